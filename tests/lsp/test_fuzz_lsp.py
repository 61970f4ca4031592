"""Fuzzing `diffill serve` over stdio: random sessions of well-formed JSON-RPC with wrong, missing and huge params,
unknown methods, notifications for documents never opened, and changes with out-of-order versions.

One real server (a tiny random checkpoint) serves the whole module; each example is a short random session against
it, kept on the same server so that state left by one session meets the next. The client here is a plain JSON-RPC
one (not pytest-lsp's typed client) so that it can send anything. Properties: the server keeps answering; every
request gets exactly one answer, a result or a JSON-RPC error with a code and a message; every edit it returns
applies cleanly to the document version it names (ranges inside that text, never inside a character); a document
whose changes came out of order gets no suggestions or edits.
"""

from __future__ import annotations

import itertools
import json
import queue
import re
import subprocess
import threading
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, strategies as st
from pytest_lsp import client_capabilities

from lsp_server.conversion import unstructure
from tests.fuzzing import editor_text, examples
from tests.lsp.conftest import ROOT, SERVER_ENV, WAIT, serve_command

SETTINGS = {
    "model": {"threads": 1},
    "sampling": {"steps": 2},
    "completion": {"debounceMs": 0, "candidates": 1, "maxTokens": 6, "lineTokens": 4},
    "rewrite": {"maxTokens": 6, "candidates": 1},
    "diagnostics": {"debounceMs": 0},
    "context": {"otherDocuments": True},
}
INTERNAL_ERROR = -32603  # JSON-RPC's code for an exception that escaped a handler: a bug, never an answer to input
ENCODING = "utf-16"  # what the server chooses for VS Code's capabilities
_LINE = re.compile(r"[^\r\n]*(\r\n|\r|\n|$)")


class RawClient:
    """A JSON-RPC client over the server's stdin and stdout that sends any message and answers the server's own
    requests (configuration, progress, applyEdit) the way an editor would."""

    def __init__(self, process: subprocess.Popen[bytes]) -> None:
        self.process = process
        self.answers: dict[int | str, queue.Queue[dict[str, Any]]] = {}
        self.notifications: list[dict[str, Any]] = []
        self.applied: list[dict[str, Any]] = []  # workspace/applyEdit params the server sent
        self.asked: list[str] = []  # the methods of the server's requests, in order
        self.documents: dict[str, Document] = {}  # open documents, as the client sent them
        self.uncertain: set[str] = set()  # documents a spoilt message may or may not have opened, changed or closed
        self.ids = itertools.count(1)
        self.lock = threading.Lock()
        threading.Thread(target=self._read, daemon=True).start()

    def send(self, message: dict[str, Any]) -> None:
        body = json.dumps({"jsonrpc": "2.0", **message}).encode("utf-8")
        with self.lock:
            self.process.stdin.write(b"Content-Length: %d\r\n\r\n" % len(body) + body)  # type: ignore[union-attr]
            self.process.stdin.flush()  # type: ignore[union-attr]

    def request(self, method: str, params: Any) -> dict[str, Any]:
        """Send a request; its one answer (AssertionError when none comes in time)."""
        call_id = next(self.ids)
        box: queue.Queue[dict[str, Any]] = queue.Queue()
        self.answers[call_id] = box
        self.send({"id": call_id, "method": method, **({} if params is ... else {"params": params})})
        try:
            return box.get(timeout=WAIT)
        except queue.Empty:
            raise AssertionError(f"no answer to {method} within {WAIT} s (server alive: "
                                 f"{self.process.poll() is None})") from None

    def notify(self, method: str, params: Any) -> None:
        self.send({"method": method, **({} if params is ... else {"params": params})})

    def _read(self) -> None:
        stream = self.process.stdout
        while True:
            length = None
            while True:
                line = stream.readline()  # type: ignore[union-attr]
                if not line:
                    return
                if line in (b"\r\n", b"\n"):
                    break
                name, _, value = line.decode("ascii").partition(":")
                if name.strip().lower() == "content-length":
                    length = int(value)
            message = json.loads(stream.read(length))  # type: ignore[union-attr, arg-type]
            if "method" in message and "id" in message:
                self.send({"id": message["id"], "result": self._answer(message["method"], message.get("params"))})
            elif "method" in message:
                self.notifications.append(message)
            else:
                box = self.answers.get(message.get("id"))
                assert box is not None, f"an answer to no request: {message}"
                box.put(message)

    def _answer(self, method: str, params: Any) -> Any:
        self.asked.append(method)
        if method == "workspace/configuration":
            return [SETTINGS for _ in params["items"]]
        if method == "workspace/applyEdit":
            self.applied.append(params)
            return {"applied": True}
        return None


