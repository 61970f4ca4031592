"""Fuzzing LSP positions and the cursor's windows: random Unicode (astral characters, combining marks), every kind of
line break, positions anywhere, in every position encoding.

Properties: nothing raises; a position and its offset round-trip; every offset agrees with an independent reading
of the specification; an edit built for a range applies to exactly those characters of that text; the cursor's
windows are slices of the document cut at line starts; other documents' chunks become comments only.
"""

from __future__ import annotations

import re
from types import SimpleNamespace

from hypothesis import example, given, strategies as st
from lsprotocol import types

from infill_engine.problems import SyntaxProblem
from infill_engine.syntax import find_problems
from lsp_server import conversion
from lsp_server.context import Chunk, as_comments, cursor_at, indent_unit
from lsp_server.conversion import LineIndex
from tests.fuzzing import editor_text, examples

ENCODINGS = st.sampled_from(["utf-8", "utf-16", "utf-32"])
_LINES = re.compile(r"[^\r\n]*(?:\r\n|\r|\n|$)")


def reference_lines(text: str) -> list[tuple[int, str]]:
    """(start offset, content without the break) of every line, read straight from the specification."""
    lines, start = [], 0
    for match in _LINES.finditer(text):
        if match.start() != start or (match.start() == len(text) and lines and lines[-1][0] == start):
            continue
        content = match.group().rstrip("\r\n")
        lines.append((start, content))
        start = match.end()
        if match.group() == content:  # the last line, without a break
            break
    return lines


def width(text: str, encoding: str) -> int:
    """Code units of text, counted by encoding it (a lone surrogate is one UTF-16 unit, three UTF-8 bytes)."""
    if encoding == "utf-8":
        return len(text.encode("utf-8", "surrogatepass"))
    if encoding == "utf-16":
        return len(text.encode("utf-16-le", "surrogatepass")) // 2
    return len(text)


def reference_offset(text: str, line: int, character: int, encoding: str) -> int | None:
    """The offset of an LSP position: past the line end is the line end, inside a character is its start."""
    lines = reference_lines(text)
    if line >= len(lines):
        return None
    start, content = lines[line]
    taken = 0
    while taken < len(content) and width(content[: taken + 1], encoding) <= character:
        taken += 1
    return start + taken


def mid_crlf(text: str, offset: int) -> bool:
    """Whether the offset falls between the \\r and the \\n of one line break (no position names it)."""
    return 0 < offset < len(text) and text[offset - 1] == "\r" and text[offset] == "\n"


@examples(200)
@given(text=editor_text, line=st.integers(-2, 50), character=st.integers(-2, 120), encoding=ENCODINGS)
@example(text="a😀b\r\n\rx", line=0, character=2, encoding="utf-16")
@example(text="\r\n", line=1, character=0, encoding="utf-8")
def test_every_position_maps_to_the_offset_the_specification_gives(text, line, character, encoding):
    offset = LineIndex(text).offset_at(types.Position(line=max(line, 0), character=max(character, 0)), encoding)
    expected = reference_offset(text, max(line, 0), max(character, 0), encoding)
    assert offset == expected
    if line < 0 or character < 0:  # lsprotocol refuses negative positions; the index answers None, never raises
        bad = SimpleNamespace(line=line, character=character)
        assert LineIndex(text).offset_at(bad, encoding) is None  # type: ignore[arg-type]


@examples(200)
@given(text=editor_text, data=st.data(), encoding=ENCODINGS)
def test_offsets_round_trip_through_positions(text, data, encoding):
    index = LineIndex(text)
    offset = data.draw(st.integers(0, len(text)))
    position = index.position_at(offset, encoding)
    back = index.offset_at(position, encoding)
    if mid_crlf(text, offset):
        assert back == offset - 1  # inside a \r\n: the end of its line
    else:
        assert back == offset
    assert index.position_at(back, encoding) == position


