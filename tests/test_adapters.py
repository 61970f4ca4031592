"""Loading every family from disk, the logit shift, DiffusionGemma parity with generate(), and load errors."""

from __future__ import annotations

import json
import shutil
from dataclasses import replace

import pytest
import torch

from infill_engine.adapters.masked import MaskedDenoiser
from infill_engine.engine import default_sampler_for
from infill_engine.loading import ModelLoadError, load_denoiser
from infill_engine.sampler import denoise_span
from infill_engine.special_tokens import END_OF_SPAN_TOKEN, MASK_TOKEN, SpecialTokens


@pytest.mark.parametrize(
    "family, noise, shifted",
    [("diffill", "mask", None), ("diffusion_gemma", "uniform", None), ("mlm", "mask", False),
     ("dream", "mask", True), ("llada", "mask", False)],
)
def test_each_family_loads_through_the_user_path(model_dirs, family, noise, shifted):
    denoiser = load_denoiser(model_dirs[family], trust_remote_code=True)
    assert denoiser.family == family
    assert denoiser.noise == noise
    if shifted is not None:
        assert denoiser.shift_logits is shifted
    vocab = denoiser.tokenizer.get_vocab()
    if noise == "mask":  # the mask id is the tokenizer's, not a literal
        assert denoiser.special.mask_id in vocab.values()
    assert denoiser.special.end_of_span_ids


def test_mask_and_end_of_span_ids_come_from_the_tokenizer(model_dirs):
    denoiser = load_denoiser(model_dirs["diffill"])
    tokenizer = denoiser.tokenizer
    assert denoiser.special.mask_id == tokenizer.convert_tokens_to_ids(MASK_TOKEN)
    assert denoiser.special.end_of_span_ids == (tokenizer.convert_tokens_to_ids(END_OF_SPAN_TOKEN),)
    assert denoiser.special.mask_id in denoiser.special.ids_never_generated


class KnownLogits(torch.nn.Module):
    """Output position j always predicts token 10 + j, so the logit shift is visible in the result."""

    def __init__(self, vocab: int = 64) -> None:
        super().__init__()
        self.out = torch.nn.Linear(1, vocab, bias=False)
        self.config = type("Config", (), {"max_position_embeddings": 64})()

    def get_output_embeddings(self):
        return self.out

    def forward(self, input_ids):
        batch, length = input_ids.shape
        logits = torch.zeros(batch, length, self.out.weight.shape[0])
        logits[:, torch.arange(length), 10 + torch.arange(length)] = 10.0
        return type("Output", (), {"logits": logits})()


@pytest.mark.parametrize("shift, first_token", [(False, 13), (True, 12)])
def test_logit_shift_reads_position_i_from_output_i_minus_1(shift, first_token):
    special = SpecialTokens(mask_id=1, end_of_span_ids=(2,), pad_id=0, bos_id=3, cls_id=None, sep_id=None,
                            ids_never_generated=(0, 1, 3))
    denoiser = MaskedDenoiser(KnownLogits(), None, special, "fake", "dream" if shift else "llada", shift_logits=shift)
    context = denoiser.encode([5, 6, 7], [8], span_length=4, batch_size=1)
    logits = denoiser.predict(context, torch.full((1, 4), 1))
    # the span starts at position 3: unshifted models predict it at output 3, shifted ones at output 2
    assert logits.argmax(-1)[0].tolist() == [first_token + i for i in range(4)]


def test_shifted_model_with_an_empty_prefix_gets_a_start_token():
    special = SpecialTokens(mask_id=1, end_of_span_ids=(2,), pad_id=0, bos_id=3, cls_id=None, sep_id=None,
                            ids_never_generated=())
    denoiser = MaskedDenoiser(KnownLogits(), None, special, "fake", "dream", shift_logits=True)
    context = denoiser.encode([], [], span_length=2, batch_size=1)
    assert denoiser.predict(context, torch.full((1, 2), 1)).shape == (1, 2, 64)


