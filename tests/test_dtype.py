"""The dtype `auto` picks: float32 for small models on the CPU, bfloat16 for large ones where the CPU or the RAM
calls for it, read from the weights files' headers before anything is loaded."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import torch
from safetensors.torch import load_file, save_file

from infill_engine import device
from infill_engine.device import cpu_dtype, cpu_has_bfloat16
from infill_engine.doctor import diagnose
from infill_engine.engine import InfillEngine
from infill_engine.interface import ModelSpec
from infill_engine.loading import StoredWeights, load_denoiser, stored_weights
from tests import tiny_models

LARGE = StoredWeights(parameters=7_000_000_000, dtype="BF16")  # LLaDA / Dream at 7-8B, as they are published


def _in_bfloat16(directory: Path) -> Path:
    """The checkpoint's weights rewritten in bfloat16, as real diffusion checkpoints are published."""
    weights = directory / "model.safetensors"
    save_file({name: t.to(torch.bfloat16) for name, t in load_file(weights).items()}, weights, {"format": "pt"})
    return directory


@pytest.fixture(scope="module")
def bfloat16_model(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny diffill checkpoint stored in bfloat16."""
    return _in_bfloat16(tiny_models.build_diffill(tmp_path_factory.mktemp("bf16") / "model"))


def test_a_small_model_runs_in_float32_on_any_cpu():
    for hardware in (True, False):
        assert cpu_dtype(StoredWeights(6_917_376, "BF16"), hardware, ram=24.0)[0] == "float32"
    assert cpu_dtype(None, True, ram=24.0)[0] == "float32"


def test_a_large_bfloat16_model_runs_in_bfloat16_where_the_cpu_has_its_arithmetic():
    name, why = cpu_dtype(StoredWeights(494_032_768, "BF16"), True, ram=512.0)
    assert name == "bfloat16" and "0.49B parameters" in why and "bfloat16 arithmetic" in why


def test_without_bfloat16_arithmetic_a_large_model_runs_in_float32_only_where_that_fits():
    assert cpu_dtype(StoredWeights(494_032_768, "BF16"), False, ram=24.0)[0] == "float32"
    name, why = cpu_dtype(LARGE, False, ram=24.0)  # 26 GiB in float32 on a 24 GiB machine
    assert name == "bfloat16" and "does not fit the RAM (24.0 GiB)" in why


def test_a_large_float32_model_keeps_float32_where_it_fits():
    assert cpu_dtype(StoredWeights(LARGE.parameters, "F32"), True, ram=256.0)[0] == "float32"
    assert cpu_dtype(StoredWeights(LARGE.parameters, "F32"), True, ram=24.0)[0] == "bfloat16"


def test_the_cpu_flags_decide_whether_it_has_bfloat16_arithmetic(tmp_path):
    cpuinfo = tmp_path / "cpuinfo"
    cpuinfo.write_text("processor\t: 0\nflags\t\t: fpu sse2 avx2 avx512f amx_bf16 amx_tile\n\nprocessor\t: 1\n")
    assert cpu_has_bfloat16(str(cpuinfo))
    cpuinfo.write_text("processor\t: 0\nflags\t\t: fpu sse2 avx2 avx512f avx512bw\n")
    assert not cpu_has_bfloat16(str(cpuinfo))
    assert not cpu_has_bfloat16(str(tmp_path / "missing"))  # not Linux: cannot tell, so no


def test_stored_weights_are_read_from_the_headers(bfloat16_model, tmp_path):
    weights = stored_weights(bfloat16_model)
    model = load_denoiser(bfloat16_model).model
    assert weights == StoredWeights(sum(t.numel() for t in load_file(bfloat16_model / "model.safetensors").values()),
                                    "BF16")
    assert weights.parameters >= sum(p.numel() for p in model.parameters())  # a tied output layer is stored too
    sharded = tmp_path / "sharded"  # a checkpoint in two files, as large ones are published: both headers count
    sharded.mkdir()
    tensors = sorted(load_file(bfloat16_model / "model.safetensors").items())
    half = len(tensors) // 2
    save_file(dict(tensors[:half]), sharded / "model-00001-of-00002.safetensors", {"format": "pt"})
    save_file({n: t.float() for n, t in tensors[half:]}, sharded / "model-00002-of-00002.safetensors")
    in_float32 = sum(t.numel() for _, t in tensors[half:])
    assert stored_weights(sharded) == StoredWeights(weights.parameters,
                                                    "F32" if 2 * in_float32 > weights.parameters else "BF16")
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "model.safetensors").write_bytes(b"\xff" * 8 + b"{}")
    assert stored_weights(broken) is None
    assert stored_weights(tmp_path / "empty") is None


def test_auto_loads_a_large_bfloat16_model_in_bfloat16_on_a_cpu_with_its_arithmetic(bfloat16_model, monkeypatch):
    monkeypatch.setattr(device, "LARGE_MODEL_PARAMETERS", 1_000)  # the tiny model counts as large
    monkeypatch.setattr(device, "cpu_has_bfloat16", lambda: True)
    assert load_denoiser(bfloat16_model).dtype == torch.bfloat16
    assert InfillEngine.load(ModelSpec(path=str(bfloat16_model))).describe().dtype == "bfloat16"  # for the log
    assert load_denoiser(bfloat16_model, dtype="float32").dtype == torch.float32  # asked for: as asked
    report = diagnose(str(bfloat16_model), None, "cpu", "auto", False)
    assert report["device"]["dtype"] == "bfloat16" and report["model"]["dtype"] == "bfloat16"
    assert "this CPU has bfloat16 arithmetic" in report["device"]["dtype because"]
    monkeypatch.setattr(device, "cpu_has_bfloat16", lambda: False)
    assert load_denoiser(bfloat16_model).dtype == torch.float32  # it fits: float32 is the faster there


def test_auto_keeps_a_small_model_in_float32(bfloat16_model, monkeypatch):
    monkeypatch.setattr(device, "cpu_has_bfloat16", lambda: True)
    assert load_denoiser(bfloat16_model).dtype == torch.float32
    report = diagnose(str(bfloat16_model), None, "cpu", "auto", False)
    assert "a small model" in report["device"]["dtype because"]
    assert json.dumps(report)  # the doctor's --json output
