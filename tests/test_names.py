"""Catalog names as users write them: nvidia-smi's GPU names, other cases and separators, the same
lookup at the run file, the command line and the web API; an ambiguous or unknown one is a
one-line error."""

from __future__ import annotations

from dataclasses import dataclass

import pytest
from hypothesis import given, strategies as st

from modelcut import catalog
from modelcut.catalog.names import NameIndex, loose_key
from modelcut.cli import main
from modelcut.core.errors import ModelcutError


@pytest.mark.parametrize("written,name", [
    ("NVIDIA A100-SXM4-80GB", "a100-sxm4-80gb"),      # nvidia-smi --query-gpu=name
    ("NVIDIA A100-SXM4-40GB", "a100-sxm4-40gb"),
    ("NVIDIA H100 80GB HBM3", "h100-sxm5-80gb"),
    ("H100 SXM5 80GB", "h100-sxm5-80gb"),
    ("h100-sxm5", "h100-sxm5-80gb"),
    ("a100_80gb", "a100-sxm4-80gb"),
    ("NVIDIA H200", "h200-sxm-141gb"),
    ("DGX-H100", "h100-sxm5-80gb"),                  # the system the NeMo and Megatron-Bridge tables name
    ("H200 141GB", "h200-sxm-141gb"),
    ("DGX B200", "b200"),
    ("DGX A100 80GB", "a100-sxm4-80gb"),             # the DGX A100 in its two memory sizes, by GPU
    ("dgx-a100-640gb", "a100-sxm4-80gb"),            # or by system memory
    ("DGX A100 40GB", "a100-sxm4-40gb"),
    ("DGX-A100-320GB", "a100-sxm4-40gb"),
])
def test_gpu_spellings(written, name):
    assert catalog.hardware(written).name == name


@pytest.mark.parametrize("written,name", [("Llama-3.1-8B", "llama3-8b"), ("LLAMA3_70B", "llama3-70b"),
                                          ("Mixtral 8x22B", "mixtral-8x22b"), ("gpt oss 120b", "gpt-oss-120b"),
                                          # a tuned checkpoint of the same shape
                                          ("meta-llama/Llama-3.1-70B-Instruct", "llama3-70b"),
                                          ("llama-2-7b-chat-hf", "llama2-7b"),
                                          ("mistralai/Mixtral-8x7B-Instruct-v0.1", "mixtral-8x7b")])
def test_model_spellings(written, name):
    assert catalog.model(written).name == name


@pytest.mark.parametrize("written,name", [("Megatron_Core", "megatron-core"), ("FSDP-Compile", "fsdp-compile"),
                                          ("DeepSpeed ZeRO3", "deepspeed-zero3"), ("nemo automodel", "nemo-automodel")])
def test_framework_spellings(written, name):
    assert catalog.framework(written).name == name


def test_unknown_names_still_fail_in_one_line():
    for look, word in ((catalog.hardware, "unknown GPU"), (catalog.model, "unknown model"),
                       (catalog.framework, "unknown framework")):
        with pytest.raises(ModelcutError, match=word):
            look("h100-pcie-nonesuch")


@dataclass
class _Item:
    name: str


def test_a_spelling_two_entries_share_is_refused():
    idx: NameIndex[_Item] = NameIndex("test", "thing")
    a, b = _Item("ab-c"), _Item("a-bc")
    idx.add(a, a.name)
    idx.add(b, b.name)
    assert idx.get("AB-C") is a and idx.get("a-bc") is b        # exact spellings still find each
    with pytest.raises(ModelcutError, match="could be any of ab-c, a-bc"):
        idx.get("abc")


@given(st.sampled_from([h.name for h in catalog.all_hardware()]), st.lists(st.sampled_from([" ", "_", "-", ""]),
                                                                              min_size=1, max_size=3))
def test_every_catalog_gpu_survives_its_separators(name, seps):
    """Any catalog name with its hyphens written as spaces, underscores or nothing, upper-cased,
    finds the same entry."""
    parts = name.split("-")
    written = parts[0] + "".join(seps[i % len(seps)] + p for i, p in enumerate(parts[1:]))
    assert catalog.hardware(written.upper()).name == name
    assert loose_key(written) == loose_key(name)


