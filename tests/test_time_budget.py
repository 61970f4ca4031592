"""A time budget per request: past it the loop takes its argmax, repairs are skipped and the result says so."""

from __future__ import annotations

import pytest

from infill_engine.engine import InfillEngine, InfillRequest
from infill_engine.loading import load_denoiser
from infill_engine.sampler import SamplerConfig
from infill_engine.service.wire import request_from_wire, request_to_wire
from tests.scripted import ScriptedDenoiser

UNSURE = SamplerConfig(steps=16, block_size=32, greedy_first=False)  # both candidates greedy


def broken_and_good(tokenizer) -> InfillEngine:
    """Two candidates, one unbalancing the brackets; every token unsure, so each takes steps."""
    return InfillEngine(ScriptedDenoiser(tokenizer, ["x))", "x"], margin=2.0), sampler=UNSURE)


def test_a_budget_of_zero_returns_after_one_step_and_skips_repairs(tokenizer):
    request = InfillRequest("print(foo(", "))\n", language="python", max_tokens=8, candidates=2, budget_ms=0)
    result = broken_and_good(tokenizer).fill(request)
    assert result.stats.forward_passes == 1
    assert result.stats.over_budget and result.stats.repairs == 0
    assert [c.text for c in result.candidates] == ["x"]  # the best candidate that passes the gate
    assert [(c.text, c.repairs) for c in result.rejected] == [("x))", 0)]


def test_without_a_budget_the_fill_runs_its_steps_and_repairs(tokenizer):
    request = InfillRequest("print(foo(", "))\n", language="python", max_tokens=8, candidates=2)
    result = broken_and_good(tokenizer).fill(request)
    assert result.stats.forward_passes > 8  # a position per step, then the repair rounds
    assert result.stats.repairs == 2 and not result.stats.over_budget
    assert [c.text for c in result.candidates] == ["x"]


def test_a_budget_of_zero_takes_one_step_of_the_tiny_model(model_dirs):
    engine = InfillEngine(load_denoiser(model_dirs["diffill"]))
    result = engine.fill(InfillRequest("def add(a, b):\n    return ", "\n", language="python", max_tokens=16,
                                       budget_ms=0))
    assert result.stats.forward_passes == 1 and result.stats.over_budget
    assert len(result.candidates) + len(result.rejected) == 1


@pytest.mark.parametrize("budget", [-1, 1.5, True, "100"])
def test_a_bad_budget_says_what_is_allowed(budget):
    with pytest.raises(ValueError, match="budget_ms must be an integer >= 0"):
        InfillRequest("a", "b", budget_ms=budget).validate()
    with pytest.raises(ValueError, match="budget_ms"):
        request_from_wire({"prefix": "a", "suffix": "b", "budget_ms": budget})


def test_the_budget_travels_to_a_shared_engine():
    request = InfillRequest("a", "b", budget_ms=120)
    assert request_from_wire(request_to_wire(request)).budget_ms == 120


def test_the_completion_settings_reach_the_engine(tokenizer):
    """`completion.budgetMs` for ghost text while typing, `completion.askedBudgetMs` for a fill the user asked for."""
    from lsp_server.completion import FillKind, fill_job
    from lsp_server.context import cursor_at
    from lsp_server.scheduler import Ticket
    from lsp_server.settings import parse_settings

    settings, problems = parse_settings({"completion": {"budgetMs": 0, "askedBudgetMs": None}})
    assert not problems and settings.completion.budget_ms == 0 and settings.completion.asked_budget_ms is None
    engine = InfillEngine(ScriptedDenoiser(tokenizer, ["a + b"], margin=2.0), sampler=UNSURE)
    text = "def add(a, b):\n    return \n"
    cursor = cursor_at(text, text.index("\n    return ") + 12)
    typing = fill_job(engine, cursor, "python", settings, [], Ticket("file:///add.py", "fill", 1),
                      FillKind.of(settings, asked=False))
    assert typing.stats["over_budget"] and typing.stats["forward_passes"] == 1
    asked = fill_job(engine, cursor, "python", settings, [], Ticket("file:///add.py", "fill", 1),
                     FillKind.of(settings, asked=True))
    assert not asked.stats["over_budget"] and asked.stats["forward_passes"] > 1
    assert parse_settings({"completion": {"budgetMs": -5}})[0].completion.budget_ms == 250  # the default, reported
    assert parse_settings({"completion": {"askedBudgetMs": "x"}})[0].completion.asked_budget_ms == 1000
