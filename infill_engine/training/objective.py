"""The infilling objective: cut a hole in a document, lay it out as serving does, and corrupt the span.

    document -> (prefix, middle, suffix) text -> trim_context + layout_canvas (the serving functions)
             -> span targets: middle ids, then end-of-span up to the span length
             -> span inputs: MDLM masking at rate t (weight 1/t) plus a few random-token replacements

The sequence given to `DiffillForInfilling.forward` is prefix | span | suffix with positions 0..T-1, which are the
positions serving uses (prefix 0..P-1, canvas P..P+N-1, suffix P+N..). Every span position carries a label:

- masked positions are the masked-diffusion loss, weighted 1/t so that the loss is the MDLM bound;
- replaced positions (a wrong token where the right one was) teach the model to correct committed tokens;
- kept positions teach it to keep correct tokens (the sampler revises committed tokens whose confidence falls).

All randomness comes from the `random.Random` passed in, so a training run's data stream is one resumable state.
"""

from __future__ import annotations

import random
from dataclasses import dataclass
from typing import Any

import torch

from infill_engine.canvas import Canvas, ContextConfig, layout_canvas, trim_context
from infill_engine.diffill_model.modeling_diffill import IGNORE_INDEX
from infill_engine.special_tokens import resolve_special_tokens

HOLE_KINDS = ("line", "rest_of_line", "block", "tokens")


@dataclass(frozen=True)
class ObjectiveConfig:
    """How holes are cut and spans corrupted; probabilities are per example unless said otherwise."""

    seq_len: int = 256  # longest prefix + span + suffix, in tokens
    max_span_tokens: int = 64  # longest span (serving's default max_tokens)
    max_extra_positions: int = 32  # span positions after the middle, drawn from 0..this, filled with end-of-span
    full_span_prob: float = 0.25  # otherwise: the span is max_span_tokens long, as serving's default request
    line_prob: float = 0.5  # a whole line, or the rest of a line from a column (half each)
    block_prob: float = 0.3  # several consecutive lines, stopping where the indentation falls below the first's
    max_block_lines: int = 12  # most lines in a block hole
    # the rest (1 - line_prob - block_prob): a random run of 1..max_span_tokens tokens
    whole_line_newline_prob: float = 0.75  # a whole-line middle includes its line end (else the suffix starts with it)
    min_mask_rate: float = 1e-3  # eps of t ~ U(eps, 1); the weight 1/t is at most 1/eps
    replace_prob: float = 0.1  # share of unmasked span positions given a random ordinary token
    suffix_share_max: float = 0.5  # the suffix budget is U(0, this) of the context room
    short_context_prob: float = 0.2  # otherwise the prefix gets the whole rest of the room
    window_chars: int = 4096  # text looked at around the hole's start when cutting a token-run hole
    holes: int = 1  # holes per training window at most: each example draws 1..holes (1: one hole, as served)
    min_context_tokens: int = 32  # a window of several holes keeps at least this much context, else it has one hole
    # the loss weight of a span's first end-of-span position (where the middle ends) is multiplied by this: at
    # unknown length that one position decides where the fill stops, while the end-of-span positions after it are easy
    end_weight: float = 1.0

    def __post_init__(self) -> None:
        if not 1 <= self.max_span_tokens < self.seq_len:
            raise ValueError(
                f"max_span_tokens must be at least 1 and below seq_len {self.seq_len} (got {self.max_span_tokens})"
            )
        if self.max_extra_positions < 0:
            raise ValueError(f"max_extra_positions must be >= 0 (got {self.max_extra_positions})")
        if not 0 < self.min_mask_rate < 1:
            raise ValueError(f"min_mask_rate must be in (0, 1) (got {self.min_mask_rate})")
        for name in ("full_span_prob", "line_prob", "block_prob", "replace_prob", "whole_line_newline_prob",
                     "suffix_share_max", "short_context_prob"):
            value = getattr(self, name)
            if not 0 <= value <= 1:
                raise ValueError(f"{name} must be a probability in [0, 1] (got {value})")
        if not (isinstance(self.end_weight, (int, float)) and 0 < self.end_weight < float("inf")):
            raise ValueError(f"end_weight must be a positive number (got {self.end_weight!r})")
        if not isinstance(self.holes, int) or self.holes < 1:
            raise ValueError(f"holes must be an integer >= 1 (got {self.holes!r})")
        if self.line_prob + self.block_prob > 1:
            raise ValueError("line_prob + block_prob must be at most 1 (the rest is token-run holes)")


