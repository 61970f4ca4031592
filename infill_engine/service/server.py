"""`diffill engine serve`: load the model once and serve fills to many clients over a local socket.

Connections are read on their own threads (`Session`); the model runs on the main thread, taking jobs from a
`FairQueue`. The first message of a connection must be `hello` with the protocol version (and the token when
listening on TCP); anything else, a wrong version or a wrong token gets an error answer and the connection is closed.
Requests: fill, refine (queued for the model), tokenize, status, shutdown (answered at once); notification: cancel.
A malformed or oversized frame closes only the connection that sent it. With no client connected and nothing to do
for `idle_timeout` seconds the engine exits.
"""

from __future__ import annotations

import fcntl
import hmac
import itertools
import logging
import os
import signal
import socket
import threading
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from infill_engine.interface import DEFAULT_GROW, DEFAULT_KEEP_ABOVE, MAX_GROW
from infill_engine.request import FillCancelled
from infill_engine.service import wire
from infill_engine.service.api import PROTOCOL_VERSION
from infill_engine.service.framing import DEFAULT_MAX_FRAME, FramedStream
from infill_engine.service.scheduling import FairQueue, Job, QueueFull
from infill_engine.service.session import Session, error
from infill_engine.service.stream import ByteStream

logger = logging.getLogger(__name__)

QUEUED_METHODS = ("fill", "refine")


@dataclass(frozen=True)
class ServiceLimits:
    """What one client may ask of the engine."""

    max_frame_bytes: int = DEFAULT_MAX_FRAME  # bytes in one msgpack frame, either way
    max_tokens: int = 1024  # span positions of one fill (max_tokens) or refine (text tokens + grow)
    max_queued: int = 8  # requests a client may have waiting for the model


@dataclass
class Client:
    """One connection."""

    number: int
    session: Session
    needs_token: bool = False  # it came in over TCP
    greeted: bool = False


