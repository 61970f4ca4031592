"""The loss curve of a training run as a PNG, as in the model card (needs matplotlib: the extra `diffill[plot]`).

    python -m infill_engine.training.plot runs/NAME [loss.png] [--title TITLE]

The first argument is a run directory or a loss log (`train_log.csv`, or a copy such as docs/train-log-embedded.csv);
the picture is written beside the log as `loss.png` unless a path is given.
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
    if evals:
        axis.plot([e[0] for e in evals], [e[1] for e in evals], "o-", color="#c52", markersize=3, label="held-out loss")
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


def main(argv: list[str] | None = None) -> int:
    """Plot a run's loss log; 2 (with a message) when the log is missing or matplotlib is not installed."""
    parser = argparse.ArgumentParser(prog="python -m infill_engine.training.plot", description=__doc__.split("\n")[0])
    parser.add_argument("log", type=Path, help="a run directory or its train_log.csv")
    parser.add_argument("png", type=Path, nargs="?", help="where the picture goes (default: loss.png beside the log)")
    parser.add_argument("--title", default="", help="the plot's title (default: the log's directory name)")
    args = parser.parse_args(argv)
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


if __name__ == "__main__":
    sys.exit(main())
