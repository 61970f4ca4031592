"""`python -m infill_engine.training.held_out_lines`: single-line holes from a corpus's held-out files, scored."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from infill_engine.training.corpus import Corpus, CorpusManifest, Document, write_corpus
from infill_engine.training.held_out_lines import LineHole, main, sample_line_holes, score_fills

MODULE = '''"""A module."""
import os


def total(values):
    # add them up
    result = 0
    for value in values:
        result += value
    return result


class Box:
    def __init__(self, size):
        self.size = size
'''


def documents(count: int, split: str = "eval") -> list[Document]:
    """`count` copies of the module under different names, and a JavaScript file that must never be used."""
    docs = [Document(f"pkg/mod{i}.py", MODULE.replace("total", f"total{i}"), f"{i:064x}", split) for i in range(count)]
    return docs + [Document("pkg/app.js", "function f() {\n    return 1;\n}\n", "f" * 64, split)]


def test_holes_are_whole_indented_code_lines_laid_out_as_the_benchmark() -> None:
    docs = documents(6)
    holes = sample_line_holes(docs, 4)
    assert len(holes) == 4 and all(h.path.endswith(".py") for h in holes)
    texts = {d.path: d.text for d in docs}
    for hole in holes:
        assert hole.prefix + hole.middle + hole.suffix == texts[hole.path]  # short files: nothing cut
        assert hole.middle.endswith("\n") and hole.middle[0] == " " and hole.middle.strip()
        assert not hole.middle.strip().startswith("#") and hole.prefix.endswith("\n")
    assert sample_line_holes(docs, 4) == holes  # the same holes for every model and setting
    assert len(sample_line_holes(docs, 50)) == 6  # at most one a file


def test_scores_count_exact_similar_and_blank_fills() -> None:
    holes = [LineHole("a.py", "", "    return a + b\n", ""), LineHole("b.py", "", "    x = 1\n", "")]
    scores = score_fills("m", "", holes, ["    return a + b", "   \n"], [10.0, 20.0], tokens=6, passes=4)
    assert (scores.exact, scores.blank, scores.ms_per_hole, scores.tokens_per_forward) == (50.0, 50.0, 15.0, 1.5)
    assert (scores.fill_chars, scores.line_chars) == (6.0, 8.5)
    assert scores.edit_similarity == 0.5  # 1.0 for the exact fill, 0.0 for the blank one


def test_the_command_scores_each_model_and_variant(tmp_path: Path, model_dirs, capsys) -> None:
    corpus = tmp_path / "run"
    write_corpus(Corpus(documents(5) + documents(2, "train"), CorpusManifest(sources=["test"])), corpus)
    out = tmp_path / "rows.json"
    model = str(model_dirs["diffill"])
    assert main([model, "--corpus", str(corpus), "--holes", "5", "--variant", "end_bias=-30",
                 "--variant", "end_bias=30", "--json", str(out)]) == 0
    printed = capsys.readouterr().out
    assert "5 held-out lines" in printed and printed.count(model) == 2
    rows = {r["variant"]: r for r in json.loads(out.read_text())}
    # +30 ends every span after its one forced token; -30 writes the whole canvas
    assert rows["end_bias=30"]["fill_chars"] < rows["end_bias=-30"]["fill_chars"]
    assert rows["end_bias=30"]["line_chars"] == rows["end_bias=-30"]["line_chars"]  # the same holes
    assert all(row["tokens_per_forward"] > 0 for row in rows.values())  # every fill wrote something


@pytest.mark.parametrize("argv, message", [
    (["--holes", "0"], "--holes must be at least 1"),
    (["--variant", "end_bias=far"], "end_bias must be a float"),
])
def test_bad_options_are_refused_before_a_model_loads(tmp_path: Path, capsys, argv, message) -> None:
    corpus = tmp_path / "run"
    write_corpus(Corpus(documents(2), CorpusManifest(sources=["test"])), corpus)
    assert main(["no-such-model", "--corpus", str(corpus), *argv]) == 2
    assert message in capsys.readouterr().err


def test_a_directory_without_a_corpus_is_a_clear_error(tmp_path: Path, capsys) -> None:
    assert main(["no-such-model", "--corpus", str(tmp_path)]) == 2
    assert "corpus.jsonl" in capsys.readouterr().err