class EngineService:
    """Serves one loaded engine to every client that connects."""

    def __init__(self, engine: Any, model: dict[str, Any], limits: ServiceLimits | None = None,
                 idle_timeout: float = 600.0, token: str | None = None) -> None:
        self.engine = engine
        self.model = model  # identity sent in the handshake: key, path, family, device
        self.limits = limits or ServiceLimits()
        self.idle_timeout = idle_timeout
        self.token = token  # required from TCP clients (a TCP client is refused when there is none)
        self.queue = FairQueue(self.limits.max_queued)
        self.clients: dict[int, Client] = {}
        self.clients_total = 0
        self.served = 0
        self.steps = 0  # denoising steps run, for all requests
        self.loads = 1
        self.started = time.monotonic()
        self.address = ""
        self._numbers = itertools.count(1)
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._last_active = time.monotonic()

    # ------------------------------------------------------------------------------------------- connections
    def accept_forever(self, listener: socket.socket) -> None:
        """Accept connections until stopped (run on its own thread); TCP clients must present the token."""
        needs_token = listener.family != socket.AF_UNIX
        while not self._stop.is_set():
            try:
                sock, _ = listener.accept()
            except OSError:
                if self._stop.is_set():
                    return
                continue
            number = next(self._numbers)
            session = Session(FramedStream(ByteStream(sock), self.limits.max_frame_bytes),
                              on_request=self._on_request, on_notification=self._on_notification,
                              name=f"client-{number}")
            client = Client(number, session, needs_token)
            session.client = client  # type: ignore[attr-defined]
            with self._lock:
                self.clients[number] = client
                self._last_active = time.monotonic()
            session.on_close(self._closed)
            session.start()

    def _closed(self, session: Session) -> None:
        client: Client = session.client  # type: ignore[attr-defined]
        with self._lock:
            self.clients.pop(client.number, None)
            self._last_active = time.monotonic()
        self.queue.drop_client(client.number)
        logger.info("client %d left (%s)", client.number, session.close_reason)

    def _on_request(self, session: Session, call_id: int, method: str, params: Any) -> None:
        client: Client = session.client  # type: ignore[attr-defined]
        if not client.greeted:
            self._handshake(client, call_id, method, params)
            return
        if not isinstance(params, dict):
            session.reply(call_id, failure=error("ValueError", "params must be a map"))
            return
        if method in QUEUED_METHODS:
            self._enqueue(client, call_id, method, params)
        elif method == "tokenize":
            self._answer(session, call_id, self._tokenize, params)
        elif method == "status":
            session.reply(call_id, self.status(asking=client.number))
        elif method == "shutdown":
            session.reply(call_id, {"stopping": True})
            self.stop("asked to shut down")
        else:
            session.reply(call_id, failure=error("NoSuchMethod", f"unknown method {method!r}"))

    def _on_notification(self, session: Session, method: str, params: Any) -> None:
        client: Client = session.client  # type: ignore[attr-defined]
        if method == "cancel" and client.greeted and isinstance(params, dict) and isinstance(params.get("id"), int):
            job = self.queue.cancel(client.number, params["id"])
            if job is not None:
                session.reply(job.call_id, failure=error("Cancelled", "cancelled before it started"))

    def _handshake(self, client: Client, call_id: int, method: str, params: Any) -> None:
        session = client.session
        problem = None
        if method != "hello" or not isinstance(params, dict):
            problem = error("HandshakeRequired", "the first request must be hello {protocol, token}")
        elif params.get("protocol") != PROTOCOL_VERSION:
            problem = error("ProtocolMismatch", f"this engine speaks protocol {PROTOCOL_VERSION}; the client speaks "
                            f"{params.get('protocol')!r}: update diffill so that both are the same version")
        elif client.needs_token and not (self.token and hmac.compare_digest(str(params.get("token") or ""),
                                                                            self.token)):
            problem = error("Unauthorized", "wrong or missing token")
        if problem is not None:
            session.reply(call_id, failure=problem)
            session.close(problem["message"])
            return
        client.greeted = True
        with self._lock:
            self.clients_total += 1
        logger.info("client %d connected (%s)", client.number, params.get("client"))
        session.reply(call_id, {"protocol": PROTOCOL_VERSION, "model": self.model, "pid": os.getpid(),
                                "limits": {"max_frame_bytes": self.limits.max_frame_bytes,
                                           "max_tokens": self.limits.max_tokens,
                                           "max_queued": self.limits.max_queued}})

    def _enqueue(self, client: Client, call_id: int, method: str, params: dict[str, Any]) -> None:
        session = client.session
        document = params.get("document")
        job = Job(client.number, call_id, method, params, document if isinstance(document, str) else None)
        try:
            superseded = self.queue.put(job)
        except QueueFull as full:
            session.reply(call_id, failure=error("QueueFull", str(full)))
            return
        for old in superseded:
            session.reply(old.call_id, failure=error("Cancelled", "superseded by a newer request of the document"))

    def _answer(self, session: Session, call_id: int, function: Any, params: dict[str, Any]) -> None:
        try:
            session.reply(call_id, function(params))
        except (ValueError, TypeError) as failure:
            session.reply(call_id, failure=error("ValueError", str(failure)))

    def status(self, asking: int | None = None) -> dict[str, Any]:
        """What `diffill engine status` shows; `clients` counts the connected clients other than the one asking."""
        with self._lock:
            connected = sum(1 for c in self.clients.values() if c.greeted and c.number != asking)
        running = self.queue.running()
        return {
            "pid": os.getpid(), "protocol": PROTOCOL_VERSION, "model": self.model, "address": self.address,
            "loads": self.loads, "clients": connected, "clients_total": self.clients_total,
            "queued": self.queue.queued(), "running": running.method if running else None, "served": self.served,
            "steps": self.steps, "uptime_s": round(time.monotonic() - self.started, 1), "idle_timeout_s": self.idle_timeout,
        }

    # ------------------------------------------------------------------------------------------- the model
    def run(self) -> None:
        """Run jobs on this thread until stopped or idle for `idle_timeout` s."""
        while not self._stop.is_set():
            job = self.queue.take(timeout=0.2)
            if job is None:
                with self._lock:
                    idle = not self.clients and time.monotonic() - self._last_active > self.idle_timeout
                if idle:
                    logger.info("no clients for %g s: exiting", self.idle_timeout)
                    self.stop("idle")
                continue
            try:
                self._run_job(job)
            finally:
                self.queue.done(job)
                with self._lock:
                    self._last_active = time.monotonic()

    def _run_job(self, job: Job) -> None:
        client = self.clients.get(job.client)
        if client is None:
            return
        session = client.session
        if job.cancelled.is_set():
            session.reply(job.call_id, failure=error("Cancelled", "cancelled before it started"))
            return

        def on_step(view: Any) -> bool:
            self.steps += 1
            session.notify("progress", {"id": job.call_id, "block": view.block, "step": view.step})
            return not job.cancelled.is_set()

        try:
            result = self._compute(job, on_step)
        except FillCancelled:
            session.reply(job.call_id, failure=error("Cancelled", "cancelled"))
            return
        except (ValueError, TypeError) as failure:
            session.reply(job.call_id, failure=error("ValueError", str(failure)))
            return
        except Exception as failure:  # noqa: BLE001 - a bug: tell the client, keep serving the others
            logger.exception("request %s of client %d failed", job.method, job.client)
            session.reply(job.call_id, failure=error("Internal", f"{type(failure).__name__}: {failure}"))
            return
        self.served += 1
        session.reply(job.call_id, wire.result_to_wire(result))

    def _compute(self, job: Job, on_step: Any) -> Any:
        params = job.params
        request = wire.request_from_wire(params.get("request"))
        engine = self._configured(params.get("config"))
        if job.method == "fill":
            if request.max_tokens > self.limits.max_tokens:
                raise ValueError(f"max_tokens {request.max_tokens} exceeds this engine's limit of "
                                 f"{self.limits.max_tokens}")
            return engine.fill(request, on_step=on_step)
        original = params.get("original")
        renoise = params.get("renoise") or []
        keep_above, grow = params.get("keep_above", DEFAULT_KEEP_ABOVE), params.get("grow", DEFAULT_GROW)
        if not isinstance(original, str):
            raise ValueError("refine needs the original text (a string)")
        if not isinstance(grow, int) or not 0 <= grow <= MAX_GROW:
            raise ValueError(f"grow must be an integer from 0 to {MAX_GROW}")
        if keep_above is not None and not isinstance(keep_above, (int, float)):
            raise ValueError("keep_above must be a number or nil")
        if not all(isinstance(r, list) and len(r) == 2 and all(isinstance(x, int) for x in r) for r in renoise):
            raise ValueError("renoise must be a list of [start, end] integer pairs")
        tokens = len(self._tokenize({"text": original}))
        if tokens + grow > self.limits.max_tokens:
            raise ValueError(f"the text has {tokens} tokens; this engine refines at most {self.limits.max_tokens}")
        return engine.refine(request, original, renoise=[tuple(r) for r in renoise], keep_above=keep_above,
                             grow=grow, on_step=on_step)

    def _configured(self, config: Any) -> Any:
        """The engine with this client's sampler and context settings (a shallow copy; the model is shared)."""
        from infill_engine.interface import EngineOptions

        options = EngineOptions.from_dict(config)
        return self.engine.with_options(options) if options.as_dict() else self.engine

    def _tokenize(self, params: dict[str, Any]) -> list[int]:
        text = params.get("text")
        if not isinstance(text, str):
            raise ValueError("tokenize needs text (a string)")
        special = bool(params.get("add_special_tokens", False))
        return self.engine.tokenize(text, add_special_tokens=special)

    def stop(self, reason: str) -> None:
        """Stop serving (the main loop returns)."""
        if not self._stop.is_set():
            logger.info("stopping: %s", reason)
            self._stop.set()


