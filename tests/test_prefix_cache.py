"""The encoded head of a recent prefix reused by the next request (models that read their context causally): typing
one more character encodes only the new tail and the suffix, and the fill is the one a whole encode gives."""

from __future__ import annotations

import json

import pytest
import torch

from infill_engine.adapters.base import ContextArgs
from infill_engine.engine import InfillEngine
from infill_engine.interface import ModelSpec
from infill_engine.prefix_cache import PrefixCache
from infill_engine.request import InfillRequest
from tests import tiny_models

TEXT = ("import os\nimport sys\n\n\ndef walk(top):\n    result = []\n    for root, dirs, files in os.walk(top):\n"
        "        for name in files:\n            result.append(os.path.join(root, name))\n    return result\n")
LINE_START = TEXT.index("            result.append")
LINE_END = TEXT.index("\n", LINE_START)


@pytest.fixture(scope="module")
def causal_model(tmp_path_factory) -> str:
    """The tiny diffill model as the shipped one reads its context: causally, the first canvas position from the
    context token before it."""
    directory = tiny_models.build_diffill(tmp_path_factory.mktemp("causal"), seed=3)
    config = json.loads((directory / "config.json").read_text())
    (directory / "config.json").write_text(json.dumps({**config, "shift_logits": True, "causal_context": True}))
    return str(directory)


def typed(cursor: int) -> InfillRequest:
    """The request of ghost text with the cursor at `cursor` in the line being typed (the rest of it not yet there)."""
    return InfillRequest(TEXT[:cursor], TEXT[LINE_END:], "python", max_tokens=8, single_line=True)


def seen(result) -> list[tuple[str, float]]:
    """What the user is offered: each candidate's text and score."""
    return [(candidate.text, candidate.score) for candidate in result.candidates + result.rejected]


def test_typing_a_line_encodes_only_what_changed_and_offers_what_a_whole_encode_does(causal_model):
    reusing = InfillEngine.load(ModelSpec(path=causal_model))
    whole = InfillEngine.load(ModelSpec(path=causal_model))
    whole.denoiser.prefixes = None  # every request encoded from scratch, as before the cache
    for cursor in range(LINE_START + 12, LINE_END):
        expected, got = whole.fill(typed(cursor)), reusing.fill(typed(cursor))
        assert [text for text, _ in seen(got)] == [text for text, _ in seen(expected)]
        assert [score for _, score in seen(got)] == pytest.approx([score for _, score in seen(expected)], abs=1e-4)
    assert reusing.denoiser.positions_reused > 0
    # every keystroke after the first ran its suffix and a token or two of prefix, not the whole context
    assert reusing.denoiser.positions_encoded < whole.denoiser.positions_encoded / 3


def test_an_edit_inside_the_prefix_reuses_only_the_head_before_it(causal_model):
    engine = InfillEngine.load(ModelSpec(path=causal_model))
    denoiser = engine.denoiser
    prefix = engine.tokenize(TEXT[:LINE_END])
    suffix = engine.tokenize(TEXT[LINE_END:])
    denoiser.encode(prefix, suffix, 8, 1)
    edited = list(prefix)
    x, y = engine.tokenize("x")[0], engine.tokenize("y")[0]
    edited[20] = x if edited[20] != x else y
    before = denoiser.positions_reused
    context = denoiser.encode(edited, suffix, 8, 1)
    assert denoiser.positions_reused - before == 20  # the tokens before the edit, not one more
    denoiser.prefixes.clear()
    fresh = denoiser.encode(edited, suffix, 8, 1)
    canvas = torch.full((1, 8), denoiser.special.mask_id)
    torch.testing.assert_close(denoiser.predict(context, canvas), denoiser.predict(fresh, canvas), atol=1e-4, rtol=0)


def test_requests_encoded_together_reuse_their_own_heads_and_get_what_each_gets_alone(causal_model):
    engine = InfillEngine.load(ModelSpec(path=causal_model))
    denoiser = engine.denoiser
    first = ContextArgs(engine.tokenize(TEXT[:LINE_END]), engine.tokenize(TEXT[LINE_END:]), 8, 1)
    other = ContextArgs(engine.tokenize("values = [1, 2, 3]\ntotal = "), engine.tokenize("\nprint(total)\n"), 6, 1)
    denoiser.encode(first.prefix_ids[:-3], first.suffix_ids, 8, 1)  # the keystroke before, for the first only
    together = denoiser.encode_many([first, other])
    denoiser.prefixes.clear()
    alone = [denoiser.encode(*first), denoiser.encode(*other)]
    for context, single, length in zip(together, alone, (8, 6)):
        canvas = torch.full((1, length), denoiser.special.mask_id)
        torch.testing.assert_close(denoiser.predict(context, canvas), denoiser.predict(single, canvas), atol=1e-4,
                                   rtol=0)


def test_a_model_whose_context_reads_both_ways_encodes_every_request_whole(tmp_path):
    engine = InfillEngine.load(ModelSpec(path=str(tiny_models.build_diffill(tmp_path / "bidirectional"))))
    assert engine.denoiser.prefixes is None  # an earlier position sees later ones: a shared head would be stale
    engine.fill(typed(LINE_START + 20))
    engine.fill(typed(LINE_START + 21))
    assert engine.denoiser.positions_reused == 0


def test_the_store_finds_the_longest_shared_head_and_forgets_the_least_recently_used():
    store: PrefixCache[str] = PrefixCache(entries=2)
    store.add([1, 2, 3, 4], "a")
    store.add([1, 2, 9], "b")
    assert store.longest([1, 2, 3, 4, 5]) == (4, "a")
    assert store.longest([1, 2, 9, 9]) == (3, "b")
    assert store.longest([7, 1, 2]) == (0, None)
    store.longest([1, 2, 3])  # "a" is now the more recently used
    store.add([5, 6], "c")
    assert len(store) == 2
    assert store.longest([1, 2, 9]) == (2, "a")  # "b" went: only "a"'s head [1, 2] is left to share
    assert store.longest([5, 6]) == (2, "c")
    with pytest.raises(ValueError, match="at least one entry"):
        PrefixCache(entries=0)
