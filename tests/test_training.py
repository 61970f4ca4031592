"""Tests of the training pipeline: corpus filters, tokenizer round trip, objective layout, resumable training."""

from __future__ import annotations

import gzip
import json
import logging
import os
import random
import re
import shutil
from dataclasses import replace
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file

from infill_engine.canvas import layout_canvas, trim_context
from infill_engine.diffill_model.modeling_diffill import IGNORE_INDEX
from infill_engine.special_tokens import END_OF_SPAN_TOKEN, END_OF_TEXT_TOKEN, MASK_TOKEN, PAD_TOKEN
from infill_engine.training import corpus as corpus_module
from infill_engine.training import depth_growth
from infill_engine.training.checkpoints import latest_checkpoint, list_checkpoints
from infill_engine.training.corpus import build_corpus, read_corpus, word_shingles
from infill_engine.training.objective import (
    HOLE_KINDS,
    Hole,
    ObjectiveConfig,
    build_example,
    collate,
    make_example,
    sample_hole,
    span_tokens,
)
from infill_engine.training.tokenizer_training import SPECIAL_TOKENS, train_tokenizer
from infill_engine.diffill_model import DiffillForInfilling
from infill_engine.training.config import TrainConfig
from infill_engine.training.loss_log import iter_log
from infill_engine.training.run_directory import prepare_run
from infill_engine.training.train import train
from tests import tiny_models

# Real code to train on: small standard-library modules, the same in every Python.
STDLIB_MODULES = ("textwrap", "colorsys", "bisect", "heapq", "shlex", "fnmatch", "glob", "copy", "numbers", "string")

WHITESPACE_SAMPLES = [
    "def f(x):\n\tif x:\n\t\treturn x\n",  # tabs
    "class A:\n    def m(self):\n        return 1\n",  # 4- and 8-space indents
    "x = 1    \ny = 2 \t \n\n\n",  # trailing spaces and tabs, blank lines
    "a = 1\r\nb = 2\r\n\r\n",  # CRLF line ends
    "s = 'héllo wörld ✓ 日本語 😀'  # ünïcödé\n",  # non-ASCII
    "    \n  \t  \n",  # whitespace only
    " leading space and\u00a0no-break space\u2028line separator",
]


