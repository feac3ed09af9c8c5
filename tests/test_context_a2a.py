"""All-to-all (Ulysses) context parallelism, ``cp_kind = "a2a"`` (core/costs/context.py): the same
attention work as the other forms, four exposed all-to-alls a pass with the bytes each tensor has,
the reorders around them, the heads' split refused in one line where it cannot be made, and the
stacks that run it (Megatron-core's family) told from those that do not."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings, strategies as st

from modelcut.catalog import model as catalog_model
from modelcut.core.costs import comm, context
from modelcut.core.errors import ModelcutError
from modelcut.core.memory import activations
from modelcut.core.specs import Layout

RUN = """[model]
name = "{model}"
[hardware]
gpu = "h100"
gpus = {gpus}
[layout]
tp = {tp}
cp = {cp}
dp = {dp}
cp_kind = "{kind}"
[training]
seq_len = 131072
global_batch = {dp}
recompute = "full"
[settings]
framework = "{framework}"
"""


def _predict(tmp_path, capsys, **kw):
    from modelcut.cli import main
    args = dict(model="llama3-8b", gpus=16, tp=1, cp=8, dp=2, kind="a2a", framework="megatron-core") | kw
    f = tmp_path / "run.toml"
    f.write_text(RUN.format(**args))
    rc = main(["predict", str(f), "--json"])
    out = capsys.readouterr()
    return rc, (json.loads(out.out) if rc == 0 else out.err)


@pytest.mark.parametrize("name", ["a2a", "ulysses", "all-to-all", "A2A"])
def test_the_names_of_the_all_to_all_form(name):
    assert context.cp_kind_name(name) == "a2a"


def test_a2a_predicts_and_its_names_agree(tmp_path, capsys):
    rc, a = _predict(tmp_path, capsys)
    assert rc == 0 and a["layout"]["cp_kind"] == "a2a" and a["breakdown"]["cp_s"] > 0
    rc, u = _predict(tmp_path, capsys, kind="ulysses")
    assert rc == 0 and u["step_time_s"] == a["step_time_s"]
    rc, r = _predict(tmp_path, capsys, kind="ring")
    assert rc == 0 and r["step_time_s"] != a["step_time_s"]
    # the same work, counted the same way, whatever the form
    assert r["flops_per_step"] == a["flops_per_step"] and r["mfu"] == pytest.approx(a["mfu"] * a["step_time_s"] / r["step_time_s"])


@pytest.mark.parametrize("model, tp, cp, says", [("llama3-8b", 4, 8, "KV heads per tensor-parallel rank (2)"),
                                                 ("llama3-8b", 1, 16, "KV heads per tensor-parallel rank (8)"),
                                                 ("gpt3-175b", 8, 8, "heads per tensor-parallel rank (12)")])
def test_heads_that_do_not_split_are_refused_in_one_line(tmp_path, capsys, model, tp, cp, says):
    rc, err = _predict(tmp_path, capsys, model=model, tp=tp, cp=cp, dp=1, gpus=tp * cp)
    assert rc == 2 and err.count("\n") == 1 and says in err and "a2a" in err and "Traceback" not in err


def test_a_stack_on_pytorchs_context_parallelism_refuses_it(tmp_path, capsys):
    rc, err = _predict(tmp_path, capsys, framework="fsdp-compile")
    assert rc == 2 and err.count("\n") == 1 and "ring or an all-gather" in err


def test_nemo_2407_cannot_run_it_and_says_so(tmp_path, capsys):
    rc, out = _predict(tmp_path, capsys, framework="nemo-24.07")
    assert rc == 0 and any("a2a form of context parallelism" in n for n in out["notes"])


def test_the_forward_exchanges_each_tensor_once():
    """Q, K, V then the output forward; dO then dQ, dK, dV backward; each rank's share of each."""
    m = catalog_model("llama3-8b")
    b, s, cp, t = 1, 131072, 8, 1
    rows = b * s / cp
    q, kv = rows * m.heads * m.d_head * 2, rows * m.kv_heads * m.d_head * 2
    fwd, bwd = context.a2a_tensors(m, b, s, cp, t)
    assert fwd == ((q, kv, kv), (q,)) and bwd == ((q,), (q, kv, kv))
    att = context.cp_attention(m, micro_batch=b, seq=s, cp=cp, kind="a2a", bw=1e11, attention_flops_per_s=1e15, t=t)
    assert att.wire_fwd_bytes == pytest.approx((cp - 1) / cp * (2 * q + 2 * kv))
    assert att.exposed_fwd_s == pytest.approx(sum(comm.all_to_all(cp, x, 1e11) for x in (q, kv, kv, q)))
    assert att.exposed_bwd_s == pytest.approx(att.exposed_fwd_s)
    # reorders: Q's copy before, V's copy and select after; the output's copy and select before, copy after
    f, bk = context.a2a_copy_bytes(m, b, s, cp, t)
    assert f == pytest.approx(2 * q + 4 * kv + 4 * q + 2 * q)
    assert bk == pytest.approx(2 * q + 4 * q + 4 * q + 2 * kv)
    assert context.a2a_copy_bytes(m, b, s, 1, t) == (0.0, 0.0)


