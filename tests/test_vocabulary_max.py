"""The sampler's argmax over the vocabulary (`infill_engine/vocabulary_max.py`): blocks of maxima give torch's own
answer, ties, -inf rows and NaN included, at every size the engine meets."""

from __future__ import annotations

import pytest
import torch

from infill_engine.sampler import pick_tokens
from infill_engine.vocabulary_max import BLOCK, FEWEST_ROWS, vocabulary_argmax


@pytest.mark.parametrize("shape", [(1, 1, 8192), (1, FEWEST_ROWS - 1, 8192), (2, 13, 8192), (1, 64, 8192),
                                   (3, 5, 1000), (4, BLOCK), (6, 3 * BLOCK)])
def test_the_first_of_the_largest_entries_as_torch_argmax_gives_it(shape):
    generator = torch.Generator().manual_seed(sum(shape))
    logits = torch.randint(-3, 4, shape, generator=generator).float()  # few values: ties in every row, across blocks
    assert torch.equal(vocabulary_argmax(logits), logits.argmax(dim=-1))
    logits[0] = -torch.inf  # a row whose every token is forbidden
    assert torch.equal(vocabulary_argmax(logits), logits.argmax(dim=-1))
    logits[-1, ..., shape[-1] // 2] = torch.nan  # a broken logit wins, as in torch
    assert torch.equal(vocabulary_argmax(logits), logits.argmax(dim=-1))
    spread = torch.randn(shape, generator=generator)  # logits as a model gives them: one clear maximum a row
    assert torch.equal(vocabulary_argmax(spread), spread.argmax(dim=-1))


def test_the_maximum_at_a_block_edge_and_in_the_last_block():
    logits = torch.zeros(FEWEST_ROWS, 4 * BLOCK)
    for row, index in enumerate((BLOCK - 1, BLOCK, 4 * BLOCK - 1, 0)):
        logits[row, index] = 1.0
    assert vocabulary_argmax(logits).tolist() == [BLOCK - 1, BLOCK, 4 * BLOCK - 1, 0]


def test_the_sampler_picks_the_argmax_of_its_logits():
    generator = torch.Generator().manual_seed(0)
    logits = torch.randn(2, 24, 8192, generator=generator)
    prediction = pick_tokens(logits, torch.zeros(2), "confidence", generator)
    assert torch.equal(prediction.argmax, logits.argmax(dim=-1)) and torch.equal(prediction.drawn, prediction.argmax)
    assert torch.allclose(prediction.argmax_probs, torch.softmax(logits, dim=-1).amax(dim=-1))
