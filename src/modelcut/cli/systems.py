"""``modelcut validate``, ``modelcut predict`` and ``modelcut report``: the training-systems model."""

from __future__ import annotations

import json
from pathlib import Path

import typer
from rich.console import Console
from rich.table import Table

from .. import catalog
from ..core.overlap import DEFAULT_FRAMEWORK
from ..core.pipeline import bubble_table
from ..core.stepmodel import ASSUMPTIONS, MODES, predict as predict_run
from ..core.validate import validate as validate_runs
from ..faces import report as report_face
from ..faces.runfile import load_run_with_settings as load_runfile
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


#: Keys of a RUN.toml's optional [settings] table: how the run was run, beyond its shape
#: (the default mode's inputs; ``--framework`` and ``--overlap`` override them).
def _catalog_run(run_id: str, mode: str):
    """A published run of the catalog as ``validate`` runs it: the seed mode the run as
    runs.toml records it; the default mode with the settings of runs_dev.toml (framework,
    micro-batch, interleaving, recomputation)."""
    from ..catalog import profiles
    from ..core.calibrate import counted_flops
    ids = [r.id for r in catalog.published_runs()]
    if run_id not in ids:
        fail(f"no published run {run_id!r}; choose one of {', '.join(ids)}")
    pr = catalog.published_run(run_id)
    settings: dict = {}
    run = pr.run
    if mode == "default":
        st = profiles.run_settings().get(run_id)
        run = profiles.apply_settings(pr.run, st)
        if st is not None:
            settings["framework"] = st.framework
    return pr, run, settings, counted_flops(pr.run)


def _published(pr, counted: float, pred, run) -> dict:
    """The prediction against what the source published, counted as ``validate`` counts it: the
    FLOPs of the run as the source describes it over the predicted step time."""
    n = run.layout.gpus
    tflops = counted / (n * pred.step_time_s) / 1e12
    out = {"id": pr.id, "source": pr.source, "published_tflops": pr.published_tflops,
           "published_step_time_s": pr.published_step_time_s, "predicted_tflops_counted_as_published": tflops}
    if pr.published_step_time_s is not None:
        out["error_pct"] = (pr.published_step_time_s / pred.step_time_s - 1) * 100
    elif pr.published_tflops:
        out["error_pct"] = (tflops / pr.published_tflops - 1) * 100
    return out


def _memory(run, hw, pred, framework=None) -> dict:
    """``memory_report`` of the pipeline the prediction simulated, under the training stack it
    assumed (default mode); a layout memory cannot describe gives its one-line reason instead."""
    from ..core.errors import ModelcutError
    from ..core.memory import memory_report
    try:
        return memory_report(run, hw, prediction=pred, framework=framework)
    except ModelcutError as exc:
        return {"error": str(exc)}


@app.command()
def predict(
    runfile: Path = typer.Argument(None, help="a RUN.toml file (or --run ID)", dir_okay=False),
    run_id: str = typer.Option(None, "--run", help="a published run of the catalog (the ids validate prints), "
                                                   "predicted as validate predicts it"),
    mode: str = typer.Option("default", "--mode", help=_MODE_HELP + " (default: the default physics model; "
                             "seed: the deck's model)"),
    eta: float = typer.Option(None, "--eta", help="fraction of peak the matrix products reach (default: fitted)"),
    as_json: bool = typer.Option(False, "--json", help="print JSON: step_time_s, tflops_per_gpu, mfu, breakdown, "
                                                       "memory, …"),
    framework: str = typer.Option(None, "--framework", help="default mode: the training stack (a preset)"),
    overlap: str = typer.Option(None, "--overlap", help="default mode: overlap overrides, e.g. grad_reduce=off,tp_comm=on"),
    profile: Path = typer.Option(None, "--profile", dir_okay=False, help="default mode: a fitted profile file"),
    budget: bool = typer.Option(False, "--budget", help="default mode: print the error budget"),
) -> None:
    """Predict one run's step time, TFLOP/s per GPU, MFU, breakdown and memory per device from a RUN.toml
    (whose optional [settings] table may name the framework and overlap overrides), or a published run."""
    if (runfile is None) == (run_id is None):
        fail("give a RUN.toml file or --run with a published run's id (one of the two)")
    pr = counted = None
    if run_id is not None:
        pr, run, settings, counted = _catalog_run(run_id, mode)
    else:
        run, settings = load_runfile(runfile)
    hw = catalog.hardware(run.gpu)
    if mode == "default":
        from .calibrate import predict_default
        extra = {}

        def more(pred):
            extra["memory"] = _memory(run, hw, pred, framework or settings.get("framework") or DEFAULT_FRAMEWORK)
            if pr is not None:
                extra["published"] = _published(pr, counted, pred, run)
            return extra
        predict_default(run, eta=eta, as_json=as_json, framework=framework or settings.get("framework"),
                        overlap=overlap or settings.get("overlap"), profile=profile, budget=budget, extra=more)
        return
    if framework is not None or overlap is not None or profile is not None or budget:
        fail("--framework, --overlap, --profile and --budget apply to --mode default")
    pred = predict_run(run, hw, mode, eta)
    mem = _memory(run, hw, pred)
    pub = _published(pr, counted, pred, run) if pr is not None else None
    if as_json:
        d = pred.as_dict()
        d["memory"] = mem
        if pub is not None:
            d["published"] = pub
        print(json.dumps(d))
        return
    show_prediction(run, pred, f"mode {pred.mode}, η = {pred.eta:.4f}", extra_lines(mem, pub, hw))


def show_prediction(run, pred, label: str, lines: list[str]) -> None:
    """A prediction as text: header, step time, TFLOP/s, MFU, the breakdown table, notes, then ``lines``."""
    con = _console()
    L = run.layout
    con.print(f"[bold]{run.model.name}[/bold] on {L.gpus:,} × {run.gpu}  (t {L.tp}, cp {L.cp}, p {L.pp}, d {L.dp}; "
              f"{pred.schedule}, v = {pred.vpp}, m = {pred.microbatches}; {label})")
    con.print(f"step time        {pred.step_time_s:.4f} s")
    con.print(f"TFLOP/s per GPU  {pred.tflops_per_gpu:.1f}")
    con.print(f"MFU              {pred.mfu * 100:.1f} %")
    table = Table("Term", "Seconds", "Share")
    for k, x in pred.breakdown.as_dict().items():
        table.add_row(k.removesuffix("_s"), f"{x:.4f}", f"{x / pred.step_time_s * 100:.1f} %")
    con.print(table)
    for n in pred.notes:
        con.print(f"note: {n}")
    for line in lines:
        con.print(line)


def extra_lines(mem: dict, pub: dict | None, hw) -> list[str]:
    """The memory and published-run lines under a prediction's table."""
    out = []
    if "error" in mem:
        out.append(f"memory: {mem['error']}")
    else:
        worst = max(mem["stages"], key=lambda x: x["total_bytes"])
        out.append(f"peak memory      {mem['peak_bytes'] / 1e9:.1f} GB on pipeline rank {worst['stage']} "
                   f"({'fits' if mem.get('fits') else 'does not fit'} in {hw.mem_bytes / 1e9:.0f} GB)")
    if pub is not None:
        what = (f"{pub['published_tflops']:g} TFLOP/s per GPU" if pub["published_tflops"]
                else f"{pub['published_step_time_s']:g} s a step")
        out.append(f"published        {what} ({pub['source']}); predicted, counted as published: "
                   f"{pub['predicted_tflops_counted_as_published']:.1f} TFLOP/s"
                   + (f", {pub['error_pct']:+.1f} %" if "error_pct" in pub else ""))
    return out


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
