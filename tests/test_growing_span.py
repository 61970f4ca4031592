"""DreamOn's growing span: exact grow and shrink on a scripted denoiser, the length guards, the engine's choice of
routine, and a tiny real Dream-style model whose tokenizer has the expand and delete tokens."""

from __future__ import annotations

import pytest
import torch

from infill_engine.adapters.base import Denoiser, EncodedContext
from infill_engine.engine import InfillEngine, InfillRequest
from infill_engine.growing_span import INITIAL_MASKS, denoise_growing_span
from infill_engine.loading import load_denoiser
from infill_engine.sampler import SamplerConfig, StepView, denoise_span
from infill_engine.special_tokens import END_OF_SPAN_TOKEN, MASK_TOKEN, PAD_TOKEN, resolve_special_tokens
from infill_engine.stats import FillStats
from tests import tiny_models

EXPAND, DELETE = "<|expand|>", "<|delete|>"
ONE_A_STEP = SamplerConfig(steps=64, threshold=1.0, min_tokens=1)


@pytest.fixture(scope="module")
def dreamon_tokenizer():
    """The tiny tokenizer with DreamOn's length-control tokens besides mask, pad and end-of-span."""
    return tiny_models.build_tokenizer({"pad": PAD_TOKEN, "mask": MASK_TOKEN, "end_of_span": END_OF_SPAN_TOKEN,
                                        "expand": EXPAND, "delete": DELETE})


class LengthScripted(Denoiser):
    """Wants the span to be exactly `target`: at a canvas too short it predicts expand at the first mask, too long
    delete at the last mask (surer than any token, so it is committed first), and otherwise the target's token at
    each position (peaked by `margin`)."""

    family = "scripted"
    noise = "mask"
    block_mode = "restrict"

    def __init__(self, tokenizer, target: str, margin: float = 12.0) -> None:
        config = type("Config", (), {"max_position_embeddings": 4096})()
        weights = torch.nn.Module()
        weights.out = torch.nn.Linear(1, len(tokenizer), bias=False)
        weights.get_output_embeddings = lambda: weights.out
        super().__init__(weights, tokenizer, resolve_special_tokens(tokenizer, config), "scripted")
        self.model.config = config
        self.target = tokenizer(target, add_special_tokens=False)["input_ids"]
        self.margin = margin
        self.lengths: list[int] = []  # canvas length seen by each forward pass

    def encode(self, prefix_ids, suffix_ids, span_length, batch_size) -> EncodedContext:
        return EncodedContext(prefix_ids, suffix_ids, span_length, batch_size)

    def predict(self, context, canvas, self_conditioning=None) -> torch.Tensor:
        length = canvas.shape[1]
        self.lengths.append(length)
        masks = (canvas[0] == self.special.mask_id).nonzero().flatten().tolist()
        wanted = [self.target[i] if i < len(self.target) else self.special.end_of_span_ids[0] for i in range(length)]
        logits = torch.zeros(1, length, self.vocab_size)
        logits[0, torch.arange(length), torch.tensor(wanted)] = self.margin
        if length < len(self.target) and masks:  # surer than any token, so committed first (when allowed)
            logits[0, masks[0], self.special.expand_id] = 2 * self.margin
        elif length > len(self.target) and masks:
            logits[0, masks[-1], self.special.delete_id] = 2 * self.margin
        return logits


def text_of(tokenizer, span) -> str:
    """The first row of a span up to its first end-of-span token."""
    end = tokenizer.convert_tokens_to_ids(END_OF_SPAN_TOKEN)
    row = span.tokens[0].tolist()
    return tokenizer.decode(row[: row.index(end)] if end in row else row)


def test_the_tokens_are_read_from_the_tokenizer(dreamon_tokenizer, tokenizer):
    special = resolve_special_tokens(dreamon_tokenizer, type("C", (), {})())
    assert special.expand_id == dreamon_tokenizer.convert_tokens_to_ids(EXPAND)
    assert special.delete_id == dreamon_tokenizer.convert_tokens_to_ids(DELETE)
    assert {special.expand_id, special.delete_id} <= set(special.ids_never_generated)  # never in a fixed canvas
    assert resolve_special_tokens(tokenizer, type("C", (), {})()).expand_id is None


