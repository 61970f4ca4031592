"""Faults around a running `diffill serve`: the model directory truncated or removed under it, changes that arrive
out of order, and a language server that dies or loses its editor while the shared engine runs its request.

Each test talks to real server processes over stdio (pytest-lsp) and, for the shared engine, a real `diffill engine
serve` around the scripted engine of `tests.lsp.fake_engine`. docs/RELIABILITY.md ("Faults") lists what the user
sees in each case.
"""

from __future__ import annotations

import asyncio
import os
import shutil
import signal
import threading
import time
from pathlib import Path

import pytest
from lsprotocol import types
from pytest_lsp import LanguageClient

from infill_engine.interface import ModelSpec
from infill_engine.request import InfillRequest
from infill_engine.service.address import socket_path
from infill_engine.service.api import EngineClient
from tests.lsp.conftest import (
    SERVER_ENV,
    WAIT,
    change_document,
    debug_info,
    field_of,
    inline,
    open_document,
    serve_command,
    start,
    start_ready,
    status_after,
    wait_until_loaded,
)
from tests.service.conftest import FACTORY, engine_env, start_engine, stop

pytestmark = pytest.mark.asyncio

ADD = "def add(a, b):\n    return \n"
FAST = {"completion": {"debounceMs": 0}, "diagnostics": {"enabled": False}, "context": {"otherDocuments": False},
        "engine": {"mode": "inprocess"}}  # the shared engine is tested on its own below


async def language_server(*options: str, env: dict[str, str] | None = None) -> LanguageClient:
    client = LanguageClient()
    await client.start_io(*serve_command(*options), env=env or SERVER_ENV)
    return client


def texts(result) -> list[str]:
    return [item.insert_text for item in (result.items if result else [])]


async def ghost_outcome(client: LanguageClient, uri: str, line: int, character: int) -> str:
    """The `diffill/status` outcome of a ghost-text request (the request must be answered either way)."""
    seen = len(client.statuses)  # type: ignore[attr-defined]
    await inline(client, uri, line, character, invoked=True)
    return field_of(await status_after(client, seen, types.TEXT_DOCUMENT_INLINE_COMPLETION), "outcome")


# ----------------------------------------------------------------------------------------- the model directory


async def test_the_model_directory_truncated_or_removed_while_serving(model_dirs, tmp_path):
    tiny_checkpoint = model_dirs["diffill"]
    served = tmp_path / "model"
    shutil.copytree(tiny_checkpoint, served)
    client = await language_server()
    try:
        settings = {**FAST, "model": {"path": str(served), "threads": 1}, "completion": {"debounceMs": 0,
                                                                                         "maxTokens": 6}}
        await start_ready(client, "visual_studio_code", settings)
        uri = "file:///faults/model.py"
        open_document(client, uri, ADD)
        assert await ghost_outcome(client, uri, 1, 11) in ("ok", "empty")

        # the weights file rewritten in place (an export into the served directory): the loaded model goes on
        weights = served / "model.safetensors"
        with open(weights, "r+b") as handle:
            handle.truncate(100)
        change_document(client, uri, "x = 1\n" + ADD, 2)  # a new context: the model runs again
        assert await ghost_outcome(client, uri, 2, 11) in ("ok", "empty")

        shutil.rmtree(served)  # the whole directory gone: still served from memory
        change_document(client, uri, "x = 2\n" + ADD, 3)
        assert await ghost_outcome(client, uri, 2, 11) in ("ok", "empty")
        assert field_of(await debug_info(client), "state") == "ready"

        # a reload now (a model setting changed) fails with the reason, and requests get an empty answer
        client.workspace_did_change_configuration(types.DidChangeConfigurationParams(
            settings={**settings, "model": {"path": str(served), "threads": 1, "dtype": "float32"}}))
        await asyncio.sleep(0.2)
        info = await wait_until_loaded(client)
        assert field_of(info, "state") == "failed"
        assert "does not exist" in field_of(info, "message")
        change_document(client, uri, "x = 3\n" + ADD, 4)
        assert await ghost_outcome(client, uri, 2, 11) == "not_ready"

        shutil.copytree(tiny_checkpoint, served)  # the model back, and the setting touched again: ready again
        client.workspace_did_change_configuration(types.DidChangeConfigurationParams(settings=settings))
        await asyncio.sleep(0.2)
        assert field_of(await wait_until_loaded(client), "state") == "ready"
        change_document(client, uri, "x = 4\n" + ADD, 5)
        assert await ghost_outcome(client, uri, 2, 11) in ("ok", "empty")
    finally:
        await asyncio.wait_for(client.shutdown_session(), WAIT)


# ----------------------------------------------------------------------------------------- stale versions