@dataclass(frozen=True)
class SpanTokens:
    """The token ids the objective writes, read from the tokenizer (never literals)."""

    mask_id: int
    end_of_span_id: int
    pad_id: int
    ordinary_ids: tuple[int, ...]  # what a random replacement may be: every id that is not special


@dataclass(frozen=True)
class Hole:
    """A document cut in three: the model sees prefix and suffix and must write the middle."""

    prefix: str
    middle: str
    suffix: str
    kind: str  # one of HOLE_KINDS


@dataclass(frozen=True)
class TrainingExample:
    """One training sequence: prefix | corrupted span | suffix, with span labels and loss weights."""

    input_ids: list[int]  # (T,)
    labels: list[int]  # (T,) target ids on the span, IGNORE_INDEX on prefix and suffix
    loss_weights: list[float]  # (T,) 1/t at masked positions, 1 at other span positions, 0 outside the span
    canvas: Canvas  # where the (first) span sits (from layout_canvas)
    middle_length: int  # span positions holding the (first) middle; the rest hold end-of-span targets
    mask_rate: float  # t (of the first span)
    context: ContextConfig  # the budgets trim_context was called with
    hole: Hole  # the first hole
    # [start, end) of every span, in order; one span unless the window has several holes
    spans: tuple[tuple[int, int], ...] = ()

    def __post_init__(self) -> None:
        if not self.spans:
            object.__setattr__(self, "spans", ((self.canvas.span_start, self.canvas.suffix_start),))

    @property
    def canvas_mask(self) -> list[bool]:
        """True at span positions."""
        return [segment > 0 for segment in self.segments]

    @property
    def segments(self) -> list[int]:
        """Per position: 0 in the context, k at the k-th span's positions (each span attends only to itself)."""
        segments = [0] * len(self.input_ids)
        for number, (start, end) in enumerate(self.spans, start=1):
            segments[start:end] = [number] * (end - start)
        return segments


def span_tokens(tokenizer: Any) -> SpanTokens:
    """Mask, end-of-span and pad ids as serving resolves them, and the ids a replacement may use."""
    special = resolve_special_tokens(tokenizer, None)
    if special.mask_id is None or not special.end_of_span_ids or special.pad_id is None:
        raise ValueError("the tokenizer needs a mask token, an end-of-span token and a pad token to train with")
    specials = set(special.ids_never_generated) | set(special.end_of_span_ids)
    specials |= {int(i) for i in getattr(tokenizer, "all_special_ids", [])}
    ordinary = tuple(i for i in range(len(tokenizer)) if i not in specials)
    return SpanTokens(special.mask_id, special.end_of_span_ids[0], special.pad_id, ordinary)


def _line_bounds(text: str, position: int) -> tuple[int, int]:
    """Start of the line containing `position`, and the index of its line end (len(text) on the last line)."""
    start = text.rfind("\n", 0, position) + 1
    end = text.find("\n", position)
    return start, len(text) if end == -1 else end


def _indent(line: str) -> int:
    """Width of a line's leading whitespace, in characters."""
    return len(line) - len(line.lstrip(" \t"))


def sample_hole(document: str, rng: random.Random, tokenizer: Any, config: ObjectiveConfig) -> Hole:
    """Cut a hole, biased to whole lines and blocks, whose middle is 1..max_span_tokens tokens."""
    for _ in range(16):
        position = rng.randrange(len(document))
        draw = rng.random()
        if draw < config.line_prob:
            start, end = _cut_line(document, position, rng, config)
            kind = "line" if start == _line_bounds(document, position)[0] else "rest_of_line"
        elif draw < config.line_prob + config.block_prob:
            start, end, kind = *_cut_block(document, position, rng, config), "block"
        else:
            start, end, kind = *_cut_tokens(document, position, rng, tokenizer, config), "tokens"
        if start < end:
            end = _fit_middle(document, start, end, tokenizer, config, keep_lines=kind in ("line", "block"))
            if start < end:
                return Hole(document[:start], document[start:end], document[end:], kind)
    # a document of blank lines only: any single character
    start = rng.randrange(len(document))
    return Hole(document[:start], document[start : start + 1], document[start + 1 :], "tokens")


def _cut_line(document: str, position: int, rng: random.Random, config: ObjectiveConfig) -> tuple[int, int]:
    """A whole line (with its line end, usually), or its rest from a column at or after the indentation."""
    start, end = _line_bounds(document, position)
    content_end = end - 1 if end > start and document[end - 1] == "\r" else end
    line = document[start:content_end]
    if rng.random() < 0.5:  # the whole line
        with_newline = end < len(document) and rng.random() < config.whole_line_newline_prob
        return start, end + 1 if with_newline else content_end
    indent = _indent(line)
    if indent >= len(line):
        return start, start  # blank line: no rest to cut
    column = indent if rng.random() < 0.3 else rng.randrange(indent, len(line))
    return start + column, content_end


