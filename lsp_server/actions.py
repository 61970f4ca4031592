"""Code actions and commands that edit a range with the model.

- **Rewrite selection** (`refactor.rewrite`, command `diffill.rewrite` with uri, range and an optional
  instruction): the selection is taken out and the hole denoised afresh in its context; the fill's length is free.
  An instruction is placed just before the selection as a comment line of the language, which is how a code model
  reads intent (chat templates are not used yet).
- **Refine selection** (`diffill.refine`): the selection's own tokens are kept where the model is confident in them
  and the rest re-noised and decided again (`InfillEngine.refine`).
- **Fill here** (`diffill.fill`): on a placeholder body inside a function (`...`, `pass`, a `TODO` comment,
  `todo!()`), the placeholder is replaced by a multi-line fill.
- **Quick fixes** (`quickfix`) for the syntax diagnostics: the region around the error (its line) is refined with
  the tokens at the error re-noised and room to grow; offered only when the result has no new problem and the
  error is gone. Computed when the editor asks for the actions of a diagnostic, once per document version.

Computing an edit takes the model, so the first three are offered without one: the edit is computed on
`codeAction/resolve`, or by the command when the client cannot resolve. Every edit is a `WorkspaceEdit` of the
document version it was computed for, and is never returned when the document changed meanwhile.
"""

from __future__ import annotations

import logging
import re
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any

from lsprotocol import types
from pygls.exceptions import JsonRpcInvalidParams

from infill_engine import syntax
from lsp_server import conversion, postprocess, status
from lsp_server.context import WINDOW_CHARS, Snapshot, cursor_at
from lsp_server.scheduler import CANCELLED, CHANGED, EDIT
from lsp_server.settings import Settings

if TYPE_CHECKING:
    from infill_engine.engine import InfillEngine
    from lsp_server.scheduler import Ticket
    from lsp_server.server import DiffillServer

logger = logging.getLogger(__name__)

REWRITE, REFINE, FILL_HERE = "rewrite", "refine", "fill"
COMMANDS = {REWRITE: "diffill.rewrite", REFINE: "diffill.refine", FILL_HERE: "diffill.fill"}
TITLES = {
    REWRITE: "Rewrite selection (diffill)", REFINE: "Refine selection (diffill)", FILL_HERE: "Fill here (diffill)",
}
QUICK_FIXES_PER_REQUEST = 3
GROW = 4  # positions a refined region may grow by
QUICK_FIX_MIN_PROB = 0.05  # a quick fix is offered only when the model gave every token it wrote at least this

_PLACEHOLDER = re.compile(r"^(?P<indent>[ \t]*)(?P<body>\.\.\.|pass|todo!\(\)|(?:#|//|--)[ \t]*TODO\b.*?)[ \t]*$")
_FUNCTION_HEADER = re.compile(
    r"^\s*(?:async\s+def|def|(?:export\s+)?(?:async\s+)?function|func|(?:pub(?:\(\w+\))?\s+)?(?:async\s+)?fn"
    r"|local\s+function)\b"  # keyword languages
    r"|^\s*\).*:\s*$"  # the last line of a multi-line Python signature
    r"|\)\s*(?:->\s*[^{]*|:\s*[\w<>\[\], ]+|\s+\w+(?:\s*,\s*\w+)*)?\{\s*$"  # C, Java, Go, Rust, TypeScript: ...) {
    r"|=>\s*\{\s*$"
)
_LINE_COMMENT = {"python": "#", "lua": "--"}


