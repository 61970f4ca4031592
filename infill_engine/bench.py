"""What a fill costs on this machine (`diffill bench spans|ghost|fill`). Benchmarks measure; tests assert."""

from __future__ import annotations

import copy
import math
import statistics
import time
from dataclasses import dataclass, replace
from typing import TYPE_CHECKING, Any, NamedTuple

import torch

from infill_engine.canvas import trim_context
from infill_engine.commit_rules import fresh_noise
from infill_engine.engine import InfillEngine, InfillRequest, InfillResult
from infill_engine.sampler import SamplerConfig, sampler_variant

if TYPE_CHECKING:
    from infill_engine.evaluation import Problem

BENCH_PREFIX = (
    "import json\n\n\ndef load_settings(path):\n    \"\"\"Read a JSON settings file into a dict.\"\"\"\n"
    "    with open(path, encoding='utf-8') as handle:\n        data = json.load(handle)\n    return "
)
BENCH_SUFFIX = "\n\n\ndef save_settings(path, settings):\n    with open(path, 'w') as handle:\n        json.dump(settings, handle)\n"


def bench_spans(engine: InfillEngine, spans: list[int], repeats: int = 3) -> list[dict[str, Any]]:
    """Milliseconds per denoising step, steps and tokens per forward for canvases of each span length."""
    rows: list[dict[str, Any]] = []
    for span in spans:
        room = engine.denoiser.max_positions - span - 2
        if room < 16:  # no room left for context: say so instead of measuring a context-free fill
            rows.append({"span": span, "skipped": f"the model has {engine.denoiser.max_positions} positions"})
            continue
        engine_config = replace(engine.sampler, block_size=max(engine.sampler.block_size, span))
        runs = []
        for repeat in range(repeats + 1):  # the first run warms up and is not counted
            engine.sampler = replace(engine_config, seed=repeat)
            stats = engine.fill(InfillRequest(BENCH_PREFIX, BENCH_SUFFIX, "python", max_tokens=span, gate=False)).stats
            if repeat:
                runs.append(stats)
        rows.append({
            "span": span,
            "ms_per_step": round(statistics.median(s.ms["denoise"] / max(s.forward_passes, 1) for s in runs), 2),
            "ms_encode": round(statistics.median(s.ms.get("encode", 0.0) for s in runs), 2),
            "steps": statistics.median(s.forward_passes for s in runs),
            "tokens_per_forward": round(statistics.median(s.tokens_per_forward for s in runs), 3),
            "ms_total": round(statistics.median(s.ms["total"] for s in runs), 1),
        })
    return rows


def _percentile(values: list[float], share: float) -> float:
    """The value below which `share` of the sorted values fall (nearest rank)."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(share * len(ordered)) - 1))]


def bench_ghost(
    engine: InfillEngine, holes: list[tuple[str, str]], max_tokens: int = 24, candidates: int = 1
) -> dict[str, Any]:
    """Single-line ghost text as an editor asks for it at each (prefix, suffix) hole: latency, steps, yield."""
    engine.fill(InfillRequest(*holes[0], "python", max_tokens=max_tokens, single_line=True))  # warm-up, not counted
    runs = [
        engine.fill(InfillRequest(prefix, suffix, "python", max_tokens=max_tokens, candidates=candidates,
                                  single_line=True))
        for prefix, suffix in holes
    ]
    totals = [r.stats.ms["total"] for r in runs]
    return {
        "holes": len(runs),
        "max_tokens": max_tokens,
        "candidates": candidates,
        "ms_median": round(statistics.median(totals), 1),
        "ms_p90": round(_percentile(totals, 0.9), 1),
        "forward_passes_median": statistics.median(r.stats.forward_passes for r in runs),
        "tokens_per_forward": round(statistics.median(r.stats.tokens_per_forward for r in runs), 3),
        "with_suggestion": round(sum(1 for r in runs if r.candidates and r.candidates[0].text.strip()) / len(runs), 3),
    }


# ------------------------------------------------------------------------------------------ diffill bench fill

LINE = "line"  # the span kind of single-line ghost text: `LINE_POSITIONS` positions, cut at the first line break
LINE_POSITIONS = 24  # as the server's completion.lineTokens
STAGES = ("tokenize", "encode", "denoise", "gate", "repair")  # disjoint parts of a fill's total


@dataclass(frozen=True)
class FillCase:
    """One kind of fill the benchmark measures: a span of `positions`, single-line or not."""

    name: str  # "line" or the positions as text
    positions: int
    single_line: bool


def ghost_text_hole(prefix: str, suffix: str, middle: str) -> tuple[str, str]:
    """A benchmark hole as single-line ghost text meets it: where the true `middle` ends its line, that line break
    stays in the document after the cursor, since a single-line fill stops before its first line break (without it
    the syntax gate judges the fill joined to the next line, and repairs and rejects what is not broken)."""
    return (prefix, "\n" + suffix) if middle.endswith("\n") else (prefix, suffix)


def fill_cases(spans: list[str]) -> list[FillCase]:
    """Cases from command-line spans: "line" or a number of positions; ValueError for anything else."""
    cases = []
    for span in spans:
        if span == LINE:
            cases.append(FillCase(LINE, LINE_POSITIONS, True))
        elif span.isdigit() and int(span) >= 1:
            cases.append(FillCase(span, int(span), False))
        else:
            raise ValueError(f"a span is {LINE!r} or a number of positions >= 1 (got {span!r})")
    return cases


def matmul_peak_gflops(size: int = 1024, repeats: int = 10, dtype: torch.dtype = torch.float32) -> float:
    """GFLOP/s of the fastest of `repeats` square matmuls in `dtype` at torch's current thread count."""
    a, b = torch.randn(size, size, dtype=dtype), torch.randn(size, size, dtype=dtype)
    a @ b  # warm-up
    best = math.inf
    for _ in range(repeats):
        start = time.perf_counter()
        a @ b
        best = min(best, time.perf_counter() - start)
    return 2 * size**3 / best / 1e9


