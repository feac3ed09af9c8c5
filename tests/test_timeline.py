"""The predicted step as a timeline (core/step/timeline.py) and its Chrome trace (predict --trace):
what each device does when, as the default model times it, ending at the step time."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from modelcut import catalog
from modelcut.cli import main
from modelcut.core.step import predict
from modelcut.core.step.exposure import prefetch_timeline
from modelcut.service.predict import catalog_run, efficiency_for
from modelcut.service.runfile import load_run_with_settings

DATA = Path(__file__).parent / "data"


def _timed(run, framework):
    hw = catalog.hardware(run.gpu)
    fw = catalog.framework(framework)
    plain = predict(run, hw, "default", efficiency=efficiency_for(hw), framework=fw)
    lined = predict(run, hw, "default", efficiency=efficiency_for(hw), framework=fw, timeline=True)
    return plain, lined


def _file(name):
    run, settings = load_run_with_settings(DATA / name)
    return run, settings.get("framework")


def _catalog(rid):
    _, run, settings = catalog_run(rid, "default")
    return run, settings.get("framework")


CASES = {
    "interleaved pipeline (NeMo, Llama 3 70B)": lambda: _file("llama3-70b-64-h100.toml"),
    "1F1B pipeline (Megatron-LM 2021, 1T)": lambda: _catalog("megatron-1t"),
    "ZeRO-3 without a pipeline (torchtitan-style FSDP2, MoE)": lambda: _catalog("automodel-qwen3-30b-a3b-8"),
    "four schedule runs a step (AutoModel DeepSeek-V3)": lambda: _catalog("automodel-deepseek-v3-1024"),
    "context parallelism at 128K (Llama 3 405B)": lambda: _catalog("llama3-405b-128k-16384"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_a_timeline_is_the_step_it_was_timed_as(case):
    """Asking for the timeline changes nothing in the prediction; its last segment ends at the step
    time; every segment lies in [0, step]; a pipeline device's ops follow its schedule's order
    without overlapping (no overlapped units in these schedules); each device ends with its
    optimizer step; the schedule runs repeat as many times as the step has them."""
    run, fw = CASES[case]()
    plain, p = _timed(run, fw)
    assert p.step_time_s == plain.step_time_s and p.breakdown == plain.breakdown and not plain.timeline
    T = p.step_time_s
    assert max(s.end_s for s in p.timeline) == pytest.approx(T, rel=1e-12)
    assert all(0 <= s.start_s <= s.end_s <= T * (1 + 1e-12) for s in p.timeline)
    tracks = {s.track for s in p.timeline}
    pipelined = sorted(t for t in tracks if t.startswith("pipeline rank"))
    if pipelined:
        assert len(pipelined) == run.layout.pp
        for t in pipelined:
            ops = [s for s in p.timeline if s.track == t and s.microbatch >= 0]
            assert all(a.end_s <= b.start_s * (1 + 1e-12) + 1e-12 for a, b in zip(ops, ops[1:]))
            per_run = len(ops) // p.flushes
            assert per_run * p.flushes == len(ops)
            last = [s for s in p.timeline if s.track == t][-1]
            assert last.kind == "optimizer"
    else:
        assert tracks == {"compute", "communication"}
        compute = [s for s in p.timeline if s.track == "compute"]
        assert all(a.end_s <= b.start_s + 1e-12 for a, b in zip(compute, compute[1:]))
        assert compute[-1].kind == "optimizer"
    assert sum(s.kind == "optimizer" for s in p.timeline) == max(1, len(pipelined))
    if "four schedule runs" in case:
        assert p.flushes == 4


def test_the_streams_of_a_prefetch_timeline_are_its_times():
    """prefetch_timeline's record: each gather ends before its task starts, each task starts when
    the one before it ends or its gather does, a reduce-scatter starts when its task ends or the
    stream frees; the record's ends are the returned ends."""
    tasks = [(1.0, 2.0, True), (3.0, 1.0, True), (0.5, 4.0, False), (0.0, 1.0, True)]
    after = [(1, 2.0), (3, 0.5)]
    rec = []
    end_c, end_comm = prefetch_timeline(tasks, after, rec)
    assert prefetch_timeline(tasks, after) == (end_c, end_comm)
    comp = {i: (s, e) for w, i, s, e in rec if w == "compute"}
    gath = {i: (s, e) for w, i, s, e in rec if w == "gather"}
    assert set(gath) == {0, 1, 2} and comp[0][0] == gath[0][1] == 1.0     # task 3 gathers nothing
    for i in range(1, 4):
        assert comp[i][0] == max(comp[i - 1][1], gath.get(i, (0, 0))[1])
    assert max(e for *_, e in rec) == max(end_c, end_comm) and comp[3][1] == end_c


