"""torchtitan's per-op selective activation checkpointing (modelcut.core.costs.op_sac): which
products it keeps and runs again, the bytes a layer keeps, and that the step time and memory both
read that one policy: selective sits between none and full on both."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given, settings, strategies as st

from modelcut import catalog
from modelcut.core.costs import fp8 as fp8_mod, op_sac
from modelcut.core.costs.kernels import Efficiency
from modelcut.core.memory import memory_report
from modelcut.core.memory.activations import layer_activation_bytes
from modelcut.core.specs import Layout, Run, Training
from modelcut.core.step import default
from modelcut.core.step.layers import LayerSetup, layer_time

EFF = Efficiency(0.8, 0.8, 0.9)
H100 = catalog.hardware("h100")
LLAMA8 = catalog.model("llama3-8b")
GPT3 = catalog.model("gpt3-175b")
OP_STACKS = ("fsdp", "fsdp-compile")


def test_torchtitans_call_order_keeps_the_odd_products():
    """wq, wk, wv, wo, w1, w3, w2 (gated): q, v, w1, w2 kept; k, wo, w3 run again. An ungated MLP
    calls two products, so its down product is the sixth, run again."""
    assert [n for n, _ in op_sac.call_order(LLAMA8)] == ["qkv", "qkv", "qkv", "proj", "mlp up", "mlp up", "mlp down"]
    assert op_sac.kept(LLAMA8) == [True, False, True, False, True, False, True]
    assert op_sac.recomputed_share(LLAMA8) == pytest.approx(
        {"qkv": 1024 / (4096 + 2 * 1024), "proj": 1.0, "mlp up": 0.5, "mlp down": 0.0})
    assert op_sac.recomputed_share(GPT3) == pytest.approx(
        {"qkv": 1 / 3, "proj": 1.0, "mlp up": 0.0, "mlp down": 1.0})


def test_kept_bytes_of_llama3_8b_by_hand():
    """Per token, t = 1: the block's input 2·4096, q 2·4096, v 2·1024, w1 2·14336, w2 2·4096, SDPA's
    output 2·4096 and its FP32 log-sum-exp 4·32 = 63,616 bytes. With t = 2 and sequence parallelism:
    the input 2·4096/2, q 2·2048, v 2·512, w1 2·7168, w2's partial sum 2·4096, the output 2·2048,
    the log-sum-exp 4·16, and the two reduce-scatters' outputs 2·(2·4096/2)."""
    assert op_sac.kept_bytes(LLAMA8) == 63_616
    assert layer_activation_bytes(LLAMA8, micro_batch=1, seq=1) == 139_392      # kept without recomputation
    assert op_sac.kept_bytes(LLAMA8, 2, True) == (4096 + 2 * (2048 + 512 + 7168 + 4096) + 2 * 2048 + 64
                                                 + 2 * 4096)


def test_memory_reads_the_policy_only_on_the_per_op_stacks():
    """Megatron's attention policy keeps what it did (a flash-attention layer's selective bytes are
    its no-recomputation bytes); the per-op policy keeps kept_bytes a token, for an MoE layer too."""
    kw = dict(micro_batch=2, seq=4096, t=1)
    none = layer_activation_bytes(LLAMA8, **kw)
    assert layer_activation_bytes(LLAMA8, recompute="selective", **kw) == none
    assert layer_activation_bytes(LLAMA8, recompute="selective", selective="op", **kw) == 2 * 4096 * 63_616
    moe = catalog.model("mixtral-8x7b")
    assert (layer_activation_bytes(moe, recompute="selective", selective="op", moe=True, **kw)
            == 2 * 4096 * 26_768)
    assert (layer_activation_bytes(moe, recompute="selective", moe=True, **kw)
            > 5 * layer_activation_bytes(moe, recompute="selective", selective="op", moe=True, **kw))


