"""What a stack can run (catalog/framework_rules.toml, core/explore/rules.py), the lower bound on
step time the explorer prunes by (core/step/bounds.py), Llama 3's schedule, and the explorer's
answers: only runnable layouts ranked, the pruned search equal to the exhaustive one, --check
naming a broken rule in one line, the Pareto set, GPU ranges, --emit nemo, progress."""

from __future__ import annotations

import json
import tomllib
from dataclasses import replace
from importlib import resources

import pytest
from hypothesis import given, settings, strategies as st

from modelcut import catalog
from modelcut.cli import main
from modelcut.core.errors import ModelcutError
from modelcut.core.explore import Space, make_run, structures
from modelcut.core.explore.rules import FIELDS, violations
from modelcut.core.memory import memory_report
from modelcut.core.sim import registry
from modelcut.core.sim.engine import Timing, simulate
from modelcut.core.sim.inflight import inflight_profile
from modelcut.core.specs import BLOCKS, EVERY
from modelcut.core.step import predict
from modelcut.core.step.bounds import lower_bound
from modelcut.core.step.default import default_plan
from modelcut.service.explore import ExploreRequest, gpu_counts, run_explore, run_explore_range
from modelcut.service.predict import catalog_run, efficiency_for

H100 = catalog.hardware("h100")
EFF = efficiency_for(H100)
LLAMA8 = catalog.model("llama3-8b")
LLAMA405 = catalog.model("llama3-405b")
QWEN_MOE = catalog.model("qwen1.5-moe-a2.7b")


# ------------------------------------------------------------------ the rules

def test_every_preset_has_rules_and_every_rule_a_source():
    rows = tomllib.loads(resources.files("modelcut.catalog").joinpath("framework_rules.toml").read_text())["stack"]
    assert {r["framework"] for r in rows} == set(catalog.framework_names())
    for r in rows:
        caps = catalog.capabilities(r["framework"])
        for f in FIELDS:
            if f in r:
                assert caps.source(f), (r["framework"], f)


@pytest.mark.parametrize("stack, knobs, rule", [
    ("megatron-core", dict(tp=8, pp=16, dp=64, zero=3), "zero_with_pipeline"),     # Megatron-FSDP: pp = 1
    ("nemo", dict(tp=8, pp=1, dp=64, zero=0), "zero"),                             # its recipes' distributed optimizer
    ("deepspeed-zero3", dict(pp=4, dp=16, zero=2), "zero_with_pipeline"),          # the pipeline engine asserts < 2
    ("llama3", dict(tp=8, cp=16, pp=16, dp=8, cp_kind="ring"), "cp_kinds"),        # all-gather CP only
    ("megatron-2021", dict(tp=8, cp=2, pp=8, dp=8), "context_parallel"),
    ("megatron-2021", dict(tp=8, pp=16, dp=64, vpp=8), "interleave"),              # 126 layers, 128 chunks
    ("megatron-2021", dict(tp=8, pp=2, dp=64, vpp=3), "interleave_min_pp"),
    ("fsdp-compile", dict(pp=4, dp=16, schedule="zbv", vpp=2), "schedules"),       # compiled stages
    ("fsdp", dict(tp=2, dp=32, zero=0), "zero0_flat_mesh_only"),                   # DDP with TP refused
    ("fsdp", dict(tp=4, cp=8, dp=1, zero=0), "zero0_flat_mesh_only"),              # FSDP over the cp ranks
    ("fsdp", dict(tp=8, dp=1, zero=0), None),                                      # no data parallelism at all
    ("fsdp", dict(tp=8, cp=2, seq=8200), "cp_seq_multiple_tp"),
    ("megatron-2021", dict(tp=8, sequence_parallel=True), "sequence_parallel"),
    ("megatron-core", dict(tp=2, ep=4, dp=8, sequence_parallel=False), "ep_with_tp_needs_sp"),
    ("megatron-2022", dict(recompute="full", zero=0, pp=1), None),
    ("megatron-2021", dict(recompute="selective", zero=0), "recompute"),
    ("megatron-core", dict(tp=8, pp=16, dp=64, local_batch=4), "local_batch"),     # one schedule a step
    ("nemo-24.07", dict(tp=8, pp=16, dp=64, local_batch=4), "local_batch"),        # as its base, nemo
    ("deepspeed-zero3", dict(pp=4, dp=16, zero=1, local_batch=4), "local_batch"),  # one TrainSchedule a step
    ("fsdp-compile", dict(pp=4, dp=16, local_batch=4), None),                      # a schedule run a local batch
    ("nemo-automodel", dict(pp=4, dp=16, local_batch=4), None),
    ("megatron-core", dict(tp=8, pp=1, dp=64, local_batch=4), None),               # no pipeline: no runs to count
])
def test_rules(stack, knobs, rule):
    model = QWEN_MOE if "ep" in knobs else LLAMA405
    got = [v.rule for v in violations(catalog.capabilities(stack), model, **knobs)]
    assert (got[:1] == [rule]) if rule else got == []
    if rule:
        v = violations(catalog.capabilities(stack), model, **knobs)[0]
        assert stack in v.line() and v.source in v.line() and "\n" not in v.line()