def test_predict_writes_the_step_as_a_chrome_trace(tmp_path, capsys):
    out = tmp_path / "step.json"
    assert main(["predict", str(DATA / "llama3-70b-64-h100.toml"), "--trace", str(out), "--json"]) == 0
    cap = capsys.readouterr()
    pred = json.loads(cap.out)                          # stdout stays the prediction's JSON
    trace = json.loads(out.read_text())
    spans = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    assert f"wrote {out}: {len(spans):,} spans on 4 tracks" in cap.err
    threads = [e["args"]["name"] for e in trace["traceEvents"] if e["name"] == "thread_name"]
    assert threads == [f"pipeline rank {d}" for d in range(4)]
    assert max(e["ts"] + e["dur"] for e in spans) == pytest.approx(pred["step_time_s"] * 1e6, rel=1e-9)
    assert trace["otherData"]["step_time_s"] == pred["step_time_s"]
    ops = [e for e in spans if "microbatch" in e["args"]]
    assert len(ops) == 2 * 4 * 5 * 64              # F and B of 64 micro-batches on 4 devices × 5 chunks
    assert {e["cat"] for e in spans} >= {"forward", "backward", "optimizer"}


@pytest.mark.parametrize("argv, words", [
    (["--mode", "seed"], "the default model's"),
    (["--precision", "bf16,fp8"], "--trace takes one precision"),
    (["--framework", "deepspeed-zero3"], None),      # with this layout's pipeline it has a timeline
])
def test_what_trace_refuses_is_one_line(tmp_path, capsys, argv, words):
    out = tmp_path / "t.json"
    rc = main(["predict", str(DATA / "llama3-70b-64-h100.toml"), "--trace", str(out), *argv])
    err = capsys.readouterr().err.strip().splitlines()
    if words is None:
        assert rc == 0 and out.exists()
    else:
        assert rc == 2 and len(err) == 1 and words in err[0] and not out.exists()


def test_deepspeeds_replay_has_no_timeline_and_says_so(tmp_path, capsys):
    out = tmp_path / "t.json"
    assert main(["predict", "--run", "zero3-174.6b-384", "--trace", str(out)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and "keeps no timeline" in err[0] and not out.exists()


def test_explore_writes_the_picked_layouts_step(tmp_path, capsys):
    """explore --trace writes the --pick-th ranked layout's step, predicted again with its
    timeline on the stack the search ranked it with: its last span ends at the ranked step time."""
    out = tmp_path / "best.json"
    argv = ["explore", "--model", "llama3-8b", "--gpu", "h100", "--gpus", "8", "--seq", "8192",
            "--global-batch-tokens", "1M", "--framework", "torchtitan", "--top", "3", "--json"]
    assert main(argv + ["--pick", "2", "--trace", str(out)]) == 0
    ranked = json.loads(capsys.readouterr().out)["layouts"]
    trace = json.loads(out.read_text())
    spans = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    assert max(e["ts"] + e["dur"] for e in spans) == pytest.approx(ranked[1]["step_time_s"] * 1e6, rel=1e-9)
    assert trace["otherData"]["rank"] == 2 and trace["otherData"]["layout"]["step_time_s"] == ranked[1]["step_time_s"]
    for extra, words in ((["--mode", "seed"], "the default model's"), (["--pick", "99"], "--pick must be in")):
        assert main(argv + extra + ["--trace", str(tmp_path / "x.json")]) == 2
        assert words in capsys.readouterr().err
    assert main(["explore", "--run", "megatron-1t", "--trace", str(tmp_path / "x.json")]) == 2
    assert "predict --run ID --trace" in capsys.readouterr().err
