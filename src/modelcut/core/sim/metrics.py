"""What a simulated pipeline costs: makespan, bubble, activation memory over time."""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction
from array import array
from collections.abc import Sequence
from typing import Any

from .engine import Trace

#: Fraction of a micro-batch's activations that the weight-gradient pass W still needs
#: after B. Qi et al. 2024 (Zero Bubble Pipeline Parallelism), §2 and Table 1, per
#: transformer layer (the accounting of Korthikanti et al. 2022): B needs the forward's
#: activations, M_B = 34·s·b·h + 5·a·s²·b; W needs only M_W = 32·s·b·h of them. So B frees
#: M_B − M_W and W the rest. The authors' scheduler uses the same figures per token
#: (sail-sg/zero-bubble-pipeline-parallelism: mem_f = 34h + 5as, mem_w = −32h,
#: mem_b = −mem_w − mem_f). modelcut drops the attention-score term 5·a·s²·b, which
#: FlashAttention and selective recomputation do not store: M_W/M_B = 32/34.
W_FRACTION = Fraction(32, 34)


@dataclass
class PipelineMetrics:
    makespan: Any
    busy: list[Any]
    bubble_per_device: list[Any]
    bubble: Any                 # overall: (p·T − Σ busy)/Σ busy
    peak_activations: list[Any]  # per device, units of one micro-batch × the device's whole share
    memory_timeline: Sequence[list[tuple[Any, Any]]]  # per device, (time, activations after the change)


def device_events(trace: Trace, d: int, w_fraction: Any = W_FRACTION, split: bool | None = None
                  ) -> list[tuple[Any, Any]]:
    """Device d's (time, change) in activation units (:func:`memory_events`); ``split``: whether
    the schedule splits the backward (read off the lists when not given)."""
    sched = trace.schedule
    v = sched.chunks
    unit = Fraction(1, v) if isinstance(trace.makespan, (int, Fraction)) else 1.0 / v
    split = sched.split_backward if split is None else split
    freed_b = -unit * (1 - w_fraction) if split else -unit
    freed_w = -unit * w_fraction
    ev = []
    for op, s, e in zip(sched.orders[d], trace.starts[d], trace.ends[d]):
        if op.kind == "F":
            ev.append((s, 1, unit))
        elif op.kind == "B":
            ev.append((e, 0, freed_b))
        else:
            ev.append((e, 0, freed_w))
    ev.sort(key=lambda x: (x[0], x[1]))
    return [(t, x) for t, _, x in ev]


def memory_events(trace: Trace, w_fraction: Any = W_FRACTION):
    """Per device, (time, change) in activation units: F allocates 1/v at its start;
    B frees 1/v at its end, or 1/v·(1 − w_fraction) when the backward is split; W
    frees the rest at its end. Frees sort before allocations at the same instant."""
    split = trace.schedule.split_backward
    return [device_events(trace, d, w_fraction, split) for d in range(trace.schedule.devices)]


def device_timeline(trace: Trace, d: int, w_fraction: Any = W_FRACTION, split: bool | None = None
                    ) -> tuple[list[tuple[Any, Any]], Any]:
    """Device d's activations after each change, [(time, activations)], and their peak."""
    zero = 0 * trace.makespan
    cur = peak = zero
    line = [(zero, cur)]
    for t, x in device_events(trace, d, w_fraction, split):
        cur += x
        if cur > peak:
            peak = cur
        if line[-1][0] == t:
            line[-1] = (t, cur)
        else:
            line.append((t, cur))
    return line, peak


class Timelines(Sequence):
    """Every device's memory timeline. Schedules of up to :data:`KEPT_UP_TO` ops keep each
    timeline as its list; larger ones in floats keep them as two arrays of floats per device (16
    bytes a change, not a tuple and two objects), the lists made when read; otherwise each
    device's is computed again when read."""

    def __init__(self, trace: Trace, w_fraction: Any, kept: list | None = None, split: bool | None = None,
                 packed: list | None = None):
        self._trace, self._w, self._kept, self._packed = trace, w_fraction, kept, packed
        self._split = trace.schedule.split_backward if split is None and kept is None else split

    def __len__(self) -> int:
        return self._trace.schedule.devices

    def __getitem__(self, d):
        if isinstance(d, slice):
            return [self[i] for i in range(*d.indices(len(self)))]
        if not -len(self) <= d < len(self):
            raise IndexError(d)
        d %= len(self)
        if self._kept is not None:
            return self._kept[d]
        if self._packed is not None:
            times, values = self._packed[d]
            return list(zip(times, values))
        return device_timeline(self._trace, d, self._w, self._split)[0]

    def __eq__(self, other) -> bool:
        return list(self) == list(other)

    def __repr__(self) -> str:
        return repr(list(self))


#: Schedules up to this many ops keep their memory timelines as lists.
KEPT_UP_TO = 200_000


def _packed(line: list[tuple[Any, Any]]):
    """A timeline as two arrays of floats, or None when its numbers are not all floats."""
    times, values = array("d"), array("d")
    for t, x in line:
        if type(t) is not float or type(x) is not float:
            return None
        times.append(t)
        values.append(x)
    return times, values


def measure(trace: Trace, w_fraction: Any = W_FRACTION) -> PipelineMetrics:
    T = trace.makespan
    P = trace.schedule.devices
    busy = [trace.busy(d) for d in range(P)]
    per_dev = [(T - b) / b if b else 0 * T for b in busy]
    total = sum(busy, start=0 * T)
    overall = (P * T - total) / total if total else 0 * T
    keep = trace.schedule.num_ops <= KEPT_UP_TO
    split = trace.schedule.split_backward
    peaks, lines, packed = [], [], []
    for d in range(P):
        line, peak = device_timeline(trace, d, w_fraction, split)
        peaks.append(peak)
        if keep:
            lines.append(line)
        elif packed is not None:
            p = _packed(line)
            if p is None:
                packed = None
            else:
                packed.append(p)
    return PipelineMetrics(T, busy, per_dev, overall, peaks,
                           Timelines(trace, w_fraction, lines if keep else None, split, None if keep else packed))
