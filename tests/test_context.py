"""Sequence and context parallelism: collectives, the causal split, ring vs all-gather attention."""

import json

import pytest
from hypothesis import given, strategies as st

from modelcut import catalog
from modelcut.core.costs import comm, context
from modelcut.core.errors import ModelcutError
from modelcut.core.specs import ModelSpec

LLAMA = catalog.model("llama3-405b")


# ---------------------------------------------------------------- sequence parallelism

@given(st.integers(1, 1024), st.floats(0, 1e12))
def test_reduce_scatter_plus_all_gather_bytes_are_the_all_reduce_bytes(n, b):
    rs_ag = comm.wire_bytes("reduce-scatter", n, b) + comm.wire_bytes("all-gather", n, b)
    assert rs_ag == pytest.approx(comm.wire_bytes("all-reduce", n, b), rel=1e-12, abs=1e-9)


@given(st.sampled_from([1, 2, 4, 8, 16]), st.floats(1, 1e10), st.floats(1e9, 1e12), st.floats(0, 1e-4))
def test_sequence_parallel_keeps_bytes_and_time(t, b, bw, alpha):
    plain, sp = context.tp_collectives(t, b, False), context.tp_collectives(t, b, True)
    assert [k for k, _, _ in sp].count("all-gather") == 2 and [k for k, _, _ in sp].count("reduce-scatter") == 2
    assert context.collectives_wire_bytes(sp) == pytest.approx(context.collectives_wire_bytes(plain), rel=1e-12)
    assert context.collectives_time(sp, bw, alpha) == pytest.approx(context.collectives_time(plain, bw, alpha),
                                                                     rel=1e-12)


def test_wire_bytes_errors():
    with pytest.raises(ModelcutError, match="unknown collective"):
        comm.wire_bytes("broadcast", 4, 1.0)
    assert comm.wire_bytes("p2p", 4, 10.0) == 10.0


# ---------------------------------------------------------------- the causal split

def test_llama3_chunks():
    """Llama 3 §3.3.2: 2·cp chunks, rank i takes chunks i and 2·cp − 1 − i."""
    assert context.causal_chunks(4) == ((0, 7), (1, 6), (2, 5), (3, 4))
    assert context.causal_chunks(4, balanced=False) == ((0,), (1,), (2,), (3,))


@given(st.integers(1, 16), st.integers(1, 64))
def test_load_balanced_split_equalises_causal_work(cp, n):
    s = 2 * cp * n
    pairs = context.causal_pairs(s, cp)
    assert len(set(pairs)) == 1
    assert pairs[0] == n * n * (2 * cp - 1) + n * (n + 1)
    assert sum(pairs) == s * (s + 1) // 2
    assert context.causal_imbalance(s, cp) == 1.0


@given(st.integers(2, 16), st.integers(1, 64))
def test_naive_split_loads_the_last_rank(cp, N):
    s = cp * N
    pairs = context.causal_pairs(s, cp, balanced=False)
    assert sum(pairs) == s * (s + 1) // 2
    assert list(pairs) == sorted(pairs) and pairs[-1] > pairs[0]
    assert context.causal_imbalance(s, cp, False) == pytest.approx((N * (2 * cp - 1) + 1) / (cp * N + 1))


def test_split_needs_divisible_sequences():
    with pytest.raises(ModelcutError, match="multiple of 2·cp"):
        context.causal_pairs(100, 16)


# ---------------------------------------------------------------- ring vs all-gather

def _both(bw, rate, cp=16, seq=131072, t=8, model=LLAMA, alpha=0.0):
    kw = dict(micro_batch=1, seq=seq, cp=cp, bw=bw, attention_flops_per_s=rate, t=t, alpha=alpha)
    return context.cp_attention(model, kind="ring", **kw), context.cp_attention(model, kind="allgather", **kw)