@settings(max_examples=60, deadline=None)
@given(cp=st.sampled_from([1, 2, 4, 8]), t=st.sampled_from([1, 2, 4, 8]), s_blocks=st.integers(1, 64),
       b=st.integers(1, 4))
def test_every_form_does_the_same_work_and_a2a_none_unevenly(cp, t, s_blocks, b):
    """The all-to-all form computes the whole causal attention split evenly: its rank's work is the
    mean of the balanced split's, which is every rank's; so every form (the hierarchical one with
    all-to-all groups of 2) agrees on FLOPs."""
    m = catalog_model("llama3-70b")
    s = 2 * cp * 64 * s_blocks
    forms = {k: context.cp_attention(m, micro_batch=b, seq=s, cp=cp, kind=k, bw=1e11, attention_flops_per_s=1e15, t=t,
                                     a2a=2 if k == "a2a+p2p" else 1)
             for k in context.CP_KINDS       # the hierarchical form: groups of 2, where they split the heads
             if k != "a2a+p2p" or (cp >= 4 and context.heads_split_problem(m, t, 2, k) is None)}
    total = b * context.attention_flops_per_pair(m, t) * s * (s + 1) / 2
    for a in forms.values():
        assert a.flops_fwd * cp == pytest.approx(total)
        assert a.kv_kept_bytes == pytest.approx(forms["ring"].kv_kept_bytes)


def test_memory_keeps_as_much_as_the_other_forms():
    m = catalog_model("llama3-8b")
    kw = dict(micro_batch=1, seq=131072, t=1, cp=8)
    kept = {k: activations.layer_activation_bytes(m, cp_kind=k, **kw) for k in context.CP_KINDS}
    assert kept["a2a"] == kept["ring"] == kept["allgather"]
    (qkv, out), _ = context.a2a_tensors(m, 1, 131072, 8, 1)
    assert activations.cp_transient_bytes(m, cp_kind="a2a", **kw) == pytest.approx(sum(qkv) + sum(out))


def test_heads_split_problem():
    m = catalog_model("llama3-70b")       # 64 heads, 8 KV heads
    assert context.heads_split_problem(m, 1, 8) is None
    assert "KV heads" in context.heads_split_problem(m, 2, 8)
    with pytest.raises(ModelcutError):
        context.heads_split_problem(m, 0, 8)


def test_the_explorer_tries_a2a_only_where_the_heads_split():
    from modelcut.core.explore import space
    from modelcut.core.explore.space import Space
    m = catalog_model("llama3-8b")
    seen = [x for x in space.structures(m, 32, 131072, 8, 8, Space(cp_kinds=("a2a",))) if x.cp > 1]
    assert seen and all(context.heads_split_problem(m, x.tp, x.cp) is None for x in seen)
    assert {(x.tp, x.cp) for x in seen} >= {(1, 8), (2, 4), (4, 2), (1, 2)}


