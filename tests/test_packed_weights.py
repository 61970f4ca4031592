"""Linear weights packed for MKL (`infill_engine/packed_weights.py`): the same products, the same checkpoints, the same
fills as plain `nn.Linear`, and the plain product wherever the packed one would not be the same."""

from __future__ import annotations

import copy
from pathlib import Path

import pytest
import torch
from torch import nn
from torch.utils.flop_counter import FlopCounterMode

from infill_engine.bench import engine_copy
from infill_engine.engine import InfillEngine, InfillRequest
from infill_engine.interface import ModelSpec
from infill_engine.packed_weights import (
    PackedLinear,
    mkl_packing_available,
    pack_linear_weights,
    packed_layers,
    packing_refusal,
    unpack_linear_weights,
)

pytestmark = pytest.mark.skipif(not mkl_packing_available(), reason="this PyTorch build has no MKL packed sgemm")


def _pair(seed: int = 0) -> tuple[nn.Sequential, nn.Sequential]:
    """A small two-layer network and a packed copy of it."""
    torch.manual_seed(seed)
    plain = nn.Sequential(nn.Linear(64, 96, bias=False), nn.Linear(96, 40))
    packed = copy.deepcopy(plain)
    assert pack_linear_weights(packed) == 2
    return plain, packed


@pytest.mark.parametrize("shape", [(1, 64), (3, 64), (24, 64), (2, 7, 64), (1, 190, 64)])
def test_packed_layers_give_the_plain_product_at_any_row_count(shape):
    plain, packed = _pair()
    x = torch.randn(*shape)
    with torch.no_grad():
        torch.testing.assert_close(packed(x), plain(x), rtol=1e-5, atol=1e-5)
    assert all(type(layer) is PackedLinear for layer in packed)
    assert packed_layers(packed) == 2


def test_packing_leaves_the_state_dict_and_tied_weights_as_they_were(model_dirs):
    engine = InfillEngine.load(ModelSpec(path=str(model_dirs["diffill"])))
    model = engine.denoiser.model
    assert packed_layers(model) > 0  # a float32 model on the CPU is packed as it loads
    assert model.lm_head.weight is model.get_input_embeddings().weight
    before = {name: t.clone() for name, t in model.state_dict().items()}
    reloaded = engine_copy(engine).denoiser.model
    unpack_linear_weights(reloaded)
    assert set(reloaded.state_dict()) == set(before)
    assert all(torch.equal(reloaded.state_dict()[name], t) for name, t in before.items())
    assert not any(isinstance(m, PackedLinear) for m in reloaded.modules())


def test_a_weight_changed_in_place_is_packed_again_before_it_is_used():
    plain, packed = _pair()
    with torch.no_grad():
        for model in (plain, packed):
            model[0].weight.mul_(-2.0)
            model[1].bias.add_(1.0)
        x = torch.randn(5, 64)
        torch.testing.assert_close(packed(x), plain(x), rtol=1e-5, atol=1e-5)
        packed[0].weight.data = torch.randn(96, 64)  # a new tensor in place of the old
        plain[0].weight.data = packed[0].weight.data.clone()
        torch.testing.assert_close(packed(x), plain(x), rtol=1e-5, atol=1e-5)


def test_a_deep_copy_multiplies_by_its_own_weights():
    plain, packed = _pair()
    copied = copy.deepcopy(packed)
    with torch.no_grad():
        copied[0].weight.zero_()
        x = torch.randn(4, 64)
        torch.testing.assert_close(packed(x), plain(x), rtol=1e-5, atol=1e-5)
        torch.testing.assert_close(copied(x), copied[1].bias.expand(4, 40))


def test_training_through_a_packed_layer_gets_the_plain_gradients():
    plain, packed = _pair()
    x = torch.randn(6, 64)
    plain(x).square().sum().backward()
    packed(x).square().sum().backward()
    for a, b in zip(plain.parameters(), packed.parameters()):
        torch.testing.assert_close(b.grad, a.grad, rtol=1e-5, atol=1e-5)


def test_models_that_cannot_or_should_not_be_packed_stay_plain():
    torch.manual_seed(0)
    half = nn.Sequential(nn.Linear(64, 64)).to(torch.bfloat16)
    assert pack_linear_weights(half) == 0 and type(half[0]) is nn.Linear
    big = nn.Sequential(nn.Linear(64, 64))
    assert pack_linear_weights(big, max_bytes=64 * 64 * 4 - 1) == 0 and type(big[0]) is nn.Linear
    plain, packed = _pair()
    with torch.no_grad():  # a bfloat16 input to a packed float32 layer: the plain product's error, not another
        with pytest.raises(RuntimeError) as plain_error:
            plain(torch.randn(2, 64, dtype=torch.bfloat16))
        with pytest.raises(RuntimeError) as packed_error:
            packed(torch.randn(2, 64, dtype=torch.bfloat16))
    assert str(packed_error.value) == str(plain_error.value)


def test_a_model_loaded_in_bfloat16_is_not_packed(model_dirs):
    engine = InfillEngine.load(ModelSpec(path=str(model_dirs["diffill"]), dtype="bfloat16"))
    assert packed_layers(engine.denoiser.model) == 0


def test_the_flop_counter_counts_a_packed_product_as_its_matmul():
    plain, packed = _pair()
    x = torch.randn(3, 5, 64)
    counted = []
    for model in (plain, packed):
        with torch.no_grad(), FlopCounterMode(display=False) as counter:
            model(x)
        counted.append(counter.get_total_flops())
    assert counted[0] == counted[1] == 2 * 15 * (64 * 96 + 96 * 40)


def test_fills_read_the_same_text_packed_and_plain(model_dirs: dict[str, Path]):
    packed = InfillEngine.load(ModelSpec(path=str(model_dirs["diffill"])))
    plain = engine_copy(packed)
    assert unpack_linear_weights(plain.denoiser.model) == packed_layers(packed.denoiser.model) > 0
    holes = [("def area(width, height):\n    return ", "\n"), ("values = [1, 2, 3]\ntotal = ", "\nprint(total)\n")]
    for prefix, suffix in holes:
        for single_line, positions in ((True, 12), (False, 20)):
            request = InfillRequest(prefix, suffix, "python", max_tokens=positions, single_line=single_line, seed=0)
            a, b = packed.fill(request), plain.fill(request)
            assert (a.text, a.stats.forward_passes) == (b.text, b.stats.forward_passes)


def test_doctor_says_how_many_layers_are_packed_and_why_none_are(model_dirs):
    from infill_engine.doctor import diagnose

    packed = diagnose(str(model_dirs["diffill"]), None, "cpu", "auto", False)["model"]
    assert packed["MKL-packed layers"] > 0 and "not packed because" not in packed
    plain = diagnose(str(model_dirs["diffill"]), None, "cpu", "bfloat16", False)["model"]
    assert plain["MKL-packed layers"] == 0
    assert plain["not packed because"] == "packing needs float32 weights on the CPU (these are bfloat16 on cpu)"


def test_a_model_over_the_size_limit_is_refused_with_its_size():
    big = nn.Sequential(nn.Linear(1024, 1024))
    assert packing_refusal(big, max_bytes=2**20) == "its Linear weights (4 MiB) exceed the 1 MiB packed"
    assert packing_refusal(big) is None
