"""The gradients' reduce type as a run input (``[training] grad_reduce``: FSDP's reduce_dtype,
torchtitan's mixed_precision_reduce, Composer's DEFAULT/PURE, Megatron-LM's --grad-reduce-in-bf16):
the wire's bytes in the step, the buffer's in memory where the stack reduces it in place; the
readers and the emitters carry it; bad values are one line."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from fastapi.testclient import TestClient
from hypothesis import given, settings, strategies as st

from modelcut import catalog
from modelcut.cli import main
from modelcut.core.errors import ModelcutError
from modelcut.core.specs import Layout, Run, Training
from modelcut.export.emit import megatron_args, nemo_overrides, torchtitan_toml
from modelcut.service.explore import ExploreRequest, run_explore
from modelcut.service.megatron_args import run_document
from modelcut.service.predict import PredictRequest, predict
from modelcut.service.torchtitan_config import run_document as titan_document
from modelcut.web import app as webapp

from helpers import assert_round_trip

H100 = catalog.hardware("h100")


def _run(model="llama3-8b", gpus=64, tp=1, pp=1, zero=None, grad_reduce=None, precision="bf16", mb=1, gb=256,
         seq=4096, gpu="h100", **lay) -> Run:
    L = Layout(tp=tp, pp=pp, dp=gpus // (tp * pp), zero=zero, **lay)
    return Run(catalog.model(model), gpu, L, Training(seq_len=seq, global_batch=gb, micro_batch=mb,
                                                       precision=precision, grad_reduce=grad_reduce))


def _predict(run: Run, framework: str):
    return predict(PredictRequest(run=run, framework=framework))


STACKS = ("megatron-core", "nemo", "fsdp", "fsdp-compile", "llm-foundry", "megatron-2022")


@settings(max_examples=30, deadline=None)
@given(st.sampled_from(STACKS), st.sampled_from(["llama3-8b", "mpt-7b", "gpt-7.5b"]),
       st.sampled_from([(1, 1), (2, 1), (1, 2), (2, 2)]), st.sampled_from([16, 64, 256]),
       st.sampled_from([1, 2]), st.sampled_from([None, 1, 2, 3]))
def test_fp32_on_the_wire_is_never_faster_and_the_stacks_own_type_changes_nothing(fw, model, tp_pp, gpus, mb, zero):
    """The same layout with its gradients reduced in fp32 takes at least as long as in bf16; naming
    the type the stack reduces in anyway is the stack's own prediction, to the last bit."""
    tp, pp = tp_pp
    if zero is not None and pp > 1 and zero >= 2 and fw in ("megatron-core", "nemo", "megatron-2022"):
        zero = 1
    base = _run(model, gpus, tp, pp, zero, mb=mb)
    try:
        own = _predict(base, fw).prediction.step_time_s
    except ModelcutError:
        return       # a layout the stack cannot run, or that does not fit its rules: nothing to compare
    t32 = _predict(replace(base, training=replace(base.training, grad_reduce="fp32")), fw).prediction.step_time_s
    t16 = _predict(replace(base, training=replace(base.training, grad_reduce="bf16")), fw).prediction.step_time_s
    assert t32 >= t16 * (1 - 1e-12)
    stack_bytes = catalog.framework(fw).grad_bytes
    assert own == (t32 if stack_bytes == 4 else t16)


def test_without_data_parallelism_nothing_is_reduced_and_nothing_changes():
    run = _run(gpus=8, tp=8, zero=0)
    times = {g: _predict(replace(run, training=replace(run.training, grad_reduce=g)), "megatron-core")
             .prediction.step_time_s for g in ("fp32", "bf16")}
    assert times["fp32"] == times["bf16"]


def test_more_nodes_more_cost():
    """Over many nodes with small micro-batches the fp32 reduce-scatter of a fully sharded 7B model
    costs time an 8-GPU node hides."""
    def gap(gpus):
        r = _run("mpt-7b", gpus, zero=3, mb=1, gb=gpus, seq=2048, gpu="a100-sxm4-80gb")
        t = {g: _predict(replace(r, training=replace(r.training, grad_reduce=g)), "llm-foundry").prediction.step_time_s
             for g in ("fp32", "bf16")}
        return t["fp32"] / t["bf16"] - 1
    assert gap(512) > gap(8) >= 0


