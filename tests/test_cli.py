"""`diffill fill` and `diffill doctor` as a user runs them, including bad input."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

from diffill.cli import main

PYTHON_FILE = "def add(a, b):\n    return a + b\n\n\nresult = add(1, \n"


@pytest.fixture()
def source(tmp_path):
    path = tmp_path / "sample.py"
    path.write_text(PYTHON_FILE)
    return path


def run(capsys, *argv):
    code = main(list(argv))
    captured = capsys.readouterr()
    return code, captured.out, captured.err


def test_fill_at_line_and_column_prints_json(capsys, source, model_dirs):
    code, out, err = run(capsys, "fill", f"{source}:5:17", "--model", str(model_dirs["diffill"]), "--json",
                         "--max-tokens", "8", "--candidates", "2")
    assert code == 0, err
    report = json.loads(out)
    assert {"text", "candidates", "rejected", "steps", "tokens_per_forward", "ms"} <= set(report)
    assert report["steps"] >= 1
    assert len(report["candidates"]) + len(report["rejected"]) >= 1


def test_fill_at_a_marker(capsys, tmp_path, model_dirs):
    path = tmp_path / "hole.py"
    path.write_text("x = compute(a, <HOLE>)\n")
    code, out, err = run(capsys, "fill", str(path), "--hole", "<HOLE>", "--model", str(model_dirs["diffill"]),
                         "--no-gate", "--max-tokens", "4")
    assert code == 0, err
    assert "--- candidate 1" in out


def test_gate_keeps_brackets_balanced_and_no_gate_shows_raw_candidates(capsys, tmp_path, model_dirs):
    from infill_engine.syntax import check_fill

    path = tmp_path / "brackets.py"
    document = "values = sorted(items, key=lambda v: (v.size, <HOLE>))\nprint(values)\n"
    path.write_text(document)
    args = ("fill", str(path), "--hole", "<HOLE>", "--model", str(model_dirs["diffill"]), "--json",
            "--max-tokens", "6", "--candidates", "4", "--temperature", "1.0")
    code, out, _ = run(capsys, *args)
    gated = json.loads(out)
    prefix, suffix = document.split("<HOLE>")
    for candidate in gated["candidates"]:  # every fill offered keeps the file's brackets balanced
        assert check_fill(prefix + suffix, len(prefix), len(prefix), candidate["text"], "python").ok
    assert all(c["problems"] for c in gated["rejected"])
    code, out, _ = run(capsys, *args, "--no-gate")
    raw = json.loads(out)
    assert len(raw["candidates"]) >= len(gated["candidates"])
    assert raw["rejected"] == []


@pytest.mark.parametrize(
    "target, message",
    [("{source}:99:1", "line 99 is outside the file"),
     ("{source}:1:400", "column 400 is outside the line"),
     ("{source}", "say where the hole is"),
     ("{missing}:1:1", "no such file")],
)
def test_bad_positions_are_clear_errors(capsys, source, tmp_path, target, message):
    code, _, err = run(capsys, "fill", target.format(source=source, missing=tmp_path / "missing.py"))
    assert code == 2
    assert message in err
    assert "Traceback" not in err


def test_missing_marker_is_a_clear_error(capsys, source):
    code, _, err = run(capsys, "fill", str(source), "--hole", "@@")
    assert code == 2 and "does not occur" in err


@pytest.mark.parametrize(
    "content, message",
    [(b"\x00\x01\x02binary", "looks binary"), (b"caf\xe9 = 1\n", "not UTF-8")],
)
def test_binary_and_non_utf8_files_are_refused(capsys, tmp_path, content, message):
    path = tmp_path / "odd.py"
    path.write_bytes(content)
    code, _, err = run(capsys, "fill", f"{path}:1:1")
    assert code == 2 and message in err


def test_empty_file_fills(capsys, tmp_path, model_dirs):
    path = tmp_path / "empty.py"
    path.write_text("")
    code, out, err = run(capsys, "fill", f"{path}:1:1", "--model", str(model_dirs["diffill"]), "--json",
                         "--max-tokens", "4", "--no-gate")
    assert code == 0, err
    assert json.loads(out)["steps"] >= 1


def test_five_megabyte_file_fills(capsys, tmp_path, model_dirs):
    path = tmp_path / "big.py"
    path.write_text("def f(x):\n    return x + 1\n\n" * 190_000 + "y = \n")
    lines = 190_000 * 3 + 1
    code, out, err = run(capsys, "fill", f"{path}:{lines}:5", "--model", str(model_dirs["diffill"]), "--json",
                         "--max-tokens", "4")
    assert code == 0, err


@pytest.mark.parametrize("kind", ["missing", "corrupt"])
def test_missing_or_corrupt_model_is_a_clear_error(capsys, source, tmp_path, kind):
    model = tmp_path / "model"
    if kind == "corrupt":
        model.mkdir()
        (model / "config.json").write_text("{")
    code, _, err = run(capsys, "fill", f"{source}:1:1", "--model", str(model))
    assert code == 2
    assert ("does not exist" if kind == "missing" else "not valid JSON") in err


def test_unknown_language_uses_the_bracket_check(capsys, tmp_path, model_dirs):
    path = tmp_path / "notes.weird"
    path.write_text("call(")
    code, out, err = run(capsys, "fill", f"{path}:1:6", "--model", str(model_dirs["diffill"]), "--json",
                         "--max-tokens", "4")
    assert code == 0, err
    report = json.loads(out)
    checked = report["candidates"] + report["rejected"]
    assert checked and all(c["checker"] == "lexical" for c in checked)


@pytest.mark.parametrize("option, value, message", [
    ("--steps", "0", "steps must be an integer >= 1"),
    ("--canvas-refresh", "-1", "canvas_refresh must be an integer >= 0, 0 for off"),
])
def test_invalid_sampler_option_is_a_clear_error(capsys, source, model_dirs, option, value, message):
    code, _, err = run(capsys, "fill", f"{source}:1:1", "--model", str(model_dirs["diffill"]), option, value)
    assert code == 2 and message in err


def test_console_script_reads_standard_input(model_dirs):
    completed = subprocess.run(
        [sys.executable, "-m", "diffill", "fill", "-", "--hole", "@@", "--model",
         str(model_dirs["diffill"]), "--json", "--max-tokens", "4", "--no-gate"],
        input="x = @@\n", capture_output=True, text=True, timeout=300,
        env={**os.environ, "PYTHONPATH": os.getcwd()},
    )
    assert completed.returncode == 0, completed.stderr
    assert json.loads(completed.stdout)["steps"] >= 1


def test_doctor_reports_each_part(capsys, model_dirs):
    code, out, err = run(capsys, "doctor", "--model", str(model_dirs["diffill"]), "--json")
    report = json.loads(out)
    assert code == 0, err
    assert report["model"]["ok"] and report["model"]["family"] == "diffill"
    assert report["tokenizer"]["mask id"] is not None
    assert report["grammars"]["python"].startswith("tree-sitter")
    assert report["device"]["device"] in ("cpu", "cuda")


def test_doctor_reports_a_broken_model(capsys, tmp_path):
    code, out, _ = run(capsys, "doctor", "--model", str(tmp_path / "nope"), "--json")
    assert code == 1
    assert "does not exist" in json.loads(out)["model"]["error"]


def test_a_time_budget_cuts_the_fill_short_and_says_so(capsys, source, model_dirs):
    """--budget-ms 0: one denoising pass, the rest takes the model's best guess; the user is told."""
    target, model = f"{source}:5:17", str(model_dirs["diffill"])
    code, out, err = run(capsys, "fill", target, "--model", model, "--json", "--max-tokens", "8", "--budget-ms", "0")
    assert code == 0, err
    report = json.loads(out)
    assert report["steps"] == 1 and report["stats"]["over_budget"] is True
    _, _, err = run(capsys, "fill", target, "--model", model, "--max-tokens", "8", "--budget-ms", "0", "--no-gate")
    assert "the 0 ms budget ran out" in err
    _, out, err = run(capsys, "fill", target, "--model", model, "--json", "--max-tokens", "8")
    assert json.loads(out)["stats"]["over_budget"] is False and "budget" not in err


