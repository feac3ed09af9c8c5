"""How the default model's step scales with the work asked of it, on the shipped constants and every
stack: twice the global batch (twice the micro-batches on each rank) never shortens a step and never
more than doubles it (the work outside the micro-batches, the optimizer step and the last reduction,
is paid once), but for the weight gradients' accumulation a longer window between reductions adds
(PyTorch FSDP holding gradients whole, NeMo AutoModel's stack: a window of one micro-batch adds
nothing, of two a cast and an addition; core/costs/residency.py ``accumulate_bytes``); recomputing
every layer never makes a step shorter than recomputing none.

DeepSpeed v0.3's ZeRO-3 replay (``deepspeed-zero3``, :mod:`modelcut.core.step.deepspeed_stage3`) is
left out of both: its gradient buckets of 5e8 elements fill across micro-batches and flush where they
fill, so a micro-batch may pay a wait another does not (twice the batch can cost a little over twice);
and a recomputed forward gathers the layer's weights right before its backward, which then reuses them
(the release's reuse distance), so recomputation can shorten its steps. Both are that release's rules.
"""

from __future__ import annotations

from dataclasses import replace

from hypothesis import HealthCheck, assume, given, settings, strategies as st

from modelcut import catalog
from modelcut.core.errors import ModelcutError
from modelcut.service.runfile import run_from_dict
from helpers import predict_default
from modelcut.core.step.layer_budget import layer_budget

STACKS = tuple(n for n in catalog.framework_names() if n != "deepspeed-zero3")
SHARDED = {"fsdp", "fsdp-compile", "llm-foundry", "nemo-automodel", "nemo-automodel-flex"}
MODELS = ("llama3-8b", "llama2-13b", "mpt-7b", "qwen2.5-14b", "gpt-7.5b", "llama3-70b", "gpt3-175b", "mixtral-8x7b",
          "qwen3-30b-a3b")
