"""The infill engine: text around a hole in, ranked syntax-checked fills out.

    prefix, suffix -> trimmed context -> canvas -> denoising loop (K candidates in one batch)
                   -> decode up to end-of-span -> syntax gate -> repair rejected ones -> rank
"""

from __future__ import annotations

import copy
import logging
import math
import time
from dataclasses import replace

import torch

from infill_engine import syntax
from infill_engine.adapters.base import Denoiser, EncodedContext
from infill_engine.canvas import ContextConfig, trim_context
from infill_engine.growing_span import denoise_growing_span
from infill_engine.interface import (
    DEFAULT_GROW,
    DEFAULT_KEEP_ABOVE,
    OWN_SAMPLER_OPTIONS,
    EngineOptions,
    ModelInfo,
    ModelSpec,
)
from infill_engine.request import (  # noqa: F401 - the request types are part of this module's interface
    MAX_CANDIDATES,
    MAX_SPAN_TOKENS,
    Candidate,
    InfillRequest,
    InfillResult,
)
from infill_engine.sampler import DenoisedSpan, SamplerConfig, StepCallback, denoise_span
from infill_engine.stats import FillStats

logger = logging.getLogger(__name__)
# Denoisers that keep canvas keys and values (the embedded model): a pass over the whole canvas every this many steps
# of a block, in between only over the open and just-changed positions (SamplerConfig.canvas_refresh).
CANVAS_REFRESH = 8


