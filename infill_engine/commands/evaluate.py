"""`diffill eval humaneval-infill`: pass@1, exact match and syntax-valid rate on HumanEval infilling (single lines, or
holes of several lines derived from them)."""

from __future__ import annotations

import argparse
import json
import sys

from infill_engine.commands import UsageError, add_fill_options, check_fill_options, load_in_process
from infill_engine.interface import add_model_options

HELP = "score a model on an infilling benchmark"


def add_arguments(evaluation: argparse.ArgumentParser) -> None:
    """The suites of `diffill eval` and their options."""
    suites = evaluation.add_subparsers(dest="suite", required=True)
    humaneval = suites.add_parser("humaneval-infill", help="HumanEval single-line infilling: pass@1 and more")
    add_model_options(humaneval, threads="torch threads (default: torch's)")
    humaneval.add_argument("--data", help="JSONL(.gz) in the HumanEval-infilling format (default: ../shared/bench)")
    humaneval.add_argument("--limit", type=int, help="only the first N problems")
    humaneval.add_argument("--sample", type=int, metavar="N",
                           help="N problems spread evenly over the file, so every part of it is represented")
    humaneval.add_argument("--protocol", choices=["both", "unknown", "oracle"], default="both",
                           help="span length unknown (the engine decides), oracle (the true length), or both")
    humaneval.add_argument("--span-lines", type=int, default=1, metavar="N",
                           help="holes of N consecutive lines, each derived from N single-line problems of one task "
                                "(the first's prefix, the last's suffix; 2: 869 holes, 3: 742), before --limit and "
                                "--sample (default: 1, the file's own)")
    humaneval.add_argument("--max-tokens", type=int,
                           help="canvas positions, unknown length (default: 48 for one line, 32 per line for more)")
    add_fill_options(humaneval, effect="; the scores then depend on the machine's speed")
    humaneval.add_argument("--candidates", type=int, default=1, metavar="K",
                           help="candidates per fill, denoised together and ranked as the language server ranks "
                                "them (the gate, then the model's own score); pass@1 scores the first (default: 1, "
                                "as automatic ghost text; the server's asked fills use 2)")
    humaneval.add_argument("--workers", type=int, default=2, help="parallel test subprocesses (default: 2)")
    humaneval.add_argument("--out", help="also write every completion and verdict to this JSON file")
    humaneval.add_argument("--against", metavar="EARLIER.json",
                           help="compare problem by problem with an earlier run's --out file: problems gained and "
                                "lost, identical fills, and McNemar's p-value (is the change more than chance?)")
    humaneval.add_argument("--json", action="store_true", help="print JSON")


def run(args: argparse.Namespace) -> int:
    """Print the score table of the chosen protocols."""
    from dataclasses import asdict

    from infill_engine.atomic import write_text_atomic
    from infill_engine.evaluation import DEFAULT_BENCH, PROTOCOLS, compare_outcomes, evaluate, load_problems
    from infill_engine.evaluation import line_spans, read_outcomes, spread_sample
    from infill_engine.request import InfillRequest
    from infill_engine.sampler import sampler_variant

    try:
        if args.limit is not None and args.limit < 1:
            raise ValueError(f"--limit takes a number of problems >= 1 (got {args.limit})")
        problems = load_problems(args.data or DEFAULT_BENCH, args.limit if args.span_lines == 1 else None)
        problems = line_spans(problems, args.span_lines)[: args.limit]
        if args.sample is not None:
            problems = spread_sample(problems, args.sample)
        check_fill_options(args)
        InfillRequest("", "", candidates=args.candidates).validate()  # a count outside 1..MAX_CANDIDATES
        earlier = read_outcomes(args.against) if args.against else None
    except ValueError as error:
        raise UsageError(str(error)) from None
    protocols = PROTOCOLS if args.protocol == "both" else (args.protocol,)
    if earlier is not None:  # refused before the model loads: nothing to compare with
        shared = {p for p in protocols if {o.task_id for o in problems} & set(earlier.get(p, {}))}
        if not shared:
            raise UsageError(f"{args.against} scored no problem of this run under {' or '.join(protocols)} (it has "
                             f"{', '.join(f'{p}: {len(rows)}' for p, rows in earlier.items()) or 'no outcomes'})")
    engine = load_in_process(args)
    if args.variant:
        engine.sampler = sampler_variant(args.variant, engine.sampler)

    def progress(protocol: str, done: int, total: int) -> None:
        if sys.stderr.isatty() or done == total or done % 100 == 0:
            print(f"\r{protocol}: {done}/{total}", end="\n" if done == total else "", file=sys.stderr, flush=True)

    max_tokens = args.max_tokens if args.max_tokens is not None else 48 if args.span_lines == 1 else 32 * args.span_lines
    reports = evaluate(engine, problems, protocols, max_tokens=max_tokens, workers=args.workers,
                       progress=progress, budget_ms=args.budget_ms, candidates=args.candidates)
    summaries = [report.summary() for report in reports]
    if args.out:
        details = {r.protocol: [asdict(o) for o in r.outcomes] for r in reports}
        write_text_atomic(args.out, json.dumps({"summary": summaries, "outcomes": details}, indent=1))
    model = engine.describe()
    comparisons = compare_outcomes(earlier, reports) if earlier is not None else []
    if args.json:
        against = {} if earlier is None else {"against": {"file": args.against,
                                                          "protocols": [c.summary() for c in comparisons]}}
        print(json.dumps({"model": model.path, "span_lines": args.span_lines, "variant": args.variant or "",
                          "budget_ms": args.budget_ms,
                          "candidates": args.candidates, "summary": summaries, **against}, indent=2))
        return 0
    variant = f"; sampler {args.variant}" if args.variant else ""
    budget = f"; budget {args.budget_ms} ms a fill" if args.budget_ms is not None else ""
    ranked = f"; the first of {args.candidates} candidates" if args.candidates > 1 else ""
    spans = f" of {args.span_lines} lines" if args.span_lines > 1 else ""
    print(f"model: {model.path} ({model.family}); {len(problems)} problems{spans}{variant}{budget}{ranked}")
    print(f"{'protocol':<9} {'pass@1':>7} {'exact':>7} {'syntax':>7} {'tok/fwd':>8} {'canvas/fwd':>10} "
          f"{'ms/problem':>11} {'blank':>6} {'lines':>6} {'depth':>6}")
    for row in summaries:
        print(f"{row['protocol']:<9} {row['pass@1']:>7} {row['exact_match']:>7} {row['syntax_valid']:>7} "
              f"{row['tokens_per_forward']:>8} {row['canvas_positions_per_forward']:>10} {row['ms_per_problem']:>11} "
              f"{row['blank_fills']:>6} {row['right_line_count']:>6} {row['right_depth']:>6}")
    for comparison in comparisons:
        print(f"against {args.against}, {comparison.line()}")
    return 0
