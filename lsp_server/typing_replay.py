"""Typing replays: a file typed into `diffill serve` key by key, the way an editor sends it, with every answer timed.

Each key is sent as VS Code sends it: an incremental `textDocument/didChange`, then `$/cancelRequest` for the
inline-completion request still waiting, then a new `textDocument/inlineCompletion` (triggerKind Automatic) at the
cursor. A newline and the indentation after it are one key (editors indent by themselves). Keys come at a steady pace
(`rate` per second), with an optional pause after each line (`line_pause`, a typist's thinking time).

Ghost text is what an editor would show: the answer to the latest key's request, when it has items and arrives
before the next key; or, while the user types what the ghost text shows, its remainder (typing ahead). A key that
types the start of the ghost text on screen is an accepted character: the user could have pressed Tab instead.

The servers run under a private `$XDG_RUNTIME_DIR`, so a shared engine (the default `engine.mode` `auto`) is started
afresh by the first server, is counted as its child, and is stopped at the end: a replay leaves no process behind.
"""

from __future__ import annotations

import asyncio
import contextlib
import hashlib
import importlib.metadata
import importlib.util
import os
import signal
import sys
import tempfile
import time
from collections.abc import AsyncIterator, Callable, Iterable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from lsp_server import process_usage
from lsp_server.stdio_client import Pending, StdioClient

DEFAULT_RATE = 20.0  # keys per second (a fast human typist)
DEFAULT_SOURCE = ("pygls", "pygls.workspace.text_document")  # a dependency not in the training corpus (README)
DEFAULT_START_LINE = 41  # the parameters of `TextDocument.__init__`, then its body: code to write
READY_TIMEOUT = 300.0  # seconds for a server to answer `initialize` and load its model
ANSWER_TIMEOUT = 120.0  # seconds the replay waits, after the last key, for every request's answer
STATUS = "diffill/status"
CAPABILITIES: dict[str, Any] = {  # what the replay client supports: plain text sync and inline completion
    "general": {"positionEncodings": ["utf-16"]},
    "textDocument": {"synchronization": {"dynamicRegistration": False},
                     "inlineCompletion": {"dynamicRegistration": False}},
    "window": {"workDoneProgress": False},
    "workspace": {"configuration": False},
}


@dataclass(frozen=True)
class Keystroke:
    """One key: text typed at the cursor, or characters deleted before it."""

    insert: str = ""
    delete: int = 0  # backspaces
    pause: float = 0.0  # seconds the typist waits before this key, beyond the pace
    reopen: bool = False  # close the document and open it afresh (as typed from the start) before this key


@dataclass(frozen=True)
class Source:
    """A stretch of a real file to type: the document starts as head + tail, and `typed` goes between them."""

    path: Path
    origin: str  # e.g. "pygls 2.1.1: pygls/workspace/text_document.py"
    sha256: str
    head: str
    typed: str
    tail: str
    start_line: int  # 1-based line where typing starts


def default_source() -> Path:
    """The installed file of DEFAULT_SOURCE (pygls is a dependency of diffill, so every install has it)."""
    spec = importlib.util.find_spec(DEFAULT_SOURCE[1])
    if spec is None or spec.origin is None:
        raise ValueError(f"{DEFAULT_SOURCE[1]} is not installed; name a file with --file")
    return Path(spec.origin)


def source_stretch(path: Path, start_line: int, chars: int) -> Source:
    """Up to `chars` characters of `path` from the start of line `start_line` (1-based), cut back to the last line
    end among them, so that the rest of the file goes on from the next line, as when new code is typed between
    lines (were it cut mid-line, the rest of that line would sit glued to the cursor at every key); a stretch
    with no line end in it is cut at `chars`."""
    try:
        text = path.read_text(encoding="utf-8")
    except (OSError, UnicodeDecodeError) as error:
        raise ValueError(f"cannot read {path} as UTF-8 text: {error}") from None
    lines = text.splitlines(keepends=True)
    if not 1 <= start_line <= len(lines):
        raise ValueError(f"--start-line must be from 1 to {len(lines)} for {path} (got {start_line})")
    if chars < 1:
        raise ValueError(f"--chars must be at least 1 (got {chars})")
    start = sum(len(line) for line in lines[: start_line - 1])
    end = min(len(text), start + chars)
    if end < len(text) and text[end] != "\n":
        line_end = text.rfind("\n", start, end)
        end = line_end if line_end > start else end
    return Source(path, origin_of(path), hashlib.sha256(text.encode("utf-8")).hexdigest()[:16],
                  text[:start], text[start:end], text[end:], start_line)