@given(st.sampled_from([2, 4, 8, 16]), st.floats(1e9, 1e12), st.floats(1e12, 1e15), st.floats(0, 1e-5))
def test_ring_and_allgather_agree_on_flops_and_bytes_and_differ_in_exposure(cp, bw, rate, alpha):
    ring, ag = _both(bw, rate, cp=cp, seq=8192 * cp, alpha=alpha)
    assert ring.flops_fwd == ag.flops_fwd and ring.flops_bwd == ag.flops_bwd
    assert ring.wire_fwd_bytes == pytest.approx(ag.wire_fwd_bytes)        # (cp − 1) blocks either way
    assert ag.exposed_fwd_s == pytest.approx(ag.comm_fwd_s)               # all of it, in the critical path
    assert ring.exposed_fwd_s <= ag.exposed_fwd_s * (1 + 1e-12)           # ring hides what compute covers
    assert ring.kv_kept_bytes == pytest.approx(ag.kv_kept_bytes)          # both keep only the local K, V
    # the all-gather form gathers K and V again in its backward: memory keeps no copy, time pays it
    assert ag.exposed_bwd_s > ag.exposed_fwd_s and ag.wire_bwd_bytes > ag.wire_fwd_bytes
    assert ag.transient_bwd_bytes == pytest.approx(2 * cp * ag.kv_kept_bytes)


def test_ring_hides_the_transfer_when_a_block_computes_longer():
    """Llama 3 405B at 128K over cp 16 on 50 GB/s: a block (4 MiB of K, V per tp rank) takes 84 µs to
    send and far longer to attend to, so the ring exposes only the last dK, dV hop; the all-gather
    exposes its whole all-gather and reduce-scatter."""
    ring, ag = _both(50e9, 400e12)
    blk = context.block_bytes(LLAMA, 1, 131072, 16, 8)
    assert blk == 131072 / 16 * 2 * 128 * 2
    step = min(context.block_pairs(131072, 16, i, j) for i in range(16) for j in range(16)) \
        * context.attention_flops_per_pair(LLAMA, 8) / 400e12
    assert step > blk / 50e9                                            # compute per block beats its transfer
    assert ring.exposed_fwd_s == 0
    assert ring.exposed_bwd_s == pytest.approx(blk / 50e9)              # dK, dV home
    assert ag.exposed_fwd_s == pytest.approx(15 * blk / 50e9)
    assert ag.exposed_s > 10 * ring.exposed_s


def test_ring_exposes_the_transfer_when_compute_is_short():
    ring, ag = _both(1e9, 1e19)
    blk = context.block_bytes(LLAMA, 1, 131072, 16, 8)
    assert ring.exposed_fwd_s == pytest.approx(15 * blk / 1e9, rel=1e-3)
    assert ring.exposed_fwd_s == pytest.approx(ag.exposed_fwd_s, rel=1e-3)
    # the backward ring carries K, V and their gradients: more bytes than the reduce-scatter
    assert ring.wire_bwd_bytes > ag.wire_bwd_bytes and ring.exposed_bwd_s > ag.exposed_bwd_s


def test_balanced_ring_steps_are_half_blocks():
    """With the balanced split every off-diagonal ring step is exactly half a full block's pairs."""
    s, cp = 4096, 8
    n = s // (2 * cp)
    full = (2 * n) ** 2
    for i in range(cp):
        for j in range(cp):
            if i != j:
                assert context.block_pairs(s, cp, i, j) == full // 2


def test_kv_width_with_more_ranks_than_kv_heads():
    assert context.kv_width_per_rank(LLAMA, 8) == 128          # 8 KV heads of 128 over 8 ranks
    assert context.kv_width_per_rank(LLAMA, 16) == 128         # one head each, replicated
    mha = ModelSpec(name="m", layers=1, hidden=1024, ffn_hidden=4096, heads=8, kv_heads=8, vocab=10)
    assert context.kv_width_per_rank(mha, 2) == 512