@torch.no_grad()
def forward_cost(engine: InfillEngine, prefix: str, suffix: str, positions: int, candidates: int,
                 repeats: int = 3) -> tuple[int, float, float]:
    """FLOPs of one denoising forward pass over the whole canvas at this hole (torch's FlopCounterMode), its median
    milliseconds, and the FLOPs of the output projection per canvas position and row, which a pass that projects
    only the open columns (`Denoiser.projects_columns`) spends only there (0 for other denoisers)."""
    from torch.utils.flop_counter import FlopCounterMode

    denoiser = engine.denoiser
    trimmed = trim_context(denoiser.tokenizer, prefix, suffix, engine.context_budget(positions))
    context = denoiser.encode(trimmed.prefix_ids, trimmed.suffix_ids, positions, candidates)
    canvas = fresh_noise(denoiser, (candidates, positions), torch.Generator(device=denoiser.device).manual_seed(0))
    with FlopCounterMode(display=False) as counter:
        denoiser.predict(context, canvas)
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        denoiser.predict(context, canvas)
        times.append((time.perf_counter() - start) * 1000.0)
    flops, head = counter.get_total_flops(), 0.0
    if denoiser.projects_columns and positions > 1:
        with FlopCounterMode(display=False) as one_column:
            denoiser.predict(context, canvas, columns=torch.zeros(1, dtype=torch.long, device=canvas.device))
        head = (flops - one_column.get_total_flops()) / (candidates * (positions - 1))
    return flops, statistics.median(times), head


class MeasuredFill(NamedTuple):
    """One measured fill and what it ran."""

    result: InfillResult
    steps: int  # steps of its main loop (repairs excluded)
    encoded: int  # context positions it encoded
    canvas_run: int | None  # canvas positions its layers ran over, all passes and rows; None: not counted


def _measured_fill(engine: InfillEngine, request: InfillRequest, after_keystroke: bool = False) -> MeasuredFill:
    """The fill and what it ran (`MeasuredFill`; the canvas positions where the denoiser counts them). Each hole is a
    new request: nothing of another hole's prefix is reused; `after_keystroke` first fills (uncounted) the same hole
    one character earlier, as the request of the key before, whose prefix a causal-context model then reuses."""
    steps = 0

    def count(_view: Any) -> None:
        nonlocal steps
        steps += 1

    denoiser = engine.denoiser
    prefixes = getattr(denoiser, "prefixes", None)
    if prefixes is not None:
        prefixes.clear()
    if after_keystroke and request.prefix:
        engine.fill(replace(request, prefix=request.prefix[:-1]))
    encoded = getattr(denoiser, "positions_encoded", 0)
    run = getattr(denoiser, "canvas_positions_run", None)
    result = engine.fill(request, on_step=count)
    ran = None if run is None else denoiser.canvas_positions_run - run
    return MeasuredFill(result, steps, getattr(denoiser, "positions_encoded", 0) - encoded, ran)


