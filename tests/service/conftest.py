"""Helpers for tests of the shared engine service: a private runtime directory and a real `diffill engine serve`.

The engine is built by `tests.lsp.fake_engine:build_engine` (a real InfillEngine around a scripted denoiser), so
fills are fast and known, and the "slow = " context takes 0.15 s per step (time to cancel or kill it mid-fill).
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from infill_engine.service.api import EngineClient, EngineError
from tests.lsp.conftest import ROOT

FACTORY = "tests.lsp.fake_engine:build_engine"
WAIT = 60.0  # seconds any single wait may take (the machine may be busy)


def engine_env(runtime: Path) -> dict[str, str]:
    """The environment of a test's engine and servers: this checkout on the path, a private runtime directory."""
    return {**os.environ, "XDG_RUNTIME_DIR": str(runtime),
            "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}


def start_engine(runtime: Path, socket: Path, *options: str) -> subprocess.Popen[bytes]:
    """`diffill engine serve` with the fake engine, once its socket answers."""
    process = subprocess.Popen(
        [sys.executable, "-m", "diffill", "engine", "serve", "--socket", str(socket),
         "--engine-factory", FACTORY, "--idle-timeout", "120", *options],
        env=engine_env(runtime), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )
    deadline = time.monotonic() + WAIT
    while True:
        try:
            EngineClient.connect(str(socket), timeout=5).close()
            return process
        except EngineError:
            if process.poll() is not None or time.monotonic() > deadline:
                stop(process)
                raise AssertionError(f"the engine did not start: {process.stderr.read().decode()}")  # type: ignore
            time.sleep(0.1)


def stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.send_signal(signal.SIGKILL)
    process.wait(timeout=WAIT)


@pytest.fixture
def runtime(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A fresh $XDG_RUNTIME_DIR for the test (this process and the ones it starts)."""
    directory = tmp_path / "run"
    directory.mkdir(mode=0o700)
    monkeypatch.setenv("XDG_RUNTIME_DIR", str(directory))
    return directory


@pytest.fixture(scope="module")
def engine(tmp_path_factory: pytest.TempPathFactory):
    """One engine for a module's tests: (process, socket path)."""
    runtime = tmp_path_factory.mktemp("engine-run")
    os.chmod(runtime, 0o700)
    socket = runtime / "engine.sock"
    process = start_engine(runtime, socket)
    yield process, socket
    stop(process)
