"""Two real `diffill serve` processes in `shared` mode share one engine, and survive its death.

The servers start with `--engine-factory tests.lsp.fake_engine:build_engine`, so the engine they start (detached,
through the launcher) is the scripted one and its answers are known.
"""

from __future__ import annotations

import asyncio
import os
import signal
import time

import pytest
from pytest_lsp import LanguageClient

from infill_engine.service.address import socket_path
from infill_engine.service.api import EngineClient
from infill_engine.interface import ModelSpec
from tests.lsp.conftest import WAIT, field_of, inline, open_document, serve_command, start, wait_until_loaded
from tests.service.conftest import FACTORY, engine_env

pytestmark = pytest.mark.asyncio

SETTINGS = {"engine": {"mode": "shared"}, "completion": {"debounceMs": 0, "candidates": 2, "maxTokens": 24},
            "diagnostics": {"enabled": False}}
ADD = "def add(a, b):\n    return \n"
SLOW = "slow = \n"


async def language_server(runtime) -> LanguageClient:
    client = LanguageClient()
    await client.start_io(*serve_command("--engine-factory", FACTORY), env=engine_env(runtime))
    await start(client, "neovim", SETTINGS)
    info = await wait_until_loaded(client)
    assert field_of(info, "state") == "ready", field_of(info, "message")
    return client


def engine_status(runtime) -> dict:
    os.environ["XDG_RUNTIME_DIR"] = str(runtime)
    client = EngineClient.connect(str(socket_path(ModelSpec(factory=FACTORY).key)))
    try:
        return client.status()
    finally:
        client.close()


def texts(result) -> list[str]:
    return [item.insert_text for item in (result.items if result else [])]


async def test_two_servers_share_one_engine_and_survive_its_death(runtime):
    first = await language_server(runtime)
    second = await language_server(runtime)
    try:
        for number, client in enumerate((first, second)):
            uri = f"file:///shared/add{number}.py"
            open_document(client, uri, ADD)
            assert "a + b" in texts(await inline(client, uri, 1, 11))
        status = engine_status(runtime)
        assert status["loads"] == 1 and status["clients"] == 2, status
        killed = status["pid"]

        # SIGKILL the engine in the middle of a slow fill: that request ends (with a fill from the restarted engine,
        # nothing or an error), and the next request is served by a new engine
        open_document(first, "file:///shared/slow.py", SLOW)
        pending = asyncio.ensure_future(inline(first, "file:///shared/slow.py", 0, 7))
        deadline = time.monotonic() + WAIT
        while engine_status(runtime)["running"] is None:
            assert time.monotonic() < deadline and not pending.done(), "the slow fill never ran"
            await asyncio.sleep(0.05)
        await asyncio.sleep(0.3)  # a few of its steps
        os.kill(killed, signal.SIGKILL)
        try:
            await asyncio.wait_for(pending, WAIT)
        except Exception as failure:  # noqa: BLE001 - an error answer is allowed; hanging is not
            assert "engine" in str(failure).lower(), failure
        uri = "file:///shared/after.py"
        open_document(second, uri, "x = 1\n" + ADD)  # another context: not from the server's cache
        assert "a + b" in texts(await inline(second, uri, 2, 11))
        assert engine_status(runtime)["pid"] != killed
    finally:
        for client in (first, second):
            await asyncio.wait_for(client.shutdown_session(), WAIT)
        try:
            os.kill(engine_status(runtime)["pid"], signal.SIGTERM)
        except Exception:  # noqa: BLE001 - already gone
            pass