def origin_of(path: Path) -> str:
    """The installed distribution a file belongs to, with its version, or the path itself."""
    resolved = path.resolve()
    for parent in resolved.parents:
        if parent.name in ("site-packages", "dist-packages"):
            top = resolved.relative_to(parent).parts[0]
            with contextlib.suppress(importlib.metadata.PackageNotFoundError):
                return f"{top} {importlib.metadata.version(top)}: {resolved.relative_to(parent)}"
            return str(resolved.relative_to(parent))
    return str(path)


def typing_keys(text: str, line_pause: float = 0.0) -> list[Keystroke]:
    """The keys that type `text`: one per character, a newline with the indentation after it as one key."""
    keys: list[Keystroke] = []
    index, pause = 0, 0.0
    while index < len(text):
        end = index + 1
        if text[index] == "\n":
            while end < len(text) and text[end] in " \t":
                end += 1
        keys.append(Keystroke(insert=text[index:end], pause=pause))
        pause = line_pause if text[index] == "\n" else 0.0
        index = end
    return keys


def with_typos(keys: Sequence[Keystroke], every: int) -> list[Keystroke]:
    """`keys` with a typo taken back before every `every`-th key that types text: the typist first hits the key
    after it (or "#" where that is the same key or a line break), sees it, and deletes it with a backspace."""
    if every < 1:
        raise ValueError(f"a typo every N keys needs N >= 1 (got {every})")
    typed: list[Keystroke] = []
    for index, key in enumerate(keys):
        if index % every == every - 1 and key.insert and key.insert[0] != "\n":
            after = keys[index + 1].insert[:1] if index + 1 < len(keys) else ""
            wrong = after if after and after not in ("\n", key.insert[0]) else "#"
            typed += [Keystroke(insert=wrong, pause=key.pause, reopen=key.reopen), Keystroke(delete=1)]
            key = Keystroke(insert=key.insert)
        typed.append(key)
    return typed


def load_keys(text: str, count: int, backspace_every: int = 23) -> list[Keystroke]:
    """`count` keys of fast typing over `text`: now and then a typo taken back (`with_typos`), and when the text
    runs out the document is closed and typed again from the start."""
    plain = typing_keys(text)
    if not plain:
        raise ValueError("nothing to type")
    cycled: list[Keystroke] = []
    while len(cycled) < count:
        cycled += [Keystroke(insert=plain[0].insert, reopen=bool(cycled)), *plain[1:]]
    return with_typos(cycled, backspace_every)[:count]


