"""`diffill fill`: fill the hole at a position or marker in a file and print the fill."""

from __future__ import annotations

import argparse
import json
import logging
import sys
from dataclasses import dataclass
from typing import Any

from infill_engine.commands import UsageError, add_fill_options, check_fill_options, load_in_process
from infill_engine.interface import add_model_options

HELP = "fill the hole at a position or marker and print the fill"
MAX_FILE_BYTES = 64 * 1024 * 1024


def add_arguments(fill: argparse.ArgumentParser) -> None:
    """The options of `diffill fill`."""
    fill.add_argument("target", help="FILE:LINE:COL (1-based), or FILE with --hole; '-' reads standard input")
    fill.add_argument("--hole", metavar="MARKER", help="fill where this marker string stands (it is removed)")
    add_model_options(fill, threads="torch threads (default: torch's)")
    fill.add_argument("--max-tokens", type=int, default=64, help="span positions on the canvas (default: 64)")
    fill.add_argument("--candidates", type=int, default=1, help="canvases denoised in one batch (default: 1)")
    fill.add_argument("--steps", type=int, help="denoising steps per block (default: the family's)")
    fill.add_argument("--block-size", type=int, help="positions per block (default: the family's)")
    fill.add_argument("--commit", help="threshold, schedule, factor or entropy_bound (default: the family's)")
    fill.add_argument("--order", help="confidence, margin, entropy or random (default: confidence)")
    fill.add_argument("--threshold", type=float, help="confidence a position needs with --commit threshold")
    fill.add_argument("--temperature", type=float, help="sampling temperature (0 = greedy)")
    fill.add_argument("--canvas-refresh", type=int, metavar="N",
                      help="the embedded model: a pass over the whole canvas every N steps, in between only over "
                           "the open and just-changed positions; 0 every pass (default: the family's)")
    add_fill_options(fill, effect=" (a fill that ran out of time says so in --json: stats.over_budget)")
    fill.add_argument("--seed", type=int, default=0, help="random seed (default: 0)")
    fill.add_argument("--language", help="language or file name for the syntax gate (default: from FILE)")
    fill.add_argument("--no-gate", action="store_true", help="show the raw candidates without the syntax gate")
    fill.add_argument("--json", action="store_true", help="print JSON: text, candidates, steps, timings")


@dataclass(frozen=True)
class Hole:
    """The document split at the hole."""

    path: str
    prefix: str
    suffix: str


def read_text(path: str) -> str:
    """A file (or standard input for '-') as text, refusing binary and non-UTF-8 content."""
    try:
        data = sys.stdin.buffer.read() if path == "-" else open(path, "rb").read(MAX_FILE_BYTES + 1)
    except FileNotFoundError:
        raise UsageError(f"{path}: no such file") from None
    except IsADirectoryError:
        raise UsageError(f"{path}: is a directory, not a file") from None
    except OSError as error:
        raise UsageError(f"{path}: cannot read ({error.strerror})") from None
    if len(data) > MAX_FILE_BYTES:
        raise UsageError(f"{path}: larger than {MAX_FILE_BYTES // (1024 * 1024)} MiB; refusing to read it")
    if b"\x00" in data:
        raise UsageError(f"{path}: looks binary (contains NUL bytes); diffill fills text files")
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as error:
        raise UsageError(f"{path}: not UTF-8 text (byte {error.start} is invalid); diffill reads UTF-8 files") from None


def split_at_position(text: str, line: int, column: int, path: str) -> tuple[str, str]:
    """Split text at a 1-based line and a 1-based column counted in characters."""
    lines = text.split("\n")
    if line < 1 or line > len(lines):
        raise UsageError(f"{path}: line {line} is outside the file (it has lines 1 to {len(lines)})")
    width = len(lines[line - 1].rstrip("\r"))
    if column < 1 or column > width + 1:
        raise UsageError(f"{path}:{line}: column {column} is outside the line (columns 1 to {width + 1})")
    offset = sum(len(previous) + 1 for previous in lines[: line - 1]) + column - 1
    return text[:offset], text[offset:]


