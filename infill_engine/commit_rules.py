"""The canvas being denoised, and the commit rules: which positions a step decides, and what a block's answer is.

Every step the model predicts a token for each position of the canvas; a commit rule decides which of those
predictions to keep. Two families of rule exist in the literature:

- `KeepCommitted` (Fast-dLLM's threshold and factor rules, LLaDA's schedule): a committed position stays committed
  (unless self-correction re-noises it); the block is finished once every position is committed, and the canvas is
  the answer.
- `EntropyBound` (DiffusionGemma): each step accepts the lowest-entropy positions and re-noises all the others;
  nothing stays committed, so the block runs until it is confident or out of steps, and the answer is the last argmax.

The sampler (`infill_engine.sampler`) picks one rule per fill with `commit_rule` and never asks which one it holds.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property
from typing import Protocol

import torch

from infill_engine.adapters.base import Denoiser
from infill_engine.context_copy import ContextCopy


@dataclass
class CanvasState:
    """The span of every candidate while it is being denoised."""

    tokens: torch.Tensor  # (B, N) current tokens (noise where undecided)
    committed: torch.Tensor  # (B, N) decided positions
    frozen: torch.Tensor  # (B, N) positions given by the caller that the loop must never change
    probs: torch.Tensor  # (B, N) probability of each committed token
    argmax: torch.Tensor  # (B, N) the last argmax of each row still being denoised


@dataclass
class Prediction:
    """What one forward pass says about the canvas: per position (B, N), and per vocabulary entry (B, n, V) at the
    positions the pass computed logits for (`columns`; all N when None). Under a rule that keeps what it commits, a
    committed position (`held`) says its committed token, with its committed probability and no entropy."""

    logits: torch.Tensor  # (B, n, V) allowed logits divided by each row's temperature
    model_probs: torch.Tensor  # (B, n, V) the model's distribution at temperature 1
    drawn: torch.Tensor  # (B, N) token drawn at the row's temperature (the argmax on greedy rows)
    drawn_probs: torch.Tensor  # (B, N) model probability of the drawn token
    argmax: torch.Tensor  # (B, N) the most likely token
    argmax_probs: torch.Tensor  # (B, N) model probability of the most likely token
    scores: torch.Tensor  # (B, N) how sure the model is, in [0, 1], for the order of commits
    probs: torch.Tensor  # (B, n, V) the distribution at the sampling temperature
    columns: torch.Tensor | None = None  # (n,) the canvas positions of the (B, n, V) fields; None: all
    held: torch.Tensor | None = None  # (B, N) positions that say their committed token; None: none

    @cached_property
    def entropy(self) -> torch.Tensor:
        """Entropy (nats) at the sampling temperature (B, N), 0 where held or left out, computed when first asked
        for: a pass over the vocabulary that the early stop needs only once the argmax canvas is stable."""
        computed = entropy(self.probs)  # (B, n)
        if self.columns is not None:
            full = computed.new_zeros(self.drawn.shape)
            full[:, self.columns] = computed
            computed = full
        return computed if self.held is None else computed.masked_fill(self.held, 0.0)


def entropy(probs: torch.Tensor) -> torch.Tensor:
    """Entropy in nats of each position's distribution (B, N)."""
    return -(probs * torch.log(probs.clamp_min(1e-30))).sum(dim=-1)  # torch.special.entr is 3x slower on CPU


class CommitRule(Protocol):
    """How a step turns predictions into decided positions, and when a block is finished."""

    keeps_committed: bool  # a committed token stays as it is (no rule re-decides it), so a settled end is final

    def commit(self, state: CanvasState, prediction: Prediction, active: torch.Tensor, steps_left: int) -> None:
        """Decide, in place, positions of `active` (B, N) from this step's prediction."""

    def settled(self, state: CanvasState, in_window: torch.Tensor) -> torch.Tensor:
        """Rows (B,) with nothing left to decide in the window (N,)."""

    def finish(self, state: CanvasState, prediction: Prediction, in_window: torch.Tensor) -> None:
        """At the step limit: the window's undecided positions take the model's argmax."""

    def answer(self, state: CanvasState) -> torch.Tensor:
        """The span tokens (B, N) the rule settled on."""


# --------------------------------------------------------------------------------------- the canvas and its ends


