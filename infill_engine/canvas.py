"""The canvas: prefix tokens, a span of N noisy positions, suffix tokens.

Serving and training build canvases with the same functions (`trim_context`, `layout_canvas`), so the model is
trained on exactly the layout it is asked to fill.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

# A long document is cut down to a window before it is tokenized, so that a 5 MB file costs no more than a small one.
# The window starts at this many characters per wanted token (code averages about 3.3) and grows 4x at a time while
# it holds fewer tokens than wanted, up to MAX_CHARS_PER_TOKEN (a token rarely covers more characters than that).
WINDOW_CHARS_PER_TOKEN = 8
MAX_CHARS_PER_TOKEN = 32
WINDOW_MARGIN_TOKENS = 16  # tokens beyond the budget, so the cut is far from the window's ragged edge


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


def _tail_window(tokenizer: Any, text: str, budget: int) -> tuple[str, list[int], list[tuple[int, int]]]:
    """The end of `text` from a line start, tokenized: a margin more than `budget` tokens unless the text (or the widest
    window) has fewer. Tokens far from a window's start do not depend on where it starts, so any such window cuts the
    same as the whole text would."""
    chars = budget * WINDOW_CHARS_PER_TOKEN
    while True:
        window_start = max(0, len(text) - chars)
        if window_start > 0:
            newline = text.find("\n", window_start)
            window_start = newline + 1 if newline != -1 else window_start
        window = text[window_start:]
        ids, offsets = _encode(tokenizer, window)
        if len(ids) > budget + WINDOW_MARGIN_TOKENS or window_start == 0 or chars >= budget * MAX_CHARS_PER_TOKEN:
            return window, ids, offsets
        chars = min(chars * 4, budget * MAX_CHARS_PER_TOKEN)


def _head_window(tokenizer: Any, text: str, budget: int) -> tuple[str, list[int], list[tuple[int, int]]]:
    """The start of `text`, tokenized: a margin more than `budget` tokens unless the text (or the widest window) has
    fewer."""
    chars = budget * WINDOW_CHARS_PER_TOKEN
    while True:
        window = text[: min(len(text), chars)]
        ids, offsets = _encode(tokenizer, window)
        if len(ids) > budget + WINDOW_MARGIN_TOKENS or len(window) == len(text) or chars >= budget * MAX_CHARS_PER_TOKEN:
            return window, ids, offsets
        chars = min(chars * 4, budget * MAX_CHARS_PER_TOKEN)


def _keep_tail(tokenizer: Any, text: str, budget: int) -> tuple[list[int], int]:
    """The last whole lines of `text` that fit in `budget` tokens (the last line may be partial: it is the cursor's)."""
    if budget == 0 or not text:
        return [], 0
    window, ids, offsets = _tail_window(tokenizer, text, budget)
    if len(ids) <= budget:
        return ids, len(window)
    first = len(ids) - budget  # the first token we could keep
    # a byte-level tokenizer can split one character over several tokens: never keep part of one
    cut_char = max(offsets[first][0], offsets[first - 1][1])
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
    window, ids, offsets = _head_window(tokenizer, text, budget)
    if len(ids) <= budget and len(window) == len(text):
        return ids, len(window)
    last_end = offsets[min(budget, len(ids)) - 1][1]  # end of the last token we could keep
    if budget < len(ids):  # a character split over the last kept and the first dropped token is not kept
        last_end = min(last_end, offsets[budget][0])
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
