"""Models checked against published runs.

* :func:`validate`: the deck's table, the seed model with η fitted on one run and every other row
  predicted; error % = (predicted − published) / published × 100, so a negative error is a low
  prediction.
* :func:`side_by_side` and :func:`summarize`: every published run under the default model beside
  the seed, per group and overall.
* :func:`profile_text`: a fitted profile as the catalog stores it.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Callable, Sequence

from .. import catalog
from ..catalog import PublishedRun
from ..core.costs.kernels import Efficiency
from ..core.errors import ModelcutError
from ..core.specs import Hardware, Run
from ..core.step import seed
from ..core.step.result import Prediction
from .calibrate import Fit, default_predictor, error_stats
from .measured import Measured, counted_flops, error_pct

#: The published run the seed's η is fitted on (the deck: Megatron-LM's 1.7B run).
CALIBRATION = "megatron-1.7b"


def fit_eta(run: Run, hw: Hardware, published_tflops: float) -> float:
    """The η at which the seed model predicts exactly ``published_tflops`` per GPU for ``run``.
    Predicted throughput rises monotonically with η; solved by bisection to 1e-13."""
    if not published_tflops > 0:
        raise ModelcutError(f"published TFLOP/s must be positive, got {published_tflops}")
    if seed.predict(run, hw, 1.0).tflops_per_gpu < published_tflops:
        raise ModelcutError(f"{run.name or 'run'}: {published_tflops} TFLOP/s per GPU is out of reach "
                            "even at the full peak (η = 1)")
    lo, hi = 0.0, 1.0
    while hi - lo > 1e-13:
        mid = (lo + hi) / 2
        if seed.predict(run, hw, mid).tflops_per_gpu < published_tflops:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


@lru_cache(maxsize=None)
def seed_eta() -> float:
    """η fitted on the catalog's :data:`CALIBRATION` run (read once)."""
    pr = catalog.published_run(CALIBRATION)
    return fit_eta(pr.run, catalog.hardware(pr.run.gpu), pr.published_tflops)


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
    """The deck's table: fit η on ``calibration`` (default :data:`CALIBRATION`), predict every run
    that publishes TFLOP/s per GPU with the seed model, and score them."""
    if mode != "seed":
        raise ModelcutError(f"the deck's table is the seed model's (η fitted on one run); mode {mode!r} is "
                            "validated beside it by side_by_side")
    calibration = calibration or CALIBRATION
    # Scored: runs that publish TFLOP/s in modelcut's own FLOP count and are in the validation
    # tables (16-bit, not marked validate = false); the deck's 13 all are.
    scored = [r for r in runs if r.published_tflops is not None and r.flop_convention is None and r.in_validation]
    cal = next((r for r in scored if r.id == calibration), None)
    if cal is None:
        raise ModelcutError(f"calibration run {calibration!r} is not among the runs given")
    eta = fit_eta(cal.run, hardware(cal.run.gpu), cal.published_tflops)
    rows = []
    for r in scored:
        pred = seed.predict(r.run, hardware(r.run.gpu), eta)
        err = (pred.tflops_per_gpu - r.published_tflops) / r.published_tflops * 100
        rows.append(RowResult(r.id, r.family, r.published_tflops, pred.tflops_per_gpu, err, r.id == calibration, pred))
    predicted = [r for r in rows if not r.fitted]
    families: dict[str, float] = {}
    for r in predicted:
        families[r.family] = max(families.get(r.family, 0.0), abs(r.error_pct))
    mean = sum(abs(r.error_pct) for r in predicted) / len(predicted) if predicted else 0.0
    return Validation(mode, eta, calibration, rows, families, mean, all(r.error_pct < 0 for r in predicted))


# ---------------------------------------------------------------- the default model beside the seed

@dataclass
class SideBySideRow:
    """One published run under the default model and under the seed mode."""

    id: str
    set: str
    group: str
    framework: str
    measured: Measured
    default: object                  # Prediction
    default_error_pct: float
    seed: object | None = None       # Prediction, None when the seed cannot predict it
    seed_error_pct: float | None = None
    loso: object | None = None       # Prediction with the constants fitted without this run's source
    loso_error_pct: float | None = None

    @property
    def published(self) -> float:
        m = self.measured
        return m.step_time_s if m.step_time_s is not None else m.tflops

    @property
    def unit(self) -> str:
        return "s" if self.measured.step_time_s is not None else "TFLOP/s"

    def value(self, pred) -> float:
        """A prediction in the published figure's unit: seconds, or TFLOP/s per GPU counting
        the FLOPs the published figure counts."""
        if self.unit == "s":
            return pred.step_time_s
        m = self.measured
        f = m.flops if m.flops is not None else counted_flops(m.run)
        return f / (m.run.layout.gpus * pred.step_time_s * 1e12)

    @property
    def dominant(self) -> str:
        terms = self.default.breakdown.as_dict()
        return max(terms, key=lambda k: terms[k]).removesuffix("_s")