def test_memory_follows_where_the_buffer_is_the_one_reduced():
    """Megatron's DDP allocates its gradient buffer in the reduce type (core_v0.8.0
    distributed_data_parallel.py): bf16 halves it. PyTorch FSDP keeps its sharded gradients in the
    fp32 parameters' type whatever it reduces in."""
    def grads(fw, g, zero):
        r = _run(gpus=64, tp=2, zero=zero, grad_reduce=g)
        res = _predict(r, fw)
        return res.memory["peak"]["gradients_bytes"] if "peak" in res.memory else res.memory["stages"][0]["gradients_bytes"]
    assert grads("megatron-core", "fp32", 1) == pytest.approx(2 * grads("megatron-core", "bf16", 1), rel=1e-12)
    assert grads("fsdp", "fp32", 3) == grads("fsdp", "bf16", 3)


def test_for_training_sets_the_wire_the_buffer_and_the_accumulation():
    mc, fsdp, auto, old = (catalog.framework(n) for n in ("megatron-core", "fsdp", "nemo-automodel", "megatron-2021"))
    bf = Training(seq_len=1, global_batch=1, grad_reduce="bf16")
    assert mc.for_training(bf).grad_bytes == 2 and mc.for_training(bf).grad_buffer_bytes == 2
    assert fsdp.for_training(bf).grad_bytes == 2 and fsdp.for_training(bf).grad_buffer_bytes == fsdp.grad_buffer_bytes
    a = auto.for_training(Training(seq_len=1, global_batch=1, grad_reduce="bf16"))
    assert a.grad_bytes == 2 and a.unsharded_grad_bytes == 2 and a.expert_grad_bytes == 2   # its experts: bf16 anyway
    fp16_32 = old.for_training(Training(seq_len=1, global_batch=1, precision="fp16", grad_reduce="fp32"))
    assert (fp16_32.grad_bytes, fp16_32.grad_buffer_bytes, fp16_32.grad_accum_bytes) == (4, 4, 10)
    assert mc.for_training(Training(seq_len=1, global_batch=1)) is mc       # none given: the stack as it is


@pytest.mark.parametrize("value, words", [
    ("fp16", "not this run's 16-bit type"),
    ("int8", "int8"),
])
def test_a_bad_type_is_one_line(tmp_path, capsys, value, words):
    f = tmp_path / "run.toml"
    f.write_text('[model]\nname = "llama3-8b"\n[hardware]\ngpu = "h100"\ngpus = 16\n[layout]\ndp = 16\n'
                 f'[training]\nseq_len = 4096\nglobal_batch = 64\ngrad_reduce = "{value}"\n')
    assert main(["predict", str(f)]) == 2
    err = capsys.readouterr().err
    assert words in err and len(err.strip().splitlines()) == 1
    assert main(["explore", "--model", "llama3-8b", "--gpu", "h100", "--gpus", "16", "--seq", "4096",
                 "--global-batch-tokens", "256K", "--grad-reduce", value]) == 2
    err = capsys.readouterr().err
    assert words in err and len(err.strip().splitlines()) == 1


