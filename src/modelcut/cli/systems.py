"""``modelcut validate``, ``modelcut predict`` and ``modelcut report``: the training-systems model."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer
from rich.table import Table

from ..core.step import MODES
from ..core.step.seed import ASSUMPTIONS
from ..export import report as report_page
from ..service import predict as service
from ..service import simulate as simulation
from ..service import validation
from ..service.runfile import load_run_with_settings
from ..service import inputs
from ..service.requests import PredictOptions
from .app import app, fail
from .calibrate import NO_FLAGS, show_default_table, show_user_table, write_text
from .common import check_writable, limit_option, limits, parse, progress, write_trace
from .views import console, show_prediction, show_precisions

_MODE_HELP = f"model mode: {', '.join(MODES)}"


@app.command()
def validate(
    mode: str = typer.Option("seed", "--mode", help=_MODE_HELP),
    as_json: bool = typer.Option(False, "--json", help="print the documented JSON object"),
    profile: Path = typer.Option(None, "--profile", dir_okay=False,
                                 help="default mode: a fitted profile (modelcut calibrate --out) for its accelerator"),
    budget: bool = typer.Option(False, "--budget", help="default mode: print each run's error budget"),
    kernels: bool = typer.Option(False, "--kernels", help="check the measured kernel tables against published "
                                                          "kernel benchmarks, and layer times against published "
                                                          "layer measurements, instead"),
    runs: Path = typer.Option(None, "--runs", dir_okay=False,
                              help="default mode: your measured runs as CSV (the columns modelcut calibrate --help "
                                   "lists), predicted with the shipped constants (or --profile's), nothing fitted "
                                   "to them, instead of the published runs"),
    keep_going: bool = typer.Option(False, "--keep-going",
                                    help="with --runs: leave out the rows modelcut cannot predict, each listed "
                                         "with its one-line reason, and predict the rest (default: the first "
                                         "such row stops it)"),
) -> None:
    """Check the systems model against the published runs: η fitted on one, the rest predicted.
    ``--mode default``: every run (deck and dev sets), the default model beside the seed.
    ``--kernels``: the kernel tables against published kernel benchmarks."""
    if keep_going and runs is None:
        fail("--keep-going applies to --runs")
    if kernels:
        if profile is not None or budget or mode != "seed" or runs is not None:
            fail("--kernels takes no --mode, --profile, --budget or --runs")
        out = validation.kernel_rows()
        if as_json:
            print(json.dumps(out))
            return
        table = Table("Benchmark", "Device", "Kind", "Published (ms)", "modelcut (ms)", "Error",
                      "Speed-up over bf16", "modelcut", "Error",
                      title="Kernel benchmarks: one layer's linear-layer products, milliseconds")
        for r in out["rows"]:
            sp = r["speedup_error_pct"]
            table.add_row(r["check"], r["device"], r["kind"], f"{r['measured_ms']:.3f}", f"{r['predicted_ms']:.3f}",
                          f"{r['error_pct']:+.1f} %",
                          *((f"{r['measured_speedup']:.3f}", f"{r['predicted_speedup']:.3f}", f"{sp:+.1f} %")
                            if sp is not None else ("-", "-", "-")))
        con = console()
        con.print(table)
        for cid, src in out["sources"].items():
            con.print(f"{cid}: {src['source']}")
        layers = Table("Measurement", "Device", "Recompute", "SP", "Forward (ms)", "modelcut", "Error",
                       "Backward (ms)", "modelcut", "Error",
                       title="Layer measurements: one layer's forward and backward (recomputation included) "
                             "in a step, the default profile's constants")
        for r in out["layers"]:
            layers.add_row(r["check"], r["device"], r["recompute"], "on" if r["sequence_parallel"] else "off",
                           f"{r['measured_fwd_ms']:.2f}", f"{r['predicted_fwd_ms']:.2f}", f"{r['fwd_error_pct']:+.1f} %",
                           f"{r['measured_bwd_ms']:.2f}", f"{r['predicted_bwd_ms']:.2f}", f"{r['bwd_error_pct']:+.1f} %")
        con.print(layers)
        for r in out["layers"]:
            p = r["fwd_parts_ms"]
            con.print(f"{r['check']} {r['recompute']}/{'SP' if r['sequence_parallel'] else 'no SP'} forward: "
                      f"products {p['products']:.2f} ms ({r['fwd_products_tflops']:.0f} TFLOP/s), attention "
                      f"{p['attention']:.2f}, memory-bound {p['memory']:.2f}, communication {p['communication']:.2f}")
        for cid, src in out["layer_sources"].items():
            con.print(f"{cid} (run {src['run']}): {src['source']}")
        sweeps = Table("Sweep", "Device", "Type", "Shapes", "Median", "10th-90th", "Time-weighted", "Furthest off",
                       "FP8 speed-up", "modelcut",
                       title="Product sweeps by shape: modelcut's burst time over the measured (1 = agree)")
        for r in out["sweeps"]:
            m, n, k = r["worst_shape"]
            sp = r["measured_speedup"]
            sweeps.add_row(r["check"], r["device"], r["dtype"], str(r["shapes"]), f"{r['median_ratio']:.3f}",
                           f"{r['p10_ratio']:.3f}-{r['p90_ratio']:.3f}", f"{r['time_ratio']:.3f}",
                           f"{r['worst_ratio']:.2f} at {m}x{n}x{k}",
                           *((f"{sp:.2f}", f"{r['predicted_speedup']:.2f}") if sp is not None else ("-", "-")))
        con.print(sweeps)
        for cid, src in out["sweep_sources"].items():
            con.print(f"{cid}: {src['source']}")
        att = Table("Sweep", "Device", "Kernel measured", "Table", "Points", "Forward: median", "range",
                    "Backward: median", "range", "Furthest off",
                    title="Attention kernels by sequence length: the table's burst time over the measured (1 = agree)")

        def far(f: dict) -> str:
            return f"{f['ratio']:.2f} at {f['seq_len']}{' causal' if f['causal'] else ''}"
        for r in out["attention"]:
            att.add_row(r["check"], r["device"], r["kernel"], r["impl"], str(len(r["points"])),
                        f"{r['fwd_median_ratio']:.3f}", f"{r['fwd_min_ratio']:.3f}-{r['fwd_max_ratio']:.3f}",
                        f"{r['bwd_median_ratio']:.3f}", f"{r['bwd_min_ratio']:.3f}-{r['bwd_max_ratio']:.3f}",
                        f"fwd {far(r['fwd_furthest'])}, bwd {far(r['bwd_furthest'])}")
        con.print(att)
        for cid, src in out["attention_sources"].items():
            con.print(f"{cid}: {src['source']}" + (f" Device: {src['device_source']}" if src["device_source"] else ""))
        norms = Table("Sweep", "Device", "Kernel measured", "η_mem", "Shapes", "Forward: median", "range",
                      "Backward: median", "range",
                      title="Fused norms by shape: modelcut's memory-bound time over the measured (1 = agree)")
        for r in out["norms"]:
            norms.add_row(r["check"], r["device"], r["kernel"], f"{r['eta_mem']:.4f}", str(len(r["points"])),
                          f"{r['fwd_median_ratio']:.3f}", f"{r['fwd_min_ratio']:.3f}-{r['fwd_max_ratio']:.3f}",
                          f"{r['bwd_median_ratio']:.3f}", f"{r['bwd_min_ratio']:.3f}-{r['bwd_max_ratio']:.3f}")
        con.print(norms)
        for cid, src in out["norm_sources"].items():
            con.print(f"{cid}: {src['source']}")
        return
    if runs is not None:
        if mode not in ("seed", "default") or budget:
            fail("--runs predicts with the default model (--mode default) and takes no --budget")
        with progress("predicting your runs", enabled=not as_json) as upd:
            upd(0)
            out = validation.user_table(runs, service.load_profile(profile), NO_FLAGS, keep_going)
        if as_json:
            print(json.dumps(out))
        else:
            show_user_table(out)
        return
    if mode == "default":
        prof = service.load_profile(profile)
        with progress("predicting every published run" + (" and its error budget" if budget else ""),
                      enabled=not as_json) as upd:
            upd(0)
            table = validation.default_table(prof, budget)
        if as_json:
            print(json.dumps(table.as_dict()))
        else:
            show_default_table(table)
        return
    if mode not in MODES:
        fail(f"unknown mode {mode!r}; choose one of {', '.join(MODES)}")
    if profile is not None or budget:
        fail("--profile and --budget apply to --mode default")
    val = validation.seed_table()
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
    con = console()
    con.print(table)
    con.print(f"η = {val.eta:.4f} (fitted on {val.calibration})")
    for fam, e in val.max_error_pct.items():
        con.print(f"largest error, {fam}: {e:.1f} %")
    con.print(f"mean absolute error over {sum(not r.fitted for r in val.rows)} predicted rows: "
              f"{val.mean_abs_error_pct:.1f} %")
    con.print(f"every prediction low: {'yes' if val.all_low else 'no'}")


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
    framework: str = typer.Option(None, "--framework", help="default mode: the training stack (a preset, or another "
                                                                "name for one: torchtitan, megatron-lm, mcore, …)"),
    overlap: str = typer.Option(None, "--overlap", help="default mode: overlap overrides, e.g. grad_reduce=off,tp_comm=on "
                                                            "(or the stacks' names: --tp-comm-overlap, async_tp, "
                                                            "backward_prefetch=BACKWARD_PRE, …; a stack's setting "
                                                            "modelcut does not model, such as "
                                                            "--defer-embedding-wgrad-compute, is taken and named "
                                                            "in the notes)"),
    profile: Path = typer.Option(None, "--profile", dir_okay=False, help="default mode: a fitted profile file"),
    budget: bool = typer.Option(False, "--budget", help="default mode: print the error budget"),
    layers: bool = typer.Option(False, "--layers", help="default mode: one micro-batch on the busiest device, unit by "
                                                        "unit and kernel by kernel: each product's shape and "
                                                        "TFLOP/s, the attention core, the memory-bound bytes, the "
                                                        "exposed communication"),
    precision: str = typer.Option(None, "--precision", help="the products' precision: bf16, fp16 or fp8 "
                                                            "(default: the run's [training] precision, bf16); "
                                                            "several, e.g. bf16,fp8: the run at each, side by side"),
    fp8_recipe: str = typer.Option(None, "--fp8-recipe", help="with fp8: delayed, current, blockwise, mxfp8, (torchao) rowwise or rowwise_with_gw_hp "
                                                              "(default: the stack's, else Transformer Engine's)"),
    grad_reduce: str = typer.Option(None, "--grad-reduce", help="the type gradients are reduced in across data "
                                                                "parallelism: fp32 or the 16-bit type (float32, bfloat16 "
                                                                "too; default: the run's [training] grad_reduce, else "
                                                                "the stack's)"),
    attention: str = typer.Option(None, "--attention", help="the attention kernel: unfused, flash2, flash3, cudnn "
                                                            "or flash4 (default: the run's [training] attention, else "
                                                            "the stack's)"),
    fp8_param_gather: Optional[bool] = typer.Option(None, "--fp8-param-gather/--no-fp8-param-gather",
                                                    help="with fp8: the linear weights kept and gathered in FP8 "
                                                         "(default: the run's, else the stack's)"),
    trace: Optional[Path] = typer.Option(None, "--trace", dir_okay=False,
                                         help="default mode: write the predicted step as a Chrome trace-event "
                                              "JSON (Perfetto): each device's ops, exposed communication, "
                                              "optimizer"),
    max_ops: Optional[int] = limit_option("max_ops"),
    max_gpus: Optional[int] = limit_option("max_gpus"),
    max_seq: Optional[int] = limit_option("max_seq"),
    max_tokens: Optional[int] = limit_option("max_tokens"),
    max_layers: Optional[int] = limit_option("max_layers"),
    max_width: Optional[int] = limit_option("max_width"),
) -> None:
    """Predict one run's step time, TFLOP/s per GPU, MFU, breakdown and memory per device from a RUN.toml
    (whose optional [settings] table may name the framework and overlap overrides), or a published run."""
    if trace is not None:
        check_writable(trace)
    lim = limits(max_ops=max_ops, max_gpus=max_gpus, max_seq=max_seq, max_tokens=max_tokens, max_layers=max_layers,
                 max_width=max_width)
    if (runfile is None) == (run_id is None):
        fail("give a RUN.toml file or --run with a published run's id (one of the two)")
    pr = None
    if run_id is not None:
        pr, run, settings = service.catalog_run(run_id, mode)
    else:
        run, settings = load_run_with_settings(runfile, lim)
    if mode == "default":
        framework = framework or settings.get("framework")
        overlap = overlap or settings.get("overlap")
    opts = parse(PredictOptions, {"mode": mode, "eta": eta, "framework": framework.lower() if framework else None,
                                  "overlap": inputs.parse_overlap(overlap) if overlap else None}, lim,
                 {"mode": "--mode", "eta": "--eta", "framework": "--framework", "overlap": "--overlap"})
    if precision is not None and "," in precision:      # the run at each precision, side by side
        if budget or trace is not None:
            fail(f"{'--budget' if budget else '--trace'} takes one precision; give --precision bf16 or fp8 alone")
        results = service.predict_each_precision(service.PredictRequest(
            run, mode=opts.mode, eta=opts.eta, framework=opts.framework,
            overlap=opts.overlap.model_dump(exclude_none=True) if opts.overlap is not None else None,
            profile=service.load_profile(profile), published=pr, fp8_recipe=fp8_recipe, layers=layers,
            grad_reduce=grad_reduce, attention=attention, fp8_param_gather=fp8_param_gather),
            service.precision_list(precision), lim)
        if as_json:
            print(json.dumps(results.as_dict()))
            return
        show_precisions(results.results)
        return
    with progress("predicting" + (" and its error budget" if budget else ""), enabled=budget and not as_json) as upd:
        upd(0)
        result = service.predict(service.PredictRequest(
            run, mode=opts.mode, eta=opts.eta, framework=opts.framework,
            overlap=opts.overlap.model_dump(exclude_none=True) if opts.overlap is not None else None,
            profile=service.load_profile(profile), budget=budget, published=pr, precision=precision,
            fp8_recipe=fp8_recipe, timeline=trace is not None, layers=layers, grad_reduce=grad_reduce,
            attention=attention, fp8_param_gather=fp8_param_gather), lim)
    if trace is not None:
        from ..export import chrome_trace
        write_trace(trace, chrome_trace.step_trace(result.prediction.timeline, result.trace_label(),
                                                   result.trace_metadata()))
    if as_json:
        print(json.dumps(result.as_dict()))
        return
    show_prediction(result)


@app.command()
def report(
    output: Path = typer.Option(Path("docs/results.md"), "--output", "-o", help="where to write the page"),
    mode: str = typer.Option("seed", "--mode", help=_MODE_HELP),
) -> None:
    """Write docs/results.md: the bubble table and the published-run table, regenerated from code."""
    if mode == "default":
        fail("report writes the seed mode's page; for the default model run modelcut validate --mode default")
    if mode not in MODES:
        fail(f"unknown mode {mode!r}; choose one of {', '.join(MODES)}")
    check_writable(output)
    text = report_page.render(validation.seed_table(), simulation.bubble_table(), validation.deck_runs(), ASSUMPTIONS)
    write_text(output, text)
    print(f"wrote {output}")
