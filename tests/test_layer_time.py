"""One transformer layer, the embedding and the loss, kernel by kernel."""

from __future__ import annotations

import math
from dataclasses import replace

import pytest
from hypothesis import given, settings, strategies as st

from modelcut import catalog
from modelcut.core.costs import comm
from modelcut.core.errors import ModelcutError
from modelcut.core.costs.kernels import Efficiency, attention_time, gemm_fwd_bwd, hbm_bandwidth
from modelcut.core.step import elementwise as E
from modelcut.core.step.layers import LayerSetup, embedding_time, layer_time, loss_time

A100 = catalog.hardware("a100")
H100 = catalog.hardware("h100")
EFF = Efficiency(0.75, 0.65, 0.6)
GPT22 = catalog.published_run("korthikanti-22b-full").run.model       # Korthikanti et al. 2022's 22B
LLAMA = catalog.model("llama3-405b")


def setup(**kw) -> LayerSetup:
    base = dict(micro_batch=4, seq_len=2048, tp=8, attention="unfused", grad_accum_fusion=True, tp_bw=A100.link_bw)
    base.update(kw)
    return LayerSetup(**base)


def test_forward_products_are_the_four_linears():
    st_ = setup()
    lt = layer_time(GPT22, st_, A100, EFF)
    T, h, t = 4 * 2048, GPT22.hidden, 8
    shapes = [(T, 3 * h // t, h), (T, h, h // t), (T, 4 * h // t, h), (T, h, 4 * h // t)]
    assert lt.fwd.gemm == pytest.approx(sum(gemm_fwd_bwd(*s, A100, EFF)[0] for s in shapes))
    assert lt.bwd.gemm == pytest.approx(sum(sum(gemm_fwd_bwd(*s, A100, EFF)[1:]) for s in shapes))
    assert lt.wgrad == pytest.approx(sum(gemm_fwd_bwd(*s, A100, EFF)[2] for s in shapes))
    att = attention_time("unfused", 4, GPT22.heads // t, 2048, 2048, GPT22.d_head, True, True, A100, EFF)
    assert lt.fwd.attention == pytest.approx(att.fwd_math)


def test_tensor_parallel_traffic_per_layer():
    lt = layer_time(GPT22, setup(), A100, EFF)
    msg = 4 * 2048 * GPT22.hidden * 2
    # inside a node: the measured nccl-tests all-reduce time at that size, at the sustained share
    ar = comm.collective("all-reduce", 8, msg, A100.link_bw, A100, inside=True, net=EFF.net)
    assert ar > comm.ring_allreduce(8, msg, A100.link_bw * EFF.net)   # measured is below line rate
    assert lt.fwd.tp == pytest.approx(2 * ar)
    assert lt.bwd.tp == pytest.approx(2 * ar)          # synchronous backward all-reduces
    sp = layer_time(GPT22, setup(sequence_parallel=True), A100, EFF)
    # all-gather + reduce-scatter move what an all-reduce moves; measured, the pair is a little slower
    assert sp.fwd.tp == pytest.approx(lt.fwd.tp, rel=0.15)
    assert sp.bwd.tp > sp.fwd.tp                       # plus the re-gather for weight gradients
    assert layer_time(GPT22, setup(tp=1, tp_bw=0.0), A100, EFF).fwd.tp == 0


def test_async_backward_collectives_hide_behind_weight_gradients():
    sync = layer_time(GPT22, setup(), A100, EFF)
    asy = layer_time(GPT22, setup(tp_async_backward=True), A100, EFF)
    assert 0 <= asy.bwd.tp < sync.bwd.tp
    assert asy.fwd.tp == sync.fwd.tp


def test_sequence_parallelism_cuts_the_replicated_memory_bound_work():
    # Korthikanti et al. 2022 Table 4: sequence parallelism makes the forward faster (7.7 -> 7.2 ms).
    no = layer_time(GPT22, setup(), A100, EFF)
    sp = layer_time(GPT22, setup(sequence_parallel=True), A100, EFF)
    assert sp.fwd.memory < no.fwd.memory
    assert sp.fwd.total < no.fwd.total
    assert sp.fwd.gemm == no.fwd.gemm


def test_recomputation_reexecutes_what_it_recomputes():
    none = layer_time(GPT22, setup(), A100, EFF)
    full = layer_time(GPT22, setup(recompute="full"), A100, EFF)
    sel = layer_time(GPT22, setup(recompute="selective"), A100, EFF)
    assert none.recompute.total == 0
    assert full.recompute.total == pytest.approx(full.fwd.total)      # the whole forward, comm included
    att = attention_time("unfused", 4, GPT22.heads // 8, 2048, 2048, GPT22.d_head, True, True, A100, EFF)
    assert sel.recompute.total == pytest.approx(att.fwd)               # only the attention core
    assert 0 < sel.recompute.total < full.recompute.total


def test_unfused_gradient_accumulation_costs_a_pass_over_the_weights():
    fused = layer_time(GPT22, setup(), A100, EFF)
    unfused = layer_time(GPT22, setup(grad_accum_fusion=False), A100, EFF)
    h = GPT22.hidden
    local = 12 * h * h / 8
    assert unfused.bwd.memory - fused.bwd.memory == pytest.approx(6 * local / (EFF.mem * hbm_bandwidth(A100)), rel=1e-9)


def test_an_fp32_accumulator_through_a_cast_costs_eighteen_bytes_a_parameter():
    """DeepSpeed's BF16_Optimizer adds each micro-batch's bf16 gradient into an FP32 copy through an
    explicit cast (``.to(fp32)``: read 2, write a temporary 4; ``add_``: read 4 + 4, write 4): the
    megatron-deepspeed-2022 preset, BLOOM's, pays 18 bytes per parameter where Megatron-LM 2021's
    16-bit buffer pays 6; a one-kernel FP32 accumulation would pay 10."""
    from modelcut.catalog import framework
    from modelcut.core.units import GRAD_ACCUM_BYTES_32, GRAD_ACCUM_BYTES_32_CAST
    assert (GRAD_ACCUM_BYTES_32, GRAD_ACCUM_BYTES_32_CAST) == (10, 18)
    assert framework("megatron-deepspeed-2022").grad_accum_fusion is False
    assert framework("megatron-deepspeed-2022").grad_accum_bytes == 18
    assert framework("megatron-2021").grad_accum_bytes == 6
    six = layer_time(GPT22, setup(grad_accum_fusion=False), A100, EFF)
    eighteen = layer_time(GPT22, setup(grad_accum_fusion=False, grad_accum_bytes=18.0), A100, EFF)
    local = 12 * GPT22.hidden ** 2 / 8
    assert eighteen.bwd.memory - six.bwd.memory == pytest.approx(12 * local / (EFF.mem * hbm_bandwidth(A100)),
                                                                 rel=1e-9)
    assert eighteen.fwd == six.fwd


def test_context_parallel_gathers_keys_and_values():
    st_ = LayerSetup(micro_batch=1, seq_len=131072, tp=8, cp=16, attention="flash2", tp_bw=H100.link_bw,
                     cp_bw=H100.net_bw)
    lt = layer_time(LLAMA, st_, H100, EFF)
    kv = 131072 * 2 * (LLAMA.kv_dim // 8) * 2
    assert lt.fwd.cp == pytest.approx(comm.all_gather(16, kv, H100.net_bw * EFF.net))
    assert lt.bwd.cp == pytest.approx(comm.all_gather(16, kv, H100.net_bw * EFF.net)      # gathered again
                                      + comm.reduce_scatter(16, kv, H100.net_bw * EFF.net))


@settings(max_examples=25, deadline=None)
@given(b=st.sampled_from([1, 2, 4]), t=st.sampled_from([1, 2, 4, 8]), rec=st.sampled_from(["none", "selective", "full"]),
       sp=st.booleans(), kind=st.sampled_from(["unfused", "flash2"]))
def test_layer_parts_are_positive_and_grow_with_the_micro_batch(b, t, rec, sp, kind):
    s1 = LayerSetup(micro_batch=b, seq_len=2048, tp=t, sequence_parallel=sp and t > 1, recompute=rec,
                    attention=kind, tp_bw=A100.link_bw)
    one = layer_time(GPT22, s1, A100, EFF)
    two = layer_time(GPT22, replace(s1, micro_batch=2 * b), A100, EFF)
    for p in (one.fwd, one.bwd):
        assert p.gemm > 0 and p.memory > 0 and p.attention > 0
    assert two.fwd.total > one.fwd.total and two.bwd.total > one.bwd.total


def test_embedding_and_loss():
    st_ = setup()
    ef, eb = embedding_time(GPT22, st_, A100, EFF)
    lf, lb = loss_time(GPT22, st_, A100, EFF)
    assert ef.tp > 0 and eb.memory > 0                # vocab-parallel lookup is all-reduced
    logits = gemm_fwd_bwd(4 * 2048, GPT22.vocab // 8, GPT22.hidden, A100, EFF)
    assert lf.gemm == pytest.approx(logits[0])
    assert lb.gemm == pytest.approx(logits[1] + logits[2])
    fused = loss_time(GPT22, setup(cross_entropy="fused"), A100, EFF)
    assert fused[0].memory < lf.memory


def test_bad_setups():
    with pytest.raises(ModelcutError):
        LayerSetup(micro_batch=1, seq_len=2048, attention="ring")
    with pytest.raises(ModelcutError):
        LayerSetup(micro_batch=1, seq_len=2048, recompute="some")


def test_eager_elementwise_costs_more_memory_time_where_pytorch_splits_ops():
    """PyTorch's eager RMSNorm, SwiGLU and rotary embedding run one kernel per op: more HBM
    traffic than the fused kernels, the products untouched. LayerNorm and GeLU are single
    native kernels either way (GPT without dropout: no difference)."""
    from dataclasses import replace as _replace
    from modelcut import catalog as _cat
    from modelcut.catalog.profiles import profile_for as _pf
    from modelcut.core.step.layers import LayerSetup as _LS, layer_time as _lt
    hw = _cat.hardware("a100")
    eff = _pf(hw).efficiency
    base = _LS(micro_batch=2, seq_len=4096, recompute="none", attention="flash2")
    llama = _cat.model("llama3-8b")
    fused, eager = _lt(llama, base, hw, eff), _lt(llama, _replace(base, fused_elementwise=False), hw, eff)
    assert eager.fwd.memory > fused.fwd.memory and eager.bwd.memory > fused.bwd.memory
    assert eager.fwd.gemm == fused.fwd.gemm and eager.bwd.gemm == fused.bwd.gemm
    gpt = _replace(_cat.model("gpt3-175b"), dropout=False)
    assert _lt(gpt, _replace(base, fused_elementwise=False), hw, eff).fwd.memory == _lt(gpt, base, hw, eff).fwd.memory


def test_torchs_rmsnorm_is_charged_as_measured_against_cudnns():
    """torch.nn.RMSNorm (torchtitan's and llm-foundry's) runs torch's fused kernels; their time over
    cuDNN's for the same shapes (NVIDIA's cudnn-frontend H200 norm sweep, the catalog's rows) gives
    the eager preset's bytes: the fused norm's 4 and 6 scaled by the medians, well below the 36 and
    60 of the op-by-op form."""
    import statistics
    from modelcut.catalog.kernel_checks import norm_sweeps
    from modelcut.core.step import layers as L
    (sweep,) = [s for s in norm_sweeps() if s.id == "cudnn-fe-norms-2026-02"]   # the H200's
    assert len(sweep.points) == 10 and sweep.source
    fwd = statistics.median(p.torch_fwd_ms / p.fused_fwd_ms for p in sweep.points)
    bwd = statistics.median(p.torch_bwd_ms / p.fused_bwd_ms for p in sweep.points)
    assert E.TORCH_RMSNORM_RATIOS == pytest.approx((fwd, bwd), abs=0.005)
    assert E.EAGER_RMSNORM_FWD == pytest.approx(E.NORM_BYTES * fwd, abs=0.03)
    assert E.EAGER_RMSNORM_BWD == pytest.approx(E.NORM_BYTES_BWD * bwd, abs=0.03)
    assert E.NORM_BYTES < E.EAGER_RMSNORM_FWD < 36 and E.NORM_BYTES_BWD < E.EAGER_RMSNORM_BWD < 60
    # TorchInductor's (the sweep's torch_compile columns): its forward as cuDNN's, its backward about twice
    cfwd = statistics.median(p.compiled_fwd_ms / p.fused_fwd_ms for p in sweep.points)
    cbwd = statistics.median(p.compiled_bwd_ms / p.fused_bwd_ms for p in sweep.points)
    assert E.COMPILED_RMSNORM_RATIOS == pytest.approx((cfwd, cbwd), abs=0.005)
    assert (E.COMPILED_RMSNORM_FWD, E.COMPILED_RMSNORM_BWD) == pytest.approx(
        (E.NORM_BYTES * cfwd, E.NORM_BYTES_BWD * cbwd), abs=0.03)


def test_each_stack_charges_its_own_norm_kernels():
    """A norm moves the fused kernel's 4 and 6 bytes an element under Megatron-LM and Transformer
    Engine (and LayerNorm everywhere); RMSNorm in eager PyTorch and under torch.compile at their
    measured times over cuDNN's (the norm sweep): the layer's norms and the final norm alike."""
    from modelcut.core.step import layers as L
    llama, gpt = catalog.model("llama3-8b"), replace(catalog.model("gpt3-175b"), dropout=False)
    base = L.LayerSetup(micro_batch=1, seq_len=4096)
    eager, compiled = replace(base, fused_elementwise=False), replace(base, compiled=True)
    assert E.norm_bytes(llama, base) == (E.NORM_BYTES, E.NORM_BYTES_BWD)
    assert E.norm_bytes(llama, eager) == (E.EAGER_RMSNORM_FWD, E.EAGER_RMSNORM_BWD)
    assert E.norm_bytes(llama, compiled) == (E.COMPILED_RMSNORM_FWD, E.COMPILED_RMSNORM_BWD)
    assert all(E.norm_bytes(gpt, s) == (E.NORM_BYTES, E.NORM_BYTES_BWD) for s in (base, eager, compiled))
    hw = catalog.hardware("h100")
    eff = catalog.profile_for(hw).efficiency
    fused_loss, compiled_loss = L.loss_time(llama, base, hw, eff), L.loss_time(llama, compiled, hw, eff)
    assert compiled_loss[1].memory > fused_loss[1].memory and compiled_loss[0].gemm == fused_loss[0].gemm


# --- the tp_comm overlap: products cut into the chunks the collective delivers -----------------

from modelcut.core.costs.kernels import gemm_time  # noqa: E402
from modelcut.core.step.layers import (UB_PIPELINE_SMS, UB_PIPELINE_SPLITS, UB_STREAMS,  # noqa: E402
                                       pipeline_overlap_time, ring_exchange_time)


def test_ring_exchange_runs_t_chunks_at_most_three_at_a_time():
    m, n, k = 4096, 2560, 8192
    assert ring_exchange_time(m, n, k, 2, H100, EFF, "fp8") == pytest.approx(
        gemm_time(m // 2, n, k, H100, EFF, batch=2, dtype="fp8"))
    # t = 8: rounds of 3, 3 and 2 chunks of m/8 rows
    assert ring_exchange_time(m, n, k, 8, H100, EFF, "bf16") == pytest.approx(
        2 * gemm_time(m // 8, n, k, H100, EFF, batch=UB_STREAMS) + gemm_time(m // 8, n, k, H100, EFF, batch=2))


def test_pipelined_overlap_gives_up_the_collectives_sms():
    m, n, k = 8192, 8192, 2048
    share = (H100.sms - UB_PIPELINE_SMS) / H100.sms
    assert pipeline_overlap_time(m, n, k, H100, EFF, "bf16") == pytest.approx(
        UB_PIPELINE_SPLITS * gemm_time(m // UB_PIPELINE_SPLITS, n, k, H100, EFF) / share)


@pytest.mark.parametrize("tp,mb,seq", [(2, 1, 4096), (4, 1, 4096), (8, 1, 2048), (4, 2, 8192)])
@pytest.mark.parametrize("fp8", [False, True])
def test_overlapped_products_cost_no_less_and_touch_only_forward_and_data_gradients(tp, mb, seq, fp8):
    from modelcut.core.costs import fp8 as fp8_mod
    f8 = fp8_mod.Fp8("delayed", transposes=True, norm_fused=True, param_gather=False) if fp8 else None
    base = LayerSetup(micro_batch=mb, seq_len=seq, tp=tp, sequence_parallel=True, attention="cudnn",
                      tp_bw=H100.link_bw, fp8=f8)
    plain = layer_time(LLAMA, base, H100, EFF)
    split = layer_time(LLAMA, replace(base, tp_overlap_split=True), H100, EFF)
    assert split.fwd.gemm >= plain.fwd.gemm * (1 - 1e-9)
    assert split.bwd.gemm >= plain.bwd.gemm * (1 - 1e-9)
    assert split.wgrad == pytest.approx(plain.wgrad)                  # weight gradients are not cut
    assert split.fwd.gemm <= 1.6 * plain.fwd.gemm                     # chunks of ≥ 256 rows lose little
    assert (split.fwd.tp, split.bwd.tp) == (plain.fwd.tp, plain.bwd.tp)


def test_no_tensor_parallelism_nothing_to_overlap():
    base = LayerSetup(micro_batch=1, seq_len=4096, tp=1, attention="cudnn")
    assert layer_time(LLAMA, replace(base, tp_overlap_split=True), H100, EFF) == layer_time(LLAMA, base, H100, EFF)


@pytest.mark.parametrize("tp,mb,seq", [(2, 1, 4096), (4, 1, 8192), (8, 2, 2048)])
def test_fp8_row_parallel_forward_follows_the_stacks_overlap_method(tp, mb, seq):
    """With FP8, NeMo's configurations before April 2025 pipeline the row-parallel forwards like
    16-bit ones (the nemo preset); Megatron-Bridge rings them (megatron-bridge). Only those two
    forwards change; the backward does not."""
    from modelcut.catalog import framework
    from modelcut.core.costs import fp8 as fp8_mod
    assert framework("nemo").fp8_rs_overlap == "pipeline"
    assert framework("megatron-bridge").fp8_rs_overlap == "ring"
    f8 = fp8_mod.Fp8("delayed", transposes=True, norm_fused=True, param_gather=False)
    base = LayerSetup(micro_batch=mb, seq_len=seq, tp=tp, sequence_parallel=True, attention="cudnn",
                      tp_bw=H100.link_bw, fp8=f8, tp_overlap_split=True)
    ring = layer_time(LLAMA, base, H100, EFF)
    piped = layer_time(LLAMA, replace(base, tp_overlap_fp8_ring=False), H100, EFF)
    assert piped.bwd == ring.bwd and piped.wgrad == ring.wgrad
    T = mb * seq
    rows = [(T, LLAMA.hidden, LLAMA.q_dim // tp), (T, LLAMA.hidden, LLAMA.ffn_hidden // tp)]   # proj, MLP down
    delta = sum(pipeline_overlap_time(m, n, k, H100, EFF, "fp8") - ring_exchange_time(m, n, k, tp, H100, EFF, "fp8")
                for m, n, k in rows)
    assert piped.fwd.gemm - ring.fwd.gemm == pytest.approx(delta, rel=1e-9)
    # 16-bit products are pipelined whatever the FP8 method
    b16 = replace(base, fp8=None)
    assert layer_time(LLAMA, b16, H100, EFF) == layer_time(LLAMA, replace(b16, tp_overlap_fp8_ring=False), H100, EFF)


@pytest.mark.parametrize("tp", [2, 4, 8])
def test_fp8_sequence_parallel_gathers_move_one_byte(tp):
    """With FP8 and sequence parallelism the all-gathers carry FP8 (Transformer Engine quantizes
    before it gathers), the reduce-scatters stay 16-bit: the layer's collectives shrink, and by
    less than half."""
    from modelcut.core.costs import fp8 as fp8_mod
    f8 = fp8_mod.Fp8("delayed", transposes=True, norm_fused=True, param_gather=False)
    base = LayerSetup(micro_batch=1, seq_len=4096, tp=tp, sequence_parallel=True, attention="cudnn",
                      tp_bw=H100.link_bw)
    b16, b8 = layer_time(LLAMA, base, H100, EFF), layer_time(LLAMA, replace(base, fp8=f8), H100, EFF)
    for p16, p8 in ((b16.fwd, b8.fwd), (b16.bwd, b8.bwd)):
        assert 0.5 * p16.tp < p8.tp < p16.tp
    no_sp = replace(base, sequence_parallel=False)   # all-reduces of 16-bit outputs: unchanged
    assert layer_time(LLAMA, replace(no_sp, fp8=f8), H100, EFF).fwd.tp == layer_time(LLAMA, no_sp, H100, EFF).fwd.tp


def test_megatron_cores_eager_paths_for_yarn_rope_a_clamped_glu_and_expert_biases():
    """Megatron-core runs three of GPT-OSS's features as eager PyTorch (elementwise.MCORE_*): RoPE with a
    YaRN attention factor other than 1 (24 bytes an element of Q and K forward, 20 backward, for
    the fused kernel's 4 and 4), the routed experts' clamped GLU (8 and 10 bytes an element of the
    up product's output) and their output biases, added expert by expert (12 and 16 bytes an
    element of the down product's output). A stack that is not Megatron-core pays none of it; with
    a plain RoPE Megatron-core keeps TE's fused one."""
    from modelcut.core.costs import moe as moe_mod
    from modelcut.core.step import layers as L
    gptoss = catalog.model("gpt-oss-120b")
    assert gptoss.rope_mscale == pytest.approx(0.1 * math.log(32) + 1) and gptoss.glu_clamp
    base = dict(micro_batch=1, seq_len=4096, tp=1, attention="flash3", tp_bw=H100.link_bw)
    plain = layer_time(gptoss, LayerSetup(**base), H100, EFF, moe=True, ep=8)
    mcore = layer_time(gptoss, LayerSetup(**base, mcore_layers=True), H100, EFF, moe=True, ep=8)
    T = 4096
    rope = T * (gptoss.q_dim + gptoss.kv_dim)
    gemms = moe_mod.moe_gemms(gptoss, T, tp=1, ep=8)
    up = sum(g.m * g.count * g.n for g in gemms if g.name == "expert up")
    down = sum(g.m * g.count * g.n for g in gemms if g.name == "expert down")
    bw = EFF.mem * hbm_bandwidth(H100)
    fwd = (E.MCORE_EAGER_ROPE_FWD - 4) * rope + E.MCORE_GLU_CLAMP_FWD * up + E.MCORE_EXPERT_BIAS_FWD * down
    # the eager bias path's own gradient replaces the MLP-down bias gradient's read of T·h (2 bytes each)
    bwd = ((E.MCORE_EAGER_ROPE_BWD - 4) * rope + E.MCORE_GLU_CLAMP_BWD * up + E.MCORE_EXPERT_BIAS_BWD * down
           - 2 * T * gptoss.hidden)
    assert mcore.fwd.memory - plain.fwd.memory == pytest.approx(fwd / bw, rel=1e-9)
    assert mcore.bwd.memory - plain.bwd.memory == pytest.approx(bwd / bw, rel=1e-9)
    assert mcore.fwd.gemm == plain.fwd.gemm
    unscaled = replace(gptoss, rope_mscale=1.0, glu_clamp=False, bias=False)
    a = layer_time(unscaled, LayerSetup(**base), H100, EFF, moe=True, ep=8)
    b = layer_time(unscaled, LayerSetup(**base, mcore_layers=True), H100, EFF, moe=True, ep=8)
    assert (a.fwd.memory, a.bwd.memory) == (b.fwd.memory, b.bwd.memory)
    assert catalog.framework("megatron-bridge").mcore_layers and catalog.framework("nemo").mcore_layers
    assert catalog.framework("megatron-core").mcore_layers
    assert not catalog.framework("nemo-automodel").mcore_layers and not catalog.framework("fsdp").mcore_layers


@pytest.mark.parametrize("bad", [0, -1.0, True, "1.3"])
def test_a_yarn_attention_factor_must_be_a_positive_number(bad):
    with pytest.raises(ModelcutError, match="rope_mscale must be a positive number"):
        replace(catalog.model("gpt-oss-120b"), rope_mscale=bad)


def test_cross_entropy_by_how_the_stack_computes_it():
    """The loss's memory-bound bytes per logit: fused least, then PyTorch's kernels on 16-bit
    logits, then on fp32 logits, Megatron-LM's separate fp32 passes most."""
    from modelcut.core.step.elementwise import CE_BYTES
    h100, eff, llama8 = catalog.hardware("h100"), Efficiency(0.8, 0.8, 0.9), catalog.model("llama3-8b")
    times = {k: loss_time(llama8, LayerSetup(micro_batch=1, seq_len=4096, cross_entropy=k), h100, eff)
             for k in CE_BYTES}
    mem = {k: f.memory + b.memory for k, (f, b) in times.items()}
    assert mem["fused"] < mem["torch"] < mem["torch-fp32"] < mem["fp32-passes"]
    # Megatron-core's native fusion runs the unfused fp32 steps in fewer passes: between the two
    assert mem["fused"] < mem["mcore-fused"] < mem["fp32-passes"]
    assert CE_BYTES["mcore-fused"][1] < CE_BYTES["fp32-passes"][1]
    with pytest.raises(ModelcutError, match="cross_entropy must be"):
        LayerSetup(micro_batch=1, seq_len=4096, cross_entropy="magic")
    assert catalog.framework("nemo-automodel").cross_entropy == "torch"
    assert catalog.framework("fsdp").cross_entropy == "torch-fp32"


def test_llm_foundrys_flash_path_pays_its_unpad_and_pad_copies():
    """MPT's FlashAttention runs on unpadded rows (llm-foundry's flash_attn_fn): Q, K and V gathered
    and the output scattered back, forward and backward (elementwise.UNPAD_BYTES), on the llm-foundry
    preset only and only on a FlashAttention kernel; nothing else in the layer changes."""
    from modelcut.core.step import layers as L
    mpt = catalog.model("mpt-7b")
    hw = catalog.hardware("a100")
    eff = catalog.profile_for(hw).efficiency
    base = L.LayerSetup(micro_batch=2, seq_len=2048, attention="flash2", fused_elementwise=False)
    on = replace(base, attention_unpad=True)
    lines = {name: (f, b) for name, f, b in L.layer_time(mpt, on, hw, eff).memory_bytes}
    T, q, kv = 2 * 2048, mpt.q_dim, mpt.kv_heads * (mpt.q_dim // mpt.heads)
    (qkv_f, qkv_b), (out_f, out_b) = E.UNPAD_BYTES
    assert lines["attention unpad and pad copies"] == pytest.approx(
        (qkv_f * T * (q + 2 * kv) + out_f * T * q, qkv_b * T * (q + 2 * kv) + out_b * T * q))
    a, b = L.layer_time(mpt, base, hw, eff), L.layer_time(mpt, on, hw, eff)
    assert b.fwd.gemm == a.fwd.gemm and b.fwd.memory > a.fwd.memory and b.bwd.memory > a.bwd.memory
    unfused = replace(on, attention="unfused")
    assert dict((n, (f, bb)) for n, f, bb in L.layer_time(mpt, unfused, hw, eff).memory_bytes).get(
        "attention unpad and pad copies", (0.0, 0.0)) == (0.0, 0.0)
    assert catalog.framework("llm-foundry").attention_unpad and not catalog.framework("fsdp").attention_unpad


def test_torchtitans_attention_copies_k_and_v_out_to_the_query_heads():
    """torchtitan's Llama attention (v0.2.0, v0.2.1) repeats K and V to every query head before SDPA:
    forward a read of each kv-wide element and a write of each q-wide one, K and V both, the backward's
    sum the same bytes (elementwise.REPEAT_KV_BYTES); per tensor-parallel rank, and nothing where the heads
    are equal (MHA) or the stack's kernel takes fewer K/V heads as they are."""
    from modelcut.core.step import layers as L
    llama, gpt = catalog.model("llama3-70b"), catalog.model("gpt3-175b")
    hw = catalog.hardware("h100")
    eff = catalog.profile_for(hw).efficiency
    base = L.LayerSetup(micro_batch=1, seq_len=8192, tp=8, sequence_parallel=True, compiled=True)
    on = replace(base, gqa_repeat_kv=True)

    def line(model, setup):
        return {n: (f, b) for n, f, b in L.layer_time(model, setup, hw, eff).memory_bytes}.get(
            "K and V repeated to the query heads", (0.0, 0.0))
    T, q_t, kv_t = 8192, llama.q_dim // 8, L.context.kv_width_per_rank(llama, 8)
    per_kv, per_q = E.REPEAT_KV_BYTES
    assert line(llama, on) == pytest.approx((2 * T * (per_kv * kv_t + per_q * q_t),) * 2)
    assert line(llama, base) == (0.0, 0.0) and line(gpt, on) == (0.0, 0.0)
    assert L.layer_time(llama, on, hw, eff).fwd.memory > L.layer_time(llama, base, hw, eff).fwd.memory
    assert [catalog.framework(f).gqa_repeat_kv for f in ("torchtitan", "fsdp", "llm-foundry", "nemo-automodel",
                                                         "megatron-core")] == [True, True, False, False, False]
