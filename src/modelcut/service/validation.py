"""The validation tables as every face shows them (``modelcut validate``, ``GET /api/runs``).

* :func:`seed_table`: the deck's table, the seed model with η fitted on Megatron-LM's 1.7B run.
* :func:`kernel_rows`: the measured kernel tables against published kernel benchmarks, and the
  step model's layer times against published layer measurements (:mod:`..analysis.kernel_checks`),
  ``validate --kernels``.
* :func:`user_table`: a user's measured runs (CSV, :mod:`.runs_csv`) under the shipped model, nothing
  fitted to them: ``validate --runs FILE.csv``.
* :func:`default_table`: every published run (deck and development sets) under the default model,
  out of sample first (each source's runs predicted with the constants of the profile's fold
  that left that source out), in sample beside it, and the seed; per source and overall, with
  the profiles used and, when asked, each run's error budget. :meth:`DefaultTable.as_dict` is ``validate --mode default --json``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from .. import catalog
from ..analysis import kernel_checks
from ..analysis import validation as av
from ..analysis.budget import ErrorBudget, error_budget
from ..analysis.measured import Measured, catalog_measured, measured_step_time
from ..catalog import Profile
from ..catalog.kernel_checks import attention_sweeps, gemm_sweeps, layer_checks, linear_checks, norm_sweeps
from ..core.errors import ModelcutError
from ..core.step import seed
from .limits import Limits
from .predict import efficiency_for, fold_constants, prediction_memory, profile_on
from .runs_csv import read_runs_rows

BREAKDOWN_KEYS = ("compute_s", "tp_s", "cp_s", "p2p_s", "bubble_s", "dp_s", "optimizer_s")


def kernel_rows() -> dict[str, Any]:
    """Every published kernel benchmark beside modelcut's time for it, with the benchmarks'
    sources: ``validate --kernels --json``."""
    return {"rows": [r.as_dict() for r in kernel_checks.linear_rows()],
            "sources": {c.id: {"source": c.source, "device": c.hw.name, "device_source": c.device_source,
                               "date": c.date} for c in linear_checks()},
            "layers": [r.as_dict() for r in kernel_checks.layer_rows()],
            "layer_sources": {c.id: {"source": c.source, "run": c.run} for c in layer_checks()},
            "sweeps": [r.as_dict() for r in kernel_checks.sweep_rows()],
            "sweep_sources": {c.id: {"source": c.source, "device": c.hw.name, "date": c.date} for c in gemm_sweeps()},
            "attention": [r.as_dict() for r in kernel_checks.attention_rows()],
            "attention_sources": {c.id: {"source": c.source, "device": c.hw.name, "device_source": c.device_source,
                                         "kernel": c.kernel, "date": c.date} for c in attention_sweeps()},
            "norms": [r.as_dict() for r in kernel_checks.norm_rows()],
            "norm_sources": {c.id: {"source": c.source, "device": c.hw.name, "kernel": c.kernel, "date": c.date}
                             for c in norm_sweeps()}}


def deck_runs() -> list[catalog.PublishedRun]:
    """The 13 runs of the deck's table."""
    return catalog.published_runs("deck")


def seed_table() -> av.Validation:
    return av.validate(deck_runs(), catalog.hardware, "seed")


@dataclass
class DefaultTable:
    rows: list[av.SideBySideRow]
    summary: dict[str, Any]
    profiles: dict[str, Profile]
    budgets: dict[str, ErrorBudget]

    def as_dict(self) -> dict[str, Any]:
        return {
            "mode": "default",
            "profiles": {h: {"gemm": p.efficiency.gemm, "mem": p.efficiency.mem, "net": p.efficiency.net,
                             "fitted": list(p.fitted), "runs": list(p.runs), "inherits": p.inherits,
                             "cv": {c[0]: {"gemm": c[1], "mem": c[2], "net": c[3], "runs": c[4],
                                           "mean_abs_error_pct": c[5], "max_abs_error_pct": c[6]} for c in p.cv}}
                         for h, p in self.profiles.items()},
            "runs": [self._row(r) for r in self.rows],
            "summary": self.summary,
        }

    def _row(self, r: av.SideBySideRow) -> dict[str, Any]:
        out = {"id": r.id, "set": r.set, "group": r.group, "framework": r.framework,
               "published": r.published, "unit": r.unit,
               "default": {"predicted": r.value(r.default), "step_time_s": r.default.step_time_s,
                           "error_pct": r.default_error_pct, "dominant": r.dominant,
                           "breakdown": {k: getattr(r.default.breakdown, k) for k in BREAKDOWN_KEYS}},
               "loso": None if r.loso is None else {"predicted": r.value(r.loso), "step_time_s": r.loso.step_time_s,
                                                    "error_pct": r.loso_error_pct},
               "seed": None if r.seed is None else {"predicted": r.value(r.seed), "step_time_s": r.seed.step_time_s,
                                                    "error_pct": r.seed_error_pct}}
        if self.budgets:
            out["budget"] = [{"input": ln.input, "alternative": ln.alternative, "change_pct": ln.change_pct}
                             for ln in self.budgets[r.id].lines]
        return out


