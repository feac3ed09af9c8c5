"""The device mesh as every face shows it (``modelcut mesh --json``, ``POST /api/mesh``): a rank's
coordinates, its peers in each group, which groups leave a node.

JSON: ``world, order, gpus_per_node, nodes, rank, coords, node, groups`` (each ``dim, size,
stride, peers, nodes, crosses_nodes, groups_crossing_fraction``), ``dims`` (each dimension inside,
across or partly across nodes), ``node_ranks`` (the rank's node, each GPU's coordinates) and
``experts`` (with ep > 1: how the expert groups are laid, ``grid`` "megatron-core" where the
order runs tp, cp and dp inside each pipeline stage, else "dp": carved from the data-parallel
ranks; ``etp``, ``ep``, ``edp``). The ep group and a rank's ep, edp (and etp) coordinates are
the step model's (:func:`..core.costs.mesh.expert_mesh`). With ``dp_shard`` below dp (hybrid
sharding), two more groups, ``dp_shard`` (the dp_shard·cp ranks one ZeRO shard is split over) and
``dp_replica`` (the dp/dp_shard ranks holding the same shard), and the rank's index in each, as the
step model lays them (:func:`..core.costs.comm.hybrid_mesh`). With ``cp_a2a`` (hierarchical context
parallelism, Megatron-LM's ``--hierarchical-context-parallel-sizes cp_a2a cp/cp_a2a``), two more,
``cp_a2a`` (the all-to-all groups of adjacent cp ranks) and ``cp_ring`` (the ring across them),
with the rank's index in each (:data:`..core.costs.mesh.CP_LEVELS`), as the step model times them.
"""

from __future__ import annotations

from typing import Any

from ..core.costs import comm
from ..core.specs import DEFAULT_ORDER, Layout
from ..core.costs.mesh import (CP_LEVELS, DIMS, Mesh, crossing_fraction, dense_mesh, dims_in_node, expert_grid_applies,
                               expert_mesh, node_ranks, nodes_spanned, parse_order)
from ..core.errors import ModelcutError
from .limits import DEFAULT, Limits
from .requests import MeshInput


def mesh_order(text: str | None) -> list[str] | None:
    """The command line's ``--order``, ``tp,cp,pp,dp`` or ``tp-cp-ep-dp-pp``, as a list."""
    if text is None:
        return None
    return [x.strip() for x in text.replace("-", ",").split(",") if x.strip()]