def test_run_file_cli_and_api_take_the_same_spellings(tmp_path, capsys):
    from fastapi.testclient import TestClient
    from modelcut.web.app import create_app
    f = tmp_path / "run.toml"
    f.write_text('[model]\nname = "Llama-3.1-8B"\n[hardware]\ngpu = "NVIDIA H100 80GB HBM3"\ngpus = 8\n'
                 '[layout]\ntp = 1\npp = 1\ndp = 8\n[training]\nseq_len = 8192\nglobal_batch = 8\nmicro_batch = 1\n'
                 '[settings]\nframework = "FSDP_Compile"\n')
    assert main(["predict", str(f), "--json"]) == 0
    import json
    cli = json.loads(capsys.readouterr().out)
    assert main(["predict", str(f), "--framework", "Megatron Core"]) == 0
    assert "framework megatron-core" in capsys.readouterr().out
    body = {"model": "Llama-3.1-8B", "gpu": "NVIDIA H100 80GB HBM3", "framework": "FSDP_Compile",
            "layout": {"tp": 1, "pp": 1, "dp": 8}, "training": {"seq_len": 8192, "global_batch": 8, "micro_batch": 1}}
    ans = TestClient(create_app()).post("/api/predict", json=body)
    assert ans.status_code == 200
    assert ans.json()["step_time_s"] == pytest.approx(cli["step_time_s"])
    bad = TestClient(create_app()).post("/api/predict", json=body | {"gpu": "a200"})
    assert bad.status_code == 422 and "unknown GPU 'a200'" in bad.json()["detail"]


# ---------------------------------------------------------------- overlap options as the stacks name them

@pytest.mark.parametrize("written, want", [
    ("tp_comm=on", {"tp_comm": True}),
    ("tp_comm", {"tp_comm": True}),                                   # a key alone: on, as a flag
    ("--tp-comm-overlap", {"tp_comm": True}),                         # Megatron-LM's flag
    ("async_tp=on", {"tp_comm": True}),                               # torchtitan
    ("overlap_comm: false", {"grad_reduce": False}),                  # DeepSpeed's ZeRO configuration
    ("Overlap-Grad-Reduce=off,overlap_param_gather=false", {"grad_reduce": False, "param_gather": False}),
    ("overlap_p2p_comm=yes", {"p2p_async": True}),
    ("--no-overlap-p2p-communication", {"p2p_async": False}),        # Megatron-LM's "no-" flag: off
    ("--no-tp-comm-overlap=on", {"tp_comm": False}),
    ("--tp-comm-overlap --overlap-grad-reduce", {"tp_comm": True, "grad_reduce": True}),   # a launch line pasted
    ("tp_comm = on, grad_reduce = off", {"tp_comm": True, "grad_reduce": False}),
    ("tp_comm on", {"tp_comm": True}),                                # a launch line's "--key value"
    # PyTorch FSDP's prefetch settings as llm-foundry's benchmark sweep passes them to Composer
    ("--fsdp_config_limit_all_gathers true --fsdp_config_forward_prefetch true "
     "--fsdp_config_backward_prefetch BACKWARD_PRE", {"param_gather": True}),
    ("backward_prefetch: BACKWARD_POST", {"param_gather": True}),
    ("backward_prefetch=BackwardPrefetch.BACKWARD_PRE,tp_comm", {"param_gather": True, "tp_comm": True}),
    ("forward_prefetch=false,limit_all_gathers: false", {}),            # the forward's gathers ahead as before
    ("batch_p2p_comm: true", {"p2p_async": False}),                   # NeMo's converse of overlap_p2p_comm
    ("overlap_p2p_comm=true,batch_p2p_comm=false", {"p2p_async": True}),
])
def test_overlap_options_as_the_stacks_write_them(written, want):
    from modelcut.service.inputs import parse_overlap
    assert parse_overlap(written) == want


