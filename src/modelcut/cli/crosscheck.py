"""``modelcut crosscheck``: modelcut's schedules and timing against PyTorch's pipeline runtime.

Needs the extra ``modelcut[torch]``; torch is imported only when the command runs.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.table import Table

from ..analysis.torchcheck.report import crosscheck as run_check
from ..core.errors import ModelcutError
from ..export.chrome_trace import to_trace_multi
from ..service.requests import CrosscheckInput
from .app import app
from .common import check_writable, limits, parse, progress, write_file


def _ms(x: float | None) -> str:
    return "—" if x is None else f"{1e3 * x:.1f} ms"


def _pct(x: float | None) -> str:
    return "—" if x is None else f"{x:+.1f} %"


def _num(x: float | None) -> str:
    return "—" if x is None else f"{x:.3f}"


@app.command()
def crosscheck(
    schedule: str = typer.Option(
        "1f1b", "--schedule", "-s",
        help="gpipe, 1f1b, interleaved, looped-bfs, zbv, or a torch class (ScheduleDualPipeV, "
             "ScheduleInterleavedZeroBubble, ...); several, comma-separated"),
    devices: int = typer.Option(4, "--devices", "-p", help="pipeline ranks p (one process each)"),
    microbatches: int = typer.Option(8, "--microbatches", "-m", help="micro-batches m"),
    chunks: Optional[int] = typer.Option(None, "--chunks", "-v",
                                         help="stages per rank v for multi-stage schedules (default 2)"),
    forward_ms: float = typer.Option(20.0, "--forward-ms", help="time of one forward action (one micro-batch, one stage)"),
    backward_ms: float = typer.Option(40.0, "--backward-ms", help="time of one full backward action"),
    weight_ms: Optional[float] = typer.Option(None, "--weight-ms",
                                              help="weight-gradient share of the backward (split schedules; default half)"),
    steps: int = typer.Option(3, "--steps", help="measured steps, after one discarded warm-up step"),
    fit_on: Optional[str] = typer.Option(None, "--fit-on",
                                         help="schedule whose run fits overhead and p2p latency (default gpipe, or 1f1b)"),
    timeout: float = typer.Option(300.0, "--timeout", help="seconds before a hung run is stopped"),
    order_only: bool = typer.Option(False, "--order-only", help="compare orders only; launch no process"),
    as_json: bool = typer.Option(False, "--json", help="print the documented JSON object"),
    trace: Optional[Path] = typer.Option(None, "--trace", help="write measured and simulated timelines as one Chrome trace"),
) -> None:
    """Check schedules and timing against torch.distributed.pipelining: orders, then real runs."""

    names = list(dict.fromkeys(n.strip() for n in schedule.split(",") if n.strip()))
    if not names:
        raise ModelcutError("--schedule names no schedule")
    if trace is not None and order_only:
        raise ModelcutError("--trace needs a real run; drop --order-only")
    inp = parse(CrosscheckInput, {"schedules": names, "devices": devices, "microbatches": microbatches,
                                  "chunks": chunks, "forward_ms": forward_ms, "backward_ms": backward_ms,
                                  "weight_ms": weight_ms, "steps": steps, "fit_on": fit_on, "timeout": timeout,
                                  "order_only": order_only}, limits(),
                {k: "--" + k.replace("_", "-") for k in ("devices", "microbatches", "chunks", "forward_ms",
                                                          "backward_ms", "weight_ms", "steps", "fit_on", "timeout")}
                | {"schedules": "--schedule"})
    if inp.weight_ms is not None and inp.weight_ms > inp.backward_ms:
        raise ModelcutError(f"--weight-ms {inp.weight_ms:g} is more than the backward it is part of "
                            f"(--backward-ms {inp.backward_ms:g})")
    if trace is not None:
        check_writable(trace)
    with progress("crosscheck: " + ("reading torch's orders" if order_only else "running the pipelines"),
                  enabled=not as_json and not order_only) as update:
        update(0)
        entries = run_check(inp.schedules, inp.devices, inp.microbatches, inp.chunks, forward_s=inp.forward_ms / 1e3,
                            backward_s=inp.backward_ms / 1e3,
                            weight_s=None if inp.weight_ms is None else inp.weight_ms / 1e3,
                            steps=inp.steps, fit_on=inp.fit_on, timeout_s=inp.timeout, order_only=inp.order_only)
    dicts = [e.as_dict() for e in entries]
    if trace is not None:
        write_file(trace, json.dumps(to_trace_multi([tl for e in entries for tl in e.timelines()],
                                                   metadata={"crosscheck": dicts})))
    if as_json:
        print(json.dumps(dicts[0] if len(dicts) == 1 else {"runs": dicts}))
        return
    con = Console()
    for d in dicts:
        con.print(f"[bold]{d['schedule']}[/bold] (torch {d['torch_class']})  p = {d['devices']}, "
                  f"m = {d['microbatches']}, v = {d['chunks']}")
        if d["order_matches"] is None:
            con.print("  order               torch only: simulated from the order torch executes")
        elif d["order_matches"]:
            con.print("  order               equal to what torch executes")
        else:
            con.print(f"  order               differs: {d['first_difference']}")
        if d["note"]:
            con.print(f"  note: {d['note']}", markup=False)
        if d["declared_difference"]:
            con.print(f"  torch's declared pipeline_order departs from what it executes: {d['declared_difference']}")
        if d["measured_makespan_s"] is None:
            continue
        if not d["executed_as_predicted"]:
            con.print("  [red]the real run executed another order than the one read without a cluster[/red]")
        table = Table("", "Simulated", "Measured", "Error", "Simulated, fitted", "Error, fitted")
        table.add_row("makespan", _ms(d["simulated_makespan_s"]), _ms(d["measured_makespan_s"]),
                      _pct(d["error_pct"]), _ms(d["simulated_makespan_fitted_s"]),
                      _pct(d["error_with_fitted_pct"]))
        table.add_row("bubble", _num(d["simulated_bubble"]), _num(d["measured_bubble"]), "", "", "")
        con.print(table)
        if d["fitted_on"] is not None:
            note = " (in sample)" if d["fitted_in_sample"] else ""
            con.print(f"  fitted on {d['fitted_on']}'s run{note}: overhead {_ms(d['fitted_overhead_s'])} per action, "
                      f"p2p {_ms(d['fitted_p2p_s'])}")
