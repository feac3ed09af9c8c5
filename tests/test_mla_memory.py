"""DeepSeek-V3's memory savings as Megatron-core's knobs (DeepSeek-AI 2024 §3.2.3, §3.3.2): what a
multi-head latent attention layer keeps, ``mla_up_proj`` and ``layernorm`` on it, the SwiGLU's input
kept in FP8 (``activation_func_fp8_input_store``) and Adam's moments in BF16 (``adam_moments``)."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given, settings, strategies as st

from modelcut import catalog
from modelcut.core.costs.kernels import Efficiency, gemm_fwd_bwd, mem_time
from modelcut.core.errors import ModelcutError
from modelcut.core.memory import memory_report
from modelcut.core.memory.activations import layer_activation_bytes
from modelcut.core.specs import Layout, Run, Training
from modelcut.core.step.elementwise import ACT_FP8_STORE_BYTES, NORM_BYTES
from modelcut.core.step.layers import LayerSetup, layer_time, mla_up_products
from modelcut.core.units import optimizer_step_bytes

H100 = catalog.hardware("h100")
EFF = Efficiency(0.8, 0.8, 0.6)
DSV3 = catalog.model("deepseek-v3")
LLAMA = catalog.model("llama3-8b")
N = 4096


def acts(model=DSV3, **kw):
    base = dict(micro_batch=1, seq=N, moe=True)
    base.update(kw)
    return layer_activation_bytes(model, **base)


def setup(mods=("core_attn",), **kw) -> LayerSetup:
    base = dict(micro_batch=1, seq_len=N, attention="cudnn", recompute="selective", recompute_modules=mods,
                tp_bw=H100.link_bw, mcore_layers=True)
    base.update(kw)
    return LayerSetup(**base)


def test_the_catalog_gives_deepseek_v3_its_latent_widths():
    """HF config.json deepseek-ai/DeepSeek-V3 and the report's §4.2: latents 1536 and 512, heads of
    128 + 64 (RoPE) for Q and K and 128 for V; the seed model's grouped-query stand-in is unchanged."""
    assert (DSV3.q_lora_rank, DSV3.kv_lora_rank, DSV3.qk_nope_head_dim, DSV3.qk_rope_head_dim,
            DSV3.v_head_dim) == (1536, 512, 128, 64, 128)
    assert DSV3.is_mla and not LLAMA.is_mla
    assert (DSV3.kv_heads, DSV3.d_head) == (8, 96)


def test_a_latent_attention_layer_keeps_its_own_q_k_v_and_output():
    """Without recomputation the layer keeps Q and K, H·(d_nope + d_rope) each, V and the output,
    H·d_v each, 16-bit: the stand-in's grouped-query Q, K, V would be far fewer bytes."""
    H, qk, v = DSV3.heads, 128 + 64, 128
    stand_in = replace(DSV3, q_lora_rank=None, kv_lora_rank=None, qk_nope_head_dim=None, qk_rope_head_dim=None,
                       v_head_dim=None)
    mine = 2 * (2 * H * qk + H * v) + 2 * H * v
    theirs = 2 * DSV3.q_dim + 4 * DSV3.kv_heads * DSV3.d_head + 2 * DSV3.q_dim
    assert acts() - acts(stand_in) == pytest.approx(N * (mine - theirs))
    # tensor parallelism cuts the heads
    assert acts(t=8) - acts(stand_in, t=8) == pytest.approx(N * (mine - theirs) / 8)


@pytest.mark.parametrize("sp", [False, True])
def test_mla_up_proj_keeps_the_latents_instead_of_q_k_v(sp):
    """``mla_up_proj`` discards Q, K and V and keeps the up-projections' inputs, the latents and the
    shared RoPE key, r_q + r_kv + d_rope 16-bit elements a token, whole on each tensor-parallel rank
    (the down-projections are plain linears), cut by sequence parallelism."""
    t = 4
    H = DSV3.heads / t
    kw = dict(recompute="selective", t=t, sequence_parallel=sp)
    none = acts(**dict(kw, recompute_modules=("core_attn",)))
    up = acts(**dict(kw, recompute_modules=("core_attn", "mla_up_proj")))
    qkv = 2 * (2 * H * 192 + H * 128)
    latents = 2 * (1536 + 512 + 64) / (t if sp else 1)
    assert none - up == pytest.approx(N * (qkv - latents))


