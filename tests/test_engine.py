"""The engine end to end: canvas, loop, end-of-span, syntax gate, repair, ranking and counters."""

from __future__ import annotations

from dataclasses import replace

import pytest

from infill_engine.interface import ModelSpec
from infill_engine.engine import InfillEngine, InfillRequest
from infill_engine.sampler import SamplerConfig
from tests.scripted import ScriptedDenoiser

SURE = SamplerConfig(steps=16, block_size=32)


def engine_with(tokenizer, scripts, **kwargs) -> InfillEngine:
    return InfillEngine(ScriptedDenoiser(tokenizer, scripts, **kwargs), sampler=SURE)


def test_fill_ends_where_the_model_writes_end_of_span(tokenizer):
    engine = engine_with(tokenizer, ["a + b"])
    result = engine.fill(InfillRequest("def add(a, b):\n    return ", "\n", language="python", max_tokens=32))
    assert result.text == "a + b"
    assert result.stats.tokens_generated == len(tokenizer("a + b", add_special_tokens=False)["input_ids"])


def test_gate_rejects_a_candidate_that_unbalances_brackets(tokenizer):
    engine = engine_with(tokenizer, ["x))", "x"])
    request = InfillRequest("print(foo(", "))\n", language="python", max_tokens=8, candidates=2)
    result = engine.fill(request)
    assert [c.text for c in result.candidates] == ["x"]
    assert [c.text for c in result.rejected] == ["x))"]
    assert result.rejected[0].gate.new_problems


def test_with_the_gate_off_raw_candidates_are_returned(tokenizer):
    engine = engine_with(tokenizer, ["x))", "x"])
    request = InfillRequest("print(foo(", "))\n", language="python", max_tokens=8, candidates=2, gate=False)
    result = engine.fill(request)
    assert sorted(c.text for c in result.candidates) == ["x", "x))"]
    assert not result.rejected


def test_repair_renoises_the_broken_region_and_keeps_a_fixed_candidate(tokenizer):
    denoiser = ScriptedDenoiser(tokenizer, ["foo(x"], later_scripts=["foo(x)"])
    engine = InfillEngine(denoiser, sampler=SURE)
    result = engine.fill(InfillRequest("y = ", "\nprint(y)\n", language="python", max_tokens=8))
    assert result.text == "foo(x)"
    assert result.candidates[0].repairs == 1
    assert result.stats.repairs == 1
    assert result.candidates[0].gate.ok


def test_a_candidate_that_cannot_be_repaired_is_dropped(tokenizer):
    engine = engine_with(tokenizer, ["x))"])
    result = engine.fill(InfillRequest("print(foo(", "))\n", language="python", max_tokens=8))
    assert result.text is None
    assert result.rejected[0].repairs == engine.repair_rounds


def test_unknown_language_falls_back_to_the_bracket_check(tokenizer):
    engine = engine_with(tokenizer, ["x))", "x"])
    result = engine.fill(InfillRequest("call(", ")\n", language="cobol", max_tokens=8, candidates=2))
    assert [c.text for c in result.candidates] == ["x"]
    assert result.rejected[0].gate.checker == "lexical"


def test_counters_and_timings_are_reported(tokenizer):
    engine = engine_with(tokenizer, ["return a + b"])
    stats = engine.fill(InfillRequest("def f(a, b):\n    ", "\n", language="python", max_tokens=16)).stats
    assert stats.forward_passes >= 1
    assert stats.tokens_per_forward == pytest.approx(stats.tokens_generated / stats.forward_passes)
    assert {"total", "tokenize", "encode", "denoise", "gate"} <= set(stats.ms)


def test_empty_document_still_fills(tokenizer):
    result = engine_with(tokenizer, ["x = 1"]).fill(InfillRequest("", "", language="python", max_tokens=8))
    assert result.text == "x = 1"


@pytest.mark.parametrize(
    "request_args, message",
    [({"max_tokens": 0}, "max_tokens must be an integer from 1"),
     ({"candidates": 99}, "candidates must be an integer from 1"),
     ({"max_tokens": 5000}, "max_tokens must be an integer from 1")],
)
def test_bad_requests_say_what_is_allowed(tokenizer, request_args, message):
    with pytest.raises(ValueError, match=message):
        engine_with(tokenizer, ["x"]).fill(InfillRequest("a", "b", **request_args))


def test_real_tiny_model_fills_a_five_megabyte_document(model_dirs):
    engine = InfillEngine.load(ModelSpec(path=str(model_dirs["diffill"])))
    body = "def f(x):\n    return x + 1\n\n" * 190_000  # about 5 MB
    result = engine.fill(InfillRequest(body + "y = ", "\n" + body, language="python", max_tokens=8, gate=True))
    assert result.stats.forward_passes >= 1
    assert len(result.candidates) + len(result.rejected) == 1


