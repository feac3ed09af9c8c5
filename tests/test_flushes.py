"""Several pipeline schedule runs a step (a local batch: torch.distributed.pipelining's stacks run
their schedule once per local batch and accumulate gradients over the runs), and the stage
reductions that hold the compute stream after each run (modelcut.core.plan.flushes,
modelcut.core.step.data_parallel.blocking_stage_reduce)."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given, settings, strategies as st

from modelcut import catalog
from modelcut.core import plan as plans
from modelcut.core.costs.kernels import Efficiency
from modelcut.core.errors import ModelcutError
from modelcut.core.memory import memory_report
from modelcut.core.specs import Layout, Run, Training
from modelcut.core.step import default
from modelcut.core.step.data_parallel import blocking_stage_reduce

EFF = Efficiency(0.8, 0.8, 0.9)
H100 = catalog.hardware("h100")
LLAMA8 = catalog.model("llama3-8b")
AUTOMODEL = catalog.framework("nemo-automodel")
MCORE = catalog.framework("megatron-core")


def run(local_batch=None, pp=4, dp=4, gb=64, mb=1, zero=3, v=None) -> Run:
    return Run(LLAMA8, H100.name, Layout(tp=1, pp=pp, dp=dp, zero=zero, vpp=v),
               Training(seq_len=4096, global_batch=gb, micro_batch=mb, local_batch=local_batch))


def test_flushes_and_the_batch_of_one():
    assert plans.flushes(run().layout, run().training) == 1
    r = run(local_batch=4)                       # 64 sequences over dp 4: 16 each, 4 runs of 4
    assert plans.flushes(r.layout, r.training) == 4
    one = plans.flush_training(r.layout, r.training)
    assert (one.global_batch, one.local_batch, one.micro_batch) == (16, None, 1)
    assert plans.flushes(r.layout, one) == 1
    flat = run(local_batch=4, pp=1, dp=16)       # no pipeline: every micro-batch is its own pass anyway
    assert plans.flushes(flat.layout, flat.training) == 1


def test_bad_local_batches_are_one_line():
    with pytest.raises(ModelcutError, match="multiple of micro_batch"):
        Training(seq_len=128, global_batch=64, micro_batch=4, local_batch=6)
    with pytest.raises(ModelcutError, match="local_batch must be at least 1"):
        Training(seq_len=128, global_batch=64, local_batch=0)
    r = run(local_batch=3)
    with pytest.raises(ModelcutError, match="dp × local_batch"):
        plans.flushes(r.layout, r.training)
    with pytest.raises(ModelcutError, match="dp × local_batch"):
        default.predict(r, H100, EFF, AUTOMODEL)


def test_a_step_of_runs_is_that_many_runs_and_one_optimizer_step():
    r = run(local_batch=4)
    whole = default.predict(r, H100, EFF, AUTOMODEL)
    one = default.predict(replace(r, training=plans.flush_training(r.layout, r.training)), H100, EFF, AUTOMODEL)
    opt = one.breakdown.optimizer_s
    assert whole.flushes == 4 and whole.microbatches == 4 == one.microbatches
    assert whole.step_time_s == pytest.approx(4 * (one.step_time_s - opt) + opt)
    assert whole.breakdown.bubble_s == pytest.approx(4 * one.breakdown.bubble_s)
    assert whole.breakdown.optimizer_s == pytest.approx(opt)
    assert whole.breakdown.total_s == pytest.approx(whole.step_time_s)
    assert whole.flops_per_step == pytest.approx(4 * one.flops_per_step)
    assert whole.as_dict()["flushes"] == 4
    assert any("4 pipeline schedule runs" in n for n in whole.notes)


@settings(max_examples=25, deadline=None)
@given(k=st.sampled_from([1, 2, 4, 8]), v=st.sampled_from([None, 2]), zero=st.sampled_from([1, 3]))
def test_more_runs_for_the_same_batch_never_make_the_step_faster(k, v, zero):
    """Cutting a step's 32 micro-batches per replica into more schedule runs fills and drains the
    pipeline more often and reduces the gradients more often: never faster, and the work is the same.
    Only the gradients' accumulation between reductions differs in the compute: FSDP2 casts the
    first micro-batch of each run to fp32 (6 bytes a parameter) and adds the later ones (10), so more
    runs move a little less (core/costs/residency.py ``accumulate_bytes``)."""
    base = run(pp=4, dp=2, gb=64, zero=zero, v=v)
    cut = replace(base, training=replace(base.training, local_batch=32 // k))
    t0 = default.predict(base, H100, EFF, AUTOMODEL)
    t1 = default.predict(cut, H100, EFF, AUTOMODEL)
    assert t1.step_time_s >= t0.step_time_s * (1 - 1e-9)
    assert t1.flops_per_step == pytest.approx(t0.flops_per_step)
    assert t1.breakdown.compute_s <= t0.breakdown.compute_s * (1 + 1e-9)
    assert t1.breakdown.compute_s == pytest.approx(t0.breakdown.compute_s, rel=5e-3)
    assert t1.mfu <= 1.0


def test_memory_holds_one_runs_micro_batches():
    """The activations in flight are one schedule run's: with a run of two micro-batches on a
    four-stage 1F1B the first stage holds two, not four."""
    whole = memory_report(run(zero=1), framework=MCORE)["stages"][0]
    cut = memory_report(run(zero=1, local_batch=2), framework=MCORE)["stages"][0]
    assert (whole["microbatches_in_flight"], cut["microbatches_in_flight"]) == (4.0, 2.0)
    assert cut["activations_bytes"] == pytest.approx(whole["activations_bytes"] / 2)


def test_torch_pipelining_stage_reductions_hold_the_compute_stream():
    """FSDP under torch.distributed.pipelining reduces each stage's gradients after its last
    backward with the compute stream waiting: the step pays them whole, more than when the same
    reductions ride behind the backward; Megatron-core's stack does not wait."""
    r = run(zero=3, dp=8, gb=64)
    assert blocking_stage_reduce(r, AUTOMODEL)
    assert not blocking_stage_reduce(r, MCORE) and not blocking_stage_reduce(run(zero=1), AUTOMODEL)
    assert not blocking_stage_reduce(run(pp=1, dp=32), AUTOMODEL)
    held = default.predict(r, H100, EFF, AUTOMODEL)
    unhidden = default.predict(r, H100, EFF, AUTOMODEL.with_overlap({"grad_reduce": False}))
    assert held.breakdown.dp_s > 0
    # the wait is exposed whole: turning the bucketed overlap off changes nothing
    assert held.breakdown.dp_s == pytest.approx(unhidden.breakdown.dp_s)
    assert held.step_time_s == pytest.approx(unhidden.step_time_s)


