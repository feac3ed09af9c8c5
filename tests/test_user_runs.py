"""A user's measured runs checked against the shipped model, nothing fitted to them
(``modelcut validate --runs FILE.csv``): each CSV row is read by the run file's own reader, so every
layout and training field a RUN.toml takes (ep, cp_kind, precision, …) and every framework name
``--framework`` takes work in a row too; a row the model cannot time is one line naming it."""

from __future__ import annotations

import json

import pytest

from modelcut import catalog
from modelcut.cli import main
from modelcut.core.errors import ModelcutError
from modelcut.service import predict as service
from modelcut.service.runfile import run_from_dict
from modelcut.service.runs_csv import read_runs_csv

HEAD = "id,group,model,gpu,tp,cp,pp,dp,ep,cp_kind,seq_len,global_batch,micro_batch,recompute,precision,framework,step_time_s\n"
ROWS = ("dense-fp8,g1,llama3-70b,h100,4,1,4,4,,,8192,128,1,none,fp8,Megatron-LM,10.0\n"
        "dense-bf16,g1,llama3-70b,h100,4,1,4,4,,,8192,128,1,none,bf16,mcore,12.0\n"
        "moe,g2,mixtral-8x7b,h100,1,1,4,16,8,,4096,256,1,full,,nemo2,5.0\n"
        "long,g2,llama3-8b,NVIDIA H100 80GB HBM3,1,4,1,2,,ring,32768,8,1,full,,torchtitan,9.0\n")


def _csv(tmp_path, body=ROWS):
    p = tmp_path / "mine.csv"
    p.write_text(HEAD + body)
    return p


def test_a_row_is_the_run_its_run_file_would_be(tmp_path):
    """Each row's run equals what run_from_dict builds from the same fields; aliases resolve."""
    got = {m.id: m for m in read_runs_csv(_csv(tmp_path))}
    assert [got[k].framework for k in ("dense-fp8", "dense-bf16", "moe", "long")] == [
        "megatron-core", "megatron-core", "nemo", "fsdp-compile"]
    doc = {"model": {"name": "llama3-8b"}, "hardware": {"gpu": "h100"},
           "layout": {"tp": 1, "cp": 4, "pp": 1, "dp": 2, "cp_kind": "ring"},
           "training": {"seq_len": 32768, "global_batch": 8, "micro_batch": 1, "recompute": "full"}}
    want = run_from_dict(doc, "x")
    long = got["long"].run
    assert (long.layout, long.training, long.model, long.gpu) == (want.layout, want.training, want.model, want.gpu)
    assert got["moe"].run.layout.ep == 8 and got["dense-fp8"].run.training.precision == "fp8"
    assert got["dense-bf16"].run.training.precision == "bf16"


