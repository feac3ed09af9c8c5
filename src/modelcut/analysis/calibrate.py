"""Fitting the default model's constants to measured runs, in the open.

The constants (:class:`.kernels.Efficiency`: η_gemm, η_mem, η_net; by default the first two,
:data:`FITTED`, η_net held at 1: the collective tables measure the network) are fitted by least
squares on the logarithm of predicted over measured throughput (equivalently, of measured
over predicted step time), so a run that is 10 % slow weighs as much as one 10 % fast and
large runs do not dominate. The fit is Levenberg-Marquardt on the constants' logits with
finite-difference derivatives; a constant no run is sensitive to keeps its starting value
(``fixed``).

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

Predictor = Callable[[Measured, Efficiency], "object"]


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
        predictor: Predictor | None = None, max_iter: int = 30, tol: float = 1e-7) -> Fit:
    """Least-squares fit of the constants named in ``fitted`` (module doc)."""
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
    x = np.array([_logit(getattr(start, k)) for k in names])
    lam = 1e-2
    r = _log_residuals(runs, _to_eff(x, names, start), predictor)
    cost = float(r @ r)
    it = 0
    h = 1e-4
    for it in range(1, max_iter + 1):
        J = np.empty((len(runs), len(names)))
        for j in range(len(names)):
            xj = x.copy()
            xj[j] += h
            J[:, j] = (_log_residuals(runs, _to_eff(xj, names, start), predictor) - r) / h
        g = J.T @ r
        A = J.T @ J
        improved = False
        for _ in range(8):
            step = np.linalg.solve(A + lam * np.diag(np.diag(A) + 1e-12), -g)
            xn = np.clip(x + step, -8.0, 8.0)
            rn = _log_residuals(runs, _to_eff(xn, names, start), predictor)
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


def leave_one_family_out(runs: Sequence[Measured], fitted: Sequence[str] = FITTED, start: Efficiency = START,
                         predictor: Predictor | None = None,
                         progress: Callable[[str], None] | None = None) -> dict[str, dict]:
    """For each family: fit on the other families' runs, predict this family's.

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
        f = fit(train, fitted, start, predictor)
        out[fam] = {"efficiency": f.efficiency, "errors_pct": evaluate(test, f.efficiency, predictor),
                    "fit_runs": len(train)}
    return out
