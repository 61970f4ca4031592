"""The denoising loop: predict every span position at once, commit the confident ones, re-noise the rest, repeat.

One loop serves every family. What differs between them is configuration (`SamplerConfig.commit`) and the noise the
denoiser understands (mask tokens, or uniformly random tokens as in DiffusionGemma). Spans longer than a block are
denoised block by block: parallel inside a block, in order across blocks.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from infill_engine.adapters.base import Denoiser, EncodedContext
from infill_engine.request import FillCancelled  # noqa: F401 - raised by the loop, defined without torch
from infill_engine.stats import FillStats

COMMIT_RULES = ("threshold", "schedule", "entropy_bound")
ORDERS = ("confidence", "margin", "entropy", "random")


@dataclass(frozen=True)
class SamplerConfig:
    """Every knob of the denoising loop.

    Args:
        steps: at most this many forward passes per block.
        block_size: span positions denoised together; a longer span goes block by block.
        commit: how many positions a step commits. "threshold" (Fast-dLLM): every free position whose score
            reaches `threshold`, always at least one. "schedule" (LLaDA): the free positions spread evenly over
            the steps left. "entropy_bound" (DiffusionGemma): the lowest-entropy positions while
            sum(entropy) - max(entropy) <= `entropy_bound`; nothing stays committed, the rest is re-noised.
        order: which free positions go first. "confidence": probability of the drawn token; "margin": top-1 minus
            top-2 probability; "entropy": exp(-entropy); "random": a uniform draw.
        threshold: commit="threshold": the score a position needs to be committed in parallel.
        entropy_bound: commit="entropy_bound": the bound on the summed entropy of accepted positions (nats).
        revise_below: self-correction: a committed token whose probability falls below this, while the model now
            prefers another token, is re-noised and decided again. 0 turns it off.
        stability_steps: early stop when the argmax canvas is unchanged for this many steps ...
        confidence_threshold: ... and the mean entropy of the span is below this (nats).
        temperature_start: temperature of the first step; a linear schedule runs to `temperature_end` at the
            last step. 0 means greedy (argmax, no sampling).
        temperature_end: temperature of the last step.
        greedy_first: with several candidates, the first is always decoded greedily (the best single guess) and
            the others are sampled at the scheduled temperature (or at 0.7 when that is 0).
        suppress_special: never write the mask, pad or other special tokens (other than end-of-span) into a span.
        allow_end_of_span: the model may end the span early; False fills every position (a known length).
        min_tokens: the span holds at least this many tokens before it may end (an empty fill is never offered,
            so by default the first position cannot end it).
        stop_at_line_break: single-line fills: once the committed run from the span start holds a line break, the
            span ends there (what follows would be cut anyway), so no step is spent on it.
        seed: the random seed; the same seed and inputs give the same output.
    """

    steps: int = 24
    block_size: int = 32
    commit: str = "threshold"
    order: str = "confidence"
    threshold: float = 0.9
    entropy_bound: float = 0.1
    revise_below: float = 0.0
    stability_steps: int = 1
    confidence_threshold: float = 0.005
    temperature_start: float = 0.0
    temperature_end: float = 0.0
    greedy_first: bool = True
    suppress_special: bool = True
    allow_end_of_span: bool = True
    min_tokens: int = 1
    stop_at_line_break: bool = False
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
        if not self.entropy_bound > 0:
            problems.append(f"entropy_bound must be > 0 (got {self.entropy_bound!r})")
        if not 0.0 <= self.revise_below < 1.0:
            problems.append(f"revise_below must be within 0..1 (got {self.revise_below!r})")
        if not isinstance(self.min_tokens, int) or self.min_tokens < 0:
            problems.append(f"min_tokens must be an integer >= 0 (got {self.min_tokens!r})")
        if not isinstance(self.stability_steps, int) or self.stability_steps < 0:
            problems.append(f"stability_steps must be an integer >= 0 (got {self.stability_steps!r})")
        if self.temperature_start < 0 or self.temperature_end < 0:
            problems.append("temperatures must be >= 0")
        if problems:
            raise ValueError("; ".join(problems))


@dataclass
class StepView:
    """What the per-step callback sees."""

    block: int  # index of the block being denoised
    step: int  # step within the block, from 0
    canvas: torch.Tensor  # (B, N) current span tokens (noise where not yet decided)
    committed: torch.Tensor  # (B, N) positions decided so far


StepCallback = Callable[[StepView], "bool | None"]  # return False to cancel the fill


@dataclass
class DenoisedSpan:
    """The loop's output: span tokens per candidate and the probability each was written with."""

    tokens: torch.Tensor  # (B, N)
    probs: torch.Tensor  # (B, N) probability of each token when it was committed
    stopped_early: bool = False
    steps_per_block: list[int] = field(default_factory=list)


