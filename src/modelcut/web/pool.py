"""The server's bounded pool for long requests (layout searches, large simulations).

``workers`` jobs run at once, each in a worker process of its own (the server's process keeps
answering small requests meanwhile); ``queue`` more may wait. Beyond that :meth:`Pool.submit`
raises :class:`Busy` at once, and the app answers 429 with ``Retry-After`` rather than queueing
without limit; a pool whose workers died raises :class:`Unavailable` (503). A job reports its
progress, (done, total), which the streaming endpoint passes on.

Workers run :mod:`.jobs`, which calls the service: the pool holds no use case.
"""

from __future__ import annotations

import asyncio
import itertools
import math
import multiprocessing
import os
import queue as queue_mod
import threading
import time
from concurrent.futures import Future, ProcessPoolExecutor, ThreadPoolExecutor
from concurrent.futures.process import BrokenProcessPool
from dataclasses import dataclass, field
from typing import Any, Callable

from . import jobs


class Busy(Exception):
    """Every worker is busy and the queue is full: retry after ``retry_after`` seconds."""

    def __init__(self, message: str, retry_after: int):
        super().__init__(message)
        self.retry_after = retry_after


class Unavailable(Exception):
    """The pool cannot run jobs (its workers died, or the server is stopping)."""

    def __init__(self, message: str, retry_after: int = 5):
        super().__init__(message)
        self.retry_after = retry_after


@dataclass
class Job:
    id: int
    future: Future
    submitted: float = field(default_factory=time.monotonic)
    started: float | None = None
    done: int = 0
    total: int | None = None

    def progress(self) -> dict[str, Any]:
        return {"done": self.done, "total": self.total, "running": self.started is not None}


class Place:
    """An admitted request's place in the pool until its job is submitted (or it gives up)."""

    def __init__(self, pool: "Pool"):
        self._pool, self._open = pool, True

    def used(self) -> None:
        """The job took the place (called with the pool's lock held)."""
        if self._open:
            self._open = False
            self._pool._held -= 1

    def release(self) -> None:
        if self._open:
            self._open = False
            self._pool._release()

    def __enter__(self) -> "Place":
        return self

    def __exit__(self, *exc) -> None:
        self.release()


def default_workers() -> int:
    """One worker per core but one, at least one: the server's process keeps a core."""
    return max(1, (os.cpu_count() or 2) - 1)


class Pool:
    """A bounded pool of worker processes (``kind="process"``) or threads (``"thread"``, for
    callers that cannot start processes)."""

    def __init__(self, workers: int | None = None, queue: int | None = None, kind: str = "process"):
        if kind not in ("process", "thread"):
            raise ValueError(f"pool kind must be process or thread, got {kind!r}")
        self.workers = workers or default_workers()
        self.queue = self.workers * 2 if queue is None else queue
        self.kind = kind
        self._lock = threading.Lock()
        self._jobs: dict[int, Job] = {}
        self._ids = itertools.count(1)
        self._executor: ProcessPoolExecutor | ThreadPoolExecutor | None = None
        self._events: Any = None
        self._reader: threading.Thread | None = None
        self._durations: list[float] = []
        self._closed = False
        self._held = 0      # places admitted but not yet submitted (their checks run in the server)

    # -- lifecycle --------------------------------------------------------------------------------

    def _start(self) -> None:
        if self._executor is not None:
            return
        if self.kind == "thread":
            self._events = queue_mod.SimpleQueue()
            self._executor = ThreadPoolExecutor(self.workers, thread_name_prefix="modelcut-search")
        else:
            ctx = multiprocessing.get_context("spawn")   # no fork of a threaded server
            self._events = ctx.SimpleQueue()
            self._executor = ProcessPoolExecutor(self.workers, mp_context=ctx, initializer=jobs.init,
                                                 initargs=(self._events,))
        self._reader = threading.Thread(target=self._read, name="modelcut-progress", daemon=True)
        self._reader.start()

    def _read(self) -> None:
        events = self._events
        while True:
            try:
                ev = events.get()
            except (EOFError, OSError):
                return
            if ev is None:
                return
            job_id, done, total = ev
            job = self._jobs.get(job_id)
            if job is not None:
                if job.started is None:
                    job.started = time.monotonic()
                job.done, job.total = done, total

    def open(self) -> None:
        """Take jobs again after :meth:`close` (a server started anew); workers start with the first."""
        with self._lock:
            self._closed = False

    def close(self) -> None:
        with self._lock:
            self._closed = True
            ex, self._executor = self._executor, None
        if ex is not None:
            # Stop the workers now, a search half done included: the server is going away.
            procs = list((getattr(ex, "_processes", None) or {}).values())
            ex.shutdown(wait=False, cancel_futures=True)
            for proc in procs:
                if proc.is_alive():
                    proc.terminate()
            for proc in procs:
                proc.join(timeout=5)
            try:
                self._events.put(None)
            except (OSError, ValueError):
                pass

    # -- jobs -------------------------------------------------------------------------------------

    @property
    def admitted(self) -> int:
        return len(self._jobs) + self._held

    def retry_after(self) -> int:
        """Seconds until a place is likely free: the recent jobs' mean time, per worker."""
        mean = sum(self._durations) / len(self._durations) if self._durations else 5.0
        waiting = max(self.admitted - self.workers + 1, 1)
        return int(min(max(math.ceil(mean * waiting / self.workers), 1), 120))

    def admit(self) -> "Place":
        """A place in the pool, or :class:`Busy` at once: taken before a request's own checks, so
        that a flood of searches costs the server nothing beyond the refusal."""
        with self._lock:
            if self._closed:
                raise Unavailable("the server is stopping")
            if self.admitted >= self.workers + self.queue:
                raise Busy(f"the server is busy: {self.workers} running and {self.queue} waiting, the most it "
                           f"takes; retry in {self.retry_after()} s", self.retry_after())
            self._held += 1
        return Place(self)

    def _release(self) -> None:
        with self._lock:
            self._held -= 1

    def submit(self, fn: Callable[..., Any], *args: Any, place: "Place | None" = None) -> Job:
        """Run ``fn(job_id, *args)`` in a worker (a function of :mod:`.jobs`) in the place
        admitted (:meth:`admit`), or in a new one; :class:`Busy` when every place is taken."""
        place = place or self.admit()
        with self._lock:
            place.used()
            if self._closed:
                raise Unavailable("the server is stopping")
            self._start()
            job_id = next(self._ids)
            try:
                if self.kind == "thread":
                    fut = self._executor.submit(jobs.in_thread, self._events, fn, job_id, *args)
                else:
                    fut = self._executor.submit(fn, job_id, *args)
            except (BrokenProcessPool, RuntimeError):
                self._executor = None     # start a fresh pool for the next job
                raise Unavailable("the search workers stopped; retry shortly") from None
            job = self._jobs[job_id] = Job(job_id, fut)
        fut.add_done_callback(lambda f, j=job: self._finish(j))
        return job

    def _finish(self, job: Job) -> None:
        with self._lock:
            self._jobs.pop(job.id, None)
            if job.started is not None:
                self._durations = (self._durations + [time.monotonic() - job.started])[-20:]
            if isinstance(job.future.exception(), BrokenProcessPool):
                self._executor = None

    async def result(self, job: Job) -> Any:
        """The job's result (its exception re-raised); :class:`Unavailable` if its worker died."""
        try:
            return await asyncio.wrap_future(job.future)
        except BrokenProcessPool:
            raise Unavailable("a search worker stopped while running this request; retry shortly") from None
