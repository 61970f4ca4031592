"""Fills of different requests sharing forward passes: one forward per denoising step for all of them.

The engine batches the candidates of one request (one context, several canvases). Requests of different users have
different prefixes and suffixes, and finish after different numbers of steps, so they are batched here one level
down, at the denoiser's two calls, while each request runs its own unchanged fill on its own thread:

    fill A (thread) --encode/predict--+
    fill B (thread) --encode/predict--+--> Lockstep: once every running fill waits on a call, one round answers
    fill C (thread) --encode/predict--+    them all: the encodes in one padded pass (`Denoiser.encode_many`), the
                                           predicts in one forward over every canvas (`Denoiser.merge_contexts`)

Everything else stays each request's own: its seed and random stream, its options, its commit rule and early stop,
its blocks, its time budget, its step callback (a cancelled fill raises on its thread and leaves; the others go on),
its syntax gate and its repairs (whose passes join the rounds too). A fill that finishes leaves the lockstep; a new
one joins when it is admitted and takes part from the next round on, between two steps of the others (continuous
batching), so no request waits for a batch to fill or to drain. A fill's result is the one it gets alone, up to
floating-point rounding of the padded batch, and with `SamplerConfig.canvas_refresh` 0: a shared pass runs every
fill's whole canvas, where alone the embedded model keeps committed positions' keys between steps (an approximation).

Families whose adapters cannot merge contexts (`Denoiser.batches_contexts` False) run one fill at a time instead.
`FillBatcher` is what servers use: it admits up to `max_batch_size` fills at once and queues the rest.
"""

from __future__ import annotations

import logging
import threading
from collections import Counter, deque
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass, field
from typing import Any, TypeVar

import torch

from infill_engine.adapters.base import ContextArgs, Denoiser, EncodedContext, MergedRows
from infill_engine.engine import InfillEngine
from infill_engine.interface import DEFAULT_MAX_BATCH_SIZE, Engine

logger = logging.getLogger(__name__)
T = TypeVar("T")


@dataclass
class _Call:
    """One encode or predict call of a member, waiting for its round."""

    kind: str  # "encode" or "predict"
    args: Any  # ContextArgs, or (context, canvas, self_conditioning)
    done: bool = False
    result: Any = None
    error: BaseException | None = None


@dataclass
class LockstepCounts:
    """What the lockstep has done: forward passes, and how many fills' calls each answered."""

    forwards: int = 0  # model calls made (an encode round and a predict round are one each)
    calls: int = 0  # member calls answered (a fill alone: one per forward)
    sizes: Counter[int] = field(default_factory=Counter)  # calls per forward -> forwards


