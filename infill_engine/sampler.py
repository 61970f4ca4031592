"""The denoising loop: predict every span position at once, commit some, re-noise the rest, repeat.

One loop serves every family. What differs between them is the commit rule (`SamplerConfig.commit`, see
`infill_engine.commit_rules`) and the noise the denoiser understands (mask tokens, or uniformly random tokens as in
DiffusionGemma). Spans longer than a block are denoised block by block: parallel inside a block, in order across
blocks. A step of `denoise_block` reads like the papers: predict, pick tokens, commit, check stop.
"""

from __future__ import annotations

import functools
import math
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import torch

from infill_engine.adapters.base import Denoiser, EncodedContext
from infill_engine.commit_rules import CanvasState, CommitRule, Prediction, commit_rule, ended_rows, holds_end
from infill_engine.commit_rules import initial_state
from infill_engine.commit_rules import entropy  # noqa: F401 - order_scores uses it; kept importable from here
from infill_engine.commit_rules import fresh_noise, settle_with_argmax  # noqa: F401 - fresh_noise: engine's refine
from infill_engine.context_copy import ContextCopy
from infill_engine.request import FillCancelled  # noqa: F401 - raised by the loop, defined without torch
from infill_engine.sampler_config import COMMIT_RULES, DRAWS, ORDERS  # noqa: F401 - importable from here too
from infill_engine.sampler_config import SamplerConfig, sampler_overrides, sampler_variant  # noqa: F401
from infill_engine.special_tokens import SpecialTokens
from infill_engine.stats import FillStats
from infill_engine.vocabulary_max import vocabulary_argmax

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
    context: EncodedContext | None = None  # the context of a one-canvas span, for another fill against it


@dataclass(frozen=True)
class Denoising:
    """What stays fixed while one span is denoised."""

    denoiser: Denoiser
    config: SamplerConfig
    rule: CommitRule  # chosen once, from config.commit
    generator: torch.Generator  # the one random stream of the fill, seeded from config.seed
    stats: FillStats
    on_step: StepCallback | None
    deadline: float | None = None  # time.perf_counter() after which each block takes its argmax; None: no limit

    def out_of_time(self) -> bool:
        """Whether the request's time budget has run out (recorded in the stats)."""
        if self.deadline is None or time.perf_counter() < self.deadline:
            return False
        self.stats.over_budget = True
        return True


@dataclass(frozen=True)
class Block:
    """One block of the span: the context it is denoised against and the canvas positions it decides."""

    index: int  # blocks are denoised in order, from 0
    context: EncodedContext
    window: slice  # canvas positions this block decides
    first_position: int  # span position of canvas position 0 (append-mode canvases hold one block each)


# ----------------------------------------------------------------------------------------------- the step's parts


def open_columns(run: Denoising, state: CanvasState, done: torch.Tensor) -> torch.Tensor | None:
    """The canvas positions (n,) whose logits the next pass needs: those not yet committed in some row still being
    denoised; None (all of them) when every position is open, or where the denoiser cannot project fewer, the rule
    may re-decide committed tokens, or the model reads the previous step's logits."""
    if not (run.denoiser.projects_columns and run.rule.keeps_committed and not run.denoiser.uses_self_conditioning):
        return None
    needed = (~state.committed & ~done[:, None]).any(dim=0)  # (N,)
    if bool(needed.all()):
        return None
    return needed.nonzero().squeeze(-1)


def rows_to_run(
    run: Denoising, state: CanvasState, last_read: torch.Tensor | None, step: int
) -> torch.Tensor | None:
    """The canvas positions (r,) the layers must run over this pass (`SamplerConfig.canvas_refresh`): those not yet
    committed in some row, and those whose token changed since the pass before (`last_read`, (B, N)); None (all of
    them) at a refresh, where the denoiser cannot keep the others' keys and values, or the rule may re-decide
    committed tokens."""
    refresh = run.config.canvas_refresh
    if not refresh or last_read is None or step % refresh == 0:
        return None
    if not (run.denoiser.reuses_canvas_keys and run.rule.keeps_committed and not run.denoiser.uses_self_conditioning):
        return None
    stale = (~state.committed | (state.tokens != last_read)).any(dim=0)  # (N,)
    if bool(stale.all()):
        return None
    return stale.nonzero().squeeze(-1)


