"""The model work behind the code actions, run on the model thread against an `Engine`.

Each job takes the engine, the document around the edited range (`Span`) and the settings, and returns the text to
put in place of the range (None when nothing passed the syntax check) with the fill's counters for the status.
"""

from __future__ import annotations

import logging
import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from infill_engine import syntax
from infill_engine.request import InfillRequest
from lsp_server import postprocess
from lsp_server.context import WINDOW_CHARS, cursor_at, line_comment
from lsp_server.settings import Settings

if TYPE_CHECKING:
    from infill_engine.interface import Engine
    from lsp_server.scheduler import Ticket

logger = logging.getLogger(__name__)

QUICK_FIX_MIN_PROB = 0.05  # a quick fix is offered only when the model gave every token it wrote at least this


@dataclass(frozen=True)
class Span:
    """The document around an edited range: the text before, the range's own text, and the text after.

    For a large document `before` and `after` are windows of whole lines, as for completion.
    """

    before: str
    original: str
    after: str

    @classmethod
    def of(cls, text: str, start: int, end: int) -> Span:
        window_start = cursor_at(text, start).window_start
        window_end = min(len(text), end + WINDOW_CHARS)
        if window_end < len(text):
            window_end = text.rfind("\n", end, window_end) + 1 or window_end
        return cls(text[window_start:start], text[start:end], text[end:window_end])

    def first_passing(self, texts: Sequence[str], language: str | None) -> str | None:
        """The first text that is not blank, differs from the original and adds no syntax problem in its place."""
        document = self.before + self.original + self.after
        start, end = len(self.before), len(self.before) + len(self.original)
        for text in texts:
            if text.strip() and text != self.original and syntax.check_fill(document, start, end, text, language).ok:
                return text
        return None


def rewrite_job(engine: Engine, span: Span, language: str | None, settings: Settings,
                instruction: str | None, ticket: Ticket) -> tuple[str | None, dict[str, Any]]:
    """On the model thread: a fresh fill in place of the selection (never blank: a blank one would be dropped)."""
    tokens = engine.count_tokens(span.original)
    max_tokens = max(8, min(settings.rewrite.max_tokens, tokens * 3 // 2 + 8))
    request = InfillRequest(_with_instruction(span.before, instruction, language), span.after, language=language,
                            max_tokens=max_tokens, candidates=settings.rewrite.candidates, require_content=True)
    result = engine.fill(request, on_step=ticket.on_step, document=ticket.key)
    texts = [_shaped_like(c.text, span.original) for c in result.candidates + result.rejected]
    return span.first_passing(texts, language), result.stats.as_dict()


def refine_job(engine: Engine, span: Span, language: str | None, settings: Settings,
               ticket: Ticket) -> tuple[str | None, dict[str, Any]]:
    """On the model thread: the selection re-denoised from its own tokens, the confident ones kept."""
    request = InfillRequest(span.before, span.after, language=language, candidates=settings.rewrite.candidates)
    result = engine.refine(request, span.original, keep_above=settings.rewrite.keep_above,
                           on_step=ticket.on_step, document=ticket.key)
    return span.first_passing([c.text for c in result.candidates], language), result.stats.as_dict()


def fill_here_job(engine: Engine, span: Span, language: str | None, settings: Settings,
                  ticket: Ticket) -> tuple[str | None, dict[str, Any]]:
    """On the model thread: a multi-line fill in place of a placeholder, tidied like ghost text."""
    request = InfillRequest(span.before, span.after, language=language, max_tokens=settings.rewrite.max_tokens,
                            candidates=settings.rewrite.candidates, require_content=True)
    result = engine.fill(request, on_step=ticket.on_step, document=ticket.key)
    around = cursor_at(span.before + span.after, len(span.before)).around
    texts = [v for c in result.candidates + result.rejected for v in postprocess.variants(c.text, around)]
    return span.first_passing(texts, language), result.stats.as_dict()


def quick_fix_job(engine: Engine, span: Span, problem: syntax.SyntaxProblem, language: str | None,
                  settings: Settings, ticket: Ticket) -> tuple[str | None, dict[str, Any]]:
    """On the model thread: the problem's line refined around it; the fix, when the line is left without problems,
    the document has fewer, and none is new.

    `problem` is in offsets of `span.original`.
    """
    request = InfillRequest(span.before, span.after, language=language, candidates=settings.rewrite.candidates)
    result = engine.refine(request, span.original, renoise=[(problem.start, problem.end)], keep_above=None,
                           on_step=ticket.on_step, document=ticket.key)
    before = syntax.find_problems(span.before + span.original + span.after, language)
    start = len(span.before)
    for candidate in result.candidates:
        if candidate.lowest < QUICK_FIX_MIN_PROB:  # a token the model did not believe in: no fix to offer
            continue
        fixed = span.first_passing([candidate.text], language)
        if fixed is None:
            continue
        after = syntax.find_problems(span.before + fixed + span.after, language)
        in_region = any(p.start <= start + len(fixed) and p.end >= start for p in after)
        if len(after) < len(before) and not in_region:
            return fixed, result.stats.as_dict()
    return None, result.stats.as_dict()


def _with_instruction(before: str, instruction: str | None, language: str | None) -> str:
    """The text before a selection with the instruction as a comment line just above the selection's line."""
    marker = line_comment(language)
    if not instruction or marker is None:
        if instruction:
            logger.info("no comment syntax for %s: the rewrite goes without its instruction", language or "plain text")
        return before
    line_start = before.rfind("\n") + 1
    indent = re.match(r"[ \t]*", before[line_start:]).group()  # type: ignore[union-attr]
    comment = " ".join(instruction.split())
    return f"{before[:line_start]}{indent}{marker} {comment}\n{before[line_start:]}"


def _shaped_like(text: str, original: str) -> str:
    """A rewrite ends with a line break exactly when the selection did."""
    text = text.rstrip()
    return text + "\n" if original.endswith("\n") else text
