"""Fuzzing the command line: hypothesis drives every command's options, and RUN.toml's fields,
with extreme, malformed and non-finite values. Each case runs in a process of its own under a
30 s time limit and a 1 GB memory limit (:mod:`fuzzbox`); every one exits 0 or 2, never with a
traceback, and every exit 2 is one line ``modelcut: error: ...``.

The cases are drawn in batches (one box process per batch) to keep the suite fast. Valid values
are small, so that a case that passes every check does little work; the extreme ones are far
beyond every cap, so that each must be refused before its work starts.
"""

from __future__ import annotations

import json

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import fuzzbox

# --- values ---------------------------------------------------------------------------------------

HUGE = [10**9, 10**12, 2**40, 2**63, 10**21, 10**30]
BAD_INTS = [0, -1, -(10**12)]
SMALL_INTS = [1, 2, 3, 4, 8]
ints = st.sampled_from(SMALL_INTS + HUGE + BAD_INTS).map(str) | st.sampled_from(["1.5", "abc", "", "1e3", "0x10", "  "])
floats = st.sampled_from(["nan", "inf", "-inf", "-1", "0", "1e308", "1e-308", "5e-324", "1.5", "2", "1e12", "abc",
                          "-0", "1e400"])
names = st.sampled_from(["1f1b", "interleaved", "zbv", "dualpipe", "gpipe", "zb-h1", "looped-bfs", "dualpipev",
                         "nope", "", "torch:NoSuchClass", "1f1b,zbv"])
models = st.sampled_from(["gpt-1.7b", "llama3-8b", "mixtral-8x7b", "nope", "", "bad.json", "huge.json", "cfg.json"])
gpus = st.sampled_from(["a100", "h100", "h200", "tpu-v4", "a200", ""])
tokens = st.sampled_from(["128K", "1e400", "-5", "0", "1.5", "999999999999999G", "abc", "262144", "2^40", "4096"])
lists = st.sampled_from(["1,2,4", "0", "-1", "1,1", "abc", "", "1,99999999999999999", ","])
checks = st.sampled_from(["tp=3,cp=1,pp=1,dp=1", "tp=8,pp=16", "tp=0", "tp=abc", "zz=1", "tp", "tp=1," * 3,
                          "cp_kind=ring", "tp=99999999999999999999"])

HF_FILES = {
    "bad.json": "{not json",
    "huge.json": json.dumps({"architectures": ["DeepseekV3ForCausalLM"], "hidden_size": 7168, "num_hidden_layers": 61,
                             "num_attention_heads": 10**12, "kv_lora_rank": 512, "qk_nope_head_dim": 128,
                             "qk_rope_head_dim": 64, "v_head_dim": 128, "intermediate_size": 18432,
                             "vocab_size": 129280}),
    "cfg.json": json.dumps({"architectures": ["LlamaForCausalLM"], "hidden_size": 512, "num_hidden_layers": 4,
                            "num_attention_heads": 8, "num_key_value_heads": 2, "intermediate_size": 1536,
                            "vocab_size": 32000}),
}


def opts(**choices):
    """A subset of the options, each with one of its values."""
    return st.lists(st.sampled_from(sorted(choices)), unique=True, max_size=len(choices)).flatmap(
        lambda keys: st.tuples(*[st.tuples(st.just(k), choices[k]) for k in keys]) if keys else st.just(()))


FLAG = st.none()   # an option without a value


def argv(command, flags, **choices):
    return opts(**choices).map(lambda pairs: [command, *flags,
                                              *[x for k, v in pairs for x in ((k,) if v is None else (k, v))]])


# --- each command ---------------------------------------------------------------------------------

csv_text = st.sampled_from(["0F0,0B0\n", "0F100000000000000000000,0B0\n", "0F0\n1B0\n", "", "x\n",
                            "0F0,0F1,0B0,0B1\n1F0,1F1,1B0,1B1\n", "9999999F0,9999999B0\n", "0W0\n" * 3])

simulate = st.tuples(argv("simulate", [], **{"-s": names, "-p": ints, "-m": ints, "-v": ints, "--forward": floats,
                                               "--backward": floats, "--weight": floats, "--p2p": floats,
                                               "--max-ops": ints, "--json": FLAG}),
                     st.sampled_from([[], ["--json"], ["--schedule-csv", "s.csv"], ["--export-csv", "/nonexistent/x.csv"],
                                      ["--trace", "t.json"], ["--plot", "p.gif"], ["--html", "/"]]),
                     csv_text).map(lambda t: {"argv": t[0] + t[1], "files": {"s.csv": t[2]}})