def around_committed(
    run: Denoising, prediction: Prediction, columns: torch.Tensor | None, state: CanvasState
) -> Prediction:
    """The prediction of the pass over `columns` (all when None) as one over the whole canvas (B, N). Under a rule
    that keeps what it commits, a committed position holds its token (as the argmax and the draw) and probability,
    so that only the undecided positions count towards the early stop; other rules see the model everywhere."""
    if not run.rule.keeps_committed:
        return prediction
    held = state.committed  # (B, N)

    def holding(computed: torch.Tensor, committed: torch.Tensor) -> torch.Tensor:
        if columns is not None:
            computed = committed.index_copy(1, columns, computed.to(committed.dtype))
        return torch.where(held, committed, computed)

    tokens, probs = state.tokens, state.probs
    return Prediction(
        prediction.logits, prediction.model_probs, holding(prediction.drawn, tokens),
        holding(prediction.drawn_probs, probs), holding(prediction.argmax, tokens),
        holding(prediction.argmax_probs, probs), holding(prediction.scores, torch.ones_like(probs)), prediction.probs,
        columns, held.clone())


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


def suppress(logits: torch.Tensor, banned: tuple[int, ...]) -> None:
    """Forbid the `banned` tokens everywhere in `logits` (B, N, V), in place."""
    if banned:
        logits[..., list(banned)] = -math.inf


def vocabulary_bias(
    config: SamplerConfig, special: SpecialTokens, size: int, device: torch.device
) -> torch.Tensor | None:
    """What every position's logits are shifted by (V,), the same at every step: -inf on the special tokens a span
    never holds (`suppress_special`) and `end_bias` on end-of-span where it applies everywhere (not only until
    content); None where that is nothing. One addition over the logits instead of a copy of them for each."""
    never = special.ids_never_generated if config.suppress_special else ()
    everywhere = 0.0 if config.end_bias_until_content else config.end_bias
    if not never and (everywhere == 0.0 or not special.end_of_span_ids):
        return None
    return _bias_vector(never, special.end_of_span_ids, everywhere, size, device)


@functools.lru_cache(maxsize=8)
def _bias_vector(never: tuple[int, ...], end_ids: tuple[int, ...], end_bias: float, size: int,
                 device: torch.device) -> torch.Tensor:
    """(V,) zeros, `end_bias` at `end_ids`, -inf at `never` (kept per model and settings; only ever read)."""
    bias = torch.zeros(size, device=device)
    if end_ids:
        bias[list(end_ids)] = end_bias
    if never:
        bias[list(never)] = -math.inf
    return bias


def forbid_early_end(
    logits: torch.Tensor, state: CanvasState, end_ids: tuple[int, ...], columns: torch.Tensor | None = None
) -> None:
    """The span cannot end before a frozen (kept) token: end-of-span is forbidden, in place, up to the last frozen
    content. `logits` (B, n, V) are those of the canvas positions `columns` (n,), or of all when None."""
    if not end_ids or not bool(state.frozen.any()):
        return
    kept = state.frozen & ~holds_end(state.tokens, end_ids)  # (B, N)
    positions = torch.arange(kept.shape[1], device=kept.device)
    last_kept = torch.where(kept, positions, torch.full_like(positions, -1)).max(dim=-1).values  # (B,)
    forbid_end_where(logits, positions[None, :] < last_kept[:, None], end_ids, columns)


def forbid_end_where(
    logits: torch.Tensor, where: torch.Tensor, end_ids: tuple[int, ...], columns: torch.Tensor | None = None
) -> None:
    """-inf, in place, on end-of-span in `logits` (B, n, V) at the canvas positions `where` (B, N) is True; the
    logits are those of the positions `columns` (n,), or of all when None."""
    if columns is not None:
        where = where[:, columns]  # (B, n)
    for end_id in end_ids:
        logits[..., end_id].masked_fill_(where, -math.inf)


def shift_end_until_content(
    logits: torch.Tensor, run: Denoising, state: CanvasState, content_from: torch.Tensor | None,
    columns: torch.Tensor | None = None,
) -> None:
    """Add `end_bias`, in place, to end-of-span in `logits` (B, n, V) of the canvas positions `columns` (all when
    None) up to each row's first committed content position (`content_from`, computed here when None), as
    `end_bias_until_content` asks; elsewhere (and without that setting) leave them as they are (`vocabulary_bias`
    adds a bias that applies everywhere)."""
    config, end_ids = run.config, run.denoiser.special.end_of_span_ids
    if not config.end_bias_until_content or config.end_bias == 0.0 or not end_ids:
        return
    if content_from is None:
        content_from = first_content(state, run.denoiser.blank_ids, end_ids)
    where = up_to_content(state, content_from)  # (B, N)
    if columns is not None:
        where = where[:, columns]  # (B, n)
    logits[..., list(end_ids)] += config.end_bias * where[..., None].to(logits.dtype)


