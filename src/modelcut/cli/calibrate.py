"""``modelcut calibrate``: fit the default model's constants to measured runs, write a profile."""

from __future__ import annotations

import json
from dataclasses import replace as dc_replace
from pathlib import Path

import typer
from rich.console import Console
from rich.table import Table

from .. import catalog
from ..catalog import profiles
from ..core import calibrate as cal
from ..core.kernels import NAMES
from . import app, fail

_COLUMNS_HELP = "CSV columns: " + ", ".join(profiles.CSV_COLUMNS)


def _console() -> Console:
    return Console(width=max(Console().width, 200))


@app.command()
def calibrate(
    runs: Path = typer.Option(None, "--runs", dir_okay=False,
                              help="your measured runs as CSV (default: the catalog's published runs). " + _COLUMNS_HELP),
    gpu: str = typer.Option(None, "--gpu", help="fit the runs on this accelerator only (default: a100-sxm4-80gb "
                                                "for the catalog; every row of --runs otherwise)"),
    fit_names: str = typer.Option("gemm,mem,net", "--fit", help="constants to fit, comma-separated, among "
                                                                 + ", ".join(NAMES)),
    base: str = typer.Option(None, "--base", help="a profile file or accelerator whose constants the unfitted "
                                                   "ones keep and the fit starts from (default: the shipped profile)"),
    out: Path = typer.Option(None, "--out", dir_okay=False, help="write the fitted profile (TOML) here"),
    cv: bool = typer.Option(True, "--cv/--no-cv", help="leave-one-group-out cross-validation table"),
    as_json: bool = typer.Option(False, "--json", help="print JSON: constants, per-run errors, cross-validation"),
) -> None:
    """Fit ≤ 3 constants (matrix-product, memory and network efficiency) by least squares on measured
    runs; print per-run errors and a leave-one-group-out table; write a hardware profile."""
    names = tuple(x.strip() for x in fit_names.split(",") if x.strip())
    if not names:
        fail("--fit names no constant")
    for k in names:
        if k not in NAMES:
            fail(f"unknown constant {k!r} in --fit; choose among {', '.join(NAMES)}")
    if runs is not None:
        measured = profiles.read_runs_csv(runs)
        if gpu:
            want = catalog.hardware(gpu).name
            measured = [m for m in measured if m.hw.name == want]
    else:
        measured = profiles.catalog_measured(gpu or "a100-sxm4-80gb")
    if not measured:
        fail("no runs on that accelerator")
    hws = sorted({m.hw.name for m in measured})
    if len(hws) > 1:
        fail(f"the runs are on several accelerators ({', '.join(hws)}); choose one with --gpu")
    hw_name = hws[0]
    if base is None:
        base_prof = profiles.profile_for(hw_name)
    elif base.endswith(".toml"):
        base_prof = profiles.load_profile(base)
    else:
        base_prof = profiles.profile_for(catalog.hardware(base).name)
    result = cal.fit(measured, names, base_prof.efficiency)
    folds = cal.leave_one_family_out(measured, names, base_prof.efficiency) if cv else {}
    inherits = base_prof.hardware if set(names) != set(NAMES) else ""
    source = f"modelcut calibrate on {len(measured)} runs" + (f" ({runs.name})" if runs is not None else " (catalog)")
    if out is not None:
        profiles.write_profile(out, profiles.profile_text(hw_name, result, inherits=inherits, source=source,
                                                          folds=folds))
    if as_json:
        print(json.dumps({
            "hardware": hw_name, "fitted": list(names),
            "efficiency": dict(zip(NAMES, result.efficiency.as_tuple())),
            "runs": result.errors_pct, "mean_abs_error_pct": result.mean_abs_pct,
            "max_abs_error_pct": result.max_abs_pct,
            "cross_validation": {g: {"efficiency": dict(zip(NAMES, f["efficiency"].as_tuple())),
                                     "errors_pct": f["errors_pct"]} for g, f in folds.items()},
        }))
        return
    con = _console()
    e = result.efficiency
    con.print(f"[bold]{hw_name}[/bold]: fitted {', '.join(names)} on {len(measured)} runs "
              f"(unfitted from {base_prof.hardware})")
    con.print(f"gemm = {e.gemm:.4f}   mem = {e.mem:.4f}   net = {e.net:.4f}")
    table = Table("Run", "Group", "Framework", "Error")
    for m in measured:
        table.add_row(m.id, m.family, m.framework or "(default)", f"{result.errors_pct[m.id]:+.1f} %")
    con.print(table)
    con.print(f"mean |error| {result.mean_abs_pct:.1f} %, largest {result.max_abs_pct:.1f} %")
    if folds:
        cvt = Table("Left out", "gemm", "mem", "net", "Runs", "Mean |error|", "Largest",
                    title="Leave one group out: fitted without the group, its runs predicted")
        for g, f in folds.items():
            errs = [abs(x) for x in f["errors_pct"].values()]
            fe = f["efficiency"]
            cvt.add_row(g, f"{fe.gemm:.3f}", f"{fe.mem:.3f}", f"{fe.net:.3f}", str(len(errs)),
                        f"{sum(errs) / len(errs):.1f} %", f"{max(errs):.1f} %")
        con.print(cvt)
    if out is not None:
        con.print(f"wrote {out}")