@pytest.mark.parametrize("gpus, tokens, kind, megatron, nemo", [
    ("16", "256K", "a2a", ["--cp-comm-type a2a"], ["cp_comm_type=a2a"]),
    # the hierarchical form with its groups: the cp ranks a node holds, then the ring across them
    ("32", "1M", "a2a+p2p", ["--cp-comm-type a2a+p2p", "--hierarchical-context-parallel-sizes 8 2"],
     ["cp_comm_type=a2a+p2p", "hierarchical_context_parallel_sizes=[8,2]"]),
])
def test_explore_emits_the_form_for_megatron_and_nemo(capsys, gpus, tokens, kind, megatron, nemo):
    from modelcut.cli import main
    base = ["explore", "--model", "llama3-8b", "--gpu", "h100", "--gpus", gpus, "--seq", "131072",
            "--global-batch-tokens", tokens, "--cp-kinds", kind, "--top", "1", "--framework", "megatron-core"]
    assert main(base + ["--emit", "megatron"]) == 0
    out = capsys.readouterr().out
    assert "--context-parallel-size" in out and all(x in out for x in megatron)
    assert main(base + ["--emit", "nemo"]) == 0
    out = capsys.readouterr().out
    assert "context_parallel_size" in out and all(x in out for x in nemo)


def test_the_api_takes_the_form_and_refuses_heads_that_do_not_split():
    from fastapi.testclient import TestClient
    from modelcut.web.app import create_app
    body = {"model": "llama3-8b", "gpu": "h100", "framework": "megatron-core",
            "layout": {"tp": 1, "cp": 8, "dp": 1, "cp_kind": "ulysses"},
            "training": {"seq_len": 131072, "global_batch": 1, "micro_batch": 1, "recompute": "full"}}
    with TestClient(create_app()) as client:      # the lifespan closes the search workers
        r = client.post("/api/predict", json=body)
        assert r.status_code == 200, r.text
        assert r.json()["layout"]["cp_kind"] == "a2a"
        r = client.post("/api/predict", json={**body, "layout": {**body["layout"], "tp": 4, "cp": 2}})
        assert r.status_code == 200, r.text
        r = client.post("/api/predict", json={**body, "layout": {**body["layout"], "tp": 2, "cp": 8}})
        assert r.status_code == 422 and "KV heads" in r.json()["detail"]
        r = client.post("/api/explore", json={"model": "llama3-8b", "gpu": "h100", "gpus": 16, "seq": 131072,
                                              "global_batch_tokens": 262144, "cp_kinds": ["a2a"], "top": 3})
        assert r.status_code == 200 and {x["cp_kind"] for x in r.json()["layouts"] if x["cp"] > 1} == {"a2a"}


def test_the_seed_mode_times_the_exchanges_too(tmp_path):
    """The deck's seed model adds the all-to-all form's exposed exchanges, not the all-gather's."""
    from modelcut.service.predict import PredictRequest, predict
    from modelcut.service.runfile import load_run
    steps = {}
    for kind in ("allgather", "a2a"):
        f = tmp_path / f"{kind}.toml"
        f.write_text(RUN.format(model="llama3-8b", gpus=16, tp=1, cp=8, dp=2, kind=kind, framework="megatron-core")
                     .split("[settings]")[0])
        steps[kind] = predict(PredictRequest(run=load_run(f), mode="seed")).prediction.breakdown.cp_s
    assert 0 < steps["a2a"] != steps["allgather"]


def test_explore_check_says_why_an_a2a_layout_cannot_be(capsys):
    from modelcut.cli import main
    argv = ["explore", "--model", "llama3-8b", "--gpu", "h100", "--gpus", "32", "--seq", "131072",
            "--global-batch-tokens", "1M", "--top", "3", "--check", "tp=4,cp=8,pp=1,dp=1,cp_kind=a2a"]
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "KV heads per tensor-parallel rank (2)" in err


def test_across_nodes_the_node_mates_share_goes_over_the_links():
    """A cp group of 16 over two nodes: each tensor's all-to-all sends 7/16 over NVLink and 8/16 over
    the network at once (comm.all_to_all_two_level, as the MoE dispatch), not 15/16 over the network."""
    from modelcut.catalog import hardware, profile_for
    from modelcut.core.step import layer_comm
    from modelcut.core.step.layer_setup import LayerSetup
    m, hw = catalog_model("llama2-7b"), hardware("h100")
    eff = profile_for(hw).efficiency
    setup = LayerSetup(micro_batch=1, seq_len=131072, cp=16, cp_kind="a2a", cp_bw=hw.net_bw,
                       cp_inside=False, cp_local=8)
    f, b = layer_comm.cp_comm(m, setup, hw, eff, None)
    link, net = (comm.achievable(x, hw) * eff.net for x in (hw.link_bw, hw.net_bw))
    fwd, bwd = context.a2a_tensors(m, 1, 131072, 16, 1)
    assert f == pytest.approx(sum(comm.all_to_all_two_level(16, x, 8, link, net) for xs in fwd for x in xs))
    assert b == pytest.approx(f)
    flat = sum(comm.all_to_all(16, x, net) for xs in fwd for x in xs)
    assert f < 0.6 * flat