def test_layernorm_drops_the_latent_layers_input_norm_too():
    """With latent attention the input norm is its own kernel (the down-projections are plain
    linears): ``layernorm`` drops its output in every layer, dense ones too, and the MoE layer's
    pre-MLP norm's as before; 2 bytes an element, 1 where the saved copy is FP8."""
    h = DSV3.hidden
    for fp8, el in ((False, 2), (True, 1)):
        for moe, norms in ((False, 1), (True, 2)):
            kw = dict(recompute="selective", fp8=fp8, moe=moe)
            assert acts(**kw) - acts(recompute_modules=("core_attn", "layernorm"), **kw) == \
                pytest.approx(N * norms * el * h)
    dense = layer_time(DSV3, setup(("layernorm",)), H100, EFF).recompute
    assert dense.memory == pytest.approx(mem_time(NORM_BYTES * N * h, H100, EFF))
    assert layer_time(LLAMA, setup(("layernorm",)), H100, EFF).recompute.total == 0.0


def test_mla_up_proj_reruns_the_up_projections_and_their_norms_and_rope():
    """The recomputation runs the two up-projections' forwards (timed from the tables), the latents'
    norms and RoPE on the queries' and the shared key's rotary parts; a model without latent
    attention has none to run."""
    prods = mla_up_products(DSV3, setup())
    assert [(m, n, k) for m, n, k, _ in prods] == [(N, 128 * 192, 1536), (N, 128 * 256, 512)]
    rc = layer_time(DSV3, setup(("mla_up_proj",)), H100, EFF, moe=True, ep=8).recompute
    assert rc.gemm == pytest.approx(sum(gemm_fwd_bwd(m, n, k, H100, EFF)[0] for m, n, k, _ in prods))
    assert rc.memory == pytest.approx(mem_time(N * (NORM_BYTES * (1536 + 512) + 4.0 * 129 * 64), H100, EFF))
    assert rc.attention == 0.0
    assert mla_up_products(LLAMA, setup()) == ()


def test_the_swiglu_input_in_fp8_keeps_half_its_bytes_and_casts_twice():
    """``activation_func_fp8_input_store``: the up product's output, the SwiGLU's input, kept at 1 byte
    an element instead of 2 (dense MLP, shared and routed experts), cast there and back (3 bytes an
    element each way); where ``moe_act`` recomputes the routed experts' activation their checkpoint
    keeps that input in 16 bits, so only the shared expert's saves."""
    f, fe, k = LLAMA.ffn_hidden, DSV3.expert_ffn_hidden, DSV3.top_k
    assert acts(LLAMA, moe=False) - acts(LLAMA, moe=False, act_fp8_input=True) == pytest.approx(N * 2 * f)
    assert acts() - acts(act_fp8_input=True) == pytest.approx(N * (k + 1) * 2 * fe)
    kw = dict(recompute="selective", recompute_modules=("moe_act",))
    assert acts(**kw) - acts(act_fp8_input=True, **kw) == pytest.approx(N * 2 * fe)
    plain = layer_time(LLAMA, setup(recompute="none"), H100, EFF)
    stored = layer_time(LLAMA, setup(recompute="none", act_fp8_input=True), H100, EFF)
    item = dict((name, (a, b)) for name, a, b in stored.memory_bytes)["SwiGLU input to FP8 and back"]
    assert item == pytest.approx(tuple(c * N * 2 * f for c in ACT_FP8_STORE_BYTES))
    assert stored.fwd.memory - plain.fwd.memory == pytest.approx(mem_time(item[0], H100, EFF))


def _run(model=DSV3, **tr) -> Run:
    return Run(model, "h100-sxm5-80gb", Layout(tp=1, pp=4, dp=16, ep=8 if model.is_moe else 1),
               Training(seq_len=N, global_batch=256, **tr))