# ----------------------------------------------------------------------------------------------- the step's parts


def temperature_at(config: SamplerConfig, step: int) -> float:
    """The linear schedule of DiffusionGemma: t_start at the first step, falling towards t_end at the last."""
    remaining = config.steps - step  # counts down from `steps` to 1, as transformers' generate() does
    return config.temperature_end + (config.temperature_start - config.temperature_end) * remaining / config.steps


def row_temperatures(config: SamplerConfig, step: int, batch: int, device: torch.device) -> torch.Tensor:
    """Temperature per candidate (B,): the first may be greedy, the others sample."""
    t = temperature_at(config, step)
    temps = torch.full((batch,), t, dtype=torch.float32, device=device)
    if batch > 1 and config.greedy_first:
        temps[1:] = t if t > 0 else 0.7
        temps[0] = 0.0
    return temps


def scale_logits(logits: torch.Tensor, temps: torch.Tensor) -> torch.Tensor:
    """Divide each row's logits by its temperature (rows at 0 are left as they are and decoded greedily)."""
    safe = torch.where(temps > 0, temps, torch.ones_like(temps))
    return logits / safe[:, None, None]


def draw_tokens(probs: torch.Tensor, temps: torch.Tensor, generator: torch.Generator) -> torch.Tensor:
    """Sample a token per position (B, N) from `probs`; argmax on rows whose temperature is 0."""
    batch, length, vocab = probs.shape
    greedy = probs.argmax(dim=-1)
    if bool((temps > 0).any()):
        sampled = torch.multinomial(probs.view(-1, vocab), num_samples=1, generator=generator).view(batch, length)
        return torch.where((temps > 0)[:, None], sampled, greedy)
    return greedy


def order_scores(
    probs: torch.Tensor, tokens: torch.Tensor, order: str, generator: torch.Generator
) -> torch.Tensor:
    """How sure the model is of each position (B, N), higher first, in [0, 1]."""
    if order == "confidence":
        return probs.gather(-1, tokens[..., None]).squeeze(-1)
    if order == "margin":
        top2 = probs.topk(2, dim=-1).values
        return top2[..., 0] - top2[..., 1]
    if order == "entropy":
        return torch.exp(-entropy(probs))
    return torch.rand(tokens.shape, generator=generator, device=tokens.device)


def entropy(probs: torch.Tensor) -> torch.Tensor:
    """Entropy in nats of each position's distribution (B, N)."""
    return -(probs * torch.log(probs.clamp_min(1e-30))).sum(dim=-1)


def choose_commits(scores: torch.Tensor, free: torch.Tensor, config: SamplerConfig, steps_left: int) -> torch.Tensor:
    """Which free positions (B, N) to commit now, by threshold or by an even schedule; at least one per row."""
    masked_scores = torch.where(free, scores, torch.full_like(scores, -1.0))
    free_count = free.sum(dim=-1)  # (B,)
    if config.commit == "threshold":
        chosen = free & (scores >= config.threshold)
        want = torch.clamp(free_count, max=1)  # at least the best one
    else:  # schedule: spread what is left evenly over the steps left
        chosen = torch.zeros_like(free)
        want = torch.ceil(free_count.float() / max(steps_left, 1)).long()
    ranks = masked_scores.argsort(dim=-1, descending=True).argsort(dim=-1)  # rank 0 = best
    chosen |= free & (ranks < want[:, None])
    return chosen


