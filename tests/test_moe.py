"""Mixture of experts: active-parameter FLOPs, expert GEMMs under ep/etp, the all-to-alls, the
catalog's MoE models and their Hugging Face configs."""

import json
import math
from dataclasses import fields, replace

import pytest
from hypothesis import given, settings, strategies as st

from modelcut import catalog
from modelcut.catalog.hf_config import mla_equivalent_shape
from modelcut.core.costs import comm, flops, moe, params
from modelcut.core.errors import ModelcutError
from modelcut.core.specs import Layout, ModelSpec, Run, Training
from modelcut.service.runfile import run_from_dict

MOE_MODELS = ("mixtral-8x7b", "deepseek-v3", "qwen1.5-moe-a2.7b", "qwen3-30b-a3b")


def dense(h=64, f=256, gated=True, bias=False, heads=4, kv=2):
    return ModelSpec(name="d", layers=4, hidden=h, ffn_hidden=f, heads=heads, kv_heads=kv, vocab=1000,
                     gated_mlp=gated, bias=bias, norm="rmsnorm" if gated else "layernorm")


def shapes(gemms):
    return [(g.m, g.n, g.k, g.count) for g in gemms]


# ---------------------------------------------------------------- E = 1 is the dense model

@given(st.sampled_from([32, 64, 128]), st.integers(1, 16), st.booleans(), st.booleans(),
       st.sampled_from([1, 2, 4]), st.integers(1, 4096))
def test_one_expert_is_the_dense_layer_exactly(h, f_mult, gated, bias, tp, tokens):
    m = dense(h=h, f=8 * f_mult * tp, gated=gated, bias=bias)
    one = replace(m, experts=1, top_k=1, expert_ffn_hidden=m.ffn_hidden)
    assert flops.layer_params(one, True) == flops.layer_params(m, False)
    assert flops.layer_params(one, True, active=True) == flops.layer_params(m, False)
    assert flops.layer_matmul_params(one, True) == flops.layer_matmul_params(m, False)
    assert shapes(moe.moe_gemms(one, tokens, tp=tp, ep=1)) == shapes(moe.dense_mlp_gemms(m, tokens, tp))
    c = moe.moe_comm(one, tokens, ep=1, link_bw=1e11, net_bw=1e10, tp=tp, etp=1)
    assert c.forward_s == 0 and c.wire_bytes_fwd == 0


def test_one_expert_model_predicts_as_the_dense_model():
    """A model declaring one expert (top-1, expert width = ffn) is not an MoE model anywhere."""
    from helpers import predict_seed as predict
    pr = catalog.published_run("megatron-18.4b")
    m = pr.run.model
    one = replace(pr.run, model=replace(m, experts=1, top_k=1, expert_ffn_hidden=m.ffn_hidden))
    hw = catalog.hardware(pr.run.gpu)
    assert predict(one, hw).as_dict() == predict(pr.run, hw).as_dict()
    assert flops.param_count(one.model) == flops.param_count(m)


# ---------------------------------------------------------------- active parameters and FLOPs

@pytest.mark.parametrize("name,total,active", [
    ("mixtral-8x7b", 46.7e9, 12.9e9),       # Mixtral blog / model card: 46.7B, 12.9B active
    ("deepseek-v3", 671e9, 37e9),           # arXiv 2412.19437 §1: 671B, 37B activated
    ("qwen1.5-moe-a2.7b", 14.3e9, 2.7e9),   # Qwen1.5-MoE blog: 14.3B, 2.7B activated
    ("qwen3-30b-a3b", 30.5e9, 3.3e9),       # Qwen3 report: 30.5B, 3.3B activated
])
def test_published_parameter_counts(name, total, active):
    m = catalog.model(name)
    assert flops.param_count(m) == pytest.approx(total, rel=0.01)
    assert flops.param_count(m, active=True) == pytest.approx(active, rel=0.02)


