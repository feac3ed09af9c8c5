"""`modelcut validate`, `predict` and `report` from the command line."""

import json

import pytest

from modelcut.cli import main


def run_cli(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def test_validate_json(capsys):
    code, out, _ = run_cli(capsys, "validate", "--json")
    assert code == 0
    d = json.loads(out)
    assert d["eta"] == pytest.approx(0.473, abs=0.001)
    assert len(d["runs"]) == 13
    row = next(r for r in d["runs"] if r["id"] == "megatron-18.4b")
    assert row["step_time_s"] == pytest.approx(10.61, abs=0.05)
    assert row["breakdown"]["tp_s"] == pytest.approx(1.67, abs=0.03)
    s = d["summary"]
    assert s["max_error_pct"]["megatron"] == pytest.approx(18.6, abs=0.3)
    assert s["max_error_pct"]["llama3"] == pytest.approx(10.3, abs=0.3)
    assert s["mean_abs_error_pct"] == pytest.approx(10.8, abs=0.3)
    assert s["all_low"] is True


def test_validate_table(capsys):
    code, out, _ = run_cli(capsys, "validate")
    assert code == 0
    assert "megatron-18.4b" in out and "η = 0.473" in out and "every prediction low: yes" in out


def test_predict_json_matches_validation(capsys):
    """The issue's example file and the Llama 3 run by catalog name."""
    code, out, _ = run_cli(capsys, "predict", "tests/data/gpt3-175b.toml", "--json", "--mode", "seed")
    assert code == 0
    d = json.loads(out)
    assert {"step_time_s", "tflops_per_gpu", "mfu", "breakdown"} <= set(d)
    assert d["vpp"] == 12 and d["schedule"] == "interleaved" and d["microbatches"] == 64
    assert sum(d["breakdown"].values()) == pytest.approx(d["step_time_s"])
    assert d["mfu"] == pytest.approx(d["tflops_per_gpu"] * 1e12 / 312e12)
    # tokens/s per GPU: the run file's 64 sequences of 2048 tokens over step time and 64 GPUs
    assert d["tokens_per_s_per_gpu"] == pytest.approx(64 * 2048 / (d["step_time_s"] * 64))

    _, out, _ = run_cli(capsys, "predict", "tests/data/llama3-405b-named.toml", "--json", "--mode", "seed")
    named = json.loads(out)
    _, out, _ = run_cli(capsys, "validate", "--json")
    row = next(r for r in json.loads(out)["runs"] if r["id"] == "llama3-405b-8k-8192")
    assert named["step_time_s"] == pytest.approx(row["step_time_s"], rel=1e-9)


def test_predict_from_hf_config_and_text(capsys):
    code, out, _ = run_cli(capsys, "predict", "tests/data/llama3-8b-config.toml")
    assert code == 0
    assert "step time" in out and "TFLOP/s per GPU" in out and "llama3-8b" in out


def test_dp_follows_from_the_gpu_count(capsys, tmp_path):
    """A run file without dp takes gpus/(tp·cp·pp), as Megatron-LM and torchtitan size data
    parallelism from the world size: the same prediction as with dp written."""
    text = open("tests/data/llama3-70b-64-h100.toml").read()
    assert "\ndp = 2\n" in text
    f = tmp_path / "no-dp.toml"
    f.write_text(text.replace("\ndp = 2\n", "\n"))
    _, a, _ = run_cli(capsys, "predict", "tests/data/llama3-70b-64-h100.toml", "--json")
    code, b, _ = run_cli(capsys, "predict", str(f), "--json")
    assert code == 0 and json.loads(a)["step_time_s"] == json.loads(b)["step_time_s"]
    lay = json.loads(b)["layout"]       # the layout as timed: dp inferred, the stack's choices filled in
    assert (lay["tp"], lay["cp"], lay["pp"], lay["dp"], lay["vpp"]) == (4, 2, 4, 2, 5)
    assert lay["framework"] == "nemo" and lay["zero"] >= 1 and lay["sequence_parallel"] and lay["cp_kind"] == "ring"


def test_predict_eta_option(capsys):
    _, a, _ = run_cli(capsys, "predict", "tests/data/gpt3-175b.toml", "--json", "--eta", "0.3", "--mode", "seed")
    _, b, _ = run_cli(capsys, "predict", "tests/data/gpt3-175b.toml", "--json", "--eta", "0.6", "--mode", "seed")
    assert json.loads(a)["step_time_s"] > json.loads(b)["step_time_s"]


@pytest.mark.parametrize("file,message", [
    ("malformed.toml", "invalid TOML"),
    ("unknown-key.toml", "unknown key 'tensor_parallel'"),
    ("unknown-section.toml", "unknown section [optimizer]"),
    ("unknown-gpu.toml", "unknown GPU 'a200'"),
    ("product.toml", "is not the GPU count 256"),
    ("no-dp.toml", "gives no dp, and the GPU count 256 is not a multiple of tp·cp·pp = 3"),
    ("heads.toml", "tp (16) must divide the attention heads (24)"),
    ("batch.toml", "must be divisible by dp × micro_batch"),
])
def test_bad_run_files_are_one_line_errors(capsys, file, message):
    code, out, err = run_cli(capsys, "predict", f"tests/data/bad/{file}")
    assert code == 2
    assert out == ""
    assert err.count("\n") == 1 and err.startswith("modelcut: error: ")
    assert message in err


@pytest.mark.parametrize("file,message", [
    ("tests/data/llama3-8b-torchtitan.toml",
     "a torchtitan job configuration ([job]), not a RUN.toml: convert it with `modelcut from-torchtitan "
     "tests/data/llama3-8b-torchtitan.toml --gpu GPU --gpus N -o run.toml`"),
    ("tests/data/llama3-70b-megatron.sh", "Megatron-LM launch arguments, not a RUN.toml: convert them with "
     "`modelcut from-megatron tests/data/llama3-70b-megatron.sh"),
    ("tests/data/llama3-8b-megatron-arrays.sh", "Megatron-LM launch arguments"),
    ("tests/data/hf/llama3-8b.json", "a Hugging Face config.json (a model's shape), not a RUN.toml: name it in "
     "a RUN.toml's [model] (config = \"tests/data/hf/llama3-8b.json\")"),
])
def test_another_tools_input_names_the_command_that_reads_it(capsys, file, message):
    """predict given a torchtitan job configuration, a Megatron-LM launch or a config.json: one line
    naming the converter (or the field) that reads it, not a TOML parse error."""
    code, out, err = run_cli(capsys, "predict", file)
    assert code == 2 and out == ""
    assert err.count("\n") == 1 and err.startswith("modelcut: error: ")
    assert message in err
    # what the line says works: the converter reads the same file
    if "from-" in message:
        tool = "from-torchtitan" if "torchtitan" in message else "from-megatron"
        vocab = ("--vocab", "128256") if tool == "from-megatron" else ()   # Megatron-LM's comes from the tokenizer
        code, out, _ = run_cli(capsys, tool, file, "--gpu", "h100", "--gpus", "64", *vocab)
        assert code == 0 and "[layout]" in out


def test_missing_file_and_unknown_mode(capsys, tmp_path):
    code, _, err = run_cli(capsys, "predict", str(tmp_path / "nope.toml"))
    assert code == 2 and "no such file" in err
    code, _, err = run_cli(capsys, "validate", "--mode", "magic")
    assert code == 2 and "unknown mode 'magic'" in err


def test_report_writes_the_results_page(capsys, tmp_path):
    target = tmp_path / "results.md"
    code, out, _ = run_cli(capsys, "report", "--output", str(target))
    assert code == 0 and str(target) in out
    text = target.read_text()
    assert "## Pipeline bubbles" in text and "| interleaved | 8 | 32 | 4 |" in text
    assert "megatron-18.4b" in text and "llama3-405b-128k-16384" in text
    assert "Every prediction low: yes" in text
    assert "## Assumptions" in text and "α = 5 µs" in text


def test_a_run_file_under_fsdp_without_a_zero_stage_is_fully_sharded(capsys, tmp_path):
    """RUN.toml's [layout] without ``zero`` under ``--framework fsdp`` runs as FSDP does (ZeRO-3, the
    states a 64th a GPU); ``zero = 0`` still asks for plain replication."""
    f = tmp_path / "RUN.toml"
    f.write_text('[model]\nname = "llama3-8b"\n[hardware]\ngpu = "h100"\ngpus = 64\n[layout]\ntp = 1\npp = 1\n'
                 'dp = 64\n[training]\nseq_len = 8192\nglobal_batch = 64\nmicro_batch = 1\nrecompute = "selective"\n')
    code, out, _ = run_cli(capsys, "predict", str(f), "--framework", "fsdp", "--json")
    assert code == 0
    d = json.loads(out)
    assert d["memory"]["assumptions"]["zero"] == 3 and d["memory"]["fits"]
    f.write_text(f.read_text().replace("dp = 64\n", "dp = 64\nzero = 0\n"))
    code, out, _ = run_cli(capsys, "predict", str(f), "--framework", "fsdp", "--json")
    replicated = json.loads(out)
    assert replicated["memory"]["assumptions"]["zero"] == 0
    assert replicated["memory"]["peak_bytes"] > 2 * d["memory"]["peak_bytes"]


def test_a_nemo_run_file_with_tensor_parallelism_cuts_the_norms_unless_it_says_not(capsys, tmp_path):
    """NeMo's Llama 3 70B layout (tp 4, cp 2, pp 4, v 5) with no ``sequence_parallel``: NeMo's
    performance scripts turn it on with tp > 1, so the run is timed and counted as it ran; ``false``
    says otherwise and costs time and memory (82.2 GB a GPU against 62.7)."""
    text = open("tests/data/llama3-70b-64-h100.toml").read()
    assert "sequence_parallel = true\n" in text
    f = tmp_path / "RUN.toml"
    f.write_text(text.replace("sequence_parallel = true\n", ""))
    _, out, _ = run_cli(capsys, "predict", str(f), "--json")
    left_open = json.loads(out)
    _, out, _ = run_cli(capsys, "predict", "tests/data/llama3-70b-64-h100.toml", "--json")
    assert left_open["step_time_s"] == json.loads(out)["step_time_s"] and left_open["memory"]["fits"]
    f.write_text(text.replace("sequence_parallel = true\n", "sequence_parallel = false\n"))
    _, out, _ = run_cli(capsys, "predict", str(f), "--json")
    off = json.loads(out)
    assert off["step_time_s"] > left_open["step_time_s"]
    assert off["memory"]["peak_bytes"] > left_open["memory"]["peak_bytes"]


def test_an_internal_error_is_one_line_and_its_own_exit_status(capsys, monkeypatch):
    """A bug (not the input) exits 70 with one line naming the exception; MODELCUT_TRACEBACK=1
    lets it propagate with its traceback."""
    from modelcut.cli import INTERNAL_ERROR
    from modelcut.service import catalog_info

    def broken(kind):
        raise KeyError("a missing entry\nover two lines")
    monkeypatch.setattr("modelcut.cli.listing.rows", broken)
    monkeypatch.delenv("MODELCUT_TRACEBACK", raising=False)
    assert main(["list", "models"]) == INTERNAL_ERROR == 70
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("modelcut: internal error") and "KeyError" in err[0]
    monkeypatch.setenv("MODELCUT_TRACEBACK", "1")
    with pytest.raises(KeyError):
        main(["list", "models"])
    assert catalog_info.rows("models")      # the real one untouched


@pytest.mark.parametrize("run_id", ["megatron-39.1b", "automodel-deepseek-v3-256", "mbridge2511-gpt-oss-120b-64",
                                    "zero3-529.6b-640"])
def test_predict_run_gives_the_error_out_of_sample_first(run_id, capsys):
    """``predict --run ID`` under the shipped constants gives the run's error out of sample (the
    constants fitted without its source, validate's leave-one-source-out fold) beside the
    in-sample one, the same figures validate prints; seed mode, ``--eta`` and ``--profile`` have no
    fold to leave a source out of, and give the one error."""
    from modelcut.service.validation import default_table
    row = next(r for r in default_table().as_dict()["runs"] if r["id"] == run_id)
    assert main(["predict", "--run", run_id, "--json"]) == 0
    pub = json.loads(capsys.readouterr().out)["published"]
    assert pub["error_pct"] == pytest.approx(row["default"]["error_pct"], abs=1e-9)
    assert pub["out_of_sample"]["error_pct"] == pytest.approx(row["loso"]["error_pct"], abs=1e-9)
    assert pub["out_of_sample"]["step_time_s"] == pytest.approx(row["loso"]["step_time_s"], rel=1e-12)
    assert pub["out_of_sample"]["source_left_out"] == row["group"]
    assert main(["predict", "--run", run_id]) == 0
    text = " ".join(capsys.readouterr().out.split())      # the published line, however it wraps
    o, i = pub["out_of_sample"]["error_pct"], pub["error_pct"]
    assert f"error out of sample {o:+.1f} % (constants fitted without {row['group']}), in sample {i:+.1f} %" in text
    for extra in (["--mode", "seed"], ["--eta", "0.5"]):
        assert main(["predict", "--run", run_id, "--json", *extra]) == 0
        assert "out_of_sample" not in json.loads(capsys.readouterr().out)["published"]