def test_validate_runs_predicts_each_row_as_predict_does(tmp_path, capsys):
    path = _csv(tmp_path)
    assert main(["validate", "--runs", str(path), "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    rows = {r["id"]: r for r in out["runs"]}
    for m in read_runs_csv(path):
        pred = service.predict(service.PredictRequest(m.run, framework=m.framework)).prediction
        r = rows[m.id]
        assert r["step_time_s"] == pytest.approx(pred.step_time_s, rel=1e-12)
        assert r["error_pct"] == pytest.approx((m.step_time_s / pred.step_time_s - 1) * 100)
        tokens = m.run.training.global_batch * m.run.training.seq_len / m.run.layout.gpus
        assert r["measured_tokens_per_s_per_gpu"] == pytest.approx(tokens / m.step_time_s)
        assert r["tokens_per_s_per_gpu"] == pytest.approx(tokens / pred.step_time_s)
    # FP8 in the precision column is honoured: the same layout is faster than in bf16
    assert rows["dense-fp8"]["step_time_s"] < rows["dense-bf16"]["step_time_s"]
    # per group and overall: the rows' own errors summarised
    g1 = [rows[k]["error_pct"] for k in ("dense-fp8", "dense-bf16")]
    assert out["groups"]["g1"]["mean_abs_pct"] == pytest.approx(sum(map(abs, g1)) / 2)
    assert out["groups"]["g1"]["mean_signed_pct"] == pytest.approx(sum(g1) / 2)
    assert out["overall"]["runs"] == 4
    assert out["overall"]["max_abs_pct"] == pytest.approx(max(abs(r["error_pct"]) for r in rows.values()))
    assert main(["validate", "--runs", str(path)]) == 0
    text = capsys.readouterr().out
    assert "Your runs" in text and "dense-fp8" in text and "overall" in text


def test_validate_runs_shows_each_rows_memory_as_predict_counts_it(tmp_path, capsys):
    """Each row carries its peak memory per device as ``predict`` reports it, and the text names a
    row that ran but that the memory model says cannot fit (its count is over for those settings)."""
    body = ROWS + "tight,g2,mixtral-8x7b,h100,1,1,4,16,,,4096,256,1,selective,,nemo,6.5\n"
    path = _csv(tmp_path, body)
    assert main(["validate", "--runs", str(path), "--json"]) == 0
    rows = {r["id"]: r for r in json.loads(capsys.readouterr().out)["runs"]}
    for m in read_runs_csv(path):
        mem = service.predict(service.PredictRequest(m.run, framework=m.framework)).memory
        assert rows[m.id]["memory"] == {"peak_bytes": mem["peak_bytes"], "capacity_bytes": mem["capacity_bytes"],
                                        "fits": mem["fits"]}
    assert not rows["tight"]["memory"]["fits"] and rows["moe"]["memory"]["fits"]
    assert main(["validate", "--runs", str(path)]) == 0
    text = capsys.readouterr().out
    over = " ".join(text.split()).split("ran but the memory model counts more than the device holds (")[1].split(")")[0]
    assert "tight" in over.split(", ") and "moe" not in over.split(", ")


@pytest.mark.parametrize("row, word", [
    ("a,g,llama3-70b,a100,4,1,4,4,,,8192,128,1,none,fp8,megatron-core,10\n", "run 'a': precision fp8"),
    ("a,g,llama3-70b,h100,4,1,4,4,,,8192,128,1,none,fp9,,10\n", "precision must be one of"),
    ("a,g,llama3-70b,h100,4,1,4,4,3,,8192,128,1,none,,,10\n", "needs a mixture-of-experts model"),
    ("a,g,llama3-70b,h100,4,1,4,4,,spiral,8192,128,1,none,,,10\n", "cp_kind"),
    ("a,g,llama3-70b,h100,4,1,4,4,,,8192,128,1,none,,titan,10\n", "unknown framework 'titan'"),
    ("a,g,/nonesuch/config.json,h100,4,1,4,4,,,8192,128,1,none,,,10\n", ":2 [model]: no such config file"),
])
def test_a_bad_row_is_one_line_naming_it(tmp_path, capsys, row, word):
    path = _csv(tmp_path, row)
    assert main(["validate", "--runs", str(path)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("modelcut: error:") and word in err[0]


def test_validate_runs_refuses_what_it_does_not_do(tmp_path, capsys):
    path = _csv(tmp_path)
    for extra in (["--kernels"], ["--budget"]):
        assert main(["validate", "--runs", str(path), *extra]) == 2
        assert len(capsys.readouterr().err.strip().splitlines()) == 1


def test_a_cell_past_the_csv_readers_limit_is_one_line(tmp_path, capsys):
    """A cell longer than the csv module's field limit (131,072 characters) is one line naming the file,
    for validate and calibrate alike (it was an internal error, exit 70)."""
    path = tmp_path / "runs.csv"
    path.write_text('id,model\nr1,"' + "x" * 200_000 + '"\n')
    for cmd in ("validate", "calibrate"):
        assert main([cmd, "--runs", str(path)]) == 2
        err = capsys.readouterr().err.strip()
        assert err.startswith(f"modelcut: error: {path}: not a CSV table") and "\n" not in err, err


@pytest.mark.parametrize("written, name", [
    ("torchtitan", "fsdp-compile"), ("TorchTitan-Compile", "fsdp-compile"), ("torchtitan-eager", "fsdp"),
    ("fsdp2", "fsdp"), ("Megatron-LM", "megatron-core"),
    ("mcore", "megatron-core"), ("megatron", "megatron-core"), ("NeMo2", "nemo"), ("DeepSpeed", "deepspeed-zero3"),
    ("automodel", "nemo-automodel"), ("mbridge", "megatron-bridge"), ("Composer", "llm-foundry"), ("mosaicml", "llm-foundry"),
    ("NeMo 2.0", "nemo"), ("NeMo-Megatron", "nemo"), ("torch-fsdp", "fsdp"), ("foundry", "llm-foundry"),
    ("PyTorch-FSDP2", "fsdp"), ("torch_fsdp2", "fsdp")])
def test_framework_aliases(written, name):
    assert catalog.framework(written).name == name


def test_a_preset_built_on_another_does_not_take_its_aliases():
    """fsdp-compile is built on fsdp (base) but "torchtitan-eager" still names fsdp alone, not both,
    and "torchtitan" fsdp-compile alone."""
    assert catalog.framework("torchtitan-eager") is catalog.framework("fsdp")
    assert catalog.framework("torchtitan") is catalog.framework("fsdp-compile")
    with pytest.raises(ModelcutError, match="unknown framework"):
        catalog.framework("automodel-flex")


def test_list_and_bool_cells_read_as_the_run_file_types_them(tmp_path):
    """order and recompute_modules (";"-separated lists), sequence_parallel (true/false) and zero, as
    the request models type them, give the run the same fields give a run file."""
    p = tmp_path / "kinds.csv"
    p.write_text("id,model,gpu,tp,pp,dp,ep,sequence_parallel,zero,order,seq_len,global_batch,micro_batch,"
                 "recompute,recompute_modules,step_time_s\n"
                 "k,mixtral-8x7b,h100,2,2,4,4,false,1,tp;cp;pp;dp,4096,64,1,selective,layernorm;moe_act,3\n")
    got = read_runs_csv(p)[0].run
    doc = {"model": {"name": "mixtral-8x7b"}, "hardware": {"gpu": "h100"},
           "layout": {"tp": 2, "pp": 2, "dp": 4, "ep": 4, "sequence_parallel": False, "zero": 1,
                      "order": ["tp", "cp", "pp", "dp"]},
           "training": {"seq_len": 4096, "global_batch": 64, "micro_batch": 1, "recompute": "selective",
                        "recompute_modules": ["layernorm", "moe_act"]}}
    want = run_from_dict(doc, "x")
    assert (got.layout, got.training) == (want.layout, want.training)


def test_tokens_per_second_per_gpu_is_a_measured_figure(tmp_path):
    """tokens_per_s_per_gpu gives the step time global_batch·seq_len / (gpus·tokens/s/GPU): the
    same run measured as a step time, as tokens/s per GPU and both (step time first) is one Measured."""
    p = tmp_path / "tps.csv"
    p.write_text("id,model,gpu,tp,pp,dp,seq_len,global_batch,micro_batch,step_time_s,tokens_per_s_per_gpu\n"
                 "s,llama3-8b,h100,1,1,8,8192,64,1,10.0,\n"
                 "t,llama3-8b,h100,1,1,8,8192,64,1,,6553.6\n"
                 "both,llama3-8b,h100,1,1,8,8192,64,1,10.0,1\n")
    got = {m.id: m for m in read_runs_csv(p)}
    assert got["t"].step_time_s == pytest.approx(10.0, rel=1e-12)
    assert got["both"].step_time_s == 10.0 and got["s"].step_time_s == 10.0
    p.write_text("id,model,gpu,tp,pp,dp,seq_len,global_batch,micro_batch,tokens_per_s_per_gpu\n"
                 "t,llama3-8b,h100,1,1,8,8192,64,1,-3\n")
    with pytest.raises(ModelcutError, match="tokens_per_s_per_gpu must be a positive number"):
        read_runs_csv(p)


@pytest.mark.parametrize("column, value, mfu", [
    ("step_time_s", "1e-3", "42,628 %"),                # a step of a millisecond
    ("tokens_per_s_per_gpu", "1e6", "5,204 %"),
    ("tflops_per_gpu", "5000", "426 %"),                # above the H100's 989 even in modelcut's count
])
def test_a_measured_figure_above_the_peak_is_one_line(tmp_path, capsys, column, value, mfu):
    """A figure that means more causal work a second than the GPUs' peak cannot be a measurement:
    one line naming the row, the figure and the MFU it means (it was predicted, -100 % off)."""
    p = tmp_path / "fast.csv"
    p.write_text(f"id,model,gpu,tp,pp,dp,seq_len,global_batch,micro_batch,{column}\n"
                 f"x,llama3-8b,h100,1,1,8,8192,8,1,{value}\n")
    assert main(["validate", "--runs", str(p)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and f"fast.csv:2: {column} {float(value):g} means an MFU of {mfu}" in err[0], err


def test_every_published_run_measures_at_most_the_peak():
    from modelcut.analysis.measured import catalog_measured, measured_mfu
    got = {m.id: measured_mfu(m) for m in catalog_measured()}
    assert len(got) >= 76 and 0 < min(got.values()) and max(got.values()) < 1, max(got.items(), key=lambda kv: kv[1])


def test_tflops_in_a_named_convention(tmp_path):
    """tflops_per_gpu with flop_convention (torchtitan's log: non-embedding) is that convention's
    model FLOPs over gpus · TFLOP/s; without it, modelcut's own count; a bad convention is one line."""
    from modelcut.analysis.measured import measured_step_time
    from modelcut.core.costs import flops
    p = tmp_path / "tf.csv"
    p.write_text("id,model,gpu,tp,pp,dp,seq_len,global_batch,micro_batch,recompute,framework,tflops_per_gpu,flop_convention\n"
                 "titan,llama3-8b,h100,1,1,8,8192,64,1,full,torchtitan,400,non-embedding\n"
                 "own,llama3-8b,h100,1,1,8,8192,64,1,full,torchtitan,400,\n")
    got = {m.id: m for m in read_runs_csv(p)}
    run = got["titan"].run
    assert measured_step_time(got["titan"]) == pytest.approx(
        flops.model_flops(run.model, run.training, "non-embedding") / (8 * 400e12), rel=1e-12)
    # the own count adds full recomputation's forward: the same TFLOP/s is a longer step
    assert measured_step_time(got["own"]) > 1.3 * measured_step_time(got["titan"])
    p.write_text("id,model,gpu,tp,pp,dp,seq_len,global_batch,micro_batch,tflops_per_gpu,flop_convention\n"
                 "x,llama3-8b,h100,1,1,8,8192,64,1,400,chinchilla\n")
    with pytest.raises(ModelcutError, match="flop_convention must be one of"):
        read_runs_csv(p)


def test_recomputation_as_llm_foundry_writes_it(tmp_path):
    """activation_checkpointing true/false (llm-foundry) and any case read as full/none, in a CSV
    row and in a RUN.toml alike."""
    p = tmp_path / "ac.csv"
    p.write_text("id,model,gpu,tp,pp,dp,seq_len,global_batch,micro_batch,recompute,framework,step_time_s\n"
                 "a,mpt-7b,a100,1,1,8,2048,64,1,TRUE,composer,10\n"
                 "b,mpt-7b,a100,1,1,8,2048,64,1,false,composer,10\n"
                 "c,mpt-7b,a100,1,1,8,2048,64,1,Full,composer,10\n")
    got = {m.id: m.run.training.recompute for m in read_runs_csv(p)}
    assert got == {"a": "full", "b": "none", "c": "full"}
    doc = {"model": {"name": "mpt-7b"}, "hardware": {"gpu": "a100"}, "layout": {"tp": 1, "pp": 1, "dp": 8},
           "training": {"seq_len": 2048, "global_batch": 64, "micro_batch": 1, "recompute": True}}
    assert run_from_dict(doc, "x").training.recompute == "full"


def test_a_setting_not_modelled_is_a_note_of_its_row(tmp_path, capsys):
    """A row's overlap cell may carry a stack's setting modelcut does not model (Megatron-core's
    deferral of the output layer's weight gradients): the row is predicted as without it, and the
    table says so under the row's id, in the text and in --json."""
    head = "id,model,gpu,tp,pp,dp,seq_len,global_batch,micro_batch,framework,overlap,step_time_s\n"
    body = ("plain,llama3-70b,h100,4,4,4,8192,128,1,nemo,tp_comm=on,10.0\n"
            "deferred,llama3-70b,h100,4,4,4,8192,128,1,nemo,tp_comm=on;defer_embedding_wgrad_compute=true;"
            "wgrad_deferral_limit=22,10.0\n")
    p = tmp_path / "mine.csv"
    p.write_text(head + body)
    got = {m.id: m for m in read_runs_csv(p)}
    assert got["plain"].notes == () and got["plain"].overlap == got["deferred"].overlap == {"tp_comm": True}
    assert len(got["deferred"].notes) == 1 and got["deferred"].notes[0].startswith(
        "defer_embedding_wgrad_compute=true: ")
    assert main(["validate", "--runs", str(p), "--json"]) == 0
    rows = {r["id"]: r for r in json.loads(capsys.readouterr().out)["runs"]}
    assert rows["deferred"]["step_time_s"] == rows["plain"]["step_time_s"]
    assert rows["deferred"]["notes"] == list(got["deferred"].notes) and rows["plain"]["notes"] == []
    assert main(["validate", "--runs", str(p)]) == 0
    out = capsys.readouterr().out
    assert "deferred: defer_embedding_wgrad_compute=true: Megatron-core's deferral" in " ".join(out.split())


def test_keep_going_predicts_the_rows_it_can_and_lists_the_rest(tmp_path, capsys):
    """validate --runs stops at the first row it cannot predict; with --keep-going it leaves each such
    row out (a bad cell, a framework it does not know, a run the model cannot time), lists it with its
    one-line reason and file line, and its figures are the other rows' alone, as without those rows."""
    head = "id,model,gpu,tp,pp,dp,seq_len,global_batch,micro_batch,framework,overlap,precision,step_time_s\n"
    good = ("ok1,llama3-70b,h100,4,4,4,8192,128,1,nemo,tp_comm=on,,10.0\n"
            "ok2,llama3-8b,h100,1,1,8,8192,128,1,fsdp,,,12.0\n")
    bad = ("badfw,llama3-70b,h100,4,4,4,8192,128,1,nemo-99.01,,,10.0\n"
           "fp8a100,llama3-8b,a100,1,1,8,8192,128,1,megatron-core,,fp8,10.0\n"
           "badov,llama3-8b,h100,1,1,8,8192,128,1,megatron-core,colour=on,,10.0\n")
    mixed, clean = tmp_path / "mixed.csv", tmp_path / "clean.csv"
    mixed.write_text(head + good[:good.index("\n") + 1] + bad + good[good.index("\n") + 1:])
    clean.write_text(head + good)
    code = main(["validate", "--runs", str(mixed)])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and f"{mixed}:3: unknown framework 'nemo-99.01'" in err
    assert main(["validate", "--runs", str(mixed), "--keep-going", "--json"]) == 0
    got = json.loads(capsys.readouterr().out)
    assert main(["validate", "--runs", str(clean), "--json"]) == 0
    want = json.loads(capsys.readouterr().out)
    assert [r["id"] for r in got["runs"]] == ["ok1", "ok2"] and got["overall"] == want["overall"]
    assert want["skipped"] == []
    reasons = {s["id"]: s["error"] for s in got["skipped"]}
    assert set(reasons) == {"badfw", "fp8a100", "badov"}
    assert reasons["badov"].startswith(f"{mixed}:5: overlap option: unknown key 'colour'")
    assert "fp8a100" in reasons["fp8a100"] and "FP8" in reasons["fp8a100"]
    assert all("\n" not in e for e in reasons.values())
    assert main(["validate", "--runs", str(mixed), "--keep-going"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "3 row(s) left out (--keep-going), not in the figures above:" in out
    # nothing left to predict: one line; --keep-going without --runs: one line
    only_bad = tmp_path / "bad.csv"
    only_bad.write_text(head + bad)
    code = main(["validate", "--runs", str(only_bad), "--keep-going"])
    err = capsys.readouterr().err
    assert code == 2 and err.count("\n") == 1 and "no row could be predicted (3 left out; the first:" in err
    code = main(["validate", "--keep-going"])
    assert code == 2 and "--keep-going applies to --runs" in capsys.readouterr().err
