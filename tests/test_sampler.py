"""The denoising loop: every branch of SamplerConfig on a scripted denoiser and on tiny real models."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
import torch

from infill_engine.adapters.base import EncodedContext
from infill_engine.loading import load_denoiser
from infill_engine.sampler import (
    FillCancelled,
    SamplerConfig,
    StepView,
    denoise_span,
    pick_tokens,
    row_temperatures,
    temperature_at,
)
from infill_engine.stats import FillStats
from tests.scripted import ScriptedDenoiser
from tests import tiny_models

GREEDY = SamplerConfig(steps=64, block_size=64, threshold=0.9, stability_steps=0, confidence_threshold=0.0)


def committed_counts(denoiser, config, span_length, batch=1, **kwargs):
    """Run the loop and return the number of committed positions after each step, and the result."""
    counts: list[list[int]] = []

    def record(view: StepView) -> None:
        counts.append(view.committed.sum(dim=-1).tolist())

    span = denoise_span(denoiser, [], [], span_length, config, batch_size=batch, on_step=record, **kwargs)
    return counts, span


def test_threshold_commits_every_confident_position_in_one_step(tokenizer):
    denoiser = ScriptedDenoiser(tokenizer, ["return a + b"], margin=14.0)
    stats = FillStats()
    span = denoise_span(denoiser, [], [], 12, GREEDY, stats=stats)
    assert stats.forward_passes == 1
    text = tokenizer.decode([t for t in span.tokens[0].tolist() if t not in denoiser.special.end_of_span_ids])
    assert text == "return a + b"


def test_threshold_commits_at_least_one_position_per_step_when_unsure(tokenizer):
    denoiser = ScriptedDenoiser(tokenizer, ["return a + b"], margin=2.0)
    counts, _ = committed_counts(denoiser, GREEDY, 8)
    increments = [b[0] - a[0] for a, b in zip([[0]] + counts, counts)]
    assert all(step >= 1 for step in increments)
    assert counts[-1][0] == 8


def test_the_one_position_an_unsure_step_commits_is_its_surest_free_one_the_first_of_equals():
    from infill_engine.commit_rules import by_threshold, take_best

    scores = torch.tensor([[0.3, 0.7, 0.7, 0.2], [0.5, 0.1, 0.4, 0.6], [0.9, 0.8, 0.1, 0.2]])
    free = torch.tensor([[True, True, True, True], [True, True, True, False], [False, False, False, False]])
    chosen = by_threshold(scores, free, threshold=0.95, steps_left=4)
    assert chosen.tolist() == [[False, True, False, False], [True, False, False, False], [False] * 4]
    assert torch.equal(chosen, take_best(scores, free, torch.clamp(free.sum(dim=-1), max=1)))


def test_the_factor_rule_commits_the_leading_run_of_the_surest_that_clears_its_rising_bar():
    """Fast-dLLM's factor rule at f: the i-th surest free position needs 1 - f / (i + 1) (f = 1: 0.67, 0.75, 0.8),
    the run stops at the first that falls short, the surest always goes, committed positions never count."""
    from infill_engine.commit_rules import by_factor

    scores = torch.tensor([[0.7, 0.95, 0.6, 0.1], [0.4, 0.3, 0.2, 0.1], [0.99, 0.5, 0.99, 0.99], [0.9, 0.8, 0.7, 0.6]])
    free = torch.tensor([[True] * 4, [True] * 4, [True, True, True, False], [False] * 4])
    chosen = by_factor(scores, free, 1.0, steps_left=4)
    assert chosen.tolist() == [[True, True, False, False], [True, False, False, False], [True, False, True, False],
                               [False] * 4]
    # a larger factor lowers the bar (f = 2: 0.33, 0.5, 0.6): the third surest of the first row goes too
    assert by_factor(scores, free, 2.0, steps_left=4)[0].tolist() == [True, True, True, False]
    assert by_factor(scores, free, 1.0, steps_left=4, least=3)[1].tolist() == [True, True, True, False]
    with pytest.raises(ValueError, match="factor must be a number > 0"):
        SamplerConfig(commit="factor", factor=0.0)


def test_the_factor_rule_writes_the_same_fill_in_fewer_passes_where_the_model_is_fairly_sure(tokenizer):
    """Every position at about 0.85: the threshold (0.9) commits one a pass, the factor rule several."""
    passes = {}
    for name, config in {"threshold": GREEDY, "factor": replace(GREEDY, commit="factor"),
                         "factor 0.5": replace(GREEDY, commit="factor", factor=0.5)}.items():
        denoiser = ScriptedDenoiser(tokenizer, ["return a + b"], margin=7.0)
        stats = FillStats()
        span = denoise_span(denoiser, [], [], 12, config, stats=stats)
        ids = [t for t in span.tokens[0].tolist() if t not in denoiser.special.end_of_span_ids]
        assert tokenizer.decode(ids) == "return a + b", name
        passes[name] = stats.forward_passes
    assert passes["factor"] < passes["factor 0.5"] <= passes["threshold"], passes


@pytest.mark.parametrize("commit", ["threshold", "schedule", "factor"])
def test_min_commits_commits_that_many_of_the_surest_a_step_but_never_where_content_is_required(tokenizer, commit):
    """settle_tail off, so that only the rule commits: 3 a step with min_commits=3, one a step when unsure (threshold)
    or as the schedule spreads them; a fill that must write something keeps the rule's own count."""
    denoiser = ScriptedDenoiser(tokenizer, ["x" * 20], margin=2.0)  # unsure everywhere: under the threshold
    base = replace(GREEDY, commit=commit, steps=8, settle_tail=False)
    counts, _ = committed_counts(denoiser, replace(base, min_commits=3), 9)
    assert [c[0] for c in counts] == [3, 6, 9]
    plain, _ = committed_counts(ScriptedDenoiser(tokenizer, ["x" * 20], margin=2.0), base, 9)
    asked, _ = committed_counts(ScriptedDenoiser(tokenizer, ["x" * 20], margin=2.0),
                                replace(base, min_commits=3, end_after_content=True), 9)
    assert [c[0] for c in asked] == [c[0] for c in plain] and len(plain) > 3
    with pytest.raises(ValueError, match="min_commits must be an integer >= 1"):
        SamplerConfig(min_commits=0)


def test_schedule_spreads_commits_evenly_over_the_steps(tokenizer):
    denoiser = ScriptedDenoiser(tokenizer, ["x" * 20], margin=2.0)
    config = replace(GREEDY, commit="schedule", steps=4)
    counts, _ = committed_counts(denoiser, config, 8)
    assert [c[0] for c in counts] == [2, 4, 6, 8]