def forbid_tokens(
    logits: torch.Tensor, state: CanvasState, config: SamplerConfig, special: SpecialTokens, first_position: int,
    columns: torch.Tensor | None = None, content_from: torch.Tensor | None = None,
) -> None:
    """-inf, in place, in the logits (B, n, V) of the canvas positions `columns` (all when None) on the tokens a
    span may not hold where they stand (the ones it holds nowhere are `vocabulary_bias`'s)."""
    too_short = config.min_tokens - first_position  # canvas positions before the span may end
    if not config.allow_end_of_span:
        suppress(logits, special.end_of_span_ids)
    elif too_short > 0:
        positions = columns if columns is not None else torch.arange(logits.shape[1], device=logits.device)
        forbid_end_where(logits, (positions < too_short)[None, :], special.end_of_span_ids)  # (1, n): before it may end
    if content_from is not None:  # end_after_content: each row's first content position (`first_content`)
        forbid_blank_end(logits, state, content_from, special.end_of_span_ids, columns)
    forbid_early_end(logits, state, special.end_of_span_ids, columns)


def first_content(state: CanvasState, blank_ids: torch.Tensor, end_ids: tuple[int, ...]) -> torch.Tensor:
    """Each row's (B,) first committed canvas position holding a token that is neither whitespace nor end-of-span;
    the canvas length in a row that has none."""
    blank_or_end = torch.isin(state.tokens, blank_ids.to(state.tokens.device)) | holds_end(state.tokens, end_ids)
    content = state.committed & ~blank_or_end  # (B, N)
    length = content.shape[1]
    positions = torch.arange(length, device=content.device)
    return torch.where(content, positions, torch.full_like(positions, length)).min(dim=-1).values


def forbid_blank_end(
    logits: torch.Tensor, state: CanvasState, first: torch.Tensor, end_ids: tuple[int, ...],
    columns: torch.Tensor | None = None,
) -> None:
    """End-of-span forbidden, in place, up to each row's first committed token that is not whitespace, `first` (B,)
    (all of the row's positions while it has none): `logits` (B, n, V) of the canvas positions `columns`, or of all
    when None."""
    if end_ids:
        forbid_end_where(logits, up_to_content(state, first), end_ids, columns)


def up_to_content(state: CanvasState, first: torch.Tensor) -> torch.Tensor:
    """The canvas positions (B, N) up to and including each row's first content position `first` (B,): all of a row
    that has none yet (`first` is then the canvas length)."""
    positions = torch.arange(state.tokens.shape[1], device=state.tokens.device)
    return positions[None, :] <= first[:, None]


def start_before_end(
    end_logits: torch.Tensor, logits: torch.Tensor, state: CanvasState, first: torch.Tensor,
    end_ids: tuple[int, ...], columns: torch.Tensor | None = None,
) -> torch.Tensor:
    """end_after_content: the positions (B, N) a step may commit, given each row's first content position `first`
    (B,; the canvas length where there is none). In a row without content yet, none where the
    model would have ended the span (its end-of-span logit before the rules forbade it, `end_logits` (B, n), above
    every logit left in `logits` (B, n, V); both of the positions `columns`), except the row's leftmost open position: what the model writes
    only because it may not end there is filler, and a line break committed at the far end would make the fill
    write every position before it."""
    batch, length = state.tokens.shape
    allowed = torch.ones(batch, length, dtype=torch.bool, device=state.tokens.device)
    if not end_ids:
        return allowed
    without_content = first == length  # (B,)
    if not bool(without_content.any()):
        return allowed
    wanted_end = end_logits > logits.amax(dim=-1)  # (B, n)
    if columns is None:
        allowed &= ~wanted_end
    else:
        allowed[:, columns] &= ~wanted_end
    open_positions = ~state.committed & ~state.frozen  # (B, N)
    leftmost = open_positions.int().argmax(dim=-1)  # (B,) the first open position (0 in a row with none)
    allowed[torch.arange(batch, device=allowed.device), leftmost] = True
    return allowed | ~without_content[:, None]


