"""Suggestions kept by context, so that typing what the ghost text shows costs no model call.

An entry is keyed on the text around the cursor: a digest of everything in the windows except the cursor's line up
to the cursor, plus that partial line itself. When the user types characters that match the start of a suggestion,
the new context differs from the stored one only in that partial line; walking back over the characters typed on the
line finds the entry, and the rest of each suggestion that starts with them is the answer (llama.vscode does the
same). The exact context is the walk's first step, so repeated requests hit too. Entries are evicted least recently
used first.
"""

from __future__ import annotations

import hashlib
from collections import OrderedDict
from dataclasses import dataclass

from lsp_server.context import Cursor

MAX_TYPED_AHEAD = 256  # characters typed on the line since the suggestion was made, at most


@dataclass(frozen=True)
class CacheKey:
    """The context of a suggestion: a digest of the windows without the cursor's partial line, and that line."""

    digest: bytes
    line_before: str

    @classmethod
    def of(cls, cursor: Cursor, flavour: str) -> CacheKey:
        """The key of a cursor; `flavour` separates suggestions made under different settings or models."""
        line_start = len(cursor.prefix) - len(cursor.around.line_before)
        hasher = hashlib.blake2b(digest_size=16)
        for part in (flavour, cursor.prefix[:line_start], cursor.suffix):
            hasher.update(part.encode("utf-8", "surrogatepass"))
            hasher.update(b"\x00")
        return cls(hasher.digest(), cursor.around.line_before)


class SuggestionCache:
    """A least-recently-used map from context to suggestions, with typed-ahead lookup."""

    def __init__(self, entries: int = 250) -> None:
        self.entries = entries
        self._items: OrderedDict[CacheKey, tuple[str, ...]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._items)

    def clear(self) -> None:
        """Forget everything (after a change of model or settings)."""
        self._items.clear()

    def store(self, key: CacheKey, texts: list[str]) -> None:
        """Remember the suggestions made for a context."""
        if self.entries <= 0 or not texts:
            return
        self._items[key] = tuple(texts)
        self._items.move_to_end(key)
        while len(self._items) > self.entries:
            self._items.popitem(last=False)

    def lookup(self, key: CacheKey) -> list[str] | None:
        """Suggestions for this context: stored for it, or the rest of those whose start the user has typed since."""
        line = key.line_before
        for typed in range(min(len(line), MAX_TYPED_AHEAD) + 1):
            earlier = CacheKey(key.digest, line[: len(line) - typed])
            texts = self._items.get(earlier)
            if texts is None:
                continue
            rest = typed_ahead(texts, line[len(line) - typed :])
            if rest:
                self._items.move_to_end(earlier)
                return rest
        return None


def typed_ahead(texts: tuple[str, ...] | list[str], typed: str) -> list[str]:
    """The rest of each suggestion that starts with the text `typed` since it was made (none left: not kept)."""
    return [text[len(typed) :] for text in texts if text.startswith(typed) and len(text) > len(typed)]