def parse_target(target: str, hole_marker: str | None) -> Hole:
    """FILE:LINE:COL, or FILE with --hole MARKER; '-' reads standard input."""
    path, line, column = target, None, None
    parts = target.rsplit(":", 2)
    if len(parts) == 3 and parts[1].isdigit() and parts[2].isdigit():
        path, line, column = parts[0], int(parts[1]), int(parts[2])
    if line is None and hole_marker is None:
        raise UsageError(f"{target}: say where the hole is: FILE:LINE:COL (1-based), or FILE --hole MARKER")
    if line is not None and hole_marker is not None:
        raise UsageError("give either FILE:LINE:COL or --hole MARKER, not both")
    text = read_text(path)
    if hole_marker is not None:
        if not hole_marker:
            raise UsageError("--hole MARKER must not be empty")
        index = text.find(hole_marker)
        if index == -1:
            raise UsageError(f"{path}: the marker {hole_marker!r} does not occur in the file")
        return Hole(path, text[:index], text[index + len(hole_marker) :])
    prefix, suffix = split_at_position(text, line, column, path)
    return Hole(path, prefix, suffix)


def sampler_from_args(args: argparse.Namespace, base: Any) -> Any:
    """The family's default sampler with --variant's settings, then the command line's own options over them."""
    from dataclasses import replace

    from infill_engine.sampler import sampler_overrides

    overrides: dict[str, Any] = {**(sampler_overrides(args.variant) if args.variant else {}), "seed": args.seed}
    for name, field_name in (("steps", "steps"), ("block_size", "block_size"), ("commit", "commit"),
                             ("order", "order"), ("threshold", "threshold"), ("canvas_refresh", "canvas_refresh")):
        if getattr(args, name) is not None:
            overrides[field_name] = getattr(args, name)
    if args.temperature is not None:
        overrides["temperature_start"] = overrides["temperature_end"] = args.temperature
    try:
        return replace(base, **overrides)
    except ValueError as error:
        raise UsageError(str(error)) from None


def run(args: argparse.Namespace) -> int:
    """`diffill fill`: print the best fill, all candidates with --no-gate, or JSON."""
    from infill_engine.engine import InfillRequest
    from infill_engine.syntax import language_for

    try:
        check_fill_options(args)
    except ValueError as error:
        raise UsageError(str(error)) from None
    hole = parse_target(args.target, args.hole)
    language = args.language or (None if hole.path == "-" else hole.path)
    if args.language and language_for(args.language) is None:
        logging.getLogger(__name__).warning("unknown language %r: only brackets are checked", args.language)
    engine = load_in_process(args)
    engine.sampler = sampler_from_args(args, engine.sampler)
    request = InfillRequest(
        prefix=hole.prefix, suffix=hole.suffix, language=language, max_tokens=args.max_tokens,
        candidates=args.candidates, gate=not args.no_gate, budget_ms=args.budget_ms,
    )
    try:
        result = engine.fill(request)
    except ValueError as error:
        raise UsageError(str(error)) from None
    if result.stats.over_budget and not args.json:
        print(f"diffill: the {args.budget_ms} ms budget ran out: undecided positions took the model's best guess "
              "and repairs were skipped", file=sys.stderr)
    if args.json:
        print(json.dumps(result_as_json(result), indent=2, ensure_ascii=False))
    elif args.no_gate:
        for index, candidate in enumerate(result.candidates + result.rejected):
            print(f"--- candidate {index + 1} (score {candidate.score:.3f})")
            print(candidate.text)
    elif result.text is None:
        print("diffill: no candidate passed the syntax gate (see them with --no-gate)", file=sys.stderr)
        return 1
    else:
        sys.stdout.write(result.text + ("" if result.text.endswith("\n") else "\n"))
    return 0


def result_as_json(result: Any) -> dict[str, Any]:
    """The JSON form of an InfillResult."""

    def candidate_json(candidate: Any) -> dict[str, Any]:
        gate = candidate.gate
        return {
            "text": candidate.text,
            "score": round(candidate.score, 4),
            "passed": candidate.passed,
            "repairs": candidate.repairs,
            "checker": None if gate is None else gate.checker,
            "problems": [] if gate is None else [
                {"start": p.start, "end": p.end, "kind": p.kind, "message": p.message} for p in gate.new_problems
            ],
        }

    stats = result.stats.as_dict()
    return {
        "text": result.text,
        "candidates": [candidate_json(c) for c in result.candidates],
        "rejected": [candidate_json(c) for c in result.rejected],
        "steps": stats["forward_passes"],
        "tokens_per_forward": stats["tokens_per_forward"],
        "ms": stats["ms"],
        "stats": stats,
    }


