"""Tests for the syntax gate: which candidate fills add syntax problems to the document they go into."""

from __future__ import annotations

import logging

import pytest

from infill_engine import brackets, syntax
from infill_engine.syntax import (
    SUPPORTED_LANGUAGES,
    GateResult,
    SyntaxProblem,
    check_fill,
    find_problems,
    language_for,
    problems_in_fill,
    rank_key,
)

HOLE = "<HOLE>"


def gate(template: str, fill: str, language: str | None) -> GateResult:
    """Check a fill for the empty hole marked by HOLE in template."""
    start = template.index(HOLE)
    return check_fill(template.replace(HOLE, ""), start, start, fill, language)


def filled(template: str, fill: str) -> str:
    """The document with the hole filled."""
    return template.replace(HOLE, fill)


# 1. Brackets around the hole ---------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("fill", "ok", "message"),
    [("x", True, None), ("x)", False, "unexpected ')'"), ("(x", False, "unclosed '('")],
)
def test_fill_inside_nested_call(fill: str, ok: bool, message: str | None) -> None:
    result = gate("print(foo(<HOLE>))\n", fill, "python")
    assert result.ok is ok
    assert result.checker == "tree-sitter:python"
    if message is not None:
        assert message in [p.message for p in result.new_problems]


@pytest.mark.parametrize(("fill", "ok"), [("b", True), ("b, c]", False)])
def test_fill_inside_argument_list(fill: str, ok: bool) -> None:
    template = "result = compute(a, <HOLE>)\n"
    result = gate(template, fill, "python")
    assert result.ok is ok
    if not ok:
        bracket = [p for p in result.new_problems if p.kind == "bracket"]
        assert [filled(template, fill)[p.start : p.end] for p in bracket] == ["]"]
        assert bracket[0].message == "']' does not match '('"


# 2. Problems the document already had ------------------------------------------------------------------------------

BROKEN_BELOW = "def f(a):\n    <HOLE>\n\n\ndef other(b):\n    return [b, {b: (b)}]\n\n\ndef g(:\n    pass\n"


@pytest.mark.parametrize(
    ("fill", "ok"),
    [("return a + 1", True), ("return (a + 1", False), ("return a]", False), ("return return", False)],
)
def test_preexisting_error_elsewhere_is_left_alone(fill: str, ok: bool) -> None:
    result = gate(BROKEN_BELOW, fill, "python")
    assert result.problems_before >= 1
    assert result.ok is ok
    assert all(p.start < filled(BROKEN_BELOW, fill).index("def g(") for p in result.new_problems)


@pytest.mark.parametrize("template", ["x = <HOLE>\n", "def f():\n    x = <HOLE>\n    return x\n"])
def test_fill_that_completes_an_incomplete_line(template: str) -> None:
    assert gate(template, "1", "python").problems_before >= 1  # the empty hole is itself an error
    good = gate(template, "1", "python")
    assert good.ok and good.problems_after == 0
    assert not gate(template, ")", "python").ok


def test_fill_after_assignment_followed_by_code() -> None:
    template = "x = <HOLE>\nprint(x)\n"
    assert gate(template, "1", "python").ok
    assert not gate(template, ")", "python").ok


def test_replacing_a_range_is_judged_like_a_fill() -> None:
    document = "total = add(a, b) + 1\n"
    start, end = document.index("add"), document.index(")") + 1
    assert check_fill(document, start, end, "mul(a, b)", "python").ok
    assert not check_fill(document, start, end, "mul(a, b", "python").ok


def test_fill_range_outside_the_document_is_a_bug() -> None:
    with pytest.raises(ValueError, match="not inside"):
        check_fill("abc", 2, 5, "x", "python")


# 3. Every language with a grammar ----------------------------------------------------------------------------------