RUNFILE = {"model": {"name": "llama3-8b"}, "hardware": {"gpu": "h100", "gpus": 16},
           "layout": {"tp": 1, "pp": 4, "dp": 4, "zero": 3},
           "training": {"seq_len": 4096, "global_batch": 64, "local_batch": 4}}


def test_run_files_and_the_api_take_a_local_batch():
    from fastapi.testclient import TestClient

    from modelcut.service.runfile import run_from_dict
    from modelcut.web import app as webapp

    r = run_from_dict(RUNFILE)
    assert r.training.local_batch == 4 and plans.flushes(r.layout, r.training) == 4
    bad = {**RUNFILE, "training": {**RUNFILE["training"], "local_batch": 5}}
    with pytest.raises(ModelcutError, match="dp × local_batch"):
        run_from_dict(bad)
    body = {"model": "llama3-8b", "gpu": "h100", "layout": RUNFILE["layout"], "training": RUNFILE["training"],
            "framework": "nemo-automodel"}
    with TestClient(webapp.create_app()) as c:
        ok = c.post("/api/predict", json=body)
        assert ok.status_code == 200, ok.text
        assert ok.json()["flushes"] == 4 and ok.json()["microbatches"] == 4
        no = c.post("/api/predict", json={**body, "training": bad["training"]})
        assert no.status_code == 422 and "local_batch" in no.json()["detail"], no.text



@settings(max_examples=40, deadline=None)
@given(gpus=st.sampled_from([8, 16, 32, 64]), gb=st.sampled_from([32, 64, 96, 128]),
       lb=st.integers(1, 12))
def test_the_explorer_searches_only_layouts_a_local_batch_runs(gpus, gb, lb):
    """With a local batch, every pipelined layout searched runs whole schedule runs of it (dp ·
    local_batch divides the batch, the micro-batch divides the local batch); layouts without a
    pipeline are searched as without one; and a run the search makes carries it where p > 1."""
    from modelcut.core.explore.space import Space, local_batch_of, make_run, structures
    space = Space(local_batch=lb)
    got = list(structures(LLAMA8, gpus, 4096, gb, 8, space))
    plain = [s for s in structures(LLAMA8, gpus, 4096, gb, 8, Space()) if s.pp == 1]
    assert [s for s in got if s.pp == 1] == plain
    for s in got:
        if s.pp > 1:
            assert gb % (s.dp * lb) == 0 and lb % s.micro_batch == 0
            r = make_run(LLAMA8, H100.name, s, 4096, gb, "none", 1, local_batch=local_batch_of(space, s.pp))
            assert plans.flushes(r.layout, r.training) == gb // (s.dp * lb)
    want = {(s.tp, s.cp, s.pp, s.dp, s.micro_batch) for s in structures(LLAMA8, gpus, 4096, gb, 8, Space())
            if s.pp > 1 and gb % (s.dp * lb) == 0 and lb % s.micro_batch == 0}
    assert {(s.tp, s.cp, s.pp, s.dp, s.micro_batch) for s in got if s.pp > 1} == want


