"""FP8 training (issue 15): the products FP8 runs, its casts, its memory, its refusals."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from hypothesis import HealthCheck, assume, given, settings, strategies as st

from modelcut import catalog
from modelcut.cli import main
from modelcut.core.costs import fp8 as fp8_mod
from modelcut.core.costs.kernels import Efficiency, gemm_time, product_tflops
from modelcut.core.errors import ModelcutError
from modelcut.core.memory import memory_report
from modelcut.core.specs import Layout, Run, Training
from modelcut.core.step.layers import LayerSetup, layer_time

from helpers import predict_default

H100 = catalog.hardware("h100")
B200 = catalog.hardware("b200")
A100 = catalog.hardware("a100")
EFF = Efficiency(0.8, 0.85, 1.0)
DATA = Path(__file__).parent / "data"

dims = st.integers(10, 14).map(lambda e: 2 ** e)          # 1024 .. 16384: a transformer's products


@settings(max_examples=60, deadline=None)
@given(m=dims, n=dims, k=dims, gpu=st.sampled_from(["h100", "h200", "b200"]))
def test_fp8_products_are_never_slower_nor_faster_than_the_throughputs_say(m, n, k, gpu):
    """For a product bound by its arithmetic: FP8 never slower than bf16, and never faster than
    the ratio of the two measured throughputs at that shape."""
    hw = catalog.hardware(gpu)
    t16, t8 = gemm_time(m, n, k, hw, EFF), gemm_time(m, n, k, hw, EFF, dtype="fp8")
    assert t8 <= t16 * (1 + 1e-12)
    tf16, tf8 = product_tflops(m, n, k, hw), product_tflops(m, n, k, hw, dtype="fp8")
    compute_bound = t16 == pytest.approx(2 * m * n * k / (EFF.gemm * tf16 * 1e12), rel=1e-12)
    assume(compute_bound)
    assert t16 / t8 <= tf8 / tf16 * (1 + 1e-9)
    assert tf8 <= (hw.peak_flops_8 or 0) / 1e12


@settings(max_examples=25, deadline=None)
@given(name=st.sampled_from(["llama3-8b", "llama3-70b", "gpt3-175b"]), tp=st.sampled_from([1, 2, 4, 8]),
       seq=st.sampled_from([2048, 4096, 8192]), gpu=st.sampled_from(["h100", "b200"]))
def test_a_layers_products_speed_up_within_the_measured_ratio(name, tp, seq, gpu):
    hw = catalog.hardware(gpu)
    model = catalog.model(name)
    base = dict(micro_batch=1, seq_len=seq, tp=tp, sequence_parallel=tp > 1, tp_bw=hw.link_bw)
    f8 = fp8_mod.resolve(Training(seq, 1, precision="fp8"), hw)
    lt16 = layer_time(model, LayerSetup(**base), hw, EFF)
    lt8 = layer_time(model, LayerSetup(**base, fp8=f8), hw, EFF)
    g16, g8 = lt16.fwd.gemm + lt16.bwd.gemm, lt8.fwd.gemm + lt8.bwd.gemm
    assert g8 < g16
    assert g16 / g8 <= hw.peak_flops_8 / hw.peak_flops_16 * (1 + 1e-9)
    assert lt8.fwd.memory > lt16.fwd.memory            # the casts are memory-bound work
    assert lt8.fwd.attention == lt16.fwd.attention     # attention stays 16-bit


def _run(prec, gpu="h100-sxm5-80gb", recipe=None, **lay):
    layout = Layout(**{"tp": 4, "pp": 2, "dp": 2, "sequence_parallel": True, **lay})
    return Run(catalog.model("llama3-70b"), gpu, layout,
               Training(seq_len=4096, global_batch=32, micro_batch=1, precision=prec, fp8_recipe=recipe))


@settings(max_examples=25, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(tp=st.sampled_from([2, 4, 8]), pp=st.sampled_from([1, 2, 4]), zero=st.sampled_from([0, 1, 3]),
       fw=st.sampled_from(["megatron-core", "nemo", "fsdp-compile"]), gpu=st.sampled_from(["h100", "b200"]),
       recompute=st.sampled_from(["none", "full"]))
def test_fp8_memory_never_exceeds_bf16_plus_its_weight_copies(tp, pp, zero, fw, gpu, recompute):
    hw = catalog.hardware(gpu)
    lay = dict(tp=tp, pp=pp, dp=2, zero=zero)
    r16 = _run("bf16", hw.name, **lay)
    r8 = _run("fp8", hw.name, **lay)
    r16 = Run(r16.model, r16.gpu, r16.layout, Training(4096, 32, 1, recompute))
    r8 = Run(r8.model, r8.gpu, r8.layout, Training(4096, 32, 1, recompute, precision="fp8"))
    framework = catalog.framework(fw)
    m16 = memory_report(r16, hw, framework=framework)
    m8 = memory_report(r8, hw, framework=framework)
    f8 = fp8_mod.for_stack(r8.training, hw, framework)
    for s16, s8 in zip(m16["stages"], m8["stages"]):
        assert s8["activations_bytes"] <= s16["activations_bytes"] * (1 + 1e-12)
        # the weights and their FP8 copies (with FP8 parameters the copies are the weights)
        extra = s8["weights_bytes"] + s8["fp8_weights_bytes"] - s16["weights_bytes"]
        assert extra <= max(fp8_mod.weight_copy_bytes(f8), 0.0) * s16["weights_bytes"] / 2 * (1 + 1e-9) + 1e-6
        if f8.param_gather:
            assert s8["fp8_weights_bytes"] == 0
        # the total moves by the copies and the activations, and the allocator's share of them
        assert s8["total_bytes"] <= s16["total_bytes"] + 1.05 * max(extra, 0.0) + 1e-6


def test_weight_copies_by_accelerator_and_recipe():
    tr = Training(4096, 8, precision="fp8")
    hop = fp8_mod.resolve(tr, H100)
    assert hop.recipe == "delayed" and hop.transposes and fp8_mod.weight_copy_bytes(hop) == 2.0
    bw = fp8_mod.resolve(tr, B200)
    assert bw.recipe == "mxfp8" and not bw.transposes and fp8_mod.weight_copy_bytes(bw) == 2.0
    cur = fp8_mod.resolve(Training(4096, 8, precision="fp8", fp8_recipe="current"), B200, param_gather=True)
    assert fp8_mod.weight_copy_bytes(cur) == -1.0      # the FP8 weight replaces the bf16 one
    assert fp8_mod.param_gather_bytes(cur) == 1.0 and fp8_mod.param_gather_bytes(None) == 2.0
    block = fp8_mod.resolve(Training(4096, 8, precision="fp8", fp8_recipe="blockwise"), H100, param_gather=True)
    assert not block.param_gather                      # block-scaled weights are gathered in bf16


def test_recipes_an_accelerator_cannot_run_are_one_line_errors():
    with pytest.raises(ModelcutError, match="FP8 tensor cores"):
        predict_default(_run("fp8", "a100-sxm4-80gb"), A100)
    with pytest.raises(ModelcutError, match="MXFP8"):
        predict_default(_run("fp8", recipe="mxfp8"), H100)
    with pytest.raises(ModelcutError, match="precision"):
        Training(4096, 8, precision="fp4")
    with pytest.raises(ModelcutError, match="needs precision"):
        Training(4096, 8, fp8_recipe="delayed")


def test_fp8_on_an_a100_from_the_command_line(capsys):
    f = str(DATA / "gpt3-175b.toml")        # an A100 run
    assert main(["predict", f, "--precision", "fp8"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "FP8" in err[0]
    assert main(["predict", f, "--mode", "seed", "--precision", "fp8"]) == 2
    assert "seed model" in capsys.readouterr().err


@pytest.mark.parametrize("written, precision, recipe", [
    (["--precision", "amp_bf16"], "bf16", None), (["--precision", "BF16-mixed"], "bf16", None),
    (["--precision", "amp_fp8"], "fp8", None), (["--precision", "FP8", "--fp8-recipe", "tensorwise"], "fp8", "current"),
    (["--precision", "fp8", "--fp8-recipe", "Delayed"], "fp8", "delayed")])
def test_the_stacks_spellings_of_a_precision_are_modelcuts(capsys, written, precision, recipe):
    """llm-foundry's amp_bf16, Lightning's bf16-mixed, Megatron-core's tensorwise: the same run as
    modelcut's names give."""
    f = str(DATA / "llama3-70b-64-h100.toml")
    canon = ["--precision", precision] + (["--fp8-recipe", recipe] if recipe else [])
    assert main(["predict", f, "--json", *written]) == 0
    got = json.loads(capsys.readouterr().out)
    assert main(["predict", f, "--json", *canon]) == 0
    assert got["step_time_s"] == json.loads(capsys.readouterr().out)["step_time_s"]


