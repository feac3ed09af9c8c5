"""``modelcut list``: each kind lists every catalog entry; an unknown name's error points there."""

from __future__ import annotations

import json

import pytest

from modelcut import catalog
from modelcut.cli import main
from modelcut.core.errors import ModelcutError
from modelcut.core.sim import registry
from modelcut.service.catalog_info import KINDS, rows


def _json(capsys, *argv):
    assert main(list(argv)) == 0
    return json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("kind, names, key", [
    ("models", lambda: [m.name for m in catalog.all_models()], "name"),
    ("hardware", lambda: [h.name for h in catalog.all_hardware()], "name"),
    ("frameworks", lambda: list(catalog.framework_names()), "name"),
    ("schedules", lambda: list(registry.SCHEDULES), "name"),
    ("runs", lambda: [r.id for r in catalog.published_runs()], "id"),
])
def test_list_json_names_every_entry_with_a_source(capsys, kind, names, key):
    rows = _json(capsys, "list", kind, "--json")
    assert [r[key] for r in rows] == names()
    if kind != "schedules":
        assert all(r["source"] for r in rows)


def test_list_table_shows_each_kind(capsys):
    for kind in KINDS:
        assert main(["list", kind]) == 0
        out = capsys.readouterr().out
        assert f"{len(rows(kind))} {kind}:" in out


def test_models_list_counts_parameters_as_the_catalog_does(capsys):
    rows = {r["name"]: r for r in _json(capsys, "list", "models", "--json")}
    assert rows["llama3-405b"]["params_b"] == pytest.approx(405.9, abs=0.1)
    assert "llama3.1-405b" in rows["llama3-405b"]["aliases"]
    moe = rows["deepseek-v3"]
    assert moe["params_b"] == pytest.approx(671, rel=0.01) and moe["active_params_b"] < moe["params_b"]
    # latent attention says so beside its stand-in's KV heads
    assert moe["kv_lora_rank"] == 512 and rows["llama3-405b"]["kv_lora_rank"] is None
    assert main(["list", "models"]) == 0
    table = capsys.readouterr().out
    assert "128 / 8 (MLA, latent 512)" in table and "(MLA" not in next(
        ln for ln in table.splitlines() if "llama3-405b " in ln)


def test_frameworks_list_says_whose_context_parallelism_and_which_nccl(capsys):
    """Each preset's context-parallel implementation and form, and the NCCL release whose latencies
    its collectives pay, as the step model reads them."""
    rows = {r["name"]: r for r in _json(capsys, "list", "frameworks", "--json")}
    assert (rows["fsdp-compile"]["cp_impl"], rows["fsdp-compile"]["cp_kind"]) == ("torch-sdpa", "allgather")
    assert (rows["nemo"]["cp_impl"], rows["nemo"]["cp_kind"], rows["nemo"]["nccl"]) == ("transformer-engine", "ring", "2.18")
    assert {r["nccl"] for r in rows.values()} <= {"2.9", "2.18", "2.23"}
    assert rows["megatron-2021"]["nccl"] == "2.9"


def test_frameworks_list_says_how_each_reduces_gradients_and_gathers_fp8_weights(capsys):
    """The defaults a run's grad_reduce and fp8_param_gather override, as the step model reads them."""
    rows = {r["name"]: r for r in _json(capsys, "list", "frameworks", "--json")}
    assert {n: rows[n]["grad_reduce"] for n in ("megatron-core", "nemo", "fsdp", "llm-foundry")} == {
        "megatron-core": "fp32", "nemo": "16-bit", "fsdp": "fp32", "llm-foundry": "16-bit"}
    assert rows["nemo"]["fp8_param_gather"] and rows["fsdp-compile"]["fp8_param_gather"]
    assert not rows["megatron-core"]["fp8_param_gather"]


def test_unknown_kind_is_one_line(capsys):
    assert main(["list", "gpus"]) == 2
    err = capsys.readouterr().err
    assert "unknown list 'gpus'" in err and len(err.strip().splitlines()) == 1


@pytest.mark.parametrize("look, written, close, listed", [
    (catalog.model, "qwen2-72b", "qwen2.5-72b", "modelcut list models"),
    (catalog.model, "lama3-70b", "llama3-70b", "modelcut list models"),
    (catalog.published_run, "automodel-qwen3-30b", "automodel-qwen3-30b-a3b-8", "modelcut list runs"),
])
def test_unknown_name_names_the_closest_and_where_the_list_is(look, written, close, listed):
    with pytest.raises(ModelcutError) as err:
        look(written)
    msg = str(err.value)
    assert "closest: " in msg and close in msg.split("closest: ")[1] and listed in msg
    assert "\n" not in msg


def test_short_catalog_still_lists_every_name():
    with pytest.raises(ModelcutError, match="choose one of a100-sxm4-40gb"):
        catalog.hardware("h1000")


def test_list_alone_says_what_each_kind_lists(capsys):
    assert main(["list"]) == 0
    out = capsys.readouterr().out.splitlines()
    assert [line.split()[2] for line in out] == list(KINDS)


def test_help_lists_every_command_in_the_chosen_order(capsys):
    """``modelcut --help`` lists the commands in ``cli.app.ORDER`` (the model's answers first), and
    every command is named there, so a new one is placed on purpose."""
    import re
    from modelcut.cli.app import ORDER, app
    import typer.main
    registered = set(typer.main.get_command(app).commands)
    assert registered == set(ORDER)
    assert main(["--help"]) == 0
    out = capsys.readouterr().out
    listed = [m.group(1) for m in re.finditer(r"^  ([a-z][a-z-]+)\s", out.split("Commands:")[1], re.M)]
    assert listed == list(ORDER)