def test_seed_cp_term_is_the_allgather_form():
    """The seed model's Llama 3 128K context-parallel time per layer and micro-batch (the deck's model,
    frozen: one all-gather forward, one reduce-scatter backward) is this module's all-gather form less
    the backward's second gather of K and V."""
    pr = catalog.published_run("llama3-405b-128k-16384")
    L, tr = pr.run.layout, pr.run.training
    h100 = catalog.hardware("h100")
    bw = comm.group_bandwidth(L, "cp", h100, 8)
    ag = context.cp_attention(LLAMA, micro_batch=1, seq=tr.seq_len, cp=L.cp, kind=L.cp_kind, bw=bw,
                              attention_flops_per_s=1e15, t=L.tp)
    kv_bytes = tr.seq_len * 2 * 128 * 2
    assert ag.comm_fwd_s + ag.comm_bwd_s == pytest.approx(3 * comm.all_gather(16, kv_bytes, bw))


@pytest.mark.parametrize("kw,msg", [(dict(kind="spiral"), "cp_kind"), (dict(cp=0), "cp"),
                                    (dict(attention_flops_per_s=0), "FLOP rate"), (dict(bw=0), "bandwidth")])
def test_bad_arguments(kw, msg):
    args = dict(micro_batch=1, seq=4096, cp=4, kind="ring", bw=1e9, attention_flops_per_s=1e12) | kw
    with pytest.raises(ModelcutError, match=msg):
        context.cp_attention(LLAMA, **args)


@given(cp=st.sampled_from([2, 4, 8, 16]), t=st.sampled_from([1, 2, 4, 8]), b=st.integers(1, 4),
       seq_k=st.integers(1, 16))
def test_the_ring_merges_its_steps_results_and_the_gather_does_not(cp, t, b, seq_k):
    """Ring attention merges each step's partial output (forward) and dQ, dK, dV (backward): 3 passes
    of 16 bits (read the step's result and the sum, write the sum) over the busiest rank's b·s rows
    of its query heads, and its K and V widths in the backward (Transformer Engine's
    AttnFuncWithCPAndKVP2P). A layer with the ring form moves exactly these bytes more than with the
    all-gather form, which runs one attention over the gathered keys and merges nothing."""
    from modelcut.core.costs.kernels import Efficiency
    from modelcut.core.step.layers import LayerSetup, layer_time
    model = catalog.model("llama3-70b")
    seq = 2 * cp * 64 * seq_k
    f, bwd = context.ring_merge_bytes(model, b, seq, cp, t)
    q = model.heads // t * model.d_head
    assert f == b * seq * q * 3 * 2
    assert bwd == b * seq * (q + 2 * context.kv_width_per_rank(model, t)) * 3 * 2
    assert context.ring_merge_bytes(model, b, seq, 1, t) == (0.0, 0.0)
    hw, eff = catalog.hardware("h100"), Efficiency(0.85, 0.85, 1.0)
    base = dict(micro_batch=b, seq_len=seq, tp=t, cp=cp, attention="flash2", cp_bw=hw.link_bw)
    ring = layer_time(model, LayerSetup(**base, cp_kind="ring"), hw, eff)
    gather = layer_time(model, LayerSetup(**base, cp_kind="allgather"), hw, eff)
    from modelcut.core.costs.kernels import mem_time
    assert ring.fwd.memory - gather.fwd.memory == pytest.approx(mem_time(f, hw, eff), rel=1e-9)
    assert ring.bwd.memory - gather.bwd.memory == pytest.approx(mem_time(bwd, hw, eff), rel=1e-9)


@given(cp=st.sampled_from([2, 4, 8, 16]), t=st.sampled_from([1, 2, 4, 8]), b=st.integers(1, 4),
       seq_k=st.integers(1, 16), kind=st.sampled_from(["ring", "allgather"]), compiled=st.booleans())
