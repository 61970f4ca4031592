"""The canvas: prefix tokens, a span of N noisy positions, suffix tokens.

Serving and training build canvases with the same functions (`trim_context`, `layout_canvas`), so the model is
trained on exactly the layout it is asked to fill.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

# A token covers at least one character, and in code rarely more than this many; used to cut a long document down
# to a window before tokenizing it, so that a 5 MB file costs no more than a small one.
MAX_CHARS_PER_TOKEN = 32


@dataclass(frozen=True)
class ContextConfig:
    """How much text around the cursor the model sees."""

    prefix_tokens: int = 1024  # budget for text before the hole, cut at a line boundary
    suffix_tokens: int = 256  # budget for text after the hole, cut at a line boundary

    def __post_init__(self) -> None:
        for name in ("prefix_tokens", "suffix_tokens"):
            value = getattr(self, name)
            if not isinstance(value, int) or value < 0:
                raise ValueError(f"{name} must be an integer >= 0 (got {value!r})")


@dataclass(frozen=True)
class TrimmedContext:
    """Prefix and suffix token ids, cut to the budget, and how much text each kept."""

    prefix_ids: list[int]
    suffix_ids: list[int]
    prefix_chars: int  # characters of the original prefix that the ids cover (the tail of the prefix)
    suffix_chars: int  # characters of the original suffix that the ids cover (the head of the suffix)


@dataclass(frozen=True)
class Canvas:
    """Where the span sits between prefix and suffix, in token positions."""

    prefix_ids: list[int]
    span_length: int
    suffix_ids: list[int]

    @property
    def span_start(self) -> int:
        """Position of the first span token."""
        return len(self.prefix_ids)

    @property
    def suffix_start(self) -> int:
        """Position of the first suffix token."""
        return len(self.prefix_ids) + self.span_length

    @property
    def length(self) -> int:
        """Total positions: prefix, span and suffix."""
        return self.suffix_start + len(self.suffix_ids)


def _encode(tokenizer: Any, text: str) -> tuple[list[int], list[tuple[int, int]]]:
    """Token ids and character offsets of `text`, without special tokens."""
    encoded = tokenizer(text, add_special_tokens=False, return_offsets_mapping=True)
    return list(encoded["input_ids"]), [tuple(o) for o in encoded["offset_mapping"]]


def _keep_tail(tokenizer: Any, text: str, budget: int) -> tuple[list[int], int]:
    """The last whole lines of `text` that fit in `budget` tokens (the last line may be partial: it is the cursor's)."""
    if budget == 0 or not text:
        return [], 0
    window_start = max(0, len(text) - budget * MAX_CHARS_PER_TOKEN)
    if window_start > 0:
        newline = text.find("\n", window_start)
        window_start = newline + 1 if newline != -1 else window_start
    window = text[window_start:]
    ids, offsets = _encode(tokenizer, window)
    if len(ids) <= budget:
        return ids, len(window)
    cut_char = offsets[len(ids) - budget][0]  # start of the first token we could keep
    at_line_start = cut_char == 0 or window[cut_char - 1] == "\n"
    next_line = window.find("\n", cut_char) + 1
    if at_line_start:
        kept = window[cut_char:]
    elif 0 < next_line < len(window):
        kept = window[next_line:]
    else:  # the cursor's own line is longer than the budget: keep its tail
        kept = window[cut_char:]
    kept_ids, _ = _encode(tokenizer, kept)
    return kept_ids[-budget:], len(kept)


def _keep_head(tokenizer: Any, text: str, budget: int) -> tuple[list[int], int]:
    """The first whole lines of `text` that fit in `budget` tokens (the first line may be partial)."""
    if budget == 0 or not text:
        return [], 0
    window_end = min(len(text), budget * MAX_CHARS_PER_TOKEN)
    window = text[:window_end]
    ids, offsets = _encode(tokenizer, window)
    if len(ids) <= budget and window_end == len(text):
        return ids, len(window)
    last_end = offsets[min(budget, len(ids)) - 1][1]  # end of the last token we could keep
    line_end = window.rfind("\n", 0, last_end)
    kept = window[: line_end + 1] if line_end > 0 else window[:last_end]
    kept_ids, _ = _encode(tokenizer, kept)
    return kept_ids[:budget], len(kept)


def trim_context(tokenizer: Any, prefix: str, suffix: str, config: ContextConfig) -> TrimmedContext:
    """Tokenize the text around a hole, keeping whole lines within each side's token budget."""
    prefix_ids, prefix_chars = _keep_tail(tokenizer, prefix, config.prefix_tokens)
    suffix_ids, suffix_chars = _keep_head(tokenizer, suffix, config.suffix_tokens)
    return TrimmedContext(prefix_ids, suffix_ids, prefix_chars, suffix_chars)


def layout_canvas(prefix_ids: list[int], span_length: int, suffix_ids: list[int]) -> Canvas:
    """Place a span of `span_length` positions between prefix and suffix ids."""
    if span_length < 1:
        raise ValueError(f"span length must be at least 1 position (got {span_length})")
    return Canvas(list(prefix_ids), span_length, list(suffix_ids))
