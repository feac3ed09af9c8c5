"""What communication a step exposes: the time a communication stream adds beyond compute.

A single communication stream serves requests in order, each no earlier than it is ready
(:func:`serve_in_order`); what runs past the end of compute is exposed.
"""

from __future__ import annotations

from typing import Iterable, Sequence

from ..errors import ModelcutError

def serve_in_order(requests: Iterable[tuple[float, float]], start: float = 0.0) -> float:
    """One communication stream serving (ready time, duration) requests in ready order, each
    starting when it is ready and the stream is free. Returns when the last one ends."""
    free = start
    for ready, dur in sorted(requests):
        if dur < 0:
            raise ModelcutError(f"communication time must be non-negative, got {dur}")
        free = max(free, ready) + dur
    return free


def exposed_after(compute_end: float, requests: Sequence[tuple[float, float]], overlapped: bool) -> float:
    """Communication time the step pays beyond ``compute_end``.

    Overlapped: the requests are served as they become ready (:func:`serve_in_order`) and
    only what runs past the end of compute is exposed. Not overlapped: all of them run after
    compute, back to back."""
    total = sum(d for _, d in requests)
    if not overlapped:
        return total
    return max(serve_in_order(requests) - compute_end, 0.0)


def exposed_tp(tp: float, gemm: float, overlapped: bool) -> float:
    """Tensor-parallel communication on the critical path of a pass: all of it, or, with
    ``tp_comm`` overlap, what the pass's matrix products cannot hide, max(tp − gemm, 0)."""
    return max(tp - gemm, 0.0) if overlapped else tp


def prefetch_timeline(tasks: Sequence[tuple[float, float, bool]],
                      after: Sequence[tuple[int, float]] = (),
                      record: list | None = None) -> tuple[float, float]:
    """A compute stream running ``tasks`` in order, each (gather, compute, prefetched): its
    weights must first be all-gathered (``gather`` seconds, 0 if none) on one communication
    stream.

    A prefetched task's gather is issued when the task before it starts (one module ahead, as
    ZeRO-3 and FSDP prefetch); otherwise when the task is reached. ``after`` lists (task index,
    seconds) collectives issued on the same stream when that task ends (gradient
    reduce-scatters). Requests are served in the order issued. Returns (compute end,
    communication end). ``record``, when given, receives every span as (what, task index, start,
    end), what being "gather", "compute" or "after" (a collective issued at the task's end)."""
    n = len(tasks)
    comm_free = 0.0
    t = 0.0
    gather_done: list[float | None] = [None] * n
    pending_after: dict[int, list[float]] = {}
    for i, dur in after:
        pending_after.setdefault(i, []).append(dur)

    def issue(i: int, when: float) -> None:
        nonlocal comm_free
        if i < n and gather_done[i] is None:
            begin = max(comm_free, when)
            comm_free = begin + tasks[i][0]
            gather_done[i] = comm_free
            if record is not None and tasks[i][0] > 0:
                record.append(("gather", i, begin, comm_free))

    for i in range(n):
        issue(i, t)
        start = max(t, gather_done[i])
        if i + 1 < n and tasks[i + 1][2]:
            issue(i + 1, start)
        t = start + tasks[i][1]
        if record is not None:
            record.append(("compute", i, start, t))
        for dur in pending_after.get(i, ()):
            begin = max(comm_free, t)
            comm_free = begin + dur
            if record is not None:
                record.append(("after", i, begin, comm_free))
    return t, comm_free
