"""LSP positions <-> str offsets in every position encoding, and engine results -> LSP types."""

from __future__ import annotations

import pytest
from lsprotocol import types

from infill_engine.syntax import SyntaxProblem
from lsp_server import conversion
from lsp_server.conversion import LineIndex

UTF8, UTF16, UTF32 = "utf-8", "utf-16", "utf-32"
TEXT = "a😀b\nxé\n"  # the emoji is 1 str index, 2 UTF-16 units, 4 UTF-8 bytes; é is 2 UTF-8 bytes


def at(line: int, character: int) -> types.Position:
    return types.Position(line=line, character=character)


@pytest.mark.parametrize(("encoding", "character", "offset"), [
    (UTF16, 0, 0), (UTF16, 1, 1), (UTF16, 2, 1), (UTF16, 3, 2), (UTF16, 4, 3),  # 2: inside the pair -> its start
    (UTF8, 1, 1), (UTF8, 3, 1), (UTF8, 5, 2), (UTF8, 6, 3),
    (UTF32, 1, 1), (UTF32, 2, 2), (UTF32, 3, 3),
])
def test_offsets_count_code_units_and_never_split_a_character(encoding, character, offset):
    assert LineIndex(TEXT).offset_at(at(0, character), encoding) == offset


@pytest.mark.parametrize("encoding", [UTF8, UTF16, UTF32])
def test_positions_round_trip(encoding):
    index = LineIndex(TEXT)
    for offset in range(len(TEXT) + 1):
        assert index.offset_at(index.position_at(offset, encoding), encoding) == offset


def test_utf16_and_utf8_positions_after_non_ascii_text():
    index = LineIndex(TEXT)
    assert index.position_at(2, UTF16) == at(0, 3)
    assert index.position_at(2, UTF8) == at(0, 5)
    assert index.position_at(6, UTF8) == at(1, 3)  # after "xé": 1 + 2 bytes


def test_a_character_past_the_line_end_means_the_line_end_and_a_line_past_the_end_means_nothing():
    index = LineIndex("ab\r\ncd")
    assert index.offset_at(at(0, 99), UTF16) == 2  # before the \r\n
    assert index.offset_at(at(1, 99), UTF16) == 6
    assert index.offset_at(at(2, 0), UTF16) is None


def test_every_lsp_line_break_counts():
    index = LineIndex("a\rb\r\nc\nd")
    assert index.line_count == 4
    assert [index.offset_at(at(line, 0), UTF16) for line in range(4)] == [0, 2, 5, 7]
    assert index.position_at(3, UTF16) == at(1, 1)
    assert index.position_at(4, UTF16) == at(1, 1)  # between \r and \n: still the end of line 1


def test_a_text_ending_with_a_line_break_has_an_empty_last_line():
    index = LineIndex("x = 1\n")
    assert index.offset_at(at(1, 0), UTF16) == 6
    assert index.offset_at(at(2, 0), UTF16) is None


def test_ranges_are_ordered():
    assert conversion.offsets_of(TEXT, types.Range(start=at(1, 1), end=at(0, 0)), UTF16) == (0, 5)


def test_completion_items_replace_the_typed_word_and_say_where_they_come_from():
    word_range = types.Range(start=at(3, 4), end=at(3, 7))
    items = conversion.completion_list(["urn x", "urn y\n    z"], "ret", word_range).items
    assert [item.label for item in items] == ["return x", "return y …"]
    assert all(item.label_details.description == "diffill" for item in items)
    assert items[1].text_edit == types.TextEdit(range=word_range, new_text="return y\n    z")
    assert items[0].preselect and not items[1].preselect


def test_inline_items_insert_at_the_cursor():
    result = conversion.inline_completion_list(["x"], at(2, 5))
    assert result.items[0].range == types.Range(start=at(2, 5), end=at(2, 5))


def test_workspace_edits_name_the_version_when_the_client_supports_it():
    edit = conversion.workspace_edit("file:///a.py", 4, types.Range(start=at(0, 0), end=at(0, 1)), "y", True)
    assert edit.document_changes[0].text_document.version == 4
    plain = conversion.workspace_edit("file:///a.py", 4, types.Range(start=at(0, 0), end=at(0, 1)), "y", False)
    assert plain.changes == {"file:///a.py": [types.TextEdit(range=types.Range(start=at(0, 0), end=at(0, 1)),
                                                            new_text="y")]}


def test_diagnostics_are_errors_in_client_units():
    problem = SyntaxProblem(3, 4, "bracket", "unclosed '('")
    diagnostic = conversion.diagnostic(problem, "😀 = (1\n", UTF16)
    assert diagnostic.range == types.Range(start=at(0, 4), end=at(0, 5))
    assert diagnostic.severity == types.DiagnosticSeverity.Error and diagnostic.source == "diffill"