def test_an_moe_block_counts_its_router_and_shared_experts():
    """torchtitan's MoE block calls wq, wk, wv, wo, the router's gate, the routed experts (grouped,
    off the list: all run again) and the shared experts' w1, w3, w2. Mixtral 8x7B (no shared
    expert) keeps q, v and the router's 8 scores: per token at t = 1 its input 2·4096, q 2·4096,
    v 2·1024, the scores 2·8, SDPA's output 2·4096 and log-sum-exp 4·32 = 26,768 bytes; with ep 8,
    the dispatched and combined rows too, 2 · 2·2·4096 a token. DeepSeek-V3's latent attention
    calls five products (wq_a, wq_b, wkv_a, wkv_b, wo: its latents and wo's output kept, the up
    projections run again), so its router is the 6th product and runs again, and of its one shared
    expert it keeps w1 and w2 (the 7th and 9th) and runs w3 again. In FP8 only the 16-bit router
    counts, so it is kept and every other product runs again."""
    mix = catalog.model("mixtral-8x7b")
    assert [n for n, _ in op_sac.call_order(mix, moe=True)] == ["qkv", "qkv", "qkv", "proj", "router"]
    assert op_sac.kept(mix, moe=True) == [True, False, True, False, True]
    assert op_sac.kept_bytes(mix, moe=True) == 26_768
    assert op_sac.kept_bytes(mix, moe=True, ep=8) == 26_768 + 2 * 2 * 2 * 4096   # dispatched + combined, 2 B, top 2
    assert op_sac.recomputed_share(mix, moe=True)["expert up"] == op_sac.recomputed_share(mix, moe=True)["expert down"] == 1.0
    dsv3 = catalog.model("deepseek-v3")
    names = [n for n, _ in op_sac.call_order(dsv3, moe=True)]
    assert names == ["q down", "q up", "kv down", "kv up", "proj",
                     "router", "shared expert up", "shared expert up", "shared expert down"]
    assert op_sac.kept(dsv3, moe=True) == [True, False, True, False, True, False, True, False, True]
    share = op_sac.recomputed_share(dsv3, moe=True)
    assert share["q up"] == share["kv up"] == share["router"] == 1.0 and share["q down"] == share["proj"] == 0.0
    assert share["shared expert up"] == 0.5 and share["shared expert down"] == 0.0
    assert op_sac.kept(dsv3, moe=True, scaled_mm=True) == [False] * 5 + [True, False, False, False]


def test_recomputed_products_follow_the_policy():
    """The recomputed forward's products are each fused product's share of its forward time."""
    base = dict(micro_batch=1, seq_len=8192, attention="cudnn", recompute="selective", selective="op",
                fused_elementwise=False)
    op = layer_time(LLAMA8, LayerSetup(**base), H100, EFF)
    whole = layer_time(LLAMA8, LayerSetup(**dict(base, recompute="full")), H100, EFF)
    assert op.recompute.attention == 0.0
    assert 0.3 * whole.recompute.gemm < op.recompute.gemm < 0.45 * whole.recompute.gemm   # 36.5 % of the FLOPs
    assert op.recompute.memory <= whole.recompute.memory            # every memory-bound kernel, the fused attention's none


def test_fp8_products_are_all_run_again():
    """torchao's products are ``aten._scaled_mm``, which the policy's list (torchtitan v0.2.0) does not
    name: none is kept, every one runs again. Llama 3 8B then keeps, per token at t = 1, its input
    2·4096, SDPA's output 2·4096 and log-sum-exp 4·32 = 16,512 bytes; its recomputed forward runs
    every product, as full recomputation's does, and the attention core not at all."""
    assert op_sac.kept(LLAMA8, scaled_mm=True) == [False] * 7
    assert op_sac.recomputed_share(LLAMA8, scaled_mm=True) == {"qkv": 1.0, "proj": 1.0, "mlp up": 1.0,
                                                               "mlp down": 1.0}
    assert op_sac.kept_bytes(LLAMA8, scaled_mm=True) == 16_512
    assert (layer_activation_bytes(LLAMA8, micro_batch=1, seq=1, recompute="selective", selective="op",
                                   fp8_products=True) == 16_512)
    fw = catalog.framework("fsdp-compile")
    f8 = fp8_mod.for_stack(Training(seq_len=8192, global_batch=8, precision="fp8"), H100, fw)
    base = dict(micro_batch=1, seq_len=8192, attention="cudnn", recompute="selective", selective="op", fp8=f8)
    op = layer_time(LLAMA8, LayerSetup(**base), H100, EFF)
    whole = layer_time(LLAMA8, LayerSetup(**dict(base, recompute="full")), H100, EFF)
    assert op.recompute.gemm == pytest.approx(whole.recompute.gemm) and op.recompute.attention == 0.0
    r = _run(LLAMA8, "selective", seq=8192, precision="fp8")
    peak = {p: memory_report(_run(LLAMA8, "selective", seq=8192, precision=p), H100, framework=fw)["peak_bytes"]
            for p in ("bf16", "fp8")}
    assert peak["fp8"] < peak["bf16"]
    assert default.predict(r, H100, EFF, fw).step_time_s < default.predict(_run(LLAMA8, "full", seq=8192,
                                                                                 precision="fp8"),
                                                                            H100, EFF, fw).step_time_s


def _run(model, recompute, tp=1, dp=8, mb=1, seq=4096, precision="bf16"):
    return Run(model, H100.name, Layout(tp=tp, pp=1, dp=dp),
               Training(seq_len=seq, global_batch=dp * mb * 2, micro_batch=mb, recompute=recompute,
                        precision=precision))