def draw_tokens(
    probs: torch.Tensor, temps: torch.Tensor, greedy: torch.Tensor, generator: torch.Generator,
    draw: str = "inverse_cdf",
) -> torch.Tensor:
    """Sample a token per position (B, N) from `probs`; `greedy` (B, N) on rows whose temperature is 0.

    Inverse-CDF sampling: one uniform draw per position, found in the running sum of the row's probabilities (in
    float64, so that no token's share is lost to rounding). An exact draw from `probs`, at the cost of one pass over
    the vocabulary; `torch.multinomial` draws an exponential variate per vocabulary entry instead, which cost more
    than the model's own forward pass with two candidates.
    """
    sampling = temps > 0  # (B,)
    if not bool(sampling.any()):
        return greedy
    if draw == "multinomial":  # every row, greedy ones too, as transformers draws: the same seed stream
        batch, length, vocab = probs.shape
        sampled = torch.multinomial(probs.view(-1, vocab), num_samples=1, generator=generator).view(batch, length)
        return torch.where(sampling[:, None], sampled, greedy)
    uniform = torch.rand(probs.shape[:2], generator=generator, device=probs.device, dtype=torch.float64)  # (B, N)
    cdf = probs[sampling].double().cumsum(dim=-1)  # (S, N, V) S sampling rows
    target = uniform[sampling] * cdf[..., -1]  # (S, N) within [0, total)
    sampled = torch.searchsorted(cdf, target[..., None], right=True).squeeze(-1)  # (S, N) first cdf > target
    drawn = greedy.clone()
    drawn[sampling] = sampled.clamp_max(probs.shape[-1] - 1)
    return drawn


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


def pick_tokens(
    logits: torch.Tensor, temps: torch.Tensor, order: str, generator: torch.Generator, draw: str = "inverse_cdf"
) -> Prediction:
    """Draw a token per position from `logits` (B, N, V) at each row's temperature `temps` (B,), and score it."""
    sampling = bool((temps > 0).any())
    logits = logits.float()
    if sampling:  # greedy rows are left as they are
        safe = torch.where(temps > 0, temps, torch.ones_like(temps))
        scaled = logits / safe[:, None, None]  # (B, N, V)
    else:
        scaled = logits
    probs = torch.softmax(scaled, dim=-1)  # (B, N, V) at the sampling temperature
    model_probs = torch.softmax(logits, dim=-1) if sampling else probs  # (B, N, V)
    argmax = vocabulary_argmax(scaled)  # (B, N) the most likely token at any temperature, the first of equals
    drawn = draw_tokens(probs, temps, argmax, generator, draw)  # (B, N)
    scores = order_scores(probs, drawn, order, generator)  # (B, N)
    drawn_probs = model_probs.gather(-1, drawn[..., None]).squeeze(-1)  # (B, N)
    argmax_probs = model_probs.gather(-1, argmax[..., None]).squeeze(-1)  # (B, N)
    return Prediction(scaled, model_probs, drawn, drawn_probs, argmax, argmax_probs, scores, probs)


def stable_rows(history: list[torch.Tensor], needed: int) -> torch.Tensor:
    """Rows (B,) whose argmax canvas has not changed over the last `needed` steps."""
    latest = history[-1]
    if len(history) <= needed:
        return torch.zeros(latest.shape[0], dtype=torch.bool, device=latest.device)
    same = torch.ones(latest.shape[0], dtype=torch.bool, device=latest.device)
    for previous in history[-needed - 1 : -1]:
        same &= (previous == latest).all(dim=-1)
    return same


def check_stop(
    history: list[torch.Tensor], prediction: Prediction, in_window: torch.Tensor, config: SamplerConfig
) -> torch.Tensor:
    """Record this step's argmax; rows (B,) that may stop early: a stable argmax and a confident model where the
    row is undecided (committed positions that the rule keeps count as settled)."""
    history.append(torch.where(in_window, prediction.argmax, torch.full_like(prediction.argmax, -1)))  # (B, N)
    stable = stable_rows(history, config.stability_steps)  # (B,)
    if not bool(stable.any()):  # the entropy is not needed (nor computed) until a row is stable
        return stable
    undecided = in_window if prediction.held is None else in_window & ~prediction.held  # (B, N)
    mean_entropy = (prediction.entropy * undecided).sum(-1) / undecided.sum(-1).clamp_min(1)  # (B,)
    return stable & (mean_entropy < config.confidence_threshold)


# ------------------------------------------------------------------------------------------------------ the loop


