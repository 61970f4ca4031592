"""The `Engine` of a team server: the language server's `engine.mode: "remote"`.

    engine = HttpEngine("http://gpu-box:8012", key="...")     # OpenError when nothing answers or the key is refused
    result = engine.fill(InfillRequest(prefix, suffix), on_step=ticket.on_step, document=uri)

Fills and refines are streamed (`"stream": true`): the server sends a line per denoising step, which is handed to
`on_step`; when it returns False (a newer request superseded this one, the document changed, the editor cancelled),
or when the ticket behind it is cancelled while the request still waits in the server's queue, the connection is
closed, the server stops the fill at its next step, and `fill` raises FillCancelled, as the in-process engine does.
Only the standard library is used, so the editor side needs no HTTP package. Errors: ValueError for a request the
server refuses as invalid, EngineUnavailable when it cannot be reached or goes away, EngineError for the rest.
"""

from __future__ import annotations

import http.client
import json
import logging
import os
import queue
import socket
import threading
import time
from typing import Any
from pathlib import Path
from urllib.parse import urlsplit

from infill_engine.interface import DEFAULT_GROW, DEFAULT_KEEP_ABOVE, EngineOptions, ModelInfo, OpenError, StepCallback
from infill_engine.request import FillCancelled, InfillRequest, InfillResult
from infill_engine.service import wire
from infill_engine.service.api import EngineError, EngineUnavailable, HandshakeError, RemoteStep

logger = logging.getLogger(__name__)

CONNECT_TIMEOUT = 5.0  # seconds to connect and for a short request
FILL_TIMEOUT = 300.0  # seconds a fill may take, queueing included
POLL_SECONDS = 0.05  # how often a waiting fill checks whether it is still wanted
KEY_ENV = "DIFFILL_API_KEY"  # the key when neither a setting nor a file gives one (the server reads it too)


def read_api_key(key: str | None, key_file: str | None) -> str | None:
    """The API key: `key`, else the first line of `key_file`, else $DIFFILL_API_KEY; OpenError for a bad file."""
    if key:
        return key.strip()
    if key_file:
        path = Path(key_file).expanduser()
        try:
            lines = path.read_text().splitlines()
        except OSError as error:
            raise OpenError(f"cannot read the API key file {path}: {error.strerror or error}") from None
        if not lines or not lines[0].strip():
            raise OpenError(f"the API key file {path} is empty")
        return lines[0].strip()
    return os.environ.get(KEY_ENV, "").strip() or None