def bench_fill(
    engine: InfillEngine,
    holes: list[tuple[str, str]],
    cases: list[FillCase],
    variants: list[str] | None = None,
    candidates: int = 1,
    after_keystroke: bool = False,
    line_holes: list[tuple[str, str]] | None = None,
) -> dict[str, Any]:
    """Fills of each case at every hole, once per sampler variant (interleaved hole by hole, so that a change in
    the machine's load falls on every variant alike): latency, passes, tokens per forward, the split into stages,
    and achieved GFLOP/s against the matmul peak measured in the same run (in float32, and for a model that
    multiplies in bfloat16, `mixed` or `bfloat16`, in bfloat16 too). `after_keystroke`: each fill comes after
    the fill of the key before (see `_measured_fill`). `line_holes`: the same holes as single-line cases meet them
    (`ghost_text_hole`; default: `holes`)."""
    variants = variants or [""]
    base = engine.sampler
    configs = [sampler_variant(text, base) for text in variants]
    peak = matmul_peak_gflops()
    bfloat16_peak = matmul_peak_gflops(dtype=torch.bfloat16) if engine.denoiser.precision in ("mixed", "bfloat16") \
        else None
    rows = []
    try:
        for case in cases:
            room = engine.denoiser.max_positions - case.positions - 2
            if room < 16:  # no room left for context: say so instead of measuring a context-free fill
                rows.append({"span": case.name, "positions": case.positions,
                             "skipped": f"the model has {engine.denoiser.max_positions} positions"})
                continue
            case_holes = line_holes if case.single_line and line_holes is not None else holes
            requests = [InfillRequest(prefix, suffix, "python", max_tokens=case.positions, candidates=candidates,
                                      single_line=case.single_line) for prefix, suffix in case_holes]
            costs = [forward_cost(engine, r.prefix, r.suffix, case.positions, candidates) for r in requests]
            runs: list[list[MeasuredFill]] = [[] for _ in configs]
            for index, request in enumerate(requests):
                for variant, config in enumerate(configs):
                    engine.sampler = config
                    if index == 0:
                        _measured_fill(engine, request)  # warm-up, not counted
                    runs[variant].append(_measured_fill(engine, request, after_keystroke))
            for text, measured in zip(variants, runs):
                rows.append(_fill_row(case, text or "defaults", measured, costs, peak, bfloat16_peak))
    finally:
        engine.sampler = base
    return {"matmul_peak_gflops": round(peak, 1),
            **({} if bfloat16_peak is None else {"bfloat16_matmul_peak_gflops": round(bfloat16_peak, 1)}),
            "holes": len(holes), "candidates": candidates, "after_keystroke": after_keystroke, "rows": rows}


def _fill_row(case: FillCase, variant: str, measured: list[MeasuredFill],
              costs: list[tuple[int, float, float]], peak: float, bfloat16_peak: float | None = None) -> dict[str, Any]:
    """The summary of one case and variant (shares of the bfloat16 peak too where it is given)."""
    stats = [m.result.stats for m in measured]
    totals = [s.ms["total"] for s in stats]
    tokens, passes = sum(s.tokens_generated for s in stats), sum(s.forward_passes for s in stats)
    # A pass's FLOPs: the layers over the canvas positions it ran them over (all of them, or fewer where the
    # denoiser keeps canvas keys between steps: `canvas_run`), and the projection over the columns it computed
    # logits for (`positions_predicted`); both as shares of a pass over the whole canvas.
    whole = [max(s.forward_passes * s.canvas_positions * s.candidates, 1) for s in stats]
    step_flops = []
    for (flops, _, head), m, s, w in zip(costs, measured, stats, whole):
        projection = head * s.candidates * s.canvas_positions  # (B x N) columns' share of the whole pass
        layers = (flops - projection) * (1.0 if m.canvas_run is None else m.canvas_run / w)
        step_flops.append(m.steps * (layers + projection * s.positions_predicted / w))
    step_gflops = [f / s.ms["denoise"] / 1e6 for f, s in zip(step_flops, stats) if s.ms.get("denoise")]
    forward_gflops = [flops / ms / 1e6 for flops, ms, _ in costs]
    step_ms = [s.ms["denoise"] / m.steps for s, m in zip(stats, measured) if m.steps]
    achieved = statistics.median(step_gflops)
    counted = [m.canvas_run for m in measured if m.canvas_run is not None]
    forward = statistics.median(forward_gflops)
    bfloat16_shares = {} if bfloat16_peak is None else {
        "share_of_bfloat16_peak_steps": round(achieved / bfloat16_peak, 3),
        "share_of_bfloat16_peak_forward_only": round(forward / bfloat16_peak, 3)}
    return {
        "span": case.name,
        "positions": case.positions,
        "variant": variant,
        "ms_median": round(statistics.median(totals), 1),
        "ms_p95": round(_percentile(totals, 0.95), 1),
        "forward_passes_median": statistics.median(s.forward_passes for s in stats),
        "loop_steps_median": statistics.median(m.steps for m in measured),
        "positions_per_pass": round(sum(s.positions_predicted for s in stats) / max(passes, 1), 1),
        "layer_positions_per_pass": round(sum(counted) / max(passes, 1), 1) if counted else None,
        "context_positions_encoded_median": statistics.median(m.encoded for m in measured),
        "tokens_per_forward": round(tokens / max(passes, 1), 3),  # all tokens over all passes, empty fills too
        "canvas_positions_per_forward": round(sum(s.canvas_positions for s in stats) / max(passes, 1), 3),
        "tokens_median": statistics.median(s.tokens_generated for s in stats),
        "repairs_mean": round(statistics.mean(s.repairs for s in stats), 2),
        "with_suggestion": round(sum(1 for m in measured if (m.result.text or "").strip()) / len(measured), 3),
        "ms_stages_median": {stage: round(statistics.median(s.ms.get(stage, 0.0) for s in stats), 2)
                             for stage in STAGES},
        "ms_per_step_median": round(statistics.median(step_ms), 2) if step_ms else None,
        "ms_per_forward_median": round(statistics.median(ms for _, ms, _ in costs), 2),
        "gflop_per_forward": round(statistics.median(flops for flops, _, _ in costs) / 1e9, 4),
        "gflops_steps": round(achieved, 2),
        "gflops_forward_only": round(forward, 2),
        "share_of_peak_steps": round(achieved / peak, 3),
        "share_of_peak_forward_only": round(forward / peak, 3),
        **bfloat16_shares,
    }