seqs = st.sampled_from(["2048", "4096"] + [str(x) for x in HUGE + BAD_INTS]) | st.sampled_from(["1.5", "abc", ""])
explore = argv("explore", [], **{"--model": models, "--gpu": gpus, "--gpus": ints, "--seq": seqs,
                                 "--global-batch-tokens": tokens, "--top": ints, "--micro-batches": lists,
                                 "--local-batch": ints,
                                 "--schedules": names, "--check": checks, "--eps": lists,
                                 "--cp-kinds": st.sampled_from(["ring", "allgather", "nope", ""]),
                                 "--margin": floats, "--gpus-per-node": ints,
                                 "--mode": st.sampled_from(["default", "seed", "magic"]),
                                 "--framework": st.sampled_from(["fsdp", "nope"]),
                                 "--emit": st.sampled_from(["megatron", "torchtitan", "yaml"]), "--pick": ints,
                                 "--max-layouts": ints, "--max-gpus": ints, "--max-search-ops": ints,
                                 "--no-flash": FLAG, "--no-reshard": FLAG, "--allow-tp-across-nodes": FLAG}).map(
    lambda a: {"argv": a + [x for k, v in (("--model", "gpt-1.7b"), ("--gpu", "a100"), ("--gpus", "8"),
                                           ("--seq", "2048"), ("--global-batch-tokens", "128K"))
                            if k not in a for x in (k, v)] + ["--json"], "files": HF_FILES})

mesh = argv("mesh", ["--json"], **{"--tp": ints, "--cp": ints, "--pp": ints, "--dp": ints, "--ep": ints,
                                   "--gpus-per-node": ints, "--rank": ints, "--max-gpus": ints,
                                   "--order": st.sampled_from(["tp,cp,pp,dp", "tp-cp-ep-dp-pp", "tp,tp", "x", ""])}).map(
    lambda a: {"argv": a})

toml_value = st.sampled_from(["1", "2", "8", "0", "-1", "10000000000000000000000", "1000000000000", "nan", "inf",
                              "-inf", "1.5", '"abc"', "true", "[]", "{}", '"full"', "2048"])
TOML_KEYS = {"model": ["layers", "hidden", "heads", "vocab", "ffn_hidden", "kv_heads", "experts", "top_k",
                       "capacity_factor", "max_seq", "head_dim", "dense_layers"],
             "hardware": ["gpus", "gpus_per_node", "gpu"],
             "layout": ["tp", "cp", "pp", "dp", "vpp", "zero", "ep", "schedule", "sequence_parallel", "cp_kind"],
             "training": ["seq_len", "global_batch", "micro_batch", "recompute", "local_batch"]}
BASE = {"model": {"layers": "4", "hidden": "512", "heads": "8", "vocab": "32000"},
        "hardware": {"gpu": '"a100"'}, "layout": {"tp": "1", "pp": "2", "dp": "1"},
        "training": {"seq_len": "1024", "global_batch": "8", "micro_batch": "1"}}


def _toml(changes: list[tuple[str, str, str]], settings: str) -> str:
    doc = {k: dict(v) for k, v in BASE.items()}
    for sec, key, val in changes:
        doc[sec][key] = val
    text = "".join(f"[{sec}]\n" + "".join(f"{k} = {v}\n" for k, v in t.items()) for sec, t in doc.items())
    return text + settings


toml_changes = st.lists(st.sampled_from(sorted(TOML_KEYS)).flatmap(
    lambda sec: st.tuples(st.just(sec), st.sampled_from(TOML_KEYS[sec]), toml_value)), max_size=4)
settings_text = st.sampled_from(["", '[settings]\nframework = "fsdp"\n', '[settings]\nframework = "nope"\n',
                                 '[settings]\noverlap = "tp_comm=on"\n', '[settings]\noverlap = 5\n', "[extra]\n"])
predict = st.tuples(toml_changes, settings_text,
                    argv("predict", ["run.toml"], **{"--mode": st.sampled_from(["default", "seed", "x"]),
                                                     "--eta": floats, "--framework": st.sampled_from(["fsdp", "x"]),
                                                     "--overlap": st.sampled_from(["tp_comm=on", "x=1", "tp_comm=2"]),
                                                     "--max-ops": ints, "--json": FLAG, "--budget": FLAG,
                                                     "--profile": st.just("nope.toml")})).map(
    lambda t: {"argv": t[2], "files": {"run.toml": _toml(t[0], t[1])}})

others = st.one_of(
    argv("validate", [], **{"--mode": st.sampled_from(["seed", "default", "magic"]), "--json": FLAG,
                            "--profile": st.sampled_from(["nope.toml", "runs.csv"])}),
    argv("validate", ["--budget"], **{"--mode": st.sampled_from(["seed", "magic"])}),
    argv("report", [], **{"-o": st.sampled_from(["/nonexistent/x.md", "r.md", "/", ""]),
                          "--mode": st.sampled_from(["seed", "default", "magic"])}),
    st.just(["bubble-table", "--json"]),
    argv("calibrate", ["--runs", "runs.csv", "--no-cv"], **{"--fit": st.sampled_from(["gemm", "zz", "", "gemm,gemm"]),
                                                            "--gpu": gpus, "--out": st.just("/nonexistent/p.toml")}),
    argv("crosscheck", ["--order-only"], **{"-s": names, "-p": ints, "-m": ints, "-v": ints, "--forward-ms": floats,
                                            "--backward-ms": floats, "--weight-ms": floats, "--steps": ints,
                                            "--timeout": floats, "--json": FLAG,
                                            "--trace": st.sampled_from(["t.json", "/nonexistent/t.json"])}),
    argv("serve", ["--port", "-1"], **{"--host": st.sampled_from(["not a host", "127.0.0.1"]), "--max-ops": ints,
                                       "--workers": ints}),
).map(lambda a: {"argv": a, "files": {"runs.csv": RUNS_CSV}})