def test_diffusion_gemma_matches_transformers_generate_token_for_token(model_dirs):
    denoiser = load_denoiser(model_dirs["diffusion_gemma"])
    prefix = denoiser.tokenizer("def add(a, b):\n    return", add_special_tokens=False)["input_ids"]
    canvas = denoiser.model.config.canvas_length
    for seed in (0, 1, 2):
        torch.manual_seed(seed)
        reference = denoiser.model.generate(torch.tensor([prefix]), max_new_tokens=canvas).sequences[0, len(prefix):]
        config = replace(default_sampler_for(denoiser), block_size=canvas, suppress_special=False, min_tokens=0,
                         draw="multinomial", seed=seed)
        ours = denoise_span(denoiser, prefix, [], canvas, config).tokens[0]
        eos = denoiser.special.end_of_span_ids[0]
        ends = (ours == eos).nonzero()
        cut = int(ends[0]) + 1 if len(ends) else canvas  # generate() pads what follows EOS
        assert ours[:cut].tolist() == reference[:cut].tolist()


@pytest.mark.parametrize("family", ["diffill", "diffusion_gemma", "mlm", "dream", "llada"])
def test_the_suffix_conditions_the_span(model_dirs, family):
    denoiser = load_denoiser(model_dirs[family], trust_remote_code=True)
    encode = lambda text: denoiser.tokenizer(text, add_special_tokens=False)["input_ids"]  # noqa: E731
    prefix = encode("def add(a, b):\n    return ")
    canvas = torch.randint(5, 50, (1, 6))
    first = denoiser.predict(denoiser.encode(prefix, encode("\nprint(1)\n"), 6, 1), canvas)
    second = denoiser.predict(denoiser.encode(prefix, encode("\nfor x in y: pass\n"), 6, 1), canvas)
    assert not torch.allclose(first, second)


def test_remote_code_is_refused_unless_allowed(model_dirs):
    with pytest.raises(ModelLoadError, match="trust_remote_code"):
        load_denoiser(model_dirs["dream"])


def test_missing_model_directory_is_a_clear_error(tmp_path):
    with pytest.raises(ModelLoadError, match="does not exist"):
        load_denoiser(tmp_path / "nowhere")
    with pytest.raises(ModelLoadError, match="no config.json"):
        load_denoiser(tmp_path)


def test_corrupt_checkpoints_are_clear_errors(model_dirs, tmp_path):
    broken = tmp_path / "broken"
    shutil.copytree(model_dirs["diffill"], broken)
    (broken / "config.json").write_text("{not json")
    with pytest.raises(ModelLoadError, match="not valid JSON"):
        load_denoiser(broken)
    truncated = tmp_path / "truncated"
    shutil.copytree(model_dirs["diffill"], truncated)
    weights = truncated / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:100])
    with pytest.raises(ModelLoadError, match="could not load"):
        load_denoiser(truncated)
    no_weights = tmp_path / "no_weights"
    shutil.copytree(model_dirs["diffill"], no_weights)
    (no_weights / "model.safetensors").unlink()
    with pytest.raises(ModelLoadError, match="no weights"):
        load_denoiser(no_weights)


def test_unknown_family_asks_for_an_explicit_one(model_dirs, tmp_path):
    odd = tmp_path / "odd"
    shutil.copytree(model_dirs["mlm"], odd)
    config = json.loads((odd / "config.json").read_text())
    config["architectures"] = ["SomethingElse"]
    config["model_type"] = "bert"
    (odd / "config.json").write_text(json.dumps(config))
    with pytest.raises(ModelLoadError, match="pass a family explicitly"):
        load_denoiser(odd)
    assert load_denoiser(odd, family="mlm").family == "mlm"
    with pytest.raises(ModelLoadError, match="unknown model family"):
        load_denoiser(odd, family="gpt")
