"""The pipeline term of a step: the schedule's makespan with per-stage durations, from the
discrete-event engine, or from the closed form where the stages are uniform and one exists
(equal to the simulation; tests/test_stepmodel.py checks both agree)."""

from __future__ import annotations

from functools import lru_cache

from .. import plan as plans
from ..plan import PipelinePlan
from ..sim import registry
from ..sim.engine import Timing, Trace, simulate

Durations = list[tuple[float, float, float]]


@lru_cache(maxsize=2048)
def _simulated(name: str, p: int, m: int, v: int, durations: tuple) -> tuple[float, tuple[float, ...]]:
    trace = simulate(registry.build(name, p, m, v), Timing(stage_durations=list(durations)), validate=False)
    return float(trace.makespan), tuple(float(trace.busy(d)) for d in range(p))


def simulate_pipeline(plan: PipelinePlan, durations: Durations) -> tuple[float, list[float]]:
    """Makespan and per-device busy time of the plan's schedule with per-stage (F, B, W)
    durations. Memoised: makespans scale with durations, so the cache key is the durations over
    their largest (12 significant digits)."""
    scale = max((x for d in durations for x in d), default=0.0)
    if scale <= 0:
        return 0.0, [0.0] * plan.p
    key = tuple(tuple(float(f"{x / scale:.12g}") for x in d) for d in durations)
    T, busy = _simulated(plan.name, plan.p, plan.m, plan.v, key)
    return T * scale, [b * scale for b in busy]


def pipeline_time(plan: PipelinePlan, durations: Durations, force_simulation: bool = False
                  ) -> tuple[float, list[float], str]:
    """(T_pipe, busy per device, method): the closed form for uniform stages where the schedule
    has one, the simulation otherwise."""
    p, m, v = plan.p, plan.m, plan.v
    uniform = all(d == durations[0] for d in durations)
    if uniform and not force_simulation and durations:
        F, B, W = durations[0]
        split = plan.weight_apart
        cf = registry.closed_form(plan.name, p, m, v, v * F, v * B, v * W if split else None)
        if cf is not None and not (split and W == 0):
            busy = m * v * (F + B + W)
            return busy * (1 + cf), [busy] * p, "closed form (equal to the simulation)"
    T, busy = simulate_pipeline(plan, durations)
    return T, busy, "simulation"


@lru_cache(maxsize=1024)
def _trace(name: str, p: int, m: int, v: int, group: int | None, durations: tuple, p2p: float) -> Trace:
    return simulate(plans._build(name, p, m, v, group), Timing(stage_durations=list(durations), p2p=p2p),
                    validate=False)


def simulated_trace(plan: PipelinePlan, durations: Durations, p2p: float = 0.0) -> Trace:
    """The engine's trace of the plan's schedule with per-stage (F, B, W) durations and send time
    ``p2p``, shared between layouts of the same schedule shape: a trace scales with its durations
    and sends (every start and end is a sum of them), so it is simulated once per shape and ratio
    of durations (12 significant digits) and scaled."""
    scale = max([x for d in durations for x in d] + [p2p])
    if scale <= 0:
        return simulate(plan.schedule, Timing(stage_durations=list(durations), p2p=p2p), validate=False)
    key = tuple(tuple(float(f"{x / scale:.12g}") for x in d) for d in durations)
    base = _trace(plan.name, plan.p, plan.m, plan.v, plan.group, key, float(f"{p2p / scale:.12g}"))
    return Trace(plan.schedule, [[x * scale for x in row] for row in base.starts],
                 [[x * scale for x in row] for row in base.ends], [tuple(x * scale for x in d) for d in base.durations],
                 base.p2p * scale)
