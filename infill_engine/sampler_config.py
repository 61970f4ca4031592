"""The denoising loop's settings (`SamplerConfig`), and reading them from text and JSON, without torch.

The loop itself is `infill_engine.sampler`; the settings live apart so that the language server can check a user's
sampler settings before any model (or torch) loads.
"""

from __future__ import annotations

import math
from collections.abc import Callable, Mapping
from dataclasses import dataclass, fields, replace
from typing import Any

COMMIT_RULES = ("threshold", "schedule", "factor", "entropy_bound")
ORDERS = ("confidence", "margin", "entropy", "random")
DRAWS = ("inverse_cdf", "multinomial")  # how a sampled token is drawn (SamplerConfig.draw)


@dataclass(frozen=True)
class SamplerConfig:
    """Every knob of the denoising loop.

    Args:
        steps: at most this many forward passes per block.
        block_size: span positions denoised together; a longer span goes block by block.
        commit: how many positions a step commits. "threshold" (Fast-dLLM): every free position whose score
            reaches `threshold`, always at least one. "schedule" (LLaDA): the free positions spread evenly over
            the steps left. "factor" (Fast-dLLM's factor rule): the surest n free positions, where the i-th surest
            has a score of at least 1 - `factor` / (i + 1) for every i from 2 to n (0.67, 0.75, 0.8, ... at
            factor 1), always at least one. "entropy_bound" (DiffusionGemma): the lowest-entropy positions while
            sum(entropy) - max(entropy) <= `entropy_bound`; nothing stays committed, the rest is re-noised.
        order: which free positions go first. "confidence": probability of the drawn token; "margin": top-1 minus
            top-2 probability; "entropy": exp(-entropy); "random": a uniform draw.
        threshold: commit="threshold": the score a position needs to be committed in parallel.
        factor: commit="factor": the factor f of the rule (n + 1) * (1 - score of the n-th surest) < f; larger
            commits more positions at once.
        min_commits: commit="threshold"/"schedule"/"factor": a step commits at least this many positions (its
            surest), 1 as in Fast-dLLM. Fills that must write something (`end_after_content`) and refines always
            use 1: there the forced positions would be content the model is not sure of (the loop sees to it).
        entropy_bound: commit="entropy_bound": the bound on the summed entropy of accepted positions (nats).
        stable_floor: commit="threshold"/"schedule": a free position whose argmax is the same token as at the pass
            before, with probability >= this, is committed too (the model has said it twice, the second time
            after the canvas changed around it); 0 turns it off.
        copy_floor: commit="threshold"/"schedule"/"factor": after the rule's own commits, an open position whose
            argmax is a token that followed the same `copy_ngram` tokens somewhere in the prefix or the suffix, with
            probability >= this, is committed too, left to right (prompt lookup, the model verifying the
            context's proposal; `infill_engine.context_copy`); 0 turns it off. Fills on one canvas only.
        copy_ngram: how many tokens before a position must match the context for `copy_floor`.
        force_content: commit="threshold"/"schedule"/"factor": a step whose commits would all be end-of-span
            commits its leftmost open position too where that holds text (not end-of-span), so that a pass is not
            spent walking the span's end in alone.
        revise_below: self-correction: a committed token whose probability falls below this, while the model now
            prefers another token, is re-noised and decided again. 0 turns it off.
        stability_steps: early stop when the argmax canvas is unchanged for this many steps ...
        confidence_threshold: ... and the mean entropy of the span's undecided positions is below this (nats)
            (with commit="threshold"/"schedule", a committed position is decided and holds its token).
        temperature_start: temperature of the first step; a linear schedule runs to `temperature_end` at the
            last step. 0 means greedy (argmax, no sampling).
        temperature_end: temperature of the last step.
        greedy_first: with several candidates, the first is always decoded greedily (the best single guess) and
            the others are sampled at the scheduled temperature (or at 0.7 when that is 0).
        suppress_special: never write the mask, pad or other special tokens (other than end-of-span) into a span.
        allow_end_of_span: the model may end the span early; False fills every position (a known length).
        min_tokens: the span holds at least this many tokens before it may end (an empty fill is never offered,
            so by default the first position cannot end it).
        end_after_content: the span may end only after a committed token that is not whitespace, so a fill of
            indentation alone (which the user sees as nothing) is not offered either; until a row has such a
            token, a step commits only where the model did not want the end, or at the leftmost open position
            (`start_before_end`). Off here; InfillRequest.require_content turns it on for a request (pass@1 and
            cost with the embedded models: docs/BENCHMARKS.md, "Fills that must write something").
        stop_at_line_break: single-line fills: once the committed run from the span start holds a line break, the
            span ends there (what follows would be cut anyway), so no step is spent on it.
        settle_tail: commit="threshold"/"schedule": when the argmax is end-of-span at every position from some
            position to the end of the canvas, each with probability >= `tail_floor`, that whole tail is
            committed as end-of-span in one step (instead of walking the end in from the right step by step).
        tail_floor: settle_tail: the model probability of end-of-span each position of the tail needs.
        tail_first: settle_tail: the tail is settled before the commit rule picks its positions, so the one
            position a step always commits is one before the tail (content, or the end walked in), not one the
            tail settles anyway.
        canvas_refresh: commit="threshold"/"schedule", denoisers that `reuses_canvas_keys`: 0 runs the layers over
            the whole canvas at every pass. N > 0 does so at a block's first pass and every N-th after it; the
            passes in between run them only over the positions still open or changed since the pass before (and
            those whose outputs give the open positions' logits), and a committed, unchanged position is attended
            with the keys and values of its last pass: computed once more after its token is committed, then kept
            (dKV-Cache's delayed cache, an approximation: they are not recomputed against later commits).
        end_bias: added to the end-of-span logits (nats) before tokens are picked, at every position unless
            `end_bias_until_content`: below 0 the model writes more before it ends a span at unknown length, above 0
            less. 0 leaves the model as it is.
        end_bias_until_content: end_bias only up to each row's first committed token that is not whitespace (and
            everywhere while it has none): it keeps a fill from ending before it has written anything, and leaves
            where a fill with content ends to the model.
        draw: how a sampled token is drawn. "inverse_cdf": one uniform draw per position (fast with several
            candidates); "multinomial": `torch.multinomial` over every row, the draw of transformers' DiffusionGemma
            `generate()`, so the same seed gives its tokens exactly (slower: an exponential variate per vocabulary
            entry). Both draw from the same distribution.
        seed: the random seed; the same seed and inputs give the same output.
    """

    steps: int = 24
    block_size: int = 32
    commit: str = "threshold"
    order: str = "confidence"
    threshold: float = 0.9
    factor: float = 1.0
    min_commits: int = 1
    entropy_bound: float = 0.1
    stable_floor: float = 0.0
    copy_floor: float = 0.0
    copy_ngram: int = 2
    force_content: bool = False
    revise_below: float = 0.0
    stability_steps: int = 1
    confidence_threshold: float = 0.005
    temperature_start: float = 0.0
    temperature_end: float = 0.0
    greedy_first: bool = True
    suppress_special: bool = True
    allow_end_of_span: bool = True
    min_tokens: int = 1
    end_after_content: bool = False
    stop_at_line_break: bool = False
    settle_tail: bool = True
    tail_floor: float = 0.2
    tail_first: bool = False
    canvas_refresh: int = 0
    end_bias: float = 0.0
    end_bias_until_content: bool = False
    draw: str = "inverse_cdf"
    seed: int = 0

    def __post_init__(self) -> None:
        problems = []
        if not isinstance(self.steps, int) or self.steps < 1:
            problems.append(f"steps must be an integer >= 1 (got {self.steps!r})")
        if not isinstance(self.block_size, int) or self.block_size < 1:
            problems.append(f"block_size must be an integer >= 1 (got {self.block_size!r})")
        if self.commit not in COMMIT_RULES:
            problems.append(f"commit must be one of {', '.join(COMMIT_RULES)} (got {self.commit!r})")
        if self.order not in ORDERS:
            problems.append(f"order must be one of {', '.join(ORDERS)} (got {self.order!r})")
        if not 0.0 <= self.threshold <= 1.0:
            problems.append(f"threshold must be within 0..1 (got {self.threshold!r})")
        if not (self.factor > 0 and math.isfinite(self.factor)):
            problems.append(f"factor must be a number > 0 (got {self.factor!r})")
        if not self.entropy_bound > 0:
            problems.append(f"entropy_bound must be > 0 (got {self.entropy_bound!r})")
        if self.draw not in DRAWS:
            problems.append(f"draw must be one of {', '.join(DRAWS)} (got {self.draw!r})")
        if not 0.0 <= self.tail_floor <= 1.0:
            problems.append(f"tail_floor must be within 0..1 (got {self.tail_floor!r})")
        if not math.isfinite(self.end_bias):
            problems.append(f"end_bias must be a finite number of nats (got {self.end_bias!r})")
        if not 0.0 <= self.stable_floor <= 1.0:
            problems.append(f"stable_floor must be within 0..1, 0 for off (got {self.stable_floor!r})")
        if not 0.0 <= self.copy_floor <= 1.0:
            problems.append(f"copy_floor must be within 0..1, 0 for off (got {self.copy_floor!r})")
        if not isinstance(self.copy_ngram, int) or isinstance(self.copy_ngram, bool) or self.copy_ngram < 1:
            problems.append(f"copy_ngram must be an integer >= 1 (got {self.copy_ngram!r})")
        if not 0.0 <= self.revise_below < 1.0:
            problems.append(f"revise_below must be within 0..1 (got {self.revise_below!r})")
        if not isinstance(self.min_commits, int) or isinstance(self.min_commits, bool) or self.min_commits < 1:
            problems.append(f"min_commits must be an integer >= 1 (got {self.min_commits!r})")
        if not isinstance(self.min_tokens, int) or self.min_tokens < 0:
            problems.append(f"min_tokens must be an integer >= 0 (got {self.min_tokens!r})")
        if not isinstance(self.canvas_refresh, int) or self.canvas_refresh < 0:
            problems.append(f"canvas_refresh must be an integer >= 0, 0 for off (got {self.canvas_refresh!r})")
        if not isinstance(self.stability_steps, int) or self.stability_steps < 0:
            problems.append(f"stability_steps must be an integer >= 0 (got {self.stability_steps!r})")
        if self.temperature_start < 0 or self.temperature_end < 0:
            problems.append("temperatures must be >= 0")
        if problems:
            raise ValueError("; ".join(problems))


