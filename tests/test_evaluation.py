"""`diffill eval humaneval-infill` on a small file in the benchmark's format (the real data stays out of tests)."""

from __future__ import annotations

import gzip
from dataclasses import replace
import json

import pytest

from diffill.cli import main
from infill_engine.evaluation import Problem, first_depth, line_spans, load_problems, run_test

PROBLEMS = [
    {
        "task_id": "Toy/0/L1", "entry_point": "add",
        "prompt": "def add(a, b):\n", "canonical_solution": "    return a + b\n", "suffix": "",
        "test": "def check(candidate):\n    assert candidate(2, 3) == 5\n",
    },
    {
        "task_id": "Toy/1/L2", "entry_point": "evens",
        "prompt": "def evens(xs):\n    out = []\n    for x in xs:\n",
        "canonical_solution": "        if x % 2 == 0: out.append(x)\n", "suffix": "    return out\n",
        "test": "def check(candidate):\n    assert candidate([1, 2, 4]) == [2, 4]\n",
    },
]


@pytest.fixture()
def bench_file(tmp_path):
    path = tmp_path / "toy.jsonl.gz"
    with gzip.open(path, "wt", encoding="utf-8") as handle:
        for row in PROBLEMS:
            handle.write(json.dumps(row) + "\n")
    return path


def test_reference_solutions_pass_and_wrong_ones_fail(bench_file):
    problems = load_problems(bench_file)
    assert all(run_test(p, p.canonical_solution) for p in problems)
    assert not run_test(problems[0], "    return a - b\n")


def test_a_test_that_exhausts_memory_fails_instead_of_hurting_the_machine():
    hog = Problem("Toy/hog", "def f():\n", "", "    return 1\n", "x = bytearray(4 << 30)\ndef check(c):\n    pass\n", "f")
    assert not run_test(hog, hog.canonical_solution)


def test_eval_prints_both_protocols(capsys, bench_file, model_dirs, tmp_path):
    out_file = tmp_path / "details.json"
    code = main(["eval", "humaneval-infill", "--data", str(bench_file), "--model", str(model_dirs["diffill"]),
                 "--json", "--max-tokens", "8", "--out", str(out_file)])
    assert code == 0
    summary = json.loads(capsys.readouterr().out)["summary"]
    assert [row["protocol"] for row in summary] == ["unknown", "oracle"]
    assert all(row["problems"] == 2 for row in summary)
    details = json.loads(out_file.read_text())
    assert len(details["outcomes"]["oracle"]) == 2
    for row in summary:  # fills that are only whitespace: no suggestion for the user
        assert row["blank_fills"] == sum(not o["completion"].strip() for o in details["outcomes"][row["protocol"]])
        one_line = [o["completion"].strip() != "" and "\n" not in o["completion"].strip()
                    for o in details["outcomes"][row["protocol"]]]  # every toy middle is one line of text
        assert row["right_line_count"] == 100 * sum(one_line) / 2
        toy_depths = ["    ", "        "]  # the toy middles' indentation: 4 and 8 spaces
        at_depth = [o["completion"].strip() != "" and first_depth(o["completion"]) == depth
                    for o, depth in zip(details["outcomes"][row["protocol"]], toy_depths)]
        assert row["right_depth"] == 100 * sum(at_depth) / 2


def test_a_right_line_at_another_depth_is_exact_but_fails(bench_file):
    """Why `depth` is reported beside exact match: the stripped text matches, the program does not."""
    loop = load_problems(bench_file)[1]
    shallower = "    " + loop.canonical_solution.lstrip()  # after the loop instead of in it
    assert shallower.strip() == loop.canonical_solution.strip()
    assert not run_test(loop, shallower)
    assert first_depth(shallower) == "    " and first_depth(loop.canonical_solution) == "        "
    assert first_depth("\n  \n") is None


