"""``modelcut from-torchtitan``: a torchtitan job configuration as a RUN.toml, the reverse of
``explore --emit torchtitan``."""

from __future__ import annotations

import json
import tomllib
from pathlib import Path

import pytest
from hypothesis import given, settings, strategies as st

from modelcut import catalog
from modelcut.cli import main
from modelcut.core.errors import ModelcutError
from modelcut.core.sim import registry
from modelcut.export.emit import torchtitan_toml
from modelcut.service.explore import ExploreRequest, run_explore
from modelcut.service.torchtitan_config import run_document, run_file_text

from helpers import assert_round_trip

CONFIG = (Path(__file__).parent / "data" / "llama3-8b-torchtitan.toml").read_text()


def _doc(conf: dict, gpus: int = 64, **kw):
    return run_document(conf, gpu="h100", gpus=gpus, **kw)


def test_a_job_configuration_reads_as_torchtitan_would_run_it():
    text = run_file_text(CONFIG, "llama3-8b-torchtitan.toml", gpu="h100", gpus=64)
    doc = tomllib.loads(text)
    assert doc["model"] == {"name": "llama3-8b"}             # [model] llama3 8B
    assert doc["layout"] == {"tp": 1, "cp": 1, "pp": 1, "dp": 64, "zero": 3, "dp_shard": 32}   # 2 replicas of 32
    assert doc["training"] == {"seq_len": 8192, "micro_batch": 2, "global_batch": 256, "recompute": "selective",
                               "precision": "fp8", "fp8_recipe": "current", "fp8_param_gather": True}
    assert doc["settings"] == {"framework": "fsdp-compile", "overlap": "tp_comm=off"}
    unread = text.splitlines()[1]
    assert unread.startswith("# keys not read: ") and "[optimizer]" in unread and "[training] steps" in unread
    assert "enable_fsdp_float8_all_gather" not in unread and "precompute_float8_dynamic_scale_for_fsdp" in unread


@pytest.mark.parametrize("name, flavor, model", [
    ("llama3", "405B", "llama3-405b"), ("qwen3", "30B-A3B", "qwen3-30b-a3b"), ("deepseek_v3", "671B", "deepseek-v3"),
    ("llama4", "17bx128e", "llama4-maverick"), ("llama4", "17bx16e", "llama4-scout"),
])
def test_torchtitans_model_names_are_the_catalogs(name, flavor, model):
    doc, _ = _doc({"model": {"name": name, "flavor": flavor}}, gpus=512)
    assert catalog.model(doc["model"]["name"]).name == model


def test_torchtitans_defaults_where_a_key_is_absent():
    """No [training]: local batch 8, sequence 2048, global local × dp; no [activation_checkpoint]:
    selective with option "2", one block in 2 whole; no [compile]: the eager preset; the shard
    degree fills the world; a replicate-only mesh is plain data parallelism (ZeRO-0)."""
    doc, _ = _doc({"model": {"name": "llama3", "flavor": "8B"}}, gpus=16)
    assert doc["training"] == {"seq_len": 2048, "micro_batch": 8, "global_batch": 128, "recompute": "full",
                               "recompute_every": 2, "precision": "bf16"}
    assert doc["layout"]["zero"] == 3 and doc["layout"]["dp"] == 16 and doc["settings"]["framework"] == "fsdp"
    doc, _ = _doc({"model": {"name": "llama3", "flavor": "8B"},
                   "parallelism": {"data_parallel_replicate_degree": 16, "data_parallel_shard_degree": 1}}, gpus=16)
    assert doc["layout"]["zero"] == 0 and "dp_shard" not in doc["layout"]
    doc, _ = _doc({"model": {"name": "llama3", "flavor": "8B"},
                   "parallelism": {"tensor_parallel_degree": 4, "context_parallel_degree": 4,
                                   "data_parallel_shard_degree": 1}}, gpus=16)
    assert doc["layout"]["zero"] == 3 and doc["layout"]["cp_kind"] == "allgather"    # FSDP over the cp ranks


