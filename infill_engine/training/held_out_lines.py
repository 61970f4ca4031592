"""Fills at single-line holes cut from a corpus's held-out Python files, laid out as HumanEval's single-line infilling.

    python -m infill_engine.training.held_out_lines --corpus RUN_DIR MODEL [MODEL ...] [--holes 500]
        [--variant KEY=VALUE,...] [--variant ...] [--threads 1] [--json PATH]

Each hole is one whole indented line of code (with its line end) in a held-out file, the prefix everything before it
and the suffix everything after, as in the benchmark. The model fills it at unknown length and the fill is scored by
exact match (whitespace at the ends ignored), edit similarity (difflib's ratio of the two stripped texts, 0..1, the
smoother measure), whether it is blank (only whitespace: no suggestion) and its length against the line's. Hundreds of holes from files no run trained
on give a measure that is larger and cheaper than the benchmark, for choosing between checkpoints and sampler settings
(`--variant end_bias=-1.0`) without tuning on the benchmark itself (docs/MODEL.md, "Held-out lines").
"""

from __future__ import annotations

import argparse
import difflib
import random
import statistics
import sys
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from infill_engine.training.measurement import add_measure_arguments, measure_models

SEED = 0  # the holes are the same for every model and setting
PREFIX_CHARS = 6_000  # the context kept around a hole before tokenizing (the engine trims it to its budget anyway)
SUFFIX_CHARS = 3_000
MIN_LINE_CHARS, MAX_LINE_CHARS = 4, 100  # the line's text without its indentation


@dataclass(frozen=True)
class LineHole:
    """One held-out line to fill."""

    path: str
    prefix: str
    middle: str  # the whole line, indentation and line end included
    suffix: str


@dataclass
class LineScores:
    """How one model and setting filled the holes."""

    model: str
    variant: str
    holes: int
    exact: float  # percent
    edit_similarity: float  # mean, 0..1
    blank: float  # percent of fills with nothing but whitespace
    fill_chars: float  # mean length of the fills' stripped text ...
    line_chars: float  # ... and of the lines' (a model that ends early writes less than this)
    ms_per_hole: float
    tokens_per_forward: float = 0.0  # the fills' tokens over their forward passes, totals over totals


def is_fillable_line(line: str) -> bool:
    """An indented line of code, not a comment or a string's text: what HumanEval's single-line holes are."""
    text = line.strip()
    indented = line[:1] in (" ", "\t")
    return indented and MIN_LINE_CHARS <= len(text) <= MAX_LINE_CHARS and not text.startswith(("#", '"', "'"))


def sample_line_holes(documents: list[Any], count: int, seed: int = SEED) -> list[LineHole]:
    """`count` holes from the Python documents, one line each, drawn with `seed` (at most one per document)."""
    python = sorted((d for d in documents if d.path.endswith(".py")), key=lambda d: d.path)
    rng = random.Random(seed)
    rng.shuffle(python)
    holes = []
    for document in python:
        lines = document.text.splitlines(keepends=True)
        starts = [0]
        for line in lines:
            starts.append(starts[-1] + len(line))
        candidates = [i for i, line in enumerate(lines) if line.endswith("\n") and is_fillable_line(line)]
        if not candidates:
            continue
        index = rng.choice(candidates)
        start, end = starts[index], starts[index + 1]
        holes.append(LineHole(document.path, document.text[max(0, start - PREFIX_CHARS):start], lines[index],
                              document.text[end:end + SUFFIX_CHARS]))
        if len(holes) == count:
            break
    return holes


def edit_similarity(fill: str, truth: str) -> float:
    """difflib's ratio of the two texts with the whitespace at their ends stripped (1.0: the same)."""
    return difflib.SequenceMatcher(None, fill.strip(), truth.strip()).ratio()


