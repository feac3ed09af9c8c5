"""Fitting the two constants, cross-validation, error budget, profiles and user CSV runs."""

from __future__ import annotations

import json
import math
import tomllib

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from modelcut import catalog
from modelcut.analysis import calibrate as cal
from modelcut.analysis.budget import error_budget
from modelcut.analysis.measured import Measured, catalog_measured, counted_flops, error_pct
from modelcut.service.runs_csv import read_runs_csv
from modelcut.cli import main
from helpers import predict_default as predict
from modelcut.core.errors import ModelcutError
from modelcut.core.costs.kernels import Efficiency
from modelcut.core.specs import Layout, Run, Training

A100 = catalog.hardware("a100")
TRUE = Efficiency(0.71, 0.58, 1.0)     # net is measured (the collective tables), not fitted


def small_runs() -> list[Measured]:
    """Measured runs made by the model itself with known constants: a fit must recover them.
    Small layouts (no or short pipelines) keep the fit fast; they differ in what bounds them
    (products, memory-bound kernels, collectives) so each constant is pinned."""
    specs = [
        ("gpt-1.7b", 1, 1, 8, 8, 64, "none", "megatron-core", "a"),
        ("gpt-3.6b", 2, 1, 4, 4, 32, "full", "megatron-2021", "a"),
        ("gpt-7.5b", 8, 1, 1, 1, 8, "selective", "megatron-2022", "b"),
        ("gpt-18.4b", 8, 2, 1, 1, 16, "full", "megatron-2021", "b"),
        ("gpt-1.7b", 8, 1, 2, 16, 64, "none", "megatron-2021", "c"),
        ("gpt-7.5b", 1, 1, 16, 1, 16, "full", "deepspeed-zero3", "c"),
    ]
    out = []
    for i, (name, tp, pp, dp, b, gb, rec, fw, grp) in enumerate(specs):
        zero = 3 if fw == "deepspeed-zero3" else 0
        run = Run(model=catalog.model(name), gpu=A100.name, layout=Layout(tp=tp, pp=pp, dp=dp, zero=zero),
                  training=Training(seq_len=2048, global_batch=gb, micro_batch=b, recompute=rec))
        t = predict(run, A100, TRUE, fw).step_time_s
        out.append(Measured(f"r{i}", grp, run, A100, fw, {}, step_time_s=t))
    return out


#: a run for fits whose predictor ignores it
_ONE_RUN = Run(model=catalog.model("gpt-1.7b"), gpu=A100.name, layout=Layout(tp=1, pp=1, dp=8),
               training=Training(seq_len=2048, global_batch=64, micro_batch=8, recompute="none"))


def test_fit_recovers_the_constants_that_made_the_runs():
    f = cal.fit(small_runs())
    assert f.efficiency.gemm == pytest.approx(TRUE.gemm, rel=2e-3)
    assert f.efficiency.mem == pytest.approx(TRUE.mem, rel=2e-3)
    assert f.fitted == ("gemm", "mem") and f.efficiency.net == 1.0
    assert f.max_abs_pct < 0.1


def test_fitting_one_constant_keeps_the_others():
    start = Efficiency(0.5, TRUE.mem, TRUE.net)
    f = cal.fit(small_runs()[:3], ("gemm",), start)
    assert f.efficiency.mem == TRUE.mem and f.efficiency.net == TRUE.net
    assert f.efficiency.gemm == pytest.approx(TRUE.gemm, rel=2e-3)
    with pytest.raises(ModelcutError):
        cal.fit(small_runs()[:1], ("gemm", "mem"))
    with pytest.raises(ModelcutError):
        cal.fit(small_runs(), ("gemm", "speed"))


def test_leave_one_group_out_predicts_each_group_unseen():
    folds = cal.leave_one_family_out(small_runs())
    assert set(folds) == {"a", "b", "c"}
    for g, f in folds.items():
        assert set(f["errors_pct"]) == {m.id for m in small_runs() if m.family == g}
        assert all(abs(e) < 0.5 for e in f["errors_pct"].values())   # same physics: tiny errors


def test_error_is_signed_by_throughput():
    m = small_runs()[0]
    p = predict(m.run, A100, TRUE, m.framework)
    slow = Measured("x", "g", m.run, A100, m.framework, step_time_s=2 * p.step_time_s)
    assert error_pct(slow, p) == pytest.approx(100.0)        # predicted twice as fast
    f = counted_flops(m.run)
    by_tflops = Measured("y", "g", m.run, A100, m.framework,
                             tflops=f / (m.run.layout.gpus * p.step_time_s * 1e12))
    assert error_pct(by_tflops, p) == pytest.approx(0.0, abs=1e-9)
    with pytest.raises(ModelcutError):
        Measured("z", "g", m.run, A100)