@pytest.mark.parametrize("written, options, noted", [
    ("--overlap-moe-expert-parallel-comm", {}, ["--overlap-moe-expert-parallel-comm"]),
    ("moe_a2a_overlap=on", {}, ["moe_a2a_overlap=on"]),
    ("tp_comm,delay_wgrad_compute=true", {"tp_comm": True}, ["delay_wgrad_compute=true"]),
    ("--defer-embedding-wgrad-compute", {}, ["--defer-embedding-wgrad-compute"]),
    # the deferral's limit tunes it; the deferral says what is not modelled, once
    ("defer_embedding_wgrad_compute=true,wgrad_deferral_limit=22", {}, ["defer_embedding_wgrad_compute=true"]),
    ("--defer-embedding-wgrad-compute --wgrad-deferral-limit 22 --tp-comm-overlap", {"tp_comm": True},
     ["--defer-embedding-wgrad-compute"]),
    ("align_param_gather: true", {}, ["align_param_gather=true"]),
    ("--overlap-param-gather-with-optimizer-step", {}, ["--overlap-param-gather-with-optimizer-step"]),
    ("--moe-shared-expert-overlap", {}, ["--moe-shared-expert-overlap"]),
    ("--tp-comm-overlap --tp-comm-overlap-rs-dgrad", {"tp_comm": True}, ["--tp-comm-overlap-rs-dgrad"]),
    ("--ddp-bucket-size 40000000 --overlap-grad-reduce", {"grad_reduce": True}, ["--ddp-bucket-size=40000000"]),
    # a part of the tensor-parallel overlap off is not modelled; on is what tp_comm times
    ("--tp-comm-overlap --disable-tp-comm-overlap-ag", {"tp_comm": True}, ["--disable-tp-comm-overlap-ag"]),
    ("tp_comm_overlap=true,tp_comm_bulk_wgrad=false", {"tp_comm": True}, ["tp_comm_bulk_wgrad=false"]),
    # what modelcut times: no note
    ("tp_comm_overlap=true,tp_comm_overlap_ag=true,tp_comm_split_rs: true", {"tp_comm": True}, []),
    ("--no-align-param-gather --overlap-param-gather", {"param_gather": True}, []),
    ("defer_embedding_wgrad_compute=false,moe_a2a_overlap: False", {}, []),
    ("--tp-comm-overlap --tp-comm-overlap-cfg ub.yaml --tp-comm-bootstrap-backend nccl", {"tp_comm": True}, []),
    ("--overlap-p2p-communication --overlap-p2p-communication-warmup-flush", {"p2p_async": True}, []),
    # DeepSpeed ZeRO's zero_optimization settings: sizes and layouts not read, whatever their value;
    # checkpoint settings taken silently
    ("overlap_comm: true, contiguous_gradients: true, reduce_bucket_size: 500000000, "
     "stage3_prefetch_bucket_size: 5e7, stage3_gather_16bit_weights_on_model_save: true", {"grad_reduce": True},
     ["contiguous_gradients=true", "reduce_bucket_size=500000000", "stage3_prefetch_bucket_size=5e7"]),
    ("zero_optimization.round_robin_gradients=false", {}, ["zero_optimization.round_robin_gradients=false"]),
    ("bucket_size: null, load_from_fp32_weights: true", {}, []),
    ("backward_prefetch=None", {}, ["backward_prefetch=None"]),
    ("backward_prefetch=BACKWARD_PRE", {"param_gather": True}, []),
    # a JSON object, or a configuration's Python dict written out (null: as the stack sets it)
    ('{"tp_comm_overlap": true, "overlap_grad_reduce": true, "defer_embedding_wgrad_compute": true, '
     '"wgrad_deferral_limit": 22}', {"tp_comm": True, "grad_reduce": True}, ["defer_embedding_wgrad_compute=true"]),
    ("{'overlap_param_gather': True, 'batch_p2p_comm': False, 'bucket_size': None}",
     {"param_gather": True, "p2p_async": True}, []),
])
def test_overlap_settings_known_but_not_modelled_are_taken_with_a_note(written, options, noted):
    """A stack's setting modelcut knows but does not model is taken, not refused: the answer carries
    one line naming it and what modelcut times instead, where the setting asks for what is not timed."""
    from modelcut.service.inputs import NOT_MODELLED, parse_overlap, read_overlap
    got, notes = read_overlap(written)
    assert got == options
    assert [n.split(": ", 1)[0] for n in notes] == noted
    for n in notes:
        assert "not modelled" in n or "not read" in n
        assert "\n" not in n
    assert parse_overlap(written) == ({**options, NOT_MODELLED: notes} if notes else options)


