"""The product tables against an independent sweep of single products by shape
(``validate --kernels``' third table): another project's harness on A100 and H100, bf16 and FP8,
never fitted to."""

from __future__ import annotations

import json
from dataclasses import replace

import pytest
from hypothesis import given, settings, strategies as st

from modelcut.analysis.kernel_checks import sweep_rows, sweep_summary, sweep_time_ms
from modelcut.catalog import kernel_checks as kc
from modelcut.catalog.kernel_checks import GemmSweep, SweepPoint, gemm_sweeps
from modelcut.cli import main
from modelcut.core.errors import ModelcutError


def _sweep(sweep_id: str) -> GemmSweep:
    return next(s for s in gemm_sweeps() if s.id == sweep_id)


def test_the_sweeps_load_with_their_shapes_and_sources():
    """A100 bf16 (m up to 8192), H100 bf16 and FP8 (m up to 16384), n and k 1024-16384; every FP8
    call carries its measured input quantization, which leaves a positive product time."""
    got = {s.id: s for s in gemm_sweeps()}
    assert set(got) == {"aic-gemm-a100-bf16", "aic-gemm-h100-bf16", "aic-gemm-h100-fp8"}
    assert len(got["aic-gemm-a100-bf16"].points) == 784
    assert len(got["aic-gemm-h100-bf16"].points) == len(got["aic-gemm-h100-fp8"].points) == 980
    for s in got.values():
        assert "095f58a51c4ca8e61b66ec108d86f223f8d559ce" in s.source and s.date
        assert all(1024 <= p.m <= 16384 and 1024 <= p.n <= 16384 and 1024 <= p.k <= 16384 for p in s.points)
    assert all(0 < p.quant_ms < p.ms for p in got["aic-gemm-h100-fp8"].points)
    assert all(p.quant_ms == 0 for p in got["aic-gemm-h100-bf16"].points)


def test_the_product_tables_agree_with_the_independent_sweeps():
    """The tables (NVIDIA's A100 cuBLAS chart by the square-size rule; XLA's sm_90 grid; its FP8
    built from B200's measured FP8/bf16 ratio) and the sweep agree at training shapes: the median
    and the time-weighted ratio within 10 %, four shapes in five within 0.85-1.25, and FP8's
    speed-up over bf16 within 5 % of the measured one."""
    rows = {r.check: r for r in sweep_rows()}
    for r in rows.values():
        assert 0.9 < r.median_ratio < 1.1, r
        assert 0.9 < r.time_ratio < 1.1, r
        assert 0.85 < r.p10_ratio <= r.median_ratio <= r.p90_ratio < 1.25, r
    fp8 = rows["aic-gemm-h100-fp8"]
    assert fp8.speedup_shapes == 980
    assert fp8.predicted_speedup == pytest.approx(fp8.measured_speedup, rel=0.05)
    assert rows["aic-gemm-h100-bf16"].measured_speedup is None


def test_sweep_time_is_the_tables_burst_rate():
    """modelcut's side is the table's burst rate: a sustained share below 1 does not change it."""
    s = _sweep("aic-gemm-h100-bf16")
    t = sweep_time_ms(s, 4096, 8192, 4096)
    assert sweep_time_ms(replace(s, hw=replace(s.hw, sustained_frac=0.5)), 4096, 8192, 4096) == pytest.approx(t)
    assert 2 * 4096 * 8192 * 4096 / (t * 1e-3) < s.hw.peak_flops_16


@settings(max_examples=30, deadline=None)
@given(c=st.floats(0.25, 4.0), picks=st.lists(st.integers(0, 979), min_size=3, max_size=40, unique=True))
def test_the_summary_scales_with_the_measurements(c, picks):
    """Measurements c times modelcut's own times give every ratio 1/c: median, percentiles and
    time-weighted alike; the speed-up of a sweep against itself is 1."""
    base = _sweep("aic-gemm-h100-bf16")
    pts = tuple(SweepPoint(p.m, p.n, p.k, c * sweep_time_ms(base, p.m, p.n, p.k)) for p in
                (base.points[i] for i in picks))
    s = replace(base, points=pts)
    r = sweep_summary(s, s)
    for v in (r.median_ratio, r.p10_ratio, r.p90_ratio, r.time_ratio, r.worst_ratio):
        assert v == pytest.approx(1 / c, rel=1e-9)
    assert r.measured_speedup == pytest.approx(1.0) and r.predicted_speedup == pytest.approx(1.0)
    assert r.shapes == len(picks) == r.speedup_shapes


def test_cli_and_json_carry_the_sweeps(capsys):
    assert main(["validate", "--kernels", "--json"]) == 0
    out = json.loads(capsys.readouterr().out)
    assert {r["check"] for r in out["sweeps"]} == set(out["sweep_sources"])
    assert main(["validate", "--kernels"]) == 0
    assert "Product sweeps by shape" in capsys.readouterr().out


@pytest.mark.parametrize("entry,match", [
    ({"dtype": "int8"}, "dtype must be one of"),
    ({"file": "kernels/nccl_single_node.csv"}, "lacks the columns"),
    ({"device": "tpu-v4"}, "no bf16 rows for tpu-v4"),
])
def test_bad_sweep_entries_are_one_line_errors(monkeypatch, entry, match):
    e = {"id": "x", "device": "a100-sxm4-80gb", "dtype": "bf16", "file": "kernels/gemm_sweep_aiconfigurator.csv",
         "source": "s"} | entry
    monkeypatch.setattr(kc, "_toml", lambda: {"gemm_sweep": [e]})
    kc.gemm_sweeps.cache_clear()
    try:
        with pytest.raises(ModelcutError, match=match):
            kc.gemm_sweeps()
    finally:
        kc.gemm_sweeps.cache_clear()
