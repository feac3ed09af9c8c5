"""Per-kernel times from measured tables: matrix products by shape, tile and wave quantization,
attention kernels by sequence length, collectives by message size."""

from __future__ import annotations

import math
import statistics

import pytest
from hypothesis import given, settings, strategies as st

from modelcut import catalog
from modelcut.core.costs.kernels import (UNMEASURED_FRACTION, Efficiency, attention_time, gemm_fwd_bwd, gemm_time,
                                         generation, hbm_bandwidth, mem_time, product_tflops)
from modelcut.core.costs.tables import ATTENTION_TILE, GemmCurve, quantization, short_sequence_tflops
from modelcut.core.errors import ModelcutError

A100 = catalog.hardware("a100")
H100 = catalog.hardware("h100")
EFF = Efficiency(0.8, 0.7, 1.0)


def test_full_waves_of_full_tiles_lose_nothing():
    q, extra = quantization(128 * 108, 256, 4096, A100.sms)   # 108 tiles of 128 x 256, one wave
    assert q == pytest.approx(1.0) and extra == 0


def test_one_tile_too_many_wastes_most_of_a_wave():
    q, _ = quantization(128 * 109, 128, 8192, A100.sms)
    assert q < 1.0


def test_small_product_uses_split_k_and_pays_the_reduction():
    q, extra = quantization(256, 512, 65536, A100.sms)
    assert q > 32 / 108 - 1e-12 and extra > 0


def test_the_grid_returns_its_measurements():
    """At a measured shape the table gives the measurement (XLA's sm_90 bf16: 780.2 at 4096³,
    641.0 at 2048³, 252.8 at 1024³), times the share of a burst the device sustains."""
    sus = H100.sustained_frac
    assert 0.8 < sus < 1
    assert product_tflops(4096, 4096, 4096, H100) == pytest.approx(780.19 * sus, rel=1e-3)
    assert product_tflops(2048, 2048, 2048, H100) == pytest.approx(641.04 * sus, rel=1e-3)
    assert product_tflops(1024, 1024, 1024, H100) == pytest.approx(252.76 * sus, rel=1e-3)


def test_beyond_the_grid_the_throughput_holds_and_quantization_rules():
    big = product_tflops(16384, 16384, 16384, H100) / H100.sustained_frac
    assert 0.75 * 989 < big < 0.85 * 989
    # a product one tile wider than a wave: quantization costs it
    aligned, ragged = product_tflops(8192, 8192, 8192, H100), product_tflops(8192 + 64, 8192, 8192, H100)
    assert ragged < aligned


def test_below_the_grid_the_time_holds():
    t256 = gemm_time(256, 256, 256, H100, EFF)
    assert gemm_time(64, 256, 256, H100, EFF) == pytest.approx(t256)


def test_the_square_rule_reproduces_the_h100_grid():
    """The A100 table is square products only; a product is taken at the square of the same work.
    On the H100 grid, the 5 square points reproduce the 27 measured shapes whose dimensions are all
    at least 1024 (a transformer's) to a median 6 % and at most 15 %."""
    grid = H100.kernels.gemm["bf16"]
    sq = [(s, grid.tflops(s, s, s)) for s in (256, 512, 1024, 2048, 4096)]
    curve = GemmCurve.from_points("h100-squares", H100.sms, sq)
    dims = (1024, 2048, 4096)
    errs = [abs(math.log(curve.tflops(m, n, k) / grid.tflops(m, n, k))) for m in dims for n in dims for k in dims]
    assert math.exp(statistics.median(errs)) - 1 < 0.06 and math.exp(max(errs)) - 1 < 0.15


def test_a100_is_held_at_its_maximum_achievable_matmul():
    sus = A100.sustained_frac
    assert product_tflops(8192, 8192, 8192, A100) == pytest.approx(271.2 * sus)
    assert 200 * sus < product_tflops(4096, 4096, 4096, A100) <= 271.2 * sus


