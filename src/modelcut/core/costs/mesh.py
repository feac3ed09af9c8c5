"""The device mesh: rank ↔ coordinates, each rank's groups, which groups leave a node.

Ranks are numbered along the layout's order, innermost first; with the default
:data:`..specs.DEFAULT_ORDER`, tp-cp-ep-dp-pp (Megatron-core's; the pipeline outermost, as every
stack modelcut models places it):

    rank = tp_i + tp·(cp_i + cp·(dp_i + dp·pp_i))     (dp_i = ep_i + ep·edp_i)

so the stride of a dimension is the product of the sizes inside it. A group along a
dimension is the ranks that differ only in that coordinate: ``size`` ranks, ``stride``
apart. Nodes hold consecutive ranks, ``gpus_per_node`` each, as a launcher places them
(torchrun's node rank × local world size); a group crosses nodes when two of its ranks lie
in different nodes. Llama 3's order is [tp, cp, pp, dp] (Grattafiori et al. 2024 §3.3.2): the
pipeline inside data parallelism; its runs name it.

**Expert parallelism** (``ep``) in a :class:`Mesh` is carved out of the data-parallel dimension (a
layout's expert groups are the expert grid's where that holds them, below): a data-parallel
index is dp_i = ep_i + ep·edp_i, ep_i the rank's place in its expert-parallel group and
edp_i in its expert-data-parallel group (dp/ep ranks holding the same experts). Where ep sits
in the rank order is configurable: the order may name ``ep`` as a fifth entry, and then ep_i
takes that place and the ``dp`` entry stands for the edp_i part. Megatron-core's default
order is ``tp-cp-ep-dp-pp`` (megatron/core/parallel_state.py, ``initialize_model_parallel(...,
order="tp-cp-ep-dp-pp")``, :data:`MEGATRON_ORDER`): the expert-parallel group is the next
ranks after tensor and context parallelism, the pipeline outermost. An order without ``ep``
puts ep innermost inside dp (ep immediately before dp). Megatron-core builds its expert
groups from a second rank generator over tp·cp·dp with context parallelism folded in
(expert tensor size etp, then ep, then expert data parallelism), so with cp > 1 its ep group
takes context-parallel ranks first: the carved groups are the same only where etp = tp and
cp = 1.

**Hierarchical context parallelism** (``cp_a2a`` = A, with 1 < A < cp dividing cp) splits each cp
group in two levels, as Megatron-LM's ``--hierarchical-context-parallel-sizes A cp/A`` lays them
(core_v0.19.0 ``parallel_state.py`` ``create_hierarchical_groups``, called on each cp group's
ranks with the sizes [A, cp/A]: the first level takes ``ranks[j + k·A]`` for j < A, the second
``ranks[j + i·A]`` for i < cp/A): ``cp_a2a``, the A adjacent cp ranks (cp index // A the same)
over which the all-to-all runs, and ``cp_ring``, the cp/A ranks A cp indices apart (cp index
mod A the same) over which the ring runs. A rank's indices are cp_i mod A and cp_i // A.

**The expert grid.** Where the rank order runs tp, cp and dp inside each pipeline stage, the
pipeline outermost (:data:`STAGE_CONTIGUOUS`: Megatron-core's default, and the same without ep),
the expert groups are laid as Megatron-core lays them, over each stage's tp·cp·dp ranks:
expert tensor parallelism (etp) innermost, then ep, then the expert-data-parallel ranks
(:func:`expert_mesh`). An ep group then takes tensor-parallel ranks first where etp < tp, and
context-parallel ones before data-parallel ones; ep need not divide dp, only ep·etp must divide
tp·cp·dp. With etp = tp and cp = 1 these are the groups carved from dp above. Other orders carve
ep from dp.

Whether groups cross nodes is exact for any order: a group's members are its first rank b
(index 0 along the group's dimensions) plus offsets from 0 to reach = Σ (size − 1)·stride,
so it stays in b's node iff (b mod g) + reach < g; every first rank is checked (numpy).
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Iterable

import numpy as np

from ..errors import ModelcutError
from ..specs import DEFAULT_ORDER, Layout, cp_a2a_problem

DIMS = ("tp", "cp", "pp", "dp")
#: The hierarchical context-parallel levels a cp group is split in (module doc): the all-to-all
#: groups and the ring across them.
CP_LEVELS = ("cp_a2a", "cp_ring")
#: Megatron-core's default rank order, innermost first (megatron/core/parallel_state.py,
#: ``initialize_model_parallel(order="tp-cp-ep-dp-pp")``): the layouts' default.
MEGATRON_ORDER = DEFAULT_ORDER


def parse_order(order: str | Iterable[str]) -> tuple[str, ...]:
    """An order as a tuple: a list of names, or text such as "tp,cp,pp,dp" or Megatron-core's
    "tp-cp-ep-dp-pp". tp, cp, pp and dp once each, ep at most once."""
    if isinstance(order, str):
        names = [o.strip() for o in order.replace("-", ",").split(",") if o.strip()]
    else:
        names = [str(o).strip() for o in order]
    for o in names:
        if o not in (*DIMS, "ep"):
            raise ModelcutError(f"order names {o!r}; use tp, cp, pp, dp (and ep)")
    if sorted(n for n in names if n != "ep") != sorted(DIMS) or names.count("ep") > 1:
        raise ModelcutError(f"order must name tp, cp, pp and dp once each (ep at most once), got {','.join(names)}")
    return tuple(names)


@lru_cache(maxsize=4096)
def _atoms(sizes: tuple[tuple[str, int], ...], ep: int) -> tuple[tuple[str, int], ...]:
    """The rank order's indivisible dimensions, innermost first: tp, cp, pp, ep and edp (dp's
    part outside ep)."""
    placed = any(n == "ep" for n, _ in sizes)
    out: list[tuple[str, int]] = []
    for n, s in sizes:
        if n == "dp":
            out += [("edp", s // ep)] if placed else [("ep", ep), ("edp", s // ep)]
        else:
            out.append((n, ep if n == "ep" else s))
    return tuple(out)


@dataclass(frozen=True)
class Mesh:
    """Sizes in rank order (innermost first; dp its full size, ep as an entry of its own where
    the order places it), the expert-parallel size carved from dp, and the hierarchical context
    parallelism's all-to-all groups' size carved from cp (1: none; module doc)."""

    sizes: tuple[tuple[str, int], ...]
    ep: int = 1
    cp_a2a: int = 1

    def __post_init__(self) -> None:
        names = [n for n, _ in self.sizes]
        parse_order(names)
        for n, s in self.sizes:
            if isinstance(s, bool) or not isinstance(s, int) or s < 1:
                raise ModelcutError(f"{n} must be a positive integer, got {s!r}")
        if isinstance(self.ep, bool) or not isinstance(self.ep, int) or self.ep < 1:
            raise ModelcutError(f"ep must be a positive integer, got {self.ep!r}")
        if dict(self.sizes).get("ep", self.ep) != self.ep:
            raise ModelcutError(f"the order's ep entry ({dict(self.sizes)['ep']}) differs from ep ({self.ep})")
        if self.size("dp") % self.ep:
            raise ModelcutError(f"ep ({self.ep}) must divide dp ({self.size('dp')})")
        if self.cp_a2a != 1 and (why := cp_a2a_problem(self.size("cp"), self.cp_a2a)) is not None:
            raise ModelcutError(why)

    @classmethod
    def build(cls, tp: int = 1, cp: int = 1, pp: int = 1, dp: int = 1, ep: int = 1,
              order: str | Iterable[str] = DEFAULT_ORDER, cp_a2a: int = 1) -> "Mesh":
        sizes = {"tp": tp, "cp": cp, "pp": pp, "dp": dp, "ep": ep}
        return cls(tuple((o, sizes[o]) for o in parse_order(order)), ep, cp_a2a)

    @classmethod
    def of(cls, layout: Layout) -> "Mesh":
        return cls.build(layout.tp, layout.cp, layout.pp, layout.dp, layout.ep, layout.order, layout.cp_a2a or 1)

    @property
    def order(self) -> tuple[str, ...]:
        return tuple(n for n, _ in self.sizes)

    @property
    def atoms(self) -> tuple[tuple[str, int], ...]:
        """(name, size) of tp, cp, pp, ep, edp in rank order, innermost first."""
        return _atoms(self.sizes, self.ep)

    @property
    def world(self) -> int:
        out = 1
        for _, s in self.atoms:
            out *= s
        return out

    def size(self, dim: str) -> int:
        if dim == "ep":
            return self.ep
        if dim == "edp":
            return self.size("dp") // self.ep
        if dim == "cp_a2a":
            return self.cp_a2a
        if dim == "cp_ring":
            return self.size("cp") // self.cp_a2a
        for n, s in self.sizes:
            if n == dim:
                return s
        raise ModelcutError(f"unknown parallel dimension {dim!r}; use tp, cp, pp, dp or ep")

    def stride(self, dim: str) -> int:
        """Rank distance between neighbours along ``dim`` (for dp: from index 0 to 1, which is
        the ep stride when ep > 1)."""
        if dim == "dp":
            return self.stride("ep" if self.ep > 1 else "edp")
        if dim in CP_LEVELS:
            return self.stride("cp") * (self.cp_a2a if dim == "cp_ring" else 1)
        acc = 1
        for n, s in self.atoms:
            if n == dim:
                return acc
            acc *= s
        raise ModelcutError(f"unknown parallel dimension {dim!r}; use tp, cp, pp, dp or ep")

    def _expand(self, dim: str | Iterable[str]) -> tuple[str, ...]:
        dims = (dim,) if isinstance(dim, str) else tuple(dim)
        out: list[str] = []
        for d in dims:
            if d not in (*DIMS, "ep", "edp", *CP_LEVELS):
                raise ModelcutError(f"unknown parallel dimension {d!r}; use tp, cp, pp, dp or ep")
            for a in (("ep", "edp") if d == "dp" else CP_LEVELS if d == "cp" and self.cp_a2a > 1 else (d,)):
                if a not in out:
                    out.append(a)
        return tuple(out)

    def _check_rank(self, rank: int) -> None:
        if isinstance(rank, bool) or not isinstance(rank, (int, np.integer)) or not 0 <= rank < self.world:
            raise ModelcutError(f"rank must be an integer in 0..{self.world - 1}, got {rank!r}")

    def coords(self, rank: int) -> dict[str, int]:
        """The rank's index along tp, cp, pp, dp (and ep, edp when ep > 1; cp_a2a, cp_ring with a
        hierarchy)."""
        out = self._all_coords(rank)
        return {k: out[k] for k in (*DIMS, *(("ep", "edp") if self.ep > 1 else ()),
                                    *(CP_LEVELS if self.cp_a2a > 1 else ()))}

    def _all_coords(self, rank: int) -> dict[str, int]:
        self._check_rank(rank)
        out, r = {}, int(rank)
        for n, s in self.atoms:
            r, out[n] = divmod(r, s)
        out["dp"] = out["ep"] + self.ep * out["edp"]
        out["cp_ring"], out["cp_a2a"] = divmod(out["cp"], self.cp_a2a)
        return out

    def rank(self, **coords: int) -> int:
        """The rank at the given coordinates (missing ones are 0)."""
        c = dict(coords)
        if "ep" in c or "edp" in c:
            if "dp" in c:
                raise ModelcutError("give dp, or ep and edp, not both")
        else:
            dp = c.pop("dp", 0)
            if isinstance(dp, bool) or not isinstance(dp, int) or not 0 <= dp < self.size("dp"):
                raise ModelcutError(f"dp index must be in 0..{self.size('dp') - 1}, got {dp!r}")
            c["ep"], c["edp"] = dp % self.ep, dp // self.ep
        r, acc = 0, 1
        for n, s in self.atoms:
            i = c.pop(n, 0)
            if isinstance(i, bool) or not isinstance(i, int) or not 0 <= i < s:
                raise ModelcutError(f"{n} index must be in 0..{s - 1}, got {i!r}")
            r += i * acc
            acc *= s
        if c:
            raise ModelcutError(f"unknown coordinates {', '.join(c)}")
        return r

    def group(self, rank: int, dim: str | Iterable[str]) -> list[int]:
        """The ranks of ``rank``'s group along ``dim`` (one name, or several for a combined
        group such as ("cp", "dp")), ascending."""
        self._check_rank(rank)
        c = self._all_coords(rank)
        ranks = [int(rank)]
        for d in self._expand(dim):
            size, stride = self.size(d), self.stride(d)
            base = [r - c[d] * stride for r in ranks]
            ranks = [b + k * stride for b in base for k in range(size)]
        return sorted(set(ranks))

    def groups(self, dim: str | Iterable[str]) -> list[list[int]]:
        """Every group along ``dim``, each ascending, ordered by first rank."""
        seen: set[int] = set()
        out = []
        for r in range(self.world):
            if r not in seen:
                g = self.group(r, dim)
                seen.update(g)
                out.append(g)
        return out

    def offsets(self, dim: str | Iterable[str]) -> tuple[tuple[int, int], ...]:
        """(stride, size) of each indivisible dimension a group along ``dim`` spans."""
        return tuple((self.stride(d), self.size(d)) for d in self._expand(dim))


#: Rank orders whose pipeline stages hold consecutive ranks, tp innermost, then cp, then dp (ep
#: named just before dp, or not at all): over these the expert grid is Megatron-core's
#: (:func:`expert_mesh`).
STAGE_CONTIGUOUS = (("tp", "cp", "ep", "dp", "pp"), ("tp", "cp", "dp", "pp"))

EXPERT_DIMS = ("ep", "edp")


def expert_grid_applies(layout: Layout) -> bool:
    """Whether the layout's expert groups are Megatron-core's expert grid (module doc): ep > 1 and
    a rank order of :data:`STAGE_CONTIGUOUS`."""
    return layout.ep > 1 and parse_order(layout.order) in STAGE_CONTIGUOUS


def expert_mesh(layout: Layout) -> Mesh:
    """The mesh whose ``ep`` and ``edp`` groups are the layout's expert-parallel and
    expert-data-parallel groups. Megatron-core builds them from a second rank generator over the
    same ranks (megatron/core/parallel_state.py ``initialize_model_parallel``, NVIDIA/Megatron-LM at
    d98e8a64dd: ``RankGenerator(tp=expert_tensor_parallel_size, ep=expert_model_parallel_size,
    dp=expert_data_parallel_size, pp=pipeline_model_parallel_size, cp=1, order=order)`` with
    expert_data_parallel_size = world/(etp·ep·pp), asserting a pp-last order where pp > 1):
    under :func:`expert_grid_applies`, the mesh of etp, ep, tp·cp·dp/etp and pp (its tp the expert
    tensor-parallel group). Otherwise the layout's own mesh, ep carved from dp."""
    check_expert_groups(layout)
    if not expert_grid_applies(layout):
        return Mesh.of(layout)
    etp = layout.etp or layout.tp
    return Mesh.build(tp=etp, cp=1, pp=layout.pp, dp=layout.tp * layout.cp * layout.dp // etp, ep=layout.ep)


def check_expert_groups(layout: Layout) -> None:
    """Refuse in one line expert groups the layout's ranks cannot hold: under the expert grid
    (:func:`expert_grid_applies`) ep·etp must divide each stage's tp·cp·dp (with a hint where etp 1
    would do); under another order ep, carved from dp, must divide it. The one rule
    :func:`expert_mesh` and :func:`..costs.moe.check_moe_layout` both apply."""
    ep, etp = layout.ep, layout.etp or layout.tp
    stage = layout.tp * layout.cp * layout.dp
    if expert_grid_applies(layout):
        if stage % (ep * etp):
            raise ModelcutError(f"ep × etp ({ep} × {etp}) must divide tp × cp × dp ({stage}): the expert grid lays "
                                "etp, ep and the expert data-parallel ranks over them"
                                + ("; with etp 1 the experts may span the tensor-parallel ranks"
                                   if etp > 1 and stage % ep == 0 else ""))
    elif ep > 1 and layout.dp % ep:
        raise ModelcutError(f"ep ({ep}) must divide dp ({layout.dp}) under the rank order {'-'.join(layout.order)}")


def dense_mesh(layout: Layout) -> Mesh:
    """The mesh of the tp, cp, pp and dp groups: the layout's, ep carved from dp only where the
    expert grid does not hold the expert groups (:func:`expert_mesh`)."""
    if expert_grid_applies(layout):
        return Mesh.build(layout.tp, layout.cp, layout.pp, layout.dp, 1, layout.order, layout.cp_a2a or 1)
    return Mesh.of(layout)


def _as_mesh(layout: Layout | Mesh, dims: Iterable[str] = ()) -> Mesh:
    """The mesh that holds the groups along ``dims``: a Mesh as given; for a layout, its expert
    mesh for the expert groups (ep, edp), else its dense one."""
    if isinstance(layout, Mesh):
        return layout
    return expert_mesh(layout) if any(d in EXPERT_DIMS for d in dims) else dense_mesh(layout)


def _check_gpn(gpus_per_node: int) -> None:
    if isinstance(gpus_per_node, bool) or not isinstance(gpus_per_node, int) or gpus_per_node < 1:
        raise ModelcutError(f"gpus_per_node must be a positive integer, got {gpus_per_node!r}")


@lru_cache(maxsize=8192)
def _crossing(mesh: Mesh, dims: tuple[str, ...], gpn: int) -> tuple[int, int]:
    """(groups that cross nodes, groups) along dims (module docstring: every first rank b is
    checked, (b mod g) + reach ≥ g)."""
    span = mesh.offsets(dims)
    reach = sum((size - 1) * stride for stride, size in span)
    ranks = np.arange(mesh.world, dtype=np.int64)
    first = np.ones(mesh.world, dtype=bool)
    for stride, size in span:
        if size > 1:
            first &= (ranks // stride) % size == 0
    b = ranks[first]
    return int(np.count_nonzero(b % gpn + reach >= gpn)), int(b.size)


def group_crosses_nodes(layout: Layout | Mesh, dim: str | Iterable[str], gpus_per_node: int) -> bool:
    """Whether any group along ``dim`` has ranks in two nodes (consecutive blocks of
    ``gpus_per_node`` ranks). Exact: every group is checked (cached). The one definition:
    :func:`modelcut.core.costs.comm.group_spans_nodes` asks it."""
    _check_gpn(gpus_per_node)
    dims = (dim,) if isinstance(dim, str) else tuple(dim)
    crossing, _ = _crossing(_as_mesh(layout, dims), dims, gpus_per_node)
    return crossing > 0


def crossing_fraction(layout: Layout | Mesh, dim: str | Iterable[str], gpus_per_node: int) -> float:
    """The share of the groups along ``dim`` that cross nodes (some orders split groups
    unevenly: part of them inside a node, part across)."""
    _check_gpn(gpus_per_node)
    dims = (dim,) if isinstance(dim, str) else tuple(dim)
    crossing, total = _crossing(_as_mesh(layout, dims), dims, gpus_per_node)
    return crossing / total


def members_in_node(layout: Layout | Mesh, dim: str | Iterable[str], gpus_per_node: int) -> int:
    """How many members of rank 0's group along ``dim`` share its node (nodes: blocks of
    ``gpus_per_node`` consecutive ranks): the group offsets Σ index·stride below gpus_per_node."""
    _check_gpn(gpus_per_node)
    offs = {0}
    for stride, size in _as_mesh(layout, (dim,) if isinstance(dim, str) else tuple(dim)).offsets(dim):
        offs = {o + k * stride for o in offs for k in range(size) if o + k * stride < gpus_per_node}
    return len(offs)


def nodes_spanned(mesh: Mesh, rank: int, dim: str | Iterable[str], gpus_per_node: int) -> int:
    """How many nodes ``rank``'s group along ``dim`` touches."""
    _check_gpn(gpus_per_node)
    return len({r // gpus_per_node for r in mesh.group(rank, dim)})


def node_ranks(mesh: Mesh, node: int, gpus_per_node: int) -> list[tuple[int, dict[str, int]]]:
    """(rank, coordinates) of every rank in one node (the last node may be partly filled)."""
    _check_gpn(gpus_per_node)
    nodes = -(-mesh.world // gpus_per_node)
    if isinstance(node, bool) or not isinstance(node, int) or not 0 <= node < nodes:
        raise ModelcutError(f"node must be in 0..{nodes - 1}, got {node!r}")
    lo = node * gpus_per_node
    return [(r, mesh.coords(r)) for r in range(lo, min(lo + gpus_per_node, mesh.world))]


def dims_in_node(mesh: Mesh, gpus_per_node: int) -> dict[str, str]:
    """For each dimension of size > 1 (and each hierarchical cp level): "inside" (every group within
    one node), "across" (every group spans nodes) or "mixed"."""
    out = {}
    for d in (*DIMS, *(("ep",) if mesh.ep > 1 else ()), *(CP_LEVELS if mesh.cp_a2a > 1 else ())):
        if mesh.size(d) == 1:
            continue
        f = crossing_fraction(mesh, d, gpus_per_node)
        out[d] = "inside" if f == 0 else "across" if f == 1 else "mixed"
    return out