@pytest.mark.parametrize("order", ["confidence", "margin", "entropy"])
def test_surest_position_is_committed_first(tokenizer, order):
    confidence = [1.0, 2.0, 6.0, 3.0, 1.5, 2.5]
    denoiser = ScriptedDenoiser(tokenizer, ["abcdefghij"], confidence=confidence)
    config = replace(GREEDY, order=order, threshold=1.0)
    firsts = []

    def record(view: StepView) -> None:
        firsts.append(view.committed[0].clone())

    denoise_span(denoiser, [], [], 6, config, on_step=record)
    assert firsts[0].nonzero().flatten().tolist() == [2]  # the position with the largest margin
    assert firsts[1].nonzero().flatten().tolist() == [2, 3]


def test_random_order_depends_on_the_seed(tokenizer):
    denoiser = ScriptedDenoiser(tokenizer, ["abcdefghij"], margin=2.0)
    first_positions = set()
    for seed in range(6):
        config = replace(GREEDY, order="random", threshold=1.0, seed=seed)
        counts = []
        denoise_span(denoiser, [], [], 8, config, on_step=lambda v: counts.append(v.committed[0].clone()))
        first_positions.add(int(counts[0].nonzero()[0]))
    assert len(first_positions) > 1


def test_entropy_bound_accepts_only_low_entropy_positions_and_renoises_the_rest(tokenizer):
    confidence = [20.0, 20.0, 1.0, 0.9, 0.8, 0.7]  # distinct: equal entropies would tie within float rounding
    denoiser = ScriptedDenoiser(tokenizer, ["abcdef"], confidence=confidence)
    config = replace(GREEDY, commit="entropy_bound", entropy_bound=0.5, steps=1)
    views = []
    denoise_span(denoiser, [], [], 6, config, on_step=lambda v: views.append((v.canvas.clone(), v.committed.clone())))
    canvas, accepted = views[0]
    # the two sure positions, plus the next one: its own entropy is the max and is not counted against the bound
    assert accepted[0].tolist() == [True, True, True, False, False, False]
    assert (canvas[0, 3:] == denoiser.special.mask_id).all()  # re-noised


class FlipDenoiser(ScriptedDenoiser):
    """Confident of 'a' at position 0 on the first call, then sure it should be 'b'."""

    def predict(self, context, canvas, self_conditioning=None):
        logits = super().predict(context, canvas, self_conditioning)
        a, b = self.tokenizer.convert_tokens_to_ids(["a", "b"])
        logits[:, 0] = 0.0
        logits[:, 0, a if self.calls == 1 else b] = 14.0
        logits[:, 1:] = logits[:, 1:] * (0.1 if self.calls == 1 else 1.0)
        return logits


@pytest.mark.parametrize("revise_below, expected", [(0.5, "b"), (0.0, "a")])
def test_revision_re_decides_a_committed_token_whose_confidence_fell(tokenizer, revise_below, expected):
    denoiser = FlipDenoiser(tokenizer, ["axyz"], margin=14.0)
    span = denoise_span(denoiser, [], [], 4, replace(GREEDY, revise_below=revise_below))
    assert tokenizer.decode(span.tokens[0, :1].tolist()) == expected


def margin_for(denoiser, probability: float) -> float:
    """The logit margin at which a ScriptedDenoiser's target token has this probability."""
    return math.log(probability * (denoiser.vocab_size - 1) / (1 - probability))


class AlternatingDenoiser(ScriptedDenoiser):
    """ScriptedDenoiser, but position 0 predicts 'x' and 'y' by turns, less surely than the other positions."""

    def predict(self, context, canvas, self_conditioning=None):
        logits = super().predict(context, canvas, self_conditioning)
        x, y = self.tokenizer.convert_tokens_to_ids(["x", "y"])
        logits[:, 0] = 0.0
        logits[:, 0, x if self.calls % 2 else y] = self.margin - 0.5
        return logits


@pytest.mark.parametrize("floor, at_once", [(0.0, False), (0.5, True), (0.7, False)])
def test_stable_floor_commits_at_once_what_the_model_said_twice_surely_enough(tokenizer, floor, at_once):
    """p = 0.6 everywhere: one commit a pass, or, from the second pass, every position whose argmax held."""
    denoiser = ScriptedDenoiser(tokenizer, ["return a + b"], margin=12.0)
    denoiser.margin = margin_for(denoiser, 0.6)
    length = len(tokenizer("return a + b", add_special_tokens=False)["input_ids"])
    config = replace(GREEDY, settle_tail=False, stable_floor=floor)
    counts, span = committed_counts(denoiser, config, length)
    assert len(counts) == (2 if at_once else length) and counts[-1] == [length]
    assert text_of(tokenizer, denoiser, span.tokens[0]) == "return a + b"


def test_stable_floor_never_commits_a_position_whose_argmax_changed(tokenizer):
    denoiser = AlternatingDenoiser(tokenizer, ["q" * 8], margin=12.0)
    denoiser.margin = margin_for(denoiser, 0.6)
    counts, span = committed_counts(denoiser, replace(GREEDY, settle_tail=False, stable_floor=0.3), 6)
    assert [c[0] for c in counts] == [1, 5, 6]  # position 0 waits for the pass whose one commit is its own
    with pytest.raises(ValueError, match="stable_floor must be within 0..1"):
        SamplerConfig(stable_floor=1.5)


def test_early_stop_when_the_canvas_is_stable_and_confident(tokenizer):
    denoiser = ScriptedDenoiser(tokenizer, ["abcdefghijklmnop"], margin=14.0)
    config = replace(GREEDY, threshold=1.0, stability_steps=1, confidence_threshold=0.01)
    stats = FillStats()
    span = denoise_span(denoiser, [], [], 16, config, stats=stats)
    assert stats.forward_passes == 2  # one to see it, one to see it again unchanged
    assert stats.stopped_early
    assert tokenizer.decode(span.tokens[0].tolist()).startswith("abcdefghijklmnop"[:8])


def test_blocks_are_denoised_in_order(tokenizer):
    denoiser = ScriptedDenoiser(tokenizer, ["abcdefghijkl"], margin=2.0)
    config = replace(GREEDY, block_size=4)
    views = []
    denoise_span(denoiser, [], [], 12, config, on_step=lambda v: views.append((v.block, v.committed[0].clone())))
    assert [block for block, _ in views] == sorted(block for block, _ in views)
    for block, committed in views:
        later = committed[(block + 1) * 4 :]
        assert not later.any()  # nothing beyond the current block is decided early