@dataclass(frozen=True)
class EditRequest:
    """An edit to compute: which action, where, and for which document version."""

    kind: str  # REWRITE, REFINE or FILL_HERE
    uri: str
    range: types.Range
    version: int | None = None  # the version the action was offered for; None: whatever is current
    instruction: str | None = None

    def data(self) -> dict[str, Any]:
        """The JSON `data` of a code action, which comes back in `codeAction/resolve`."""
        return {"diffill": self.kind, "uri": self.uri, "range": conversion.unstructure(self.range),
                "version": self.version, "instruction": self.instruction}

    @classmethod
    def from_data(cls, data: Any) -> EditRequest:
        """The request a resolved code action carries; ValueError when it is not one of ours."""
        if not isinstance(data, dict) or data.get("diffill") not in COMMANDS:
            raise ValueError("not a diffill code action")
        return cls(data["diffill"], str(data["uri"]), conversion.structure(data["range"], types.Range),
                   data.get("version"), data.get("instruction"))

    @classmethod
    def from_arguments(cls, kind: str, arguments: Sequence[Any]) -> EditRequest:
        """The request of a command's arguments: uri, range and (rewrite only) an optional instruction."""
        most = 3 if kind == REWRITE else 2
        if not 2 <= len(arguments) <= most or not isinstance(arguments[0], str):
            raise JsonRpcInvalidParams(f"{COMMANDS[kind]} takes a document uri, a range" +
                                       (" and an optional instruction" if kind == REWRITE else ""))
        try:
            range_ = conversion.structure(arguments[1], types.Range)
        except Exception as error:  # noqa: BLE001 - any structuring failure is the caller's bad argument
            raise JsonRpcInvalidParams(f"{COMMANDS[kind]}: the second argument is not an LSP range ({error})") from None
        instruction = arguments[2] if len(arguments) == 3 else None
        if instruction is not None and not isinstance(instruction, str):
            raise JsonRpcInvalidParams(f"{COMMANDS[kind]}: the instruction must be text")
        return cls(kind, arguments[0], range_, None, instruction or None)


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


# ------------------------------------------------------------------------------------------- the model jobs


