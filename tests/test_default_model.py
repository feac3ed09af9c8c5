"""The default step model: pipeline from the engine, exposure by framework, the catalog's runs."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given, settings, strategies as st

from modelcut import catalog
from modelcut.analysis.measured import catalog_measured, error_pct
from modelcut.catalog import profile_for, run_settings
from modelcut.core import step as stepmodel
from modelcut.core.errors import ModelcutError
from modelcut.core.costs.kernels import Efficiency
from modelcut.core.step.exposure import exposed_after, prefetch_timeline, serve_in_order
from modelcut.core.step.frameworks import Overlap
from modelcut.service.inputs import parse_overlap
from helpers import predict_default as predict

FRAMEWORKS = {n: catalog.framework(n) for n in catalog.framework_names()}
from modelcut.core.specs import Layout, Run, Training

A100 = catalog.hardware("a100")
H100 = catalog.hardware("h100")
EFF = Efficiency(0.75, 0.65, 0.6)
GPT = catalog.model("gpt-7.5b")


def run(tp=4, pp=2, dp=2, vpp=None, b=2, gb=32, rec="full", zero=0, model=GPT, sp=False) -> Run:
    return Run(model=model, gpu=A100.name, layout=Layout(tp=tp, pp=pp, dp=dp, vpp=vpp, zero=zero, sequence_parallel=sp),
               training=Training(seq_len=2048, global_batch=gb, micro_batch=b, recompute=rec))


def test_breakdown_sums_to_the_step():
    for fw in ("megatron-2021", "megatron-core", "nemo", "llama3"):
        p = predict(run(vpp=2), A100, EFF, fw)
        assert p.breakdown.total_s == pytest.approx(p.step_time_s, rel=1e-9)
        assert min(p.breakdown.as_dict().values()) >= -1e-12
        assert p.mode == "default" and p.vpp == 2 and p.schedule == "interleaved"


def test_sharded_data_parallel_term_never_rounds_below_zero():
    """ZeRO-3 without a pipeline takes its data-parallel term as the step less the compute stream's
    work: one GPU, no collective, a 16,651 s step (`modelcut predict` prints "16651.2040 s") whose
    difference rounded to -1.8e-12 s before commit ef2dfc7."""
    r = Run(model=catalog.model("gpt3-175b"), gpu="h800", layout=Layout(),
            training=Training(seq_len=131072, global_batch=32, micro_batch=4, precision="fp8"))
    p = predict(r, catalog.hardware("h800"), profile_for(H100).efficiency, "fsdp-compile")
    assert min(p.breakdown.as_dict().values()) >= 0.0
    assert p.breakdown.total_s == pytest.approx(p.step_time_s, rel=1e-12)


@pytest.mark.parametrize("gpn, tp, spans", [(4, 8, True), (8, 8, False), (4, 4, False), (4, 2, False)])
def test_tensor_parallelism_across_nodes_is_said(gpn, tp, spans):
    """predict takes a layout whose tensor-parallel groups reach past a node (the explorer keeps
    them inside one unless told), and says so: Llama 3 70B on 64 GH200 in nodes of four."""
    gh = catalog.hardware("gh200")
    r = Run(model=catalog.model("llama3-70b"), gpu="gh200", gpus_per_node=gpn,
            layout=Layout(tp=tp, pp=4, dp=64 // (4 * tp)),
            training=Training(seq_len=8192, global_batch=64, micro_batch=1, recompute="full"))
    p = predict(r, gh, profile_for(gh).efficiency, "megatron-core")
    said = [n for n in p.notes if n.startswith("tensor parallelism spans nodes")]
    assert bool(said) is spans
    if spans:
        assert f"groups of {tp} reach past a node of {gpn}" in said[0]


def test_gb200_is_the_b200_die_in_a_72_gpu_nvlink_domain():
    """The GB200 (NVIDIA's GB200 NVL72 specifications and DGX GB200 User Guide, hardware.toml) is
    the B200's die at 1,200 W: the B200's tables scaled by the dense peaks (2.5 against 2.25 PFLOP/s),
    the B200's sustained share (measured at ~980 W, below the limit), and one NVLink domain of 72.
    A run that counts a compute tray's 4 GPUs as its node is told what modelcut's node is."""
    from modelcut.core.costs.kernels import product_tflops
    gb, b = catalog.hardware("gb200-nvl72"), catalog.hardware("b200")
    assert gb.arch == b.arch and gb.per_node == 72 and gb.link_bw == b.link_bw and gb.mem_bytes == 186e9
    assert gb.sustained_frac == b.sustained_frac
    for dtype in ("bf16", "fp8"):
        assert product_tflops(4096, 4096, 4096, gb, 1, dtype) / product_tflops(4096, 4096, 4096, b, 1, dtype) == \
            pytest.approx(2.5 / 2.25)
    eff = profile_for(gb).efficiency
    notes, steps = {}, {}
    for gpn in (4, 72):
        r = Run(model=catalog.model("llama3-70b"), gpu="gb200", gpus_per_node=gpn,
                layout=Layout(tp=8, pp=2, dp=9, sequence_parallel=True),
                training=Training(seq_len=8192, global_batch=144, micro_batch=1))
        p = predict(r, gb, eff, "megatron-core")
        notes[gpn] = [n for n in p.notes if n.startswith("nodes of")]
        steps[gpn] = p.step_time_s
    assert notes[72] == [] and "gb200's fast links can join 72" in notes[4][0] and "gpus_per_node = 72" in notes[4][0]
    assert steps[4] > steps[72]          # tp 8 across trays of 4 goes over the network


def test_stepmodel_dispatches_the_default_mode():
    r = run()
    eff, fw = profile_for(A100).efficiency, catalog.framework(None)
    direct = predict(r, A100, eff, None)
    via = stepmodel.predict(r, A100, "default", efficiency=eff, framework=fw)
    assert via.step_time_s == pytest.approx(direct.step_time_s)
    faster = stepmodel.predict(r, A100, "default", eta=0.95, efficiency=eff, framework=fw)
    assert faster.step_time_s < via.step_time_s
    with pytest.raises(ModelcutError):
        stepmodel.predict(r, A100, "seed")        # the seed needs its η
    with pytest.raises(ModelcutError):
        stepmodel.predict(r, A100, "default", efficiency=eff)        # and the default model a stack


def test_seed_mode_is_untouched():
    from modelcut.analysis.validation import seed_eta
    pr = catalog.published_run("megatron-18.4b")
    p = stepmodel.predict(pr.run, A100, "seed", eta=seed_eta())
    assert p.mode == "seed" and p.breakdown.tp_s == pytest.approx(1.665, abs=0.01)   # the deck's 1.67 s
    assert p.step_time_s == pytest.approx(10.61, abs=0.01)


def test_overlapping_never_costs_time():
    r = run(pp=2, dp=4, gb=64)
    for k in ("grad_reduce", "p2p_async", "tp_comm"):
        on = predict(r, A100, EFF, "megatron-2021", {k: True}).step_time_s
        off = predict(r, A100, EFF, "megatron-2021", {k: False}).step_time_s
        assert on <= off + 1e-12, k


@settings(max_examples=15, deadline=None)
@given(g=st.floats(0.3, 0.99), m=st.floats(0.3, 0.99), n=st.floats(0.3, 0.99), k=st.floats(1.05, 2.0),
       which=st.sampled_from(["gemm", "mem", "net"]))
def test_a_faster_constant_never_slows_the_step(g, m, n, k, which):
    base = Efficiency(g, m, n)
    better = replace(base, **{which: min(getattr(base, which) * k, 1.0)})
    r = run(pp=2, dp=2, gb=16)
    assert predict(r, A100, better, "megatron-core").step_time_s <= predict(r, A100, base, "megatron-core").step_time_s * (1 + 1e-12)


def test_heavier_end_stages_come_from_embedding_and_loss():
    # 1 layer per chunk: the last chunk also carries the logits and the loss, so the pipeline runs
    # longer than with stages of equal weight would.
    r = run(tp=8, pp=4, dp=1, vpp=None, b=1, gb=16, model=catalog.model("gpt-1.7b"))
    p = predict(r, A100, EFF, "megatron-2021")
    assert p.stage_layers == (6, 6, 6, 6)
    assert p.breakdown.bubble_s > 0


def test_zero3_is_bound_by_its_gathers_when_compute_is_short():
    m = catalog.published_run("zero3-174.6b-1536")
    p = predict(m.run, A100, EFF, "deepspeed-zero3")
    params = 174.6e9
    gather = (1536 - 1) / 1536 * params * 2 / (A100.net_bw * EFF.net)
    assert p.step_time_s >= 3 * gather * 0.98      # forward gather, backward gather, reduce-scatter
    assert p.breakdown.dp_s > p.breakdown.compute_s


def test_serving_and_prefetch_timelines():
    assert serve_in_order([(0, 1), (0.5, 1), (5, 1)]) == pytest.approx(6)
    assert exposed_after(2.0, [(0, 1), (0.5, 1)], True) == pytest.approx(0.0)
    assert exposed_after(2.0, [(0, 1), (0.5, 1)], False) == pytest.approx(2.0)
    # two tasks of 1 s compute, 1 s gather each: prefetching hides the second gather
    assert prefetch_timeline([(1, 1, True), (1, 1, True)])[0] == pytest.approx(3)
    assert prefetch_timeline([(1, 1, False), (1, 1, False)])[0] == pytest.approx(4)


def test_overlap_options_parse_and_refuse():
    assert parse_overlap("grad_reduce=off, tp_comm=on") == {"grad_reduce": False, "tp_comm": True}
    assert parse_overlap("tp_comm") == {"tp_comm": True}        # a key alone: on, as the stacks' flags
    assert parse_overlap("tp_comm_overlap: true, overlap_grad_reduce: false") == {"tp_comm": True,
                                                                                 "grad_reduce": False}   # YAML lines
    assert parse_overlap("none") == dict.fromkeys(("grad_reduce", "param_gather", "p2p_async", "tp_comm"), False)
    assert parse_overlap(" All ") == dict.fromkeys(("grad_reduce", "param_gather", "p2p_async", "tp_comm"), True)
    for bad in ("grad=on", "tp_comm=maybe", "=on"):
        with pytest.raises(ModelcutError):
            parse_overlap(bad)
    with pytest.raises(ModelcutError):
        Overlap().with_options(nope=True)
    with pytest.raises(ModelcutError):
        predict(run(), A100, EFF, "megatron-1999")


def test_every_catalog_run_has_settings_and_a_prediction():
    names = {pr.id for pr in catalog.published_runs()}
    assert names == set(run_settings())
    assert all(s.framework in FRAMEWORKS for s in run_settings().values())


def test_validation_set_out_of_sample_and_in_sample():
    """Every validated published run, under the shipped shared profile (two constants) and, out
    of sample, under the constants of the fold that left the run's source out. Issue 13 asks for
    a leave-one-source-out mean |error| of at most 5 % (largest 12 %) and an in-sample mean of at
    most 2.5 %; the model is not there yet (the closing note of issue 13 names the sources and
    mechanisms). These are the bars it holds today, so that a change that makes it worse fails."""
    from modelcut.service.validation import default_table
    t = default_table()
    s = t.summary
    assert s["overall"]["loso"]["runs"] == s["overall"]["default"]["runs"] == len(catalog_measured())
    assert s["overall"]["loso"]["mean_abs_pct"] <= 9.0
    assert s["overall"]["default"]["mean_abs_pct"] <= 8.0
    assert abs(s["overall"]["loso"]["mean_signed_pct"]) <= 2.0     # no overall bias
    assert s["signs"]["low"] > 10 and s["signs"]["high"] > 10        # errors of both signs
    # the constants barely move when a source is left out: the errors are the physics', per source
    gemms = [c[1] for c in profile_for(A100).cv]
    assert max(gemms) - min(gemms) < 0.06


#: The deck's runs outside 6 %, the bound each holds today, and why (issue 13's closing note).
DECK_OUTSIDE = {
    "megatron-39.1b": 8.0,           # Narayanan et al. Table 1 predicted too slow with the shared
    "megatron-1t": 8.0,              # constants; the Megatron-LM README of January 2021 reports the
                                     # same layouts 7.8 % and 5.8 % slower (128 and 154 TFLOP/s),
                                     # within 0.2 % and 2.0 % of modelcut (docs/default-model.md)
}


@pytest.mark.parametrize("rid", [pr.id for pr in catalog.published_runs("deck")])
def test_deck_runs_within_six_percent(rid):
    m = next(x for x in catalog_measured() if x.id == rid)
    p = predict(m.run, m.hw, profile_for(m.hw).efficiency, m.framework)
    assert abs(error_pct(m, p)) <= DECK_OUTSIDE.get(rid, 6.0)


def test_validate_default_prints_both_models_and_the_summary(capsys):
    import json
    from modelcut.cli import main
    assert main(["validate", "--mode", "default", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert len(d["runs"]) == len([r for r in catalog.published_runs() if r.in_validation])
    assert {r["set"] for r in d["runs"]} == {"deck", "dev"}
    shown = {r["id"] for r in d["runs"]}
    assert all(pr.id not in shown for pr in catalog.published_runs() if not pr.validate)
    assert any(pr.id in shown for pr in catalog.published_runs() if pr.precision == "fp8")   # scored in FP8
    s = d["summary"]
    assert s["deck"]["default"]["max_abs_pct"] <= 8.0
    assert s["signs"]["low"] > 0 and s["signs"]["high"] > 0          # errors of both signs
    assert s["overall"]["default"]["mean_abs_pct"] < s["overall"]["seed"]["mean_abs_pct"]
    assert s["overall"]["loso"]["mean_abs_pct"] < s["overall"]["seed"]["mean_abs_pct"]
    assert d["profiles"]["*"]["cv"]                                    # leave-one-source-out is reported
    assert all(r["loso"] is not None for r in d["runs"])              # every run out of sample too
    capsys.readouterr()                                                # drop the JSON
    assert main(["validate", "--mode", "default"]) == 0
    text = capsys.readouterr().out
    assert text.index("Out of sample") < text.index("Every run")      # out of sample leads


def test_predict_default_from_a_run_file(capsys):
    import json
    from pathlib import Path
    from modelcut.cli import main
    f = str(Path(__file__).parent / "data" / "gpt3-175b.toml")
    assert main(["predict", f, "--mode", "default", "--framework", "megatron-2022", "--overlap", "p2p_async=on",
                 "--budget", "--json"]) == 0
    d = json.loads(capsys.readouterr().out)
    assert d["mode"] == "default" and d["budget"]["dominant"] == "compute_s"
    assert main(["predict", f, "--mode", "default", "--framework", "jax"]) == 2
    assert main(["predict", f, "--mode", "seed", "--framework", "nemo"]) == 2  # seed mode takes no framework
    assert main(["validate", "--budget"]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 3 and all(e.startswith("modelcut: error") for e in err)


def test_validate_budget_applies_each_rows_overlaps():
    """A row's error budget starts from the row as validated, its overlap overrides included:
    validate's budget for a Nemotron-4 row (tp_comm on) is predict --run's, line for line."""
    from modelcut.analysis.budget import error_budget
    from modelcut.service import validation
    m = next(x for x in catalog_measured() if x.id == "nemotron4-15b-768")
    assert m.overlap == {"tp_comm": True}
    table = validation.default_table(budget=True)
    lines = {(ln.input, ln.alternative): ln.change_pct for ln in table.budgets[m.id].lines}
    assert ("overlap tp_comm", "off") in lines and ("overlap tp_comm", "on") not in lines
    own = error_budget(m.run, m.hw, profile_for(m.hw).efficiency, m.framework, m.overlap)
    assert lines == {(ln.input, ln.alternative): ln.change_pct for ln in own.lines}


def test_ring_latency_follows_nccls_model():
    """(n − 1)·α is NCCL's ring latency: base + intra-node steps + inter-node steps."""
    from modelcut.core.costs import comm as dm
    assert dm.ring_alpha(1, 8) == 0.0
    n, k = 64, 8
    total = (n - 1) * dm.ring_alpha(n, k)
    nodes = n // k
    t9 = dm.NCCL_2_9
    expected = t9.ring_base + (n - nodes) * t9.ring_nvlink + (nodes - 1) * t9.ring_net
    assert total == pytest.approx(expected)
    # More ranks across more nodes: the ring's latency grows.
    assert 2047 * dm.ring_alpha(2048, 8) > 1023 * dm.ring_alpha(1024, 8) > total


def test_zero3_step_grows_with_ring_latency_at_fixed_work_per_rank():
    """Same per-GPU batch and bytes on twice the ranks: only the ring latency differs, so the
    step cannot get shorter."""
    base = next(m for m in catalog_measured() if m.id == "zero3-174.6b-768")
    r = base.run
    eff = profile_for(base.hw).efficiency
    big = replace(r, layout=replace(r.layout, dp=r.layout.dp * 2),
                  training=replace(r.training, global_batch=r.training.global_batch * 2))
    t1 = predict(r, base.hw, eff, base.framework).step_time_s
    t2 = predict(big, base.hw, eff, base.framework).step_time_s
    assert t2 > t1


def test_fsdp_over_whole_nodes_uses_every_port():
    """FSDP with no model parallelism over 16 whole nodes: its rings use the eight ports of each
    node (comm.collective_bandwidth), so the step is far shorter than with one port per GPU,
    and the data-parallel time is what ~8× the bandwidth makes it."""
    r = Run(model=catalog.model("gpt3-175b"), gpu=A100.name, layout=Layout(tp=1, pp=1, dp=128, zero=3),
            training=Training(seq_len=2048, global_batch=256, micro_batch=2, recompute="full"))
    fsdp = FRAMEWORKS["fsdp"]
    many = predict(r, A100, EFF, fsdp)
    one = predict(r, A100, EFF, replace(fsdp, multi_nic_rings=False))
    assert many.step_time_s < one.step_time_s
    assert one.breakdown.dp_s > one.breakdown.compute_s       # one port: bound by the gathers
    assert many.breakdown.dp_s < 0.2 * many.breakdown.compute_s  # eight: hidden behind compute
    # Tensor parallelism filling the node leaves one member per node: the ports do not help.
    tp8 = replace(r, layout=Layout(tp=8, pp=1, dp=16, zero=3, sequence_parallel=True))
    assert predict(tp8, A100, EFF, fsdp).step_time_s == pytest.approx(
        predict(tp8, A100, EFF, replace(fsdp, multi_nic_rings=False)).step_time_s)


def test_context_parallel_form_defaults_to_the_frameworks():
    """A layout that names no cp_kind takes the stack's: the ring for megatron-core and nemo
    (--cp-comm-type p2p), the all-gather for llama3; a named form always wins."""
    model = catalog.model("llama3-8b")

    def r(kind):
        return Run(model=model, gpu=H100.name, layout=Layout(tp=4, cp=8, sequence_parallel=True, cp_kind=kind),
                   training=Training(seq_len=131072, global_batch=8, micro_batch=1, recompute="none"))

    for fw, form in (("megatron-core", "ring"), ("nemo", "ring"), ("llama3", "allgather"), ("fsdp", "allgather")):
        assert FRAMEWORKS[fw].cp_kind == form
        assert predict(r(None), H100, EFF, fw).step_time_s == pytest.approx(predict(r(form), H100, EFF, fw).step_time_s)
    ring, gather = (predict(r(k), H100, EFF, "nemo") for k in ("ring", "allgather"))
    assert ring.breakdown.cp_s < gather.breakdown.cp_s
    assert r(None).layout.cp_form == "allgather"        # seed mode and memory without a framework


@pytest.mark.parametrize("rid", ["megatron-7.5b", "megatron-18.4b", "megatron-readme-7.5b", "megatron-readme-18b"])
def test_the_tree_moves_the_rows_it_wins_for_by_under_half_a_percent(rid, monkeypatch):
    """docs/default-model.md, "Collectives": NCCL's tree wins a data-parallel all-reduce in four
    catalog rows, Megatron 2021's 7.5B and 18.4B (Table 1 and the README), and moves none of
    them by 0.5 %: the step with the tree priced out of reach (the ring alone) is within 0.5 %."""
    from modelcut.core.costs import comm as dm
    base = next(m for m in catalog_measured() if m.id == rid)
    eff = profile_for(base.hw).efficiency
    collective, wins = dm.collective, []

    def spy(kind, n, nbytes, bw, hw, alpha=0.0, inside=False, net=1.0, per_node=None, tuner=dm.NCCL_2_9):
        t = collective(kind, n, nbytes, bw, hw, alpha, inside, net, per_node, tuner)
        wins.append(t < collective(kind, n, nbytes, bw, hw, alpha, inside, net, None, tuner))
        return t
    monkeypatch.setattr(dm, "collective", spy)
    picked = predict(base.run, base.hw, eff, base.framework).step_time_s
    assert any(wins)                        # the tree wins at least one reduction of this row
    monkeypatch.setattr(dm, "tree_allreduce", lambda *a, **k: float("inf"))
    ring = predict(base.run, base.hw, eff, base.framework).step_time_s
    assert picked <= ring and ring / picked - 1 < 0.005
