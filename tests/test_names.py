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
])
def test_gpu_spellings(written, name):
    assert catalog.hardware(written).name == name


@pytest.mark.parametrize("written,name", [("Llama-3.1-8B", "llama3-8b"), ("LLAMA3_70B", "llama3-70b"),
                                          ("Mixtral 8x22B", "mixtral-8x22b"), ("gpt oss 120b", "gpt-oss-120b")])
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
