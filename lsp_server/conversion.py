"""Conversion between LSP types and the engine's plain strings and offsets, in one place.

LSP positions are a line and a `character` counted in the negotiated position encoding: UTF-16 code units unless
client and server agreed on UTF-8 or UTF-32 during `initialize`. Python strings are indexed by code point, so a
character outside the Basic Multilingual Plane (an emoji) is one `str` index but two UTF-16 units and four UTF-8
bytes. Lines end at `\\n`, `\\r\\n` or `\\r`. Following the specification, a character past the end of its line
means the end of the line; a position inside a surrogate pair (or a UTF-8 sequence) is moved back to the start of
its character; a line past the end of the document has no offset (`None`), and the caller answers with nothing.
"""

from __future__ import annotations

import bisect
import functools
import re
from collections.abc import Sequence
from typing import Any

from lsprotocol import types
from lsprotocol.converters import get_converter

from infill_engine.syntax import SyntaxProblem

SOURCE = "diffill"  # the `source` of diagnostics and the label of model suggestions
_LINE_BREAK = re.compile(r"\r\n|\r|\n")
_CONVERTER = get_converter()


def units(text: str, encoding: str) -> int:
    """Length of `text` in code units of the position encoding."""
    if encoding == types.PositionEncodingKind.Utf32 or text.isascii():
        return len(text)
    if encoding == types.PositionEncodingKind.Utf8:
        return len(text.encode("utf-8", "surrogatepass"))
    return len(text) + sum(1 for ch in text if ord(ch) > 0xFFFF)


def _chars_within(line: str, count: int, encoding: str) -> int:
    """How many characters of `line` fit in `count` code units (never splitting a character)."""
    if encoding == types.PositionEncodingKind.Utf32 or line.isascii():
        return min(count, len(line))
    used = 0
    for index, ch in enumerate(line):
        width = units(ch, encoding)
        if used + width > count:
            return index
        used += width
    return len(line)


class LineIndex:
    """Where every line of a text starts and ends, to turn LSP positions into `str` offsets and back."""

    def __init__(self, text: str) -> None:
        self.text = text
        if "\r" not in text:
            self.starts = [0]
            for line in text.split("\n")[:-1]:
                self.starts.append(self.starts[-1] + len(line) + 1)
        else:
            self.starts = [0] + [match.end() for match in _LINE_BREAK.finditer(text)]

    @property
    def line_count(self) -> int:
        """Number of lines (a text ending with a line break has an empty last line)."""
        return len(self.starts)

    def line_end(self, line: int) -> int:
        """Offset of the end of a line's content, before its line break."""
        if line + 1 >= len(self.starts):
            return len(self.text)
        end = self.starts[line + 1]
        return end - 2 if self.text.startswith("\r\n", end - 2) else end - 1

    def offset_at(self, position: types.Position, encoding: str) -> int | None:
        """The `str` offset of an LSP position, or None when its line is not in the text."""
        if position.line < 0 or position.character < 0 or position.line >= len(self.starts):
            return None
        start = self.starts[position.line]
        line = self.text[start : self.line_end(position.line)]
        return start + _chars_within(line, position.character, encoding)

    def position_at(self, offset: int, encoding: str) -> types.Position:
        """The LSP position of a `str` offset (clamped to the text)."""
        offset = max(0, min(offset, len(self.text)))
        line = bisect.bisect_right(self.starts, offset) - 1
        start = self.starts[line]
        offset = min(offset, max(start, self.line_end(line)))  # inside a \r\n: the end of the line
        return types.Position(line=line, character=units(self.text[start:offset], encoding))

    def range_of(self, start: int, end: int, encoding: str) -> types.Range:
        """The LSP range of `str` offsets [start, end)."""
        return types.Range(start=self.position_at(start, encoding), end=self.position_at(end, encoding))


@functools.lru_cache(maxsize=4)
def line_index(text: str) -> LineIndex:
    """The line index of a text, kept for the last few texts (a document version is asked about many times)."""
    return LineIndex(text)


def offsets_of(text: str, range_: types.Range, encoding: str) -> tuple[int, int] | None:
    """`str` offsets of an LSP range, ordered; None when a line is outside the text."""
    index = line_index(text)
    start, end = index.offset_at(range_.start, encoding), index.offset_at(range_.end, encoding)
    if start is None or end is None:
        return None
    return (start, end) if start <= end else (end, start)


def structure(value: Any, cls: type) -> Any:
    """An lsprotocol object from its JSON form (command arguments, code action data)."""
    return _CONVERTER.structure(value, cls)


def unstructure(value: Any) -> Any:
    """The JSON form of an lsprotocol object."""
    return _CONVERTER.unstructure(value)


# ------------------------------------------------------------------------------------------------- engine -> LSP


def inline_completion_list(texts: Sequence[str], at: types.Position) -> types.InlineCompletionList:
    """Ghost text: one item per suggestion, inserted at the cursor."""
    here = types.Range(start=at, end=at)
    return types.InlineCompletionList(items=[types.InlineCompletionItem(insert_text=t, range=here) for t in texts])


def completion_list(texts: Sequence[str], word: str, word_range: types.Range) -> types.CompletionList:
    """Completion items that replace the word before the cursor by that word plus the fill.

    The label is the first line of the result and the label details say `diffill`, so the user sees where it came
    from. The list is incomplete: the client asks again as the user types (the cache answers those).
    """
    items = []
    for rank, text in enumerate(texts):
        new_text = word + text
        lines = [line.strip() for line in new_text.split("\n") if line.strip()]
        items.append(
            types.CompletionItem(
                label=lines[0] + (" …" if len(lines) > 1 else "") if lines else new_text,
                label_details=types.CompletionItemLabelDetails(description=SOURCE),
                kind=types.CompletionItemKind.Snippet,
                detail=f"{SOURCE}: suggestion from the diffusion model",
                documentation=types.MarkupContent(kind=types.MarkupKind.PlainText, value=new_text),
                filter_text=new_text,
                sort_text=f"{rank:04d}",
                preselect=rank == 0,
                insert_text_format=types.InsertTextFormat.PlainText,
                text_edit=types.TextEdit(range=word_range, new_text=new_text),
            )
        )
    return types.CompletionList(is_incomplete=True, items=items)


def workspace_edit(
    uri: str, version: int | None, range_: types.Range, new_text: str, document_changes: bool
) -> types.WorkspaceEdit:
    """An edit of one range, tied to the document version it was computed for when the client supports that."""
    edit = types.TextEdit(range=range_, new_text=new_text)
    if document_changes:
        document = types.OptionalVersionedTextDocumentIdentifier(uri=uri, version=version)
        return types.WorkspaceEdit(document_changes=[types.TextDocumentEdit(text_document=document, edits=[edit])])
    return types.WorkspaceEdit(changes={uri: [edit]})


def diagnostic(problem: SyntaxProblem, text: str, encoding: str) -> types.Diagnostic:
    """A syntax problem as an LSP error diagnostic; a zero-width problem covers one character where it can."""
    end = problem.end if problem.end > problem.start else min(problem.start + 1, len(text))
    if "\n" in text[problem.start : end] and problem.end <= problem.start:
        end = problem.start
    return types.Diagnostic(
        range=line_index(text).range_of(problem.start, end, encoding),
        message=problem.message,
        severity=types.DiagnosticSeverity.Error,
        source=SOURCE,
        code=problem.kind,
    )
