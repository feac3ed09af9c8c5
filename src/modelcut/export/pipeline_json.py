"""The documented JSON object for a simulated pipeline (``modelcut simulate --json``,
``POST /api/simulate``).

Keys: ``schedule, devices, microbatches, chunks, stages, makespan, bubble`` (overall,
idle over busy), ``bubble_per_device``, ``closed_form_bubble`` (null where the schedule
has none for these sizes and timings), ``peak_activations`` (one per device, in units of
one micro-batch's activations for the device's whole share of layers), ``timing``,
``memory_timeline`` (per device, [time, activations] after each change) and ``ops``
(``{device, kind, microbatch, chunk, stage, start, end}``; ``chunk`` is the op's chunk
index on its device, ``stage`` its virtual stage) and ``notes`` (what the timing means for this
schedule, e.g. a weight time added to B where the backward is not split).

:func:`write` streams the same text as ``json.dumps(to_dict(result))`` to a file, device by
device, without holding the object: ``simulate --json`` of millions of ops stays within a few
hundred megabytes.
"""

from __future__ import annotations

import json
from typing import Any, Iterable, TextIO

from ..core.sim.run import PipelineResult


def num(x: Any) -> float | None:
    return None if x is None else float(x)


def chunk_index(result: PipelineResult) -> dict[int, int]:
    """Stage -> its chunk index on its device (the device's stages in ascending order)."""
    idx: dict[int, int] = {}
    for order in result.schedule.orders:
        for k, s in enumerate(sorted({op.stage for op in order})):
            idx[s] = k
    return idx


def _head(result: PipelineResult) -> dict:
    s, m, t = result.schedule, result.metrics, result.timing
    return {
        "schedule": s.name,
        "devices": s.devices,
        "microbatches": s.microbatches,
        "chunks": s.chunks,
        "stages": s.stages,
        "makespan": num(m.makespan),
        "bubble": num(m.bubble),
        "bubble_per_device": [num(x) for x in m.bubble_per_device],
        "closed_form_bubble": num(result.closed_form_bubble),
        "peak_activations": [num(x) for x in m.peak_activations],
        "timing": {"forward": num(t.forward), "backward": num(t.backward), "weight": num(t.weight),
                   "p2p": num(t.p2p), "split_backward": s.split_backward},
    }


def to_dict(result: PipelineResult, include_ops: bool = True, notes: Iterable[str] = ()) -> dict:
    out = _head(result)
    out["memory_timeline"] = [[[num(a), num(b)] for a, b in line] for line in result.metrics.memory_timeline]
    chunk = chunk_index(result)
    if include_ops:
        out["ops"] = [
            {"device": d, "kind": op.kind, "microbatch": op.microbatch, "chunk": chunk[op.stage],
             "stage": op.stage, "start": num(a), "end": num(b)}
            for d, op, a, b in result.trace.rows()
        ]
    out["notes"] = list(notes)
    return out


#: One op of ``ops`` as ``json.dumps`` writes it.
_OP = '{"device": %d, "kind": "%s", "microbatch": %d, "chunk": %d, "stage": %d, "start": %s, "end": %s}'


class _Reprs(dict):
    """A time's JSON text (the repr of its float, as ``json.dumps`` writes it), made once."""

    def __missing__(self, x):
        text = self[x] = repr(float(x))
        return text


def write(result: PipelineResult, fp: TextIO, notes: Iterable[str] = (), chunk_ops: int = 20_000) -> None:
    """Write ``json.dumps(to_dict(result, notes=notes))`` to ``fp``, a device's timeline and a few
    thousand ops at a time."""
    head = json.dumps(_head(result))
    fp.write(head[:-1] + ', "memory_timeline": [')
    for d, line in enumerate(result.metrics.memory_timeline):
        fp.write((", " if d else "") + json.dumps([[num(a), num(b)] for a, b in line]))
    fp.write('], "ops": [')
    chunk = chunk_index(result)
    trace, first = result.trace, True
    text = _Reprs()   # a pipeline's times repeat (an op starts as the one before it ends): each written once
    for d, order in enumerate(result.schedule.orders):
        if len(text) > 100_000:
            text.clear()
        for k in range(0, len(order), chunk_ops):   # a few thousand ops a write
            part = ", ".join([_OP % (d, op.kind, op.microbatch, chunk[op.stage], op.stage, text[a], text[b])
                              for op, a, b in zip(order[k:k + chunk_ops], trace.starts[d][k:k + chunk_ops],
                                                  trace.ends[d][k:k + chunk_ops])])
            fp.write(part if first else ", " + part)
            first = False
    fp.write('], "notes": ' + json.dumps(list(notes)) + "}")