def entropy_bound_accept(token_entropy: torch.Tensor, eligible: torch.Tensor, bound: float) -> torch.Tensor:
    """DiffusionGemma's rule: the lowest-entropy positions while sum(entropy) - max(entropy) <= bound."""
    ranked = torch.where(eligible, token_entropy, torch.full_like(token_entropy, math.inf))
    sorted_entropy, order = torch.sort(ranked, dim=-1)
    finite = torch.where(torch.isinf(sorted_entropy), torch.zeros_like(sorted_entropy), sorted_entropy)
    selected = (torch.cumsum(finite, dim=-1) - finite <= bound) & ~torch.isinf(sorted_entropy)
    return torch.zeros_like(selected).scatter(-1, order, selected)


def fresh_noise(denoiser: Denoiser, shape: tuple[int, ...], generator: torch.Generator) -> torch.Tensor:
    """Noise tokens: the mask token, or uniform random tokens for uniform-noise models."""
    device = denoiser.device
    if denoiser.noise == "mask":
        return torch.full(shape, denoiser.special.mask_id, dtype=torch.long, device=device)
    return torch.randint(0, denoiser.vocab_size, shape, generator=generator, device=device)


def suppress(logits: torch.Tensor, banned: tuple[int, ...]) -> torch.Tensor:
    """Forbid special tokens (mask, pad, ...) from being written into a span."""
    if banned:
        logits = logits.clone()
        logits[..., list(banned)] = -math.inf
    return logits


def ended_rows(tokens: torch.Tensor, committed: torch.Tensor, end_ids: tuple[int, ...]) -> torch.Tensor:
    """Rows (B,) where a committed end-of-span token settles the rest of the span."""
    if not end_ids:
        return torch.zeros(tokens.shape[0], dtype=torch.bool, device=tokens.device)
    is_end = torch.isin(tokens, torch.tensor(end_ids, device=tokens.device)) & committed
    return is_end.any(dim=-1)


def fill_after_end(
    tokens: torch.Tensor, committed: torch.Tensor, end_id: int, frozen: torch.Tensor | None = None
) -> None:
    """Once a row commits an end-of-span token, every later (not frozen) position is settled as end-of-span."""
    is_end = (tokens == end_id) & committed
    after = torch.cumsum(is_end.long(), dim=-1) > 0
    after &= ~is_end
    if frozen is not None:
        after &= ~frozen
    tokens[after] = end_id
    committed |= after


# ------------------------------------------------------------------------------------------------------ the loop