def test_run_toml_the_api_and_the_csv_take_it(tmp_path, capsys):
    text = ('[model]\nname = "mpt-7b"\n[hardware]\ngpu = "a100"\ngpus = 64\n[layout]\ndp = 64\n'
            '[training]\nseq_len = 2048\nglobal_batch = 64\nmicro_batch = 1\nrecompute = true\n'
            'precision = "amp_bf16"\ngrad_reduce = "float32"\n[settings]\nframework = "llm-foundry"\n')
    f = tmp_path / "run.toml"
    f.write_text(text)
    assert main(["predict", str(f), "--json"]) == 0
    cli = json.loads(capsys.readouterr().out)
    assert any("gradients reduced in fp32" in n for n in cli["notes"])
    f.write_text(text.replace('grad_reduce = "float32"\n', ""))
    assert main(["predict", str(f), "--json"]) == 0
    assert json.loads(capsys.readouterr().out)["step_time_s"] < cli["step_time_s"]   # llm-foundry: bf16 (PURE)
    body = {"model": "mpt-7b", "gpu": "a100", "framework": "llm-foundry", "layout": {"dp": 64},
            "training": {"seq_len": 2048, "global_batch": 64, "micro_batch": 1, "recompute": "full",
                         "grad_reduce": "fp32"}}
    with TestClient(webapp.create_app()) as client:
        r = client.post("/api/predict", json=body)
        assert r.status_code == 200, r.text
        assert r.json()["step_time_s"] == cli["step_time_s"]
        r = client.post("/api/predict", json={**body, "training": {**body["training"], "grad_reduce": "int8"}})
        assert r.status_code == 422 and "grad_reduce" in r.json()["detail"]
    f.write_text(text)
    assert main(["predict", str(f), "--grad-reduce", "bfloat16", "--json"]) == 0      # the flag overrides the file
    flag = json.loads(capsys.readouterr().out)
    assert flag["step_time_s"] < cli["step_time_s"] and any("reduced in bf16" in n for n in flag["notes"])
    assert main(["predict", str(f), "--grad-reduce", "fp16"]) == 2
    assert "16-bit type" in capsys.readouterr().err
    csv = tmp_path / "runs.csv"
    csv.write_text("id,model,gpu,tp,pp,dp,seq_len,global_batch,micro_batch,recompute,grad_reduce,framework,step_time_s\n"
                   f"a,mpt-7b,a100,1,1,64,2048,64,1,full,fp32,llm-foundry,{cli['step_time_s']:.6f}\n")
    assert main(["validate", "--runs", str(csv), "--json"]) == 0
    rows = json.loads(capsys.readouterr().out)["runs"]
    assert [r["id"] for r in rows] == ["a"]                      # the column read as the file's field is
    assert rows[0]["step_time_s"] == pytest.approx(cli["step_time_s"], rel=1e-9)


def test_from_megatron_reads_megatron_lms_rule():
    base = ("--num-layers 32 --hidden-size 4096 --num-attention-heads 32 --seq-length 4096 --micro-batch-size 1 "
            "--global-batch-size 64 --vocab-size 32000 --use-distributed-optimizer ")
    def gr(flags):
        return run_document(base + flags, gpu="h100", gpus=16)[0]["training"]["grad_reduce"]
    assert gr("--bf16") == "fp32"
    assert gr("--bf16 --grad-reduce-in-bf16") == "bf16"
    assert gr("--bf16 --grad-reduce-in-bf16 --accumulate-allreduce-grads-in-fp32") == "bf16"   # the first wins
    assert gr("--fp16") == "fp16"
    assert gr("--fp16 --accumulate-allreduce-grads-in-fp32") == "fp32"
    _, unread = run_document(base + "--bf16 --grad-reduce-in-bf16", gpu="h100", gpus=16)
    assert not unread


def test_from_torchtitan_reads_mixed_precision_reduce(tmp_path):
    conf = ('[model]\nname = "llama3"\nflavor = "8B"\n[training]\nlocal_batch_size = 1\nseq_len = 8192\n'
            'mixed_precision_reduce = "{}"\n')
    import tomllib

    def read(text):
        return titan_document(tomllib.loads(text), gpu="h100", gpus=64)
    doc, _ = read(conf.format("bfloat16"))
    assert doc["training"]["grad_reduce"] == "bf16"
    with pytest.raises(ModelcutError, match="mixed_precision_reduce"):
        read(conf.format("float16"))
    doc, _ = read(conf.replace('mixed_precision_reduce = "{}"\n', ""))
    assert "grad_reduce" not in doc["training"]       # torchtitan's default, float32: the fsdp preset's own


