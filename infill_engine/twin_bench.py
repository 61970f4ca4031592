"""The diffusion engine against its autoregressive twin on the same problems, in one process (`diffill bench vs-ar`).

The twin (`fim_generation`) has the diffusion model's size, tokenizer and training tokens, with causal attention,
fill-in-the-middle ordering and a KV cache. Both fill every problem at unknown length with the same number of
positions (`max_tokens`: the diffusion canvas, the twin's most tokens) and the same context budget, without the
syntax gate (it would apply to either alike), greedily. For the main comparison the two alternate problem by
problem, so load on the machine falls on both alike; besides wall-clock ms each fill's CPU time of this process
is reported (with one torch thread it is the fill's own work, which a shared machine does not inflate as much as
wall time). Then the diffusion engine alone is swept over sampler settings
(steps, threshold, entropy bound), each a point of pass@1 against ms per fill. Benchmarks measure; tests never
assert timings.
"""

from __future__ import annotations

import logging
import statistics
import time
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any

from infill_engine.engine import InfillEngine, InfillRequest
from infill_engine.evaluation import Problem, run_test
from infill_engine.fim_generation import FimGenerator, cut_at_suffix_line, first_suffix_line
from infill_engine.sampler import SamplerConfig, sampler_overrides

logger = logging.getLogger(__name__)

@dataclass
class Fill:
    """One fill of one problem by one side."""

    task_id: str
    completion: str
    ms: float  # the whole fill (wall clock): tokenize, encode, decode
    cpu_ms: float  # this process's CPU time during the fill
    forward_passes: int
    tokens: int  # tokens written
    exact: bool = False
    passed: bool = False
    # the twin only: its ms had it stopped after the true middle's token count (its measured ms per token), the cost
    # any twin that writes the right answer pays, whether or not this one has learned to end a middle
    ms_at_true_length: float | None = None


def summarize(fills: list[Fill]) -> dict[str, Any]:
    """pass@1, exact match (percent) and ms per fill (median, mean, p90), forward passes and tokens (median)."""
    count = max(len(fills), 1)
    ms = sorted(f.ms for f in fills) or [0.0]
    return {
        "problems": len(fills),
        "pass@1": round(100 * sum(f.passed for f in fills) / count, 2),
        "exact_match": round(100 * sum(f.exact for f in fills) / count, 2),
        "ms_median": round(statistics.median(ms), 1),
        "ms_mean": round(statistics.mean(ms), 1),
        "ms_p90": round(ms[min(len(ms) - 1, round(0.9 * len(ms)) - 1)], 1),
        "cpu_ms_median": round(statistics.median(f.cpu_ms for f in fills), 1) if fills else 0.0,
        "forward_passes_median": statistics.median(f.forward_passes for f in fills) if fills else 0,
        "tokens_median": statistics.median(f.tokens for f in fills) if fills else 0,
        **({"ms_at_true_length_median": round(statistics.median(f.ms_at_true_length for f in fills), 1)}
           if fills and all(f.ms_at_true_length is not None for f in fills) else {}),
    }


def line_completion(text: str, single_line: bool) -> str:
    """What is scored: a single-line fill is cut before its line break, so the hole's own line break is given back."""
    return text + "\n" if single_line else text


def diffusion_fill(
    engine: InfillEngine, problem: Problem, max_tokens: int, single_line: bool = False, stop_at_suffix: bool = False
) -> Fill:
    """The engine's fill of a problem at unknown length, without the syntax gate (cut at its first line break with
    `single_line`, as ghost text is; with `stop_at_suffix`, before a line that repeats the suffix's first line, as the
    twin stops there)."""
    cpu = time.process_time()
    result = engine.fill(InfillRequest(problem.prompt, problem.suffix, "python", max_tokens=max_tokens, gate=False,
                                       single_line=single_line))
    cpu_ms = (time.process_time() - cpu) * 1000
    best = result.candidates[0] if result.candidates else None
    text = best.text if best else ""
    if stop_at_suffix:
        cut = cut_at_suffix_line(text, first_suffix_line(problem.suffix))
        text = text if cut is None else cut
    return Fill(problem.task_id, line_completion(text, single_line),
                result.stats.ms.get("total", 0.0), cpu_ms, result.stats.forward_passes,
                len(best.token_ids) if best else 0)


