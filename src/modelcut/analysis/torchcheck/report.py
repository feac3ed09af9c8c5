"""One crosscheck: order checks, real runs, the fit, and the figures the faces print.

:func:`crosscheck` returns one :class:`Entry` per schedule asked for; ``Entry.as_dict()``
is the documented JSON object (``order_matches, first_difference, simulated_makespan_s,
measured_makespan_s, error_pct, fitted_overhead_s, fitted_p2p_s, error_with_fitted_pct``
and a few more). Times are per action (one micro-batch through one stage), in seconds.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from ...core.errors import ModelcutError
from . import require_torch
from .fit import Comparison, compare, simulated_rows
from .orders import TORCH_CLASS, check, declared_difference, is_multi, schedule_class, torch_order
from .runner import Row, run

_MODELCUT_NAME = {cls: name for name, cls in TORCH_CLASS.items()}
#: The torch classes a fit may be made on, in order of preference (see :func:`default_fit_on`).
_FIT_CANDIDATES = ("ScheduleGPipe", "Schedule1F1B", "ScheduleLoopedBFS")
_ONE_F_ONE_B = _MODELCUT_NAME["Schedule1F1B"]


@dataclass
class Entry:
    name: str                    # as asked (modelcut name or torch class)
    class_name: str
    devices: int
    microbatches: int
    chunks: int
    order_matches: bool | None   # None: torch-only schedule, nothing of modelcut's to compare
    first_difference: str | None
    declared_difference: str | None
    note: str | None = None      # how modelcut's side was built, where not by its defaults
    comparison: Comparison | None = None  # None with --order-only

    def as_dict(self) -> dict[str, Any]:
        c = self.comparison
        d: dict[str, Any] = {
            "schedule": self.name, "torch_class": self.class_name, "devices": self.devices,
            "microbatches": self.microbatches, "chunks": self.chunks,
            "order_matches": self.order_matches, "first_difference": self.first_difference,
            "declared_difference": self.declared_difference, "note": self.note,
            "executed_as_predicted": None, "simulated_makespan_s": None, "measured_makespan_s": None,
            "error_pct": None, "simulated_bubble": None, "measured_bubble": None,
            "measured_steps_s": None, "fitted_on": None, "fitted_overhead_s": None, "fitted_p2p_s": None,
            "simulated_makespan_fitted_s": None, "error_with_fitted_pct": None, "fitted_in_sample": None,
        }
        if c is not None:
            d.update({
                "executed_as_predicted": c.measured.executed_as_predicted(),
                "simulated_makespan_s": c.simulated_makespan_s,
                "measured_makespan_s": c.measured_makespan_s,
                "error_pct": c.error_pct,
                "simulated_bubble": float(c.simulated_bubble),
                "measured_bubble": c.measured.bubble(),
                "measured_steps_s": c.measured.makespans(),
            })
            if c.fitted is not None:
                d.update({
                    "fitted_on": c.fitted_on, "fitted_overhead_s": c.overhead_s, "fitted_p2p_s": c.p2p_s,
                    "simulated_makespan_fitted_s": float(c.fitted.makespan),
                    "error_with_fitted_pct": c.error_with_fitted_pct,
                    "fitted_in_sample": c.fitted_on == self.name,
                })
        return d

    def timelines(self) -> list[tuple[str, list[Row]]]:
        """(label, rows) for the trace: measured, simulated, simulated with the fit."""
        c = self.comparison
        if c is None:
            return []
        out = [(f"{self.name}: measured", c.measured.rows()),
               (f"{self.name}: simulated", simulated_rows(c.simulated))]
        if c.fitted is not None:
            out.append((f"{self.name}: simulated, fitted on {c.fitted_on}", simulated_rows(c.fitted)))
        return out


def _chunks_for(name: str, chunks: int | None) -> int | None:
    return chunks if chunks is not None and is_multi(schedule_class(name)) else None


def default_fit_on(names: list[str], devices: int, microbatches: int) -> str:
    """GPipe's run, unless GPipe is the only schedule checked (then 1F1B's, or looped
    BFS's where torch's 1F1B refuses m < p). GPipe's forward and backward phases keep
    every rank busy at once, so its run shows the per-action overhead as contended as it
    gets on a small machine; fitted there, it transferred best to the other schedules
    (docs/crosscheck.md)."""
    canon = [_MODELCUT_NAME.get(schedule_class(n).__name__, n) for n in names]
    for cand in _FIT_CANDIDATES:
        if _MODELCUT_NAME[cand] == _ONE_F_ONE_B and microbatches < devices:
            continue   # torch's Schedule1F1B refuses m < p
        if canon != [_MODELCUT_NAME[cand]]:
            return _MODELCUT_NAME[cand]
    return _MODELCUT_NAME[_FIT_CANDIDATES[0]]


def crosscheck(names: list[str], devices: int, microbatches: int, chunks: int | None = None, *,
               forward_s: float = 0.020, backward_s: float = 0.040, weight_s: float | None = None,
               steps: int = 3, warmup: int = 1, fit_on: str | None = None, timeout_s: float = 300.0,
               order_only: bool = False) -> list[Entry]:
    require_torch()
    if not names:
        raise ModelcutError("name at least one schedule to check")
    entries = []
    for name in names:
        cls = schedule_class(name)
        v = _chunks_for(name, chunks)
        mc_name = _MODELCUT_NAME.get(cls.__name__)
        if mc_name is not None:
            oc = check(mc_name, devices, microbatches, v)
            entries.append(Entry(name, cls.__name__, devices, microbatches, oc.chunks, oc.matches,
                                 oc.first_difference, oc.declared_difference, oc.note))
        else:
            order = torch_order(name, devices, microbatches, v)
            entries.append(Entry(name, cls.__name__, devices, microbatches, order.chunks, None, None,
                                 declared_difference(order)))
    if order_only:
        return entries
    fit_on = fit_on or default_fit_on(names, devices, microbatches)
    schedule_class(fit_on)
    to_run = list(names) + ([fit_on] if fit_on not in names else [])
    runs = run(to_run, devices, microbatches, chunks, forward_s=forward_s, backward_s=backward_s,
               weight_s=weight_s, steps=steps, warmup=warmup, timeout_s=timeout_s)
    comps = compare(runs, forward_s, backward_s, weight_s, fit_on)
    for e, c in zip(entries, comps):
        e.comparison = c
    return entries