def test_a_run_against_an_earlier_one_counts_gains_losses_and_chance(capsys, bench_file, model_dirs, tmp_path):
    """--against: the same model again changes nothing (p = 1); against a run that passed both, both are lost."""
    first = tmp_path / "first.json"
    model = ["--data", str(bench_file), "--model", str(model_dirs["diffill"]), "--max-tokens", "8"]
    assert main(["eval", "humaneval-infill", *model, "--out", str(first)]) == 0
    capsys.readouterr()
    assert main(["eval", "humaneval-infill", *model, "--against", str(first), "--json"]) == 0
    against = json.loads(capsys.readouterr().out)["against"]["protocols"]
    assert [c["protocol"] for c in against] == ["unknown", "oracle"]
    assert all(c["problems"] == 2 and c["identical_fills"] == 2 and c["gained"] == c["lost"] == 0
               and c["p_value"] == 1.0 for c in against)

    saved = json.loads(first.read_text())
    passing = [o for o in saved["outcomes"]["unknown"] if o["passed"]]
    for outcome in saved["outcomes"]["unknown"]:
        outcome["passed"], outcome["completion"] = True, PROBLEMS[0]["canonical_solution"]
    all_passed = tmp_path / "all-passed.json"
    all_passed.write_text(json.dumps({"outcomes": {"unknown": saved["outcomes"]["unknown"]}}))
    assert main(["eval", "humaneval-infill", *model, "--protocol", "unknown", "--against", str(all_passed)]) == 0
    printed = capsys.readouterr().out
    lost = 2 - len(passing)  # a random tiny model; whatever it passed now it passed before
    assert f"2 problems in both: passing 2 -> {len(passing)} (0 gained, {lost} lost; McNemar p = " in printed
    blank_now = sum(not o["completion"].strip() for o in json.loads(first.read_text())["outcomes"]["unknown"])
    assert f"blank fills 0 -> {blank_now}" in printed  # the earlier file's fills all wrote the solution
    assert ("p = 0.50" if lost == 2 else "p = 1.00") in printed

    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"summary": []}))
    assert main(["eval", "humaneval-infill", *model, "--against", str(bad)]) == 2
    assert "is not the --out file of `diffill eval humaneval-infill`" in capsys.readouterr().err
    other = tmp_path / "other.json"
    other.write_text(json.dumps({"outcomes": {"unknown": [{"task_id": "Else/0", "passed": True, "completion": ""}]}}))
    assert main(["eval", "humaneval-infill", *model, "--protocol", "oracle", "--against", str(other)]) == 2
    assert "scored no problem of this run under oracle (it has unknown: 1)" in capsys.readouterr().err
    assert main(["eval", "humaneval-infill", *model, "--against", str(tmp_path / "missing.json")]) == 2
    assert "cannot read" in capsys.readouterr().err


def test_a_sampler_variant_changes_the_fills_and_a_bad_one_is_refused(capsys, bench_file, model_dirs, tmp_path):
    """--variant end_bias=-30 writes the whole canvas where +30 ends every span after one token."""
    lengths = {}
    for bias in ("-30", "30"):
        out_file = tmp_path / f"bias{bias}.json"
        assert main(["eval", "humaneval-infill", "--data", str(bench_file), "--model", str(model_dirs["diffill"]),
                     "--protocol", "unknown", "--max-tokens", "8", "--variant", f"end_bias={bias}",
                     "--out", str(out_file)]) == 0
        assert f"sampler end_bias={bias}" in capsys.readouterr().out
        outcomes = json.loads(out_file.read_text())["outcomes"]["unknown"]
        lengths[bias] = sum(len(o["completion"]) for o in outcomes)
    assert lengths["-30"] > lengths["30"]
    assert main(["eval", "humaneval-infill", "--data", str(bench_file), "--variant", "end_bias=far"]) == 2
    assert "end_bias must be a float" in capsys.readouterr().err


def test_a_time_budget_as_the_server_sets_it_cuts_each_fill_short(capsys, bench_file, model_dirs, tmp_path):
    """--budget-ms 0: one denoising step a fill (the rest takes the model's best guess), so each fill writes all
    of its tokens in that one pass; the random tiny model is too unsure to do so without a budget."""
    per_forward = {}
    for budget in ([], ["--budget-ms", "0"]):
        out_file = tmp_path / f"budget{len(budget)}.json"
        assert main(["eval", "humaneval-infill", "--data", str(bench_file), "--model", str(model_dirs["diffill"]),
                     "--protocol", "unknown", "--max-tokens", "8", *budget, "--out", str(out_file)]) == 0
        assert ("budget 0 ms a fill" in capsys.readouterr().out) == bool(budget)
        outcomes = json.loads(out_file.read_text())["outcomes"]["unknown"]
        per_forward[bool(budget)] = sum(o["tokens_per_forward"] for o in outcomes)
    assert per_forward[True] > per_forward[False]
    assert main(["eval", "humaneval-infill", "--data", str(bench_file), "--budget-ms", "-1"]) == 2
    assert "--budget-ms must be an integer >= 0" in capsys.readouterr().err


