"""Full recomputation of every k-th layer (torchtitan's per-layer selective checkpointing,
``selective_ac_option = "k"``; ``Training.recompute_every``): each rank counts the blocks it holds
from 1 in order and recomputes block n when n % k == 0. Time, memory and FLOPs sit between none and
full, k = 1 is full; the plan is the one rule; what cannot take it is refused in one line."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given, settings, strategies as st

from modelcut import catalog
from modelcut.core.costs.kernels import Efficiency
from modelcut.core.errors import ModelcutError
from modelcut.core.memory import memory_report
from modelcut.core.plan import resolve
from modelcut.core.specs import Layout, Run, Training
from modelcut.core.step import default
from modelcut.core.step import predict as step_predict

H100 = catalog.hardware("h100")
EFF = Efficiency(0.86, 0.81, 1.0)
LLAMA8 = catalog.model("llama3-8b")
MIXTRAL = catalog.model("mixtral-8x7b")
FSDP = catalog.framework("fsdp-compile")


def _run(model=LLAMA8, recompute="full", k=None, pp=1, dp=8, vpp=None, zero=3, seq=4096, batch=16) -> Run:
    return Run(model, "h100", Layout(pp=pp, dp=dp, vpp=vpp, zero=zero),
               Training(seq_len=seq, global_batch=batch, recompute=recompute, recompute_every=k), gpus_per_node=8)


def _torchtitan_count(plan, k: int) -> dict[int, set[int]]:
    """The layers torchtitan checkpoints on each device: its blocks in stage order, counted from 1,
    block n checkpointed when n % k == 0 (activation_checkpoint.py _apply_layer_sac)."""
    out: dict[int, set[int]] = {}
    for d in range(plan.p):
        n = 0
        for stage in plan.on_device(d):
            for layer in range(stage.first_layer, stage.first_layer + stage.layers):
                n += 1
                if n % k == 0:
                    out.setdefault(d, set()).add(layer)
    return out


@settings(max_examples=60, deadline=None)
@given(k=st.integers(1, 40), pp=st.sampled_from([1, 2, 4]), v=st.sampled_from([1, 2]))
def test_the_plan_recomputes_what_torchtitan_checkpoints(k, pp, v):
    v = v if pp > 1 else 1
    tr = Training(seq_len=4096, global_batch=16, recompute="full", recompute_every=k)
    lay = Layout(pp=pp, dp=1, vpp=v)
    plan = resolve(LLAMA8, lay, tr, v=v, schedule="interleaved" if v > 1 else None)
    want = _torchtitan_count(plan, k)
    for d in range(plan.p):
        got = {i for s in plan.on_device(d) for i in range(s.first_layer, s.first_layer + s.layers)
               if s.recomputes(tr, i)}
        assert got == want.get(d, set())
        assert sum(sum(s.recomputed(LLAMA8, tr)) for s in plan.on_device(d)) == len(got)


def test_moe_layers_are_counted_where_they_fall():
    dsv3 = catalog.model("deepseek-v3")            # three dense layers first
    tr = Training(seq_len=4096, global_batch=16, recompute="full", recompute_every=2)
    plan = resolve(dsv3, Layout(pp=1, dp=1), tr, v=1)
    dense, moe = plan.stages[0].recomputed(dsv3, tr)
    assert (dense, moe) == (1, dsv3.layers // 2 - 1)     # layer 2 of the first three is dense; 4, 6, ... MoE


def test_between_none_and_full_and_k_1_is_full():
    steps = {}
    for name, rc, k in (("none", "none", None), ("every2", "full", 2), ("every4", "full", 4), ("full", "full", None),
                        ("every1", "full", 1)):
        run = _run(recompute=rc, k=k)
        p = default.predict(run, H100, EFF, FSDP)
        steps[name] = (p.step_time_s, memory_report(run, H100, framework=FSDP)["peak_bytes"], p.flops_per_step)
    for i in (0, 2):        # time and the FLOPs counted grow with what is recomputed, memory shrinks
        assert steps["none"][i] < steps["every4"][i] < steps["every2"][i] < steps["full"][i]
    assert steps["none"][1] > steps["every4"][1] > steps["every2"][1] > steps["full"][1]
    for i in range(3):
        assert steps["every1"][i] == pytest.approx(steps["full"][i])


def test_the_stacks_that_run_it():
    from modelcut.service.predict import PredictRequest, predict
    run = _run(k=2)
    notes = predict(PredictRequest(run=run, framework="fsdp-compile")).prediction.notes
    assert any("one layer in 2" in n for n in notes) and not any(n.startswith("stack rule") for n in notes)
    notes = predict(PredictRequest(run=replace(run, layout=Layout(dp=8, zero=1)), framework="megatron-core")
                    ).prediction.notes
    assert any("every recomputation" in n for n in notes)


@pytest.mark.parametrize("kw, says", [
    (dict(recompute="selective", recompute_every=2), 'needs recompute = "full"'),
    (dict(recompute="full", recompute_every=2, recompute_layers=3), "two rules"),
    (dict(recompute="full", recompute_every=0), "at least 1"),
    (dict(recompute="full", recompute_every=True), "at least 1"),
])
def test_bad_values_are_refused(kw, says):
    with pytest.raises(ModelcutError, match=says):
        Training(seq_len=4096, global_batch=16, **kw)


def test_runs_that_cannot_take_it_are_one_line(tmp_path, capsys):
    from modelcut.cli import main
    body = """[model]\nname = "llama3-8b"\n[hardware]\ngpu = "h100"\ngpus = 8\n[layout]\ndp = 8\n
[training]\nseq_len = 4096\nglobal_batch = 8\nrecompute = "full"\nrecompute_every = {k}\n"""
    f = tmp_path / "run.toml"
    for k, extra, says in ((40, [], "exceeds the model's layers"), (2, ["--mode", "seed"], "seed model"),
                           (2, ["--framework", "deepspeed-zero3"], "DeepSpeed v0.3")):
        f.write_text(body.format(k=k))
        assert main(["predict", str(f), *extra]) == 2
        err = capsys.readouterr().err
        assert err.count("\n") == 1 and says in err, err
    f.write_text(body.format(k=2))
    assert main(["predict", str(f), "--framework", "torchtitan", "--json"]) == 0
    capsys.readouterr()


def test_the_api_takes_it():
    from fastapi.testclient import TestClient
    from modelcut.web.app import create_app
    with TestClient(create_app()) as client:
        r = client.post("/api/predict", json={
            "model": "llama3-8b", "gpu": "h100", "framework": "fsdp-compile", "layout": {"dp": 8, "zero": 3},
            "training": {"seq_len": 4096, "global_batch": 8, "recompute": "full", "recompute_every": 2}})
    assert r.status_code == 200, r.text
    assert any("one layer in 2" in n for n in r.json()["notes"])


def test_a_runs_csv_row_names_it(tmp_path):
    from modelcut.service.runs_csv import read_runs_csv
    csv = tmp_path / "r.csv"
    csv.write_text("id,model,gpu,tp,pp,dp,seq_len,global_batch,micro_batch,recompute,recompute_every,step_time_s\n"
                   "a,llama3-8b,h100,1,1,8,4096,8,1,full,2,1.0\n")
    assert read_runs_csv(csv)[0].run.training.recompute_every == 2