def score_fills(model: str, variant: str, holes: list[LineHole], fills: list[str], ms: list[float],
                tokens: int = 0, passes: int = 0) -> LineScores:
    """Exact match, edit similarity and blank fills of `fills` against the holes' lines; `tokens` written in
    `passes` forward passes, all fills together."""
    count = max(len(holes), 1)
    return LineScores(
        model=model, variant=variant, holes=len(holes),
        exact=round(100 * sum(f.strip() == h.middle.strip() for f, h in zip(fills, holes)) / count, 2),
        edit_similarity=round(statistics.fmean(edit_similarity(f, h.middle) for f, h in zip(fills, holes)), 4)
        if holes else 0.0,
        blank=round(100 * sum(not f.strip() for f in fills) / count, 2),
        fill_chars=round(sum(len(f.strip()) for f in fills) / count, 1),
        line_chars=round(sum(len(h.middle.strip()) for h in holes) / count, 1),
        ms_per_hole=round(statistics.fmean(ms), 1) if ms else 0.0,
        tokens_per_forward=round(tokens / passes, 3) if passes else 0.0,
    )


def fill_holes(engine: Any, holes: list[LineHole], max_tokens: int = 48) -> tuple[list[str], list[float], int, int]:
    """The engine's first suggestion at each hole (empty where it has none), at unknown length, ms per fill, and
    the tokens written and forward passes run, all fills together."""
    from infill_engine.engine import InfillRequest
    from infill_engine.evaluation import first_fill

    fills, ms, tokens, passes = [], [], 0, 0
    for hole in holes:
        started = time.perf_counter()
        result = engine.fill(InfillRequest(hole.prefix, hole.suffix, "python", max_tokens=max_tokens))
        ms.append(1000 * (time.perf_counter() - started))
        tokens, passes = tokens + result.stats.tokens_generated, passes + result.stats.forward_passes
        best = first_fill(result)
        fills.append(best.text if best is not None else "")
    return fills, ms, tokens, passes


def main(argv: list[str] | None = None) -> int:
    """Score each model under each variant on the same held-out line holes; print a table (and write JSON)."""
    parser = argparse.ArgumentParser(prog="python -m infill_engine.training.held_out_lines",
                                     description=__doc__.split("\n\n")[0])
    add_measure_arguments(parser, 500, "holes, one per held-out Python file")
    parser.add_argument("--corpus", required=True, type=Path,
                        help="a training run directory (or any directory with a corpus.jsonl): its held-out files")
    parser.add_argument("--variant", action="append", default=[], metavar="KEY=VALUE,...",
                        help="sampler settings to score (repeatable); without one, each model's own")
    args = parser.parse_args(argv)

    import torch

    from infill_engine.sampler import sampler_overrides, sampler_variant
    from infill_engine.training.corpus import read_corpus

    try:
        if args.holes < 1:
            raise ValueError(f"--holes must be at least 1 (got {args.holes})")
        for variant in args.variant:
            sampler_overrides(variant)
        corpus = read_corpus(args.corpus)
    except (ValueError, FileNotFoundError) as error:
        print(f"held_out_lines: {error}", file=sys.stderr)
        return 2
    holes = sample_line_holes(corpus.split("eval"), args.holes)
    if not holes:
        print(f"held_out_lines: {args.corpus} has no held-out Python file with an indented line to fill",
              file=sys.stderr)
        return 2
    torch.set_num_threads(args.threads)
    print(f"{len(holes)} held-out lines of {args.corpus}")
    print(f"{'exact %':>8} {'edit sim':>8} {'blank %':>8} {'chars':>11} {'ms/hole':>8} {'tok/fwd':>8}  model, variant")

    def score_model(engine: Any, model: str) -> list[LineScores]:
        rows, own = [], engine.sampler
        for variant in args.variant or [""]:
            engine.sampler = sampler_variant(variant, own) if variant else own
            row = score_fills(model, variant, holes, *fill_holes(engine, holes))
            rows.append(row)
            chars = f"{row.fill_chars}/{row.line_chars}"
            print(f"{row.exact:>8} {row.edit_similarity:>8} {row.blank:>8} {chars:>11} {row.ms_per_hole:>8} "
                  f"{row.tokens_per_forward:>8}  {model}"
                  f"{', ' + variant if variant else ''}", flush=True)
        return rows

    return measure_models("held_out_lines", args.models, score_model, args.json)


if __name__ == "__main__":
    sys.exit(main())
