"""The device mesh: rank ↔ coordinates, each rank's groups, which groups leave a node.

Ranks are numbered along the layout's order, innermost first; with the default
[tp, cp, pp, dp] (Megatron-LM's, and Llama 3's, Grattafiori et al. 2024 §3.3.2):

    rank = tp_i + tp·(cp_i + cp·(pp_i + pp·dp_i))

so the stride of a dimension is the product of the sizes inside it. A group along a
dimension is the ranks that differ only in that coordinate: ``size`` ranks, ``stride``
apart. Expert parallelism (``ep``) is carved out of the data-parallel dimension, its
innermost ``ep`` indices (Megatron-LM's expert-data-parallel layout with the expert
tensor-parallel size equal to tp): dp_i = ep_i + ep·edp_i. Nodes hold consecutive ranks,
``gpus_per_node`` each, as a launcher places them (torchrun's node rank × local world size);
a group crosses nodes when two of its ranks lie in different nodes.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from functools import lru_cache
from typing import Iterable

from .errors import ModelcutError
from .specs import Layout

DIMS = ("tp", "cp", "pp", "dp")


@dataclass(frozen=True)
class Mesh:
    """Sizes in rank order (innermost first) and the expert-parallel size carved from dp."""

    sizes: tuple[tuple[str, int], ...]
    ep: int = 1

    def __post_init__(self) -> None:
        names = [n for n, _ in self.sizes]
        if sorted(names) != sorted(DIMS):
            raise ModelcutError(f"order must name tp, cp, pp and dp once each, got {','.join(names)}")
        for n, s in self.sizes:
            if isinstance(s, bool) or not isinstance(s, int) or s < 1:
                raise ModelcutError(f"{n} must be a positive integer, got {s!r}")
        if isinstance(self.ep, bool) or not isinstance(self.ep, int) or self.ep < 1:
            raise ModelcutError(f"ep must be a positive integer, got {self.ep!r}")
        if self.size("dp") % self.ep:
            raise ModelcutError(f"ep ({self.ep}) must divide dp ({self.size('dp')})")

    @classmethod
    def build(cls, tp: int = 1, cp: int = 1, pp: int = 1, dp: int = 1, ep: int = 1,
              order: Iterable[str] = DIMS) -> "Mesh":
        sizes = {"tp": tp, "cp": cp, "pp": pp, "dp": dp}
        order = tuple(o.strip() for o in order)
        for o in order:
            if o not in sizes:
                raise ModelcutError(f"order names {o!r}; use tp, cp, pp and dp")
        return cls(tuple((o, sizes[o]) for o in order), ep)

    @classmethod
    def of(cls, layout: Layout) -> "Mesh":
        return cls.build(layout.tp, layout.cp, layout.pp, layout.dp, layout.ep, layout.order)

    @property
    def order(self) -> tuple[str, ...]:
        return tuple(n for n, _ in self.sizes)

    @property
    def world(self) -> int:
        out = 1
        for _, s in self.sizes:
            out *= s
        return out

    def size(self, dim: str) -> int:
        if dim == "ep":
            return self.ep
        if dim == "edp":
            return self.size("dp") // self.ep
        for n, s in self.sizes:
            if n == dim:
                return s
        raise ModelcutError(f"unknown parallel dimension {dim!r}; use tp, cp, pp, dp or ep")

    def stride(self, dim: str) -> int:
        """Rank distance between neighbours along ``dim``."""
        if dim in ("ep", "edp"):
            base = self.stride("dp")
            return base if dim == "ep" else base * self.ep
        acc = 1
        for n, s in self.sizes:
            if n == dim:
                return acc
            acc *= s
        raise ModelcutError(f"unknown parallel dimension {dim!r}; use tp, cp, pp, dp or ep")

    def _check_rank(self, rank: int) -> None:
        if isinstance(rank, bool) or not isinstance(rank, int) or not 0 <= rank < self.world:
            raise ModelcutError(f"rank must be an integer in 0..{self.world - 1}, got {rank!r}")

    def coords(self, rank: int) -> dict[str, int]:
        """The rank's index along tp, cp, pp, dp (and ep, edp when ep > 1)."""
        out = self._all_coords(rank)
        return {k: out[k] for k in (*DIMS, *(("ep", "edp") if self.ep > 1 else ()))}

    def _all_coords(self, rank: int) -> dict[str, int]:
        self._check_rank(rank)
        out, r = {}, rank
        for n, s in self.sizes:
            r, out[n] = divmod(r, s)
        out["ep"], out["edp"] = out["dp"] % self.ep, out["dp"] // self.ep
        return out

    def rank(self, **coords: int) -> int:
        """The rank at the given coordinates (missing ones are 0)."""
        c = dict(coords)
        if "ep" in c or "edp" in c:
            if "dp" in c:
                raise ModelcutError("give dp, or ep and edp, not both")
            c["dp"] = c.pop("ep", 0) + self.ep * c.pop("edp", 0)
        r, acc = 0, 1
        for n, s in self.sizes:
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
        dims = (dim,) if isinstance(dim, str) else tuple(dim)
        c = self._all_coords(rank)
        ranks = [rank]
        for d in dims:
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


