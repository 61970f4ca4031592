"""Security of a running `diffill serve`: it reads no file of the workspace (context comes from the open documents
only), and over TCP, which any local user can reach, a client cannot turn on a checkpoint's own code.

docs/SECURITY.md names the test of each mitigation.
"""

from __future__ import annotations

import asyncio
import shutil
import socket
import subprocess
import sys
import time

import pytest
from lsprotocol import types
from pytest_lsp import LanguageClient, client_capabilities

from tests.lsp.conftest import (
    SERVER_ENV,
    WAIT,
    connect_when_listening,
    complete,
    field_of,
    free_port,
    inline,
    lsp_message,
    open_document,
    read_lsp_message,
    serve_command,
    wait_until_loaded,
)
from tests.service.conftest import FACTORY

ADD = "def add(a, b):\n    return \n"

# `diffill serve` with an audit hook that writes every path the process opens or lists to a log (one a line).
AUDITED_SERVE = """
import os, sys
log = os.open(sys.argv[1], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
def record(event, args):
    if event in ("open", "os.listdir", "os.scandir", "glob.glob", "os.walk") and args \\
            and isinstance(args[0], (str, bytes, os.PathLike)):
        os.write(log, os.fsencode(os.path.abspath(os.fsdecode(args[0]))) + b"\\n")
sys.addaudithook(record)
from diffill.cli import main
sys.exit(main(["serve", "--engine-factory", sys.argv[2]]))
"""


@pytest.mark.asyncio
async def test_no_file_of_the_workspace_is_read_only_the_open_documents(tmp_path):
    project = tmp_path / "project"
    project.mkdir()
    (project / "secrets.py").write_text("API_KEY = 'do-not-read'\ndef add_key(a, b):\n    return a + b\n")
    (project / "main.py").write_text(ADD)  # on disk too: the server must use what the editor sent, not the file
    (project / ".env").write_text("TOKEN=do-not-read\n")
    log = tmp_path / "opened.log"
    client = LanguageClient()
    await client.start_io(sys.executable, "-c", AUDITED_SERVE, str(log), FACTORY, env=SERVER_ENV)
    try:
        params = types.InitializeParams(
            capabilities=client_capabilities("visual_studio_code"), root_uri=project.as_uri(),
            workspace_folders=[types.WorkspaceFolder(uri=project.as_uri(), name="project")],
            initialization_options={"completion": {"debounceMs": 0}, "diagnostics": {"debounceMs": 0},
                                    "engine": {"mode": "inprocess"}},  # the model's reads are audited too
        )
        await asyncio.wait_for(client.initialize_session(params), WAIT)
        assert field_of(await wait_until_loaded(client), "state") == "ready"
        main, other = (project / "main.py").as_uri(), (project / "other.py").as_uri()
        open_document(client, other, "def add_numbers(a, b):\n    return a + b\n")  # open: may be context
        open_document(client, main, ADD)
        assert await inline(client, main, 1, 11) is not None
        await complete(client, main, 1, 11)
        selection = types.Range(start=types.Position(line=1, character=4), end=types.Position(line=1, character=10))
        await asyncio.wait_for(client.text_document_code_action_async(types.CodeActionParams(
            text_document=types.TextDocumentIdentifier(uri=main), range=selection,
            context=types.CodeActionContext(diagnostics=[]))), WAIT)
        await asyncio.sleep(0.5)  # the diagnostics of both documents
    finally:
        await asyncio.wait_for(client.shutdown_session(), WAIT)
    opened = log.read_text().splitlines()
    assert any("fake_engine" in path for path in opened), "the audit log recorded nothing useful"
    assert [path for path in opened if path.startswith(str(project))] == []


def test_over_tcp_a_client_cannot_turn_on_a_checkpoints_own_code(model_dirs, tmp_path):
    marker = tmp_path / "imported"
    remote = tmp_path / "remote"
    shutil.copytree(model_dirs["dream"], remote)
    with open(remote / "modeling_tiny_masked.py", "a", encoding="utf-8") as module:
        module.write(f"\nimport pathlib\npathlib.Path({str(marker)!r}).touch()\n")
    port = free_port()
    server = subprocess.Popen(serve_command("--tcp", str(port)), env=SERVER_ENV, stderr=subprocess.DEVNULL)
    try:
        connection = connect_when_listening(port, server)
        deadline = time.monotonic() + WAIT
        with connection, connection.makefile("rb") as stream:
            options = {"model": {"path": str(remote), "trustRemoteCode": True}}
            connection.sendall(lsp_message({"id": 1, "method": "initialize",
                                            "params": {"capabilities": {}, "initializationOptions": options}}))
            connection.sendall(lsp_message({"method": "initialized", "params": {}}))
            shown, state, ask = [], None, 2
            connection.sendall(lsp_message({"id": ask, "method": "diffill/debugInfo", "params": {}}))
            while time.monotonic() < deadline:
                message = read_lsp_message(stream)
                if message.get("method") == "window/showMessage":
                    shown.append(message["params"]["message"])
                elif message.get("id") == ask and "result" in message:
                    state = message["result"]
                    if state["state"] not in ("starting", "loading"):
                        break
                    time.sleep(0.1)
                    ask += 1
                    connection.sendall(lsp_message({"id": ask, "method": "diffill/debugInfo", "params": {}}))
            assert any("trustRemoteCode is refused over TCP" in m for m in shown), shown
            assert state is not None and state["state"] == "failed", state
            assert "ships its own modelling code" in state["message"]
            assert state["settings"]["model"]["trust_remote_code"] is False
            connection.sendall(lsp_message({"id": 999, "method": "shutdown"}) + lsp_message({"method": "exit"}))
        server.wait(timeout=WAIT)
    finally:
        server.kill()
    assert not marker.exists()


