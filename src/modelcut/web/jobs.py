"""What the server's worker pool runs (:mod:`.pool`): the service's long use cases, reporting
progress as (job id, done, total) on the pool's queue. Each returns plain data, or
``{"error": message, "limit": bool}`` for a one-line refusal (exceptions of the core do not
all cross a process boundary intact)."""

from __future__ import annotations

import io
import threading
import time
from typing import Any, Callable

from ..core.errors import ModelcutError
from ..export import pipeline_json
from ..service.explore import explore_input
from ..service.limits import LimitError, Limits
from ..service.requests import ExploreInput, SimulateInput
from ..service.simulate import simulate_input

#: The pool's progress queue, in this worker process (set by :func:`init`).
EVENTS: Any = None
_thread = threading.local()   # a thread pool's queue, per worker thread (:func:`in_thread`)


def init(events: Any) -> None:
    """A worker process's start: where its progress goes."""
    global EVENTS
    EVENTS = events


def in_thread(events: Any, fn: Callable[..., Any], *args: Any) -> Any:
    """Run a job in a thread of the server's own process, its progress to ``events``."""
    _thread.events = events
    try:
        return fn(*args)
    finally:
        _thread.events = None


def _report(job_id: int):
    """The job's progress callback: (done, total) onto the pool's queue, at most every 0.1 s and
    always the last; the callback's ``seen`` holds the latest pair, which the job hands back with
    its answer (the queue's reader may not have passed the last pair on when the answer lands)."""
    last = [0.0]
    events = getattr(_thread, "events", None) or EVENTS

    def progress(done: int, total: int | None) -> None:
        progress.seen = (done, total)
        now = time.monotonic()
        if events is not None and (now - last[0] >= 0.1 or (total is not None and done >= total)):
            last[0] = now
            events.put((job_id, done, total))
    progress.seen = (0, None)
    return progress


def _refusal(exc: ModelcutError) -> dict[str, Any]:
    return {"error": str(exc), "limit": isinstance(exc, LimitError)}


def explore(job_id: int, inp: ExploreInput, limits: Limits) -> dict[str, Any]:
    """The explorer's search, its answer as ``modelcut explore --json`` prints it."""
    progress = _report(job_id)
    progress(0, None)
    try:
        result = explore_input(inp, limits, progress).as_dict()
    except ModelcutError as exc:
        return _refusal(exc)
    done, total = progress.seen
    return {"result": result, "progress": {"done": done, "total": total}}


def simulate(job_id: int, inp: SimulateInput, limits: Limits, exact_up_to: int) -> dict[str, Any]:
    """A simulation, its answer as the JSON text of ``modelcut simulate --json``."""
    _report(job_id)(0, None)
    try:
        sim = simulate_input(inp, limits, exact_up_to)
    except ModelcutError as exc:
        return _refusal(exc)
    buf = io.StringIO()
    pipeline_json.write(sim.result, buf, sim.notes)
    return {"text": buf.getvalue()}
