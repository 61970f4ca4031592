"""The model thread: the one place where the model is loaded and run, off the event loop.

The language server's event loop must stay free to read messages (a cancellation, a newer request, a change of the
document) while the model works, so every piece of model work is a job submitted to one background thread and
awaited. One thread, because one model cannot usefully run two fills at once on a laptop; jobs run in the order
they were submitted, and a job whose ticket was cancelled while it waited is skipped. A running fill stops at its
next denoising step when its ticket is cancelled (the step callback returns False).

torch and transformers are imported here only inside functions that run on the model thread, so importing this
module (and answering `initialize`) never imports them.
"""

from __future__ import annotations

import asyncio
import importlib
import logging
import os
import queue
import threading
from collections.abc import Callable
from concurrent.futures import Executor, Future
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypeVar

from lsp_server.scheduler import Ticket
from lsp_server.settings import Settings

if TYPE_CHECKING:
    from infill_engine.engine import InfillEngine
    from infill_engine.sampler import SamplerConfig

logger = logging.getLogger(__name__)
T = TypeVar("T")

# Model states, as `diffill/status` and `diffill/debugInfo` report them.
STARTING = "starting"  # before `initialized`
LOADING = "loading"
READY = "ready"
FAILED = "failed"  # the configured model could not be loaded (the message says why)
NO_MODEL = "none"  # no model configured and this build ships no embedded one


class DaemonThreadExecutor(Executor):
    """An executor of one daemon thread: jobs run in order, and exiting never waits for a running fill."""

    def __init__(self, name: str) -> None:
        self._jobs: queue.SimpleQueue[tuple[Future[Any], Callable[[], Any]] | None] = queue.SimpleQueue()
        self._thread = threading.Thread(target=self._work, name=name, daemon=True)
        self._thread.start()

    def submit(self, fn: Callable[..., T], /, *args: Any, **kwargs: Any) -> Future[T]:  # type: ignore[override]
        """Queue a call; its future holds the result or the exception."""
        future: Future[T] = Future()
        self._jobs.put((future, lambda: fn(*args, **kwargs)))
        return future

    def shutdown(self, wait: bool = True, *, cancel_futures: bool = False) -> None:
        """Stop after the queued jobs."""
        self._jobs.put(None)
        if wait:
            self._thread.join()

    def _work(self) -> None:
        while (item := self._jobs.get()) is not None:
            future, call = item
            if not future.set_running_or_notify_cancel():
                continue
            try:
                future.set_result(call())
            except BaseException as error:  # noqa: BLE001 - handed to whoever awaits the future
                future.set_exception(error)