def test_explore_run_times_a_pipelined_published_layout_over_its_runs(capsys):
    """NeMo AutoModel's Kimi K2 (pp 8, local batch 8: 2 schedule runs a step, runs.toml) is searched
    with its local batch, so ``explore --run`` times its published layout as ``predict --run`` does
    (one run of 16 micro-batches would have shrunk the bubble: 7.66 s against 8.41)."""
    import json

    from modelcut.cli import main
    from modelcut.service.explore import catalog_request, run_explore
    rid = "automodel-kimi-k2-256"
    req = catalog_request(rid, top=1)
    assert req.space.local_batch == 8
    best = run_explore(req).check_answer()["best"]
    assert main(["predict", "--run", rid, "--json"]) == 0
    assert best["step_time_s"] == pytest.approx(json.loads(capsys.readouterr().out)["step_time_s"], rel=1e-9)


def test_explore_takes_a_local_batch_on_the_command_line_and_the_api(capsys):
    from fastapi.testclient import TestClient

    from modelcut.cli import main
    from modelcut.web import app as webapp
    args = ["explore", "--model", "llama3-8b", "--gpu", "h100", "--gpus", "16", "--seq", "4096",
            "--global-batch-tokens", "256K", "--framework", "nemo-automodel", "--top", "50", "--json"]
    assert main(args + ["--local-batch", "2"]) == 0
    import json
    rows = json.loads(capsys.readouterr().out)["layouts"]
    piped = [r for r in rows if r["pp"] > 1]
    assert piped and all(64 % (r["dp"] * 2) == 0 and 2 % r["micro_batch"] == 0 for r in piped)
    assert all(r["local_batch"] == (2 if r["pp"] > 1 else None) for r in rows)   # each layout's own
    assert main(args + ["--local-batch", "0"]) == 2
    assert "--local-batch must be at least 1" in capsys.readouterr().err
    assert main(["explore", "--run", "automodel-kimi-k2-256", "--local-batch", "2"]) == 2
    assert "drop --local-batch" in capsys.readouterr().err
    body = {"model": "llama3-8b", "gpu": "h100", "gpus": 16, "seq": 4096, "global_batch_tokens": "256K",
            "framework": "nemo-automodel", "local_batch": 2, "top": 3}
    with TestClient(webapp.create_app()) as c:
        ok = c.post("/api/explore", json=body)
        assert ok.status_code == 200, ok.text
        no = c.post("/api/explore", json={**body, "local_batch": 0})
        assert no.status_code == 422 and "local_batch" in no.text, no.text


def test_the_seed_model_runs_a_local_batch_as_that_many_schedule_runs():
    """The deck's model times one schedule run of the local batch and repeats it (each run with its
    bubble and all-reduce): f times the one run's step, slower than one run of all the micro-batches,
    the FLOPs and so the TFLOP/s those of the whole step."""
    from modelcut.core.step import seed
    r = run(local_batch=4, zero=1)               # 64 sequences over dp 4: 4 runs of 4
    whole = seed.predict(r, H100, 0.5)
    one = seed.predict(replace(r, training=plans.flush_training(r.layout, r.training)), H100, 0.5)
    flat = seed.predict(replace(r, training=replace(r.training, local_batch=None)), H100, 0.5)
    assert whole.flushes == 4 and whole.microbatches == one.microbatches == 4 and flat.microbatches == 16
    assert whole.step_time_s == pytest.approx(4 * one.step_time_s, rel=1e-12)
    assert whole.breakdown.bubble_s == pytest.approx(4 * one.breakdown.bubble_s, rel=1e-12)
    assert whole.step_time_s > flat.step_time_s
    assert whole.flops_per_step == pytest.approx(flat.flops_per_step, rel=1e-12)
    assert whole.tflops_per_gpu == pytest.approx(flat.flops_per_step / (16 * whole.step_time_s) / 1e12, rel=1e-12)
    assert any("4 pipeline schedule runs a step" in n for n in whole.notes)