def test_a_setting_not_modelled_is_a_note_of_the_answer(capsys):
    """predict (CLI and API) and explore take Megatron-core's deferral of the output layer's weight
    gradients and say, in the answer's notes, that it is not modelled; the step is the one without it."""
    import json
    from fastapi.testclient import TestClient
    from modelcut.web.app import create_app

    def run_cli(capsys, *argv):
        code = main(list(argv))
        out, err = capsys.readouterr()
        return code, out, err
    base = ["predict", "tests/data/llama3-70b-64-h100.toml", "--framework", "nemo", "--json"]
    code, out, _ = run_cli(capsys, *base, "--overlap", "tp_comm=on")
    assert code == 0
    plain = json.loads(out)
    code, out, _ = run_cli(capsys, *base, "--overlap", "--tp-comm-overlap --defer-embedding-wgrad-compute "
                                                          "--wgrad-deferral-limit 22")
    assert code == 0
    noted = json.loads(out)
    assert noted["step_time_s"] == plain["step_time_s"]
    lines = [n for n in noted["notes"] if n.startswith("--defer-embedding-wgrad-compute: ")]
    assert len(lines) == 1 and "last stage" in lines[0]
    assert not any("not modelled" in n for n in plain["notes"])
    body = {"model": "llama3-70b", "gpu": "h100", "layout": {"tp": 4, "pp": 4, "dp": 4},
            "training": {"seq_len": 8192, "global_batch": 128, "micro_batch": 1},
            "framework": "nemo", "overlap": {"tp_comm": True, "defer_embedding_wgrad_compute": True,
                                             "wgrad_deferral_limit": 22}}
    r = TestClient(create_app()).post("/api/predict", json=body)
    assert r.status_code == 200, r.text
    assert any(n.startswith("defer_embedding_wgrad_compute=True: ") for n in r.json()["notes"])
    # null keeps the preset's, as for every option: no note; a long value is cut in the note
    r = TestClient(create_app()).post("/api/predict", json={**body, "overlap": {"align_param_gather": None,
                                                                               "ddp_bucket_size": "9" * 500}})
    assert r.status_code == 200, r.text
    noted = [n for n in r.json()["notes"] if "not modelled" in n or "not read" in n]
    assert len(noted) == 1 and noted[0].startswith("ddp_bucket_size=" + "9" * 39 + "…: ") and len(noted[0]) < 400
    code, out, _ = run_cli(capsys, "explore", "--model", "llama3-8b", "--gpu", "h100", "--gpus", "8", "--seq", "4096",
                           "--global-batch-tokens", "1M", "--framework", "nemo", "--json",
                           "--overlap", "moe_a2a_overlap=true,grad_reduce=on")
    assert code == 0
    assert any(n.startswith("moe_a2a_overlap=true: ") for n in json.loads(out)["notes"])


@pytest.mark.parametrize("written, word", [("colour=on", "unknown key 'colour'"), ("tp_comm=maybe", "not on or off"),
                                           ("tp_comm=on,tp_comm_overlap=off", "both on and off"),
                                           ("--overlap-grad-reduce --no-overlap-grad-reduce", "both on and off"),
                                           ("--no-colour", "unknown key '--no-colour'"),
                                           ("overlap_p2p_comm=true,batch_p2p_comm=true", "both on and off"),
                                           # a stack's setting beside its overlaps: where a run says it
                                           ("sharding_strategy: FULL_SHARD, limit_all_gathers: true",
                                            "is no overlap: it is the layout's"),
                                           ("--fsdp_config_shard_strategy SHARD_GRAD_OP", "is no overlap"),
                                           ("--use-distributed-optimizer --overlap-grad-reduce", "zero = 1"),
                                           ("stage: 3, overlap_comm: true", "is no overlap: it is the layout's .layout. zero"),
                                           ("overlap_comm=true,offload_optimizer=cpu", "CPU or NVMe offload"),
                                           # FSDP2's and torchtitan's resharding, Megatron FSDP's sharding: ZeRO
                                           ("reshard_after_forward=false", "kept gathered until the backward: 2"),
                                           ("fsdp_reshard_after_forward=never", "the layout's .layout. zero"),
                                           ("--data-parallel-sharding-strategy optim_grads", "optim_grads 2"),
                                           ("zero_quantized_gradients: true", "ZeRO++"),
                                           ('{"tp_comm_overlap": [1]}', "is not a value"),
                                           ("{'x': __import__('os')}", "must be a JSON object or a Python dict"),
                                           ("{1: 2}", "must map names to values")])
def test_bad_overlap_options_are_one_line_errors(written, word):
    from modelcut.service.inputs import parse_overlap
    with pytest.raises(ModelcutError, match=word):
        parse_overlap(written)


@pytest.mark.parametrize("written, word", [("backward_prefetch=AHEAD", "not BACKWARD_PRE, BACKWARD_POST or None"),
                                           ("forward_prefetch=maybe", "not true or false"),
                                           ("param_gather=off,backward_prefetch=BACKWARD_PRE", "both on and off")])
