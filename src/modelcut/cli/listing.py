"""``modelcut list KIND``: what the catalog and the registry hold (models, hardware, frameworks,
schedules, published runs), as a table or JSON."""

from __future__ import annotations

import json
from typing import Any, Callable

import typer
from rich.table import Table

from ..service.catalog_info import KINDS, rows
from .app import app
from .views import console


def _num(x: float | None, digits: int = 1) -> str:
    return "-" if x is None else f"{x:,.{digits}f}"


def _names(row: dict) -> str:
    return ", ".join(row["aliases"][:3]) + (" …" if len(row["aliases"]) > 3 else "")


#: Each kind's table: (column, how a row gives its cell).
_COLUMNS: dict[str, list[tuple[str, Callable[[dict], Any]]]] = {
    "models": [("Name", lambda r: r["name"]), ("Also", _names),
               ("Params (B)", lambda r: _num(r["params_b"])),
               ("Active (B)", lambda r: _num(r["active_params_b"]) if r["experts"] > 1 else "-"),
               ("Layers", lambda r: r["layers"]), ("Hidden", lambda r: r["hidden"]),
               ("Heads / KV", lambda r: f"{r['heads']} / {r['kv_heads']}"
                + (f" (MLA, latent {r['kv_lora_rank']})" if r.get("kv_lora_rank") else "")),
               ("Experts", lambda r: f"{r['experts']} (top {r['top_k']})" if r["experts"] > 1 else "-"),
               ("Source", lambda r: r["source"])],
    "hardware": [("Name", lambda r: r["name"]), ("Also", _names),
                 ("16-bit TFLOP/s", lambda r: _num(r["peak_tflops_16"], 0)),
                 ("FP8 TFLOP/s", lambda r: _num(r["peak_tflops_8"], 0)),
                 ("Memory GiB", lambda r: _num(r["memory_gib"], 0)), ("HBM TB/s", lambda r: _num(r["memory_tb_s"], 2)),
                 ("Link GB/s", lambda r: _num(r["link_gb_s"], 0)), ("Net GB/s", lambda r: _num(r["net_gb_s"], 1)),
                 ("Per node", lambda r: r["per_node"]),
                 ("Power W", lambda r: "-" if r["power_w"] is None else f'{r["power_w"]:g}'),
                 ("Cap", lambda r: "@<W>w" if r["power_cap"] else "-"),
                 ("FP8 recipes", lambda r: ", ".join(r["fp8_recipes"]) or "-"),
                 ("Source", lambda r: r["source"])],
    "frameworks": [("Preset", lambda r: r["name"] + (" (default)" if r["default"] else "")),
                   ("Also", lambda r: ", ".join(r["aliases"]) or "-"), ("Attention", lambda r: r["attention"]),
                   ("ZeRO", lambda r: r["default_zero"]), ("Overlaps", lambda r: ", ".join(r["overlaps"]) or "-"),
                   ("Selective", lambda r: r["selective"]), ("torch.compile", lambda r: "yes" if r["compiled"] else "no"),
                   ("Context parallel", lambda r: f"{r['cp_impl']}, {r['cp_kind']}"), ("NCCL", lambda r: r["nccl"]),
                   ("FP8", lambda r: f"{r['fp8_library']}: {', '.join(r['fp8_recipes'])}"
                    + (", FP8 weights gathered" if r["fp8_param_gather"] else "") if r['fp8_recipes'] else "-"),
                   ("Grads reduced", lambda r: r["grad_reduce"]),
                   ("Source", lambda r: r["source"])],
    "schedules": [("Schedule", lambda r: r["name"]), ("Chunks", lambda r: r["default_chunks"]),
                  ("Fixed", lambda r: "yes" if r["chunks_fixed"] else "no"),
                  ("Split backward", lambda r: "yes" if r["split_backward"] else "no"),
                  ("Explored", lambda r: "yes" if r["explored_by_default"] else "on request"),
                  ("Summary", lambda r: r["doc"])],
    "runs": [("Run", lambda r: r["id"]), ("Source", lambda r: r["group"]), ("Stack", lambda r: r["framework"] or "-"),
             ("Model", lambda r: r["model"]), ("GPUs", lambda r: f"{r['gpus']} × {r['gpu']}"),
             ("t·c·p·d·e", lambda r: f"{r['tp']}·{r['cp']}·{r['pp']}·{r['dp']}·{r['ep']}"),
             ("Seq", lambda r: r["seq_len"]), ("Batch", lambda r: r["global_batch"]),
             ("Precision", lambda r: r["precision"]),
             ("Published", lambda r: f"{r['published_step_time_s']:g} s" if r["published_step_time_s"]
              else f"{r['published_tflops']:g} TFLOP/s" if r["published_tflops"] else "-"),
             ("Validated", lambda r: "yes" if r["in_validation"] else "no")],
}


@app.command("list", help="List what the catalog and the schedule registry hold: "
                          + "; ".join(f"{k}: {v}" for k, v in KINDS.items()) + ".")
def list_cmd(
    kind: str = typer.Argument(None, metavar="KIND", help="one of " + ", ".join(KINDS) + " (none: what each lists)",
                               show_default=False),
    as_json: bool = typer.Option(False, "--json", help="print JSON (every field, sources whole)"),
) -> None:
    if kind is None:
        for k, what in KINDS.items():
            typer.echo(f"modelcut list {k:<11} {what}")
        return
    entries = rows(kind)
    if as_json:
        typer.echo(json.dumps(entries, indent=1))
        return
    table = Table(title=f"{len(entries)} {kind}: {KINDS[kind]}")
    for col, _ in _COLUMNS[kind]:
        table.add_column(col, overflow="fold")
    for r in entries:
        table.add_row(*(str(cell(r)) for _, cell in _COLUMNS[kind]))
    console(200).print(table)
