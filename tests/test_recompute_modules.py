"""Selective recomputation by module (Megatron-core's --recompute-modules): what each module
re-executes, what it stops keeping, how runs name it, and what is refused."""

from __future__ import annotations

import subprocess
import sys
from dataclasses import replace
from itertools import combinations

import pytest
from hypothesis import given, settings, strategies as st

from modelcut import catalog
from modelcut.core.costs.flops import executed_flops
from modelcut.core.costs.kernels import Efficiency, mem_time
from modelcut.core.errors import ModelcutError
from modelcut.core.memory.activations import layer_activation_bytes
from modelcut.core.specs import RECOMPUTE_MODULES, Training
from modelcut.core.step.elementwise import NORM_BYTES
from modelcut.core.step.layers import LayerSetup, layer_time

H100 = catalog.hardware("h100")
EFF = Efficiency(0.8, 0.8, 0.6)
OSS = catalog.model("gpt-oss-120b")
LLAMA = catalog.model("llama3-8b")
SUBSETS = [c for k in range(1, len(RECOMPUTE_MODULES) + 1) for c in combinations(RECOMPUTE_MODULES, k)]


def setup(mods=("core_attn",), **kw) -> LayerSetup:
    base = dict(micro_batch=1, seq_len=4096, attention="cudnn", recompute="selective", recompute_modules=mods,
                tp_bw=H100.link_bw, mcore_layers=True)
    base.update(kw)
    return LayerSetup(**base)


def test_each_module_reexecutes_its_own_forward():
    """core_attn: the attention core's forward; layernorm: the MoE layer's pre-MLP norm, read and
    written once more (4 bytes an element over T·h); moe_act: the experts' activation's forward bytes.
    Together they are the sum of the parts."""
    T, h = 4096, OSS.hidden
    core = layer_time(OSS, setup(), H100, EFF, moe=True, ep=8).recompute
    norm = layer_time(OSS, setup(("layernorm",)), H100, EFF, moe=True, ep=8).recompute
    act = layer_time(OSS, setup(("moe_act",)), H100, EFF, moe=True, ep=8).recompute
    both = layer_time(OSS, setup(("layernorm", "moe_act")), H100, EFF, moe=True, ep=8).recompute
    full = layer_time(OSS, setup(), H100, EFF, moe=True, ep=8)
    assert core.attention == pytest.approx(full.fwd.attention) and core.gemm == 0.0
    assert norm.attention == 0.0 and norm.gemm == 0.0
    assert norm.memory == pytest.approx(mem_time(NORM_BYTES * T * h, H100, EFF))
    assert act.attention == 0.0 and 0.0 < act.memory < full.fwd.memory
    assert both.memory == pytest.approx(norm.memory + act.memory)


def test_moe_act_does_not_recompute_the_experts_output_biases():
    """moe_act checkpoints the activation function (its clamped GLU included); the routed experts'
    output biases are added after the down product, outside the checkpoint (Megatron-LM core_v0.15.0
    experts.py TEGroupedMLP.forward), so a model with them recomputes the same bytes as one without."""
    plain = replace(OSS, bias=False)
    with_b = layer_time(OSS, setup(("moe_act",)), H100, EFF, moe=True, ep=8)
    without = layer_time(plain, setup(("moe_act",)), H100, EFF, moe=True, ep=8)
    assert with_b.fwd.memory > without.fwd.memory                  # the biases' eager adds do cost
    assert with_b.recompute.memory == pytest.approx(without.recompute.memory)


def test_a_dense_layer_has_nothing_but_its_attention_core_to_recompute():
    """Under Transformer Engine's layer spec a dense layer's input norm is fused into the QKV
    product and it has no routed experts: layernorm and moe_act recompute nothing there."""
    for mods in (("layernorm",), ("moe_act",), ("layernorm", "moe_act")):
        rc = layer_time(LLAMA, setup(mods), H100, EFF).recompute
        assert rc.total == 0.0
        assert layer_activation_bytes(LLAMA, micro_batch=1, seq=4096, recompute="selective",
                                      recompute_modules=mods) == \
            layer_activation_bytes(LLAMA, micro_batch=1, seq=4096, recompute="none")


def test_discarded_outputs_are_what_the_memory_stops_keeping():
    """layernorm drops the pre-MLP norm's output (2 bytes an element over the tokens; 1 in FP8, the
    saved copy being FP8), moe_act the experts' activation output (top-k routed rows of the expert
    width, per expert-tensor-parallel rank)."""
    n, h, fe, k = 4096, OSS.hidden, OSS.expert_ffn_hidden, OSS.top_k
    for fp8, el in ((False, 2), (True, 1)):
        kw = dict(micro_batch=1, seq=4096, moe=True, fp8=fp8)
        none = layer_activation_bytes(OSS, recompute="none", **kw)
        norm = layer_activation_bytes(OSS, recompute="selective", recompute_modules=("layernorm",), **kw)
        act = layer_activation_bytes(OSS, recompute="selective", recompute_modules=("moe_act",), **kw)
        assert none - norm == pytest.approx(n * el * h)
        assert none - act == pytest.approx(n * k * el * fe)


