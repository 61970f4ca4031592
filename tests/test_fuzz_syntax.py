"""Fuzzing the syntax gate: random edits of real files in every supported language, then random fills.

Each example takes a real file (this project's own, or a sample in tests/fuzz_samples/), damages it with a few random
inserts, deletions and replacements (random Unicode included), and asks the gate about a fill of a random range.
Properties: nothing raises and nothing hangs (pytest's timeout); the verdict is the same when asked again (from the
cache of parsed originals); a fill that puts back the original text passes; the incremental bracket rescan finds what
a full scan of the filled document finds; a filled document is clean for the gate exactly when a fresh parse
finds no problem.
"""

from __future__ import annotations

from pathlib import Path
from unittest import mock

from hypothesis import example, given, strategies as st

from infill_engine import brackets
from infill_engine.brackets import Edit, filled_bracket_scan, scan_brackets
from infill_engine.syntax import SUPPORTED_LANGUAGES, check_fill, find_problems, language_for
from tests.fuzzing import editor_text, examples

ROOT = Path(__file__).resolve().parents[1]
SAMPLES = {
    path.name: path.read_text(encoding="utf-8")
    for path in [
        *sorted((ROOT / "tests" / "fuzz_samples").iterdir()),
        ROOT / "infill_engine" / "problems.py",
        ROOT / "editors" / "neovim" / "plugin" / "diffill.lua",
        ROOT / "editors" / "vscode" / "src" / "statusBar.ts",
        ROOT / "editors" / "vscode" / "tsconfig.json",
    ]
}


def test_there_is_a_sample_of_every_supported_language():
    assert {language_for(name) for name in SAMPLES} == set(SUPPORTED_LANGUAGES)


@st.composite
def damaged(draw: st.DrawFn) -> tuple[str, str]:
    """(file name, its text after up to three random edits: insert, delete or replace a random slice)."""
    name = draw(st.sampled_from(sorted(SAMPLES)))
    text = SAMPLES[name]
    for _ in range(draw(st.integers(0, 3))):
        start = draw(st.integers(0, len(text)))
        end = draw(st.integers(start, min(len(text), start + 40)))
        text = text[:start] + draw(st.one_of(editor_text, st.sampled_from(["", "(", "}", '"', "/*", "\n"]))) + text[end:]
    return name, text


@st.composite
def fills(draw: st.DrawFn, document: str) -> tuple[int, int, str]:
    """(start, end, fill): the original text back, random text, or a slice of the document moved here."""
    start = draw(st.integers(0, len(document)))
    end = draw(st.integers(start, min(len(document), start + 80)))
    kind = draw(st.sampled_from(["original", "random", "moved"]))
    if kind == "original":
        return start, end, document[start:end]
    if kind == "random":
        return start, end, draw(editor_text)
    origin = draw(st.integers(0, len(document)))
    return start, end, document[origin : origin + draw(st.integers(0, 60))]


# sample.tsx with an unterminated template string: every bracket after it is unclosed
OPEN_TEMPLATE = SAMPLES["sample.tsx"].replace("  const title = `${label} (${items.length})`;", "  )`;")


@examples(150)
@given(sample=damaged(), data=st.data(), checkpoint_every=st.sampled_from([brackets.CHECKPOINT_EVERY, 1, 3]))
@example(sample=("sample.js", SAMPLES["sample.js"]), data=(0, 10), checkpoint_every=1)
# Putting back the original text of a range that held an old problem (an unclosed '{') made it new: the gate moved
# every old problem inside the replaced range to its start.
@example(sample=("sample.tsx", OPEN_TEMPLATE), data=(106, 186), checkpoint_every=256)
def test_the_gate_is_deterministic_and_passes_the_original_text(sample, data, checkpoint_every):
    """`data` draws the fill; the explicit examples give a (start, end) whose original text is put back instead."""
    name, document = sample
    language = language_for(name)
    if isinstance(data, tuple):
        start, end, fill = *data, document[data[0] : data[1]]
    else:
        start, end, fill = data.draw(fills(document))
    # small checkpoint intervals make short files take the incremental rescan's every path
    with mock.patch.object(brackets, "CHECKPOINT_EVERY", checkpoint_every):
        verdict = check_fill(document, start, end, fill, language)
        assert check_fill(document, start, end, fill, language) == verdict
        if fill == document[start:end]:
            assert verdict.ok, verdict.new_problems
        filled = document[:start] + fill + document[end:]
        edit = Edit(start, end, len(fill))
        rescanned = filled_bracket_scan(scan_brackets(document, language), filled, edit, language)
        assert rescanned.problems == scan_brackets(filled, language).problems
    # The gate reparses incrementally; tree-sitter may then recover from errors differently than a fresh parse does
    # (other ERROR and MISSING nodes), but a filled document is clean for both or for neither.
    unprintable = sum(problem.kind == "text" for problem in verdict.new_problems)
    assert (verdict.problems_after - unprintable == 0) == (find_problems(filled, language) == [])
    for problem in verdict.new_problems:
        assert 0 <= problem.start <= problem.end <= len(filled)


@examples(60)
@given(sample=damaged(), language=st.sampled_from([*SUPPORTED_LANGUAGES, None, "plaintext", "cobol"]))
def test_any_text_in_any_language_gets_a_list_of_problems_inside_it(sample, language):
    _, document = sample
    for problem in find_problems(document, language):
        assert 0 <= problem.start <= problem.end <= len(document) and problem.message