def test_megatron_core_interleaves_with_embedding_and_loss_slots():
    caps = catalog.capabilities("megatron-core")
    assert violations(caps, LLAMA405, tp=8, pp=16, dp=64, vpp=8) == []     # 126 + 2 = 128 = 16 · 8
    assert violations(caps, LLAMA405, tp=8, pp=16, dp=64, vpp=3)[0].rule == "interleave"


def test_a_preset_without_rules_is_refused(monkeypatch):
    from modelcut.core.explore.rules import from_table
    with pytest.raises(ModelcutError, match="has no source"):
        from_table("x", {"zero": [1]}, None, {})
    with pytest.raises(ModelcutError, match="unknown field"):
        from_table("x", {"zeros": [1]}, None, {"zeros": "s"})


# ------------------------------------------------------------------ the lower bound

SCHEDS = ("1f1b", "interleaved", "llama3-interleaved", "zb-h1", "zbv", "dualpipe", "dualpipev", "gpipe", "looped-bfs")
SPACE = Space(schedules=SCHEDS)
STRUCTS = {(m.name, n): list(structures(m, n, 4096, 64, 8, SPACE)) for m, n in ((LLAMA8, 32), (QWEN_MOE, 16))}


@settings(max_examples=60, deadline=None)
@given(which=st.sampled_from(sorted(STRUCTS)), pick=st.integers(0, 10**6), recompute=st.sampled_from(
    ["none", "selective", "full", BLOCKS, EVERY]), count=st.integers(1, 40), zero=st.sampled_from([0, 1, 2, 3]),
    fw=st.sampled_from(["megatron-core", "fsdp", "megatron-2021", "nemo", "llama3"]))
def test_the_lower_bound_never_exceeds_the_step(which, pick, recompute, count, zero, fw):
    """Every recomputation the explorer ranks, partial ones too (the first ``count`` layers of each
    chunk, one layer in ``count`` on each rank): the bound counts a stage's recomputed layers as
    its durations do."""
    ss = STRUCTS[which]
    s = ss[pick % len(ss)]
    model = LLAMA8 if which[0] == LLAMA8.name else QWEN_MOE
    run = make_run(model, H100.name, s, 4096, 64, recompute, zero, count=count)
    framework = replace(catalog.framework(fw), reshard_with_pipeline=True) if zero == 3 else catalog.framework(fw)
    try:
        pred = predict(run, H100, "default", efficiency=EFF, framework=framework)
    except ModelcutError:
        return
    lb = lower_bound(run, H100, EFF, framework, default_plan(run))
    assert 0 <= lb <= pred.step_time_s * (1 + 1e-12)