def test_a_recipe_modelcut_does_not_time_is_one_line_with_the_reason(tmp_path, capsys):
    f = str(DATA / "llama3-70b-64-h100.toml")
    assert main(["predict", f, "--precision", "fp8", "--fp8-recipe", "NVFP4"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "NVFP4" in err[0] and "does not time" in err[0]
    # torchao's rowwise is timed, on the stacks that run torchao: this run's NeMo runs Transformer Engine
    assert main(["predict", f, "--precision", "fp8", "--fp8-recipe", "rowwise"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "rowwise" in err[0] and "transformer-engine" in err[0] and "nemo" in err[0]
    run = tmp_path / "run.toml"
    run.write_text(open(f).read().replace("[training]", '[training]\nprecision = "fp8"\nfp8_recipe = "nvfp4"'))
    assert main(["predict", str(run)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "does not time" in err[0]
    run.write_text(open(f).read().replace("[training]", '[training]\nprecision = "amp_fp8"\nfp8_recipe = "tensorwise"'))
    assert main(["predict", str(run), "--json"]) == 0
    spelled = json.loads(capsys.readouterr().out)["step_time_s"]
    assert main(["predict", f, "--json", "--precision", "fp8", "--fp8-recipe", "current"]) == 0
    assert spelled == json.loads(capsys.readouterr().out)["step_time_s"]


def test_fp8_speeds_a_70b_step_on_h100_and_names_the_dtypes(capsys):
    f = str(DATA / "llama3-70b-64-h100.toml")
    assert main(["predict", f, "--json"]) == 0
    bf16 = json.loads(capsys.readouterr().out)
    assert main(["predict", f, "--precision", "fp8", "--json"]) == 0
    fp8 = json.loads(capsys.readouterr().out)
    assert fp8["step_time_s"] < bf16["step_time_s"]
    assert bf16["step_time_s"] / fp8["step_time_s"] < 2.0
    assert fp8["mfu"] <= 1.0
    assert fp8["memory"]["assumptions"]["fp8_recipe"] == "delayed"
    assert "fp8" in fp8["memory"]["dtypes"]["fp8_weights_bytes"]
    assert bf16["memory"]["dtypes"]["fp8_weights_bytes"] == "none"


def test_catalog_fp8_runs_are_scored_in_fp8():
    """The FP8 rows of the second development set are in validation, as their own sources (all 16 H100
    rows but Megatron-Bridge's Qwen3 30B, left out as a known software regression: runs.toml's notes)."""
    from modelcut.analysis.measured import catalog_measured
    fp8_runs = [m for m in catalog_measured() if m.run.training.precision == "fp8"]
    assert len(fp8_runs) >= 15
    assert {m.family for m in fp8_runs} >= {"nemo-24.07", "megatron-bridge-25.11"}
    for m in fp8_runs:
        assert m.hw.fp8_recipes


def test_the_explorer_searches_in_fp8(capsys):
    args = ["explore", "--model", "llama3-70b", "--gpu", "h100", "--gpus", "64", "--seq", "8192",
            "--global-batch-tokens", "1M", "--framework", "nemo", "--top", "3", "--json"]
    assert main(args) == 0
    bf16 = json.loads(capsys.readouterr().out)
    assert main(args + ["--precision", "fp8"]) == 0
    fp8 = json.loads(capsys.readouterr().out)
    assert fp8["layouts"][0]["step_time_s"] < bf16["layouts"][0]["step_time_s"]
    assert main(["explore", "--model", "llama3-70b", "--gpu", "a100", "--gpus", "64", "--seq", "8192",
                 "--global-batch-tokens", "1M", "--precision", "fp8"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "FP8" in err[0]


def test_the_explorer_searches_several_precisions_each_as_alone(capsys):
    """--precision bf16,fp8: one search per precision, each the search that precision alone gives
    (its best layout and step time), the fastest named; --fp8-recipe goes with the FP8 search."""
    args = ["explore", "--model", "llama3-8b", "--gpu", "h100", "--gpus", "8", "--seq", "4096",
            "--global-batch-tokens", "512K", "--top", "2", "--json"]
    alone = {}
    for prec in (["--precision", "bf16"], ["--precision", "fp8", "--fp8-recipe", "current"]):
        assert main(args + prec) == 0
        alone[prec[1]] = json.loads(capsys.readouterr().out)
    assert main(args + ["--precision", "bf16,fp8", "--fp8-recipe", "tensorwise"]) == 0
    both = json.loads(capsys.readouterr().out)
    assert both["precisions"] == ["bf16", "fp8"]
    for got, prec in zip(both["searches"], ("bf16", "fp8")):
        assert got["layouts"] == alone[prec]["layouts"] and got["precision"] == prec
    assert both["searches"][1]["fp8_recipe"] == "current"
    times = {p: s["layouts"][0]["step_time_s"] for p, s in zip(both["precisions"], both["searches"])}
    assert both["fastest"] == min(times, key=times.get)
    assert main(args[:-1] + ["--precision", "bf16,fp8"]) == 0
    out = capsys.readouterr().out
    assert "fastest layout per precision" in out and "speed-up" in out


@pytest.mark.parametrize("argv, words", [
    (["--gpu", "a100", "--gpus", "8", "--precision", "bf16,fp8"], "FP8"),
    (["--gpu", "h100", "--gpus", "8-16", "--precision", "bf16,fp8"], "one GPU count"),
    (["--gpu", "h100", "--gpus", "8", "--precision", "bf16,fp4"], "precision"),
])
def test_a_precision_search_it_cannot_do_is_one_line(capsys, argv, words):
    assert main(["explore", "--model", "llama3-8b", "--seq", "4096", "--global-batch-tokens", "512K", *argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and words in err[0]


@pytest.mark.parametrize("recipe, transposes, fused", [
    ("delayed", True, 2.0),      # the norm writes FP8; a separate transpose reads 1 and writes 1 (Hopper)
    ("delayed", False, 0.0),     # Blackwell takes the row-wise copy: nothing more
    ("current", True, 4.0),      # the norm's amax, then the cast: read 2, write 1, transpose 1
    ("current", False, 3.0),
    ("mxfp8", False, 2 + 2 * (1 + 1 / 32)),   # cast apart from the norm, both directions
])
def test_a_norm_fused_input_costs_what_transformer_engine_runs(recipe, transposes, fused):
    """TransformerEngine v2.8 normalization.cpp: FULLY_FUSED for delayed scaling (plus the
    column-wise transpose of ln_api.cpp on Hopper), FUSED_NORM_AMAX_FP8 for current scaling,
    UNFUSED for MXFP8. A norm-fused input never costs more than one quantized apart."""
    f = fp8_mod.Fp8(recipe, transposes=transposes, norm_fused=True, param_gather=False)
    fwd, bwd = fp8_mod.cast_bytes(f, inputs=0, fused_inputs=1000, grads=0, weights=0)
    assert fwd == pytest.approx(1000 * fused) and bwd == 0
    apart, _ = fp8_mod.cast_bytes(f, inputs=1000, fused_inputs=0, grads=0, weights=0)
    assert fwd <= apart
    unfused = fp8_mod.Fp8(recipe, transposes=transposes, norm_fused=False, param_gather=False)
    assert fp8_mod.cast_bytes(unfused, inputs=0, fused_inputs=1000, grads=0, weights=0)[0] == pytest.approx(apart)


def test_a_published_runs_search_keeps_its_own_precision(capsys):
    """explore --run searches at the run's precision: --precision beside it is refused, not ignored."""
    assert main(["explore", "--run", "automodel-gpt-oss-20b-8", "--precision", "bf16,fp8"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "drop --precision" in err[0]


def test_predict_at_several_precisions_is_each_prediction(capsys):
    """predict --precision bf16,fp8: each precision's prediction as predict alone gives it, side by side."""
    f = str(DATA / "llama3-70b-64-h100.toml")
    assert main(["predict", f, "--precision", "bf16,amp_fp8", "--fp8-recipe", "tensorwise", "--json"]) == 0
    both = json.loads(capsys.readouterr().out)
    assert both["precisions"] == ["bf16", "fp8"]
    for got, argv in zip(both["predictions"], (["--precision", "bf16"], ["--precision", "fp8", "--fp8-recipe", "current"])):
        assert main(["predict", f, "--json", *argv]) == 0
        alone = json.loads(capsys.readouterr().out)
        assert (got["step_time_s"], got["memory"]["peak_bytes"]) == (alone["step_time_s"], alone["memory"]["peak_bytes"])
    assert main(["predict", f, "--precision", "bf16,fp8"]) == 0
    out = capsys.readouterr().out
    assert "the run at each precision" in out and "fp8 (delayed) / bf16" in out


@pytest.mark.parametrize("argv, words", [
    (["tests/data/llama3-70b-64-h100.toml", "--precision", "bf16,bf16"], "twice"),
    (["tests/data/llama3-70b-64-h100.toml", "--precision", "bf16,fp4"], "--precision must be"),
    (["tests/data/llama3-70b-64-h100.toml", "--precision", "bf16,fp8", "--budget"], "--budget takes one"),
    (["tests/data/llama3-70b-64-h100.toml", "--precision", "bf16,fp16", "--fp8-recipe", "delayed"], "needs fp8"),
    (["tests/data/gpt3-175b.toml", "--precision", "bf16,fp8"], "FP8 tensor cores"),
])
def test_a_precision_list_predict_cannot_do_is_one_line(capsys, argv, words):
    assert main(["predict", *argv]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and words in err[0]


# ---------------------------------------------------------------- torchao's float8 (torchtitan, NeMo AutoModel)

def _torchao(recipe, compiled, gather=False, hw=H100):
    return fp8_mod.resolve(Training(4096, 8, precision="fp8", fp8_recipe=recipe), hw, norm_fused=False,
                           param_gather=gather, library="torchao", compiled=compiled)


def _casts(f, inputs=0.0, grads=0.0, weights=0.0, fused_inputs=0.0):
    return fp8_mod.cast_bytes(f, inputs=inputs, fused_inputs=fused_inputs, grads=grads, weights=weights)


def test_torchaos_eager_casts_move_what_its_kernels_do():
    """Counted here from torchao's code, kernel by kernel: tensor_to_amax is abs (read 2, write 2)
    then max (read 2); the cast is to(float32) (2 → 4), the scale's multiply (4 → 4), clamp (4 → 4)
    and to(float8) (4 → 1); preprocess_addmm copies an operand into the other layout (1 → 1)."""
    cast = (2 + 2) + 2 + (2 + 4) + (4 + 4) + (4 + 4) + (4 + 1)
    copy = 1 + 1
    f = _torchao("current", compiled=False)
    # an input: cast in the forward, cast again from its saved bf16 copy and copied in the backward
    assert _casts(f, inputs=1) == (cast, cast + copy)
    # an output gradient: cast row-wise and column-wise, one of them copied
    assert _casts(f, grads=1) == (0, 2 * cast + copy)
    # a weight: cast in the forward and again in the backward, copied for the data gradient
    assert _casts(f, weights=1) == (cast, cast + copy)
    # norm-fed inputs are cast like any other: torchao has no norm-fused cast
    assert _casts(f, fused_inputs=1) == _casts(f, inputs=1)
    # FSDP's float8 all-gather brings the weight in FP8: only its layout copy remains
    assert _casts(_torchao("current", compiled=False, gather=True), weights=1) == (0, copy)


def test_torchaos_compiled_casts_are_its_roofline_counts():
    """torchao's roofline (testing/training/roofline_utils.py), the amax not fused into the producer:
    tensorwise, read for the amax (2), read once more and written in both layouts (2 + 1 + 1); a
    weight twice cast (2 + 3 + 3); rowwise, a row-wise cast beside a bf16 transpose (2 + 1 + 2) and
    that transpose cast (2 + 1), a weight 3 + 4 + 3, and the two backward products' outputs
    rescaled in bf16 (2 + 2)."""
    tw, rw = _torchao("current", compiled=True), _torchao("rowwise", compiled=True)
    assert _casts(tw, inputs=1) == (2 + 2 + 1 + 1, 0) and _casts(tw, grads=1) == (0, 2 + 2 + 1 + 1)
    assert _casts(tw, weights=1) == (2 + 3, 3)
    assert _casts(rw, grads=1) == (0, (2 + 1 + 2) + (2 + 1))
    assert _casts(rw, inputs=1) == (2 + 1 + 2, (2 + 1) + (2 + 2))        # and its data gradient rescaled
    assert _casts(rw, weights=1) == (3, 4 + 3 + (2 + 2))                 # and its weight gradient rescaled
    assert _casts(_torchao("current", compiled=True, gather=True), weights=1) == (0, 1 + 1)
    assert not rw.param_gather and not _torchao("rowwise", True, gather=True).param_gather   # bf16 all-gather


@settings(max_examples=40, deadline=None)
@given(inputs=st.floats(0, 1e9), grads=st.floats(0, 1e9), weights=st.floats(0, 1e9),
       recipe=st.sampled_from(["current", "rowwise"]), gather=st.booleans())
def test_eager_casts_never_move_less_than_compiled_ones_nor_tensorwise_more_than_rowwise(
        inputs, grads, weights, recipe, gather):
    eager = sum(_casts(_torchao(recipe, False, gather), inputs, grads, weights))
    compiled = sum(_casts(_torchao(recipe, True, gather), inputs, grads, weights))
    assert eager >= compiled
    tw = sum(_casts(_torchao("current", True, gather), inputs, grads, weights))
    rw = sum(_casts(_torchao("rowwise", True, gather), inputs, grads, weights))
    assert tw <= rw


@settings(max_examples=20, deadline=None)
@given(name=st.sampled_from(["llama3-8b", "llama3-70b"]), tp=st.sampled_from([1, 2, 8]),
       seq=st.sampled_from([2048, 8192]), recipe=st.sampled_from(["current", "rowwise"]),
       compiled=st.booleans())
def test_torchaos_products_speed_up_within_the_measured_ratio_and_its_casts_cost(name, tp, seq, recipe, compiled):
    """torchao times its products from the same FP8 table as Transformer Engine (one rate for both
    recipes, as torchao's roofline has it); what differs is the casts, memory-bound work."""
    model = catalog.model(name)
    base = dict(micro_batch=1, seq_len=seq, tp=tp, sequence_parallel=tp > 1, tp_bw=H100.link_bw,
                fused_elementwise=compiled)
    lt16 = layer_time(model, LayerSetup(**base), H100, EFF)
    lt8 = layer_time(model, LayerSetup(**base, fp8=_torchao(recipe, compiled)), H100, EFF)
    te = layer_time(model, LayerSetup(**base, fp8=fp8_mod.resolve(Training(seq, 1, precision="fp8",
                                                                             fp8_recipe="current"), H100)), H100, EFF)
    g16, g8 = lt16.fwd.gemm + lt16.bwd.gemm, lt8.fwd.gemm + lt8.bwd.gemm
    assert g8 < g16 and g16 / g8 <= H100.peak_flops_8 / H100.peak_flops_16 * (1 + 1e-9)
    assert g8 == pytest.approx(te.fwd.gemm + te.bwd.gemm, rel=1e-12)
    assert lt8.bwd.memory > lt16.bwd.memory


def test_rowwise_runs_on_torchaos_stacks_and_nowhere_else():
    lay = dict(tp=8, pp=1, dp=8, zero=1)          # compute-bound: weights gathered once a step
    run = _run("fp8", recipe="rowwise", **lay)
    fast = predict_default(_run("fp8", recipe="current", **lay), H100, framework="fsdp-compile")
    row = predict_default(run, H100, framework="fsdp-compile")
    bf16 = predict_default(_run("bf16", **lay), H100, framework="fsdp-compile")
    assert fast.step_time_s < row.step_time_s          # more cast bytes, the same products
    assert row.step_time_s < bf16.step_time_s
    with pytest.raises(ModelcutError, match="transformer-engine"):
        predict_default(run, H100, framework="megatron-core")
    with pytest.raises(ModelcutError, match="FP8 tensor cores"):
        predict_default(_run("fp8", "a100-sxm4-80gb", recipe="rowwise", tp=8, pp=1, dp=8, zero=3), A100,
                        framework="fsdp-compile")
    with pytest.raises(ModelcutError, match="torchao"):          # torchao has no delayed scaling
        predict_default(_run("fp8", recipe="delayed", tp=8, pp=1, dp=8, zero=3), H100, framework="fsdp-compile")


def test_torchao_keeps_its_linear_inputs_in_16_bits(capsys):
    """torchao saves a linear's bf16 input for its backward (float8_linear.py save_for_backward(input_hp,
    ...)): FP8 leaves the activations as they are; Transformer Engine keeps the FP8 copy."""
    lay = dict(tp=8, pp=1, dp=8, zero=3)
    for fw, smaller in (("fsdp-compile", False), ("megatron-core", True)):
        framework = catalog.framework(fw)
        m16 = memory_report(_run("bf16", **lay), H100, framework=framework)["stages"][0]
        m8 = memory_report(_run("fp8", recipe="current", **lay), H100, framework=framework)
        assert (m8["stages"][0]["activations_bytes"] < m16["activations_bytes"]) is smaller
        if not smaller:
            assert m8["stages"][0]["activations_bytes"] == m16["activations_bytes"]
            assert "torchao" in m8["dtypes"]["activations_bytes"]


def test_the_torchtitan_emitter_names_rowwise(capsys):
    args = ["explore", "--model", "llama3-8b", "--gpu", "h100", "--gpus", "8", "--seq", "8192",
            "--global-batch-tokens", "65536", "--framework", "torchtitan", "--precision", "fp8",
            "--fp8-recipe", "rowwise", "--emit", "torchtitan"]
    assert main(args) == 0
    out = capsys.readouterr().out
    assert 'recipe_name = "rowwise"' in out and "quantize.linear.float8" in out
    assert main(args[:-1] + ["megatron"]) == 0
    assert "no flag" in capsys.readouterr().out


def test_rowwise_gathers_activations_in_16_bits_and_tensorwise_in_fp8():
    """Sequence parallelism's all-gathers: FP8 under Transformer Engine and torchao's tensorwise, 16-bit
    under torchao's rowwise (torchtitan v0.2.2 parallelize.py enable_float8_tensorwise_tp)."""
    model = catalog.model("llama3-70b")
    base = dict(micro_batch=1, seq_len=8192, tp=8, sequence_parallel=True, tp_bw=H100.link_bw)
    tp = {}
    for key, f8 in (("bf16", None), ("te", fp8_mod.resolve(Training(8192, 1, precision="fp8", fp8_recipe="current"), H100)),
                    ("tensorwise", _torchao("current", True)), ("rowwise", _torchao("rowwise", True))):
        lt = layer_time(model, LayerSetup(**base, fp8=f8), H100, EFF)
        tp[key] = lt.fwd.tp
    assert tp["te"] == tp["tensorwise"] < tp["bf16"] == tp["rowwise"]


def test_rowwise_with_a_16_bit_weight_gradient():
    """torchao's rowwise_with_gw_hp: one row-wise cast of the input and of the output gradient, the
    weight cast row-wise and per-tensor, and the weight gradient's product on the bf16 operands."""
    gw = _torchao("rowwise_with_gw_hp", compiled=True)
    assert _casts(gw, inputs=1) == (2 + 1, 0) and _casts(gw, grads=1) == (0, 2 + 1)
    assert _casts(gw, weights=1) == (2 + 1, 2 + 1)
    cast = (2 + 2) + 2 + (2 + 4) + (4 + 4) + (4 + 4) + (4 + 1)
    eager = _torchao("rowwise_with_gw_hp", compiled=False)
    assert _casts(eager, inputs=1) == (cast, 0) and _casts(eager, grads=1) == (0, cast)
    assert _casts(eager, weights=1) == (cast, cast + 2)
    assert not gw.gathers_fp8_activations and not _torchao("rowwise_with_gw_hp", True, gather=True).param_gather
    model = catalog.model("llama3-70b")
    base = dict(micro_batch=1, seq_len=8192, tp=8, sequence_parallel=True, tp_bw=H100.link_bw, fused_elementwise=True)
    times = {key: layer_time(model, LayerSetup(**base, fp8=f8), H100, EFF)
             for key, f8 in (("bf16", None), ("rowwise", _torchao("rowwise", True)), ("gw_hp", gw))}
    assert times["gw_hp"].fwd.gemm == times["rowwise"].fwd.gemm                # the forward is rowwise's
    assert times["rowwise"].bwd.gemm < times["gw_hp"].bwd.gemm < times["bf16"].bwd.gemm
    assert times["gw_hp"].wgrad == pytest.approx(times["bf16"].wgrad, rel=1e-12)   # the weight gradient in bf16


def test_torchao_leaves_the_routed_experts_in_16_bits():
    """torchao's float8 converts nn.Linear: torchtitan's routed experts (a grouped product on bf16
    parameters) stay 16-bit, its shared experts run in FP8; Transformer Engine's grouped GEMMs run in FP8."""
    model = catalog.model("deepseek-v3")
    base = dict(micro_batch=1, seq_len=4096, tp=1, tp_bw=H100.link_bw, fused_elementwise=True)
    te = fp8_mod.resolve(Training(4096, 1, precision="fp8", fp8_recipe="current"), H100)
    times = {key: layer_time(model, LayerSetup(**base, fp8=f8), H100, EFF, moe=True, ep=8)
             for key, f8 in (("bf16", None), ("te", te), ("torchao", _torchao("current", True)))}
    assert times["te"].fwd.gemm < times["torchao"].fwd.gemm < times["bf16"].fwd.gemm
    assert not _torchao("rowwise", True).routed_experts_fp8 and te.routed_experts_fp8


def test_eager_torchao_fp8_says_what_it_costs(capsys):
    f = str(DATA / "llama3-70b-64-h100.toml")
    assert main(["predict", f, "--framework", "torchtitan-eager", "--precision", "fp8", "--json"]) == 0
    eager = json.loads(capsys.readouterr().out)
    assert any("torchao in eager PyTorch" in n and "torch.compile" in n for n in eager["notes"])
    assert main(["predict", f, "--framework", "torchtitan", "--precision", "fp8", "--json"]) == 0
    assert not any("eager" in n for n in json.loads(capsys.readouterr().out)["notes"])


@pytest.mark.parametrize("name", catalog.framework_names())
@pytest.mark.parametrize("gpu", ["h100", "b200"])
def test_every_stack_runs_fp8_when_a_run_names_no_recipe(name, gpu):
    """A run that says precision fp8 and no recipe gets its stack's default, one its FP8 library runs
    (NeMo AutoModel's torchao defaulted to Transformer Engine's delayed scaling and refused itself)."""
    fw, hw = catalog.framework(name), catalog.hardware(gpu)
    tr = Training(seq_len=4096, global_batch=8, precision="fp8")
    if fw.fp8_library == "none":      # the 2021-2022 stacks: one line saying they have no FP8
        with pytest.raises(ModelcutError, match=f"{name} has no FP8 training"):
            fp8_mod.for_stack(tr, hw, fw)
        assert fw.fp8_recipes == ()
        return
    f = fp8_mod.for_stack(tr, hw, fw)
    assert f.recipe in fw.fp8_recipes and f.library == fw.fp8_library


@pytest.mark.parametrize("stack", ["megatron-2021", "megatron-2022", "deepspeed-zero3", "megatron-deepspeed",
                                   "megatron-deepspeed-2022"])
def test_stacks_older_than_fp8_refuse_it_in_one_line(stack, capsys):
    """Megatron-LM of 2021-2022, DeepSpeed's ZeRO-3 of 2021 and Megatron-DeepSpeed predate FP8
    training (Transformer Engine's first code is of 2022-09-27): an FP8 prediction on them is one
    line, exit 2, and their 16-bit prediction is unchanged."""
    run = str(DATA / "gpt3-175b-nemo-h100.toml")
    assert main(["predict", run, "--framework", stack, "--precision", "fp8"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"{stack} has no FP8 training" in err[0]
    assert main(["predict", run, "--framework", stack, "--json"]) == 0
    capsys.readouterr()
    assert main(["list", "frameworks", "--json"]) == 0
    listed = {r["name"]: r for r in json.loads(capsys.readouterr().out)}
    assert listed[catalog.framework(stack).name]["fp8_recipes"] == []


def test_a_stack_whose_default_recipe_its_library_lacks_is_refused_when_it_is_built():
    from dataclasses import replace
    fw = catalog.framework("fsdp")
    with pytest.raises(ModelcutError, match="Transformer Engine's choice"):
        replace(fw, fp8_default_recipe="auto")
    with pytest.raises(ModelcutError, match="not torchao's"):
        replace(fw, fp8_default_recipe="delayed")
    with pytest.raises(ModelcutError, match="not transformer-engine's"):
        replace(catalog.framework("nemo"), fp8_default_recipe="rowwise")


def test_a_stack_older_than_a_recipe_refuses_it_in_one_line(capsys):
    """NeMo 24.07's Transformer Engine (7d576ed, 2024-06-13) has delayed scaling only: its preset
    offers that recipe, takes it when a run names none, and refuses current scaling in one line,
    where the nemo preset (NeMo 2.4) runs all four."""
    assert catalog.framework("nemo-24.07").fp8_recipes == ("delayed",)
    assert catalog.framework("llm-foundry").fp8_recipes == ("delayed",)   # Composer's amp_fp8: DelayedScaling
    assert set(catalog.framework("nemo").fp8_recipes) == {"delayed", "current", "blockwise", "mxfp8"}
    with pytest.raises(ModelcutError, match="predates it"):
        fp8_mod.for_stack(Training(seq_len=4096, global_batch=8, precision="fp8", fp8_recipe="current"),
                          catalog.hardware("h100"), catalog.framework("nemo-24.07"))
    assert main(["predict", "--run", "nemo2407-llama3-8b-8", "--fp8-recipe", "current"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "fp8_recipe current is not one nemo-24.07 runs" in err[0]
    assert main(["predict", "--run", "nemo2407-llama3-8b-8", "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["memory"]["assumptions"]["fp8_recipe"] == "delayed"
    from dataclasses import replace
    with pytest.raises(ModelcutError, match="fp8_only must list recipes of transformer-engine"):
        replace(catalog.framework("nemo"), fp8_only=("rowwise",))


def test_a_run_may_say_whether_its_fp8_weights_are_gathered_in_fp8(tmp_path, capsys):
    """[training] fp8_param_gather overrides the stack's: on megatron-core (off by default) it keeps
    the linear weights in FP8 and gathers them so; the memory is never more and the step never
    slower than with the bf16 copy; without fp8 it is one line."""
    from modelcut.cli import main
    text = ('[model]\nname = "llama3-70b"\n[hardware]\ngpu = "h100"\ngpus = 64\n[layout]\ntp = 4\npp = 1\ndp = 16\n'
            'zero = 3\n[training]\nseq_len = 8192\nglobal_batch = 128\nprecision = "fp8"\nfp8_recipe = "current"\n'
            '{}[settings]\nframework = "megatron-core"\n')
    f = tmp_path / "run.toml"
    out = {}
    for k, line in (("stack", ""), ("on", "fp8_param_gather = true\n"), ("off", "fp8_param_gather = false\n")):
        f.write_text(text.format(line))
        assert main(["predict", str(f), "--json"]) == 0
        out[k] = json.loads(capsys.readouterr().out)
    assert out["stack"]["step_time_s"] == out["off"]["step_time_s"]          # megatron-core: off
    assert out["on"]["memory"]["peak_bytes"] < out["off"]["memory"]["peak_bytes"]
    assert out["on"]["step_time_s"] <= out["off"]["step_time_s"]              # ZeRO-3 gathers 1 byte, not 2
    f.write_text(text.format("fp8_param_gather = true\n").replace('precision = "fp8"\nfp8_recipe = "current"\n', ""))
    assert main(["predict", str(f)]) == 2
    err = capsys.readouterr().err
    assert "fp8_param_gather needs precision" in err and len(err.strip().splitlines()) == 1


def test_torchtitans_float8_all_gather_is_off_unless_the_file_turns_it_on():
    import tomllib
    from modelcut.service.torchtitan_config import run_document
    conf = ('[model]\nname = "llama3"\nflavor = "8B"\nconverters = ["quantize.linear.float8"]\n'
            '[training]\nlocal_batch_size = 1\nseq_len = 8192\n[quantize.linear.float8]\n{}')
    doc, _ = run_document(tomllib.loads(conf.format("")), gpu="h100", gpus=64)
    assert doc["training"]["fp8_param_gather"] is False          # torchtitan's default
    doc, _ = run_document(tomllib.loads(conf.format("enable_fsdp_float8_all_gather = true\n")), gpu="h100", gpus=64)
    assert doc["training"]["fp8_param_gather"] is True


def test_the_explorer_takes_fp8_param_gather_for_its_fp8_searches(capsys):
    """--fp8-param-gather: every layout of an FP8 search keeps its weights in FP8 (the answer says
    so, and the best layout needs no more memory than without); beside bf16 it goes to the FP8
    search only; alone with bf16 it is one line."""
    args = ["explore", "--model", "llama3-8b", "--gpu", "h100", "--gpus", "16", "--seq", "4096",
            "--global-batch-tokens", "512K", "--top", "1", "--json"]
    ans = {}
    for k, extra in (("on", ["--precision", "fp8", "--fp8-param-gather"]), ("off", ["--precision", "fp8"])):
        assert main(args + extra) == 0
        ans[k] = json.loads(capsys.readouterr().out)
    assert ans["on"]["fp8_param_gather"] is True and ans["off"]["fp8_param_gather"] is None
    assert ans["on"]["layouts"][0]["memory"]["peak_bytes"] <= ans["off"]["layouts"][0]["memory"]["peak_bytes"] * 1.001 \
        or ans["on"]["layouts"][0]["step_time_s"] < ans["off"]["layouts"][0]["step_time_s"]
    assert main(args + ["--precision", "bf16,fp8", "--fp8-param-gather"]) == 0
    both = json.loads(capsys.readouterr().out)
    assert [s["fp8_param_gather"] for s in both["searches"]] == [None, True]
    assert main(args + ["--precision", "bf16", "--fp8-param-gather"]) == 2
    assert "fp8_param_gather needs precision" in capsys.readouterr().err


def test_predicting_a_run_at_other_precisions_keeps_what_each_can_take(tmp_path, capsys):
    """--precision bf16,fp16,fp8 on a run that gathers FP8 weights and reduces in bf16: the FP8
    gathering goes with fp8 only, the 16-bit reduction stays 16-bit in each precision's type."""
    f = tmp_path / "run.toml"
    f.write_text('[model]\nname = "llama3-8b"\n[hardware]\ngpu = "h100"\ngpus = 16\n[layout]\ndp = 16\n'
                 '[training]\nseq_len = 4096\nglobal_batch = 64\nprecision = "fp8"\nfp8_param_gather = true\n'
                 'grad_reduce = "bf16"\n[settings]\nframework = "megatron-core"\n')
    assert main(["predict", str(f), "--precision", "bf16,fp16,fp8", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert out["precisions"] == ["bf16", "fp16", "fp8"] and len(out["predictions"]) == 3
    notes = [" ".join(p["notes"]) for p in out["predictions"]]
    assert "reduced in bf16" in notes[0] and "reduced in fp16" in notes[1] and "reduced in bf16" in notes[2]