class Lockstep:
    """Answers the encode and predict calls of fills on several threads together, one round at a time."""

    def __init__(self, denoiser: Denoiser) -> None:
        if not denoiser.batches_contexts:
            raise ValueError(f"{denoiser.family} cannot put canvases of different contexts in one forward pass")
        self.denoiser = denoiser
        self.counts = LockstepCounts()
        self._cond = threading.Condition()
        self._members = 0  # fills that have joined and not left
        self._waiting: list[_Call] = []
        self._merged: tuple[list[tuple[EncodedContext, torch.Size]], EncodedContext] | None = None

    def member(self) -> "LockstepMember":
        """A denoiser for one fill whose calls go through this lockstep; rounds wait for it until it `leave()`s."""
        with self._cond:
            self._members += 1
        return LockstepMember(self.denoiser, self)

    # --------------------------------------------------------------------------------------------- the rounds
    def call(self, member: "LockstepMember", call: _Call) -> Any:
        """Wait until every member waits, answer them all in one round (on whichever thread comes last)."""
        with self._cond:
            if not member.joined:
                raise RuntimeError("a fill called the model after it left its batch")
            self._waiting.append(call)
            while not call.done:
                if len(self._waiting) >= self._members:
                    self._run_round()
                else:
                    self._cond.wait()
        if call.error is not None:
            raise call.error
        return call.result

    def leave(self, member: "LockstepMember") -> None:
        """The member's fill ended (finished, cancelled or failed): the others no longer wait for it."""
        with self._cond:
            if member.joined:
                member.joined = False
                self._members -= 1
                self._merged = None  # its context is in it: let the merged keys and values go
                self._cond.notify_all()

    def _run_round(self) -> None:
        """Answer every waiting call (the lock is held: nobody else can call meanwhile)."""
        calls, self._waiting = self._waiting, []
        for kind, answer in (("encode", self._encode_all), ("predict", self._predict_all)):
            group = [c for c in calls if c.kind == kind]
            if not group:
                continue
            try:
                for c, result in zip(group, answer([c.args for c in group])):
                    c.result = result
            except Exception as error:  # noqa: BLE001 - answered one by one: a bad call fails its own fill only
                if len(group) == 1:
                    group[0].error = error
                else:
                    logger.warning("a batched %s failed; answering its %d calls one by one", kind, len(group))
                    for c in group:
                        try:
                            c.result = answer([c.args])[0]
                        except Exception as error:  # noqa: BLE001 - handed to that fill's thread
                            c.error = error
        for c in calls:
            c.done = True
        self._cond.notify_all()

    def _encode_all(self, items: list[ContextArgs]) -> list[EncodedContext]:
        """Every member's context, in one padded forward pass."""
        self._count(len(items))
        return self.denoiser.encode_many(items)

    @torch.no_grad()
    def _predict_all(self, items: list[tuple[EncodedContext, torch.Tensor, torch.Tensor | None]]) -> list[torch.Tensor]:
        """Logits of every member's canvas, from one forward over all of them (stacked, right-padded)."""
        if len(items) == 1 or any(conditioning is not None for _, _, conditioning in items):
            self._count(1, times=len(items))
            return [self.denoiser.predict(*item) for item in items]
        self._count(len(items))
        shapes = [(context, canvas.shape) for context, canvas, _ in items]
        merged = self._merged_context(shapes)
        longest = max(canvas.shape[1] for _, canvas, _ in items)
        filler = self._padding_token()
        canvas = torch.cat([torch.nn.functional.pad(c, (0, longest - c.shape[1]), value=filler)
                            for _, c, _ in items])  # (sum B, N)
        logits = self.denoiser.predict(merged, canvas)  # (sum B, N, V)
        out, start = [], 0
        for _, part, _ in items:
            out.append(logits[start : start + part.shape[0], : part.shape[1]])
            start += part.shape[0]
        return out

    def _merged_context(self, shapes: list[tuple[EncodedContext, torch.Size]]) -> EncodedContext:
        """The merged context of these members' contexts and canvas shapes, built again only when they change."""
        if self._merged is not None:
            known, merged = self._merged
            if len(known) == len(shapes) and all(a is c and s == t for (a, s), (c, t) in zip(known, shapes)):
                return merged
        merged = self.denoiser.merge_contexts([MergedRows(context, shape[0], shape[1]) for context, shape in shapes])
        self._merged = (shapes, merged)
        return merged

    def _padding_token(self) -> int:
        special = self.denoiser.special
        token = special.mask_id if special.mask_id is not None else special.pad_id
        if token is None:
            raise ValueError(f"{self.denoiser.path}: no mask or pad token to pad canvases with")
        return token

    def _count(self, size: int, times: int = 1) -> None:
        self.counts.forwards += times
        self.counts.calls += size * times
        self.counts.sizes[size] += times


class LockstepMember(Denoiser):
    """The denoiser one fill sees: the real one's model and tokens, its encode and predict through the lockstep."""

    def __init__(self, denoiser: Denoiser, lockstep: Lockstep) -> None:
        super().__init__(denoiser.model, denoiser.tokenizer, denoiser.special, denoiser.path)
        self.family, self.noise, self.block_mode = denoiser.family, denoiser.noise, denoiser.block_mode
        self.uses_self_conditioning = denoiser.uses_self_conditioning
        self.projects_columns = denoiser.projects_columns  # the same columns as alone; the merged pass computes all
        self.batches_contexts = False  # a member is one fill
        self.inner = denoiser
        self.lockstep = lockstep
        self.joined = True  # counted among the lockstep's members until `leave`

    @property
    def token_texts(self) -> list[str]:  # type: ignore[override]
        """The real denoiser's (decoded once for all fills, as the id sets read from it)."""
        return self.inner.token_texts

    @property
    def line_break_ids(self) -> torch.Tensor:  # type: ignore[override]
        """The real denoiser's (computed once for all fills)."""
        return self.inner.line_break_ids

    @property
    def is_line_break(self) -> torch.Tensor:  # type: ignore[override]
        """The real denoiser's (computed once for all fills)."""
        return self.inner.is_line_break

    @property
    def blank_ids(self) -> torch.Tensor:  # type: ignore[override]
        """The real denoiser's (computed once for all fills)."""
        return self.inner.blank_ids

    def encode(self, prefix_ids: list[int], suffix_ids: list[int], span_length: int, batch_size: int) -> EncodedContext:
        """Encoded in the next round, with the other fills' encodes."""
        return self.lockstep.call(self, _Call("encode", ContextArgs(prefix_ids, suffix_ids, span_length, batch_size)))

    def predict(
        self, context: EncodedContext, canvas: torch.Tensor, self_conditioning: torch.Tensor | None = None,
        columns: torch.Tensor | None = None,
    ) -> torch.Tensor:
        """Predicted in the next round, in one forward with the other fills' canvases (every position's logits,
        then those of `columns` if given)."""
        logits = self.lockstep.call(self, _Call("predict", (context, canvas, self_conditioning)))
        return logits if columns is None else logits[:, columns]

    def leave(self) -> None:
        """This fill is over."""
        self.lockstep.leave(self)