@pytest.mark.parametrize("name", MOE_MODELS)
def test_balanced_expert_work_is_the_active_parameter_flops(name):
    """Summed over the ep ranks, balanced dropless routing executes 2 FLOPs per active MLP weight per
    token (router + top_k routed + shared experts): the active-parameter count of :mod:`flops`."""
    m = catalog.model(name)
    tokens, tp = 4096, 2
    ep = max(d for d in (1, 2, 4, 8) if m.experts % d == 0)
    per_device = moe.gemm_flops(moe.moe_gemms(m, tokens, tp=tp, ep=ep))
    attn = flops.layer_matmul_params(m, False) - (3 if m.gated_mlp else 2) * m.hidden * m.ffn_hidden
    mlp_active = flops.layer_matmul_params(m, True) - attn
    shared = m.shared_experts * 3 * m.hidden * flops.expert_width(m)
    # routed experts and router are spread over the tp ranks (each routes tokens/tp); shared experts are cut by tp
    routed = (mlp_active - shared) * 2 * tokens / tp
    assert per_device == pytest.approx(routed + 2 * tokens * shared / tp, rel=1e-12)


def test_imbalance_and_capacity():
    m = catalog.model("mixtral-8x7b")
    T = 1000
    assert moe.routed_rows(m, T) == 2 * T
    assert moe.routed_rows(m, T, imbalance=1.5) == 3 * T
    # a capacity factor pads every expert to C·mean whatever the imbalance
    assert moe.routed_rows(m, T, imbalance=1.5, capacity_factor=1.25) == 2.5 * T
    assert moe.routed_rows(replace(m, capacity_factor=2.0), T, imbalance=3.0) == 4 * T
    kw = dict(ep=8, link_bw=450e9, net_bw=50e9, local=1, tp=1)
    base = moe.moe_comm(m, T, **kw)
    skew = moe.moe_comm(m, T, imbalance=2.0, **kw)
    assert skew.dispatch_s == pytest.approx(2 * base.dispatch_s)
    busy = moe.gemm_flops(moe.moe_gemms(m, T, ep=8, imbalance=2.0))
    router = 2 * T * m.experts * m.hidden
    assert busy - router == pytest.approx(2 * (moe.gemm_flops(moe.moe_gemms(m, T, ep=8)) - router))
    with pytest.raises(ModelcutError, match="imbalance"):
        moe.routed_rows(m, T, imbalance=0.5)


def test_expert_gemm_shapes_under_ep_and_etp():
    """DeepSeek-V3 with ep 64: 4 local experts per device, each [rows/4, 7168] × [7168, 2·2048]; with
    etp 2 half as wide and twice the rows (the etp group all-gathers what it received)."""
    m = catalog.model("deepseek-v3")
    T = 4096
    g = {x.name: x for x in moe.moe_gemms(m, T, ep=64)}
    assert (g["expert up"].m, g["expert up"].n, g["expert up"].k, g["expert up"].count) == (T * 8 / 4, 4096, 7168, 4)
    assert (g["expert down"].n, g["expert down"].k) == (7168, 2048)
    assert (g["router"].m, g["router"].n) == (T, 256)
    assert g["shared expert up"].m == T and g["shared expert up"].n == 4096
    g2 = {x.name: x for x in moe.moe_gemms(m, T, ep=64, etp=2)}
    assert g2["expert up"].n == 2048 and g2["expert up"].m == 2 * g["expert up"].m
    assert g2["expert up"].flops == pytest.approx(g["expert up"].flops)


# ---------------------------------------------------------------- all-to-all

