"""The diffill language server: every LSP handler is registered here, each a thin call into its module.

    initialize            answered at once; torch is not imported (the model loads after `initialized`)
    initialized           loads the model in the background, with $/progress
    didOpen/didChange     supersede running work for the document; schedule its syntax diagnostics
    inlineCompletion      ghost text                          -> completion.Completer
    completion            completion items inserting the fill -> completion.Completer
    codeAction (+resolve) rewrite, refine, fill here, quick fixes -> actions.Editor
    diffill.rewrite/refine/fill   the same edits as commands  -> actions.Editor
    diffill/debugInfo     the server's state (model, settings, whether torch was loaded at initialize)
    diffill/status        notification after every request   -> status

State lives on `DiffillServer`; handlers take it as their first parameter.
"""

from __future__ import annotations

import asyncio
import logging
import os
import sys
from dataclasses import asdict, replace
from importlib import metadata
from typing import Any
from urllib.parse import unquote

from lsprotocol import types
from pygls.capabilities import get_capability
from pygls.exceptions import JsonRpcException, JsonRpcInvalidParams
from pygls.lsp.server import LanguageServer
from pygls.protocol import LanguageServerProtocol

from infill_engine.interface import ModelSpec
from infill_engine.service.address import is_loopback
from lsp_server import status
from lsp_server.actions import COMMANDS, FILL_HERE, REFINE, REWRITE, Editor
from lsp_server.cache import SuggestionCache
from lsp_server.completion import Completer
from lsp_server.context import Snapshot
from lsp_server.conversion import completion_list, inline_completion_list
from lsp_server.diagnostics import DiagnosticsPublisher
from lsp_server.scheduler import CHANGED, CLOSED, FILL, PREFETCH, RELOAD, SHUTDOWN, Scheduler
from lsp_server.settings import ModelSettings, Settings, concerns_us, parse_settings
from lsp_server.worker import ModelHost

logger = logging.getLogger(__name__)

try:
    VERSION = metadata.version("diffill")
except metadata.PackageNotFoundError:  # running from a source tree that was never installed
    VERSION = "0.0.0"

DEBUG_INFO = "diffill/debugInfo"
MAX_DOCUMENT_CHARS = 16 * 1024 * 1024  # a larger document (generated data, a log) is served nothing


# params that the protocol types as arrays, by method: the converter reads a string given there character by character,
# one failed element each, so a 200 kB string kept the server busy for over a minute (found by the LSP fuzz test)
LIST_PARAMS = {
    "textDocument/didChange": (("contentChanges",),),
    "textDocument/codeAction": (("context", "diagnostics"), ("context", "only")),
    "workspace/didChangeWorkspaceFolders": (("event", "added"), ("event", "removed")),
    "workspace/didChangeWatchedFiles": (("changes",),),
}


def lists_where_lists_belong(message: dict[str, Any]) -> bool:
    """Whether the array params of the message's method (LIST_PARAMS) hold no string, bytes or number."""
    for path in LIST_PARAMS.get(str(message.get("method")), ()):
        value: Any = message.get("params")
        for key in path:
            value = value.get(key) if isinstance(value, dict) else None
        if isinstance(value, (str, bytes, int, float)):
            return False
    return True


