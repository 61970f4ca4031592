"""`diffill http --ray`: the same HTTP application on Ray Serve, with model replicas that Ray scales and batches.

    HTTP -> Ray Serve's proxy -> DiffillIngress (the ASGI app of `infill_engine.http.app`, no model)
                                   | DeploymentHandle, one call per request
                                 DiffillModel replicas (each loads the model; `@serve.batch` hands it the requests
                                 that arrived within `batch_wait_ms`, up to `max_batch_size`, as one batch)

What a batch buys: Ray Serve gathers the requests of different users that arrive together and gives them to one
replica call, and the replica fills them together (`infill_engine.batched_fill`): their contexts encoded in one
padded pass, then one forward pass per denoising step over every request's canvases, each request keeping its own
options, stopping, syntax gate and repairs, and getting the fill it gets alone. Families whose adapters cannot merge
contexts run the batch's requests one after another. Requests of one batch that share their whole request and
options are denoised once and answered alike. Ray is the `cluster` extra and is imported only here.
"""

from __future__ import annotations

import asyncio
import logging
import threading
import time
from collections import Counter
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from infill_engine.interface import (
    DEFAULT_GROW,
    DEFAULT_KEEP_ABOVE,
    DEFAULT_MAX_BATCH_SIZE,
    EngineOptions,
    ModelInfo,
    ModelSpec,
    StepCallback,
)
from infill_engine.request import FillCancelled, InfillRequest, InfillResult
from infill_engine.service import wire

if TYPE_CHECKING:
    from infill_engine.batched_fill import FillBatcher

logger = logging.getLogger(__name__)

APP_NAME = "diffill"
MODEL_DEPLOYMENT = "DiffillModel"
POLL_SECONDS = 0.05  # how often a waiting request asks whether its client is still there


@dataclass(frozen=True)
class RayOptions:
    """How the application is deployed on Ray Serve."""

    address: str | None = None  # cluster to join (ray://host:10001, auto); None: start a local Ray
    replicas: int = 1  # model replicas (the least, when autoscaling)
    max_replicas: int = 0  # autoscale up to this many replicas; 0: a fixed number
    max_batch_size: int = DEFAULT_MAX_BATCH_SIZE  # requests handed to a replica together, filled in lockstep
    batch_wait_ms: float = 10.0  # how long a replica waits for a batch to fill
    num_gpus: float = 0.0  # GPUs per model replica

    def __post_init__(self) -> None:
        if not isinstance(self.replicas, int) or self.replicas < 1:
            raise ValueError(f"--replicas must be an integer >= 1 (got {self.replicas!r})")
        if self.max_replicas and self.max_replicas < self.replicas:
            raise ValueError(f"--max-replicas ({self.max_replicas}) must be 0 or at least --replicas "
                             f"({self.replicas})")
        if not isinstance(self.max_batch_size, int) or self.max_batch_size < 1:
            raise ValueError(f"--max-batch-size must be an integer >= 1 (got {self.max_batch_size!r})")
        if self.batch_wait_ms < 0 or self.num_gpus < 0:
            raise ValueError("--batch-wait-ms and --num-gpus must be >= 0")


def run_calls(batcher: FillBatcher, calls: list[dict[str, Any]],
              gone: list[threading.Event] | None = None) -> list[dict[str, Any]]:
    """Answer a batch of calls together on the batcher's engine, in order: {"result": ...} or {"error": {"kind",
    "message"}} each.

    A call is {"method": "fill"|"refine"|"count_tokens", "args": {...}, "options": {...}}; calls that are equal
    are run once. `gone[i]` is set when the caller of call i went away: once every caller of a run has gone, its
    canvas stops at the next denoising step (answered with the kind "FillCancelled") and the others go on.
    """
    gone = gone if gone is not None else [threading.Event() for _ in calls]
    keys = [repr(sorted(call.items())) for call in calls]
    unique = {key: call for key, call in zip(keys, calls)}
    callers: dict[str, list[threading.Event]] = {}
    for key, event in zip(keys, gone):
        callers.setdefault(key, []).append(event)

    def work(key: str) -> Callable[[Any], dict[str, Any]]:
        def still_wanted(_view: Any) -> bool:
            return not all(event.is_set() for event in callers[key])
        return lambda engine: _run_call(engine, unique[key], still_wanted)

    outcomes = batcher.run_together([work(key) for key in unique])
    answers = dict(zip(unique, outcomes))
    return [answers[key] for key in keys]