def denoise_block(run: Denoising, block: Block, state: CanvasState) -> int:
    """Denoise the positions of the block's window in place until they are settled; return the steps taken."""
    config, rule = run.config, run.rule
    batch, length = state.tokens.shape
    in_window = torch.zeros(length, dtype=torch.bool, device=state.tokens.device)  # (N,)
    in_window[block.window] = True
    history: list[torch.Tensor] = []  # (B, N) argmax of every step so far
    self_conditioning = None  # (B, N, V) the previous step's logits, for models that read them
    done = rule.settled(state, in_window)  # (B,) rows with nothing left to decide
    last_read: torch.Tensor | None = None  # (B, N) the canvas the pass before read
    step = 0
    for step in range(config.steps):
        if bool(done.all()):
            return step
        # predict: logits of the canvas positions still open (the model reads them all; between canvas refreshes
        # it runs only the open and just-changed ones), forbidden tokens out
        columns = open_columns(run, state, done)  # (n,); None: every position
        rows = rows_to_run(run, state, last_read, step) if columns is not None else None  # (r,); None: all
        kwargs = {} if columns is None else {"columns": columns}
        if rows is not None:
            kwargs["rows"] = rows
        logits = run.denoiser.predict(block.context, state.tokens, self_conditioning, **kwargs)  # (B, n, V)
        last_read = state.tokens.clone() if config.canvas_refresh else None  # only a canvas refresh reads it
        run.stats.forward_passes += 1
        run.stats.positions_predicted += logits.shape[0] * logits.shape[1]
        end_ids = run.denoiser.special.end_of_span_ids
        content_from = None  # end_after_content: each row's first committed content position
        if config.end_after_content and block.first_position == 0:
            content_from = first_content(state, run.denoiser.blank_ids, end_ids)
        bias = vocabulary_bias(config, run.denoiser.special, logits.shape[-1], logits.device)  # (V,) every step alike
        logits = logits + bias if bias is not None else logits.clone()  # the step's own: the rules write into it
        shift_end_until_content(logits, run, state, content_from, columns)
        # end_after_content: where the model would end the span, read before the rules forbid it (B, n)
        end_logits = None if content_from is None else logits[..., list(end_ids)].amax(dim=-1)
        forbid_tokens(logits, state, config, run.denoiser.special, block.first_position, columns, content_from)
        # pick tokens: draw one per position at each row's temperature; committed positions keep theirs
        temps = row_temperatures(config, step, batch, state.tokens.device)  # (B,)
        prediction = around_committed(run, pick_tokens(logits, temps, config.order, run.generator, config.draw),
                                      columns, state)
        # commit: the rule decides which positions keep their token; the others are (re-)noised
        active = ~done[:, None] & in_window  # (B, N) positions this step may change
        if content_from is not None:  # no content yet: not where the model would have ended the span
            active &= start_before_end(end_logits, logits, state, content_from, end_ids, columns)
        rule.commit(state, prediction, active, config.steps - step)
        # check stop: a stable, confident row takes its argmax and is done
        confident = check_stop(history, prediction, in_window, config) & ~done  # (B,)
        state.argmax = torch.where(done[:, None], state.argmax, prediction.argmax)  # (B, N)
        if bool(confident.any()):
            settle_with_argmax(state, prediction.argmax, prediction.argmax_probs, confident[:, None] & in_window)
            run.stats.stopped_early = True
        done |= confident | rule.settled(state, in_window)
        self_conditioning = prediction.logits if run.denoiser.uses_self_conditioning else None
        if run.on_step is not None and run.on_step(StepView(block.index, step, state.tokens, state.committed)) is False:
            raise FillCancelled()
        if not bool(done.all()) and run.out_of_time():
            break
    rule.finish(state, prediction, in_window)  # step limit reached: what is undecided takes the last argmax
    return step + 1


def block_windows(span_length: int, block_size: int, whole: bool) -> list[slice]:
    """The span positions of each block, in order (one block when `whole` or when the span fits one)."""
    if whole or span_length <= block_size:
        return [slice(0, span_length)]
    return [slice(start, min(start + block_size, span_length)) for start in range(0, span_length, block_size)]


