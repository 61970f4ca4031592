"""The team server: one ASGI application around an `Engine`, speaking llama.cpp's `/infill` and diffill's own JSON.

    app = InfillApp(engine, HttpLimits(), api_key="...")     # any Engine: in process, shared, or Ray Serve's
    uvicorn.run(app, host="127.0.0.1", port=8012)

Endpoints (docs/TEAM.md has the bodies):
    GET  /health, /v1/health     llama.cpp's {"status": "ok"}; open without a key, as in llama.cpp
    POST /infill                  llama.cpp's fill-in-the-middle (`infill_engine.http.llama`)
    POST /v1/fill                 one hole, several candidates, with the syntax gate's verdicts
    POST /v1/rewrite              a selection replaced by a fresh fill (an optional instruction as a comment line)
    POST /v1/refine               a text denoised again in place, keeping what the model is sure of
    POST /v1/count_tokens         how many of the model's tokens a text is
    GET  /v1/model, /v1/status    the model, and what the server has done
With `"stream": true`, the diffill endpoints answer one JSON line per denoising step, then the result (so a client
sees progress and can stop a fill by closing the connection).
Every other request needs `Authorization: Bearer KEY` when the server has a key. Bodies larger than the limit get
413, malformed JSON 400 with the parser's message, a bad field 400 naming it; errors have llama.cpp's shape
`{"error": {"code", "message", "type"}}`. Model work runs on worker threads (one by default, so fills run one at a
time, as on the shared engine), or through a `FillBatcher` (`infill_engine.batched_fill`), which runs the fills of
concurrent clients together, one forward pass per denoising step for all of them; when a client disconnects, its
fill stops at its next denoising step and the others go on.
"""

from __future__ import annotations

import asyncio
import hmac
import json
import logging
import threading
import time
from collections.abc import Awaitable, Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from infill_engine.interface import DEFAULT_GROW, DEFAULT_KEEP_ABOVE, MAX_GROW, Engine, EngineOptions
from infill_engine.request import FillCancelled, InfillRequest, InfillResult
from infill_engine.service import wire
from infill_engine.http.llama import infill_answer, infill_chunks, parse_infill

if TYPE_CHECKING:
    from infill_engine.batched_fill import FillBatcher

logger = logging.getLogger(__name__)

Scope = dict[str, Any]
Receive = Callable[[], Awaitable[dict[str, Any]]]
Send = Callable[[dict[str, Any]], Awaitable[None]]
Job = Callable[[Engine, Callable[[Any], bool]], Any]  # model work: called with the engine to use and the step
#                                                       callback, on a model thread

PUBLIC_PATHS = ("/health", "/v1/health")  # answered without a key, as llama.cpp does
DEFAULT_REWRITE_TOKENS = 256  # span positions of a rewrite when the body does not say


@dataclass(frozen=True)
class HttpLimits:
    """What one request may ask of the server."""

    max_body_bytes: int = 8 * 1024 * 1024  # request body size (the socket engine's frame limit)
    max_tokens: int = 1024  # span positions of one fill, or of a refine (text tokens + grow)
    max_queued: int = 64  # requests waiting for or on the model, all clients together; more get 503

    def __post_init__(self) -> None:
        for name in ("max_body_bytes", "max_tokens", "max_queued"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ValueError(f"{name} must be an integer >= 1 (got {value!r})")


class HttpError(Exception):
    """An answer other than 200: status, message and llama.cpp's error type."""

    def __init__(self, status: int, message: str, kind: str = "invalid_request_error") -> None:
        super().__init__(message)
        self.status, self.message, self.kind = status, message, kind

    def body(self) -> dict[str, Any]:
        """llama.cpp's error body."""
        return {"error": {"code": self.status, "message": self.message, "type": self.kind}}


class ClientGone(Exception):
    """The client disconnected; nothing is sent."""


@dataclass(frozen=True)
class EventStream:
    """An answer sent as server-sent events, one `data: {json}` event per chunk (llama.cpp's streamed answers)."""

    chunks: list[Any]

    async def send(self, send: Send) -> None:
        """Send the events, then end the response."""
        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"text/event-stream"), (b"cache-control", b"no-cache")]})
        for chunk in self.chunks:
            data = b"data: " + json.dumps(chunk, ensure_ascii=False).encode() + b"\n\n"
            await send({"type": "http.response.body", "body": data, "more_body": True})
        await send({"type": "http.response.body", "body": b"", "more_body": False})


