"""``modelcut simulate`` and ``modelcut bubble-table``."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.table import Table

from ..core.sim import registry
from ..core.sim.actions import to_csv
from ..export import pipeline_json, timeline_text
from ..service import catalog_info
from ..service import simulate as simulation
from ..service.limits import DEFAULT
from ..service.requests import SimulateArgs
from .app import app
from .common import check_writable, limit_option, limits, parse, progress, write_file

FLAGS = {"schedule": "--schedule", "devices": "--devices", "microbatches": "--microbatches", "chunks": "--chunks",
         "forward": "--forward", "backward": "--backward", "weight": "--weight", "p2p": "--p2p"}


def _fmt(x) -> str:
    return "—" if x is None else f"{float(x):.4f}"


def _split_names() -> str:
    return ", ".join(n for n, spec in registry.SCHEDULES.items() if spec.split_backward)


@app.command(help=f"""Simulate a pipeline schedule: makespan, bubble against its closed form, peak
    activations.

    Schedules: {", ".join(registry.names())}, or torch:<Class> (modelcut[torch]: the order
    torch.distributed.pipelining executes, e.g. torch:ScheduleInterleavedZeroBubble).

    Times are for a device's whole share of layers (F = 1, B = 2 by default); with v
    chunks each chunk's ops take 1/v of them. Schedules that split the backward
    ({_split_names()}) run B as the input gradient and W as the weight gradient, half of
    --backward each unless --weight is given; the others add --weight to B.

    At most {DEFAULT.max_ops:,} ops per simulation unless --max-ops raises it.""")
def simulate(
    schedule: str = typer.Option("1f1b", "--schedule", "-s", help=catalog_info.schedule_help()),
    devices: int = typer.Option(4, "--devices", "-p", help="pipeline devices p"),
    microbatches: int = typer.Option(8, "--microbatches", "-m", help="micro-batches m"),
    chunks: Optional[int] = typer.Option(None, "--chunks", "-v", help="chunks per device v (schedule's default)"),
    forward: float = typer.Option(1.0, "--forward", help="forward time for a device's whole share of layers"),
    backward: float = typer.Option(2.0, "--backward", help="backward time (B; with --weight, the input gradient only)"),
    weight: Optional[float] = typer.Option(None, "--weight", help="weight-gradient time W (split schedules; "
                                                                  "added to B otherwise)"),
    p2p: float = typer.Option(0.0, "--p2p", help="point-to-point time added to each cross-device input"),
    as_json: bool = typer.Option(False, "--json", help="print the documented JSON object"),
    trace: Optional[Path] = typer.Option(None, "--trace", help="write a Chrome trace-event JSON (Perfetto)"),
    plot: Optional[Path] = typer.Option(None, "--plot", help="write a Gantt chart (.png or .svg)"),
    html: Optional[Path] = typer.Option(None, "--html", help="write a self-contained animated HTML timeline"),
    schedule_csv: Optional[Path] = typer.Option(None, "--schedule-csv", help="simulate a custom schedule (action CSV)"),
    export_csv: Optional[Path] = typer.Option(None, "--export-csv", help="write the schedule as an action CSV"),
    max_ops: Optional[int] = limit_option("max_ops"),
    max_time: Optional[float] = limit_option("max_time"),
) -> None:
    lim = limits(max_ops=max_ops, max_time=max_time)
    inp = parse(SimulateArgs, {"schedule": schedule, "devices": devices, "microbatches": microbatches,
                               "chunks": chunks, "forward": forward, "backward": backward, "weight": weight,
                               "p2p": p2p}, lim, FLAGS)
    for path in (trace, plot, html, export_csv):
        if path is not None:
            check_writable(path)
    if plot is not None:
        from ..export import gantt
        gantt.check_path(plot)
    sched = simulation.csv_file(schedule_csv, lim) if schedule_csv is not None else None
    with progress(f"simulating {inp.schedule if sched is None else sched.name}",
                  enabled=(sched.num_ops if sched else simulation.op_estimate(inp)) > 200_000) as update:
        update(0)
        sim = simulation.simulate_input(inp, lim, schedule=sched)
    result, sched = sim.result, sim.result.schedule
    if export_csv is not None:
        write_file(export_csv, to_csv(sched))
    if trace is not None:
        from ..export import chrome_trace
        write_file(trace, json.dumps(chrome_trace.to_trace(result)))
    if plot is not None:
        gantt.save(result, plot)
    if html is not None:
        from ..export import html_export
        write_file(html, html_export.render(result))
    if as_json:
        pipeline_json.write(result, sys.stdout, sim.notes)
        sys.stdout.write("\n")
        return
    m = result.metrics
    con = Console(highlight=False)
    con.print(f"[bold]{sched.name}[/bold]  p = {sched.devices}, m = {sched.microbatches}, v = {sched.chunks}"
              f"{'  (backward split into B and W)' if sched.split_backward else ''}")
    con.print(f"makespan             {float(m.makespan):g}")
    con.print(f"bubble (simulated)   {_fmt(m.bubble)}")
    con.print(f"bubble (closed form) {_fmt(result.closed_form_bubble)}")
    con.print("peak activations     " + ", ".join(f"d{d}: {float(x):g}" for d, x in enumerate(m.peak_activations)))
    for note in sim.notes:
        con.print(f"note: {note}", soft_wrap=True, markup=False)
    # Fit the terminal; written to a file or a pipe, allow at least 100 characters.
    width = con.width if con.is_terminal else max(con.width, 100)
    text = timeline_text.render(result.trace, max_width=width)
    if text is None:
        con.print("(timeline too wide for the terminal: use --plot, --trace or --html)")
    else:
        con.print(text, end="", soft_wrap=True)
        con.print(timeline_text.legend(result.trace), style="dim", soft_wrap=True)


@app.command("bubble-table")
def bubble_table_cmd(as_json: bool = typer.Option(False, "--json", help="print JSON")) -> None:
    """The deck's bubble table: each row simulated in exact arithmetic beside its closed form."""
    rows = simulation.bubble_table()
    largest = max(abs(sim - cf) for *_, sim, cf in rows)
    if as_json:
        print(json.dumps({
            "rows": [{"schedule": n, "devices": p, "microbatches": m, "chunks": v,
                      "simulated_bubble": float(sim), "closed_form_bubble": float(cf)}
                     for n, p, m, v, sim, cf in rows],
            "largest_difference": float(largest)}))
        return
    table = Table("Schedule", "Devices p", "Micro-batches m", "Chunks v", "Simulated bubble", "Closed form")
    for n, p, m, v, sim, cf in rows:
        table.add_row(n, str(p), str(m), str(v), _fmt(sim), _fmt(cf))
    con = Console()
    if not con.is_terminal:  # written to a file or a pipe: room for the whole table
        con = Console(width=max(con.width, 100))
    con.print(table)
    con.print(f"Largest difference between simulation and formula: {float(largest)}")