def test_the_span_grows_one_position_per_expand(dreamon_tokenizer):
    target = "return [v * factor for v in values]"
    denoiser = LengthScripted(dreamon_tokenizer, target)
    assert len(denoiser.target) > INITIAL_MASKS
    span = denoise_growing_span(denoiser, [], [], 32, ONE_A_STEP)
    assert text_of(dreamon_tokenizer, span) == target
    grown = denoiser.lengths[: len(denoiser.target) - INITIAL_MASKS + 1]
    assert grown == list(range(INITIAL_MASKS, len(denoiser.target) + 1))  # one more position per step
    assert span.tokens.shape == (1, 32)


def test_the_span_shrinks_one_position_per_delete(dreamon_tokenizer):
    denoiser = LengthScripted(dreamon_tokenizer, "x")
    assert len(denoiser.target) < INITIAL_MASKS
    span = denoise_growing_span(denoiser, [], [], 32, ONE_A_STEP)
    assert text_of(dreamon_tokenizer, span) == "x"
    assert denoiser.lengths[: INITIAL_MASKS] == list(range(INITIAL_MASKS, 0, -1))


def test_the_maximum_length_guards_growth(dreamon_tokenizer):
    target = "return [v * factor for v in values]"
    denoiser = LengthScripted(dreamon_tokenizer, target)
    span = denoise_growing_span(denoiser, [], [], 6, ONE_A_STEP)
    assert max(denoiser.lengths) == 6
    assert dreamon_tokenizer.decode(span.tokens[0].tolist()) == dreamon_tokenizer.decode(denoiser.target[:6])


def test_delete_never_empties_the_span(dreamon_tokenizer):
    denoiser = LengthScripted(dreamon_tokenizer, "")
    span = denoise_growing_span(denoiser, [], [], 8, ONE_A_STEP)
    assert min(denoiser.lengths) == ONE_A_STEP.min_tokens
    assert span.tokens.shape == (1, 8)


def test_the_step_limit_settles_the_masks_left(dreamon_tokenizer):
    denoiser = LengthScripted(dreamon_tokenizer, "return a + b")
    stats = FillStats()
    views: list[StepView] = []
    span = denoise_growing_span(denoiser, [], [], 32, SamplerConfig(steps=2, threshold=1.0), stats=stats,
                                on_step=views.append)
    assert len(views) == 2
    assert stats.forward_passes == 3  # two steps and the final argmax
    assert dreamon_tokenizer.mask_token_id not in span.tokens[0].tolist()


def test_an_engine_fills_growing_spans_only_for_models_with_the_tokens(dreamon_tokenizer, tokenizer):
    from tests.scripted import ScriptedDenoiser

    growing = InfillEngine(LengthScripted(dreamon_tokenizer, "a + b"), sampler=ONE_A_STEP)
    result = growing.fill(InfillRequest(prefix="return ", suffix="\n", max_tokens=16, gate=False))
    assert result.candidates[0].text == "a + b"
    assert growing._fill_span is denoise_growing_span
    assert InfillEngine(ScriptedDenoiser(tokenizer, ["a + b"]))._fill_span is denoise_span


def test_a_tiny_dream_model_with_the_tokens_loads_and_fills(tmp_path):
    directory = tiny_models.build_remote_code(tmp_path / "dreamon", "dream", extra_tokens=(EXPAND, DELETE))
    denoiser = load_denoiser(directory, trust_remote_code=True)
    assert denoiser.special.expand_id is not None and denoiser.special.delete_id is not None
    engine = InfillEngine(denoiser, sampler=SamplerConfig(steps=12, threshold=1.0))
    assert engine._fill_span is denoise_growing_span
    result = engine.fill(InfillRequest(prefix="def add(a, b):\n    return ", suffix="\n", max_tokens=8, gate=False))
    assert result.stats.forward_passes >= 1
    written = {t for c in result.candidates + result.rejected for t in c.token_ids}
    assert not written & {denoiser.special.expand_id, denoiser.special.delete_id, denoiser.special.mask_id}