class Document:
    """The document as the editor holds it: text, cursor and version; each key becomes an incremental change."""

    def __init__(self, uri: str, head: str, tail: str) -> None:
        self.uri, self.head, self.tail = uri, head, tail
        self.text = head + tail
        self.cursor = len(head)
        self.version = 1

    def position(self, offset: int) -> dict[str, int]:
        """An LSP position (UTF-16 code units) of a str offset."""
        line_start = self.text.rfind("\n", 0, offset) + 1
        return {"line": self.text.count("\n", 0, offset),
                "character": len(self.text[line_start:offset].encode("utf-16-le")) // 2}

    def change(self, key: Keystroke) -> dict[str, Any]:
        """Apply a key; the `didChange` params that say what it did."""
        start = max(0, self.cursor - key.delete)
        where = {"start": self.position(start), "end": self.position(self.cursor)}
        self.text = self.text[:start] + key.insert + self.text[self.cursor:]
        self.cursor = start + len(key.insert)
        self.version += 1
        return {"textDocument": {"uri": self.uri, "version": self.version},
                "contentChanges": [{"range": where, "text": key.insert}]}

    def opened(self) -> dict[str, Any]:
        """The `didOpen` params."""
        return {"textDocument": {"uri": self.uri, "languageId": "python", "version": self.version, "text": self.text}}


@dataclass
class KeyRecord:
    """One key and the inline-completion request it sent."""

    session: int
    typed_at: float  # time.perf_counter() just before the change was sent
    request: Pending
    insert: str
    line_before: str = ""  # the cursor's line before it, once the key was typed
    answer: str = ""  # "items", "empty" (a null or empty result), "cancelled" (RequestCancelled), "error"
    ghost_text: str = ""  # the first item's text, when there were items
    error: str = ""


@dataclass
class Server:
    """A `diffill serve` process of a replay, and what it sent besides answers."""

    client: StdioClient
    statuses: list[dict[str, Any]] = field(default_factory=list)
    info: dict[str, Any] = field(default_factory=dict)  # its diffill/debugInfo once ready
    initialize_ms: float = 0.0  # from spawning the process to the answer to `initialize`
    ready_ms: float = 0.0  # from spawning the process to its model being ready (what the first ghost text waits for)


class Session:
    """One document typed into one server."""

    def __init__(self, number: int, server: Server, source: Source) -> None:
        self.number, self.server, self.source = number, server, source
        self.opened = 0
        self.document = self._open()
        self.pending: Pending | None = None

    def _open(self) -> Document:
        self.opened += 1
        uri = Path(tempfile.gettempdir(), f"diffill-replay-{self.number}-{self.opened}.py").as_uri()
        document = Document(uri, self.source.head, self.source.tail)
        self.server.client.notify("textDocument/didOpen", document.opened())
        return document

    def press(self, key: Keystroke) -> KeyRecord:
        """Send a key as an editor does: (reopen,) change, cancel the waiting request, ask for ghost text."""
        client = self.server.client
        typed_at = time.perf_counter()
        if key.reopen:
            client.notify("textDocument/didClose", {"textDocument": {"uri": self.document.uri}})
            self.document = self._open()
        client.notify("textDocument/didChange", self.document.change(key))
        if self.pending is not None:
            client.cancel(self.pending)
        self.pending = client.request("textDocument/inlineCompletion", {
            "textDocument": {"uri": self.document.uri}, "position": self.document.position(self.document.cursor),
            "context": {"triggerKind": 2}})  # InlineCompletionTriggerKind.Automatic
        text, cursor = self.document.text, self.document.cursor
        line_before = text[text.rfind("\n", 0, cursor) + 1 : cursor]
        record = KeyRecord(self.number, typed_at, self.pending, key.insert, line_before)
        self.pending.future.add_done_callback(lambda future: _note_answer(record, future))
        return record


def _note_answer(record: KeyRecord, future: asyncio.Future[dict[str, Any]]) -> None:
    if future.cancelled() or future.exception() is not None:
        record.answer, record.error = "error", "no answer (the server closed its output)"
        return
    message = future.result()
    if "error" in message:
        cancelled = message["error"].get("code") == -32800
        record.answer, record.error = ("cancelled", "") if cancelled else ("error", str(message["error"]))
        return
    result = message.get("result")
    items = (result.get("items") if isinstance(result, dict) else result) or []
    record.answer = "items" if items else "empty"
    if items:
        text = items[0].get("insertText")
        record.ghost_text = text if isinstance(text, str) else str((text or {}).get("value", ""))


# ---------------------------------------------------------------------------------------------- servers


def serve_command(model: str | None = None) -> list[str]:
    """`diffill serve` with this interpreter (and `--model` when given)."""
    return [sys.executable, "-m", "diffill", "serve", *(["--model", model] if model else [])]


async def start_server(command: Sequence[str], options: dict[str, Any], env: dict[str, str], log: Path) -> Server:
    """Start a server, initialize it with `options`, and wait until its model is ready (ValueError if it fails)."""
    statuses: list[dict[str, Any]] = []

    def on_notification(method: str, params: Any, at: float) -> None:
        if method == STATUS and isinstance(params, dict):
            statuses.append({**params, "at": at})

    spawned = time.perf_counter()
    client = await StdioClient.spawn(command, env, log, on_notification)
    server = Server(client, statuses)
    try:
        await client.initialize(options, CAPABILITIES, READY_TIMEOUT)
        server.initialize_ms = (time.perf_counter() - spawned) * 1000
        deadline = time.monotonic() + READY_TIMEOUT
        while True:
            info = await client.call("diffill/debugInfo", {}, READY_TIMEOUT)
            if info["state"] not in ("starting", "loading"):
                break
            if time.monotonic() > deadline:
                raise ValueError(f"the model did not load within {READY_TIMEOUT:g} s (log: {log})")
            await asyncio.sleep(0.1)
    except BaseException:
        await client.close()
        raise
    if info["state"] != "ready":
        await client.close()
        raise ValueError(f"the server has no model ({info['state']}): {info['message']} (log: {log})")
    server.ready_ms = (time.perf_counter() - spawned) * 1000  # to within the 0.1 s the state is polled at
    server.info = info
    return server


@contextlib.asynccontextmanager
async def servers(count: int, command: Sequence[str], options: dict[str, Any]) -> AsyncIterator[list[Server]]:
    """`count` ready servers under a private runtime directory; on leaving, they and their engine are stopped."""
    with tempfile.TemporaryDirectory(prefix="diffill-replay-") as scratch:
        runtime = Path(scratch, "run")
        runtime.mkdir(mode=0o700)
        env = {**os.environ, "XDG_RUNTIME_DIR": str(runtime)}
        started: list[Server] = []
        children: set[int] = set()
        try:
            for number in range(count):  # one after another, as editor windows open
                started.append(await start_server(command, options, env, Path(scratch, f"server-{number}.log")))
                children.update(process_usage.descendants(started[-1].client.pid))
            yield started
        finally:
            for server in started:
                children.update(process_usage.descendants(server.client.pid))
            await asyncio.gather(*(server.client.close() for server in started), return_exceptions=True)
            await stop_processes(children)


async def stop_processes(pids: Iterable[int], wait: float = 10.0) -> None:
    """SIGTERM these processes (a detached engine), then SIGKILL what is left after `wait` seconds."""
    pids = [pid for pid in pids if process_usage.alive(pid)]
    for pid in pids:
        with contextlib.suppress(ProcessLookupError):
            os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + wait
    while any(process_usage.alive(pid) for pid in pids) and time.monotonic() < deadline:
        await asyncio.sleep(0.05)
    for pid in pids:
        if process_usage.alive(pid):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)


