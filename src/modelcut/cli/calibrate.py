"""``modelcut calibrate``: fit the default model's constants to measured runs, write a profile; and
the text view of ``modelcut validate --mode default``."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path

import typer
from rich.table import Table

from ..core.costs.kernels import NAMES
from ..service import calibrate as service
from ..service.limits import DEFAULT
from ..service.runs_csv import CSV_COLUMNS
from ..service.validation import DefaultTable
from .app import app
from .common import check_writable, progress, write_file

#: calibrate's runs meet the default caps, which it has no flags to raise
NO_FLAGS = dataclasses.replace(DEFAULT, flags=False)
from .views import console

_COLUMNS_HELP = "CSV columns: " + ", ".join(CSV_COLUMNS)


write_text = write_file


@app.command()
def calibrate(
    runs: Path = typer.Option(None, "--runs", dir_okay=False,
                              help="your measured runs as CSV (default: the catalog's published runs). " + _COLUMNS_HELP),
    gpu: str = typer.Option(None, "--gpu", help="fit the runs on this accelerator only (default: every run, "
                                                "one profile shared by all accelerators)"),
    fit_names: str = typer.Option(service.FITTED, "--fit", help="constants to fit, comma-separated, among "
                                                                 + ", ".join(NAMES)),
    base: str = typer.Option(None, "--base", help="a profile file or accelerator whose constants the unfitted "
                                                   "ones keep and the fit starts from (default: the shipped profile)"),
    out: Path = typer.Option(None, "--out", dir_okay=False, help="write the fitted profile (TOML) here"),
    cv: bool = typer.Option(True, "--cv/--no-cv", help="leave-one-group-out cross-validation table"),
    weigh: str = typer.Option("runs", "--weigh", help="what the fit weighs alike: runs (each run, as the shipped "
                                                       "profile is fitted) or sources (each source's runs "
                                                       "together weigh as one run of another source's)"),
    as_json: bool = typer.Option(False, "--json", help="print JSON: constants, per-run errors, cross-validation"),
) -> None:
    """Fit the default model's constants (the sustained share of measured kernel throughput and of HBM
    bandwidth) by least squares on measured runs; print per-run errors and a leave-one-source-out
    table; write a profile."""
    if out is not None:
        check_writable(out)
    with progress("fitting", enabled=not as_json) as update:
        res = service.calibrate(runs, gpu, fit_names, base, cv,
                                progress=lambda done, total, text: update(done, total, f"{text}: {done} predictions"),
                                limits=NO_FLAGS, weigh=weigh)
    if out is not None:
        write_text(out, res.text)
    if as_json:
        print(json.dumps(res.as_dict()))
        return
    con = console(200)
    e = res.fit.efficiency
    weighed = "each run alike" if res.weigh == "runs" else "each source alike"
    con.print(f"[bold]{res.hardware}[/bold]: fitted {', '.join(res.names)} on {len(res.measured)} runs, "
              f"{weighed} (unfitted from {res.base.hardware})")
    con.print(f"gemm = {e.gemm:.4f}   mem = {e.mem:.4f}   net = {e.net:.4f}")
    table = Table("Run", "Group", "Framework", "Error")
    for m in res.measured:
        table.add_row(m.id, m.family, m.framework or "(default)", f"{res.fit.errors_pct[m.id]:+.1f} %")
    con.print(table)
    con.print(f"mean |error| {res.fit.mean_abs_pct:.1f} %, largest {res.fit.max_abs_pct:.1f} %")
    if res.folds:
        cvt = Table("Left out", "gemm", "mem", "net", "Runs", "Mean |error|", "Largest",
                    title="Leave one group out: fitted without the group, its runs predicted")
        lo = res.loso
        for g, f in res.folds.items():
            st, fe = lo["sources"][g], f["efficiency"]
            cvt.add_row(g, f"{fe.gemm:.3f}", f"{fe.mem:.3f}", f"{fe.net:.3f}", str(st["runs"]),
                        f"{st['mean_abs_pct']:.1f} %", f"{st['max_abs_pct']:.1f} %")
        con.print(cvt)
        con.print(f"leave one source out, every run: mean |error| {lo['mean_abs_pct']:.2f} %, largest "
                  f"{lo['max_abs_pct']:.1f} %; the sources' own means averaged: {lo['source_mean_abs_pct']:.2f} %; "
                  f"the source furthest off on average: {lo['worst_source']} {lo['worst_source_signed_pct']:+.1f} %")
    if out is not None:
        con.print(f"wrote {out}")


def _budget_lines(b) -> str:
    return "; ".join(f"{ln.input} {ln.alternative}: {ln.change_pct:+.1f} %" for ln in b.lines)


def show_user_table(out: dict) -> None:
    """``modelcut validate --runs FILE.csv`` as text: per group and overall first, then every run,
    then the constants used (none fitted to these runs)."""
    con = console(200)

    def fmt(x, signed=False):
        return "-" if x is None else (f"{x:+.1f} %" if signed else f"{x:.1f} %")

    st_t = Table("Group", "Runs", "Mean |error|", "Mean error", "Largest",
                 title="Your runs, predicted with constants fitted on none of them; errors in throughput, "
                       "+ = predicted faster")
    for g, st in [*out["groups"].items(), ("[bold]overall[/bold]", out["overall"])]:
        st_t.add_row(g, str(st["runs"]), fmt(st["mean_abs_pct"]), fmt(st["mean_signed_pct"], True),
                     fmt(st["max_abs_pct"]))
    con.print(st_t)
    table = Table("Run", "Group", "Framework", "GPU", "Measured", "Predicted", "Error", "Step (s)",
                  "Tokens/s/GPU", "Dominant", "Peak GB",
                  title="Every run (TFLOP/s per GPU, or seconds a step where the CSV gives a step time or "
                        "tokens/s; step and tokens/s/GPU: measured → predicted; peak memory per device)")
    over = []
    for r in out["runs"]:
        u = " s" if r["unit"] == "s" else ""
        mem = r["memory"]
        if "error" in mem:
            peak = "-"
        else:
            peak = f"{mem['peak_bytes'] / 1e9:.1f}"
            if not mem["fits"]:
                peak += f" > {mem['capacity_bytes'] / 1e9:.1f}"
                over.append(r["id"])
        table.add_row(r["id"], r["group"], r["framework"], r["gpu"], f"{r['measured']:.4g}{u}",
                      f"{r['predicted']:.4g}{u}", fmt(r["error_pct"], True),
                      f"{r['measured_step_time_s']:.3f} → {r['step_time_s']:.3f}",
                      f"{r['measured_tokens_per_s_per_gpu']:,.0f} → {r['tokens_per_s_per_gpu']:,.0f}", r["dominant"],
                      peak)
    con.print(table)
    for r in out["runs"]:
        for note in r.get("notes", []):
            con.print(f"{r['id']}: {note}")
    if out.get("skipped"):
        con.print(f"{len(out['skipped'])} row(s) left out (--keep-going), not in the figures above:")
        for b in out["skipped"]:
            con.print(f"  {b['error']}")
    if over:
        con.print(f"{len(over)} run(s) ran but the memory model counts more than the device holds "
                  f"({', '.join(over)}): the memory model over-counts these settings")
    for h, p in out["profiles"].items():
        con.print(f"{h}: gemm {p['gemm']:.4f}, mem {p['mem']:.4f}, net {p['net']:.4f} ({p['source']})")


def show_default_table(t: DefaultTable) -> None:
    """``modelcut validate --mode default`` as text: first the error out of sample, per source
    (each source's runs predicted with the constants fitted without it) beside the in-sample
    error; then every run; the constants and their folds; the error budgets when asked for."""
    rows, summary, used, budgets, budget = t.rows, t.summary, t.profiles, t.budgets, bool(t.budgets)
    con = console(200)

    def fmt(x, signed=False):
        return "-" if x is None else (f"{x:+.1f} %" if signed else f"{x:.1f} %")

    st_t = Table("Source", "Runs", "Mean |error|", "Mean error", "Largest", "In sample: mean", "Largest",
                 title="Out of sample first: each source's runs predicted with the constants fitted without "
                       "that source (leave one source out); errors in throughput, + = predicted faster")
    for g, st in summary["groups"].items():
        lo, ins = st["loso"], st["default"]
        st_t.add_row(g, str(ins["runs"]), fmt(lo["mean_abs_pct"]), fmt(lo["mean_signed_pct"], True),
                     fmt(lo["max_abs_pct"]), fmt(ins["mean_abs_pct"]), fmt(ins["max_abs_pct"]))
    for name in ("deck", "overall"):
        lo, ins = summary[name]["loso"], summary[name]["default"]
        st_t.add_row(f"[bold]{name}[/bold]", str(ins["runs"]), fmt(lo["mean_abs_pct"]),
                     fmt(lo["mean_signed_pct"], True), fmt(lo["max_abs_pct"]), fmt(ins["mean_abs_pct"]),
                     fmt(ins["max_abs_pct"]))
    con.print(st_t)

    table = Table("Run", "Source", "Published", "Out of sample", "Error", "In sample", "Error", "Seed", "Error",
                  "Compute", "TP", "CP", "P2P", "Bubble", "DP", "Opt", "Dominant",
                  title="Every run (TFLOP/s per GPU; step-time rows in seconds); the breakdown is the in-sample "
                        "prediction's, in seconds")

    def val(r, pred):
        if pred is None:
            return "-"
        return f"{r.value(pred):.2f} s" if r.unit == "s" else f"{r.value(pred):.1f}"

    for r in rows:
        b = r.default.breakdown
        pub = f"{r.published:g} s" if r.unit == "s" else f"{r.published:g}"
        table.add_row(r.id, r.group, pub, val(r, r.loso), fmt(r.loso_error_pct, True),
                      val(r, r.default), fmt(r.default_error_pct, True),
                      val(r, r.seed), fmt(r.seed_error_pct, True),
                      *(f"{x:.2f}" for x in (b.compute_s, b.tp_s, b.cp_s, b.p2p_s, b.bubble_s, b.dp_s,
                                             b.optimizer_s)), r.dominant)
    con.print(table)
    seed_st = summary["deck"]["seed"]
    con.print(f"seed mode on the deck's runs: mean |error| {fmt(seed_st['mean_abs_pct'])}, "
              f"largest {fmt(seed_st['max_abs_pct'])}")
    sg = summary["signs"]
    con.print(f"default model in sample: {sg['low']} predictions low, {sg['high']} high")
    for h, p in used.items():
        e = p.efficiency
        fitted = ", ".join(p.fitted) or "none"
        inh = f"; the others from {p.inherits}" if p.inherits else ""
        con.print(f"{h}: gemm {e.gemm:.4f}, mem {e.mem:.4f}, net {e.net:.4f} (fitted: {fitted} on "
                  f"{len(p.runs)} runs{inh}; {p.path or p.source})")
        if p.cv:
            cvt = Table("Left out", "gemm", "mem", "net", "Runs", "Mean |error|", "Largest",
                        title=f"{h}: the folds' constants (fitted without the source, as calibrate left them)")
            for c in p.cv:
                # the errors as the profile stores them (two decimals), not rounded a second time
                cvt.add_row(c[0], f"{c[1]:.3f}", f"{c[2]:.3f}", f"{c[3]:.3f}", str(c[4]), f"{c[5]:.2f} %",
                            f"{c[6]:.2f} %")
            con.print(cvt)
    if budget:
        bt = Table("Run", "Dominant", "Share", "Other plausible inputs: change of predicted throughput",
                   title="Error budget")
        for r in rows:
            b = budgets[r.id]
            bt.add_row(r.id, b.dominant.removesuffix("_s"), f"{b.dominant_share * 100:.0f} %", _budget_lines(b))
        con.print(bt)
