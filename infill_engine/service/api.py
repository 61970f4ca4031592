"""The typed engine API over a session: `EngineClient` works like `InfillEngine`, so callers need not know where the
model runs.

    client = EngineClient.connect(address)
    result = client.fill(InfillRequest(prefix, suffix), on_step=ticket.on_step)   # an InfillResult

`on_step` is called once per denoising step of the remote fill (with a `RemoteStep`); when it returns False the
client sends `cancel` for the request and `fill` raises FillCancelled, as the in-process engine does. Errors:
ValueError for a request the engine refuses as invalid, FillCancelled when cancelled, EngineUnavailable when the
engine cannot be reached or goes away, EngineError for anything else it reports.
"""

from __future__ import annotations

import logging
import os
import queue
import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from infill_engine.interface import DEFAULT_GROW, DEFAULT_KEEP_ABOVE, EngineOptions
from infill_engine.request import FillCancelled, InfillRequest, InfillResult
from infill_engine.service import wire
from infill_engine.service.framing import DEFAULT_MAX_FRAME, FramedStream
from infill_engine.service.session import Call, ConnectionLost, RemoteError, Session
from infill_engine.service.stream import connect

logger = logging.getLogger(__name__)

PROTOCOL_VERSION = 1
POLL_SECONDS = 0.05  # how often a waiting call checks whether its caller still wants it
DEFAULT_TIMEOUT = 300.0  # seconds a fill may take before the client gives up on the engine


class EngineError(RuntimeError):
    """The engine refused or failed a request."""


class EngineUnavailable(EngineError):
    """No engine answers at the address, or it went away during a request."""


class HandshakeError(EngineError):
    """The engine speaks another protocol version, serves another model, or refused the token."""


@dataclass(frozen=True)
class RemoteStep:
    """What `on_step` sees of a remote denoising step."""

    block: int
    step: int


