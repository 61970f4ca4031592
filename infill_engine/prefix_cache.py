"""The encoded heads of recent prefixes, so that the next request encodes only what changed since.

Typing changes a document at the cursor: the next request's prefix starts with the tokens of the last one, up to
the last token or two. In a model whose context is read causally (each context position attends only to the
positions before it), the keys and values at a prefix position depend on the tokens up to it and on nothing after,
so the head that two prefixes share is encoded once and the next request computes only its new tail and its suffix.
The store is model-agnostic: it keeps, per recent prefix, whatever value the adapter encoded it into.
"""

from __future__ import annotations

import threading
from collections import OrderedDict
from collections.abc import Sequence
from typing import Generic, TypeVar

Value = TypeVar("Value")

DEFAULT_ENTRIES = 4  # recent prefixes kept: the request before, a repair's, and a prefetched one or two


def shared_head(a: Sequence[int], b: Sequence[int]) -> int:
    """How many leading tokens `a` and `b` have in common."""
    count = 0
    for x, y in zip(a, b):
        if x != y:
            break
        count += 1
    return count


class PrefixCache(Generic[Value]):
    """A small least-recently-used store of encoded prefixes, looked up by the longest shared head; thread-safe."""

    def __init__(self, entries: int = DEFAULT_ENTRIES) -> None:
        if entries < 1:
            raise ValueError(f"a prefix cache keeps at least one entry (got {entries})")
        self.entries = entries
        self._store: OrderedDict[tuple[int, ...], Value] = OrderedDict()
        self._lock = threading.Lock()

    def longest(self, ids: Sequence[int]) -> tuple[int, Value | None]:
        """The stored value whose prefix shares the longest head with `ids`, and that length; (0, None) if none."""
        with self._lock:
            best, best_key = 0, None
            for key in self._store:
                shared = shared_head(key, ids)
                if shared > best:
                    best, best_key = shared, key
            if best_key is None:
                return 0, None
            self._store.move_to_end(best_key)
            return best, self._store[best_key]

    def add(self, ids: Sequence[int], value: Value) -> None:
        """Keep `value` as the encoding of the prefix `ids`; the least recently used entry goes when full."""
        if not ids:
            return
        with self._lock:
            self._store[tuple(ids)] = value
            self._store.move_to_end(tuple(ids))
            while len(self._store) > self.entries:
                self._store.popitem(last=False)

    def clear(self) -> None:
        """Forget every entry."""
        with self._lock:
            self._store.clear()

    def __len__(self) -> int:
        with self._lock:
            return len(self._store)