def test_fsdp_prefetch_settings_modelcut_cannot_take_are_one_line_errors(written, word):
    """A value no FSDP takes, and a prefetch setting against param_gather, are one line each."""
    from modelcut.service.inputs import parse_overlap
    with pytest.raises(ModelcutError, match=word) as e:
        parse_overlap(written)
    assert "\n" not in str(e.value)


def test_fsdp_prefetch_settings_time_a_run_as_the_options_they_stand_for(capsys):
    """llm-foundry's benchmark settings (forward and backward prefetch, the rate limiter) predict
    what the llm-foundry preset's param_gather predicts, on the CLI and the web API alike; the
    gathers unhidden (param_gather=off) are slower."""
    import json
    from fastapi.testclient import TestClient
    from modelcut.web.app import create_app
    f = "tests/data/mpt-13b-llm-foundry.toml"
    got = {}
    for ov in ("param_gather=on", "param_gather=off",
               "--fsdp_config_limit_all_gathers true --fsdp_config_forward_prefetch true "
               "--fsdp_config_backward_prefetch BACKWARD_PRE"):
        assert main(["predict", f, "--overlap", ov, "--json"]) == 0
        got[ov] = json.loads(capsys.readouterr().out)["step_time_s"]
    on, off, fsdp = got.values()
    assert fsdp == on < off
    body = {"model": "mpt-13b", "gpu": "h100", "framework": "llm-foundry", "layout": {"dp": 256},
            "training": {"seq_len": 2048, "global_batch": 256, "micro_batch": 1, "recompute": "none"}}
    c = TestClient(create_app())
    a = c.post("/api/predict", json=body | {"overlap": {"param_gather": True}})
    b = c.post("/api/predict", json=body | {"overlap": {"backward_prefetch": "BACKWARD_PRE",
                                                        "forward_prefetch": True, "limit_all_gathers": True}})
    assert a.status_code == b.status_code == 200 and a.json()["step_time_s"] == b.json()["step_time_s"]
    # without backward prefetch FSDP queues each gather behind the last reduce-scatter, which neither
    # value of param_gather describes: taken, the step timed with the preset's, and noted
    none = c.post("/api/predict", json=body | {"overlap": {"backward_prefetch": None}})
    unset = c.post("/api/predict", json=body | {"overlap": {"backward_prefetch": "NONE"}})
    assert none.status_code == unset.status_code == 200
    assert none.json()["step_time_s"] == unset.json()["step_time_s"] == a.json()["step_time_s"]
    assert not any("backward prefetching" in n for n in none.json()["notes"])        # null: the preset's
    assert [n for n in unset.json()["notes"] if "backward prefetching" in n][0].startswith(
        "backward_prefetch=NONE: PyTorch FSDP without backward prefetching")
    assert main(["predict", f, "--overlap", "--fsdp_config_backward_prefetch None", "--json"]) == 0
    notes = json.loads(capsys.readouterr().out)["notes"]
    assert any(n.startswith("--fsdp_config_backward_prefetch=None: ") and "not modelled" in n for n in notes)
    elsewhere = c.post("/api/predict", json=body | {"overlap": {"sharding_strategy": "FULL_SHARD"}})
    assert elsewhere.status_code == 422 and "is no overlap" in elsewhere.text


def test_every_overlap_alias_names_an_option():
    from modelcut.core.step.frameworks import OPTIONS
    from modelcut.core.step.stack_names import OPTION_ALIASES, option_name
    assert all(option_name(k) == k for k in OPTIONS)
    assert set(OPTION_ALIASES.values()) <= set(OPTIONS)