async def test_changes_with_a_stale_version_put_the_document_out_of_sync_until_its_whole_text_comes():
    client = await language_server("--engine-factory", FACTORY)
    try:
        messages: list[str] = []
        client.feature(types.WINDOW_SHOW_MESSAGE)(lambda ls, params: messages.append(params.message))
        await start_ready(client, "neovim", FAST)
        uri = "file:///faults/stale.py"
        open_document(client, uri, "x = 0\n", version=1)
        change_document(client, uri, ADD, 3)
        assert "a + b" in texts(await inline(client, uri, 1, 11))

        change_document(client, uri, "y = 1\n", 2)  # a change older than the text the server has
        assert await inline(client, uri, 1, 11) is None  # nothing is computed on text that may not be the editor's
        stale = types.CodeAction(title="Rewrite selection (diffill)", kind=types.CodeActionKind.RefactorRewrite, data={
            "diffill": "rewrite", "uri": uri, "version": 2, "instruction": None,
            "range": {"start": {"line": 0, "character": 0}, "end": {"line": 0, "character": 5}}})
        assert (await asyncio.wait_for(client.code_action_resolve_async(stale), WAIT)).edit is None
        for _ in range(WAIT * 20):
            if messages:
                break
            await asyncio.sleep(0.05)
        assert any("version 2 after version 3" in m for m in messages), messages

        change_document(client, uri, "z = 2\n" + ADD, 4)  # the whole text, newer: in sync again
        assert "a + b" in texts(await inline(client, uri, 2, 11))
    finally:
        await asyncio.wait_for(client.shutdown_session(), WAIT)


# ----------------------------------------------------------------------------------------- the shared engine


def engine_status(socket: Path) -> dict:
    client = EngineClient.connect(str(socket))
    try:
        return client.status()
    finally:
        client.close()


@pytest.fixture(scope="module")
def shared_engine(tmp_path_factory):
    """A `diffill engine serve` at the socket language servers in shared mode look for: (runtime, socket)."""
    runtime = tmp_path_factory.mktemp("shared") / "run"
    runtime.mkdir(mode=0o700)
    os.environ["XDG_RUNTIME_DIR"] = str(runtime)  # for socket_path here; the servers get it through their env
    try:
        socket = socket_path(ModelSpec(factory=FACTORY).key)
        process = start_engine(runtime, socket)
        yield runtime, socket
        stop(process)
    finally:
        os.environ.pop("XDG_RUNTIME_DIR", None)


@pytest.mark.parametrize("how", ["killed", "disconnected"])
async def test_a_language_server_lost_mid_request_has_its_request_cancelled_and_others_are_served(
        shared_engine, how):
    runtime, socket = shared_engine
    client = await language_server("--engine-factory", FACTORY, env=engine_env(runtime))
    await start(client, "neovim", {**FAST, "engine": {"mode": "shared"}})
    info = await wait_until_loaded(client)
    assert field_of(info, "state") == "ready", field_of(info, "message")
    server_pid = field_of(info, "pid")
    steps_before = engine_status(socket)["steps"]

    open_document(client, "file:///faults/slow.py", "slow = \n")
    pending = asyncio.ensure_future(inline(client, "file:///faults/slow.py", 0, 7))
    deadline = time.monotonic() + WAIT
    while engine_status(socket)["running"] is None:  # the slow fill (24 steps) is on the engine's model
        assert time.monotonic() < deadline and not pending.done(), "the slow fill never ran"
        await asyncio.sleep(0.05)
    other = EngineClient.connect(str(socket))  # another window's request, queued behind the slow fill
    answers: list[str] = []
    waiting = threading.Thread(target=lambda: answers.append(other.fill(
        InfillRequest(prefix="def add(a, b):\n    return ", suffix="\n", language="python", max_tokens=16)).text))
    waiting.start()

    if how == "killed":
        os.kill(server_pid, signal.SIGKILL)
    else:  # the editor went away without shutdown/exit: its end of the pipe closes
        client._server.stdin.close()  # type: ignore[union-attr]
    await asyncio.wait_for(client._server.wait(), WAIT)  # type: ignore[union-attr] - the server process is gone
    pending.cancel()

    waiting.join(WAIT)
    assert answers == ["a + b"]  # the other client was served
    deadline = time.monotonic() + WAIT  # the engine notices the lost connection at its next read or step
    while (status := engine_status(socket))["clients"] != 1 or status["running"] is not None:
        if time.monotonic() > deadline:
            break
        await asyncio.sleep(0.05)
    assert status["running"] is None and status["queued"] == 0 and status["clients"] == 1  # only `other` is left
    # the slow fill stopped when its server went: far fewer than its 24 steps ran (the other fill took a few)
    assert status["steps"] - steps_before < 24
    other.close()
    try:
        await asyncio.wait_for(client.stop(), 5)
    except Exception:  # noqa: BLE001 - the client's transport is already closed
        pass