@given(st.sampled_from([2, 4, 8, 16, 64]), st.floats(1, 1e9), st.floats(1e9, 1e12), st.floats(1e8, 1e11))
def test_two_level_all_to_all_limits(n, b, link, net):
    assert comm.all_to_all_two_level(n, b, 1, link, net) == pytest.approx(comm.all_to_all(n, b, net))
    assert comm.all_to_all_two_level(n, b, n, link, net) == pytest.approx(comm.all_to_all(n, b, link))
    mid = comm.all_to_all_two_level(n, b, max(1, n // 2), link, min(net, link))
    assert mid <= comm.all_to_all(n, b, min(net, link)) + 1e-15


def test_a2a_bytes_and_the_four_per_layer():
    """Dispatch and combine each move T·top_k·h BF16 values per rank; the backward mirrors the forward."""
    m = catalog.model("deepseek-v3")
    tokens = 4096
    c = moe.moe_comm(m, tokens, ep=64, link_bw=450e9, net_bw=50e9, local=8)
    nbytes = tokens * 8 * 7168 * 2
    assert moe.a2a_bytes(m, tokens) == nbytes
    assert c.wire_bytes_fwd == pytest.approx(2 * 63 / 64 * nbytes)
    assert c.dispatch_s == pytest.approx(max(7 / 64 * nbytes / 450e9, 56 / 64 * nbytes / 50e9))
    assert c.backward_s == c.forward_s == c.dispatch_s + c.combine_s
    fp8 = moe.moe_comm(m, tokens, ep=64, link_bw=450e9, net_bw=50e9, local=8, dispatch_bytes=1)
    assert fp8.dispatch_s == pytest.approx(c.dispatch_s / 2) and fp8.combine_s == c.combine_s
    etp = moe.moe_comm(m, tokens, ep=64, link_bw=450e9, net_bw=50e9, local=8, tp=2, etp=2)
    assert etp.etp_s > 0 and etp.dispatch_s == pytest.approx(c.dispatch_s / 2)


@settings(max_examples=40, deadline=None)
@given(st.sampled_from([(8, 2), (16, 4), (32, 4), (128, 8), (64, 6)]), st.sampled_from([2, 4, 8]))
def test_deepep_sends_a_token_once_to_each_rank_it_is_routed_to(shape, ep):
    """DeepEP delivers a token once per rank holding any of its experts: the expected number of
    such ranks, counted exactly over every choice of k distinct experts, is :func:`moe.rank_copies`;
    on one node the dispatch moves that share of the k copies a plain all-to-all moves, never
    more, and exactly as much with top-1 routing."""
    from itertools import combinations
    E, k = shape
    m = replace(catalog.model("qwen3-30b-a3b"), experts=E, top_k=k)
    per = E // ep
    picks = list(combinations(range(E), k)) if E <= 16 else None
    if picks is not None:
        exact = sum(len({e // per for e in c}) for c in picks) / len(picks)
        assert moe.rank_copies(m, ep) == pytest.approx(exact)
    assert 1.0 <= moe.rank_copies(m, ep) <= min(k, ep)
    tokens, kw = 4096, dict(ep=ep, link_bw=450e9, net_bw=50e9, local=ep)
    plain, dedup = moe.moe_comm(m, tokens, **kw), moe.moe_comm(m, tokens, node_dedup=True, **kw)
    assert dedup.dispatch_s == pytest.approx(plain.dispatch_s * moe.rank_copies(m, ep) / k)
    assert dedup.dispatch_s <= plain.dispatch_s and dedup.wire_bytes_fwd <= plain.wire_bytes_fwd
    top1 = replace(m, top_k=1)
    assert (moe.moe_comm(top1, tokens, node_dedup=True, **kw).dispatch_s
            == pytest.approx(moe.moe_comm(top1, tokens, **kw).dispatch_s))


def test_permutation_bytes_count_each_row_gathered():
    """Megatron-core's all-to-all dispatcher gathers a token's top-k rows (3S), sorts the
    received rows by local expert and back (4R) and sums them into the tokens (T); DeepEP's
    path expands the delivered tokens to the experts' rows and back (3R + U). Worked by hand for
    GPT OSS 120B (h 2880, 128 experts, top 4) at 4096 tokens over ep 8."""
    m = catalog.model("gpt-oss-120b")
    T, h2 = 4096, 2880 * 2
    rows = T * 4                                   # S = R: every token's four rows, balanced
    f, b = moe.permute_bytes(m, T, ep=8)
    assert f == b == (3 * rows + 4 * rows + T) * h2
    one_local = moe.permute_bytes(m, T, ep=128)[0]          # one expert a rank: no sorting
    assert one_local == (3 * rows + T) * h2
    deepep = moe.permute_bytes(m, T, ep=8, dispatch="deepep")[0]
    assert deepep == pytest.approx((3 * rows + rows * moe.rank_copies(m, 8) / 4) * h2)
    # tensor parallelism: each rank routes its T/tp tokens, expert tp gathers etp times the rows
    assert moe.permute_bytes(m, T, ep=8, tp=2, etp=1)[0] == pytest.approx(f / 2)
    assert moe.permute_bytes(m, T, ep=8, tp=2, etp=2)[0] == pytest.approx((3 * rows / 2 + 4 * rows + T / 2) * h2)
    with pytest.raises(ModelcutError, match="dispatch"):
        moe.permute_bytes(m, T, ep=8, dispatch="nccl")


@settings(max_examples=60, deadline=None)
@given(st.sampled_from(MOE_MODELS), st.sampled_from([1, 2, 4, 8]), st.integers(1, 1 << 16),
       st.floats(1.0, 3.0))
def test_permutation_bytes_grow_with_the_rows(name, ep, tokens, imbalance):
    m = catalog.model(name)
    if m.experts % ep:
        return
    a2a = moe.permute_bytes(m, tokens, ep=ep, imbalance=imbalance)
    dep = moe.permute_bytes(m, tokens, ep=ep, imbalance=imbalance, dispatch="deepep")
    assert 0 < dep[0] and 0 < a2a[0] and a2a[0] == a2a[1] and dep[0] == dep[1]
    if m.experts // ep > 1:     # then both sort by local expert: DeepEP's once, on fewer rows
        assert dep[0] <= a2a[0]
    assert moe.permute_bytes(m, 2 * tokens, ep=ep, imbalance=imbalance)[0] == pytest.approx(2 * a2a[0])
    assert moe.permute_bytes(m, tokens, ep=ep, imbalance=imbalance + 0.5)[0] >= a2a[0]


def test_an_moe_layer_pays_its_permutations_at_memory_bandwidth():
    """The layer's memory-bound time with the all-to-all dispatcher exceeds DeepEP's by the
    permutation bytes between them at the achievable bandwidth, forward and backward alike."""
    from modelcut.core.costs.kernels import Efficiency, mem_time
    from modelcut.core.step.layers import LayerSetup, layer_time
    m, hw, eff = catalog.model("gpt-oss-120b"), catalog.hardware("h100"), Efficiency(0.8, 0.9, 1.0)
    base = dict(micro_batch=1, seq_len=4096, attention="cudnn")
    a = layer_time(m, LayerSetup(**base), hw, eff, moe=True, ep=8)
    d = layer_time(m, LayerSetup(**base, moe_dispatch="deepep"), hw, eff, moe=True, ep=8)
    gap = moe.permute_bytes(m, 4096, ep=8)[0] - moe.permute_bytes(m, 4096, ep=8, dispatch="deepep")[0]
    assert a.fwd.memory - d.fwd.memory == pytest.approx(mem_time(gap, hw, eff), rel=1e-9)
    assert a.bwd.memory - d.bwd.memory == pytest.approx(mem_time(gap, hw, eff), rel=1e-9)
    assert a.fwd.gemm == d.fwd.gemm
    dense = layer_time(m, LayerSetup(**base, moe_dispatch="deepep"), hw, eff)
    assert dense.fwd.memory < d.fwd.memory


@given(st.floats(0, 1.0), st.floats(0, 1.0), st.integers(0, 132), st.sampled_from([None, 108, 132]))
def test_shared_experts_beside_the_all_to_all_save_at_most_either(shared, a2a, comm_sms, sms):
    """min(S, A·(1 − sms_comm/SMs)): never more than the shared products or the all-to-all, never
    negative, all of the shared products when the all-to-all's free SMs cover them."""
    comm_sms = min(comm_sms, sms or 0)
    got = moe.shared_overlap_saving(shared, a2a, comm_sms, sms)
    assert 0.0 <= got <= min(shared, a2a) + 1e-15
    free = 1 - comm_sms / sms if sms else 1.0
    if shared <= a2a * free:
        assert got == shared
    assert moe.shared_overlap_saving(shared, 2 * a2a, comm_sms, sms) >= got


def test_a_stack_that_runs_the_shared_experts_beside_the_dispatch_hides_them():
    """NeMo AutoModel runs DeepSeek-V3's shared expert on a second stream beside DeepEP's
    dispatch and combine (20 of the H100's 132 SMs): each pass's all-to-all term shrinks by
    min(S, A·(1 − 20/132)), S the pass's shared products; the pipeline's stages and ZeRO-3's
    units read the same rule; a model without shared experts, or a stack that runs them in
    line, keeps the whole all-to-all."""
    from modelcut.core.step.stage_costs import a2a_time, kernels, moe_a2a, unit_costs
    hw = catalog.hardware("h100")
    fw = catalog.framework("nemo-automodel")
    inline = replace(fw, shared_expert_overlap=False)
    eff = catalog.profile_for(hw).efficiency
    for model, shared in (("deepseek-v3", True), ("qwen3-30b-a3b", False)):
        m = catalog.model(model)
        run = fw.resolve(Run(m, hw.name, Layout(tp=1, pp=1, dp=m.experts // 4, ep=m.experts // 4, zero=3),
                             Training(seq_len=4096, global_batch=64, micro_batch=1, recompute="full")))
        bw = comm.group_bandwidths(run.layout, hw, 8, fw.multi_nic_rings)
        k = kernels(run, hw, eff, fw, bw)
        a = a2a_time(run, hw, eff, fw)
        s_f, s_b = k.moe.shared
        assert (s_f > 0) == shared and (s_b > 0) == shared
        free = 1 - moe.DISPATCH_SMS["deepep"] / hw.sms
        f, b = moe_a2a(k.moe, a, "full", fw, hw)
        assert f == pytest.approx(a - min(s_f, a * free))
        assert b == pytest.approx(2 * a - min(s_b, a * free) - min(s_f, a * free))
        assert moe_a2a(k.moe, a, "full", inline, hw) == (a, 2 * a)
        uc = unit_costs(run, hw, eff, fw, k).layers[True]
        assert (uc[0][3], uc[1][3]) == pytest.approx((f, b))
    with pytest.raises(ModelcutError, match="shared_expert_overlap needs a dispatcher"):
        replace(fw, moe_dispatch="all-to-all")


def test_ep_members_in_a_node_follow_the_order():
    """ep is carved from the innermost data-parallel ranks: with pp inside dp (Llama 3's order) a
    DeepSeek-V3-shaped layout puts every ep member on its own node; with pp outermost (the default,
    Megatron-core's tp-cp-ep-dp-pp, or tp-cp-dp-pp) eight share a node."""
    llama = Layout(pp=16, dp=128, ep=64, order=("tp", "cp", "pp", "dp"))
    default = Layout(pp=16, dp=128, ep=64)
    megatron = Layout(pp=16, dp=128, ep=64, order=("tp", "cp", "dp", "pp"))
    assert comm.group_members_in_node(llama, "ep", 8) == 1
    assert comm.group_members_in_node(default, "ep", 8) == 8
    assert comm.group_members_in_node(megatron, "ep", 8) == 8
    assert comm.group_members_in_node(Layout(tp=8, dp=4), "tp", 8) == 8


# ---------------------------------------------------------------- weights

@pytest.mark.parametrize("name,tp,ep,etp", [("deepseek-v3", 1, 64, None), ("mixtral-8x7b", 2, 4, 1),
                                            ("qwen1.5-moe-a2.7b", 2, 2, 2)])
def test_expert_sharding_matches_memory(name, tp, ep, etp):
    m = catalog.model(name)
    lay = Layout(tp=tp, pp=1, dp=2 * ep, ep=ep, etp=etp)
    sh = moe.expert_sharding(m, lay)
    assert sh.local_experts * ep == m.experts
    assert sh.params_per_layer == pytest.approx(params.layer_params(m, tp, True, ep, etp)[1])
    assert sh.data_parallel == tp * 2 * ep // (ep * (etp or tp))
    expert, rest = moe.expert_param_counts(m)
    assert expert + rest == flops.param_count(m)
    assert expert == pytest.approx(flops.moe_layer_count(m) * sh.params_per_layer * ep * (etp or tp))


@pytest.mark.parametrize("layout,msg", [
    (Layout(dp=8, ep=3), "must divide the experts"),
    (Layout(dp=4, ep=8), r"ep × etp \(8 × 1\) must divide tp × cp × dp \(4\)"),
    (Layout(tp=2, dp=4, ep=8), "with etp 1 the experts may span the tensor-parallel ranks"),
    (Layout(dp=4, ep=8, order=("tp", "cp", "pp", "dp")), r"ep \(8\) must divide dp \(4\) under the rank order"),
    (Layout(tp=3, dp=8, ep=8), "must divide expert_ffn_hidden"),
])
def test_bad_expert_layouts(layout, msg):
    with pytest.raises(ModelcutError, match=msg):
        moe.check_moe_layout(catalog.model("mixtral-8x7b"), layout)
    with pytest.raises(ModelcutError, match="needs a mixture-of-experts model"):
        moe.check_moe_layout(catalog.model("llama3-8b"), Layout(dp=8, ep=2))


# ---------------------------------------------------------------- catalog and Hugging Face configs

@pytest.mark.parametrize("file,name", [("mixtral-8x7b", "mixtral-8x7b"), ("deepseek-v3", "deepseek-v3"),
                                       ("qwen1.5-moe-a2.7b", "qwen1.5-moe-a2.7b"), ("qwen3-30b-a3b", "qwen3-30b-a3b"),
                                       ("gpt-oss-120b", "gpt-oss-120b"), ("mixtral-8x22b", "mixtral-8x22b")])
def test_hf_configs_give_the_catalog_entries(file, name):
    got, want = catalog.load_hf_config(f"tests/data/hf/{file}.json"), catalog.model(name)
    for f in fields(want):
        if f.name not in ("name", "source"):
            assert getattr(got, f.name) == getattr(want, f.name), f.name


@pytest.mark.parametrize("rope_scaling,factor", [
    (None, 1.0),
    ({"rope_type": "llama3", "factor": 8.0}, 1.0),
    ({"rope_type": "yarn", "factor": 32.0}, 0.1 * math.log(32) + 1),
    ({"type": "yarn", "factor": 40.0, "mscale": 1.0, "mscale_all_dim": 1.0}, 1.0),
    ({"type": "yarn", "factor": 40.0, "mscale": 1.0, "mscale_all_dim": 0.707}, (0.1 * math.log(40) + 1) / (0.0707 * math.log(40) + 1)),
    ({"rope_type": "yarn", "factor": 4.0, "attention_factor": 1.2}, 1.2),
])
def test_yarn_attention_factor_as_transformers_computes_it(rope_scaling, factor):
    cfg = json.loads(open("tests/data/hf/llama3-8b.json").read()) | {"rope_scaling": rope_scaling}
    assert catalog.model_from_hf_config(cfg).rope_mscale == pytest.approx(factor, rel=1e-12)


def test_deepseek_fields():
    m = catalog.model("deepseek-v3")
    assert (m.layers, m.experts, m.top_k, m.shared_experts, m.dense_layers, m.expert_ffn_hidden) == (61, 256, 8, 1, 3, 2048)
    assert flops.moe_layer_count(m) == 58


def test_mla_stand_in_holds_mla_weights():
    """DeepSeek-V3's latent attention (q rank 1536, kv rank 512, 128 + 64 qk, 128 v per head): the
    stand-in GQA shape holds its projection weights to 0.1 %; its attention core is the part it
    under-counts (60 %), as the catalog documents."""
    mla = flops.mla_attention_params(7168, 128, 1536, 512, 128, 64, 128)
    kv, d = mla_equivalent_shape(7168, 128, 1536, 512, 128, 64, 128)
    m = catalog.model("deepseek-v3")
    assert (kv, d) == (m.kv_heads, m.head_dim)
    assert flops.attention_params(m) == pytest.approx(mla, rel=1e-3)
    core = 4 * m.core_width          # MLA's own core a pair: 2·H·(d_nope + d_rope) + 2·H·d_v
    assert 4 * m.heads * m.head_dim / core == pytest.approx(0.6)


@pytest.mark.parametrize("change,msg", [
    ({"decoder_sparse_step": 2, "mlp_only_layers": [0]}, "decoder_sparse_step 2 beside mlp_only_layers"),
    ({"decoder_sparse_step": 0}, "decoder_sparse_step must be a positive whole number"),
    ({"mlp_only_layers": [3]}, "not the leading layers"),
    ({"shared_expert_intermediate_size": 1000}, "not a multiple"),
])
def test_qwen_moe_config_limits(change, msg):
    cfg = json.loads(open("tests/data/hf/qwen1.5-moe-a2.7b.json").read()) | change
    with pytest.raises(ModelcutError, match=msg):
        catalog.model_from_hf_config(cfg)


def test_qwen_leading_dense_layers_and_deepseek_freq():
    cfg = json.loads(open("tests/data/hf/qwen1.5-moe-a2.7b.json").read()) | {"mlp_only_layers": [0, 1]}
    assert catalog.model_from_hf_config(cfg).dense_layers == 2
    ds = json.loads(open("tests/data/hf/deepseek-v3.json").read())
    with pytest.raises(ModelcutError, match="moe_layer_freq"):
        catalog.model_from_hf_config(ds | {"moe_layer_freq": 2})
    with pytest.raises(ModelcutError, match="missing 'kv_lora_rank'"):
        catalog.model_from_hf_config({k: v for k, v in ds.items() if k != "kv_lora_rank"})


# ---------------------------------------------------------------- RUN.toml

def _doc(**model):
    return {"model": {"layers": 4, "hidden": 256, "heads": 4, "vocab": 1000, "gated_mlp": True, **model},
            "hardware": {"gpu": "h100", "gpus": 16},
            "layout": {"tp": 2, "pp": 1, "dp": 8, "ep": 4, "etp": 1, "cp_kind": "ring", "sequence_parallel": True},
            "training": {"seq_len": 1024, "global_batch": 16}}


def test_runfile_moe_fields():
    run = run_from_dict(_doc(experts=8, top_k=2, expert_ffn_hidden=512, shared_experts=1, dense_layers=1,
                             capacity_factor=1.25))
    m, L = run.model, run.layout
    assert (m.experts, m.top_k, m.expert_ffn_hidden, m.shared_experts, m.dense_layers, m.capacity_factor) == \
        (8, 2, 512, 1, 1, 1.25)
    assert (L.ep, L.etp, L.cp_kind) == (4, 1, "ring")


@pytest.mark.parametrize("model,msg", [
    ({"experts": 8, "top_k": 2, "capacity_factor": 0}, "capacity_factor must be more than 0"),
    ({"experts": 8, "top_k": 2, "capacity_factor": "x"}, "capacity_factor"),
    ({"experts": 8, "top_k": 9}, "top_k"),
    ({"experts": 8, "top_k": 2, "expert_ffn_hidden": 511}, "must divide expert_ffn_hidden"),
    ({"experts": 6, "top_k": 2}, "must divide the experts"),
    ({"experts": 8, "shared_experts": -1}, "shared_experts"),
])
def test_runfile_moe_errors(model, msg):
    doc = _doc(**model)
    if "expert_ffn_hidden" in model:
        doc["layout"]["etp"] = 2
    with pytest.raises(ModelcutError, match=msg):
        run_from_dict(doc)


# ---------------------------------------------------------------- the stacks' default expert tensor parallelism

def _moe_run(etp=None, tp=2, ep=8):
    from modelcut.core.specs import Layout, Run, Training
    return Run(catalog.model("mixtral-8x7b"), "h100-sxm5-80gb", Layout(tp=tp, dp=8, ep=ep, etp=etp),
               Training(seq_len=4096, global_batch=64, micro_batch=1, recompute="full"))


@pytest.mark.parametrize("fw, etp, tp, ep, want", [
    ("fsdp", None, 2, 8, 1),               # torchtitan v0.2.2: expert_tensor_parallel_degree = 1
    ("nemo-automodel", None, 2, 8, 1),     # AutoModel's (ep_shard, ep) mesh over dp·cp·tp
    ("fsdp-compile", None, 2, 8, 1),
    ("fsdp", 2, 2, 8, 2),                  # a layout's own etp stays
    ("fsdp", None, 1, 8, None),            # nothing to cut without tp
    ("fsdp", None, 2, 1, None),            # no expert parallelism: the experts as the MLP, over tp
    ("megatron-core", None, 2, 8, None),   # Megatron-core: etp = tp unless set
])
def test_the_stack_fills_the_experts_tensor_parallelism(fw, etp, tp, ep, want):
    assert catalog.framework(fw).resolve(_moe_run(etp, tp, ep)).layout.etp == want


def test_an_fsdp_moe_step_without_etp_is_its_step_with_etp_1():
    from helpers import predict_default
    hw = catalog.hardware("h100")
    t = {etp: predict_default(_moe_run(etp), hw, framework="fsdp").step_time_s for etp in (None, 1, 2)}
    assert t[None] == t[1] != t[2]


def test_the_explorer_keeps_the_experts_whole_on_a_stack_that_does(capsys):
    from modelcut.cli import main
    """On torchtitan every MoE layout with tp > 1 and ep > 1 is searched with etp 1, as the stack runs
    it (its --emit writes expert_tensor_parallel_degree = 1); Megatron-core still cuts them over tp."""
    args = ["explore", "--model", "mixtral-8x7b", "--gpu", "h100", "--gpus", "16", "--seq", "4096",
            "--global-batch-tokens", "256K", "--top", "500", "--json", "--micro-batches", "1",
            "--schedules", "1f1b"]
    for fw, whole in (("torchtitan", True), ("megatron-core", False)):
        assert main(args + ["--framework", fw]) == 0
        rows = [x for x in json.loads(capsys.readouterr().out)["layouts"] if x["tp"] > 1 and x["ep"] > 1]
        assert rows, fw
        assert all(x["etp"] == 1 for x in rows) == whole
    with pytest.raises(ModelcutError, match="default_etp must be 1"):
        replace(catalog.framework("fsdp"), default_etp=2)
