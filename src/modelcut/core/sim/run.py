"""One call from a schedule's name and sizes to its simulated timeline and costs."""

from __future__ import annotations

from dataclasses import dataclass
from fractions import Fraction
from typing import Any

from . import registry
from .engine import Timing, Trace, simulate
from .metrics import W_FRACTION, PipelineMetrics, measure
from .ops import Schedule


@dataclass
class PipelineResult:
    schedule: Schedule
    timing: Timing
    trace: Trace
    metrics: PipelineMetrics
    closed_form_bubble: Any | None


def closed_form_for(schedule: Schedule, timing: Timing) -> Any | None:
    """The closed form, where the schedule has one and the timing is the ideal it assumes
    (uniform stages, free sends)."""
    if timing.stage_scale is not None or timing.stage_durations is not None:
        return None
    if timing.p2p:
        return None
    if schedule.name not in registry.SCHEDULES:   # a custom order (an action CSV): no formula claimed
        return None
    return registry.closed_form(schedule.name, schedule.devices, schedule.microbatches, schedule.chunks,
                                timing.forward, timing.backward, timing.weight)


def run(schedule: Schedule, timing: Timing | None = None, w_fraction: Any = W_FRACTION) -> PipelineResult:
    timing = timing or Timing()
    trace = simulate(schedule, timing)
    return PipelineResult(schedule, timing, trace, measure(trace, w_fraction), closed_form_for(schedule, timing))


def run_named(name: str, p: int, m: int, v: int | None = None, timing: Timing | None = None,
              exact: bool = False) -> PipelineResult:
    """Build and simulate a named schedule. ``exact`` turns the timing into Fractions."""
    timing = timing or Timing()
    if exact:
        timing = exact_timing(timing)
    return run(registry.build(name, p, m, v), timing)


def exact_timing(t: Timing) -> Timing:
    def fr(x):
        return None if x is None else Fraction(str(x)) if isinstance(x, float) else Fraction(x)
    return Timing(fr(t.forward), fr(t.backward), fr(t.weight), fr(t.p2p),
                  None if t.stage_scale is None else [fr(x) for x in t.stage_scale],
                  None if t.stage_durations is None else [tuple(fr(x) for x in s) for s in t.stage_durations])


#: The deck's bubble table (results.md §12): schedule, p, m, v.
DECK_BUBBLE_TABLE = [
    ("gpipe", 4, 8, 1), ("1f1b", 4, 8, 1), ("interleaved", 4, 8, 2), ("interleaved", 4, 8, 4),
    ("1f1b", 8, 32, 1), ("interleaved", 8, 32, 4), ("gpipe", 16, 32, 1), ("1f1b", 16, 64, 1),
]


def bubble_table() -> list[tuple[str, int, int, int, Fraction, Fraction]]:
    """Each deck row simulated in exact arithmetic beside its closed form."""
    rows = []
    for name, p, m, v in DECK_BUBBLE_TABLE:
        r = run_named(name, p, m, v, exact=True)
        rows.append((name, p, m, v, r.metrics.bubble, r.closed_form_bubble))
    return rows