def denoise_block(
    denoiser: Denoiser,
    context: EncodedContext,
    state: "CanvasState",
    window: slice,
    config: SamplerConfig,
    generator: torch.Generator,
    stats: FillStats,
    on_step: StepCallback | None,
    block_index: int,
) -> int:
    """Denoise the positions of `window` in place until they are settled; return the steps taken."""
    batch, length = state.tokens.shape
    in_window = torch.zeros(length, dtype=torch.bool, device=state.tokens.device)
    in_window[window] = True
    history: list[torch.Tensor] = []
    self_conditioning = None
    # positions of this canvas that may not end the span yet (append-mode blocks number their positions from 0)
    offset = block_index * config.block_size if denoiser.block_mode == "append" else 0
    too_short = config.min_tokens - offset
    # a row is done when its window has nothing left to decide (entropy-bound decoding decides every step anew)
    done = torch.zeros(batch, dtype=torch.bool, device=state.tokens.device)
    if config.commit != "entropy_bound":
        done = ~((~state.committed) & in_window).any(dim=-1)
    step = 0
    for step in range(config.steps):
        if bool(done.all()):
            return step
        temps = row_temperatures(config, step, batch, state.tokens.device)
        raw = denoiser.predict(context, state.tokens, self_conditioning)  # (B, N, V)
        stats.forward_passes += 1
        if config.suppress_special:
            raw = suppress(raw, denoiser.special.ids_never_generated)
        if not config.allow_end_of_span:
            raw = suppress(raw, denoiser.special.end_of_span_ids)
        elif too_short > 0:
            raw = raw.clone()
            raw[:, :too_short, list(denoiser.special.end_of_span_ids)] = -math.inf
        raw = forbid_early_end(raw, state, denoiser.special.end_of_span_ids)
        logits = scale_logits(raw.float(), temps)
        probs = torch.softmax(logits, dim=-1, dtype=torch.float32)  # (B, N, V) at the sampling temperature
        model_probs = probs if not bool((temps > 0).any()) else torch.softmax(raw.float(), dim=-1)  # (B, N, V)
        drawn = draw_tokens(probs, temps, generator)
        argmax = logits.argmax(dim=-1)
        scores = order_scores(probs, drawn, config.order, generator)
        drawn_probs = model_probs.gather(-1, drawn[..., None]).squeeze(-1)  # what ranking and revision read
        token_entropy = entropy(probs)
        active = ~done[:, None] & in_window  # (B, N) positions this step may change
        free = active & ~state.committed & ~state.frozen

        if config.commit == "entropy_bound":
            eligible = active & ~state.frozen
            accepted = entropy_bound_accept(token_entropy, eligible, config.entropy_bound)
            noise = fresh_noise(denoiser, state.tokens.shape, generator)
            state.tokens = torch.where(accepted, drawn, torch.where(eligible, noise, state.tokens))
            state.probs = torch.where(accepted, drawn_probs, state.probs)
            state.committed = torch.where(eligible, accepted, state.committed)
        else:
            commit = choose_commits(scores, free, config, config.steps - step)
            state.tokens = torch.where(commit, drawn, state.tokens)
            state.probs = torch.where(commit, drawn_probs, state.probs)
            state.committed |= commit
            revise_committed(denoiser, state, model_probs, argmax, active & ~commit, config, generator)
            if config.stop_at_line_break:
                end_after_line_break(denoiser, state)
            settle_ends(denoiser, state)

        # early stop: the argmax canvas is stable and the model is confident about the whole window
        window_argmax = torch.where(in_window, argmax, torch.full_like(argmax, -1))
        history.append(window_argmax)
        stable = stable_rows(history, config.stability_steps)
        mean_entropy = (token_entropy * in_window).sum(-1) / in_window.sum()
        confident = stable & (mean_entropy < config.confidence_threshold) & ~done
        if config.commit == "entropy_bound":
            state.argmax = torch.where(done[:, None], state.argmax, argmax)
        if bool(confident.any()):
            settle_with_argmax(state, argmax, model_probs, confident[:, None] & in_window)
            stats.stopped_early = True
        done |= confident
        if config.commit != "entropy_bound":
            done |= ~((~state.committed) & in_window).any(dim=-1)
        self_conditioning = logits
        if on_step is not None and on_step(StepView(block_index, step, state.tokens, state.committed)) is False:
            raise FillCancelled()
    # step limit reached: whatever is still undecided takes the model's last argmax
    if config.commit == "entropy_bound":
        settle_with_argmax(state, state.argmax, None, ~done[:, None] & in_window)
    else:
        settle_with_argmax(state, argmax, model_probs, ~state.committed & in_window)
    return step + 1


def stable_rows(history: list[torch.Tensor], needed: int) -> torch.Tensor:
    """Rows (B,) whose argmax canvas has not changed over the last `needed` steps."""
    latest = history[-1]
    if needed == 0:
        return torch.ones(latest.shape[0], dtype=torch.bool, device=latest.device)
    if len(history) <= needed:
        return torch.zeros(latest.shape[0], dtype=torch.bool, device=latest.device)
    same = torch.ones(latest.shape[0], dtype=torch.bool, device=latest.device)
    for previous in history[-needed - 1 : -1]:
        same &= (previous == latest).all(dim=-1)
    return same


def revise_committed(
    denoiser: Denoiser,
    state: "CanvasState",
    probs: torch.Tensor,
    argmax: torch.Tensor,
    candidates: torch.Tensor,
    config: SamplerConfig,
    generator: torch.Generator,
) -> None:
    """Self-correction: re-noise committed tokens whose probability fell while the model now prefers another."""
    if config.revise_below <= 0:
        return
    current = probs.gather(-1, state.tokens[..., None]).squeeze(-1)
    revise = candidates & state.committed & ~state.frozen & (current < config.revise_below) & (argmax != state.tokens)
    if bool(revise.any()):
        noise = fresh_noise(denoiser, state.tokens.shape, generator)
        state.tokens = torch.where(revise, noise, state.tokens)
        state.committed &= ~revise
        state.revisions += int(revise.sum())


