"""A model checked against published runs: fit η on one run, predict the rest, score the errors.

Pure: the caller passes the runs (``modelcut.catalog.published_runs()``) and a hardware lookup.
error % = (predicted − published) / published × 100, so a negative error is a low prediction.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

from .errors import ModelcutError
from .specs import Hardware, Run
from .stepmodel import CALIBRATION, Prediction, fit_eta, predict


@dataclass(frozen=True)
class PublishedRun:
    """One published training run, as the source reports it.

    ``family``: whose stack ran it ("megatron", "llama3", "zero3"); ``set``: "deck" for the 13
    rows the deck's model is checked on, "dev" for the development set. ``published_tflops``
    (TFLOP/s per GPU as the source counts it) and ``published_step_time_s`` are None where the
    source does not print them. ``script``: settings from the authors' released scripts where
    they differ from what the paper states (micro-batch, interleaving)."""

    id: str
    family: str
    run: Run
    published_tflops: float | None
    published_step_time_s: float | None
    source: str
    notes: str = ""
    set: str = "deck"
    gpus: int = 0
    published_mfu: float | None = None
    published_pct_peak: float | None = None
    script: dict = field(default_factory=dict)


@dataclass
class RowResult:
    id: str
    family: str
    published_tflops: float
    predicted_tflops: float
    error_pct: float
    fitted: bool
    prediction: Prediction

    @property
    def step_time_s(self) -> float:
        return self.prediction.step_time_s


@dataclass
class Validation:
    mode: str
    eta: float
    calibration: str
    rows: list[RowResult]
    max_error_pct: dict[str, float]      # largest |error| per family over the predicted rows
    mean_abs_error_pct: float            # over the predicted rows (the fitted one excluded)
    all_low: bool                        # every predicted row below its published figure

    def as_dict(self) -> dict:
        """The documented JSON object of ``modelcut validate --json``."""
        keys = ("compute_s", "tp_s", "cp_s", "p2p_s", "bubble_s", "dp_s")
        return {
            "eta": self.eta,
            "runs": [{"id": r.id, "published_tflops": r.published_tflops, "predicted_tflops": r.predicted_tflops,
                      "error_pct": r.error_pct, "step_time_s": r.step_time_s,
                      "breakdown": {k: getattr(r.prediction.breakdown, k) for k in keys}} for r in self.rows],
            "summary": {"max_error_pct": dict(self.max_error_pct), "mean_abs_error_pct": self.mean_abs_error_pct,
                        "all_low": self.all_low},
        }


def validate(runs: list[PublishedRun], hardware: Callable[[str], Hardware], mode: str = "seed",
             calibration: str | None = None) -> Validation:
    """Fit η on ``calibration`` (default: the mode's, ``CALIBRATION``), predict every run that
    publishes TFLOP/s per GPU, and score them."""
    calibration = calibration or CALIBRATION.get(mode)
    scored = [r for r in runs if r.published_tflops is not None]
    cal = next((r for r in scored if r.id == calibration), None)
    if cal is None:
        raise ModelcutError(f"calibration run {calibration!r} is not among the runs given")
    eta = fit_eta(cal.run, hardware(cal.run.gpu), cal.published_tflops, mode)
    rows = []
    for r in scored:
        pred = predict(r.run, hardware(r.run.gpu), mode, eta)
        err = (pred.tflops_per_gpu - r.published_tflops) / r.published_tflops * 100
        rows.append(RowResult(r.id, r.family, r.published_tflops, pred.tflops_per_gpu, err, r.id == calibration, pred))
    predicted = [r for r in rows if not r.fitted]
    families: dict[str, float] = {}
    for r in predicted:
        families[r.family] = max(families.get(r.family, 0.0), abs(r.error_pct))
    mean = sum(abs(r.error_pct) for r in predicted) / len(predicted) if predicted else 0.0
    return Validation(mode, eta, calibration, rows, families, mean, all(r.error_pct < 0 for r in predicted))