def _run_call(engine: Any, call: dict[str, Any], on_step: StepCallback | None = None) -> dict[str, Any]:
    try:
        engine.configure(EngineOptions.from_dict(call.get("options")))
        args = call["args"]
        if call["method"] == "count_tokens":
            return {"result": engine.count_tokens(args["text"])}
        request = wire.request_from_wire(args["request"])
        if call["method"] == "fill":
            result = engine.fill(request, on_step)
        else:
            result = engine.refine(request, args["original"], [tuple(r) for r in args["renoise"]],
                                   args["keep_above"], args["grow"], on_step)
        return {"result": wire.result_to_wire(result)}
    except FillCancelled:
        return {"error": {"kind": "FillCancelled", "message": "the caller went away"}}
    except (ValueError, TypeError) as error:
        return {"error": {"kind": "ValueError", "message": str(error)}}
    except Exception as error:  # noqa: BLE001 - one bad request must not fail the others of its batch
        logger.exception("a batched request failed")
        return {"error": {"kind": type(error).__name__, "message": str(error)}}


class RayEngine:
    """An `Engine` whose calls go to the model deployment through a Ray Serve handle (thread-safe).

    The HTTP app runs it on many threads at once so that requests reach the replicas together and get batched;
    `configure` therefore sets the options of the calling thread. It cannot report denoising steps: it polls
    `on_step(None)` (the app's callback takes None as "is the client still there?") and cancels the call when not.
    """

    def __init__(self, handle: Any, model: ModelInfo) -> None:
        self.handle = handle
        self.model = model
        self._local = threading.local()

    def describe(self) -> ModelInfo:
        """The model of the replicas."""
        return self.model

    def configure(self, options: EngineOptions) -> None:
        """Options for this thread's next calls."""
        self._local.options = options.as_dict()

    def fill(self, request: InfillRequest, on_step: StepCallback | None = None, *,
             document: str | None = None) -> InfillResult:
        """Fill on a replica, batched with other users' requests."""
        answer = self._call("fill", {"request": wire.request_to_wire(request)}, on_step)
        return wire.result_from_wire(answer)

    def refine(self, request: InfillRequest, original: str, renoise: list[tuple[int, int]] | None = None,
               keep_above: float | None = DEFAULT_KEEP_ABOVE, grow: int = DEFAULT_GROW,
               on_step: StepCallback | None = None, *, document: str | None = None) -> InfillResult:
        """Refine on a replica."""
        args = {"request": wire.request_to_wire(request), "original": original,
                "renoise": [list(r) for r in renoise or []], "keep_above": keep_above, "grow": grow}
        return wire.result_from_wire(self._call("refine", args, on_step))

    def count_tokens(self, text: str) -> int:
        """Counted on a replica."""
        return int(self._call("count_tokens", {"text": text}, None))

    def close(self) -> None:
        """The replicas belong to Ray Serve."""

    def _call(self, method: str, args: dict[str, Any], on_step: StepCallback | None) -> Any:
        call = {"method": method, "args": args, "options": getattr(self._local, "options", {})}
        response = self.handle.run.remote(call)
        while True:
            try:
                answer = response.result(timeout_s=POLL_SECONDS)
                break
            except TimeoutError:
                if on_step is not None and on_step(None) is False:
                    response.cancel()
                    raise FillCancelled() from None
        if "error" in answer:
            error = answer["error"]
            if error["kind"] == "ValueError":
                raise ValueError(error["message"])
            if error["kind"] == "FillCancelled":
                raise FillCancelled()
            raise RuntimeError(f"{error['kind']}: {error['message']}")
        return answer["result"]