RUNS_CSV = ("id,model,gpu,tp,pp,dp,seq_len,global_batch,micro_batch,tflops_per_gpu\n"
            "a,gpt-1.7b,a100,1,1,99999999999999999999,2048,512,1,nan\n")

# validate --runs: a CSV row of small valid values with some cells made extreme or malformed
CSV_BASE = {"id": "a", "model": "gpt-1.7b", "gpu": "a100", "tp": "1", "pp": "2", "dp": "1", "seq_len": "1024",
            "global_batch": "8", "micro_batch": "1", "step_time_s": "1.5"}
CSV_CELLS = {"tp": ints, "pp": ints, "dp": ints, "cp": ints, "ep": ints, "vpp": ints, "zero": ints,
             "seq_len": ints, "global_batch": ints, "micro_batch": ints, "local_batch": ints, "gpus_per_node": ints,
             "step_time_s": floats, "tflops_per_gpu": floats, "model": models, "gpu": gpus,
             "precision": st.sampled_from(["fp8", "bf16", "fp4", ""]), "fp8_recipe": st.sampled_from(["mxfp8", "x"]),
             "cp_kind": st.sampled_from(["ring", "x"]), "schedule": names, "order": st.sampled_from(["tp;pp;dp", "x;y"]),
             "sequence_parallel": st.sampled_from(["true", "maybe"]), "recompute": st.sampled_from(["full", "x"]),
             "recompute_modules": st.sampled_from(["layernorm;moe_act", "x"]),
             "framework": st.sampled_from(["torchtitan", "Megatron-LM", "nope"]),
             "overlap": st.sampled_from(["tp_comm=on", "--tp-comm-overlap", "x=1", "tp_comm=on;tp_comm=off"])}


def _csv(changes: list[tuple[str, str]]) -> str:
    row = dict(CSV_BASE, **dict(changes))
    return ",".join(row) + "\n" + ",".join(v.replace(",", ";") for v in row.values()) + "\n"


user_runs = st.tuples(st.lists(st.sampled_from(sorted(CSV_CELLS)).flatmap(
    lambda k: st.tuples(st.just(k), CSV_CELLS[k])), max_size=3),
    argv("validate", ["--runs", "mine.csv"], **{"--json": FLAG, "--profile": st.just("nope.toml"),
                                                "--mode": st.sampled_from(["default", "magic"])})).map(
    lambda t: {"argv": t[1], "files": {"mine.csv": _csv(t[0]), **HF_FILES}})

every = st.one_of(simulate, explore, mesh, predict, others, user_runs)


def check(cases: list[dict]) -> None:
    bad = []
    for case, res in zip(cases, fuzzbox.run(cases)):
        err = res["stderr"]
        ok = (res["rc"] in (0, 2) and "Traceback" not in err + res["stdout"] and not res["killed"]
              and (res["rc"] == 0 or (err.startswith("modelcut: error") and err.strip().count("\n") == 0)))
        if not ok:
            bad.append((case["argv"], res["rc"], round(res["seconds"], 1), err[-600:]))
    assert not bad, "\n".join(map(repr, bad[:5]))


@settings(max_examples=5, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(st.lists(every, min_size=40, max_size=40))
def test_every_command_exits_0_or_2_in_time_and_memory(cases):
    check(cases)


@settings(max_examples=2, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(st.lists(predict, min_size=40, max_size=40))
def test_run_toml_fields_exit_0_or_2_in_time_and_memory(cases):
    check(cases)


@settings(max_examples=2, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
@given(st.lists(user_runs, min_size=40, max_size=40))
def test_csv_rows_exit_0_or_2_in_time_and_memory(cases):
    check(cases)


def test_files_nested_past_the_parser_are_one_line(tmp_path, capsys):
    """A config.json, a RUN.toml, a torchtitan configuration or a profile nested deeper than Python's
    parsers go is refused in one line with exit 2 (each was an internal error, exit 70)."""
    from modelcut.cli import main

    deep_json = tmp_path / "config.json"
    deep_json.write_text("[" * 200_000 + "]" * 200_000)
    deep_toml = tmp_path / "run.toml"
    deep_toml.write_text("a = " + "[" * 20_000 + "1" + "]" * 20_000 + "\n")
    cases = [
        ["explore", "--model", str(deep_json), "--gpu", "h100", "--gpus", "8", "--seq", "4096",
         "--global-batch-tokens", "1M"],
        ["predict", str(deep_toml)],
        ["from-torchtitan", str(deep_toml), "--gpu", "h100", "--gpus", "8"],
        ["predict", "tests/data/gpt3-175b.toml", "--profile", str(deep_toml)],
    ]
    for args in cases:
        capsys.readouterr()
        assert main(args) == 2, args
        err = capsys.readouterr().err.strip()
        assert err.startswith("modelcut: error:") and "nested more deeply" in err and "\n" not in err, err