def test_pipeline_stages_as_torchtitan_counts_them():
    """A multi-stage schedule holds the parts module_fqns_per_model_part gives, or
    ceil((layers + 1 + 1) / pipeline_parallel_layers_per_stage) stages, over pp; the micro-batch is
    pipeline_parallel_microbatch_size and the local batch one schedule run's."""
    base = {"model": {"name": "llama3", "flavor": "8B"}, "training": {"local_batch_size": 8}}
    par = {"pipeline_parallel_degree": 2, "pipeline_parallel_schedule": "Interleaved1F1B",
           "pipeline_parallel_layers_per_stage": 3, "pipeline_parallel_microbatch_size": 2}
    doc, _ = _doc(base | {"parallelism": par}, gpus=16)
    assert doc["layout"]["schedule"] == "interleaved" and doc["layout"]["vpp"] == 6     # ceil((32 + 1 + 1) / 3) = 12, over 2
    assert doc["training"]["micro_batch"] == 2 and doc["training"]["local_batch"] == 8
    parts = [[f"layers.{4 * i + j}" for j in range(4)] for i in range(8)]
    parts[0].insert(0, "tok_embeddings")
    parts[-1] += ["norm", "output"]
    doc, _ = _doc(base | {"parallelism": par | {"module_fqns_per_model_part": parts}}, gpus=16)
    assert doc["layout"]["vpp"] == 4 and "last_layers" not in doc["layout"]      # 4 blocks a stage: even


@pytest.mark.parametrize("conf, needle", [
    ({"model": {"name": "llama3", "flavor": "debugmodel"}}, "not in the catalog as 'llama3-debugmodel'"),
    ({"model": {"name": "llama3"}}, "needs name and flavor"),
    ({"model": {"name": "llama3", "flavor": "8B"}, "parallelism": {"tensor_parallel_degree": 3}},
     "not a multiple of tp·cp·pp·replicate"),
    ({"model": {"name": "llama3", "flavor": "8B"}, "parallelism": {"pipeline_parallel_degree": 2,
                                                                   "pipeline_parallel_schedule": "Nope"}},
     "pipeline_parallel_schedule 'Nope'"),
    ({"model": {"name": "llama3", "flavor": "8B"}, "activation_checkpoint": {"selective_ac_option": "x"}},
     "selective_ac_option"),
    ({"model": {"name": "llama3", "flavor": "8B"}, "training": {"mixed_precision_param": "float32"}}, "fp32"),
    ({"model": {"name": "llama3", "flavor": "8B", "converters": ["quantize.linear.float8"]},
      "quantize": {"linear": {"float8": {"recipe_name": "blockwise"}}}}, "recipe_name 'blockwise'"),
    ({"model": {"name": "llama3", "flavor": "8B"}, "training": {"local_batch_size": 0}}, "local_batch_size"),
    ({"model": "llama3"}, "[model] must be a table"),
])
def test_bad_configurations_are_one_line(conf, needle):
    with pytest.raises(ModelcutError) as e:
        _doc(conf)
    assert needle in str(e.value) and "\n" not in str(e.value)


def test_the_cli_writes_a_run_file_predict_reads(tmp_path, capsys):
    out = tmp_path / "run.toml"
    src = Path(__file__).parent / "data" / "llama3-8b-torchtitan.toml"
    assert main(["from-torchtitan", str(src), "--gpu", "h100", "--gpus", "64", "-o", str(out)]) == 0
    assert main(["predict", str(out), "--json"]) == 0
    pred = json.loads(capsys.readouterr().out)
    assert pred["layout"]["dp_shard"] == 32 and pred["step_time_s"] > 0
    bad = tmp_path / "bad.toml"
    bad.write_text("[model\n")
    assert main(["from-torchtitan", str(bad), "--gpu", "h100", "--gpus", "64"]) == 2
    assert "not TOML" in capsys.readouterr().err


# the opening of torchtitan's torchtitan/models/llama3/config_registry.py after its move from TOML job
# files to Python registries (pytorch/torchtitan #2386, 2026-02-23), shortened
REGISTRY = """from torchtitan.config import CompileConfig, ParallelismConfig, TrainingConfig
from torchtitan.trainer import Trainer

from . import model_registry


def llama3_8b() -> Trainer.Config:
    return Trainer.Config(model_spec=model_registry("8B"),
                          parallelism=ParallelismConfig(tensor_parallel_degree=1))
"""


@pytest.mark.parametrize("name", ["config_registry.py", "llama3_8b.txt"])
def test_a_python_config_registry_is_named_as_such_in_one_line(tmp_path, capsys, name):
    """torchtitan after v0.2.2 configures a job in Python, which from-torchtitan does not run: the
    error says so, and which files it reads, whatever the file is called."""
    src = tmp_path / name
    src.write_text(REGISTRY)
    assert main(["from-torchtitan", str(src), "--gpu", "h100", "--gpus", "8"]) == 2
    err = capsys.readouterr().err
    assert "Python, not a TOML job configuration" in err and "v0.2.2" in err and "#2386" in err
    assert err.count("\n") == 1


