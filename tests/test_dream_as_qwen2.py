"""Dream-family checkpoints with Qwen2's weights (Dream, DiffuCoder, Open-dCoder) load through transformers' own
Qwen2 read bidirectionally: their own modelling code never runs, and the dual cache applies to them."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch

from infill_engine.engine import InfillEngine
from infill_engine.interface import ModelSpec
from infill_engine.loading import ModelLoadError, inspect_model, load_denoiser
from infill_engine.request import InfillRequest
from tests import tiny_models
from tests.test_dual_cache import PREFIX, SUFFIX, context_ids, uncached_twin


@pytest.fixture(scope="module")
def dream_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """A Dream-layout checkpoint with its own output layer, one with the output layer tied to the embedding, and a
    Dream-family one whose weights are not Qwen2's (its own code is needed)."""
    root = tmp_path_factory.mktemp("dream-qwen2")
    return {"untied": tiny_models.build_dream_qwen2(root / "untied"),
            "tied": tiny_models.build_dream_qwen2(root / "tied", seed=1, tie=True),
            "own code": tiny_models.build_remote_code(root / "own", "dream", rope=True)}


@pytest.mark.parametrize("kind", ["untied", "tied"])
def test_it_loads_without_running_its_code_and_keeps_its_rotary_base(dream_dirs, kind):
    info = inspect_model(dream_dirs[kind])
    assert info.family == "dream" and info.reads_as_qwen2 and not info.needs_remote_code
    denoiser = load_denoiser(dream_dirs[kind])  # its modelling and tokenizer files raise if they are run
    assert type(denoiser.model).__name__ == "Qwen2ForCausalLM" and denoiser.model.config.is_causal is False
    assert denoiser.model.config.rope_parameters["rope_theta"] == 50_000.0  # the top-level rope_theta, carried
    assert denoiser.special.mask_id == denoiser.tokenizer.convert_tokens_to_ids("<|mask|>")
    assert denoiser.shift_logits  # Dream predicts each position from the one before


def test_weights_that_are_not_qwen2s_still_need_their_own_code(dream_dirs):
    assert inspect_model(dream_dirs["own code"]).needs_remote_code
    with pytest.raises(ModelLoadError, match="ships its own modelling code"):
        load_denoiser(dream_dirs["own code"])


@torch.no_grad()
def test_it_reads_the_suffix(dream_dirs):
    """Bidirectional: the first canvas position's prediction changes with the text after the hole."""
    denoiser = load_denoiser(dream_dirs["untied"])
    prefix, suffix = context_ids(denoiser)
    other = denoiser.tokenizer("\n    return None\n")["input_ids"]
    canvas = torch.full((1, 6), denoiser.special.mask_id)
    first = [denoiser.predict(denoiser.encode(prefix, s, 6, 1), canvas)[0, 0] for s in (suffix, other)]
    assert not torch.allclose(first[0], first[1])


@torch.no_grad()
def test_the_dual_cache_applies_exact_after_each_refresh(dream_dirs):
    cached = load_denoiser(dream_dirs["untied"], dual_cache=3)
    plain = uncached_twin(cached)
    prefix, suffix = context_ids(cached)
    with_cache, without = cached.encode(prefix, suffix, 8, 2), plain.encode(prefix, suffix, 8, 2)
    canvas = torch.full((2, 8), cached.special.mask_id)
    generator = torch.Generator().manual_seed(0)
    differences = []
    for step in range(7):  # refreshes at steps 0, 3 and 6
        differences.append((cached.predict(with_cache, canvas) - plain.predict(without, canvas)).abs().max().item())
        canvas[:, step] = torch.randint(0, len(cached.tokenizer), (2,), generator=generator)
    assert cached.dual_cache.usable
    assert all(differences[step] == 0.0 for step in (0, 3, 6))
    assert all(differences[step] > 0.0 for step in (1, 2, 4, 5))


def test_fills_with_the_cache_pass_the_gate(dream_dirs):
    engine = InfillEngine.load(ModelSpec(path=str(dream_dirs["tied"]), dual_cache=4))
    request = InfillRequest(PREFIX + "v)  # ", SUFFIX, language="python", max_tokens=12, candidates=2,
                            single_line=True)
    result = engine.fill(request)
    assert result.candidates and all(c.gate.ok and "\n" not in c.text for c in result.candidates)
    assert engine.denoiser.dual_cache.usable


def test_doctor_says_how_it_is_loaded(dream_dirs, capsys):
    import json

    from diffill.cli import main

    assert main(["doctor", "--model", str(dream_dirs["untied"]), "--json"]) == 0
    model = json.loads(capsys.readouterr().out)["model"]
    assert model["loaded_as"] == "Qwen2, bidirectional" and model["needs_remote_code"] is False
