"""Per-kernel times: roofline, tile and wave quantization, attention kernels."""

from __future__ import annotations

import math

import pytest
from hypothesis import given, settings, strategies as st

from modelcut import catalog
from modelcut.core.errors import ModelcutError
from modelcut.core.costs.kernels import (FLASH_FRACTION, Efficiency, attention_time, gemm_fwd_bwd, gemm_time, generation,
                                   mem_time, quantization)

A100 = catalog.hardware("a100")
H100 = catalog.hardware("h100")
EFF = Efficiency(0.8, 0.7, 0.6)


def test_full_waves_of_full_tiles_lose_nothing():
    # 108 tiles of 128 x 256 on 108 SMs: one full wave.
    q, extra = quantization(128 * 108, 256, 4096, A100.sms)
    assert q == pytest.approx(1.0)
    assert extra == 0


def test_one_tile_too_many_wastes_most_of_a_wave():
    # m = 128·109 rows, n = 128: with 128-wide tiles 109 tiles need two waves of 108 SMs;
    # 256-row tiles give 55 tiles (one wave, 55/108 used) with the last tile half empty.
    m, n = 128 * 109, 128
    q, _ = quantization(m, n, 8192, A100.sms)
    by_hand = max(109 / 216,                                   # 128x128: 2 waves
                  (m * n) / (55 * 256 * 128) * 55 / 108,        # 256x128 tiles
                  (m * n) / (109 * 128 * 256) * 109 / 216)      # 128x256 tiles, n padded to 256
    # split-K may recover SMs when the tile count is below the SM count
    assert q >= by_hand - 1e-12
    assert q < 1.0


def test_small_product_uses_split_k_and_pays_the_reduction():
    # 8 tiles of 128x128 (4 of 128x256) on 108 SMs with a long k: splitting k four ways fills
    # 4x the SMs; the smaller tile then wins.
    q, extra = quantization(256, 512, 65536, A100.sms)
    assert q == pytest.approx(8 * 4 / 108)
    assert extra == pytest.approx(2 * 4 * 256 * 512 * 4)


def test_gemm_is_the_roofline_of_its_shape():
    m, n, k = 8192, 8192, 8192
    t = gemm_time(m, n, k, A100, EFF)
    q, _ = quantization(m, n, k, A100.sms)
    assert t == pytest.approx(max(2 * m * n * k / (EFF.gemm * q * A100.peak_flops_16),
                                  2 * (m * k + k * n + m * n) / (EFF.mem * A100.mem_bw)))
    # a skinny product is memory-bound: its time is its bytes at the streaming rate
    skinny = gemm_time(65536, 64, 64, A100, EFF)
    assert skinny == pytest.approx(2 * (65536 * 64 + 64 * 64 + 65536 * 64) / (EFF.mem * A100.mem_bw))


@settings(max_examples=60, deadline=None)
@given(m=st.integers(1, 20000), n=st.integers(1, 20000), k=st.integers(1, 20000))
def test_gemm_never_beats_either_roof(m, n, k):
    t = gemm_time(m, n, k, H100, EFF)
    q, _ = quantization(m, n, k, H100.sms)
    assert 0 < q <= 1
    assert t >= 2 * m * n * k / (EFF.gemm * H100.peak_flops_16) * (1 - 1e-12)
    assert t >= 2 * (m * k + k * n + m * n) / (EFF.mem * H100.mem_bw) * (1 - 1e-12)


def test_backward_products_have_the_transposed_shapes():
    f, dg, wg = gemm_fwd_bwd(4096, 12288, 3072, A100, EFF)
    assert f == gemm_time(4096, 12288, 3072, A100, EFF)
    assert dg == gemm_time(4096, 3072, 12288, A100, EFF)
    assert wg == gemm_time(3072, 12288, 4096, A100, EFF)


def test_memory_bound_time_and_efficiency_checks():
    assert mem_time(2e9, A100, EFF) == pytest.approx(2e9 / (0.7 * A100.mem_bw))
    with pytest.raises(ModelcutError):
        mem_time(-1, A100, EFF)
    for bad in (0, 1.5, -0.1, True, "0.5"):
        with pytest.raises(ModelcutError):
            Efficiency(bad, 0.5, 0.5)


def test_flash_attention_causal_does_half_the_work():
    full = attention_time("flash2", 4, 16, 8192, 8192, 128, False, False, H100, EFF)
    causal = attention_time("flash2", 4, 16, 8192, 8192, 128, True, False, H100, EFF)
    assert causal.fwd == pytest.approx(full.fwd / 2)
    f, b = FLASH_FRACTION[("flash2", "hopper")]
    flops = 4 * 4 * 16 * 8192 * 8192 * 128 / 2
    blocks = 4 * 16 * 8192 // 128
    wave = blocks / (math.ceil(blocks / H100.sms) * H100.sms)
    assert causal.fwd == pytest.approx(flops / (f * wave * H100.peak_flops_16))
    assert causal.bwd == pytest.approx(2.5 * flops / (b * wave * H100.peak_flops_16))


def test_unfused_attention_moves_the_score_matrix():
    # Megatron-LM 2021: full s x s scores, softmax and dropout through HBM.
    b, a, s, d = 4, 8, 2048, 128
    att = attention_time("unfused", b, a, s, s, d, True, True, A100, EFF)
    scores = b * a * s * s
    assert att.fwd_mem == pytest.approx(scores * (4 + 5) / (EFF.mem * A100.mem_bw))
    assert att.bwd_mem == pytest.approx(scores * (5 + 6) / (EFF.mem * A100.mem_bw))
    no_drop = attention_time("unfused", b, a, s, s, d, True, False, A100, EFF)
    assert no_drop.fwd < att.fwd


def test_attention_errors():
    with pytest.raises(ModelcutError):
        attention_time("sparse", 1, 1, 128, 128, 64, True, False, A100, EFF)
    with pytest.raises(ModelcutError):
        attention_time("flash3", 1, 1, 128, 128, 64, True, False, A100, EFF)   # FlashAttention-3 is Hopper-only
    assert generation(A100) == "ampere" and generation(H100) == "hopper"


def test_attention_without_a_published_figure_runs_at_the_product_rate():
    b200 = catalog.hardware("b200")
    att = attention_time("flash2", 2, 16, 4096, 4096, 128, True, False, b200, EFF)
    flops = 4 * 2 * 16 * 4096 * 4096 * 128 / 2
    assert att.fwd == pytest.approx(flops / (EFF.gemm * b200.peak_flops_16))