def test_a_short_span_ends_early_and_skips_later_blocks(tokenizer):
    denoiser = ScriptedDenoiser(tokenizer, ["ab"], margin=14.0)
    stats = FillStats()
    span = denoise_span(denoiser, [], [], 32, replace(GREEDY, block_size=8), stats=stats)
    end = denoiser.special.end_of_span_ids[0]
    assert stats.forward_passes == 1
    assert (span.tokens[0, 2:] == end).all()


def test_candidates_are_denoised_as_one_batch(tokenizer):
    denoiser = ScriptedDenoiser(tokenizer, ["aa", "bb", "cc"], margin=14.0)
    stats = FillStats()
    span = denoise_span(denoiser, [], [], 6, GREEDY, batch_size=3, stats=stats)
    assert span.tokens.shape == (3, 6)
    assert stats.forward_passes == denoiser.calls == 1
    assert all(canvas.shape[0] == 3 for canvas in denoiser.seen_canvases)


def test_callback_can_cancel_the_fill(tokenizer):
    denoiser = ScriptedDenoiser(tokenizer, ["abcdefgh"], margin=2.0)
    with pytest.raises(FillCancelled):
        denoise_span(denoiser, [], [], 8, GREEDY, on_step=lambda view: view.step < 2)
    assert denoiser.calls == 3


def test_frozen_positions_are_never_changed(tokenizer):
    denoiser = ScriptedDenoiser(tokenizer, ["abcdefgh"], margin=14.0)
    keep = tokenizer.convert_tokens_to_ids("z")
    initial = torch.tensor([keep] * 8)
    frozen = torch.tensor([True, False, True, False, False, False, False, True])
    span = denoise_span(denoiser, [], [], 8, GREEDY, initial=initial, frozen=frozen)
    assert span.tokens[0, frozen].tolist() == [keep] * 3
    assert span.tokens[0, 1] != keep


def test_temperature_schedule_is_linear_from_start_to_end():
    config = SamplerConfig(steps=4, temperature_start=0.8, temperature_end=0.4)
    temps = [temperature_at(config, step) for step in range(4)]
    assert temps[0] == pytest.approx(0.8)
    assert temps == sorted(temps, reverse=True)
    assert temps[-1] == pytest.approx(0.4 + 0.4 / 4)


def test_invalid_sampler_settings_name_the_problem():
    with pytest.raises(ValueError, match="commit must be one of"):
        SamplerConfig(commit="fastest")
    with pytest.raises(ValueError, match="steps must be an integer >= 1"):
        SamplerConfig(steps=0)


@pytest.mark.parametrize("family", ["diffill", "diffusion_gemma", "mlm", "dream", "llada"])
def test_same_seed_same_output_and_another_seed_differs(model_dirs, family):
    denoiser = load_denoiser(model_dirs[family], trust_remote_code=True)
    from infill_engine.engine import default_sampler_for

    config = replace(default_sampler_for(denoiser), temperature_start=1.0, temperature_end=1.0, steps=8,
                     greedy_first=False)
    prefix = denoiser.tokenizer("def add(a, b):\n    return ", add_special_tokens=False)["input_ids"]
    suffix = denoiser.tokenizer("\nprint(add(1, 2))\n", add_special_tokens=False)["input_ids"]
    runs = [denoise_span(denoiser, prefix, suffix, 8, replace(config, seed=s)).tokens for s in (1, 1, 2)]
    assert torch.equal(runs[0], runs[1])
    assert not torch.equal(runs[0], runs[2])


def test_known_length_fills_every_position(tokenizer):
    denoiser = ScriptedDenoiser(tokenizer, ["ab"], margin=14.0)
    end = denoiser.special.end_of_span_ids[0]
    span = denoise_span(denoiser, [], [], 6, replace(GREEDY, allow_end_of_span=False))
    assert end not in span.tokens[0].tolist()


def test_block_diffusion_appends_finished_blocks_to_the_context(model_dirs):
    from infill_engine.engine import default_sampler_for

    denoiser = load_denoiser(model_dirs["diffusion_gemma"])
    config = replace(default_sampler_for(denoiser), block_size=8, steps=4, allow_end_of_span=False)
    seen = []
    stats = FillStats()
    prefix = denoiser.tokenizer("x = ", add_special_tokens=False)["input_ids"]
    span = denoise_span(denoiser, prefix, [], 16, config, stats=stats, on_step=lambda v: seen.append(v.canvas.shape))
    assert span.tokens.shape == (1, 16)
    assert stats.context_encodes == 2  # the second block's context holds the first block
    assert set(seen) == {(1, 8)}  # each block is its own canvas


def test_first_candidate_is_the_greedy_one(model_dirs):
    denoiser = load_denoiser(model_dirs["diffill"])
    config = SamplerConfig(steps=8, temperature_start=1.0, temperature_end=1.0)
    prefix = denoiser.tokenizer("def f(x):\n    return ", add_special_tokens=False)["input_ids"]
    greedy = denoise_span(denoiser, prefix, [], 8, replace(config, temperature_start=0.0, temperature_end=0.0))
    batch = denoise_span(denoiser, prefix, [], 8, config, batch_size=3)
    assert torch.equal(batch.tokens[0], greedy.tokens[0])
    assert not torch.equal(batch.tokens[1], batch.tokens[0]) or not torch.equal(batch.tokens[2], batch.tokens[0])


def test_the_span_never_ends_before_a_kept_token(tokenizer):
    denoiser = ScriptedDenoiser(tokenizer, ["a"], margin=14.0)  # wants to end right after one token
    keep = tokenizer.convert_tokens_to_ids("z")
    initial = torch.tensor([0, 0, 0, keep, 0, 0])
    frozen = torch.tensor([False, False, False, True, False, False])
    span = denoise_span(denoiser, [], [], 6, GREEDY, initial=initial, frozen=frozen)
    end = denoiser.special.end_of_span_ids[0]
    assert end not in span.tokens[0, :3].tolist()
    assert span.tokens[0, 3] == keep


def test_the_first_position_cannot_end_the_span(tokenizer):
    denoiser = ScriptedDenoiser(tokenizer, [""], margin=14.0)  # the model wants an empty fill
    end = denoiser.special.end_of_span_ids[0]
    span = denoise_span(denoiser, [], [], 4, GREEDY)
    assert span.tokens[0, 0] != end
    assert (denoise_span(denoiser, [], [], 4, replace(GREEDY, min_tokens=0)).tokens[0] == end).all()