def test_several_candidates_score_the_first_as_the_engine_ranks_them(capsys, bench_file, model_dirs, tmp_path):
    from infill_engine.engine import InfillEngine, InfillRequest
    from infill_engine.loading import load_denoiser

    out_file = tmp_path / "k4.json"
    assert main(["eval", "humaneval-infill", "--data", str(bench_file), "--model", str(model_dirs["diffill"]),
                 "--protocol", "unknown", "--max-tokens", "8", "--candidates", "4", "--out", str(out_file)]) == 0
    assert "the first of 4 candidates" in capsys.readouterr().out
    outcomes = json.loads(out_file.read_text())["outcomes"]["unknown"]
    assert [o["candidates"] for o in outcomes] == [4, 4]
    engine = InfillEngine(load_denoiser(model_dirs["diffill"], device="cpu"))
    for problem, outcome in zip(load_problems(bench_file), outcomes):
        result = engine.fill(InfillRequest(problem.prompt, problem.suffix, "python", max_tokens=8, candidates=4))
        first = (result.candidates or result.rejected)[0]
        assert outcome["completion"] == first.text
    assert main(["eval", "humaneval-infill", "--data", str(bench_file), "--candidates", "17"]) == 2
    assert "candidates must be an integer from 1 to 16 (got 17)" in capsys.readouterr().err


def test_a_file_in_another_format_is_a_clear_error(capsys, tmp_path, model_dirs):
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"question": "?"}\n')
    code = main(["eval", "humaneval-infill", "--data", str(bad), "--model", str(model_dirs["diffill"])])
    assert code == 2
    assert "not a HumanEval-infilling problem" in capsys.readouterr().err


def test_a_sample_spreads_over_the_whole_file(capsys, tmp_path, model_dirs):
    many = tmp_path / "many.jsonl"
    rows = [dict(PROBLEMS[i % 2], task_id=f"Toy/{i}/L1") for i in range(10)]
    many.write_text("".join(json.dumps(row) + "\n" for row in rows))
    code = main(["eval", "humaneval-infill", "--data", str(many), "--model", str(model_dirs["diffill"]),
                 "--sample", "3", "--protocol", "oracle", "--max-tokens", "8", "--out", str(tmp_path / "o.json")])
    assert code == 0
    outcomes = json.loads((tmp_path / "o.json").read_text())["outcomes"]["oracle"]
    assert [o["task_id"] for o in outcomes] == ["Toy/0/L1", "Toy/3/L1", "Toy/6/L1"]
    assert main(["eval", "humaneval-infill", "--data", str(many), "--model", str(model_dirs["diffill"]),
                 "--sample", "0"]) == 2
    assert "at least 1 problem" in capsys.readouterr().err


SUM_PROGRAM = ["def total(xs):\n", "    s = 0\n", "    for x in xs:\n", "\n", "        s += x\n", "    return s\n"]


def single_line_holes(program: list[str], task: str = "Toy/9") -> list[Problem]:
    """One single-line problem for each non-blank body line of `program`, as HumanEval-infilling lays them out."""
    test = "def check(candidate):\n    assert candidate([1, 2, 3]) == 6\n"
    return [Problem(f"{task}/L{i - 1}", "".join(program[:i]), "".join(program[i + 1 :]), program[i], test, "total")
            for i in range(1, len(program)) if program[i].strip()]


def test_holes_of_several_lines_are_derived_from_the_single_line_ones():
    spans = line_spans(single_line_holes(SUM_PROGRAM), 2)
    assert [p.task_id for p in spans] == ["Toy/9/L0_L1", "Toy/9/L1_L3", "Toy/9/L3_L4"]
    assert spans[1].canonical_solution == "    for x in xs:\n\n        s += x\n"  # the blank line between is in it
    assert all(p.prompt + p.canonical_solution + p.suffix == "".join(SUM_PROGRAM) for p in spans)
    assert all(run_test(p, p.canonical_solution) for p in spans)
    assert not run_test(spans[0], "    s = 1\n    for x in xs:\n")
    assert len(line_spans(single_line_holes(SUM_PROGRAM), 4)) == 1
    assert line_spans(single_line_holes(SUM_PROGRAM), 5) == []


