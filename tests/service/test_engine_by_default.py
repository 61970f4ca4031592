"""One engine by default: two `diffill serve` processes started with no settings load the model once.

The servers run with `--engine-factory tests.lsp.fake_engine:build_engine` (fills known, no checkpoint to load) under
a private $XDG_RUNTIME_DIR, and no `--engine-mode`: the server's own default decides. The engine they start is
detached, so the test stops it itself and checks that no process of this test outlives it.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time
from pathlib import Path

import pytest
from pytest_lsp import LanguageClient

from infill_engine.interface import ModelSpec
from infill_engine.service.address import socket_path
from infill_engine.service.api import EngineClient
from lsp_server.settings import Settings, parse_settings
from tests.lsp.conftest import WAIT, debug_info, field_of, inline, open_document, serve_command, start, wait_until_loaded
from tests.service.conftest import FACTORY, engine_env

ADD = "def add(a, b):\n    return \n"


def test_the_default_engine_mode_is_auto_and_the_command_line_decides_when_the_editor_does_not():
    assert parse_settings({})[0].engine.mode == "auto"
    pinned = Settings(engine=type(Settings().engine)(mode="inprocess"))
    assert parse_settings({"completion": {"debounceMs": 0}}, pinned)[0].engine.mode == "inprocess"
    assert parse_settings({"engine": {"mode": "shared"}}, pinned)[0].engine.mode == "shared"
    assert parse_settings({"diffill": {"engine": {"mode": "auto"}}}, pinned)[0].engine.mode == "auto"


def engine_processes(runtime: Path) -> list[int]:
    """Pids of the `diffill engine serve` processes listening in this test's runtime directory."""
    found = []
    for entry in Path("/proc").iterdir():
        try:
            command = (entry / "cmdline").read_bytes().split(b"\0")
            state = (entry / "stat").read_text().rsplit(")", 1)[1].split()[0]
        except (OSError, IndexError, ValueError):
            continue
        if b"engine" in command and b"serve" in command and str(runtime).encode() in b" ".join(command) \
                and state != "Z":
            found.append(int(entry.name))
    return found


def engine_status() -> dict:
    client = EngineClient.connect(str(socket_path(ModelSpec(factory=FACTORY).key)), timeout=5)
    try:
        return client.status()
    finally:
        client.close()


@pytest.mark.asyncio
async def test_two_servers_without_settings_load_the_model_once_and_both_get_fills(runtime: Path):
    clients: list[LanguageClient] = []
    try:
        for name in ("neovim", "visual_studio_code"):
            client = LanguageClient()
            await client.start_io(*serve_command("--engine-factory", FACTORY, engine_mode=None),
                                  env=engine_env(runtime))
            clients.append(client)
            await start(client, name, None)
            info = await wait_until_loaded(client)
            assert field_of(info, "state") == "ready", field_of(info, "message")
        for number, client in enumerate(clients):
            info = await debug_info(client)
            assert info["settings"]["engine"]["mode"] == "auto"
            uri = f"file:///default/add{number}.py"
            open_document(client, uri, ADD)
            result = await inline(client, uri, 1, 11)
            assert result is not None and "a + b" in [item.insert_text for item in result.items]
        status = engine_status()
        assert status["loads"] == 1 and status["clients"] == 2, status
        assert engine_processes(runtime) == [status["pid"]]
    finally:
        for client in clients:
            await asyncio.wait_for(client.shutdown_session(), WAIT)
        for pid in engine_processes(runtime):
            os.kill(pid, signal.SIGTERM)
        deadline = time.monotonic() + WAIT
        while engine_processes(runtime) and time.monotonic() < deadline:
            await asyncio.sleep(0.1)
    assert engine_processes(runtime) == [], "the engine outlived the test"