def _cut_block(document: str, position: int, rng: random.Random, config: ObjectiveConfig) -> tuple[int, int]:
    """2..max_block_lines whole lines from the line at `position`, ending before the indentation falls."""
    start, end = _line_bounds(document, position)
    first_indent = _indent(document[start:end])
    wanted = rng.randint(2, max(config.max_block_lines, 2))
    lines = 1
    while lines < wanted and end < len(document):
        next_start = end + 1
        next_end = _line_bounds(document, next_start)[1]
        line = document[next_start:next_end]
        if line.strip() and _indent(line) < first_indent:
            break
        end, lines = next_end, lines + 1
    return start, min(end + 1, len(document))


def _cut_tokens(
    document: str, position: int, rng: random.Random, tokenizer: Any, config: ObjectiveConfig
) -> tuple[int, int]:
    """A run of 1..max_span_tokens tokens starting at a token boundary near `position`."""
    window = document[position : position + config.window_chars]
    offsets = tokenizer(window, add_special_tokens=False, return_offsets_mapping=True)["offset_mapping"]
    if len(offsets) < 2:
        return position, position + len(window)
    first = 1 if len(offsets) > 2 else 0  # the window may start inside a token: begin at the next one
    length = rng.randint(1, min(config.max_span_tokens, len(offsets) - first))
    return position + offsets[first][0], position + offsets[first + length - 1][1]


def _fit_middle(
    document: str, start: int, end: int, tokenizer: Any, config: ObjectiveConfig, keep_lines: bool
) -> int:
    """The end of the middle, moved back so that the middle is at most max_span_tokens tokens."""
    middle = document[start:end]
    encoded = tokenizer(middle, add_special_tokens=False, return_offsets_mapping=True)
    if len(encoded["input_ids"]) <= config.max_span_tokens:
        return end
    cut = encoded["offset_mapping"][config.max_span_tokens - 1][1]
    if keep_lines:
        line_end = middle.rfind("\n", 0, cut)
        if line_end > 0:
            cut = line_end + 1
    # re-tokenizing a shorter text can merge differently; shrink until it fits
    while cut > 0 and len(tokenizer(middle[:cut], add_special_tokens=False)["input_ids"]) > config.max_span_tokens:
        cut -= 1
    return start + cut


def corrupt_span(
    targets: list[int], rng: random.Random, tokens: SpanTokens, config: ObjectiveConfig
) -> tuple[list[int], list[float], float]:
    """Noisy span inputs, per-position loss weights and the mask rate t: mask at rate t, replace a few of the rest.

    The first end-of-span target (where the middle ends) has its weight multiplied by `config.end_weight`.
    """
    t = rng.uniform(config.min_mask_rate, 1.0)
    inputs, weights = [], []
    for target in targets:
        if rng.random() < t:
            inputs.append(tokens.mask_id)
            weights.append(1.0 / t)
        elif rng.random() < config.replace_prob:
            inputs.append(rng.choice(tokens.ordinary_ids))
            weights.append(1.0)
        else:
            inputs.append(target)
            weights.append(1.0)
    if config.end_weight != 1.0 and tokens.end_of_span_id in targets:
        weights[targets.index(tokens.end_of_span_id)] *= config.end_weight
    return inputs, weights, t


def draw_context_budgets(room: int, rng: random.Random, config: ObjectiveConfig) -> ContextConfig:
    """Split `room` context tokens between prefix and suffix at random (now and then a short prefix)."""
    suffix_budget = int(room * rng.uniform(0.0, config.suffix_share_max))
    prefix_budget = room - suffix_budget
    if rng.random() < config.short_context_prob:
        prefix_budget = rng.randint(0, prefix_budget)
    return ContextConfig(prefix_tokens=prefix_budget, suffix_tokens=suffix_budget)


