"""Fitting the default model's constants to measured runs, in the open.

The constants (:class:`.kernels.Efficiency`: η_gemm, η_mem, η_net; by default the first two,
:data:`FITTED`, η_net held at 1: the collective tables measure the network) are fitted by least
squares on the logarithm of predicted over measured throughput (equivalently, of measured
over predicted step time), so a run that is 10 % slow weighs as much as one 10 % fast and
large runs do not dominate. Each run weighs alike (``weigh="runs"``, the shipped profile's
choice) or each source does (``weigh="sources"``: a run of a source of n runs weighs 1/n, scaled
so the weights average 1), so a source with many runs does not pull the constants its way. The
fit is Levenberg-Marquardt on the constants' logits with finite-difference derivatives; a constant
no run is sensitive to keeps its starting value (``fixed``).

:func:`leave_one_family_out` refits on all families but one and predicts the one left out:
the honest error of a family the constants never saw.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Callable, Sequence

import numpy as np

from .. import catalog
from ..core.costs.kernels import NAMES, Efficiency
from ..core.errors import ModelcutError
from ..core.step import default
from .measured import Measured, error_pct

#: Where a fit starts: large products at 80 % of peak, streaming kernels at 80 % of HBM
#: bandwidth, collectives at 80 % of line rate (typical of cuBLAS, STREAM-like kernels and
#: NCCL bus bandwidth on A100/H100 systems; only a starting point).
START = Efficiency(0.8, 0.8, 1.0)

#: The constants a fit adjusts unless told otherwise: the sustained share of the measured kernel
#: throughput and of the measured HBM bandwidth (two, shared by every accelerator).
FITTED = ("gemm", "mem")

#: How a fit weighs the runs (module doc): each run alike, or each source (``Measured.family``) alike.
WEIGHINGS = ("runs", "sources")

Predictor = Callable[[Measured, Efficiency], "object"]


def run_weights(runs: Sequence[Measured], weigh: str = "runs") -> np.ndarray:
    """Each run's weight in the fit's sum of squares (module doc): 1 each, or, with ``"sources"``,
    1/n for a run of a source of n runs, scaled so the weights average 1."""
    if weigh not in WEIGHINGS:
        raise ModelcutError(f"weigh must be one of {', '.join(WEIGHINGS)}, got {weigh!r}")
    if weigh == "runs" or not runs:
        return np.ones(len(runs))
    count: dict[str, int] = {}
    for m in runs:
        count[m.family] = count.get(m.family, 0) + 1
    w = np.array([1.0 / count[m.family] for m in runs])
    return w * len(runs) / w.sum()


def default_predictor(meas: Measured, eff: Efficiency):
    """The default step model on the run's stack, with its overlap overrides."""
    return default.predict(meas.run, meas.hw, eff, catalog.framework(meas.framework).with_overlap(meas.overlap))


def _log_residuals(runs: Sequence[Measured], eff: Efficiency, predictor: Predictor) -> np.ndarray:
    out = []
    for r in runs:
        pred = predictor(r, eff)
        out.append(math.log1p(error_pct(r, pred) / 100))
    return np.array(out)


def _to_eff(x: np.ndarray, names: Sequence[str], base: Efficiency) -> Efficiency:
    vals = dict(zip(NAMES, base.as_tuple()))
    for k, xi in zip(names, x):
        vals[k] = float(1 / (1 + math.exp(-xi)))
    return Efficiency(**vals)


def _logit(p: float) -> float:
    p = min(max(p, 1e-6), 1 - 1e-6)
    return math.log(p / (1 - p))


@dataclass
class Fit:
    """A fitted profile: the constants, which were fitted, on which runs, and how well."""

    efficiency: Efficiency
    fitted: tuple[str, ...]
    runs: tuple[str, ...]
    errors_pct: dict[str, float]
    rms_log: float
    iterations: int

    @property
    def mean_abs_pct(self) -> float:
        return sum(abs(e) for e in self.errors_pct.values()) / max(len(self.errors_pct), 1)

    @property
    def max_abs_pct(self) -> float:
        return max((abs(e) for e in self.errors_pct.values()), default=0.0)