@pytest.fixture(scope="module")
def source_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A directory of real Python files."""
    return tiny_models.copy_stdlib_sources(tmp_path_factory.mktemp("sources"), STDLIB_MODULES)


@pytest.fixture(scope="module")
def tokenizer(source_dir: Path):
    """A small byte-level BPE tokenizer trained on the source files."""
    return train_tokenizer((p.read_text() for p in sorted(source_dir.glob("*.py"))), vocab_size=400)


def tiny_config(run_dir: Path, source_dir: Path, **overrides) -> TrainConfig:
    """A run of the tiny preset on the test sources, without the progress bar."""
    settings = dict(
        run_dir=run_dir, sources=(str(source_dir),), use_stdlib=False, bench_path=str(run_dir / "no-bench.gz"),
        preset="tiny", steps=6, batch_size=3, seq_len=80, vocab_size=400, checkpoint_every=2, eval_every=3,
        eval_batches=1, log_every=1, progress=False,
    )
    settings.update(overrides)
    return TrainConfig(**settings)


@pytest.fixture(scope="module")
def prepared_run(tmp_path_factory: pytest.TempPathFactory, source_dir: Path) -> Path:
    """A run directory with its corpus and tokenizer written, and no checkpoint yet (copy it before training)."""
    run_dir = tmp_path_factory.mktemp("prepared") / "run"
    prepare_run(tiny_config(run_dir, source_dir).resolved())
    return run_dir


def copy_run(prepared: Path, destination: Path) -> Path:
    """A fresh copy of the prepared run directory."""
    shutil.copytree(prepared, destination)
    return destination


# ------------------------------------------------------------------------------------------------- tokenizer


@pytest.mark.parametrize("text", WHITESPACE_SAMPLES)
def test_tokenizer_round_trips_whitespace_exactly(tokenizer, text: str, tmp_path: Path) -> None:
    from transformers import AutoTokenizer

    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    assert tokenizer.decode(ids) == text
    tokenizer.save_pretrained(tmp_path)
    reloaded = AutoTokenizer.from_pretrained(tmp_path)
    assert reloaded(text, add_special_tokens=False)["input_ids"] == ids
    assert reloaded.decode(ids, skip_special_tokens=True) == text


def test_tokenizer_registers_the_special_tokens(tokenizer) -> None:
    vocab = tokenizer.get_vocab()
    assert all(token in vocab for token in SPECIAL_TOKENS)
    assert tokenizer.pad_token == PAD_TOKEN and tokenizer.mask_token == MASK_TOKEN
    assert tokenizer.eos_token == END_OF_TEXT_TOKEN
    tokens = span_tokens(tokenizer)
    assert tokens.end_of_span_id == vocab[END_OF_SPAN_TOKEN]
    assert len({tokens.mask_id, tokens.end_of_span_id, tokens.pad_id, tokenizer.eos_token_id}) == 4
    assert not {vocab[t] for t in SPECIAL_TOKENS} & set(tokens.ordinary_ids)


# ------------------------------------------------------------------------------------------------- corpus


def write_fake_bench(path: Path, problems: list[tuple[str, str, str]]) -> Path:
    """A gzip JSONL benchmark of (prompt, canonical_solution, suffix) problems."""
    with gzip.open(path, "wt", encoding="utf-8") as handle:
        for prompt, middle, suffix in problems:
            handle.write(json.dumps({"prompt": prompt, "canonical_solution": middle, "suffix": suffix}) + "\n")
    return path


BENCH_PROMPT = (
    "def has_close_elements(numbers, threshold):\n"
    '    """Check if in given list of numbers, are any two numbers closer to each other than given threshold."""\n'
)


def test_corpus_filters_each_kind_of_bad_file(tmp_path: Path) -> None:
    source = tmp_path / "src"
    (source / "pkg" / "tests" / "data").mkdir(parents=True)
    (source / "site-packages").mkdir()
    good = "def add(a, b):\n    return a + b\n"
    (source / "good.py").write_text(good)
    (source / "pkg" / "copy_of_good.py").write_text(good)  # duplicate content
    (source / "pkg" / "tests" / "data" / "sample.py").write_text("x = 1\n")  # test data is kept
    (source / "gen.py").write_text("# This file was automatically generated.\nx = 1\n")
    (source / "edit.js").write_text("// Copyright\n// DO NOT EDIT\nvar x = 1;\n")
    (source / "min.js").write_text("var a=1;" * 100 + "\n")  # one 800-character line
    (source / "wide.py").write_text(("y = " + "1 + " * 40 + "1\n") * 10)  # mean line length above 120
    (source / "latin1.py").write_bytes("name = 'café'\n".encode("latin-1"))
    (source / "huge.py").write_text("x = 1\n" * 40_000)  # 240 KB
    (source / "empty.py").write_text("\n\n")
    (source / "notes.txt").write_text("not a source file\n")
    (source / "site-packages" / "third_party.py").write_text("z = 3\n")
    leaked = "import math\n\n" + BENCH_PROMPT + "    return True\n"
    (source / "leak.py").write_text(leaked)
    bench = write_fake_bench(tmp_path / "bench.jsonl.gz", [(BENCH_PROMPT, "    return True\n", "")])

    corpus = build_corpus([source], bench)

    kept = sorted(Path(d.path).name for d in corpus.documents)
    assert kept == ["good.py", "sample.py"]
    dropped = corpus.manifest.dropped
    assert dropped["duplicate"] == 1
    assert dropped["generated"] == 2
    assert dropped["minified"] == 2
    assert dropped["non_utf8"] == 1
    assert dropped["huge"] == 1
    assert dropped["empty"] == 1
    assert dropped["bench_overlap"] == 1
    assert corpus.manifest.bench["files_dropped"] == 1
    assert corpus.manifest.bench["distinct_shingles_matched"] > 0
    assert corpus.manifest.bench["example_files"][0]["path"].endswith("leak.py")
    assert corpus.manifest.files == 2 and corpus.manifest.bytes == len(good) + len("x = 1\n")


def test_bench_overlap_needs_a_whole_13_word_run(tmp_path: Path) -> None:
    source = tmp_path / "src"
    source.mkdir()
    words = BENCH_PROMPT.split()
    (source / "twelve.py").write_text("# " + " ".join(words[:12]) + "\nx = 1\n")  # 12 shared words: kept
    (source / "thirteen.py").write_text("# " + " ".join(words[3:16]) + "\nx = 2\n")  # 13 shared words: dropped
    bench = write_fake_bench(tmp_path / "bench.jsonl.gz", [(BENCH_PROMPT, "    return True\n", "")])

    corpus = build_corpus([source], bench)

    assert [Path(d.path).name for d in corpus.documents] == ["twelve.py"]
    assert len(word_shingles(BENCH_PROMPT + "    return True\n")) == corpus.manifest.bench["shingles"]


def test_missing_bench_file_warns_and_skips_the_check(tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    source = tmp_path / "src"
    source.mkdir()
    (source / "a.py").write_text("x = 1\n")
    with caplog.at_level(logging.WARNING, logger=corpus_module.__name__):
        corpus = build_corpus([source], tmp_path / "absent.jsonl.gz")
    assert corpus.manifest.files == 1 and corpus.manifest.bench["checked"] is False
    assert "NOT checked" in caplog.text


def test_corpus_holds_out_documents_for_evaluation(source_dir: Path, tmp_path: Path) -> None:
    corpus = build_corpus([source_dir], tmp_path / "absent.gz")
    assert corpus.split("train") and corpus.split("eval")
    assert len(corpus.split("train")) + len(corpus.split("eval")) == len(STDLIB_MODULES)


# ------------------------------------------------------------------------------------------------- objective


def test_example_uses_the_serving_layout_and_labels_only_the_span(tokenizer) -> None:
    tokens = span_tokens(tokenizer)
    config = ObjectiveConfig(seq_len=120, max_span_tokens=40, full_span_prob=0.0, replace_prob=0.3)
    hole = Hole(prefix="def add(a, b):\n    total = a + b\n", middle="    return total\n",
                suffix="\n\nprint(add(1, 2))\n", kind="line")
    for seed in range(20):
        example = build_example(tokenizer, hole, random.Random(seed), tokens, config)
        trimmed = trim_context(tokenizer, hole.prefix, hole.suffix, example.context)
        assert example.canvas == layout_canvas(trimmed.prefix_ids, example.canvas.span_length, trimmed.suffix_ids)
        start, end = example.canvas.span_start, example.canvas.suffix_start
        assert example.input_ids[:start] == trimmed.prefix_ids
        assert example.input_ids[end:] == trimmed.suffix_ids
        assert all(label == IGNORE_INDEX for label in example.labels[:start] + example.labels[end:])
        assert all(weight == 0.0 for weight in example.loss_weights[:start] + example.loss_weights[end:])
        middle_ids = tokenizer(hole.middle, add_special_tokens=False)["input_ids"]
        assert example.labels[start : start + len(middle_ids)] == middle_ids
        extra = end - start - len(middle_ids)
        assert example.labels[start + len(middle_ids) : end] == [tokens.end_of_span_id] * extra
        assert len(example.input_ids) <= config.seq_len


def test_span_extends_past_the_middle_with_end_of_span_targets(tokenizer) -> None:
    tokens = span_tokens(tokenizer)
    config = ObjectiveConfig(seq_len=120, max_span_tokens=40, full_span_prob=0.0)
    hole = Hole(prefix="x = 1\n", middle="y = 2\n", suffix="z = 3\n", kind="line")
    extras = set()
    for seed in range(60):
        example = build_example(tokenizer, hole, random.Random(seed), tokens, config)
        extras.add(example.canvas.span_length - example.middle_length)
    assert 0 in extras and max(extras) > 10  # sometimes exact, often longer: the model learns to end spans
    full = build_example(tokenizer, hole, random.Random(0), tokens, replace(config, full_span_prob=1.0))
    assert full.canvas.span_length == config.max_span_tokens  # serving's default request shape


def test_end_weight_weighs_the_position_where_the_middle_ends(tokenizer) -> None:
    tokens = span_tokens(tokenizer)
    hole = Hole(prefix="values = [1, 2]\n", middle="total = sum(values)\n", suffix="print(total)\n", kind="line")
    plain, weighted = ObjectiveConfig(seq_len=120, max_span_tokens=40), ObjectiveConfig(seq_len=120, max_span_tokens=40,
                                                                                        end_weight=4.0)
    saw_end = 0
    for seed in range(20):
        a = build_example(tokenizer, hole, random.Random(seed), tokens, plain)
        b = build_example(tokenizer, hole, random.Random(seed), tokens, weighted)
        assert a.input_ids == b.input_ids and a.labels == b.labels  # the same draw: only the weights differ
        boundary = a.canvas.span_start + a.middle_length
        for position, (wa, wb) in enumerate(zip(a.loss_weights, b.loss_weights)):
            if position == boundary and boundary < a.canvas.suffix_start:
                assert a.labels[position] == tokens.end_of_span_id and wb == pytest.approx(4.0 * wa)
                saw_end += 1
            else:
                assert wb == wa  # the middle, the end-of-span positions after the first, the context
    assert saw_end > 10  # most spans have end-of-span positions after the middle
    with pytest.raises(ValueError, match="end_weight"):
        ObjectiveConfig(end_weight=0.0)


def test_end_weight_reaches_the_objective_and_not_the_twin(tmp_path: Path) -> None:
    assert TrainConfig(run_dir=tmp_path, end_weight=4.0).resolved().objective.end_weight == 4.0
    with pytest.raises(ValueError, match="--end-weight"):
        TrainConfig(run_dir=tmp_path, end_weight=4.0, autoregressive=True)


def test_masked_positions_carry_weight_one_over_t(tokenizer) -> None:
    tokens = span_tokens(tokenizer)
    config = ObjectiveConfig(seq_len=120, max_span_tokens=40, replace_prob=0.5)
    hole = Hole(prefix="for i in range(10):\n", middle="    print(i, i * i)\n", suffix="done()\n", kind="line")
    saw_replacement = saw_mask = False
    for seed in range(30):
        example = build_example(tokenizer, hole, random.Random(seed), tokens, config)
        start, end = example.canvas.span_start, example.canvas.suffix_start
        for position in range(start, end):
            token, label, weight = example.input_ids[position], example.labels[position], example.loss_weights[position]
            assert label != IGNORE_INDEX
            if token == tokens.mask_id:
                saw_mask = True
                assert weight == pytest.approx(1.0 / example.mask_rate)
            else:
                assert weight == 1.0
                saw_replacement |= token != label
    assert saw_mask and saw_replacement


def test_holes_cover_lines_blocks_and_token_runs(tokenizer, source_dir: Path) -> None:
    document = (source_dir / "textwrap.py").read_text()
    config = ObjectiveConfig(seq_len=160, max_span_tokens=64)
    rng = random.Random(0)
    kinds = set()
    for _ in range(200):
        hole = sample_hole(document, rng, tokenizer, config)
        kinds.add(hole.kind)
        assert hole.prefix + hole.middle + hole.suffix == document
        assert hole.middle
        assert 1 <= len(tokenizer(hole.middle, add_special_tokens=False)["input_ids"]) <= config.max_span_tokens
        if hole.kind in ("line", "block") and hole.prefix:
            assert hole.prefix.endswith("\n")  # whole lines start at a line start
    assert kinds == set(HOLE_KINDS)


def test_training_forward_sees_what_serving_computes(tokenizer, source_dir: Path) -> None:
    """The span logits of the one-pass training forward equal the adapter's cached encode + predict."""
    from infill_engine.adapters.diffill import DiffillDenoiser
    from infill_engine.special_tokens import resolve_special_tokens
    from infill_engine.training.config import PRESETS
    from infill_engine.training.run_directory import build_model

    tokens = span_tokens(tokenizer)
    config = ObjectiveConfig(seq_len=120, max_span_tokens=40)
    torch.manual_seed(0)
    model = build_model(PRESETS["tiny"], tokenizer, config.seq_len).eval()
    denoiser = DiffillDenoiser(model, tokenizer, resolve_special_tokens(tokenizer, model.config), "memory")
    document = (source_dir / "heapq.py").read_text()
    examples = [make_example(tokenizer, document, random.Random(seed), tokens, config) for seed in range(3)]
    batch = collate(examples, tokens.pad_id)
    with torch.no_grad():
        logits = model(**{k: v for k, v in batch.items() if k not in ("labels", "loss_weights")}).logits
    for row, example in enumerate(examples):
        canvas = example.canvas
        assert batch["attention_mask"][row].sum() == len(example.input_ids)
        assert not batch["attention_mask"][row, len(example.input_ids) :].any()
        context = denoiser.encode(canvas.prefix_ids, canvas.suffix_ids, canvas.span_length, 1)
        span = torch.tensor([example.input_ids[canvas.span_start : canvas.suffix_start]])
        served = denoiser.predict(context, span)[0]  # (N, V)
        trained = logits[row, canvas.span_start : canvas.suffix_start]
        torch.testing.assert_close(trained, served, atol=1e-4, rtol=1e-4)