def test_the_lower_bound_is_tight_on_a_compute_bound_pipeline():
    run = make_run(LLAMA405, H100.name, next(s for s in structures(LLAMA405, 8192, 8192, 2048, 8)
                                              if (s.tp, s.cp, s.pp, s.vpp, s.schedule, s.micro_batch)
                                              == (8, 1, 16, 8, "interleaved", 1)), 8192, 2048, "none", 1)
    fw = catalog.framework("megatron-core")
    lb = lower_bound(run, H100, EFF, fw, default_plan(run))
    t = predict(run, H100, "default", efficiency=EFF, framework=fw).step_time_s
    assert 0.9 * t < lb < t


# ------------------------------------------------------------------ Llama 3's schedule

@settings(max_examples=60, deadline=None)
@given(p=st.integers(2, 8), v=st.integers(2, 4), k=st.integers(1, 4), group=st.sampled_from([None, 1, 2]),
       tau=st.sampled_from([0.0, 0.25]))
def test_llama3_interleaved_runs_with_megatrons_bubble_and_holds_less(p, v, k, group, tau):
    m = p * k
    N = None if group is None else min(m, p * group)
    lean, meg = registry.build("llama3-interleaved", p, m, v, N), registry.build("interleaved", p, m, v, N)
    t = Timing(forward=1, backward=2, p2p=tau)
    a, b = simulate(lean, t), simulate(meg, t)                         # no deadlock either way
    if tau == 0:
        assert a.makespan == pytest.approx(b.makespan)                 # the same bubble with free sends
    held = lambda sched, d: max(sum(1 if op.kind == "F" else -1 for op in sched.orders[d][:i + 1])  # noqa: E731
                                for i in range(len(sched.orders[d])))
    for d in range(p):
        assert held(lean, d) <= held(meg, d)
    assert inflight_profile("llama3-interleaved", p, m, v, N) is not None


# ------------------------------------------------------------------ the catalog's Llama 3 runs

@pytest.mark.parametrize("rid", ["llama3-405b-8k-8192", "llama3-405b-8k-16384", "llama3-405b-128k-16384"])
def test_llama3_runs_fit_as_run(rid):
    pr, run, st_ = catalog_run(rid, "default")
    fw = catalog.framework(st_["framework"])
    hw = catalog.hardware(run.gpu)
    rep = memory_report(run, hw, plan=default_plan(run), framework=fw)
    assert rep["fits"] and rep["peak_bytes"] <= 0.98 * hw.mem_bytes
    assert run.training.recompute != "full"
    if rid.startswith("llama3-405b-8k"):
        assert run.training.recompute == "none"                        # §3.3.2: no checkpointing at 8K


# ------------------------------------------------------------------ the explorer

SMALL = ExploreRequest(LLAMA8, H100, 32, 4096, 64 * 4096, top=5)


def test_only_runnable_layouts_are_ranked_and_the_bound_loses_nothing():
    for fw in ("llama3", "megatron-core", "fsdp", "deepspeed-zero3"):
        req = replace(SMALL, framework=fw)
        fast, full = run_explore(req), run_explore(replace(req, exhaustive=True))
        caps = catalog.capabilities(fw)
        for e in full.layouts:
            s, lay = e.structure, e.run.layout
            assert violations(caps, LLAMA8, tp=s.tp, cp=s.cp, pp=s.pp, dp=s.dp, ep=s.ep, vpp=s.vpp,
                              schedule=s.schedule, cp_kind=lay.cp_kind if s.cp > 1 else None, seq=4096,
                              sequence_parallel=lay.sequence_parallel, zero=e.zero, recompute=e.recompute) == []
            assert s.tp * s.cp * s.pp * s.dp == 32 and e.feasible
        k = lambda e: (e.structure, e.recompute, e.zero, round(e.step_time_s, 9))  # noqa: E731
        assert [k(e) for e in fast.layouts[:5]] == [k(e) for e in full.layouts[:5]]
        assert fast.exploration.predictions <= full.exploration.predictions
        reach = full.layouts[0].step_time_s * 1.05
        assert {k(e) for e in full.layouts if e.step_time_s <= reach} <= {k(e) for e in fast.layouts}


