"""Accumulating weight gradients over micro-batches: Megatron-LM's ``main_grad.add_`` on the compute
stream where the stack does not fuse it into the product, and PyTorch FSDP's own way (torch 2.13:
the shard added beside the reduce-scatter where the gradients are reduced every micro-batch; the
first micro-batch cast to the reduce type and the later ones added where they are held whole):
core/costs/residency.py ``accumulate_bytes``, ``Framework.grad_accum_rule``."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given, settings, strategies as st

from modelcut import catalog
from modelcut.core.costs.kernels import Efficiency, mem_time
from modelcut.core.costs.residency import Residency, accumulate_bytes
from modelcut.core.errors import ModelcutError
from modelcut.core.specs import Layout, Run, Training
from modelcut.core.step import predict
from modelcut.core.step.layer_budget import layer_budget

EFF = Efficiency(0.85, 0.8, 1.0)
H100 = catalog.hardware("h100")
PER_MB = Residency(3, "per-pass", "per-microbatch")
PER_STEP = Residency(3, "per-pass", "per-step")


def test_the_byte_rule():
    assert accumulate_bytes(PER_MB, 8, 2, 4) == 0.0            # the shard is added beside the reduce-scatter
    assert accumulate_bytes(PER_STEP, 1, 2, 4) == 0.0          # one micro-batch: nothing to accumulate
    assert accumulate_bytes(PER_STEP, 2, 2, 4) == (6 + 10) / 2   # bf16 cast to fp32, then fp32 += bf16
    assert accumulate_bytes(PER_STEP, 4, 2, 2) == 6 * 3 / 4      # kept in bf16: autograd adds into .grad
    for bad in (lambda: accumulate_bytes(PER_STEP, 0, 2, 4), lambda: accumulate_bytes(PER_STEP, 2, 0, 4)):
        with pytest.raises(ModelcutError):
            bad()


@settings(max_examples=60, deadline=None)
@given(st.integers(1, 512), st.sampled_from([2, 4]), st.sampled_from([2, 4]))
def test_accumulating_whole_costs_at_most_an_addition_a_micro_batch(window, computed, held):
    """Averaged over the window it never exceeds one addition (2·held + computed) a micro-batch, and
    grows with the window towards it."""
    b = accumulate_bytes(PER_STEP, window, computed, held)
    add = 2 * held + computed
    assert 0 <= b <= add
    assert accumulate_bytes(PER_STEP, window + 1, computed, held) >= b


def run(model: str, dp: int, gb: int, mb: int = 1, pp: int = 1, zero: int | None = None) -> Run:
    return Run(catalog.model(model), H100.name, Layout(tp=1, pp=pp, dp=dp, zero=zero),
               Training(seq_len=4096, global_batch=gb, micro_batch=mb))


def accum_line(r: Run, fw) -> float:
    """The layer's weight-gradient accumulation bytes in ``predict --layers`` (0 where none is listed)."""
    b = layer_budget(r, H100, EFF, fw)
    lines = [ln for u in b.units for ln in u.lines if ln.item == "weight-gradient accumulation"]
    return sum(ln.nbytes[1] for ln in lines)


def test_pytorch_fsdp_reducing_every_micro_batch_accumulates_nothing_on_the_compute_stream():
    fsdp = catalog.framework("fsdp")
    r = run("llama3-8b", dp=8, gb=32)                      # 4 micro-batches, each reduce-scattered
    assert fsdp.grad_accum_rule(3, 1, 4) == (False, 0.0, None)
    assert accum_line(r, fsdp) == 0.0
    # the same stack charged Megatron-LM's main_grad.add_ instead: slower by that many bytes
    megatron_way = replace(fsdp, name="fsdp-main-grad", fsdp_grad_accum=False)
    assert accum_line(r, megatron_way) > 0
    assert (predict(r, H100, "default", efficiency=EFF, framework=megatron_way).step_time_s
            > predict(r, H100, "default", efficiency=EFF, framework=fsdp).step_time_s)
    assert catalog.framework("llm-foundry").grad_accum_rule(3, 1, 4)[1] == 0.0     # FSDP1 alike


def test_fsdp2_holding_gradients_whole_casts_then_adds_and_experts_stay_in_their_type():
    am = catalog.framework("nemo-automodel")             # requires_gradient_sync off but in the last
    fusion, dense, expert = am.grad_accum_rule(3, 1, 4)
    assert not fusion
    assert dense == pytest.approx((2 + 4 + (4 + 2 + 4) * 3) / 4)    # fp32 reduce type
    assert expert == pytest.approx(6 * 3 / 4)                       # the experts' bf16 gradients
    assert am.grad_accum_rule(3, 1, 1) == (False, 0.0, 0.0)


def test_stacks_that_are_not_pytorch_fsdp_keep_their_own_rule():
    for name in ("megatron-core", "megatron-2021", "deepspeed-zero3", "megatron-deepspeed-2022", "llama3"):
        fw = catalog.framework(name)
        assert fw.grad_accum_rule(3, 1, 4) == (fw.grad_accum_fusion, fw.grad_accum_bytes, None)
    fsdp = catalog.framework("fsdp")
    assert fsdp.grad_accum_rule(1, 1, 4) == (fsdp.grad_accum_fusion, fsdp.grad_accum_bytes, None)   # no sharded gradients


def test_the_accumulation_costs_its_bytes_at_hbm_bandwidth():
    """Under the no-sync window the layer's backward grows by exactly the accumulation bytes' time."""
    am = catalog.framework("nemo-automodel")
    r = run("qwen3-30b-a3b", dp=8, gb=32)
    b = layer_budget(r, H100, EFF, am)
    lines = [ln for u in b.units for ln in u.lines if ln.item == "weight-gradient accumulation"]
    assert lines and all(ln.nbytes[1] > 0 for ln in lines)
    for ln in lines:
        assert ln.bwd_s == pytest.approx(mem_time(ln.nbytes[1], H100, EFF), rel=1e-6)
    # against the same stack with the accumulation fused into the products (nothing on the stream)
    fused = layer_budget(r, H100, EFF, replace(am, name="automodel-fused", fsdp_grad_accum=False,
                                                  grad_accum_fusion=True))
    by_unit = {u.unit: u.bwd_s for u in fused.units}
    for u in b.units:
        added = sum(ln.bwd_s for ln in u.lines if ln.item == "weight-gradient accumulation")
        assert u.bwd_s - by_unit[u.unit] == pytest.approx(added, rel=1e-6, abs=1e-12)