@dataclass
class Document:
    """What the client knows of an open document: its text at every version it sent."""

    text: str | None  # None when a change with a range outside the text made it unknown
    language: str
    newest: int  # the newest version the server has seen (as `note_version` keeps it)
    texts: dict[int, str | None] = field(default_factory=dict)
    out_of_order: bool = False


@pytest.fixture(scope="module")
def client(tiny_checkpoint: Path, tmp_path_factory: pytest.TempPathFactory):
    log = (tmp_path_factory.mktemp("fuzz-lsp") / "server.log").open("wb")
    process = subprocess.Popen(serve_command(), stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=log,
                               env=SERVER_ENV, cwd=ROOT)
    raw = RawClient(process)
    capabilities = unstructure(client_capabilities("visual_studio_code"))
    SETTINGS["model"] = {**SETTINGS["model"], "path": str(tiny_checkpoint)}  # what the client answers from now on
    settings = SETTINGS
    answer = raw.request("initialize", {"processId": None, "rootUri": ROOT.as_uri(), "capabilities": capabilities,
                                        "initializationOptions": settings})
    assert answer["result"]["capabilities"]["positionEncoding"] == ENCODING
    raw.notify("initialized", {})
    for _ in range(WAIT * 10):
        state = raw.request("diffill/debugInfo", {})["result"]["state"]
        if state not in ("starting", "loading"):
            break
        threading.Event().wait(0.1)
    assert state == "ready"
    yield raw
    raw.request("shutdown", ...)
    raw.notify("exit", ...)
    process.wait(timeout=WAIT)
    log.close()


# ------------------------------------------------------------------------------------------ the text, independently


def lines_of(text: str) -> list[str]:
    """Line contents, split at \\r\\n, \\r and \\n as the specification says."""
    found = []
    for match in _LINE.finditer(text):
        found.append(match.group().rstrip("\r\n"))
        if not match.group(1):
            break
    return found


def offset_of(text: str, position: dict[str, int]) -> int:
    """The offset of a position that must be valid: its line in the text, its character inside the line and not
    inside a surrogate pair (an AssertionError otherwise)."""
    lines = lines_of(text)
    line, character = position["line"], position["character"]
    assert 0 <= line < len(lines), f"line {line} of a text of {len(lines)} lines"
    start = 0
    for match, _ in zip(_LINE.finditer(text), range(line)):
        start = match.end()
    units = 0
    for index, ch in enumerate(lines[line]):
        if units == character:
            return start + index
        units += 2 if ord(ch) > 0xFFFF else 1
        assert units <= character, "the position is inside a surrogate pair"
    assert units == character, f"character {character} of a line of {units} units"
    return start + len(lines[line])


def applied(text: str, edits: list[dict[str, Any]]) -> str:
    """The text after LSP text edits, each range checked."""
    spans = []
    for edit in edits:
        start, end = offset_of(text, edit["range"]["start"]), offset_of(text, edit["range"]["end"])
        assert start <= end, f"a range that ends before it starts: {edit['range']}"
        spans.append((start, end, edit["newText"]))
    for start, end, new_text in sorted(spans, reverse=True):
        text = text[:start] + new_text + text[end:]
    return text


def check_workspace_edit(client: RawClient, edit: dict[str, Any] | None) -> None:
    """Every edit of a document applies cleanly to the version it names (or to the current text, unversioned)."""
    if not edit:
        return
    for change in edit.get("documentChanges") or []:
        uri, version = change["textDocument"]["uri"], change["textDocument"]["version"]
        if uri in client.uncertain:
            continue
        document = client.documents.get(uri)
        assert document is not None, f"an edit of {uri}, which is not open"
        assert version in document.texts, f"an edit of version {version} of {uri}, which the client never sent"
        assert not document.out_of_order, "an edit of a document whose changes came out of order"
        if document.texts[version] is not None:
            applied(document.texts[version], change["edits"])
    for uri, edits in (edit.get("changes") or {}).items():
        if uri in client.uncertain:
            continue
        document = client.documents.get(uri)
        assert document is not None and not document.out_of_order
        if document.text is not None:
            applied(document.text, edits)