# ------------------------------------------------------------------------------------------------- training


def test_interrupted_and_resumed_run_ends_with_the_same_weights(prepared_run: Path, source_dir: Path,
                                                               tmp_path: Path) -> None:
    straight = copy_run(prepared_run, tmp_path / "straight")
    result = train(tiny_config(straight, source_dir))
    assert result.stopped_by == "steps" and result.step == 6

    interrupted = copy_run(prepared_run, tmp_path / "interrupted")
    first = train(tiny_config(interrupted, source_dir, stop_at_step=3))
    assert first.stopped_by == "stop_at_step" and first.step == 3
    assert latest_checkpoint(interrupted).name == "step-00000003"
    second = train(tiny_config(interrupted, source_dir))
    assert second.stopped_by == "steps" and second.step == 6

    straight_weights = load_file(latest_checkpoint(straight) / "model.safetensors")
    resumed_weights = load_file(latest_checkpoint(interrupted) / "model.safetensors")
    assert straight_weights.keys() == resumed_weights.keys()
    for name, tensor in straight_weights.items():
        assert torch.equal(tensor, resumed_weights[name]), name
    # the loss log is continuous: one row per step, the same losses
    straight_log = [(r["step"], r["loss"]) for r in iter_log(straight)]
    resumed_log = [(r["step"], r["loss"]) for r in iter_log(interrupted)]
    assert [step for step, _ in straight_log] == [str(s) for s in range(1, 7)]
    assert resumed_log == straight_log
    assert len(list_checkpoints(straight)) == 2  # only the newest two are kept


def test_the_weight_average_follows_each_step_resumes_exactly_and_serves(prepared_run: Path, source_dir: Path,
                                                                         tmp_path: Path) -> None:
    from infill_engine.engine import InfillEngine, InfillRequest
    from infill_engine.loading import load_denoiser
    from infill_engine.training.weight_average import AVERAGE_DIRECTORY

    straight = copy_run(prepared_run, tmp_path / "straight")
    train(tiny_config(straight, source_dir, ema=0.5, checkpoint_every=1, keep_checkpoints=6))
    interrupted = copy_run(prepared_run, tmp_path / "interrupted")
    train(tiny_config(interrupted, source_dir, ema=0.5, stop_at_step=3))
    train(tiny_config(interrupted, source_dir, ema=0.5))

    def weights(directory: Path) -> dict[str, torch.Tensor]:
        return load_file(directory / "model.safetensors")

    steps = list_checkpoints(straight)
    assert [c.name for c in steps] == [f"step-{n:08d}" for n in range(1, 7)]
    before, last = weights(steps[-2] / AVERAGE_DIRECTORY), weights(steps[-1] / AVERAGE_DIRECTORY)
    trained = weights(steps[-1])
    moved = 0
    for name, tensor in last.items():  # average_6 = 0.5 average_5 + 0.5 weights_6
        torch.testing.assert_close(tensor, 0.5 * before[name] + 0.5 * trained[name])
        moved += not torch.equal(tensor, trained[name])
    assert moved > 0  # the average is not the trained weights
    resumed = weights(latest_checkpoint(interrupted) / AVERAGE_DIRECTORY)
    assert resumed.keys() == last.keys()
    for name, tensor in last.items():  # carried through the checkpoint, not started again from the weights at step 3
        assert torch.equal(tensor, resumed[name]), name
    averaged_losses = [r["eval_loss_average"] for r in iter_log(straight) if r["eval_loss"]]
    assert averaged_losses and all(float(loss) > 0 for loss in averaged_losses)

    denoiser = load_denoiser(steps[-1] / AVERAGE_DIRECTORY, device="cpu")  # a model directory as it stands
    result = InfillEngine(denoiser).fill(InfillRequest(prefix="def add(a, b):\n    return ", suffix="\n",
                                                       max_tokens=8, gate=False))
    assert result.stats.as_dict()["forward_passes"] >= 1


@pytest.mark.parametrize("decay", [1.0, -0.1, 2])
def test_a_weight_average_decay_outside_0_to_1_is_refused(decay: float) -> None:
    with pytest.raises(ValueError, match="such as 0.998"):
        TrainConfig(run_dir=Path("unused"), ema=decay)


def test_bfloat16_training_follows_float32_and_resumes_in_either(prepared_run: Path, source_dir: Path,
                                                                 tmp_path: Path) -> None:
    runs = {}
    for precision in ("float32", "bfloat16"):
        run_dir = copy_run(prepared_run, tmp_path / precision)
        result = train(tiny_config(run_dir, source_dir, precision=precision, dense=True))
        assert result.stopped_by == "steps" and result.step == 6
        runs[precision] = run_dir
    losses = {p: [float(r["loss"]) for r in iter_log(d)] for p, d in runs.items()}
    # the same batches, the same start: bfloat16 arithmetic changes the losses only in their rounding
    assert len(losses["bfloat16"]) == 6 and losses["bfloat16"] != losses["float32"]
    for low, full in zip(losses["bfloat16"], losses["float32"]):
        assert abs(low - full) <= 0.02 * full
    # weights and optimizer state stay float32, so a bfloat16 run resumes in float32 and the other way round
    weights = load_file(latest_checkpoint(runs["bfloat16"]) / "model.safetensors")
    assert {t.dtype for t in weights.values()} == {torch.float32}
    result = train(tiny_config(runs["bfloat16"], source_dir, precision="float32", dense=True, steps=8))
    assert result.step == 8 and result.eval_loss is not None


