"""A real `diffill http` (uvicorn on loopback) for the team server's tests, and a small stdlib HTTP client.

The server is started with `--engine-factory tests.lsp.fake_engine:build_engine`: a real InfillEngine around a
scripted denoiser, so fills are known ("def add(a, b):\n    return " -> "a + b", a second candidate "b + a") and the
"slow = " context takes 0.15 s per step, time enough to disconnect in the middle of it.
"""

from __future__ import annotations

import http.client
import json
import socket
import subprocess
import sys
import time
from typing import Any

from tests.lsp.conftest import SERVER_ENV

FACTORY = "tests.lsp.fake_engine:build_engine"
KEY = "team-secret-key"
WAIT = 60.0  # seconds any single wait may take (the machine may be busy)


def free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def start_server(*options: str, env: dict[str, str] | None = None, scripted: bool = True
                 ) -> tuple[subprocess.Popen[bytes], int]:
    """`diffill http` (with the scripted engine unless not `scripted`) on a free loopback port, once /health
    answers."""
    port = free_port()
    engine = ["--engine-factory", FACTORY] if scripted else []
    process = subprocess.Popen(
        [sys.executable, "-m", "diffill", "http", *engine, "--port", str(port), *options],
        env=env or SERVER_ENV, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE,
    )
    deadline = time.monotonic() + WAIT
    while True:
        try:
            if request(port, "GET", "/health")[0] == 200:
                return process, port
        except OSError:
            pass
        if process.poll() is not None or time.monotonic() > deadline:
            stop(process)
            raise AssertionError(f"diffill http did not start: {process.stderr.read().decode()}")  # type: ignore
        time.sleep(0.1)


def stop(process: subprocess.Popen[bytes]) -> None:
    if process.poll() is None:
        process.terminate()
        try:
            process.wait(timeout=WAIT)
        except subprocess.TimeoutExpired:
            process.kill()
            process.wait(timeout=WAIT)


def request(port: int, method: str, path: str, body: Any = None, key: str | None = None,
            raw: bytes | None = None) -> tuple[int, Any]:
    """(status, decoded JSON) of one request; `raw` is sent as the body as it is."""
    headers = {"Content-Type": "application/json"}
    if key is not None:
        headers["Authorization"] = f"Bearer {key}"
    data = raw if raw is not None else (None if body is None else json.dumps(body).encode())
    connection = http.client.HTTPConnection("127.0.0.1", port, timeout=WAIT)
    try:
        connection.request(method, path, data, headers)
        response = connection.getresponse()
        return response.status, json.loads(response.read() or b"null")
    finally:
        connection.close()
