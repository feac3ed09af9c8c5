"""``modelcut from-megatron``: Megatron-LM launch arguments as a RUN.toml, the reverse of
``explore --emit megatron``."""

from __future__ import annotations

import json
import tomllib
from dataclasses import replace
from pathlib import Path

import pytest
from hypothesis import given, settings, strategies as st

from modelcut import catalog
from modelcut.cli import main
from modelcut.core.errors import ModelcutError
from modelcut.export.emit import megatron_args
from modelcut.service.explore import ExploreRequest, catalog_request, run_explore
from modelcut.service.megatron_args import expand_literals, parse_flags, run_document

from helpers import assert_round_trip

LLAMA70 = (Path(__file__).parent / "data" / "llama3-70b-megatron.sh").read_text()


def _doc(text: str = LLAMA70, **kw):
    args = dict(gpu="h100", gpus=64, vocab=128256) | kw
    return run_document(text, **args)


def test_a_launch_script_reads_as_megatron_lm_would_run_it():
    doc, unread = _doc()
    m, lay, tr = doc["model"], doc["layout"], doc["training"]
    assert (m["layers"], m["hidden"], m["ffn_hidden"], m["heads"], m["kv_heads"]) == (80, 8192, 28672, 64, 8)
    assert m["gated_mlp"] and not m["tied_embeddings"] and m["norm"] == "rmsnorm" and not m["bias"]
    assert not m["dropout"] and "learned_positions" not in m
    assert m["vocab"] == 128512          # 128,256 padded to a multiple of 128 · tp 4 (vocab_utils.py)
    assert (lay["tp"], lay["cp"], lay["pp"], lay["dp"], lay["vpp"]) == (4, 2, 4, 2, 4)   # 80 / (4 · 5) = 4
    assert lay["schedule"] == "interleaved" and lay["cp_kind"] == "ring" and lay["sequence_parallel"]
    assert lay["zero"] == 1
    assert tr == {"seq_len": 8192, "micro_batch": 1, "global_batch": 128, "recompute": "selective",
                  "precision": "bf16", "cross_entropy": "mcore-fused", "grad_reduce": "fp32"}   # --bf16: fp32
    assert doc["settings"] == {"framework": "megatron-core",
                               "overlap": "grad_reduce=on,param_gather=on,tp_comm=on,p2p_async=on"}
    assert unread == ["--data-path", "--lr", "--nproc_per_node", "--tokenizer-type"]


def test_megatron_lms_defaults_where_a_flag_is_absent():
    """No --swiglu: a 4·h MLP; dropout 0.1; learned positions; tied embeddings; biases; plain data
    parallelism (ZeRO-0) without --use-distributed-optimizer; every overlap off but the pipeline's;
    no --global-batch-size: micro-batch × dp; --fp8-format alone: delayed scaling; with --swiglu and
    no --ffn-hidden-size, int(4·h·2/3 / 64)·64."""
    text = ("--num-layers 24 --hidden-size 2048 --num-attention-heads 16 --seq-length 2048 --max-position-embeddings 4096"
            " --micro-batch-size 4 --tensor-model-parallel-size 2 --bf16 --fp8-format hybrid --vocab-size 50257")
    doc, _ = run_document(text, gpu="h100", gpus=16)
    m = doc["model"]
    assert m["ffn_hidden"] == 8192 and m["dropout"] and m["learned_positions"] and m["max_seq"] == 4096
    assert m["tied_embeddings"] and m["bias"] and m["norm"] == "layernorm" and m["kv_heads"] == 16
    assert m["vocab"] == 50432            # 50,257 to a multiple of 256
    assert doc["layout"]["zero"] == 0 and doc["layout"]["sequence_parallel"] is False
    assert doc["training"]["global_batch"] == 4 * 8 and doc["training"]["fp8_recipe"] == "delayed"
    assert doc["settings"]["overlap"] == "grad_reduce=off,param_gather=off,tp_comm=off,p2p_async=on"
    doc, _ = run_document(text + " --swiglu", gpu="h100", gpus=16)
    assert doc["model"]["ffn_hidden"] == int(4 * 2048 * 2 / 3 / 64) * 64 == 5440


