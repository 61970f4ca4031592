"""The loss curve of a training run as a PNG, as in the model card (needs matplotlib: the extra `diffill[plot]`).

    python -m infill_engine.training.plot runs/NAME [loss.png] [--title TITLE]
    python -m infill_engine.training.plot --compare span=runs/A dense=runs/B compare.png \
        [--pass-at-1 dense:1.6:3.2 ...] [--reference shipped:3.32:1.84]

The first form draws one run (a run directory or a loss log such as docs/train-log-embedded.csv; the picture goes
beside the log as `loss.png` unless a path is given). `--compare` draws the held-out loss of several runs against
their training tokens on one plot, with pass@1 points (LABEL:MILLION_TOKENS:PASS) on a second axis, so objectives
are compared at equal tokens; `--reference NAME:LOSS:PASS` draws a starting model's held-out loss and pass@1 as lines.
"""

from __future__ import annotations

import argparse
import csv
import os
import sys
from pathlib import Path

from infill_engine.training.loss_log import LOG_FILE


def read_log(path: str | os.PathLike[str]) -> list[dict[str, float | None]]:
    """Rows of a loss log with numbers parsed (empty cells become None)."""
    with open(path, newline="", encoding="utf-8") as handle:
        return [{k: (float(v) if v not in ("", None) else None) for k, v in row.items()}
                for row in csv.DictReader(handle)]


def held_out_series(rows: list[dict[str, float | None]]) -> dict[str, list[tuple[float, float]]]:
    """The held-out losses of a log against millions of training tokens: the weights', and the weight average's in a
    run with --ema (from the first row that has it)."""
    series = {"held-out loss": [(r["tokens"] / 1e6, r["eval_loss"]) for r in rows if r["eval_loss"] is not None]}
    averaged = [(r["tokens"] / 1e6, r["eval_loss_average"]) for r in rows if r.get("eval_loss_average") is not None]
    if averaged:
        series["held-out loss, weight average"] = averaged
    return series


def plot_loss(log_path: str | os.PathLike[str], png_path: str | os.PathLike[str], title: str = "") -> None:
    """Training loss (smoothed) and held-out loss against training tokens, with eval accuracy on a second axis."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    rows = read_log(log_path)
    tokens = [r["tokens"] / 1e6 for r in rows]
    loss = [r["loss"] for r in rows]
    smooth, alpha, value = [], 0.1, None
    for point in loss:
        value = point if value is None else (1 - alpha) * value + alpha * point
        smooth.append(value)
    evals = [(r["tokens"] / 1e6, r["eval_loss"], r.get("eval_accuracy")) for r in rows if r["eval_loss"] is not None]
    figure, axis = plt.subplots(figsize=(7, 4), dpi=110)
    axis.plot(tokens, loss, color="#9ab", linewidth=0.6, label="train loss")
    axis.plot(tokens, smooth, color="#135", linewidth=1.5, label="train loss (smoothed)")
    for (label, points), colour in zip(held_out_series(rows).items(), ("#c52", "#a3a")):
        axis.plot([p[0] for p in points], [p[1] for p in points], "o-", color=colour, markersize=3, label=label)
    axis.set_xlabel("training tokens (millions)")
    axis.set_ylabel("loss (nats, 1/t-weighted)")
    axis.set_ylim(0, min(8.0, max(loss) if loss else 8.0))
    axis.grid(alpha=0.3)
    accuracy = [(e[0], e[2]) for e in evals if e[2] is not None]
    if accuracy:
        right = axis.twinx()
        right.plot([a[0] for a in accuracy], [100 * a[1] for a in accuracy], "s--", color="#393", markersize=3,
                   label="held-out masked-token accuracy (%)")
        right.set_ylabel("accuracy (%)")
        right.legend(loc="lower right", fontsize=8)
    axis.legend(loc="lower left", fontsize=8)
    axis.set_title(title or Path(log_path).parent.name)
    figure.tight_layout()
    figure.savefig(png_path)
    plt.close(figure)


def plot_comparison(
    logs: dict[str, Path], png_path: str | os.PathLike[str], pass_at_1: dict[str, list[tuple[float, float]]],
    reference: tuple[str, float, float] | None = None, title: str = "",
) -> None:
    """Held-out loss of several runs against training tokens, pass@1 points on a second axis."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colours = ["#c52", "#25a", "#393", "#a3a", "#888"]
    figure, axis = plt.subplots(figsize=(7, 4), dpi=110)
    right = axis.twinx()
    for index, (label, log) in enumerate(logs.items()):
        colour = colours[index % len(colours)]
        evals = [(r["tokens"] / 1e6, r["eval_loss"]) for r in read_log(log) if r["eval_loss"] is not None]
        axis.plot([e[0] for e in evals], [e[1] for e in evals], "o-", color=colour, markersize=3,
                  label=f"{label}: held-out span loss")
        points = pass_at_1.get(label, [])
        if points:
            right.plot([p[0] for p in points], [p[1] for p in points], "D--", color=colour, markersize=5,
                       label=f"{label}: pass@1 (%)")
    if reference is not None:
        name, loss, score = reference
        axis.axhline(loss, color="#555", linestyle=":", linewidth=1, label=f"{name}: held-out span loss")
        right.axhline(score, color="#555", linestyle="-.", linewidth=1, label=f"{name}: pass@1 (%)")
    axis.set_xlabel("training tokens (millions)")
    axis.set_ylabel("held-out span loss (nats, 1/t-weighted)")
    axis.grid(alpha=0.3)
    axis.legend(loc="upper left", fontsize=7)
    if any(pass_at_1.values()) or reference is not None:
        right.set_ylabel("HumanEval single-line pass@1 (%)")
        right.legend(loc="upper right", fontsize=7)
    else:  # losses only: no empty pass@1 axis
        right.set_axis_off()
    axis.set_title(title or "objectives at equal training tokens")
    figure.tight_layout()
    figure.savefig(png_path)
    plt.close(figure)