def test_an_accelerator_without_a_table_runs_at_the_typical_share_of_peak():
    tpu = catalog.hardware("tpu-v4")
    q = quantization(8192, 8192, 8192, tpu.sms)[0]
    assert tpu.sustained_frac == 1.0      # no sustained measurement: the typical share alone
    assert product_tflops(8192, 8192, 8192, tpu) == pytest.approx(UNMEASURED_FRACTION * q * tpu.peak_flops_16 / 1e12)


@settings(max_examples=60, deadline=None)
@given(m=st.integers(1, 40000), n=st.integers(1, 40000), k=st.integers(1, 40000))
def test_gemm_never_beats_either_roof(m, n, k):
    for hw in (H100, A100):
        t = gemm_time(m, n, k, hw, EFF)
        assert t >= 2 * m * n * k / (EFF.gemm * hw.peak_flops_16) * (1 - 1e-12)
        assert t >= 2 * (m * k + k * n + m * n) / (EFF.mem * hbm_bandwidth(hw)) * (1 - 1e-12)


def test_backward_products_have_the_transposed_shapes():
    f, dg, wg = gemm_fwd_bwd(4096, 12288, 3072, A100, EFF)
    assert f == gemm_time(4096, 12288, 3072, A100, EFF)
    assert dg == gemm_time(4096, 3072, 12288, A100, EFF)
    assert wg == gemm_time(3072, 12288, 4096, A100, EFF)


def test_memory_bound_time_and_efficiency_checks():
    assert mem_time(2e9, A100, EFF) == pytest.approx(2e9 / (0.7 * hbm_bandwidth(A100)))
    with pytest.raises(ModelcutError):
        mem_time(-1, A100, EFF)
    for bad in (0, 1.5, -0.1, True, "0.5"):
        with pytest.raises(ModelcutError):
            Efficiency(bad, 0.5, 0.5)


def test_flash_attention_runs_at_its_measured_rate():
    """FlashAttention-3 paper, H100: causal head-dim-128 forward 602 TFLOP/s at 8k; the FLOPs the
    benchmark counts, 4·b·h·s²·d halved for the mask; backward 2.5 × forward at its own rate."""
    att = attention_time("flash3", 2, 16, 8192, 8192, 128, True, False, H100, EFF)
    flops = 4 * 2 * 16 * 8192 * 8192 * 128 / 2
    sus = H100.sustained_frac            # the paper's burst rate, at the clocks the device sustains
    assert att.fwd == pytest.approx(flops / (EFF.gemm * sus * 602e12), rel=0.02)
    full = attention_time("flash3", 2, 16, 8192, 8192, 128, False, False, H100, EFF)
    assert full.fwd == pytest.approx(2 * flops / (EFF.gemm * sus * 646e12), rel=0.02)
    assert att.bwd > 2.5 * att.fwd   # the backward's rate is below the forward's


def test_short_sequences_are_slower_per_flop():
    short = attention_time("cudnn", 32, 16, 512, 512, 128, True, False, H100, EFF)
    long = attention_time("cudnn", 1, 16, 16384, 16384, 128, True, False, H100, EFF)
    per_flop = lambda a, s, b: a.fwd / (b * s * s)  # noqa: E731
    assert per_flop(short, 512, 32) > 1.5 * per_flop(long, 16384, 1)


@settings(max_examples=80, deadline=None)
@given(causal=st.booleans(), k0=st.integers(2, 8), r0=st.floats(50, 900), gain=st.floats(1.0, 2.0),
       frac=st.floats(0.01, 1.0))
