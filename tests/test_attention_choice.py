"""A run's attention kernel ([training] attention, Megatron-LM's --attention-backend): it replaces
the stack's in time and in memory, the readers and the emitters carry it, bad values are one line."""

from __future__ import annotations

import json

import pytest

from modelcut.cli import main
from modelcut.core.errors import ModelcutError
from modelcut.core.specs import ATTENTION_KINDS, Training
from modelcut.core.step.stack_names import ATTENTION_BACKENDS, MEGATRON_ATTENTION_BACKEND
from modelcut.service.megatron_args import run_document

SHAPE = ("--num-layers 32 --hidden-size 4096 --num-attention-heads 32 --seq-length 8192 --micro-batch-size 1 "
         "--global-batch-size 64 --vocab-size 32000 --bf16 ")
RUN = ('[model]\nname = "llama3-8b"\n[hardware]\ngpu = "{gpu}"\ngpus = 8\n[layout]\ndp = 8\n'
       '[training]\nseq_len = 8192\nglobal_batch = 64\n{line}[settings]\nframework = "megatron-core"\n')


def _predict(tmp_path, capsys, line: str, gpu: str = "h100") -> dict:
    f = tmp_path / "run.toml"
    f.write_text(RUN.format(gpu=gpu, line=line))
    assert main(["predict", str(f), "--json"]) == 0
    return json.loads(capsys.readouterr().out)


def test_the_runs_kernel_replaces_the_stacks_in_time_and_memory(tmp_path, capsys):
    stack = _predict(tmp_path, capsys, "")
    named = {k: _predict(tmp_path, capsys, f'attention = "{k}"\n') for k in ("cudnn", "flash2", "flash3", "unfused")}
    assert stack["step_time_s"] == named["cudnn"]["step_time_s"]        # megatron-core on Hopper: cuDNN ("auto")
    assert len({named[k]["step_time_s"] for k in ("cudnn", "flash2", "flash3")}) == 3
    assert named["unfused"]["step_time_s"] > max(named[k]["step_time_s"] for k in ("cudnn", "flash2", "flash3"))
    # the unfused path holds the s² scores; the fused kernels hold none
    assert named["unfused"]["memory"]["peak_bytes"] > 2 * named["flash2"]["memory"]["peak_bytes"]
    assert named["flash2"]["memory"]["peak_bytes"] == named["cudnn"]["memory"]["peak_bytes"]


@pytest.mark.parametrize("line, gpu, words", [
    ('attention = "sdpa"\n', "h100", "attention"),
    ('attention = "flash3"\n', "a100", "FlashAttention-3 runs on Hopper GPUs only"),
])
def test_a_kernel_that_cannot_be_is_one_line(tmp_path, capsys, line, gpu, words):
    f = tmp_path / "run.toml"
    f.write_text(RUN.format(gpu=gpu, line=line))
    assert main(["predict", str(f)]) == 2
    err = capsys.readouterr().err
    assert words in err and len(err.strip().splitlines()) == 1
    with pytest.raises(ModelcutError, match="attention must be one of"):
        Training(seq_len=8, global_batch=1, attention="sdpa")


def test_from_megatron_reads_the_attention_backend_and_emit_writes_it_back(tmp_path, capsys):
    for backend, kernel in ATTENTION_BACKENDS.items():
        doc, unread = run_document(SHAPE + f"--attention-backend {backend}", gpu="h100", gpus=8)
        assert doc["training"].get("attention") == kernel and not unread
    assert set(k for k in ATTENTION_BACKENDS.values() if k) <= set(ATTENTION_KINDS)
    assert set(MEGATRON_ATTENTION_BACKEND) == set(ATTENTION_KINDS)            # every kernel a run names emits
    assert all(ATTENTION_BACKENDS[b] == k for k, b in MEGATRON_ATTENTION_BACKEND.items() if k in ("flash2", "cudnn",
                                                                                                     "unfused"))
    with pytest.raises(ModelcutError, match="attention-backend"):
        run_document(SHAPE + "--attention-backend sdpa", gpu="h100", gpus=8)
    args = ["explore", "--model", "llama3-8b", "--gpu", "h100", "--gpus", "16", "--seq", "8192",
            "--global-batch-tokens", "512K", "--top", "1", "--attention", "cudnn"]
    assert main(args + ["--emit", "megatron"]) == 0
    emitted = capsys.readouterr().out
    assert "--attention-backend fused" in emitted.splitlines()
    assert main(args + ["--emit", "nemo"]) == 0
    assert "model.config.attention_backend=fused" in capsys.readouterr().out.splitlines()
    assert main(args + ["--json"]) == 0
    assert json.loads(capsys.readouterr().out)["attention"] == "cudnn"


def test_predict_takes_the_choices_as_flags_over_the_file(tmp_path, capsys):
    """--attention, --grad-reduce and --fp8-param-gather on predict replace the file's; at several
    precisions FP8 gathering goes with fp8 only."""
    base = _predict(tmp_path, capsys, 'attention = "flash2"\n')
    assert main(["predict", str(tmp_path / "run.toml"), "--attention", "cudnn", "--json"]) == 0
    flagged = json.loads(capsys.readouterr().out)
    assert flagged["step_time_s"] == _predict(tmp_path, capsys, 'attention = "cudnn"\n')["step_time_s"]
    assert flagged["step_time_s"] != base["step_time_s"]
    assert main(["predict", str(tmp_path / "run.toml"), "--precision", "bf16,fp8", "--fp8-param-gather",
                 "--grad-reduce", "bf16", "--json"]) == 0
    both = json.loads(capsys.readouterr().out)
    assert len(both["predictions"]) == 2
    assert main(["predict", str(tmp_path / "run.toml"), "--fp8-param-gather"]) == 2      # a bf16 run
    assert "fp8_param_gather needs precision" in capsys.readouterr().err