class InfillApp:
    """The ASGI application; `workers` threads run model work (more than one only for thread-safe engines), or
    `batcher` runs it, concurrent fills sharing forward passes."""

    def __init__(self, engine: Engine, limits: HttpLimits | None = None, api_key: str | None = None,
                 workers: int = 1, batcher: FillBatcher | None = None) -> None:
        self.engine = engine
        self._batcher = batcher
        self.limits = limits or HttpLimits()
        self.api_key = api_key or None
        self.model = engine.describe()
        self._pool = ThreadPoolExecutor(max_workers=workers, thread_name_prefix="diffill-http-model")
        self._lock = threading.Lock()
        self.counts = {"queued": 0, "served": 0, "cancelled": 0, "refused": 0, "errors": 0}
        self.started = time.monotonic()
        self.routes: dict[tuple[str, str], Callable[[Any], tuple[Job, Callable[[Any], Any]]]] = {
            ("POST", "/infill"): self._infill,
            ("POST", "/v1/fill"): self._fill,
            ("POST", "/v1/rewrite"): self._rewrite,
            ("POST", "/v1/refine"): self._refine,
            ("POST", "/v1/count_tokens"): self._count_tokens,
        }

    # ------------------------------------------------------------------------------------------------- ASGI
    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        """Answer one ASGI connection scope."""
        if scope["type"] == "lifespan":
            await self._lifespan(receive, send)
            return
        if scope["type"] != "http":
            return
        try:
            answer = await self._answer(scope, receive, send)
        except HttpError as error:
            answer = error.status, error.body()
        except ClientGone:
            return
        if answer is not None:
            await _send_json(send, *answer)

    async def _lifespan(self, receive: Receive, send: Send) -> None:
        while True:
            message = await receive()
            if message["type"] == "lifespan.startup":
                await send({"type": "lifespan.startup.complete"})
            elif message["type"] == "lifespan.shutdown":
                self._pool.shutdown(wait=False, cancel_futures=True)
                if self._batcher is not None:
                    self._batcher.close()
                await send({"type": "lifespan.shutdown.complete"})
                return

    async def _answer(self, scope: Scope, receive: Receive, send: Send) -> tuple[int, Any] | None:
        """The status and body to send, or None when the answer was streamed."""
        method, path = scope["method"], scope["path"].rstrip("/") or "/"
        if path in PUBLIC_PATHS and method == "GET":
            return 200, {"status": "ok"}
        self._authorize(scope)
        if method == "GET" and path == "/v1/model":
            return 200, self._model_info()
        if method == "GET" and path == "/v1/status":
            return 200, self.status()
        handler = self.routes.get((method, path))
        if handler is None:
            if any(p == path for _, p in self.routes) or path in ("/v1/model", "/v1/status", *PUBLIC_PATHS):
                raise HttpError(405, f"{method} is not allowed on {path}", "invalid_request_error")
            raise HttpError(404, f"no endpoint {path}; see docs/TEAM.md", "not_found_error")
        body = await self._read_json(scope, receive)
        stream = isinstance(body, dict) and path != "/infill" and body.pop("stream", False) is True
        try:
            job, finish = handler(body)
        except (ValueError, TypeError) as error:
            raise HttpError(400, str(error)) from None
        if not stream:
            answer = finish(await self._on_model(job, receive))
            if isinstance(answer, EventStream):  # /infill with "stream": true
                await answer.send(send)
                return None
            return 200, answer
        await self._stream(job, finish, receive, send)
        return None

    async def _stream(self, job: Job, finish: Callable[[Any], Any], receive: Receive, send: Send) -> None:
        """Answer with one JSON line per denoising step ({"block", "step"}), then {"result": ...} or {"error": ...}."""
        loop = asyncio.get_running_loop()
        steps: asyncio.Queue[dict[str, int]] = asyncio.Queue()

        def on_step(view: Any) -> None:
            step = {"block": int(getattr(view, "block", 0)), "step": int(getattr(view, "step", 0))}
            loop.call_soon_threadsafe(steps.put_nowait, step)

        await send({"type": "http.response.start", "status": 200,
                    "headers": [(b"content-type", b"application/x-ndjson")]})
        work = asyncio.ensure_future(self._on_model(job, receive, on_step))
        while not work.done():
            waiting = asyncio.ensure_future(steps.get())
            await asyncio.wait({work, waiting}, return_when=asyncio.FIRST_COMPLETED)
            if not waiting.done():
                waiting.cancel()
                break
            await send({"type": "http.response.body", "body": _line(waiting.result()), "more_body": True})
        try:
            last = {"result": finish(await work)}
        except HttpError as error:
            last = error.body()
        except ClientGone:
            return
        await send({"type": "http.response.body", "body": _line(last), "more_body": False})

    def _authorize(self, scope: Scope) -> None:
        if self.api_key is None:
            return
        header = _header(scope, b"authorization") or ""
        scheme, _, key = header.partition(" ")
        if scheme.lower() != "bearer" or not hmac.compare_digest(key.strip().encode(), self.api_key.encode()):
            raise HttpError(401, "Invalid API Key", "authentication_error")

    async def _read_json(self, scope: Scope, receive: Receive) -> Any:
        limit = self.limits.max_body_bytes
        declared = _header(scope, b"content-length")
        if declared is not None and declared.isdigit() and int(declared) > limit:
            raise HttpError(413, f"the body is {declared} bytes; this server takes at most {limit}")
        chunks, size = [], 0
        while True:
            message = await receive()
            if message["type"] == "http.disconnect":
                raise ClientGone()
            chunk = message.get("body", b"")
            size += len(chunk)
            if size > limit:
                raise HttpError(413, f"the body is over {limit} bytes, the most this server takes")
            chunks.append(chunk)
            if not message.get("more_body", False):
                break
        try:
            return json.loads(b"".join(chunks) or b"null")
        except (UnicodeDecodeError, json.JSONDecodeError) as error:
            raise HttpError(400, f"the body is not valid JSON: {error}") from None

    # ---------------------------------------------------------------------------------------------- the model
    async def _on_model(self, job: Job, receive: Receive, progress: Callable[[Any], None] | None = None) -> Any:
        """Run `job(engine, on_step)` on a model thread; a disconnect of the client stops it at its next step.

        `progress` is called with each step's view (on the model thread)."""
        with self._lock:
            if self.counts["queued"] >= self.limits.max_queued:
                self.counts["refused"] += 1
                raise HttpError(503, f"the server is busy: {self.counts['queued']} requests wait for the model "
                                     "(the limit); try again", "unavailable_error")
            self.counts["queued"] += 1
        gone = threading.Event()

        def on_step(view: Any) -> bool:  # None: an engine that cannot report steps asks if the client is still there
            if progress is not None and view is not None:
                progress(view)
            return not gone.is_set()

        def call(engine: Engine) -> Any:
            if gone.is_set():
                raise FillCancelled()
            return job(engine, on_step)

        future = self._batcher.submit(call) if self._batcher is not None else self._pool.submit(call, self.engine)
        work = asyncio.wrap_future(future)
        watch = asyncio.ensure_future(_disconnected(receive))
        try:
            await asyncio.wait({work, watch}, return_when=asyncio.FIRST_COMPLETED)
            if watch.done() and not work.done():
                gone.set()  # the fill stops at its next step; the thread is free again after it
            result = await work
        except FillCancelled:
            self._count("cancelled")
            if gone.is_set():
                raise ClientGone() from None
            raise HttpError(409, "the fill was cancelled: a newer request of the same document superseded it",
                            "cancelled_error") from None
        except ValueError as error:
            raise HttpError(400, str(error)) from None
        except Exception as error:  # noqa: BLE001 - a bug or a lost engine: answer 500, keep serving the others
            logger.exception("a request failed")
            self._count("errors")
            raise HttpError(500, f"{type(error).__name__}: {error}", "server_error") from None
        finally:
            watch.cancel()
            with self._lock:
                self.counts["queued"] -= 1
        if gone.is_set():
            self._count("cancelled")
            raise ClientGone()
        self._count("served")
        return result

    def _count(self, name: str) -> None:
        with self._lock:
            self.counts[name] += 1

    def _run(self, options: EngineOptions, work: Callable[[_Stepped], Any]) -> Job:
        """A model job: this request's sampling options, then the work."""
        def job(engine: Engine, on_step: Callable[[Any], bool]) -> Any:
            engine.configure(options)
            return work(_Stepped(engine, on_step))
        return job

    # -------------------------------------------------------------------------------------------- endpoints
    # Each takes the parsed body and returns the model job and what makes the answer of its result.
    def _infill(self, body: Any) -> tuple[Job, Callable[[Any], Any]]:
        call = parse_infill(body, self.limits.max_tokens)
        request = call.request
        started = time.perf_counter()

        def work(engine: _Stepped) -> tuple[InfillResult | None, int]:
            tokens = engine.count_tokens(request.prefix + request.suffix)  # one call: a Ray engine asks a replica
            return (None if call.warm_up else engine.fill(request)), tokens

        def finish(done: tuple[InfillResult | None, int]) -> dict[str, Any] | EventStream:
            elapsed = (time.perf_counter() - started) * 1000.0
            if call.stream:
                return EventStream(infill_chunks(call, done[0], done[1], self.model.description, elapsed))
            return infill_answer(call, done[0], done[1], self.model.description, elapsed)

        return self._run(EngineOptions(), work), finish

    def _fill(self, body: Any) -> tuple[Job, Callable[[Any], Any]]:
        fields = _object(body)
        options, document = _options(fields.pop("options", None)), _document(fields.pop("document", None))
        request = _request(fields, self.limits.max_tokens)
        return self._run(options, lambda e: e.fill(request, document=document)), _result

    def _rewrite(self, body: Any) -> tuple[Job, Callable[[Any], Any]]:
        fields = _object(body)
        options, document = _options(fields.pop("options", None)), _document(fields.pop("document", None))
        selection = fields.pop("selection", "")
        instruction, comment = fields.pop("instruction", None), fields.pop("comment", "#")
        if not isinstance(selection, str):
            raise HttpError(400, "selection must be a string")
        if instruction is not None and (not isinstance(instruction, str) or "\n" in instruction):
            raise HttpError(400, "instruction must be one line of text")
        if not isinstance(comment, str) or not comment.strip() or "\n" in comment:
            raise HttpError(400, "comment must be the language's line-comment marker, e.g. \"#\" or \"//\"")
        fields.setdefault("max_tokens", DEFAULT_REWRITE_TOKENS)
        request = _request(fields, self.limits.max_tokens)
        if instruction:
            request = _with_instruction(request, instruction, comment)
        return (self._run(options, lambda e: e.fill(request, document=document)),
                lambda result: {**_result(result), "replaces": selection})

    def _refine(self, body: Any) -> tuple[Job, Callable[[Any], Any]]:
        fields = _object(body)
        options, document = _options(fields.pop("options", None)), _document(fields.pop("document", None))
        original = fields.pop("original", None)
        renoise = fields.pop("renoise", None) or []
        keep_above = fields.pop("keep_above", DEFAULT_KEEP_ABOVE)
        grow = fields.pop("grow", DEFAULT_GROW)
        if not isinstance(original, str) or not original:
            raise HttpError(400, "refine needs original: the text to refine (a non-empty string)")
        if isinstance(grow, bool) or not isinstance(grow, int) or not 0 <= grow <= MAX_GROW:
            raise HttpError(400, f"grow must be an integer from 0 to {MAX_GROW}")
        if keep_above is not None and (isinstance(keep_above, bool) or not isinstance(keep_above, (int, float))
                                       or not 0.0 <= keep_above <= 1.0):
            raise HttpError(400, "keep_above must be a number from 0 to 1, or null (re-noise only `renoise`)")
        if not isinstance(renoise, list) or not all(
                isinstance(r, list) and len(r) == 2 and all(isinstance(x, int) and not isinstance(x, bool) for x in r)
                for r in renoise):
            raise HttpError(400, "renoise must be a list of [start, end] character offsets into original")
        request = _request(fields, self.limits.max_tokens)
        limit = self.limits.max_tokens

        def work(engine: _Stepped) -> InfillResult:
            tokens = engine.count_tokens(original)
            if tokens + grow > limit:
                raise ValueError(f"the text has {tokens} tokens; this server refines at most {limit - grow}")
            return engine.refine(request, original, [tuple(r) for r in renoise], keep_above, grow,
                                 document=document)

        return self._run(options, work), _result

    def _count_tokens(self, body: Any) -> tuple[Job, Callable[[Any], Any]]:
        text = _object(body).get("text")
        if not isinstance(text, str):
            raise HttpError(400, "count_tokens needs text (a string)")
        return (lambda engine, _on_step: engine.count_tokens(text)), lambda count: {"tokens": count}

    def _model_info(self) -> dict[str, Any]:
        info = self.model
        return {"family": info.family, "path": info.path, "device": info.device, "dtype": info.dtype,
                "description": info.description,
                "limits": {"max_body_bytes": self.limits.max_body_bytes, "max_tokens": self.limits.max_tokens,
                           "max_queued": self.limits.max_queued}}

    def status(self) -> dict[str, Any]:
        """Counters: requests waiting or running, served, cancelled by a disconnect, refused as busy, failed; and
        with a batcher, the model calls made and the fills' calls they answered (fewer calls than: shared)."""
        with self._lock:
            counts = dict(self.counts)
        batching = {"batching": self._batcher.report()} if self._batcher is not None else {}
        return {"model": self.model.description, **counts, **batching,
                "uptime_s": round(time.monotonic() - self.started, 1)}