def test_below_the_shortest_measurement_a_block_of_queries_pays_its_fixed_cost(causal, k0, r0, gain, frac):
    """Below the table's shortest sequence a block of queries takes a + b·n for its n key blocks
    (tables.short_sequence_tflops): the rate is the measurement's at that sequence, falls as the
    sequence shortens, stays positive, and reproduces the line through the two measurements."""
    s0, s1, r1 = k0 * ATTENTION_TILE, 2 * k0 * ATTENTION_TILE, r0 * gain
    assert short_sequence_tflops(s0, causal, s0, r0, s1, r1) == pytest.approx(r0)
    s = max(1.0, s0 * frac)
    r = short_sequence_tflops(s, causal, s0, r0, s1, r1)
    assert 0 < r <= r0 * (1 + 1e-12)
    assert short_sequence_tflops(s / 2, causal, s0, r0, s1, r1) <= r * (1 + 1e-12)
    # the line through the two measured points' times a block of queries takes
    blocks = (lambda v: ((v / 128 + 1) / 2, v / 256)) if causal else (lambda v: (v / 128, v / 128))
    (n0, c0), (n1, c1), (n, c) = blocks(s0), blocks(s1), blocks(s)
    b = (c1 / r1 - c0 / r0) / (n1 - n0)
    a = c0 / r0 - b * n0
    if a > 0 and b > 0:
        assert r == pytest.approx(c / (a + b * n))
    else:       # a rate that does not fall with the sequence: held
        assert r == r0


def test_the_attention_table_below_its_shortest_sequence():
    """cuDNN 9.1 on the H100 (head 64, causal, forward): 225 TFLOP/s at 512 tokens and 288 at
    1,024. At 384 tokens a block of queries runs 2 key blocks for 1.5 blocks' worth of pairs:
    a + 2b with a, b from 2.5 blocks in 2/225 and 4.5 in 4/288 (time units per block's pairs)."""
    curves = H100.kernels.attention["cudnn"]
    assert curves.tflops("fwd", True, 64, 512) == pytest.approx(225.0)
    b = (4 / 288 - 2 / 225) / 2
    a = 2 / 225 - 2.5 * b
    assert curves.tflops("fwd", True, 64, 384) == pytest.approx(1.5 / (a + 2 * b))
    assert 190 < curves.tflops("fwd", True, 64, 384) < 200
    # held beyond the longest measurement
    assert curves.tflops("fwd", True, 64, 1 << 20) == curves.tflops("fwd", True, 64, 16384)


def test_unfused_attention_moves_the_score_matrix():
    b, a, s, d = 4, 8, 2048, 128
    att = attention_time("unfused", b, a, s, s, d, True, True, A100, EFF)
    scores = b * a * s * s
    assert att.fwd_mem == pytest.approx(scores * (4 + 5) / (EFF.mem * hbm_bandwidth(A100)))
    assert att.bwd_mem == pytest.approx(scores * (5 + 6) / (EFF.mem * hbm_bandwidth(A100)))
    no_drop = attention_time("unfused", b, a, s, s, d, True, False, A100, EFF)
    assert no_drop.fwd < att.fwd


def test_attention_errors():
    with pytest.raises(ModelcutError):
        attention_time("sparse", 1, 1, 128, 128, 64, True, False, A100, EFF)
    with pytest.raises(ModelcutError):
        attention_time("flash3", 1, 1, 128, 128, 64, True, False, A100, EFF)   # FlashAttention-3 is Hopper-only
    assert generation(A100) == "ampere" and generation(H100) == "hopper"


def test_collectives_inside_a_node_follow_the_measured_curve():
    """nccl-tests on 8 × H100 (NCCL 2.29.2): an all-reduce of 512 MiB takes 2,112 µs."""
    curves = H100.kernels.collectives
    assert curves.time("all-reduce", 8, 512 * 2**20) == pytest.approx(2112.02e-6, rel=1e-6)
    small, large = curves.time("all-gather", 8, 1024), curves.time("all-gather", 8, 2**30)
    assert 5e-6 < small < 30e-6 and large > 1e-3
    assert curves.time("all-reduce", 3, 1e6) is None   # no 3-rank curve: the caller's ring model


def test_hbm_bandwidth_is_the_measured_share_of_the_datasheet():
    """STREAM copy/triad reach 85-89 % of the datasheet's HBM bandwidth (hardware.toml sources)."""
    for hw in (A100, H100):
        assert 0.8 < hbm_bandwidth(hw) / hw.mem_bw < 0.95