def test_holes_of_several_lines_need_single_line_ids_and_one_program():
    with pytest.raises(ValueError, match="ids end in /L<line>"):
        line_spans([Problem("Toy/x", "a", "", "b", "", "f")], 2)
    other = single_line_holes(["def total(xs):\n", "    return sum(xs)\n", "    pass\n"])
    with pytest.raises(ValueError, match="not holes of one program"):
        line_spans(single_line_holes(SUM_PROGRAM)[:1] + [replace(other[1], task_id="Toy/9/L1")], 2)
    twice = single_line_holes(SUM_PROGRAM)[:2]
    with pytest.raises(ValueError, match="not holes of one program"):  # one line twice is no hole of two
        line_spans([twice[1], replace(twice[1], task_id="Toy/9/L2")], 2)
    with pytest.raises(ValueError, match="at least 1 line"):
        line_spans(single_line_holes(SUM_PROGRAM), 0)


def test_eval_scores_holes_of_several_lines_on_a_canvas_sized_for_them(capsys, tmp_path, model_dirs):
    data = tmp_path / "lines.jsonl"
    data.write_text("".join(json.dumps(p.__dict__) + "\n" for p in single_line_holes(SUM_PROGRAM)))
    out = tmp_path / "o.json"
    code = main(["eval", "humaneval-infill", "--data", str(data), "--model", str(model_dirs["diffill"]), "--json",
                 "--span-lines", "2", "--protocol", "unknown", "--limit", "2", "--out", str(out)])
    assert code == 0
    assert json.loads(capsys.readouterr().out)["span_lines"] == 2
    outcomes = json.loads(out.read_text())["outcomes"]["unknown"]
    assert [o["task_id"] for o in outcomes] == ["Toy/9/L0_L1", "Toy/9/L1_L3"]
    assert all(o["positions"] == 64 for o in outcomes)  # 32 positions a line
    for o in outcomes:  # both middles hold two lines of text
        assert o["lines_right"] == (sum(1 for line in o["completion"].split("\n") if line.strip()) == 2)
    bad = main(["eval", "humaneval-infill", "--data", str(data), "--model", str(model_dirs["diffill"]),
                "--span-lines", "0"])
    assert bad == 2 and "at least 1 line" in capsys.readouterr().err
    assert main(["eval", "humaneval-infill", "--data", str(data), "--limit", "0"]) == 2
    assert "--limit takes a number of problems >= 1" in capsys.readouterr().err


def test_bench_ghost_fills_each_hole_as_single_line_ghost_text(capsys, bench_file, model_dirs):
    code = main(["bench", "ghost", "--data", str(bench_file), "--model", str(model_dirs["diffill"]), "--sample", "2",
                 "--max-tokens", "6", "--json"])
    assert code == 0
    report = json.loads(capsys.readouterr().out)
    assert (report["holes"], report["max_tokens"], report["candidates"]) == (2, 6, 1)
    assert 1 <= report["forward_passes_median"] <= 6 * 3  # a 6-position span, and at most two repair rounds
    assert 0.0 <= report["with_suggestion"] <= 1.0
    assert main(["bench", "ghost", "--data", str(bench_file), "--model", str(model_dirs["diffill"]),
                 "--max-tokens", "0"]) == 2
    assert "max_tokens" in capsys.readouterr().err


def test_per_forward_figures_count_all_fills_together(capsys, bench_file, model_dirs, tmp_path):
    """The summary's tokens and canvas positions per forward are totals over totals (as `bench fill` counts them):
    with a budget of 0 ms each fill decides its whole canvas of 8 positions in its one pass."""
    out_file = tmp_path / "budget.json"
    assert main(["eval", "humaneval-infill", "--data", str(bench_file), "--model", str(model_dirs["diffill"]),
                 "--protocol", "unknown", "--max-tokens", "8", "--budget-ms", "0", "--json",
                 "--out", str(out_file)]) == 0
    summary = json.loads(capsys.readouterr().out)["summary"][0]
    outcomes = json.loads(out_file.read_text())["outcomes"]["unknown"]
    assert all(o["forward_passes"] == 1 and o["positions"] == 8 for o in outcomes)
    assert summary["canvas_positions_per_forward"] == 8
    assert summary["tokens_per_forward"] == round(sum(o["tokens"] for o in outcomes) / len(outcomes), 3)
    assert 0 < summary["tokens_per_forward"] <= 8
