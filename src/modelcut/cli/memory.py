"""``modelcut mesh``: rank ↔ coordinates, a rank's peers in each group, which groups leave a node."""

from __future__ import annotations

import json
from typing import Optional

import typer
from rich.console import Console
from rich.table import Table

from ..core.errors import ModelcutError
from ..core.mesh import DIMS, MEGATRON_ORDER, Mesh, crossing_fraction, dims_in_node, node_ranks, nodes_spanned
from . import app


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
    ep: int = typer.Option(1, "--ep", help="expert-parallel size, carved from the data-parallel ranks"),
    gpus_per_node: int = typer.Option(8, "--gpus-per-node", help="accelerators per node"),
    rank: int = typer.Option(0, "--rank", "-r", help="the rank whose groups to show"),
    order: Optional[str] = typer.Option(
        None, "--order", help="rank order, innermost first, e.g. tp,cp,pp,dp or tp-cp-ep-dp-pp; may place ep "
                              "(default: tp,cp,pp,dp; with --ep > 1 Megatron-core's tp,cp,ep,dp,pp)"),
    as_json: bool = typer.Option(False, "--json", help="print JSON"),
) -> None:
    """A rank's coordinates, its peers in each parallel group, and whether each group crosses nodes."""
    if order is None:
        order = ",".join(MEGATRON_ORDER if ep > 1 else DIMS)
    m = Mesh.build(tp, cp, pp, dp, ep, order)
    if gpus_per_node < 1:
        raise ModelcutError(f"gpus_per_node must be at least 1, got {gpus_per_node}")
    coords = m.coords(rank)
    dims = [*DIMS, *(("ep",) if ep > 1 else ())]
    node = rank // gpus_per_node
    groups = []
    for d in dims:
        peers = m.group(rank, d)
        groups.append({"dim": d, "size": m.size(d), "stride": m.stride(d), "peers": peers,
                       "nodes": nodes_spanned(m, rank, d, gpus_per_node),
                       "crosses_nodes": nodes_spanned(m, rank, d, gpus_per_node) > 1,
                       "groups_crossing_fraction": crossing_fraction(m, d, gpus_per_node)})
    inside = dims_in_node(m, gpus_per_node)
    if as_json:
        print(json.dumps({"world": m.world, "order": list(m.order), "gpus_per_node": gpus_per_node,
                          "nodes": -(-m.world // gpus_per_node), "rank": rank, "coords": coords, "node": node,
                          "groups": groups, "dims": inside,
                          "node_ranks": [{"rank": r, **c} for r, c in node_ranks(m, node, gpus_per_node)]}))
        return
    con = Console()
    sizes = " × ".join(f"{n} {s}" for n, s in m.atoms if n not in ("ep", "edp") or ep > 1) if ep > 1 else \
        " × ".join(f"{n} {m.size(n)}" for n in m.order)
    con.print(f"[bold]mesh[/bold] {sizes} = {m.world:,} ranks, order {','.join(m.order)} (innermost first)"
              f"{f'; dp {dp} = ep {ep} × edp {dp // ep}' if ep > 1 else ''}; {gpus_per_node} per node → "
              f"{-(-m.world // gpus_per_node):,} nodes")
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
    members = node_ranks(m, node, gpus_per_node)
    pic.add_column("")
    for r, _ in members:
        pic.add_column(f"GPU {r % gpus_per_node}", justify="right")
    pic.add_row("rank", *[str(r) for r, _ in members])
    for d in dims:
        if m.size(d) > 1:
            pic.add_row(d, *[str(c[d]) for _, c in members])
    con.print(pic)
    ins = [d for d, k in inside.items() if k == "inside"]
    acr = [d for d, k in inside.items() if k == "across"]
    mix = [d for d, k in inside.items() if k == "mixed"]
    con.print("inside one node: " + (", ".join(ins) or "none") + "; across nodes: " + (", ".join(acr) or "none")
              + (f"; partly: {', '.join(mix)}" if mix else ""))