@examples(200)
@given(text=editor_text, data=st.data(), encoding=ENCODINGS, new_text=editor_text)
@example(text="x\r\ny", data=None, encoding="utf-16", new_text="😀")
def test_an_edit_built_for_a_range_replaces_exactly_that_range(text, data, encoding, new_text):
    if data is None:
        start, end = 1, 3
    else:
        start = data.draw(st.integers(0, len(text)))
        end = data.draw(st.integers(start, len(text)))
    if mid_crlf(text, start) or mid_crlf(text, end):
        start, end = start - mid_crlf(text, start), end - mid_crlf(text, end)
    range_ = conversion.line_index(text).range_of(start, end, encoding)
    # the client applies the edit with its own reading of the positions
    begin = reference_offset(text, range_.start.line, range_.start.character, encoding)
    finish = reference_offset(text, range_.end.line, range_.end.character, encoding)
    assert (begin, finish) == (start, end)
    assert conversion.offsets_of(text, range_, encoding) == (start, end)
    edit = conversion.workspace_edit("file:///x", 3, range_, new_text, document_changes=True)
    (change,) = edit.document_changes
    assert change.text_document.version == 3 and change.edits[0].new_text == new_text


@examples(100)
@given(text=editor_text, data=st.data(), encoding=ENCODINGS)
def test_a_diagnostic_covers_its_problem_inside_the_text(text, data, encoding):
    start = data.draw(st.integers(0, len(text)))
    end = data.draw(st.integers(start, len(text)))
    diagnostic = conversion.diagnostic(SyntaxProblem(start, end, "error", "unexpected"), text, encoding)
    first, last = conversion.offsets_of(text, diagnostic.range, encoding)
    assert first <= start + mid_crlf(text, start) and 0 <= first <= last <= len(text)
    assert last >= end - mid_crlf(text, end)


@examples(200)
@given(text=editor_text, data=st.data(), window=st.integers(1, 64))
@example(text="ab\ncd\r\nef", data=None, window=2)
def test_the_cursor_windows_are_slices_of_the_document_cut_at_line_starts(text, data, window):
    offset = 5 if data is None else data.draw(st.integers(0, len(text)))
    cursor = cursor_at(text, offset, window)
    start = cursor.window_start
    assert text[start:offset] == cursor.prefix
    assert text[offset : offset + len(cursor.suffix)] == cursor.suffix
    assert len(cursor.suffix) <= window and len(cursor.prefix) <= 2 * window
    assert start == 0 or text[start - 1] == "\n" or start == offset - window
    around = cursor.around
    assert "\n" not in around.line_before and "\n" not in around.line_after
    assert cursor.prefix.endswith(around.line_before)
    assert around.newline in ("\n", "\r\n") and around.indent in ("\t", *(" " * n for n in range(2, 9)))


@examples(100)
@given(text=editor_text)
def test_the_indent_unit_is_a_tab_or_two_to_eight_spaces(text):
    assert indent_unit(text) in ("\t", *(" " * n for n in range(2, 9)))


# One valid statement per language with line comments: what follows other documents' chunks in a prefix.
CODE_AFTER = {
    "python": "x = 1\n", "lua": "x = 1\n", "javascript": "let x = 1;\n", "typescript": "let x = 1;\n",
    "tsx": "let x = 1;\n", "go": "package main\n", "rust": "fn main() {}\n", "c": "int x;\n", "cpp": "int x;\n",
    "java": "class A {}\n",
}


@examples(150)
@given(bodies=st.lists(editor_text, min_size=1, max_size=3), language=st.sampled_from(sorted(CODE_AFTER)),
       newline=st.sampled_from(["\n", "\r\n"]), name=editor_text)
@example(bodies=["a\rb = ("], language="javascript", newline="\n", name="o.js")  # a lone \r ended the comment
@example(bodies=["a\u2028b = ("], language="javascript", newline="\n", name="o.js")  # so did U+2028 in JavaScript
@example(bodies=["\x00"], language="c", newline="\n", name="o.c")  # a NUL is an ERROR node, even in a comment
@example(bodies=["x"], language="python", newline="\n", name="a\nb = (")  # a line break in the file's name
def test_other_documents_chunks_become_comments_only(bodies, language, newline, name):
    chunks = [Chunk(f"file:///w/{name}{i}", body, 0.5) for i, body in enumerate(bodies)]
    comments = as_comments(chunks, language, newline)
    code = CODE_AFTER[language]
    assert find_problems(code, language) == []
    # whatever the chunks hold, they leave no syntax problem in front of the code
    assert find_problems(comments + code, language) == []
