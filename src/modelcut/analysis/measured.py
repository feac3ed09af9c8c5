"""Measured runs: what ran and what was measured, the published runs of the catalog as such; the
error of a prediction against one. (A user's own runs come from a CSV file:
:mod:`modelcut.service.runs_csv`.)"""

from __future__ import annotations

from dataclasses import dataclass, field

from .. import catalog
from ..core.costs.flops import causal_model_flops, model_flops
from ..core.costs.kernels import mfu_peak
from ..core.step.default import default_plan, reported_step_flops
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
    notes: tuple[str, ...] = ()       # what the run's settings ask for that the model does not time

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
    attention core with selective recomputation, and only the layers Megatron-core's block
    method recomputes: :func:`..core.step.default.reported_step_flops`)."""
    return reported_step_flops(run, default_plan(run))


def published_flops(pr: catalog.PublishedRun) -> float | None:
    """FLOPs per step that a published run's TFLOP/s (or MFU) count, in the source's convention:
    modelcut's :func:`counted_flops` of the run as the source describes it, or, with a
    ``flop_convention``, that convention's model FLOPs (no recomputation); None where the source
    counts in a way modelcut does not reproduce ("source")."""
    conv = pr.flop_convention
    if conv is None:
        return counted_flops(pr.run)
    if conv == "source":
        return None
    return model_flops(pr.run.model, pr.run.training, conv)


def measured_step_time(meas: Measured) -> float:
    """The measured step time: given, or the FLOPs the measured TFLOP/s count over n·TFLOP/s."""
    if meas.step_time_s is not None:
        return meas.step_time_s
    f = meas.flops if meas.flops is not None else counted_flops(meas.run)
    return f / (meas.run.layout.gpus * meas.tflops * 1e12)


def measured_mfu(meas: Measured) -> float:
    """The MFU a measured run's step time means, counted as ``predict`` counts it: the causal work
    of the step without recomputation (:func:`..core.costs.flops.causal_model_flops`, the least
    the step must do) over n·T·peak (:func:`..core.costs.kernels.mfu_peak`). Above 1, the figure
    claims more work a second than the GPUs can do."""
    tr = meas.run.training
    work = causal_model_flops(meas.run.model, tr.global_batch, tr.seq_len)
    return work / (meas.run.layout.gpus * measured_step_time(meas) * mfu_peak(meas.hw, tr))


def error_pct(meas: Measured, pred) -> float:
    """Error of the predicted throughput, (measured step time / predicted − 1)·100: the same
    as predicted over measured TFLOP/s when both count the same FLOPs. Negative: the
    prediction is low (too slow)."""
    return (measured_step_time(meas) / pred.step_time_s - 1) * 100


def catalog_measured(hardware: str | None = None) -> list[Measured]:
    """Every published run of the validation tables (deck and dev sets) as a :class:`Measured`,
    with its real settings; ``hardware`` keeps those on one accelerator (catalog name or alias).
    Runs outside the tables (:attr:`~modelcut.catalog.PublishedRun.in_validation`: marked
    ``validate = false``) are left out; :func:`measured_run` makes one of them."""
    settings = catalog.run_settings()
    want = catalog.hardware(hardware).name if hardware else None
    out = []
    for pr in catalog.published_runs():
        # Left out, by an explicit mark only: runs marked validate = false (notes say why).
        if not pr.in_validation:
            continue
        hw = catalog.hardware(pr.run.gpu)
        if want and hw.name != want:
            continue
        out.append(measured_run(pr, hw, settings.get(pr.id)))
    return out


def measured_run(pr: catalog.PublishedRun, hw: Hardware | None = None,
                 st: catalog.RunSettings | None = None) -> Measured:
    """One published run as a :class:`Measured` with its real settings (``st``): its step time
    where given, else its TFLOP/s (or its MFU of the 16-bit peak) over the FLOPs the source
    counts (:func:`published_flops`); a run with neither is a one-line error."""
    hw = hw or catalog.hardware(pr.run.gpu)
    run = catalog.apply_settings(pr.run, st)
    step = pr.published_step_time_s
    tflops = None
    if step is None:
        tflops = pr.published_tflops
        if tflops is None and pr.published_mfu is not None:
            tflops = pr.published_mfu * hw.peak_flops_16 / 1e12
    # Published TFLOP/s count the FLOPs of the run as the source describes it (runs.toml).
    flops = published_flops(pr)
    if step is None and (tflops is None or flops is None):
        raise ModelcutError(f"{pr.id}: no step time, and no TFLOP/s or MFU in a FLOP count modelcut "
                            "reproduces; mark it validate = false with the reason in notes")
    return Measured(pr.id, st.group if st else pr.family, run, hw, st.framework if st else None,
                    dict(st.overlap) if st else {},
                    tflops, step, pr.source, flops)