class HttpEngine:
    """A team server (`diffill http`) as an `Engine`."""

    def __init__(self, url: str, key: str | None = None, *, connect_timeout: float = CONNECT_TIMEOUT,
                 fill_timeout: float = FILL_TIMEOUT) -> None:
        parts = urlsplit(url)
        if parts.scheme not in ("http", "https") or not parts.hostname:
            raise OpenError(f"engine.url must be an http:// or https:// address such as http://gpu-box:8012 "
                            f"(got {url!r})")
        self.url = url.rstrip("/")
        self._scheme, self._host, self._port = parts.scheme, parts.hostname, parts.port
        self._base = parts.path.rstrip("/")
        self._key = key or None
        self.connect_timeout, self.fill_timeout = connect_timeout, fill_timeout
        self._options = EngineOptions()
        try:
            self.model = self._get("/v1/model")
        except HandshakeError as error:
            raise OpenError(str(error)) from None
        except EngineError as error:
            raise OpenError(f"no diffill server answers at {self.url}: {error}") from None

    # ---------------------------------------------------------------------------------------------- Engine
    def describe(self) -> ModelInfo:
        """The model the server serves; its device names the server."""
        return ModelInfo(family=str(self.model.get("family", "?")), path=str(self.model.get("path", "?")),
                         device=f"{self.model.get('device', '?')} (team server {self.url})",
                         dtype=str(self.model.get("dtype", "")))

    def configure(self, options: EngineOptions) -> None:
        """Sampling and context settings, sent with every request."""
        self._options = options

    def fill(self, request: InfillRequest, on_step: StepCallback | None = None, *,
             document: str | None = None) -> InfillResult:
        """`Engine.fill` on the server."""
        return self._denoise("/v1/fill", wire.request_to_wire(request), on_step, document)

    def refine(self, request: InfillRequest, original: str, renoise: list[tuple[int, int]] | None = None,
               keep_above: float | None = DEFAULT_KEEP_ABOVE, grow: int = DEFAULT_GROW,
               on_step: StepCallback | None = None, *, document: str | None = None) -> InfillResult:
        """`Engine.refine` on the server."""
        body = {**wire.request_to_wire(request), "original": original, "renoise": [list(r) for r in renoise or []],
                "keep_above": keep_above, "grow": grow}
        return self._denoise("/v1/refine", body, on_step, document)

    def count_tokens(self, text: str) -> int:
        """How many of the model's tokens `text` is."""
        return int(self._post("/v1/count_tokens", {"text": text})["tokens"])

    def status(self) -> dict[str, Any]:
        """The server's counters."""
        return self._get("/v1/status")

    def close(self) -> None:
        """Nothing is held between requests."""

    # -------------------------------------------------------------------------------------------- plumbing
    def _connection(self, timeout: float) -> http.client.HTTPConnection:
        kind = http.client.HTTPSConnection if self._scheme == "https" else http.client.HTTPConnection
        return kind(self._host, self._port, timeout=timeout)

    def _headers(self) -> dict[str, str]:
        headers = {"Content-Type": "application/json", "Accept": "application/json"}
        if self._key:
            headers["Authorization"] = f"Bearer {self._key}"
        return headers

    def _get(self, path: str) -> dict[str, Any]:
        return self._exchange("GET", path, None)

    def _post(self, path: str, body: dict[str, Any]) -> dict[str, Any]:
        return self._exchange("POST", path, body)

    def _exchange(self, method: str, path: str, body: dict[str, Any] | None) -> dict[str, Any]:
        connection = self._connection(self.connect_timeout)
        try:
            connection.request(method, self._base + path, None if body is None else json.dumps(body).encode(),
                               self._headers())
            response = connection.getresponse()
            data = response.read()
        except (OSError, http.client.HTTPException) as error:
            raise EngineUnavailable(f"{self.url} does not answer ({_reason(error)})") from None
        finally:
            connection.close()
        return self._decoded(response.status, data)

    def _decoded(self, status: int, data: bytes) -> dict[str, Any]:
        try:
            answer = json.loads(data or b"null")
        except ValueError:
            raise EngineError(f"{self.url} answered {status} with something other than JSON") from None
        if status == 200 and isinstance(answer, dict):
            return answer
        raise self._failure(status, answer)

    def _failure(self, status: int, answer: Any) -> BaseException:
        message = answer.get("error", {}).get("message", "") if isinstance(answer, dict) else ""
        if status == 401:
            return HandshakeError(f"the server at {self.url} refused the API key: set `engine.key`, "
                                  "`engine.keyFile` or $DIFFILL_API_KEY to its key")
        if status == 409:  # superseded at the server (a shared engine behind it) by a newer request of the document
            return FillCancelled()
        if status in (400, 413):
            return ValueError(message or f"the server refused the request ({status})")
        if status == 404:
            return EngineError(f"{self.url} is not a diffill server (no {message or 'such endpoint'})")
        return EngineError(f"the server at {self.url} answered {status}: {message}")

    def _denoise(self, path: str, body: dict[str, Any], on_step: StepCallback | None,
                 document: str | None) -> InfillResult:
        """A streamed fill or refine; stops (and closes the connection) once the caller no longer wants it."""
        body = {**body, "document": document, "options": self._options.as_dict(), "stream": True}
        lines: queue.SimpleQueue[Any] = queue.SimpleQueue()
        connection = self._connection(self.connect_timeout)
        try:  # connected here, so that hanging up below always reaches the socket the reader uses
            connection.connect()
        except OSError as error:
            raise EngineUnavailable(f"{self.url} does not answer ({_reason(error)})") from None
        reader = threading.Thread(target=self._read_stream, args=(connection, path, body, lines),
                                  name="diffill-http-client", daemon=True)
        reader.start()
        ticket = getattr(on_step, "__self__", None)  # a bound method of a ticket: also stop once it is cancelled
        deadline = time.monotonic() + self.fill_timeout
        try:
            while True:
                if getattr(ticket, "cancelled", False):
                    raise FillCancelled()
                if time.monotonic() > deadline:
                    raise EngineUnavailable(f"{self.url} did not finish in {self.fill_timeout:g} s")
                try:
                    kind, value = lines.get(timeout=POLL_SECONDS)
                except queue.Empty:
                    continue
                if kind == "step":
                    if on_step is not None and on_step(RemoteStep(value["block"], value["step"])) is False:
                        raise FillCancelled()
                elif kind == "result":
                    return wire.result_from_wire(value)
                else:
                    raise value
        finally:
            _hang_up(connection)

    def _read_stream(self, connection: http.client.HTTPConnection, path: str, body: dict[str, Any],
                     lines: queue.SimpleQueue[Any]) -> None:
        """On a helper thread: send the request and queue ("step", ...), then ("result", ...) or ("error", ...)."""
        try:
            connection.request("POST", self._base + path, json.dumps(body).encode(), self._headers())
            connection.sock.settimeout(self.fill_timeout)
            response = connection.getresponse()
            if response.status != 200:
                lines.put(("error", self._failure(response.status, _json(response.read()))))
                return
            for raw in response:
                line = _json(raw)
                if not isinstance(line, dict):
                    continue
                if "error" in line:
                    code = line["error"].get("code", 500) if isinstance(line["error"], dict) else 500
                    lines.put(("error", self._failure(int(code), line)))
                    return
                if "result" in line:
                    lines.put(("result", line["result"]))
                    return
                lines.put(("step", {"block": int(line.get("block", 0)), "step": int(line.get("step", 0))}))
            lines.put(("error", EngineUnavailable(f"{self.url} closed the connection before the result")))
        except (OSError, http.client.HTTPException, ValueError) as error:
            lines.put(("error", EngineUnavailable(f"{self.url} does not answer ({_reason(error)})")))


def _json(data: bytes) -> Any:
    try:
        return json.loads(data or b"null")
    except ValueError:
        return None


def _reason(error: Exception) -> str:
    if isinstance(error, OSError) and error.strerror:
        return error.strerror
    return str(error) or type(error).__name__


def _hang_up(connection: http.client.HTTPConnection) -> None:
    """Close the connection now, also while the reader thread waits on it (the server then stops the fill)."""
    sock = connection.sock
    if sock is not None:
        try:
            sock.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
    connection.close()