def test_the_emitters_say_the_type_timed_and_it_reads_back(tmp_path, capsys):
    req = ExploreRequest(model=catalog.model("llama3-8b"), hw=H100, gpus=16, seq=8192, global_batch_tokens=1 << 20,
                         framework="nemo", top=1)
    res = run_explore(req)
    e = res.layouts[0]
    text = megatron_args(e, res.framework)
    assert "--grad-reduce-in-bf16" in text.splitlines()              # nemo reduces in bf16; Megatron-LM would not
    assert "trainer.strategy.ddp.grad_reduce_in_fp32=false" in nemo_overrides(e, res.framework).splitlines()
    assert assert_round_trip("from-megatron", text, req, res.framework, tmp_path, capsys) == \
        pytest.approx(e.step_time_s, rel=1e-9)
    req = ExploreRequest(model=catalog.model("llama3-8b"), hw=H100, gpus=16, seq=8192, global_batch_tokens=1 << 20,
                         framework="fsdp", top=1)
    res = run_explore(req)
    assert "mixed_precision_reduce" not in torchtitan_toml(res.layouts[0], res.framework)   # float32, torchtitan's default
    res16 = run_explore(replace(req, space=replace(req.space, grad_reduce="bf16")))
    text = torchtitan_toml(res16.layouts[0], res16.framework)
    assert 'mixed_precision_reduce = "bfloat16"' in text
    assert assert_round_trip("from-torchtitan", text, req, res16.framework, tmp_path, capsys) == \
        pytest.approx(res16.layouts[0].step_time_s, rel=1e-9)


def test_the_seed_model_says_it_does_not_model_it():
    from helpers import predict_seed
    r = _run(gpus=16, grad_reduce="fp32")
    assert any("grad_reduce fp32 not modelled" in n for n in predict_seed(r, H100).notes)


def test_several_precisions_reduce_16_bit_in_each_ones_type(capsys):
    assert main(["explore", "--model", "llama3-8b", "--gpu", "h100", "--gpus", "16", "--seq", "4096",
                 "--global-batch-tokens", "512K", "--precision", "bf16,fp16", "--grad-reduce", "bf16", "--top", "1",
                 "--json"]) == 0
    assert [s["grad_reduce"] for s in json.loads(capsys.readouterr().out)["searches"]] == ["bf16", "fp16"]


def test_fsdp1_readies_each_gradient_before_its_reduction():
    """FSDP1 (llm-foundry) casts each unsharded bf16 gradient to the reduce type where it differs
    and divides it in place before the collective (torch 2.13 _post_backward_hook, _reduce_grad):
    14 bytes a parameter into fp32, 4 in bf16, nothing for one rank. Charged on the communication
    stream, it slows a step by at most those bytes at HBM speed, and only the FSDP1 stack pays."""
    from dataclasses import replace as _replace
    from modelcut.core.costs.flops import param_count
    from modelcut.core.costs.kernels import mem_time
    from modelcut.core.costs.residency import fsdp1_reduce_prep_bytes
    from pathlib import Path
    from modelcut.core.step.default import predict as step
    from modelcut.service.predict import efficiency_for
    from modelcut.service.runfile import load_run_with_settings
    assert fsdp1_reduce_prep_bytes(10.0, 2, 4, 8) == 140.0
    assert fsdp1_reduce_prep_bytes(10.0, 2, 2, 2) == 40.0
    assert fsdp1_reduce_prep_bytes(10.0, 2, 4, 1) == 0.0
    assert catalog.framework("llm-foundry").fsdp1_reduce
    assert not catalog.framework("fsdp").fsdp1_reduce and not catalog.framework("fsdp-compile").fsdp1_reduce
    run, _ = load_run_with_settings(Path(__file__).parent / "data" / "mpt-13b-llm-foundry.toml")
    hw = catalog.hardware(run.gpu)
    eff = efficiency_for(hw)
    fw = catalog.framework("llm-foundry")
    for b, kind in ((2, "bf16"), (4, "fp32")):
        r = _replace(run, training=_replace(run.training, grad_reduce=kind))
        on = step(r, hw, eff, fw)
        off = step(r, hw, eff, _replace(fw, fsdp1_reduce=False))
        prep = mem_time(fsdp1_reduce_prep_bytes(param_count(run.model), 2, b, 256), hw, eff)   # every weight, once
        assert 0 < on.step_time_s - off.step_time_s <= prep