def fresh_noise(denoiser: Denoiser, shape: tuple[int, ...], generator: torch.Generator) -> torch.Tensor:
    """Noise tokens: the mask token, or uniform random tokens for uniform-noise models."""
    device = denoiser.device
    if denoiser.noise == "mask":
        return torch.full(shape, denoiser.special.mask_id, dtype=torch.long, device=device)
    return torch.randint(0, denoiser.vocab_size, shape, generator=generator, device=device)


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
    noise = fresh_noise(denoiser, (batch, length), generator)  # (B, N)
    if frozen is None:
        frozen = torch.zeros((batch, length), dtype=torch.bool, device=device)
    frozen = frozen.to(device).expand(batch, length).clone()  # (B, N)
    tokens = noise if initial is None else torch.where(frozen, initial.to(device).expand(batch, length), noise)
    probs = torch.where(frozen, torch.ones(batch, length, device=device), torch.zeros(batch, length, device=device))
    return CanvasState(tokens, frozen.clone(), frozen, probs, tokens.clone())


def settle_with_argmax(
    state: CanvasState, argmax: torch.Tensor, argmax_probs: torch.Tensor | None, where: torch.Tensor
) -> None:
    """Commit the argmax (B, N) at `where` (B, N), recording its probability `argmax_probs` (B, N) if given."""
    where = where & ~state.frozen
    state.tokens = torch.where(where, argmax, state.tokens)
    if argmax_probs is not None:
        state.probs = torch.where(where, argmax_probs, state.probs)
    state.committed |= where


def fill_after_end(
    tokens: torch.Tensor, committed: torch.Tensor, end_id: int, frozen: torch.Tensor | None = None
) -> None:
    """Once a row commits an end-of-span token, every later (not frozen) position is settled as end-of-span."""
    is_end = (tokens == end_id) & committed
    after = torch.cumsum(is_end.long(), dim=-1) > 0
    after &= ~is_end
    if frozen is not None:
        after &= ~frozen
    tokens.masked_fill_(after, end_id)
    committed |= after


def end_after_line_break(denoiser: Denoiser, state: CanvasState) -> None:
    """Commit end-of-span right after the first line break of the committed run that starts the span."""
    if not denoiser.special.end_of_span_ids:
        return
    leading = state.committed.long().cumprod(dim=-1).bool()  # (B, N) every position up to here is committed
    is_break = denoiser.is_line_break[state.tokens] & leading
    if not bool(is_break.any()):
        return
    length = state.tokens.shape[1]
    positions = torch.arange(length, device=state.tokens.device)
    first = torch.where(is_break, positions, length).min(dim=-1).values  # (B,) length where a row has none
    ends = (positions[None, :] == first[:, None] + 1) & ~state.frozen  # (B, N)
    state.tokens = torch.where(ends, denoiser.special.end_of_span_ids[0], state.tokens)
    state.committed |= ends  # settle_ends then fills the rest of the row


def settle_tail(denoiser: Denoiser, state: CanvasState, prediction: Prediction, active: torch.Tensor,
                floor: float) -> None:
    """Commit end-of-span at once where the model's argmax ends the span from some position to the end of the canvas.

    A position belongs to the tail when its argmax is end-of-span with probability >= `floor` (or it already holds
    a committed end-of-span); the tail is the run of such positions that reaches the canvas's last position.
    Without this rule a confident model still walks the end in from the right, one position per step.
    """
    end_ids = denoiser.special.end_of_span_ids
    if not end_ids:
        return
    argmax_prob = prediction.argmax_probs  # (B, N)
    predicted = holds_end(prediction.argmax, end_ids) & (argmax_prob >= floor) & ~state.committed
    held = holds_end(state.tokens, end_ids) & state.committed
    ending = predicted | held  # (B, N)
    tail = ending.flip(-1).long().cumprod(dim=-1).flip(-1).bool()  # (B, N) every position from here on is ending
    chosen = tail & predicted & active & ~state.frozen
    if bool(chosen.any()):
        state.tokens = torch.where(chosen, prediction.argmax, state.tokens)
        state.probs = torch.where(chosen, argmax_prob, state.probs)
        state.committed |= chosen


def holds_end(tokens: torch.Tensor, end_ids: tuple[int, ...]) -> torch.Tensor:
    """Where `tokens` (B, N) are end-of-span (a comparison where the tokenizer has one such token, as most do)."""
    if len(end_ids) == 1:
        return tokens == end_ids[0]
    return torch.isin(tokens, torch.tensor(end_ids, dtype=tokens.dtype, device=tokens.device))