def default_threads() -> int:
    """Half the CPU cores, at least one: the editor and the rest of the machine keep theirs."""
    return max(1, (os.cpu_count() or 2) // 2)


class ModelHost:
    """Loads the model in the background and runs jobs against it on the model thread."""

    def __init__(self, engine_factory: str | None = None) -> None:
        self.engine_factory = engine_factory  # "module:function" building the engine instead of loading a checkpoint
        self.state = STARTING
        self.message = ""  # why the state is FAILED or NO_MODEL
        self.engine: InfillEngine | None = None
        self.description = ""  # the model, for status bars: "family:directory"
        self.generation = 0  # counts loads; a load that is overtaken by a newer one is discarded
        self._base_sampler: SamplerConfig | None = None
        self._thread = DaemonThreadExecutor("diffill-model")

    @property
    def ready(self) -> bool:
        """Whether fills can run."""
        return self.state == READY and self.engine is not None

    async def load(self, settings: Settings) -> None:
        """Load the model the settings name (in the background); sets `state` and `message`."""
        self.generation += 1
        generation = self.generation
        if hasattr(self.engine, "close"):  # a shared engine's connection
            self.engine.close()  # type: ignore[union-attr]
        self.state, self.message, self.engine = LOADING, "", None
        loop = asyncio.get_running_loop()
        try:
            engine, state, message = await loop.run_in_executor(self._thread, self._load, settings)
        except Exception as error:
            logger.exception("loading the model failed")
            engine, state, message = None, FAILED, f"{type(error).__name__}: {error}"
        if generation != self.generation:
            return  # a newer load started meanwhile; its result counts
        self.engine, self.state, self.message = engine, state, message
        if engine is not None:
            self.description = f"{engine.denoiser.family}:{Path(str(engine.denoiser.path)).name}"

    def _load(self, settings: Settings) -> tuple[InfillEngine | None, str, str]:
        """On the model thread: build the engine, or say why there is none.

        `engine.mode` "shared" and "auto" use the shared engine service (a client with the engine's `fill` and
        `refine`; no torch in this process); "auto" falls back to loading the model here when no engine can be
        reached or started, "shared" reports the failure instead.
        """
        if settings.engine.mode != "inprocess":
            shared = self._connect_shared(settings)
            if shared is not None:
                return shared
        _quiet_transformers()
        from infill_engine.engine import InfillEngine
        from infill_engine.loading import ModelLoadError, default_model_path

        model = settings.model
        try:
            if self.engine_factory:
                module, _, name = self.engine_factory.partition(":")
                engine = getattr(importlib.import_module(module), name)(settings)
            elif model.path is None and default_model_path() is None:
                return None, NO_MODEL, (
                    "this build of diffill ships no embedded model yet; set the `model.path` setting (or "
                    "`diffill serve --model PATH`) to a checkpoint directory"
                )
            else:
                path = None if model.path is None else str(Path(model.path).expanduser())
                engine = InfillEngine.load(
                    path, family=model.family, device=model.device, dtype=model.dtype,
                    trust_remote_code=model.trust_remote_code,
                )
        except (ModelLoadError, ValueError, OSError) as error:
            return None, FAILED, str(error)
        self._base_sampler = engine.sampler
        self._configure(engine, settings)
        if engine.denoiser.device.type == "cpu":
            import torch

            torch.set_num_threads(model.threads or default_threads())
        logger.info("model ready: %s (%s on %s)", engine.denoiser.path, engine.denoiser.family, engine.denoiser.device)
        return engine, READY, ""

    def _connect_shared(self, settings: Settings) -> tuple[InfillEngine | None, str, str] | None:
        """On the model thread: a client of the shared engine for the configured model (None: load it here)."""
        from infill_engine.service.api import EngineError
        from infill_engine.service.launcher import EngineSpec, SharedEngine

        model = settings.model
        spec = EngineSpec(path=model.path, family=model.family, device=model.device, dtype=model.dtype,
                          trust_remote_code=model.trust_remote_code, factory=self.engine_factory)
        try:
            engine = SharedEngine(spec)
        except EngineError as error:
            if settings.engine.mode == "shared":
                return None, FAILED, f"no shared engine: {error}"
            logger.warning("no shared engine (%s); loading the model in this process", error)
            return None
        self._configure(engine, settings)  # type: ignore[arg-type]
        logger.info("using the shared engine at %s (%s)", engine.client.address, engine.client.model)
        return engine, READY, ""  # type: ignore[return-value]

    def _configure(self, engine: InfillEngine, settings: Settings) -> None:
        """Apply the sampling and context settings to a loaded engine (or send them with a shared engine's requests)."""
        if hasattr(engine, "configure"):  # the shared engine: its model is not ours to change
            engine.configure(steps=settings.sampling.steps, seed=settings.sampling.seed,
                             prefix_tokens=settings.context.prefix_tokens, suffix_tokens=settings.context.suffix_tokens)
            return
        from infill_engine.canvas import ContextConfig

        base = self._base_sampler or engine.sampler
        steps = settings.sampling.steps or base.steps
        engine.sampler = replace(base, steps=steps, seed=settings.sampling.seed)
        engine.context = ContextConfig(
            prefix_tokens=settings.context.prefix_tokens, suffix_tokens=settings.context.suffix_tokens
        )

    async def reconfigure(self, settings: Settings) -> None:
        """Apply new sampling and context settings without reloading (on the model thread, between jobs)."""
        engine = self.engine
        if engine is not None:
            await asyncio.get_running_loop().run_in_executor(self._thread, self._configure, engine, settings)

    async def run(
        self, job: Callable[[InfillEngine], T], ticket: Ticket, abandoned: Callable[[Ticket], None] | None = None
    ) -> T | None:
        """Run `job(engine)` on the model thread; None when there is no model or the ticket was cancelled.

        When the awaiting request is itself cancelled (`$/cancelRequest`), the ticket is cancelled so the fill stops
        at its next step, and `abandoned(ticket)` is called once the thread has let go of it.
        """
        engine = self.engine
        if engine is None:
            return None

        def call() -> T | None:
            if ticket.cancelled:
                return None
            from infill_engine.request import FillCancelled

            try:
                return job(engine)
            except FillCancelled:
                return None

        future = self._thread.submit(call)
        try:
            return await asyncio.shield(asyncio.wrap_future(future))
        except asyncio.CancelledError:
            ticket.cancel("cancelled")
            if abandoned is not None:
                loop = asyncio.get_running_loop()
                future.add_done_callback(lambda _: loop.call_soon_threadsafe(abandoned, ticket))
            raise


def _quiet_transformers() -> None:
    """No progress bars or advice from transformers on standard error unless the log level asks for them."""
    if logging.getLogger().getEffectiveLevel() > logging.INFO:
        from transformers.utils import logging as hf_logging

        hf_logging.set_verbosity_error()
        hf_logging.disable_progress_bar()
