"""The documented JSON object for a simulated pipeline (``modelcut simulate --json``,
``POST /api/simulate``).

Keys: ``schedule, devices, microbatches, chunks, stages, makespan, bubble`` (overall,
idle over busy), ``bubble_per_device``, ``closed_form_bubble`` (null where the schedule
has none for these sizes and timings), ``peak_activations`` (one per device, in units of
one micro-batch's activations for the device's whole share of layers), ``timing``,
``memory_timeline`` (per device, [time, activations] after each change) and ``ops``
(``{device, kind, microbatch, chunk, stage, start, end}``; ``chunk`` is the op's chunk
index on its device, ``stage`` its virtual stage).
"""

from __future__ import annotations

from typing import Any

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


def to_dict(result: PipelineResult, include_ops: bool = True) -> dict:
    s, m, t = result.schedule, result.metrics, result.timing
    chunk = chunk_index(result)
    out = {
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
        "memory_timeline": [[[num(a), num(b)] for a, b in line] for line in m.memory_timeline],
    }
    if include_ops:
        out["ops"] = [
            {"device": d, "kind": op.kind, "microbatch": op.microbatch, "chunk": chunk[op.stage],
             "stage": op.stage, "start": num(a), "end": num(b)}
            for d, op, a, b in result.trace.rows()
        ]
    return out