# ---------------------------------------------------------------- the hierarchical form (a2a+p2p)

H_RUN = RUN.replace('cp_kind = "{kind}"', 'cp_kind = "a2a+p2p"\ncp_a2a = {a}')


def _predict_h(tmp_path, capsys, **kw):
    from modelcut.cli import main
    args = dict(model="llama3-8b", gpus=16, tp=1, cp=16, dp=1, a=4, framework="megatron-core") | kw
    f = tmp_path / "h.toml"
    f.write_text(H_RUN.format(**args))
    rc = main(["predict", str(f), "--json"])
    out = capsys.readouterr()
    return rc, (json.loads(out.out) if rc == 0 else out.err)


@pytest.mark.parametrize("kw, says", [(dict(cp_kind="a2a+p2p", cp=8), "needs cp_a2a"),
                                      (dict(cp_kind="a2a+p2p", cp=8, cp_a2a=8), "between 1 and cp"),
                                      (dict(cp_kind="a2a+p2p", cp=8, cp_a2a=3), "between 1 and cp"),
                                      (dict(cp_kind="ring", cp=8, cp_a2a=2), "cp_a2a is the all-to-all groups' size"),
                                      (dict(cp=8, cp_a2a=2), "cp_a2a is the all-to-all groups' size")])
def test_the_layout_names_its_groups(kw, says):
    from modelcut.core.specs import Layout
    with pytest.raises(ModelcutError, match=says):
        Layout(**kw)
    assert Layout(cp=8, cp_kind="a2a+p2p", cp_a2a=2).cp_a2a == 2 and Layout(cp=8).cp_a2a is None


def test_the_hierarchical_form_is_an_all_to_all_then_a_ring():
    """Its exchanges are the all-to-all form's tensors over a ranks; its ring is the ring form's over
    cp/a ranks on heads/(t·a) heads; it does the same work."""
    m = catalog_model("llama3-70b")
    b, s, cp, a, t, bw = 1, 131072, 16, 4, 2, 1e11
    h = context.cp_attention(m, micro_batch=b, seq=s, cp=cp, kind="a2a+p2p", a2a=a, bw=bw, attention_flops_per_s=1e15, t=t)
    ring = context.cp_attention(m, micro_batch=b, seq=s, cp=cp // a, kind="ring", bw=bw, attention_flops_per_s=1e15,
                                t=t * a)
    fwd, bwd = context.a2a_tensors(m, b, s, cp, t)
    assert h.exposed_fwd_s == pytest.approx(ring.exposed_fwd_s + sum(comm.all_to_all(a, x, bw) for xs in fwd for x in xs))
    assert h.exposed_bwd_s == pytest.approx(ring.exposed_bwd_s + sum(comm.all_to_all(a, x, bw) for xs in bwd for x in xs))
    total = b * context.attention_flops_per_pair(m, t) * s * (s + 1) / 2
    assert h.flops_fwd * cp == pytest.approx(total)
    with pytest.raises(ModelcutError, match="between 1 and cp"):
        context.cp_attention(m, micro_batch=b, seq=s, cp=cp, kind="a2a+p2p", a2a=cp, bw=bw, attention_flops_per_s=1e15)