@settings(max_examples=25, deadline=None)
@given(st.sampled_from(SUBSETS), st.sampled_from(SUBSETS), st.sampled_from([1, 2, 8]), st.booleans())
def test_recomputing_more_modules_keeps_no_more_and_costs_no_less(a, b, tp, fp8):
    """Property: for module sets a ⊆ a ∪ b, the larger set's recomputation takes no less time and
    its layer keeps no more bytes, on MoE and dense layers alike."""
    big = tuple(m for m in RECOMPUTE_MODULES if m in a or m in b)
    for model, moe in ((OSS, True), (LLAMA, False)):
        kw = dict(micro_batch=2, seq=4096, t=tp, sequence_parallel=tp > 1, moe=moe, fp8=fp8, recompute="selective")
        assert layer_activation_bytes(model, recompute_modules=big, **kw) <= \
            layer_activation_bytes(model, recompute_modules=a, **kw) + 1e-6
        s_a, s_big = setup(a, tp=tp, sequence_parallel=tp > 1), setup(big, tp=tp, sequence_parallel=tp > 1)
        ep = 8 if moe else 1
        assert layer_time(model, s_big, H100, EFF, moe=moe, ep=ep).recompute.total >= \
            layer_time(model, s_a, H100, EFF, moe=moe, ep=ep).recompute.total - 1e-15


def test_flops_count_the_attention_core_only_when_it_is_recomputed():
    base = Training(seq_len=4096, global_batch=64, recompute="none")
    core = replace(base, recompute="selective")
    mods = replace(base, recompute="selective", recompute_modules=("layernorm", "moe_act"))
    assert executed_flops(OSS, core, "palm") > executed_flops(OSS, base, "palm")
    assert executed_flops(OSS, mods, "palm") == executed_flops(OSS, base, "palm")
    assert executed_flops(OSS, replace(mods, recompute_modules=("core_attn", "moe_act")), "palm") == \
        executed_flops(OSS, core, "palm")


@pytest.mark.parametrize("kw, words", [
    (dict(recompute="none", recompute_modules=("moe_act",)), "needs recompute = \"selective\""),
    (dict(recompute="selective", recompute_modules=("mlp",)), "'mlp' is not one modelcut times"),
    (dict(recompute="selective", recompute_modules=()), "at least one module"),
    (dict(recompute="selective", recompute_modules=("moe_act", "moe_act")), "each once"),
    (dict(recompute="selective", recompute_modules="moe_act"), "a list of module names"),
])
def test_bad_module_lists_are_refused_in_one_line(kw, words):
    with pytest.raises(ModelcutError, match=words.replace("(", r"\(")):
        Training(seq_len=4096, global_batch=64, **kw)


RUN = """[model]
name = "gpt-oss-120b"
[hardware]
gpu = "h100-sxm5-80gb"
gpus = 64
[layout]
tp = 1
pp = 4
dp = 16
ep = 8
[training]
seq_len = 4096
global_batch = 512
recompute = "selective"
recompute_modules = {mods}
"""


def _predict(tmp_path, mods: str, *args: str) -> subprocess.CompletedProcess:
    f = tmp_path / "run.toml"
    f.write_text(RUN.format(mods=mods))
    return subprocess.run([sys.executable, "-m", "modelcut", "predict", str(f), *args], capture_output=True, text=True)


def test_a_run_file_names_its_modules_and_the_prediction_says_so(tmp_path):
    out = _predict(tmp_path, '["layernorm", "moe_act"]', "--framework", "megatron-bridge")
    assert out.returncode == 0, out.stderr
    assert "selective recomputation of layernorm, moe_act" in out.stdout


@pytest.mark.parametrize("mods, args, words", [
    ('["layernorm"]', ("--framework", "fsdp"), "not built on Megatron-core's layers"),
    ('["moe_act"]', ("--framework", "megatron-2022"), "not built on Megatron-core's layers"),
    ('["mla_up_proj"]', ("--framework", "megatron-bridge"), "mla_up_proj"),
])
def test_a_bad_run_file_exits_two_with_one_line(tmp_path, mods, args, words):
    out = _predict(tmp_path, mods, *args)
    assert out.returncode == 2 and "Traceback" not in out.stderr
    lines = [x for x in out.stderr.strip().splitlines() if x.strip()]
    assert len(lines) == 1 and words in lines[0], out.stderr


def test_a_csv_row_names_its_modules_with_semicolons(tmp_path):
    from modelcut.service.runs_csv import read_runs_csv
    f = tmp_path / "runs.csv"
    f.write_text("id,model,gpu,tp,pp,dp,seq_len,global_batch,micro_batch,recompute,recompute_modules,step_time_s\n"
                 "a,llama3-8b,h100,1,1,8,4096,64,1,selective,core_attn;layernorm,10\n"
                 "b,llama3-8b,h100,1,1,8,4096,64,1,selective,,10\n")
    got = read_runs_csv(f)
    assert got[0].run.training.recompute_modules == ("core_attn", "layernorm")
    assert got[1].run.training.recompute_modules is None
    f.write_text("id,model,gpu,tp,pp,dp,seq_len,global_batch,micro_batch,recompute,recompute_modules,step_time_s\n"
                 "a,llama3-8b,h100,1,1,8,4096,64,1,full,moe_act,1\n")
    with pytest.raises(ModelcutError, match="needs recompute"):
        read_runs_csv(f)