def test_the_bound_keeps_partial_recomputation_where_it_ranks():
    """Llama 3 8B on 16 A100 under NeMo 24.07: the second best recomputes one layer a chunk (the
    block method) where recomputing none also fits. Its bound counts that one layer, not every
    layer's recomputed forward (which exceeded its step and pruned it before commit d2b56f6)."""
    req = ExploreRequest(LLAMA8, catalog.hardware("a100"), 16, 2048, 64 * 1024, framework="nemo-24.07", top=5)
    fast, full = run_explore(req), run_explore(replace(req, exhaustive=True))
    k = lambda e: (e.structure, e.recompute, e.zero, round(e.step_time_s, 9))  # noqa: E731
    assert [k(e) for e in fast.layouts[:5]] == [k(e) for e in full.layouts[:5]]
    assert BLOCKS in [e.recompute for e in fast.layouts[:5]]
    for e in fast.layouts[:5]:
        assert lower_bound(e.run, req.hw, efficiency_for(req.hw),
                           catalog.framework("nemo-24.07"), e.plan) <= e.step_time_s * (1 + 1e-12)


def test_check_names_the_broken_rule_in_one_line(capsys):
    args = ["explore", "--model", "llama3-8b", "--gpu", "h100", "--gpus", "32", "--seq", "4096",
            "--global-batch-tokens", "256K", "--framework", "megatron-core", "--check", "tp=2,cp=1,pp=4,dp=4,zero=3"]
    assert main(args) == 0
    out = capsys.readouterr().out
    line = next(x for x in out.splitlines() if x.startswith("--check"))
    assert "megatron-core cannot run it: ZeRO-3 with pp = 4" in line and "rule zero_with_pipeline" in line
    assert main(args + ["--json"]) == 0
    ans = json.loads(capsys.readouterr().out)["check"]
    assert ans["rule"]["rule"] == "zero_with_pipeline" and ans["rank"] is None


def test_check_of_a_runnable_layout_gives_rank_gap_and_why():
    res = run_explore(replace(SMALL, framework="megatron-core", check={"tp": 2, "pp": 4}))
    ans = res.as_dict()["check"]
    assert ans["rank"] >= 1 and ans["ratio_to_best"] >= 1
    assert ans["rank"] == 1 or ans["why"]["text"].startswith("#1 beats #")


def test_cli_table_fits_100_columns_and_shows_the_pareto_set(capsys):
    assert main(["explore", "--model", "llama3-8b", "--gpu", "h100", "--gpus", "32", "--seq", "4096",
                 "--global-batch-tokens", "256K"]) == 0
    out = capsys.readouterr().out
    assert max(len(x) for x in out.splitlines() if not x.startswith("--check")) <= 100
    assert "Pareto set" in out and "#1 beats #2" in out


def test_emit_nemo(capsys):
    assert main(["explore", "--model", "llama3-8b", "--gpu", "h100", "--gpus", "32", "--seq", "4096",
                 "--global-batch-tokens", "256K", "--emit", "nemo"]) == 0
    out = capsys.readouterr().out
    assert "trainer.strategy.tensor_model_parallel_size=" in out and "data.global_batch_size=64" in out


def test_gpu_range_and_progress(capsys):
    assert gpu_counts(4096, 16384, 8) == [4096, 8192, 16384] and gpu_counts(8, 24, 8) == [8, 16, 24]
    with pytest.raises(ModelcutError, match="must not exceed"):
        gpu_counts(16, 8, 8)
    seen = []
    results = run_explore_range(replace(SMALL, gpus=8), [8, 16, 32], lambda d, t: seen.append((d, t)))
    assert [r.request.gpus for r in results] == [8, 16, 32]
    assert all(d <= t for d, t in seen) and seen[-1][0] == seen[-1][1] > 0
    assert [d for d, _ in seen] == sorted(d for d, _ in seen)
    assert main(["explore", "--model", "llama3-8b", "--gpu", "h100", "--gpus", "8-32", "--seq", "4096",
                 "--global-batch-tokens", "256K"]) == 0
    out = capsys.readouterr().out
    assert "fastest layout per GPU count" in out and "Pareto" in out


def test_progress_reaches_the_total():
    seen = []
    run_explore(SMALL, lambda d, t: seen.append((d, t)))
    assert seen[0][0] == 0 and seen[-1][0] == seen[-1][1] and all(d <= t for d, t in seen)