def test_it_predicts_and_sits_among_the_forms(tmp_path, capsys):
    rc, h = _predict_h(tmp_path, capsys)
    assert rc == 0 and h["layout"]["cp_kind"] == "a2a+p2p" and h["layout"]["cp_a2a"] == 4
    assert h["breakdown"]["cp_s"] > 0 and not any(n.startswith("stack rule") for n in h["notes"])
    rc, r = _predict(tmp_path, capsys, cp=16, dp=1, kind="ring")
    assert rc == 0 and r["flops_per_step"] == h["flops_per_step"] and r["step_time_s"] != h["step_time_s"]
    rc, n = _predict_h(tmp_path, capsys, framework="nemo-24.07")
    assert rc == 0 and any("a2a+p2p form of context parallelism" in x for x in n["notes"])
    rc, err = _predict_h(tmp_path, capsys, framework="fsdp-compile")
    assert rc == 2 and err.count("\n") == 1


def test_its_groups_must_split_the_heads(tmp_path, capsys):
    rc, err = _predict_h(tmp_path, capsys, tp=4, cp=4, gpus=16, a=2)      # 2 KV heads a rank: 2 splits
    assert rc == 0
    rc, err = _predict_h(tmp_path, capsys, tp=4, cp=8, gpus=32, a=4)      # but not over 4
    assert rc == 2 and err.count("\n") == 1 and "cp_a2a (4) to divide the KV heads per tensor-parallel rank (2)" in err


def test_its_memory_holds_the_exchanges_and_the_rings_blocks():
    m = catalog_model("llama3-8b")
    kw = dict(micro_batch=1, seq=131072, t=1, cp=16)
    (qkv, out), _ = context.a2a_tensors(m, 1, 131072, 16, 1)
    blk = context.block_bytes(m, 1, 131072, 16, 1)
    assert activations.cp_transient_bytes(m, cp_kind="a2a+p2p", **kw) == pytest.approx(sum(qkv) + sum(out) + 4 * blk)
    assert activations.layer_activation_bytes(m, cp_kind="a2a+p2p", **kw) == \
        activations.layer_activation_bytes(m, cp_kind="ring", **kw)


def test_the_api_and_the_csv_name_its_groups(tmp_path):
    from fastapi.testclient import TestClient
    from modelcut.service.runs_csv import read_runs_csv
    from modelcut.web.app import create_app
    body = {"model": "llama3-8b", "gpu": "h100", "framework": "megatron-core",
            "layout": {"tp": 1, "cp": 16, "dp": 1, "cp_kind": "hierarchical", "cp_a2a": 8},
            "training": {"seq_len": 131072, "global_batch": 1, "micro_batch": 1, "recompute": "full"}}
    with TestClient(create_app()) as client:
        r = client.post("/api/predict", json=body)
        assert r.status_code == 200, r.text
        assert r.json()["layout"]["cp_kind"] == "a2a+p2p" and r.json()["layout"]["cp_a2a"] == 8
        r = client.post("/api/predict", json={**body, "layout": {**body["layout"], "cp_a2a": 16}})
        assert r.status_code == 422 and "cp_a2a" in r.json()["detail"]
    csv = tmp_path / "r.csv"
    csv.write_text("id,model,gpu,tp,pp,cp,dp,cp_kind,cp_a2a,seq_len,global_batch,micro_batch,step_time_s\n"
                   "a,llama3-8b,h100,1,1,16,1,a2a+p2p,4,131072,1,1,30\n")
    assert read_runs_csv(csv)[0].run.layout.cp_a2a == 4


