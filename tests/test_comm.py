"""Collective costs (α–β) and which link a parallel group uses."""

import itertools

import pytest
from hypothesis import given, strategies as st

from modelcut import catalog
from modelcut.core.costs import comm
from modelcut.core.errors import ModelcutError
from modelcut.core.specs import DEFAULT_ORDER, Layout

LLAMA3 = ("tp", "cp", "pp", "dp")     # Llama 3's rank order (Grattafiori et al. 2024 §3.3.2)

sizes = st.integers(1, 4096)
nbytes = st.floats(0, 1e12)
bws = st.floats(1e6, 1e13)
alphas = st.floats(0, 1e-3)
COLLECTIVES = (comm.ring_allreduce, comm.reduce_scatter, comm.all_gather, comm.all_to_all)


@given(sizes, nbytes, bws, alphas)
def test_allreduce_is_reduce_scatter_plus_all_gather(n, b, bw, a):
    assert comm.ring_allreduce(n, b, bw, a) == pytest.approx(comm.reduce_scatter(n, b, bw, a) + comm.all_gather(n, b, bw, a))


@given(nbytes, bws, alphas)
def test_a_group_of_one_costs_nothing(b, bw, a):
    assert all(f(1, b, bw, a) == 0 for f in COLLECTIVES)


@given(sizes, nbytes, bws, bws, alphas)
def test_more_bandwidth_never_slower(n, b, bw1, bw2, a):
    lo, hi = sorted((bw1, bw2))
    for f in COLLECTIVES:
        assert f(n, b, hi, a) <= f(n, b, lo, a)
    assert comm.p2p(b, hi, a) <= comm.p2p(b, lo, a)


@given(st.integers(2, 4096), nbytes, bws, alphas)
def test_bandwidth_term_limits(n, b, bw, a):
    """Ring all-reduce moves 2(n − 1)/n of the buffer: above one buffer, below two; the latency term
    grows with the ring."""
    bw_only = comm.ring_allreduce(n, b, bw)
    assert b / bw - 1e-12 <= bw_only <= 2 * b / bw + 1e-12
    assert comm.ring_allreduce(n, b, bw, a) == pytest.approx(bw_only + 2 * (n - 1) * a, rel=1e-12)
    assert comm.ring_allreduce(n + 1, b, bw) >= bw_only


def test_tp_allreduce_of_the_deck():
    """18.4B: BF16 message of s·h = 2048·6144 at 300 GB/s over t = 8 with 5 µs steps: 70 µs of latency."""
    t = comm.ring_allreduce(8, 2048 * 6144 * 2, 300e9, 5e-6)
    assert t == pytest.approx(2 * 7 / 8 * 2048 * 6144 * 2 / 300e9 + 70e-6)


@pytest.mark.parametrize("bad", [dict(n=0), dict(b=-1), dict(bw=0), dict(a=-1e-6)])
def test_bad_arguments(bad):
    args = dict(n=4, b=1e6, bw=1e9, a=0.0) | bad
    with pytest.raises(ModelcutError):
        comm.ring_allreduce(args["n"], args["b"], args["bw"], args["a"])