SEARCHES = [
    ExploreRequest(model=catalog.model("llama3-8b"), hw=catalog.hardware("h100"), gpus=64, seq=8192,
                   global_batch_tokens=1 << 22, top=3, framework="fsdp-compile"),
    ExploreRequest(model=catalog.model("llama3-8b"), hw=catalog.hardware("h100"), gpus=32, seq=131072,
                   global_batch_tokens=1 << 20, top=3, framework="fsdp"),
    ExploreRequest(model=catalog.model("qwen3-30b-a3b"), hw=catalog.hardware("h100"), gpus=32, seq=8192,
                   global_batch_tokens=1 << 21, top=3, framework="fsdp-compile"),
]


@pytest.mark.parametrize("req", SEARCHES, ids=["llama3-8b-hsdp", "llama3-8b-128k-cp-pp", "qwen3-moe"])
def test_emitted_configurations_read_back_to_the_same_prediction(req, tmp_path, capsys):
    """The round trip: a ranked layout's --emit torchtitan configuration, read back by
    from-torchtitan (the catalog model named, the stack the search ran on), predicts to the explorer's
    step time to the last digit: hybrid sharding, pipelines with torch.distributed.pipelining's
    schedules and their parts, context parallelism of both rotations, experts."""
    res = run_explore(req)
    ok = [e for e in res.exploration.layouts if e.structure.pp == 1 or registry.get(e.structure.schedule).torch_class]
    seen = ok[::max(1, len(ok) // 8)][:8]
    assert seen
    for e in seen:
        text = torchtitan_toml(e, res.framework)
        assert tomllib.loads(text).get("compile", {}).get("enable", False) == res.framework.torch_compile
        got = assert_round_trip("from-torchtitan", text, req, res.framework, tmp_path, capsys)
        assert got == pytest.approx(e.step_time_s, rel=1e-9), text


TABLE_KEYS = {"parallelism": ["tensor_parallel_degree", "context_parallel_degree", "pipeline_parallel_degree",
                              "data_parallel_replicate_degree", "data_parallel_shard_degree", "expert_parallel_degree",
                              "pipeline_parallel_schedule", "pipeline_parallel_microbatch_size",
                              "fsdp_reshard_after_forward", "context_parallel_rotate_method",
                              "pipeline_parallel_layers_per_stage", "module_fqns_per_model_part"],
              "training": ["local_batch_size", "global_batch_size", "seq_len", "mixed_precision_param"],
              "activation_checkpoint": ["mode", "selective_ac_option"], "compile": ["enable"]}
VALUES = [-1, 0, 1, 2, 3, 4, 8, 64, 10**12, "1F1B", "Interleaved1F1B", "ZBVZeroBubble", "never", "always", "op",
          "2", "full", "none", "alltoall", "bfloat16", "float32", True, [["a"]] * 4, "x", 1.5]


@given(st.lists(st.tuples(st.sampled_from(sorted(TABLE_KEYS)), st.data()), max_size=8), st.sampled_from([1, 8, 64]))
@settings(max_examples=150, deadline=None)
def test_any_configuration_reads_or_is_one_line(tables, gpus):
    """Whatever the keys and values, a configuration reads into a RUN.toml or stops at one line naming
    the problem (a ModelcutError), never another exception."""
    conf: dict = {"model": {"name": "llama3", "flavor": "8B"}}
    for t, data in tables:
        key = data.draw(st.sampled_from(TABLE_KEYS[t]))
        conf.setdefault(t, {})[key] = data.draw(st.sampled_from(VALUES))
    try:
        out = run_file_text(_as_toml(conf), "fuzz.toml", gpu="h100", gpus=gpus)
    except ModelcutError as exc:
        assert "\n" not in str(exc)
    else:
        assert tomllib.loads(out)["hardware"]["gpus"] == gpus


def _as_toml(conf: dict) -> str:
    """A configuration as TOML text (values as TOML writes them)."""
    def value(v):
        if isinstance(v, bool):
            return "true" if v else "false"
        if isinstance(v, str):
            return '"' + v + '"'
        if isinstance(v, list):
            return "[" + ", ".join(value(x) for x in v) + "]"
        return repr(v)
    return "\n".join(f"[{t}]\n" + "\n".join(f"{k} = {value(v)}" for k, v in table.items()) for t, table in conf.items())


def test_a_rotate_method_that_is_not_a_name_is_one_line():
    """A list where torchtitan takes a rotation's name (hypothesis found it: the lookup raised
    TypeError, a traceback) stops at one line naming the key."""
    conf = {"model": {"name": "llama3", "flavor": "8B"},
            "parallelism": {"context_parallel_degree": 2, "context_parallel_rotate_method": [["a"], ["a"]]}}
    with pytest.raises(ModelcutError, match="context_parallel_rotate_method must be allgather or alltoall"):
        run_file_text(_as_toml(conf), "fuzz.toml", gpu="h100", gpus=8)