# ---------------------------------------------------------------- default mode for validate / predict

def _profiles_for(profile: Path | None):
    """hardware -> Efficiency: the user's profile for its accelerator, shipped ones elsewhere."""
    user = profiles.load_profile(profile) if profile is not None else None

    def eff_for(hw):
        if user is not None and catalog.hardware(user.hardware).name == hw.name:
            return user.efficiency
        return profiles.profile_for(hw).efficiency
    return eff_for, user


def _budget_lines(b) -> str:
    return "; ".join(f"{ln.input} {ln.alternative}: {ln.change_pct:+.1f} %" for ln in b.lines)


def validate_default(as_json: bool = False, profile: Path | None = None, budget: bool = False) -> None:
    """``modelcut validate --mode default``: every published run (deck and dev sets) under the
    default model beside the seed mode, per group and overall, the constants and where they
    were fitted, and the leave-one-group-out table stored with each profile."""
    from ..core.stepmodel import default_eta, predict as predict_run
    eff_for, user = _profiles_for(profile)
    measured = profiles.catalog_measured()
    sets = {pr.id: pr.set for pr in catalog.published_runs()}
    originals = {pr.id: pr.run for pr in catalog.published_runs()}
    eta_seed = default_eta("seed")

    def seed(m):
        try:
            return predict_run(originals[m.id], m.hw, "seed", eta_seed)
        except Exception:  # noqa: BLE001 - a run the seed mode cannot express
            return None

    rows = cal.side_by_side(measured, sets, eff_for, seed)
    summary = cal.summarize(rows)
    budgets = {}
    if budget:
        for r in rows:
            budgets[r.id] = cal.error_budget(r.measured.run, r.measured.hw, eff_for(r.measured.hw),
                                             r.measured.framework)
    used = {}
    for m in measured:
        if m.hw.name not in used:
            used[m.hw.name] = user if (user is not None and catalog.hardware(user.hardware).name == m.hw.name) \
                else profiles.profile_for(m.hw)
    if as_json:
        keys = ("compute_s", "tp_s", "cp_s", "p2p_s", "bubble_s", "dp_s", "optimizer_s")
        print(json.dumps({
            "mode": "default",
            "profiles": {h: {"gemm": p.efficiency.gemm, "mem": p.efficiency.mem, "net": p.efficiency.net,
                             "fitted": list(p.fitted), "runs": list(p.runs), "inherits": p.inherits,
                             "cv": {c[0]: {"gemm": c[1], "mem": c[2], "net": c[3], "runs": c[4],
                                           "mean_abs_error_pct": c[5], "max_abs_error_pct": c[6]} for c in p.cv}}
                         for h, p in used.items()},
            "runs": [{"id": r.id, "set": r.set, "group": r.group, "framework": r.framework,
                      "published": r.published, "unit": r.unit,
                      "default": {"predicted": r.value(r.default), "step_time_s": r.default.step_time_s,
                                  "error_pct": r.default_error_pct, "dominant": r.dominant,
                                  "breakdown": {k: getattr(r.default.breakdown, k, 0.0) for k in keys}},
                      "seed": None if r.seed is None else {"predicted": r.value(r.seed),
                                                           "step_time_s": r.seed.step_time_s,
                                                           "error_pct": r.seed_error_pct},
                      **({"budget": [{"input": ln.input, "alternative": ln.alternative, "change_pct": ln.change_pct}
                                     for ln in budgets[r.id].lines]} if budget else {})}
                     for r in rows],
            "summary": summary,
        }))
        return
    con = _console()
    table = Table("Run", "Set", "Published", "Default", "Error", "Seed", "Error", "Compute", "TP", "CP", "P2P",
                  "Bubble", "DP", "Opt", "Dominant",
                  title="Published runs: default model beside the seed (TFLOP/s per GPU; step-time rows in seconds)")

    def val(r, pred):
        return f"{r.value(pred):.2f} s" if r.unit == "s" else f"{r.value(pred):.1f}"

    for r in rows:
        b = r.default.breakdown
        pub = f"{r.published:g} s" if r.unit == "s" else f"{r.published:g}"
        table.add_row(r.id, r.set, pub, val(r, r.default), f"{r.default_error_pct:+.1f} %",
                      "-" if r.seed is None else val(r, r.seed),
                      "-" if r.seed_error_pct is None else f"{r.seed_error_pct:+.1f} %",
                      *(f"{x:.2f}" for x in (b.compute_s, b.tp_s, b.cp_s, b.p2p_s, b.bubble_s, b.dp_s,
                                             getattr(b, "optimizer_s", 0.0))), r.dominant)
    con.print(table)
    gt = Table("Group", "Runs", "Default mean |err|", "Default largest", "Seed mean |err|", "Seed largest",
               title="Per group and overall (errors: throughput, + = predicted faster)")

    def fmt(x):
        return "-" if x is None else f"{x:.1f} %"
    for g, st in summary["groups"].items():
        gt.add_row(g, str(st["default"]["runs"]), fmt(st["default"]["mean_abs_pct"]), fmt(st["default"]["max_abs_pct"]),
                   fmt(st["seed"]["mean_abs_pct"]), fmt(st["seed"]["max_abs_pct"]))
    for name in ("deck", "overall"):
        st = summary[name]
        gt.add_row(f"[bold]{name}[/bold]", str(st["default"]["runs"]), fmt(st["default"]["mean_abs_pct"]),
                   fmt(st["default"]["max_abs_pct"]), fmt(st["seed"]["mean_abs_pct"]), fmt(st["seed"]["max_abs_pct"]))
    con.print(gt)
    sg = summary["signs"]
    con.print(f"default model: {sg['low']} predictions low, {sg['high']} high")
    for h, p in used.items():
        e = p.efficiency
        fitted = ", ".join(p.fitted) or "none"
        inh = f"; the others from {p.inherits}" if p.inherits else ""
        con.print(f"{h}: gemm {e.gemm:.4f}, mem {e.mem:.4f}, net {e.net:.4f} (fitted: {fitted} on "
                  f"{len(p.runs)} runs{inh}; {p.path or p.source})")
        if p.cv:
            cvt = Table("Left out", "gemm", "mem", "net", "Runs", "Mean |error|", "Largest",
                        title=f"{h}: leave one group out (fitted without the group, its runs predicted)")
            for c in p.cv:
                cvt.add_row(c[0], f"{c[1]:.3f}", f"{c[2]:.3f}", f"{c[3]:.3f}", str(c[4]), f"{c[5]:.1f} %",
                            f"{c[6]:.1f} %")
            con.print(cvt)
    if budget:
        bt = Table("Run", "Dominant", "Share", "Other plausible inputs: change of predicted throughput",
                   title="Error budget")
        for r in rows:
            b = budgets[r.id]
            bt.add_row(r.id, b.dominant.removesuffix("_s"), f"{b.dominant_share * 100:.0f} %", _budget_lines(b))
        con.print(bt)