def text_of(tokenizer, denoiser, row: torch.Tensor) -> str:
    """The span text of one candidate, up to its end-of-span."""
    ids = row.tolist()
    end = denoiser.special.end_of_span_ids[0]
    return tokenizer.decode(ids[: ids.index(end)] if end in ids else ids)


def test_positions_never_committed_take_the_argmax_at_the_step_limit(tokenizer):
    denoiser = ScriptedDenoiser(tokenizer, ["abcdef"], margin=2.0)  # unsure: one commit per step at threshold 0.9
    counts, span = committed_counts(denoiser, replace(GREEDY, steps=2), 6)
    assert [c[0] for c in counts] == [1, 2]
    assert text_of(tokenizer, denoiser, span.tokens[0]) == "abcdef"


def test_entropy_bound_answers_with_the_last_argmax_even_where_it_re_noised(tokenizer):
    confidence = [20.0, 20.0, 1.0, 0.9, 0.8, 0.7]  # distinct: equal entropies would tie within float rounding
    denoiser = ScriptedDenoiser(tokenizer, ["abcdef"], confidence=confidence)
    config = replace(GREEDY, commit="entropy_bound", entropy_bound=0.5, steps=2)
    counts, span = committed_counts(denoiser, config, 6)
    assert counts[-1][0] < 6  # the last step still re-noised positions ...
    assert text_of(tokenizer, denoiser, span.tokens[0]) == "abcdef"  # ... the answer is the argmax there


@pytest.mark.parametrize("commit, passes", [("threshold", 1), ("entropy_bound", 5)])
def test_entropy_bound_never_settles_early_it_runs_until_confident_or_out_of_steps(tokenizer, commit, passes):
    denoiser = ScriptedDenoiser(tokenizer, ["abcdef"], margin=20.0)  # every position accepted at the first step
    stats = FillStats()
    denoise_span(denoiser, [], [], 6, replace(GREEDY, commit=commit, steps=5), stats=stats)
    assert stats.forward_passes == passes


def test_entropy_bound_stops_early_once_stable_and_confident(tokenizer):
    denoiser = ScriptedDenoiser(tokenizer, ["abcdef"], margin=20.0)
    config = replace(GREEDY, commit="entropy_bound", steps=5, stability_steps=1, confidence_threshold=0.01)
    stats = FillStats()
    span = denoise_span(denoiser, [], [], 6, config, stats=stats)
    assert stats.forward_passes == 2 and stats.stopped_early
    assert text_of(tokenizer, denoiser, span.tokens[0]) == "abcdef"


def test_entropy_bound_keeps_frozen_positions(tokenizer):
    denoiser = ScriptedDenoiser(tokenizer, ["abcdef"], margin=20.0)
    keep = tokenizer.convert_tokens_to_ids("z")
    frozen = torch.tensor([False, True, False, False, True, False])
    config = replace(GREEDY, commit="entropy_bound", steps=3)
    span = denoise_span(denoiser, [], [], 6, config, initial=torch.full((6,), keep), frozen=frozen)
    script = denoiser.encode([], [], 6, 1).state[0]  # (N,) what the model predicts at each position
    assert span.tokens[0, frozen].tolist() == [keep, keep]
    assert torch.equal(span.tokens[0, ~frozen], script[~frozen])


@pytest.mark.parametrize("stop, expected", [(True, "ab\n"), (False, "ab\ncd")])
def test_single_line_fills_end_after_the_first_line_break(tokenizer, stop, expected):
    denoiser = ScriptedDenoiser(tokenizer, ["ab\ncd"], margin=2.0)  # one commit per step, left to right
    stats = FillStats()
    span = denoise_span(denoiser, [], [], 8, replace(GREEDY, stop_at_line_break=stop), stats=stats)
    assert text_of(tokenizer, denoiser, span.tokens[0]) == expected
    assert stats.forward_passes == (3 if stop else 6)  # a step per token (and the end): none after the line break


@pytest.mark.parametrize("suppress_special", [True, False])
def test_special_tokens_are_never_written_unless_allowed(tokenizer, suppress_special):
    denoiser = ScriptedDenoiser(tokenizer, ["<|mask|>ab"], margin=14.0)  # the model wants a mask token first
    span = denoise_span(denoiser, [], [], 4, replace(GREEDY, suppress_special=suppress_special))
    assert (span.tokens[0, 0] == denoiser.special.mask_id) is not suppress_special


def test_min_tokens_holds_the_end_back_for_that_many_positions(tokenizer):
    denoiser = ScriptedDenoiser(tokenizer, ["a"], margin=14.0)
    end = denoiser.special.end_of_span_ids[0]
    span = denoise_span(denoiser, [], [], 6, replace(GREEDY, min_tokens=3))
    assert end not in span.tokens[0, :3].tolist()
    assert (span.tokens[0, 3:] == end).all()


class AppendScripted(ScriptedDenoiser):
    """The scripted denoiser as a block-diffusion model: each block is its own canvas after the finished ones."""

    block_mode = "append"

    def encode_rows(self, prefix_ids, continuation, suffix_ids, span_length):
        self.encodes += 1
        whole = super().encode(prefix_ids, suffix_ids, continuation.shape[1] + span_length, continuation.shape[0])
        self.encodes -= 1
        done = continuation.shape[1]
        return EncodedContext(prefix_ids, suffix_ids, span_length, continuation.shape[0], whole.state[:, done:])


def test_min_tokens_counts_span_positions_across_appended_blocks(tokenizer):
    denoiser = AppendScripted(tokenizer, ["a"], margin=14.0)  # wants to end after one token
    end = denoiser.special.end_of_span_ids[0]
    stats = FillStats()
    span = denoise_span(denoiser, [], [], 12, replace(GREEDY, block_size=4, min_tokens=6), stats=stats)
    assert stats.context_encodes == 2  # each block is its own canvas; the span ended in the second
    assert end not in span.tokens[0, :6].tolist()  # the second block's first two positions may not end it either
    assert (span.tokens[0, 6:8] == end).all()


def test_appended_blocks_stop_once_every_candidate_has_ended(tokenizer):
    denoiser = AppendScripted(tokenizer, ["ab", "c"], margin=14.0)
    stats = FillStats()
    span = denoise_span(denoiser, [], [], 12, replace(GREEDY, block_size=4), batch_size=2, stats=stats)
    assert stats.context_encodes == 1 and span.steps_per_block == [1]
    assert [text_of(tokenizer, denoiser, row) for row in span.tokens] == ["ab", "c"]