class DiffillProtocol(LanguageServerProtocol):
    """pygls' protocol, except that a request whose params cannot be read is answered with an error.

    pygls logs such a message and drops it, leaving the client waiting for an answer that never comes.

    Also: pygls keeps the future of every notification whose handler is a generator or a coroutine (`didOpen`,
    `didChange`, `didClose` among them) in its table of running requests, under a fresh uuid that nothing removes,
    so each keystroke's change stayed in memory (about 2 KiB; found by `diffill bench load`). A notification cannot be
    cancelled, so its future leaves the table when it is done.
    """

    def structure_message(self, data: dict[str, Any]) -> Any:
        try:
            if isinstance(data, dict) and "method" in data and "params" not in data:
                data = {**data, "params": None}  # JSON-RPC lets params be left out; pygls' message types require them
            if isinstance(data, dict) and not lists_where_lists_belong(data):
                raise JsonRpcInvalidParams(f"{data.get('method')}: an array param holds a string or a number")
            return super().structure_message(data)
        except JsonRpcException as error:
            if isinstance(data, dict) and "id" in data and "method" in data:
                self._send_response(data["id"], error=error.to_response_error())
            raise

    def _handle_notification(self, method_name: str, params: Any) -> None:
        before = set(self._request_futures)
        super()._handle_notification(method_name, params)
        for key in set(self._request_futures) - before:
            self._request_futures[key].add_done_callback(lambda _, key=key: self._request_futures.pop(key, None))