@pytest.mark.parametrize("fw, before, after, label", [
    ("megatron-core", 12, 8, "fp32 master weights + bf16 Adam m and v"),
    ("fsdp", 8, 4, "bf16 Adam m and v (the fp32 weights are the master copy)"),
])
def test_bf16_moments_take_two_bytes_each(fw, before, after, label):
    """``adam_moments = "bf16"``: Megatron-core's precision-aware optimizer keeps each moment in 2 bytes
    beside the FP32 master copy (12 → 8 bytes a parameter); FSDP's FP32 parameters stay the master
    copy (8 → 4)."""
    run = _run(LLAMA)
    bf = _run(LLAMA, adam_moments="bf16")
    framework = catalog.framework(fw)
    a, b = memory_report(run, H100, framework=framework), memory_report(bf, H100, framework=framework)
    assert b["stages"][0]["optimizer_bytes"] == pytest.approx(a["stages"][0]["optimizer_bytes"] * after / before)
    assert b["dtypes"]["optimizer_bytes"] == label
    assert memory_report(_run(LLAMA, adam_moments="fp32"), H100, framework=framework)["stages"][0][
        "optimizer_bytes"] == pytest.approx(a["stages"][0]["optimizer_bytes"])


def test_bf16_moments_move_fewer_bytes_in_the_optimizer_step():
    """Adam reads and writes each moment: 2 bytes fewer an element each way for each, 8 a parameter."""
    assert optimizer_step_bytes(1000, 4) - optimizer_step_bytes(1000, 4, moment_bytes=2) == pytest.approx(1000 * 8 / 4)
    assert optimizer_step_bytes(1000, 4, moment_bytes=4) == pytest.approx(optimizer_step_bytes(1000, 4))


@pytest.mark.parametrize("make, words", [
    (lambda: _run(LLAMA, recompute="selective", recompute_modules=("mla_up_proj",)),
     "mla_up_proj needs multi-head latent attention"),
    (lambda: _run(catalog.model("gpt3-175b"), activation_func_fp8_input_store=True), "has no gated MLP"),
    (lambda: Training(seq_len=N, global_batch=8, adam_moments="fp16"), "adam_moments must be one of fp32, bf16"),
    (lambda: Training(seq_len=N, global_batch=8, activation_func_fp8_input_store="yes"), "must be true or false"),
    (lambda: replace(DSV3, qk_rope_head_dim=None), "needs kv_lora_rank, qk_nope_head_dim"),
    (lambda: replace(LLAMA, q_lora_rank=512), "q_lora_rank alone"),
    (lambda: memory_report(_run(LLAMA, adam_moments="fp32"), H100, framework=catalog.framework("nemo-automodel")),
     "no master copy"),
])
def test_bad_settings_are_one_line(make, words):
    with pytest.raises(ModelcutError, match=words) as e:
        make()
    assert "\n" not in str(e.value)


@settings(max_examples=20, deadline=None)
@given(st.sets(st.sampled_from(["core_attn", "layernorm", "moe_act", "mla_up_proj"]), min_size=1),
       st.sets(st.sampled_from(["core_attn", "layernorm", "moe_act", "mla_up_proj"]), min_size=1),
       st.sampled_from([1, 2, 8]), st.booleans(), st.booleans(), st.booleans())
def test_on_latent_attention_more_modules_keep_no_more_and_cost_no_less(a, b, tp, fp8, moe, store):
    """Property: on DeepSeek-V3's layers, for module sets a ⊆ a ∪ b, the larger set keeps no more bytes
    and its recomputation takes no less time; with the SwiGLU's FP8 input store, for sets without
    ``moe_act`` (whose checkpoint keeps that input in 16 bits: the next test)."""
    order = ("core_attn", "layernorm", "moe_act", "mla_up_proj")
    if store:
        a, b = a - {"moe_act"} or {"core_attn"}, b - {"moe_act"}
    small, big = tuple(m for m in order if m in a), tuple(m for m in order if m in a | b)
    kw = dict(micro_batch=1, seq=N, t=tp, sequence_parallel=tp > 1, moe=moe, fp8=fp8, recompute="selective",
              act_fp8_input=store)
    assert layer_activation_bytes(DSV3, recompute_modules=big, **kw) <= \
        layer_activation_bytes(DSV3, recompute_modules=small, **kw) + 1e-6
    s_a = setup(small, tp=tp, sequence_parallel=tp > 1, act_fp8_input=store)
    s_big = setup(big, tp=tp, sequence_parallel=tp > 1, act_fp8_input=store)
    ep = 8 if moe else 1
    assert layer_time(DSV3, s_big, H100, EFF, moe=moe, ep=ep).recompute.total >= \
        layer_time(DSV3, s_a, H100, EFF, moe=moe, ep=ep).recompute.total - 1e-15