def test_pytorch_context_parallelism_merges_in_fp32_with_either_rotation(cp, t, b, seq_k, kind, compiled):
    """PyTorch's SDPA context parallelism (torch 2.13 _context_parallel/_attention.py) runs one
    attention call a step and merges every step's output into an FP32 one, eagerly 38 bytes an
    element (the cast, three elementwise ops), with either rotation: a layer under it moves exactly
    :func:`context.torch_merge_bytes` more than a Transformer Engine all-gather layer, which merges
    nothing, and more than Transformer Engine's ring, whose merges are 6 bytes an element. Compiled,
    a merge is one pass of 10 bytes, less than eager and never free."""
    from modelcut.core.costs.kernels import Efficiency, mem_time
    from modelcut.core.step.layers import LayerSetup, layer_time
    model = catalog.model("llama3-70b")
    seq = 2 * cp * 64 * seq_k
    f, bwd = context.torch_merge_bytes(model, b, seq, cp, t, compiled)
    e_q = b * seq / cp * model.heads // t * model.d_head
    e_kv = b * seq / cp * 2 * context.kv_width_per_rank(model, t)
    per_step = 10 if compiled else 38
    assert f == pytest.approx(e_q * (12 + per_step * (cp - 1)) + e_kv * 4 * (cp - 1), rel=1e-12)
    eager_f, eager_b = context.torch_merge_bytes(model, b, seq, cp, t, False)
    ring_f, ring_b = context.ring_merge_bytes(model, b, seq, cp, t)
    assert f <= eager_f and bwd <= eager_b
    assert eager_f > ring_f and eager_b > ring_b
    assert context.torch_merge_bytes(model, b, seq, 1, t, compiled) == (0.0, 0.0)
    hw, eff = catalog.hardware("h100"), Efficiency(0.85, 0.85, 1.0)
    base = dict(micro_batch=b, seq_len=seq, tp=t, cp=cp, attention="flash2", cp_bw=hw.link_bw)
    torch_layer = layer_time(model, LayerSetup(**base, cp_kind=kind, cp_impl="torch-sdpa", compiled=compiled),
                             hw, eff)
    te_gather = layer_time(model, LayerSetup(**base, cp_kind="allgather", compiled=compiled), hw, eff)   # the same norms
    assert torch_layer.fwd.memory - te_gather.fwd.memory == pytest.approx(mem_time(f, hw, eff), rel=1e-9)
    assert torch_layer.bwd.memory - te_gather.bwd.memory == pytest.approx(mem_time(bwd, hw, eff), rel=1e-9)


@given(steps=st.lists(st.floats(0, 1e-2), min_size=2, max_size=16), gather=st.floats(0, 1e-2),
       hop=st.floats(0, 1e-2), kind=st.sampled_from(["ring", "allgather"]))
def test_pytorch_context_parallelism_hides_its_rotation_behind_the_steps(steps, gather, hop, kind):
    """PyTorch's rotation waits for K, V one step after it sends them, and for the dK, dV one step
    after the previous rank sent them, so exposed time is what outlasts the step it runs beside:
    never negative, never more than the transfers themselves, and the last dK, dV hop always in
    full. The all-gather rotation exposes max(0, gather − step 0) in the forward."""
    fwd = tuple(steps)
    bwd = tuple(2 * c for c in steps)
    grad_hop = 2 * hop
    ef, eb = context.torch_exposed(kind, fwd, bwd, gather, hop, grad_hop)
    cp = len(steps)
    kv_total = gather if kind == "allgather" else (cp - 1) * hop
    assert 0.0 <= ef <= kv_total + 1e-15
    assert grad_hop - 1e-15 <= eb <= kv_total + cp * grad_hop + 1e-15
    if kind == "allgather":
        assert ef == pytest.approx(max(0.0, gather - fwd[0]))
    assert context.torch_exposed(kind, (1.0,), (2.0,), gather, hop, grad_hop) == (0.0, 0.0)
    with pytest.raises(ModelcutError):
        context.torch_exposed("p2p", fwd, bwd, gather, hop, grad_hop)


@given(cp=st.sampled_from([1, 2, 4, 8, 16]), t=st.sampled_from([1, 2, 4, 8]), b=st.integers(1, 4),
       seq_k=st.integers(1, 16), kind=st.sampled_from(["ring", "allgather"]))
