"""InfillEngine.refine: a text denoised again from its own tokens, the confident ones kept."""

from __future__ import annotations

import pytest

from infill_engine.engine import InfillEngine, InfillRequest
from infill_engine.sampler import FillCancelled, SamplerConfig
from tests.scripted import ScriptedDenoiser

SURE = SamplerConfig(steps=16, block_size=32)


def engine_with(tokenizer, script: str) -> InfillEngine:
    return InfillEngine(ScriptedDenoiser(tokenizer, [script]), sampler=SURE)


def test_tokens_the_model_doubts_are_decided_again_and_the_rest_kept(tokenizer):
    engine = engine_with(tokenizer, "return a - b")
    result = engine.refine(InfillRequest("def sub(a, b):\n    ", "\n", language="python"), "return a * b")
    assert result.text == "return a - b"
    assert result.stats.forward_passes >= 2  # the scoring pass and at least one denoising step


def test_nothing_is_changed_where_the_model_agrees(tokenizer):
    engine = engine_with(tokenizer, "return a - b")
    result = engine.refine(InfillRequest("def sub(a, b):\n    ", "\n", language="python"), "return a - b")
    assert result.text == "return a - b"  # the text itself (the gate passes it; the caller sees no change)


def test_renoised_ranges_and_room_to_grow_close_a_bracket(tokenizer):
    engine = engine_with(tokenizer, "x = foo(1, 2)")
    result = engine.refine(InfillRequest("", "\ny = 3\n", language="python"), "x = foo(1, 2",
                           renoise=[(7, 8)], keep_above=None)
    assert result.text == "x = foo(1, 2)"
    assert result.candidates[0].gate.ok


def test_the_span_cannot_end_inside_the_text(tokenizer):
    engine = engine_with(tokenizer, "a")  # the model would end the span right after "a"
    result = engine.refine(InfillRequest("x = ", "\n", language=None), "a + b + c + d", renoise=[(2, 3)],
                           keep_above=None, grow=0)
    texts = [c.text for c in result.candidates + result.rejected]
    assert texts and all(t.startswith("a") and t.endswith("c + d") for t in texts)  # the kept tail survives


def test_a_refinement_that_adds_a_syntax_problem_is_rejected(tokenizer):
    engine = engine_with(tokenizer, "foo((1, 2)")
    result = engine.refine(InfillRequest("x = ", "\n", language="python"), "foo(1, 2)", keep_above=0.9, grow=0)
    assert result.text is None and result.rejected


def test_refine_stops_when_the_step_callback_says_so(tokenizer):
    engine = engine_with(tokenizer, "return a - b")
    with pytest.raises(FillCancelled):
        engine.refine(InfillRequest("def sub(a, b):\n    ", "\n"), "return a * b", on_step=lambda view: False)


def test_an_empty_text_cannot_be_refined(tokenizer):
    with pytest.raises(ValueError, match="nothing to refine"):
        engine_with(tokenizer, "x").refine(InfillRequest("a", "b"), "")


@pytest.mark.parametrize("family", ["diffill", "diffusion_gemma", "mlm", "dream", "llada"])
def test_refine_runs_on_every_family(model_dirs, family):
    from infill_engine.loading import load_denoiser

    engine = InfillEngine(load_denoiser(model_dirs[family], trust_remote_code=True), sampler=SURE)
    request = InfillRequest("def add(a, b):\n    ", "\n\nprint(add(1, 2))\n", language="python", candidates=2)
    result = engine.refine(request, "return a + b", keep_above=0.5)
    original = engine.denoiser.tokenizer("return a + b", add_special_tokens=False)["input_ids"]
    for candidate in result.candidates + result.rejected:
        assert len(candidate.token_ids) <= len(original) + 4
    assert result.stats.forward_passes >= 1
