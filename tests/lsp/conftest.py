"""Helpers for end-to-end tests of `diffill serve` with pytest-lsp.

Every test talks to the real server process over stdio, with the recorded capabilities of a real client. pytest-lsp
pitfalls this module works around: `wait_for_notification` never returns for a notification that has already
arrived (so notifications are collected into lists and awaited by index, always under a timeout), and fixture and
test event loops must share a scope (pyproject sets both to "module": one server per module and client).
"""

from __future__ import annotations

import asyncio
import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

import pytest
from lsprotocol import types
from pytest_lsp import LanguageClient, client_capabilities

from infill_engine import syntax

ROOT = Path(__file__).resolve().parents[2]
CLIENTS = ["neovim", "visual_studio_code"]
SERVER_ENV = {**os.environ, "PYTHONPATH": os.pathsep.join([str(ROOT), os.environ.get("PYTHONPATH", "")])}
STATUS = "diffill/status"
WAIT = 60  # seconds any single wait may take before the test fails (the machine may be busy)


def serve_command(*options: str, engine_mode: str | None = "inprocess") -> list[str]:
    """`diffill serve` as installed (the console script next to this interpreter), or through -m.

    The model loads in the server unless the test says otherwise (settings naming `engine.mode` win), so no test
    leaves a detached engine behind; `engine_mode=None` keeps the server's own default (`auto`).
    """
    script = Path(sys.executable).with_name("diffill")
    command = [str(script), "serve"] if script.exists() else [sys.executable, "-m", "diffill", "serve"]
    return command + (["--engine-mode", engine_mode] if engine_mode else []) + list(options)


def spec_with_every_field_set(directory: Path) -> Any:
    """A ModelSpec whose every field differs from the default (asserted: a new field must be given a value here), for
    tests that a spec survives a round trip (the engine's command line, the server's settings) whole."""
    import dataclasses

    from infill_engine.interface import ModelSpec

    defaults = ModelSpec()
    spec = ModelSpec(path=str(directory), family="diffill", device="cpu", dtype="float32", trust_remote_code=True,
                     factory="tests.lsp.fake_engine:build_engine", threads=3, dual_cache=5,
                     compiled_layers="off" if defaults.compiled_layers == "auto" else "auto")
    unset = [f.name for f in dataclasses.fields(ModelSpec) if getattr(spec, f.name) == getattr(defaults, f.name)]
    assert unset == [], f"give {unset} a value other than the default in spec_with_every_field_set"
    return spec


def plain(value: Any) -> Any:
    """JSON-like data as dicts and lists (pygls hands custom messages' params over as named tuples)."""
    if hasattr(value, "_asdict"):
        return {key: plain(item) for key, item in value._asdict().items()}
    if isinstance(value, dict):
        return {key: plain(item) for key, item in value.items()}
    if isinstance(value, (list, tuple)):
        return [plain(item) for item in value]
    return value


def field_of(value: Any, name: str) -> Any:
    """A field of a custom notification's or request's params."""
    return plain(value)[name]


async def start(client: LanguageClient, name: str, options: dict[str, Any] | None) -> types.InitializeResult:
    """Record what the server sends, and initialize it as the client `name` would."""
    client.statuses = []  # type: ignore[attr-defined]
    client.applied_edits = []  # type: ignore[attr-defined]

    @client.feature(STATUS)
    def on_status(ls: LanguageClient, params: Any) -> None:
        ls.statuses.append(plain(params))  # type: ignore[attr-defined]

    @client.feature(types.WORKSPACE_APPLY_EDIT)
    def on_apply_edit(ls: LanguageClient, params: types.ApplyWorkspaceEditParams) -> types.ApplyWorkspaceEditResult:
        ls.applied_edits.append(params.edit)  # type: ignore[attr-defined]
        return types.ApplyWorkspaceEditResult(applied=True)

    params = types.InitializeParams(
        capabilities=client_capabilities(name), initialization_options=options,
        root_uri=ROOT.as_uri(), workspace_folders=[types.WorkspaceFolder(uri=ROOT.as_uri(), name="main")],
    )
    return await asyncio.wait_for(client.initialize_session(params), WAIT)