def twin_fill(
    twin: FimGenerator, problem: Problem, max_tokens: int, use_cache: bool = True, single_line: bool = False,
    stop_at_suffix: bool = False,
) -> Fill:
    """The twin's greedy fill of a problem, up to `max_tokens` tokens (stopped at its first line break with
    `single_line`, at a line that repeats the suffix's first line with `stop_at_suffix`)."""
    cpu = time.process_time()
    fill = twin.fill(problem.prompt, problem.suffix, max_tokens, use_cache=use_cache, single_line=single_line,
                     stop_at_suffix=stop_at_suffix)
    cpu_ms = (time.process_time() - cpu) * 1000
    true_ids = twin.tokenizer(problem.canonical_solution, add_special_tokens=False)["input_ids"]
    true_tokens = min(max_tokens, len(true_ids))
    # writing n tokens and the end token takes the prompt's pass and n passes more
    per_pass = fill.ms["decode"] / max(fill.forward_passes - 1, 1)
    at_true_length = fill.ms["tokenize"] + fill.ms["encode"] + true_tokens * per_pass
    return Fill(problem.task_id, line_completion(fill.text, single_line), fill.ms["total"], cpu_ms,
                fill.forward_passes, len(fill.token_ids), ms_at_true_length=at_true_length)


def score(problems: list[Problem], fills: list[Fill], workers: int) -> None:
    """Set exact and passed on each fill (the tests run in sandboxed subprocesses, `workers` at a time)."""
    by_id = {p.task_id: p for p in problems}
    for fill in fills:
        fill.exact = fill.completion.strip() == by_id[fill.task_id].canonical_solution.strip()
    with ThreadPoolExecutor(max_workers=workers) as pool:
        for fill, passed in zip(fills, pool.map(lambda f: run_test(by_id[f.task_id], f.completion), fills)):
            fill.passed = passed


def compare(
    engine: InfillEngine,
    twin: FimGenerator,
    problems: list[Problem],
    max_tokens: int = 64,
    sweep: list[str] | tuple[str, ...] = (),
    sweep_problems: list[Problem] | None = None,
    uncached: bool = False,
    workers: int = 2,
    progress: Callable[[str, int, int], None] | None = None,
    single_line: bool = False,
    stop_at_suffix: bool = False,
) -> dict[str, Any]:
    """Both models on the same problems (alternating), then the diffusion sweep (`sampler_overrides` strings); a
    JSON-ready report. `single_line`: every fill on both sides ends at its first line break, as ghost text does;
    `stop_at_suffix`: before a line that repeats the suffix's first line (the twin stops writing there)."""
    stops = {"single_line": single_line, "stop_at_suffix": stop_at_suffix}
    settings = [(text, sampler_overrides(text)) for text in sweep]
    sweep_problems = sweep_problems if sweep_problems is not None else problems
    base = engine.sampler
    diffusion_fill(engine, problems[0], max_tokens, **stops)  # warm-up, not counted
    twin_fill(twin, problems[0], max_tokens, **stops)
    diffusion, autoregressive = [], []
    for number, problem in enumerate(problems, 1):
        diffusion.append(diffusion_fill(engine, problem, max_tokens, **stops))
        autoregressive.append(twin_fill(twin, problem, max_tokens, **stops))
        if progress is not None:
            progress("both", number, len(problems))
    score(problems, diffusion, workers)
    score(problems, autoregressive, workers)
    main_diffusion, main_twin = summarize(diffusion), summarize(autoregressive)
    report: dict[str, Any] = {
        "max_tokens": max_tokens,
        "single_line": single_line,
        "stop_at_suffix": stop_at_suffix,
        "diffusion": {"sampler": _sampler_dict(base), **main_diffusion},
        "autoregressive": main_twin,
        "speedup_median": _ratio(main_twin["ms_median"], main_diffusion["ms_median"]),
        "speedup_mean": _ratio(main_twin["ms_mean"], main_diffusion["ms_mean"]),
        "speedup_cpu_median": _ratio(main_twin["cpu_ms_median"], main_diffusion["cpu_ms_median"]),
        "speedup_at_true_length_median": _ratio(main_twin["ms_at_true_length_median"], main_diffusion["ms_median"]),
        "pass@1_difference": round(main_diffusion["pass@1"] - main_twin["pass@1"], 2),
        "outcomes": [
            {"task_id": d.task_id, "diffusion": _fill_dict(d), "autoregressive": _fill_dict(a)}
            for d, a in zip(diffusion, autoregressive)
        ],
    }
    points: list[dict[str, Any]] = []
    if sweep_problems is problems:
        points.append({"side": "diffusion", "setting": "default", **main_diffusion})
        points.append({"side": "autoregressive", "setting": "KV cache", **main_twin})
    else:  # the sweep's points are on their own problems: measure the defaults and the twin there too
        settings.insert(0, ("default", {}))
        fills = [twin_fill(twin, p, max_tokens, **stops) for p in sweep_problems]
        score(sweep_problems, fills, workers)
        points.append({"side": "autoregressive", "setting": "KV cache", **summarize(fills)})
    if uncached:  # what the twin's cache buys: every token re-runs the whole sequence
        fills = [twin_fill(twin, p, max_tokens, use_cache=False, **stops) for p in sweep_problems]
        score(sweep_problems, fills, workers)
        points.append({"side": "autoregressive", "setting": "no cache", **summarize(fills)})
    for text, overrides in settings:
        engine.sampler = replace(base, **overrides)
        try:
            fills = []
            for number, problem in enumerate(sweep_problems, 1):
                fills.append(diffusion_fill(engine, problem, max_tokens, **stops))
                if progress is not None:
                    progress(text, number, len(sweep_problems))
        finally:
            engine.sampler = base
        score(sweep_problems, fills, workers)
        points.append({"side": "diffusion", "setting": text, **summarize(fills)})
    report["sweep"] = {"problems": len(sweep_problems), "points": points}
    return report


