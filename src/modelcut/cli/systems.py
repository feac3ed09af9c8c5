"""``modelcut validate``, ``modelcut predict`` and ``modelcut report``: the training-systems model."""

from __future__ import annotations

import json
from pathlib import Path

import typer
from rich.console import Console
from rich.table import Table

from .. import catalog
from ..core.pipeline import bubble_table
from ..core.stepmodel import ASSUMPTIONS, MODES, predict as predict_run
from ..core.validate import validate as validate_runs
from ..faces import report as report_face
from ..faces.runfile import load_run
from . import app, fail

_MODE_HELP = f"model mode: {', '.join(MODES)}"


def _console() -> Console:
    return Console(width=max(Console().width, 150))


def _validation(mode: str):
    if mode not in MODES:
        fail(f"unknown mode {mode!r}; choose one of {', '.join(MODES)}")
    return validate_runs(catalog.published_runs("deck"), catalog.hardware, mode)


@app.command()
def validate(
    mode: str = typer.Option("seed", "--mode", help=_MODE_HELP),
    as_json: bool = typer.Option(False, "--json", help="print the documented JSON object"),
    profile: Path = typer.Option(None, "--profile", dir_okay=False,
                                 help="default mode: a fitted profile (modelcut calibrate --out) for its accelerator"),
    budget: bool = typer.Option(False, "--budget", help="default mode: print each run's error budget"),
) -> None:
    """Check the systems model against the published runs: η fitted on one, the rest predicted.
    ``--mode default``: every run (deck and dev sets), the default model beside the seed."""
    if mode == "default":
        from .calibrate import validate_default
        validate_default(as_json=as_json, profile=profile, budget=budget)
        return
    if profile is not None or budget:
        fail("--profile and --budget apply to --mode default")
    val = _validation(mode)
    if as_json:
        print(json.dumps(val.as_dict()))
        return
    table = Table("Run", "Published", "Predicted", "Error", "Step (s)", "Compute", "TP", "CP", "P2P", "Bubble",
                  "DP", title=f"Published runs, TFLOP/s per GPU (mode {mode})")
    for r in val.rows:
        b = r.prediction.breakdown
        table.add_row(r.id, f"{r.published_tflops:g}", f"{r.predicted_tflops:.1f}",
                      "fitted" if r.fitted else f"{r.error_pct:+.1f} %", f"{r.step_time_s:.3f}",
                      *(f"{x:.3f}" for x in (b.compute_s, b.tp_s, b.cp_s, b.p2p_s, b.bubble_s, b.dp_s)))
    con = _console()
    con.print(table)
    con.print(f"η = {val.eta:.4f} (fitted on {val.calibration})")
    for fam, e in val.max_error_pct.items():
        con.print(f"largest error, {fam}: {e:.1f} %")
    con.print(f"mean absolute error over {sum(not r.fitted for r in val.rows)} predicted rows: "
              f"{val.mean_abs_error_pct:.1f} %")
    con.print(f"every prediction low: {'yes' if val.all_low else 'no'}")


@app.command()
def predict(
    runfile: Path = typer.Argument(..., help="a RUN.toml file", dir_okay=False),
    mode: str = typer.Option("seed", "--mode", help=_MODE_HELP),
    eta: float = typer.Option(None, "--eta", help="fraction of peak the matrix products reach (default: fitted)"),
    as_json: bool = typer.Option(False, "--json", help="print JSON: step_time_s, tflops_per_gpu, mfu, breakdown, …"),
    framework: str = typer.Option(None, "--framework", help="default mode: the training stack (a preset)"),
    overlap: str = typer.Option(None, "--overlap", help="default mode: overlap overrides, e.g. grad_reduce=off,tp_comm=on"),
    profile: Path = typer.Option(None, "--profile", dir_okay=False, help="default mode: a fitted profile file"),
    budget: bool = typer.Option(False, "--budget", help="default mode: print the error budget"),
) -> None:
    """Predict one run's step time, TFLOP/s per GPU, MFU and breakdown from a RUN.toml."""
    run = load_run(runfile)
    if mode == "default":
        from .calibrate import predict_default
        predict_default(run, eta=eta, as_json=as_json, framework=framework, overlap=overlap, profile=profile,
                        budget=budget)
        return
    if framework is not None or overlap is not None or profile is not None or budget:
        fail("--framework, --overlap, --profile and --budget apply to --mode default")
    pred = predict_run(run, catalog.hardware(run.gpu), mode, eta)
    if as_json:
        print(json.dumps(pred.as_dict()))
        return
    con = _console()
    L = run.layout
    con.print(f"[bold]{run.model.name}[/bold] on {L.gpus:,} × {run.gpu}  (t {L.tp}, cp {L.cp}, p {L.pp}, d {L.dp}; "
              f"{pred.schedule}, v = {pred.vpp}, m = {pred.microbatches}; mode {pred.mode}, η = {pred.eta:.4f})")
    con.print(f"step time        {pred.step_time_s:.4f} s")
    con.print(f"TFLOP/s per GPU  {pred.tflops_per_gpu:.1f}")
    con.print(f"MFU              {pred.mfu * 100:.1f} %")
    table = Table("Term", "Seconds", "Share")
    for k, x in pred.breakdown.as_dict().items():
        table.add_row(k.removesuffix("_s"), f"{x:.4f}", f"{x / pred.step_time_s * 100:.1f} %")
    con.print(table)
    for n in pred.notes:
        con.print(f"note: {n}")


@app.command()
def report(
    output: Path = typer.Option(Path("docs/results.md"), "--output", "-o", help="where to write the page"),
    mode: str = typer.Option("seed", "--mode", help=_MODE_HELP),
) -> None:
    """Write docs/results.md: the bubble table and the published-run table, regenerated from code."""
    if mode == "default":
        fail("report writes the seed mode's page; for the default model run modelcut validate --mode default")
    val = _validation(mode)
    text = report_face.render(val, bubble_table(), catalog.published_runs("deck"), ASSUMPTIONS.get(mode, []))
    output.parent.mkdir(parents=True, exist_ok=True)
    output.write_text(text, encoding="utf-8")
    print(f"wrote {output}")