def test_explore_check_finds_the_hierarchical_form_and_says_what_cp_a2a_needs(capsys):
    """The explorer searches a2a+p2p with its all-to-all groups the cp ranks a node holds: a check of
    that layout ranks it; cp_a2a without the form, or the form on a cp group inside one node, says
    why in one line."""
    from modelcut.cli import main
    base = ["explore", "--model", "llama3-8b", "--gpu", "h100", "--gpus", "32", "--seq", "131072",
            "--global-batch-tokens", "1M", "--top", "3"]
    assert main(base + ["--check", "tp=1,cp=16,pp=1,dp=2,cp_kind=a2a+p2p,cp_a2a=8"]) == 0
    assert "best such layout ranks" in capsys.readouterr().out
    assert main(base + ["--check", "cp=16,cp_a2a=8"]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "name cp_kind=a2a+p2p with it" in err
    assert main(base + ["--check", "tp=2,cp=4,cp_kind=a2a+p2p"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "no layout of the searched space is like it" in out and "only where the cp group leaves a node" in out


@settings(max_examples=80, deadline=None)
@given(name=st.sampled_from(["llama3-8b", "qwen3-30b-a3b"]), t=st.sampled_from([1, 2, 4, 8]),
       c=st.sampled_from([2, 4, 6, 8, 16, 32]), p=st.sampled_from([1, 2]), d=st.sampled_from([1, 2, 4]),
       gpn=st.sampled_from([4, 8]))
def test_the_explorers_hierarchical_groups_are_a_nodes_cp_ranks(name, t, c, p, d, gpn):
    """hierarchical_a2a: where the cp group leaves a node, the largest divisor above 1 of the cp ranks
    one node holds that divides c and the heads per tensor-parallel rank (the node's count itself
    where it cuts them: Llama 3 8B's 8 KV heads; a part of it where not: Qwen3-30B-A3B's 4), else
    None; the explorer's a2a+p2p layouts carry exactly that group."""
    from modelcut.core.costs.mesh import Mesh, members_in_node
    from modelcut.core.explore import space
    m = catalog_model(name)
    a = space.hierarchical_a2a(m, t, c, p, d, gpn)
    node = members_in_node(Mesh.build(tp=t, cp=c, pp=p, dp=d), "cp", gpn)
    fits = [x for x in range(2, node + 1) if node % x == 0 and c % x == 0
            and context.heads_split_problem(m, t, x, "a2a+p2p") is None]
    assert a == (max(fits) if node < c and fits else None)
    if a is not None:
        assert 1 < a < c and Layout(tp=t, cp=c, cp_kind="a2a+p2p", cp_a2a=a)
    forms = dict(space.cp_forms(m, t, c, p, d, gpn, space.Space()))
    assert forms.get("a2a+p2p", a) == a and ("a2a+p2p" in forms) == (a is not None)


def test_a_node_whose_cp_ranks_do_not_cut_the_heads_runs_a_smaller_group():
    """Qwen3-30B-A3B has 4 KV heads: a node's 8 cp ranks cannot all-to-all them, so the explorer's
    hierarchical form takes groups of 4 (tp 1) or 2 (tp 2, 2 KV heads a rank), inside the node."""
    from modelcut.core.explore import space
    m = catalog_model("qwen3-30b-a3b")
    assert space.hierarchical_a2a(m, 1, 16, 1, 2, 8) == 4
    assert space.hierarchical_a2a(m, 2, 16, 1, 1, 8) == 2
    assert space.hierarchical_a2a(catalog_model("llama3-8b"), 1, 16, 1, 2, 8) == 8
    assert space.hierarchical_a2a(m, 1, 8, 1, 4, 8) is None     # the cp group inside one node


def test_the_explorer_runs_the_hierarchical_form_where_the_cp_group_leaves_a_node():
    from modelcut.core.explore import space
    from modelcut.core.explore.space import Space
    m = catalog_model("llama3-8b")
    seen = [x for x in space.structures(m, 32, 131072, 8, 8, Space(cp_kinds=("a2a+p2p",))) if x.cp > 1]
    assert seen and all(x.cp_kind == "a2a+p2p" and x.cp_a2a == 8 // x.tp and x.tp * x.cp > 8 for x in seen)
    assert {(x.tp, x.cp) for x in seen} >= {(1, 16), (1, 32), (2, 8), (2, 16)}



def test_predict_names_the_form_it_timed_in_its_first_line(tmp_path, capsys):
    """The first line of a prediction names the context-parallel form it was timed with: the run's,
    with the hierarchical form's groups, or the stack's where the run names none."""
    from pathlib import Path
    from modelcut.cli import main
    assert main(["predict", str(Path(__file__).parent / "data" / "llama3-70b-256k-hcp.toml")]) == 0
    assert "(t 2, cp 16 a2a+p2p 4, p 4, d 1;" in capsys.readouterr().out.splitlines()[0]
    f = tmp_path / "run.toml"
    f.write_text(RUN.format(model="llama3-8b", gpus=16, tp=1, cp=8, dp=2, kind="a2a", framework="megatron-core")
                 .replace('cp_kind = "a2a"\n', ""))
    assert main(["predict", str(f)]) == 0
    assert "(t 1, cp 8 ring, p 1, d 2;" in capsys.readouterr().out.splitlines()[0]     # Megatron-core's default