@pytest.mark.parametrize("greedy_first, t, expected", [
    (True, 0.0, [0.0, 0.7, 0.7]),  # the other candidates still sample
    (True, 0.5, [0.0, 0.5, 0.5]),
    (False, 0.5, [0.5, 0.5, 0.5]),
])
def test_the_first_candidate_is_greedy_and_the_others_sample(greedy_first, t, expected):
    config = SamplerConfig(temperature_start=t, temperature_end=t, greedy_first=greedy_first)
    assert row_temperatures(config, 0, 3, torch.device("cpu")).tolist() == pytest.approx(expected)


def test_sampled_candidates_follow_the_model_and_the_greedy_one_its_argmax(tokenizer):
    denoiser = ScriptedDenoiser(tokenizer, ["ab"], margin=0.5)  # flat: sampling rarely draws the script
    config = replace(GREEDY, temperature_start=1.0, temperature_end=1.0, suppress_special=False)
    span = denoise_span(denoiser, [], [], 6, config, batch_size=3)
    assert text_of(tokenizer, denoiser, span.tokens[0]) == "ab"
    assert text_of(tokenizer, denoiser, span.tokens[1]) != "ab" or text_of(tokenizer, denoiser, span.tokens[2]) != "ab"


class ConditionedDenoiser(ScriptedDenoiser):
    """Records the self-conditioning input of every step."""

    def predict(self, context, canvas, self_conditioning=None):
        self.conditioning = getattr(self, "conditioning", []) + [self_conditioning]
        return super().predict(context, canvas, self_conditioning)


@pytest.mark.parametrize("uses", [True, False])
def test_the_previous_logits_reach_only_models_that_read_them(tokenizer, uses):
    denoiser = ConditionedDenoiser(tokenizer, ["abcd"], margin=2.0)
    denoiser.uses_self_conditioning = uses
    denoise_span(denoiser, [], [], 4, GREEDY)
    assert denoiser.conditioning[0] is None
    assert [c is not None for c in denoiser.conditioning[1:]] == [uses] * (len(denoiser.conditioning) - 1)
    if uses:
        assert denoiser.conditioning[1].shape == (1, 4, denoiser.vocab_size)


def test_a_frozen_mask_needs_initial_tokens(tokenizer):
    denoiser = ScriptedDenoiser(tokenizer, ["ab"])
    with pytest.raises(ValueError, match="frozen mask needs the initial tokens"):
        denoise_span(denoiser, [], [], 4, GREEDY, frozen=torch.tensor([True, False, False, False]))


# ------------------------------------------------------------------------------- settling an end-of-span tail

class TargetsDenoiser(ScriptedDenoiser):
    """Predicts the given token ids per position (`rows`), each with its own margin."""

    def __init__(self, tokenizer, rows: list[list[int]], confidence: list[float]) -> None:
        super().__init__(tokenizer, [""], confidence=confidence)
        self.rows = rows

    def encode(self, prefix_ids, suffix_ids, span_length, batch_size) -> EncodedContext:
        self.encodes += 1
        return EncodedContext(prefix_ids, suffix_ids, span_length, batch_size, torch.tensor(self.rows))


def walking_end(tokenizer, text: str, length: int) -> tuple[list[int], list[float]]:
    """Token ids of `text` then end-of-span, and margins: the text unsure, the end surer towards the right (p about
    0.67 to 0.83 in the tiny vocabulary: under the threshold of 0.9, over a tail floor of 0.5)."""
    ids = tokenizer(text, add_special_tokens=False)["input_ids"]
    return ids, [2.0] * len(ids) + [6.0 + 0.1 * i for i in range(length - len(ids))]


@pytest.mark.parametrize("settle_tail, tail_floor", [(True, 0.5), (False, 0.5), (True, 0.95)])
def test_an_end_of_span_tail_is_settled_in_one_step(tokenizer, settle_tail, tail_floor):
    ids, confidence = walking_end(tokenizer, "ab", 12)
    denoiser = ScriptedDenoiser(tokenizer, ["ab"], confidence=confidence)
    stats = FillStats()
    config = replace(GREEDY, settle_tail=settle_tail, tail_floor=tail_floor)
    span = denoise_span(denoiser, [], [], 12, config, stats=stats)
    assert text_of(tokenizer, denoiser, span.tokens[0]) == "ab"
    if settle_tail and tail_floor < 0.67:
        assert stats.forward_passes == 1 + len(ids)  # the whole tail, then one text position per step
    else:  # the end walks in from the right, one position per step
        assert stats.forward_passes == 12


def test_tail_first_spends_the_first_steps_commit_on_the_text_not_on_the_tail(tokenizer):
    """The step that settles the tail also commits a text position: one step fewer, the same answer."""
    ids, confidence = walking_end(tokenizer, "abc", 12)
    passes, answers = {}, {}
    for first in (False, True):
        denoiser = ScriptedDenoiser(tokenizer, ["abc"], confidence=confidence)
        stats = FillStats()
        config = replace(GREEDY, settle_tail=True, tail_floor=0.5, tail_first=first)
        answers[first] = text_of(tokenizer, denoiser, denoise_span(denoiser, [], [], 12, config, stats=stats).tokens[0])
        passes[first] = stats.forward_passes
    assert answers == {False: "abc", True: "abc"}
    assert passes == {False: 1 + len(ids), True: len(ids)}


def test_only_an_end_of_span_run_reaching_the_canvas_end_is_settled(tokenizer):
    end = ScriptedDenoiser(tokenizer, [""]).special.end_of_span_ids[0]
    a, b = (tokenizer(t, add_special_tokens=False)["input_ids"][0] for t in "ab")
    denoiser = TargetsDenoiser(tokenizer, [[a, end, end, b, end, end, end, end]],
                               confidence=[14.0, 6.5, 6.5, 2.0, 6.0, 6.2, 6.4, 6.6])
    counts, span = committed_counts(denoiser, GREEDY, 8)
    after_first_step = (denoiser.seen_canvases[1][0] != denoiser.special.mask_id).tolist()
    assert after_first_step == [True, False, False, False, True, True, True, True]  # "a" and the tail only
    without = denoise_span(TargetsDenoiser(tokenizer, denoiser.rows, denoiser.confidence), [], [], 8,
                           replace(GREEDY, settle_tail=False))
    assert torch.equal(span.tokens, without.tokens)  # the rule saves steps; the answer is the same