def ended_rows(tokens: torch.Tensor, committed: torch.Tensor, end_ids: tuple[int, ...]) -> torch.Tensor:
    """Rows (B,) where a committed end-of-span token settles the rest of the span."""
    if not end_ids:
        return torch.zeros(tokens.shape[0], dtype=torch.bool, device=tokens.device)
    return (holds_end(tokens, end_ids) & committed).any(dim=-1)


def settle_ends(denoiser: Denoiser, state: CanvasState) -> None:
    """Positions after a committed end-of-span token are end-of-span too: the span has ended there."""
    if denoiser.special.end_of_span_ids:
        fill_after_end(state.tokens, state.committed, denoiser.special.end_of_span_ids[0], state.frozen)


# -------------------------------------------------------------------------------------------------- the rules


def said_twice(state: CanvasState, prediction: Prediction, free: torch.Tensor, floor: float) -> torch.Tensor:
    """Free positions (B, N) whose drawn token is the argmax of this pass and of the pass before, with probability
    >= `floor` (a position still holding its first noise token, which `state.argmax` starts as, never counts)."""
    again = (prediction.argmax == state.argmax) & (prediction.drawn == prediction.argmax)
    return free & again & (state.argmax != state.tokens) & (prediction.argmax_probs >= floor)


def take_best(scores: torch.Tensor, free: torch.Tensor, want: torch.Tensor) -> torch.Tensor:
    """The `want` (B,) highest-scoring free positions (B, N) of each row."""
    masked_scores = torch.where(free, scores, torch.full_like(scores, -1.0))
    ranks = masked_scores.argsort(dim=-1, descending=True).argsort(dim=-1)  # (B, N) rank 0 = best
    return free & (ranks < want[:, None])


def take_surest(scores: torch.Tensor, free: torch.Tensor) -> torch.Tensor:
    """Each row's highest-scoring free position (B, N), the first of equals (none in a row with no free position):
    `take_best` of one, without ranking every position."""
    best = torch.where(free, scores, -1.0).argmax(dim=-1, keepdim=True)  # (B, 1)
    return torch.zeros_like(free).scatter_(-1, best, True) & free


def by_threshold(
    scores: torch.Tensor, free: torch.Tensor, threshold: float, steps_left: int, least: int = 1
) -> torch.Tensor:
    """Fast-dLLM: every free position (B, N) whose score reaches `threshold`, and always the best `least`."""
    if least == 1:
        return (free & (scores >= threshold)) | take_surest(scores, free)
    want = torch.clamp(free.sum(dim=-1), max=least)  # (B,)
    return (free & (scores >= threshold)) | take_best(scores, free, want)


def by_schedule(
    scores: torch.Tensor, free: torch.Tensor, threshold: float, steps_left: int, least: int = 1
) -> torch.Tensor:
    """LLaDA: the free positions (B, N) spread evenly over the steps left (at least `least`), the best first."""
    count = free.sum(dim=-1)  # (B,)
    want = torch.ceil(count.float() / max(steps_left, 1)).long()  # (B,)
    return take_best(scores, free, torch.minimum(torch.clamp(want, min=least), count))


def by_factor(
    scores: torch.Tensor, free: torch.Tensor, factor: float, steps_left: int, least: int = 1
) -> torch.Tensor:
    """Fast-dLLM's factor rule: the surest n free positions (B, N) of each row, where the i-th surest scores at
    least 1 - factor / (i + 1) for every i from 2 to n, and always the best `least`."""
    ranked = torch.where(free, scores, -1.0).sort(dim=-1, descending=True).values  # (B, N), the surest first
    rank = torch.arange(1, ranked.shape[-1] + 1, device=ranked.device)  # i = 1 .. N
    needed = (1.0 - factor / (rank + 1.0)).to(ranked.dtype)
    needed[0] = -1.0  # the surest always goes
    run = (ranked >= needed).long().cumprod(dim=-1).sum(dim=-1)  # (B,) n: the leading run that clears its bar
    want = torch.minimum(torch.clamp(run, min=least), free.sum(dim=-1))
    return take_best(scores, free, want)