class EngineClient:
    """A connection to a shared engine, with the in-process engine's `fill` and `refine`."""

    def __init__(self, session: Session, hello: dict[str, Any], address: str, timeout: float = DEFAULT_TIMEOUT) -> None:
        self.session = session
        self.address = address
        self.timeout = timeout
        self.hello = hello  # the engine's handshake answer: protocol, model, pid
        self.model: dict[str, Any] = dict(hello.get("model") or {})
        self.options = EngineOptions()  # this client's sampler and context settings, sent with every request

    @classmethod
    def connect(
        cls,
        address: str,
        *,
        token: str | None = None,
        expect_key: str | None = None,
        timeout: float = 5.0,
        fill_timeout: float = DEFAULT_TIMEOUT,
        max_frame: int = DEFAULT_MAX_FRAME,
        protocol: int = PROTOCOL_VERSION,
    ) -> EngineClient:
        """Connect and shake hands; EngineUnavailable when nothing listens, HandshakeError when refused."""
        try:
            stream = connect(address, timeout)
        except OSError as failure:
            raise EngineUnavailable(f"no engine at {address}: {failure.strerror or failure}") from None
        session = Session(FramedStream(stream, max_frame), name=f"engine-client:{address}").start()
        call = session.request("hello", {"protocol": protocol, "token": token, "client": f"pid {os.getpid()}"})
        try:
            hello = call.future.result(timeout=timeout)
        except RemoteError as failure:
            session.close("handshake refused")
            raise HandshakeError(f"the engine at {address} refused the connection: {failure.message}") from None
        except (ConnectionLost, TimeoutError) as failure:
            session.close("handshake failed")
            raise EngineUnavailable(f"the engine at {address} did not answer the handshake ({failure})") from None
        if expect_key is not None and (hello.get("model") or {}).get("key") != expect_key:
            session.close("another model")
            raise HandshakeError(f"the engine at {address} serves another model: {hello.get('model')}")
        return cls(session, hello, address, fill_timeout)

    # ------------------------------------------------------------------------------------------ the engine's API
    def configure(self, options: EngineOptions) -> None:
        """This client's sampler and context settings; unset ones keep the engine's own."""
        self.options = options

    def fill(
        self, request: InfillRequest, on_step: Callable[[Any], Any] | None = None, *, document: str | None = None
    ) -> InfillResult:
        """Fill the hole, like `InfillEngine.fill`; `document` names the document so that a newer request of the
        same document supersedes this one at the engine."""
        params = {"request": wire.request_to_wire(request)}
        return wire.result_from_wire(self._call("fill", params, on_step, document))

    def refine(
        self,
        request: InfillRequest,
        original: str,
        renoise: list[tuple[int, int]] | None = None,
        keep_above: float | None = DEFAULT_KEEP_ABOVE,
        grow: int = DEFAULT_GROW,
        on_step: Callable[[Any], Any] | None = None,
        *,
        document: str | None = None,
    ) -> InfillResult:
        """Denoise `original` again in place, like `InfillEngine.refine`."""
        params = {
            "request": wire.request_to_wire(request), "original": original,
            "renoise": [list(r) for r in renoise or []], "keep_above": keep_above, "grow": grow,
        }
        return wire.result_from_wire(self._call("refine", params, on_step, document))

    def tokenize(self, text: str, add_special_tokens: bool = False) -> list[int]:
        """The model's token ids of `text`."""
        return list(self._call("tokenize", {"text": text, "add_special_tokens": add_special_tokens}, None, None))

    def status(self) -> dict[str, Any]:
        """The engine's status: pid, model, loads, clients, queued and served requests."""
        return dict(self._call("status", {}, None, None))

    def shutdown(self) -> None:
        """Ask the engine to exit (after answering)."""
        try:
            self._call("shutdown", {}, None, None)
        except EngineUnavailable:
            pass

    def cancel(self, call_id: int) -> None:
        """Ask the engine to stop request `call_id` (a no-op when it is done)."""
        self.session.notify("cancel", {"id": call_id})

    def close(self) -> None:
        """Close the connection."""
        self.session.close("closed by the client")

    @property
    def connected(self) -> bool:
        """Whether the connection is still open."""
        return not self.session.closed.is_set()

    # ------------------------------------------------------------------------------------------------ plumbing
    def _call(self, method: str, params: dict[str, Any], on_step: Callable[[Any], Any] | None,
              document: str | None) -> Any:
        ticket = getattr(on_step, "__self__", None)  # a bound method of a ticket: also stop once it is cancelled
        params = {**params, "document": document, "config": self.options.as_dict()}
        steps: queue.SimpleQueue[dict[str, Any]] = queue.SimpleQueue()
        call = self.session.request(method, params, on_progress=steps.put if on_step else None)
        deadline = time.monotonic() + self.timeout
        wanted = True
        while not call.future.done():
            try:
                call.future.exception(timeout=POLL_SECONDS)
            except TimeoutError:
                pass
            if wanted:
                wanted = self._still_wanted(call, steps, on_step, ticket)
            if time.monotonic() > deadline:
                self.cancel(call.id)
                raise EngineUnavailable(f"the engine at {self.address} did not answer {method} in {self.timeout:g} s")
        if wanted and on_step is not None:
            wanted = self._still_wanted(call, steps, on_step, ticket)
        try:
            result = call.future.result()
        except ConnectionLost as failure:
            raise EngineUnavailable(f"the engine at {self.address} went away: {failure}") from None
        except RemoteError as failure:
            if failure.kind == "Cancelled":
                raise FillCancelled() from None
            if failure.kind == "ValueError":
                raise ValueError(failure.message) from None
            raise EngineError(f"{failure.kind}: {failure.message}") from None
        if not wanted:
            raise FillCancelled()
        return result

    def _still_wanted(self, call: Call, steps: queue.SimpleQueue[dict[str, Any]],
                      on_step: Callable[[Any], Any] | None, ticket: Any) -> bool:
        """Feed the steps that arrived to `on_step`; cancel the remote call (and return False) once it says stop."""
        wanted = not bool(getattr(ticket, "cancelled", False))
        while wanted and on_step is not None:
            try:
                step = steps.get_nowait()
            except queue.Empty:
                break
            wanted = on_step(RemoteStep(int(step.get("block", 0)), int(step.get("step", 0)))) is not False
        if not wanted:
            self.cancel(call.id)
        return wanted