def build_example(
    tokenizer: Any, hole: Hole, rng: random.Random, tokens: SpanTokens, config: ObjectiveConfig
) -> TrainingExample:
    """Lay a hole out with the serving functions and corrupt its span."""
    middle_ids = tokenizer(hole.middle, add_special_tokens=False)["input_ids"][: config.max_span_tokens]
    span_length = _span_length(middle_ids, rng, config)
    context = draw_context_budgets(config.seq_len - span_length, rng, config)
    trimmed = trim_context(tokenizer, hole.prefix, hole.suffix, context)
    canvas = layout_canvas(trimmed.prefix_ids, span_length, trimmed.suffix_ids)
    targets = list(middle_ids) + [tokens.end_of_span_id] * (span_length - len(middle_ids))
    noisy, span_weights, t = corrupt_span(targets, rng, tokens, config)
    outside = [IGNORE_INDEX] * len(canvas.prefix_ids), [IGNORE_INDEX] * len(canvas.suffix_ids)
    return TrainingExample(
        input_ids=canvas.prefix_ids + noisy + canvas.suffix_ids,
        labels=outside[0] + targets + outside[1],
        loss_weights=[0.0] * len(canvas.prefix_ids) + span_weights + [0.0] * len(canvas.suffix_ids),
        canvas=canvas,
        middle_length=len(middle_ids),
        mask_rate=t,
        context=context,
        hole=hole,
    )


def make_example(
    tokenizer: Any, document: str, rng: random.Random, tokens: SpanTokens, config: ObjectiveConfig
) -> TrainingExample:
    """A training example from one document: cut a hole (or several), lay it out as serving does, corrupt the span."""
    holes = rng.randint(1, config.holes) if config.holes > 1 else 1
    if holes > 1:
        example = build_multi_hole_example(tokenizer, document, holes, rng, tokens, config)
        if example is not None:
            return example
    return build_example(tokenizer, sample_hole(document, rng, tokenizer, config), rng, tokens, config)


def _span_length(middle_ids: list[int], rng: random.Random, config: ObjectiveConfig) -> int:
    """Span positions for a middle: its tokens and a few end-of-span positions (the whole span, sometimes)."""
    if rng.random() < config.full_span_prob:
        span_length = config.max_span_tokens
    else:
        span_length = min(len(middle_ids) + rng.randint(0, config.max_extra_positions), config.max_span_tokens)
    return max(span_length, len(middle_ids), 1)


