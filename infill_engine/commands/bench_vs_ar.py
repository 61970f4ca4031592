"""`diffill bench vs-ar`: the diffusion engine against its autoregressive twin, pass@1 and ms per fill side by side.

The twin is trained with `diffill train --autoregressive` (same data, tokenizer, size and tokens); the comparison and
the sweep are `infill_engine.twin_bench`. `diffill.bench` lists this module among its sides.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Callable
from pathlib import Path

from infill_engine.commands import UsageError, load_in_process
from infill_engine.interface import add_model_options, model_spec_from_args

# One-knob-at-a-time departures from the engine's defaults (threshold commits, 24 steps, threshold 0.9).
DEFAULT_SWEEP = (
    "steps=8", "steps=16", "steps=32",
    "threshold=0.5", "threshold=0.7", "threshold=0.99",
    "commit=entropy_bound,entropy_bound=0.1", "commit=entropy_bound,entropy_bound=0.5",
    "commit=entropy_bound,entropy_bound=2.0",
)


def add_kinds(kinds: argparse._SubParsersAction) -> dict[str, Callable[[argparse.Namespace], int]]:
    """Add `vs-ar` to `diffill bench`; kind name -> its run function."""
    parser = kinds.add_parser("vs-ar", help="the diffusion model against its autoregressive twin: pass@1, exact "
                                            "match and ms per fill side by side, a sweep of sampler settings, a plot")
    add_model_options(parser, threads="torch threads (default: torch's)")
    parser.add_argument("--twin", required=True, metavar="PATH",
                        help="the autoregressive twin: a checkpoint of `diffill train --autoregressive`")
    parser.add_argument("--data", help="JSONL(.gz) in the HumanEval-infilling format (default: ../shared/bench)")
    parser.add_argument("--sample", type=int, default=100, metavar="N",
                        help="problems, spread over the file (default: 100)")
    parser.add_argument("--max-tokens", type=int, default=64,
                        help="positions per fill: the diffusion canvas and the twin's most tokens (default: 64)")
    parser.add_argument("--sweep", nargs="*", default=list(DEFAULT_SWEEP), metavar="KEY=VALUE[,KEY=VALUE]",
                        help="diffusion sampler settings to sweep, one point each (default: "
                             f"{' '.join(DEFAULT_SWEEP)}); none: no sweep")
    parser.add_argument("--sweep-sample", type=int, metavar="N",
                        help="problems for the sweep's points (default: the same as --sample)")
    parser.add_argument("--single-line", action="store_true",
                        help="both sides end each fill at its first line break, as ghost text does (the twin then "
                             "stops there whether or not it has learned to end a middle)")
    parser.add_argument("--stop-at-suffix", action="store_true",
                        help="the twin stops once a line it wrote repeats the suffix's first line with text (dropped), "
                             "as editors' fill-in-the-middle clients cut a completion that runs into the code after "
                             "the cursor; the diffusion fills are cut at the same line")
    parser.add_argument("--uncached", action="store_true",
                        help="add a point for the twin without its KV cache (every token re-runs the sequence)")
    parser.add_argument("--workers", type=int, default=2, help="test subprocesses at a time (default: 2)")
    parser.add_argument("--out", type=Path, metavar="JSON", help="write the report here")
    parser.add_argument("--plot", type=Path, metavar="PNG",
                        help="plot pass@1 against ms per fill here (needs matplotlib: diffill[plot])")
    parser.add_argument("--json", action="store_true", help="print the report as JSON instead of a table")
    return {"vs-ar": run}


def run(args: argparse.Namespace) -> int:
    """Fill the problems with both models, sweep the diffusion sampler, write the report and the plot."""
    from infill_engine.commands.bench import run_header
    from infill_engine.evaluation import DEFAULT_BENCH, load_problems, spread_sample
    from infill_engine.fim_generation import load_twin
    from infill_engine.loading import ModelLoadError
    from infill_engine.sampler import sampler_overrides
    from infill_engine.twin_bench import compare, plot_sweep

    if args.plot is not None:
        try:
            import matplotlib  # noqa: F401  (checked before the models load)
        except ImportError:
            raise UsageError("--plot needs matplotlib: pip install 'diffill[plot]'") from None
    try:
        for setting in args.sweep:  # refused before any model loads
            sampler_overrides(setting)
        problems = load_problems(args.data or DEFAULT_BENCH)
        sample = spread_sample(problems, args.sample)
        sweep_sample = None if args.sweep_sample is None else spread_sample(problems, args.sweep_sample)
        engine = load_in_process(args, compile_first=True)
        spec = model_spec_from_args(args)  # the twin is loaded as the diffusion model is: dtype, compiled layers
        twin = load_twin(args.twin, device=str(engine.denoiser.device), context=engine.context, dtype=spec.dtype,
                         compiled_layers=spec.compiled_layers)
        report = compare(engine, twin, sample, args.max_tokens, args.sweep, sweep_sample, args.uncached,
                         args.workers, progress=_progress, single_line=args.single_line,
                         stop_at_suffix=args.stop_at_suffix)
    except (ValueError, OSError, ModelLoadError) as error:
        raise UsageError(f"the twin: {error}" if isinstance(error, ModelLoadError) else str(error)) from None
    header = run_header(engine)
    if header["compiled_layers"].startswith("loaded") and not twin.compiled_layers.startswith("loaded"):
        print(f"note: the diffusion model's layers run compiled and the twin's do not ({twin.compiled_layers}); "
              f"`diffill compile --model {args.twin}` compiles the twin's for a like-for-like comparison",
              file=sys.stderr)
    report = {**header, "twin": str(args.twin), "twin_dtype": twin.precision,
              "twin_compiled_layers": twin.compiled_layers, **report}
    if args.out is not None:
        args.out.parent.mkdir(parents=True, exist_ok=True)
        args.out.write_text(json.dumps(report, indent=2) + "\n", encoding="utf-8")
    if args.plot is not None:
        plot_sweep(report, args.plot)
    print(json.dumps(report, indent=2) if args.json else table(report))
    return 0


def _progress(stage: str, done: int, total: int) -> None:
    """A progress line on stderr (stdout carries the report)."""
    print(f"\r{stage}: {done}/{total}", end="\n" if done == total else "", file=sys.stderr, flush=True)


def table(report: dict) -> str:
    """The side-by-side table and the sweep, as text."""
    diffusion, twin = report["diffusion"], report["autoregressive"]
    lines = [
        f"diffusion: {report['model']}  twin: {report['twin']}  threads {report['threads']}  "
        f"{diffusion['problems']} problems, {report['max_tokens']} positions"
        f"{', single line' if report.get('single_line') else ''}"
        f"{', stopped at the suffix' if report.get('stop_at_suffix') else ''}",
        f"diffusion: {report['dtype']}, compiled layers {report['compiled_layers']}",
        f"twin:      {report['twin_dtype']}, compiled layers {report['twin_compiled_layers']}",
        f"{'':16}{'pass@1':>8}{'exact':>8}{'ms p50':>9}{'ms mean':>9}{'ms p90':>9}{'cpu p50':>9}{'fwd p50':>9}"
        f"{'tok p50':>9}",
    ]
    for name, side in (("diffusion", diffusion), ("autoregressive", twin)):
        lines.append(f"{name:16}{side['pass@1']:>8}{side['exact_match']:>8}{side['ms_median']:>9}"
                     f"{side['ms_mean']:>9}{side['ms_p90']:>9}{side['cpu_ms_median']:>9}"
                     f"{side['forward_passes_median']:>9}"
                     f"{side['tokens_median']:>9}")
    lines.append(f"diffusion is {report['speedup_median']}x the twin's speed (median ms; mean: "
                 f"{report['speedup_mean']}x; CPU ms: {report['speedup_cpu_median']}x), pass@1 "
                 f"{report['pass@1_difference']:+} points")
    lines.append(f"had the twin stopped at each true middle's length: {twin['ms_at_true_length_median']} ms median, "
                 f"diffusion {report['speedup_at_true_length_median']}x its speed")
    points = report["sweep"]["points"]
    if points:
        lines.append(f"sweep ({report['sweep']['problems']} problems):")
        lines.append(f"  {'side':16}{'setting':42}{'pass@1':>8}{'exact':>8}{'ms p50':>9}{'cpu p50':>9}{'fwd p50':>9}")
        for p in points:
            lines.append(f"  {p['side']:16}{p['setting']:42}{p['pass@1']:>8}{p['exact_match']:>8}"
                         f"{p['ms_median']:>9}{p['cpu_ms_median']:>9}{p['forward_passes_median']:>9}")
    return "\n".join(lines)