def test_flags_are_read_as_argparse_reads_them():
    flags = parse_flags("python x.py --a 1 --b=2 --c x y \\\n --a 3  # --d 4")
    assert flags == {"a": ["3"], "b": ["2"], "c": ["x", "y"]}


@pytest.mark.parametrize("extra, needle", [
    ("--tensor-model-parallel-size $TP", "--tensor-model-parallel-size: cannot read '$TP'"),
    ("--moe-layer-freq ([1]*3+[0])*20 --num-experts 8", "this pattern is not of that shape"),
    ("--moe-layer-freq [1]*79 --num-experts 8", "gives 79 layers, --num-layers 80"),
    ("--moe-layer-freq [1]*80] --num-experts 8", "unexpected ']'"),
    ("--moe-layer-freq eval('[1]*80') --num-experts 8", "unexpected 'e'"),
    ("--moe-layer-freq " + "(" * 30 + "[1]*80" + ")" * 30 + " --num-experts 8", "nested more than 20 deep"),
    ("--moe-layer-freq [1]*99999999999 --num-experts 8", "more than the 80 layers"),   # refused before it is built
    ("--pipeline-model-parallel-layout 't*99999999999'", "more than 1,000,000 characters"),   # likewise
    ("--pipeline-model-parallel-layout '" + "(" * 40 + "t|" + ")*2" * 40 + "'", "more than 1,000,000 characters"),
    ("--recompute-granularity full --recompute-method uniform --recompute-num-layers 2", "not modelled"),
    ("--recompute-granularity full", "needs --recompute-method"),
    ("--cp-comm-type ring2", "--cp-comm-type 'ring2'"),
    ("--cp-comm-type p2p a2a", "a form a layer"),
    ("--hierarchical-context-parallel-sizes 2 2 --cp-comm-type a2a+p2p", "not the context-parallel size 2"),
    ("--data-parallel-sharding-strategy everything --use-megatron-fsdp", "must be one of"),
    ("--sequence-parallel yes", "takes no value"),
])
def test_bad_arguments_are_one_line(extra, needle):
    with pytest.raises(ModelcutError, match=None) as e:
        _doc(LLAMA70 + " " + extra)
    assert needle in str(e.value) and "\n" not in str(e.value)


def test_what_the_arguments_lack_is_named(tmp_path, capsys):
    f = tmp_path / "launch.sh"
    f.write_text(LLAMA70.replace("--bf16", ""))
    assert main(["from-megatron", str(f), "--gpu", "h100", "--gpus", "64", "--vocab", "128256"]) == 2
    assert "neither --bf16 nor --fp16" in capsys.readouterr().err
    f.write_text(LLAMA70)
    assert main(["from-megatron", str(f), "--gpu", "h100", "--gpus", "64"]) == 2
    assert "give --vocab" in capsys.readouterr().err
    assert main(["from-megatron", str(f), "--gpu", "h100", "--gpus", "60", "--vocab", "128256"]) == 2
    assert "not a multiple of tp·cp·pp" in capsys.readouterr().err
    assert main(["from-megatron", str(f), "--gpu", "h100", "--gpus", "64", "--model", "llama3-8b"]) == 2
    assert "--num-layers 80 is not llama3-8b's 32" in capsys.readouterr().err
    assert main(["from-megatron", str(tmp_path / "none.sh"), "--gpu", "h100", "--gpus", "64"]) == 2
    assert "cannot read it" in capsys.readouterr().err


def test_the_cli_writes_a_run_file_predict_reads(tmp_path, capsys):
    f, out = tmp_path / "launch.sh", tmp_path / "run.toml"
    f.write_text(LLAMA70)
    assert main(["from-megatron", str(f), "--gpu", "h100", "--gpus", "64", "--model", "llama3-70b", "-o", str(out)]) == 0
    text = out.read_text()
    unread = text.splitlines()[1]
    assert text.startswith("# from the Megatron-LM arguments of") and unread.startswith("# flags not read: ")
    assert "--data-path" in unread and "--num-layers" in unread      # with --model, the shape flags too
    assert tomllib.loads(text)["model"] == {"name": "llama3-70b"}
    assert main(["predict", str(out), "--json"]) == 0
    pred = json.loads(capsys.readouterr().out)
    assert pred["layout"]["tp"] == 4 and pred["layout"]["vpp"] == 4 and pred["step_time_s"] > 0


