"""Mixed precision (`--dtype mixed`, `infill_engine/mixed_precision.py`): the blocks' matrix products in bfloat16,
the output layer and the rest in float32; what `auto` picks, and the compiled layers of a mixed model."""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from infill_engine import device
from infill_engine.compiled_layers import compile_layers, package_key
from infill_engine.device import cpu_dtype, dtype_choice
from infill_engine.doctor import diagnose
from infill_engine.engine import InfillEngine, InfillRequest
from infill_engine.interface import ModelSpec
from infill_engine.loading import StoredWeights, load_denoiser
from infill_engine.mixed_precision import BFloat16Linear, is_mixed, mix_precision, mixing_refusal
from tests import tiny_models

REQUEST = InfillRequest("def add(a, b):\n    return ", "\n\nprint(add(1, 2))\n", "python", max_tokens=12,
                        single_line=True)
SMALL = StoredWeights(6_917_376, "BF16")  # the embedded model
pytestmark = pytest.mark.usefixtures("package_cache")  # each test's own package cache (tests/conftest.py)


@pytest.fixture(scope="module")
def model_dir(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny diffill checkpoint read the embedded model's way, with a tied output layer as the embedded model's."""
    return tiny_models.build_diffill(tmp_path_factory.mktemp("mixed") / "diffill", seed=5, hidden=64, layers=2,
                                     causal_context=True, shift_logits=True, tie_word_embeddings=True)


def _logits(model: torch.nn.Module) -> torch.Tensor:
    """One denoising step's logits for a fixed context and canvas."""
    generator = torch.Generator().manual_seed(0)
    context = torch.randint(5, model.config.vocab_size, (1, 24), generator=generator)
    canvas = torch.randint(5, model.config.vocab_size, (2, 8), generator=generator)
    positions = torch.arange(24, 32)[None].expand(2, -1)
    return model.denoise_planned(canvas, model.plan_denoising(positions, model.encode_context(
        context, torch.arange(24)[None])))


def test_mixed_rounds_the_blocks_products_and_keeps_the_output_layer_in_float32(model_dir):
    full = load_denoiser(model_dir, dtype="float32", compiled_layers="off")
    mixed = load_denoiser(model_dir, dtype="mixed", compiled_layers="off")
    layers = [m for m in mixed.model.modules() if isinstance(m, BFloat16Linear)]
    assert len(layers) == 2 * 4  # per block: the fused q/k/v, the output, the gate/up and the down products
    assert all(layer.weight.dtype == torch.bfloat16 for layer in layers)
    assert mixed.model.lm_head.weight.dtype == torch.float32 and mixed.model.embed_tokens.weight.dtype == torch.float32
    assert mixed.model.lm_head.weight is mixed.model.embed_tokens.weight  # still tied
    assert mixed.model.norm.weight.dtype == torch.float32
    assert mixed.precision == "mixed" and full.precision == "float32"
    expected, got = _logits(full.model), _logits(mixed.model)
    assert got.dtype == torch.float32
    assert not torch.equal(got, expected)  # the products were rounded
    spread = expected.std().item()
    assert (got - expected).abs().max().item() < 0.05 * spread + 1e-3  # and only by bfloat16's rounding
    engine = InfillEngine.load(ModelSpec(path=str(model_dir), device="cpu", dtype="mixed", compiled_layers="off"))
    assert engine.describe().dtype == "mixed"  # what the server's log and `diffill doctor` say
    assert engine.fill(REQUEST).stats.forward_passes > 0


def test_mixed_is_for_the_cpu_and_for_float32_models_with_linear_layers(model_dir):
    with pytest.raises(ValueError, match="'mixed' .* is for the CPU, not cuda"):
        dtype_choice(torch.device("cuda"), "mixed")
    with pytest.raises(ValueError, match="allowed: auto, float32, bfloat16, float16, mixed"):
        dtype_choice(torch.device("cpu"), "half")
    bf16 = load_denoiser(model_dir, dtype="bfloat16", compiled_layers="off").model
    assert "needs a float32 model on the CPU (this one has bfloat16 on cpu)" in mixing_refusal(bf16)
    with pytest.raises(ValueError, match="float32 model"):
        mix_precision(bf16)
    only_output = torch.nn.Module()
    only_output.head = torch.nn.Linear(4, 4)
    only_output.get_output_embeddings = lambda: only_output.head
    assert "besides the output layer" in mixing_refusal(only_output)
    assert not is_mixed(bf16)


def test_auto_mixes_a_small_model_only_where_its_layers_are_compiled_on_a_cpu_with_bfloat16(model_dir, monkeypatch):
    name, why = cpu_dtype(SMALL, True, ram=24.0, compiled_with_bfloat16=True)
    assert name == "mixed" and "compiled for a CPU with bfloat16 arithmetic" in why
    assert cpu_dtype(SMALL, True, ram=24.0)[0] == "float32"
    assert cpu_dtype(StoredWeights(494_032_768, "BF16"), True, ram=512.0, compiled_with_bfloat16=True)[0] == "bfloat16"
    for flags in (["avx512f", "amx_bf16", "avx512_bf16"], ["avx512f", "avx512_bf16"]):  # AMX, or AVX-512 BF16 alone
        monkeypatch.setattr(device, "cpu_flags", lambda *_, flags=flags: flags)
        assert load_denoiser(model_dir, compiled_layers="auto").precision == "mixed"
        assert load_denoiser(model_dir, compiled_layers="off").precision == "float32"  # eager: no faster mixed
    report = diagnose(str(model_dir), None, "cpu", "auto", False, compiled_layers="auto")
    assert report["device"]["dtype"] == "mixed" and report["model"]["dtype"] == "mixed"
    monkeypatch.setattr(device, "cpu_flags", lambda *_: ["avx2", "avx512f"])  # no bfloat16 arithmetic: emulated, slower
    assert load_denoiser(model_dir, compiled_layers="auto").precision == "float32"
    monkeypatch.setattr(device, "cpu_flags", lambda *_: ["avx512_bf16"])
    bert = tiny_models.build_bert(model_dir.parent / "bert")  # a family whose layers are never compiled
    assert load_denoiser(bert, compiled_layers="auto").precision == "float32"
    assert load_denoiser(bert, dtype="mixed", compiled_layers="auto").precision == "mixed"  # asked for: as asked


@pytest.mark.skipif(not any(shutil.which(name) for name in ("c++", "g++", "clang++")),
                    reason="no C++ compiler on this machine (AOTInductor needs one: apt install g++)")
def test_a_mixed_models_compiled_layers_give_its_eager_numbers(model_dir, package_cache):
    eager = InfillEngine.load(ModelSpec(path=str(model_dir), device="cpu", dtype="mixed", compiled_layers="off"))
    full = InfillEngine.load(ModelSpec(path=str(model_dir), device="cpu", dtype="float32", compiled_layers="off"))
    path = compile_layers(eager.denoiser.model)
    assert path.name == package_key(eager.denoiser.model) != package_key(full.denoiser.model)  # its own package
    compiled = InfillEngine.load(ModelSpec(path=str(model_dir), device="cpu", dtype="mixed", compiled_layers="auto"))
    layers = compiled.denoiser.model.compiled_layers
    assert layers is not None
    expected, got = _logits(eager.denoiser.model), _logits(compiled.denoiser.model)
    assert layers.calls == 1  # the step ran compiled
    spread = expected.std().item()
    assert (got - expected).abs().max().item() < 0.05 * spread + 1e-3
    result = compiled.fill(REQUEST)
    assert result.stats.forward_passes > 0 and layers.calls > 1 and layers.context_calls > 0
    # a fresh process whose first AMX instruction is the package's (its context encode): Linux grants a process AMX
    # tiles only once it asks, which torch's own kernels do and a compiled library does not (SIGILL before the fix)
    fill = subprocess.run([sys.executable, "-m", "diffill", "fill", "-", "--model", str(model_dir), "--dtype", "mixed",
                           "--compiled-layers", "auto", "--max-tokens", "8", "--hole", "<FILL>"],
                          capture_output=True, text=True, input="def add(a, b):\n    return <FILL>\n", timeout=300)
    assert fill.returncode == 0, fill.stderr[-2000:]
