"""What is resident is what is paid for: ZeRO-3 with a pipeline, resharding or keeping the weights;
ZeRO-2/3 gradients reduced every micro-batch or once (modelcut.core.costs.residency, read by both
memory and step time)."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given, settings, strategies as st

from modelcut import catalog
from modelcut.core.costs.kernels import Efficiency, gemm_time
from modelcut.core.costs.residency import residency
from modelcut.core.errors import ModelcutError
from modelcut.core.memory import memory_report
from modelcut.core.specs import Layout, Run, Training
from modelcut.core.step import predict

EFF = Efficiency(0.75, 0.65, 0.6)
H100 = catalog.hardware("h100")
LLAMA8 = catalog.model("llama3-8b")
FSDP = catalog.framework("fsdp")
#: A stack that reshards after every forward even with a pipeline (torchtitan's
#: fsdp_reshard_after_forward = "always") and reduces sharded gradients every micro-batch.
RESHARDING = replace(FSDP, name="fsdp-always", reshard_with_pipeline=True, pipeline_grad_sync="microbatch")
KEEPING = replace(FSDP, name="fsdp-never", reshard_after_forward=False, reshard_with_pipeline=False,
                  pipeline_grad_sync="microbatch")


def run(zero: int, pp: int = 4, dp: int = 8, tp: int = 2, gb: int = 64, mb: int = 1, model=LLAMA8) -> Run:
    return Run(model, H100.name, Layout(tp=tp, pp=pp, dp=dp, zero=zero, sequence_parallel=tp > 1),
               Training(seq_len=4096, global_batch=gb, micro_batch=mb))


def step(r: Run, fw) -> float:
    return predict(r, H100, "default", efficiency=EFF, framework=fw).step_time_s


def test_the_rule():
    assert residency(1, 4, 16, reshard_after_forward=True).weights == "replicated"
    assert residency(3, 1, 16, reshard_after_forward=True).weights == "per-pass"
    assert residency(3, 4, 16, reshard_after_forward=True, reshard_with_pipeline=False).weights == "per-step"
    assert residency(3, 1, 16, reshard_after_forward=True, reshard_with_pipeline=False).weights == "per-pass"
    assert residency(2, 4, 16, reshard_after_forward=True, pipeline_grad_sync="step").grads == "per-step"
    assert residency(2, 1, 16, reshard_after_forward=True, pipeline_grad_sync="step").grads == "per-microbatch"
    assert residency(1, 4, 16, reshard_after_forward=True).grads == "per-step"
    with pytest.raises(ModelcutError, match="zero must be"):
        residency(4, 1, 1, reshard_after_forward=True)
    with pytest.raises(ModelcutError, match="pipeline_grad_sync"):
        residency(3, 2, 2, reshard_after_forward=True, pipeline_grad_sync="sometimes")


def test_zero3_with_a_pipeline_that_reshards_pays_the_regathers():
    """ZeRO-3 with pp > 1 on a stack that reshards is slower than ZeRO-1 (every pass of every
    micro-batch gathers its chunk's weights again), and holds less; keeping the weights costs
    about ZeRO-1's time and holds a whole 16-bit copy of them (ZeRO-1 on this stack keeps its FP32
    weights whole: twice those bytes)."""
    z1, z3 = run(1), run(3)
    t1, t3 = step(z1, RESHARDING), step(z3, RESHARDING)
    assert t3 > t1 * 1.01
    t3_keep = step(z3, KEEPING)
    assert t3_keep < t3
    m1 = memory_report(z1, H100, framework=RESHARDING)
    m3 = memory_report(z3, H100, framework=RESHARDING)
    m3_keep = memory_report(z3, H100, framework=KEEPING)
    w = lambda m: max(s["weights_bytes"] for s in m["stages"])  # noqa: E731
    assert w(m3) < w(m3_keep)
    assert w(m3_keep) >= w(m1) * 2 / RESHARDING.param_bytes
    assert m3["assumptions"]["residency"] == {"weights": "per-pass", "grads": "per-microbatch"}
    assert m3_keep["assumptions"]["residency"]["weights"] == "per-step"


def test_more_micro_batches_cost_a_resharding_stack_more_gathers():
    """At a fixed global batch, halving the micro-batch doubles the passes and so the gathers."""
    fast = step(run(3, mb=2), RESHARDING) - step(run(1, mb=2), RESHARDING)
    slow = step(run(3, mb=1), RESHARDING) - step(run(1, mb=1), RESHARDING)
    assert slow > fast > 0


@settings(max_examples=25, deadline=None)
@given(zero=st.sampled_from([2, 3]), pp=st.sampled_from([1, 2, 4]), dp=st.sampled_from([2, 4, 8]),
       mb=st.sampled_from([1, 2]), reshard=st.booleans(), reshard_pp=st.sampled_from([None, True, False]),
       sync=st.sampled_from(["microbatch", "step"]))
def test_memory_and_time_agree_on_what_is_resident(zero, pp, dp, mb, reshard, reshard_pp, sync):
    """For any stack and layout: memory reports the residency time used; where memory holds only
    the units in use (weights gathered every pass) time pays more than where it holds them all,
    and where memory keeps only a shard of the gradients time reduces them every micro-batch
    (more gradient traffic than reducing once)."""
    fw = replace(FSDP, name="fsdp-x", reshard_after_forward=reshard, reshard_with_pipeline=reshard_pp,
                 pipeline_grad_sync=sync, flat_grad_sync=sync)
    r = run(zero, pp=pp, dp=dp, mb=mb, gb=16 * dp // 4)
    pred = predict(r, H100, "default", efficiency=EFF, framework=fw)
    rep = memory_report(r, H100, plan=pred.plan, framework=fw)
    res = fw.residency(zero, pp, pred.plan.m)
    assert rep["assumptions"]["residency"] == {"weights": res.weights, "grads": res.grads}
    stage = max(rep["stages"], key=lambda s: s["total_bytes"])
    # weights: the whole device's BF16 weights resident, or only the sharded copy and two units
    other = replace(fw, reshard_after_forward=not res.gathers_each_pass,
                    reshard_with_pipeline=not res.gathers_each_pass)
    if zero == 3:
        flip = memory_report(r, H100, plan=pred.plan, framework=other)
        flip_stage = flip["stages"][stage["stage"]]
        t_other = predict(r, H100, "default", efficiency=EFF, framework=other).step_time_s
        if res.gathers_each_pass:
            assert stage["weights_bytes"] < flip_stage["weights_bytes"]
            assert pred.step_time_s >= t_other
        else:
            assert stage["weights_bytes"] > flip_stage["weights_bytes"]
            assert pred.step_time_s <= t_other
    # gradients: a shard, or the whole buffer
    flipped = "step" if sync == "microbatch" else "microbatch"
    whole = flip_g = memory_report(r, H100, plan=pred.plan, framework=replace(
        fw, pipeline_grad_sync=flipped, flat_grad_sync=flipped))
    if pred.plan.m > 1:
        g, g_flip = stage["gradients_bytes"], whole["stages"][stage["stage"]]["gradients_bytes"]
        assert (g < g_flip) == res.grads_sharded and g != g_flip
    del flip_g


def test_context_parallelism_at_short_sequences_shrinks_the_products_it_splits():
    """cp cuts the tokens of every product (m = b·s/cp): at a short sequence the products run
    smaller and at a lower fraction of peak, so time per FLOP rises."""
    from modelcut.core.step.layers import LayerSetup, layer_time
    h, f = LLAMA8.hidden, LLAMA8.ffn_hidden
    per_flop = [gemm_time(m, f, h, H100, EFF) / (2 * m * f * h) for m in (512, 1024, 8192)]
    assert per_flop[0] > per_flop[2] and per_flop[1] > per_flop[2]
    one = layer_time(LLAMA8, LayerSetup(micro_batch=1, seq_len=2048, cp=1), H100, EFF)
    four = layer_time(LLAMA8, LayerSetup(micro_batch=1, seq_len=2048, cp=4), H100, EFF)
    assert four.fwd.gemm * 4 > one.fwd.gemm     # a quarter of the work, more than a quarter of the time


def test_a_stack_that_syncs_gradients_once_without_a_pipeline():
    """NeMo AutoModel turns FSDP2's gradient sync off for every micro-batch but the last: the
    unsharded gradients stay resident (memory holds the whole buffer) and are reduce-scattered
    once (time pays one reduction where torchtitan's way pays one per micro-batch)."""
    assert residency(3, 1, 8, reshard_after_forward=True, flat_grad_sync="step").grads == "per-step"
    assert residency(3, 1, 8, reshard_after_forward=True).grads == "per-microbatch"
    assert residency(3, 1, 1, reshard_after_forward=True, flat_grad_sync="step").grads == "per-microbatch"
    with pytest.raises(ModelcutError, match="flat_grad_sync"):
        residency(3, 1, 2, reshard_after_forward=True, flat_grad_sync="never")
    auto = catalog.framework("nemo-automodel")
    assert auto.flat_grad_sync == "step" and FSDP.flat_grad_sync == "microbatch"
    every = replace(auto, name="automodel-every", flat_grad_sync="microbatch")
    r = run(3, pp=1, dp=32, tp=2, gb=256)          # 4 micro-batches a replica
    once_t = predict(r, H100, "default", efficiency=EFF, framework=auto)
    every_t = predict(r, H100, "default", efficiency=EFF, framework=every)
    assert once_t.step_time_s <= every_t.step_time_s and once_t.breakdown.dp_s < every_t.breakdown.dp_s
    once_m, every_m = memory_report(r, framework=auto), memory_report(r, framework=every)
    g_once, g_every = once_m["stages"][0]["gradients_bytes"], every_m["stages"][0]["gradients_bytes"]
    # the whole buffer, in FSDP2's fp32 reduce dtype, against a 1/dp shard in bf16
    assert (auto.unsharded_grad_bytes, auto.grad_buffer_bytes) == (4, 2)
    assert g_once == pytest.approx(32 * g_every * 4 / 2)
    assert once_m["dtypes"]["gradients_bytes"].startswith("fp32 for the dense weights'")
    assert every_m["dtypes"]["gradients_bytes"].startswith("bf16")


# --- a layout that leaves the ZeRO stage open takes the stack's -------------------------------------

def _open(r: Run) -> Run:
    return replace(r, layout=replace(r.layout, zero=None))


@pytest.mark.parametrize("name", catalog.framework_names())
def test_a_layout_without_a_zero_stage_runs_at_the_stacks_own(name):
    """``zero`` left out (None) is the stack's stage: FSDP's presets shard everything (torchtitan's
    data_parallel_shard_degree -1), Megatron's distributed optimizer at least the optimizer states,
    older Megatron nothing; time and memory both read it."""
    fw = catalog.framework(name)
    flat = {"fsdp": 3, "fsdp-compile": 3, "llm-foundry": 3, "nemo-automodel": 3, "nemo-automodel-flex": 3,
            "deepspeed-zero3": 3, "llama3": 2}.get(name, 1 if fw.dist_optimizer else 0)
    piped = 1 if name == "deepspeed-zero3" else flat     # DeepSpeed's pipeline engine runs ZeRO below 2
    for pp, tp in ((1, 1), (4, 2)):
        r = run(0, pp=pp, tp=tp)
        want = flat if pp == 1 else piped
        assert fw.zero_stage(_open(r).layout) == want
        explicit = replace(r, layout=replace(r.layout, zero=want))
        got = predict(_open(r), H100, "default", efficiency=EFF, framework=fw)
        assert got.step_time_s == step(explicit, fw)
        m_open = memory_report(_open(r), H100, plan=got.plan, framework=fw)
        m_explicit = memory_report(explicit, H100, plan=got.plan, framework=fw)
        assert m_open["peak_bytes"] == m_explicit["peak_bytes"]
        assert m_open["assumptions"]["zero"] == want


def test_fsdp_without_a_zero_stage_shards_the_weights_and_the_optimizer():
    """An 8B model on 64 GPUs under FSDP with no ``zero`` given: a 64th of the FP32 states a GPU,
    not the whole model (which, with its activations, would not fit in 80 GB)."""
    r = Run(LLAMA8, H100.name, Layout(dp=64), Training(seq_len=8192, global_batch=64, micro_batch=1,
                                                       recompute="selective"))
    mem = memory_report(r, H100, framework=FSDP)
    st = mem["stages"][0]
    params = 8.03e9
    assert st["optimizer_bytes"] < 8 * params / 64 * 1.1
    # the FP32 shard, plus the bf16 units gathered at a time (a layer and the one prefetched; the
    # embedding and the output layer are units of their own): far below the whole 32 GB
    assert 4 * params / 64 < st["weights_bytes"] < 4 * params / 8
    assert mem["fits"]
    assert mem["assumptions"]["zero"] == 3
    assert mem["dtypes"]["gradients_bytes"] == "fp32 (sharded, in the fp32 parameters' dtype)"
    # with a pipeline, torchtitan's stages hold their gradients whole until the schedule ends
    piped = Run(LLAMA8, H100.name, Layout(pp=4, dp=16), r.training)
    assert memory_report(piped, H100, framework=FSDP)["dtypes"]["gradients_bytes"].startswith("fp32 (held whole")
    # and without a stack to choose (seed mode's memory), an open stage is no sharding
    assert memory_report(r, H100)["assumptions"]["zero"] == 0


@pytest.mark.parametrize("name", catalog.framework_names())
def test_a_layout_without_sequence_parallelism_said_runs_as_the_stack_does(name):
    """``sequence_parallel`` left out (None) with tp > 1 is the stack's: on under Megatron-core, NeMo
    (both presets), Megatron-Bridge and torchtitan's presets, off under Megatron-LM of 2021-2022, DeepSpeed and
    AutoModel; time and memory read the same."""
    fw = catalog.framework(name)
    on = name in ("megatron-core", "nemo", "nemo-24.07", "megatron-bridge", "fsdp", "fsdp-compile", "llm-foundry",
                  "llama3")
    assert fw.sequence_parallel is on
    r = _open(run(0, pp=1, tp=4))
    r = replace(r, layout=replace(r.layout, sequence_parallel=None))
    r = replace(r, layout=replace(r.layout, zero=fw.zero_stage(r.layout)))
    assert fw.resolve(r).layout.sequence_parallel is on
    explicit = replace(r, layout=replace(r.layout, sequence_parallel=on))
    got = predict(r, H100, "default", efficiency=EFF, framework=fw)
    assert got.step_time_s == step(explicit, fw)
    assert (memory_report(r, H100, plan=got.plan, framework=fw)["peak_bytes"]
            == memory_report(explicit, H100, plan=got.plan, framework=fw)["peak_bytes"])
    # without tensor parallelism there is nothing to cut
    assert fw.resolve(_open(run(0, pp=1, tp=1))).layout.sequence_parallel is False
