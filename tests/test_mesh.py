"""The device mesh: rank ↔ coordinates, groups, which groups leave a node."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings, strategies as st

from modelcut.cli import main
from modelcut.core.costs import comm
from modelcut.core.errors import ModelcutError
from modelcut.core.costs.mesh import (DIMS, MEGATRON_ORDER, Mesh, crossing_fraction, dims_in_node, expert_grid_applies,
                                expert_mesh, group_crosses_nodes, members_in_node, node_ranks, nodes_spanned,
                                parse_order)
from modelcut.core.specs import DEFAULT_ORDER, Layout

sizes = st.sampled_from([1, 2, 3, 4, 8])


@st.composite
def meshes(draw):
    tp, cp, pp, dp = (draw(sizes) for _ in range(4))
    order = draw(st.permutations(DIMS))
    ep = draw(st.sampled_from([e for e in (1, 2, 4) if dp % e == 0]))
    return Mesh.build(tp, cp, pp, dp, ep, order)


@settings(max_examples=80, deadline=None)
@given(meshes(), st.data())
def test_rank_coords_round_trip_and_groups(m, data):
    r = data.draw(st.integers(0, m.world - 1))
    c = m.coords(r)
    assert m.rank(**{k: c[k] for k in DIMS}) == r
    for d in (*DIMS, "ep"):
        g = m.group(r, d)
        assert len(g) == m.size(d) and r in g
        others = [k for k in DIMS if k != d] if d != "ep" else [k for k in DIMS if k != "dp"]
        for q in g:
            cq = m._all_coords(q)
            assert all(cq[k] == m._all_coords(r)[k] for k in others)
            if d == "ep":
                assert cq["edp"] == m._all_coords(r)["edp"]


def test_default_order_formula():
    """The default (Megatron-core's, the pipeline outermost): rank = tp_i + tp·(cp_i + cp·(dp_i + dp·pp_i));
    Llama 3's [tp, cp, pp, dp]: rank = tp_i + tp·(cp_i + cp·(pp_i + pp·dp_i))."""
    m = Mesh.build(8, 2, 16, 4)
    llama = Mesh.build(8, 2, 16, 4, order=DIMS)
    assert m.order == DEFAULT_ORDER == Layout().order
    for r in (0, 1, 7, 8, 15, 16, 255, 256, 1000, m.world - 1):
        c = m.coords(r)
        assert r == c["tp"] + 8 * (c["cp"] + 2 * (c["dp"] + 4 * c["pp"]))
        c = llama.coords(r)
        assert r == c["tp"] + 8 * (c["cp"] + 2 * (c["pp"] + 16 * c["dp"]))


@settings(max_examples=80, deadline=None)
@given(meshes(), st.sampled_from([1, 2, 4, 6, 8]))
def test_crossing_is_exact_and_agrees_with_comm(m, gpn):
    lay = Layout(tp=m.size("tp"), cp=m.size("cp"), pp=m.size("pp"), dp=m.size("dp"), ep=m.ep, order=m.order)
    for d in (*DIMS, "ep", ("cp", "dp")):
        brute = [len({r // gpn for r in g}) > 1 for g in m.groups(d)]
        assert group_crosses_nodes(m, d, gpn) == any(brute)
        assert crossing_fraction(m, d, gpn) == pytest.approx(sum(brute) / len(brute))
        assert group_crosses_nodes(lay, d, gpn) == comm.group_spans_nodes(lay, d, gpn)


def test_llama3_published_mesh():
    """Llama 3 405B, 8,192 GPUs: tp 8 fills a node; pp and dp cross nodes."""
    m = Mesh.build(8, 1, 16, 64, order=DIMS)
    assert dims_in_node(m, 8) == {"tp": "inside", "pp": "across", "dp": "across"}
    node = node_ranks(m, 3, 8)
    assert [r for r, _ in node] == list(range(24, 32))
    assert {c["pp"] for _, c in node} == {3} and [c["tp"] for _, c in node] == list(range(8))


def test_order_changes_what_stays_inside():
    inner_dp = Mesh.build(2, 1, 4, 4, order=("dp", "tp", "cp", "pp"))
    assert dims_in_node(inner_dp, 8) == {"tp": "inside", "pp": "across", "dp": "inside"}


@pytest.mark.parametrize("kw, needle", [
    (dict(order=("tp", "pp", "dp")), "order"),
    (dict(order=("tp", "cp", "pp", "xx")), "order names"),
    (dict(dp=3, ep=2), "ep"),
    (dict(tp=0), "positive"),
])
def test_bad_mesh(kw, needle):
    base = dict(tp=2, cp=1, pp=2, dp=2)
    base.update(kw)
    with pytest.raises(ModelcutError, match=needle):
        Mesh.build(**base)


def test_bad_rank_and_coords():
    m = Mesh.build(2, 1, 2, 2)
    with pytest.raises(ModelcutError):
        m.coords(8)
    with pytest.raises(ModelcutError):
        m.rank(tp=2)
    with pytest.raises(ModelcutError):
        group_crosses_nodes(m, "tp", 0)


def test_cli_json(capsys):
    args = ["mesh", "--tp", "8", "--cp", "1", "--pp", "16", "--dp", "64", "--gpus-per-node", "8", "--rank", "1234"]
    assert main([*args, "--order", "tp,cp,pp,dp", "--json"]) == 0      # Llama 3's order
    out = json.loads(capsys.readouterr().out)
    assert out["world"] == 8192 and out["coords"] == {"tp": 2, "cp": 0, "pp": 10, "dp": 9}
    by = {g["dim"]: g for g in out["groups"]}
    assert by["tp"]["crosses_nodes"] is False and by["pp"]["crosses_nodes"] is True
    assert by["pp"]["peers"] == [1154 + 8 * i for i in range(16)]
    assert len(out["node_ranks"]) == 8
    assert main([*args, "--json"]) == 0                                 # the default: the pipeline outermost
    out = json.loads(capsys.readouterr().out)
    assert out["order"] == list(DEFAULT_ORDER) and out["coords"] == {"tp": 2, "cp": 0, "pp": 2, "dp": 26}
    by = {g["dim"]: g for g in out["groups"]}
    assert by["pp"]["peers"] == [210 + 512 * i for i in range(16)] and by["dp"]["stride"] == 8


def test_cli_text_and_errors(capsys):
    assert main(["mesh", "--tp", "8", "--pp", "2", "--dp", "2", "--ep", "2"]) == 0
    text = capsys.readouterr().out
    assert "inside one node: tp" in text and "GPU 7" in text
    assert main(["mesh", "--tp", "8", "--rank", "9"]) == 2
    assert "rank" in capsys.readouterr().err


# ---------------------------------------------------------------- ep placed by the order


@st.composite
def ep_meshes(draw):
    """Meshes whose order may name ep anywhere (or not at all: ep innermost in dp)."""
    tp, cp, pp = (draw(sizes) for _ in range(3))
    ep = draw(st.sampled_from([1, 2, 4]))
    dp = ep * draw(st.sampled_from([1, 2, 3]))
    names = list(DIMS) + (["ep"] if draw(st.booleans()) else [])
    return Mesh.build(tp, cp, pp, dp, ep, draw(st.permutations(names)))


def brute_rank(m: Mesh, c: dict) -> int:
    """Rank from coordinates by the definition: along the order, innermost first; dp_i = ep_i + ep·edp_i
    with ep_i where the order names ep (else just inside dp)."""
    idx = {"tp": c["tp"], "cp": c["cp"], "pp": c["pp"], "ep": c["dp"] % m.ep, "edp": c["dp"] // m.ep}
    seq = []
    for n in m.order:
        if n == "dp":
            seq += [("edp", m.size("dp") // m.ep)] if "ep" in m.order else [("ep", m.ep), ("edp", m.size("dp") // m.ep)]
        elif n == "ep":
            seq.append(("ep", m.ep))
        else:
            seq.append((n, m.size(n)))
    r, acc = 0, 1
    for n, s in seq:
        r += idx[n] * acc
        acc *= s
    return r


@settings(max_examples=80, deadline=None)
@given(ep_meshes(), st.sampled_from([1, 2, 4, 6, 8]), st.data())
def test_ep_in_the_order_round_trip_groups_and_crossing(m, gpn, data):
    r = data.draw(st.integers(0, m.world - 1))
    c = m.coords(r)
    assert brute_rank(m, c) == r and m.rank(**{k: c[k] for k in DIMS}) == r
    lay = Layout(tp=m.size("tp"), cp=m.size("cp"), pp=m.size("pp"), dp=m.size("dp"), ep=m.ep, order=m.order)
    for d in (*DIMS, "ep", ("cp", "dp")):
        g = m.group(r, d)
        fixed = [k for k in ("tp", "cp", "pp", "ep", "edp") if k not in ({d} if isinstance(d, str) else set(d))
                 and not (k in ("ep", "edp") and "dp" in ((d,) if isinstance(d, str) else d))]
        mine = m._all_coords(r)
        assert all(all(m._all_coords(q)[k] == mine[k] for k in fixed) for q in g)
        brute = [len({q // gpn for q in grp}) > 1 for grp in m.groups(d)]
        assert group_crosses_nodes(m, d, gpn) == any(brute)
        assert crossing_fraction(m, d, gpn) == pytest.approx(sum(brute) / len(brute))
        first = m.group(0, d)
        assert members_in_node(m, d, gpn) == sum(1 for q in first if q // gpn == 0)
        # a layout's ep groups are its expert grid's where that holds them, else the mesh's
        ref = expert_mesh(lay) if d == "ep" else m
        assert comm.group_spans_nodes(lay, d, gpn) == any(len({q // gpn for q in grp}) > 1 for grp in ref.groups(d))
        assert comm.group_members_in_node(lay, d, gpn) == sum(1 for q in ref.group(0, d) if q // gpn == 0)


def test_megatron_order_formula_and_text():
    """Megatron-core's default order tp-cp-ep-dp-pp: rank = tp_i + tp·(cp_i + cp·(ep_i + ep·(edp_i + edp·pp_i)))."""
    assert parse_order("tp-cp-ep-dp-pp") == MEGATRON_ORDER == parse_order(["tp", "cp", "ep", "dp", "pp"])
    m = Mesh.build(2, 2, 4, 8, 4, MEGATRON_ORDER)
    for r in range(0, m.world, 7):
        c = m.coords(r)
        assert r == c["tp"] + 2 * (c["cp"] + 2 * (c["ep"] + 4 * (c["edp"] + 2 * c["pp"])))
        assert c["dp"] == c["ep"] + 4 * c["edp"]
    assert m.stride("ep") == 4 and m.stride("edp") == 16 and m.stride("pp") == 32 and m.stride("dp") == 4


def test_deepseek_v3_ep_group_follows_the_order():
    """DeepSeek-V3-shaped: 2,048 GPUs, pp 16, ep 64 (dp 128). Megatron-core's order keeps eight ep
    ranks in each node (ep inside the pipeline); Llama 3's [tp, cp, pp, dp] puts the 16 pipeline
    stages between them, one ep rank a node."""
    meg = Mesh.build(pp=16, dp=128, ep=64, order=MEGATRON_ORDER)
    llama = Mesh.build(pp=16, dp=128, ep=64, order=DIMS)
    assert members_in_node(meg, "ep", 8) == 8 and members_in_node(llama, "ep", 8) == 1
    assert meg.group(9, "ep") == list(range(64)) and nodes_spanned(meg, 9, "ep", 8) == 8
    assert nodes_spanned(llama, 0, "ep", 8) == 64
    assert dims_in_node(meg, 8)["pp"] == "across"


@pytest.mark.parametrize("order, needle", [
    (("tp", "cp", "ep", "ep", "dp", "pp"), "ep at most once"),
    ("tp-cp-ep-pp", "once each"),
    ("tp,cp,xp,dp,pp", "order names"),
])
def test_bad_orders(order, needle):
    with pytest.raises(ModelcutError, match=needle):
        Mesh.build(2, 1, 2, 4, 2, order)


def test_cli_ep_default_is_megatron_order(capsys):
    assert main(["mesh", "--pp", "16", "--dp", "128", "--ep", "64", "--rank", "9", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["order"] == list(MEGATRON_ORDER)
    by = {g["dim"]: g for g in out["groups"]}
    assert by["ep"]["peers"] == list(range(64)) and by["ep"]["nodes"] == 8
    assert out["coords"] == {"tp": 0, "cp": 0, "pp": 0, "dp": 9, "etp": 0, "ep": 9, "edp": 0}
    assert out["experts"] == {"grid": "megatron-core", "etp": 1, "ep": 64, "edp": 2}
    assert main(["mesh", "--pp", "16", "--dp", "128", "--ep", "64", "--order", "tp,cp,pp,dp", "--json"]) == 0
    by = {g["dim"]: g for g in json.loads(capsys.readouterr().out)["groups"]}
    assert by["ep"]["stride"] == 16 and by["ep"]["nodes"] == 64
    assert main(["mesh", "--pp", "16", "--dp", "128", "--ep", "64"]) == 0
    assert "experts: etp 1 × ep 64 × edp 2" in " ".join(capsys.readouterr().out.split())
    assert main(["mesh", "--pp", "16", "--dp", "128", "--ep", "64", "--order", "tp,cp,pp,dp"]) == 0
    assert "dp 128 = ep 64 × edp 2" in capsys.readouterr().out
    assert main(["mesh", "--dp", "4", "--ep", "2", "--order", "tp,ep,ep,cp,pp,dp"]) == 2
    assert "ep at most once" in capsys.readouterr().err


def mcore_expert_groups(tp, cp, pp, dp, ep, etp):
    """Megatron-core's expert groups by its own construction (parallel_state.py's second
    RankGenerator over tp·cp·dp ranks a stage, pp-last order): rank = etp_i + etp·(ep_i + ep·(edp_i
    + edp·pp_i)); returns (ep groups, expert-data-parallel groups)."""
    stage = tp * cp * dp
    edp = stage // (ep * etp)
    world = stage * pp
    coords = {r: (r % etp, (r // etp) % ep, (r // (etp * ep)) % edp, r // stage) for r in range(world)}
    def groups(free):
        out = {}
        for r, c in coords.items():
            key = tuple(v for i, v in enumerate(c) if i != free)
            out.setdefault(key, []).append(r)
        return sorted(sorted(g) for g in out.values())
    return groups(1), groups(2)


@settings(max_examples=80, deadline=None)
@given(tp=sizes, cp=sizes, pp=st.sampled_from([1, 2, 3]), dp=sizes, data=st.data(),
       gpn=st.sampled_from([1, 2, 4, 8]))
def test_the_expert_grid_is_megatron_cores(tp, cp, pp, dp, data, gpn):
    """Over Megatron-core's default order the expert-parallel and expert-data-parallel groups are
    the ones its second rank generator builds, for any etp and any ep with ep·etp dividing
    tp·cp·dp (ep may exceed dp); the dense groups stay the layout's."""
    stage = tp * cp * dp
    etp = data.draw(st.sampled_from([e for e in (1, 2, 4, 8) if stage % e == 0]))
    ep = data.draw(st.sampled_from([e for e in range(2, 17) if stage % (e * etp) == 0] or [1]))
    lay = Layout(tp=tp, cp=cp, pp=pp, dp=dp, ep=ep, etp=etp)
    if ep == 1:
        assert not expert_grid_applies(lay)
        return
    assert expert_grid_applies(lay)
    em = expert_mesh(lay)
    ep_groups, edp_groups = mcore_expert_groups(tp, cp, pp, dp, ep, etp)
    assert em.groups("ep") == ep_groups and em.groups(comm.EXPERT_DP) == edp_groups
    assert comm.expert_dp_size(lay) == len(edp_groups[0])
    assert comm.group_members_in_node(lay, "ep", gpn) == sum(1 for r in ep_groups[0] if r // gpn == 0)
    assert comm.group_spans_nodes(lay, "ep", gpn) == any(len({r // gpn for r in g}) > 1 for g in ep_groups)
    dense = Mesh.build(tp, cp, pp, dp)
    assert comm.group_members_in_node(lay, ("cp", "dp"), gpn) == members_in_node(dense, ("cp", "dp"), gpn)


def test_with_etp_tp_and_no_cp_the_expert_grid_is_ep_carved_from_dp():
    for tp, dp, ep in ((1, 16, 8), (2, 8, 4), (4, 16, 16), (8, 64, 8)):
        lay = Layout(tp=tp, pp=2, dp=dp, ep=ep)
        legacy = Mesh.build(tp=tp, pp=2, dp=dp, ep=ep)
        assert expert_mesh(lay).groups("ep") == legacy.groups("ep")
        assert expert_mesh(lay).groups(comm.EXPERT_DP) == legacy.groups(comm.EXPERT_DP)


def test_experts_over_tensor_parallel_ranks_stay_in_the_node():
    """tp 4 with etp 1 and ep 8 over dp 8: Megatron-core's ep group is eight consecutive ranks, one
    node; ep may exceed dp (ep 32 over tp 2 · dp 16 spans four nodes); another rank order carves ep
    from dp and must divide it."""
    assert comm.group_members_in_node(Layout(tp=4, dp=8, ep=8, etp=1), "ep", 8) == 8
    assert comm.group_members_in_node(Layout(tp=4, dp=8, ep=8), "ep", 8) == 2        # etp = tp: every 4th rank
    wide = Layout(tp=2, pp=8, dp=16, ep=32, etp=1)
    assert comm.group_spans_nodes(wide, "ep", 8) and comm.group_members_in_node(wide, "ep", 8) == 8
    assert comm.expert_dp_size(wide) == 1
    with pytest.raises(ModelcutError, match=r"ep × etp \(32 × 2\) must divide tp × cp × dp \(32\)"):
        expert_mesh(Layout(tp=2, pp=8, dp=16, ep=32))
    with pytest.raises(ModelcutError, match=r"ep \(32\) must divide dp \(16\)"):
        comm.group_members_in_node(Layout(tp=2, pp=8, dp=16, ep=32, etp=1, order=("tp", "cp", "pp", "dp")), "ep", 8)


def test_cli_mesh_shows_the_step_models_expert_grid(capsys):
    """ep 32 over tp 2 · dp 16 with etp 1 (Megatron-Bridge's Qwen3 235B): the mesh command lays the ep
    group as the step model does, 32 consecutive ranks over four nodes; without --etp (etp = tp) it
    is a one-line refusal, and --etp with another rank order too."""
    assert main(["mesh", "--tp", "2", "--pp", "8", "--dp", "16", "--ep", "32", "--etp", "1", "--rank", "3",
                 "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    by = {g["dim"]: g for g in out["groups"]}
    assert by["ep"]["peers"] == list(range(32)) and by["ep"]["nodes"] == 4 and out["dims"]["ep"] == "across"
    assert out["coords"]["ep"] == 3 and out["coords"]["etp"] == 0 and by["tp"]["peers"] == [2, 3]
    lay = Layout(tp=2, pp=8, dp=16, ep=32, etp=1)
    assert by["ep"]["nodes"] == len({r // 8 for r in expert_mesh(lay).group(3, "ep")})
    assert main(["mesh", "--tp", "2", "--pp", "8", "--dp", "16", "--ep", "32"]) == 2
    err = capsys.readouterr().err
    assert "ep × etp (32 × 2) must divide tp × cp × dp (32)" in err and len(err.strip().splitlines()) == 1
    assert main(["mesh", "--tp", "2", "--dp", "8", "--ep", "4", "--etp", "1", "--order", "tp,cp,pp,dp"]) == 2
    assert "the experts are carved from dp there" in capsys.readouterr().err
    assert main(["mesh", "--tp", "2", "--dp", "8", "--etp", "1"]) == 2
    assert "etp (expert tensor parallelism) needs ep > 1" in capsys.readouterr().err


# ---------------------------------------------------------------- hierarchical context parallelism


@st.composite
def hierarchical_meshes(draw):
    tp, pp, dp = draw(sizes), draw(st.sampled_from([1, 2, 3])), draw(st.sampled_from([1, 2, 4]))
    cp = draw(st.sampled_from([4, 6, 8, 12, 16]))
    a2a = draw(st.sampled_from([a for a in range(2, cp) if cp % a == 0]))
    ep = draw(st.sampled_from([e for e in (1, 2) if dp % e == 0]))
    return Mesh.build(tp, cp, pp, dp, ep, draw(st.permutations(DIMS)), cp_a2a=a2a)


@settings(max_examples=80, deadline=None)
@given(hierarchical_meshes(), st.sampled_from([1, 2, 4, 8]), st.data())
def test_hierarchical_cp_groups_are_megatrons(m, gpn, data):
    """Megatron-LM's create_hierarchical_groups over a cp group's ranks R (by cp index) with the sizes
    [A, cp/A]: the all-to-all groups R[k·A : (k+1)·A], the ring groups R[j::A]; each rank's indices
    cp mod A and cp // A; the cp group is still the two levels' union; crossing exact."""
    a, cp = m.cp_a2a, m.size("cp")
    r = data.draw(st.integers(0, m.world - 1))
    R = m.group(r, "cp")
    R = sorted(R, key=lambda q: m.coords(q)["cp"])
    c = m.coords(r)
    assert (c["cp_a2a"], c["cp_ring"]) == (c["cp"] % a, c["cp"] // a)
    k, j = c["cp"] // a, c["cp"] % a
    assert m.group(r, "cp_a2a") == sorted(R[k * a:(k + 1) * a])
    assert m.group(r, "cp_ring") == sorted(R[j::a])
    assert set(m.group(r, "cp_a2a")) & set(m.group(r, "cp_ring")) == {r}
    assert m.size("cp_ring") == cp // a and len(m.group(r, "cp_ring")) == cp // a
    for d in ("cp_a2a", "cp_ring", "cp"):
        brute = [len({q // gpn for q in g}) > 1 for g in m.groups(d)]
        assert group_crosses_nodes(m, d, gpn) == any(brute)
        assert crossing_fraction(m, d, gpn) == pytest.approx(sum(brute) / len(brute))
    first = m.group(0, "cp_a2a")
    assert members_in_node(m, "cp_a2a", gpn) == sum(q // gpn == 0 for q in first)


def test_hierarchical_layout_lays_the_step_models_groups():
    """A layout's hierarchical cp groups, as the step model reads them (comm.group_members_in_node):
    tp 2, cp 16 with all-to-all groups of 4 on 8-GPU nodes puts each all-to-all group in one node
    and runs each ring over 4 nodes."""
    lay = Layout(tp=2, cp=16, cp_kind="a2a+p2p", cp_a2a=4)
    assert comm.group_members_in_node(lay, "cp_a2a", 8) == 4
    assert not comm.group_spans_nodes(lay, "cp_a2a", 8) and comm.group_spans_nodes(lay, "cp_ring", 8)
    assert Mesh.of(lay).group(5, "cp_ring") == [5, 13, 21, 29]
    assert Mesh.of(Layout(tp=2, cp=16)).cp_a2a == 1


@pytest.mark.parametrize("a2a", [0, 3, 16])
def test_bad_hierarchical_mesh(a2a):
    with pytest.raises(ModelcutError, match="cp_a2a"):
        Mesh.build(1, 16, 1, 1, cp_a2a=a2a)


def test_cli_hierarchical_groups(capsys):
    assert main(["mesh", "--cp", "16", "--dp", "2", "--cp-a2a", "8", "--rank", "5", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["coords"] == {"tp": 0, "cp": 5, "pp": 0, "dp": 0, "cp_a2a": 5, "cp_ring": 0}
    by = {g["dim"]: g for g in out["groups"]}
    assert by["cp_a2a"]["peers"] == list(range(8)) and not by["cp_a2a"]["crosses_nodes"]
    assert by["cp_ring"]["peers"] == [5, 13] and by["cp_ring"]["crosses_nodes"]
    assert out["dims"]["cp_a2a"] == "inside" and out["dims"]["cp_ring"] == "across"
    assert [row["cp_ring"] for row in out["node_ranks"]] == [0] * 8
    assert main(["mesh", "--cp", "16", "--dp", "2", "--cp-a2a", "8", "--rank", "5"]) == 0
    text = capsys.readouterr().out
    assert "cp_ring" in text and "inside one node: cp_a2a" in text
    assert main(["mesh", "--cp", "16", "--cp-a2a", "3"]) == 2
    err = capsys.readouterr().err
    assert "cp_a2a" in err and len(err.strip().splitlines()) == 1
    assert main(["mesh", "--cp", "16", "--cp-a2a", "0"]) == 2
    assert "--cp-a2a" in capsys.readouterr().err
