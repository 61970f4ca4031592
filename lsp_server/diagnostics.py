"""Syntax diagnostics: tree-sitter ERROR and MISSING nodes and unbalanced brackets, published per document.

Publishing is debounced: each change of a document restarts its timer, and the document is checked only once the
user has paused for `diagnostics.debounceMs`. The check runs on a thread of its own (a 5 MB file takes a second or
more to parse the first time; a later version of a large document is parsed incrementally from the one before, a
few hundred ms), never on the event loop and never behind a model job; a result for a version that has since
changed is dropped. Only languages with a tree-sitter grammar get diagnostics: elsewhere the lexical bracket check alone would
flag text that is not code (a list item "1)" in Markdown).
"""

from __future__ import annotations

import asyncio
import logging
from typing import TYPE_CHECKING

from lsprotocol import types

from infill_engine import syntax
from lsp_server import conversion
from lsp_server.context import Snapshot
from lsp_server.worker import DaemonThreadExecutor

if TYPE_CHECKING:
    from lsp_server.server import DiffillServer

logger = logging.getLogger(__name__)

MAX_DIAGNOSTICS = 100  # per document; a broken 5 MB file would otherwise flood the editor


class DiagnosticsPublisher:
    """Debounced syntax diagnostics for every open document."""

    def __init__(self, ls: DiffillServer) -> None:
        self.ls = ls
        self._timers: dict[str, asyncio.Task[None]] = {}
        self._thread = DaemonThreadExecutor("diffill-syntax")

    def schedule(self, uri: str) -> None:
        """Check the document after the debounce delay, replacing a pending check."""
        pending = self._timers.pop(uri, None)
        if pending is not None:
            pending.cancel()
        if self.ls.settings.diagnostics.enabled:
            self._timers[uri] = asyncio.ensure_future(self._check(uri))

    def clear(self, uri: str) -> None:
        """Withdraw a closed document's diagnostics."""
        pending = self._timers.pop(uri, None)
        if pending is not None:
            pending.cancel()
        self.ls.text_document_publish_diagnostics(types.PublishDiagnosticsParams(uri=uri, diagnostics=[]))

    async def _check(self, uri: str) -> None:
        await asyncio.sleep(self.ls.settings.diagnostics.debounce_ms / 1000)
        document = self.ls.snapshot(uri)
        if document is None:
            return
        diagnostics = await asyncio.get_running_loop().run_in_executor(self._thread, self._diagnose, document)
        if diagnostics is None or self.ls.document_version(uri) != document.version:
            return
        params = types.PublishDiagnosticsParams(uri=uri, diagnostics=diagnostics, version=document.version)
        self.ls.text_document_publish_diagnostics(params)

    def _diagnose(self, document: Snapshot) -> list[types.Diagnostic] | None:
        """On the syntax thread: the document's diagnostics, or None when it is not checked."""
        language = document.language
        enabled = self.ls.settings.enabled_for(document.language_id)
        if language is None or not enabled or language not in syntax.SUPPORTED_LANGUAGES:
            return []
        problems = syntax.find_problems(document.text, language)[:MAX_DIAGNOSTICS]
        return [conversion.diagnostic(problem, document.text, self.ls.encoding) for problem in problems]
