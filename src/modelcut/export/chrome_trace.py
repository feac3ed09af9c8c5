"""Chrome trace-event JSON for a pipeline timeline, to open in Perfetto (ui.perfetto.dev)
or chrome://tracing.

Format: the Trace Event Format's JSON object form, ``{"traceEvents": [...]}``, with
complete events (``"ph": "X"``, ``ts`` and ``dur`` in microseconds), metadata events
naming each process and thread (``process_name``, ``thread_name``, ``*_sort_index``) and
counter events (``"ph": "C"``) for activation memory. Each timeline is one process
(``pid``); each device is one thread (track) in it.

Colour: chrome://tracing honours ``cname``, which is set by micro-batch from its reserved
colour names. Perfetto ignores ``cname`` and colours a slice by its name with the digits
taken out, so there F, B and W each get one colour.

Simulated time is in abstract units; :func:`to_trace` shows one unit as one second
unless told otherwise (``unit_seconds``).
"""

from __future__ import annotations

from operator import index
from typing import Any, Iterable, Sequence

from ..core.errors import ModelcutError
from ..core.sim.run import PipelineResult
from ..core.step.timeline import DEVICE_TRACK

#: Reserved colour names of the legacy trace viewer (catapult
#: tracing/tracing/base/color_scheme.html), in an order that keeps neighbours distinct.
CNAMES = ["thread_state_running", "thread_state_iowait", "rail_response", "thread_state_runnable",
          "rail_animation", "thread_state_uninterruptible", "rail_load", "cq_build_passed", "olive",
          "rail_idle", "cq_build_failed", "yellow", "good", "terrible", "generic_work", "startup"]

KIND_NAMES = {"F": "forward", "B": "backward", "W": "weight gradient"}

#: One row of a timeline: (device, kind, micro-batch, stage, start in s, end in s).
Row = tuple[int, str, int, int, float, float]


def _us(seconds: Any) -> float:
    return round(float(seconds) * 1e6, 6)


def to_trace_multi(timelines: Sequence[tuple[str, Iterable[Row]]],
                   counters: Sequence[dict[str, Sequence[tuple[float, float]]] | None] | None = None,
                   metadata: dict | None = None) -> dict:
    """Several timelines side by side, one process each, in the order given.

    ``timelines`` is a list of (label, rows), each row (device, kind, micro-batch, stage,
    start_s, end_s). ``counters``, if given, holds for each timeline a dict from a
    counter's name to its (time_s, value) points, or None. ``metadata`` goes under
    ``otherData``.
    """
    events: list[dict] = []
    max_dev = 0
    checked = []
    for name, rows in timelines:
        clean = []
        for r in rows:
            if len(r) != 6:
                raise ModelcutError(f"timeline {name!r}: a row needs (device, kind, micro-batch, stage, "
                                    f"start_s, end_s), got {r!r}")
            d, kind, mb, stage, a, b = r
            try:
                d, mb, stage = index(d), index(mb), index(stage)
                a, b = float(a), float(b)
            except (TypeError, ValueError):
                raise ModelcutError(f"timeline {name!r}: device, micro-batch and stage must be integers "
                                    f"and times numbers, got {r!r}") from None
            if d < 0:
                raise ModelcutError(f"timeline {name!r}: device must be non-negative, got {d}")
            if not b >= a:
                raise ModelcutError(f"timeline {name!r}: op {kind}{mb} on device {d} ends ({b}) "
                                    f"before it starts ({a})")
            max_dev = max(max_dev, d)
            clean.append((d, str(kind), mb, stage, a, b))
        checked.append((name, clean))
    stride = 1000
    while stride <= max_dev:
        stride *= 10
    for k, (name, rows) in enumerate(checked):
        pid = k + 1
        events.append({"name": "process_name", "ph": "M", "pid": pid, "tid": 0, "args": {"name": name}})
        events.append({"name": "process_sort_index", "ph": "M", "pid": pid, "tid": 0, "args": {"sort_index": k}})
        devices = sorted({r[0] for r in rows})
        for d in devices:
            tid = k * stride + d  # thread ids unique across processes
            events.append({"name": "thread_name", "ph": "M", "pid": pid, "tid": tid,
                           "args": {"name": f"device {d}"}})
            events.append({"name": "thread_sort_index", "ph": "M", "pid": pid, "tid": tid,
                           "args": {"sort_index": d}})
        for d, kind, mb, stage, a, b in rows:
            events.append({
                "name": f"{kind}{mb}",
                "cat": KIND_NAMES.get(kind, kind),
                "ph": "X",
                "ts": _us(a),
                "dur": _us(b) - _us(a),
                "pid": pid,
                "tid": k * stride + d,
                "cname": CNAMES[mb % len(CNAMES)],
                "args": {"kind": kind, "microbatch": mb, "stage": stage, "device": d},
            })
        series = (counters[k] if counters and k < len(counters) else None) or {}
        for cname, points in series.items():
            for t, value in points:
                events.append({"name": cname, "ph": "C", "ts": _us(t), "pid": pid,
                               "args": {"value": float(value)}})
    out: dict[str, Any] = {"traceEvents": events, "displayTimeUnit": "ms"}
    if metadata:
        out["otherData"] = metadata
    return out