class InfillEngine:
    """Fills holes with a diffusion denoiser in this process (an `Engine`); knows nothing of editors or LSP."""

    def __init__(
        self,
        denoiser: Denoiser,
        sampler: SamplerConfig | None = None,
        context: ContextConfig | None = None,
        repair_rounds: int = 2,
    ) -> None:
        self.denoiser = denoiser
        self.sampler = sampler or default_sampler_for(denoiser)
        self.context = context or ContextConfig()
        self.repair_rounds = repair_rounds
        self._defaults = (self.sampler, self.context)  # what `configure` starts from
        # a model with DreamOn's expand/delete tokens fills a span that grows and shrinks; others a fixed canvas
        self._fill_span = denoise_growing_span if denoiser.special.expand_id is not None else denoise_span

    @classmethod
    def load(
        cls, spec: ModelSpec | None = None, sampler: SamplerConfig | None = None, context: ContextConfig | None = None
    ) -> "InfillEngine":
        """Load the checkpoint of `spec` (by default the embedded one) and wrap it in an engine."""
        from infill_engine.loading import load_denoiser

        spec = spec or ModelSpec()
        denoiser = load_denoiser(spec.path, family=spec.family, device=spec.device, dtype=spec.dtype,
                                 trust_remote_code=spec.trust_remote_code, dual_cache=spec.dual_cache,
                                 compiled_layers=spec.compiled_layers)
        return cls(denoiser, sampler=sampler, context=context)

    # ----------------------------------------------------------------------------------- the rest of `Engine`
    def describe(self) -> ModelInfo:
        """The model's family, directory, device and dtype."""
        return ModelInfo(family=self.denoiser.family, path=str(self.denoiser.path), device=str(self.denoiser.device),
                         dtype=self.denoiser.precision)

    def count_tokens(self, text: str) -> int:
        """How many of the model's tokens `text` is."""
        return len(self.tokenize(text))

    def tokenize(self, text: str, add_special_tokens: bool = False) -> list[int]:
        """The model's token ids of `text`."""
        return list(self.denoiser.tokenizer(text, add_special_tokens=add_special_tokens)["input_ids"])

    def configure(self, options: EngineOptions) -> None:
        """Use these sampling and context settings from now on; unset ones go back to the engine's defaults."""
        self.sampler, self.context = self._with(options)

    def with_options(self, options: EngineOptions) -> "InfillEngine":
        """A shallow copy (the same model) that uses these settings, for one client of a shared engine."""
        engine = copy.copy(self)
        engine.sampler, engine.context = self._with(options, current=True)
        return engine

    def with_denoiser(self, denoiser: Denoiser) -> "InfillEngine":
        """A shallow copy (the same settings) that runs on another denoiser: a fill's member of a batch."""
        engine = copy.copy(self)
        engine.denoiser = denoiser
        return engine

    def _with(self, options: EngineOptions, current: bool = False) -> tuple[SamplerConfig, ContextConfig]:
        """The sampler and context of the defaults (or the current ones) with `options` set."""
        sampler, context = (self.sampler, self.context) if current else self._defaults
        values = options.as_dict()
        sampler = replace(sampler, **values.get("sampler", {}))
        sampler = replace(sampler, **{k: values[k] for k in OWN_SAMPLER_OPTIONS if k in values})
        context = replace(context, **{k: values[k] for k in ("prefix_tokens", "suffix_tokens") if k in values})
        return sampler, context

    def close(self) -> None:
        """Nothing to let go of: the model is freed with the engine."""

    # ------------------------------------------------------------------------------------------------ filling
    def fill(
        self, request: InfillRequest, on_step: StepCallback | None = None, *, document: str | None = None
    ) -> InfillResult:
        """Fill the hole between `request.prefix` and `request.suffix` (`document` is for shared engines)."""
        request.validate()
        stats = FillStats(candidates=request.candidates, canvas_positions=request.max_tokens)
        language = syntax.language_for(request.language) if request.language else None
        config = self.sampler if request.seed is None else replace(self.sampler, seed=request.seed)
        if request.single_line:  # the fill is cut at its first line break: stop denoising there
            config = replace(config, stop_at_line_break=True)
        if request.require_content:
            config = replace(config, end_after_content=True)
        deadline = None if request.budget_ms is None else time.perf_counter() + request.budget_ms / 1000.0
        with stats.timed("total"):
            with stats.timed("tokenize"):
                trimmed = trim_context(
                    self.denoiser.tokenizer, request.prefix, request.suffix, self.context_budget(request.max_tokens)
                )
            span = self._fill_span(
                self.denoiser, trimmed.prefix_ids, trimmed.suffix_ids, request.max_tokens, config,
                batch_size=request.candidates, stats=stats, on_step=on_step, deadline=deadline,
            )
            candidates = self._decode(span, request.single_line)
            document = request.prefix + request.suffix
            hole = len(request.prefix)
            if request.gate:
                self._gate(document, hole, hole, candidates, language, stats)
                rounds = self.repair_rounds if request.repair_rounds is None else request.repair_rounds
                with stats.timed("repair"):
                    self._repair(request, trimmed.prefix_ids, trimmed.suffix_ids, candidates, language, config, stats,
                                 rounds, deadline, span.context)
        return _ranked(candidates, stats)

    def context_budget(self, span_tokens: int) -> ContextConfig:
        """The context budget for a span, shrunk so that prefix, span and suffix fit the model's positions."""
        room = self.denoiser.max_positions - span_tokens - 2
        if room < 0:
            raise ValueError(
                f"a span of {span_tokens} tokens does not fit this model's {self.denoiser.max_positions} positions"
            )
        prefix_tokens, suffix_tokens = self.context.prefix_tokens, self.context.suffix_tokens
        if prefix_tokens + suffix_tokens > room:
            suffix_tokens = min(suffix_tokens, room // 4)
            prefix_tokens = room - suffix_tokens
        return ContextConfig(prefix_tokens=prefix_tokens, suffix_tokens=suffix_tokens)

    def _gate(
        self, document: str, start: int, end: int, candidates: list[Candidate], language: str | None, stats: FillStats
    ) -> None:
        """Check every candidate in place of document[start:end]."""
        with stats.timed("gate"):
            for candidate in candidates:
                candidate.gate = syntax.check_fill(document, start, end, candidate.text, language)

    def _decode(self, span: DenoisedSpan, single_line: bool = False) -> list[Candidate]:
        """Cut each row at its first end-of-span token (and line break, for single-line fills) and make it text."""
        end_ids = set(self.denoiser.special.end_of_span_ids)
        never = set(self.denoiser.special.ids_never_generated)
        candidates = []
        for row, probs in zip(span.tokens.tolist(), span.probs.tolist()):
            kept, kept_probs = [], []
            for token, prob in zip(row, probs):
                if token in end_ids:
                    break
                if token not in never:
                    kept.append(token)
                    kept_probs.append(prob)
            if single_line:
                kept, kept_probs = self._first_line(kept, kept_probs)
            score = sum(math.log(max(p, 1e-12)) for p in kept_probs) / max(len(kept_probs), 1)
            candidates.append(Candidate(self._text(kept), kept, score, lowest=min(kept_probs, default=1.0)))
        return candidates

    def _first_line(self, token_ids: list[int], probs: list[float]) -> tuple[list[int], list[float]]:
        """The tokens up to the first line break; a token holding the break is cut there and kept if text remains."""
        for index in range(len(token_ids)):
            text = self._text(token_ids[: index + 1])
            if "\n" in text:
                head = text[: text.index("\n")]
                if head == self._text(token_ids[:index]):
                    return token_ids[:index], probs[:index]
                head_ids = self.denoiser.tokenizer(head, add_special_tokens=False)["input_ids"]
                return head_ids, probs[: len(head_ids)]
        return token_ids, probs

    def _text(self, token_ids: list[int]) -> str:
        """Decode span tokens exactly (no clean-up of spaces: code keeps its whitespace)."""
        return self.denoiser.tokenizer.decode(token_ids, skip_special_tokens=True, clean_up_tokenization_spaces=False)

    def _repair(
        self,
        request: InfillRequest,
        prefix_ids: list[int],
        suffix_ids: list[int],
        candidates: list[Candidate],
        language: str | None,
        config: SamplerConfig,
        stats: FillStats,
        rounds: int,
        deadline: float | None = None,
        context: EncodedContext | None = None,
    ) -> None:
        """Re-noise the tokens around each new syntax problem and denoise them again, at most `rounds` times.

        No round starts after `deadline` (a `time.perf_counter()` value): the candidates stay as they are.
        Repairs count their forward passes in `stats` and their time under "repair" only. `context`: the fill's
        encoded context, which its rounds run against instead of encoding it again (where the denoiser
        `reuses_context`).
        """
        document = request.prefix + request.suffix
        start = len(request.prefix)
        end_id = self.denoiser.special.end_of_span_ids[0] if self.denoiser.special.end_of_span_ids else None
        for round_index in range(rounds):
            failing = [c for c in candidates if c.gate is not None and not c.gate.ok and c.token_ids]
            if not failing:
                return
            if deadline is not None and time.perf_counter() >= deadline:
                stats.over_budget = True
                return
            length = request.max_tokens
            initial = torch.full((len(failing), length), end_id if end_id is not None else 0, dtype=torch.long)
            frozen = torch.ones((len(failing), length), dtype=torch.bool)
            for row, candidate in enumerate(failing):
                ids = candidate.token_ids[:length]
                initial[row, : len(ids)] = torch.tensor(ids, dtype=torch.long)
                for first, last in self._problem_tokens(candidate, start):
                    frozen[row, first : last + 1] = False
                if end_id is not None:  # room to grow by a couple of tokens (a missing closing bracket)
                    frozen[row, len(ids) : len(ids) + 2] = False
            repair_config = replace(
                config,
                greedy_first=False,
                temperature_start=max(config.temperature_start, 0.8),
                temperature_end=max(config.temperature_end, 0.4),
                seed=config.seed + round_index + 1,
            )
            spent = FillStats()  # its encode and denoise time belong to "repair", its passes to the fill
            span = denoise_span(
                self.denoiser, prefix_ids, suffix_ids, length, repair_config,
                batch_size=len(failing), stats=spent, initial=initial, frozen=frozen, deadline=deadline,
                context=context,
            )
            stats.forward_passes += spent.forward_passes
            stats.positions_predicted += spent.positions_predicted
            stats.context_encodes += spent.context_encodes
            stats.over_budget |= spent.over_budget
            stats.repairs += 1
            for candidate, repaired in zip(failing, self._decode(span, request.single_line)):
                gate = syntax.check_fill(document, start, start, repaired.text, language)
                if syntax.rank_key(gate) <= syntax.rank_key(candidate.gate):
                    candidate.text, candidate.token_ids = repaired.text, repaired.token_ids
                    candidate.score, candidate.lowest = repaired.score, repaired.lowest
                    candidate.gate = gate
                candidate.repairs += 1

    def _problem_tokens(self, candidate: Candidate, start: int) -> list[tuple[int, int]]:
        """Token index ranges of the candidate that cover its new syntax problems, one token of margin each side."""
        ends = []  # character offset where each token ends in the candidate's text
        for index in range(len(candidate.token_ids)):
            ends.append(len(self._text(candidate.token_ids[: index + 1])))
        ranges = []
        for begin, finish in syntax.problems_in_fill(candidate.gate, start, candidate.text, margin=1):
            first = next((i for i, e in enumerate(ends) if e > begin), len(ends) - 1)
            last = next((i for i, e in enumerate(ends) if e >= finish), len(ends) - 1)
            ranges.append((max(first - 1, 0), min(last + 1, len(ends) - 1)))
        return ranges or [(max(len(ends) - 2, 0), len(ends) - 1)]

    def refine(
        self,
        request: InfillRequest,
        original: str,
        renoise: list[tuple[int, int]] | None = None,
        keep_above: float | None = DEFAULT_KEEP_ABOVE,
        grow: int = DEFAULT_GROW,
        on_step: StepCallback | None = None,
        *,
        document: str | None = None,
    ) -> InfillResult:
        """Denoise `original` again in place, starting from its own tokens, and keep what the model is sure of.

        `original` is the text between `request.prefix` and `request.suffix`. With `keep_above`, its tokens are
        scored in one batched forward pass (each position hidden in one of a few interleaved groups, so every token
        is judged with most of its neighbours visible) and those the model gives less than `keep_above` are
        re-noised; tokens overlapping a `renoise` character range of `original` (one token of margin) are re-noised
        too; the others stay as they are. `grow` free positions after the text let it grow (a missing closing
        bracket) or stay empty. The span cannot end inside the text (`SamplerConfig.min_tokens`), so a re-noised
        position there is given a token and the kept tokens after it survive. Candidates are gated against the
        document with `original` in place. `request.max_tokens` is not used: the span is the text's tokens plus
        `grow`. `document` is for shared engines.
        """
        request.validate()
        special = self.denoiser.special
        ids = list(self.denoiser.tokenizer(original, add_special_tokens=False)["input_ids"])
        grow = grow if special.end_of_span_ids else 0
        length = len(ids) + grow
        if not ids:
            raise ValueError("there is nothing to refine: the text is empty")
        if length > MAX_SPAN_TOKENS:
            raise ValueError(f"the text has {len(ids)} tokens; refine handles at most {MAX_SPAN_TOKENS - grow}")
        stats = FillStats(candidates=request.candidates, canvas_positions=length)
        language = syntax.language_for(request.language) if request.language else None
        config = self.sampler if request.seed is None else replace(self.sampler, seed=request.seed)
        with stats.timed("total"):
            with stats.timed("tokenize"):
                trimmed = trim_context(
                    self.denoiser.tokenizer, request.prefix, request.suffix, self.context_budget(length)
                )
            end_id = special.end_of_span_ids[0] if grow else 0
            initial = torch.tensor(ids + [end_id] * grow, dtype=torch.long)  # (N,)
            free = torch.zeros(length, dtype=torch.bool)  # (N,) positions decided again
            free[len(ids) :] = True
            for first, last in self._token_ranges(original, renoise or []):
                free[first : last + 1] = True
            if keep_above is not None:
                with stats.timed("score"):
                    confidence = self._token_confidence(
                        trimmed.prefix_ids, trimmed.suffix_ids, initial, len(ids), config
                    )
                stats.forward_passes += 1
                stats.context_encodes += 1
                free[: len(ids)] |= confidence < keep_above
            span = denoise_span(  # the refined text keeps at least its own length: it can only end in the room to grow
                self.denoiser, trimmed.prefix_ids, trimmed.suffix_ids, length, replace(config, min_tokens=len(ids)),
                batch_size=request.candidates, stats=stats, on_step=on_step, initial=initial, frozen=~free,
            )
            candidates = self._decode(span, request.single_line)
            if request.gate:
                start = len(request.prefix)
                self._gate(request.prefix + original + request.suffix, start, start + len(original), candidates,
                           language, stats)
        return _ranked(candidates, stats, rewritten=int(free.sum()))

    def _token_ranges(self, text: str, char_ranges: list[tuple[int, int]]) -> list[tuple[int, int]]:
        """Token index ranges of `text` that overlap each character range, with one token of margin each side."""
        if not char_ranges:
            return []
        offsets = self.denoiser.tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)["offset_mapping"]
        ranges = []
        for begin, finish in char_ranges:
            hit = [i for i, (a, b) in enumerate(offsets) if a < max(finish, begin + 1) and b > begin]
            if not hit:  # past the end of the text: its last token
                hit = [len(offsets) - 1]
            ranges.append((max(hit[0] - 1, 0), min(hit[-1] + 1, len(offsets) - 1)))
        return ranges

    @torch.no_grad()
    def _token_confidence(
        self, prefix_ids: list[int], suffix_ids: list[int], span: torch.Tensor, scored: int, config: SamplerConfig
    ) -> torch.Tensor:
        """Probability (scored,) the model gives each of the first `scored` span tokens when that token is hidden."""
        from infill_engine.sampler import fresh_noise

        groups = min(4, scored)
        length = span.shape[0]
        generator = torch.Generator(device=self.denoiser.device).manual_seed(config.seed)
        canvas = span.to(self.denoiser.device).expand(groups, length).clone()  # (G, N)
        hidden = torch.zeros((groups, length), dtype=torch.bool, device=canvas.device)  # (G, N)
        for position in range(scored):
            hidden[position % groups, position] = True
        canvas = torch.where(hidden, fresh_noise(self.denoiser, (groups, length), generator), canvas)
        context = self.denoiser.encode(prefix_ids, suffix_ids, length, groups)
        probs = torch.softmax(self.denoiser.predict(context, canvas).float(), dim=-1)  # (G, N, V)
        rows = torch.arange(scored, device=canvas.device) % groups
        columns = torch.arange(scored, device=canvas.device)
        return probs[rows, columns, span[:scored].to(canvas.device)].cpu()  # (scored,)


