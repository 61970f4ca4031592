"""Benchmarks: what a fill costs on this machine (`diffill bench spans|ghost`). Benchmarks measure; tests assert."""

from __future__ import annotations

import statistics
from dataclasses import replace
from typing import Any

from infill_engine.engine import InfillEngine, InfillRequest

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
