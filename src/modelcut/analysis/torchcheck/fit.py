"""Measured against simulated: the errors, and a per-action overhead and p2p latency fitted
on one schedule's run.

Model (modelcut's engine, :mod:`modelcut.core.sim.engine`): every action lasts its nominal
time plus an overhead ``c``, and an input that crosses ranks arrives ``l`` (Timing's
``p2p``) after its producer ends. Both are read off one measured run by the method of
moments, averaging over every action of every measured step:

* ``c`` = mean(measured duration − nominal duration) + mean(idle time before an action
  whose input was already there, or came from its own rank): the time the runtime spends
  in and around an action besides the controlled wait (stage bookkeeping, posting sends
  and receives, Python between actions);
* ``l`` = mean(consumer start − producer end, over cross-rank inputs the consumer sat
  waiting for) − mean(that same idle time), floored at 0: in the engine the consumer
  starts ``c``'s share of idle time plus ``l`` after the measured end of the producer.

Means, not medians, because a makespan is a sum. A least-squares fit of every action's
start and end was tried and transferred worse between schedules: on a loaded machine
it pushes the timing jitter of zero-slack chains into ``l`` (fitted ``l`` of 1-2 ms
against gloo's ~0.1 ms), which only fits the schedule it was fitted on. The fit is made
on one schedule's run and used to re-simulate the others; only that out-of-sample error
tests the model.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ...core.sim.engine import Timing, Trace, simulate
from ...core.sim.metrics import measure
from ...core.sim.ops import Schedule
from .orders import to_schedule
from .runner import Measured, Row


def timing_for(schedule: Schedule, forward_s: float, backward_s: float, weight_s: float | None,
               overhead_s: float = 0.0, p2p_s: float = 0.0) -> Timing:
    """Per-action durations (F, B, W) of every stage, each plus ``overhead_s``.

    The crosscheck's times are per action (one micro-batch through one stage), so each
    stage gets them whole, whatever v. With a split backward, B is ``backward_s −
    weight_s`` (weight default ``backward_s / 2``, modelcut's convention) and W is
    ``weight_s``; without, B is ``backward_s``. (A full backward in a split schedule,
    DualPipeV's, becomes B + W and so carries the overhead twice.)
    """
    w = backward_s / 2 if weight_s is None else weight_s
    if schedule.split_backward:
        durs = (forward_s + overhead_s, backward_s - w + overhead_s, w + overhead_s)
    else:
        durs = (forward_s + overhead_s, backward_s + overhead_s, 0.0)
    return Timing(p2p=p2p_s, stage_durations=[durs] * schedule.stages)


def simulated_rows(trace: Trace) -> list[Row]:
    return [(d, op.kind, op.microbatch, op.stage, float(s), float(e)) for d, op, s, e in trace.rows()]


def _nominal(kind: str, forward_s: float, backward_s: float, weight_s: float) -> float:
    """Nominal time of a torch action: F, B (full backward), I (input part), W."""
    return {"F": forward_s, "B": backward_s, "I": backward_s - weight_s, "W": weight_s}[kind]


def samples(measured: Measured, forward_s: float, backward_s: float,
            weight_s: float | None) -> tuple[list[float], list[float], list[float]]:
    """(excess, idle, wait): each action's duration beyond nominal; the idle time before
    each action whose input was ready (or local); the time from a cross-rank producer's
    end to the start of a consumer that was waiting for it."""
    w = backward_s / 2 if weight_s is None else weight_s
    where = measured.order.stage_rank
    n_stages = len(where)
    excess: list[float] = []
    idle: list[float] = []
    wait: list[float] = []
    for step in measured.steps:
        end: dict[tuple[str, int, int], float] = {}
        for rank in step:
            for s, k, mb, _, t1 in rank:
                end[("B" if k == "I" else k, s, mb)] = t1
        for d, rank in enumerate(step):
            for i, (s, k, mb, t0, t1) in enumerate(rank):
                excess.append(t1 - t0 - _nominal(k, forward_s, backward_s, w))
                if i == 0:
                    continue
                prev_end = rank[i - 1][4]
                dep = None
                if k == "F" and s > 0:
                    dep = ("F", s - 1, mb)
                elif k in ("B", "I") and s < n_stages - 1:
                    dep = ("B", s + 1, mb)
                if dep is not None and where[dep[1]] != d and end[dep] > prev_end:
                    wait.append(t0 - end[dep])
                else:
                    idle.append(t0 - prev_end)
    return excess, idle, wait


def fit(measured: Measured, forward_s: float, backward_s: float, weight_s: float | None) -> tuple[float, float]:
    """(overhead_s, p2p_s) read off a measured run (see the module docstring)."""
    excess, idle, wait = samples(measured, forward_s, backward_s, weight_s)

    def mean(xs: list[float]) -> float:
        return sum(xs) / len(xs) if xs else 0.0

    overhead = max(0.0, mean(excess) + mean(idle))
    p2p = max(0.0, mean(wait) - mean(idle)) if wait else 0.0
    return overhead, p2p


@dataclass
class Comparison:
    """One schedule: measured against simulated, nominal and with fitted overhead/latency."""

    measured: Measured
    simulated: Trace
    simulated_bubble: Any
    fitted: Trace | None
    fitted_on: str | None
    overhead_s: float | None
    p2p_s: float | None

    @property
    def measured_makespan_s(self) -> float:
        return self.measured.makespan

    @property
    def simulated_makespan_s(self) -> float:
        return float(self.simulated.makespan)

    @property
    def error_pct(self) -> float:
        """(measured − simulated) / simulated, in per cent."""
        return 100.0 * (self.measured_makespan_s - self.simulated_makespan_s) / self.simulated_makespan_s

    @property
    def error_with_fitted_pct(self) -> float | None:
        if self.fitted is None:
            return None
        sim = float(self.fitted.makespan)
        return 100.0 * (self.measured_makespan_s - sim) / sim


def compare(runs: list[Measured], forward_s: float, backward_s: float, weight_s: float | None,
            fit_on: str | None) -> list[Comparison]:
    """Simulate what each run executed (torch's order) with the nominal times, fit (c, l) on
    the run named ``fit_on`` and re-simulate every run with them."""
    params = None
    if fit_on is not None:
        base = next((r for r in runs if r.name == fit_on), None)
        if base is not None:
            params = fit(base, forward_s, backward_s, weight_s)
    out = []
    for r in runs:
        sched, _ = to_schedule(r.order)
        nominal = simulate(sched, timing_for(sched, forward_s, backward_s, weight_s))
        fitted = None
        if params is not None:
            fitted = simulate(sched, timing_for(sched, forward_s, backward_s, weight_s, *params))
        out.append(Comparison(r, nominal, measure(nominal).bubble, fitted, fit_on if params else None,
                              params[0] if params else None, params[1] if params else None))
    return out