def test_sampling_follows_the_distribution_and_never_draws_a_forbidden_token():
    from infill_engine.sampler import draw_tokens

    probs = torch.zeros(2, 20_000, 8)  # (B, N, V): tokens 0, 3, 4, 6 and 7 are forbidden (probability 0)
    probs[..., 1], probs[..., 2], probs[..., 5] = 0.5, 0.3, 0.2
    greedy = probs.argmax(dim=-1)
    drawn = draw_tokens(probs, torch.tensor([0.0, 1.0]), greedy, torch.Generator().manual_seed(0))
    assert torch.equal(drawn[0], greedy[0])  # the greedy row keeps its argmax
    shares = torch.bincount(drawn[1], minlength=8).float() / 20_000
    assert shares[[0, 3, 4, 6, 7]].sum() == 0
    assert shares[[1, 2, 5]].tolist() == pytest.approx([0.5, 0.3, 0.2], abs=0.015)


# ------------------------------------------------------------- logits only where positions are still open

class ProjectingDenoiser(ScriptedDenoiser):
    """A scripted denoiser that, as the embedded model's adapter, computes the logits of the columns it is given."""

    projects_columns = True

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.seen_columns: list[list[int] | None] = []

    def predict(self, context, canvas, self_conditioning=None, columns=None) -> torch.Tensor:
        self.seen_columns.append(None if columns is None else columns.tolist())
        logits = super().predict(context, canvas, self_conditioning)
        return logits if columns is None else logits[:, columns]


@pytest.mark.parametrize("commit", ["threshold", "schedule"])
def test_logits_are_computed_only_where_a_position_is_open_and_the_answer_is_the_same(tokenizer, commit):
    ids, confidence = walking_end(tokenizer, "abc", 12)
    projecting = ProjectingDenoiser(tokenizer, ["abc", "ab"], confidence=confidence)
    stats = FillStats()
    config = replace(GREEDY, settle_tail=True, tail_floor=0.5, commit=commit, greedy_first=False)  # both greedy
    span = denoise_span(projecting, [], [], 12, config, batch_size=2, stats=stats)
    whole = denoise_span(ScriptedDenoiser(tokenizer, ["abc", "ab"], confidence=confidence), [], [], 12, config,
                         batch_size=2)
    assert torch.equal(span.tokens, whole.tokens) and torch.allclose(span.probs, whole.probs)
    assert [text_of(tokenizer, projecting, row) for row in span.tokens] == ["abc", "ab"]
    assert projecting.seen_columns[0] is None  # the first pass: every position is open
    later = projecting.seen_columns[1:]
    assert later and all(c is not None and len(c) < 12 for c in later)
    for canvas, columns in zip(projecting.seen_canvases[1:], later):  # open in some row, and nothing else
        open_somewhere = (canvas == projecting.special.mask_id).any(dim=0).nonzero().squeeze(-1).tolist()
        assert columns == open_somewhere
    assert stats.positions_predicted == 2 * (12 + sum(len(c) for c in later))


@pytest.mark.parametrize("config", [
    replace(GREEDY, commit="entropy_bound"),  # every step re-decides every position
    replace(GREEDY, revise_below=0.5),  # committed tokens may be re-decided: their logits are needed
])
def test_rules_that_re_decide_committed_positions_get_every_logit(tokenizer, config):
    ids, confidence = walking_end(tokenizer, "ab", 12)
    denoiser = ProjectingDenoiser(tokenizer, ["ab"], confidence=confidence)
    denoise_span(denoiser, [], [], 12, config)
    assert set(map(str, denoiser.seen_columns)) == {"None"}


def test_the_embedded_architecture_projects_only_the_open_positions_with_the_same_logits(model_dirs):
    denoiser = load_denoiser(str(model_dirs["diffill"]))
    context = denoiser.encode([5, 6, 7], [8, 9], 16, 2)
    canvas = torch.full((2, 16), denoiser.special.mask_id)
    canvas[:, :4] = torch.tensor([11, 12, 13, 14])
    columns = torch.tensor([4, 5, 9, 15])
    whole = denoiser.predict(context, canvas)
    some = denoiser.predict(context, canvas, columns=columns)
    assert some.shape == (2, 4, denoiser.vocab_size)
    assert torch.allclose(some, whole[:, columns], atol=1e-5)
    end = denoiser.special.end_of_span_ids[0]
    initial = torch.full((16,), denoiser.special.mask_id)
    initial[4] = end  # a repair's canvas: the span ends after four positions (the random model would not say so)
    frozen = torch.zeros(16, dtype=torch.bool)
    frozen[4] = True
    stats = FillStats()
    span = denoise_span(denoiser, [5, 6, 7], [8, 9], 16, replace(GREEDY, steps=12), batch_size=2, stats=stats,
                        initial=initial, frozen=frozen)
    assert stats.positions_predicted < stats.forward_passes * 2 * 16  # later passes project fewer positions
    for row in span.tokens.tolist():  # each answer still ends as a span does: nothing after its first end
        assert set(row[row.index(end):]) == {end}


