"""Full recomputation of some layers (Megatron-core's --recompute-method block
--recompute-num-layers N, ``Training.recompute_layers``): the first N layers of each pipeline chunk
are recomputed, the rest run whole. Time, memory and FLOPs sit between none and full, move one way
with N, equal full's once N covers a chunk; what cannot take it is refused in one line."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given, settings, strategies as st

from modelcut import catalog
from modelcut.core.costs import flops
from modelcut.core.costs.kernels import Efficiency
from modelcut.core.errors import ModelcutError
from modelcut.core.memory import memory_report
from modelcut.core.plan import Stage
from modelcut.core.specs import Layout, Run, Training
from modelcut.core.step import default
from modelcut.core.step import predict as step_predict

H100 = catalog.hardware("h100")
EFF = Efficiency(0.86, 0.81, 1.0)
LLAMA8 = catalog.model("llama3-8b")
MIXTRAL = catalog.model("mixtral-8x7b")


def _run(model=LLAMA8, recompute="full", n=None, tp=1, pp=1, dp=8, ep=1, vpp=None, zero=None, seq=4096,
         batch=64, mb=1, gpus_per_node=8) -> Run:
    lay = Layout(tp=tp, pp=pp, dp=dp, ep=ep, vpp=vpp, zero=zero)
    return Run(model, "h100", lay, Training(seq_len=seq, global_batch=batch, micro_batch=mb, recompute=recompute,
                                            recompute_layers=n), gpus_per_node=gpus_per_node)


def _time(run, fw="megatron-core"):
    return default.predict(run, H100, EFF, catalog.framework(fw))


def _peak(run, fw="megatron-core"):
    return memory_report(run, H100, framework=catalog.framework(fw))["peak_bytes"]


def test_the_first_layers_of_each_chunk():
    """Stage.recomputed: the first min(N, layers) of the stage, its MoE ones counted where they fall."""
    st = Stage(index=0, device=0, layers=8, slots=8, first_layer=8, moe_layers=8, embedding=False, loss=False)
    full = Training(4096, 8, recompute="full")
    assert st.recomputed(MIXTRAL, full) == (0, 8)
    assert st.recomputed(MIXTRAL, replace(full, recompute_layers=3)) == (0, 3)
    assert st.recomputed(MIXTRAL, replace(full, recompute_layers=30)) == (0, 8)
    assert st.recomputed(LLAMA8, Training(4096, 8, recompute="selective")) == (0, 0)
    dsv3 = catalog.model("deepseek-v3")          # three dense layers first
    first = Stage(index=0, device=0, layers=8, slots=8, first_layer=0, moe_layers=5, embedding=True, loss=False)
    assert first.recomputed(dsv3, replace(full, recompute_layers=4)) == (3, 1)
    for stage, model in ((st, MIXTRAL), (first, dsv3)):       # layer by layer, the same rule
        for tr in (full, replace(full, recompute_layers=3), Training(4096, 8)):
            layers = range(stage.first_layer, stage.first_layer + stage.layers)
            assert sum(stage.recomputes(tr, i) for i in layers) == sum(stage.recomputed(model, tr))


@pytest.mark.parametrize("layout", [dict(), dict(pp=4, dp=2), dict(pp=4, dp=2, vpp=2), dict(zero=3)])
def test_between_none_and_full_and_full_once_a_chunk_is_covered(layout):
    """Pipeline-free, 1F1B, interleaved and ZeRO-3: none < N < full in time and full < N < none in
    activation memory; N as large as a chunk (or the model) is full recomputation exactly."""
    runs = {k: _run(recompute=r, n=n, **layout) for k, r, n in
            (("none", "none", None), ("some", "full", 2), ("all", "full", None), ("cover", "full", 32))}
    t = {k: _time(r).step_time_s for k, r in runs.items()}
    m = {k: _peak(r) for k, r in runs.items()}
    assert t["none"] < t["some"] < t["all"]
    assert m["all"] < m["some"] < m["none"]
    assert t["cover"] == pytest.approx(t["all"], rel=1e-12) and m["cover"] == pytest.approx(m["all"], rel=1e-12)


def test_each_recomputed_layer_adds_one_forward():
    """Without a pipeline the step grows by one layer's recomputed forward per layer and
    micro-batch: N = 1 and N = 2 differ by as much as N = 2 and N = 3."""
    t = [_time(_run(n=n, dp=8)).step_time_s for n in (1, 2, 3)]
    assert t[1] - t[0] == pytest.approx(t[2] - t[1], rel=1e-6)
    assert t[1] > t[0]


def test_an_moe_layers_exchange_repeats_only_where_it_is_recomputed():
    """Mixtral with expert parallelism: the all-to-all term grows with N (the recomputed forward
    repeats its dispatch and combine), from none's to full's."""
    a2a = {n: _time(_run(MIXTRAL, "full", n, dp=8, ep=8, seq=4096, batch=16)).breakdown.a2a_s for n in (1, 16)}
    a_none = _time(_run(MIXTRAL, "none", None, dp=8, ep=8, seq=4096, batch=16)).breakdown.a2a_s
    a_full = _time(_run(MIXTRAL, "full", None, dp=8, ep=8, seq=4096, batch=16)).breakdown.a2a_s
    assert a_none < a2a[1] < a2a[16] < a_full


def test_the_flops_count_the_recomputed_layers_only():
    """TFLOP/s (eq. 3's count under full recomputation) adds the forward of the recomputed layers:
    with pp 4 · vpp 2 and N = 1, eight of 32 layers, a quarter of full recomputation's extra work."""
    r = _run(n=1, pp=4, dp=2, vpp=2)
    p = _time(r)
    tr = r.training
    base = flops.megatron_model_flops(LLAMA8, tr.global_batch, tr.seq_len)
    extra = flops.recompute_flops(LLAMA8, tr.global_batch, tr.seq_len, "full")
    assert p.flops_per_step == pytest.approx(base + extra / 4, rel=1e-12)


@settings(max_examples=25, deadline=None)
@given(st.integers(1, 40), st.sampled_from([dict(), dict(pp=2, dp=4), dict(zero=3)]))
def test_more_layers_recomputed_never_faster_nor_heavier(n, layout):
    """Monotone in N: one more layer recomputed never shortens the step nor raises the peak."""
    n = min(n, 31)
    a, b = _run(n=n, **layout), _run(n=n + 1, **layout)
    assert _time(a).step_time_s <= _time(b).step_time_s * (1 + 1e-12)
    assert _peak(b) <= _peak(a) * (1 + 1e-12)


@pytest.mark.parametrize("kw, word", [
    (dict(recompute="selective", n=2), 'recompute_layers needs recompute = "full"'),
    (dict(recompute="none", n=2), 'recompute_layers needs recompute = "full"'),
])
def test_only_with_full_recomputation(kw, word):
    with pytest.raises(ModelcutError, match=word):
        _run(**kw)


def test_refusals_in_one_line():
    with pytest.raises(ModelcutError, match="whole number of layers"):
        Training(4096, 8, recompute="full", recompute_layers=0)
    with pytest.raises(ModelcutError, match="exceeds the model's layers"):
        _time(_run(n=33))
    with pytest.raises(ModelcutError, match="seed model recomputes every layer or none"):
        step_predict(_run(n=2), H100, "seed", eta=0.5)
    with pytest.raises(ModelcutError, match="DeepSpeed v0.3 ZeRO-3"):
        _time(_run(n=2, zero=3), "deepspeed-zero3")


def test_a_run_file_a_csv_row_and_the_api_name_it(tmp_path):
    """recompute_layers reads the same from RUN.toml, a runs CSV row and POST /api/predict, and
    the CSV's bad cell is one line naming the row."""
    from fastapi.testclient import TestClient

    from modelcut.service.runfile import load_run
    from modelcut.service.runs_csv import read_runs_csv
    from modelcut.web.app import create_app

    toml = tmp_path / "r.toml"
    toml.write_text('[model]\nname = "llama3-8b"\n[hardware]\ngpu = "h100"\n[layout]\ntp = 1\npp = 4\ndp = 2\n'
                    '[training]\nseq_len = 4096\nglobal_batch = 64\nrecompute = "full"\nrecompute_layers = 3\n')
    assert load_run(toml).training.recompute_layers == 3
    csv = tmp_path / "r.csv"
    csv.write_text("id,model,gpu,tp,pp,dp,seq_len,global_batch,micro_batch,recompute,recompute_layers,step_time_s\n"
                   "a,llama3-8b,h100,1,4,2,4096,64,1,full,3,10\n")
    assert read_runs_csv(csv)[0].run.training.recompute_layers == 3
    csv.write_text("id,model,gpu,tp,pp,dp,seq_len,global_batch,micro_batch,recompute,recompute_layers,step_time_s\n"
                   "a,llama3-8b,h100,1,4,2,4096,64,1,selective,3,10\n")
    with pytest.raises(ModelcutError, match=r"r\.csv:2.*recompute_layers needs recompute"):
        read_runs_csv(csv)
    body = {"model": "llama3-8b", "gpu": "h100", "layout": {"tp": 1, "pp": 4, "dp": 2},
            "training": {"seq_len": 4096, "global_batch": 64, "recompute": "full", "recompute_layers": 3}}
    with TestClient(create_app()) as client:
        ok = client.post("/api/predict", json=body)
        assert ok.status_code == 200 and any("first 3 layers" in n for n in ok.json()["notes"])
        body["training"]["recompute_layers"] = 0
        assert client.post("/api/predict", json=body).status_code == 422


def test_a_measured_tflops_counts_the_layers_recomputed():
    """A measured TFLOP/s in modelcut's own count (a runs CSV row without flop_convention) counts
    the block method's recomputed layers only, as predict's TFLOP/s does: the prediction's own
    TFLOP/s, taken as measured, gives back its step time."""
    from modelcut.analysis.measured import Measured, measured_step_time

    r = _run(n=2, pp=4, dp=2)
    p = _time(r)
    meas = Measured("x", "g", r, H100, "megatron-core", tflops=p.tflops_per_gpu)
    assert measured_step_time(meas) == pytest.approx(p.step_time_s, rel=1e-12)