class DiffillServer(LanguageServer):
    """The language server and everything it keeps between requests."""

    def __init__(self) -> None:
        super().__init__(
            "diffill", VERSION, text_document_sync_kind=types.TextDocumentSyncKind.Incremental,
            protocol_cls=DiffillProtocol,
        )
        self.base_settings = Settings()  # from the command line: used where the editor sends nothing
        self.settings = Settings()
        self.host = ModelHost()
        self.scheduler = Scheduler()
        self.cache = SuggestionCache(self.settings.completion.cache_entries)
        self.completer = Completer(self)
        self.editor = Editor(self)
        self.diagnostics = DiagnosticsPublisher(self)
        self.torch_loaded_at_initialize: bool | None = None
        self.pending_messages: list[str] = []  # settings problems found before the client was ready to hear them
        self.options_sent = False  # whether the client sent initializationOptions
        self.client_initialized = False  # whether the client sent `initialized` (a second one must not reload the model)
        self.loop: asyncio.AbstractEventLoop | None = None
        self.versions: dict[str, int] = {}  # the newest version seen of each open document
        self.out_of_sync: set[str] = set()  # documents whose changes arrived out of order: served nothing
        self.over_tcp = False  # serving a TCP port, which any local user can reach (see `configure`)
        self.too_large: set[str] = set()  # documents over MAX_DOCUMENT_CHARS the user has been told about
        self._loading: asyncio.Task[None] | None = None

    # ------------------------------------------------------------------------------------------- documents

    @property
    def encoding(self) -> str:
        """The position encoding agreed with the client (UTF-16 unless it offered UTF-8 or UTF-32 first)."""
        return str(self.workspace.position_encoding or types.PositionEncodingKind.Utf16)

    def snapshot(self, uri: str) -> Snapshot | None:
        """The open document at `uri` as it is now, or None when the client never opened it."""
        document = self.workspace.text_documents.get(unquote(uri))
        if document is None or unquote(uri) in self.out_of_sync or not self.within_limit(unquote(uri), document.source):
            return None
        return Snapshot(uri, document.version, document.source, document.language_id or "")

    def document_version(self, uri: str) -> int | None:
        """The current version of an open document (None when closed)."""
        document = self.workspace.text_documents.get(unquote(uri))
        return None if document is None or unquote(uri) in self.out_of_sync else document.version

    def within_limit(self, key: str, text: str) -> bool:
        """Whether a document is small enough to serve; the first time one is not, the user is told."""
        if len(text) <= MAX_DOCUMENT_CHARS:
            self.too_large.discard(key)
            return True
        if key not in self.too_large:
            self.too_large.add(key)
            self.show(f"diffill: {key} has {len(text):,} characters, over the limit of {MAX_DOCUMENT_CHARS:,}; no "
                      "suggestions, edits or diagnostics for it")
        return False

    def note_version(self, uri: str, version: int, whole: bool) -> None:
        """Check a change's version against the newest seen: one that is not newer means the changes arrived out of
        order, and the text may not be the editor's; the document is served nothing (no edit can name the wrong text)
        until a change of the whole text with a newer version, or a reopen, brings it back."""
        key = unquote(uri)
        newest = self.versions.get(key)
        if newest is not None and version <= newest:
            if key not in self.out_of_sync:
                self.out_of_sync.add(key)
                self.show(f"diffill: a change of {key} came with version {version} after version {newest}; no "
                          "suggestions or edits for it until the editor sends its whole text again (reopen it)")
            return
        self.versions[key] = version
        if whole:
            self.out_of_sync.discard(key)

    def other_documents(self, uri: str) -> list[tuple[str, str]]:
        """(uri, text) of every other open document."""
        own = unquote(uri)
        return [(key, document.source) for key, document in self.workspace.text_documents.items()
                if key != own and key not in self.out_of_sync and len(document.source) <= MAX_DOCUMENT_CHARS]

    # ------------------------------------------------------------------------------------------ the client

    def client_supports(self, field: str) -> bool:
        """Whether a dotted client capability (`window.work_done_progress`) is set."""
        return bool(get_capability(self.client_capabilities, field, False))  # type: ignore[call-overload]

    def client_supports_resolve(self, prop: str) -> bool:
        """Whether the client resolves this property of code actions lazily."""
        support = get_capability(self.client_capabilities, "text_document.code_action.resolve_support", None)
        return support is not None and prop in support.properties

    def client_supports_versioned_edits(self) -> bool:
        """Whether workspace edits may name the document version they apply to."""
        return self.client_supports("workspace.workspace_edit.document_changes")

    def show(self, message: str, kind: types.MessageType = types.MessageType.Warning) -> None:
        """Tell the user (window/showMessage) and log it."""
        logger.log(logging.WARNING if kind <= types.MessageType.Warning else logging.INFO, "%s", message)
        self.window_show_message(types.ShowMessageParams(type=kind, message=message))

    # ------------------------------------------------------------------------------------------ settings

    def configure(self, raw: Any) -> tuple[bool, list[str]]:
        """Take new settings; returns whether the model must be reloaded, and the problems found."""
        settings, problems = parse_settings(raw, self.base_settings)
        if self.over_tcp and settings.model.trust_remote_code and not self.base_settings.model.trust_remote_code:
            # any local user can connect to the port and send settings: a checkpoint's code runs only when the
            # command line that started the server allowed it
            settings = replace(settings, model=replace(settings.model, trust_remote_code=False))
            problems.append("model.trustRemoteCode is refused over TCP, where any user of this machine can connect; "
                            "start the server with --trust-remote-code to allow a checkpoint's own code")
        reload = settings.model != self.settings.model
        self.settings = settings
        self.cache = SuggestionCache(settings.completion.cache_entries)
        return reload, [f"diffill: {problem}" for problem in problems]

    def start_loading(self) -> None:
        """Load (or reload) the model in the background."""
        self.scheduler.cancel_all(RELOAD)
        self._loading = asyncio.ensure_future(status.load_with_progress(self))

    def report_server_error(self, error: Exception, source: Any) -> None:
        """Malformed input was already answered with a JSON-RPC error: log it, do not alarm the user."""
        if source is JsonRpcException:  # the message could not be read (see DiffillProtocol)
            logger.warning("bad message from the client: %s", error)
            return
        super().report_server_error(error, source)

    def debug_info(self) -> dict[str, Any]:
        """What `diffill/debugInfo` answers."""
        return {
            "version": VERSION,
            "torch_loaded_at_initialize": self.torch_loaded_at_initialize,
            "torch_loaded": "torch" in sys.modules,
            "state": self.host.state,
            "message": self.host.message,
            "model": self.host.description,
            "position_encoding": self.encoding,
            "settings": asdict(self.settings),
            "cache_entries": len(self.cache),
            "prefetched": self.completer.prefetched,  # fills made ahead for an accepted suggestion and kept
            "open_documents": len(self.workspace.text_documents),
            "running_handlers": len(self.protocol._request_futures),  # requests (and notifications) not yet done
            "pid": os.getpid(),
        }


SERVER = DiffillServer()