def rows(result: PipelineResult, unit_seconds: float = 1.0) -> list[Row]:
    """The simulated ops as timeline rows, ``unit_seconds`` seconds per time unit."""
    return [(d, op.kind, op.microbatch, op.stage, float(a) * unit_seconds, float(b) * unit_seconds)
            for d, op, a, b in result.trace.rows()]


def to_trace(result: PipelineResult, unit_seconds: float = 1.0, label: str | None = None,
             memory: bool = True) -> dict:
    """One simulated pipeline as a trace: a track per device, and (``memory``) a counter
    per device of its activations, in units of one micro-batch's activations for the
    device's whole share of layers."""
    s, m = result.schedule, result.metrics
    label = label or f"{s.name} p={s.devices} m={s.microbatches} v={s.chunks} (simulated)"
    counters = None
    if memory:
        counters = [{f"activations, device {d}": [(float(t) * unit_seconds, x) for t, x in line]
                     for d, line in enumerate(m.memory_timeline)}]
    meta = {"schedule": s.name, "devices": s.devices, "microbatches": s.microbatches, "chunks": s.chunks,
            "seconds_per_time_unit": unit_seconds, "makespan": float(m.makespan),
            "bubble": float(m.bubble),
            "closed_form_bubble": None if result.closed_form_bubble is None else float(result.closed_form_bubble)}
    return to_trace_multi([(label, rows(result, unit_seconds))], counters, meta)


#: Where each track of a predicted step sits, and what each segment kind is coloured as in the legacy
#: viewer (Perfetto colours by name).
_STEP_CNAMES = {"forward": "thread_state_running", "backward": "thread_state_iowait",
                "weight gradient": "rail_response", "data parallel": "terrible", "optimizer": "yellow",
                "all-gather": "rail_load", "reduce-scatter": "cq_build_failed"}


def _track_order(track: str) -> tuple[int, int, str]:
    """Pipeline ranks in rank order, then the compute stream, then the communication stream."""
    if track.startswith(DEVICE_TRACK):
        return 0, int(track[len(DEVICE_TRACK):]), track
    return (1, 0, track) if track == "compute" else (2, 0, track)


def step_trace(segments: Iterable, label: str, metadata: dict | None = None) -> dict:
    """A predicted step (:mod:`modelcut.core.step.timeline` segments, seconds) as a trace: one
    process, a track (thread) per pipeline device or stream, a complete event per segment named
    as the timeline names it, its kind the category."""
    segs = list(segments)
    if not segs:
        raise ModelcutError("the prediction has no timeline to write")
    tracks = sorted({s.track for s in segs}, key=_track_order)
    tid = {t: i + 1 for i, t in enumerate(tracks)}
    events: list[dict] = [{"name": "process_name", "ph": "M", "pid": 1, "tid": 0, "args": {"name": label}}]
    for t, i in tid.items():
        events.append({"name": "thread_name", "ph": "M", "pid": 1, "tid": i, "args": {"name": t}})
        events.append({"name": "thread_sort_index", "ph": "M", "pid": 1, "tid": i, "args": {"sort_index": i}})
    for s in segs:
        if not s.end_s >= s.start_s:
            raise ModelcutError(f"timeline: {s.name} on {s.track} ends ({s.end_s}) before it starts ({s.start_s})")
        args: dict[str, Any] = {"seconds": s.end_s - s.start_s}
        if s.microbatch >= 0:
            args.update(microbatch=s.microbatch, stage=s.stage)
        events.append({"name": s.name, "cat": s.kind, "ph": "X", "ts": _us(s.start_s),
                       "dur": _us(s.end_s) - _us(s.start_s), "pid": 1, "tid": tid[s.track],
                       "cname": _STEP_CNAMES.get(s.kind, "generic_work"), "args": args})
    out: dict[str, Any] = {"traceEvents": events, "displayTimeUnit": "ms"}
    if metadata:
        out["otherData"] = metadata
    return out
