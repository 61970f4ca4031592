"""Fair scheduling of engine requests across clients.

Each client has its own queue; the model takes the next job from the clients in turn (round robin), so a client
that queues many requests does not starve the others. A new job that names a document supersedes the same client's
queued or running job for that document (the older one is answered "Cancelled"). A client may queue only so many.
"""

from __future__ import annotations

import threading
from collections import OrderedDict, deque
from dataclasses import dataclass, field
from typing import Any


class QueueFull(Exception):
    """The client already has as many queued requests as it may."""


@dataclass(eq=False)
class Job:
    """One request waiting for (or on) the model."""

    client: int  # connection number
    call_id: int
    method: str
    params: dict[str, Any]
    document: str | None = None
    cancelled: threading.Event = field(default_factory=threading.Event)
    reply: Any = None  # callable(result=None, failure=None), set by the server


class FairQueue:
    """Per-client FIFO queues served round robin."""

    def __init__(self, max_queued: int) -> None:
        self.max_queued = max_queued
        self._queues: OrderedDict[int, deque[Job]] = OrderedDict()
        self._running: Job | None = None
        self._cond = threading.Condition()

    def put(self, job: Job) -> list[Job]:
        """Queue `job`; the jobs it supersedes (cancelled, for the caller to answer). QueueFull when over the limit."""
        with self._cond:
            queue = self._queues.setdefault(job.client, deque())
            superseded = []
            if job.document is not None:
                superseded = [j for j in queue if j.document == job.document]
                for old in superseded:
                    queue.remove(old)
                running = self._running
                if running is not None and running.client == job.client and running.document == job.document:
                    running.cancelled.set()  # the model thread answers it when it stops
            if len(queue) >= self.max_queued:
                queue.extendleft(reversed(superseded))
                raise QueueFull(f"this client already has {len(queue)} queued requests (the limit)")
            for old in superseded:
                old.cancelled.set()
            queue.append(job)
            self._cond.notify()
            return superseded

    def take(self, timeout: float) -> Job | None:
        """The next job, taking clients in turn; None after `timeout` s without one."""
        with self._cond:
            if not any(self._queues.values()):
                self._cond.wait(timeout)
            for client in list(self._queues):
                queue = self._queues[client]
                self._queues.move_to_end(client)  # this client goes to the back of the line
                if queue:
                    self._running = queue.popleft()
                    return self._running
            return None

    def done(self, job: Job) -> None:
        """The model let go of `job`."""
        with self._cond:
            if self._running is job:
                self._running = None

    def cancel(self, client: int, call_id: int) -> Job | None:
        """Cancel a client's job; the job when it was still queued (the caller answers it), else None."""
        with self._cond:
            running = self._running
            if running is not None and running.client == client and running.call_id == call_id:
                running.cancelled.set()
                return None
            queue = self._queues.get(client, deque())
            for job in queue:
                if job.call_id == call_id:
                    queue.remove(job)
                    job.cancelled.set()
                    return job
            return None

    def drop_client(self, client: int) -> None:
        """Forget a disconnected client's jobs and stop its running one."""
        with self._cond:
            for job in self._queues.pop(client, deque()):
                job.cancelled.set()
            if self._running is not None and self._running.client == client:
                self._running.cancelled.set()

    def running(self) -> Job | None:
        """The job on the model now."""
        with self._cond:
            return self._running

    def queued(self) -> int:
        """Jobs waiting, all clients together."""
        with self._cond:
            return sum(len(q) for q in self._queues.values())
