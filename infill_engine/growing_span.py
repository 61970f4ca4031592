"""DreamOn's variable-length infilling: a span that grows and shrinks while it is denoised.

A fixed canvas makes the user guess the fill's length, and a wrong guess is the main quality loss of diffusion
infilling. DreamOn (https://github.com/DreamLM/DreamOn, arXiv 2602.01326) adds two states to the vocabulary:

- expand: a masked position predicted as expand becomes two masked positions (the span grows by one);
- delete: a masked position predicted as delete is removed (the span shrinks by one).

The span starts from a few masks and each step is: predict every position, commit the surest masked positions
(one a step in DreamOn's setting), then apply the deletes and expands. The canvas length is guarded by a maximum
(the request's `max_tokens`): at the maximum, expand is forbidden; a span never shrinks below
`SamplerConfig.min_tokens`. The loop ends when no mask is left, or at the step limit, where the masks left take
the model's argmax. Each candidate row has its own canvas (their lengths differ), denoised one after the other.

This routine is chosen once per engine, when the model's tokenizer has both tokens
(`SpecialTokens.expand_id`/`delete_id`); the fixed-length loop (`infill_engine.sampler`) knows nothing of it.
"""

from __future__ import annotations

import math
import time

import torch

from infill_engine.adapters.base import Denoiser, EncodedContext
from infill_engine.commit_rules import by_threshold
from infill_engine.request import FillCancelled
from infill_engine.sampler import DenoisedSpan, SamplerConfig, StepCallback, StepView, pick_tokens, row_temperatures
from infill_engine.stats import FillStats

INITIAL_MASKS = 4  # DreamOn's quickstart and its infilling evaluation (min_gen_len: 4) start from 4 masks


@torch.no_grad()
def denoise_growing_span(
    denoiser: Denoiser,
    prefix_ids: list[int],
    suffix_ids: list[int],
    span_length: int,
    config: SamplerConfig,
    batch_size: int = 1,
    stats: FillStats | None = None,
    on_step: StepCallback | None = None,
    deadline: float | None = None,
) -> DenoisedSpan:
    """Denoise a span that starts from `INITIAL_MASKS` masks and may grow to `span_length` positions, per candidate.

    The result has the shape of the fixed-length loop's: (B, span_length) tokens, each row padded after its end
    with end-of-span tokens (or padding, for a model without one). Past `deadline` (a `time.perf_counter()` value)
    each row stops growing and its masks take the argmax.
    """
    if denoiser.special.expand_id is None or denoiser.special.delete_id is None or denoiser.special.mask_id is None:
        raise ValueError("a growing span needs a masked-diffusion model with expand and delete tokens")
    stats = stats if stats is not None else FillStats()
    generator = torch.Generator(device=denoiser.device).manual_seed(config.seed)
    with stats.timed("encode"):
        context = denoiser.encode(prefix_ids, suffix_ids, span_length, 1)
    stats.context_encodes += 1
    rows, steps = [], []
    with stats.timed("denoise"):
        for row in range(batch_size):
            tokens, probs, taken = denoise_row(denoiser, context, span_length, config, row, batch_size, generator,
                                               stats, on_step, deadline)
            rows.append((tokens, probs))
            steps.append(taken)
    return padded(denoiser, rows, span_length, steps)


