"""Tidying fills for the cursor they go to, and choosing the first tidy variant that passes the gate."""

from __future__ import annotations

from lsp_server.completion import gated_variants
from lsp_server.context import cursor_at
from lsp_server.postprocess import variants


def around(document: str, marker: str = "|"):
    offset = document.index(marker)
    return cursor_at(document.replace(marker, "", 1), offset)


def test_mid_line_fills_are_cut_at_the_first_line_break():
    assert variants("values)\nprint(total)", around("total = sum(|)\n").around)[0] == "values"


def test_the_closing_text_after_the_cursor_is_not_repeated():
    assert variants("x):", around("if check(|):\n").around) == ["x", "x):"]


def test_a_bracket_that_belongs_to_the_fill_survives_the_gate():
    cursor = around("print(|)\n")
    assert variants("foo()", cursor.around) == ["foo(", "foo()"]
    assert gated_variants(["foo()"], cursor, "python") == ["foo()"]  # "foo(" would unbalance the line


def test_a_repeated_closing_line_is_dropped():
    cursor = around("def f(x):\n    if x:\n|\n    return x\n")
    assert variants("        x += 1\n    return x", cursor.around)[0] == "        x += 1"


def test_at_the_indentation_the_first_line_is_not_indented_again():
    cursor = around("def f(x):\n    |\n")
    assert variants("    return x", cursor.around)[0] == "return x"


def test_lines_written_from_column_zero_are_moved_into_the_block():
    cursor = around("def f(x):\n    |\n")
    assert variants("y = x\nreturn y", cursor.around)[0] == "y = x\n    return y"
    assert gated_variants(["y = x\nreturn y"], cursor, "python") == ["y = x\n    return y"]


def test_tabs_follow_the_document():
    cursor = around("def f(x):\n\tif x:\n\t\t|\n")
    assert variants("y = 1\n\t\treturn y", cursor.around)[0] == "y = 1\n\t\treturn y"
    spaces = around("def f(x):\n  if x:\n    |\n")
    assert spaces.around.indent == "  "
    assert variants("y = 1\n\t\treturn y", spaces.around)[0] == "y = 1\n    return y"


def test_windows_line_breaks_are_kept():
    cursor = around("def f(x):\r\n    |\r\n")
    assert variants("y = x\n    return y", cursor.around)[0] == "y = x\r\n    return y"


def test_empty_and_whitespace_fills_are_dropped():
    assert variants("  \n ", around("x = |\n").around) == []
    assert gated_variants(["", "x))"], around("print(|)\n"), "python") == []


def test_a_fill_the_engine_gated_on_this_document_is_not_parsed_again(monkeypatch):
    from infill_engine import syntax
    from infill_engine.request import Candidate

    cursor = around("total = sum(|)\n")
    document = cursor.prefix + cursor.suffix
    passed = Candidate("values", [], 0.0, gate=syntax.check_fill(document, len(cursor.prefix), len(cursor.prefix),
                                                                  "values", "python"))
    lexical = Candidate("values", [], 0.0, gate=syntax.GateResult(True, (), 0, 0, "lexical"))
    checked: list[str] = []
    real = syntax.check_fill
    monkeypatch.setattr(syntax, "check_fill", lambda *a, **k: checked.append(a[3]) or real(*a, **k))
    assert gated_variants([passed], cursor, "python") == ["values"] and checked == []
    # a checker other than this process's, or a plain text (no verdict), is checked here
    assert gated_variants([lexical, "values"], cursor, "python") == ["values"] and checked == ["values", "values"]
    # a variant the engine never saw is checked too: "x)" tidied to "x" (the suffix's bracket)
    tidied = Candidate("x)", [], 0.0, gate=real(document, len(cursor.prefix), len(cursor.prefix), "x)", "python"))
    checked.clear()
    assert gated_variants([tidied], cursor, "python") == ["x"] and checked == ["x"]