def default_sampler_for(denoiser: Denoiser) -> SamplerConfig:
    """Library defaults per family (DiffusionGemma's entropy-bound sampler, confidence thresholds elsewhere), with
    the recommended settings of a catalogued model (`infill_engine.catalogue`) on top, and on top of those the
    checkpoint's own (`Denoiser.sampler_settings`, its config.json's `diffill_sampler`)."""
    from infill_engine.catalogue import for_checkpoint

    config = SamplerConfig()
    if denoiser.noise == "uniform":
        config = SamplerConfig(
            steps=48, block_size=256, commit="entropy_bound", entropy_bound=0.1,
            temperature_start=0.8, temperature_end=0.4, stability_steps=1, confidence_threshold=0.005,
        )
    if denoiser.reuses_canvas_keys:  # the embedded model: docs/BENCHMARKS.md, "Canvas keys kept between steps"
        config = replace(config, canvas_refresh=CANVAS_REFRESH)
    known = for_checkpoint(str(denoiser.path))
    if known is not None and known.settings is not None:
        config = replace(config, **known.settings.sampler_fields())
    return replace(config, **denoiser.sampler_settings)


def _ranked(candidates: list[Candidate], stats: FillStats, rewritten: int | None = None) -> InfillResult:
    """Passing candidates best first (fewer problems, then surer), the rejected ones, and the counters.

    `rewritten` is the number of positions the model decided (refine keeps the others); by default the best
    candidate's length.
    """
    passing = [c for c in candidates if c.passed]
    rejected = [c for c in candidates if not c.passed]
    # mean log-probabilities closer than 1e-3 are a tie, kept in batch order (the greedy candidate first)
    passing.sort(key=lambda c: (syntax.rank_key(c.gate) if c.gate else (), -round(c.score, 3)))
    best = passing[0] if passing else (candidates[0] if candidates else None)
    decided = len(best.token_ids) if best else 0
    stats.tokens_generated = decided if rewritten is None else min(decided, rewritten)
    return InfillResult(_unique(passing), rejected, stats)


def _unique(candidates: list[Candidate]) -> list[Candidate]:
    """Drop empty fills and later duplicates of the same text."""
    seen: set[str] = set()
    unique = []
    for candidate in candidates:
        if candidate.text and candidate.text not in seen:
            seen.add(candidate.text)
            unique.append(candidate)
    return unique