def settle_ends(denoiser: Denoiser, state: "CanvasState") -> None:
    """Positions after a committed end-of-span token are end-of-span too: the span has ended there."""
    if denoiser.special.end_of_span_ids:
        fill_after_end(state.tokens, state.committed, denoiser.special.end_of_span_ids[0], state.frozen)


def end_after_line_break(denoiser: Denoiser, state: "CanvasState") -> None:
    """Commit end-of-span right after the first line break of the committed run that starts the span."""
    if not denoiser.special.end_of_span_ids:
        return
    breaks = denoiser.line_break_ids.to(state.tokens.device)
    leading = state.committed.long().cumprod(dim=-1).bool()  # (B, N) every position up to here is committed
    is_break = torch.isin(state.tokens, breaks) & leading
    if not bool(is_break.any()):
        return
    length = state.tokens.shape[1]
    positions = torch.arange(length, device=state.tokens.device)
    first = torch.where(is_break, positions, length).min(dim=-1).values  # (B,) length where a row has none
    ends = (positions[None, :] == first[:, None] + 1) & ~state.frozen  # (B, N)
    state.tokens = torch.where(ends, denoiser.special.end_of_span_ids[0], state.tokens)
    state.committed |= ends  # settle_ends then fills the rest of the row


def forbid_early_end(logits: torch.Tensor, state: "CanvasState", end_ids: tuple[int, ...]) -> torch.Tensor:
    """The span cannot end before a frozen (kept) token: end-of-span is forbidden up to the last frozen content."""
    if not end_ids or not bool(state.frozen.any()):
        return logits
    is_end = torch.isin(state.tokens, torch.tensor(end_ids, device=state.tokens.device))
    kept = state.frozen & ~is_end  # (B, N)
    positions = torch.arange(kept.shape[1], device=kept.device)
    last_kept = torch.where(kept, positions, torch.full_like(positions, -1)).max(dim=-1).values  # (B,)
    before = positions[None, :] < last_kept[:, None]  # (B, N)
    if not bool(before.any()):
        return logits
    logits = logits.clone()
    banned = logits[..., list(end_ids)]
    logits[..., list(end_ids)] = torch.where(before[..., None], torch.full_like(banned, -math.inf), banned)
    return logits


def settle_with_argmax(
    state: "CanvasState", argmax: torch.Tensor, probs: torch.Tensor | None, where: torch.Tensor
) -> None:
    """Commit the model's argmax at `where` (B, N)."""
    where = where & ~state.frozen
    state.tokens = torch.where(where, argmax, state.tokens)
    if probs is not None:
        state.probs = torch.where(where, probs.gather(-1, argmax[..., None]).squeeze(-1), state.probs)
    state.committed |= where


@dataclass
class CanvasState:
    """The span of every candidate while it is being denoised."""

    tokens: torch.Tensor  # (B, N) current tokens (noise where undecided)
    committed: torch.Tensor  # (B, N) decided positions
    frozen: torch.Tensor  # (B, N) positions given by the caller that the loop must never change
    probs: torch.Tensor  # (B, N) probability of each committed token
    argmax: torch.Tensor  # (B, N) the last argmax (the output of entropy-bound decoding)
    revisions: int = 0


def initial_state(
    denoiser: Denoiser,
    batch: int,
    length: int,
    generator: torch.Generator,
    initial: torch.Tensor | None,
    frozen: torch.Tensor | None,
) -> CanvasState:
    """A canvas of pure noise, or the caller's tokens with the non-frozen positions re-noised."""
    device = denoiser.device
    noise = fresh_noise(denoiser, (batch, length), generator)
    if frozen is None:
        frozen = torch.zeros((batch, length), dtype=torch.bool, device=device)
    frozen = frozen.to(device).expand(batch, length).clone()
    tokens = noise if initial is None else torch.where(frozen, initial.to(device).expand(batch, length), noise)
    probs = torch.where(frozen, torch.ones(batch, length, device=device), torch.zeros(batch, length, device=device))
    return CanvasState(tokens, frozen.clone(), frozen, probs, tokens.clone())


