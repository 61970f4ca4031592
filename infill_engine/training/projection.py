"""What more training would buy, projected from a run's own curve (docs/MODEL.md, "What more compute would buy").

    python -m infill_engine.training.projection --curve TOKENS:LOSS ... --pass LOSS:PASS ... \
        --tokens-per-second N --hours H [--hours H ...]

The held-out loss is fitted as a power law of training tokens (log loss linear in log tokens), the way the loss of
these runs has fallen; pass@1 is fitted as a straight line in the held-out loss through the evaluated checkpoints.
Each budget of CPU hours is turned into tokens at the measured rate, added to the curve's last point, and read off
both fits. A straight line in loss is the optimistic reading where pass@1 has barely moved: it says what the goals
would need, not that they follow.
"""

from __future__ import annotations

import argparse
import math
import sys
from dataclasses import dataclass


@dataclass(frozen=True)
class Line:
    """y = intercept + slope * x."""

    intercept: float
    slope: float

    def at(self, x: float) -> float:
        """The line's value at x."""
        return self.intercept + self.slope * x


def fit_line(xs: list[float], ys: list[float]) -> Line:
    """Least-squares straight line through the points (at least two distinct x)."""
    if len(xs) != len(ys) or len(set(xs)) < 2:
        raise ValueError("a fit needs at least two points with different x")
    mean_x, mean_y = sum(xs) / len(xs), sum(ys) / len(ys)
    slope = sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys)) / sum((x - mean_x) ** 2 for x in xs)
    return Line(mean_y - slope * mean_x, slope)


def fit_power_law(tokens: list[float], losses: list[float]) -> Line:
    """log(loss) = intercept + slope * log(tokens): slope is minus the power law's exponent."""
    if any(t <= 0 for t in tokens) or any(v <= 0 for v in losses):
        raise ValueError("tokens and losses must be positive")
    return fit_line([math.log(t) for t in tokens], [math.log(v) for v in losses])


def project(curve: list[tuple[float, float]], passes: list[tuple[float, float]], tokens_per_second: float,
            hours: list[float]) -> list[dict[str, float]]:
    """For each budget of hours: total tokens, projected held-out loss and the pass@1 the loss line gives."""
    law = fit_power_law([t for t, _ in curve], [v for _, v in curve])
    pass_line = fit_line([v for v, _ in passes], [p for _, p in passes])
    start = max(t for t, _ in curve)
    rows = []
    for budget in hours:
        total = start + tokens_per_second * 3600 * budget
        loss = math.exp(law.at(math.log(total)))
        rows.append({"hours": budget, "tokens": total, "loss": loss, "pass_at_1": pass_line.at(loss),
                     "loss_per_doubling": 2 ** law.slope, "pass_per_nat": -pass_line.slope})
    return rows


def _pair(text: str) -> tuple[float, float]:
    try:
        first, second = text.split(":")
        return float(first), float(second)
    except ValueError:
        raise argparse.ArgumentTypeError(f"expected two numbers as A:B, got {text!r}") from None


def main(argv: list[str] | None = None) -> int:
    """Print the projection for each budget."""
    parser = argparse.ArgumentParser(prog="python -m infill_engine.training.projection",
                                     description=__doc__.split("\n")[0])
    parser.add_argument("--curve", type=_pair, nargs="+", required=True, metavar="TOKENS:LOSS",
                        help="held-out loss after this many training tokens (one scale: see training.held_out)")
    parser.add_argument("--pass", dest="passes", type=_pair, nargs="+", required=True, metavar="LOSS:PASS",
                        help="pass@1 of an evaluated checkpoint and its held-out loss")
    parser.add_argument("--tokens-per-second", type=float, required=True, help="the measured training rate")
    parser.add_argument("--hours", type=float, nargs="+", default=[20.0], help="CPU-hour budgets (default: 20)")
    args = parser.parse_args(argv)
    try:
        rows = project(args.curve, args.passes, args.tokens_per_second, args.hours)
    except ValueError as error:
        print(f"projection: {error}", file=sys.stderr)
        return 2
    print(f"loss x{rows[0]['loss_per_doubling']:.3f} per doubling of tokens; "
          f"pass@1 {rows[0]['pass_per_nat']:+.2f} points per nat of held-out loss")
    for row in rows:
        print(f"{row['hours']:6.1f} h: {row['tokens'] / 1e6:8.1f}M tokens, held-out loss {row['loss']:.3f}, "
              f"pass@1 {row['pass_at_1']:.2f}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