def sampler_overrides(text: str) -> dict[str, Any]:
    """SamplerConfig fields from "KEY=VALUE[,KEY=VALUE...]", each read as its field's type; ValueError names a bad
    key or value (the sampler's own checks included)."""
    types = {f.name: type(getattr(SamplerConfig, f.name)) for f in fields(SamplerConfig)}
    overrides: dict[str, Any] = {}
    for item in filter(None, (part.strip() for part in text.split(","))):
        key, _, value = item.partition("=")
        key = key.strip().replace("-", "_")
        if key not in types or not value:
            raise ValueError(f"a sampler override is KEY=VALUE with KEY one of {', '.join(types)} (got {item!r})")
        if types[key] is bool:
            if value.lower() not in ("true", "false"):
                raise ValueError(f"{key} is true or false (got {value!r})")
            overrides[key] = value.lower() == "true"
        else:
            try:
                overrides[key] = types[key](value)
            except ValueError:
                raise ValueError(f"{key} must be a {types[key].__name__} (got {value!r})") from None
    replace(SamplerConfig(), **overrides)  # validated with the sampler's own messages
    return overrides


def checked_sampler_settings(
    settings: Any, where: str = "", exclude: tuple[str, ...] = (), spell: Callable[[str], str] = str
) -> dict[str, Any]:
    """SamplerConfig fields from a JSON object, each of its field's type and passing the sampler's own checks;
    ValueError, after `where`, names an unknown or `exclude`d key or a wrong value and says what is allowed (field
    names as `spell` writes them)."""
    lead = f"{where} " if where else ""
    if not isinstance(settings, Mapping):
        raise ValueError(f"{lead}must be an object of sampler settings (got {settings!r})")
    own = sorted(set(settings) & set(exclude))
    if own:
        raise ValueError(f"{lead}cannot set {', '.join(map(spell, own))}: each has a setting of its own")
    defaults = SamplerConfig()
    allowed = [f.name for f in fields(SamplerConfig) if f.name not in exclude]
    unknown = sorted(set(settings) - set(allowed))
    if unknown:
        raise ValueError(f"{lead}has unknown sampler settings {', '.join(map(spell, unknown))}; allowed: "
                         f"{', '.join(map(spell, allowed))}")
    for key, value in settings.items():
        expected = type(getattr(defaults, key))
        if not _of_setting_type(value, expected):
            wanted = {bool: "true or false", int: "an integer", float: "a number"}.get(expected, "text")
            raise ValueError(f"{lead}{spell(key)} must be {wanted} (got {value!r})")
    try:
        replace(defaults, **settings)
    except ValueError as error:
        raise ValueError(f"{lead}{error}") from None
    return dict(settings)


def _of_setting_type(value: Any, expected: type) -> bool:
    """Whether a JSON value fits a SamplerConfig field of type `expected` (an integer is a fine float; a bool is
    neither a number nor text)."""
    if expected is bool or isinstance(value, bool):
        return expected is bool and isinstance(value, bool)
    if expected is float:
        return isinstance(value, (int, float))
    return isinstance(value, expected)


def sampler_variant(text: str, base: SamplerConfig) -> SamplerConfig:
    """`base` with the "KEY=VALUE,..." overrides of `sampler_overrides`."""
    return replace(base, **sampler_overrides(text))