@SERVER.feature(types.INITIALIZE)
def initialize(ls: DiffillServer, params: types.InitializeParams) -> None:
    ls.torch_loaded_at_initialize = "torch" in sys.modules
    ls.loop = asyncio.get_running_loop()
    ls.options_sent = params.initialization_options is not None
    _, ls.pending_messages = ls.configure(params.initialization_options)


@SERVER.feature(types.INITIALIZED)
async def initialized(ls: DiffillServer, params: types.InitializedParams) -> None:
    if ls.client_initialized:
        logger.warning("a second 'initialized' notification ignored")
        return
    ls.client_initialized = True
    for message in ls.pending_messages:
        ls.show(message)
    if not ls.options_sent and ls.client_supports("workspace.configuration"):
        await _pull_configuration(ls)
    ls.start_loading()


@SERVER.feature(types.WORKSPACE_DID_CHANGE_CONFIGURATION)
async def did_change_configuration(ls: DiffillServer, params: types.DidChangeConfigurationParams) -> None:
    if not params.settings and ls.client_supports("workspace.configuration"):
        await _pull_configuration(ls, reload=True)
        return
    _apply(ls, params.settings, reload_model=True)


async def _pull_configuration(ls: DiffillServer, reload: bool = False) -> None:
    """Ask the client for the `diffill` section (clients that do not push settings)."""
    try:
        items = [types.ConfigurationItem(section="diffill")]
        result = await asyncio.wait_for(ls.workspace_configuration_async(types.ConfigurationParams(items=items)), 5)
    except Exception as error:  # noqa: BLE001 - a client that cannot answer keeps the settings it sent
        logger.info("workspace/configuration failed: %s", error)
        return
    if result and result[0]:
        _apply(ls, result[0], reload_model=reload)


def _apply(ls: DiffillServer, raw: Any, reload_model: bool) -> None:
    if not concerns_us(raw):
        logger.info("settings without a diffill section ignored")
        return
    reload, problems = ls.configure(raw)
    for problem in problems:
        ls.show(problem)
    if reload and reload_model:
        ls.start_loading()
    elif ls.host.ready:
        asyncio.ensure_future(ls.host.reconfigure(ls.settings))


@SERVER.feature(types.TEXT_DOCUMENT_DID_OPEN)
def did_open(ls: DiffillServer, params: types.DidOpenTextDocumentParams) -> None:
    ls.versions[unquote(params.text_document.uri)] = params.text_document.version
    ls.out_of_sync.discard(unquote(params.text_document.uri))
    ls.diagnostics.schedule(params.text_document.uri)


@SERVER.feature(types.TEXT_DOCUMENT_DID_CHANGE)
def did_change(ls: DiffillServer, params: types.DidChangeTextDocumentParams) -> None:
    whole = all(isinstance(c, types.TextDocumentContentChangeWholeDocument) for c in params.content_changes)
    ls.note_version(params.text_document.uri, params.text_document.version, whole)
    uri = params.text_document.uri
    spare = [PREFETCH] if ls.completer.is_accepted_state(uri) else []  # the ghost text's prefetch goes on
    if ls.completer.types_through(uri):  # keys typed at a running fill's cursor: it goes on
        spare.append(FILL)
    ls.scheduler.cancel_document(uri, CHANGED, spare=spare)
    ls.diagnostics.schedule(params.text_document.uri)


@SERVER.feature(types.TEXT_DOCUMENT_DID_CLOSE)
def did_close(ls: DiffillServer, params: types.DidCloseTextDocumentParams) -> None:
    ls.versions.pop(unquote(params.text_document.uri), None)
    ls.out_of_sync.discard(unquote(params.text_document.uri))
    ls.scheduler.cancel_document(params.text_document.uri, CLOSED)
    ls.diagnostics.clear(params.text_document.uri)