def test_error_budget_names_the_dominant_term_and_moves():
    m = small_runs()[1]                       # t = 2, d = 4, no pipeline
    b = error_budget(m.run, A100, TRUE, m.framework)
    assert b.dominant in b.terms and 0 < b.dominant_share <= 1
    inputs = {ln.input for ln in b.lines}
    assert {"micro-batch", "recompute", "overlap grad_reduce", "overlap tp_comm"} <= inputs
    assert "overlap p2p_async" not in inputs and "interleaving" not in inputs   # no pipeline to change
    rec = {ln.alternative: ln.change_pct for ln in b.lines if ln.input == "recompute"}
    assert rec["none"] > 0 and rec["selective"] > 0      # recomputing less is faster


CSV = """id,group,model,gpu,tp,pp,dp,seq_len,global_batch,micro_batch,recompute,framework,step_time_s
a,x,gpt-1.7b,a100,1,1,8,2048,64,8,none,megatron-core,{a}
b,x,gpt-3.6b,a100,2,1,4,2048,32,4,full,megatron-2021,{b}
c,y,gpt-7.5b,a100,8,1,1,2048,8,1,selective,megatron-2022,{c}
"""


def test_csv_runs_and_the_calibrate_command(tmp_path, capsys):
    runs = small_runs()
    text = CSV.format(a=runs[0].step_time_s, b=runs[1].step_time_s, c=runs[2].step_time_s)
    path = tmp_path / "mine.csv"
    path.write_text(text)
    got = read_runs_csv(path)
    assert [m.id for m in got] == ["a", "b", "c"] and got[2].run.training.recompute == "selective"
    assert got[0].run.training.local_batch is None
    lb = tmp_path / "lb.csv"
    lb.write_text("id,model,gpu,tp,pp,dp,seq_len,global_batch,micro_batch,local_batch,step_time_s\n"
                  "p,gpt-1.7b,a100,1,2,4,2048,64,1,4,1\n")
    assert read_runs_csv(lb)[0].run.training.local_batch == 4
    out = tmp_path / "prof.toml"
    assert main(["calibrate", "--runs", str(path), "--fit", "gemm", "--base", "a100", "--out", str(out),
                 "--no-cv", "--json"]) == 0
    data = json.loads(capsys.readouterr().out)
    assert data["hardware"] == "a100-sxm4-80gb" and data["fitted"] == ["gemm"]
    prof = catalog.load_profile(out)
    assert prof.fitted == ("gemm",) and prof.runs == ("a", "b", "c")
    assert tomllib.loads(out.read_text())["errors_pct"]["a"] == pytest.approx(data["runs"]["a"], abs=0.01)


def test_a_fit_does_not_start_from_the_profile_it_replaces(tmp_path):
    """The fitted constants start from the fit's own starting point, whatever the base profile
    holds for them, so rerunning calibrate writes the same file; the base profile still gives the
    constants not fitted."""
    from modelcut.service.calibrate import calibrate
    runs = small_runs()
    path = tmp_path / "mine.csv"
    path.write_text(CSV.format(a=runs[0].step_time_s, b=runs[1].step_time_s, c=runs[2].step_time_s))
    mem = catalog.profile_for("a100-sxm4-80gb").efficiency.mem
    other = tmp_path / "other.toml"
    other.write_text(f'hardware = "a100-sxm4-80gb"\ngemm = 0.55\nmem = {mem}\nnet = 1.0\n')
    a = calibrate(runs=path, fit_names="gemm", base="a100", cv=False)
    b = calibrate(runs=path, fit_names="gemm", base=str(other), cv=False)
    assert a.fit.efficiency.gemm == b.fit.efficiency.gemm         # not where the base had it
    assert b.fit.efficiency.mem == mem                             # the base gives what is not fitted