# ------------------------------------------------------------------------------------------ sessions

URIS = st.sampled_from(["file:///fuzz/a.py", "file:///fuzz/b.ts", "file:///fuzz/c.txt", "file:///fuzz/d%20e.rs",
                        "untitled:Untitled-1"]) | st.text(max_size=12).map(lambda s: "file:///fuzz/" + s)
LANGUAGES = st.sampled_from(["python", "typescript", "plaintext", "rust", "json", "lua", "", "klingon"])
HUGE = st.sampled_from([2**31, 2**53 + 1, 2**64, -(2**63), 10**30, 1e308, -1, "x" * 200_000, [0] * 5_000,
                        {"a" * 1000: None}])
JUNK = st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=20) | HUGE | \
    st.lists(st.integers(), max_size=3) | st.dictionaries(st.text(max_size=6), st.integers(), max_size=3)


def positions(document: Document | None) -> st.SearchStrategy[dict[str, int]]:
    lines = lines_of(document.text) if document and document.text is not None else [""]
    return st.builds(lambda line, character: {"line": line, "character": character},
                     st.integers(0, len(lines) + 1), st.integers(0, max(len(line) for line in lines) + 3))


@st.composite
def spoiled(draw: st.DrawFn, params: dict[str, Any]) -> Any:
    """Params as they are, or with a field removed, replaced by junk, or the whole params replaced by junk."""
    how = draw(st.sampled_from(["as is", "as is", "drop", "junk", "nested junk", "whole"]))
    if how == "as is":
        return params
    if how == "whole":
        return draw(JUNK | st.just(...))
    spoilt = json.loads(json.dumps(params))
    target = spoilt
    for _ in range(draw(st.integers(0, 2))):  # go down into a nested object now and then
        nested = [k for k, v in target.items() if isinstance(v, dict) and v]
        if not nested:
            break
        target = target[draw(st.sampled_from(sorted(nested)))]
    key = draw(st.sampled_from(sorted(target)))
    if how == "drop":
        del target[key]
    else:
        target[key] = draw(JUNK)
    return spoilt


