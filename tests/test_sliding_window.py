"""Sliding-window attention (GPT-OSS): the kernels that skip the window's masked blocks do only the
window's share of the causal attention; the FLOPs behind MFU count the window's pairs
(modelcut.core.costs.kernels.window_tile_share, modelcut.core.costs.flops.attention_pairs)."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given, settings, strategies as st

from modelcut import catalog
from modelcut.catalog.hf_config import model_from_hf_config
from modelcut.core.costs import flops
from modelcut.core.costs.kernels import Efficiency, attention_time, window_tile_share
from modelcut.core.errors import ModelcutError
from modelcut.core.step.layers import LayerSetup, layer_attention

H100 = catalog.hardware("h100")
EFF = Efficiency(0.8, 0.8, 0.9)
OSS = catalog.model("gpt-oss-20b")


def brute_tiles(s: int, w: int, tile: int = 128) -> float:
    """Tiles of (query block, key block) holding at least one (q, k) pair with q − w < k ≤ q."""
    n = -(-s // tile)
    kept = 0
    for i in range(n):
        lo_q, hi_q = i * tile, min(s, (i + 1) * tile) - 1
        for j in range(i + 1):
            lo_k, hi_k = j * tile, (j + 1) * tile - 1
            if hi_k > lo_q - w and lo_k <= hi_q:       # some key in the block is in some query's window
                kept += 1
    return kept / (n * (n + 1) / 2)


@settings(max_examples=60, deadline=None)
@given(n=st.integers(1, 40), w=st.integers(1, 3000))
def test_the_tile_share_counts_the_tiles(n, w):
    s = 128 * n
    assert window_tile_share(s, w) == pytest.approx(brute_tiles(s, w) if w < s else 1.0)


@settings(max_examples=40, deadline=None)
@given(s=st.integers(2, 1 << 16), w=st.integers(1, 1 << 16))
def test_pairs_are_between_the_window_and_the_causal_half(s, w):
    pairs = flops.attention_pairs(s, w)
    assert 0 < pairs <= flops.attention_pairs(s) + 1e-9
    assert pairs >= min(s, w) * s / 2 - 1e-9       # at least half a window per query, on average
    assert flops.attention_pairs(s, None) == s * s / 2


def test_fused_kernels_do_the_windows_share_and_the_unfused_path_the_whole():
    """Every fused kernel skips the key blocks outside the window (cuDNN by NVIDIA's measured sweep:
    kernels.WINDOW_SKIPPING); the unfused path materialises the scores and masks them."""
    args = (4, 64, 4096, 4096, 64, True, False, H100, EFF)
    for kind in ("flash2", "flash3", "cudnn"):
        full, win = attention_time(kind, *args), attention_time(kind, *args, window=128)
        # 12 % of the tiles (63 of 528), each at a short sequence's lower rate
        assert win.fwd < 0.5 * full.fwd and win.bwd < 0.5 * full.bwd
        # but at no better a rate than the causal attention at the same length
        assert win.fwd >= full.fwd * window_tile_share(4096, 128) * (1 - 1e-12)
    assert attention_time("unfused", *args, window=128) == attention_time("unfused", *args)
    # a window covering the sequence is causal attention
    assert attention_time("flash2", *args, window=8192) == attention_time("flash2", *args)
    assert attention_time("cudnn", *args, window=4096) == attention_time("cudnn", *args)


def test_a_model_with_windowed_layers_averages_its_layers():
    st_ = LayerSetup(micro_batch=2, seq_len=4096, attention="flash2")
    causal = replace(OSS, sliding_window=None, sliding_layers=0)
    all_win = replace(OSS, sliding_layers=OSS.layers)
    a, b, c = (layer_attention(m, st_, H100, EFF) for m in (causal, OSS, all_win))
    assert b.fwd == pytest.approx((a.fwd + c.fwd) / 2)        # half the layers windowed
    assert c.fwd < b.fwd < a.fwd
    # the MFU's FLOPs count the window's pairs in half the layers
    f_causal = flops.causal_model_flops(causal, 8, 4096)
    f_oss = flops.causal_model_flops(OSS, 8, 4096)
    attn = 8 * 4096 * 3 * 4.0 * OSS.q_dim / 4096 * 12 * (flops.attention_pairs(4096) - flops.attention_pairs(4096, 128))
    assert f_causal - f_oss == pytest.approx(attn)


def test_bad_windows_are_one_line():
    with pytest.raises(ModelcutError, match="go together"):
        replace(OSS, sliding_window=None)
    with pytest.raises(ModelcutError, match="go together"):
        replace(OSS, sliding_layers=0)
    with pytest.raises(ModelcutError, match="sliding_layers"):
        replace(OSS, sliding_layers=OSS.layers + 1)
    with pytest.raises(ModelcutError, match="sliding_window must be at least 1"):
        replace(OSS, sliding_window=0)


def test_hf_configs_name_the_window():
    import json
    from pathlib import Path
    cfg = json.loads((Path(__file__).parent / "data" / "hf" / "gpt-oss-120b.json").read_text())
    m = model_from_hf_config(cfg)
    assert (m.sliding_window, m.sliding_layers) == (128, 18)          # GptOssConfig's alternation
    typed = {**cfg, "layer_types": ["sliding_attention", "full_attention", "full_attention"] * 12}
    assert model_from_hf_config(typed).sliding_layers == 12
    assert model_from_hf_config({**cfg, "sliding_window": None}).sliding_layers == 0
    assert catalog.model("gpt-oss-120b").sliding_layers == 18
