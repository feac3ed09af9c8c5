"""The device mesh as every face shows it (``modelcut mesh --json``, ``POST /api/mesh``): a rank's
coordinates, its peers in each group, which groups leave a node.

JSON: ``world, order, gpus_per_node, nodes, rank, coords, node, groups`` (each ``dim, size,
stride, peers, nodes, crosses_nodes, groups_crossing_fraction``), ``dims`` (each dimension inside,
across or partly across nodes) and ``node_ranks`` (the rank's node, each GPU's coordinates).
"""

from __future__ import annotations

from typing import Any

from ..core.specs import DEFAULT_ORDER
from ..core.costs.mesh import (DIMS, Mesh, crossing_fraction, dims_in_node, node_ranks,
                               nodes_spanned)
from ..core.errors import ModelcutError
from .limits import DEFAULT, Limits
from .requests import MeshInput


def build_mesh(tp: int = 1, cp: int = 1, pp: int = 1, dp: int = 1, ep: int = 1, order: str | None = None) -> Mesh:
    """The mesh; the default order is a layout's, Megatron-core's tp-cp-ep-dp-pp
    (:data:`..core.specs.DEFAULT_ORDER`)."""
    return Mesh.build(tp, cp, pp, dp, ep, DEFAULT_ORDER if order is None else order)


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
    m = build_mesh(inp.tp, inp.cp, inp.pp, inp.dp, inp.ep, ",".join(inp.order) if inp.order else None)
    return m, mesh_json(m, inp.rank, inp.gpus_per_node)


def mesh_json(m: Mesh, rank: int, gpus_per_node: int) -> dict[str, Any]:
    if isinstance(gpus_per_node, bool) or not isinstance(gpus_per_node, int) or gpus_per_node < 1:
        raise ModelcutError(f"gpus_per_node must be at least 1, got {gpus_per_node}")
    coords = m.coords(rank)
    node = rank // gpus_per_node
    groups = []
    for d in (*DIMS, *(("ep",) if m.size("ep") > 1 else ())):
        spanned = nodes_spanned(m, rank, d, gpus_per_node)
        groups.append({"dim": d, "size": m.size(d), "stride": m.stride(d), "peers": m.group(rank, d),
                       "nodes": spanned, "crosses_nodes": spanned > 1,
                       "groups_crossing_fraction": crossing_fraction(m, d, gpus_per_node)})
    return {"world": m.world, "order": list(m.order), "gpus_per_node": gpus_per_node,
            "nodes": -(-m.world // gpus_per_node), "rank": rank, "coords": coords, "node": node, "groups": groups,
            "dims": dims_in_node(m, gpus_per_node),
            "node_ranks": [{"rank": r, **c} for r, c in node_ranks(m, node, gpus_per_node)]}
