"""The autoregressive twin: its fill-in-the-middle examples, a tiny training run, KV-cached generation, and
`diffill bench vs-ar` end to end on tiny models."""

from __future__ import annotations

import gzip
import json
import random
from pathlib import Path

import pytest
import torch

from diffill.cli import main
from infill_engine.diffill_model import DiffillForInfilling
from infill_engine.diffill_model.modeling_diffill import IGNORE_INDEX
from infill_engine.fim_generation import FimGenerator, cut_at_suffix_line, fim_prompt, first_suffix_line
from infill_engine.special_tokens import END_OF_SPAN_TOKEN, FIM_MIDDLE_TOKEN, FIM_PREFIX_TOKEN, FIM_SUFFIX_TOKEN
from infill_engine.training.config import TrainConfig
from infill_engine.training.fim_objective import (
    add_fim_tokens,
    collate_fim,
    fim_tokens,
    make_fim_example,
)
from infill_engine.training.objective import ObjectiveConfig
from infill_engine.training.tokenizer_training import train_tokenizer
from infill_engine.training.train import train
from tests import tiny_models

STDLIB_MODULES = ("textwrap", "heapq", "bisect", "shlex")


@pytest.fixture(scope="module")
def source_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A directory of real Python files."""
    return tiny_models.copy_stdlib_sources(tmp_path_factory.mktemp("sources"), STDLIB_MODULES)


@pytest.fixture(scope="module")
def twin_tokenizer(source_dir: Path):
    """A small tokenizer trained on the sources, with the FIM sentinels appended."""
    return add_fim_tokens(train_tokenizer((p.read_text() for p in sorted(source_dir.glob("*.py"))), vocab_size=400))


@pytest.fixture(scope="module")
def twin_checkpoint(tmp_path_factory: pytest.TempPathFactory, source_dir: Path) -> Path:
    """A tiny twin trained a few steps from scratch with `train(autoregressive=True)`."""
    run_dir = tmp_path_factory.mktemp("twin") / "run"
    result = train(TrainConfig(
        run_dir=run_dir, sources=(str(source_dir),), use_stdlib=False, bench_path=str(run_dir / "no-bench.gz"),
        preset="tiny", steps=4, batch_size=3, seq_len=96, vocab_size=400, checkpoint_every=4, eval_every=2,
        eval_batches=1, log_every=1, progress=False, autoregressive=True, seed=3,
    ))
    assert result.stopped_by == "steps" and result.checkpoint is not None
    return result.checkpoint


def test_fim_examples_are_prefix_suffix_middle_between_the_tokenizers_sentinels(twin_tokenizer, source_dir):
    vocab = twin_tokenizer.get_vocab()
    sentinels = [vocab[FIM_PREFIX_TOKEN], vocab[FIM_SUFFIX_TOKEN], vocab[FIM_MIDDLE_TOKEN]]
    tokens = fim_tokens(twin_tokenizer)
    assert [tokens.prefix_id, tokens.suffix_id, tokens.middle_id] == sentinels
    assert tokens.end_id == vocab[END_OF_SPAN_TOKEN]
    # the sentinels are whole special tokens: ordinary text never tokenizes into them
    text = (source_dir / "textwrap.py").read_text()
    assert not set(sentinels) & set(twin_tokenizer(text, add_special_tokens=False)["input_ids"])

    config = ObjectiveConfig(seq_len=120, max_span_tokens=40)
    rng = random.Random(5)
    examples = [make_fim_example(twin_tokenizer, text, rng, tokens, config) for _ in range(12)]
    for example in examples:
        ids = example.input_ids
        assert len(ids) <= config.seq_len
        assert [ids.count(s) for s in sentinels] == [1, 1, 1]
        at_suffix, at_middle = ids.index(tokens.suffix_id), ids.index(tokens.middle_id)
        assert ids[0] == tokens.prefix_id and 0 < at_suffix < at_middle == example.middle_start - 1
        prefix = twin_tokenizer.decode(ids[1:at_suffix])
        suffix = twin_tokenizer.decode(ids[at_suffix + 1 : at_middle])
        middle = twin_tokenizer.decode(ids[example.middle_start : -1])
        assert example.hole.prefix.endswith(prefix) and example.hole.suffix.startswith(suffix)
        assert middle == example.hole.middle and ids[-1] == tokens.end_id
        assert ids[: example.middle_start] == fim_prompt(
            twin_tokenizer(prefix, add_special_tokens=False)["input_ids"],
            twin_tokenizer(suffix, add_special_tokens=False)["input_ids"], tokens)
        # every position after the first learns its own token from the output before it, the end token included
        assert example.labels == [IGNORE_INDEX] + ids[1:]

    batch = collate_fim(examples[:3], tokens.pad_id)
    longest = max(len(e.input_ids) for e in examples[:3])
    assert batch["input_ids"].shape == (3, longest) and not batch["canvas_mask"].any()
    for row, example in enumerate(examples[:3]):
        n = len(example.input_ids)
        assert batch["attention_mask"][row].sum() == n
        assert (batch["input_ids"][row, n:] == tokens.pad_id).all()
        assert (batch["labels"][row, n:] == IGNORE_INDEX).all()


def test_a_tiny_twin_trains_and_its_kv_cache_writes_what_the_full_pass_writes(twin_checkpoint, source_dir):
    model = DiffillForInfilling.from_pretrained(twin_checkpoint, dtype=torch.float32).eval()
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(twin_checkpoint)
    config = model.config
    assert config.autoregressive and config.causal_context and config.shift_logits
    assert config.vocab_size == len(tokenizer) and FIM_MIDDLE_TOKEN in tokenizer.get_vocab()
    log = (twin_checkpoint.parents[1] / "train_log.csv").read_text().splitlines()
    assert len(log) > 1 and all("nan" not in row for row in log)

    # logits: encode a prompt, then extend it token by token; each step's next-token logits are the full pass's
    tokens = fim_tokens(tokenizer)
    text = (source_dir / "heapq.py").read_text()
    objective = ObjectiveConfig(seq_len=96, max_span_tokens=24)
    example = make_fim_example(tokenizer, text, random.Random(2), tokens, objective)
    ids = torch.tensor([example.input_ids])  # (1, T)
    full = model(input_ids=ids, canvas_mask=torch.zeros_like(ids, dtype=torch.bool)).logits  # (1, T, V): t from t-1
    start = example.middle_start
    cache = model.encode_context(ids[:, :start], torch.arange(start)[None])
    for t in range(start, ids.shape[1]):
        torch.testing.assert_close(model.next_token_logits(cache), full[:, t], atol=1e-4, rtol=1e-4)
        cache = model.extend_context(ids[:, t : t + 1], torch.tensor([[t]]), cache)

    generator = FimGenerator(model, tokenizer)
    for seed in range(3):
        hole = make_fim_example(tokenizer, text, random.Random(seed), tokens, ObjectiveConfig(seq_len=96)).hole
        cached = generator.fill(hole.prefix, hole.suffix, max_new_tokens=12)
        uncached = generator.fill(hole.prefix, hole.suffix, max_new_tokens=12, use_cache=False)
        assert cached.token_ids and cached.token_ids == uncached.token_ids and cached.text == uncached.text
        assert not set(cached.token_ids) & set(tokens.never_ids)


def test_a_twin_cache_with_room_decodes_what_the_copying_cache_decodes_past_its_room(twin_checkpoint, source_dir):
    model = DiffillForInfilling.from_pretrained(twin_checkpoint, dtype=torch.float32).eval()
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(twin_checkpoint)
    text = (source_dir / "heapq.py").read_text()
    example = make_fim_example(tokenizer, text, random.Random(3), fim_tokens(tokenizer),
                               ObjectiveConfig(seq_len=96, max_span_tokens=24))
    ids = torch.tensor([example.input_ids])  # (1, T)
    start = example.middle_start
    copying = model.encode_context(ids[:, :start], torch.arange(start)[None])
    room = 3  # fewer positions than the middle: past them the cache falls back to copying
    reserved = model.reserve_context(model.encode_context(ids[:, :start], torch.arange(start)[None]), room)
    assert reserved.length == start and reserved.room is not None
    for t in range(start, ids.shape[1]):
        torch.testing.assert_close(model.next_token_logits(reserved), model.next_token_logits(copying))
        step = (ids[:, t : t + 1], torch.tensor([[t]]))
        copying, reserved = model.extend_context(*step, copying), model.extend_context(*step, reserved)
        assert reserved.length == copying.length == t + 1
        assert (reserved.room is not None) == (t + 1 <= start + room)  # in place while the room lasts
    padded = model.encode_context(ids[:, :start], torch.arange(start)[None])
    padded.padding_mask = torch.ones(1, start, dtype=torch.bool)
    with pytest.raises(ValueError, match="unpadded"):
        model.reserve_context(padded, 4)


HUMANEVAL_STYLE = [
    ("def add(a, b):\n", "    return a + b\n", "\n", "def check(f):\n    assert f(1, 2) == 3\n", "add"),
    ("def neg(x):\n", "    return -x\n", "\n", "def check(f):\n    assert f(2) == -2\n", "neg"),
    ("def first(xs):\n", "    return xs[0]\n", "\n", "def check(f):\n    assert f([4]) == 4\n", "first"),
]

def write_problems(path):
    """HUMANEVAL_STYLE as a benchmark file in the HumanEval-infilling format."""
    with gzip.open(path, "wt", encoding="utf-8") as handle:
        for number, (prompt, middle, suffix, test, entry) in enumerate(HUMANEVAL_STYLE):
            handle.write(json.dumps({"task_id": f"Tiny/{number}", "prompt": prompt, "canonical_solution": middle,
                                     "suffix": suffix, "test": test, "entry_point": entry}) + "\n")
    return path


def test_a_twin_stopped_at_the_suffix_ends_before_the_line_that_repeats_it(twin_checkpoint):
    from transformers import AutoTokenizer

    model = DiffillForInfilling.from_pretrained(twin_checkpoint, dtype=torch.float32).eval()
    tokenizer = AutoTokenizer.from_pretrained(twin_checkpoint)
    generator = FimGenerator(model, tokenizer)
    # the twin "writes" a scripted middle (its choices replaced, its cache and passes real): the hole's line, then
    # the line that already follows the hole, then more
    script_ids = tokenizer("x = 1\ny = 2\nz = 3\nw = 4\n", add_special_tokens=False)["input_ids"]
    suffix = "\n  y = 2\nprint(x, y)\n"  # its first line with text, indented differently
    fills = {}
    for stop in (False, True):
        script = iter(script_ids)
        generator._choose = lambda logits, allow_end: next(script)
        fills[stop] = generator.fill("def f():\n", suffix, max_new_tokens=len(script_ids), stop_at_suffix=stop)
    assert fills[False].text == "x = 1\ny = 2\nz = 3\nw = 4\n"  # without the rule it writes on
    assert fills[True].text == "x = 1\n" and not fills[True].ended
    written = len(tokenizer("x = 1\ny = 2\n", add_special_tokens=False)["input_ids"])
    assert fills[True].token_ids == script_ids[:written]  # it stopped at the repeated line's break
    assert fills[True].forward_passes == written < fills[False].forward_passes


def test_a_fill_is_cut_only_at_a_whole_line_that_repeats_the_suffix():
    assert first_suffix_line("\n\n    return total\n") == "return total"
    assert first_suffix_line("  \n") == ""
    assert cut_at_suffix_line("a = 1\n    return total\nmore\n", "return total") == "a = 1\n"
    assert cut_at_suffix_line("return total\n", "return total") == ""  # the fill starts with the next line
    assert cut_at_suffix_line("return total + 1\n", "return total") is None  # a longer line is not a repeat
    assert cut_at_suffix_line("a = 1\n    return total", "return total") is None  # not a whole line yet
    assert cut_at_suffix_line("\n\n", "") is None  # a suffix without text stops nothing


def test_bench_vs_ar_writes_both_sides_the_sweep_and_a_plot(tmp_path, twin_checkpoint, capsys):
    pytest.importorskip("matplotlib")
    data = write_problems(tmp_path / "problems.jsonl.gz")
    diffusion = tiny_models.build_diffill(tmp_path / "diffusion")
    out, plot = tmp_path / "vs-ar.json", tmp_path / "vs-ar.png"
    common = ["bench", "vs-ar", "--model", str(diffusion), "--twin", str(twin_checkpoint), "--data", str(data),
              "--max-tokens", "8", "--workers", "1", "--threads", "1"]

    assert main([*common, "--sweep", "stepz=2"]) == 2  # a bad setting is refused before anything loads
    assert "stepz" in capsys.readouterr().err

    code = main([*common, "--sample", "3", "--sweep", "steps=2", "commit=entropy_bound,entropy_bound=0.5",
                 "--uncached", "--out", str(out), "--plot", str(plot)])
    printed = capsys.readouterr().out
    assert code == 0
    report = json.loads(out.read_text())
    for side in ("diffusion", "autoregressive"):
        assert report[side]["problems"] == 3 and 0 <= report[side]["pass@1"] <= 100
        assert report[side]["ms_median"] > 0
    ratio = report["autoregressive"]["ms_median"] / report["diffusion"]["ms_median"]
    assert report["speedup_median"] == round(ratio, 2)
    assert report["autoregressive"]["ms_at_true_length_median"] > 0 and report["speedup_at_true_length_median"]
    assert [row["task_id"] for row in report["outcomes"]] == ["Tiny/0", "Tiny/1", "Tiny/2"]
    assert all(row["autoregressive"]["tokens"] >= 1 for row in report["outcomes"])
    settings = [(p["side"], p["setting"]) for p in report["sweep"]["points"]]
    assert settings == [("diffusion", "default"), ("autoregressive", "KV cache"), ("autoregressive", "no cache"),
                        ("diffusion", "steps=2"), ("diffusion", "commit=entropy_bound,entropy_bound=0.5")]
    steps_2 = report["sweep"]["points"][3]
    assert steps_2["forward_passes_median"] <= 2 * 2  # two steps per block at most (the 8 positions are one block)
    # the twin wrote the same text with and without its cache, so both points score alike
    assert report["sweep"]["points"][1]["pass@1"] == report["sweep"]["points"][2]["pass@1"]
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert "diffusion" in printed and "autoregressive" in printed and "x the twin's speed" in printed


def test_bench_vs_ar_single_line_stops_both_sides_at_the_line_break(tmp_path, twin_checkpoint, capsys):
    data = write_problems(tmp_path / "problems.jsonl.gz")
    diffusion = tiny_models.build_diffill(tmp_path / "diffusion")
    out = tmp_path / "vs-ar.json"
    common = ["bench", "vs-ar", "--model", str(diffusion), "--twin", str(twin_checkpoint), "--data", str(data),
              "--max-tokens", "8", "--workers", "1", "--threads", "1"]
    # single line, as ghost text: both sides stop at the first line break, and the hole's own break is given back
    assert main([*common, "--sample", "3", "--sweep", "--single-line", "--out", str(out)]) == 0
    assert "single line" in capsys.readouterr().out
    report = json.loads(out.read_text())
    assert report["single_line"] is True
    for row in report["outcomes"]:
        for side in ("diffusion", "autoregressive"):
            completion = row[side]["completion"]
            assert completion.endswith("\n") and completion.count("\n") == 1, completion

    # stopped at the suffix: no fill on either side holds a line that repeats the suffix's first line
    assert main([*common, "--sample", "3", "--sweep", "--stop-at-suffix", "--out", str(out)]) == 0
    assert "stopped at the suffix" in capsys.readouterr().out
    report = json.loads(out.read_text())
    assert report["stop_at_suffix"] is True and report["single_line"] is False
    suffixes = {json.loads(line)["task_id"]: json.loads(line)["suffix"] for line in gzip.open(data, "rt")}
    for row in report["outcomes"]:
        for side in ("diffusion", "autoregressive"):
            assert cut_at_suffix_line(row[side]["completion"], first_suffix_line(suffixes[row["task_id"]])) is None


def test_the_twin_is_loaded_as_the_diffusion_model_is(tmp_path, twin_checkpoint, capsys, package_cache,
                                                         monkeypatch):
    from infill_engine.compiled_layers import compile_layers
    from infill_engine.fim_generation import load_twin

    data = write_problems(tmp_path / "problems.jsonl.gz")
    diffusion = tiny_models.build_diffill(tmp_path / "diffusion")
    out = tmp_path / "vs-ar.json"
    common = ["bench", "vs-ar", "--model", str(diffusion), "--twin", str(twin_checkpoint), "--data", str(data),
              "--max-tokens", "8", "--workers", "1", "--threads", "1", "--sample", "2", "--sweep", "--out", str(out)]
    assert main([*common[:4], "--twin", str(tmp_path / "missing"), *common[6:]]) == 2  # a clear error, no traceback
    assert "the twin: model directory" in capsys.readouterr().err
    for dtype in ("float32", "mixed"):  # the same precision on both sides, said in the report and the table
        assert main([*common, "--dtype", dtype, "--compiled-layers", "off"]) == 0
        report = json.loads(out.read_text())
        assert report["dtype"] == report["twin_dtype"] == dtype and report["twin_compiled_layers"] == "off"
        assert f"twin:      {dtype}, compiled layers off" in capsys.readouterr().out

    # compiled layers: `diffill compile --model TWIN` caches them, and the twin then decodes through them, token for
    # token as eagerly (float32)
    eager = load_twin(str(twin_checkpoint), dtype="float32", compiled_layers="off")
    compile_layers(eager.model)
    compiled = load_twin(str(twin_checkpoint), dtype="float32", compiled_layers="auto")
    assert compiled.compiled_layers.startswith("loaded") and compiled.model.compiled_layers is not None
    prefix, suffix = "def total(values):\n    result = 0\n    for value in values:\n", "\n    return result\n"
    poisoned = torch.Tensor.new_empty  # new memory may hold anything, NaN included: the reserved room's does here
    monkeypatch.setattr(torch.Tensor, "new_empty", lambda self, *size, **kw: poisoned(self, *size, **kw).fill_(
        float("nan")))
    fill = compiled.fill(prefix, suffix, 12)
    assert fill.token_ids == eager.fill(prefix, suffix, 12).token_ids
    assert compiled.model.compiled_layers.context_calls == fill.forward_passes  # the prompt, then a call a token
