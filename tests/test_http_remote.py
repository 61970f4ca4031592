"""The language server as a client of the team server: a real `diffill serve` in `engine.mode: "remote"` against a
real `diffill http` on loopback (the scripted engine), with the key from a file, as an editor would set it up.
"""

from __future__ import annotations

import asyncio
import time

import pytest
from pytest_lsp import LanguageClient

from tests.http_server import KEY, free_port, request, start_server, stop
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
    status_after,
    wait_until_loaded,
)

pytestmark = pytest.mark.asyncio

ADD = "def add(a, b):\n    return \n"
SLOW = "slow = \n"


@pytest.fixture(scope="module")
def team_server():
    process, port = start_server("--api-key", KEY)
    yield port
    stop(process)


def settings(url: str, **engine: str) -> dict:
    return {"engine": {"mode": "remote", "url": url, **engine}, "diagnostics": {"enabled": False},
            "completion": {"debounceMs": 0, "candidates": 2, "maxTokens": 24, "prefetchAccepted": False},
            "context": {"otherDocuments": False}}  # no prefetch: a fill on the server is the one the test asked for


async def language_server(options: dict) -> tuple[LanguageClient, dict]:
    client = LanguageClient()
    env = {key: value for key, value in SERVER_ENV.items() if key != "DIFFILL_API_KEY"}
    await client.start_io(*serve_command(), env=env)
    await start(client, "neovim", options)
    return client, await wait_until_loaded(client)


def texts(result) -> list[str]:
    return [item.insert_text for item in (result.items if result else [])]


async def test_remote_mode_fills_and_a_superseded_fill_stops_on_the_server(team_server, tmp_path):
    key_file = tmp_path / "key"
    key_file.write_text(KEY + "\n")
    client, info = await language_server(settings(f"http://127.0.0.1:{team_server}", keyFile=str(key_file)))
    try:
        assert field_of(info, "state") == "ready", field_of(info, "message")
        open_document(client, "file:///team/add.py", ADD)
        assert "a + b" in texts(await inline(client, "file:///team/add.py", 1, 11))

        # a slow fill, then an edit of its document: the server stops it (the client hung up) and counts it
        before = request(team_server, "GET", "/v1/status", key=KEY)[1]["cancelled"]
        open_document(client, "file:///team/slow.py", SLOW)
        pending = asyncio.ensure_future(inline(client, "file:///team/slow.py", 0, 7))
        deadline = time.monotonic() + WAIT
        while request(team_server, "GET", "/v1/status", key=KEY)[1]["queued"] == 0:
            assert time.monotonic() < deadline and not pending.done(), "the slow fill never reached the server"
            await asyncio.sleep(0.05)
        change_document(client, "file:///team/slow.py", "# edited\nslow = \n", 2)  # not typed at the cursor
        assert texts(await asyncio.wait_for(pending, WAIT)) == []
        while request(team_server, "GET", "/v1/status", key=KEY)[1]["cancelled"] == before:
            assert time.monotonic() < deadline, "the server never stopped the abandoned fill"
            await asyncio.sleep(0.05)
        open_document(client, "file:///team/add2.py", "x = 1\n" + ADD)
        assert "a + b" in texts(await inline(client, "file:///team/add2.py", 2, 11))
    finally:
        await asyncio.wait_for(client.shutdown_session(), WAIT)


async def test_an_unreachable_server_or_a_wrong_key_is_a_clear_status(team_server):
    nowhere = f"http://127.0.0.1:{free_port()}"
    client, info = await language_server(settings(nowhere))
    try:
        assert field_of(info, "state") == "failed"
        assert nowhere in field_of(info, "message") and "does not answer" in field_of(info, "message")
    finally:
        await asyncio.wait_for(client.shutdown_session(), WAIT)
    client, info = await language_server(settings(f"http://127.0.0.1:{team_server}", key="not-the-key"))
    try:
        assert field_of(info, "state") == "failed"
        assert "refused the API key" in field_of(info, "message")
    finally:
        await asyncio.wait_for(client.shutdown_session(), WAIT)


async def test_a_server_that_goes_away_is_reported_as_unreachable():
    process, port = start_server()
    client, info = await language_server(settings(f"http://127.0.0.1:{port}"))
    try:
        assert field_of(info, "state") == "ready", field_of(info, "message")
        open_document(client, "file:///team/add.py", ADD)
        assert "a + b" in texts(await inline(client, "file:///team/add.py", 1, 11))
        stop(process)
        count = len(client.statuses)
        open_document(client, "file:///team/add2.py", "x = 1\n" + ADD)
        assert texts(await inline(client, "file:///team/add2.py", 2, 11)) == []
        report = await status_after(client, count, "textDocument/inlineCompletion")
        assert field_of(report, "outcome") == "unreachable" and field_of(report, "state") == "unreachable"
        info = await debug_info(client)
        assert field_of(info, "state") == "unreachable" and f"127.0.0.1:{port}" in field_of(info, "message")
    finally:
        stop(process)
        await asyncio.wait_for(client.shutdown_session(), WAIT)