def test_zero_0_is_plain_data_parallelism(tmp_path, capsys):
    """Without --use-distributed-optimizer Megatron-LM replicates the optimizer states: the run is
    timed and sized as ZeRO-0 under megatron-core, which runs it (no rule note), with more memory
    for the optimizer than with the flag."""
    peaks = {}
    for flag in ("", "--use-distributed-optimizer"):
        f, out = tmp_path / "launch.sh", tmp_path / "run.toml"
        f.write_text(LLAMA70.replace("--use-distributed-optimizer", flag).replace("--overlap-param-gather", ""))
        assert main(["from-megatron", str(f), "--gpu", "h100", "--gpus", "64", "--model", "llama3-70b",
                     "-o", str(out)]) == 0
        assert main(["predict", str(out), "--json"]) == 0
        pred = json.loads(capsys.readouterr().out)
        assert not any("stack rule" in n for n in pred["notes"])
        peaks[flag] = pred["memory"]["stages"][0]["optimizer_bytes"]
    assert peaks[""] == pytest.approx(4 * peaks["--use-distributed-optimizer"])     # replicated, not over dp·cp = 4


SEARCHES = [
    catalog_request("nemo2407-llama3-70b-64", top=3),
    ExploreRequest(model=catalog.model("llama3-8b"), hw=catalog.hardware("h100"), gpus=32, seq=131072,
                   global_batch_tokens=1 << 20, top=3),
    ExploreRequest(model=catalog.model("mixtral-8x7b"), hw=catalog.hardware("h100"), gpus=64, seq=4096,
                   global_batch_tokens=1 << 21, top=3, framework="nemo"),
]