def rewrite_job(engine: InfillEngine, span: Span, language: str | None, settings: Settings,
                instruction: str | None, ticket: Ticket) -> tuple[str | None, dict[str, Any]]:
    """On the model thread: a fresh fill in place of the selection."""
    from infill_engine.request import InfillRequest

    tokens = len(engine.denoiser.tokenizer(span.original, add_special_tokens=False)["input_ids"])
    max_tokens = max(8, min(settings.rewrite.max_tokens, tokens * 3 // 2 + 8))
    request = InfillRequest(_with_instruction(span.before, instruction, language), span.after, language=language,
                            max_tokens=max_tokens, candidates=settings.rewrite.candidates)
    result = engine.fill(request, on_step=ticket.on_step)
    texts = [_shaped_like(c.text, span.original) for c in result.candidates + result.rejected]
    return span.first_passing(texts, language), result.stats.as_dict()


def refine_job(engine: InfillEngine, span: Span, language: str | None, settings: Settings,
               ticket: Ticket) -> tuple[str | None, dict[str, Any]]:
    """On the model thread: the selection re-denoised from its own tokens, the confident ones kept."""
    from infill_engine.request import InfillRequest

    request = InfillRequest(span.before, span.after, language=language, candidates=settings.rewrite.candidates)
    result = engine.refine(request, span.original, keep_above=settings.rewrite.keep_above, grow=GROW,
                           on_step=ticket.on_step)
    return span.first_passing([c.text for c in result.candidates], language), result.stats.as_dict()


def fill_here_job(engine: InfillEngine, span: Span, language: str | None, settings: Settings,
                  ticket: Ticket) -> tuple[str | None, dict[str, Any]]:
    """On the model thread: a multi-line fill in place of a placeholder, tidied like ghost text."""
    from infill_engine.request import InfillRequest

    request = InfillRequest(span.before, span.after, language=language, max_tokens=settings.rewrite.max_tokens,
                            candidates=settings.rewrite.candidates)
    result = engine.fill(request, on_step=ticket.on_step)
    around = cursor_at(span.before + span.after, len(span.before)).around
    texts = [v for c in result.candidates + result.rejected for v in postprocess.variants(c.text, around)]
    return span.first_passing(texts, language), result.stats.as_dict()


def quick_fix_job(engine: InfillEngine, span: Span, problem: syntax.SyntaxProblem, language: str | None,
                  settings: Settings, ticket: Ticket) -> tuple[str | None, dict[str, Any]]:
    """On the model thread: the problem's line refined around it; the fix, when the line is left without problems,
    the document has fewer, and none is new.

    `problem` is in offsets of `span.original`.
    """
    from infill_engine.request import InfillRequest

    request = InfillRequest(span.before, span.after, language=language, candidates=settings.rewrite.candidates)
    result = engine.refine(request, span.original, renoise=[(problem.start, problem.end)], keep_above=None,
                           grow=GROW, on_step=ticket.on_step)
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
    marker = _LINE_COMMENT.get(language or "", "//" if language else None)
    if not instruction or marker is None:
        return before
    line_start = before.rfind("\n") + 1
    indent = re.match(r"[ \t]*", before[line_start:]).group()  # type: ignore[union-attr]
    comment = " ".join(instruction.split())
    return f"{before[:line_start]}{indent}{marker} {comment}\n{before[line_start:]}"


def _shaped_like(text: str, original: str) -> str:
    """A rewrite ends with a line break exactly when the selection did."""
    text = text.rstrip()
    return text + "\n" if original.endswith("\n") else text


def placeholder_at(text: str, line: int) -> tuple[int, int] | None:
    """Offsets of a placeholder body on `line` when the line is inside a function, else None.

    The block's header is the nearest line above with less indentation (a lone `{` defers to the line above it).
    """
    index = conversion.line_index(text)
    if not 0 <= line < index.line_count:
        return None
    start = index.starts[line]
    match = _PLACEHOLDER.match(text[start : index.line_end(line)])
    if match is None or not match.group("indent"):
        return None
    indent = len(match.group("indent"))
    lines = [text[index.starts[n] : index.line_end(n)] for n in range(max(0, line - 200), line)]
    headers = [content for content in lines if content.strip() and len(content) - len(content.lstrip(" \t")) < indent]
    if headers and headers[-1].strip() == "{" and len(headers) > 1:
        headers.pop()
        if headers[-1].rstrip().endswith(")"):
            return start + indent, start + match.end("body")
    if headers and _FUNCTION_HEADER.search(headers[-1]):
        return start + indent, start + match.end("body")
    return None


def _wanted(kind: str, only: Sequence[str] | None) -> bool:
    """Whether a code action kind is among those the client asked for (kinds are hierarchical)."""
    return not only or any(kind == o or kind.startswith(f"{o}.") or o == "" for o in only)


# -------------------------------------------------------------------------------------------------- the actions


class Editor:
    """Offers the code actions, and computes their edits on request."""

    def __init__(self, ls: DiffillServer) -> None:
        self.ls = ls
        self._fixes: OrderedDict[tuple[str, int | None, int, int, str], str | None] = OrderedDict()

    async def actions(self, document: Snapshot, params: types.CodeActionParams) -> list[types.CodeAction]:
        """The code actions for a range: lazy rewrite/refine/fill-here, and quick fixes that are known to work."""
        ls = self.ls
        offsets = conversion.offsets_of(document.text, params.range, ls.encoding)
        if offsets is None or not ls.settings.enabled_for(document.language_id):
            return []
        only = params.context.only
        found: list[types.CodeAction] = []
        if _wanted(types.CodeActionKind.QuickFix, only) and ls.settings.rewrite.quick_fixes:
            found += await self._quick_fixes(document, params.context.diagnostics)
        if not _wanted(types.CodeActionKind.RefactorRewrite, only):
            return found
        start, end = offsets
        if start != end:
            for kind in (REWRITE, REFINE):
                found.append(self._lazy(EditRequest(kind, document.uri, params.range, document.version)))
        place = placeholder_at(document.text, params.range.start.line)
        if place is not None:
            place_range = conversion.line_index(document.text).range_of(*place, ls.encoding)
            found.append(self._lazy(EditRequest(FILL_HERE, document.uri, place_range, document.version)))
        return found

    def _lazy(self, request: EditRequest) -> types.CodeAction:
        """A code action whose edit is computed on resolve, or by its command when the client cannot resolve."""
        action = types.CodeAction(title=TITLES[request.kind], kind=types.CodeActionKind.RefactorRewrite)
        if self.ls.client_supports_resolve("edit"):
            action.data = request.data()
        else:
            arguments = [request.uri, conversion.unstructure(request.range)]
            action.command = types.Command(
                title=TITLES[request.kind], command=COMMANDS[request.kind], arguments=arguments
            )
        return action

    async def resolve(self, action: types.CodeAction) -> types.CodeAction:
        """Fill in the edit of a lazy code action (left without one when nothing passed or the document moved on)."""
        try:
            request = EditRequest.from_data(action.data)
        except (ValueError, KeyError, TypeError):
            return action
        action.edit = await self.edit(request, types.CODE_ACTION_RESOLVE)
        return action

    async def command(self, kind: str, arguments: Sequence[Any]) -> types.WorkspaceEdit | None:
        """Run a command: compute the edit, ask the client to apply it, and return it."""
        edit = await self.edit(EditRequest.from_arguments(kind, arguments), types.WORKSPACE_EXECUTE_COMMAND)
        if edit is not None and self.ls.client_supports("workspace.apply_edit"):
            future = self.ls.workspace_apply_edit(types.ApplyWorkspaceEditParams(edit=edit, label=TITLES[kind]))
            future.add_done_callback(_log_apply_result)
        return edit

    async def edit(self, request: EditRequest, method: str) -> types.WorkspaceEdit | None:
        """Compute the edit of a request against the current document, or None."""
        ls = self.ls
        report = status.Report(method, request.uri)
        document = ls.snapshot(request.uri)
        if document is None or (request.version is not None and request.version != document.version):
            self._done(report, CHANGED if document else "invalid")
            return None
        offsets = conversion.offsets_of(document.text, request.range, ls.encoding)
        if offsets is None or (offsets[0] == offsets[1] and request.kind != FILL_HERE):
            self._done(report, "invalid")
            return None
        if not ls.host.ready:
            self._done(report, "not_ready")
            return None
        span = Span.of(document.text, *offsets)
        settings, language = ls.settings, document.language
        ticket = ls.scheduler.issue(document.uri, EDIT, document.version)
        if request.kind == REWRITE:
            job = partial(rewrite_job, span=span, language=language, settings=settings,
                          instruction=request.instruction, ticket=ticket)
        elif request.kind == REFINE:
            job = partial(refine_job, span=span, language=language, settings=settings, ticket=ticket)
        else:
            job = partial(fill_here_job, span=span, language=language, settings=settings, ticket=ticket)
        try:
            outcome = await ls.host.run(_expected_failures(job), ticket, lambda t: self._done(report, CANCELLED, t))
        finally:
            ls.scheduler.finish(ticket)
        if outcome is None:
            self._done(report, ticket.reason or CANCELLED, ticket=ticket)
            return None
        text, report.stats = outcome
        if ls.document_version(document.uri) != document.version:
            self._done(report, CHANGED, ticket=ticket)
            return None
        if text is None:
            ls.show(f"diffill: no {request.kind} of this range passed the syntax check", types.MessageType.Info)
            self._done(report, "empty", ticket=ticket)
            return None
        self._done(report, "ok", ticket=ticket, items=1)
        range_ = conversion.line_index(document.text).range_of(*offsets, ls.encoding)
        versioned = ls.client_supports_versioned_edits()
        return conversion.workspace_edit(document.uri, document.version, range_, text, versioned)

    async def _quick_fixes(
        self, document: Snapshot, diagnostics: Sequence[types.Diagnostic]
    ) -> list[types.CodeAction]:
        """A quick fix for each of our diagnostics whose region the model can repair."""
        ls = self.ls
        ours = [d for d in diagnostics if d.source == conversion.SOURCE][:QUICK_FIXES_PER_REQUEST]
        if not ours or not ls.host.ready or document.language is None:
            return []
        report = status.Report(types.TEXT_DOCUMENT_CODE_ACTION, document.uri)
        index = conversion.line_index(document.text)
        ticket = ls.scheduler.issue(document.uri, EDIT, document.version)
        fixes = []
        try:
            for diagnostic in ours:
                region = self._region(document.text, diagnostic)
                if region is None:
                    continue
                start, end, problem = region
                key = (document.uri, document.version, start, end, diagnostic.message)
                if key not in self._fixes:
                    span, settings, language = Span.of(document.text, start, end), ls.settings, document.language
                    job = partial(quick_fix_job, span=span, problem=problem, language=language, settings=settings,
                                  ticket=ticket)
                    outcome = await ls.host.run(_expected_failures(job), ticket)
                    if outcome is None:
                        break  # superseded, cancelled or the document changed
                    self._remember(key, outcome[0])
                    report.stats = outcome[1]
                text = self._fixes[key]
                if text is not None:
                    range_ = index.range_of(start, end, ls.encoding)
                    edit = conversion.workspace_edit(document.uri, document.version, range_, text,
                                                     ls.client_supports_versioned_edits())
                    fixes.append(types.CodeAction(title=f"Fix {diagnostic.message} (diffill)",
                                                  kind=types.CodeActionKind.QuickFix, diagnostics=[diagnostic],
                                                  edit=edit, is_preferred=True))
        finally:
            ls.scheduler.finish(ticket)
        if ls.document_version(document.uri) != document.version:
            fixes = []
        self._done(report, "ok" if fixes else (ticket.reason or "empty"), ticket=ticket, items=len(fixes))
        return fixes

    def _region(self, text: str, diagnostic: types.Diagnostic) -> tuple[int, int, syntax.SyntaxProblem] | None:
        """The line where a diagnostic starts, and its problem in offsets of that line; None when it is blank."""
        offsets = conversion.offsets_of(text, diagnostic.range, self.ls.encoding)
        if offsets is None:
            return None
        index = conversion.line_index(text)
        line = diagnostic.range.start.line
        start, end = index.starts[line], index.line_end(line)
        if not text[start:end].strip():
            return None
        first, last = offsets[0] - start, min(offsets[1], end) - start
        kind = diagnostic.code if isinstance(diagnostic.code, str) else "error"
        return start, end, syntax.SyntaxProblem(first, max(first, last), kind, diagnostic.message)

    def _remember(self, key: tuple[str, int | None, int, int, str], text: str | None) -> None:
        self._fixes[key] = text
        while len(self._fixes) > 128:
            self._fixes.popitem(last=False)

    def _done(self, report: status.Report, outcome: str, ticket: Ticket | None = None, items: int = 0) -> None:
        """Send the request's status; the callers then answer with nothing (or their edit)."""
        report.outcome, report.items = outcome, items
        if ticket is not None:
            report.steps_done = ticket.steps
        status.send(self.ls, report)


def _expected_failures(job: Any) -> Any:
    """The job, with a request the model cannot take (too long for it, nothing to refine) turned into no edit."""

    def guarded(engine: InfillEngine) -> tuple[str | None, dict[str, Any]]:
        try:
            return job(engine)
        except ValueError as error:
            logger.warning("no edit: %s", error)
            return None, {}

    return guarded


def _log_apply_result(future: Any) -> None:
    try:
        result = future.result()
        if not getattr(result, "applied", True):
            logger.info("the client did not apply the edit: %s", getattr(result, "failure_reason", None))
    except Exception as error:  # noqa: BLE001 - a client without workspace/applyEdit answers with an error
        logger.info("workspace/applyEdit failed: %s", error)