def _labelled(value: str, separator: str) -> tuple[str, list[str]]:
    """LABEL=REST or LABEL:A:B split at `separator`; ValueError naming the expected form."""
    label, _, rest = value.partition(separator)
    if not label or not rest:
        raise ValueError(f"expected LABEL{separator}..., got {value!r}")
    return label, rest.split(":")


def main(argv: list[str] | None = None) -> int:
    """Plot a run's loss log; 2 (with a message) when the log is missing or matplotlib is not installed."""
    parser = argparse.ArgumentParser(prog="python -m infill_engine.training.plot", description=__doc__.split("\n")[0])
    parser.add_argument("log", type=Path, nargs="?", help="a run directory or its train_log.csv")
    parser.add_argument("png", type=Path, nargs="?", help="where the picture goes (default: loss.png beside the log)")
    parser.add_argument("--title", default="", help="the plot's title (default: the log's directory name)")
    parser.add_argument("--compare", nargs="+", metavar="LABEL=RUN", help="runs to compare, then the PNG path")
    parser.add_argument("--pass-at-1", action="append", default=[], metavar="LABEL:MTOKENS:PASS",
                        help="a pass@1 point of a compared run (repeatable)")
    parser.add_argument("--reference", metavar="NAME:LOSS:PASS", help="a starting model's held-out loss and pass@1")
    if argv is None:
        argv = sys.argv[1:]
    if "--compare" in argv:
        return _compare(parser, argv)
    args = parser.parse_args(argv)
    if args.log is None:
        parser.error("name a run directory or a loss log")
    log = args.log / LOG_FILE if args.log.is_dir() else args.log
    if not log.is_file():
        parser.error(f"no loss log at {log}")
    try:
        import matplotlib  # noqa: F401
    except ImportError:
        parser.error("plotting needs matplotlib: pip install 'diffill[plot]' (or pip install matplotlib)")
    png = args.png or log.with_name("loss.png")
    plot_loss(log, png, args.title)
    print(png)
    return 0


def _compare(parser: argparse.ArgumentParser, argv: list[str]) -> int:
    """The --compare form: LABEL=RUN ... PNG."""
    args = parser.parse_args(argv)
    if args.log is not None:
        parser.error("--compare takes its runs and the PNG path after it, and no run before it")
    *runs, png = args.compare
    try:
        logs = {}
        for run in runs:
            label, (path,) = _labelled(run, "=")
            log = Path(path) / LOG_FILE if Path(path).is_dir() else Path(path)
            if not log.is_file():
                raise ValueError(f"no loss log at {log}")
            logs[label] = log
        points: dict[str, list[tuple[float, float]]] = {}
        for point in args.pass_at_1:
            label, (tokens, score) = _labelled(point, ":")
            points.setdefault(label, []).append((float(tokens), float(score)))
        reference = None
        if args.reference:
            name, (loss, score) = _labelled(args.reference, ":")
            reference = (name, float(loss), float(score))
    except ValueError as error:
        parser.error(str(error))
    if not logs:
        parser.error("--compare needs at least one LABEL=RUN before the PNG path")
    plot_comparison(logs, png, points, reference, args.title)
    print(png)
    return 0


if __name__ == "__main__":
    sys.exit(main())