def fit(runs: Sequence[Measured], fitted: Sequence[str] = FITTED, start: Efficiency = START,
        predictor: Predictor | None = None, max_iter: int = 30, tol: float = 1e-7,
        weigh: str = "runs") -> Fit:
    """Least-squares fit of the constants named in ``fitted``, the runs weighed as ``weigh``
    says (module doc, :func:`run_weights`); ``rms_log`` is the weighted root mean square."""
    if not runs:
        raise ModelcutError("no runs to fit on")
    names = tuple(fitted)
    for k in names:
        if k not in NAMES:
            raise ModelcutError(f"unknown constant {k!r}; choose among {', '.join(NAMES)}")
    if len(set(names)) != len(names):
        raise ModelcutError("a constant is named twice")
    if len(runs) < len(names):
        raise ModelcutError(f"{len(runs)} runs cannot fit {len(names)} constants")
    predictor = predictor or default_predictor
    root_w = np.sqrt(run_weights(runs, weigh))

    def residuals(eff: Efficiency) -> np.ndarray:
        return _log_residuals(runs, eff, predictor) * root_w

    x = np.array([_logit(getattr(start, k)) for k in names])
    lam = 1e-2
    r = residuals(_to_eff(x, names, start))
    cost = float(r @ r)
    it = 0
    h = 1e-4
    for it in range(1, max_iter + 1):
        J = np.empty((len(runs), len(names)))
        for j in range(len(names)):
            xj = x.copy()
            xj[j] += h
            J[:, j] = (residuals(_to_eff(xj, names, start)) - r) / h
        g = J.T @ r
        A = J.T @ J
        improved = False
        for _ in range(8):
            step = np.linalg.solve(A + lam * np.diag(np.diag(A) + 1e-12), -g)
            xn = np.clip(x + step, -8.0, 8.0)
            rn = residuals(_to_eff(xn, names, start))
            cn = float(rn @ rn)
            if cn < cost:
                improved = True
                done = cost - cn < tol * max(cost, 1e-12) or float(np.max(np.abs(step))) < 1e-6
                x, r, cost = xn, rn, cn
                lam = max(lam / 3, 1e-7)
                break
            lam *= 4
        if not improved or done:
            break
    eff = _to_eff(x, names, start)
    errs = {m.id: error_pct(m, predictor(m, eff)) for m in runs}
    return Fit(eff, names, tuple(m.id for m in runs), errs, math.sqrt(cost / len(runs)), it)


def evaluate(runs: Sequence[Measured], eff: Efficiency, predictor: Predictor | None = None) -> dict[str, float]:
    """Error % of each run under fixed constants."""
    predictor = predictor or default_predictor
    return {m.id: error_pct(m, predictor(m, eff)) for m in runs}


def error_stats(errs: Sequence[float]) -> dict:
    """Runs, mean and largest |error| % and the mean signed error of a list of errors (None each
    where the list is empty)."""
    if not errs:
        return {"runs": 0, "mean_abs_pct": None, "max_abs_pct": None, "mean_signed_pct": None}
    a = [abs(e) for e in errs]
    return {"runs": len(a), "mean_abs_pct": sum(a) / len(a), "max_abs_pct": max(a),
            "mean_signed_pct": sum(errs) / len(errs)}


def folds_summary(folds: dict[str, dict]) -> dict:
    """The leave-one-source-out errors (:func:`leave_one_family_out`) over every source's runs
    (:func:`error_stats`); ``sources``, each source's own (:func:`error_stats`);
    ``source_mean_abs_pct``, the mean over the sources of each one's mean |error|; and the source
    whose runs' mean signed error is furthest from 0: ``worst_source`` (its name) and
    ``worst_source_signed_pct``."""
    out = error_stats([e for f in folds.values() for e in f["errors_pct"].values()])
    each = {g: error_stats(list(f["errors_pct"].values())) for g, f in folds.items()}
    worst = max(each, key=lambda g: abs(each[g]["mean_signed_pct"]), default=None)
    out.update(sources=each, source_mean_abs_pct=sum(e["mean_abs_pct"] for e in each.values()) / len(each) if each else None,
               worst_source=worst, worst_source_signed_pct=each[worst]["mean_signed_pct"] if worst else None)
    return out


def leave_one_family_out(runs: Sequence[Measured], fitted: Sequence[str] = FITTED, start: Efficiency = START,
                         predictor: Predictor | None = None,
                         progress: Callable[[str], None] | None = None, weigh: str = "runs") -> dict[str, dict]:
    """For each family: fit on the other families' runs (weighed as ``weigh`` says), predict this
    family's.

    Returns {family: {"efficiency": Efficiency, "errors_pct": {run id: error %}, "fit_runs": n}}.
    A family whose removal leaves fewer runs than constants is skipped."""
    predictor = predictor or default_predictor
    fams = sorted({m.family for m in runs})
    out: dict[str, dict] = {}
    for i, fam in enumerate(fams, 1):
        if progress is not None:
            progress(f"leave one source out: {fam} ({i} of {len(fams)})")
        train = [m for m in runs if m.family != fam]
        test = [m for m in runs if m.family == fam]
        if len(train) < len(fitted):
            continue
        f = fit(train, fitted, start, predictor, weigh=weigh)
        out[fam] = {"efficiency": f.efficiency, "errors_pct": evaluate(test, f.efficiency, predictor),
                    "fit_runs": len(train)}
    return out
