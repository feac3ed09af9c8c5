"""Fitting the default model's three constants to measured runs, in the open.

The constants (:class:`.kernels.Efficiency`: η_gemm, η_mem, η_net) are fitted by least
squares on the logarithm of predicted over measured throughput (equivalently, of measured
over predicted step time), so a run that is 10 % slow weighs as much as one 10 % fast and
large runs do not dominate. The fit is Levenberg-Marquardt on the constants' logits with
finite-difference derivatives; a constant no run is sensitive to keeps its starting value
(``fixed``).

:func:`leave_one_family_out` refits on all families but one and predicts the one left out:
the honest error of a family the constants never saw. :func:`error_budget` says which term
dominates a prediction and how far it moves when each uncertain input takes its other
plausible value.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, replace
from typing import Callable, Sequence

import numpy as np

from .errors import ModelcutError
from .kernels import NAMES, Efficiency
from .specs import Hardware, Run

#: Where a fit starts: large products at 80 % of peak, streaming kernels at 80 % of HBM
#: bandwidth, collectives at 80 % of line rate (typical of cuBLAS, STREAM-like kernels and
#: NCCL bus bandwidth on A100/H100 systems; only a starting point).
START = Efficiency(0.8, 0.8, 0.8)


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


Predictor = Callable[[Measured, Efficiency], "object"]


def _default_predictor(meas: Measured, eff: Efficiency):
    from .default_model import predict
    return predict(meas.run, meas.hw, eff, meas.framework, meas.overlap or None)


def counted_flops(run: Run) -> float:
    """FLOPs per step as modelcut reports TFLOP/s (the seed's count): Narayanan et al. 2021
    eq. 3 with full recomputation, PaLM's 6N + 12·l·s·d otherwise (plus the recomputed
    attention core with selective recomputation)."""
    from .flops import executed_flops
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


def fit(runs: Sequence[Measured], fitted: Sequence[str] = NAMES, start: Efficiency = START,
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
    predictor = predictor or _default_predictor
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
    predictor = predictor or _default_predictor
    return {m.id: error_pct(m, predictor(m, eff)) for m in runs}


def leave_one_family_out(runs: Sequence[Measured], fitted: Sequence[str] = NAMES, start: Efficiency = START,
                         predictor: Predictor | None = None) -> dict[str, dict]:
    """For each family: fit on the other families' runs, predict this family's.

    Returns {family: {"efficiency": Efficiency, "errors_pct": {run id: error %}, "fit_runs": n}}.
    A family whose removal leaves fewer runs than constants is skipped."""
    predictor = predictor or _default_predictor
    fams = sorted({m.family for m in runs})
    out: dict[str, dict] = {}
    for fam in fams:
        train = [m for m in runs if m.family != fam]
        test = [m for m in runs if m.family == fam]
        if len(train) < len(fitted):
            continue
        f = fit(train, fitted, start, predictor)
        out[fam] = {"efficiency": f.efficiency, "errors_pct": evaluate(test, f.efficiency, predictor),
                    "fit_runs": len(train)}
    return out


# ---------------------------------------------------------------- error budget

@dataclass
class BudgetLine:
    input: str
    alternative: str
    change_pct: float     # change of predicted throughput (steps per second), %


@dataclass
class ErrorBudget:
    dominant: str                 # the largest term of the step
    dominant_share: float         # its share of the step time
    terms: dict[str, float]       # every term, seconds
    lines: list[BudgetLine]


def alternatives(run: Run, fw_overlap: dict[str, bool]) -> list[tuple[str, str, Run, dict]]:
    """The other plausible values of the uncertain inputs: micro-batch halved and doubled
    (where the batch allows), each overlap option that applies to the layout flipped, the
    other recomputation modes, interleaving one step up and down (with a pipeline)."""
    out: list[tuple[str, str, Run, dict]] = []
    tr, L = run.training, run.layout
    b = tr.micro_batch
    per_replica = tr.global_batch // L.dp
    for nb in (b // 2, b * 2):
        if nb >= 1 and nb != b and per_replica % nb == 0:
            out.append(("micro-batch", str(nb), replace(run, training=replace(tr, micro_batch=nb)), {}))
    applies = {"grad_reduce": L.dp * L.cp > 1, "param_gather": L.dp * L.cp > 1, "p2p_async": L.pp > 1,
               "tp_comm": L.tp > 1}
    for k, val in fw_overlap.items():
        if applies.get(k, True):
            out.append((f"overlap {k}", "on" if not val else "off", run, {k: not val}))
    for rc in ("none", "selective", "full"):
        if rc != tr.recompute:
            out.append(("recompute", rc, replace(run, training=replace(tr, recompute=rc)), {}))
    if L.pp > 1:
        v = L.vpp or 1
        for nv in (v - 1, v + 1):
            if nv >= 1 and L.pp * nv <= run.model.layers + 2:
                out.append(("interleaving", f"v={nv}", run.with_layout(vpp=nv if nv > 1 else None), {}))
    return out


def error_budget(run: Run, hw: Hardware, eff: Efficiency, framework: str | None = None,
                 overlap: dict | None = None) -> ErrorBudget:
    """Which term dominates ``run``'s predicted step, and how far the prediction moves when
    each uncertain input takes its other plausible values (:func:`alternatives`). An
    alternative the model refuses (a layout no framework would run) is skipped."""
    from .default_model import predict
    from .overlap import framework as get_fw
    base = predict(run, hw, eff, framework, overlap)
    bd = base.breakdown
    terms = {k: float(v) for k, v in bd.as_dict().items()}
    dominant = max(terms, key=lambda k: terms[k])
    fw = get_fw(framework)
    ov = fw.overlap.with_options(**(overlap or {})).as_dict()
    if fw.zero3_runtime == "deepspeed-0.3" and run.layout.zero == 3 and run.layout.pp == 1:
        ov.pop("grad_reduce", None)   # the replayed hooks decide when gradients are reduced
    lines = []
    for name, alt, r2, ov2 in alternatives(run, ov):
        try:
            p2 = predict(r2, hw, eff, framework, {**(overlap or {}), **ov2})
        except ModelcutError:
            continue
        lines.append(BudgetLine(name, alt, (base.step_time_s / p2.step_time_s - 1) * 100))
    return ErrorBudget(dominant, terms[dominant] / base.step_time_s, terms, lines)


# ---------------------------------------------------------------- validation, default beside seed

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
                 seed: Callable[[Measured], object | None] | None = None) -> list[SideBySideRow]:
    """Every run predicted by the default model (constants ``eff_for(hw)``) and, where
    ``seed`` gives a prediction, by the seed mode; errors as :func:`error_pct`."""
    from .default_model import predict
    rows = []
    for m in runs:
        pred = predict(m.run, m.hw, eff_for(m.hw), m.framework, m.overlap or None)
        sp = seed(m) if seed is not None else None
        rows.append(SideBySideRow(m.id, sets.get(m.id, ""), m.family, m.framework or "", m, pred, error_pct(m, pred),
                                  sp, error_pct(m, sp) if sp is not None else None))
    return rows


def summarize(rows: Sequence[SideBySideRow]) -> dict:
    """Per group and overall: runs, mean and largest |error| % for the default model and the
    seed; the signs of the default model's errors; the largest |error| over the deck's runs."""
    def stats(errs: list[float]) -> dict:
        if not errs:
            return {"runs": 0, "mean_abs_pct": None, "max_abs_pct": None}
        a = [abs(e) for e in errs]
        return {"runs": len(a), "mean_abs_pct": sum(a) / len(a), "max_abs_pct": max(a)}

    groups: dict[str, dict] = {}
    for g in dict.fromkeys(r.group for r in rows):
        rs = [r for r in rows if r.group == g]
        groups[g] = {"default": stats([r.default_error_pct for r in rs]),
                     "seed": stats([r.seed_error_pct for r in rs if r.seed_error_pct is not None])}
    d = [r.default_error_pct for r in rows]
    deck = [r.default_error_pct for r in rows if r.set == "deck"]
    return {
        "groups": groups,
        "overall": {"default": stats(d),
                    "seed": stats([r.seed_error_pct for r in rows if r.seed_error_pct is not None])},
        "deck": {"default": stats(deck),
                 "seed": stats([r.seed_error_pct for r in rows if r.set == "deck" and r.seed_error_pct is not None])},
        "signs": {"low": sum(e < 0 for e in d), "high": sum(e > 0 for e in d)},
    }
