"""Text views the commands share: a prediction with its breakdown, memory and published figure."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from ..service.predict import PredictResult


def console(width: int = 150) -> Console:
    """A console at least ``width`` wide (tables stay whole when written to a file or a pipe)."""
    return Console(width=max(Console().width, width))


def extra_lines(result: PredictResult) -> list[str]:
    """The memory and published-run lines under a prediction's table."""
    mem, pub, hw = result.memory, result.published, result.hw
    out = []
    if "error" in mem:
        out.append(f"memory: {mem['error']}")
    else:
        worst = max(mem["stages"], key=lambda x: x["total_bytes"])
        out.append(f"peak memory      {mem['peak_bytes'] / 1e9:.1f} GB ({mem['peak_bytes'] / 2**30:.1f} GiB) on pipeline "
                   f"rank {worst['stage']} "
                   f"({'fits' if mem.get('fits') else 'does not fit'} in {hw.mem_bytes / 1e9:.1f} GB = "
                   f"{hw.mem_bytes / 2**30:.1f} GiB)")
    if pub is not None:
        if pub["published_tflops"]:
            what = f"{pub['published_tflops']:g} TFLOP/s per GPU"
        elif pub["published_step_time_s"]:
            what = f"{pub['published_step_time_s']:g} s a step"
        else:
            what = f"MFU {pub.get('published_mfu') or 0:.1%}"
        tf = pub["predicted_tflops_counted_as_published"]
        out.append(f"published        {what} ({pub['source']}); predicted, counted as published: "
                   + (f"{tf:.1f} TFLOP/s" if tf is not None else "not comparable")
                   + (f", {pub['error_pct']:+.1f} %" if "error_pct" in pub else ""))
    return out


def show_prediction(result: PredictResult) -> None:
    """A prediction as text: header, step time, TFLOP/s, MFU, the breakdown table, notes, memory,
    the published figure, the error budget."""
    run, pred = result.run, result.prediction
    con = console()
    L = run.layout
    label = f"mode {pred.mode}" + (f", η = {pred.eta:.4f}" if pred.mode == "seed" else "")
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
    for line in extra_lines(result):
        con.print(line)
    b = result.budget
    if b is not None:
        con.print(f"dominant term: {b.dominant.removesuffix('_s')} ({b.dominant_share * 100:.0f} % of the step)")
        for ln in b.lines:
            con.print(f"  {ln.input} {ln.alternative}: {ln.change_pct:+.1f} %")
