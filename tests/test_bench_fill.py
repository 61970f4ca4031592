"""`diffill bench fill` end to end on a tiny model: every span kind and sampler variant reported, JSON written."""

from __future__ import annotations

import json

import pytest

from diffill.cli import main
from infill_engine.bench import fill_cases, sampler_variant
from infill_engine.sampler import SamplerConfig
from tests.test_evaluation import PROBLEMS, bench_file  # noqa: F401 - the fixture


def test_bench_fill_reports_each_span_and_variant_and_writes_json(capsys, bench_file, model_dirs,  # noqa: F811
                                                                   tmp_path):
    out = tmp_path / "fill.json"
    code = main(["bench", "fill", "--data", str(bench_file), "--model", str(model_dirs["diffill"]), "--sample", "2",
                 "--spans", "line", "4000", "--variant", "settle_tail=false", "--variant", "", "--json",
                 "--out", str(out), "--threads", "1"])
    assert code == 0
    report = json.loads(capsys.readouterr().out)
    assert json.loads(out.read_text()) == report
    assert report["holes"] == len(PROBLEMS) and report["matmul_peak_gflops"] > 0
    assert report["threads"] == 1 and report["compiled_layers"] == "off"  # what ran: the suite keeps them off
    assert report["dtype"] == "float32" and "bfloat16_matmul_peak_gflops" not in report
    measured = [(r["span"], r["variant"]) for r in report["rows"] if "skipped" not in r]
    assert measured == [("line", "settle_tail=false"), ("line", "defaults")]
    assert [r["span"] for r in report["rows"] if "skipped" in r] == ["4000"]  # more than the model's positions
    for row in report["rows"][:2]:
        assert set(row["ms_stages_median"]) == {"tokenize", "encode", "denoise", "gate", "repair"}
        assert row["forward_passes_median"] >= row["loop_steps_median"] >= 1
        assert row["gflop_per_forward"] > 0 and row["gflops_steps"] > 0
        assert row["canvas_positions_per_forward"] >= row["tokens_per_forward"]  # a row holds more than its text


def test_bench_fill_of_a_mixed_model_gives_its_share_of_the_bfloat16_peak_too(capsys, bench_file,  # noqa: F811
                                                                               model_dirs):
    code = main(["bench", "fill", "--data", str(bench_file), "--model", str(model_dirs["diffill"]), "--sample", "1",
                 "--spans", "line", "--dtype", "mixed", "--json", "--threads", "1"])
    assert code == 0
    report = json.loads(capsys.readouterr().out)
    assert report["dtype"] == "mixed" and report["bfloat16_matmul_peak_gflops"] > 0
    [row] = report["rows"]
    ratio = report["matmul_peak_gflops"] / report["bfloat16_matmul_peak_gflops"]
    assert row["share_of_bfloat16_peak_steps"] == pytest.approx(row["share_of_peak_steps"] * ratio, abs=2e-3)


def test_bench_fill_names_a_bad_span_or_variant(capsys, bench_file, model_dirs):  # noqa: F811
    args = ["bench", "fill", "--data", str(bench_file), "--model", str(model_dirs["diffill"])]
    assert main(args + ["--spans", "lines"]) == 2
    assert "'line' or a number of positions" in capsys.readouterr().err
    assert main(args + ["--variant", "tail=1"]) == 2
    assert "KEY one of steps" in capsys.readouterr().err


@pytest.mark.parametrize("text, expected", [
    ("settle_tail=false,tail_floor=0.3", {"settle_tail": False, "tail_floor": 0.3}),
    ("steps=8, commit=schedule", {"steps": 8, "commit": "schedule"}),
])
def test_sampler_variants_override_fields_with_their_types(text, expected):
    config = sampler_variant(text, SamplerConfig())
    assert {key: getattr(config, key) for key in expected} == expected
    assert [c.name for c in fill_cases(["line", "64"])] == ["line", "64"]