def test_the_cli_and_the_api_take_the_stacks_overlap_names(capsys):
    import json
    from fastapi.testclient import TestClient
    from modelcut.web.app import create_app
    f = "tests/data/llama3-70b-64-h100.toml"
    got = {}
    for ov in ("tp_comm=on", "--tp-comm-overlap", "tp_comm=off"):
        assert main(["predict", f, "--framework", "megatron-core", "--overlap", ov, "--json"]) == 0
        got[ov] = json.loads(capsys.readouterr().out)["step_time_s"]
    assert got["tp_comm=on"] == got["--tp-comm-overlap"] != got["tp_comm=off"]
    body = {"model": "llama3-70b", "gpu": "h100", "framework": "megatron-core",
            "layout": {"tp": 4, "cp": 2, "pp": 4, "dp": 2, "vpp": 5, "sequence_parallel": True},
            "training": {"seq_len": 8192, "global_batch": 128, "micro_batch": 1}}
    c = TestClient(create_app())
    a = c.post("/api/predict", json=body | {"overlap": {"tp_comm": True}})
    b = c.post("/api/predict", json=body | {"overlap": {"async_tp": True}})
    assert a.status_code == b.status_code == 200 and a.json()["step_time_s"] == b.json()["step_time_s"]
    assert a.json()["step_time_s"] == pytest.approx(got["tp_comm=on"])
    assert c.post("/api/predict", json=body | {"overlap": {"colour": True}}).status_code == 422
    d = c.post("/api/predict", json=body | {"overlap": {"batch_p2p_comm": True}})       # the converse: off
    e = c.post("/api/predict", json=body | {"overlap": {"p2p_async": False}})
    assert d.status_code == e.status_code == 200 and d.json()["step_time_s"] == e.json()["step_time_s"]


def test_an_unknown_name_at_the_boundary_gets_the_catalogs_own_line(capsys):
    """The one input boundary (CLI flags and the web API) words an unknown model, GPU or
    framework as the catalog does: a catalog too long for a line (the models) names its closest
    entries and where the whole list is, instead of printing all of them; a short one is listed."""
    from fastapi.testclient import TestClient
    from modelcut.web.app import create_app
    args = ["explore", "--gpu", "h100", "--gpus", "8", "--seq", "4096", "--global-batch-tokens", "32768"]
    assert main(args + ["--model", "qwen2-72b"]) == 2
    err = capsys.readouterr().err.strip()
    assert err == "modelcut: error: " + _refusal(catalog.model, "qwen2-72b")
    assert "closest: qwen2.5-72b" in err and "modelcut list models" in err and "gpt-1.7b" not in err
    assert len(err.splitlines()) == 1
    assert main(args[:2] + ["a200"] + args[3:] + ["--model", "llama3-8b"]) == 2
    assert capsys.readouterr().err.strip() == "modelcut: error: " + _refusal(catalog.hardware, "a200")
    assert main(args + ["--model", "llama3-8b", "--framework", "megatorn"]) == 2
    assert capsys.readouterr().err.strip() == "modelcut: error: " + _refusal(catalog.framework, "megatorn")
    body = {"model": "qwen2-72b", "gpu": "h100", "gpus": 8, "seq": 4096, "global_batch_tokens": 32768}
    r = TestClient(create_app()).post("/api/explore", json=body)
    assert r.status_code == 422 and r.json()["detail"] == _refusal(catalog.model, "qwen2-72b")


def _refusal(lookup, name) -> str:
    """The catalog's own line for a name it does not know."""
    with pytest.raises(ModelcutError) as exc:
        lookup(name)
    return str(exc.value)


@pytest.mark.parametrize("written, preset", [("nemo-25.09", "nemo"), ("NeMo 24.12", "nemo"),
                                             ("megatron-bridge-25.11", "megatron-bridge"),
                                             ("mcore-0.9", "megatron-core"), ("torchtitan-v0.2.2", "fsdp-compile"),
                                             ("llm_foundry_0.10", "llm-foundry")])
def test_a_release_no_preset_has_names_the_stacks_preset(written, preset):
    """A stack's name with a release modelcut has no preset for is one line naming the stack's preset
    (to choose knowingly), in the catalog and at the web API; a release preset is found as it is."""
    from fastapi.testclient import TestClient
    from modelcut.web.app import create_app
    with pytest.raises(ModelcutError) as e:
        catalog.framework(written)
    msg = str(e.value)
    assert f"no preset for that release; its preset for the stack is {preset} " in msg and "\n" not in msg
    body = {"model": "llama3-8b", "gpu": "h100", "framework": written, "layout": {"tp": 1, "pp": 1, "dp": 8},
            "training": {"seq_len": 8192, "global_batch": 8, "micro_batch": 1}}
    r = TestClient(create_app()).post("/api/predict", json=body)
    assert r.status_code == 422 and f"its preset for the stack is {preset}" in r.json()["detail"]


def test_release_presets_and_unknown_stacks_are_as_before():
    assert catalog.framework("nemo-24.07").name == "nemo-24.07"
    assert catalog.framework("NeMo-2407").name == "nemo-24.07"
    for name in ("foo-1.2", "25.09"):
        with pytest.raises(ModelcutError, match="choose one of"):
            catalog.framework(name)
