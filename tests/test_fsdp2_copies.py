"""FSDP2's copies on the compute stream: the all-gather copy-out (the gathered bytes read and
written) and the reduce-scatter copy-in (each gradient read in its dtype, written in the reduce
dtype), torch 2.13 torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py; charged where the
stack is FSDP2 (``fsdp2_copies``) under ZeRO-3."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given, settings, strategies as st

from modelcut import catalog
from modelcut.core.costs import flops
from modelcut.core.costs.kernels import Efficiency, mem_time
from modelcut.core.costs.residency import copy_in_bytes, copy_out_bytes
from modelcut.core.errors import ModelcutError
from modelcut.core.specs import Layout, Run, Training
from modelcut.core.step import predict

EFF = Efficiency(0.85, 0.8, 1.0)
H100 = catalog.hardware("h100")
LLAMA8 = catalog.model("llama3-8b")
FSDP = catalog.framework("fsdp")
NO_COPIES = replace(FSDP, name="fsdp-no-copies", fsdp2_copies=False)


def run(dp: int = 8, pp: int = 1, gb: int = 8, mb: int = 1, model=LLAMA8, zero: int | None = None) -> Run:
    return Run(model, H100.name, Layout(tp=1, pp=pp, dp=dp, zero=zero), Training(seq_len=4096, global_batch=gb,
                                                                                 micro_batch=mb))


def step(r: Run, fw) -> float:
    return predict(r, H100, "default", efficiency=EFF, framework=fw).step_time_s


def test_the_byte_rules():
    assert copy_out_bytes(1e9) == 2e9                        # read the all-gather output, write the parameters
    assert copy_in_bytes(1e9, 2, 4) == 6e9                   # bf16 gradients into an fp32 reduce buffer
    for bad in (lambda: copy_out_bytes(-1), lambda: copy_in_bytes(-1, 2, 4)):
        with pytest.raises(ModelcutError, match="non-negative"):
            bad()


def test_the_presets_that_run_fsdp2():
    assert catalog.framework("fsdp").fsdp2_copies and catalog.framework("fsdp-compile").fsdp2_copies
    assert catalog.framework("nemo-automodel").fsdp2_copies
    for name in ("megatron-core", "nemo", "deepspeed-zero3", "llama3"):
        assert not catalog.framework(name).fsdp2_copies, name


def test_one_microbatch_pays_two_copy_outs_and_one_copy_in_of_the_whole_model():
    """Llama 3 8B on one node, one micro-batch, resharding after the forward: every unit gathered
    in the forward and again in the backward but the output layer (its forward and backward are
    one unit, the loss), every unit reduced once: 2·(P + P − P_out)·2 bytes out, P·(2 + 4) bytes
    in (fsdp reduces in fp32), at the HBM rate. The step grows by that, less the little of it
    that the next all-gather runs beside (FSDP2 overlaps a copy-out with the next unit's gather):
    at least 90 % of it."""
    P, P_out = flops.param_count(LLAMA8), LLAMA8.vocab * LLAMA8.hidden
    want = mem_time(copy_out_bytes((2 * P - P_out) * 2) + copy_in_bytes(P, 2, FSDP.grad_bytes), H100, EFF)
    got = step(run(), FSDP) - step(run(), NO_COPIES)
    assert 0.9 * want <= got <= want * (1 + 1e-9)
    assert 0.03 < got / step(run(), FSDP) < 0.10          # a few per cent of a local batch of one


def test_the_copies_land_in_the_data_parallel_term_not_compute():
    with_c = predict(run(), H100, "default", efficiency=EFF, framework=FSDP)
    without = predict(run(), H100, "default", efficiency=EFF, framework=NO_COPIES)
    assert with_c.breakdown.compute_s == pytest.approx(without.breakdown.compute_s)
    assert with_c.breakdown.dp_s > without.breakdown.dp_s
    assert any("copy-out" in n for n in with_c.notes)


def test_nothing_to_copy_without_sharding():
    one = run(dp=1, gb=1)
    assert step(one, FSDP) == pytest.approx(step(one, NO_COPIES))
    zero1 = run(zero=1)
    assert step(zero1, FSDP) == pytest.approx(step(zero1, NO_COPIES))


def test_with_a_pipeline_the_kept_weights_are_copied_once_a_step():
    """torchtitan keeps the weights gathered with a pipeline and reduces once: the copies are
    once a step, far less than the same model without a pipeline pays per micro-batch."""
    r = run(dp=4, pp=2, gb=32)
    extra = step(r, FSDP) - step(r, NO_COPIES)
    P = flops.param_count(LLAMA8)
    assert 0 < extra <= mem_time(copy_out_bytes(P * 2) + copy_in_bytes(P, 2, FSDP.grad_bytes), H100, EFF)


@settings(max_examples=25, deadline=None)
@given(dp=st.sampled_from([2, 8, 32]), mb=st.sampled_from([1, 2]), accum=st.sampled_from([1, 2, 4]))
def test_the_copies_never_make_a_step_faster(dp, mb, accum):
    r = run(dp=dp, gb=dp * mb * accum, mb=mb)
    assert step(r, FSDP) >= step(r, NO_COPIES) - 1e-12