class FillBatcher:
    """Runs the model work of many requests, up to `max_batch_size` at once in lockstep; the rest wait in order.

    `work(engine)` is called on a thread of its own with an engine whose forward passes are shared with the other
    running works: a copy of the in-process engine on a lockstep member. For a family that cannot batch contexts,
    and for engines in another process (shared, Ray), works run one at a time on the engine itself.
    """

    def __init__(self, engine: Engine, max_batch_size: int = DEFAULT_MAX_BATCH_SIZE) -> None:
        if isinstance(max_batch_size, bool) or not isinstance(max_batch_size, int) or max_batch_size < 1:
            raise ValueError(f"max_batch_size must be an integer >= 1 (got {max_batch_size!r})")
        self.engine = engine
        batches = isinstance(engine, InfillEngine) and engine.denoiser.batches_contexts and max_batch_size > 1
        self.capacity = max_batch_size if batches else 1
        self.lockstep = Lockstep(engine.denoiser) if batches else None
        self._threads = ThreadPoolExecutor(self.capacity, thread_name_prefix="diffill-fill")  # reused: a new
        # thread's first torch calls are slower
        self._cond = threading.Condition()
        self._pending: deque[tuple[Callable[[Any], Any], Future[Any]]] = deque()
        self._running = 0

    def submit(self, work: Callable[[Any], T]) -> Future[T]:
        """Run `work(engine)` as soon as there is room; its future holds the result or the exception."""
        return self._submit_all([work])[0]

    def run_together(self, works: Sequence[Callable[[Any], T]]) -> list[T | BaseException]:
        """Run every work (in lockstep where the family allows) and return each one's result or exception.

        Works admitted together join before any of them starts, so their first passes are shared too."""
        futures = self._submit_all(works)
        outcomes: list[T | BaseException] = []
        for future in futures:
            error = future.exception()
            outcomes.append(error if error is not None else future.result())
        return outcomes

    def report(self) -> dict[str, Any]:
        """For status pages: fills at once at most, model calls made, and the fills' calls they answered."""
        counts = self.lockstep.counts if self.lockstep is not None else None
        return {"max_batch_size": self.capacity, "forwards": counts.forwards if counts else None,
                "calls": counts.calls if counts else None}

    def close(self) -> None:
        """Start nothing more (works already running finish)."""
        with self._cond:
            for _, future in self._pending:
                future.cancel()
            self._pending.clear()
        self._threads.shutdown(wait=False)

    def _submit_all(self, works: Sequence[Callable[[Any], T]]) -> list[Future[T]]:
        futures: list[Future[T]] = [Future() for _ in works]
        with self._cond:
            self._pending.extend(zip(works, futures))
            self._start_more()
        return futures

    def _start_more(self) -> None:
        """Admit pending works while there is room (the lock is held): join them all, then start their threads."""
        admitted = []
        while self._pending and self._running < self.capacity:
            work, future = self._pending.popleft()
            if not future.set_running_or_notify_cancel():
                continue
            self._running += 1
            member = self.lockstep.member() if self.lockstep is not None else None
            admitted.append((work, future, member))
        for args in admitted:
            self._threads.submit(self._run, *args)

    def _run(self, work: Callable[[Any], Any], future: Future[Any], member: LockstepMember | None) -> None:
        try:
            engine = self.engine
            if member is not None and isinstance(engine, InfillEngine):
                engine = engine.with_denoiser(member)
            future.set_result(work(engine))
        except BaseException as error:  # noqa: BLE001 - handed to the caller through the future
            future.set_exception(error)
        finally:
            if member is not None:
                member.leave()
            with self._cond:
                self._running -= 1
                self._start_more()
