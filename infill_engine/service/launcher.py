"""The language server's side of the shared engine: find the engine for a model, or start one, and survive its death.

`SharedEngine` is what the language server holds in place of an `InfillEngine`. It connects to the engine serving
the same model (the socket's name is a hash of the model's identity); when none answers it starts
`diffill engine serve` detached (its own session, so it outlives the editor that started it and exits on its own
after an idle timeout) and waits for the socket. When the engine dies during a request, it logs that once, starts a
new engine and retries the request once. Every wait has a timeout.
"""

from __future__ import annotations

import logging
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

from infill_engine.interface import DEFAULT_GROW, DEFAULT_KEEP_ABOVE, EngineOptions, ModelInfo, ModelSpec, StepCallback
from infill_engine.request import InfillRequest, InfillResult
from infill_engine.service.address import socket_path
from infill_engine.service.api import EngineClient, EngineError, EngineUnavailable

logger = logging.getLogger(__name__)

CONNECT_TIMEOUT = 5.0  # seconds for a connection and its handshake
START_TIMEOUT = 120.0  # seconds a new engine may take to load its model and listen
IDLE_TIMEOUT = 600.0  # seconds an engine started here stays up with no client


def serve_command(spec: ModelSpec, socket: Path, idle_timeout: float) -> list[str]:
    """`diffill engine serve` for the model of `spec`."""
    command = [sys.executable, "-m", "diffill", "engine", "serve", "--socket", str(socket),
               "--idle-timeout", f"{idle_timeout:g}", "--device", spec.device, "--dtype", spec.dtype]
    if spec.path is not None:
        command += ["--model", str(spec.resolved_path)]
    if spec.family is not None:
        command += ["--family", spec.family]
    if spec.trust_remote_code:
        command += ["--trust-remote-code"]
    if spec.factory is not None:
        command += ["--engine-factory", spec.factory]
    if spec.threads:
        command += ["--threads", str(spec.threads)]
    command += ["--dual-cache", str(spec.dual_cache), "--compiled-layers", spec.compiled_layers]
    return command


def start_engine(spec: ModelSpec, socket: Path, idle_timeout: float) -> subprocess.Popen[bytes]:
    """Start an engine detached from this process (its standard error goes to a log beside the socket)."""
    log_path = socket.with_suffix(".log")
    with open(log_path, "ab") as log:
        os.chmod(log_path, 0o600)
        process = subprocess.Popen(
            serve_command(spec, socket, idle_timeout), stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
            stderr=log, start_new_session=True, close_fds=True,
        )
    threading.Thread(target=process.wait, name="engine-reaper", daemon=True).start()  # no zombie when it exits
    logger.info("started a shared engine (pid %d) for %s; log: %s", process.pid, spec.path or "the embedded model",
                log_path)
    return process


def connect_or_start(spec: ModelSpec, *, start: bool = True, connect_timeout: float = CONNECT_TIMEOUT,
                     start_timeout: float = START_TIMEOUT, idle_timeout: float = IDLE_TIMEOUT) -> EngineClient:
    """A client of the engine for `spec`, starting one when none answers (and `start`)."""
    socket = socket_path(spec.key)
    try:
        return EngineClient.connect(str(socket), expect_key=spec.key, timeout=connect_timeout)
    except EngineUnavailable:
        if not start:
            raise
    process = start_engine(spec, socket, idle_timeout)
    deadline = time.monotonic() + start_timeout
    while True:
        try:
            return EngineClient.connect(str(socket), expect_key=spec.key, timeout=connect_timeout)
        except EngineUnavailable as failure:
            code = process.poll()
            if code not in (None, 0):  # 0: another engine won the race for the socket; wait for that one
                raise EngineUnavailable(f"the engine exited with status {code} while starting; see "
                                        f"{socket.with_suffix('.log')}") from None
            if time.monotonic() > deadline:
                raise EngineUnavailable(f"no engine answered at {socket} within {start_timeout:g} s "
                                        f"({failure})") from None
        time.sleep(0.1)


class SharedEngine:
    """An `Engine` backed by the shared engine service; restarts the service once per failure."""

    def __init__(self, spec: ModelSpec, *, connect_timeout: float = CONNECT_TIMEOUT,
                 start_timeout: float = START_TIMEOUT, idle_timeout: float = IDLE_TIMEOUT) -> None:
        self.spec = spec
        self._timeouts = {"connect_timeout": connect_timeout, "start_timeout": start_timeout,
                          "idle_timeout": idle_timeout}
        self._options = EngineOptions()
        self._lock = threading.Lock()
        self.restarts = 0
        self.client = connect_or_start(spec, **self._timeouts)

    def describe(self) -> ModelInfo:
        """The model the engine serves; its device names the engine's address."""
        model = self.client.model
        return ModelInfo(family=str(model.get("family", "?")), path=str(model.get("path", "?")),
                         device=f"{model.get('device', '?')} (shared engine {self.client.address})",
                         dtype=str(model.get("dtype", "")))

    def configure(self, options: EngineOptions) -> None:
        """Sampler and context settings of this client, sent with every request."""
        self._options = options
        self.client.configure(options)

    def fill(self, request: InfillRequest, on_step: StepCallback | None = None, *,
             document: str | None = None) -> InfillResult:
        """`Engine.fill` on the shared engine."""
        return self._retrying(lambda c: c.fill(request, on_step, document=document))

    def refine(self, request: InfillRequest, original: str, renoise: list[tuple[int, int]] | None = None,
               keep_above: float | None = DEFAULT_KEEP_ABOVE, grow: int = DEFAULT_GROW,
               on_step: StepCallback | None = None, *, document: str | None = None) -> InfillResult:
        """`Engine.refine` on the shared engine."""
        return self._retrying(lambda c: c.refine(request, original, renoise, keep_above, grow, on_step,
                                                 document=document))

    def count_tokens(self, text: str) -> int:
        """How many of the model's tokens `text` is."""
        return len(self._retrying(lambda c: c.tokenize(text)))

    def status(self) -> dict[str, Any]:
        """The engine's status."""
        return self._retrying(lambda c: c.status())

    def close(self) -> None:
        """Disconnect (the engine keeps running for other clients, or until its idle timeout)."""
        self.client.close()

    def _retrying(self, call: Any) -> Any:
        client = self.client
        try:
            return call(client)
        except EngineUnavailable as failure:
            logger.warning("the shared engine stopped (%s); starting a new one and retrying once", failure)
        replacement = self._replace(client)
        return call(replacement)

    def _replace(self, dead: EngineClient) -> EngineClient:
        """A working client; one thread reconnects, the others use its result."""
        with self._lock:
            if self.client is dead or not self.client.connected:
                dead.close()
                try:
                    self.client = connect_or_start(self.spec, **self._timeouts)
                except EngineError as failure:
                    raise EngineUnavailable(f"could not restart the shared engine: {failure}") from None
                self.client.configure(self._options)
                self.restarts += 1
            return self.client