def test_a_sampler_variant_applies_and_the_own_options_win(capsys, source, model_dirs):
    """threshold=0 commits every position in the first pass; --threshold 1.0 over it commits one a pass."""
    target, model = f"{source}:5:17", str(model_dirs["diffill"])
    steps = {}
    for extra in ([], ["--threshold", "1.0"]):
        code, out, err = run(capsys, "fill", target, "--model", model, "--json", "--no-gate", "--max-tokens", "8",
                             "--variant", "threshold=0,settle_tail=false,confidence_threshold=0", *extra)
        assert code == 0, err
        steps[bool(extra)] = json.loads(out)["steps"]
    assert steps[False] == 1 and steps[True] >= 2


@pytest.mark.parametrize("option, message", [
    (["--variant", "threshold=2"], "threshold must be within 0..1"),
    (["--variant", "speed=fast"], "a sampler override is KEY=VALUE"),
    (["--budget-ms", "-5"], "--budget-ms must be an integer >= 0"),
])
def test_bad_fill_options_are_refused_before_the_model_loads(capsys, source, option, message):
    code, _, err = run(capsys, "fill", f"{source}:5:17", "--model", "/nonexistent/model", *option)
    assert code == 2 and message in err and "Traceback" not in err


def test_a_reader_that_goes_away_stops_the_output_quietly():
    """`diffill models | head -1`: the pipe closes before the table is written; no traceback, the pipe's status."""
    child = subprocess.Popen([sys.executable, "-m", "diffill", "models"], stdout=subprocess.PIPE,
                             stderr=subprocess.PIPE)
    child.stdout.close()  # the reader is gone before the command writes anything
    _, stderr = child.communicate(timeout=120)
    assert child.returncode == 141, stderr.decode()
    assert b"Traceback" not in stderr and b"BrokenPipeError" not in stderr
