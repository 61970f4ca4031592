"""Context trimming at line boundaries and the canvas layout."""

from __future__ import annotations

import pytest

from infill_engine.canvas import ContextConfig, layout_canvas, trim_context

LINES = [f"value_{i} = compute({i}, {i + 1})\n" for i in range(200)]


def test_small_context_is_kept_whole(tokenizer):
    trimmed = trim_context(tokenizer, "a = 1\nb = ", "\nprint(b)\n", ContextConfig(100, 100))
    assert tokenizer.decode(trimmed.prefix_ids) == "a = 1\nb = "
    assert tokenizer.decode(trimmed.suffix_ids) == "\nprint(b)\n"


def test_prefix_is_cut_at_a_line_start_within_budget(tokenizer):
    prefix = "".join(LINES) + "result = "
    trimmed = trim_context(tokenizer, prefix, "", ContextConfig(prefix_tokens=60, suffix_tokens=0))
    text = tokenizer.decode(trimmed.prefix_ids)
    assert len(trimmed.prefix_ids) <= 60
    assert text.endswith("result = ")
    assert prefix.endswith(text)
    assert text.startswith("value_")  # a whole line, not the tail of one


def test_suffix_is_cut_at_a_line_end_within_budget(tokenizer):
    suffix = ")\n" + "".join(LINES)
    trimmed = trim_context(tokenizer, "", suffix, ContextConfig(prefix_tokens=0, suffix_tokens=60))
    text = tokenizer.decode(trimmed.suffix_ids)
    assert len(trimmed.suffix_ids) <= 60
    assert suffix.startswith(text)
    assert text.endswith("\n")


def test_a_huge_document_only_tokenizes_a_window(tokenizer):
    prefix = "".join(LINES) * 300  # about 5 MB
    trimmed = trim_context(tokenizer, prefix, prefix, ContextConfig(prefix_tokens=100, suffix_tokens=50))
    assert 0 < len(trimmed.prefix_ids) <= 100
    assert 0 < len(trimmed.suffix_ids) <= 50


def test_a_cursor_line_longer_than_the_budget_keeps_its_tail(tokenizer):
    prefix = "x = [" + ", ".join(str(i) for i in range(300))
    trimmed = trim_context(tokenizer, prefix, "", ContextConfig(prefix_tokens=20, suffix_tokens=0))
    assert 0 < len(trimmed.prefix_ids) <= 20
    assert prefix.endswith(tokenizer.decode(trimmed.prefix_ids))


def test_layout_places_the_span_between_prefix_and_suffix():
    canvas = layout_canvas([1, 2, 3], 4, [9])
    assert (canvas.span_start, canvas.suffix_start, canvas.length) == (3, 7, 8)
    with pytest.raises(ValueError, match="at least 1"):
        layout_canvas([1], 0, [])


def test_negative_budgets_are_rejected():
    with pytest.raises(ValueError, match="prefix_tokens must be"):
        ContextConfig(prefix_tokens=-1)


def test_a_small_window_cuts_exactly_where_the_whole_text_would(tokenizer, monkeypatch):
    """The window starts small and grows; what it keeps is what tokenizing the whole text would keep."""
    import inspect
    import textwrap as module

    from infill_engine import canvas

    source = inspect.getsource(module) + "\n" + "x = '" + "long line " * 400 + "'\n" + "\t\n" * 50
    cursors = range(0, len(source), max(1, len(source) // 37))
    budgets = (1, 7, 30, 120, 500)
    narrow = [trim_context(tokenizer, source[:c], source[c:], ContextConfig(b, b)) for c in cursors for b in budgets]
    monkeypatch.setattr(canvas, "WINDOW_CHARS_PER_TOKEN", canvas.MAX_CHARS_PER_TOKEN)  # the widest window at once
    wide = [trim_context(tokenizer, source[:c], source[c:], ContextConfig(b, b)) for c in cursors for b in budgets]
    assert narrow == wide
