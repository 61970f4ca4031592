"""Committing what the context says comes next (`copy_floor`): the model's argmax verifies the context's proposal."""

from __future__ import annotations

from dataclasses import replace

import pytest
import torch

from infill_engine.context_copy import ContextCopy, context_grams
from infill_engine.sampler import SamplerConfig, denoise_span
from tests.scripted import ScriptedDenoiser
from tests.test_sampler import GREEDY, margin_for, text_of


def test_every_run_of_n_tokens_in_the_context():
    assert context_grams([1, 2, 3, 1, 2, 4], 3) == {(1, 2, 3), (2, 3, 1), (3, 1, 2), (1, 2, 4)}
    assert context_grams([1, 2], 3) == set()


def agreed(copy: ContextCopy, tokens, known, argmax, probs, free=None) -> list[list[bool]]:
    """`copy.agreed` on one row given as lists."""
    free = [not k for k in known] if free is None else free
    as_tensor = lambda values, dtype: torch.tensor([values], dtype=dtype)  # noqa: E731
    return copy.agreed(as_tensor(tokens, torch.long), as_tensor(known, torch.bool), as_tensor(argmax, torch.long),
                       as_tensor(probs, torch.float), as_tensor(free, torch.bool)).tolist()


def test_a_run_the_model_and_the_context_agree_on_goes_at_once_and_stops_where_they_differ():
    """Context `7 8 1 2 3 4 5 ... 7 8`: the canvas after the prefix's `7 8` is proposed `1 2 3 4 5`; the model's
    argmax is `1 2 3 9 5`: 1 2 3 go in one call, 9 is not the context's, and 5 has no known tokens before it."""
    copy = ContextCopy.of([7, 8, 1, 2, 3, 4, 5, 6, 7, 8], [], ngram=2, floor=0.5)
    row = agreed(copy, [0] * 5, [False] * 5, [1, 2, 3, 9, 5], [0.6] * 5)
    assert row == [[True, True, True, False, False]]


def test_only_positions_the_model_is_sure_enough_of_free_ones_and_after_known_tokens():
    copy = ContextCopy.of([7, 8, 1, 2, 3, 4, 7, 8], [], ngram=2, floor=0.5)  # the prefix ends in `7 8`
    # below the floor at position 1: the run stops there
    assert agreed(copy, [0] * 4, [False] * 4, [1, 2, 3, 4], [0.9, 0.4, 0.9, 0.9]) == [[True, False, False, False]]
    # a committed token stands for itself (position 0 holds 1), whatever the argmax says there
    assert agreed(copy, [1, 0, 0, 0], [True, False, False, False], [5, 2, 3, 4], [0.9] * 4) == [
        [False, True, True, True]]
    # a position that is not free is never chosen, and breaks the run of known tokens
    assert agreed(copy, [0] * 4, [False] * 4, [1, 2, 3, 4], [0.9] * 4, [True, False, True, True]) == [
        [True, False, False, False]]


def test_the_suffix_proposes_too_and_an_empty_context_nothing():
    copy = ContextCopy.of([7, 8], [7, 8, 1, 2], ngram=2, floor=0.5)  # `7 8 1` only in the suffix
    assert agreed(copy, [0] * 2, [False] * 2, [1, 2], [0.9] * 2) == [[True, True]]
    assert agreed(ContextCopy.of([], [], 2, 0.5), [0] * 2, [False] * 2, [1, 2], [0.9] * 2) == [[False, False]]


def fill(tokenizer, prefix_ids, config, probability=0.6, target="return a + b"):
    """Denoise `target` (every position at `probability`) after `prefix_ids`: commits after each pass, and text."""
    denoiser = ScriptedDenoiser(tokenizer, [target], margin=12.0)
    denoiser.margin = margin_for(denoiser, probability)
    counts: list[int] = []
    record = lambda view: counts.append(int(view.committed.sum())) and None  # noqa: E731
    length = len(tokenizer(target, add_special_tokens=False)["input_ids"])
    span = denoise_span(denoiser, prefix_ids, [], length, config, on_step=record)
    return counts, text_of(tokenizer, denoiser, span.tokens[0])


def ids(tokenizer, text):
    return tokenizer(text, add_special_tokens=False)["input_ids"]


@pytest.mark.parametrize("floor, passes", [(0.5, 1), (0.7, None), (0.0, None)])
def test_a_fill_that_repeats_the_context_takes_one_pass_where_the_model_is_sure_enough(tokenizer, floor, passes):
    """p = 0.6 everywhere, the line already written above after the same `y = `: one pass with copy_floor 0.5;
    one commit a pass above 0.6 or with the rule off. The same text either way."""
    lead, target = ids(tokenizer, "y = "), ids(tokenizer, "return a + b")
    prefix = lead + target + ids(tokenizer, "\n") + lead
    counts, text = fill(tokenizer, prefix, replace(GREEDY, settle_tail=False, copy_floor=floor))
    assert text == "return a + b"
    assert len(counts) == (passes or len(target)), counts


def test_where_the_context_says_another_token_the_model_decides_alone(tokenizer):
    """The context has `return a - b`: the first pass commits `return a` (the model's first token, then what both
    say), not `+`; the rest one a pass, and the fill is the model's."""
    lead, target = ids(tokenizer, "y = "), ids(tokenizer, "return a + b")
    other = ids(tokenizer, "return a - b")
    prefix = lead + other + ids(tokenizer, "\n") + lead
    shared = next(i for i, (a, b) in enumerate(zip(target, other)) if a != b)  # tokens the two lines begin with
    counts, text = fill(tokenizer, prefix, replace(GREEDY, settle_tail=False, copy_floor=0.5))
    assert text == "return a + b"
    assert counts[0] == shared and len(counts) == 1 + len(target) - shared, counts


def test_copy_floor_and_copy_ngram_are_checked():
    with pytest.raises(ValueError, match="copy_floor must be within 0..1"):
        SamplerConfig(copy_floor=1.5)
    with pytest.raises(ValueError, match="copy_ngram must be an integer >= 1"):
        SamplerConfig(copy_ngram=0)
