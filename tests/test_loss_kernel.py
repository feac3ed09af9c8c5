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
from modelcut.core.step.elementwise import CE_BYTES
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
    for a in CROSS_ENTROPY_KINDS:
        for b in CROSS_ENTROPY_KINDS:
            if sum(CE_BYTES[a]) < sum(CE_BYTES[b]):
                assert times[a] < times[b]
            elif sum(CE_BYTES[a]) == sum(CE_BYTES[b]):
                assert times[a] == pytest.approx(times[b], rel=1e-9)
    assert times["fused"] < times["fp32-passes"]


def test_an_unknown_loss_kernel_is_a_one_line_error():
    with pytest.raises(ModelcutError, match="cross_entropy must be one of fp32-passes, fused, mcore-fused, torch, torch-fp32, torch-compiled, flash-attn"):
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


def test_every_loss_kernel_says_what_it_keeps_and_holds():
    """The memory model prices every kernel the step time does, and none holds less than it keeps."""
    from modelcut.core.memory.activations import LOSS_BYTES
    assert set(LOSS_BYTES) == {None, *CROSS_ENTROPY_KINDS}
    assert all(0 < kept <= held for kept, held in LOSS_BYTES.values())


def test_the_loss_kernel_moves_the_last_devices_peak_as_it_keeps_and_holds():
    """One device holds the loss (pp 1): its peak activations differ between kernels by
    (held − kept) + kept, per logit of V/t a token. torchtitan's FP32 loss against Transformer
    Engine's fused one on Llama 3 8B (V 128,000 as its paper's Table 3), t 2, 8,192 tokens: (12 − 2)·V/2
    bytes a token."""
    from modelcut.core.memory import memory_report
    peak = {ce: memory_report(with_ce(ce), H100, framework=catalog.framework("megatron-core"))["stages"][0]
            ["activations_bytes"] for ce in CROSS_ENTROPY_KINDS}
    per_token = 8192 * RUN.model.vocab / 2
    assert peak["torch-fp32"] - peak["fused"] == pytest.approx(10 * per_token, rel=1e-9)
    assert peak["fp32-passes"] - peak["fused"] == pytest.approx(4 * per_token, rel=1e-9)
    assert peak["fp32-passes"] == peak["mcore-fused"]


@pytest.mark.torch
def test_the_compiled_loss_keeps_the_16_bit_logits_and_recomputes_the_softmax():
    """torchtitan's loss (``F.cross_entropy(pred.flatten(0, 1).float(), ...)``) through AOTAutograd's
    min-cut partitioner with Inductor's decompositions, as torch.compile runs it: the backward
    receives the 16-bit logits and per-row statistics, no vocabulary-wide FP32 tensor, so the loss
    keeps 2 bytes a logit ("torch-compiled" in LOSS_BYTES) and recomputes the softmax in one pass."""
    torch = pytest.importorskip("torch")
    import torch.nn.functional as F
    from functorch.compile import aot_function, make_boxed_func, min_cut_rematerialization_partition
    from torch._inductor.decomposition import select_decomp_table
    from modelcut.core.memory.activations import LOSS_BYTES

    saved = []

    def forward_compiler(gm, _):
        out = next(n for n in gm.graph.nodes if n.op == "output")
        saved.extend(a.meta["val"] for a in out.args[0][1:] if hasattr(a, "meta") and "val" in a.meta)
        return make_boxed_func(gm)

    def loss(x, y):
        return F.cross_entropy(x.flatten(0, 1).float(), y.flatten(0, 1))

    f = aot_function(loss, fw_compiler=forward_compiler, bw_compiler=lambda gm, _: make_boxed_func(gm),
                     partition_fn=min_cut_rematerialization_partition, decompositions=select_decomp_table())
    rows, vocab = 2 * 64, 1000
    x = torch.randn(2, 64, vocab, dtype=torch.bfloat16, requires_grad=True)
    f(x, torch.randint(0, vocab, (2, 64))).backward()
    wide = [t for t in saved if t.numel() >= rows * vocab]
    assert [t.dtype for t in wide] == [torch.bfloat16]               # the logits, nothing FP32 that wide
    assert sum(t.numel() * t.element_size() for t in saved) < rows * vocab * 2 + 64 * rows
    assert LOSS_BYTES["torch-compiled"][0] == 2.0