def test_single_line_fill_ends_at_the_first_line_break(tokenizer):
    engine = engine_with(tokenizer, ["a + b\nprint(x)"])
    result = engine.fill(InfillRequest("y = ", " # sum\n", language="python", max_tokens=16, single_line=True))
    assert result.text == "a + b"


def test_single_line_fill_stops_denoising_at_the_line_break(tokenizer):
    from dataclasses import replace

    # every position is under the commit threshold, the leftmost most confident: one commit per step, left to right
    script = "a + b\nprint(x + y)\n"
    margins = [6.0 - 0.1 * i for i in range(24)]
    runs = {}
    for single_line in (False, True):
        denoiser = ScriptedDenoiser(tokenizer, [script], confidence=margins)
        engine = InfillEngine(denoiser, sampler=replace(SURE, steps=24))
        result = engine.fill(InfillRequest("y = ", "\n", language="python", max_tokens=24, gate=False,
                                           single_line=single_line))
        runs[single_line] = (result.candidates[0].text, denoiser.calls)
    line_tokens = len(tokenizer("a + b\n", add_special_tokens=False)["input_ids"])
    assert runs[True] == ("a + b", line_tokens)  # one step per token up to and including the line break
    assert runs[False][0].startswith("a + b\nprint(") and runs[False][1] > line_tokens


def test_no_repair_budget_rejects_at_once(tokenizer):
    denoiser = ScriptedDenoiser(tokenizer, ["foo(x"], later_scripts=["foo(x)"])
    engine = InfillEngine(denoiser, sampler=SURE)
    result = engine.fill(InfillRequest("y = ", "\n", language="python", max_tokens=8, repair_rounds=0))
    assert result.text is None and result.stats.repairs == 0


def test_scores_are_the_models_probabilities_not_the_sampling_temperatures(tokenizer):
    from dataclasses import replace

    denoiser = ScriptedDenoiser(tokenizer, ["x"], margin=3.0)  # p(x) is about 0.07
    hot = InfillEngine(denoiser, sampler=replace(SURE, temperature_start=0.2, temperature_end=0.2))  # p(x) ~ 1 there
    cold = InfillEngine(denoiser, sampler=SURE)
    request = InfillRequest("y = ", "\n", language="python", max_tokens=4)
    assert hot.fill(request).candidates[0].score == pytest.approx(cold.fill(request).candidates[0].score, abs=1e-4)


def test_a_request_that_requires_content_gets_more_than_whitespace_over_the_wire_too():
    """The model would write a space and end; `require_content` holds the end back until it has written more. The
    flag travels to a shared engine, and anything but true or false is refused."""
    from infill_engine.service.wire import request_from_wire, request_to_wire
    from tests.lsp.fake_engine import build_engine

    engine = build_engine(None)
    request = InfillRequest("def pad(a):\n    return", "\n", language="python", max_tokens=8)
    assert engine.fill(request).text == " "
    wanted = request_from_wire(request_to_wire(replace(request, require_content=True)))
    assert wanted.require_content and engine.fill(wanted).text == " a"
    with pytest.raises(ValueError, match="require_content must each be true or false"):
        request_from_wire({"prefix": "a", "suffix": "b", "require_content": "yes"})


def test_repairs_run_against_the_fills_own_context_and_write_what_a_fresh_encode_would(model_dirs):
    """The embedded architecture's steps leave an encoded context as it was, so a fill's repair rounds reuse it:
    the same repaired text as with the context encoded again each round, and one encode for the whole fill."""
    from infill_engine.loading import load_denoiser

    denoiser = load_denoiser(str(model_dirs["diffill"]))
    engine = InfillEngine(denoiser, sampler=SamplerConfig(steps=8, block_size=32))
    assert denoiser.reuses_context
    repaired = None
    for seed in range(20):  # the random model breaks the syntax often; find a fill that needed repairs
        request = InfillRequest("values = [1, 2\ntotal = sum(", ")\n", language="python", max_tokens=12,
                                candidates=2, seed=seed, repair_rounds=2)
        reused = engine.fill(request)
        if reused.stats.repairs:
            repaired = request
            break
    assert repaired is not None, "no fill of the random model needed a repair"
    denoiser.reuses_context = False  # the instance's switch: each round encodes the context again
    fresh = engine.fill(repaired)
    texts = lambda result: [c.text for c in result.candidates + result.rejected]  # noqa: E731
    assert texts(reused) == texts(fresh) and reused.stats.repairs == fresh.stats.repairs
    assert reused.stats.context_encodes == 1
    assert fresh.stats.context_encodes == 1 + fresh.stats.repairs