async def debug_info(client: LanguageClient) -> Any:
    """The server's `diffill/debugInfo`."""
    return plain(await asyncio.wait_for(client.protocol.send_request_async("diffill/debugInfo", {}), WAIT))


async def wait_until_loaded(client: LanguageClient) -> Any:
    """Poll `diffill/debugInfo` until the model has loaded (or failed); its last answer."""
    for _ in range(WAIT * 20):
        info = await debug_info(client)
        if field_of(info, "state") not in ("starting", "loading"):
            return info
        await asyncio.sleep(0.05)
    raise AssertionError("the model did not load in time")


async def status_after(client: LanguageClient, count: int, method: str | None = None) -> Any:
    """The first `diffill/status` after the first `count` ones (of `method`, when given)."""
    for _ in range(WAIT * 100):
        recent = client.statuses[count:]  # type: ignore[attr-defined]
        later = [s for s in recent if method is None or field_of(s, "method") == method]
        if later:
            return later[0]
        await asyncio.sleep(0.01)
    raise AssertionError("no diffill/status notification arrived")


def open_document(client: LanguageClient, uri: str, text: str, language: str = "python", version: int = 1) -> None:
    client.text_document_did_open(types.DidOpenTextDocumentParams(
        text_document=types.TextDocumentItem(uri=uri, language_id=language, version=version, text=text)))


def change_document(client: LanguageClient, uri: str, text: str, version: int) -> None:
    client.text_document_did_change(types.DidChangeTextDocumentParams(
        text_document=types.VersionedTextDocumentIdentifier(uri=uri, version=version),
        content_changes=[types.TextDocumentContentChangeWholeDocument(text=text)]))


def close_document(client: LanguageClient, uri: str) -> None:
    client.text_document_did_close(types.DidCloseTextDocumentParams(types.TextDocumentIdentifier(uri=uri)))


async def inline(client: LanguageClient, uri: str, line: int, character: int,
                 invoked: bool = False) -> types.InlineCompletionList | None:
    """Ghost text at a position, as typing asks for it (or as a key that invokes it, with `invoked`)."""
    kind = types.InlineCompletionTriggerKind.Invoked if invoked else types.InlineCompletionTriggerKind.Automatic
    params = types.InlineCompletionParams(
        context=types.InlineCompletionContext(trigger_kind=kind),
        text_document=types.TextDocumentIdentifier(uri=uri), position=types.Position(line=line, character=character))
    return await asyncio.wait_for(client.text_document_inline_completion_async(params), WAIT)


async def complete(client: LanguageClient, uri: str, line: int, character: int) -> Any:
    params = types.CompletionParams(text_document=types.TextDocumentIdentifier(uri=uri),
                                    position=types.Position(line=line, character=character))
    return await asyncio.wait_for(client.text_document_completion_async(params), WAIT)


async def start_ready(client: LanguageClient, name: str, options: dict[str, Any] | None) -> None:
    """Initialize as the named client, remember the answer and the name, and wait until the model is ready."""
    client.init_result = await start(client, name, options)  # type: ignore[attr-defined]
    client.client_name = name  # type: ignore[attr-defined]
    info = await wait_until_loaded(client)
    assert field_of(info, "state") == "ready", field_of(info, "message")


def encoding(client: LanguageClient) -> str:
    """The position encoding the server chose for this client."""
    return encoding_of(client.init_result)  # type: ignore[attr-defined]


def encoding_of(result: types.InitializeResult) -> str:
    return str(result.capabilities.position_encoding or types.PositionEncodingKind.Utf16)


