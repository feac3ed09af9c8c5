"""What a simulated pipeline costs: makespan, bubble, activation memory over time."""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction
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
    memory_timeline: list[list[tuple[Any, Any]]]  # per device, (time, activations after the change)


def memory_events(trace: Trace, w_fraction: Any = W_FRACTION):
    """Per device, (time, change) in activation units: F allocates 1/v at its start;
    B frees 1/v at its end, or 1/v·(1 − w_fraction) when the backward is split; W
    frees the rest at its end. Frees sort before allocations at the same instant."""
    sched = trace.schedule
    v = sched.chunks
    unit = Fraction(1, v) if isinstance(trace.makespan, (int, Fraction)) else 1.0 / v
    split = sched.split_backward
    out = []
    for d, order in enumerate(sched.orders):
        ev = []
        for op, s, e in zip(order, trace.starts[d], trace.ends[d]):
            if op.kind == "F":
                ev.append((s, 1, unit))
            elif op.kind == "B":
                ev.append((e, 0, -unit * (1 - w_fraction) if split else -unit))
            else:
                ev.append((e, 0, -unit * w_fraction))
        ev.sort(key=lambda x: (x[0], x[1]))
        out.append([(t, x) for t, _, x in ev])
    return out


def measure(trace: Trace, w_fraction: Any = W_FRACTION) -> PipelineMetrics:
    T = trace.makespan
    P = trace.schedule.devices
    busy = [trace.busy(d) for d in range(P)]
    per_dev = [(T - b) / b if b else 0 * T for b in busy]
    total = sum(busy, start=0 * T)
    overall = (P * T - total) / total if total else 0 * T
    peaks, timelines = [], []
    for ev in memory_events(trace, w_fraction):
        cur = peak = 0 * T
        line = [(0 * T, cur)]
        for t, x in ev:
            cur += x
            if cur > peak:
                peak = cur
            if line[-1][0] == t:
                line[-1] = (t, cur)
            else:
                line.append((t, cur))
        peaks.append(peak)
        timelines.append(line)
    return PipelineMetrics(T, busy, per_dev, overall, peaks, timelines)