@pytest.mark.asyncio
async def test_a_document_over_the_size_limit_is_served_nothing_and_the_user_is_told():
    from lsp_server.server import MAX_DOCUMENT_CHARS
    from tests.lsp.conftest import change_document, start_ready

    client = LanguageClient()
    await client.start_io(*serve_command("--engine-factory", FACTORY), env=SERVER_ENV)
    try:
        shown: list[str] = []
        client.feature(types.WINDOW_SHOW_MESSAGE)(lambda ls, params: shown.append(params.message))
        await start_ready(client, "neovim", {"completion": {"debounceMs": 0}, "diagnostics": {"debounceMs": 0},
                                             "engine": {"mode": "inprocess"}})
        huge = "file:///limits/huge.py"
        filler = "# " + "x" * 61 + "\n"
        open_document(client, huge, filler * (MAX_DOCUMENT_CHARS // len(filler) + 1) + ADD)
        lines = MAX_DOCUMENT_CHARS // len(filler) + 1
        assert await inline(client, huge, lines + 1, 11) is None
        for _ in range(WAIT * 20):
            if shown:
                break
            await asyncio.sleep(0.05)
        assert any("over the limit of 16,777,216" in m for m in shown), shown
        small = "file:///limits/small.py"
        open_document(client, small, ADD)
        assert [i.insert_text for i in (await inline(client, small, 1, 11)).items][0] == "a + b"
        change_document(client, huge, ADD, 2)  # cut down to size: served again
        assert [i.insert_text for i in (await inline(client, huge, 1, 11)).items][0] == "a + b"
    finally:
        await asyncio.wait_for(client.shutdown_session(), WAIT)


def test_one_client_cannot_queue_more_than_its_share_of_the_engine(tmp_path):
    import msgpack
    import struct

    from infill_engine.request import InfillRequest
    from infill_engine.service import wire
    from infill_engine.service.api import EngineClient
    from infill_engine.service.server import ServiceLimits
    from tests.service.conftest import start_engine, stop

    runtime = tmp_path / "run"
    runtime.mkdir(mode=0o700)
    path = runtime / "engine.sock"
    process = start_engine(runtime, path)
    try:
        def frame(message) -> bytes:
            body = msgpack.packb(message, use_bin_type=True)
            return struct.pack(">I", len(body)) + body

        slow = wire.request_to_wire(InfillRequest(prefix="slow = ", suffix="\n", language="python", max_tokens=24))
        greedy = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        greedy.settimeout(WAIT)
        greedy.connect(str(path))
        flood = 3 * ServiceLimits().max_queued  # one client asks for three times what it may queue
        greedy.sendall(frame([0, 1, "hello", {"protocol": 1}]) + b"".join(
            frame([0, 2 + n, "fill", {"request": slow, "document": f"doc{n}"}]) for n in range(flood)))
        refused, data = 0, b""
        while refused < flood - ServiceLimits().max_queued - 1:  # all but the queue and the running one
            data += greedy.recv(65536)
            while len(data) >= 4 and len(data) >= 4 + struct.unpack(">I", data[:4])[0]:
                size = struct.unpack(">I", data[:4])[0]
                message, data = msgpack.unpackb(data[4 : 4 + size]), data[4 + size :]
                if message[0] == 1 and message[2] is not None:
                    assert message[2]["type"] == "QueueFull" and "limit" in message[2]["message"]
                    refused += 1
        other = EngineClient.connect(str(path))  # another client still gets its turn: round robin, not FIFO
        assert other.fill(InfillRequest(prefix="def add(a, b):\n    return ", suffix="\n", language="python",
                                        max_tokens=16)).text == "a + b"
        assert other.status()["queued"] > 0  # served while the greedy client's backlog still waits
        other.close()
        greedy.close()
    finally:
        stop(process)