def default_table(profile: Profile | None = None, budget: bool = False) -> DefaultTable:
    """Every published run under the default model (the user's ``profile`` for its accelerator,
    the shipped ones elsewhere) beside the seed (the run as runs.toml records it)."""
    measured = catalog_measured()
    sets = {pr.id: pr.set for pr in catalog.published_runs()}
    originals = {pr.id: pr.run for pr in catalog.published_runs()}
    eta = av.seed_eta()

    def seed_of(m: Measured):
        try:
            return seed.predict(originals[m.id], m.hw, eta)
        except ModelcutError:   # a run the seed mode cannot express
            return None

    def held_out(m: Measured):
        """The constants of the profile's fold that left this run's source out (None: no fold)."""
        return fold_constants(m.family, m.hw, profile)

    rows = av.side_by_side(measured, sets, lambda hw: efficiency_for(hw, profile), seed_of, held_out)
    budgets = {r.id: error_budget(r.measured.run, r.measured.hw, efficiency_for(r.measured.hw, profile),
                                  r.measured.framework, r.measured.overlap) for r in rows} if budget else {}
    used: dict[str, Profile] = {}
    for m in measured:
        p = profile_on(m.hw, profile)
        used.setdefault(p.hardware, p)
    return DefaultTable(rows, av.summarize(rows), used, budgets)


def user_table(path, profile: Profile | None = None, limits: Limits | None = None,
               keep_going: bool = False) -> dict[str, Any]:
    """A user's measured runs (a CSV file, :func:`.runs_csv.read_runs_csv`) predicted by the default
    model with the shipped constants (or ``profile``'s), none of them fitted to these runs: each
    run's measured and predicted figure and error (+ = predicted faster), per group (the CSV's
    ``group``, else the framework) and overall: ``validate --runs FILE.csv [--json]``. The first
    row that is not a run modelcut can predict is a one-line error; with ``keep_going`` every such
    row is left out and listed under ``skipped`` with its line (``--keep-going``), and the figures
    are the other rows', unless no row is left."""
    measured, bad = read_runs_rows(path, limits)
    if bad and not keep_going:
        raise ModelcutError(bad[0].error)
    skipped = [{"id": b.id, "error": b.error} for b in bad]
    rows = []
    for m in measured:
        try:
            rows += av.side_by_side([m], {}, lambda hw: efficiency_for(hw, profile))
        except ModelcutError as exc:     # a run the model cannot time (FP8 on an A100): its row named
            line = f"{m.source}: run {m.id!r}: {exc}"
            if not keep_going:
                raise ModelcutError(line) from None
            skipped.append({"id": m.id, "error": line})
    if not rows:
        raise ModelcutError(f"{path}: no runs" if not skipped else f"{path}: no row could be predicted "
                            f"({len(skipped)} left out; the first: {skipped[0]['error']})")
    measured = [r.measured for r in rows]
    summary = av.summarize(rows)
    used: dict[str, Profile] = {}
    for m in measured:
        p = profile_on(m.hw, profile)
        used.setdefault(p.hardware, p)

    def memory(r) -> dict[str, Any]:
        """The run's peak memory per device as predict counts it: a run that ran but that the memory
        model says cannot fit shows where the memory model over-counts."""
        m = r.measured
        rep = prediction_memory(m.run, m.hw, r.default, catalog.framework(m.framework).with_overlap(m.overlap))
        if "error" in rep:
            return {"error": rep["error"]}
        return {"peak_bytes": rep["peak_bytes"], "capacity_bytes": rep["capacity_bytes"], "fits": rep["fits"]}
    return {
        "mode": "default",
        "runs": [{"id": r.id, "group": r.group, "framework": r.framework or catalog.default_framework(),
                  "gpu": r.measured.hw.name, "measured": r.published, "unit": r.unit, "predicted": r.value(r.default),
                  "step_time_s": r.default.step_time_s, "error_pct": r.default_error_pct, "dominant": r.dominant,
                  "measured_step_time_s": measured_step_time(r.measured),
                  "measured_tokens_per_s_per_gpu": r.measured.run.tokens_per_s_per_gpu(measured_step_time(r.measured)),
                  "tokens_per_s_per_gpu": r.measured.run.tokens_per_s_per_gpu(r.default.step_time_s),
                  "breakdown": {k: getattr(r.default.breakdown, k) for k in BREAKDOWN_KEYS},
                  "notes": list(r.measured.notes),
                  "memory": memory(r)} for r in rows],
        "groups": {g: st["default"] for g, st in summary["groups"].items()},
        "overall": summary["overall"]["default"],
        "profiles": {h: {"gemm": p.efficiency.gemm, "mem": p.efficiency.mem, "net": p.efficiency.net,
                         "source": p.path or p.source} for h, p in used.items()},
        "skipped": skipped,
    }