# language: (template, balanced fill, unbalanced fill)
SNIPPETS = {
    "python": ("def area(r):\n    return <HOLE>\n", "math.pi * (r ** 2)", "math.pi * (r ** 2"),
    "javascript": ("function area(r) {\n  return <HOLE>;\n}\n", "Math.PI * (r * r)", "Math.PI * (r * r))"),
    "typescript": (
        "function area(r: number): number {\n  return <HOLE>;\n}\n",
        "Math.PI * Math.pow(r, 2)",
        "Math.PI * Math.pow(r, 2",
    ),
    "tsx": (
        "export const List = ({ items }: { items: string[] }) => (\n  <ul><HOLE></ul>\n);\n",
        "{items.map((i) => <li key={i}>{i}</li>)}",
        "{items.map((i) => <li key={i}>{i}</li>}",
    ),
    "go": (
        'package main\n\nimport "math"\n\nfunc area(r float64) float64 {\n\treturn <HOLE>\n}\n',
        "math.Pi * (r * r)",
        "math.Pi * (r * r",
    ),
    "rust": (
        "fn area(r: f64) -> f64 {\n    <HOLE>\n}\n",
        "std::f64::consts::PI * r.powi(2)",
        "std::f64::consts::PI * r.powi(2))",
    ),
    "c": (
        "#include <stdio.h>\n\nint main(void) {\n    <HOLE>\n    return 0;\n}\n",
        'printf("%d\\n", add(1, 2));',
        'printf("%d\\n", add(1, 2);',
    ),
    "cpp": (
        "#include <vector>\n\nint sum(const std::vector<int>& v) {\n    int s = 0;\n    <HOLE>\n    return s;\n}\n",
        "for (int x : v) { s += x; }",
        "for (int x : v) { s += x;",
    ),
    "java": (
        "class Greeter {\n    String greet(String name) {\n        <HOLE>\n    }\n}\n",
        'return "Hello, " + name.trim();',
        'return "Hello, " + name.trim(;',
    ),
    "lua": ("local function area(r)\n  return <HOLE>\nend\n", "math.pi * (r ^ 2)", "math.pi * (r ^ 2"),
    "json": ('{\n  "name": "diffill",\n  "tags": <HOLE>\n}\n', '["lsp", "diffusion"]', '["lsp", "diffusion"'),
}


def test_every_supported_language_has_a_snippet() -> None:
    assert set(SNIPPETS) == set(SUPPORTED_LANGUAGES)


@pytest.mark.parametrize("language", sorted(SNIPPETS))
def test_balanced_fill_passes_and_unbalanced_fill_fails(language: str) -> None:
    template, good, bad = SNIPPETS[language]
    passing, failing = gate(template, good, language), gate(template, bad, language)
    assert passing.checker == failing.checker == f"tree-sitter:{language}"
    assert passing.ok and passing.problems_after == 0
    assert not failing.ok
    assert {p.kind for p in failing.new_problems} & {"error", "missing"}  # the grammar sees it, not only the scan
    # The incremental reparse finds what a fresh parse of the filled document finds.
    assert list(failing.new_problems) == find_problems(filled(template, bad), language)


@pytest.mark.parametrize(
    ("language", "template", "fill"),
    [
        ("python", "def f(a):\n    return <HOLE>\n", "a +"),
        ("javascript", "function f(a) {\n  <HOLE>\n}\n", "const = a;"),
        ("go", "package main\n\nfunc f(a int) int {\n\t<HOLE>\n}\n", "return return a"),
        ("rust", "fn f(a: i32) -> i32 {\n    <HOLE>\n}\n", "let x = ; x"),
        ("json", '{"a": <HOLE>}\n', "1 2"),
    ],
)
def test_grammar_catches_errors_without_brackets(language: str, template: str, fill: str) -> None:
    result = gate(template, fill, language)
    assert not result.ok
    assert all(p.kind in ("error", "missing") for p in result.new_problems)


@pytest.mark.parametrize(
    ("language", "document"),
    [
        ("python", 's = "(" + \'[\' + """{\n"""  # )\n'),
        ("javascript", 'const s = "(" + \'[\' + `{${"}"}`; // )\n/* ] */\n'),
        ("tsx", "const s: string = \"(\" + '[' + `{`; // )\n"),
        ("go", "package main\n\nvar s = \"(\" + `[` + string('{') // )\n"),
        ("rust", 'fn main() { let s = "("; let c = \'[\'; let r = r#"{"#; let l: &\'static str = "}"; } // )\n'),
        ("c", "int main(void) { char *s = \"(\"; char c = '['; /* { */ return 0; } // )\n"),
        ("cpp", 'auto s = R"x(( [ {)x"; // )\n'),
        ("java", "class A { String s = \"(\"; char c = '['; /* { */ } // )\n"),
        ("lua", "local s = \"(\" .. '[' .. [[{]] -- )\n--[[ ] ]]\n"),
        ("json", '{"a": "(", "b": "[{"}\n'),
    ],
)
def test_brackets_in_strings_and_comments_are_not_problems(language: str, document: str) -> None:
    assert find_problems(document, language) == []


# 4. Languages without a grammar ------------------------------------------------------------------------------------


