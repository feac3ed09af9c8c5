"""The predicted step as a timeline: what each device does when, as the default model times it.

A :class:`Segment` is one span on one track: a pipeline device's forward, backward or
weight-gradient op of one micro-batch and virtual stage (from the discrete-event engine's trace),
the data-parallel communication its step leaves exposed after its last op, and the optimizer
step; under ZeRO-3 without a pipeline, the compute stream's units (embedding, each layer, the
loss) and the communication stream's weight all-gathers and gradient reduce-scatters
(:func:`.exposure.prefetch_timeline`). With several pipeline schedule runs a step
(:func:`..plan.flushes`) the run repeats, the optimizer stepping once at the end. The last
segment ends at the step time.

Built only when asked (``default.predict(..., timeline=True)``): a search times thousands of
layouts and keeps none of their timelines.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from typing import Sequence

#: What each op kind of a pipeline schedule is called on a timeline.
OP_KINDS = {"F": "forward", "B": "backward", "W": "weight gradient"}


@dataclass(frozen=True)
class Segment:
    """One span of a predicted step: on ``track`` (a pipeline device, or a stream), ``name`` (what
    runs), ``kind`` (forward, backward, weight gradient, data parallel, optimizer, all-gather,
    reduce-scatter), from ``start_s`` to ``end_s`` seconds into the step; ``microbatch`` and
    ``stage`` where it is one op of a schedule (else -1)."""

    track: str
    name: str
    kind: str
    start_s: float
    end_s: float
    microbatch: int = -1
    stage: int = -1


def repeated(run_segments: Sequence[Segment], flushes: int, run_s: float,
             once: Sequence[Segment] = ()) -> tuple[Segment, ...]:
    """One schedule run's segments repeated ``flushes`` times, each ``run_s`` after the last, and
    the ``once`` segments (each device's optimizer step, timed as in one run) in the last run:
    the step f·(T − optimizer) + optimizer of :func:`.default._finish`."""
    def shifted(s: Segment, by: float) -> Segment:
        return replace(s, start_s=s.start_s + by, end_s=s.end_s + by)
    out = [shifted(s, k * run_s) for k in range(flushes) for s in run_segments]
    out += [shifted(s, (flushes - 1) * run_s) for s in once]
    return tuple(out)


def optimizer_segment(track: str, start_s: float, seconds: float) -> Segment:
    """The optimizer step on ``track``."""
    return Segment(track, "optimizer step", "optimizer", start_s, start_s + seconds)


def pipeline_segments(orders, starts, ends, devices: Sequence[tuple[float, float]]) -> list[Segment]:
    """A schedule run on each pipeline device: its ops as the engine timed them (``orders``: each
    device's ops, ``starts``/``ends`` their times), then, after its last op, what its data
    parallelism leaves exposed; ``devices``: per device (last op's end, exposed seconds)."""
    out: list[Segment] = []
    for d, (order, st, en) in enumerate(zip(orders, starts, ends)):
        track = device_track(d)
        for op, s, e in zip(order, st, en):
            out.append(Segment(track, f"{op.kind}{op.microbatch} (stage {op.stage})", OP_KINDS.get(op.kind, op.kind),
                               float(s), float(e), int(op.microbatch), int(op.stage)))
        last, exposed = devices[d]
        if exposed > 0:
            out.append(Segment(track, "data parallel (exposed)", "data parallel", last, last + exposed))
    return out


#: A pipeline device's track is this prefix and its rank.
DEVICE_TRACK = "pipeline rank "


def device_track(device: int) -> str:
    """A pipeline device's track name."""
    return f"{DEVICE_TRACK}{device}"


def stream_segments(labels: Sequence[tuple[str, str]], events: Sequence[tuple[str, int, float, float]],
                    tail_s: float) -> list[Segment]:
    """ZeRO-3's two streams (:func:`.exposure.prefetch_timeline`'s ``record``): each compute task,
    ``labels[i]`` its (name, kind), on "compute"; each all-gather of its weights and each
    reduce-scatter of its gradients issued when it ends on "communication"; then ``tail_s``
    seconds of reductions the stack does not overlap, after both streams."""
    out: list[Segment] = []
    for what, i, s, e in events:
        name, kind = labels[i]
        if what == "compute":
            out.append(Segment("compute", name, kind, s, e))
        elif what == "gather":
            out.append(Segment("communication", f"all-gather for {name}", "all-gather", s, e))
        else:
            out.append(Segment("communication", f"reduce-scatter after {name}", "reduce-scatter", s, e))
    end = max((s.end_s for s in out), default=0.0)
    if tail_s > 0:
        out.append(Segment("communication", "gradient reduce-scatters (not overlapped)", "reduce-scatter",
                           end, end + tail_s))
    return out
