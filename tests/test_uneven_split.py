"""An uneven pipeline split given with the layout (Megatron-LM's --decoder-first/last-pipeline-num-layers):
the time model, the memory model and from-megatron read the same split; bad values are one line."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from fastapi.testclient import TestClient
from hypothesis import given, settings, strategies as st

from modelcut import catalog
from modelcut.cli import main
from modelcut.core.errors import ModelcutError
from modelcut.core.memory import stage_memory
from modelcut.core.plan import first_last_split
from modelcut.core.specs import Layout, Run, Training
from modelcut.service.megatron_args import _layout_split, run_document
from modelcut.service.predict import PredictRequest, predict
from modelcut.web import app as webapp

# Nemotron-3 22B (40 layers, a 256,000-token vocabulary) on 64 H100, tp 2 · pp 4 · dp 8: the last rank
# holds the output layer and the loss, several layers' work at this vocabulary.
MODEL = catalog.model("nemotron3-22b")


def _run(pp: int = 4, vpp: int = 1, **ends) -> Run:
    lay = Layout(tp=2, pp=pp, dp=64 // (2 * pp), vpp=vpp, schedule="interleaved" if vpp > 1 else "1f1b", **ends)
    return Run(MODEL, "h100", lay, Training(seq_len=4096, global_batch=256, micro_batch=1))


def _predict(run: Run):
    return predict(PredictRequest(run=run, framework="megatron-core"))


def test_the_split_is_the_layouts_in_time_and_memory():
    even = _predict(_run())
    assert even.prediction.stage_layers == (10, 10, 10, 10)
    light = _predict(_run(last_layers=7))
    assert light.prediction.stage_layers == (11, 11, 11, 7) == first_last_split(40, 4, 1, None, 7)
    mem = light.memory["stages"]
    assert [s["layers"] for s in mem] == [11, 11, 11, 7]
    assert [s.layers for s in stage_memory(_run(last_layers=7))] == [11, 11, 11, 7]   # without a prediction's plan
    # the last rank's output layer outweighs three layers here: moving them off it shortens the step
    assert light.prediction.step_time_s < 0.9 * even.prediction.step_time_s
    both = _predict(_run(first_layers=11, last_layers=7))
    assert both.prediction.step_time_s == light.prediction.step_time_s


def test_with_interleaving_each_end_rank_shares_its_layers_over_its_chunks():
    # the ranks hold 12, 11, 11, 6 layers; each middle rank's 11 cannot halve
    with pytest.raises(ModelcutError, match="do not divide into 2 chunks"):
        _predict(_run(vpp=2, first_layers=12, last_layers=6))
    res = _predict(_run(vpp=2, first_layers=12, last_layers=4))
    # ranks 12, 12, 12, 4 in two chunks each: stage c·p + r is chunk c of rank r
    assert res.prediction.stage_layers == (6, 6, 6, 2, 6, 6, 6, 2)
    with pytest.raises(ModelcutError, match="do not divide into 2 chunks"):
        _predict(_run(vpp=2, first_layers=11, last_layers=7))


@pytest.mark.parametrize("ends, words", [
    ({"last_layers": 41}, "exceed the model's 40 layers"),
    ({"first_layers": 3}, "do not divide evenly"),
    ({"first_layers": 11, "last_layers": 8}, "cannot be split"),
])
def test_a_split_that_cannot_be_is_one_line(ends, words):
    with pytest.raises(ModelcutError, match=words):
        _predict(_run(**ends))


@pytest.mark.parametrize("ends, words", [
    ({"last_layers": 0}, "1 or more"), ({"first_layers": True}, "1 or more"), ({"last_layers": 2.5}, "1 or more"),
])
def test_bad_values_are_refused_by_the_layout(ends, words):
    with pytest.raises(ModelcutError, match=words):
        Layout(tp=2, pp=4, dp=8, **ends)
    with pytest.raises(ModelcutError, match="pp of 2 or more"):
        Layout(tp=2, pp=1, dp=32, last_layers=3)


def test_run_toml_and_the_api_take_it(tmp_path, capsys):
    text = ('[model]\nname = "nemotron3-22b"\n[hardware]\ngpu = "h100"\ngpus = 64\n'
            '[layout]\ntp = 2\npp = 4\ndp = 8\nlast_layers = 7\n'
            '[training]\nseq_len = 4096\nglobal_batch = 256\nmicro_batch = 1\n'
            '[settings]\nframework = "megatron-core"\n')
    f = tmp_path / "run.toml"
    f.write_text(text)
    assert main(["predict", str(f), "--json"]) == 0
    cli = json.loads(capsys.readouterr().out)
    assert cli["stage_layers"] == [11, 11, 11, 7]
    assert cli["step_time_s"] == pytest.approx(_predict(_run(last_layers=7)).prediction.step_time_s, rel=1e-12)
    f.write_text(text.replace("last_layers = 7", "last_layers = 0"))
    assert main(["predict", str(f)]) == 2
    assert "last_layers" in capsys.readouterr().err
    body = {"model": "nemotron3-22b", "gpu": "h100", "framework": "megatron-core",
            "layout": {"tp": 2, "pp": 4, "dp": 8, "last_layers": 7},
            "training": {"seq_len": 4096, "global_batch": 256, "micro_batch": 1}}
    with TestClient(webapp.create_app()) as client:
        r = client.post("/api/predict", json=body)
        assert r.status_code == 200, r.text
        assert r.json()["step_time_s"] == cli["step_time_s"]
        r = client.post("/api/predict", json={**body, "layout": {**body["layout"], "last_layers": 41}})
        assert r.status_code == 422 and "exceed" in r.json()["detail"]


def test_from_megatron_reads_the_flags():
    base = ("--num-layers 40 --hidden-size 6144 --num-attention-heads 48 --seq-length 4096 --micro-batch-size 1 "
            "--global-batch-size 256 --tensor-model-parallel-size 2 --pipeline-model-parallel-size 4 --bf16 "
            "--vocab-size 256000")
    doc, unread = run_document(base + " --decoder-last-pipeline-num-layers 7", gpu="h100", gpus=64)
    assert doc["layout"]["last_layers"] == 7 and "first_layers" not in doc["layout"] and not unread
    doc, _ = run_document(base + " --decoder-first-pipeline-num-layers 11 --decoder-last-pipeline-num-layers 7",
                          gpu="h100", gpus=64)
    assert (doc["layout"]["first_layers"], doc["layout"]["last_layers"]) == (11, 7)
    for layout in ("E,t*10|t*10|t*10|t*10,L", "Et*11|t*11|t*11|t*7L"):     # even or not, the pair is refused
        with pytest.raises(ModelcutError, match="refuses the two together"):
            run_document(base + f' --decoder-last-pipeline-num-layers 7 --pipeline-model-parallel-layout "{layout}"',
                         gpu="h100", gpus=64)


@settings(max_examples=25, deadline=None)
@given(st.sampled_from([2, 4, 8]), st.sampled_from([1, 2]), st.integers(1, 6), st.integers(1, 6))
def test_memory_and_time_read_one_split(pp, vpp, first_chunk, last_chunk):
    """Wherever the split can be (Megatron-LM's rules), the time model's stages and the memory model's
    ranks hold the same layers, the ends as given, the total the model's."""
    first, last = first_chunk * vpp, last_chunk * vpp
    run = replace(_run(pp=pp, vpp=vpp), layout=replace(_run(pp=pp, vpp=vpp).layout, first_layers=first,
                                                         last_layers=last))
    try:
        split = first_last_split(40, pp, vpp, first, last)
    except ModelcutError:
        with pytest.raises(ModelcutError):
            _predict(run)
        return
    pred = _predict(run).prediction
    assert pred.stage_layers == split and sum(split) == 40
    per_rank = [sum(split[r::pp]) for r in range(pp)]
    assert per_rank[0] == first and per_rank[-1] == last
    assert [s.layers for s in stage_memory(run, plan=pred.plan)] == per_rank


# ---------------------------------------------------------------- the explorer's lighter last rank

from modelcut.core.explore.rules import violations  # noqa: E402
from modelcut.core.explore.space import Space, structures  # noqa: E402
from modelcut.core.plan import even_split, lighter_last  # noqa: E402
from modelcut.core.costs import flops  # noqa: E402
from modelcut.export.emit import megatron_args, nemo_overrides  # noqa: E402
from modelcut.service.explore import ExploreRequest, run_explore  # noqa: E402

from helpers import assert_round_trip  # noqa: E402


@settings(max_examples=60, deadline=None)
@given(st.sampled_from(["nemotron3-22b", "llama3-8b", "llama3-70b", "gpt-oss-120b", "gpt3-175b", "mpt-7b"]),
       st.sampled_from([2, 3, 4, 8]), st.sampled_from([1, 2, 4]), st.sampled_from([2048, 4096, 8192]))
def test_a_lighter_last_rank_is_a_split_megatron_runs_and_lighter_than_the_even_one(name, p, v, seq):
    model = catalog.model(name)
    if p * v > model.layers:
        return
    n = lighter_last(model, p, v, seq)
    if n is None:
        return
    split = first_last_split(model.layers, p, v, None, n)     # Megatron-core's rules hold
    L, O = flops.layer_and_output_flops_per_token(model, seq)
    def busiest(s):
        ranks = [sum(s[r::p]) for r in range(p)]
        return max(max(ranks[:-1]) * L, ranks[-1] * L + O)
    assert busiest(split) < busiest(even_split(model.layers, p * v))
    assert sum(split[p - 1::p]) == n < sum(even_split(model.layers, p * v)[p - 1::p])


def test_the_space_offers_it_only_where_asked_and_with_a_pipeline():
    args = (MODEL, 64, 4096, 256, 8)
    plain = list(structures(*args, Space(schedules=("1f1b",))))
    uneven = list(structures(*args, Space(schedules=("1f1b",), uneven_split=True)))
    assert all(s.last_layers is None for s in plain)
    extra = [s for s in uneven if s.last_layers is not None]
    assert extra and all(s.pp > 1 for s in extra)
    assert {replace(s, last_layers=None) for s in extra} <= set(plain)
    assert len(uneven) == len(plain) + len(extra)
    four = {s.last_layers for s in extra if s.pp == 4}
    assert four == {7}


def test_the_explorer_balances_the_last_rank_on_a_stack_that_takes_it():
    req = ExploreRequest(model=MODEL, hw=catalog.hardware("h100"), gpus=64, seq=4096, global_batch_tokens=1 << 20,
                         framework="megatron-core", check={"tp": 2, "cp": 1, "pp": 4, "dp": 8}, top=3)
    res = run_explore(req)
    best_pp4 = res.checked[0] if res.checked else None
    assert best_pp4 is not None and best_pp4.structure.last_layers == 7
    even = run_explore(replace(req, check={**req.check, "micro_batch": best_pp4.structure.micro_batch},
                               space=replace(req.space, uneven_split=False)))
    assert best_pp4.step_time_s < even.checked[0].step_time_s
    assert res.check_answer()["why"]["knobs"]["last_layers"] == ["even", 7]   # the best has no pipeline
    # NeMo 24.07 (Megatron-core 0.8) has no uneven split, nor does the seed model search one
    for fw, mode in (("nemo-24.07", "default"), (None, "seed")):
        other = run_explore(replace(req, framework=fw, mode=mode, check=None))
        assert other.layouts and all(e.structure.last_layers is None for e in other.layouts)


def test_a_stack_without_it_names_the_rule():
    caps = catalog.capabilities("nemo-24.07")
    bad = violations(caps, MODEL, tp=2, pp=4, dp=8, last_layers=7)
    assert [v.rule for v in bad] == ["uneven_split"] and "7 layers on the last rank" in bad[0].line()
    run = replace(_run(first_layers=11, last_layers=7), training=Training(seq_len=4096, global_batch=256))
    notes = predict(PredictRequest(run=run, framework="nemo-24.07")).prediction.notes
    assert any("uneven_split" in n and "11 layers on the first rank, 7 layers on the last rank" in n for n in notes)
    assert not any("uneven_split" in n for n in _predict(_run(last_layers=7)).prediction.notes)
    assert not violations(catalog.capabilities("megatron-core"), MODEL, tp=2, pp=4, dp=8, last_layers=7)


def test_its_launch_settings_read_back_to_the_same_prediction(tmp_path, capsys):
    req = ExploreRequest(model=MODEL, hw=catalog.hardware("h100"), gpus=64, seq=4096, global_batch_tokens=1 << 20,
                         framework="megatron-core", check={"tp": 2, "pp": 4, "dp": 8, "last_layers": 7}, top=3)
    res = run_explore(req)
    e = res.checked[0]
    text = megatron_args(e, res.framework)
    assert "--decoder-last-pipeline-num-layers 7" in text and "pipeline-model-parallel-layout" not in text
    assert assert_round_trip("from-megatron", text, req, res.framework, tmp_path, capsys) == \
        pytest.approx(e.step_time_s, rel=1e-9)
    assert "model.config.num_layers_in_last_pipeline_stage=7" in nemo_overrides(e, res.framework).splitlines()


@pytest.mark.parametrize("layout, ends", [
    ("E,t*10|t*10|t*10|t*10,L", {}),                                  # the even split
    ("Et*11|t*11|t*11|t*7L", {"last_layers": 7}),
    ("Et*8|(t*11|)*2t*10,L", {"first_layers": 8, "last_layers": 10}),
    ("E(t*2|)*4(t*3|)*4(t*3|)*4,(t*2|)*3t*2L", {}),    # v = 4: the even split of 40 over 16, lighter at the ends
])
def test_from_megatron_reads_a_layout_string_stage_by_stage(layout, ends):
    base = ("--num-layers 40 --hidden-size 6144 --num-attention-heads 48 --seq-length 4096 --micro-batch-size 1 "
            "--global-batch-size 256 --tensor-model-parallel-size 2 --pipeline-model-parallel-size 4 --bf16 "
            "--vocab-size 256000")
    doc, _ = run_document(base + f' --pipeline-model-parallel-layout "{layout}"', gpu="h100", gpus=64)
    got = {k: doc["layout"][k] for k in ("first_layers", "last_layers") if k in doc["layout"]}
    assert got == ends
    v = doc["layout"].get("vpp", 1)
    run = Run(MODEL, "h100", Layout(tp=2, pp=4, dp=8, vpp=v, schedule="interleaved" if v > 1 else "1f1b", **ends),
              Training(seq_len=4096, global_batch=256))
    assert _predict(run).prediction.stage_layers == _layout_split(layout, 4)     # the string's own split, timed


@pytest.mark.parametrize("layout, words", [
    ("Et*12|t*11|t*10|t*7,L", "not [12, 11, 10, 7]"),
    ("Et*10|t*10|t*10|t*9", "holds 39 transformer layers, the model 40"),
    ("Ex|t|t|t", "'x' is no layer type"),
    ("Et*10|t*10|t*10", "not a multiple of pp"),
])
def test_a_layout_string_modelcut_cannot_time_is_one_line(layout, words):
    base = ("--num-layers 40 --hidden-size 6144 --num-attention-heads 48 --seq-length 4096 --micro-batch-size 1 "
            "--global-batch-size 256 --tensor-model-parallel-size 2 --pipeline-model-parallel-size 4 --bf16 "
            "--vocab-size 256000")
    with pytest.raises(ModelcutError, match=words.replace("[", r"\[").replace("]", r"\]")):
        run_document(base + f' --pipeline-model-parallel-layout "{layout}"', gpu="h100", gpus=64)


def test_torchtitan_stacks_take_it_and_read_it_back(tmp_path, capsys):
    """On fsdp-compile (torchtitan) the explorer offers a lighter last rank too; its --emit torchtitan
    names each stage's modules (module_fqns_per_model_part), which from-torchtitan reads back to the
    same split and step time; a split that is neither even nor end-rank is one line."""
    from modelcut.export.emit import torchtitan_toml
    from modelcut.service.torchtitan_config import run_file_text as titan_text
    model = catalog.model("llama3-8b")
    req = ExploreRequest(model=model, hw=catalog.hardware("h100"), gpus=32, seq=8192, global_batch_tokens=1 << 20,
                         framework="fsdp-compile", check={"pp": 4, "last_layers": 5}, top=3)
    res = run_explore(req)
    e = res.checked[0]
    assert e.structure.last_layers == 5 and e.prediction.stage_layers[-1] == 5
    text = torchtitan_toml(e, res.framework)
    assert assert_round_trip("from-torchtitan", text, req, res.framework, tmp_path, capsys) == \
        pytest.approx(e.step_time_s, rel=1e-9)
    bad = text.replace('"layers.0", ', "", 1)          # a block fewer on the first stage
    with pytest.raises(ModelcutError, match="holds 31 transformer layers, the model 32"):
        titan_text(bad, "job.toml", gpu="h100", gpus=32, model="llama3-8b")


@pytest.mark.parametrize("name, p, tp, seq, fw, gpus", [
    ("llama3-8b", 4, 2, 8192, "megatron-core", 32), ("gpt-oss-120b", 4, 1, 4096, "megatron-bridge", 64),
    ("nemotron4-340b", 8, 8, 4096, "megatron-core", 256), ("qwen2.5-7b", 4, 1, 4096, "fsdp-compile", 16),
])
def test_the_flops_choice_is_the_time_models_fastest_nearby(name, p, tp, seq, fw, gpus):
    """The lighter last rank chosen by FLOPs is faster, in the time model, than the splits a step
    lighter and a step heavier on the last rank (the next counts Megatron-core's rules allow)."""
    model = catalog.model(name)
    n = lighter_last(model, p, 1, seq)
    assert n is not None
    dp = gpus // (tp * p)

    def step(last: int) -> float:
        lay = Layout(tp=tp, pp=p, dp=dp, last_layers=last, ep=8 if model.is_moe else 1)
        return _predict_on(Run(model, "h100", lay, Training(seq_len=seq, global_batch=dp * 16)), fw)

    near = [k for k in (n - (p - 1), n + (p - 1)) if 1 <= k < model.layers]
    assert near and all(step(n) < step(k) for k in near)


def _predict_on(run: Run, fw: str) -> float:
    return predict(PredictRequest(run=run, framework=fw)).prediction.step_time_s
