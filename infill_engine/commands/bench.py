"""The engine's kinds of `diffill bench` (spans, ghost, fill, gate): what fills cost on this machine.

Benchmarks measure; tests never assert timings. `diffill.bench` puts these kinds beside the editor-side ones.
"""

from __future__ import annotations

import argparse
import json
from collections.abc import Callable
from typing import Any

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
    fill = kinds.add_parser("fill", help="ms per fill, passes, tokens per forward, stages and GFLOP/s by span")
    add_model_options(fill, threads=THREADS_HELP)
    fill.add_argument("--data", help="JSONL(.gz) in the HumanEval-infilling format (default: ../shared/bench)")
    fill.add_argument("--sample", type=int, default=20, metavar="N", help="holes, spread over the file (default 20)")
    fill.add_argument("--spans", nargs="+", default=["line", "16", "64", "256"], metavar="SPAN",
                      help="'line' (single-line ghost text, 24 positions) or positions (default: line 16 64 256)")
    fill.add_argument("--candidates", type=int, default=1, help="canvases denoised together (default 1)")
    fill.add_argument("--variant", action="append", metavar="KEY=VALUE[,...]",
                      help="sampler settings to compare on the same holes in the same run, e.g. settle_tail=false; "
                           "repeat for more (default: the model's own settings)")
    fill.add_argument("--after-keystroke", action="store_true",
                      help="time each fill after an uncounted fill of the same hole one character earlier, as when "
                           "typing (the context's keys and values of that prefix are then reused); default: each "
                           "hole a new request")
    fill.add_argument("--profile", action="store_true", help="add torch.profiler's table of one fill per span")
    fill.add_argument("--json", action="store_true", help="print JSON")
    fill.add_argument("--out", metavar="FILE", help="also write the JSON to FILE")
    gate = kinds.add_parser("gate", help="ms of the syntax gate per keystroke in a large file, by way of gating")
    gate.add_argument("--mb", type=float, default=5.0, help="document size in millions of characters (default 5)")
    gate.add_argument("--keys", type=int, default=40, help="keystrokes typed, each a new version (default 40)")
    gate.add_argument("--candidates", type=int, default=2, help="fills gated per keystroke (default 2)")
    gate.add_argument("--modes", nargs="+", default=["fresh", "whole", "window"], metavar="MODE",
                      help="fresh, whole, window: compared keystroke by keystroke (default: all three)")
    gate.add_argument("--json", action="store_true", help="print JSON")
    return {"spans": run_spans, "ghost": run_ghost, "fill": run_fill, "gate": run_gate}


def run_gate(args: argparse.Namespace) -> int:
    """Per way of gating: ms for each keystroke's first candidate (with the new version's parse) and the others."""
    from infill_engine.gate_bench import bench_gate

    try:
        report = bench_gate(args.mb, args.keys, args.candidates, tuple(args.modes))
    except ValueError as error:
        raise UsageError(str(error)) from None
    if args.json:
        print(json.dumps(report, indent=2))
        return 0
    print(f"{report['characters']:,} characters ({report['bytes']:,} bytes); {report['keys']} keystrokes, "
          f"{report['candidates']} candidate(s) each; same verdicts in every mode: {report['same_verdicts']}")
    print(f"{'mode':<8} {'first p50':>10} {'first p95':>10} {'further p50':>12} {'further p95':>12} {'passed':>7}")
    for row in report["rows"]:
        print(f"{row['mode']:<8} {row['first_ms_median']:>10} {row['first_ms_p95']:>10} "
              f"{row.get('further_ms_median', '-'):>12} {row.get('further_ms_p95', '-'):>12} {row['passed']:>7}")
    return 0