def test_pytorch_context_parallelism_holds_fp32_accumulators(cp, t, b, seq_k, kind):
    """PyTorch's SDPA context parallelism keeps the K, V it rotates (cp blocks gathered, or this
    step's and the next) and FP32 accumulators: the output and a temporary forward, dQ and three
    FP32 dK, dV buffers backward. Its buffers are never fewer than Transformer Engine's ring's,
    and none without context parallelism."""
    from modelcut.core.memory import cp_transient_bytes
    model = catalog.model("llama3-70b")
    seq = 2 * cp * 64 * seq_k
    kw = dict(micro_batch=b, seq=seq, t=t, cp=cp, cp_kind=kind)
    got = cp_transient_bytes(model, **kw, cp_impl="torch-sdpa")
    if cp == 1:
        assert got == 0.0
        return
    blk = context.block_bytes(model, b, seq, cp, t)
    q32 = 4 * b * seq / cp * model.heads // t * model.d_head
    rotated = cp * blk if kind == "allgather" else 2 * blk
    assert got == pytest.approx(rotated + max(2 * q32, q32 + 6 * blk), rel=1e-12)
    assert got >= cp_transient_bytes(model, **dict(kw, cp_kind="ring"))
    with pytest.raises(ModelcutError):
        cp_transient_bytes(model, **kw, cp_impl="megatron")
    from modelcut.core.step.layers import LayerSetup
    with pytest.raises(ModelcutError, match="cp_impl must be one of"):
        LayerSetup(micro_batch=b, seq_len=seq, cp_impl="megatron")


CP_RUN = """[model]
name = "llama3-8b"
[hardware]
gpu = "h100"
gpus = 32
[layout]
tp = 4
cp = 8
cp_kind = "{kind}"
[training]
seq_len = 131072
global_batch = 8
recompute = "full"
[settings]
framework = "nemo"
"""


@pytest.mark.parametrize("kind, ours", [("p2p", "ring"), ("P2P", "ring"), ("all_gather", "allgather"),
                                        ("allgather", "allgather"), ("ring", "ring")])
def test_the_stacks_names_for_the_forms_are_taken(tmp_path, capsys, kind, ours):
    """Megatron-LM's --cp-comm-type p2p and allgather (and their spellings) are modelcut's ring and
    allgather: the same prediction as modelcut's own name."""
    import json
    from modelcut.cli import main
    out = {}
    for k in (kind, ours):
        f = tmp_path / f"{k}.toml"
        f.write_text(CP_RUN.format(kind=k))
        assert main(["predict", str(f), "--json"]) == 0
        out[k] = json.loads(capsys.readouterr().out)["step_time_s"]
    assert out[kind] == out[ours]
    assert context.cp_kind_name(kind) == ours


def test_the_hierarchical_form_needs_its_group_and_the_explorer_chooses_it(tmp_path, capsys):
    """a2a+p2p is timed with its all-to-all groups' size (tests/test_context_a2a.py); without cp_a2a a
    run is one line naming it. A search of that form alone gives every layout that splits the
    sequence over more than a node the cp ranks a node holds as its groups, from the CLI and the API."""
    from fastapi.testclient import TestClient
    from modelcut.cli import main
    from modelcut.web.app import create_app
    f = tmp_path / "run.toml"
    f.write_text(CP_RUN.format(kind="a2a+p2p"))
    assert main(["predict", str(f)]) == 2
    err = capsys.readouterr().err
    assert err.count("\n") == 1 and "needs cp_a2a" in err
    assert main(["explore", "--model", "llama3-8b", "--gpu", "h100", "--gpus", "32", "--seq", "131072",
                 "--global-batch-tokens", "1M", "--cp-kinds", "a2a+p2p", "--json"]) == 0
    rows = [x for x in json.loads(capsys.readouterr().out)["layouts"] if x["cp"] > 1]
    assert rows and all(x["cp_kind"] == "a2a+p2p" and x["cp_a2a"] * x["tp"] == 8 for x in rows)
    with TestClient(create_app()) as client:
        r = client.post("/api/explore", json={"model": "llama3-8b", "gpu": "h100", "gpus": 32, "seq": 131072,
                                              "global_batch_tokens": 1048576, "cp_kinds": ["a2a+p2p"]})
    assert r.status_code == 200, r.text
    rows = [x for x in r.json()["layouts"] if x["cp"] > 1]
    assert rows and all(x["cp_kind"] == "a2a+p2p" and x["cp_a2a"] * x["tp"] == 8 for x in rows)
