"""The loss's kernel: the stack's by default, the run's where its configuration chose
(``[training] cross_entropy``; Megatron-core's ``cross_entropy_loss_fusion``)."""

from __future__ import annotations

from dataclasses import replace

import pytest

from modelcut import catalog
from modelcut.core.costs.kernels import Efficiency
from modelcut.core.errors import ModelcutError
from modelcut.core.specs import CROSS_ENTROPY_KINDS, Layout, Run, Training
from modelcut.core.step import predict
from modelcut.core.step.layers import CE_BYTES
from modelcut.service.requests import TrainingIn, parse

EFF = Efficiency(0.75, 0.65, 0.6)
H100 = catalog.hardware("h100")
RUN = Run(catalog.model("llama3-8b"), H100.name, Layout(tp=2, dp=4, sequence_parallel=True),
          Training(seq_len=8192, global_batch=32, micro_batch=1))


def step(run: Run, fw) -> float:
    return predict(run, H100, "default", efficiency=EFF, framework=fw).step_time_s


def with_ce(ce):
    return replace(RUN, training=replace(RUN.training, cross_entropy=ce))


@pytest.mark.parametrize("name", ["nemo", "megatron-core", "fsdp", "nemo-automodel"])
def test_left_open_the_loss_is_the_stacks_and_a_run_may_say_otherwise(name):
    fw = catalog.framework(name)
    assert fw.resolve(RUN).training.cross_entropy == fw.cross_entropy
    assert step(RUN, fw) == step(with_ce(fw.cross_entropy), fw)
    times = {ce: step(with_ce(ce), fw) for ce in CROSS_ENTROPY_KINDS}
    # more bytes a logit, a longer step: the loss is memory-bound work
    order = sorted(CROSS_ENTROPY_KINDS, key=lambda ce: sum(CE_BYTES[ce]))
    assert [times[ce] for ce in order] == sorted(times.values())
    assert times["fused"] < times["fp32-passes"]


def test_an_unknown_loss_kernel_is_a_one_line_error():
    with pytest.raises(ModelcutError, match="cross_entropy must be one of fp32-passes, fused, mcore-fused, torch, torch-fp32"):
        Training(seq_len=4096, global_batch=8, cross_entropy="liger")
    with pytest.raises(ModelcutError, match="cross_entropy"):
        parse(TrainingIn, {"seq_len": 4096, "global_batch": 8, "cross_entropy": "liger"})


def test_nemo_24_07s_launcher_runs_say_their_loss():
    """The NeMo 24.07 rows carry the loss their launcher configuration chose: unfused for GPT-3,
    Llama 2 and Nemotron-340B; where the file turns cross_entropy_loss_fusion on, Megatron-core's
    native fusion of 2024 (its fp32 passes in compiled groups), not Transformer Engine's one-kernel
    loss, which Megatron-core took up only in 2025."""
    st = catalog.run_settings()
    ce = {rid: s.cross_entropy for rid, s in st.items() if rid.startswith("nemo2407-")}
    assert len(ce) == 12
    assert {rid for rid, c in ce.items() if c == "mcore-fused"} == {
        "nemo2407-nemotron-8b-64", "nemo2407-nemotron-22b-64", "nemo2407-llama3-8b-8", "nemo2407-llama3-70b-64"}
    assert all(c == "fp32-passes" for rid, c in ce.items() if "gpt3" in rid or "llama2" in rid or "340b" in rid)
    assert all(("cross_entropy_loss_fusion: true" in st[rid].source) == (c == "mcore-fused") for rid, c in ce.items())
    pr = catalog.published_run("nemo2407-gpt3-5b-64")
    assert catalog.apply_settings(pr.run, st[pr.id]).training.cross_entropy == "fp32-passes"