def mesh_input(inp: MeshInput, limits: Limits | None = None) -> tuple[Mesh, dict[str, Any]]:
    """The use case: the world within the limits (before any array is made), the mesh, its JSON."""
    lim = limits or DEFAULT
    world = inp.tp * inp.cp * inp.pp * inp.dp
    lim.check("max_gpus", world, "tp·cp·pp·dp")
    if inp.rank >= world:
        raise ModelcutError(f"rank {inp.rank:,} is outside the {world:,} ranks (0..{world - 1:,})")
    order = parse_order(",".join(inp.order)) if inp.order else DEFAULT_ORDER
    if inp.etp is not None and inp.ep == 1:
        raise ModelcutError("etp (expert tensor parallelism) needs ep > 1")
    layout = Layout(tp=inp.tp, cp=inp.cp, pp=inp.pp, dp=inp.dp, ep=inp.ep, etp=inp.etp, order=order,
                    dp_shard=inp.dp_shard, cp_kind="a2a+p2p" if inp.cp_a2a is not None else None, cp_a2a=inp.cp_a2a)
    if expert_grid_applies(layout):
        m, experts = dense_mesh(layout), expert_mesh(layout)
    else:
        if inp.etp is not None and inp.etp != inp.tp:
            raise ModelcutError(f"etp {inp.etp} under the rank order {'-'.join(order)}: the experts are carved from "
                                "dp there, cut as the attention (etp = tp); the expert grid needs tp, cp and dp inside "
                                "each pipeline stage, the pipeline outermost")
        m, experts = Mesh.of(layout), None
    out = mesh_json(m, inp.rank, inp.gpus_per_node, experts)
    if layout.hybrid:
        groups = hybrid_groups(layout, inp.rank, inp.gpus_per_node)
        out["groups"] += groups
        for row in (out["coords"], *out["node_ranks"]):
            row.update(dp_shard=row["dp"] % layout.shard_dp, dp_replica=row["dp"] // layout.shard_dp)
        for g in groups:
            if g["size"] > 1:
                f = g["groups_crossing_fraction"]
                out["dims"][g["dim"]] = "inside" if f == 0 else "across" if f == 1 else "mixed"
    return m, out


def hybrid_groups(layout: Layout, rank: int, gpus_per_node: int) -> list[dict[str, Any]]:
    """The rank's shard and replica groups under hybrid sharding (the mesh JSON's group rows;
    ``stride``: between its data-parallel members)."""
    hm = comm.hybrid_mesh(layout)
    out = []
    for name, dims, size, stride in (("dp_shard", comm.SHARD, layout.shard_ranks, hm.stride("ep")),
                                     ("dp_replica", comm.REPLICA, layout.dp // layout.shard_dp, hm.stride("edp"))):
        peers = hm.group(rank, dims)
        spanned = nodes_spanned(hm, rank, dims, gpus_per_node)
        out.append({"dim": name, "size": size, "stride": stride, "peers": peers, "nodes": spanned,
                    "crosses_nodes": spanned > 1, "groups_crossing_fraction": crossing_fraction(hm, dims, gpus_per_node)})
    return out


def _group(m: Mesh, rank: int, d: str, gpus_per_node: int) -> dict[str, Any]:
    spanned = nodes_spanned(m, rank, d, gpus_per_node)
    return {"dim": d, "size": m.size(d), "stride": m.stride(d), "peers": m.group(rank, d), "nodes": spanned,
            "crosses_nodes": spanned > 1, "groups_crossing_fraction": crossing_fraction(m, d, gpus_per_node)}


def _expert_coords(experts: Mesh, rank: int) -> dict[str, int]:
    c = experts.coords(rank)
    return {"etp": c["tp"], "ep": c["ep"], "edp": c["edp"]}


def mesh_json(m: Mesh, rank: int, gpus_per_node: int, experts: Mesh | None = None) -> dict[str, Any]:
    """The JSON (module doc); ``experts``: the expert grid's mesh where it holds the expert groups
    (else they are ``m``'s, carved from dp)."""
    if isinstance(gpus_per_node, bool) or not isinstance(gpus_per_node, int) or gpus_per_node < 1:
        raise ModelcutError(f"gpus_per_node must be at least 1, got {gpus_per_node}")
    coords = m.coords(rank)
    node = rank // gpus_per_node
    groups = [_group(m, rank, d, gpus_per_node) for d in (*DIMS, *(("ep",) if m.size("ep") > 1 else ()),
                                                        *(CP_LEVELS if m.cp_a2a > 1 else ()))]
    dims = dims_in_node(m, gpus_per_node)
    ranks = [{"rank": r, **c} for r, c in node_ranks(m, node, gpus_per_node)]
    out: dict[str, Any] = {"experts": None}
    if experts is not None:
        coords.update(_expert_coords(experts, rank))
        groups.append(_group(experts, rank, "ep", gpus_per_node))
        f = crossing_fraction(experts, "ep", gpus_per_node)
        dims["ep"] = "inside" if f == 0 else "across" if f == 1 else "mixed"
        for row in ranks:
            row.update(_expert_coords(experts, row["rank"]))
        out["experts"] = {"grid": "megatron-core", "etp": experts.size("tp"), "ep": experts.ep,
                          "edp": experts.size("edp")}
    elif m.size("ep") > 1:
        out["experts"] = {"grid": "dp", "etp": m.size("tp"), "ep": m.ep, "edp": m.size("edp")}
    return {"world": m.world, "order": list(m.order), "gpus_per_node": gpus_per_node,
            "nodes": -(-m.world // gpus_per_node), "rank": rank, "coords": coords, "node": node, "groups": groups,
            "dims": dims, "node_ranks": ranks, **out}
