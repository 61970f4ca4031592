"""What the syntax gate costs in a large file while the user types (`diffill bench gate`).

A large Python document (the standard library's modules, concatenated) is typed into one character at a time at a
line inside a function in its middle; each keystroke makes a new version of the document, and each version is gated
with the candidates a request would bring (the rest of the line, which passes, and, from the second candidate on,
the rest of the line with its closing bracket missing, which fails). Ways of gating are compared in one run,
keystroke by keystroke, each with its own cache of parsed originals:

- `fresh`: every version parsed from scratch, every candidate reparsed over the whole document (the gate before
  versions were derived from each other and windows were used);
- `whole`: each version derived incrementally from the one before, every candidate reparsed over the whole
  document (`check_fill(window=False)`);
- `window`: versions derived, candidates parsed in a window of top-level nodes around the hole (the default).

Benchmarks measure; tests assert.
"""

from __future__ import annotations

import statistics
import sysconfig
import time
from collections import OrderedDict
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from infill_engine import syntax

MODES = ("fresh", "whole", "window")
TYPED_LINE = 'value = compute(items[index], key="name", default=None)'


def large_python_document(characters: int) -> str:
    """At least `characters` characters of real Python: the standard library's modules, whole, in path order.

    Tests and installed packages are left out (some tests hold invalid Python on purpose).
    """
    parts: list[str] = []
    size = 0
    for path in _stdlib_modules(Path(sysconfig.get_paths()["stdlib"])):
        text = path.read_text(encoding="utf-8", errors="replace")
        parts.append(text)
        size += len(text) + 1
        if size >= characters:
            return "\n".join(parts)
    raise ValueError(f"the standard library holds fewer than {characters} characters of Python modules")


def _stdlib_modules(directory: Path) -> Iterator[Path]:
    """The .py files under directory in path order, without tests and installed packages (not even walked)."""
    entries = sorted(directory.iterdir())
    for entry in entries:
        if entry.is_file() and entry.suffix == ".py":
            yield entry
    for entry in entries:
        if entry.is_dir() and "test" not in entry.name and entry.name not in ("site-packages", "lib2to3"):
            yield from _stdlib_modules(entry)


def _hole(document: str) -> int:
    """The start of an indented line inside a function near the middle of the document, after its indentation."""
    line = document.index("\n        return ", len(document) // 2)
    return line + len("\n        ")


def _percentile(values: list[float], share: float) -> float:
    """The value below which `share` of values lie (nearest rank)."""
    ordered = sorted(values)
    return ordered[min(len(ordered) - 1, max(0, round(share * len(ordered)) - 1))]


def bench_gate(megabytes: float, keys: int, candidates: int, modes: tuple[str, ...] = MODES) -> dict[str, Any]:
    """Per mode: ms to gate each keystroke's first candidate (the new version's parse included) and each further one."""
    unknown = sorted(set(modes) - set(MODES))
    if unknown or not modes:
        raise ValueError(f"unknown gate mode(s) {unknown} (allowed: {', '.join(MODES)})")
    if keys < 1 or candidates < 1:
        raise ValueError(f"keys and candidates must be at least 1 (got {keys} and {candidates})")
    document = large_python_document(int(megabytes * 1_000_000))
    hole = _hole(document)
    caches: dict[str, OrderedDict] = {mode: OrderedDict() for mode in modes}
    first: dict[str, list[float]] = {mode: [] for mode in modes}
    further: dict[str, list[float]] = {mode: [] for mode in modes}
    verdicts: dict[str, list[bool]] = {mode: [] for mode in modes}
    for key in range(keys + 1):  # version 0 (nothing typed yet) warms each mode's cache and is not counted
        lines, column = divmod(key, len(TYPED_LINE))  # the line is typed again, below, once it is complete
        typed = (TYPED_LINE + "\n        ") * lines + TYPED_LINE[:column]
        version = document[:hole] + typed + "\n        " + document[hole:]
        at = hole + len(typed)
        rest = TYPED_LINE[column:]
        fills = [rest] + [rest.rstrip(")") + " (" for _ in range(candidates - 1)]
        for mode in modes:
            previous = syntax.swap_cache(caches[mode] if mode != "fresh" else None)
            try:
                for index, fill in enumerate(fills):
                    started = time.perf_counter()
                    result = syntax.check_fill(version, at, at, fill, "python", window=mode == "window")
                    elapsed = (time.perf_counter() - started) * 1000
                    if key:
                        (first if index == 0 else further)[mode].append(elapsed)
                        verdicts[mode].append(result.ok)
            finally:
                caches[mode] = syntax.swap_cache(previous)
    rows = []
    for mode in modes:
        row: dict[str, Any] = {
            "mode": mode,
            "first_ms_median": round(statistics.median(first[mode]), 1),
            "first_ms_p95": round(_percentile(first[mode], 0.95), 1),
        }
        if further[mode]:
            row["further_ms_median"] = round(statistics.median(further[mode]), 1)
            row["further_ms_p95"] = round(_percentile(further[mode], 0.95), 1)
        row["passed"] = sum(verdicts[mode])
        rows.append(row)
    return {
        "characters": len(document), "bytes": len(document.encode("utf-8", errors="replace")), "keys": keys,
        "candidates": candidates, "same_verdicts": len({tuple(v) for v in verdicts.values()}) == 1, "rows": rows,
    }