# ----------------------------------------------------------------------------------------------- listening
def listen_unix(path: Path) -> tuple[socket.socket, Any]:
    """A listening Unix socket at `path` (mode 0600) and the lock that makes this engine the only one there.

    Raises FileExistsError when another engine holds the lock (it serves that socket already).
    """
    lock = open(f"{path}.lock", "a")  # noqa: SIM115 - held for the life of the process
    os.chmod(lock.name, 0o600)
    try:
        fcntl.flock(lock, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except BlockingIOError:
        lock.close()
        raise FileExistsError(f"another engine already serves {path}") from None
    try:
        path.unlink()  # a stale socket of an engine that died
    except FileNotFoundError:
        pass
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    old = os.umask(0o177)
    try:
        listener.bind(str(path))
    finally:
        os.umask(old)
    os.chmod(path, 0o600)
    listener.listen(64)
    return listener, lock


def listen_tcp(host: str, port: int) -> socket.socket:
    """A listening TCP socket (the caller has checked the host)."""
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    listener = socket.socket(family, socket.SOCK_STREAM)
    listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    listener.bind((host, port))
    listener.listen(64)
    return listener


def serve(service: EngineService, listeners: list[socket.socket]) -> None:
    """Accept on every listener and run the model loop until the service stops; then close the listeners."""
    signal.signal(signal.SIGTERM, lambda *_: service.stop("SIGTERM"))
    for listener in listeners:
        threading.Thread(target=service.accept_forever, args=(listener,), name="accept", daemon=True).start()
    try:
        service.run()
    except KeyboardInterrupt:
        service.stop("interrupted")
    finally:
        for listener in listeners:
            try:
                listener.close()
            except OSError:
                pass
        with service._lock:
            clients = list(service.clients.values())
        for client in clients:
            client.session.close("the engine is stopping")