def _line_cuts(text: str, parts: int) -> list[int]:
    """Offsets that cut text into `parts` pieces of about equal length, each cut at a line start."""
    cuts = [0]
    for part in range(1, parts):
        at = text.find("\n", part * len(text) // parts)
        cuts.append(max(cuts[-1], at + 1 if at != -1 else len(text)))
    return cuts + [len(text)]


def build_multi_hole_example(
    tokenizer: Any, document: str, holes: int, rng: random.Random, tokens: SpanTokens, config: ObjectiveConfig
) -> TrainingExample | None:
    """Several holes in one window: context | span 1 | context | span 2 | ... | context, each span corrupted alone.

    The window is cut into `holes` runs of whole lines with a hole in each; the text before the first and after the
    last hole is trimmed as serving trims a prefix and a suffix. None when the spans would leave less than
    `min_context_tokens` of context (the caller then cuts one hole).
    """
    window = config.seq_len * 3  # characters: about the sequence length in tokens, at ~3.3 characters a token
    start = _line_bounds(document, rng.randrange(len(document)))[0]
    end = min(len(document), start + window)
    cuts = _line_cuts(document[start:end], holes)
    parts = [(start + a, start + b) for a, b in zip(cuts, cuts[1:]) if b > a]
    if len(parts) < holes:
        return None
    cut = [sample_hole(document[a:b], rng, tokenizer, config) for a, b in parts]
    middles = [tokenizer(h.middle, add_special_tokens=False)["input_ids"][: config.max_span_tokens] for h in cut]
    span_lengths = [_span_length(m, rng, config) for m in middles]
    # the context between two holes: the rest of one part and the start of the next, kept whole
    between = [tokenizer(a.suffix + b.prefix, add_special_tokens=False)["input_ids"] for a, b in zip(cut, cut[1:])]
    room = config.seq_len - sum(span_lengths) - sum(len(ids) for ids in between)
    if room < config.min_context_tokens:
        return None
    suffix_budget = int(room * rng.uniform(0.0, config.suffix_share_max))
    context = ContextConfig(prefix_tokens=room - suffix_budget, suffix_tokens=suffix_budget)
    outer = trim_context(tokenizer, document[: parts[0][0]] + cut[0].prefix,
                         cut[-1].suffix + document[parts[-1][1] :], context)
    pieces = [outer.prefix_ids, *between, outer.suffix_ids]  # the context around and between the spans
    input_ids, labels, weights = list(pieces[0]), [IGNORE_INDEX] * len(pieces[0]), [0.0] * len(pieces[0])
    spans: list[tuple[int, int]] = []
    rates: list[float] = []
    for middle, length, after in zip(middles, span_lengths, pieces[1:]):
        targets = list(middle) + [tokens.end_of_span_id] * (length - len(middle))
        noisy, span_weights, t = corrupt_span(targets, rng, tokens, config)
        spans.append((len(input_ids), len(input_ids) + length))
        rates.append(t)
        input_ids += noisy + list(after)
        labels += targets + [IGNORE_INDEX] * len(after)
        weights += span_weights + [0.0] * len(after)
    first = layout_canvas(outer.prefix_ids, span_lengths[0], input_ids[spans[0][1] :])
    return TrainingExample(
        input_ids=input_ids, labels=labels, loss_weights=weights, canvas=first, middle_length=len(middles[0]),
        mask_rate=rates[0], context=context, hole=cut[0], spans=tuple(spans),
    )


def next_token_targets(example: TrainingExample) -> list[int]:
    """Dense supervision's labels: each context token, read by the (shifted) output just before it.

    Left out: position 0 (nothing before it) and the first token after each span, whose shifted output is the span's
    last canvas position, which sees that token; span positions keep their masked-diffusion labels only.
    """
    ids, left_out = example.input_ids, {0}
    for start, end in example.spans:
        left_out.update(range(start, end + 1))
    return [IGNORE_INDEX if i in left_out else ids[i] for i in range(len(ids))]


# What a collated batch's padding holds, by key (`collate`, and the twin's `collate_fim`); position ids go on counting
PADDING = {"input_ids": None, "labels": IGNORE_INDEX, "next_token_labels": IGNORE_INDEX, "loss_weights": 0.0,
           "attention_mask": False, "canvas_mask": False, "canvas_segments": 0}


def pad_batch(batch: dict[str, torch.Tensor], length: int, pad_id: int) -> dict[str, torch.Tensor]:
    """A collated batch right-padded to `length` positions, as `collate` pads (nobody attends the padding, no loss
    reads it): every batch of a run the same shape, which a compiled training step needs. Longer batches stay."""
    batch_size, current = batch["input_ids"].shape
    if current >= length:
        return batch
    padded = {}
    for key, tensor in batch.items():
        if key == "position_ids":
            padded[key] = torch.arange(length).expand(batch_size, length).clone()
            continue
        if key not in PADDING:
            raise ValueError(f"cannot pad a batch's {key!r}; known: position_ids, {', '.join(PADDING)}")
        value = pad_id if PADDING[key] is None else PADDING[key]
        tail = torch.full((batch_size, length - current), value, dtype=tensor.dtype)
        padded[key] = torch.cat([tensor, tail], dim=1)
    return padded


def collate(examples: list[TrainingExample], pad_id: int, dense: bool = False) -> dict[str, torch.Tensor]:
    """Right-padded tensors for `DiffillForInfilling.forward`; attention_mask and canvas_mask are False on padding.

    With `dense`, also `next_token_labels` (see `next_token_targets`).
    """
    length = max(len(e.input_ids) for e in examples)
    batch = len(examples)
    input_ids = torch.full((batch, length), pad_id, dtype=torch.long)  # (B, T)
    labels = torch.full((batch, length), IGNORE_INDEX, dtype=torch.long)  # (B, T)
    loss_weights = torch.zeros((batch, length), dtype=torch.float32)  # (B, T)
    attention_mask = torch.zeros((batch, length), dtype=torch.bool)  # (B, T)
    canvas_segments = torch.zeros((batch, length), dtype=torch.long)  # (B, T) 0: context, k: the k-th span
    for row, example in enumerate(examples):
        n = len(example.input_ids)
        input_ids[row, :n] = torch.tensor(example.input_ids)
        labels[row, :n] = torch.tensor(example.labels)
        loss_weights[row, :n] = torch.tensor(example.loss_weights)
        attention_mask[row, :n] = True
        canvas_segments[row, :n] = torch.tensor(example.segments)
    canvas_mask = canvas_segments > 0  # (B, T)
    position_ids = torch.arange(length).expand(batch, length).clone()  # (B, T) serving's positions, see module doc
    if dense:
        next_token_labels = torch.full((batch, length), IGNORE_INDEX, dtype=torch.long)  # (B, T)
        for row, example in enumerate(examples):
            next_token_labels[row, : len(example.input_ids)] = torch.tensor(next_token_targets(example))
        return {**collate(examples, pad_id), "next_token_labels": next_token_labels}
    return {
        "input_ids": input_ids,
        "position_ids": position_ids,
        "canvas_mask": canvas_mask,
        "attention_mask": attention_mask,
        **({"canvas_segments": canvas_segments} if any(len(e.spans) > 1 for e in examples) else {}),
        "labels": labels,
        "loss_weights": loss_weights,
    }
