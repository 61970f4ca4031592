"""What the server tells the editor about itself: `diffill/status` after each request, `$/progress` while loading.

`diffill/status` is a notification for status bars, sent after every request about an open document that could use
the model:

    {"method": "textDocument/inlineCompletion", "uri": ..., "outcome": "ok", "items": 2, "cache_hit": false,
     "ms": 41.2, "model_ms": 35.0, "forward_passes": 9, "tokens_per_forward": 2.3, "steps_done": 9,
     "model_started": true, "model": "diffill:model", "state": "ready"}

`outcome` is one of: ok (items > 0), empty (the model ran; nothing passed), cache (answered from the cache, no model
call), through (the rest of a suggestion of a fill that the keys since were typed through, see `completion`),
not_ready (the model is loading, failed or absent: `state` says which), superseded, cancelled, changed (the
document changed meanwhile; a result for an old version is never returned), disabled (setting or language), invalid
(a position or range outside the document), unreachable (the engine, a team server or the shared engine, stopped
answering; `state` is then "unreachable" too, `diffill/debugInfo`'s message says why, and the next request tries it
again).

Model loading is reported as work-done progress (begin "Loading model", end "Model ready" or the reason it failed)
when the client supports server-initiated progress; a Hugging Face model that is not cached yet is downloaded first,
with a report per percent ("Downloading owner/name: 1.20 of 14.20 GiB").
"""

from __future__ import annotations

import asyncio
import itertools
import logging
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

from lsprotocol import types

if TYPE_CHECKING:
    from lsp_server.server import DiffillServer

logger = logging.getLogger(__name__)

STATUS = "diffill/status"
_tokens = itertools.count(1)


@dataclass
class Report:
    """The status of one request, filled in as it goes and sent once."""

    method: str
    uri: str
    started: float = field(default_factory=time.perf_counter)
    outcome: str = "empty"
    items: int = 0
    cache_hit: bool = False
    stats: dict[str, Any] | None = None  # FillStats.as_dict() of the model call, when there was one
    steps_done: int = 0  # denoising steps run, also for fills that were stopped
    model_started: bool = False  # the model took the request up (encoded its context), also when it was then stopped

    def payload(self, model: str, state: str) -> dict[str, Any]:
        """The notification's parameters."""
        stats = self.stats or {}
        return {
            "method": self.method,
            "uri": self.uri,
            "outcome": self.outcome,
            "items": self.items,
            "cache_hit": self.cache_hit,
            "ms": round((time.perf_counter() - self.started) * 1000, 1),
            "model_ms": stats.get("ms", {}).get("total", 0.0),
            "forward_passes": stats.get("forward_passes", 0),
            "tokens_per_forward": stats.get("tokens_per_forward", 0.0),
            "steps_done": self.steps_done,
            "model_started": self.model_started,
            "model": model,
            "state": state,
        }


def send(ls: DiffillServer, report: Report) -> None:
    """Send a request's `diffill/status` notification."""
    payload = report.payload(ls.host.description, ls.host.state)
    logger.debug("status %s", payload)
    ls.protocol.notify(STATUS, payload)


async def load_with_progress(ls: DiffillServer) -> None:
    """Load the model from the current settings, reporting progress and telling the user when it fails."""
    token: str | None = None
    if ls.client_supports("window.work_done_progress"):
        token = f"diffill-load-{next(_tokens)}"
        try:
            await asyncio.wait_for(ls.work_done_progress.create_async(token), timeout=10)
        except Exception:  # noqa: BLE001 - a client that refuses the token just gets no progress
            logger.info("the client did not create a progress token; loading without progress")
            token = None
    if token is not None:
        ls.work_done_progress.begin(token, types.WorkDoneProgressBegin(title="diffill", message="Loading model"))
    await ls.host.load(ls.settings, _download_reporter(ls, token))
    if token is not None:
        message = "Model ready" if ls.host.ready else f"No model: {ls.host.message}"
        ls.work_done_progress.end(token, types.WorkDoneProgressEnd(message=message))
    if ls.host.ready:
        message = f"diffill: model {ls.host.description} ready"
        ls.window_log_message(types.LogMessageParams(types.MessageType.Info, message))
    else:
        ls.show(f"diffill: no suggestions until a model loads: {ls.host.message}", types.MessageType.Warning)


def _download_reporter(ls: DiffillServer, token: str | None) -> Any:
    """A callback for the model thread that reports a hub download as `$/progress` (None without a token)."""
    if token is None:
        return None
    loop = asyncio.get_running_loop()
    last = [-1]

    def report(what: str, done: float, total: float | None) -> None:
        percentage = int(100 * done / total) if total else None
        if percentage is not None and percentage == last[0]:
            return  # one report per percent
        last[0] = percentage if percentage is not None else last[0]
        message = f"{what}: {done / 2**30:.2f}" + (f" of {total / 2**30:.2f} GiB" if total else " GiB")
        params = types.WorkDoneProgressReport(message=message, percentage=percentage)
        loop.call_soon_threadsafe(ls.work_done_progress.report, token, params)

    return report


_MESSAGE_TYPES = {logging.ERROR: types.MessageType.Error, logging.WARNING: types.MessageType.Warning}


class _ClientLog(logging.Handler):
    """Sends log records to the client as `window/logMessage` (from any thread, through the event loop)."""

    def __init__(self, ls: DiffillServer) -> None:
        super().__init__(logging.INFO)
        self.ls = ls

    def emit(self, record: logging.LogRecord) -> None:
        loop = self.ls.loop
        if loop is None or loop.is_closed() or self.ls.protocol.writer is None:
            return
        kind = _MESSAGE_TYPES.get(record.levelno, types.MessageType.Info)
        params = types.LogMessageParams(type=kind, message=f"{record.name}: {self.format(record)}")
        try:
            loop.call_soon_threadsafe(self.ls.window_log_message, params)
        except RuntimeError:  # the loop closed meanwhile
            pass


def forward_logs(ls: DiffillServer) -> None:
    """Send the log of diffill's own packages to the client's log as well (standard error keeps everything)."""
    handler = _ClientLog(ls)
    for name in ("lsp_server", "infill_engine"):
        logging.getLogger(name).addHandler(handler)
