"""The engine's kinds of `diffill bench` (spans, ghost): what fills cost on this machine.

Benchmarks measure; tests never assert timings. `diffill.bench` puts these kinds beside the editor-side ones.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable

from infill_engine.commands import UsageError, load_in_process
from infill_engine.interface import add_model_options

THREADS_HELP = "torch threads (default: torch's)"


def add_kinds(kinds: argparse._SubParsersAction) -> dict[str, Callable[[argparse.Namespace], int]]:
    """Add the engine's benchmark kinds to `diffill bench`; kind name -> its run function."""
    spans = kinds.add_parser("spans", help="ms per denoising step and tokens per forward by span length")
    add_model_options(spans, threads=THREADS_HELP)
    spans.add_argument("--spans", type=int, nargs="+", default=[16, 64, 256], help="span lengths (default: 16 64 256)")
    spans.add_argument("--repeats", type=int, default=3, help="measured runs per span (default: 3)")
    spans.add_argument("--json", action="store_true", help="print JSON")
    ghost = kinds.add_parser("ghost", help="single-line ghost-text latency at the benchmark's holes")
    add_model_options(ghost, threads=THREADS_HELP)
    ghost.add_argument("--data", help="JSONL(.gz) in the HumanEval-infilling format (default: ../shared/bench)")
    ghost.add_argument("--sample", type=int, default=30, metavar="N", help="holes, spread over the file (default 30)")
    ghost.add_argument("--max-tokens", type=int, default=24, help="span positions (default 24, as mid-line)")
    ghost.add_argument("--candidates", type=int, default=1, help="canvases denoised together (default 1)")
    ghost.add_argument("--json", action="store_true", help="print JSON")
    return {"spans": run_spans, "ghost": run_ghost}


def run_ghost(args: argparse.Namespace) -> int:
    """Single-line ghost-text latency, steps and yield at real holes."""
    import torch

    from infill_engine.bench import bench_ghost
    from infill_engine.evaluation import DEFAULT_BENCH, load_problems, spread_sample

    try:
        problems = spread_sample(load_problems(args.data or DEFAULT_BENCH), args.sample)
        engine = load_in_process(args)
        report = bench_ghost(engine, [(p.prompt, p.suffix) for p in problems], args.max_tokens, args.candidates)
    except ValueError as error:
        raise UsageError(str(error)) from None
    report = {"model": engine.describe().path, "threads": torch.get_num_threads(), **report}
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print("\n".join(f"{key}: {value}" for key, value in report.items()))
    return 0


def run_spans(args: argparse.Namespace) -> int:
    """Milliseconds per denoising step and tokens per forward, by span length."""
    import torch

    from infill_engine.bench import bench_spans

    engine = load_in_process(args)
    model = engine.describe()
    rows = bench_spans(engine, args.spans, args.repeats)
    if args.json:
        print(json.dumps({"model": model.path, "family": model.family, "rows": rows}, indent=2))
        return 0
    print(f"model: {model.path} ({model.family}, {model.device}, threads {torch.get_num_threads()})")
    print(f"{'span':>6} {'ms/step':>9} {'encode ms':>10} {'steps':>6} {'tok/fwd':>8} {'total ms':>9}")
    for row in rows:
        if "skipped" in row:
            print(f"{row['span']:>6}  skipped: {row['skipped']}")
            continue
        print(f"{row['span']:>6} {row['ms_per_step']:>9} {row['ms_encode']:>10} {row['steps']:>6} "
              f"{row['tokens_per_forward']:>8} {row['ms_total']:>9}")
    return 0