def text_too(free: torch.Tensor, chosen: torch.Tensor, ends: torch.Tensor) -> torch.Tensor:
    """In rows where a step's commits (`chosen`, B x N) are all end-of-span (`ends`: where the drawn token is), their
    leftmost open position (B, N) where its token is text: the pass writes on from the left, as an autoregressive
    step would, instead of only walking the end in (where the model would end the span there, nothing)."""
    still_open = free & ~chosen
    leftmost = torch.zeros_like(free).scatter_(-1, still_open.int().argmax(dim=-1, keepdim=True), True) & still_open
    only_ends = ~(chosen & ~ends).any(dim=-1, keepdim=True)  # (B, 1)
    return leftmost & ~ends & only_ends


Quota = Callable[[torch.Tensor, torch.Tensor, float, int, int], torch.Tensor]


@dataclass(frozen=True)
class KeepCommitted:
    """Fast-dLLM's threshold and factor rules, LLaDA's schedule: committed positions stay; the canvas is the answer."""

    denoiser: Denoiser
    generator: torch.Generator
    quota: Quota  # by_threshold, by_schedule or by_factor
    threshold: float  # the score a position needs (by_threshold), or the factor f (by_factor)
    revise_below: float  # self-correction: re-noise a committed token whose probability fell below this; 0 = off
    stop_at_line_break: bool  # end the span after the first line break of its committed start
    tail_floor: float | None = None  # settle an end-of-span tail at once (see `settle_tail`); None: off
    tail_first: bool = False  # settle the tail before the quota, so the quota's positions are the ones before it
    min_commits: int = 1  # the surest positions a step commits at the least (threshold and schedule alike)
    stable_floor: float = 0.0  # commit a position whose argmax held since the pass before at this probability; 0 = off
    context_copy: ContextCopy | None = None  # commit what the model and the context agree comes next; None = off
    force_content: bool = False  # a step whose commits are all end-of-span commits its leftmost open text too

    @property
    def keeps_committed(self) -> bool:
        """Committed tokens stay, unless self-correction may re-noise them."""
        return self.revise_below <= 0

    def commit(self, state: CanvasState, prediction: Prediction, active: torch.Tensor, steps_left: int) -> None:
        """Commit the surest free positions, re-noise committed ones the model changed its mind on, settle ends."""
        if self.tail_floor is not None and self.tail_first:
            settle_tail(self.denoiser, state, prediction, active, self.tail_floor)
        free = active & ~state.committed & ~state.frozen  # (B, N)
        chosen = self.quota(prediction.scores, free, self.threshold, steps_left, self.min_commits)  # (B, N)
        if self.stable_floor > 0:
            chosen |= said_twice(state, prediction, free, self.stable_floor)
        if self.force_content and self.denoiser.special.end_of_span_ids:
            ends = holds_end(prediction.drawn, self.denoiser.special.end_of_span_ids)  # (B, N)
            chosen |= text_too(free, chosen, ends)
        state.tokens = torch.where(chosen, prediction.drawn, state.tokens)
        state.probs = torch.where(chosen, prediction.drawn_probs, state.probs)
        state.committed |= chosen
        if self.context_copy is not None:  # what the context says comes next, where the model's argmax agrees
            left = free & ~chosen & (prediction.drawn == prediction.argmax)  # (B, N) open, drawn as the argmax
            copied = self.context_copy.agreed(state.tokens, state.committed, prediction.argmax,
                                              prediction.argmax_probs, left)
            settle_with_argmax(state, prediction.argmax, prediction.argmax_probs, copied)
            chosen |= copied
        self.revise(state, prediction, active & ~chosen)
        if self.tail_floor is not None and not self.tail_first:
            settle_tail(self.denoiser, state, prediction, active, self.tail_floor)
        if self.stop_at_line_break:
            end_after_line_break(self.denoiser, state)
        settle_ends(self.denoiser, state)

    def revise(self, state: CanvasState, prediction: Prediction, candidates: torch.Tensor) -> None:
        """Self-correction: re-noise committed tokens whose probability fell while the model now prefers another."""
        if self.revise_below <= 0:
            return
        current = prediction.model_probs.gather(-1, state.tokens[..., None]).squeeze(-1)  # (B, N)
        revise = candidates & state.committed & ~state.frozen & (current < self.revise_below)
        revise &= prediction.argmax != state.tokens
        if bool(revise.any()):
            noise = fresh_noise(self.denoiser, state.tokens.shape, self.generator)
            state.tokens = torch.where(revise, noise, state.tokens)
            state.committed &= ~revise

    def settled(self, state: CanvasState, in_window: torch.Tensor) -> torch.Tensor:
        """Rows (B,) whose window is fully committed."""
        return ~((~state.committed) & in_window).any(dim=-1)

    def finish(self, state: CanvasState, prediction: Prediction, in_window: torch.Tensor) -> None:
        """The positions never committed take the last argmax."""
        settle_with_argmax(state, prediction.argmax, prediction.argmax_probs, ~state.committed & in_window)

    def answer(self, state: CanvasState) -> torch.Tensor:
        """The canvas."""
        return state.tokens