def test_bench_fill_after_a_keystroke_encodes_only_what_the_key_changed(capsys, bench_file, tmp_path):  # noqa: F811
    """With a causal-context model the fill after the key before reuses that prefix's keys and values."""
    from tests import tiny_models

    directory = tiny_models.build_diffill(tmp_path / "causal")
    config = json.loads((directory / "config.json").read_text())
    (directory / "config.json").write_text(json.dumps({**config, "shift_logits": True, "causal_context": True}))
    encoded = {}
    for flag in ([], ["--after-keystroke"]):
        args = ["bench", "fill", "--data", str(bench_file), "--model", str(directory), "--sample", "2",
                "--spans", "16", "--json", "--threads", "1"]
        assert main(args + flag) == 0
        report = json.loads(capsys.readouterr().out)
        assert report["after_keystroke"] == bool(flag)
        (row,) = report["rows"]
        assert 0 < row["positions_per_pass"] <= 16
        encoded[bool(flag)] = row["context_positions_encoded_median"]
    assert 0 < encoded[True] < encoded[False]


def test_forward_cost_separates_the_projection_that_open_columns_alone_pay_for(tmp_path):
    """The embedded model's passes project only the open columns: the bench counts the projection per position
    (2 x hidden x vocabulary FLOPs), so a pass over a few columns is not credited with the whole canvas's."""
    from infill_engine.bench import forward_cost
    from infill_engine.engine import InfillEngine
    from infill_engine.interface import ModelSpec
    from tests import tiny_models

    engine = InfillEngine.load(ModelSpec(path=str(tiny_models.build_diffill(tmp_path / "diffill"))))
    config = engine.denoiser.model.config
    flops, ms, head = forward_cost(engine, "def add(a, b):\n    return ", "\n", 8, 2, repeats=1)
    assert head == 2 * config.hidden_size * config.vocab_size
    assert 2 * 8 * head < flops and ms > 0  # the layers cost the rest


def test_bench_fill_counts_the_canvas_positions_the_layers_ran_over(capsys, bench_file, model_dirs):  # noqa: F811
    """Between refreshes the embedded model's steps run the layers over the open and just-changed positions only:
    the bench reports it per pass (and counts those FLOPs, not the whole canvas's)."""
    args = ["bench", "fill", "--data", str(bench_file), "--model", str(model_dirs["diffill"]), "--sample", "2",
            "--spans", "16", "--variant", "canvas_refresh=0", "--variant", "canvas_refresh=8", "--json",
            "--threads", "1"]
    assert main(args) == 0
    every, kept = json.loads(capsys.readouterr().out)["rows"]
    assert every["layer_positions_per_pass"] == 16
    assert every["loop_steps_median"] > 1 and kept["layer_positions_per_pass"] < 16


def test_single_line_cases_leave_the_hole_s_line_break_in_the_document(tokenizer):
    """A single-line fill stops before its line break; where the benchmark's middle ends its line, that break stays
    after the cursor, as in an editor. A model that writes the true line then passes the syntax gate; joined to the
    next line, the same fill would be a syntax error, repaired and rejected."""
    from infill_engine.bench import bench_fill, ghost_text_hole
    from infill_engine.engine import InfillEngine
    from tests.scripted import ScriptedDenoiser

    prefix, middle, suffix = "def f(t):\n", "    return t\n", "x = 1\n"
    engine = InfillEngine(ScriptedDenoiser(tokenizer, [middle]))
    line = fill_cases(["line"])
    assert ghost_text_hole(prefix, suffix, middle) == (prefix, "\n" + suffix)
    assert ghost_text_hole(prefix, suffix, "    return t") == (prefix, suffix)  # a middle inside its line
    (joined,) = bench_fill(engine, [(prefix, suffix)], line)["rows"]
    (kept,) = bench_fill(engine, [(prefix, suffix)], line, line_holes=[ghost_text_hole(prefix, suffix, middle)])["rows"]
    assert joined["with_suggestion"] == 0 and joined["repairs_mean"] > 0
    assert kept["with_suggestion"] == 1 and kept["repairs_mean"] == 0
