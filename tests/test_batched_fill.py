"""Fills of different requests in shared forward passes (`infill_engine.batched_fill`) on the tiny diffill model:
each request gets exactly what it gets alone, fewer forward passes are run, and a cancelled fill stops alone."""

from __future__ import annotations

import pytest

from infill_engine.batched_fill import FillBatcher
from infill_engine.engine import InfillEngine
from infill_engine.interface import EngineOptions, ModelSpec
from infill_engine.request import FillCancelled, InfillRequest
from tests import tiny_models

# different context lengths, canvas lengths, candidates, seeds, single-line cuts; gated ones get repaired
REQUESTS = [
    InfillRequest("def add(a, b):\n    return ", "\n", language="python", max_tokens=8),
    InfillRequest("import os\nimport sys\n\nvalues = {'a': 1, 'b': (2, 3)}\nfor i in range(10):\n    print(", ")\n",
                  max_tokens=12, candidates=2, gate=False),
    InfillRequest("x = ", "", max_tokens=16, seed=7, language="python"),
    InfillRequest("class Point:\n    def __init__(self, x, y):\n        self.x = ", "\n        self.y = y\n",
                  max_tokens=6, candidates=3, single_line=True, language="python"),
]


@pytest.fixture(scope="module")
def engine(tmp_path_factory) -> InfillEngine:
    """Every pass over the whole canvas, as a shared pass runs it (the canvas keys kept between steps are a fill's
    own approximation, which a merged pass does not make)."""
    engine = InfillEngine.load(ModelSpec(path=str(tiny_models.build_diffill(tmp_path_factory.mktemp("diffill")))))
    return engine.with_options(EngineOptions(canvas_refresh=0))


@pytest.fixture(scope="module")
def alone(engine) -> list[tuple]:
    """Each request filled on its own."""
    return [outcome(engine.fill(request)) for request in REQUESTS]


def outcome(result) -> tuple:
    """What a user sees of a fill: every candidate's text, the rejected ones, and the passes it took."""
    return ([c.text for c in result.candidates], [c.text for c in result.rejected], result.stats.forward_passes,
            result.stats.repairs)


def test_requests_filled_together_get_what_each_gets_alone_in_fewer_forward_passes(engine, alone):
    batcher = FillBatcher(engine, max_batch_size=8)
    together = batcher.run_together([lambda e, r=r: e.fill(r) for r in REQUESTS])
    assert [outcome(result) for result in together] == alone
    counts = batcher.lockstep.counts
    assert counts.sizes[len(REQUESTS)] >= 2  # the four encodes, then at least the first step, in one pass each
    assert counts.forwards < counts.calls  # the passes the fills asked for were shared


def test_a_cancelled_fill_stops_at_its_next_step_and_the_others_finish(engine, alone):
    steps = []

    def give_up(view) -> bool:
        steps.append(view.step)
        return view.step < 1  # the client went away after the first step

    batcher = FillBatcher(engine, max_batch_size=8)
    results = batcher.run_together([lambda e: e.fill(REQUESTS[0]), lambda e: e.fill(REQUESTS[2], give_up),
                                    lambda e: e.fill(REQUESTS[1])])
    assert isinstance(results[1], FillCancelled) and steps == [0, 1]
    assert [outcome(results[0]), outcome(results[2])] == alone[:2]


def test_more_requests_than_the_batch_size_wait_their_turn_and_a_bad_one_fails_alone(engine, alone):
    bad = InfillRequest("x", "", max_tokens=0)
    batcher = FillBatcher(engine, max_batch_size=2)
    results = batcher.run_together([lambda e, r=r: e.fill(r) for r in (*REQUESTS[:3], bad)])
    assert [outcome(r) for r in results[:3]] == alone[:3]
    assert isinstance(results[3], ValueError) and "max_tokens" in str(results[3])
    assert max(batcher.lockstep.counts.sizes) <= 2
    with pytest.raises(ValueError, match="max_batch_size"):
        FillBatcher(engine, max_batch_size=0)


def test_concurrent_clients_of_the_http_app_share_forward_passes_and_get_their_own_fills(engine, alone):
    import asyncio

    from infill_engine.http.app import InfillApp
    from tests.test_http import call_app

    batcher = FillBatcher(engine, max_batch_size=8)
    app = InfillApp(engine, batcher=batcher)
    bodies = [{"prefix": r.prefix, "suffix": r.suffix, "language": r.language, "max_tokens": r.max_tokens,
               "candidates": r.candidates, "seed": r.seed, "single_line": r.single_line, "gate": r.gate}
              for r in REQUESTS]

    async def all_at_once():
        return await asyncio.gather(*(call_app(app, "/v1/fill", body) for body in bodies))

    answers = asyncio.run(all_at_once())
    assert [status for status, _ in answers] == [200] * len(REQUESTS)
    assert [([c["text"] for c in body["candidates"]], [c["text"] for c in body["rejected"]])
            for _, body in answers] == [texts[:2] for texts in alone]
    status = app.status()["batching"]
    assert status["max_batch_size"] == 8 and status["forwards"] < status["calls"]


def test_a_model_converted_from_an_autoregressive_one_fills_together_as_alone(tmp_path):
    """shift_logits and causal_context (a converted checkpoint): the first canvas position reads the output of the
    context token before it, per row; a request without a prefix reads its own first position, the others not."""
    import json

    directory = tiny_models.build_diffill(tmp_path / "converted")
    config = json.loads((directory / "config.json").read_text())
    (directory / "config.json").write_text(json.dumps({**config, "shift_logits": True, "causal_context": True}))
    engine = InfillEngine.load(ModelSpec(path=str(directory)))
    requests = [InfillRequest("", "\nprint(x)\n", max_tokens=6, gate=False), REQUESTS[0], REQUESTS[1]]
    alone = [outcome(engine.fill(request)) for request in requests]
    batcher = FillBatcher(engine, max_batch_size=8)
    assert [outcome(r) for r in batcher.run_together([lambda e, r=r: e.fill(r) for r in requests])] == alone
    assert batcher.lockstep.counts.sizes[len(requests)] >= 2
