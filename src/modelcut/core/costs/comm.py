"""Collective costs in α–β form, and which link a parallel group's traffic uses.

A ring of n ranks moving a buffer of ``nbytes`` over links of bandwidth ``bw`` (bytes/s, each
way) with latency ``alpha`` (s per step) costs (Thakur, Rabenseifner & Gropp 2005, "Optimization
of Collective Communication Operations in MPICH", §4; Patarasuk & Yuan 2009 for the ring
all-reduce):

* all-reduce:      2(n − 1)/n · nbytes/bw + 2(n − 1)·α
* reduce-scatter:  (n − 1)/n · nbytes/bw + (n − 1)·α   (nbytes: the whole buffer before scattering)
* all-gather:      (n − 1)/n · nbytes/bw + (n − 1)·α   (nbytes: the whole gathered buffer)
* all-to-all:      (n − 1)/n · nbytes/bw + (n − 1)·α   (nbytes: one rank's send buffer, 1/n to each)
* point-to-point:  nbytes/bw + α

A group of one rank costs nothing. Ranks are numbered from the layout's order, innermost
first, by default Megatron-core's tp-cp-ep-dp-pp: rank = tp_i + tp·(cp_i + cp·(dp_i + dp·pp_i)),
the pipeline outermost (:data:`..specs.DEFAULT_ORDER`, :mod:`.mesh`; Llama 3's runs name their
own, [tp, cp, pp, dp]). Ranks ``k·g … k·g + g − 1`` share a node
(g accelerators per node); a group whose members sit in different nodes uses the network.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import lru_cache
from typing import Iterable

from ..errors import ModelcutError
from .mesh import Mesh, group_crosses_nodes, members_in_node
from ..specs import Hardware, Layout


def _check(n: int, nbytes: float, bw: float, alpha: float) -> None:
    if isinstance(n, bool) or not isinstance(n, int) or n < 1:
        raise ModelcutError(f"group size must be a positive integer, got {n!r}")
    if nbytes < 0:
        raise ModelcutError(f"message size must be non-negative, got {nbytes}")
    if not bw > 0:
        raise ModelcutError(f"bandwidth must be positive, got {bw}")
    if alpha < 0:
        raise ModelcutError(f"latency must be non-negative, got {alpha}")


def ring_allreduce(n: int, nbytes: float, bw: float, alpha: float = 0.0) -> float:
    """Ring all-reduce: 2(n − 1)/n · nbytes/bw + 2(n − 1)·α (a reduce-scatter then an all-gather)."""
    _check(n, nbytes, bw, alpha)
    if n == 1:
        return 0.0
    return 2 * (n - 1) / n * nbytes / bw + 2 * (n - 1) * alpha


def reduce_scatter(n: int, nbytes: float, bw: float, alpha: float = 0.0) -> float:
    """Ring reduce-scatter of an nbytes buffer: (n − 1)/n · nbytes/bw + (n − 1)·α."""
    _check(n, nbytes, bw, alpha)
    if n == 1:
        return 0.0
    return (n - 1) / n * nbytes / bw + (n - 1) * alpha


def all_gather(n: int, nbytes: float, bw: float, alpha: float = 0.0) -> float:
    """Ring all-gather into an nbytes buffer: (n − 1)/n · nbytes/bw + (n − 1)·α."""
    _check(n, nbytes, bw, alpha)
    if n == 1:
        return 0.0
    return (n - 1) / n * nbytes / bw + (n - 1) * alpha


def all_to_all(n: int, nbytes: float, bw: float, alpha: float = 0.0) -> float:
    """All-to-all, each rank sending nbytes in n equal parts (one kept): (n − 1)/n · nbytes/bw
    + (n − 1)·α (pairwise exchange)."""
    _check(n, nbytes, bw, alpha)
    if n == 1:
        return 0.0
    return (n - 1) / n * nbytes / bw + (n - 1) * alpha


def p2p(nbytes: float, bw: float, alpha: float = 0.0) -> float:
    """One point-to-point send: nbytes/bw + α."""
    _check(1, nbytes, bw, alpha)
    return nbytes / bw + alpha


#: The bytes one rank puts on the wire, as a fraction of ``nbytes``, for a group of n (the bandwidth
#: terms above): all-reduce 2(n − 1)/n, reduce-scatter, all-gather and all-to-all (n − 1)/n each.
_WIRE = {"all-reduce": 2.0, "reduce-scatter": 1.0, "all-gather": 1.0, "all-to-all": 1.0}


def wire_bytes(kind: str, n: int, nbytes: float) -> float:
    """Bytes each rank sends in one collective over n ranks (the numerators of the formulas above):
    all-reduce 2(n − 1)/n · nbytes; reduce-scatter, all-gather, all-to-all (n − 1)/n · nbytes;
    "p2p" nbytes. So reduce-scatter + all-gather of one buffer put exactly the all-reduce's bytes
    on the wire (sequence parallelism, Korthikanti et al. 2022 §4.2.2)."""
    if kind == "p2p":
        _check(1, nbytes, 1.0, 0.0)
        return float(nbytes)
    if kind not in _WIRE:
        raise ModelcutError(f"unknown collective {kind!r}; use {', '.join((*_WIRE, 'p2p'))}")
    _check(n, nbytes, 1.0, 0.0)
    return _WIRE[kind] * (n - 1) / n * nbytes


def all_to_all_two_level(n: int, nbytes: float, local: int, link_bw: float, net_bw: float,
                         alpha: float = 0.0) -> float:
    """All-to-all over n ranks of which ``local`` (this rank included) share its node: the
    (local − 1)/n of the buffer bound for node-mates crosses the node's links, the (n − local)/n
    bound for other nodes the network, both at once; the slower sets the time,
    max((local − 1)/n · nbytes/link_bw, (n − local)/n · nbytes/net_bw) + (n − 1)·α.
    ``local = 1`` is :func:`all_to_all` at ``net_bw``; ``local = n`` at ``link_bw``."""
    _check(n, nbytes, link_bw, alpha)
    _check(n, nbytes, net_bw, alpha)
    if isinstance(local, bool) or not isinstance(local, int) or not 1 <= local <= n:
        raise ModelcutError(f"ranks in a node must be between 1 and the group size {n}, got {local!r}")
    if n == 1:
        return 0.0
    inside = (local - 1) / n * nbytes / link_bw
    across = (n - local) / n * nbytes / net_bw
    return max(inside, across) + (n - 1) * alpha


# ---------------------------------------------------------------- which link a group uses
# One definition of "does a group cross nodes" and "how many of its members share a node":
# the device mesh's (:mod:`.mesh`, which also places ep where the layout's order names it).


def group_spans_nodes(layout: Layout | Mesh, dim: str | Iterable[str], gpus_per_node: int) -> bool:
    """Whether a group along ``dim`` (a name, or several names for a combined group such as
    ("cp", "dp")) has members in different nodes, with ranks numbered in ``layout.order``
    (:func:`.mesh.group_crosses_nodes`; a :class:`.mesh.Mesh` as given)."""
    dims = dim if isinstance(dim, str) else tuple(dim)
    if isinstance(layout, Mesh):
        return group_crosses_nodes(layout, dims, gpus_per_node)
    return _spans(_mesh_key(layout), dims, gpus_per_node)


@lru_cache(maxsize=8192)
def _mesh_key(layout: Layout) -> Layout:
    """The layout's sizes, rank order, shard groups and hierarchical cp groups only: what decides
    where groups sit (kept per layout: a search asks it of each candidate several times)."""
    return Layout(tp=layout.tp, cp=layout.cp, pp=layout.pp, dp=layout.dp, ep=layout.ep, etp=layout.etp,
                  order=layout.order, dp_shard=layout.dp_shard if layout.hybrid else None,
                  cp_kind="a2a+p2p" if layout.cp_a2a else None, cp_a2a=layout.cp_a2a)


@lru_cache(maxsize=8192)
def _spans(layout: Layout, dim, gpus_per_node: int) -> bool:
    return group_crosses_nodes(layout, dim, gpus_per_node)


def group_members_in_node(layout: Layout | Mesh, dim: str | Iterable[str], gpus_per_node: int) -> int:
    """How many members of a group along ``dim`` share a node with its first rank (rank 0's group;
    nodes are blocks of ``gpus_per_node`` consecutive ranks): :func:`.mesh.members_in_node`, for a
    layout kept per :func:`_mesh_key` as :func:`group_spans_nodes` keeps its answer."""
    if isinstance(layout, Mesh):
        return members_in_node(layout, dim, gpus_per_node)
    return _members(_mesh_key(layout), dim if isinstance(dim, str) else tuple(dim), gpus_per_node)


@lru_cache(maxsize=8192)
def _members(layout: Layout, dim, gpus_per_node: int) -> int:
    return members_in_node(layout, dim, gpus_per_node)


def collective_bandwidth(layout: Layout | Mesh, dim: str | Iterable[str], hw: Hardware, gpus_per_node: int, *,
                         multi_nic: bool = True) -> float:
    """Bus bandwidth per accelerator, each way, of a ring collective (all-reduce, reduce-scatter,
    all-gather) over a group along ``dim``.

    Inside a node: the node's links, ``link_bw``. Across nodes, with k members of the group in
    each node: NCCL runs the collective as several rings (channels), each entering and leaving
    every node once, and spreads the channels over the network ports of the k members, so the
    group's inter-node traffic uses k ports at once while its intra-node hops ride the links:
    min(link_bw, k · net_bw) (NCCL's developers measure an all-reduce bus bandwidth of 192 GB/s
    on DGX A100 nodes with 8 × 200 Gb/s InfiniBand, 8 × 25 GB/s less about 4 %: NVIDIA/nccl
    issue 812, comment by the NCCL team, quoted in issue 1576). k = 1 (tensor parallelism
    filling the node, each data-parallel group one member per node) gives ``net_bw``.
    ``multi_nic`` off: one port per member whatever k (a framework preset says which stack does
    that: the deepspeed-zero3 preset)."""
    if not group_spans_nodes(layout, dim, gpus_per_node):
        return hw.link_bw
    k = group_members_in_node(layout, dim, gpus_per_node) if multi_nic else 1
    return min(hw.link_bw, k * hw.net_bw)


def achievable(bw: float, hw: Hardware) -> float:
    """A bandwidth from :func:`group_bandwidth` or :func:`collective_bandwidth` at the share of
    line rate NCCL's tests reach on that kind of link: ``hw.link_busbw_frac`` when it is the
    node's links (``bw >= hw.link_bw``), ``hw.net_busbw_frac`` otherwise (figures and sources
    in the hardware catalog: NVLink loses about a fifth to NCCL's protocol, InfiniBand about
    4 %)."""
    return bw * (hw.link_busbw_frac if bw >= hw.link_bw else hw.net_busbw_frac)


def group_bandwidth(layout: Layout, dim: str | Iterable[str], hw: Hardware, gpus_per_node: int) -> float:
    """Bandwidth per accelerator each way for a group: the node's links when the group stays
    inside a node, the network otherwise (the slowest hop bounds a ring)."""
    return hw.net_bw if group_spans_nodes(layout, dim, gpus_per_node) else hw.link_bw


# ---------------------------------------------------------------- NCCL's latency, and each group's bandwidth

@dataclass(frozen=True)
class NcclTuner:
    """The latencies NCCL's own tuner charges (``src/graph/tuning.cc``: ``baseLat`` and ``hwLat``,
    µs, the Simple protocol of large messages), which change between releases; a stack runs
    the NCCL of its era (``Framework.nccl``, :data:`NCCL_TUNERS`).

    Ring (all-gather, reduce-scatter, all-reduce): ``latencies = baseLat + (nsteps −
    nInterSteps)·intraLat + nInterSteps·interLat``, nsteps = n − 1 and nInterSteps = nodes − 1
    for an all-gather or reduce-scatter (twice both for an all-reduce): ``ring_base`` and the
    per-step ``ring_nvlink``, ``ring_net``. Tree (all-reduce only): ``tree_base`` +
    2·((ppn − 1)·``tree_nvlink`` + ⌊log₂ nodes⌋·``tree_net``)."""

    ring_base: float
    ring_nvlink: float
    ring_net: float
    tree_base: float
    tree_nvlink: float
    tree_net: float


#: NCCL's tuner by release (NVIDIA/nccl ``src/graph/tuning.cc`` at each tag; Simple protocol):
#:
#: * "2.9": v2.8.4 … v2.11.4 (and v2.14 … v2.17): ring base 8.4, 3.4 per NVLink step, 9.6 per
#:   network step; tree no base, 28 per hop inside a node and 28 between nodes ("the latency a
#:   256kB chunk"). The release of the 2021-2022 runs.
#: * "2.18": v2.18.1 (2023-04-03) … v2.22.3: the network ring step 14.0; the tree as before.
#: * "2.23": v2.23.4 (2024-09-10) … v2.28: the ring as 2.18's; the tree 8.4 base, 4.0 per hop
#:   inside a node, 14 between nodes. (From v2.18.1 a ring across nodes also takes
#:   max(intraLat, 3 × the host's network overhead: 1.0 µs on Intel hosts, 2.0 on AMD) per step
#:   inside a node, which on Intel hosts leaves the 3.4 µs; modelcut keeps 3.4.)
#:
#: Documented figures, not fitted.
NCCL_TUNERS = {
    "2.9": NcclTuner(8.4e-6, 3.4e-6, 9.6e-6, 0.0, 28e-6, 28e-6),
    "2.18": NcclTuner(8.4e-6, 3.4e-6, 14.0e-6, 0.0, 28e-6, 28e-6),
    "2.23": NcclTuner(8.4e-6, 3.4e-6, 14.0e-6, 8.4e-6, 4.0e-6, 14.0e-6),
}
NCCL_2_9 = NCCL_TUNERS["2.9"]


def ring_alpha(n: int, members_per_node: int, tuner: NcclTuner = NCCL_2_9) -> float:
    """Per-step latency α of an n-rank ring with ``members_per_node`` ranks in each node, such
    that (n − 1)·α is NCCL's latency of one all-gather or reduce-scatter (:class:`NcclTuner`):
    α = (base + (n − nodes)·α_nvlink + (nodes − 1)·α_net)/(n − 1), nodes = ⌈n / members_per_node⌉.
    An all-reduce (2(n − 1) steps) pays it twice."""
    if n <= 1:
        return 0.0
    k = max(1, min(members_per_node, n))
    nodes = -(-n // k)
    return (tuner.ring_base + (n - nodes) * tuner.ring_nvlink + (nodes - 1) * tuner.ring_net) / (n - 1)


#: The tree's bus bandwidth over the ring's (NCCL ``src/graph/tuning.cc``, ``busBw*.92``, v2.8
#: to v2.28), which an all-reduce moves at half (``ratio = .5``, the algorithm bandwidth, against
#: the ring's n/(2(n − 1))).
NCCL_TREE_BW_FRAC = 0.92


def tree_allreduce(n: int, members_per_node: int, nbytes: float, bw: float, tuner: NcclTuner = NCCL_2_9) -> float:
    """NCCL's double-binary-tree all-reduce of ``nbytes`` over n ranks with ``members_per_node``
    in each node: base + 2·((ppn − 1)·α_nvlink + ⌊log₂ nodes⌋·α_net) + 2·nbytes/(0.92·bw)
    (:class:`NcclTuner`), ``bw`` the ring's bus bandwidth each way. The tree's latency grows with
    the logarithm of the nodes, the ring's with their number, so NCCL's tuner picks the tree for
    all-reduces over many nodes below some size (:func:`collective`)."""
    _check(n, nbytes, bw, 0.0)
    if n == 1:
        return 0.0
    k = max(1, min(members_per_node, n))
    nodes = -(-n // k)
    hops = (k - 1) * tuner.tree_nvlink + (nodes.bit_length() - 1) * tuner.tree_net
    return tuner.tree_base + 2 * hops + 2 * nbytes / (NCCL_TREE_BW_FRAC * bw)


#: The dimensions of the expert-data-parallel group: the ranks holding the same experts,
#: tp·cp·dp/(ep·etp) of them (Megatron-LM's expert data-parallel group; FSDP2 with expert
#: parallelism shards and reduces the experts over the same ranks).
EXPERT_DP = ("cp", "edp")


def expert_dp_size(layout: Layout) -> int:
    """Ranks of the expert-data-parallel group, tp·cp·dp/(ep·etp) (at least 1)."""
    etp = layout.etp or layout.tp
    return max(1, layout.tp * layout.cp * layout.dp // (layout.ep * etp))


#: Hybrid sharding's two groups (:attr:`..specs.Layout.dp_shard`) in :func:`hybrid_mesh`: the shard
#: group, dp_shard·cp ranks that split ZeRO's states, and the replica group, the dp/dp_shard ranks
#: holding the same shard.
SHARD = ("cp", "ep")
REPLICA = ("edp",)


@lru_cache(maxsize=1024)
def hybrid_mesh(layout: Layout) -> Mesh:
    """The mesh whose groups are hybrid sharding's: dp's inner dp_shard ranks carved out as the
    mesh's "ep" (innermost inside dp, as torchtitan's mesh [..., "dp_replicate", "dp_shard", "cp",
    "tp"] and Megatron-LM's distributed-optimizer instances of consecutive ranks place them), dp's
    outer dp/dp_shard as its "edp" (:data:`SHARD`, :data:`REPLICA`). A hybrid layout has no expert
    parallelism (:class:`..specs.Layout` refuses both)."""
    order = tuple(o for o in layout.order if o != "ep")
    return Mesh.build(layout.tp, layout.cp, layout.pp, layout.dp, layout.shard_dp, order)


@dataclass(frozen=True)
class RingGroup:
    """A group the data-parallel collectives run over, as :func:`collective` reads it: ``n`` ranks,
    ``per_node`` of them in a node, all in one node (``inside``) or not, NCCL's ring latency
    ``alpha`` a step and the bus bandwidth ``bw`` each way."""

    n: int
    per_node: int
    inside: bool
    alpha: float
    bw: float

    def time(self, kind: str, nbytes: float, hw: Hardware, net: float, tuner: NcclTuner = NCCL_2_9) -> float:
        return collective(kind, self.n, nbytes, self.bw, hw, self.alpha, self.inside, net, per_node=self.per_node,
                          tuner=tuner)


def ring_group(where: Layout | Mesh, dims: str | Iterable[str], n: int, bw: float, gpus_per_node: int,
               tuner: NcclTuner = NCCL_2_9) -> RingGroup:
    """The group of ``n`` ranks along ``dims`` of a layout (or mesh) as :func:`collective` reads it:
    its members in a node, whether it stays in one, :func:`ring_alpha` for that shape, and ``bw``."""
    k = group_members_in_node(where, dims, gpus_per_node)
    return RingGroup(n, k, not group_spans_nodes(where, dims, gpus_per_node), ring_alpha(n, k, tuner), bw)


def hybrid_groups(layout: Layout, bw: dict[str, float], gpus_per_node: int,
                  tuner: NcclTuner = NCCL_2_9) -> tuple[RingGroup, RingGroup]:
    """(shard, replica) groups of a hybrid layout (:func:`hybrid_mesh`), their bandwidths from
    :func:`group_bandwidths` (``bw["dp_shard"]``, ``bw["dp_replica"]``)."""
    mesh = hybrid_mesh(_mesh_key(layout))
    return (ring_group(mesh, SHARD, layout.shard_ranks, bw["dp_shard"], gpus_per_node, tuner),
            ring_group(mesh, REPLICA, layout.dp // layout.shard_dp, bw["dp_replica"], gpus_per_node, tuner))


def group_bandwidths(layout: Layout, hw: Hardware, gpus_per_node: int, multi_nic: bool = True) -> dict[str, float]:
    """Per-accelerator bandwidth each way of each group's traffic: tp, cp and pp exchanges are
    bounded by one hop (:func:`group_bandwidth`); the data-parallel collectives, and with ep > 1
    the expert-data-parallel ones ("edp", :data:`EXPERT_DP`), and with hybrid sharding its shard and
    replica groups ("dp_shard", "dp_replica", :func:`hybrid_mesh`), are rings over all the group's
    network ports (:func:`collective_bandwidth`); each at the share of line rate
    NCCL's own tests reach on that kind of link (:func:`achievable`). Computed once per layout
    shape (sizes, rank order and shard group)."""
    return dict(_bandwidths(_mesh_key(layout), hw, gpus_per_node, multi_nic))


@lru_cache(maxsize=4096)
def _bandwidths(layout: Layout, hw: Hardware, gpus_per_node: int, multi_nic: bool) -> dict[str, float]:
    out = {dim: achievable(group_bandwidth(layout, dim, hw, gpus_per_node), hw) for dim in ("tp", "cp", "pp")}
    out["dp"] = achievable(collective_bandwidth(layout, ("cp", "dp"), hw, gpus_per_node, multi_nic=multi_nic), hw)
    out["edp"] = (achievable(collective_bandwidth(layout, EXPERT_DP, hw, gpus_per_node, multi_nic=multi_nic), hw)
                  if layout.ep > 1 else out["dp"])
    if layout.hybrid:
        mesh = hybrid_mesh(layout)
        for key, dims in (("dp_shard", SHARD), ("dp_replica", REPLICA)):
            out[key] = achievable(collective_bandwidth(mesh, dims, hw, gpus_per_node, multi_nic=multi_nic), hw)
    return out


_RING = {"all-reduce": ring_allreduce, "reduce-scatter": reduce_scatter, "all-gather": all_gather,
         "all-to-all": all_to_all}


def size_efficiency(nbytes: float, hw: Hardware, bw: float) -> float:
    """The share of its bus bandwidth ``bw`` the network reaches for a collective of ``nbytes``
    (the whole buffer), S/(S + S½); 1 without a measurement. S½ is the measured half-bandwidth
    buffer (``hw.net_half_bytes``) at the bus bandwidth of the setup that measured it
    (``hw.net_half_bw``, which the catalog derives from that setup; without it S½ as measured),
    scaled to ``bw``: S½·bw/bw_measured. The ramp is then one time,
    S½/bw_measured (about 175 µs), whatever the group's bandwidth: the α of an α–β model, as
    NCCL's own tuner models it (a latency in µs plus bytes over bandwidth, ``src/graph/tuning.cc``).
    A group with one network port per member (tensor parallelism filling each node) reaches half
    its bandwidth at an eighth of the buffer that eight ports need."""
    half = hw.net_half_bytes
    if half > 0 and hw.net_half_bw > 0:
        half *= bw / hw.net_half_bw
    return nbytes / (nbytes + half) if half > 0 and nbytes > 0 else 1.0


def collective(kind: str, n: int, nbytes: float, bw: float, hw: Hardware, alpha: float = 0.0,
               inside: bool = False, net: float = 1.0, per_node: int | None = None,
               tuner: NcclTuner = NCCL_2_9) -> float:
    """One collective of ``kind`` over n ranks moving ``nbytes`` (the whole buffer, as nccl-tests
    counts it). Inside one node, the measured nccl-tests curve of the accelerator's architecture
    where it has one for n ranks (``hw.kernels.collectives``; a node whose links are slower than
    the measuring node's stretches the time above the latency floor by the ratio); otherwise the ring's α–β time at
    bandwidth ``bw`` (each way) times its size efficiency across nodes (:func:`size_efficiency`).
    ``net``: the share of the measured bandwidth sustained (the model's η_net). An all-reduce
    across nodes whose group's ``per_node`` members per node are given runs as NCCL picks it: the
    faster of its ring and its tree by NCCL's own model (:func:`tree_allreduce`; NCCL's tuner
    compares the two predicted times, ``ncclTopoTuneModel``), by the ``tuner`` of the stack's NCCL."""
    if n == 1:
        return 0.0
    curves = hw.kernels.collectives if hw.kernels is not None else None
    if inside and curves is not None:
        ref = hw.kernels.reference
        slower = ref.link_bw / hw.link_bw if ref is not None and ref.link_bw > 0 else 1.0
        t = curves.time(kind, n, nbytes, slower)
        if t is not None:
            return t / net
    eff = 1.0 if inside else size_efficiency(nbytes, hw, bw)
    t = _RING[kind](n, nbytes, bw * net * eff, alpha)
    if kind == "all-reduce" and not inside and per_node is not None:
        t = min(t, tree_allreduce(n, per_node, nbytes, bw * net * eff, tuner))
    return t