def run_fill(args: argparse.Namespace) -> int:
    """Per span kind and sampler variant: latency, passes, tokens per forward, stages and achieved GFLOP/s."""
    from infill_engine.atomic import write_text_atomic
    from infill_engine.bench import bench_fill, fill_cases, ghost_text_hole, profile_one_fill, sampler_variant
    from infill_engine.evaluation import DEFAULT_BENCH, load_problems, spread_sample

    try:
        cases = fill_cases(args.spans)
        problems = spread_sample(load_problems(args.data or DEFAULT_BENCH), args.sample)
        engine = load_in_process(args, compile_first=True)
        for variant in args.variant or []:
            sampler_variant(variant, engine.sampler)
        holes = [(p.prompt, p.suffix) for p in problems]
        line_holes = [ghost_text_hole(p.prompt, p.suffix, p.canonical_solution) for p in problems]
        report = bench_fill(engine, holes, cases, args.variant, args.candidates, args.after_keystroke, line_holes)
    except ValueError as error:
        raise UsageError(str(error)) from None
    if args.profile:
        report["profiles"] = {
            case.name: profile_one_fill(engine, *(line_holes if case.single_line else holes)[0], case)
            for case in cases if engine.denoiser.max_positions - case.positions - 2 >= 16}
    report = {**run_header(engine), **report}
    text = json.dumps(report, indent=2)
    if args.out:
        write_text_atomic(args.out, text + "\n")
    if args.json:
        print(text)
        return 0
    print(f"model: {report['model']}; threads {report['threads']}; compiled layers {report['compiled_layers']}; "
          f"{report['holes']} holes; "
          f"{report['candidates']} candidate(s); {report['dtype']}; matmul peak {report['matmul_peak_gflops']} GFLOP/s"
          + (f" (bfloat16: {report['bfloat16_matmul_peak_gflops']})" if "bfloat16_matmul_peak_gflops" in report else "")
          + ("; each fill after the key before" if report["after_keystroke"] else ""))
    print(f"{'span':>5} {'variant':<22} {'ms p50':>7} {'ms p95':>7} {'passes':>6} {'tok/fwd':>7} {'canvas/fwd':>10} {'pos/pass':>8} {'rows/pass':>9} "
          f"{'tokenize':>8} {'encoded':>7} {'encode':>7} {'denoise':>8} {'gate':>6} {'repair':>7} {'ms/step':>7} "
          f"{'GFLOP/s':>8} {'of peak':>7}")
    for row in report["rows"]:
        if "skipped" in row:
            print(f"{row['span']:>5}  skipped: {row['skipped']}")
            continue
        ms = row["ms_stages_median"]
        print(f"{row['span']:>5} {row['variant']:<22} {row['ms_median']:>7} {row['ms_p95']:>7} "
              f"{row['forward_passes_median']:>6} {row['tokens_per_forward']:>7} {row['canvas_positions_per_forward']:>10} "
              f"{row['positions_per_pass']:>8} "
              f"{str(row['layer_positions_per_pass'] or '-'):>9} {ms['tokenize']:>8} {row['context_positions_encoded_median']:>7} {ms['encode']:>7} {ms['denoise']:>8} {ms['gate']:>6} {ms['repair']:>7} "
              f"{row['ms_per_step_median']:>7} {row['gflops_steps']:>8} {row['share_of_peak_steps']:>7}"
              + (f" (of the bfloat16 peak {row['share_of_bfloat16_peak_steps']})"
                 if "share_of_bfloat16_peak_steps" in row else ""))
    for name, table in report.get("profiles", {}).items():
        print(f"\nprofile of one fill, span {name}: {table}")
    return 0


def run_header(engine: Any) -> dict[str, Any]:
    """What a bench report says of the engine it measured: the model, torch's threads, the compiled layers' state."""
    import torch

    info = engine.describe()
    return {"model": info.path, "dtype": info.dtype, "threads": torch.get_num_threads(),
            "compiled_layers": getattr(engine.denoiser, "compiled_layers_state", "not a diffill model")}


def run_ghost(args: argparse.Namespace) -> int:
    """Single-line ghost-text latency, steps and yield at real holes."""
    from infill_engine.bench import bench_ghost, ghost_text_hole
    from infill_engine.evaluation import DEFAULT_BENCH, load_problems, spread_sample

    try:
        problems = spread_sample(load_problems(args.data or DEFAULT_BENCH), args.sample)
        engine = load_in_process(args, compile_first=True)
        holes = [ghost_text_hole(p.prompt, p.suffix, p.canonical_solution) for p in problems]
        report = bench_ghost(engine, holes, args.max_tokens, args.candidates)
    except ValueError as error:
        raise UsageError(str(error)) from None
    report = {**run_header(engine), **report}
    if args.json:
        print(json.dumps(report, indent=2))
    else:
        print("\n".join(f"{key}: {value}" for key, value in report.items()))
    return 0


def run_spans(args: argparse.Namespace) -> int:
    """Milliseconds per denoising step and tokens per forward, by span length."""
    import torch

    from infill_engine.bench import bench_spans

    engine = load_in_process(args, compile_first=True)
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