def test_a_device_of_an_architecture_scales_its_tables():
    """A device without its own measurement computes at its peak over the measuring device's
    (an H200 as an H100 SXM; a slower-linked H800 stretches the collectives above the floor)."""
    from modelcut.core.costs import comm
    h200, h800 = catalog.hardware("h200"), catalog.hardware("h800")
    assert product_tflops(4096, 4096, 4096, h200) == pytest.approx(product_tflops(4096, 4096, 4096, H100))
    big, small = 256 * 2 ** 20, 1024
    slow = comm.collective("all-gather", 8, big, h800.link_bw, h800, inside=True)
    fast = comm.collective("all-gather", 8, big, H100.link_bw, H100, inside=True)
    assert slow == pytest.approx(fast * H100.link_bw / h800.link_bw, rel=0.01)
    assert comm.collective("all-gather", 8, small, h800.link_bw, h800, inside=True) == pytest.approx(
        comm.collective("all-gather", 8, small, H100.link_bw, H100, inside=True), rel=0.05)


def test_the_fp8_ratio_the_docs_quote_is_the_b200_tables():
    """kernels.toml and docs/fp8.md quote B200's measured FP8/bf16 ratio: 1.0 at 256³, 1.45 at
    2048³, 1.95 at 4096³ (the ratio the H100 FP8 table borrows)."""
    b200 = catalog.hardware("b200")
    ratio = {s: product_tflops(s, s, s, b200, dtype="fp8") / product_tflops(s, s, s, b200) for s in (256, 2048, 4096)}
    assert ratio[256] == pytest.approx(1.0, abs=0.05)
    assert ratio[2048] == pytest.approx(1.45, abs=0.01)
    assert ratio[4096] == pytest.approx(1.95, abs=0.01)


def test_megatron_causal_softmax_reads_the_lower_triangle():
    """Megatron-LM's fused causal softmax (its unfused attention path) reads each score row up to the
    query, (s + 1)/(2s) of it, within its limits (16 < s <= 2048, s and b·heads multiples of 4), else
    the whole row; its unfused attention is then faster, by the softmax bytes alone."""
    from modelcut import catalog
    from modelcut.core.costs.kernels import Efficiency, attention_time, causal_softmax_rows
    assert causal_softmax_rows(2048, 2048, 32, 2048) == (2048 + 1) / 4096
    assert causal_softmax_rows(4096, 4096, 32, 2048) == 1.0      # past the kernel's limit
    assert causal_softmax_rows(2048, 2048, 30, 2048) == 1.0      # b·heads not a multiple of 4
    assert causal_softmax_rows(1024, 2048, 32, 2048) == 1.0      # not self-attention
    assert causal_softmax_rows(2048, 2048, 32, 0) == 1.0         # a stack without the kernel
    for name in ("megatron-2021", "megatron-2021-torch-ddp", "megatron-2022", "megatron-deepspeed",
                 "megatron-deepspeed-2022"):
        assert catalog.framework(name).causal_softmax_max_seq == 2048
    assert catalog.framework("fsdp").causal_softmax_max_seq == 0
    hw, eff = catalog.hardware("a100"), Efficiency(0.86, 0.8, 1.0)
    whole = attention_time("unfused", 1, 32, 2048, 2048, 128, True, True, hw, eff)
    rows = attention_time("unfused", 1, 32, 2048, 2048, 128, True, True, hw, eff, softmax_max_seq=2048)
    assert rows.fwd < whole.fwd and rows.bwd < whole.bwd
    assert rows.fwd_math == whole.fwd_math and rows.bwd_math == whole.bwd_math     # the products alike
    # not causal: the whole row either way
    nc = attention_time("unfused", 1, 32, 2048, 2048, 128, False, True, hw, eff, softmax_max_seq=2048)
    assert nc.fwd == attention_time("unfused", 1, 32, 2048, 2048, 128, False, True, hw, eff).fwd