def test_moe_act_beside_the_fp8_input_store_keeps_more():
    """With the SwiGLU's input stored in FP8 a routed row keeps that input (2·f_e bytes) and the down
    product's input (f_e in FP8); ``moe_act``'s checkpoint keeps the input in 16 bits instead (4·f_e)
    and drops the down product's: f_e bytes more a routed row. Megatron-core keeps what its source
    says, so recomputing more is not always keeping less."""
    fe, k = DSV3.expert_ffn_hidden, DSV3.top_k
    kw = dict(recompute="selective", fp8=True, act_fp8_input=True)
    assert acts(recompute_modules=("core_attn", "moe_act"), **kw) - acts(recompute_modules=("core_attn",), **kw) == \
        pytest.approx(N * k * fe)


def test_context_parallelism_moves_latent_attentions_own_q_k_v():
    """Latent attention runs its core on up-projected tensors, a K and V per query head: context
    parallelism passes and merges those (Q, K: H·192; V, output: H·128 on DeepSeek-V3), not the
    stand-in's 8 KV heads of 96. The all-to-all form can then cut K and V as finely as the query heads."""
    from modelcut.core.costs import context
    H = DSV3.heads
    assert context.cp_widths(DSV3, 1) == (H * 192, H * 192, H * 128, H * 128)
    assert context.cp_widths(DSV3, 4) == (H // 4 * 192, H // 4 * 192, H // 4 * 128, H // 4 * 128)
    assert context.cp_widths(LLAMA, 2) == (LLAMA.q_dim // 2, 4 * 128, 4 * 128, LLAMA.q_dim // 2)
    assert context.block_bytes(DSV3, 1, N, 2) == pytest.approx(N / 2 * H * (192 + 128) * 2)
    (qkv, out), (dout, grads) = context.a2a_tensors(DSV3, 1, N, 4)
    assert qkv == pytest.approx(tuple(N / 4 * w * 2 for w in (H * 192, H * 192, H * 128)))
    assert out == dout == pytest.approx((N / 4 * H * 128 * 2,))
    assert context.ring_merge_bytes(DSV3, 1, N, 2) == pytest.approx((N * H * 128 * 6, N * H * 512 * 6))
    assert context.heads_split_problem(DSV3, 1, 16) is None          # the stand-in's 8 KV heads would refuse it
    assert "KV heads" in context.heads_split_problem(replace(DSV3, q_lora_rank=None, kv_lora_rank=None,
                                                             qk_nope_head_dim=None, qk_rope_head_dim=None,
                                                             v_head_dim=None), 1, 16)


def test_latent_attentions_core_is_timed_and_counted_at_its_own_width():
    """The core runs on up-projected heads of 192 (QKᵀ) and 128 (A·V): 4·128·160 FLOPs a pair on
    DeepSeek-V3 where the stand-in's head_dim of 96 counts 60 % of it, timed at the tables' rate for
    heads of 128 (cuDNN's 192/128 forward runs at the 128/128 rate from 4K tokens: the catalog's
    cudnn-fe-2026-02 sweep); the FLOPs behind MFU count the same work."""
    from modelcut.core.costs import context, flops
    from modelcut.core.specs import MLA_FIELDS
    from modelcut.core.step.layers import layer_attention
    assert DSV3.core_width == 128 * 160 and LLAMA.core_width == LLAMA.q_dim
    heads128 = replace(DSV3, head_dim=128, **{f: None for f in MLA_FIELDS})
    s = setup()
    a, b = layer_attention(DSV3, s, H100, EFF), layer_attention(heads128, s, H100, EFF)
    k = 160 / 128
    assert (a.fwd_math, a.bwd_math, a.flops_fwd) == pytest.approx((k * b.fwd_math, k * b.bwd_math, k * b.flops_fwd))
    assert a.fwd_mem == pytest.approx(b.fwd_mem)
    assert context.attention_flops_per_pair(DSV3, 2) == 4 * 128 * 160 / 2
    stand_in = replace(DSV3, **{f: None for f in MLA_FIELDS})
    extra = flops.causal_model_flops(DSV3, 8, N) - flops.causal_model_flops(stand_in, 8, N)
    # the core's extra work, and the products' own weights: 187,105,280 a layer against the stand-in's 187,170,816
    weights = sum(n * k for _, _, n, k in context.attention_products(DSV3, 1)) - 2 * 7168 * 128 * 96 - 2 * 7168 * 8 * 96
    assert weights == 187_105_280 - 187_170_816
    assert extra == pytest.approx(8 * N * 3 * DSV3.layers * (4 * (128 * 160 - 128 * 96) * N / 2 + 2 * weights))


def test_the_explorer_counts_the_searchs_adam_moments_as_predict_does():
    """A search with Adam's moments in bf16 checks each layout's memory with 8 bytes of optimizer state
    a parameter beside the master copy, as ``predict`` counts the same run."""
    from modelcut.core.memory import memory_report
    from modelcut.core.step.default import default_plan
    from modelcut.service.explore import ExploreRequest, run_explore
    req = ExploreRequest(model=LLAMA, hw=H100, gpus=8, seq=N, global_batch_tokens=1 << 19, top=1,
                         framework="megatron-core")
    plain = run_explore(req).layouts[0]
    bf16 = run_explore(replace(req, space=replace(req.space, adam_moments="bf16")))
    fw = catalog.framework("megatron-core")
    assert plain.peak_bytes == pytest.approx(
        memory_report(plain.run, H100, plan=default_plan(plain.run), framework=fw)["peak_bytes"], rel=1e-9)
    low = [x for x in bf16.layouts if x.structure == plain.structure and x.zero == plain.zero
           and x.run.training.recompute == plain.run.training.recompute]
    assert low and low[0].run.training.adam_moments == "bf16" and low[0].peak_bytes < plain.peak_bytes
    assert low[0].peak_bytes == pytest.approx(
        memory_report(low[0].run, H100, plan=default_plan(low[0].run), framework=fw)["peak_bytes"], rel=1e-9)


def test_explore_takes_the_memory_settings_on_its_command_line(capsys):
    """``explore --adam-moments bf16 --fp8-swiglu-input`` searches with both (each layout's run carries
    them); a model without a gated MLP, or a moments type modelcut does not keep, is one line, exit 2."""
    from modelcut.cli import main
    argv = ["explore", "--model", "llama3-8b", "--gpu", "h100", "--gpus", "8", "--seq", "4096",
            "--global-batch-tokens", "512K", "--top", "1", "--json"]
    assert main(argv + ["--adam-moments", "bf16", "--fp8-swiglu-input"]) == 0
    capsys.readouterr()
    from modelcut.service.explore import explore_request
    from modelcut.service.requests import ExploreInput
    req = explore_request(ExploreInput(model="llama3-8b", gpu="h100", gpus=8, seq=4096, global_batch_tokens="512K",
                                       adam_moments="bf16", activation_func_fp8_input_store=True))
    assert req.space.adam_moments == "bf16" and req.space.act_fp8_input
    for extra, words in ((["--adam-moments", "fp16"], "--adam-moments must be one of"),
                         (["--fp8-swiglu-input", "--model", "gpt3-175b"], "has no gated MLP")):
        assert main(argv + extra) == 2
        err = capsys.readouterr().err.strip()
        assert words in err and "\n" not in err


def test_latent_attentions_products_are_its_own_five():
    """Latent attention runs wq_a, wq_b, wkv_a, wkv_b and wo at their own shapes, whose weights are
    the layer's exact count less the latents' two norms (187,107,328 − 2,048 on DeepSeek-V3); the
    step's product lines are those five, timed from the tables, not the grouped-query stand-in's
    QKV and projection."""
    from modelcut.core.costs import context, flops
    h = 7168
    prods = context.attention_products(DSV3, N)
    assert prods == (("q down", N, 1536, h), ("q up", N, 128 * 192, 1536), ("kv down", N, 512 + 64, h),
                     ("kv up", N, 128 * 256, 512), ("proj", N, h, 128 * 128))
    assert sum(n * k for _, _, n, k in prods) == flops.attention_params(DSV3) - (1536 + 512) == 187_107_328 - 2048
    lt = layer_time(DSV3, setup(), H100, EFF, moe=True, ep=8)
    lines = {p.name: p for p in lt.products}
    for name, m, n, k in prods:
        f, dg, wg = gemm_fwd_bwd(m, n, k, H100, EFF)
        assert (lines[name].m, lines[name].n, lines[name].k) == (m, n, k)
        assert (lines[name].fwd, lines[name].dgrad, lines[name].wgrad) == pytest.approx((f, dg, wg))
    assert "qkv" not in lines
    # without a query latent (DeepSeek-V2-Lite) the queries are projected from the input: four products
    lite = catalog.model("deepseek-v2-lite")
    four = context.attention_products(lite, N)
    assert [p[0] for p in four] == ["q", "kv down", "kv up", "proj"]
    assert four[0] == ("q", N, 16 * 192, 2048)
    assert sum(n * k for _, _, n, k in four) == flops.attention_params(lite) - 512
    # a model without latent attention keeps its two
    assert [p[0] for p in context.attention_products(LLAMA, N)] == ["qkv", "proj"]


@pytest.mark.parametrize("sp", [True, False])
def test_tensor_parallelism_duplicates_the_down_projections(sp):
    """The down projections' weights are whole on every tensor-parallel rank (Megatron-core's
    ``parallel_mode="duplicated"``): each rank projects its own T/t tokens under sequence
    parallelism, all T without it; the up projections and the output are cut over the heads. A rank
    holds both down projections whole, and the column-parallel gather moves the latents and the
    shared RoPE key, r_q + r_kv + d_rope = 2,112 elements a token, not the hidden 7,168."""
    from modelcut.core.costs import context, params
    from modelcut.core.step.layer_comm import tp_gather_width
    t = 8
    prods = {n: (m, nn, k) for n, m, nn, k in context.attention_products(DSV3, N, t, sp)}
    rows = N / t if sp else N
    assert prods["q down"] == (rows, 1536, 7168) and prods["kv down"] == (rows, 576, 7168)
    assert prods["q up"] == (N, 16 * 192, 1536) and prods["proj"] == (N, 7168, 16 * 128)
    dense1, dense8 = params.layer_params(DSV3, 1, False)[0], params.layer_params(DSV3, 8, False)[0]
    down = 7168 * (1536 + 576)
    assert dense8 - down - (1536 + 512) == pytest.approx((dense1 - down - (1536 + 512) - 2 * 7168) / 8 + 2 * 7168)
    assert tp_gather_width(DSV3) == 2112 and tp_gather_width(LLAMA) == 4096
    stand_in = replace(DSV3, **{f: None for f in ("q_lora_rank", "kv_lora_rank", "qk_nope_head_dim",
                                                  "qk_rope_head_dim", "v_head_dim")})
    s = setup(tp=t, sequence_parallel=True)
    mine, theirs = layer_time(DSV3, s, H100, EFF, moe=True, ep=8), layer_time(stand_in, s, H100, EFF, moe=True, ep=8)
    assert 0 < mine.fwd.tp < theirs.fwd.tp and 0 < mine.bwd.tp < theirs.bwd.tp


def test_a_dense_latent_attention_model_is_refused_by_the_deepspeed_replay_in_one_line():
    """The DeepSpeed v0.3 ZeRO-3 replay hooks a layer of four linears (QKV, projection, MLP up and
    down); a dense model with latent attention (DeepSeek-V2-Lite's attention, one dense MLP) is
    refused there in one line and predicted under FSDP."""
    from modelcut.service.predict import PredictRequest, predict
    dense = replace(catalog.model("deepseek-v2-lite"), name="mla-dense", experts=1, top_k=1, shared_experts=0,
                    expert_ffn_hidden=None, dense_layers=0)
    run = Run(model=dense, gpu="a100", layout=Layout(tp=1, pp=1, dp=8, zero=3),
              training=Training(seq_len=2048, global_batch=8, micro_batch=1))
    with pytest.raises(ModelcutError, match="multi-head latent attention") as e:
        predict(PredictRequest(run=run, framework="deepspeed-zero3"))
    assert "\n" not in str(e.value)
    p = predict(PredictRequest(run=run, framework="fsdp")).prediction
    assert p.step_time_s > 0 and 0 < p.mfu < 1
