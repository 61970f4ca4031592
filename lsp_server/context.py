"""What the model sees around the cursor: windows of the document, and similar chunks of other open documents.

The engine trims prefix and suffix to its token budget itself; this module only cuts a large document down to a
window of whole lines first (so a 5 MB file costs what a small one does, in tokenizing and in the syntax gate) and
decides whether the fill may span lines.

Extra context follows llama.vscode's idea: chunks of other open documents whose identifiers overlap most with the
cursor's surroundings (Jaccard similarity), most similar last, placed before the prefix as line comments of the
document's language. Comments keep the syntax gate's verdict about the real code unchanged, and since the engine
keeps the end of the prefix when it must cut, the chunks are the first thing dropped when the model has no room.
"""

from __future__ import annotations

import re
from collections import Counter
from collections.abc import Iterable
from dataclasses import dataclass

from infill_engine.syntax import language_for
from lsp_server.postprocess import Surroundings

WINDOW_CHARS = 64 * 1024  # each side of the cursor; far more than any token budget covers
_IDENTIFIER = re.compile(r"[A-Za-z_][A-Za-z0-9_]{2,}")
# The line-comment marker of each language (JSON has none): for other documents' chunks and rewrite instructions.
LINE_COMMENTS = {
    "python": "#", "lua": "--", "javascript": "//", "typescript": "//", "tsx": "//", "go": "//", "rust": "//",
    "c": "//", "cpp": "//", "java": "//",
}
SCAN_CHARS = 256 * 1024  # of each other document, at most
_CONTROL = re.compile(r"[\x00-\x08\x0e-\x1f\x7f]")  # C0 controls other than tab and line breaks, and DEL


@dataclass(frozen=True)
class Cursor:
    """The cursor in a document: the text windows around it and how a fill must look there."""

    offset: int  # in the document
    window_start: int  # document offset where `prefix` starts
    prefix: str  # whole lines before the cursor's line, and the cursor's line up to it
    suffix: str  # the cursor's line after it, and whole lines after
    around: Surroundings


def cursor_at(text: str, offset: int, window: int = WINDOW_CHARS) -> Cursor:
    """The cursor at `offset` of `text`, with windows of at most `window` characters cut at line boundaries."""
    # The prefix window is measured from the start of the cursor's line, so that typing on the line keeps it (and
    # the cache key) the same; a line longer than the window is cut at the window.
    line_start = text.rfind("\n", 0, offset) + 1
    start = max(0, line_start - window) if offset - line_start <= window else offset - window
    if 0 < start < line_start:
        start = text.find("\n", start, line_start) + 1
    end = min(len(text), offset + window)
    if end < len(text):
        newline = text.rfind("\n", offset, end)
        end = newline + 1 if newline != -1 else end
    prefix, suffix = text[start:offset], text[offset:end]
    line_start = prefix.rfind("\n") + 1
    line_before = prefix[line_start:]
    line_after, _, following = suffix.partition("\n")
    around = Surroundings(
        line_before=line_before,
        line_after=line_after.rstrip("\r"),
        next_lines=tuple(line.rstrip("\r") for line in following.split("\n")[:8]),
        multiline=line_after.strip() == "",
        indent=indent_unit(prefix[-16384:] + suffix[:4096]),
        newline="\r\n" if "\r\n" in text[max(0, offset - 4096) : offset + 4096] else "\n",
    )
    return Cursor(offset, start, prefix, suffix, around)


def typed_at(before: str, offset: int, now: str, limit: int) -> str | None:
    """The text typed at `offset` that turns the document `before` into `now`: at most `limit` characters, with no
    line break, nothing else changed; None when `now` is not such a continuation of `before`."""
    grown = len(now) - len(before)
    if not 0 <= grown <= limit or offset > len(before):
        return None
    typed = now[offset : offset + grown]
    if "\n" in typed or "\r" in typed:
        return None
    if not (now.startswith(before[:offset]) and now.endswith(before[offset:])):
        return None
    return typed


def indent_unit(text: str) -> str:
    """The document's indentation step: a tab, or the most common difference between indented lines' spaces."""
    tabs = spaces = 0
    steps: Counter[int] = Counter()
    previous = 0
    for line in text.split("\n"):
        if not line.strip():
            continue
        leading = len(line) - len(line.lstrip(" "))
        tabs += line.startswith("\t")
        spaces += leading > 0
        if leading != previous:
            steps[abs(leading - previous)] += 1
        previous = leading
    if tabs > spaces:
        return "\t"
    usable = [step for step, _ in steps.most_common() if 2 <= step <= 8]
    return " " * (usable[0] if usable else 4)


@dataclass(frozen=True)
class Chunk:
    """A few lines of another open document and how similar they are to the cursor's surroundings."""

    uri: str
    text: str
    score: float


def _identifiers(text: str) -> set[str]:
    return set(_IDENTIFIER.findall(text))


def similar_chunks(
    others: Iterable[tuple[str, str]], cursor: Cursor, chunk_lines: int, limit: int
) -> list[Chunk]:
    """The `limit` chunks of other documents, (uri, text) pairs, most similar to the text around the cursor."""
    if limit <= 0:
        return []
    near = "\n".join(cursor.prefix.split("\n")[-40:]) + cursor.suffix[:2000]
    wanted = _identifiers(near)
    if not wanted:
        return []
    chunks = []
    for uri, text in others:
        lines = text[:SCAN_CHARS].split("\n")
        for first in range(0, len(lines), chunk_lines):
            body = "\n".join(lines[first : first + chunk_lines]).strip("\n")
            found = _identifiers(body)
            if found:
                score = len(found & wanted) / len(found | wanted)
                if score > 0:
                    chunks.append(Chunk(uri, body, score))
    chunks.sort(key=lambda c: c.score, reverse=True)
    return chunks[:limit]


def line_comment(language: str | None) -> str | None:
    """The line-comment marker of a canonical language; None for plain text and languages without comments."""
    return LINE_COMMENTS.get(language or "")


def as_comments(chunks: list[Chunk], language: str | None, newline: str = "\n") -> str:
    """Chunks as line comments of the language, the most similar nearest the code; empty without a comment syntax."""
    marker = line_comment(language)
    if marker is None or not chunks:
        return ""
    lines: list[str] = []
    for chunk in reversed(chunks):
        # Every line break some language knows ends a comment (a lone \r, U+2028 in JavaScript), and tree-sitter
        # takes control characters for errors even in a comment: either would put code or errors before the cursor.
        name = " ".join(_CONTROL.sub(" ", chunk.uri.rsplit("/", 1)[-1]).splitlines())
        lines.append(f"{marker} from {name}:")
        # a trailing backslash would continue a C comment onto the next line: drop it
        text = _CONTROL.sub(" ", chunk.text)
        lines += [f"{marker} {line}".rstrip().rstrip("\\").rstrip() for line in text.splitlines() or [""]]
    return newline.join(lines) + newline


@dataclass(frozen=True)
class Snapshot:
    """A document as it was when a request arrived: what the model works on and the version its answer is for."""

    uri: str
    version: int | None
    text: str
    language_id: str

    @property
    def language(self) -> str | None:
        """The canonical language for the syntax gate, from the languageId, else from the file name; None if unknown."""
        return language_for(self.language_id) or language_for(self.uri.rsplit("/", 1)[-1])
