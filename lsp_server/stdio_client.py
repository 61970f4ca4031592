"""A minimal LSP client of a language server process over its standard input/output, for the typing replays.

The replays (`diffill bench lsp`, `diffill bench load`) need what an editor does, timed to the millisecond: send a
change and a request without waiting, cancel the superseded request with `$/cancelRequest`, and note when each
answer arrives. Layers, each wrapping one thing: the process's pipes, Content-Length framing, and the JSON-RPC
session (request id -> future; notifications to a callback; requests from the server answered with null, since the
replays offer no client features such as progress or configuration).
"""

from __future__ import annotations

import asyncio
import contextlib
import itertools
import json
import logging
import os
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

logger = logging.getLogger(__name__)

REQUEST_CANCELLED = -32800  # the JSON-RPC error code of a request the client cancelled (LSP)
EXIT_WAIT = 10.0  # seconds a server may take to exit after `exit` before it is killed

Notification = Callable[[str, Any, float], None]  # (method, params, arrival time) -> None


@dataclass
class Pending:
    """A request sent and (later) its answer."""

    id: int
    method: str
    sent: float  # time.perf_counter() when written
    future: asyncio.Future[dict[str, Any]] = field(repr=False)
    answered: float | None = None  # when the response arrived
    cancel_sent: bool = False

    @property
    def done(self) -> bool:
        """Whether the response arrived."""
        return self.answered is not None


class StdioClient:
    """A language server process and the JSON-RPC session with it."""

    def __init__(self, process: asyncio.subprocess.Process, on_notification: Notification | None = None) -> None:
        self.process = process
        self.on_notification = on_notification
        self._ids = itertools.count(1)
        self._pending: dict[int, Pending] = {}
        self._reader = asyncio.ensure_future(self._read())
        self.closed = False  # the server closed its output

    @classmethod
    async def spawn(cls, command: Sequence[str], env: Mapping[str, str] | None = None, log: Path | None = None,
                    on_notification: Notification | None = None) -> StdioClient:
        """Start the server process (its standard error to `log`, else discarded)."""
        stderr = open(log, "ab") if log is not None else asyncio.subprocess.DEVNULL  # noqa: SIM115 - the child owns it
        try:
            process = await asyncio.create_subprocess_exec(
                *command, stdin=asyncio.subprocess.PIPE, stdout=asyncio.subprocess.PIPE, stderr=stderr,
                env=dict(env) if env is not None else None)
        finally:
            if log is not None:
                stderr.close()  # type: ignore[union-attr]
        return cls(process, on_notification)

    @property
    def pid(self) -> int:
        """The server's process id."""
        return self.process.pid

    # ------------------------------------------------------------------------------------------ sending

    def _write(self, message: dict[str, Any]) -> None:
        body = json.dumps({"jsonrpc": "2.0", **message}).encode("utf-8")
        assert self.process.stdin is not None
        self.process.stdin.write(b"Content-Length: %d\r\n\r\n" % len(body) + body)

    def notify(self, method: str, params: Any) -> None:
        """Send a notification."""
        self._write({"method": method, "params": params})

    def request(self, method: str, params: Any) -> Pending:
        """Send a request; its `future` holds the response message."""
        number = next(self._ids)
        pending = Pending(number, method, time.perf_counter(), asyncio.get_running_loop().create_future())
        self._pending[number] = pending
        self._write({"id": number, "method": method, "params": params})
        return pending

    def cancel(self, pending: Pending) -> None:
        """`$/cancelRequest` for a request still waiting for its answer."""
        if not pending.done and not pending.cancel_sent:
            pending.cancel_sent = True
            self.notify("$/cancelRequest", {"id": pending.id})

    async def call(self, method: str, params: Any, timeout: float) -> Any:
        """Send a request and wait for its result; RuntimeError for an error answer."""
        answer = await asyncio.wait_for(self.request(method, params).future, timeout)
        if "error" in answer:
            raise RuntimeError(f"{method} failed: {answer['error']}")
        return answer.get("result")

    async def drain(self) -> None:
        """Wait until what was written has reached the pipe."""
        assert self.process.stdin is not None
        await self.process.stdin.drain()

    # ------------------------------------------------------------------------------------------ receiving

    async def _read(self) -> None:
        stream = self.process.stdout
        assert stream is not None
        try:
            while True:
                length = None
                while (line := await stream.readline()) not in (b"\r\n", b"\n"):
                    if not line:
                        return
                    name, _, value = line.decode("ascii", "replace").partition(":")
                    if name.strip().lower() == "content-length":
                        length = int(value.strip())
                if length is None:
                    logger.warning("a message without Content-Length from the server")
                    continue
                self._dispatch(json.loads(await stream.readexactly(length)), time.perf_counter())
        except (asyncio.IncompleteReadError, ConnectionError):
            return
        finally:
            self.closed = True
            for pending in self._pending.values():
                if not pending.future.done():
                    pending.future.set_exception(ConnectionError("the server closed its output"))

    def _dispatch(self, message: dict[str, Any], now: float) -> None:
        if "method" in message and "id" in message:  # a request from the server: progress, configuration, ...
            self._write({"id": message["id"], "result": None})
        elif "method" in message:
            if self.on_notification is not None:
                self.on_notification(message["method"], message.get("params"), now)
        elif (pending := self._pending.pop(message.get("id"), None)) is not None:  # type: ignore[arg-type]
            pending.answered = now
            if not pending.future.done():
                pending.future.set_result(message)

    # ------------------------------------------------------------------------------------------ life cycle

    async def initialize(self, options: Any, capabilities: dict[str, Any], timeout: float) -> Any:
        """`initialize` with these initializationOptions and capabilities, then `initialized`."""
        result = await self.call("initialize", {
            "processId": os.getpid(), "rootUri": None, "capabilities": capabilities,
            "initializationOptions": options}, timeout)
        self.notify("initialized", {})
        return result

    async def close(self) -> None:
        """`shutdown` and `exit`, then wait for the process (killed when it does not exit in time)."""
        with contextlib.suppress(Exception):
            if not self.closed:
                await self.call("shutdown", None, EXIT_WAIT)
                self.notify("exit", None)
                await self.drain()
        try:
            await asyncio.wait_for(self.process.wait(), EXIT_WAIT)
        except asyncio.TimeoutError:
            self.process.kill()
            await self.process.wait()
        self._reader.cancel()
        with contextlib.suppress(asyncio.CancelledError):
            await self._reader
