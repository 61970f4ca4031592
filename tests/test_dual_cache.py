"""The dual cache of llada and dream models: exact right after a refresh, refreshed on time, fills that still pass the
gate, and modelling code that cannot take a cache found out and run without one."""

from __future__ import annotations

import logging
from pathlib import Path

import pytest
import torch

from infill_engine.adapters.masked import MaskedDenoiser
from infill_engine.engine import InfillEngine
from infill_engine.interface import ModelSpec
from infill_engine.loading import load_denoiser
from infill_engine.request import InfillRequest
from tests import tiny_models

PREFIX = "def scale(values, factor):\n    result = []\n    for v in values:\n        result.append("
SUFFIX = ")\n    return result\n\n\nprint(scale([1, 2, 3], 2))\n"


@pytest.fixture(scope="module")
def rope_dirs(tmp_path_factory: pytest.TempPathFactory) -> dict[str, Path]:
    """Tiny Dream- and LLaDA-style checkpoints of Dream's architecture (rotary positions, a key/value cache)."""
    root = tmp_path_factory.mktemp("rope")
    return {family: tiny_models.build_remote_code(root / family, family, rope=True) for family in ("dream", "llada")}


def uncached_twin(denoiser: MaskedDenoiser) -> MaskedDenoiser:
    """The same model and tokenizer behind an adapter that runs the whole sequence every step."""
    return MaskedDenoiser(denoiser.model, denoiser.tokenizer, denoiser.special, denoiser.path, denoiser.family,
                          shift_logits=denoiser.shift_logits)


def context_ids(denoiser: MaskedDenoiser) -> tuple[list[int], list[int]]:
    return (denoiser.tokenizer(PREFIX)["input_ids"], denoiser.tokenizer(SUFFIX)["input_ids"])


@pytest.mark.parametrize("family", ["dream", "llada"])
@torch.no_grad()
def test_a_step_right_after_a_refresh_equals_the_uncached_step(rope_dirs, family):
    cached = load_denoiser(rope_dirs[family], trust_remote_code=True, dual_cache=3)
    plain = uncached_twin(cached)
    prefix, suffix = context_ids(cached)
    mask = cached.special.mask_id
    with_cache, without = cached.encode(prefix, suffix, 8, 2), plain.encode(prefix, suffix, 8, 2)
    canvas = torch.full((2, 8), mask)
    generator = torch.Generator().manual_seed(0)
    differences = []
    for step in range(7):  # refreshes at steps 0, 3 and 6; the canvas changes every step, as in a fill
        difference = (cached.predict(with_cache, canvas) - plain.predict(without, canvas)).abs().max().item()
        differences.append(difference)
        canvas[:, step] = torch.randint(0, len(cached.tokenizer), (2,), generator=generator)
    assert cached.dual_cache.usable
    assert with_cache.state[2].refreshes == 3 and with_cache.state[2].cached_steps == 4
    assert all(differences[step] == 0.0 for step in (0, 3, 6))
    # between refreshes the kept prefix and suffix saw an older canvas: an approximation
    assert all(differences[step] > 0.0 for step in (1, 2, 4, 5))


@torch.no_grad()
def test_a_cached_step_on_the_refreshed_canvas_is_exact(rope_dirs):
    cached = load_denoiser(rope_dirs["dream"], trust_remote_code=True, dual_cache=4)
    plain = uncached_twin(cached)
    prefix, suffix = context_ids(cached)
    canvas = torch.full((1, 6), cached.special.mask_id)
    context = cached.encode(prefix, suffix, 6, 1)
    cached.predict(context, canvas)  # the refresh
    again = cached.predict(context, canvas)  # the canvas alone against the kept keys and values
    assert context.state[2].cached_steps == 1
    torch.testing.assert_close(again, plain.predict(plain.encode(prefix, suffix, 6, 1), canvas), rtol=1e-4,
                               atol=1e-4)


@torch.no_grad()
def test_a_new_batch_size_or_canvas_length_refreshes_at_once(rope_dirs):
    cached = load_denoiser(rope_dirs["dream"], trust_remote_code=True, dual_cache=8)
    plain = uncached_twin(cached)
    prefix, suffix = context_ids(cached)
    context = cached.encode(prefix, suffix, 4, 2)
    cached.predict(context, torch.full((2, 4), cached.special.mask_id))
    fewer = cached.predict(context, torch.full((1, 4), cached.special.mask_id))  # one candidate left
    assert fewer.shape[0] == 1 and context.state[2].refreshes == 2
    longer = torch.full((1, 5), cached.special.mask_id)  # a growing span (DreamOn): the suffix moved
    assert torch.equal(cached.predict(context, longer), plain.predict(plain.encode(prefix, suffix, 5, 1), longer))
    assert context.state[2].refreshes == 3


