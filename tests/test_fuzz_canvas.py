"""Fuzzing the canvas: context around a hole trimmed to token budgets, for random Unicode text and random budgets.

Properties: nothing raises; each side keeps at most its budget of tokens; what is kept is the end of the prefix and
the start of the suffix, cut at a line boundary unless one line is longer than the budget; the ids the model sees
are the tokens of exactly that text; a side that fits is kept whole.
"""

from __future__ import annotations


import pytest
from hypothesis import example, given, strategies as st

from infill_engine.canvas import ContextConfig, layout_canvas, trim_context
from infill_engine.loading import default_model_path
from tests.fuzzing import editor_text, examples

documents = st.lists(editor_text, max_size=12).map("\n".join)


@pytest.fixture(scope="module")
def tokenizer():
    """The embedded model's own byte-level tokenizer: every character has tokens (the tiny test one drops some)."""
    from transformers import AutoTokenizer

    path = default_model_path()
    if path is None:
        pytest.skip("this build ships no embedded model")
    return AutoTokenizer.from_pretrained(str(path))


def ids_of(tokenizer, text: str) -> list[int]:
    return list(tokenizer(text, add_special_tokens=False)["input_ids"])


@examples(100)
@given(prefix=documents, suffix=documents, prefix_tokens=st.integers(0, 48), suffix_tokens=st.integers(0, 48))
@example(prefix="a😀\n" * 20, suffix="\n😀b" * 20, prefix_tokens=3, suffix_tokens=3)
@example(prefix="é" * 60, suffix="", prefix_tokens=5, suffix_tokens=0)
# A budget ending inside a character that the byte-level tokenizer splits over several tokens kept part of it, and
# said the whole text was kept.
@example(prefix="", suffix="a_\x80𐀀0\x80\x80𐀀a\u200d0:\x80\x80", prefix_tokens=0, suffix_tokens=26)
@example(prefix="\x80\x80:0\u200da𐀀\x80\x800𐀀\x80_a", suffix="", prefix_tokens=26, suffix_tokens=0)
def test_trimmed_context_is_the_text_next_to_the_hole_within_budget(
    tokenizer, prefix, suffix, prefix_tokens, suffix_tokens
):
    trimmed = trim_context(tokenizer, prefix, suffix, ContextConfig(prefix_tokens, suffix_tokens))
    assert len(trimmed.prefix_ids) <= prefix_tokens and len(trimmed.suffix_ids) <= suffix_tokens
    assert 0 <= trimmed.prefix_chars <= len(prefix) and 0 <= trimmed.suffix_chars <= len(suffix)
    kept_prefix = prefix[len(prefix) - trimmed.prefix_chars :]
    kept_suffix = suffix[: trimmed.suffix_chars]
    whole_prefix, whole_suffix = ids_of(tokenizer, prefix), ids_of(tokenizer, suffix)
    if len(whole_prefix) <= prefix_tokens:
        assert trimmed.prefix_ids == whole_prefix and kept_prefix == prefix
    else:  # cut at a line start, or inside one line (the cursor's, or the one before it) over the budget alone
        cut = len(prefix) - trimmed.prefix_chars
        assert cut > 0 and (prefix[cut - 1] == "\n" or "\n" not in kept_prefix[:-1])
        assert trimmed.prefix_ids == ids_of(tokenizer, kept_prefix)  # whole characters only
    if len(whole_suffix) <= suffix_tokens:
        assert trimmed.suffix_ids == whole_suffix and kept_suffix == suffix
    else:
        assert trimmed.suffix_chars < len(suffix)
        assert kept_suffix.endswith("\n") or "\n" not in kept_suffix[1:]  # whole lines, or part of one
        assert trimmed.suffix_ids == ids_of(tokenizer, kept_suffix)


@examples(100)
@given(prefix=st.lists(st.integers(0, 50), max_size=20), span=st.integers(-3, 40),
       suffix=st.lists(st.integers(0, 50), max_size=20))
def test_the_span_sits_between_prefix_and_suffix(prefix, span, suffix):
    if span < 1:
        try:
            layout_canvas(prefix, span, suffix)
        except ValueError as error:
            assert "at least 1" in str(error)
        else:
            raise AssertionError("an empty span was accepted")
        return
    canvas = layout_canvas(prefix, span, suffix)
    assert (canvas.span_start, canvas.suffix_start, canvas.length) == (
        len(prefix), len(prefix) + span, len(prefix) + span + len(suffix))