def brute_spans(layout: Layout, dims: tuple[str, ...], g: int) -> bool:
    """Enumerate every rank and every group: rank = tp_i + tp·(cp_i + cp·(pp_i + pp·dp_i)) in Llama 3's
    order (ep inside dp), tp_i + tp·(cp_i + cp·(dp_i + dp·pp_i)) in the default (Megatron-core's), whose
    ep groups are its expert grid's."""
    order = ("tp", "cp", "pp", "dp")
    size = {d: getattr(layout, d) for d in order}
    llama = layout.order == LLAMA3
    if "ep" in dims and layout.ep > 1 and not llama:
        # Megatron-core's expert grid over each stage's tp·cp·dp ranks: etp innermost, then ep
        etp, stage = layout.etp or layout.tp, layout.tp * layout.cp * layout.dp
        eg: dict[tuple, set] = {}
        for rank in range(stage * layout.pp):
            j = rank % stage
            eg.setdefault((rank // stage, j % etp, j // (etp * layout.ep)), set()).add(rank // g)
        return any(len(nodes) > 1 for nodes in eg.values())
    groups: dict[tuple, set] = {}
    for idx in itertools.product(*(range(size[d]) for d in order)):
        i = dict(zip(order, idx))
        if llama:
            rank = i["tp"] + size["tp"] * (i["cp"] + size["cp"] * (i["pp"] + size["pp"] * i["dp"]))
        else:
            rank = i["tp"] + size["tp"] * (i["cp"] + size["cp"] * (i["dp"] + size["dp"] * i["pp"]))
        key = []
        for d in order:
            if d == "dp" and "ep" in dims:
                key.append(i["dp"] // layout.ep)
            elif d not in dims:
                key.append(i[d])
        groups.setdefault(tuple(key), set()).add(rank // g)
    return any(len(nodes) > 1 for nodes in groups.values())


dim = st.sampled_from([1, 2, 3, 4, 8])


@given(dim, dim, dim, dim, st.sampled_from([1, 2, 4]), st.sampled_from([1, 2, 4, 6, 8, 16]),
       st.sampled_from([("tp",), ("cp",), ("pp",), ("dp",), ("cp", "dp"), ("tp", "cp"), ("ep",)]),
       st.sampled_from([LLAMA3, DEFAULT_ORDER]))
def test_group_spans_nodes_matches_enumeration(tp, cp, pp, dp, ep, g, dims, order):
    if dp % ep:
        ep = 1
    L = Layout(tp=tp, cp=cp, pp=pp, dp=dp, ep=ep, order=order)
    assert comm.group_spans_nodes(L, dims, g) == brute_spans(L, dims, g)


def test_llama3_groups():
    """Llama 3's [TP, CP, PP, DP] on 8-GPU servers: TP inside a server, CP/PP/DP across servers."""
    L = Layout(tp=8, cp=16, pp=16, dp=8)
    assert not comm.group_spans_nodes(L, "tp", 8)
    assert all(comm.group_spans_nodes(L, d, 8) for d in ("cp", "pp", "dp"))
    h100 = catalog.hardware("h100")
    assert comm.group_bandwidth(L, "tp", h100, 8) == h100.link_bw
    assert comm.group_bandwidth(L, "pp", h100, 8) == h100.net_bw


def test_order_changes_the_link():
    inner_dp = Layout(tp=2, pp=2, dp=4, order=("dp", "tp", "cp", "pp"))
    assert not comm.group_spans_nodes(inner_dp, "dp", 4)
    assert comm.group_spans_nodes(Layout(tp=2, pp=2, dp=4), "dp", 4)


def test_bad_dimension_and_node_size():
    with pytest.raises(ModelcutError, match="unknown parallel dimension"):
        comm.group_spans_nodes(Layout(), "xp", 8)
    with pytest.raises(ModelcutError, match="gpus_per_node"):
        comm.group_spans_nodes(Layout(), "tp", 0)


def test_collective_bandwidth_uses_the_members_ports():
    """A data-parallel ring over whole nodes uses every member's network port (NCCL's rings:
    192 GB/s bus bandwidth on 8 × 25 GB/s DGX A100 nodes); one member per node uses one; inside
    a node, the links; one port per member when multi_nic is off."""
    a100 = catalog.hardware("a100")
    whole = Layout(tp=1, dp=64)                       # 8 nodes, 8 members in each
    half = Layout(tp=2, dp=32)                        # 4 members in each node
    one = Layout(tp=8, dp=8)                          # 1 member in each node
    inside = Layout(tp=1, dp=8)
    dp = ("cp", "dp")
    assert comm.collective_bandwidth(whole, dp, a100, 8) == min(a100.link_bw, 8 * a100.net_bw)
    assert comm.collective_bandwidth(half, dp, a100, 8) == 4 * a100.net_bw
    assert comm.collective_bandwidth(one, dp, a100, 8) == a100.net_bw
    assert comm.collective_bandwidth(inside, dp, a100, 8) == a100.link_bw
    assert comm.collective_bandwidth(whole, dp, a100, 8, multi_nic=False) == a100.net_bw


@given(st.sampled_from([1, 2, 4, 8]), st.sampled_from([2, 4, 8, 16, 32]))
def test_collective_bandwidth_between_one_port_and_the_links(tp, nodes):
    h100 = catalog.hardware("h100")
    lay = Layout(tp=tp, dp=8 * nodes // tp)
    bw = comm.collective_bandwidth(lay, ("cp", "dp"), h100, 8)
    assert h100.net_bw <= bw <= h100.link_bw
    assert bw == min(h100.link_bw, 8 // tp * h100.net_bw)


def test_experts_are_reduced_and_gathered_over_the_ranks_holding_them():
    """Routed experts' weights and gradients move over the expert-data-parallel group, the
    tp·cp·dp/(ep·etp) ranks holding the same experts, at that group's bandwidth: nothing when
    every rank's experts are its own (ep = dp); with ep filling a node, a group of one member per
    node on the network port alone, slower than the dense group's eight ports for the same bytes."""
    from modelcut.core.costs.kernels import Efficiency
    from modelcut.core.specs import Run, Training
    from modelcut.core.step.data_parallel import dp_collective
    hw = catalog.hardware("h100")
    model = catalog.model("qwen3-30b-a3b")
    eff = Efficiency(1.0, 1.0, 1.0)

    def coll(layout):
        run = Run(model, "h100-sxm5-80gb", layout, Training(seq_len=4096, global_batch=layout.dp, micro_batch=1),
                  gpus_per_node=8)
        return dp_collective(run, hw, eff, comm.group_bandwidths(layout, hw, 8))
    own = Layout(dp=8, ep=8, order=("tp", "cp", "ep", "dp", "pp"))
    assert comm.expert_dp_size(own) == 1
    assert coll(own)("reduce-scatter", 1e9, 5e9) == pytest.approx(coll(own)("reduce-scatter", 1e9))
    wide = Layout(dp=256, ep=8, order=("tp", "cp", "ep", "dp", "pp"))
    assert comm.expert_dp_size(wide) == 32
    assert comm.group_members_in_node(wide, comm.EXPERT_DP, 8) == 1
    bw = comm.group_bandwidths(wide, hw, 8)
    assert bw["edp"] < bw["dp"]
    c = coll(wide)
    experts = c("all-gather", 0.0, 4e9)
    assert experts > c("all-gather", 4e9) and experts > 0
    assert c("all-gather", 1e9, 4e9) == pytest.approx(c("all-gather", 1e9) + experts)
    dense = Layout(dp=256)
    assert comm.group_bandwidths(dense, hw, 8)["edp"] == comm.group_bandwidths(dense, hw, 8)["dp"]


# ---------------------------------------------------------------- NCCL's tree and the size ramp

def test_tree_latency_grows_with_the_log_of_the_nodes():
    """NCCL 2.8 tuning.cc, Tree/Simple: 2·((ppn − 1)·28 µs + ⌊log₂ nodes⌋·28 µs), no base latency;
    bandwidth 0.92 of the ring's bus bandwidth, at half of it for an all-reduce."""
    assert comm.tree_allreduce(1, 8, 1e9, 1e11) == 0.0
    assert comm.tree_allreduce(64, 8, 0.0, 1e11) == pytest.approx(2 * (7 + 3) * 28e-6)     # 8 nodes
    assert comm.tree_allreduce(512, 8, 0.0, 1e11) == pytest.approx(2 * (7 + 6) * 28e-6)    # 64 nodes
    assert comm.tree_allreduce(96, 1, 0.0, 1e11) == pytest.approx(2 * 6 * 28e-6)           # ⌊log₂ 96⌋ = 6
    assert comm.tree_allreduce(64, 8, 1e9, 1e11) - comm.tree_allreduce(64, 8, 0.0, 1e11) == \
        pytest.approx(2 * 1e9 / (0.92 * 1e11))


def test_nccl_picks_the_tree_for_all_reduces_over_many_nodes_and_the_ring_for_large_ones():
    """The all-reduce runs as the faster of NCCL's two models: over 64 nodes a 25 MB bucket (a
    ring of 511 steps pays ~2 ms of latency) goes by the tree; a 2 GB buffer and any collective
    inside two nodes stays on the ring; reduce-scatter and all-gather are rings only."""
    h100 = catalog.hardware("h100")
    bw = min(h100.link_bw, 8 * h100.net_bw) * h100.net_busbw_frac

    def both(n, k, size, kind="all-reduce"):
        a = comm.ring_alpha(n, k)
        return (comm.collective(kind, n, size, bw, h100, a), comm.collective(kind, n, size, bw, h100, a, per_node=k))

    ring, picked = both(512, 8, 25e6)
    assert picked < ring / 2
    assert picked == pytest.approx(comm.tree_allreduce(512, 8, 25e6, bw * comm.size_efficiency(25e6, h100, bw)))
    for n, size in ((16, 25e6), (16, 2e9), (512, 2e10)):
        ring, picked = both(n, 8, size)
        assert picked == ring
    for kind in ("reduce-scatter", "all-gather"):
        ring, picked = both(512, 8, 25e6, kind)
        assert picked == ring


@given(st.sampled_from([2, 8, 32, 96, 288, 1024]), st.sampled_from([1, 2, 4, 8]), st.floats(1e3, 1e10))
def test_picking_never_slows_an_all_reduce(n, k, size):
    h100 = catalog.hardware("h100")
    bw = min(h100.link_bw, k * h100.net_bw) * h100.net_busbw_frac
    a = comm.ring_alpha(n, k)
    assert comm.collective("all-reduce", n, size, bw, h100, a, per_node=k) <= comm.collective(
        "all-reduce", n, size, bw, h100, a)


def test_the_size_ramp_is_one_time_whatever_the_bandwidth():
    """S½ = 64 MiB was measured at the bus bandwidth modelcut gives 2 nodes × 8 H100 (384 GB/s):
    there the ramp is unchanged; a group with one port per member (48 GB/s) reaches half its
    bandwidth at an eighth of the buffer, so the extra time S½/bw is the same for both."""
    h100 = catalog.hardware("h100")
    full = min(h100.link_bw, 8 * h100.net_bw) * h100.net_busbw_frac
    assert full == pytest.approx(h100.net_half_bw)
    assert comm.size_efficiency(h100.net_half_bytes, h100, full) == pytest.approx(0.5)
    one = h100.net_bw * h100.net_busbw_frac
    assert comm.size_efficiency(h100.net_half_bytes / 8, h100, one) == pytest.approx(0.5)
    extra = [comm.reduce_scatter(16, s, b * comm.size_efficiency(s, h100, b)) - comm.reduce_scatter(16, s, b)
             for s, b in ((1e8, full), (1e8, one))]
    assert extra[0] == pytest.approx(extra[1])
    assert comm.size_efficiency(1e8, h100, full) == pytest.approx(1e8 / (1e8 + h100.net_half_bytes))   # as measured there
    assert catalog.hardware("a100").net_half_bw == h100.net_half_bw        # the A100 rows cite the same H100 sweep
    assert catalog.hardware("b200").net_half_bw == pytest.approx(384e9)    # its own: min(900, 8 x 50) GB/s at 0.96
    assert catalog.hardware("gb200").net_half_bw == catalog.hardware("b200").net_half_bw   # the B200's sweep


@given(n=st.integers(2, 4096), k=st.sampled_from([1, 2, 4, 8]))
def test_each_nccl_release_charges_its_own_tuner_latencies(n, k):
    """NCCL's tuner latencies by release (src/graph/tuning.cc at each tag): the network ring step
    is 9.6 µs up to 2.17 and 14 µs from 2.18.1; the tree's hops 28 µs up to 2.22, then 4 µs inside
    a node and 14 µs between, with an 8.4 µs base. A ring never gets cheaper from 2.9 to 2.18, and
    the two agree inside one node."""
    nodes = -(-n // k)
    t9, t18, t23 = (comm.NCCL_TUNERS[v] for v in ("2.9", "2.18", "2.23"))
    for tuner, net in ((t9, 9.6e-6), (t18, 14e-6), (t23, 14e-6)):
        assert (n - 1) * comm.ring_alpha(n, k, tuner) == pytest.approx(8.4e-6 + (n - nodes) * 3.4e-6 + (nodes - 1) * net)
    assert comm.ring_alpha(n, k, t18) >= comm.ring_alpha(n, k, t9)
    if nodes == 1:
        assert comm.ring_alpha(n, k, t18) == pytest.approx(comm.ring_alpha(n, k, t9))
    hops = (min(k, n) - 1, nodes.bit_length() - 1)
    assert comm.tree_allreduce(n, k, 0.0, 1e11, t23) == pytest.approx(8.4e-6 + 2 * (hops[0] * 4e-6 + hops[1] * 14e-6))
    assert comm.tree_allreduce(n, k, 0.0, 1e11, t18) == pytest.approx(2 * (hops[0] + hops[1]) * 28e-6)


def test_every_stack_names_an_nccl_release_of_its_era():
    """The 2021-2022 stacks pay NCCL 2.9's latencies, the ones of 2023 to mid-2024 2.18's, and
    those from late 2024 on 2.23's (catalog/frameworks.toml, each with its reason)."""
    from modelcut.core.step.frameworks import Framework
    assert {catalog.framework(n).nccl for n in ("megatron-2021", "megatron-2021-torch-ddp", "megatron-2022",
                                                "deepspeed-zero3", "megatron-deepspeed")} == {"2.9"}
    assert {catalog.framework(n).nccl for n in ("megatron-core", "nemo", "llama3")} == {"2.18"}
    assert {catalog.framework(n).nccl for n in ("megatron-bridge", "fsdp", "torchtitan", "nemo-automodel")} == {"2.23"}
    assert catalog.framework("nemo").nccl_tuner is comm.NCCL_TUNERS["2.18"]
    with pytest.raises(ModelcutError, match="nccl must be one of"):
        Framework(name="x", overlap=catalog.framework("nemo").overlap, attention="auto", grad_accum_fusion=True,
                  cross_entropy="fused", grad_bytes=2, nccl="2.4")