def denoise_on_one_canvas(
    run: Denoising, prefix_ids: list[int], suffix_ids: list[int], windows: list[slice], state: CanvasState,
    context: EncodedContext | None = None,
) -> tuple[list[int], EncodedContext]:
    """The whole span on one canvas against one encoded context (`context`, or encoded now); the blocks order the
    commits. Returns the steps per block and the context."""
    batch, length = state.tokens.shape
    if context is None:
        with run.stats.timed("encode"):
            context = run.denoiser.encode(prefix_ids, suffix_ids, length, batch)
        run.stats.context_encodes += 1
    steps_per_block = []
    for index, window in enumerate(windows):
        with run.stats.timed("denoise"):
            steps_per_block.append(denoise_block(run, Block(index, context, window, 0), state))
        if bool(ended_rows(state.tokens, state.committed, run.denoiser.special.end_of_span_ids).all()):
            break
    return steps_per_block, context


def denoise_appended_blocks(
    run: Denoising, prefix_ids: list[int], suffix_ids: list[int], windows: list[slice], state: CanvasState
) -> list[int]:
    """Block diffusion: each block is its own canvas; finished blocks join the context of the next."""
    end_ids = run.denoiser.special.end_of_span_ids
    steps_per_block = []
    for index, window in enumerate(windows):
        finished = run.rule.answer(state)[:, : window.start]  # (B, k) the blocks before this one
        with run.stats.timed("encode"):
            context = run.denoiser.encode_rows(prefix_ids, finished, suffix_ids, window.stop - window.start)
        run.stats.context_encodes += 1
        parts = (state.tokens, state.committed, state.frozen, state.probs, state.argmax)
        block_state = CanvasState(*(part[:, window].clone() for part in parts))
        block = Block(index, context, slice(0, window.stop - window.start), window.start)
        with run.stats.timed("denoise"):
            steps_per_block.append(denoise_block(run, block, block_state))
        state.tokens[:, window] = block_state.tokens
        state.committed[:, window] = block_state.committed
        state.probs[:, window] = block_state.probs
        state.argmax[:, window] = block_state.argmax
        if bool(ended_rows(run.rule.answer(state), torch.ones_like(state.committed), end_ids).all()):
            break
    return steps_per_block


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
    deadline: float | None = None,
    context: EncodedContext | None = None,
) -> DenoisedSpan:
    """Denoise a span of `span_length` positions between prefix and suffix for `batch_size` candidates.

    With `initial` (N,) or (B, N) tokens and a `frozen` mask, the frozen positions are kept and the others are
    re-noised and decided again (used to repair and to refine). Past `deadline` (a `time.perf_counter()` value),
    a block stops after its current step and its undecided positions take the argmax. `context`: the span's
    context as an earlier one-canvas fill of the same ids and length encoded it (`DenoisedSpan.context`), for a
    denoiser that `reuses_context`; it is not encoded again.
    """
    if frozen is not None and initial is None:
        raise ValueError("a frozen mask needs the initial tokens it keeps")
    stats = stats if stats is not None else FillStats()
    generator = torch.Generator(device=denoiser.device).manual_seed(config.seed)
    windows = block_windows(span_length, config.block_size, whole=initial is not None)
    on_one_canvas = denoiser.block_mode == "restrict" or len(windows) == 1
    copy = None  # the context's n-grams reach the canvas's first position only where the span is one canvas
    if config.copy_floor > 0 and on_one_canvas:
        copy = ContextCopy.of(prefix_ids, suffix_ids, config.copy_ngram, config.copy_floor)
    rule = commit_rule(
        config.commit, denoiser, generator, threshold=config.threshold, entropy_bound=config.entropy_bound,
        revise_below=config.revise_below, stop_at_line_break=config.stop_at_line_break,
        tail_floor=config.tail_floor if config.settle_tail else None, tail_first=config.tail_first,
        stable_floor=config.stable_floor, factor=config.factor, context_copy=copy, force_content=config.force_content,
        # a fill that must write something, or a refine, commits only what the model is surest of (see min_commits)
        min_commits=1 if config.end_after_content or initial is not None else config.min_commits,
    )
    run = Denoising(denoiser, config, rule, generator, stats, on_step, deadline)
    state = initial_state(denoiser, batch_size, span_length, generator, initial, frozen)
    one_canvas = None
    if on_one_canvas:
        reused = context if denoiser.reuses_context and context is not None else None
        steps_per_block, one_canvas = denoise_on_one_canvas(run, prefix_ids, suffix_ids, windows, state, reused)
    else:
        steps_per_block = denoise_appended_blocks(run, prefix_ids, suffix_ids, windows, state)
    return DenoisedSpan(rule.answer(state), state.probs, stats.stopped_early, steps_per_block, one_canvas)
