"""The syntax gate in a large document: a window of top-level nodes, and versions parsed from the one before.

The gate parses only the top-level nodes around a fill in a large document, and derives a new version of a
document (a keystroke) from the version before. Either must give the verdict that parsing the whole document
gives (`check_fill(window=False)`, and a cache of parsed originals emptied before each version).
"""

from __future__ import annotations

from pathlib import Path
from unittest import mock

from infill_engine import syntax
from infill_engine.brackets import scan_brackets
from infill_engine.syntax import check_fill, find_problems, language_for

ROOT = Path(__file__).resolve().parents[1]
FILES = [
    *sorted((ROOT / "tests" / "fuzz_samples").iterdir()),
    ROOT / "infill_engine" / "engine.py",
    ROOT / "editors" / "neovim" / "plugin" / "diffill.lua",
]
FILLS = ["x", "(", ")", '"""', "}", "foo(bar)", "\n", "if x:\n    pass\n", "'", "/*", "]", "return 1;"]


class WindowSpy:
    """Counts the fills whose tree-sitter problems came from a window rather than the whole document."""

    def __init__(self) -> None:
        self.windowed = self.whole = 0
        self._real = syntax._window_problems

    def __call__(self, *args, **kwargs):
        problems = self._real(*args, **kwargs)
        if problems is None:
            self.whole += 1
        else:
            self.windowed += 1
        return problems


def test_a_window_gives_the_verdict_of_the_whole_document() -> None:
    spy = WindowSpy()
    with mock.patch.object(syntax, "WINDOW_FROM_BYTES", 0), mock.patch.object(syntax, "_window_problems", spy):
        for path in FILES:
            document, language = path.read_text(encoding="utf-8"), language_for(path.name)
            line_ends = [index for index, char in enumerate(document) if char == "\n"]
            for hole in line_ends[3 :: max(1, len(line_ends) // 8)]:
                for fill in FILLS:
                    whole = check_fill(document, hole, hole, fill, language, window=False)
                    windowed = check_fill(document, hole, hole, fill, language)
                    assert windowed.ok == whole.ok, (path.name, hole, fill, whole.new_problems, windowed.new_problems)
                    if whole.ok:
                        assert windowed.problems_after == whole.problems_after
    assert spy.windowed > len(FILES) * len(FILLS), "few fills were gated in a window"


def large_module(functions: int) -> str:
    """A valid Python module of many small functions (several hundred kB)."""
    return "".join(
        f'def f{i}(a, b="("):\n    # note (\n    value = [a, {{"k": b}}, (a + b) * 2]\n    return value\n\n\n'
        for i in range(functions)
    )


def test_a_bracket_left_open_fails_in_a_window_and_everywhere_after_it() -> None:
    document = large_module(3000)
    assert len(document.encode()) > syntax.WINDOW_FROM_BYTES
    hole = document.index("value", document.index("def f100("))
    spy = WindowSpy()
    with mock.patch.object(syntax, "_window_problems", spy):
        passing = check_fill(document, hole, hole, "x = g(a)\n    ", "python")
        failing = check_fill(document, hole, hole, "x = g(a\n    ", "python")
    assert passing.ok and passing.problems_after == 0
    assert not failing.ok
    assert spy.windowed == 2 and spy.whole == 0
    assert not check_fill(document, hole, hole, "x = g(a\n    ", "python", window=False).ok
    # the problems point into the function that holds the fill, where a repair can act on them
    function_end = document.index("def f101(")
    assert failing.new_problems and all(p.start < function_end for p in failing.new_problems)


def test_a_fill_that_closes_a_bracket_left_open_far_below_is_judged_on_the_whole_document() -> None:
    # a stray ')' far below the fill: the fill's '(' makes it match, which only the whole document shows
    document = large_module(3000)
    stray = document.index("def f2500(")
    document = document[:stray] + ")\n" + document[stray:]
    hole = document.index("value", document.index("def f100("))
    for fill in ["x = g(a\n    ", "x = g(a)\n    "]:
        assert check_fill(document, hole, hole, fill, "python").ok == \
            check_fill(document, hole, hole, fill, "python", window=False).ok


def test_a_comment_opened_in_the_window_and_closed_beyond_it_passes_as_in_the_whole_document() -> None:
    # Java: the block comment that the fill opens ends at a '*/' below the window; parsed alone, the window would
    # call the '/*' an error
    document = (ROOT / "tests" / "fuzz_samples" / "Sample.java").read_text(encoding="utf-8")
    hole = document.index("\n") + 1  # after the package declaration
    spy = WindowSpy()
    with mock.patch.object(syntax, "WINDOW_FROM_BYTES", 0), mock.patch.object(syntax, "_window_problems", spy):
        result = check_fill(document, hole, hole, "/*", "java")
    assert result.ok == check_fill(document, hole, hole, "/*", "java", window=False).ok == (
        find_problems(document[:hole] + "/*" + document[hole:], "java") == []
    )
    assert spy.whole == 1


def test_each_version_typed_is_parsed_from_the_one_before_and_finds_what_a_fresh_parse_finds() -> None:
    document = (ROOT / "infill_engine" / "engine.py").read_text(encoding="utf-8")
    hole = document.index("\n", document.index("def _gate(")) + 1
    line = "        x = self._decode(span, [y for y in (a, b) if y], {'k': \"(\"})  # done (\n"
    saved = syntax.swap_cache()
    try:
        with mock.patch.object(syntax, "VERSIONS_FROM_CHARS", 0):
            check_each_version(document, hole, line)
    finally:
        syntax.swap_cache(saved)


def check_each_version(document: str, hole: int, line: str) -> None:
    """Type line at hole, three characters at a time; each version's problems and bracket checkpoints are right."""
    derived_versions = 0
    real = syntax._next_version

    def counted(*args):
        nonlocal derived_versions
        analysis = real(*args)
        derived_versions += analysis is not None
        return analysis

    with mock.patch.object(syntax, "_next_version", counted):
        for typed in range(0, len(line) + 1, 3):
            version = document[:hole] + line[:typed] + document[hole:]
            derived = syntax.find_problems(version, "python")
            used = syntax.swap_cache()  # empty: the next parse is a fresh one
            fresh = syntax.find_problems(version, "python")
            syntax.swap_cache(used)
            assert derived == fresh, line[:typed]
            # the derived bracket scan's checkpoints are states that a scan can resume from
            scan = syntax._analyse(version, "python").brackets
            assert scan.problems == scan_brackets(version, "python").problems
            for checkpoint in scan.checkpoints:
                resumed = scan_brackets(version, "python", checkpoint, scan.problems[: checkpoint.reported])
                assert resumed.problems == scan.problems
    assert derived_versions >= len(line) // 3


def test_the_gate_benchmark_gives_every_way_of_gating_the_same_verdicts() -> None:
    from infill_engine.gate_bench import bench_gate

    report = bench_gate(0.2, keys=2, candidates=2)
    assert report["same_verdicts"] and report["characters"] >= 200_000
    assert [row["mode"] for row in report["rows"]] == ["fresh", "whole", "window"]
    assert all(row["passed"] == 2 for row in report["rows"])  # the rest of the line passes, the open bracket fails