def entropy_bound_accept(token_entropy: torch.Tensor, eligible: torch.Tensor, bound: float) -> torch.Tensor:
    """DiffusionGemma: the lowest-entropy positions (B, N) while sum(entropy) - max(entropy) <= bound; ties go left first."""
    ranked = torch.where(eligible, token_entropy, torch.full_like(token_entropy, math.inf))
    sorted_entropy, order = torch.sort(ranked, dim=-1, stable=True)  # ties: the leftmost first
    finite = torch.where(torch.isinf(sorted_entropy), torch.zeros_like(sorted_entropy), sorted_entropy)
    selected = (torch.cumsum(finite, dim=-1) - finite <= bound) & ~torch.isinf(sorted_entropy)
    return torch.zeros_like(selected).scatter(-1, order, selected)


@dataclass(frozen=True)
class EntropyBound:
    """DiffusionGemma: accept the lowest-entropy positions, re-noise the rest; the answer is the last argmax."""

    denoiser: Denoiser
    generator: torch.Generator
    bound: float  # the summed entropy (nats) of the accepted positions, less the largest one
    keeps_committed = False  # every step decides every position anew

    def commit(self, state: CanvasState, prediction: Prediction, active: torch.Tensor, steps_left: int) -> None:
        """Every non-frozen active position is decided anew: accepted, or re-noised."""
        eligible = active & ~state.frozen  # (B, N)
        accepted = entropy_bound_accept(prediction.entropy, eligible, self.bound)  # (B, N)
        noise = fresh_noise(self.denoiser, state.tokens.shape, self.generator)
        state.tokens = torch.where(accepted, prediction.drawn, torch.where(eligible, noise, state.tokens))
        state.probs = torch.where(accepted, prediction.drawn_probs, state.probs)
        state.committed = torch.where(eligible, accepted, state.committed)

    def settled(self, state: CanvasState, in_window: torch.Tensor) -> torch.Tensor:
        """Never: nothing stays committed, so the block runs until it is confident or out of steps."""
        return torch.zeros(state.tokens.shape[0], dtype=torch.bool, device=state.tokens.device)

    def finish(self, state: CanvasState, prediction: Prediction, in_window: torch.Tensor) -> None:
        """The window takes each row's last argmax (rows that stopped early already hold theirs)."""
        settle_with_argmax(state, state.argmax, None, in_window)

    def answer(self, state: CanvasState) -> torch.Tensor:
        """The last argmax, and the caller's tokens where they are frozen."""
        return torch.where(state.frozen, state.tokens, state.argmax)


def commit_rule(
    commit: str,
    denoiser: Denoiser,
    generator: torch.Generator,
    *,
    threshold: float,
    entropy_bound: float,
    revise_below: float,
    stop_at_line_break: bool,
    tail_floor: float | None = None,
    tail_first: bool = False,
    min_commits: int = 1,
    stable_floor: float = 0.0,
    factor: float = 1.0,
    context_copy: ContextCopy | None = None,
    force_content: bool = False,
) -> CommitRule:
    """The rule named by `SamplerConfig.commit`: "threshold", "schedule", "factor" or "entropy_bound"."""
    if commit == "entropy_bound":
        return EntropyBound(denoiser, generator, entropy_bound)
    if commit == "schedule":
        quota, bar = by_schedule, threshold
    elif commit == "factor":
        quota, bar = by_factor, factor
    else:
        quota, bar = by_threshold, threshold
    return KeepCommitted(denoiser, generator, quota, bar, revise_below, stop_at_line_break, tail_floor,
                         tail_first, min_commits, stable_floor, context_copy, force_content)
