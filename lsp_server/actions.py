"""Code actions and commands that edit a range with the model.

- **Rewrite selection** (`refactor.rewrite`, command `diffill.rewrite` with uri, range and an optional
  instruction): the selection is taken out and the hole denoised afresh in its context; the fill's length is free.
  An instruction is placed just before the selection as a comment line of the language, which is how a code model
  reads intent (chat templates are not used yet).
- **Refine selection** (`diffill.refine`): the selection's own tokens are kept where the model is confident in them
  and the rest re-noised and decided again (`Engine.refine`).
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
from collections import OrderedDict
from collections.abc import Sequence
from dataclasses import dataclass
from functools import partial
from typing import TYPE_CHECKING, Any

from lsprotocol import types
from pygls.exceptions import JsonRpcInvalidParams

from infill_engine import syntax
from lsp_server import conversion, status
from lsp_server.context import Snapshot
from lsp_server.model_jobs import Span, fill_here_job, quick_fix_job, refine_job, rewrite_job
from lsp_server.placeholders import placeholder_at
from lsp_server.scheduler import CANCELLED, CHANGED, EDIT

if TYPE_CHECKING:
    from infill_engine.interface import Engine
    from lsp_server.scheduler import Ticket
    from lsp_server.server import DiffillServer

logger = logging.getLogger(__name__)

REWRITE, REFINE, FILL_HERE = "rewrite", "refine", "fill"
COMMANDS = {REWRITE: "diffill.rewrite", REFINE: "diffill.refine", FILL_HERE: "diffill.fill"}
TITLES = {
    REWRITE: "Rewrite selection (diffill)", REFINE: "Refine selection (diffill)", FILL_HERE: "Fill here (diffill)",
}
QUICK_FIXES_PER_REQUEST = 3


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
        try:
            range_ = conversion.structure(data["range"], types.Range)
        except Exception as error:  # noqa: BLE001 - cattrs raises ClassValidationError, an ExceptionGroup
            raise ValueError(f"the code action's range is not an LSP range ({error})") from None
        instruction = data.get("instruction")
        if instruction is not None and not isinstance(instruction, str):
            raise ValueError("the code action's instruction is not text")
        return cls(data["diffill"], str(data["uri"]), range_, data.get("version"), instruction)

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
            report.model_started = ticket.started
        status.send(self.ls, report)


def _expected_failures(job: Any) -> Any:
    """The job, with a request the model cannot take (too long for it, nothing to refine) turned into no edit."""

    def guarded(engine: Engine) -> tuple[str | None, dict[str, Any]]:
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