def denoise_row(
    denoiser: Denoiser,
    context: EncodedContext,
    max_length: int,
    config: SamplerConfig,
    row: int,
    batch_size: int,
    generator: torch.Generator,
    stats: FillStats,
    on_step: StepCallback | None,
    deadline: float | None = None,
) -> tuple[list[int], list[float], int]:
    """One candidate's span: its tokens, the probability each was committed with, and the steps taken."""
    mask = int(denoiser.special.mask_id)  # type: ignore[arg-type]
    tokens = [mask] * min(INITIAL_MASKS, max_length)
    probs = [0.0] * len(tokens)
    step = 0
    for step in range(config.steps):
        if mask not in tokens:
            return tokens, probs, step
        # predict: logits of every position, with what may not stand here forbidden
        canvas = torch.tensor([tokens], dtype=torch.long, device=denoiser.device)  # (1, L)
        logits = allowed_logits(denoiser, denoiser.predict(context, canvas), len(tokens), max_length, config)
        stats.forward_passes += 1
        # pick and commit: the surest masked positions keep their drawn token
        temps = row_temperatures(config, step, batch_size, canvas.device)[row : row + 1]  # (1,)
        prediction = pick_tokens(logits, temps, config.order, generator, config.draw)
        free = canvas == mask  # (1, L)
        chosen = by_threshold(prediction.scores, free, config.threshold, config.steps - step)[0]  # (L,)
        drawn, drawn_probs = prediction.drawn[0].tolist(), prediction.drawn_probs[0].tolist()
        for position in chosen.nonzero().flatten().tolist():
            tokens[position], probs[position] = drawn[position], drawn_probs[position]
        # grow and shrink: deletes leave the span, each expand becomes two masks
        tokens, probs = apply_length_control(denoiser, tokens, probs, max_length, config.min_tokens)
        if on_step is not None:
            view = torch.tensor([tokens], dtype=torch.long)
            if on_step(StepView(0, step, view, view != mask)) is False:
                raise FillCancelled()
        if deadline is not None and mask in tokens and time.perf_counter() >= deadline:
            stats.over_budget = True
            break
    if mask in tokens:  # step limit: the masks left take the model's argmax (no more growing or shrinking)
        canvas = torch.tensor([tokens], dtype=torch.long, device=denoiser.device)
        logits = allowed_logits(denoiser, denoiser.predict(context, canvas), max_length, max_length,
                                config, length_fixed=True)
        stats.forward_passes += 1
        best = torch.softmax(logits.float(), dim=-1)[0].max(dim=-1)  # (L,) values and indices
        for position, token in enumerate(tokens):
            if token == mask:
                tokens[position], probs[position] = int(best.indices[position]), float(best.values[position])
    return tokens, probs, step + 1


def allowed_logits(
    denoiser: Denoiser, logits: torch.Tensor, length: int, max_length: int, config: SamplerConfig,
    length_fixed: bool = False,
) -> torch.Tensor:
    """Logits (1, L, V) with -inf on what may not be written: special tokens, expand at the maximum length, delete
    at the minimum, end-of-span before `min_tokens`, and both length tokens once the length is fixed."""
    special = denoiser.special
    banned = set(special.ids_never_generated) if config.suppress_special else set()
    banned -= {special.expand_id, special.delete_id}
    if length_fixed or length >= max_length:
        banned.add(special.expand_id)  # type: ignore[arg-type]
    if length_fixed or length <= config.min_tokens:
        banned.add(special.delete_id)  # type: ignore[arg-type]
    logits = logits.float().clone()
    logits[..., sorted(banned)] = -math.inf
    if special.end_of_span_ids and config.min_tokens > 0:
        logits[:, : config.min_tokens, list(special.end_of_span_ids)] = -math.inf
    return logits


def apply_length_control(
    denoiser: Denoiser, tokens: list[int], probs: list[float], max_length: int, min_length: int
) -> tuple[list[int], list[float]]:
    """The span after its committed deletes (removed) and expands (two masks each), within the length guards.

    A delete that would take the span below `min_length`, or an expand that would take it past `max_length`,
    is turned back into a mask and decided again.
    """
    special = denoiser.special
    mask = int(special.mask_id)  # type: ignore[arg-type]
    length = len(tokens)
    kept: list[int] = []
    kept_probs: list[float] = []
    for token, prob in zip(tokens, probs):
        if token == special.delete_id and length > min_length:
            length -= 1
        elif token == special.expand_id and length < max_length:
            kept += [mask, mask]
            kept_probs += [0.0, 0.0]
            length += 1
        elif token in (special.delete_id, special.expand_id):
            kept.append(mask)
            kept_probs.append(0.0)
        else:
            kept.append(token)
            kept_probs.append(prob)
    return kept, kept_probs


def padded(denoiser: Denoiser, rows: list[tuple[list[int], list[float]]], length: int,
           steps: list[int]) -> DenoisedSpan:
    """The rows as one (B, length) span, each padded after its end with end-of-span (or padding) tokens."""
    special = denoiser.special
    filler = special.end_of_span_ids[0] if special.end_of_span_ids else (special.pad_id or 0)
    tokens = torch.full((len(rows), length), filler, dtype=torch.long)  # (B, N)
    probs = torch.zeros((len(rows), length))  # (B, N)
    for index, (row_tokens, row_probs) in enumerate(rows):
        tokens[index, : len(row_tokens)] = torch.tensor(row_tokens[:length], dtype=torch.long)
        probs[index, : len(row_probs)] = torch.tensor(row_probs[:length])
    return DenoisedSpan(tokens, probs, False, steps[:1])