@pytest.mark.parametrize("req", SEARCHES, ids=["llama3-70b-nemo-24.07-fp8", "llama3-8b-128k-cp", "mixtral-nemo"])
def test_emitted_arguments_read_back_to_the_same_prediction(req, tmp_path, capsys):
    """The round trip: a ranked layout's --emit megatron arguments, read back by from-megatron
    (the catalog model named, the stack the search ran on), predict to the step time the explorer
    gave it, to the last digit: layouts with interleaving, uneven splits (--pipeline-model-parallel-layout),
    context parallelism of each form (the hierarchical one too), experts, FP8, every ZeRO stage the
    stacks run, the overlaps and the loss kernel."""
    req = replace(req, space=replace(req.space, schedules=("1f1b", "interleaved")))
    res = run_explore(req)
    seen = res.exploration.layouts[::max(1, len(res.exploration.layouts) // 8)][:8]
    assert seen
    for e in seen:
        text = megatron_args(e, res.framework)
        got = assert_round_trip("from-megatron", text, req, res.framework, tmp_path, capsys)
        assert got == pytest.approx(e.step_time_s, rel=1e-9), text


def test_emitted_arguments_carry_the_stacks_overlaps():
    """megatron-core's preset overlaps the gradient reduction and (with the distributed optimizer)
    the weight gather; NeMo's also the tensor-parallel collectives; a stack that leaves an overlap
    off emits no flag for it, and without a pipeline no p2p flag."""
    res = run_explore(catalog_request("nemo2407-llama3-70b-64", top=1))
    e = res.layouts[0]
    args = megatron_args(e, res.framework).splitlines()
    assert {"--overlap-grad-reduce", "--overlap-param-gather"} <= set(args)
    assert ("--tp-comm-overlap" in args) == (e.structure.tp > 1)
    quiet = megatron_args(e, res.framework.with_overlap({"grad_reduce": False, "tp_comm": False})).splitlines()
    assert "--overlap-grad-reduce" not in quiet and "--tp-comm-overlap" not in quiet
    assert not any("overlap" in a for a in megatron_args(e).splitlines())       # no stack: no flags
    from modelcut.export.emit import nemo_overrides, torchtitan_toml
    nemo = nemo_overrides(e, res.framework).splitlines()
    assert "trainer.strategy.ddp.overlap_grad_reduce=true" in nemo and "model.config.cross_entropy_loss_fusion=true" in nemo
    titan = tomllib.loads(torchtitan_toml(e, res.framework))["parallelism"]
    assert titan.get("enable_async_tensor_parallel", False) == (e.structure.tp > 1)


def test_standard_input_and_unknown_names(monkeypatch, capsys):
    import io
    monkeypatch.setattr("sys.stdin", io.StringIO(LLAMA70))
    assert main(["from-megatron", "-", "--gpu", "h100", "--gpus", "64", "--vocab", "128256"]) == 0
    doc = tomllib.loads(capsys.readouterr().out)
    assert doc["model"]["name"] == "megatron-args" and doc["layout"]["tp"] == 4
    monkeypatch.setattr("sys.stdin", io.StringIO(LLAMA70))
    assert main(["from-megatron", "-", "--gpu", "a100x", "--gpus", "64"]) == 2
    assert "unknown GPU 'a100x'" in capsys.readouterr().err
    monkeypatch.setattr("sys.stdin", io.StringIO(LLAMA70))
    assert main(["from-megatron", "-", "--gpu", "h100", "--gpus", "64", "--vocab", "128256", "--framework", "nope"]) == 2
    assert "nope" in capsys.readouterr().err


SMALL_ARGS = "--num-layers 4 --hidden-size 256 --num-attention-heads 4 --seq-length 512 --micro-batch-size 1 --bf16"
FLAG_NAMES = ["num-layers", "hidden-size", "ffn-hidden-size", "num-attention-heads", "group-query-attention",
              "num-query-groups", "kv-channels", "swiglu", "seq-length", "micro-batch-size", "global-batch-size",
              "tensor-model-parallel-size", "pipeline-model-parallel-size", "context-parallel-size", "cp-comm-type",
              "hierarchical-context-parallel-sizes", "num-virtual-stages-per-pipeline-rank",
              "num-layers-per-virtual-pipeline-stage", "pipeline-model-parallel-layout", "expert-model-parallel-size",
              "expert-tensor-parallel-size", "num-experts", "moe-router-topk", "moe-ffn-hidden-size",
              "moe-layer-freq", "use-megatron-fsdp", "data-parallel-sharding-strategy",
              "num-distributed-optimizer-instances", "recompute-granularity", "recompute-method",
              "recompute-num-layers", "recompute-modules", "fp8-format", "fp8-recipe", "bf16", "fp16", "vocab-size",
              "sequence-parallel", "position-embedding-type", "max-position-embeddings", "attention-dropout",
              "multi-latent-attention", "q-lora-rank", "kv-lora-rank", "qk-head-dim", "v-head-dim",
              "use-precision-aware-optimizer", "exp-avg-dtype", "exp-avg-sq-dtype"]
VALUES = ["", "1", "2", "4", "8", "0", "-3", "2048", "10" * 12, "1e3", "abc", "$X", "nan", "p2p a2a", "E|t|L",
          "(t|)*3", "full", "block", "uniform", "selective", "hybrid", "mxfp8", "optim", "core_attn moe_act", "4 2",
          "bf16", "fp8", "([0]*3+[1])", "[1]*4", "[0,1]*2", "([1]*3+[0]", "[2]*4"]


@given(st.lists(st.tuples(st.sampled_from(FLAG_NAMES), st.sampled_from(VALUES)), max_size=14),
       st.sampled_from([1, 8, 64, 1000]), st.sampled_from([None, "gpt-1.7b"]))
@settings(max_examples=150, deadline=None)
def test_any_argument_list_reads_or_is_one_line(pairs, gpus, model):
    """Whatever the flags and values, the arguments read into a RUN.toml or stop at one line
    naming the problem (a ModelcutError), never another exception."""
    from modelcut.service.megatron_args import run_file_text
    text = SMALL_ARGS + " " + " ".join(f"--{k} {v}" for k, v in pairs)
    try:
        out = run_file_text(text, "fuzz.sh", gpu="h100", gpus=gpus, model=model, vocab=32000)
    except ModelcutError as exc:
        assert "\n" not in str(exc)
    else:
        assert tomllib.loads(out)["hardware"]["gpus"] == gpus


ARRAYS = (Path(__file__).parent / "data" / "llama3-8b-megatron-arrays.sh").read_text()


def test_a_script_of_bash_arrays_and_literal_variables_reads_as_written():
    """Megatron-LM's example scripts keep their flags in bash arrays, their sizes in variables and
    some flags in a conditional's quoted words: each read as the shell would hand them over."""
    doc, unread = run_document(ARRAYS, gpu="h100", gpus=64)
    m, lay, tr = doc["model"], doc["layout"], doc["training"]
    assert (m["layers"], m["hidden"], m["ffn_hidden"], m["kv_heads"], m["vocab"]) == (32, 4096, 14336, 8, 128256)
    assert (lay["tp"], lay["pp"], lay["dp"], lay["zero"]) == (2, 1, 32, 1) and lay["sequence_parallel"]
    assert "cp" not in lay or lay["cp"] == 1                      # the commented-out flag inside the array
    assert (tr["seq_len"], tr["micro_batch"], tr["global_batch"]) == (8192, 1, 128)     # $SEQ, ${SEQ}, $GBS
    assert (tr["precision"], tr["fp8_recipe"], tr["fp8_param_gather"], tr["grad_reduce"]) == ("fp8", "current", True,
                                                                                                "bf16")
    assert doc["settings"]["overlap"] == "grad_reduce=on,param_gather=on,tp_comm=off,p2p_async=on"   # TRAIN+=(DDP)
    # the launcher's flags, the data and checkpoint flags: listed, none of them a value of another flag
    assert unread == ["--data-path", "--load", "--mock-data", "--nnodes", "--nproc_per_node", "--save",
                      "--tokenizer-type"]


def test_shell_words_end_a_flags_values_and_a_variable_left_unset_is_one_line():
    flags = parse_flags('A=(--x 1 --y) B+=("--z 3" --w)\nC=("${A[@]}")\n'
                        'torchrun --q "E,t*10|(t*11|)*2t*10,L" --r 5)\nif [[ 1 ]]; then --s 2; fi')
    assert flags == {"x": ["1"], "y": [], "z": ["3"], "w": [], "q": ["E,t*10|(t*11|)*2t*10,L"], "r": ["5"],
                     "s": ["2"]}
    assert expand_literals('N=4\nM=${N}\nP=${Q:-7}\nW=$(($N*2))\n--a $M --b $P --c $W') \
        .splitlines()[-1] == "--a 4 --b 7 --c $W"      # arithmetic: left as written
    assert expand_literals("T=1\nT=$(nproc)\n--t $T\nU=$T\nT=2\n--t $T").splitlines()[2::3] == ["--t $T", "--t 2"]
    with pytest.raises(ModelcutError, match=r"cannot read '\$UNSET' .*expand the script's variables"):
        run_document(ARRAYS.replace("--tensor-model-parallel-size $TP", "--tensor-model-parallel-size $UNSET"),
                     gpu="h100", gpus=64)


def test_fp8_param_gather_is_read_and_keeps_the_weights_in_fp8(tmp_path, capsys):
    """--fp8-param-gather: the linear weights held in FP8 (and their transposes) in place of a bf16
    copy beside FP8 ones; absent, Megatron-LM's default, off."""
    def run(text):
        f = tmp_path / "a.sh"
        f.write_text(text)
        out = tmp_path / "run.toml"
        assert main(["from-megatron", str(f), "--gpu", "h100", "--gpus", "64", "-o", str(out)]) == 0
        assert main(["predict", str(out), "--json"]) == 0
        return json.loads(capsys.readouterr().out)
    on, off = run(ARRAYS), run(ARRAYS.replace('"--fp8-param-gather"', ""))
    assert on["memory"]["peak_bytes"] < off["memory"]["peak_bytes"]
    assert "fp8 weight and its fp8 transpose (FP8 parameters)" in on["memory"]["dtypes"]["weights_bytes"]
    assert "beside the bf16 copy" in off["memory"]["dtypes"]["fp8_weights_bytes"]


def test_latent_attention_and_bf16_moments_are_read_as_megatron_lm_runs_them():
    """--multi-latent-attention with DeepSeek-V3's widths reads as the catalog's deepseek-v3 attention
    (the equal-weight stand-in and the latent widths); --use-precision-aware-optimizer with both
    moments in bf16 keeps Adam's moments in bf16; a mixed or an unset switch is one line."""
    dsv3 = catalog.model("deepseek-v3")
    text = ("--num-layers 4 --hidden-size 7168 --num-attention-heads 128 --seq-length 4096 --micro-batch-size 1"
            " --bf16 --swiglu --multi-latent-attention --q-lora-rank 1536 --kv-lora-rank 512 --qk-head-dim 128"
            " --qk-pos-emb-head-dim 64 --v-head-dim 128 --vocab-size 129280 --use-precision-aware-optimizer"
            " --exp-avg-dtype bf16 --exp-avg-sq-dtype bf16")
    doc, unread = run_document(text, gpu="h100", gpus=8)
    m = doc["model"]
    got = tuple(m[k] for k in ("kv_heads", "head_dim", "q_lora_rank", "kv_lora_rank", "qk_nope_head_dim",
                               "qk_rope_head_dim", "v_head_dim"))
    assert got == (dsv3.kv_heads, dsv3.head_dim, 1536, 512, 128, 64, 128)
    assert doc["training"]["adam_moments"] == "bf16" and unread == []
    with pytest.raises(ModelcutError, match="moments in bf16 and fp32: modelcut keeps both in fp32 or both in bf16"):
        run_document(text + " --exp-avg-dtype fp32", gpu="h100", gpus=8)
    with pytest.raises(ModelcutError, match="need --use-precision-aware-optimizer"):
        run_document(text.replace(" --use-precision-aware-optimizer", ""), gpu="h100", gpus=8)


@pytest.mark.parametrize("freq, dense, every", [
    ("'([0]*3+[1]*58)'", 3, 1),          # DeepSeek-V3's: three dense layers, then experts in every one
    ("([1]*61)", 0, 1),
    ("[0,1]*30+[0]", 0, 2),              # experts in the odd layers
    ("[0]*2+([0]*2+[1])*19+[0,0]", 2, 3),
])
def test_a_layer_pattern_reads_as_leading_dense_layers_then_every_kth(freq, dense, every):
    """--moe-layer-freq as Megatron-LM takes a Python list expression (1 a layer with experts, 0 a
    dense one), read without evaluating it: its leading dense layers, then every k-th layer."""
    text = ("--num-layers 61 --hidden-size 1024 --num-attention-heads 8 --seq-length 4096 --micro-batch-size 1"
            f" --bf16 --swiglu --vocab-size 32000 --num-experts 16 --moe-router-topk 2 --moe-layer-freq {freq}")
    m = run_document(text, gpu="h100", gpus=8)[0]["model"]
    assert (m.get("dense_layers", 0), m.get("moe_every", 1)) == (dense, every)


@given(st.integers(0, 6), st.integers(1, 5), st.integers(1, 40))
@settings(max_examples=200, deadline=None)
def test_any_representable_layer_pattern_reads_back_to_itself(d, k, n):
    """For d dense layers then every k-th of n more, the pair read back regenerates the same layers
    (a pattern with a single expert layer has several such pairs: any one will do)."""
    from modelcut.service.megatron_args import moe_pattern
    layers = [1 if i >= d and (i - d + 1) % k == 0 else 0 for i in range(d + n)]
    if not any(layers):
        return
    d2, k2 = moe_pattern("[" + ",".join(map(str, layers)) + "]", len(layers))
    assert layers == [1 if i >= d2 and (i - d2 + 1) % k2 == 0 else 0 for i in range(len(layers))]


def test_a_pattern_as_long_as_the_layer_cap_is_read_or_refused_at_once():
    """Two expert layers give d and k, so a pattern is checked once, not once a candidate: a
    100,000-layer pattern (the cap on layers) whose first expert layer is its last but two took
    minutes to refuse when every leading-dense count was tried."""
    from modelcut.service.megatron_args import moe_pattern
    assert moe_pattern("[0]*99997+[1,0,1]", 100_000) == (99_996, 2)
    with pytest.raises(ModelcutError, match="not of that shape"):
        moe_pattern("[0]*99996+[1,1,0,1]", 100_000)


def test_latent_attention_without_a_query_latent_writes_a_run_file(tmp_path, capsys):
    """Megatron-LM's MLA defaults (no query latent: --q-lora-rank unset) write a RUN.toml that reads back."""
    from modelcut.service.megatron_args import run_file_text
    text = SMALL_ARGS + " --multi-latent-attention --swiglu"
    doc = tomllib.loads(run_file_text(text, "mla.sh", gpu="h100", gpus=8, vocab=32000))
    assert "q_lora_rank" not in doc["model"] and doc["model"]["kv_lora_rank"] == 32


def test_bf16_moments_round_trip_and_the_fp8_swiglu_input_is_a_note(tmp_path, capsys):
    """A search with Adam's moments in bf16 emits the precision-aware optimizer's flags, which read back
    to the same prediction; the SwiGLU's FP8 input, a TransformerConfig field with no Megatron-LM flag,
    is a note."""
    req = ExploreRequest(model=catalog.model("llama3-8b"), hw=catalog.hardware("h100"), gpus=8, seq=4096,
                         global_batch_tokens=1 << 19, top=2, framework="megatron-core")
    req = replace(req, space=replace(req.space, adam_moments="bf16"))
    res = run_explore(req)
    e = res.layouts[0]
    assert e.run.training.adam_moments == "bf16"
    text = megatron_args(e, res.framework)
    assert {"--use-precision-aware-optimizer", "--exp-avg-dtype bf16", "--exp-avg-sq-dtype bf16"} <= set(text.splitlines())
    got = assert_round_trip("from-megatron", text, req, res.framework, tmp_path, capsys)
    assert got == pytest.approx(e.step_time_s, rel=1e-9)
    stored = run_explore(replace(req, space=replace(req.space, act_fp8_input=True)))
    assert stored.layouts[0].run.training.activation_func_fp8_input_store
    assert any(ln.startswith("# the SwiGLU's input kept in FP8") for ln in megatron_args(stored.layouts[0]).splitlines())


def test_a_bad_latent_width_names_megatron_lms_flag():
    """The one-line error names the flag as Megatron-LM spells it (--qk-pos-emb-head-dim), not the field."""
    with pytest.raises(ModelcutError, match="^--qk-pos-emb-head-dim must be a positive whole number, got 0$"):
        run_document(SMALL_ARGS + " --multi-latent-attention --qk-pos-emb-head-dim 0", gpu="h100", gpus=8, vocab=32000)


def test_overlap_flags_not_modelled_go_into_the_overlap_settings(tmp_path, capsys):
    """Megatron-LM's overlap flags modelcut knows but does not model are read into the run file's
    overlap settings as given (not listed as not read), and predict notes each that asks for what it
    does not time; the step is the one without them."""
    extra = " --defer-embedding-wgrad-compute --wgrad-deferral-limit 22 --align-param-gather"
    doc, unread = _doc(LLAMA70 + extra)
    plain, _ = _doc()
    assert not {"--defer-embedding-wgrad-compute", "--wgrad-deferral-limit", "--align-param-gather"} & set(unread)
    ov = doc["settings"]["overlap"]
    assert ov == plain["settings"]["overlap"] + ",--defer-embedding-wgrad-compute,--wgrad-deferral-limit=22" \
                                                ",--align-param-gather"
    steps, notes = [], []
    for text in (LLAMA70, LLAMA70 + extra):
        f, out = tmp_path / "launch.sh", tmp_path / "run.toml"
        f.write_text(text)
        assert main(["from-megatron", str(f), "--gpu", "h100", "--gpus", "64", "--vocab", "128256", "-o", str(out)]) == 0
        assert main(["predict", str(out), "--json"]) == 0
        pred = json.loads(capsys.readouterr().out)
        steps.append(pred["step_time_s"])
        notes.append([n for n in pred["notes"] if "not modelled" in n])
    assert steps[0] == steps[1]
    assert notes[0] == [] and [n.split(":")[0] for n in notes[1]] == ["--defer-embedding-wgrad-compute",
                                                                       "--align-param-gather"]