def _as_mesh(layout: Layout | Mesh) -> Mesh:
    return layout if isinstance(layout, Mesh) else Mesh.of(layout)


def _check_gpn(gpus_per_node: int) -> None:
    if isinstance(gpus_per_node, bool) or not isinstance(gpus_per_node, int) or gpus_per_node < 1:
        raise ModelcutError(f"gpus_per_node must be a positive integer, got {gpus_per_node!r}")


@lru_cache(maxsize=4096)
def _crossing(mesh: Mesh, dims: tuple[str, ...], gpn: int) -> tuple[int, int]:
    """(groups that cross nodes, groups) along dims.

    For one dimension the pattern repeats every lcm(stride·size, gpn) ranks (groups repeat
    every stride·size ranks, nodes every gpn), so only the groups starting in the first
    period are examined and scaled up; combined groups are enumerated in full."""
    if len(dims) == 1:
        d = dims[0]
        size, stride = mesh.size(d), mesh.stride(d)
        span = size * stride
        period = min(mesh.world, span * gpn // math.gcd(span, gpn))
        reps = mesh.world // period

        def count(lo: int, hi: int) -> tuple[int, int]:
            crossing = total = 0
            for base in range(lo, hi):
                if (base // stride) % size:
                    continue
                total += 1
                crossing += base // gpn != (base + (size - 1) * stride) // gpn
            return crossing, total
        c, t = count(0, period)
        c2, t2 = count(reps * period, mesh.world)
        return c * reps + c2, t * reps + t2
    gs = mesh.groups(dims)
    return sum(1 for g in gs if g[0] // gpn != g[-1] // gpn), len(gs)


def group_crosses_nodes(layout: Layout | Mesh, dim: str | Iterable[str], gpus_per_node: int) -> bool:
    """Whether any group along ``dim`` has ranks in two nodes (consecutive blocks of
    ``gpus_per_node`` ranks). Exact: every group is enumerated (cached)."""
    _check_gpn(gpus_per_node)
    dims = (dim,) if isinstance(dim, str) else tuple(dim)
    crossing, _ = _crossing(_as_mesh(layout), dims, gpus_per_node)
    return crossing > 0


def crossing_fraction(layout: Layout | Mesh, dim: str | Iterable[str], gpus_per_node: int) -> float:
    """The share of the groups along ``dim`` that cross nodes (some orders split groups
    unevenly: part of them inside a node, part across)."""
    _check_gpn(gpus_per_node)
    dims = (dim,) if isinstance(dim, str) else tuple(dim)
    crossing, total = _crossing(_as_mesh(layout), dims, gpus_per_node)
    return crossing / total


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
    """For each dimension of size > 1: "inside" (every group within one node), "across"
    (every group spans nodes) or "mixed"."""
    out = {}
    for d in (*DIMS, *(("ep",) if mesh.ep > 1 else ())):
        if mesh.size(d) == 1:
            continue
        f = crossing_fraction(mesh, d, gpus_per_node)
        out[d] = "inside" if f == 0 else "across" if f == 1 else "mixed"
    return out