def run_step(client: RawClient, data: st.DataObject) -> None:
    """Draw one message, send it, and check its answer."""
    documents = client.documents
    opened = sorted(documents)
    uri = data.draw(st.sampled_from(opened) | URIS if opened else URIS)
    document = documents.get(uri)
    kind = data.draw(st.sampled_from(["open", "change", "change", "close", "inline", "inline", "completion",
                                      "action", "resolve", "command", "unknown", "notification", "cancel"]))
    identifier = {"uri": uri}
    if kind == "open":
        text = data.draw(editor_text | st.sampled_from(["def f(x):\n    return (x\n", "let a = [1, 2;\n", "😀\r\n"]))
        version = data.draw(st.integers(-5, 2**31 - 1))
        language = data.draw(LANGUAGES)
        params = {"textDocument": {**identifier, "languageId": language, "version": version, "text": text}}
        sent = data.draw(spoiled(params))
        client.notify("textDocument/didOpen", sent)
        if sent is params:
            documents[uri] = Document(text, language, version, {version: text})
            client.uncertain.discard(uri)
        else:
            client.uncertain.add(uri)
    elif kind == "change":
        version = data.draw(st.integers(-5, 2**31 - 1) | st.just(min(document.newest + 1, 2**31 - 1) if document else 1))
        whole = data.draw(st.booleans())
        new_text = data.draw(editor_text)
        if whole:
            changes: list[dict[str, Any]] = [{"text": new_text}]
        else:
            changes = [{"range": {"start": data.draw(positions(document)), "end": data.draw(positions(document))},
                        "text": new_text}]
        params = {"textDocument": {**identifier, "version": version}, "contentChanges": changes}
        sent = data.draw(spoiled(params))
        client.notify("textDocument/didChange", sent)
        if sent is params and document is not None:
            _note_change(document, version, whole, changes[0])
        elif sent is not params:
            client.uncertain.add(uri)
    elif kind == "close":
        params = {"textDocument": identifier}
        sent = data.draw(spoiled(params))
        client.notify("textDocument/didClose", sent)
        documents.pop(uri, None)
        if sent is not params:  # a close the server could not read may leave it open
            client.uncertain.add(uri)
    elif kind in ("inline", "completion"):
        method = "textDocument/inlineCompletion" if kind == "inline" else "textDocument/completion"
        params = {"textDocument": identifier, "position": data.draw(positions(document))}
        if kind == "inline":
            params["context"] = {"triggerKind": data.draw(st.sampled_from([1, 2]))}
        sent = data.draw(spoiled(params))
        answer = answered(client, method, sent)
        if sent is params and answer.get("result") and uri not in client.uncertain:
            _check_suggestions(document, answer["result"])
    elif kind == "action":
        start, end = data.draw(positions(document)), data.draw(positions(document))
        params = {"textDocument": identifier, "range": {"start": start, "end": end},
                  "context": {"diagnostics": [], "only": data.draw(st.sampled_from([None, ["refactor.rewrite"]]))}}
        if params["context"]["only"] is None:
            del params["context"]["only"]
        resolve = data.draw(st.booleans())  # drawn before the answer: what is drawn never depends on the server
        answer = answered(client, "textDocument/codeAction", data.draw(spoiled(params)))
        for action in answer.get("result") or []:
            check_workspace_edit(client, action.get("edit"))
            if action.get("data") is not None and resolve:
                resolved = answered(client, "codeAction/resolve", action)
                if isinstance(resolved.get("result"), dict):
                    check_workspace_edit(client, resolved["result"].get("edit"))
    elif kind == "resolve":  # a code action of ours as a client could send it back, spoilt
        action = {"title": "Rewrite selection (diffill)", "kind": "refactor.rewrite",
                  "data": {"diffill": "rewrite", "uri": uri, "version": document.newest if document else 1,
                           "range": {"start": data.draw(positions(document)), "end": data.draw(positions(document))},
                           "instruction": None}}
        resolved = answered(client, "codeAction/resolve", data.draw(spoiled(action)))
        if isinstance(resolved.get("result"), dict):
            check_workspace_edit(client, resolved["result"].get("edit"))
    elif kind == "command":
        command = data.draw(st.sampled_from(["diffill.rewrite", "diffill.refine", "diffill.fill", "diffill.nothing"]))
        range_ = {"start": data.draw(positions(document)), "end": data.draw(positions(document))}
        arguments = data.draw(st.sampled_from([[uri, range_], [uri, range_, "make it shorter"], [uri], [], [range_]])
                              | st.lists(JUNK, max_size=3))
        answer = answered(client, "workspace/executeCommand", data.draw(spoiled({"command": command,
                                                                                 "arguments": arguments})))
        if isinstance(answer.get("result"), dict):
            check_workspace_edit(client, answer["result"])
        for params in client.applied:  # sent before the answer, so already read
            check_workspace_edit(client, params["edit"])
        client.applied.clear()
    elif kind == "unknown":
        method = data.draw(st.sampled_from(["textDocument/hover", "diffill/nothing", "$/unknown", "", "initialize"])
                           | st.text(max_size=20))
        answered(client, method, data.draw(JUNK | st.just(...)))
    elif kind == "notification":
        method = data.draw(st.sampled_from(["$/setTrace", "$/unknown", "workspace/didChangeConfiguration",
                                            "textDocument/didSave", "initialized", "exit-not"]) | st.text(max_size=20))
        params = data.draw(JUNK | st.just(...))
        if method == "workspace/didChangeConfiguration" and data.draw(st.booleans()):
            # settings with junk in one section (the model stays: a reload would make the next session slow)
            section = data.draw(st.sampled_from(["completion", "rewrite", "context", "diagnostics", "languages"]))
            params = {"settings": {**SETTINGS, section: data.draw(JUNK)}}
        client.notify(method, params)
    else:
        client.notify("$/cancelRequest", {"id": data.draw(st.integers(0, 50) | JUNK)})