class _Stepped:
    """The engine with a request's step callback put into every fill and refine (the disconnect check)."""

    def __init__(self, engine: Engine, on_step: Callable[[Any], bool]) -> None:
        self._engine, self._on_step = engine, on_step

    def fill(self, request: InfillRequest, *, document: str | None = None) -> InfillResult:
        return self._engine.fill(request, self._on_step, document=document)

    def refine(self, request: InfillRequest, original: str, renoise: list[tuple[int, int]],
               keep_above: float | None, grow: int, *, document: str | None = None) -> InfillResult:
        return self._engine.refine(request, original, renoise, keep_above, grow, self._on_step, document=document)

    def count_tokens(self, text: str) -> int:
        return self._engine.count_tokens(text)


# ------------------------------------------------------------------------------------------------ helpers
async def _disconnected(receive: Receive) -> None:
    """Return once the client has gone."""
    while (await receive())["type"] != "http.disconnect":
        pass


async def _send_json(send: Send, status: int, body: Any) -> None:
    data = json.dumps(body, ensure_ascii=False).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-type", b"application/json; charset=utf-8"),
                            (b"content-length", str(len(data)).encode())]})
    await send({"type": "http.response.body", "body": data})


def _header(scope: Scope, name: bytes) -> str | None:
    for key, value in scope.get("headers", []):
        if key.lower() == name:
            return value.decode("latin-1")
    return None