@SERVER.feature(types.TEXT_DOCUMENT_INLINE_COMPLETION, types.InlineCompletionOptions())
async def inline_completion(
    ls: DiffillServer, params: types.InlineCompletionParams
) -> types.InlineCompletionList | None:
    document = ls.snapshot(params.text_document.uri)
    method = types.TEXT_DOCUMENT_INLINE_COMPLETION
    asked = params.context is not None and params.context.trigger_kind == types.InlineCompletionTriggerKind.Invoked
    found = await ls.completer.suggest(document, params.position, method, asked) if document else None
    return inline_completion_list(found.texts, found.position) if found else None


@SERVER.feature(types.TEXT_DOCUMENT_COMPLETION, types.CompletionOptions(resolve_provider=False))
async def completion(ls: DiffillServer, params: types.CompletionParams) -> types.CompletionList | None:
    document = ls.snapshot(params.text_document.uri)
    found = await ls.completer.suggest(document, params.position, types.TEXT_DOCUMENT_COMPLETION) if document else None
    return completion_list(found.texts, found.word, found.word_range) if found else None


@SERVER.feature(
    types.TEXT_DOCUMENT_CODE_ACTION,
    types.CodeActionOptions(
        code_action_kinds=[types.CodeActionKind.QuickFix, types.CodeActionKind.RefactorRewrite], resolve_provider=True
    ),
)
async def code_action(ls: DiffillServer, params: types.CodeActionParams) -> list[types.CodeAction] | None:
    document = ls.snapshot(params.text_document.uri)
    actions = await ls.editor.actions(document, params) if document else []
    return actions or None


@SERVER.feature(types.CODE_ACTION_RESOLVE)
async def resolve_code_action(ls: DiffillServer, action: types.CodeAction) -> types.CodeAction:
    return await ls.editor.resolve(action)


@SERVER.command(COMMANDS[REWRITE])
async def rewrite(ls: DiffillServer, *arguments: Any) -> types.WorkspaceEdit | None:
    return await ls.editor.command(REWRITE, arguments)


@SERVER.command(COMMANDS[REFINE])
async def refine(ls: DiffillServer, *arguments: Any) -> types.WorkspaceEdit | None:
    return await ls.editor.command(REFINE, arguments)


@SERVER.command(COMMANDS[FILL_HERE])
async def fill_here(ls: DiffillServer, *arguments: Any) -> types.WorkspaceEdit | None:
    return await ls.editor.command(FILL_HERE, arguments)


@SERVER.feature(DEBUG_INFO)
def debug_info(ls: DiffillServer, params: Any) -> dict[str, Any]:
    return ls.debug_info()


@SERVER.feature(types.SHUTDOWN)
def shutdown(ls: DiffillServer, params: Any) -> None:
    ls.scheduler.cancel_all(SHUTDOWN)


# ---------------------------------------------------------------------------------------------- start-up


def serve(tcp: tuple[str, int] | None = None, model: ModelSpec | None = None, engine_mode: str | None = None) -> int:
    """Run the server until the client exits: over stdio, or on a TCP (host, port)."""
    spec = model or ModelSpec()
    defaults = Settings()
    SERVER.base_settings = replace(defaults, model=ModelSettings.of_spec(spec),
                                   engine=replace(defaults.engine, mode=engine_mode or defaults.engine.mode))
    SERVER.settings = SERVER.base_settings
    SERVER.host.engine_factory = spec.factory
    status.forward_logs(SERVER)
    if tcp is not None:
        host, port = tcp
        if not is_loopback(host):
            logger.warning("listening on %s: anyone who can reach this address can use the model", host)
        SERVER.over_tcp = True
        SERVER.start_tcp(host, port)
        return 0
    # Standard output carries the protocol: keep it for that, and send anything else written there to stderr.
    protocol_out = os.fdopen(os.dup(sys.stdout.fileno()), "wb")
    os.dup2(sys.stderr.fileno(), sys.stdout.fileno())
    sys.stdout = sys.stderr
    SERVER.start_io(sys.stdin.buffer, protocol_out)
    return 0