@pytest.mark.parametrize("language", [None, "cobol"])
@pytest.mark.parametrize(
    "template",
    [
        "CALL foo(a) <HOLE>\n",
        's = "(" <HOLE>\n',
        "# (\n<HOLE>\n",
        "// )\n<HOLE>\n",
        "/* { */ <HOLE>\n",
        "s = '[' <HOLE>\n",
    ],
)
def test_unknown_language_uses_the_bracket_scan(language: str | None, template: str) -> None:
    passing, failing = gate(template, "x", language), gate(template, "(x", language)
    assert passing.checker == failing.checker == "lexical"
    assert passing.ok and passing.problems_before == 0
    assert not failing.ok
    [problem] = failing.new_problems
    assert problem.message == "unclosed '('"
    assert problem.start == template.index(HOLE)  # the fill's own bracket, not one in a string or comment


def test_missing_grammar_degrades_to_the_bracket_scan(
    monkeypatch: pytest.MonkeyPatch, caplog: pytest.LogCaptureFixture
) -> None:
    monkeypatch.setitem(syntax._GRAMMARS, "python", ("tree_sitter_no_such_grammar", "language"))
    syntax._parser.cache_clear()
    syntax._ORIGINALS.clear()
    try:
        with caplog.at_level(logging.WARNING, logger="infill_engine.syntax"):
            passing, failing = gate("print(<HOLE>)\n", "x", "python"), gate("print(<HOLE>)\n", "x)", "python")
    finally:
        syntax._parser.cache_clear()
        syntax._ORIGINALS.clear()
    assert passing.checker == "lexical" and passing.ok
    assert not failing.ok
    assert "no tree-sitter grammar for python" in caplog.text


# 5. Language names -------------------------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("name", "language"),
    [
        *[(language, language) for language in SUPPORTED_LANGUAGES],
        ("javascriptreact", "javascript"),
        ("typescriptreact", "tsx"),
        ("jsonc", "json"),
        ("Python", "python"),
        *[(f"foo{ext}", "python") for ext in (".py", ".pyi")],
        *[(f"foo{ext}", "javascript") for ext in (".js", ".mjs", ".cjs", ".jsx")],
        *[(f"foo{ext}", "typescript") for ext in (".ts", ".mts")],
        ("/a/b.tsx", "tsx"),
        ("main.go", "go"),
        ("lib.rs", "rust"),
        ("x.c", "c"),
        ("x.h", "c"),
        *[(f"x{ext}", "cpp") for ext in (".cc", ".cpp", ".cxx", ".hpp", ".hh")],
        ("src/Main.java", "java"),
        ("init.lua", "lua"),
        ("package.json", "json"),
        ("C:\\src\\App.TSX", "tsx"),
        ("file:///home/me/x.py", "python"),
        (".py", "python"),
        ("Makefile", None),
        ("cobol", None),
        ("notes.txt", None),
        ("", None),
        (None, None),
    ],
)
def test_language_for(name: str | None, language: str | None) -> None:
    assert language_for(name) == language


# 6. Offsets --------------------------------------------------------------------------------------------------------

# Two-, three- and four-byte characters (the Fraktur letters and emoji are outside the BMP).
ACCENTED = '# café 🎉 naïve — 𝔘𝔫𝔦𝔠𝔬𝔡𝔢\ns = "héllo 🌍"\nprint(foo(<HOLE>))\n'


@pytest.mark.parametrize("language", ["python", None])
def test_offsets_are_characters_after_non_ascii_text(language: str | None) -> None:
    text = filled(ACCENTED, "x)")
    result = gate(ACCENTED, "x)", language)
    bracket = [p for p in result.new_problems if p.kind == "bracket"]
    assert [text[p.start : p.end] for p in bracket] == [")"]
    for problem in result.new_problems:
        assert text.index("print") <= problem.start <= problem.end <= len(text)


def test_missing_node_offset_after_non_ascii_text() -> None:
    document = "// 😀 ünïcödé\nint f() { return g(1; }\n"
    [missing] = [p for p in find_problems(document, "c") if p.kind == "missing"]
    assert missing.message == "missing ')'"
    assert document[: missing.start].endswith("g(1")
    assert missing.start == missing.end


def test_lone_surrogate_does_not_break_offsets() -> None:
    template = 's = "\ud800"\nprint(foo(<HOLE>))\n'
    assert gate(template, "x", "python").ok
    result = gate(template, "x]", "python")
    assert not result.ok
    assert "]" in [filled(template, "x]")[p.start : p.end] for p in result.new_problems]


# 7. Large documents and the incremental paths ----------------------------------------------------------------------