@pytest.mark.parametrize("body, word", [
    ("id,model,gpu,tp,pp,dp,seq_len,global_batch,micro_batch,colour\n", "colour"),
    ("id,model,gpu,tp,pp,dp,seq_len,global_batch,micro_batch\nx,gpt-1.7b,a100,1,1,8,2048,64,8\n", "tflops_per_gpu"),
    ("id,model,gpu,tp,pp,dp,seq_len,global_batch,micro_batch,step_time_s\nx,gpt-1.7b,a100,one,1,8,2048,64,8,1\n",
     "tp"),
    ("id,model,gpu,tp,pp,dp,seq_len,global_batch,micro_batch,step_time_s,framework\n"
     "x,gpt-1.7b,a100,1,1,8,2048,64,8,1,jax\n", "framework"),
    ("id,model,gpu,tp,pp,dp,seq_len,global_batch,micro_batch,local_batch,step_time_s\n"
     "x,gpt-1.7b,a100,1,2,4,2048,64,1,3,1\n", "local_batch"),
])
def test_bad_csv_rows_are_one_line_errors(tmp_path, body, word, capsys):
    path = tmp_path / "bad.csv"
    path.write_text(body)
    with pytest.raises(ModelcutError, match=word):
        read_runs_csv(path)
    assert main(["calibrate", "--runs", str(path), "--no-cv"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("modelcut: error:")


def test_shipped_profiles_and_settings():
    """One profile, shared by every accelerator, two constants fitted on every catalog source,
    with a leave-one-source-out fold per source (issue 13: nothing fitted per GPU)."""
    shared = catalog.profile_for(A100)
    assert shared.hardware == catalog.profiles.EVERY and set(shared.fitted) == {"gemm", "mem"}
    assert shared.efficiency.net == 1.0
    for gpu in ("h100", "b200", "h800", "tpu-v4"):
        assert catalog.profile_for(catalog.hardware(gpu)) is shared
    sources = {m.family for m in catalog_measured()}
    assert set(shared.runs) == {m.id for m in catalog_measured()}
    assert {c[0] for c in shared.cv} == sources
    # the folds' constants stay close: what differs between sources is not absorbed by them
    assert max(c[1] for c in shared.cv) - min(c[1] for c in shared.cv) < 0.1
    with pytest.raises(ModelcutError):
        catalog.load_profile("/nonexistent/profile.toml")


class _Step:
    def __init__(self, t: float) -> None:
        self.step_time_s = t


@settings(max_examples=40, deadline=None)
@given(st.lists(st.tuples(st.sampled_from("abc"), st.floats(0.5, 2.0)), min_size=2, max_size=9))
def test_a_weighed_fit_is_the_weighted_mean_of_the_log_errors(rows):
    """With a predictor whose throughput is proportional to gemm, the least-squares fit of gemm on
    log errors has a closed form: log gemm = -(Σ w·log(measured / base)) / Σ w, with w = 1 for each
    run (``weigh="runs"``) or 1/n for each run of a source of n runs (``"sources"``)."""
    run = _ONE_RUN
    meas = [Measured(f"r{i}", fam, run, A100, step_time_s=ratio) for i, (fam, ratio) in enumerate(rows)]

    def predictor(m, eff):                   # base step 1 s at gemm = 1
        return _Step(1.0 / eff.gemm)

    n = {fam: sum(1 for f, _ in rows if f == fam) for fam, _ in rows}
    for weigh, w in (("runs", [1.0] * len(rows)), ("sources", [1 / n[f] for f, _ in rows])):
        want = math.exp(-sum(wi * math.log(r) for wi, (_, r) in zip(w, rows)) / sum(w))
        if not 0.02 < want < 0.98:           # the fit works on the logit of a share in (0, 1)
            continue
        f = cal.fit(meas, ("gemm",), Efficiency(0.5, 0.5, 1.0), predictor, weigh=weigh)
        assert f.efficiency.gemm == pytest.approx(want, rel=1e-4)
        w_arr = cal.run_weights(meas, weigh)
        assert w_arr.mean() == pytest.approx(1.0) and (w_arr > 0).all()


def test_weighing_sources_alike_moves_the_fit_towards_the_smaller_source():
    run = _ONE_RUN
    meas = [Measured(f"a{i}", "big", run, A100, step_time_s=1 / 0.6) for i in range(5)]
    meas.append(Measured("b0", "small", run, A100, step_time_s=1 / 0.8))

    def predictor(m, eff):
        return _Step(1.0 / eff.gemm)
    by_run = cal.fit(meas, ("gemm",), Efficiency(0.5, 0.5, 1.0), predictor)
    by_source = cal.fit(meas, ("gemm",), Efficiency(0.5, 0.5, 1.0), predictor, weigh="sources")
    assert 0.6 < by_run.efficiency.gemm < by_source.efficiency.gemm < 0.8
    assert by_source.efficiency.gemm == pytest.approx(math.sqrt(0.6 * 0.8), rel=1e-4)
    with pytest.raises(ModelcutError, match="weigh must be one of runs, sources"):
        cal.run_weights(meas, "gpus")


def test_folds_summary_names_the_source_furthest_off():
    folds = {"a": {"errors_pct": {"x": 2.0, "y": -4.0}}, "b": {"errors_pct": {"z": 3.0}}}
    s = cal.folds_summary(folds)
    assert s["runs"] == 3 and s["mean_abs_pct"] == pytest.approx(3.0) and s["max_abs_pct"] == 4.0
    assert s["worst_source"] == "b" and s["worst_source_signed_pct"] == 3.0
    assert s["source_mean_abs_pct"] == pytest.approx(3.0)     # (3 + 3) / 2
    assert cal.folds_summary({})["worst_source"] is None


def test_the_calibrate_command_weighs_sources_when_told(tmp_path, capsys):
    runs = small_runs()
    path = tmp_path / "mine.csv"
    path.write_text(CSV.format(a=runs[0].step_time_s * 1.1, b=runs[1].step_time_s, c=runs[2].step_time_s * 0.9))
    outs = {}
    for weigh in ("runs", "sources"):
        assert main(["calibrate", "--runs", str(path), "--fit", "gemm", "--base", "a100", "--weigh", weigh,
                     "--json"]) == 0
        outs[weigh] = json.loads(capsys.readouterr().out)
        assert outs[weigh]["weigh"] == weigh
        s = outs[weigh]["cross_validation_summary"]
        assert s["runs"] == 3 and s["worst_source"] in ("x", "y")
    assert outs["runs"]["efficiency"]["gemm"] != outs["sources"]["efficiency"]["gemm"]
    assert main(["calibrate", "--runs", str(path), "--fit", "gemm", "--weigh", "gpus"]) == 2
    assert "--weigh must be one of" in capsys.readouterr().err
