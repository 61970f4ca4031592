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
import logging
import queue
import threading
from collections.abc import Callable
from concurrent.futures import Executor, Future
from typing import TYPE_CHECKING, Any, TypeVar

from lsp_server.scheduler import Ticket
from lsp_server.settings import Settings

if TYPE_CHECKING:
    from infill_engine.interface import Engine

logger = logging.getLogger(__name__)
T = TypeVar("T")

# Model states, as `diffill/status` and `diffill/debugInfo` report them.
STARTING = "starting"  # before `initialized`
LOADING = "loading"
READY = "ready"
FAILED = "failed"  # the configured model could not be loaded (the message says why)
NO_MODEL = "none"  # no model configured and this build ships no embedded one
UNREACHABLE = "unreachable"  # the engine (a team server, a shared engine) stopped answering; tried again each request


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


class ModelHost:
    """Opens the engine in the background and runs jobs against it on the model thread."""

    def __init__(self, engine_factory: str | None = None) -> None:
        self.engine_factory = engine_factory  # "module:function" building the engine instead of loading a checkpoint
        self.state = STARTING
        self.message = ""  # why the state is FAILED or NO_MODEL
        self.engine: Engine | None = None
        self.description = ""  # the model, for status bars: "family:directory"
        self.generation = 0  # counts loads; a load that is overtaken by a newer one is discarded
        self._thread = DaemonThreadExecutor("diffill-model")

    @property
    def ready(self) -> bool:
        """Whether fills can run (also while the engine is unreachable: the next request tries it again)."""
        return self.state in (READY, UNREACHABLE) and self.engine is not None

    async def load(self, settings: Settings, on_download: Callable[[str, float, float | None], None] | None = None
                   ) -> None:
        """Open the engine the settings name (in the background); sets `state` and `message`. A hub id that is not
        in the cache is downloaded first, reporting to `on_download(what, done, total)` from the model thread."""
        self.generation += 1
        generation = self.generation
        if self.engine is not None:
            self.engine.close()
        self.state, self.message, self.engine = LOADING, "", None
        loop = asyncio.get_running_loop()
        try:
            engine, state, message = await loop.run_in_executor(self._thread, self._open, settings, on_download)
        except Exception as error:
            logger.exception("loading the model failed")
            engine, state, message = None, FAILED, f"{type(error).__name__}: {error}"
        if generation != self.generation:
            if engine is not None:
                engine.close()
            return  # a newer load started meanwhile; its result counts
        self.engine, self.state, self.message = engine, state, message
        if engine is not None:
            self.description = engine.describe().description

    def _open(self, settings: Settings, on_download: Callable[[str, float, float | None], None] | None = None
              ) -> tuple[Engine | None, str, str]:
        """On the model thread: open the engine of the settings' model and mode, or say why there is none."""
        from infill_engine.hub import HubError, resolve_model_path
        from infill_engine.interface import NoModelError, OpenError, open_engine

        try:
            if settings.model.path and self.engine_factory is None and settings.engine.mode != "remote":
                # fetch a hub model here, with progress (a team server has its own model)
                resolve_model_path(settings.model.path, on_download)
            remote = settings.engine
            engine = open_engine(settings.model.spec(self.engine_factory), remote.mode, url=remote.url,
                                 key=remote.key, key_file=remote.key_file, serving=True)
        except NoModelError as error:
            return None, NO_MODEL, str(error)
        except (OpenError, HubError) as error:
            return None, FAILED, str(error)
        engine.configure(settings.engine_options())
        info = engine.describe()
        logger.info("model ready: %s (%s on %s, %s)", info.path, info.family, info.device,
                    info.dtype or "dtype unknown")
        return engine, READY, ""

    async def reconfigure(self, settings: Settings) -> None:
        """Apply new sampling and context settings without reloading (on the model thread, between jobs)."""
        engine = self.engine
        if engine is not None:
            await asyncio.get_running_loop().run_in_executor(self._thread, engine.configure, settings.engine_options())

    async def run(
        self, job: Callable[[Engine], T], ticket: Ticket, abandoned: Callable[[Ticket], None] | None = None
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
            from infill_engine.service.api import EngineUnavailable

            ticket.started = True
            try:
                result = job(engine)
            except FillCancelled:
                return None
            except EngineUnavailable as error:  # the request is answered with nothing; the state says why
                if self.engine is engine:  # (not an engine that a reload has replaced meanwhile)
                    if self.state != UNREACHABLE:
                        logger.warning("the engine does not answer: %s", error)
                    self.state, self.message = UNREACHABLE, str(error)
                ticket.cancel(UNREACHABLE)
                return None
            if self.state == UNREACHABLE and self.engine is engine:
                logger.info("the engine answers again")
                self.state, self.message = READY, ""
            return result

        future = self._thread.submit(call)
        try:
            return await asyncio.shield(asyncio.wrap_future(future))
        except asyncio.CancelledError:
            ticket.cancel("cancelled")
            if abandoned is not None:
                loop = asyncio.get_running_loop()
                future.add_done_callback(lambda _: loop.call_soon_threadsafe(abandoned, ticket))
            raise