def _note_change(document: Document, version: int, whole: bool, change: dict[str, Any]) -> None:
    """Mirror the change on the client's copy, and the server's rule for versions out of order."""
    if whole:
        document.text = change["text"]
    elif document.text is not None:
        try:
            document.text = applied(document.text, [{"range": change["range"], "newText": change["text"]}])
        except AssertionError:  # a range outside the text: what the server makes of it is its own business
            document.text = None
    if version <= document.newest:
        document.out_of_order = True
    else:
        document.newest = version
        document.out_of_order = document.out_of_order and not whole
    document.texts[version] = document.text


def _check_suggestions(document: Document | None, result: Any) -> None:
    """Suggestions only for open documents in order, each range inside the current text."""
    assert document is not None, f"suggestions for a document that is not open: {result}"
    assert not document.out_of_order, "suggestions for a document whose changes came out of order"
    items = result["items"] if isinstance(result, dict) else result
    for item in items:
        edit = item.get("textEdit") or ({"range": item["range"], "newText": item["insertText"]}
                                        if "range" in item else None)
        if edit is not None and document.text is not None:
            applied(document.text, [edit])


def answered(client: RawClient, method: str, params: Any) -> dict[str, Any]:
    """The request's answer, which must be exactly one of a result and an error with a code and a message."""
    answer = client.request(method, params)
    assert ("result" in answer) != ("error" in answer), answer
    if "error" in answer:
        assert isinstance(answer["error"]["code"], int) and isinstance(answer["error"]["message"], str), answer
        assert answer["error"]["code"] != INTERNAL_ERROR, f"{method} raised: {answer['error']['message'][:2000]}"
    return answer


@examples(25)
@given(data=st.data())
def test_random_sessions_are_answered_and_only_clean_edits_come_back(client, data):
    for uri in sorted({*client.documents, *client.uncertain}):  # each session starts with nothing open
        client.notify("textDocument/didClose", {"textDocument": {"uri": uri}})
    client.notify("workspace/didChangeConfiguration", {"settings": SETTINGS})  # and the module's settings
    client.documents.clear()
    client.uncertain.clear()
    uri, text = data.draw(URIS), data.draw(editor_text)  # one document open from the start, then anything
    client.notify("textDocument/didOpen", {"textDocument": {"uri": uri, "languageId": "python", "version": 1,
                                                            "text": text}})
    client.documents[uri] = Document(text, "python", 1, {1: text})
    for _ in range(data.draw(st.integers(1, 10))):
        run_step(client, data)
    info = answered(client, "diffill/debugInfo", {})  # still serving
    assert info["result"]["state"] == "ready"


def test_a_code_action_sent_back_with_a_broken_range_comes_back_without_an_edit(client):
    """Found by the fuzzer: the range's structuring error escaped `codeAction/resolve` as an internal error."""
    uri = "file:///fuzz/regression.py"
    client.notify("textDocument/didOpen", {"textDocument": {"uri": uri, "languageId": "python", "version": 1,
                                                            "text": "x = (1 +\n"}})
    for broken in ({"start": "", "end": {"line": 0, "character": 3}}, [0] * 50, None):
        action = {"title": "Rewrite selection (diffill)", "kind": "refactor.rewrite",
                  "data": {"diffill": "rewrite", "uri": uri, "version": 1, "range": broken, "instruction": None}}
        assert answered(client, "codeAction/resolve", action)["result"] == action
    action["data"] = {**action["data"], "range": {"start": {"line": 0, "character": 0},
                                                  "end": {"line": 0, "character": 3}}, "instruction": 7}
    assert answered(client, "codeAction/resolve", action)["result"] == action  # an instruction that is not text
    client.notify("textDocument/didClose", {"textDocument": {"uri": uri}})


def test_a_second_initialized_notification_does_not_reload_the_model(client):
    """Found by the fuzzer: `initialized` sent again reloaded the model, cancelling every running request."""
    asked = len(client.asked)
    client.notify("initialized", {})
    answered(client, "diffill/debugInfo", {})  # a reload would have asked for its progress token before this answer
    assert "window/workDoneProgress/create" not in client.asked[asked:]
    assert answered(client, "diffill/debugInfo", {})["result"]["state"] == "ready"