SETTINGS = settings(max_examples=100, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@st.composite
def stack_runs(draw):
    """A run a stack may take: a catalog model on an A100, H100, H200 or B200, a layout of up to
    8-way tensor, 2-way context, 4-way pipeline and 64-way data parallelism (sharded on the FSDP
    stacks), and the stack's name."""
    stack = draw(st.sampled_from(STACKS))
    model = draw(st.sampled_from(MODELS))
    tp, cp, dp = draw(st.sampled_from([1, 2, 4, 8])), draw(st.sampled_from([1, 2])), draw(st.sampled_from([1, 2, 8, 64]))
    pp = 1 if stack in SHARDED else draw(st.sampled_from([1, 2, 4]))
    layout = {"tp": tp, "cp": cp, "pp": pp, "dp": dp}
    if stack in SHARDED:
        layout["zero"] = 3
    if catalog.model(model).experts and dp % 8 == 0 and draw(st.booleans()):
        layout["ep"] = 8
    mb = draw(st.sampled_from([1, 2]))
    doc = {"model": {"name": model},
           "hardware": {"gpu": draw(st.sampled_from(["a100", "h100", "h200", "b200"])), "gpus": tp * cp * pp * dp},
           "layout": layout,
           "training": {"seq_len": draw(st.sampled_from([2048, 8192, 32768])), "micro_batch": mb,
                        "global_batch": dp * mb * draw(st.sampled_from([1, 2, 4, 8])),
                        "recompute": draw(st.sampled_from(["none", "selective", "full"]))}}
    try:
        return run_from_dict(doc), stack
    except ModelcutError:
        assume(False)


def step_s(run, stack) -> float:
    try:
        return predict_default(run, catalog.hardware(run.gpu), framework=stack).step_time_s
    except ModelcutError:   # a layout or setting this stack or model refuses
        assume(False)


def accumulation_s(run, stack) -> float:
    """Seconds a step spends accumulating weight gradients on the compute stream: the
    ``weight-gradient accumulation`` lines of ``predict --layers`` (one micro-batch on the busiest
    device), times the micro-batches a rank runs."""
    hw = catalog.hardware(run.gpu)
    b = layer_budget(run, hw, catalog.profile_for(hw).efficiency, catalog.framework(stack))
    per_mb = sum(u.per_device * ln.bwd_s for u in b.units for ln in u.lines
                 if ln.item == "weight-gradient accumulation")
    return per_mb * (run.training.global_batch // (run.layout.dp * run.training.micro_batch))


@SETTINGS
@given(case=stack_runs())
def test_twice_the_batch_never_shortens_a_step_and_at_most_doubles_it(case):
    run, stack = case
    double = replace(run, training=replace(run.training, global_batch=2 * run.training.global_batch))
    once, twice = step_s(run, stack), step_s(double, stack)
    longer_window = max(0.0, accumulation_s(double, stack) - 2 * accumulation_s(run, stack))
    assert once * (1 - 1e-9) <= twice <= (2 * once + longer_window) * (1 + 1e-9)


@SETTINGS
@given(case=stack_runs())
def test_recomputing_every_layer_never_shortens_a_step(case):
    run, stack = case
    none = step_s(replace(run, training=replace(run.training, recompute="none")), stack)
    full = step_s(replace(run, training=replace(run.training, recompute="full")), stack)
    assert full >= none * (1 - 1e-9)


@SETTINGS
@given(stack=st.sampled_from(["llama3", "fsdp", "fsdp-compile", "llm-foundry"]), zero=st.sampled_from([2, 3]),
       model=st.sampled_from(["llama3-70b", "gpt3-175b", "qwen2.5-14b"]), tp=st.sampled_from([1, 2, 4, 8]),
       cp=st.sampled_from([1, 2]), dp=st.sampled_from([2, 4, 8, 16]), per_rank=st.sampled_from([1, 2, 4]),
       gpu=st.sampled_from(["a100", "h100"]))
def test_sharded_gradients_twice_the_batch_at_most_doubles_a_step(stack, zero, model, tp, cp, dp, per_rank, gpu):
    """Where only a shard of the gradients is kept (ZeRO-2 and -3), each micro-batch's are reduced
    after its backward; short micro-batches of a large model make those reductions outlast the
    compute, where a charge out of step with the backward shows."""
    doc = {"model": {"name": model}, "hardware": {"gpu": gpu, "gpus": tp * cp * dp},
           "layout": {"tp": tp, "cp": cp, "dp": dp, "zero": zero},
           "training": {"seq_len": 2048, "global_batch": dp * per_rank, "micro_batch": 1, "recompute": "none"}}
    try:
        run = run_from_dict(doc)
    except ModelcutError:
        assume(False)
    once = step_s(run, stack)
    twice = step_s(replace(run, training=replace(run.training, global_batch=2 * run.training.global_batch)), stack)
    assert once * (1 - 1e-9) <= twice <= 2 * once * (1 + 1e-9)


def test_an_earlier_micro_batch_reduces_its_gradients_unit_by_unit():
    """Llama 3's stack keeps a shard of the gradients (ZeRO-2), so every micro-batch's gradients are
    reduce-scattered after its backward. Each earlier micro-batch's reductions start as its backward
    finishes each unit, as the last one's do: GPT-3 175B at tensor 4, context 2 and data 4 on A100,
    whose reductions outlast the compute, took 2.11 times one micro-batch's step for two when an
    earlier micro-batch's were charged at its backward's end (a step of 9.39 s against 4.45 s)."""
    doc = {"model": {"name": "gpt3-175b"}, "hardware": {"gpu": "a100", "gpus": 32},
           "layout": {"tp": 4, "cp": 2, "dp": 4},
           "training": {"seq_len": 2048, "global_batch": 8, "micro_batch": 2, "recompute": "none"}}
    one = run_from_dict(doc)
    two = replace(one, training=replace(one.training, global_batch=16))
    t1, t2 = step_s(one, "llama3"), step_s(two, "llama3")
    assert t1 < t2 < 1.8 * t1
