"""The RPC session: msgpack-rpc messages over a framed stream, with request ids mapped to futures.

    request       [0, id, method, params]
    response      [1, id, error, result]     error: None or {"type": ..., "message": ...}
    notification  [2, method, params]

A notification named "progress" whose params carry an "id" goes to the progress callback of that pending request
(a fill's denoising steps). A frame that cannot be read, or a message of the wrong shape, gets an error response
(id None, type "ProtocolError") and the connection is closed; the reader thread never dies of bad input.
"""

from __future__ import annotations

import itertools
import logging
import threading
from collections.abc import Callable
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

from infill_engine.service.framing import FrameError, FramedStream
from infill_engine.service.stream import StreamClosed

logger = logging.getLogger(__name__)

REQUEST, RESPONSE, NOTIFICATION = 0, 1, 2
PROTOCOL_ERROR = "ProtocolError"

RequestHandler = Callable[["Session", int, str, Any], None]  # must answer with session.reply(id, ...) sometime
NotificationHandler = Callable[["Session", str, Any], None]


class RemoteError(Exception):
    """The peer answered a request with an error."""

    def __init__(self, kind: str, message: str) -> None:
        super().__init__(f"{kind}: {message}")
        self.kind = kind
        self.message = message


class ConnectionLost(ConnectionError):
    """The connection closed before the answer came."""


@dataclass
class Call:
    """A request in flight."""

    id: int
    future: Future[Any]


def error(kind: str, message: str) -> dict[str, str]:
    """An error object for a response."""
    return {"type": kind, "message": message}


class Session:
    """One connection's RPC: send requests and notifications, receive them on a reader thread."""

    def __init__(
        self,
        framed: FramedStream,
        on_request: RequestHandler | None = None,
        on_notification: NotificationHandler | None = None,
        name: str = "session",
    ) -> None:
        self.framed = framed
        self.name = name
        self._on_request = on_request
        self._on_notification = on_notification
        self._ids = itertools.count(1)
        self._pending: dict[int, tuple[Future[Any], Callable[[Any], None] | None]] = {}
        self._lock = threading.Lock()
        self._on_close: list[Callable[[Session], None]] = []
        self.closed = threading.Event()
        self.close_reason = ""
        self._reader = threading.Thread(target=self._read_loop, name=f"{name}-reader", daemon=True)

    def start(self) -> Session:
        """Start reading; returns self."""
        self._reader.start()
        return self

    def on_close(self, callback: Callable[[Session], None]) -> None:
        """Call `callback(session)` once, when the connection is gone."""
        self._on_close.append(callback)

    # ------------------------------------------------------------------------------------------------ sending
    def request(self, method: str, params: Any, on_progress: Callable[[Any], None] | None = None) -> Call:
        """Send a request; the call's future gets the result, RemoteError, or ConnectionLost."""
        future: Future[Any] = Future()
        with self._lock:
            if self.closed.is_set():
                future.set_exception(ConnectionLost(self.close_reason or "the connection is closed"))
                return Call(0, future)
            call_id = next(self._ids)
            self._pending[call_id] = (future, on_progress)
        try:
            self.framed.write([REQUEST, call_id, method, params])
        except (OSError, FrameError) as failure:
            with self._lock:
                pending = self._pending.pop(call_id, None) is not None
            if pending:  # else the reader's `close` took the call and failed it with ConnectionLost already
                future.set_exception(failure if isinstance(failure, FrameError) else ConnectionLost(str(failure)))
        return Call(call_id, future)

    def notify(self, method: str, params: Any) -> bool:
        """Send a notification; False when the connection is gone."""
        return self._send([NOTIFICATION, method, params])

    def reply(self, call_id: int | None, result: Any = None, failure: dict[str, str] | None = None) -> bool:
        """Answer a request; False when the connection is gone."""
        return self._send([RESPONSE, call_id, failure, None if failure else result])

    def _send(self, message: list[Any]) -> bool:
        if self.closed.is_set():
            return False
        try:
            self.framed.write(message)
            return True
        except FrameError as failure:  # our own answer is too large: say so instead
            if message[0] == RESPONSE:
                return self._send([RESPONSE, message[1], error("TooLarge", str(failure)), None])
            return False
        except OSError:
            return False

    def close(self, reason: str = "closed") -> None:
        """Close the connection; pending calls fail with ConnectionLost."""
        with self._lock:
            if self.closed.is_set():
                return
            self.close_reason = reason
            self.closed.set()
            pending, self._pending = self._pending, {}
        self.framed.stream.close()
        for future, _ in pending.values():
            if not future.done():
                future.set_exception(ConnectionLost(reason))
        for callback in self._on_close:
            try:
                callback(self)
            except Exception:  # noqa: BLE001 - a callback's bug must not stop the others
                logger.exception("%s: on_close callback failed", self.name)

    # ------------------------------------------------------------------------------------------------ receiving
    def _read_loop(self) -> None:
        reason = "the peer closed the connection"
        try:
            while not self.closed.is_set():
                try:
                    message = self.framed.read()
                except FrameError as failure:
                    reason = str(failure)
                    self.reply(None, failure=error(PROTOCOL_ERROR, reason))
                    break
                problem = self._dispatch(message)
                if problem:
                    reason = problem
                    self.reply(None, failure=error(PROTOCOL_ERROR, problem))
                    break
        except StreamClosed:
            pass
        except OSError as failure:
            reason = f"the connection failed: {failure}"
        except Exception:  # noqa: BLE001 - a bug in a handler: close this connection, keep the process
            logger.exception("%s: the reader failed", self.name)
            reason = "internal error"
        finally:
            self.close(reason)

    def _dispatch(self, message: Any) -> str | None:
        """Hand a message to its handler; a description of what is wrong with it, or None."""
        if not isinstance(message, list) or not message or message[0] not in (REQUEST, RESPONSE, NOTIFICATION):
            return "a message must be an array [type, ...] with type 0, 1 or 2"
        kind = message[0]
        if kind == REQUEST:
            if len(message) != 4 or not isinstance(message[1], int) or not isinstance(message[2], str):
                return "a request must be [0, id (integer), method (string), params]"
            if self._on_request is None:
                self.reply(message[1], failure=error("NoSuchMethod", "this side takes no requests"))
            else:
                self._on_request(self, message[1], message[2], message[3])
        elif kind == RESPONSE:
            if len(message) != 4:
                return "a response must be [1, id, error, result]"
            with self._lock:
                entry = self._pending.pop(message[1], None) if isinstance(message[1], int) else None
            if entry is not None:
                failure = message[2]
                if failure is None:
                    entry[0].set_result(message[3])
                else:
                    kind_, text = _error_parts(failure)
                    entry[0].set_exception(RemoteError(kind_, text))
            elif message[2] is not None:  # an error about the connection itself (id None)
                kind_, text = _error_parts(message[2])
                logger.warning("%s: the peer reported %s: %s", self.name, kind_, text)
        else:
            if len(message) != 3 or not isinstance(message[1], str):
                return "a notification must be [2, method (string), params]"
            method, params = message[1], message[2]
            if method == "progress" and isinstance(params, dict) and isinstance(params.get("id"), int):
                with self._lock:
                    entry = self._pending.get(params["id"])
                if entry is not None and entry[1] is not None:
                    entry[1](params)
            elif self._on_notification is not None:
                self._on_notification(self, method, params)
        return None


def _error_parts(failure: Any) -> tuple[str, str]:
    if isinstance(failure, dict):
        return str(failure.get("type", "Error")), str(failure.get("message", ""))
    return "Error", str(failure)