@torch.no_grad()
def denoise_span(
    denoiser: Denoiser,
    prefix_ids: list[int],
    suffix_ids: list[int],
    span_length: int,
    config: SamplerConfig,
    batch_size: int = 1,
    stats: FillStats | None = None,
    on_step: StepCallback | None = None,
    initial: torch.Tensor | None = None,
    frozen: torch.Tensor | None = None,
) -> DenoisedSpan:
    """Denoise a span of `span_length` positions between prefix and suffix for `batch_size` candidates.

    With `initial` (N,) or (B, N) tokens and a `frozen` mask, the frozen positions are kept and the others are
    re-noised and decided again (used to repair and to refine).
    """
    stats = stats if stats is not None else FillStats()
    generator = torch.Generator(device=denoiser.device).manual_seed(config.seed)
    state = initial_state(denoiser, batch_size, span_length, generator, initial, frozen)
    whole = initial is not None or span_length <= config.block_size
    windows = [slice(0, span_length)] if whole else [
        slice(start, min(start + config.block_size, span_length)) for start in range(0, span_length, config.block_size)
    ]
    steps_per_block = []
    if denoiser.block_mode == "restrict" or len(windows) == 1:
        with stats.timed("encode"):
            context = denoiser.encode(prefix_ids, suffix_ids, span_length, batch_size)
        stats.context_encodes += 1
        for index, window in enumerate(windows):
            with stats.timed("denoise"):
                steps_per_block.append(
                    denoise_block(denoiser, context, state, window, config, generator, stats, on_step, index)
                )
            if bool(ended_rows(state.tokens, state.committed, denoiser.special.end_of_span_ids).all()):
                break
    else:
        steps_per_block = denoise_appended_blocks(
            denoiser, prefix_ids, suffix_ids, windows, state, config, generator, stats, on_step
        )
    tokens = state.argmax if config.commit == "entropy_bound" and initial is None else state.tokens
    if config.commit == "entropy_bound" and initial is not None:
        tokens = torch.where(state.frozen, state.tokens, state.argmax)
    return DenoisedSpan(tokens, state.probs, stats.stopped_early, steps_per_block)


def denoise_appended_blocks(
    denoiser: Denoiser,
    prefix_ids: list[int],
    suffix_ids: list[int],
    windows: list[slice],
    state: CanvasState,
    config: SamplerConfig,
    generator: torch.Generator,
    stats: FillStats,
    on_step: StepCallback | None,
) -> list[int]:
    """Block diffusion: each block is its own canvas; finished blocks join the context of the next."""
    steps_per_block = []
    for index, window in enumerate(windows):
        done_so_far = state.tokens[:, : window.start]
        if config.commit == "entropy_bound":
            done_so_far = state.argmax[:, : window.start]
        with stats.timed("encode"):
            context = denoiser.encode_rows(prefix_ids, done_so_far, suffix_ids, window.stop - window.start)
        stats.context_encodes += 1
        block = CanvasState(
            state.tokens[:, window].clone(),
            state.committed[:, window].clone(),
            state.frozen[:, window].clone(),
            state.probs[:, window].clone(),
            state.argmax[:, window].clone(),
        )
        with stats.timed("denoise"):
            steps_per_block.append(
                denoise_block(
                    denoiser, context, block, slice(0, window.stop - window.start), config, generator, stats,
                    on_step, index,
                )
            )
        state.tokens[:, window] = block.tokens
        state.committed[:, window] = block.committed
        state.probs[:, window] = block.probs
        state.argmax[:, window] = block.argmax
        finished = state.argmax if config.commit == "entropy_bound" else state.tokens
        if bool(ended_rows(finished, torch.ones_like(state.committed), denoiser.special.end_of_span_ids).all()):
            break
    return steps_per_block