def runs_page(mode: str = "seed", which: str = "deck") -> dict[str, Any]:
    """The web's runs page: one row per published run with its layout, the published and
    predicted throughput (or step time), the error and the breakdown. Under the default model each
    row also carries its prediction out of sample (``out_of_sample``: with the constants of the
    profile's fold that left its source out, as ``validate --mode default`` leads with), and the
    summary both figures; the row's own ``predicted`` and ``error_pct`` are in sample."""
    if mode == "seed":
        return _seed_page(which)
    if mode != "default":
        raise ModelcutError(f"unknown mode {mode!r}; choose seed or default")
    table = default_table()
    by_id = {r.id: r for r in catalog.published_runs()}
    rows = []
    for r in table.rows:
        if which == "deck" and r.set != "deck":
            continue
        pr = by_id[r.id]
        row = _page_row(pr, r.default, r.measured.run, r.published, r.unit, r.value(r.default),
                        r.default_error_pct, False)
        # out of sample first: the run predicted with the constants fitted without its source
        held = None if r.loso is None else _page_row(pr, r.loso, r.measured.run, r.published, r.unit,
                                                     r.value(r.loso), r.loso_error_pct, False)
        row["out_of_sample"] = None if held is None else {
            k: held[k] for k in ("predicted", "predicted_tflops", "error_pct", "step_time_s")}
        rows.append(row)
    st = table.summary["deck" if which == "deck" else "overall"]
    ins, oos = st["default"], st["loso"]
    summary = {"mean_abs_error_pct": ins["mean_abs_pct"], "max_abs_error_pct": ins["max_abs_pct"],
               "predicted": len(rows), "signs": table.summary["signs"],
               "out_of_sample": {"runs": oos["runs"], "mean_abs_error_pct": oos["mean_abs_pct"],
                                 "max_abs_error_pct": oos["max_abs_pct"], "mean_signed_error_pct": oos["mean_signed_pct"]}}
    return {"mode": "default", "eta": None, "calibration": None, "runs": rows, "summary": summary}


def _page_row(pr, pred, run, published, unit: str, predicted: float, error: float, fitted: bool) -> dict[str, Any]:
    lay = run.layout
    return {"id": pr.id, "family": pr.family, "model": run.model.name, "gpu": run.gpu, "gpus": lay.gpus,
            "layout": {"tp": lay.tp, "cp": lay.cp, "pp": lay.pp, "dp": lay.dp, "ep": lay.ep, "etp": lay.etp,
                       "vpp": pred.vpp, "schedule": pred.schedule},
            "unit": unit, "published": published, "predicted": predicted,
            "published_tflops": published if unit == "TFLOP/s" else None,
            "predicted_tflops": predicted if unit == "TFLOP/s" else pred.tflops_per_gpu,
            "error_pct": error, "fitted": fitted, "step_time_s": pred.step_time_s,
            "breakdown": pred.breakdown.as_dict(), "source": pr.source, "notes": pr.notes}


def _seed_page(which: str) -> dict[str, Any]:
    runs = catalog.published_runs("deck" if which == "deck" else None)
    val = av.validate(runs, catalog.hardware, "seed")
    by_id = {r.id: r for r in runs}
    rows = [_page_row(by_id[r.id], r.prediction, by_id[r.id].run, r.published_tflops, "TFLOP/s", r.predicted_tflops,
                      r.error_pct, r.fitted) for r in val.rows]
    summary = {"max_error_pct": dict(val.max_error_pct), "mean_abs_error_pct": val.mean_abs_error_pct,
               "all_low": val.all_low, "predicted": sum(not r["fitted"] for r in rows)}
    return {"mode": "seed", "eta": val.eta, "calibration": val.calibration, "runs": rows, "summary": summary}