def predict_default(run, eta=None, as_json: bool = False, framework: str | None = None, overlap: str | None = None,
                    profile: Path | None = None, budget: bool = False, extra=None) -> None:
    """``modelcut predict --mode default``. ``extra``: a function of the prediction returning more
    JSON fields (memory, the published figure), printed as lines under the table too."""
    from ..core.overlap import parse_overlap
    from ..core.stepmodel import predict as predict_run
    hw = catalog.hardware(run.gpu)
    eff_for, _ = _profiles_for(profile)
    eff = eff_for(hw)
    ov = parse_overlap(overlap) if overlap else None
    pred = predict_run(run, hw, "default", eta, framework=framework, overlap=ov, profile=eff)
    b = cal.error_budget(run, hw, eff if eta is None else dc_replace(eff, gemm=eta), framework, ov) if budget else None
    more = extra(pred) if extra is not None else {}
    if as_json:
        d = pred.as_dict()
        d.update(more)
        if b is not None:
            d["budget"] = {"dominant": b.dominant, "dominant_share": b.dominant_share,
                           "lines": [{"input": ln.input, "alternative": ln.alternative, "change_pct": ln.change_pct}
                                     for ln in b.lines]}
        print(json.dumps(d))
        return
    from .systems import extra_lines, show_prediction
    show_prediction(run, pred, "mode default",
                    extra_lines(more.get("memory", {"error": "not computed"}), more.get("published"), hw)
                    if more else [])
    con = _console()
    if b is not None:
        con.print(f"dominant term: {b.dominant.removesuffix('_s')} ({b.dominant_share * 100:.0f} % of the step)")
        for ln in b.lines:
            con.print(f"  {ln.input} {ln.alternative}: {ln.change_pct:+.1f} %")