def side_by_side(runs: Sequence[Measured], sets: dict[str, str], eff_for: Callable[[Hardware], Efficiency],
                 seed: Callable[[Measured], object | None] | None = None,
                 held_out: Callable[[Measured], Efficiency | None] | None = None) -> list[SideBySideRow]:
    """Every run predicted by the default model (constants ``eff_for(hw)``) and, where
    ``seed`` gives a prediction, by the seed mode; where ``held_out`` gives constants fitted
    without the run's source, by those too (leave one source out); errors as :func:`error_pct`."""
    rows = []
    for m in runs:
        pred = default_predictor(m, eff_for(m.hw))
        sp = seed(m) if seed is not None else None
        eff_out = held_out(m) if held_out is not None else None
        lp = default_predictor(m, eff_out) if eff_out is not None else None
        rows.append(SideBySideRow(m.id, sets.get(m.id, ""), m.family, m.framework or "", m, pred, error_pct(m, pred),
                                  sp, error_pct(m, sp) if sp is not None else None,
                                  lp, error_pct(m, lp) if lp is not None else None))
    return rows


def summarize(rows: Sequence[SideBySideRow]) -> dict:
    """Per group (source) and overall: runs, mean and largest |error| % and the mean signed
    error for the default model out of sample (``loso``: each source's runs predicted with the
    constants fitted without that source), in sample (``default``) and for the seed; the signs of
    the default model's in-sample errors; the same over the deck's runs."""
    def three(rs: Sequence[SideBySideRow]) -> dict:
        return {"loso": error_stats([r.loso_error_pct for r in rs if r.loso_error_pct is not None]),
                "default": error_stats([r.default_error_pct for r in rs]),
                "seed": error_stats([r.seed_error_pct for r in rs if r.seed_error_pct is not None])}

    groups = {g: three([r for r in rows if r.group == g]) for g in dict.fromkeys(r.group for r in rows)}
    d = [r.default_error_pct for r in rows]
    return {
        "groups": groups,
        "overall": three(rows),
        "deck": three([r for r in rows if r.set == "deck"]),
        "signs": {"low": int(sum(e < 0 for e in d)), "high": int(sum(e > 0 for e in d))},
    }


def profile_text(hardware: str, fit: Fit, inherits: str = "", source: str = "", folds: dict | None = None) -> str:
    """The TOML text of a fitted profile; ``folds``: :func:`.calibrate.leave_one_family_out`."""
    e = fit.efficiency
    lines = [
        "# A fitted profile for modelcut's default model (modelcut calibrate).",
        "# gemm: the share of the measured kernel throughput (matrix products, attention) a step sustains;",
        "# mem: the share of HBM bandwidth memory-bound kernels reach; net: the share of the measured",
        "# collective bandwidth (1: not fitted). hardware = \"*\": shared by every accelerator.",
        f'hardware = "{hardware}"',
        f"gemm = {e.gemm:.4f}",
        f"mem = {e.mem:.4f}",
        f"net = {e.net:.4f}",
        "fitted = [" + ", ".join(f'"{k}"' for k in fit.fitted) + "]",
        "runs = [" + ", ".join(f'"{r}"' for r in fit.runs) + "]",
        f"mean_abs_error_pct = {fit.mean_abs_pct:.2f}",
        f"max_abs_error_pct = {fit.max_abs_pct:.2f}",
    ]
    if inherits:
        lines.append(f'inherits = "{inherits}"')
    if source:
        lines.append(f'source = "{source}"')
    lines.append("")
    lines.append("[errors_pct]")
    for k, v in fit.errors_pct.items():
        lines.append(f'"{k}" = {v:.2f}')
    for g, f in (folds or {}).items():
        errs = [abs(x) for x in f["errors_pct"].values()]
        fe = f["efficiency"]
        lines += ["", f'[cv."{g}"]', f"gemm = {fe.gemm:.4f}", f"mem = {fe.mem:.4f}", f"net = {fe.net:.4f}",
                  f"runs = {len(errs)}", f"mean_abs_error_pct = {sum(errs) / len(errs):.2f}",
                  f"max_abs_error_pct = {max(errs):.2f}"]
    return "\n".join(lines) + "\n"