def test_large_document() -> None:
    function = 'def f{i}(a, b="("):\n    # note (\n    return [a, {{"k": b}}, (a + b) * 2]\n\n\n'
    document = "".join(function.format(i=i) for i in range(65_000))  # about 5 MB
    assert len(document) > 4_500_000
    hole = document.index("return", document.index("def f30000"))
    assert check_fill(document, hole, hole, "x = g(a)\n    ", "python").ok
    result = check_fill(document, hole, hole, "x = g(a\n    ", "python")
    assert not result.ok and result.problems_before == 0


BRACKETY = "".join(f"def f{i}(a):\n    return [a, {{'k': (a, '(')}}]  # ) {i}\n" for i in range(400))


@pytest.mark.parametrize("where", ["def f0(", "def f130(", "def f399(", "# ) 260"])
@pytest.mark.parametrize("fill", ["x", "(", ")", "]", '"', "'''", "#", "\n", "}\n{"])
def test_incremental_bracket_scan_matches_a_full_scan(where: str, fill: str) -> None:
    start = BRACKETY.index(where) + len(where) - 1
    for language in ("python", None):
        result = check_fill(BRACKETY, start, start + 1, fill, language)
        expected = find_problems(BRACKETY[:start] + fill + BRACKETY[start + 1 :], language)
        assert result.problems_after == len(expected)
        assert set(result.new_problems) <= set(expected)


def test_scan_does_not_resume_from_a_checkpoint_on_the_edited_line() -> None:
    # The '(' after the unterminated quote is exactly where the original scan takes a checkpoint; the fill closes
    # the quote, so resuming from that checkpoint would keep the '(' open.
    first_line = "x = (" + "()" * ((brackets.CHECKPOINT_EVERY - 2) // 2) + "\n"
    template = first_line + "s = 'ab(c <HOLE>\n)\n"
    assert gate(template, "", None).problems_before == 1
    result = gate(template, "'", None)
    assert result.ok and result.problems_after == len(find_problems(filled(template, "'"), None)) == 0


def test_cached_original_is_not_reused_for_another_document() -> None:
    first, second = "f(<HOLE>)\n", "f(<HOLE>\n"
    assert gate(first, "x", "python").problems_before == 0
    assert gate(second, "x", "python").problems_before >= 1
    assert gate(first, "x", "python").problems_before == 0
    assert len(syntax._ORIGINALS) <= syntax._ORIGINALS_SIZE


# 8. Ranking and repair ---------------------------------------------------------------------------------------------


def test_rank_key_orders_passing_first_then_fewer_problems() -> None:
    template = "def f(:\n    return <HOLE>\n"  # the signature is broken whatever the fill
    failing = gate(template, "(a", "python")
    passing = gate(template, "a", "python")
    passing_fixed = check_fill("def f():\n    return a\n", 6, 6, "", "python")
    assert not failing.ok and passing.ok and passing_fixed.ok
    assert passing_fixed.problems_after < passing.problems_after
    ranked = sorted([failing, passing, passing_fixed], key=rank_key)
    assert ranked == [passing_fixed, passing, failing]


def test_problems_in_fill_points_into_the_fill() -> None:
    template = "value = compute(a, <HOLE>)\nnext_line = 1\n"
    fill = "b, [c + d)"
    start = template.index(HOLE)
    result = gate(template, fill, "python")
    assert not result.ok
    ranges = problems_in_fill(result, start, fill)
    assert len(ranges) == len(result.new_problems)
    assert all(0 <= begin < end <= len(fill) for begin, end in ranges)
    bracket = result.new_problems.index(next(p for p in result.new_problems if p.kind == "bracket"))
    assert fill[slice(*ranges[bracket])] in ("[", ")")
    widened = problems_in_fill(result, start, fill, margin=2)
    assert all(w[0] <= r[0] and r[1] <= w[1] for w, r in zip(widened, ranges, strict=True))


def test_problems_in_fill_clamps_problems_outside_the_fill() -> None:
    fill = "abc"
    before = SyntaxProblem(0, 2, "bracket", "unclosed '('")
    after = SyntaxProblem(20, 21, "error", "unexpected ')'")
    result = GateResult(False, (before, after), 0, 2, "lexical")
    assert problems_in_fill(result, 10, fill) == [(0, 1), (2, 3)]
    assert problems_in_fill(result, 10, "") == [(0, 0), (0, 0)]


@pytest.mark.parametrize("garbage", ["\x14", "\ufffd", "a\x0fb"])
@pytest.mark.parametrize("language", ["python", None])
def test_unprintable_text_is_rejected_even_inside_a_comment(garbage, language):
    document = "# note: \nx = 1\n"
    result = check_fill(document, 8, 8, garbage, language)
    assert not result.ok
    assert result.new_problems[0].kind == "text"
    assert check_fill(document, 8, 8, "fine\twords", language).ok