def offset_of(text: str, position: types.Position, encoding: str) -> int:
    """A test's own, independent conversion of an LSP position to a str offset (lines end with \\n here)."""
    lines = text.split("\n")
    start = sum(len(line) + 1 for line in lines[: position.line])
    units, index, line = 0, 0, lines[position.line]
    while index < len(line) and units < position.character:
        ch = line[index]
        if encoding == "utf-8":
            units += len(ch.encode("utf-8"))
        else:
            units += 2 if ord(ch) > 0xFFFF and encoding == "utf-16" else 1
        index += 1
    return start + index


def apply_text_edits(text: str, edits: list[types.TextEdit], encoding: str) -> str:
    """The text after the edits (applied back to front)."""
    spans = sorted(((offset_of(text, e.range.start, encoding), offset_of(text, e.range.end, encoding), e.new_text)
                    for e in edits), reverse=True)
    for start, end, new_text in spans:
        text = text[:start] + new_text + text[end:]
    return text


def apply_workspace_edit(text: str, uri: str, edit: types.WorkspaceEdit, encoding: str) -> str:
    """The document after a workspace edit of it (either form: changes or versioned documentChanges)."""
    edits: list[types.TextEdit] = []
    for change in edit.document_changes or []:
        assert isinstance(change, types.TextDocumentEdit) and change.text_document.uri == uri
        edits += change.edits  # type: ignore[arg-type]
    edits += (edit.changes or {}).get(uri, [])
    assert edits, "the workspace edit does not edit the document"
    return apply_text_edits(text, edits, encoding)


def problems(text: str, language: str = "python") -> list[syntax.SyntaxProblem]:
    return syntax.find_problems(text, language)


@pytest.fixture(scope="session")
def tiny_checkpoint(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A tiny random-weight checkpoint of the embedded model's architecture, saved like a real one."""
    from tests import tiny_models

    return tiny_models.build_diffill(tmp_path_factory.mktemp("lsp-model") / "diffill")


async def send_raw(client: LanguageClient, message: dict[str, Any]) -> Any:
    """Send a JSON-RPC request exactly as given, bypassing the client's typed serialization; its response.

    The response comes back to the future registered under the message's id (pygls' own bookkeeping).
    """
    import concurrent.futures
    import json

    future: concurrent.futures.Future[Any] = concurrent.futures.Future()
    client.protocol._request_futures[message["id"]] = future
    body = json.dumps({"jsonrpc": "2.0", **message}).encode("utf-8")
    client.protocol.writer.write(f"Content-Length: {len(body)}\r\n\r\n".encode() + body)  # type: ignore[union-attr]
    return await asyncio.wait_for(asyncio.wrap_future(future), WAIT)


def lsp_message(payload: dict[str, Any]) -> bytes:
    """A JSON-RPC message framed as LSP frames it (Content-Length header, then the body)."""
    body = json.dumps({"jsonrpc": "2.0", **payload}).encode()
    return f"Content-Length: {len(body)}\r\n\r\n".encode() + body


def read_lsp_message(stream: Any) -> dict[str, Any]:
    """The next framed message from a binary stream; ConnectionError when the server closed it."""
    length = 0
    while (line := stream.readline()) not in (b"\r\n", b""):
        if line.lower().startswith(b"content-length:"):
            length = int(line.split(b":")[1])
    if not length:
        raise ConnectionError("the server closed the connection")
    return json.loads(stream.read(length))


def free_port() -> int:
    """A loopback TCP port nobody listens on now."""
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def connect_when_listening(port: int, server: subprocess.Popen[bytes]) -> socket.socket:
    """A connection to `diffill serve --tcp PORT` once it listens (OSError when it exits or WAIT passes first)."""
    deadline = time.monotonic() + WAIT
    while True:
        try:
            return socket.create_connection(("127.0.0.1", port), timeout=WAIT)
        except OSError:
            if time.monotonic() > deadline or server.poll() is not None:
                raise
            time.sleep(0.1)