def _ratio(numerator: float, denominator: float) -> float | None:
    """numerator / denominator, rounded; None when the denominator is 0."""
    return round(numerator / denominator, 2) if denominator else None


def _fill_dict(fill: Fill) -> dict[str, Any]:
    """A fill as JSON (without its task id, which the row carries)."""
    return {"completion": fill.completion, "passed": fill.passed, "exact": fill.exact, "ms": round(fill.ms, 1),
            "cpu_ms": round(fill.cpu_ms, 1), "forward_passes": fill.forward_passes, "tokens": fill.tokens,
            **({} if fill.ms_at_true_length is None else {"ms_at_true_length": round(fill.ms_at_true_length, 1)})}


def _sampler_dict(config: SamplerConfig) -> dict[str, Any]:
    """The sampler knobs the sweep varies."""
    return {"commit": config.commit, "steps": config.steps, "threshold": config.threshold, "factor": config.factor,
            "entropy_bound": config.entropy_bound}


def plot_sweep(report: dict[str, Any], path: Path, title: str | None = None) -> None:
    """pass@1 against ms per fill, wall clock and CPU (medians, log scale), for every point of the sweep, as a PNG
    (needs matplotlib)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    figure, panels = plt.subplots(1, 2, figsize=(12, 5), dpi=120, sharey=True)
    styles = {"diffusion": ("tab:blue", "o"), "autoregressive": ("tab:red", "s")}
    for axes, key, name in zip(panels, ("ms_median", "cpu_ms_median"), ("wall-clock ms", "CPU ms")):
        for side, (color, marker) in styles.items():
            points = [p for p in report["sweep"]["points"] if p["side"] == side]
            if not points:
                continue
            axes.scatter([p[key] for p in points], [p["pass@1"] for p in points], color=color, marker=marker,
                         s=48, label=f"{side} ({'sampler settings' if side == 'diffusion' else 'greedy'})", zorder=3)
            for number, p in enumerate(points):  # labels staggered: points of equal pass@1 sit side by side
                axes.annotate(p["setting"].replace("commit=entropy_bound,", ""), (p[key], p["pass@1"]),
                              textcoords="offset points", xytext=(4, 6 + 11 * (number % 4)), fontsize=7,
                              color=color, rotation=20)
        axes.set_xscale("log")
        axes.set_xlabel(f"{name} per fill (median, {report['max_tokens']} positions, log scale)")
        axes.grid(True, which="both", alpha=0.3)
        axes.legend(loc="best", fontsize=8)
    panels[0].set_ylabel(f"pass@1 (%, {report['sweep']['problems']} problems)")
    figure.suptitle(title or "diffusion sampler settings against the autoregressive twin")
    figure.tight_layout()
    path.parent.mkdir(parents=True, exist_ok=True)
    figure.savefig(path)
    plt.close(figure)