@settings(max_examples=25, deadline=None)
@given(model=st.sampled_from(["llama3-8b", "gpt3-175b", "mpt-7b", "qwen2.5-14b", "llama3-70b", "mixtral-8x7b",
                              "qwen3-30b-a3b"]),
       stack=st.sampled_from(OP_STACKS), tp=st.sampled_from([1, 2, 4, 8]), mb=st.sampled_from([1, 2, 4]),
       seq=st.sampled_from([1024, 4096, 16384]), precision=st.sampled_from(["bf16", "fp8"]))
def test_selective_against_none_and_full(model, stack, tp, mb, seq, precision):
    """On the per-op stacks a model's step under selective recomputation takes no less than
    with none and no more than with full, and its peak activations are no less than full
    recomputation's. They exceed none's by at most what the policy keeps and no recomputation does
    not: the row-parallel MLP product's whole-width partial sum, 2h a token, and the two
    reduce-scatters' outputs, 2·2h/t (none keeps the MLP's inputs instead). In FP8 too, where the
    policy keeps no product."""
    m = catalog.model(model)
    fw = catalog.framework(stack)
    acts, steps = {}, {}
    for rc in ("none", "selective", "full"):
        r = _run(m, rc, tp=tp, dp=64 // tp, mb=mb, seq=seq, precision=precision)
        acts[rc] = max(s["activations_bytes"] for s in memory_report(r, H100, framework=fw)["stages"])
        steps[rc] = default.predict(r, H100, EFF, fw).step_time_s
    extra = m.layers * mb * seq * 2 * m.hidden * (1 + 2 / tp)
    assert acts["full"] <= acts["selective"] <= acts["none"] + extra
    assert steps["none"] <= steps["selective"] * (1 + 1e-9) and steps["selective"] <= steps["full"] * (1 + 1e-9)


def test_at_high_tp_the_policy_can_keep_more_than_no_recomputation():
    """Qwen2.5 14B at t = 8: the kept partial sum of w2 (2·5120 bytes a token) outweighs the MLP's
    inputs no recomputation keeps (6·13824/8), so the layer keeps 20,372 bytes a token against 18,580."""
    q = catalog.model("qwen2.5-14b")
    assert op_sac.kept_bytes(q, 8, True) == 20_372
    assert layer_activation_bytes(q, micro_batch=1, seq=1, t=8, sequence_parallel=True) == 18_580


def test_the_explorer_and_predict_agree_on_selective_memory():
    """The explorer's memory options come from the same stack rule (stack_options), so its peak for a
    selective layout is predict's."""
    from modelcut.core.memory import stack_options
    fw = catalog.framework("fsdp-compile")
    assert stack_options(fw).selective == "op"
    assert stack_options(catalog.framework("megatron-core")).selective == "attention"
    r = _run(LLAMA8, "selective", seq=8192)
    a = memory_report(r, H100, framework=fw)["peak_bytes"]
    b = memory_report(r, H100, framework=replace(fw, selective="attention"))["peak_bytes"]
    assert a < b


def test_reported_flops_count_the_products_the_policy_runs_again():
    """The TFLOP/s count adds what the policy recomputes, not Megatron's attention core: Llama 3 8B's
    k, wo and w3, 4096·(1024 + 4096 + 14336) weights a layer; in FP8 every product, so full
    recomputation's work less the attention core's 4·s·q a token a layer. An MoE layer adds its
    top_k routed experts, whatever the precision."""
    from modelcut.core.costs import flops
    s, tokens = 8192, 2 * 8192
    assert op_sac.recompute_flops(LLAMA8, 2, s) == tokens * 32 * 2.0 * 4096 * (1024 + 4096 + 14336)
    assert op_sac.recompute_flops(LLAMA8, 2, s, scaled_mm=True) == pytest.approx(
        flops.recompute_flops(LLAMA8, 2, s, "full") - tokens * 32 * 4.0 * s * LLAMA8.q_dim)
    mix = catalog.model("mixtral-8x7b")
    routed = 2 * 3 * 4096 * 14336                   # top 2 of SwiGLU experts of width 14336
    assert op_sac.recompute_flops(mix, 1, s) == s * 32 * 2.0 * (4096 * 1024 + 4096 * 4096 + routed)
    fw = catalog.framework("fsdp-compile")
    r = _run(LLAMA8, "selective", seq=s)
    p = default.predict(r, H100, EFF, fw)
    assert p.flops_per_step == pytest.approx(flops.model_flops(LLAMA8, r.training, "palm")
                                             + op_sac.recompute_flops(LLAMA8, r.training.global_batch, s))
    mega = default.predict(r, H100, EFF, catalog.framework("megatron-core"))
    assert mega.flops_per_step == pytest.approx(flops.reported_flops(LLAMA8, r.training))