def engine_copy(engine: InfillEngine) -> InfillEngine:
    """A copy of the engine with a model of its own (deep-copied), to change for `compare_engines`."""
    copied = copy.copy(engine)
    copied.denoiser = copy.copy(engine.denoiser)
    copied.denoiser.model = copy.deepcopy(engine.denoiser.model)
    return copied


def compare_engines(engines: dict[str, InfillEngine], problems: list["Problem"], cases: list[FillCase],
                    baseline: str) -> list[dict[str, Any]]:
    """Copies of an engine (a model changed in one way each) filling the same holes, one after another at each hole
    and in turn first (so that the machine's load falls on all alike): per case and copy, the medians of one forward
    pass, of a fill and of its passes, the median of each fill's ms over `baseline`'s at the same hole, and how many
    fills came out with `baseline`'s text (real `engine.fill`s: gate and repairs on, seed 0; single-line cases at the
    holes as ghost text meets them, `ghost_text_hole`, as in `bench_fill`)."""
    names = list(engines)
    rows = []
    for case in cases:
        forward: dict[str, list[float]] = {name: [] for name in names}
        measured: dict[str, list[InfillResult]] = {name: [] for name in names}
        holes = [ghost_text_hole(p.prompt, p.suffix, p.canonical_solution) if case.single_line else (p.prompt, p.suffix)
                 for p in problems]
        for index, (prefix, suffix) in enumerate(holes):
            request = InfillRequest(prefix, suffix, "python", max_tokens=case.positions,
                                    single_line=case.single_line, seed=0)
            turn = index % len(names)
            for name in names[turn:] + names[:turn]:
                engine = engines[name]
                forward[name].append(forward_cost(engine, prefix, suffix, case.positions, 1)[1])
                if index == 0:
                    engine.fill(request)  # warm-up, not counted
                measured[name].append(engine.fill(request))
        base = measured[baseline]
        for name in names:
            fills = measured[name]
            rows.append({
                "span": case.name, "model": name,
                "forward_ms_median": round(statistics.median(forward[name]), 2),
                "fill_ms_median": round(statistics.median(r.stats.ms["total"] for r in fills), 1),
                "fill_ms_p95": round(_percentile([r.stats.ms["total"] for r in fills], 0.95), 1),
                "passes_median": statistics.median(r.stats.forward_passes for r in fills),
                "ms_ratio_to_baseline": round(statistics.median(
                    r.stats.ms["total"] / b.stats.ms["total"] for r, b in zip(fills, base)), 3),
                "same_text_as_baseline": sum(r.text == b.text for r, b in zip(fills, base)),
            })
    return rows


def profile_one_fill(engine: InfillEngine, prefix: str, suffix: str, case: FillCase, rows: int = 15) -> str:
    """torch.profiler's table (operators by self CPU time) of one fill at this hole."""
    from torch.profiler import ProfilerActivity, profile

    request = InfillRequest(prefix, suffix, "python", max_tokens=case.positions, single_line=case.single_line)
    engine.fill(request)  # warm-up
    with profile(activities=[ProfilerActivity.CPU]) as prof:
        result, steps, _, _ = _measured_fill(engine, request)
    stats = result.stats
    header = f"{steps} loop steps, {stats.forward_passes} forward passes, {stats.ms['total']:.0f} ms\n"
    return header + prof.key_averages().table(sort_by="self_cpu_time_total", row_limit=rows)
