"""`diffill serve` starting up: before the model is ready, without settings, with bad settings, over TCP."""

from __future__ import annotations

import subprocess
import sys

import pytest
import pytest_lsp
from pytest_lsp import ClientServerConfig, LanguageClient

from infill_engine.loading import default_model_path
from tests.lsp.conftest import (
    CLIENTS,
    SERVER_ENV,
    WAIT,
    connect_when_listening,
    debug_info,
    field_of,
    free_port,
    inline,
    lsp_message,
    open_document,
    read_lsp_message,
    serve_command,
    start,
    status_after,
    wait_until_loaded,
)


@pytest_lsp.fixture(config=ClientServerConfig(serve_command(), server_env=SERVER_ENV), params=CLIENTS)
async def fresh(lsp_client: LanguageClient, request: pytest.FixtureRequest):
    """A server that each test initializes itself."""
    lsp_client.client_name = request.param  # type: ignore[attr-defined]
    yield
    await lsp_client.shutdown_session()


@pytest.mark.asyncio
async def test_a_request_before_the_model_is_ready_gets_an_empty_answer_at_once(fresh: LanguageClient, tiny_checkpoint):
    settings = {"model": {"path": str(tiny_checkpoint), "threads": 1}, "completion": {"debounceMs": 0}}
    await start(fresh, fresh.client_name, settings)  # type: ignore[attr-defined]
    uri = "file:///startup/early.py"
    open_document(fresh, uri, "def add(a, b):\n    return \n")
    assert await inline(fresh, uri, 1, 11) is None
    early = await status_after(fresh, 0)
    assert field_of(early, "outcome") == "not_ready"
    assert field_of(early, "state") in ("starting", "loading")
    info = await debug_info(fresh)
    assert info["torch_loaded_at_initialize"] is False
    assert field_of(await wait_until_loaded(fresh), "state") == "ready"
    seen = len(fresh.statuses)  # type: ignore[attr-defined]
    await inline(fresh, uri, 1, 11)
    assert field_of(await status_after(fresh, seen), "forward_passes") >= 1  # now the model answers


@pytest.mark.asyncio
async def test_without_settings_the_embedded_model_is_used(fresh: LanguageClient):
    assert default_model_path() is not None  # this build ships one
    await start(fresh, fresh.client_name, None)  # type: ignore[attr-defined]
    info = await wait_until_loaded(fresh)
    assert info["state"] == "ready"
    assert info["settings"]["model"]["path"] is None
    assert info["model"].startswith("diffill:")


@pytest_lsp.fixture(config=ClientServerConfig([sys.executable, "-m", "tests.lsp.serve_without_model"],
                                              server_env=SERVER_ENV), params=CLIENTS)
async def modelless(lsp_client: LanguageClient, request: pytest.FixtureRequest):
    """A server of a build that ships no embedded model."""
    lsp_client.client_name = request.param  # type: ignore[attr-defined]
    yield
    await lsp_client.shutdown_session()


@pytest.mark.asyncio
async def test_a_build_without_a_model_says_how_to_set_one_and_suggests_nothing(modelless: LanguageClient):
    await start(modelless, modelless.client_name, None)  # type: ignore[attr-defined]
    info = await wait_until_loaded(modelless)
    assert info["state"] == "none"
    assert any("model.path" in m.message for m in modelless.messages)
    uri = "file:///startup/none.py"
    open_document(modelless, uri, "x = \n")
    assert await inline(modelless, uri, 0, 4) is None
    assert field_of(await status_after(modelless, 0), "outcome") == "not_ready"


@pytest.mark.asyncio
async def test_malformed_initialization_options_are_named_and_defaults_used(fresh: LanguageClient):
    await start(fresh, fresh.client_name, {  # type: ignore[attr-defined]
        "model": 42, "completion": {"maxTokens": -1, "lineTokens": "x"}, "languages": "python", "typo": {}})
    info = await wait_until_loaded(fresh)
    text = " ".join(m.message for m in fresh.messages)
    for key in ("'model'", "'completion.maxTokens'", "'completion.lineTokens'", "'languages'", "'typo'"):
        assert key in text
    assert info["settings"]["completion"]["max_tokens"] == 64
    assert info["settings"]["languages"] == []


def test_tcp_serves_on_loopback():
    port = free_port()
    server = subprocess.Popen(serve_command("--tcp", str(port)), env=SERVER_ENV, stderr=subprocess.DEVNULL)
    try:
        connection = connect_when_listening(port, server)
        with connection, connection.makefile("rb") as stream:
            connection.sendall(lsp_message({"id": 1, "method": "initialize", "params": {"capabilities": {}}}))
            answer = read_lsp_message(stream)
            assert answer["id"] == 1 and "inlineCompletionProvider" in answer["result"]["capabilities"]
            connection.sendall(lsp_message({"id": 2, "method": "shutdown"}) + lsp_message({"method": "exit"}))
            assert read_lsp_message(stream)["id"] == 2
        assert server.wait(timeout=WAIT) == 0
    finally:
        server.kill()


def test_tcp_port_must_be_valid():
    result = subprocess.run(serve_command("--tcp", "localhost:http"), env=SERVER_ENV, capture_output=True,
                            text=True, timeout=WAIT, check=False)
    assert result.returncode == 2 and "--tcp" in result.stderr