@pytest.mark.parametrize("family", ["dream", "llada"])
def test_fills_with_the_cache_start_as_without_it_complete_and_pass_the_gate(rope_dirs, family):
    with_cache = InfillEngine.load(ModelSpec(path=str(rope_dirs[family]), trust_remote_code=True, dual_cache=4))
    without = InfillEngine.load(ModelSpec(path=str(rope_dirs[family]), trust_remote_code=True, dual_cache=0))
    assert with_cache.denoiser.dual_cache is not None and without.denoiser.dual_cache is None
    default = InfillEngine.load(ModelSpec(path=str(rope_dirs[family]), trust_remote_code=True)).denoiser.dual_cache
    assert default is not None and default.refresh_every == 2  # on by default, every second step
    # single-line fills inside comments: any text passes the gate, so both loops must give a fill every time
    holes = [("x = compute(a, b)  # ", "\nprint(x)\n"), ("def f():\n    # ", "\n    return 1\n"),
             (PREFIX + "v)  # ", SUFFIX)]
    for prefix, suffix in holes:
        request = InfillRequest(prefix, suffix, language="python", max_tokens=16, candidates=2, single_line=True)
        first_steps = []
        results = [engine.fill(request, on_step=lambda view: first_steps.append(view.canvas.clone())
                               if view.step == 0 and view.block == 0 else None) for engine in (with_cache, without)]
        assert torch.equal(first_steps[0], first_steps[1])  # the first step is a refresh: exact
        for result in results:
            assert result.candidates and all(candidate.gate.ok for candidate in result.candidates)
            assert all(candidate.text and "\n" not in candidate.text for candidate in result.candidates)
    assert with_cache.denoiser.dual_cache.usable


class PositionsFromCacheLength(torch.nn.Module):
    """LLaDA's own code in miniature: it takes a cache but derives rotary positions from the cache's length."""

    def __init__(self, model: torch.nn.Module) -> None:
        super().__init__()
        self.inner = model
        self.config = model.config

    def get_output_embeddings(self):
        return self.inner.get_output_embeddings()

    def forward(self, input_ids, position_ids=None, past_key_values=None, use_cache=False, **kwargs):
        return self.inner(input_ids=input_ids, past_key_values=past_key_values, use_cache=use_cache)


@pytest.mark.parametrize("wrap", ["no cache returned", "positions ignored"])
@torch.no_grad()
def test_modelling_code_that_cannot_take_the_cache_runs_without_it(rope_dirs, model_dirs, caplog, wrap):
    if wrap == "no cache returned":  # a plain encoder stack: takes **kwargs, returns no key/value cache
        source = load_denoiser(model_dirs["dream"], trust_remote_code=True, dual_cache=0)
        model = source.model
    else:
        source = load_denoiser(rope_dirs["llada"], trust_remote_code=True, dual_cache=0)
        model = PositionsFromCacheLength(source.model)
    cached = MaskedDenoiser(model, source.tokenizer, source.special, source.path, source.family,
                            shift_logits=source.shift_logits, refresh_every=4)
    plain = MaskedDenoiser(model, source.tokenizer, source.special, source.path, source.family,
                           shift_logits=source.shift_logits)
    prefix, suffix = context_ids(cached)
    with_cache, without = cached.encode(prefix, suffix, 6, 1), plain.encode(prefix, suffix, 6, 1)
    canvas = torch.full((1, 6), cached.special.mask_id)
    with caplog.at_level(logging.WARNING, logger="infill_engine.dual_cache"):
        for step in range(3):
            assert torch.equal(cached.predict(with_cache, canvas), plain.predict(without, canvas))
            canvas[0, step] = prefix[step]
    assert cached.dual_cache.usable is False
    assert sum("dual cache off" in record.getMessage() for record in caplog.records) == 1


def test_the_setting_says_what_is_allowed():
    with pytest.raises(ValueError, match="dual_cache must be an integer >= 0"):
        ModelSpec(dual_cache=-1)
    with pytest.raises(ValueError, match="refresh_every must be an integer >= 1"):
        from infill_engine.dual_cache import DualCache

        DualCache(torch.nn.Linear(1, 1), 0, False, "x")


def test_bench_cache_compares_steps_on_transformers_own_bidirectional_qwen2(monkeypatch, capsys):
    """`diffill bench cache` at a tiny size: transformers' Qwen2 with is_causal=False (Dream's architecture) takes
    the cache through its `cache` argument, the probe accepts it, and every span gets a row."""
    import argparse
    import json

    from infill_engine.commands import bench_cache

    tiny = dict(hidden_size=32, intermediate_size=64, num_hidden_layers=2, num_attention_heads=4,
                num_key_value_heads=2, vocab_size=128, rope_theta=10_000.0, tie_word_embeddings=True,
                max_position_embeddings=256, mask_token_id=127, pad_token_id=126)
    monkeypatch.setitem(bench_cache.REAL_CONFIGS, "tiny", tiny)
    parser = argparse.ArgumentParser()
    run = bench_cache.add_kinds(parser.add_subparsers(dest="kind"))["cache"]
    args = parser.parse_args(["cache", "--config", "tiny", "--context", "40", "--spans", "4", "8", "--json"])
    assert run(args) == 0
    report = json.loads(capsys.readouterr().out)
    assert [row["span"] for row in report["spans"]] == [4, 8]
    assert all(row["cached_ms"] > 0 and row["uncached_ms"] > 0 for row in report["spans"])