def _object(body: Any) -> dict[str, Any]:
    if not isinstance(body, dict):
        raise HttpError(400, "the body must be a JSON object")
    return dict(body)


def _line(value: Any) -> bytes:
    return json.dumps(value, ensure_ascii=False).encode() + b"\n"


def _document(value: Any) -> str | None:
    if value is not None and not isinstance(value, str):
        raise HttpError(400, "document must be a string naming the document (or absent)")
    return value


def _options(value: Any) -> EngineOptions:
    try:
        return EngineOptions.from_dict(value)
    except (ValueError, TypeError) as error:
        raise HttpError(400, f"options: {error}") from None


def _request(fields: dict[str, Any], max_tokens: int) -> InfillRequest:
    """The engine's request of the body's fields (InfillRequest's names); 400 for anything wrong."""
    try:
        request = wire.request_from_wire(fields)
    except (ValueError, TypeError) as error:
        raise HttpError(400, str(error)) from None
    if request.max_tokens > max_tokens:
        raise HttpError(400, f"max_tokens {request.max_tokens} exceeds this server's limit of {max_tokens}")
    return request


def _with_instruction(request: InfillRequest, instruction: str, comment: str) -> InfillRequest:
    """The instruction as a comment line just before the hole, indented as the hole's line."""
    from dataclasses import replace

    line_start = request.prefix.rfind("\n") + 1
    head = request.prefix[line_start:]
    if head.strip():  # the hole starts mid-line: the comment goes on a line of its own before that line
        indent = head[: len(head) - len(head.lstrip(" \t"))]
        prefix = request.prefix[:line_start] + f"{indent}{comment} {instruction}\n" + head
    else:
        prefix = request.prefix + f"{comment} {instruction}\n" + head
    return replace(request, prefix=prefix)


def _result(result: InfillResult) -> dict[str, Any]:
    """diffill's answer: the best text, every passing candidate best first, the rejected ones, the counters."""
    return {"text": result.text, **wire.result_to_wire(result)}
