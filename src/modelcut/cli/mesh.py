"""``modelcut mesh``: rank ↔ coordinates, a rank's peers in each group, which groups leave a node."""

from __future__ import annotations

import json
from typing import Optional

import typer
from rich.console import Console
from rich.table import Table

from ..service.mesh import mesh_input, mesh_order
from ..service.requests import MeshInput
from .app import app
from .common import limit_option, limits, parse


def _ranks_text(ranks: list[int], limit: int = 8) -> str:
    """A rank list, arithmetic runs shortened: 0, 8, 16, …, 120 (16 ranks)."""
    if len(ranks) <= limit:
        return ", ".join(map(str, ranks))
    steps = {b - a for a, b in zip(ranks, ranks[1:])}
    if len(steps) == 1:
        return f"{ranks[0]}, {ranks[1]}, {ranks[2]}, …, {ranks[-1]} (step {steps.pop()}, {len(ranks)} ranks)"
    return ", ".join(map(str, ranks[:limit - 1])) + f", …, {ranks[-1]} ({len(ranks)} ranks)"


@app.command()
def mesh(
    tp: int = typer.Option(1, "--tp", help="tensor-parallel size"),
    cp: int = typer.Option(1, "--cp", help="context-parallel size"),
    pp: int = typer.Option(1, "--pp", help="pipeline-parallel size"),
    dp: int = typer.Option(1, "--dp", help="data-parallel size"),
    ep: int = typer.Option(1, "--ep", help="expert-parallel size (with the default order laid as Megatron-core's "
                                           "expert grid over each stage's tp·cp·dp ranks)"),
    etp: Optional[int] = typer.Option(None, "--etp", help="expert tensor-parallel size (default tp)"),
    gpus_per_node: int = typer.Option(8, "--gpus-per-node", help="accelerators per node"),
    rank: int = typer.Option(0, "--rank", "-r", help="the rank whose groups to show"),
    order: Optional[str] = typer.Option(
        None, "--order", help="rank order, innermost first, e.g. tp,cp,pp,dp or tp-cp-ep-dp-pp; may place ep "
                              "(default: Megatron-core's tp,cp,ep,dp,pp)"),
    dp_shard: Optional[int] = typer.Option(None, "--dp-shard", help="hybrid sharding: the data-parallel ranks a ZeRO "
                                           "shard group spans (dividing dp); shows its shard and replica groups"),
    cp_a2a: Optional[int] = typer.Option(None, "--cp-a2a", help="hierarchical context parallelism (a2a+p2p): the "
                                         "all-to-all groups' size, adjacent cp ranks (Megatron-LM's "
                                         "--hierarchical-context-parallel-sizes A cp/A); shows its all-to-all and "
                                         "ring groups"),
    as_json: bool = typer.Option(False, "--json", help="print JSON"),
    max_gpus: Optional[int] = limit_option("max_gpus"),
) -> None:
    """A rank's coordinates, its peers in each parallel group, and whether each group crosses nodes."""
    lim = limits(max_gpus=max_gpus)
    inp = parse(MeshInput, {"tp": tp, "cp": cp, "pp": pp, "dp": dp, "ep": ep, "etp": etp,
                            "gpus_per_node": gpus_per_node, "rank": rank, "order": mesh_order(order),
                            "dp_shard": dp_shard, "cp_a2a": cp_a2a}, lim,
                {k: f"--{k.replace('_', '-')}" for k in ("tp", "cp", "pp", "dp", "ep", "etp", "gpus_per_node", "rank",
                                                         "order", "dp_shard", "cp_a2a")})
    m, out = mesh_input(inp, lim)
    if as_json:
        print(json.dumps(out))
        return
    coords, node, groups, inside = out["coords"], out["node"], out["groups"], out["dims"]
    con = Console()
    grid = out.get("experts")
    if grid is not None and grid["grid"] == "dp":
        sizes = " × ".join(f"{n} {s}" for n, s in m.atoms)
        how = f"; dp {dp} = ep {ep} × edp {dp // ep}"
    else:
        sizes = " × ".join(f"{n} {m.size(n)}" for n in m.order if n != "ep")
        how = (f"; experts: etp {grid['etp']} × ep {grid['ep']} × edp {grid['edp']} over each stage's "
               f"tp·cp·dp = {tp * cp * dp:,} ranks (Megatron-core's expert grid)" if grid is not None else "")
    con.print(f"[bold]mesh[/bold] {sizes} = {m.world:,} ranks, order {','.join(m.order)} (innermost first)"
              f"{how}; {gpus_per_node} per node → {-(-m.world // gpus_per_node):,} nodes")
    con.print(f"rank {rank}: " + ", ".join(f"{k} {v}" for k, v in coords.items())
              + f"  (node {node}, local GPU {rank % gpus_per_node})")
    t = Table("group", "size", "stride", f"peers of rank {rank}", "crosses nodes")
    for g in groups:
        if g["size"] == 1:
            cross = "—"
        elif g["crosses_nodes"]:
            cross = f"yes ({g['nodes']} nodes)"
        else:
            cross = "no"
        if g["size"] > 1 and 0 < g["groups_crossing_fraction"] < 1:
            cross += f"; {g['groups_crossing_fraction']:.0%} of {g['dim']} groups do"
        t.add_row(g["dim"], str(g["size"]), str(g["stride"]), _ranks_text(g["peers"]), cross)
    con.print(t)
    pic = Table(title=f"node {node}: ranks {node * gpus_per_node}–"
                      f"{min((node + 1) * gpus_per_node, m.world) - 1}", show_header=True)
    members = out["node_ranks"]
    pic.add_column("")
    for c in members:
        pic.add_column(f"GPU {c['rank'] % gpus_per_node}", justify="right")
    pic.add_row("rank", *[str(c["rank"]) for c in members])
    for g in groups:
        if g["size"] > 1:
            pic.add_row(g["dim"], *[str(c[g["dim"]]) for c in members])
    con.print(pic)
    ins = [d for d, k in inside.items() if k == "inside"]
    acr = [d for d, k in inside.items() if k == "across"]
    mix = [d for d, k in inside.items() if k == "mixed"]
    con.print("inside one node: " + (", ".join(ins) or "none") + "; across nodes: " + (", ".join(acr) or "none")
              + (f"; partly: {', '.join(mix)}" if mix else ""))