def test_a_bfloat16_run_on_the_cpu_caps_onednns_kernel_cache_and_keeps_a_users_cap(
        prepared_run: Path, source_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """Uncapped, oneDNN's cache of bfloat16 kernels (one per window length) grew a CPU run's memory to 12 GB."""
    from infill_engine.training.train import ONEDNN_CACHE_CAPACITY, ONEDNN_CACHE_VARIABLE

    monkeypatch.delenv(ONEDNN_CACHE_VARIABLE, raising=False)
    train(tiny_config(copy_run(prepared_run, tmp_path / "float32"), source_dir, precision="float32", steps=2))
    assert ONEDNN_CACHE_VARIABLE not in os.environ  # float32 products do not go through that cache
    train(tiny_config(copy_run(prepared_run, tmp_path / "bfloat16"), source_dir, precision="bfloat16", steps=2))
    assert os.environ[ONEDNN_CACHE_VARIABLE] == str(ONEDNN_CACHE_CAPACITY)
    monkeypatch.setenv(ONEDNN_CACHE_VARIABLE, "200")
    train(tiny_config(copy_run(prepared_run, tmp_path / "own"), source_dir, precision="bfloat16", steps=2))
    assert os.environ[ONEDNN_CACHE_VARIABLE] == "200"


def test_precision_auto_is_bfloat16_where_the_hardware_does_it(monkeypatch: pytest.MonkeyPatch) -> None:
    from infill_engine import device as device_module
    from infill_engine.training.train import trains_in_bfloat16

    cpu = torch.device("cpu")
    for hardware in (True, False):
        monkeypatch.setattr(device_module, "cpu_has_bfloat16", lambda hardware=hardware: hardware)
        assert trains_in_bfloat16(cpu, "auto") is hardware
        assert trains_in_bfloat16(cpu, "float32") is False and trains_in_bfloat16(cpu, "bfloat16") is True
    assert trains_in_bfloat16(torch.device("cuda"), "auto") is True
    with pytest.raises(ValueError, match="unknown precision 'half'; allowed: auto, float32, bfloat16"):
        TrainConfig(run_dir=Path("unused"), precision="half")


@pytest.mark.skipif(not any(shutil.which(name) for name in ("c++", "g++", "clang++")),
                    reason="no C++ compiler on this machine (torch.compile writes C++ on the CPU)")
def test_compiled_steps_follow_eager_ones_and_resume_either_way(prepared_run: Path, source_dir: Path,
                                                                 tmp_path: Path) -> None:
    runs = {}
    for compile_steps in ("off", "on"):
        run_dir = copy_run(prepared_run, tmp_path / compile_steps)
        result = train(tiny_config(run_dir, source_dir, precision="float32", dense=True, holes=2,
                                   compile=compile_steps))
        assert result.stopped_by == "steps" and result.step == 6
        runs[compile_steps] = run_dir
    losses = {c: [float(r["loss"]) for r in iter_log(d)] for c, d in runs.items()}
    # the same batches (padded to seq_len when compiled), the same start: the same losses but for rounding
    assert len(losses["on"]) == 6
    for compiled, eager in zip(losses["on"], losses["off"]):
        assert abs(compiled - eager) <= 1e-3 * eager
    eval_losses = [float(r["eval_loss"]) for d in runs.values() for r in iter_log(d) if r.get("eval_loss")]
    assert len(eval_losses) == 4 and abs(eval_losses[1] - eval_losses[3]) <= 1e-3 * eval_losses[1]
    # the checkpoint holds the model's own weights (no compiled wrapper's names): it resumes eagerly
    weights = load_file(latest_checkpoint(runs["on"]) / "model.safetensors")
    assert weights and not any("_orig_mod" in name for name in weights)
    result = train(tiny_config(runs["on"], source_dir, precision="float32", dense=True, holes=2, steps=8,
                               compile="off"))
    assert result.step == 8 and result.eval_loss is not None


@pytest.mark.skipif(not any(shutil.which(name) for name in ("c++", "g++", "clang++")),
                    reason="no C++ compiler on this machine (torch.compile writes C++ on the CPU)")
def test_compiled_steps_do_not_compile_again_for_each_batch(prepared_run: Path, source_dir: Path, tmp_path: Path,
                                                             monkeypatch: pytest.MonkeyPatch) -> None:
    """The labelled positions differ in number from batch to batch; a step that compiled again for each count (as
    the loss did inside the compiled graph) runs at a fraction of the compiled speed."""
    from torch._dynamo.utils import counters
    from infill_engine.training import train as train_module

    compiled_after: list[int] = []  # frames compiled so far, after each step
    labelled: list[int] = []
    step = train_module.train_step

    def counted(model, optimizer, scheduler, batch, *args, **kwargs):
        result = step(model, optimizer, scheduler, batch, *args, **kwargs)
        compiled_after.append(int(counters["frames"]["ok"]))
        labelled.append(int((batch["labels"] != IGNORE_INDEX).sum()))
        return result

    monkeypatch.setattr(train_module, "train_step", counted)
    torch._dynamo.reset()
    run_dir = copy_run(prepared_run, tmp_path / "run")
    train(tiny_config(run_dir, source_dir, precision="float32", dense=True, holes=2, steps=10, compile="on"))
    assert len(compiled_after) == 10 and len(set(labelled)) >= 6  # batches of many labelled counts
    compiling_steps = sum(1 for before, after in zip(compiled_after, compiled_after[1:]) if after > before)
    assert compiling_steps <= 1  # once at most: a batch with several holes' canvases is the graph's other variant


def test_a_step_that_fails_to_compile_runs_eagerly_and_the_run_goes_on(
        prepared_run: Path, source_dir: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch,
        caplog: pytest.LogCaptureFixture) -> None:
    from infill_engine.training import train as train_module

    def failing_compile(model):  # what a machine whose compiler breaks gives: an error at the first compiled call
        def call(**_):
            raise torch._dynamo.exc.TorchDynamoException("the C++ compiler failed")
        return call

    monkeypatch.setattr(train_module.torch, "compile", failing_compile)
    eager_dir, failing_dir = copy_run(prepared_run, tmp_path / "eager"), copy_run(prepared_run, tmp_path / "failing")
    train(tiny_config(eager_dir, source_dir, precision="float32", compile="off"))
    with caplog.at_level(logging.WARNING):
        result = train(tiny_config(failing_dir, source_dir, precision="float32", compile="on"))
    assert result.stopped_by == "steps" and result.step == 6
    assert "the compiled training step failed (the C++ compiler failed); the run goes on eagerly" in caplog.text
    # the failed step took no optimizer step: the run's losses are the eager run's, batch for batch
    failing, eager = ([float(r["loss"]) for r in iter_log(d)] for d in (failing_dir, eager_dir))
    assert len(failing) == len(eager) == 6
    assert all(abs(a - b) <= 1e-3 * b for a, b in zip(failing, eager))  # padded to seq_len: the same but for rounding


def test_compile_auto_is_for_long_cpu_runs_with_a_compiler(monkeypatch: pytest.MonkeyPatch) -> None:
    from infill_engine.training import train as train_module
    from infill_engine.training.train import COMPILE_MIN_STEPS, compiles_steps

    cpu, config = torch.device("cpu"), TrainConfig(run_dir=Path("unused"))
    for compiler in ("/usr/bin/g++", None):
        monkeypatch.setattr(train_module.shutil, "which", lambda name, compiler=compiler: compiler)
        assert compiles_steps(config, cpu, COMPILE_MIN_STEPS) is (compiler is not None)
        assert compiles_steps(config, cpu, COMPILE_MIN_STEPS - 1) is False  # a short run: the compile would not pay
        assert compiles_steps(config, torch.device("cuda"), 10_000) is False
        assert compiles_steps(replace(config, compile="on"), cpu, 1) is True
        assert compiles_steps(replace(config, compile="off"), cpu, 10_000) is False
    with pytest.raises(ValueError, match="unknown compile setting 'yes'; allowed: auto, on, off"):
        TrainConfig(run_dir=Path("unused"), compile="yes")


def test_a_leftover_partial_checkpoint_is_ignored(prepared_run: Path, source_dir: Path, tmp_path: Path) -> None:
    run_dir = copy_run(prepared_run, tmp_path / "run")
    train(tiny_config(run_dir, source_dir, stop_at_step=2))
    good = latest_checkpoint(run_dir)
    # a run killed while writing step 4: a temporary directory with half its files
    partial = run_dir / "checkpoints" / "step-00000004.tmp-k1ll"
    partial.mkdir()
    (partial / "config.json").write_text("{")
    (partial / "model-00001-of-00002.safetensors").write_bytes(b"\x00" * 10)
    assert latest_checkpoint(run_dir) == good

    result = train(tiny_config(run_dir, source_dir, stop_at_step=4))

    assert result.step == 4 and result.stopped_by == "stop_at_step"
    assert not partial.exists()
    assert [p.name for p in list_checkpoints(run_dir)] == ["step-00000002", "step-00000004"]


def test_time_limit_stops_with_a_checkpoint(prepared_run: Path, source_dir: Path, tmp_path: Path) -> None:
    run_dir = copy_run(prepared_run, tmp_path / "run")
    result = train(tiny_config(run_dir, source_dir, time_limit_minutes=1e-9, checkpoint_every=100))
    assert result.stopped_by == "time_limit" and result.step == 1
    assert latest_checkpoint(run_dir).name == "step-00000001"


def test_resume_flags_refuse_what_they_cannot_do(prepared_run: Path, source_dir: Path, tmp_path: Path) -> None:
    run_dir = copy_run(prepared_run, tmp_path / "run")
    with pytest.raises(ValueError, match="no complete checkpoint"):
        train(tiny_config(run_dir, source_dir, resume=True))
    train(tiny_config(run_dir, source_dir, stop_at_step=1))
    with pytest.raises(ValueError, match="already has checkpoints"):
        train(tiny_config(run_dir, source_dir, resume=False))


def test_checkpoint_loads_for_serving_and_fills(prepared_run: Path, source_dir: Path, tmp_path: Path) -> None:
    from infill_engine.engine import InfillEngine, InfillRequest
    from infill_engine.loading import load_denoiser

    run_dir = copy_run(prepared_run, tmp_path / "run")
    checkpoint = train(tiny_config(run_dir, source_dir, steps=2)).checkpoint
    assert list(checkpoint.glob("*.safetensors"))
    denoiser = load_denoiser(checkpoint, device="cpu")
    assert denoiser.family == "diffill"
    assert denoiser.special.mask_id == denoiser.tokenizer.mask_token_id
    assert denoiser.special.end_of_span_ids == (denoiser.tokenizer.convert_tokens_to_ids(END_OF_SPAN_TOKEN),)
    assert denoiser.max_positions == 80  # serving budgets its context to the trained sequence length

    result = InfillEngine(denoiser).fill(
        InfillRequest(prefix="def add(a, b):\n    return ", suffix="\n", max_tokens=8, gate=False)
    )
    assert result.stats.as_dict()["forward_passes"] >= 1
    assert all(isinstance(c.text, str) and c.token_ids for c in result.candidates)


def test_model_is_written_in_shards_of_at_most_16_mb(tmp_path: Path, tokenizer) -> None:
    from infill_engine.training.config import PRESETS
    from infill_engine.training.run_directory import build_model

    model = build_model(PRESETS["small"], tokenizer, 256)  # 400 tokens: about 4.8M parameters, 19 MB in float32
    model.save_pretrained(tmp_path, max_shard_size="16MB")
    shards = sorted(tmp_path.glob("*.safetensors"))
    assert len(shards) >= 2 and all(s.stat().st_size <= 16 * 1000**2 + 2**20 for s in shards)


def test_train_command_runs_from_the_cli(prepared_run: Path, source_dir: Path, tmp_path: Path) -> None:
    from diffill.cli import main

    run_dir = copy_run(prepared_run, tmp_path / "run")
    argv = ["train", "--run-dir", str(run_dir), "--no-stdlib", "--source", str(source_dir), "--preset", "tiny",
            "--steps", "2", "--batch-size", "2", "--seq-len", "80", "--checkpoint-every", "1", "--precision", "bfloat16"]
    assert main(argv) == 0
    assert latest_checkpoint(run_dir).name == "step-00000002"
    assert main(argv + ["--no-resume"]) == 2  # refused: the directory already has checkpoints
    assert read_corpus(run_dir).manifest.files == len(STDLIB_MODULES)


def test_a_run_told_extensions_trains_on_those_files_and_says_what_there_is(prepared_run: Path, source_dir: Path,
                                                                            tmp_path: Path, capsys) -> None:
    from diffill.cli import main
    from infill_engine.training.corpus import Corpus, CorpusManifest, Document

    documents = [Document(f"src/{name}", "x = 1\n", name, split) for name, split in
                 (("a.py", "train"), ("b.js", "train"), ("c.py", "eval"), ("d.py", "train"), ("e.ts", "train"))]
    corpus = Corpus(documents, CorpusManifest(sources=["src"]))
    assert [d.path for d in corpus.training_documents((".py",))] == ["src/a.py", "src/d.py"]
    assert [d.path for d in corpus.training_documents((".js", ".ts"))] == ["src/b.js", "src/e.ts"]
    assert len(corpus.training_documents()) == 4  # no extensions: the whole train split
    with pytest.raises(ValueError, match=r"no training file ends with \.rs; the corpus has: \.py \(2\), \.js \(1\)"):
        corpus.training_documents((".rs",))

    run_dir = copy_run(prepared_run, tmp_path / "run")  # the test sources are all Python
    with pytest.raises(ValueError, match=r"ends with \.js; the corpus has: \.py"):
        train(tiny_config(run_dir, source_dir, extensions=(".js",), steps=1))
    assert train(tiny_config(run_dir, source_dir, extensions=(".py",), steps=1)).step == 1
    argv = ["train", "--run-dir", str(tmp_path / "other"), "--no-stdlib", "--source", str(source_dir),
            "--preset", "tiny", "--extensions", "py"]
    assert main(argv) == 2 and "such as .py" in capsys.readouterr().err
    with pytest.raises(ValueError, match="starts with a dot"):
        TrainConfig(run_dir=tmp_path, extensions=("py",))


FUNCTIONS_MODULE = '''"""A module."""
import os
from typing import (
    List,
)

LIMIT = 3


@functools.cache
def mean(values: List[float]) -> float:
    """The mean of the values."""
    total = sum(values)
    return total / len(values)


def undocumented(values):
    return values


def only_a_docstring():
    """Nothing after it."""


def test_mean():
    """A test, not library code."""
    assert mean([1.0]) == 1.0


class Box:
    def method(self):
        """A method, not a top-level function."""
        return 2


def too_long():
    """Its body is longer than HumanEval's."""
''' + "    x = 1\n" * 31


def test_functions_trains_on_documented_functions_each_after_its_imports(prepared_run: Path, source_dir: Path,
                                                                         tmp_path: Path, tokenizer, caplog) -> None:
    from infill_engine.training.corpus import Document
    from infill_engine.training.example_stream import ExampleStream
    from infill_engine.training.function_documents import function_documents, functions_to_train_on

    windows_copy = FUNCTIONS_MODULE.replace("\n", "\r\n").replace("LIMIT = 3", "LIMIT = 3  # \x0c")
    documents = [Document("pkg/stats.py", FUNCTIONS_MODULE, "a"), Document("copy/stats.py", windows_copy, "b"),
                 Document("pkg/broken.py", "def (:\n", "c"), Document("web/x.js", "/** doc */ function f() {}\n", "d")]
    functions = function_documents(documents)
    # the copy's function (Windows line ends, a form feed above it) is the same text: kept once
    assert [d.path for d in functions] == ["pkg/stats.py::mean"]
    assert functions[0].text == (  # of the imports, only the name the function uses
        "from typing import List\n\n\n@functools.cache\n"
        "def mean(values: List[float]) -> float:\n    \"\"\"The mean of the values.\"\"\"\n"
        "    total = sum(values)\n    return total / len(values)\n"
    )
    assert functions[0].split == "train"
    with pytest.raises(ValueError, match=r"no top-level Python function .* in the 2 training files \(1 of them"):
        functions_to_train_on(documents[2:])
    assert functions_to_train_on(documents) == (functions, None)  # functions only: drawn by length, as files are
    # a mixture: a quarter of the examples from the (short) function, the rest from the files, whatever the lengths
    mixed, weights = functions_to_train_on(documents, share=0.25)
    assert mixed == documents + functions
    draws = ExampleStream(mixed, tokenizer, ObjectiveConfig(), seed=3, weights=weights)
    drawn = [draws.draw_document().path for _ in range(4000)]
    assert drawn.count("pkg/stats.py::mean") / len(drawn) == pytest.approx(0.25, abs=0.03)
    files_length = sum(len(d.text) for d in documents)  # the files in proportion to their length
    assert drawn.count("pkg/stats.py") / len(drawn) == pytest.approx(0.75 * len(FUNCTIONS_MODULE) / files_length,
                                                                    abs=0.03)
    for bad in (0, 1.5):
        with pytest.raises(ValueError, match=r"share of function documents must be in \(0, 1\]"):
            functions_to_train_on(documents, share=bad)
    with pytest.raises(ValueError, match="give --functions too"):
        TrainConfig(run_dir=tmp_path, function_share=0.5)

    run_dir = copy_run(prepared_run, tmp_path / "run")  # the test sources are standard-library modules
    caplog.set_level(logging.INFO, logger="infill_engine.training")
    assert train(tiny_config(run_dir, source_dir, functions=True, steps=1)).step == 1
    assert re.search(r"training on [1-9]\d* documented functions cut from \d+ training files", caplog.text)
    assert json.loads((run_dir / "run_config.json").read_text())["functions"] is True
    mixed_run = copy_run(prepared_run, tmp_path / "mixed")
    assert train(tiny_config(mixed_run, source_dir, functions=True, function_share=0.5, steps=1)).step == 1
    assert re.search(r"documented functions cut from \d+ training files for 50% of the examples, on the files", caplog.text)


def test_worker_processes_draw_documents_by_the_given_weights(tokenizer) -> None:
    from infill_engine.training.batch_workers import worker_batches
    from infill_engine.training.corpus import Document

    alpha = "".join(f"alpha_{i} = alpha_{i - 1} + 1\n" for i in range(1, 40))
    omega = "".join(f"omega_{i} = omega_{i - 1} * 2\n" for i in range(1, 40))
    documents = [Document("a.py", alpha, "a"), Document("o.py", omega, "o")]
    objective = ObjectiveConfig(seq_len=80, max_span_tokens=16)
    batches = worker_batches(documents, tokenizer, objective, batch_size=4, seed=5, start_step=0, dense=True,
                             workers=2, pin_memory=False, weights=[0.0, 1.0])
    texts = [tokenizer.decode(row, skip_special_tokens=True) for _ in range(4) for row in next(batches)["input_ids"]]
    assert len(texts) == 16 and all("omega" in text and "alpha" not in text for text in texts)


def test_line_share_sets_how_many_holes_are_lines(tokenizer, source_dir: Path, tmp_path: Path) -> None:
    objective = TrainConfig(run_dir=tmp_path, line_share=0.9).resolved().objective
    assert objective.line_prob == 0.9 and objective.block_prob == pytest.approx(0.06)  # blocks : token runs = 3 : 2
    assert TrainConfig(run_dir=tmp_path).resolved().objective.line_prob == ObjectiveConfig().line_prob
    document = (source_dir / "textwrap.py").read_text()
    rng = random.Random(0)
    shares = {}
    for share in (0.2, 0.9):
        config = replace(TrainConfig(run_dir=tmp_path, line_share=share).resolved().objective, seq_len=160)
        kinds = [sample_hole(document, rng, tokenizer, config).kind for _ in range(300)]
        shares[share] = sum(kind in ("line", "rest_of_line") for kind in kinds) / len(kinds)
    assert shares[0.9] > 0.8 and shares[0.2] < 0.35
    for bad in (1.5, -0.1):
        with pytest.raises(ValueError, match="line share"):
            TrainConfig(run_dir=tmp_path, line_share=bad)


def test_a_new_run_needs_data() -> None:
    with pytest.raises(ValueError, match="no training data"):
        TrainConfig(run_dir=Path("unused"), use_stdlib=False)
    with pytest.raises(ValueError, match="unknown preset"):
        TrainConfig(run_dir=Path("unused"), preset="huge")
    with pytest.raises(ValueError, match="max_span_tokens"):
        ObjectiveConfig(seq_len=64, max_span_tokens=64)


def test_a_new_run_can_start_from_a_trained_model(tmp_path, source_dir):
    from infill_engine.training.checkpoints import latest_checkpoint

    first = tmp_path / "first"
    train(tiny_config(first, source_dir, steps=2, checkpoint_every=2))
    trained = latest_checkpoint(first)
    second = tmp_path / "second"
    train(tiny_config(second, source_dir, steps=2, checkpoint_every=2, lr=1e-12, init_from=trained))
    before = DiffillForInfilling.from_pretrained(trained)
    after = DiffillForInfilling.from_pretrained(latest_checkpoint(second))
    assert all(torch.allclose(a, b, atol=1e-6) for a, b in zip(before.parameters(), after.parameters()))
    assert (second / "tokenizer" / "tokenizer.json").read_text() == (trained / "tokenizer.json").read_text()
    # a longer sequence than the start was trained at: its checkpoints say so, and serving budgets its context by it
    assert before.config.max_position_embeddings == 80
    longer = tmp_path / "longer"
    train(tiny_config(longer, source_dir, steps=2, checkpoint_every=2, seq_len=120, init_from=trained))
    assert DiffillForInfilling.from_pretrained(latest_checkpoint(longer)).config.max_position_embeddings == 120


def test_a_model_grown_deeper_gives_the_same_logits_and_its_new_blocks_train(tmp_path, source_dir, capsys):
    first = tmp_path / "first"
    train(tiny_config(first, source_dir, steps=2, checkpoint_every=2))
    trained = latest_checkpoint(first)
    deep_dir = tmp_path / "deep"
    assert depth_growth.main([str(trained), str(deep_dir), "--depth", "4"]) == 0
    shallow = DiffillForInfilling.from_pretrained(trained).eval()
    deep = DiffillForInfilling.from_pretrained(deep_dir).eval()
    assert (shallow.config.num_hidden_layers, deep.config.num_hidden_layers) == (2, 4)
    ids = torch.randint(5, shallow.config.vocab_size, (2, 60), generator=torch.Generator().manual_seed(0))
    canvas = torch.zeros_like(ids, dtype=torch.bool)
    canvas[:, 20:36] = True
    with torch.no_grad():
        assert torch.allclose(shallow(ids, canvas_mask=canvas).logits, deep(ids, canvas_mask=canvas).logits, atol=1e-6)
    assert (deep_dir / "tokenizer.json").read_text() == (trained / "tokenizer.json").read_text()
    # the added blocks (1 and 3) write nothing at first; a run started from the deeper model grows them
    grown = tmp_path / "grown"
    train(tiny_config(grown, source_dir, steps=2, checkpoint_every=2, init_from=deep_dir))
    after = DiffillForInfilling.from_pretrained(latest_checkpoint(grown))
    for index in (1, 3):
        assert not deep.layers[index].attn.o_proj.weight.any() and not deep.layers[index].mlp.down_proj.weight.any()
        assert after.layers[index].attn.o_proj.weight.any() and after.layers[index].mlp.down_proj.weight.any()
    # a depth that is not a whole multiple copies some blocks only (here the second), with the same logits
    assert depth_growth.main([str(trained), str(tmp_path / "odd"), "--depth", "3"]) == 0
    odd = DiffillForInfilling.from_pretrained(tmp_path / "odd").eval()
    assert odd.config.num_hidden_layers == 3 and not odd.layers[2].mlp.down_proj.weight.any()
    assert odd.layers[1].mlp.down_proj.weight.any()
    with torch.no_grad():
        assert torch.allclose(shallow(ids, canvas_mask=canvas).logits, odd(ids, canvas_mask=canvas).logits, atol=1e-6)
    # a depth no deeper than the model's is refused before anything is written
    capsys.readouterr()
    with pytest.raises(SystemExit) as refused:
        depth_growth.main([str(trained), str(tmp_path / "same"), "--depth", "2"])
    assert refused.value.code == 2 and "more than the model's 2 blocks" in capsys.readouterr().err
    assert not (tmp_path / "same").exists()


# ------------------------------------------------------------------------------------------------- dense supervision


def test_dense_labels_cover_the_context_and_never_read_the_canvas(tokenizer, source_dir: Path) -> None:
    """Every context token is a next-token target except position 0 and the suffix's first token."""
    from infill_engine.training.objective import next_token_targets

    tokens = span_tokens(tokenizer)
    config = ObjectiveConfig(seq_len=120, max_span_tokens=40)
    document = (source_dir / "heapq.py").read_text()
    example = make_example(tokenizer, document, random.Random(4), tokens, config)
    targets = next_token_targets(example)
    canvas = example.canvas
    assert targets[0] == IGNORE_INDEX
    assert all(t == IGNORE_INDEX for t in targets[canvas.span_start : canvas.suffix_start + 1])
    labelled = [i for i, t in enumerate(targets) if t != IGNORE_INDEX]
    assert labelled and all(targets[i] == example.input_ids[i] for i in labelled)
    context = [i for i in range(1, len(targets)) if not canvas.span_start <= i <= canvas.suffix_start]
    assert labelled == context


def test_dense_training_reads_causally_and_serves_the_same_logits(tokenizer, source_dir: Path) -> None:
    """A dense run's model is causal and shifted, its loss adds the context's, and serving computes what it trained."""
    from infill_engine.adapters.diffill import DiffillDenoiser
    from infill_engine.special_tokens import resolve_special_tokens
    from infill_engine.training.config import PRESETS
    from infill_engine.training.run_directory import build_model

    tokens = span_tokens(tokenizer)
    config = ObjectiveConfig(seq_len=120, max_span_tokens=40)
    torch.manual_seed(0)
    model = build_model(PRESETS["tiny"], tokenizer, config.seq_len, dense=True).eval()
    assert model.config.shift_logits and model.config.causal_context
    document = (source_dir / "heapq.py").read_text()
    examples = [make_example(tokenizer, document, random.Random(seed), tokens, config) for seed in range(3)]
    batch = collate(examples, tokens.pad_id, dense=True)
    span_only = {k: v for k, v in batch.items() if k != "next_token_labels"}
    with torch.no_grad():
        dense_loss = model(**batch, loss_only=True).loss
        span_loss = model(**span_only, loss_only=True).loss
        full = model(**batch)
    assert dense_loss > span_loss  # the next-token term is added, not averaged into the span's
    torch.testing.assert_close(full.loss, dense_loss, atol=1e-4, rtol=1e-4)
    denoiser = DiffillDenoiser(model, tokenizer, resolve_special_tokens(tokenizer, model.config), "memory")
    for row, example in enumerate(examples):
        canvas = example.canvas
        context = denoiser.encode(canvas.prefix_ids, canvas.suffix_ids, canvas.span_length, 1)
        span = torch.tensor([example.input_ids[canvas.span_start : canvas.suffix_start]])
        served = denoiser.predict(context, span)[0]  # (N, V)
        torch.testing.assert_close(full.logits[row, canvas.span_start : canvas.suffix_start], served,
                                   atol=1e-4, rtol=1e-4)


def test_a_dense_run_switches_a_trained_model_to_causal_reading(tmp_path, source_dir):
    first = tmp_path / "first"
    train(tiny_config(first, source_dir, steps=2, checkpoint_every=2))
    second = tmp_path / "second"
    result = train(tiny_config(second, source_dir, steps=2, checkpoint_every=2, dense=True,
                               init_from=latest_checkpoint(first)))
    trained = DiffillForInfilling.from_pretrained(result.checkpoint)
    assert trained.config.shift_logits and trained.config.causal_context


# ------------------------------------------------------------------------------------------------- several holes


def several_hole_examples(tokenizer, source_dir: Path, count: int = 6):
    """Examples of windows with two or three holes, from the test sources."""
    from infill_engine.training.objective import build_multi_hole_example

    tokens = span_tokens(tokenizer)
    config = ObjectiveConfig(seq_len=200, max_span_tokens=24, holes=3, max_extra_positions=4)
    document = (source_dir / "textwrap.py").read_text()
    examples, rng = [], random.Random(7)
    while len(examples) < count:
        example = build_multi_hole_example(tokenizer, document, rng.choice((2, 3)), rng, tokens, config)
        if example is not None:
            examples.append((example, document))
    return examples, tokens, config


def test_a_window_with_several_holes_labels_each_span_and_keeps_the_text_in_order(tokenizer, source_dir: Path):
    examples, tokens, config = several_hole_examples(tokenizer, source_dir)
    for example, document in examples:
        assert len(example.spans) > 1 and len(example.input_ids) <= config.seq_len
        assert all(end <= start for (_, end), (start, _) in zip(example.spans, example.spans[1:]))  # in order
        pieces, position = [], 0
        for start, end in example.spans:
            pieces.append(tokenizer.decode(example.input_ids[position:start]))
            targets = example.labels[start:end]
            middle = [t for t in targets if t != tokens.end_of_span_id]
            assert targets == middle + [tokens.end_of_span_id] * (len(targets) - len(middle))  # middle, then ends
            pieces.append(tokenizer.decode(middle))
            position = end
        pieces.append(tokenizer.decode(example.input_ids[position:]))
        assert "".join(pieces) in document  # context and middles in order are one run of the document
        outside = [i for i, s in enumerate(example.segments) if s == 0]
        assert all(example.labels[i] == IGNORE_INDEX and example.loss_weights[i] == 0 for i in outside)


def test_each_hole_sees_the_context_and_itself_only(tokenizer, source_dir: Path):
    from infill_engine.training.run_directory import build_model
    from infill_engine.training.config import PRESETS

    examples, tokens, config = several_hole_examples(tokenizer, source_dir, count=1)
    example = examples[0][0]
    torch.manual_seed(0)
    model = build_model(PRESETS["tiny"], tokenizer, config.seq_len, dense=True).eval()
    batch = collate([example], tokens.pad_id, dense=True)
    assert "canvas_segments" in batch
    (first_start, first_end), (second_start, second_end) = example.spans[:2]

    def first_span_logits(input_ids):
        inputs = {k: v for k, v in batch.items() if k not in ("labels", "loss_weights", "next_token_labels")}
        with torch.no_grad():
            return model(**{**inputs, "input_ids": input_ids}).logits[0, first_start:first_end]

    before = first_span_logits(batch["input_ids"])
    other_span = batch["input_ids"].clone()
    other_span[0, second_start:second_end] = tokens.mask_id  # another hole's canvas: not seen
    torch.testing.assert_close(first_span_logits(other_span), before)
    later_context = batch["input_ids"].clone()
    later_context[0, second_end:] = tokens.mask_id  # the context after another hole: seen
    assert not torch.allclose(first_span_logits(later_context), before)
    targets = batch["next_token_labels"][0]
    assert targets[first_end] == IGNORE_INDEX and targets[second_end] == IGNORE_INDEX  # read a canvas' output
    with torch.no_grad():
        assert torch.isfinite(model(**batch, loss_only=True).loss)


def test_a_run_with_several_holes_trains(prepared_run: Path, source_dir: Path, tmp_path: Path) -> None:
    run_dir = copy_run(prepared_run, tmp_path / "run")
    result = train(tiny_config(run_dir, source_dir, steps=2, seq_len=96, holes=3, dense=True))
    assert result.step == 2 and result.eval_loss is not None
    with pytest.raises(ValueError, match="holes"):
        ObjectiveConfig(holes=0)


def test_corpus_token_counts_by_kind_match_tokenizing_each_file(tokenizer) -> None:
    from infill_engine.training.tokenizer_training import chars_and_tokens

    files = [("python", "def mean(values):\n    return sum(values) / len(values)\n"), ("other", "const x = 1;\n"),
             ("python", "import os\n")] * 40  # more than one batch of 64
    counts = chars_and_tokens(tokenizer, iter(files))
    for kind in ("python", "other"):
        texts = [text for group, text in files if group == kind]
        tokens = sum(len(tokenizer(text, add_special_tokens=False)["input_ids"]) for text in texts)
        assert counts[kind] == (sum(len(text) for text in texts), tokens)


def test_a_large_corpus_s_tokens_are_counted_on_an_even_sample_and_scaled(prepared_run: Path, monkeypatch) -> None:
    from transformers import AutoTokenizer

    from infill_engine.training import run_directory
    from infill_engine.training.corpus import Corpus, CorpusManifest, Document

    tokenizer = AutoTokenizer.from_pretrained(prepared_run / "tokenizer")
    manifest = read_corpus(prepared_run).manifest
    assert manifest.tokens > 0 and manifest.tokens_counted_share == 1.0  # a small corpus: every token counted
    texts = ["def mean(values):\n    return sum(values) / len(values)\n", "const answer = 42;\n", "import os\n"]
    documents = [Document(f"f{i}{'.py' if i % 3 != 1 else '.js'}", texts[i % 3] * (1 + i % 5), str(i), "train")
                 for i in range(300)]
    corpus = Corpus(documents, CorpusManifest(sources=["here"]))
    exact, chars, python_exact, share = run_directory.count_tokens(tokenizer, corpus)
    assert share == 1.0 and exact == sum(len(tokenizer(d.text, add_special_tokens=False)["input_ids"])
                                         for d in documents)
    monkeypatch.setattr(run_directory, "COUNTED_CHARS", chars // 4)  # as if the corpus were four times the limit
    estimate, same_chars, python_estimate, share = run_directory.count_tokens(tokenizer, corpus)
    assert same_chars == chars and 0.15 < share < 0.35  # every fourth or fifth document tokenized
    assert estimate == pytest.approx(exact, rel=0.1) and python_estimate == pytest.approx(python_exact, rel=0.1)


def test_held_out_loss_is_measured_as_served_whatever_the_training_layout(prepared_run: Path, source_dir: Path,
                                                                         tmp_path: Path) -> None:
    # with a learning rate too small to move the weights, runs that train on one or on three holes per window report
    # the same held-out loss: both measure the one-hole layout that serving uses, so their curves share one scale
    losses = []
    for holes in (1, 3):
        run_dir = copy_run(prepared_run, tmp_path / f"holes-{holes}")
        result = train(tiny_config(run_dir, source_dir, steps=1, eval_every=1, seq_len=96, holes=holes, lr=1e-12))
        losses.append(result.eval_loss)
    assert losses[0] == pytest.approx(losses[1], rel=1e-4)


# ------------------------------------------------------------------------------------------------- certainty forcing


def test_certainty_loss_is_the_entropy_of_the_right_predictions_only() -> None:
    from infill_engine.diffill_model.modeling_diffill import CERTAINTY_TEMPERATURE, certainty_loss

    logits = torch.tensor([[4.0, 1.0, 0.0], [0.0, 3.0, 0.5], [2.0, 0.0, 1.0]], requires_grad=True)
    labels = torch.tensor([0, 2, 0])  # the first and the third are right, the second is wrong
    probs = torch.softmax(logits.detach()[[0, 2]] / CERTAINTY_TEMPERATURE, dim=-1)
    expected = -(probs * probs.log()).sum(dim=-1).mean()
    loss = certainty_loss(logits, labels)
    assert loss.item() == pytest.approx(expected.item(), rel=1e-5)
    loss.backward()
    assert logits.grad[1].abs().sum() == 0  # a wrong prediction is left to the cross-entropy
    nothing_right = certainty_loss(logits, torch.tensor([2, 0, 1]))
    assert nothing_right.item() == 0.0


def test_certainty_forcing_makes_the_model_surer_where_it_is_right(prepared_run: Path, source_dir: Path,
                                                                   tmp_path: Path) -> None:
    # the same run with and without the term: with it, the masked positions the model gets right end up with a
    # lower entropy, which is what lets the sampler's threshold commit several positions per step
    from infill_engine.diffill_model.modeling_diffill import certainty_loss
    from infill_engine.training.held_out import run_batches

    entropies = []
    for weight in (0.0, 5.0):
        run_dir = copy_run(prepared_run, tmp_path / f"certainty-{weight}")
        result = train(tiny_config(run_dir, source_dir, steps=30, checkpoint_every=30, eval_every=30, seq_len=96,
                                   lr=1e-2, certainty_weight=weight))
        model = DiffillForInfilling.from_pretrained(result.checkpoint).eval()
        batch = run_batches(run_dir, batch_size=16, count=1)[0][0]
        with torch.no_grad():
            logits = model(**{k: v for k, v in batch.items() if k not in ("labels", "loss_weights",
                                                                          "next_token_labels")}).logits
        labelled = batch["labels"] != IGNORE_INDEX
        entropies.append(certainty_loss(logits[labelled], batch["labels"][labelled]).item())
    assert entropies[1] < entropies[0]
    with pytest.raises(ValueError, match="certainty"):
        TrainConfig(run_dir=tmp_path / "bad", certainty_weight=-1.0)


def test_held_out_tool_puts_a_checkpoint_on_its_runs_own_curve(prepared_run: Path, source_dir: Path,
                                                               tmp_path: Path, capsys) -> None:
    from infill_engine.training.held_out import main as held_out_main

    run_dir = copy_run(prepared_run, tmp_path / "run")
    result = train(tiny_config(run_dir, source_dir, steps=3, eval_every=3, checkpoint_every=3, seq_len=96))
    assert held_out_main(["--run-dir", str(run_dir), str(result.checkpoint), "--json", str(tmp_path / "h.json")]) == 0
    rows = json.loads((tmp_path / "h.json").read_text())
    assert rows[0]["held_out_loss"] == pytest.approx(result.eval_loss, abs=1e-3)
    assert 0.0 <= rows[0]["sure"] <= 1.0  # the share of masked positions the sampler's threshold would commit
    assert held_out_main(["--run-dir", str(tmp_path), str(result.checkpoint)]) == 2
    assert "not a training run directory" in capsys.readouterr().err
    # more batches of the same stream: the run's own first batch is the first of them, so one batch is not the loss
    # of eight, and both are read from the same held-out files
    one, eight = tmp_path / "one.json", tmp_path / "eight.json"
    for count, path in (("1", one), ("8", eight)):
        assert held_out_main(["--run-dir", str(run_dir), str(result.checkpoint), "--batches", count,
                              "--json", str(path)]) == 0
    assert json.loads(one.read_text())[0]["held_out_loss"] == pytest.approx(result.eval_loss, abs=1e-3)
    assert json.loads(eight.read_text())[0]["held_out_loss"] != json.loads(one.read_text())[0]["held_out_loss"]
    with pytest.raises(SystemExit):
        held_out_main(["--run-dir", str(run_dir), str(result.checkpoint), "--batches", "0"])
    assert "at least 1" in capsys.readouterr().err