def process_tree(started: Sequence[Server]) -> tuple[list[int], list[int]]:
    """(server pids, pids of the processes they started: a shared engine)."""
    roots = [server.client.pid for server in started]
    return roots, sorted({pid for root in roots for pid in process_usage.descendants(root)} - set(roots))


# ---------------------------------------------------------------------------------------------- the replay


async def replay(sessions: Sequence[Session], keys: Sequence[Sequence[Keystroke]], rate: float,
                 on_request: Callable[[int], None] | None = None) -> list[KeyRecord]:
    """Type every session's keys at `rate` keys per second in all (taking turns, one key at a time), then wait for
    every answer; `on_request(n)` is called after the n-th request is sent."""
    if rate <= 0:
        raise ValueError(f"the pace must be more than 0 keys per second (got {rate:g})")
    order = [(s, k) for k in range(max(len(each) for each in keys)) for s in range(len(sessions)) if k < len(keys[s])]
    records: list[KeyRecord] = []
    due = time.perf_counter()
    for number, (session, index) in enumerate(order, start=1):
        key = keys[session][index]
        due += key.pause
        if (wait := due - time.perf_counter()) > 0:
            await asyncio.sleep(wait)
        records.append(sessions[session].press(key))
        if on_request is not None:
            on_request(number)
        due += 1.0 / rate
    await asyncio.gather(*(session.server.client.drain() for session in sessions))
    waiting = [record.request.future for record in records if not record.request.future.done()]
    if waiting:
        await asyncio.wait(waiting, timeout=ANSWER_TIMEOUT)
    return records


def key_rows(records: Sequence[KeyRecord]) -> list[dict[str, Any]]:
    """Each key of one session (in the order typed) as a report row: what it typed, the line before the cursor,
    its request's answer, the first item's text, ms from the key to the answer, and whether that came before the
    next key (in time to show)."""
    rows: list[dict[str, Any]] = []
    for record, shown_in_time in zip(records, answered_in_time(records)):
        answered = record.request.answered
        rows.append({"key": record.insert, "line_before": record.line_before, "answer": record.answer or "none",
                     "ghost_text": record.ghost_text,
                     "ms": None if answered is None else round((answered - record.typed_at) * 1000, 1),
                     "in_time": shown_in_time})
    return rows


def answered_in_time(records: Sequence[KeyRecord]) -> list[bool]:
    """For each key of one session (in the order typed), whether its request was answered before the next key."""
    ends = [record.typed_at for record in records[1:]] + [float("inf")]
    return [record.request.answered is not None and record.request.answered < end for record, end in zip(records, ends)]


@dataclass
class GhostText:
    """What the user saw while typing one session."""

    latencies_ms: list[float]  # keystroke to ghost text, for keys whose own answer showed some in time
    shown: int  # keys after which ghost text was on screen (answered in time, or kept by typing ahead)
    kept: int  # of those, kept on screen only by typing ahead (the key's own answer came too late)
    accepted_chars: int  # characters typed that the ghost text on screen already showed


def ghost_text(records: Sequence[KeyRecord]) -> GhostText:
    """The ghost text an editor would have shown for one session's keys (in the order typed)."""
    latencies: list[float] = []
    shown = kept = accepted = 0
    visible = ""  # ghost text on screen just before the next key
    for record, shown_in_time in zip(records, answered_in_time(records)):
        if record.insert and visible.startswith(record.insert):
            accepted += len(record.insert)
            visible = visible[len(record.insert):]
        else:
            visible = ""
        if shown_in_time and record.answer in ("items", "empty"):
            if record.answer == "items":
                latencies.append((record.request.answered - record.typed_at) * 1000)
            visible = record.ghost_text  # the key's own answer replaces what typing ahead kept ("" hides it)
        elif visible:
            kept += 1
        shown += bool(visible)
    return GhostText(latencies, shown, kept, accepted)