class KeyReusingDenoiser(ProjectingDenoiser):
    """A projecting denoiser that, as the embedded model's adapter, may be told to run its layers over some rows."""

    reuses_canvas_keys = True

    def __init__(self, *args, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        self.seen_rows: list[list[int] | None] = []

    def predict(self, context, canvas, self_conditioning=None, columns=None, rows=None) -> torch.Tensor:
        self.seen_rows.append(None if rows is None else rows.tolist())
        return super().predict(context, canvas, self_conditioning, columns)


@pytest.mark.parametrize("refresh", [100, 2])
def test_canvas_refresh_runs_the_layers_only_over_open_and_just_changed_positions(tokenizer, refresh):
    """Between refreshes a pass runs over the positions still open in some row and those whose token changed since
    the pass before (their keys and values are computed once with their new token); a refresh reads them all."""
    ids, confidence = walking_end(tokenizer, "abc", 12)
    denoiser = KeyReusingDenoiser(tokenizer, ["abc", "ab"], confidence=confidence)
    config = replace(GREEDY, settle_tail=True, tail_floor=0.5, greedy_first=False, canvas_refresh=refresh)
    span = denoise_span(denoiser, [], [], 12, config, batch_size=2)
    assert [text_of(tokenizer, denoiser, row) for row in span.tokens] == ["abc", "ab"]
    assert len(denoiser.seen_rows) >= 4
    mask = denoiser.special.mask_id
    for step, (rows, canvas) in enumerate(zip(denoiser.seen_rows, denoiser.seen_canvases)):
        if step % refresh == 0:
            assert rows is None
            continue
        before = denoiser.seen_canvases[step - 1]
        stale = ((canvas == mask) | (canvas != before)).any(dim=0).nonzero().squeeze(-1).tolist()
        assert rows == (None if len(stale) == 12 else stale)  # the first commits change most of the canvas
    assert any(rows is not None for rows in denoiser.seen_rows)


def test_canvas_refresh_is_off_by_default_and_never_given_to_denoisers_that_cannot_keep_keys(tokenizer):
    ids, confidence = walking_end(tokenizer, "abc", 12)
    config = replace(GREEDY, settle_tail=True, tail_floor=0.5)
    reusing = KeyReusingDenoiser(tokenizer, ["abc"], confidence=confidence)
    denoise_span(reusing, [], [], 12, config)
    assert set(map(str, reusing.seen_rows)) == {"None"}  # the default: every pass over the whole canvas
    projecting = ProjectingDenoiser(tokenizer, ["abc"], confidence=confidence)  # its predict takes no rows
    span = denoise_span(projecting, [], [], 12, replace(config, canvas_refresh=100))
    assert text_of(tokenizer, projecting, span.tokens[0]) == "abc"


@pytest.mark.parametrize("family, refresh", [("diffill", 8), ("diffusion_gemma", 0), ("mlm", 0), ("dream", 0)])
def test_only_denoisers_that_keep_canvas_keys_get_a_canvas_refresh_by_default(model_dirs, family, refresh):
    """The embedded model's engine keeps canvas keys between steps; families that cannot (their passes run the whole
    sequence, or against a dual cache) keep every pass over the whole canvas."""
    from infill_engine.engine import default_sampler_for

    denoiser = load_denoiser(model_dirs[family], trust_remote_code=True)
    assert denoiser.reuses_canvas_keys == (family == "diffill")
    assert default_sampler_for(denoiser).canvas_refresh == refresh


def test_a_checkpoint_brings_its_own_sampler_settings_and_a_bad_one_is_refused(tmp_path):
    """A model whose config.json carries `diffill_sampler` is filled with those settings by default (the embedded
    model's end_bias); an unknown setting or a bad value names what was wrong when the engine is built."""
    import json

    from infill_engine.engine import InfillEngine, default_sampler_for

    directory = tiny_models.build_diffill(tmp_path / "own")
    plain = default_sampler_for(load_denoiser(directory))
    config_path = directory / "config.json"
    config = json.loads(config_path.read_text())
    config_path.write_text(json.dumps({**config, "diffill_sampler": {"end_bias": -0.5}}))
    engine = InfillEngine(load_denoiser(directory))
    assert engine.sampler.end_bias == -0.5 and plain.end_bias == 0.0
    assert replace(engine.sampler, end_bias=0.0) == plain  # nothing else moved
    for bad, message in (({"end_bais": -0.5}, "unknown sampler settings end_bais"),
                         ({"end_bias": float("inf")}, "end_bias must be a finite number"),
                         ({"end_bias": "-0.5"}, "end_bias must be a number"),
                         ({"end_bias_until_content": "false"}, "end_bias_until_content must be true or false"),
                         ({"steps": 8.5}, "steps must be an integer"),
                         ({"commit": 1}, "commit must be text"),
                         ([-0.5], "must be an object of sampler settings")):
        config_path.write_text(json.dumps({**config, "diffill_sampler": bad}))
        with pytest.raises(ValueError, match=message):
            InfillEngine(load_denoiser(directory))


def test_canvas_refresh_must_be_a_count_of_steps():
    with pytest.raises(ValueError, match="canvas_refresh must be an integer >= 0"):
        SamplerConfig(canvas_refresh=-1)


def test_end_bias_moves_where_a_span_of_unknown_length_ends(tokenizer):
    """Below 0 the model writes on past the end it would choose; above 0 it ends sooner (after min_tokens)."""
    denoiser = ScriptedDenoiser(tokenizer, ["return a + b"], margin=3.0)
    end = denoiser.special.end_of_span_ids[0]
    script = tokenizer("return a + b", add_special_tokens=False)["input_ids"]

    def written(bias: float) -> list[int]:
        ids = denoise_span(denoiser, [], [], 12, replace(GREEDY, end_bias=bias)).tokens[0].tolist()
        return ids[: ids.index(end)] if end in ids else ids

    assert written(0.0) == script
    assert written(5.0) == script[:1]
    longer = written(-5.0)
    assert len(longer) == 12 and longer[: len(script)] == script
    with pytest.raises(ValueError, match="end_bias"):
        SamplerConfig(end_bias=float("nan"))


def test_end_bias_until_content_writes_past_indentation_and_leaves_a_written_fill_its_own_end(tokenizer):
    """Scoped to the positions up to the first content token, the bias still keeps a fill the model would end
    after indentation from ending there, but a fill with content ends where the model ends it; the bias at every
    position writes that one out to the canvas's end."""
    end_bias = replace(GREEDY, end_bias=-5.0)
    scoped = replace(end_bias, end_bias_until_content=True)

    def written(script: str, config: SamplerConfig) -> str:
        denoiser = ScriptedDenoiser(tokenizer, [script], margin=3.0)
        return text_of(tokenizer, denoiser, denoise_span(denoiser, [], [], 12, config).tokens[0])

    assert written("    ", GREEDY) == "    "
    blank = written("    ", scoped)
    assert blank.startswith("    ") and blank.strip() != ""
    assert written("return a + b", scoped) == "return a + b"
    everywhere = written("return a + b", end_bias)
    assert everywhere.startswith("return a + b") and len(tokenizer(everywhere, add_special_tokens=False)[
        "input_ids"]) == 12


def test_a_span_of_only_indentation_does_not_end_with_end_after_content(tokenizer):
    """The model wants indentation and nothing else (what the user would see as no ghost text): with the rule the
    span writes on past it; the content it writes is the model's next choice."""
    denoiser = ScriptedDenoiser(tokenizer, ["    ", "    return x"], margin=6.0)
    end = denoiser.special.end_of_span_ids[0]

    def texts(config: SamplerConfig) -> list[str]:
        span = denoise_span(denoiser, [], [], 8, config, batch_size=2)
        return [text_of(tokenizer, denoiser, row) for row in span.tokens]

    assert texts(GREEDY)[0] == "    "
    blank, written = texts(replace(GREEDY, end_after_content=True))
    assert blank.strip() != "" and blank.startswith("    ")
    assert written == "    return x"  # a span with content ends where the model ends it
    assert end not in denoiser.blank_ids.tolist()


class FarLineBreakDenoiser(ScriptedDenoiser):
    """The script, with second choices beside it (lower logits: where the first is forbidden, they win); and once a
    line break stands at the canvas's far end, the model fills every position before it with `filler`, as the
    embedded model writes a line's worth of text before a line break it is shown."""

    def __init__(self, tokenizer, scripts: list[str], second: dict[int, tuple[int, float]], filler: int) -> None:
        super().__init__(tokenizer, scripts)
        self.second, self.filler = second, filler  # span position -> (token id, logit)
        (self.line_break,) = tokenizer("\n", add_special_tokens=False)["input_ids"]

    def predict(self, context, canvas, self_conditioning=None) -> torch.Tensor:
        logits = super().predict(context, canvas, self_conditioning)
        for position, (token, logit) in self.second.items():
            logits[:, position, token] = logit
        ended = canvas[:, -1] == self.line_break  # (B,)
        logits[ended, :-1, self.filler] = 20.0
        return logits


def test_end_after_content_does_not_commit_what_the_model_writes_only_because_it_may_not_end(tokenizer):
    """The model wants indentation, then the span's end; its second choice at the far end is a line break (nearly
    as sure as the end), and after the indentation `return`. The rule forbids the end; a line break committed at
    the far end would make the fill write every position before it. So while a row has no content it commits
    only where the model did not want the end, or its leftmost open position: the fill is the indentation and
    `return`, and the rest ends in one step."""
    (word,) = tokenizer(" return", add_special_tokens=False)["input_ids"]
    (filler,) = tokenizer("x", add_special_tokens=False)["input_ids"]
    length = 10
    (line_break,) = tokenizer("\n", add_special_tokens=False)["input_ids"]
    denoiser = FarLineBreakDenoiser(tokenizer, ["   "], {length - 1: (line_break, 11.0), 1: (word, 4.0)}, filler)
    stats = FillStats()
    span = denoise_span(denoiser, [], [], length, replace(GREEDY, end_after_content=True), stats=stats)
    assert text_of(tokenizer, denoiser, span.tokens[0]) == "    return"
    assert stats.forward_passes == 3  # indentation, then `return`, then the end settled at once
    assert all(not bool((canvas[:, -1] == line_break).any()) for canvas in denoiser.seen_canvases)
    plain = denoise_span(denoiser, [], [], length, GREEDY).tokens[0]
    assert text_of(tokenizer, denoiser, plain) == "   "  # without the rule: indentation alone


def test_the_greedy_token_of_a_tie_is_the_first_of_the_tied():
    logits = torch.full((1, 3, 10), -1.0)
    logits[0, 0, [4, 7]] = 5.0  # a tie: the first, as argmax breaks it
    logits[0, 1, 9] = 2.0
    logits[0, 2, [0, 1, 2]] = 3.0
    generator = torch.Generator().manual_seed(0)
    prediction = pick_tokens(logits, torch.zeros(1), "confidence", generator)
    assert prediction.argmax.tolist() == [[4, 9, 0]] == logits.argmax(dim=-1).tolist()
    assert prediction.drawn.tolist() == [[4, 9, 0]]  # greedy: the drawn token is the argmax


@pytest.mark.parametrize("force_content", [False, True])
def test_force_content_writes_on_from_the_left_beside_an_end_a_pass_would_commit_alone(tokenizer, force_content):
    """The span's 4 end-of-span positions surer the further right (p 0.7 to 0.85) and its text less sure, and surer
    to the right (0.5 to 0.65), all under the threshold: one commit a pass walks the end in from the right first, one
    position at a time (a committed end settles only what is after it); with force_content each of those passes
    also commits the leftmost open position, so the text goes in from the left while the end comes in."""
    text = "return a + b"
    length = len(tokenizer(text, add_special_tokens=False)["input_ids"])
    probe = ScriptedDenoiser(tokenizer, [text])
    text_sureness = [0.5 + 0.15 * i / (length - 1) for i in range(length)]
    confidence = [margin_for(probe, p) for p in text_sureness + [0.7, 0.75, 0.8, 0.85]]
    denoiser = ScriptedDenoiser(tokenizer, [text], confidence=confidence)
    committed = []
    span = denoise_span(denoiser, [], [], length + 4, replace(GREEDY, settle_tail=False, force_content=force_content),
                        on_step=lambda view: committed.append(view.committed[0].tolist()) and None)
    assert text_of(tokenizer, denoiser, span.tokens[0]) == text
    assert len(committed) == (length if force_content else length + 4), committed
    new = [[i for i, now in enumerate(after) if now and not before[i]]
           for before, after in zip([[False] * (length + 4)] + committed, committed)]
    if force_content:  # the text from the left, the end from the right, a position of each a pass
        assert new[:4] == [[i, length + 3 - i] for i in range(4)]
    else:
        assert new[:4] == [[length + 3 - i] for i in range(4)]


class EndFirstDenoiser(ScriptedDenoiser):
    """ScriptedDenoiser, but position 0 predicts end-of-span (p 0.6) before the script's text."""

    def predict(self, context, canvas, self_conditioning=None):
        logits = super().predict(context, canvas, self_conditioning)
        logits[:, 0] = 0.0
        logits[:, 0, self.special.end_of_span_ids[0]] = margin_for(self, 0.6)
        return logits


def test_force_content_writes_nothing_where_the_model_would_end_the_span_at_its_leftmost_open_position(tokenizer):
    """Position 0 ends the span (p 0.6), position 1 holds text (0.65), position 2 ends (0.8): the first pass commits
    the end at 2 alone, as without force_content (which commits no text further right than where the model would
    end); the text at 1 goes in its own turn, and the end at 0 then settles the rest."""
    probe = ScriptedDenoiser(tokenizer, ["ab"])
    denoiser = EndFirstDenoiser(tokenizer, ["ab"], confidence=[margin_for(probe, p) for p in (0.6, 0.65, 0.8)])
    config = replace(GREEDY, settle_tail=False, min_tokens=0)
    forced, span = committed_counts(denoiser, replace(config, force_content=True), 3)
    plain, _ = committed_counts(EndFirstDenoiser(tokenizer, ["ab"], confidence=denoiser.confidence), config, 3)
    assert forced == plain == [[1], [2], [3]] and text_of(tokenizer, denoiser, span.tokens[0]) == ""