def build_application(spec: ModelSpec, limits: Any, key: str | None, options: RayOptions) -> Any:
    """The Ray Serve application: the ingress (the HTTP app) bound to the model deployment."""
    from ray import serve

    scaling: dict[str, Any] = {"num_replicas": options.replicas}
    if options.max_replicas:
        scaling = {"autoscaling_config": {"min_replicas": options.replicas, "max_replicas": options.max_replicas,
                                          "target_ongoing_requests": options.max_batch_size}}

    @serve.deployment(name=MODEL_DEPLOYMENT, ray_actor_options={"num_gpus": options.num_gpus},
                      max_ongoing_requests=max(options.max_batch_size * 2, 2), **scaling)
    class DiffillModel:
        """One model replica."""

        def __init__(self) -> None:
            from infill_engine.batched_fill import FillBatcher
            from infill_engine.interface import load_engine

            self.engine = load_engine(spec, serving=True)
            self.batcher = FillBatcher(self.engine, options.max_batch_size)
            self.batch_sizes: Counter[int] = Counter()
            self.started = time.monotonic()

        async def run(self, call: dict[str, Any]) -> dict[str, Any]:
            gone = threading.Event()
            try:
                return await self.run_batch((call, gone))
            except asyncio.CancelledError:  # the caller cancelled (its client went away): stop its canvas
                gone.set()
                raise

        # Two batches at once: a batch that arrives while one runs joins the replica's fills between two steps (the
        # batcher admits max_batch_size fills at a time) instead of waiting for the slowest request of the first.
        @serve.batch(max_batch_size=options.max_batch_size, batch_wait_timeout_s=options.batch_wait_ms / 1000.0,
                     max_concurrent_batches=2)
        async def run_batch(self, items: list[tuple[dict[str, Any], threading.Event]]) -> list[dict[str, Any]]:
            self.batch_sizes[len(items)] += 1
            calls, gone = [call for call, _ in items], [event for _, event in items]
            return await asyncio.to_thread(run_calls, self.batcher, calls, gone)

        def describe(self) -> dict[str, str]:
            info = self.engine.describe()
            return {"family": info.family, "path": info.path, "device": info.device, "dtype": info.dtype}

        def stats(self) -> dict[str, Any]:
            replica = serve.get_replica_context().replica_id.unique_id
            return {"replica": replica, "batch_sizes": dict(self.batch_sizes),
                    "uptime_s": round(time.monotonic() - self.started, 1)}

    def build_asgi() -> Any:
        from infill_engine.http.app import InfillApp

        handle = serve.get_deployment_handle(MODEL_DEPLOYMENT, app_name=APP_NAME)
        with ThreadPoolExecutor(1) as thread:  # .result() may not be called on an event loop's thread
            info = thread.submit(lambda: handle.describe.remote().result()).result()
        model = ModelInfo(info["family"], info["path"], f"{info['device']} (Ray Serve)", info.get("dtype", ""))
        return InfillApp(RayEngine(handle, model), limits, key, workers=limits.max_queued)

    @serve.deployment(name="DiffillIngress", max_ongoing_requests=limits.max_queued * 2)
    @serve.ingress(build_asgi)
    class DiffillIngress:
        """The HTTP application; holds no model."""

        def __init__(self, model: Any) -> None:
            self.model = model

    return DiffillIngress.bind(DiffillModel.bind())


def serve_on_ray(spec: ModelSpec, limits: Any, key: str | None, host: str, port: int, options: RayOptions) -> int:
    """Deploy on Ray Serve (starting a local Ray unless `options.address` names a cluster) and wait."""
    import sys

    try:
        import ray
        from ray import serve
    except ImportError:
        print("diffill http --ray needs Ray Serve: pip install 'diffill[cluster]'", file=sys.stderr)
        return 2
    ray.init(address=options.address, ignore_reinit_error=True, log_to_driver=False)
    serve.start(http_options={"host": host, "port": port})
    serve.run(build_application(spec, limits, key, options), name=APP_NAME, route_prefix="/")
    print(f"diffill http: Ray Serve on http://{host}:{port} ({options.replicas} replica(s), batches of up to "
          f"{options.max_batch_size})", file=sys.stderr, flush=True)
    try:
        while True:
            time.sleep(3600)
    except KeyboardInterrupt:
        serve.shutdown()
    return 0


def replica_stats(asks: int = 16) -> dict[str, dict[str, Any]]:
    """Batch sizes (calls per batch: size -> batches) seen by each model replica that answered one of `asks` asks
    (a handle picks the replica; for scripts/ray-check)."""
    from ray import serve

    handle = serve.get_deployment_handle(MODEL_DEPLOYMENT, app_name=APP_NAME)
    answers = [handle.stats.remote().result() for _ in range(asks)]
    return {answer["replica"]: answer for answer in answers}