def test_the_published_llama3_layout_is_within_5_percent_of_the_best():
    """The issue's acceptance: Llama 3 405B on 8,192 H100, 8K sequences, 16M tokens, llama3 stack."""
    req = ExploreRequest(LLAMA405, H100, 8192, 8192, 16 * 2**20, framework="llama3",
                         check={"tp": 8, "cp": 1, "pp": 16, "dp": 64})
    res = run_explore(req)
    caps = catalog.capabilities("llama3")
    for e in res.layouts:
        s = e.structure
        assert s.tp * s.cp * s.pp * s.dp == 8192 and e.peak_bytes <= res.exploration.limit_bytes
        assert not violations(caps, LLAMA405, tp=s.tp, cp=s.cp, pp=s.pp, dp=s.dp, vpp=s.vpp, schedule=s.schedule,
                              cp_kind=s.cp_kind if s.cp > 1 else None, zero=e.zero, recompute=e.recompute)
    assert res.checked and res.checked[0].step_time_s <= 1.05 * res.layouts[0].step_time_s


def test_nemo_automodel_runs_no_tensor_parallelism_on_moe_models():
    """NeMo AutoModel's MoE parallelizer asserts tp = 1 for its custom MoE models: the rule names
    it, dense models keep their tp, and the explorer ranks no MoE layout with tp > 1 on that stack."""
    from modelcut.core.explore.rules import violations
    from modelcut.service.explore import catalog_request, run_explore
    caps = catalog.capabilities("nemo-automodel")
    moe = catalog.model("qwen3-30b-a3b")
    bad = violations(caps, moe, tp=2, cp=1, pp=1, dp=4, ep=4, vpp=1, schedule=None, cp_kind=None, seq=4096,
                     sequence_parallel=True, zero=3, recompute="none")
    assert [v.rule for v in bad] == ["moe_tensor_parallel"] and "parallelizer" in bad[0].source
    assert not violations(caps, catalog.model("llama3-8b"), tp=2, cp=1, pp=1, dp=4, ep=1, vpp=1, schedule=None,
                          cp_kind=None, seq=4096, sequence_parallel=True, zero=3, recompute="none")
    assert catalog.capabilities("fsdp").moe_tensor_parallel
    ex = run_explore(catalog_request("automodel-qwen3-30b-a3b-8", top=3))
    assert ex.layouts and all(e.run.layout.tp == 1 for e in ex.layouts)


def test_nemo_24_07_is_nemo_with_the_layouts_its_megatron_core_ran(capsys):
    """The NeMo 24.07 rows' preset times as nemo does (the same step, the same memory) and offers the
    explorer only what core_r0.8.0 had: ZeRO-0/1 (no FSDP), even pipeline splits, no --recompute-modules."""
    from modelcut.service.explore import catalog_request, run_explore
    old, new = catalog.capabilities("nemo-24.07"), catalog.capabilities("nemo")
    assert old.zero == old.zero_with_pipeline == (0, 1) and 3 in new.zero
    assert old.interleave == "layers" and new.interleave == "layers+2"
    assert old.cp_kinds == ("ring",) and "allgather" in new.cp_kinds
    assert "layernorm+moe_act" not in old.recompute and "layernorm+moe_act" in new.recompute
    steps = []
    for fw in ("nemo-24.07", "nemo"):
        assert main(["predict", "--run", "nemo2407-llama3-70b-64", "--framework", fw, "--json"]) == 0
        d = json.loads(capsys.readouterr().out)
        steps.append((d["step_time_s"], d["memory"]["peak_bytes"]))
    assert steps[0] == steps[1]
    assert all(s.framework == "nemo-24.07" for rid, s in catalog.run_settings().items() if rid.startswith("nemo2407-"))
    ex = run_explore(catalog_request("nemo2407-llama3-70b-64")).exploration
    assert ex.layouts and all(e.zero <= 1 for e in ex.layouts)
    assert ex.rule_rejections.get("zero", 0) > 0
