"""Measured runs: what ran and what was measured, the published runs of the catalog as such; the
error of a prediction against one. (A user's own runs come from a CSV file:
:mod:`modelcut.service.runs_csv`.)"""

from __future__ import annotations

from dataclasses import dataclass, field

from .. import catalog
from ..core.costs.flops import executed_flops
from ..core.errors import ModelcutError
from ..core.specs import Hardware, Run


@dataclass(frozen=True)
class Measured:
    """One measured run: what ran (run, framework, overlap overrides) and what was measured.

    Exactly one of ``tflops`` (per GPU, counted as the default model counts it) or
    ``step_time_s`` is used: step time when given."""

    id: str
    family: str
    run: Run
    hw: Hardware
    framework: str | None = None
    overlap: dict = field(default_factory=dict)
    tflops: float | None = None
    step_time_s: float | None = None
    source: str = ""
    flops: float | None = None        # FLOPs per step the measured TFLOP/s count (default: counted_flops(run))

    def __post_init__(self) -> None:
        if self.tflops is None and self.step_time_s is None:
            raise ModelcutError(f"{self.id}: a measured run needs tflops or step_time_s")
        for name in ("tflops", "step_time_s"):
            val = getattr(self, name)
            if val is not None and not val > 0:
                raise ModelcutError(f"{self.id}: {name} must be positive, got {val}")


def counted_flops(run: Run) -> float:
    """FLOPs per step as modelcut reports TFLOP/s (the seed's count): Narayanan et al. 2021
    eq. 3 with full recomputation, PaLM's 6N + 12·l·s·d otherwise (plus the recomputed
    attention core with selective recomputation)."""
    tr = run.training
    return executed_flops(run.model, tr, "megatron" if tr.recompute == "full" else "palm")


def measured_step_time(meas: Measured) -> float:
    """The measured step time: given, or the FLOPs the measured TFLOP/s count over n·TFLOP/s."""
    if meas.step_time_s is not None:
        return meas.step_time_s
    f = meas.flops if meas.flops is not None else counted_flops(meas.run)
    return f / (meas.run.layout.gpus * meas.tflops * 1e12)


def error_pct(meas: Measured, pred) -> float:
    """Error of the predicted throughput, (measured step time / predicted − 1)·100: the same
    as predicted over measured TFLOP/s when both count the same FLOPs. Negative: the
    prediction is low (too slow)."""
    return (measured_step_time(meas) / pred.step_time_s - 1) * 100


def catalog_measured(hardware: str | None = None) -> list[Measured]:
    """Every published run of the catalog (deck and dev sets) as a :class:`Measured`, with
    its real settings; ``hardware`` keeps those on one accelerator (catalog name or alias)."""
    settings = catalog.run_settings()
    want = catalog.hardware(hardware).name if hardware else None
    out = []
    for pr in catalog.published_runs():
        hw = catalog.hardware(pr.run.gpu)
        if want and hw.name != want:
            continue
        st = settings.get(pr.id)
        run = catalog.apply_settings(pr.run, st)
        step = pr.published_step_time_s
        # Published TFLOP/s count the FLOPs of the run as the source describes it (runs.toml).
        out.append(Measured(pr.id, st.group if st else pr.family, run, hw, st.framework if st else None, {},
                            None if step is not None else pr.published_tflops, step, pr.source,
                            counted_flops(pr.run)))
    return out
