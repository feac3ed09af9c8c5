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


MISTRAL = catalog.model("mistral-7b")       # every layer within 4,096 keys


def _mistral_32k(kind: str, framework: str = "nemo"):
    from modelcut.service.predict import PredictRequest, predict
    from modelcut.service.runfile import run_from_dict
    doc = {"model": {"name": "mistral-7b"}, "hardware": {"gpu": "h100"},
           "layout": {"tp": 1, "cp": 4, "pp": 1, "dp": 2, "cp_kind": kind},
           "training": {"seq_len": 32768, "global_batch": 16, "micro_batch": 1, "recompute": "full"}}
    return predict(PredictRequest(run_from_dict(doc, "x"), framework=framework)).prediction


def test_transformer_engine_runs_a_window_under_context_parallelism_only_gathered_or_all_to_all():
    """Transformer Engine refuses a sliding window with its ring (TransformerEngine v2.9
    context_parallel.py asserts cp_comm_type in a2a, all_gather): the Megatron stacks' rule
    cp_window_kinds. A causal model's ring, and a stack with no such rule known, are not refused."""
    from modelcut.core.explore.rules import violations
    llama = catalog.model("llama3-8b")
    for fw in ("megatron-core", "nemo", "megatron-bridge"):
        caps = catalog.capabilities(fw)
        assert caps.cp_window_kinds == ("allgather", "a2a") and caps.source("cp_window_kinds")
        ring = violations(caps, MISTRAL, tp=1, cp=4, dp=2, cp_kind="ring")
        assert [v.rule for v in ring] == ["cp_window_kinds"] and "sliding-window" in ring[0].line()
        assert violations(caps, MISTRAL, tp=1, cp=4, dp=2, cp_kind="a2a+p2p")
        assert not violations(caps, MISTRAL, tp=1, cp=4, dp=2, cp_kind="allgather")
        assert not violations(caps, llama, tp=1, cp=4, dp=2, cp_kind="ring")
        assert not violations(caps, MISTRAL, tp=1, cp=1, dp=8)
    assert catalog.capabilities("fsdp").cp_window_kinds is None
    assert not violations(catalog.capabilities("fsdp"), MISTRAL, tp=1, cp=4, dp=2, cp_kind="ring")
    # predict says so in its notes
    assert any("cp_window_kinds" in n for n in _mistral_32k("ring").notes)
    assert not any("cannot run" in n for n in _mistral_32k("allgather").notes)


def test_the_gathered_form_runs_only_the_window_of_its_keys():
    """Transformer Engine's all-gather form hands each chunk its window of the gathered keys, so at
    32K tokens within 4,096 keys a rank's attention is a small share of the causal work: the step
    is well below the ring's (which the stack refuses, charged whole) and a causal model's; a
    rank's share is the window's key blocks over the causal count's s/(2·tile) a query block."""
    from modelcut.core.costs.kernels import window_work
    share, s_rate = window_work("cudnn", True, 8192, 32768, 4096)
    assert share == pytest.approx(33 * 2 * 128 / 32768) and s_rate == min(8192, 128 * 65)
    assert window_work("cudnn", True, 8192, 32768, None) == (1.0, 8192)
    assert window_work("unfused", True, 8192, 32768, 4096) == (1.0, 8192)
    assert window_work("cudnn", True, 8192, 32768, 40000) == (1.0, 8192)
    gathered, ring = _mistral_32k("allgather"), _mistral_32k("ring")
    assert gathered.step_time_s < 0.8 * ring.step_time_s
    assert gathered.mfu <= 1.0 and ring.mfu <= 1.0
    # PyTorch's context parallelism calls SDPA, which takes no window: charged the whole attention
    torch_gathered = _mistral_32k("allgather", "fsdp")
    args = dict(micro_batch=1, seq_len=32768, attention="flash2", cp=4, cp_kind="allgather")
    te = layer_attention(MISTRAL, LayerSetup(**args), H100, EFF)
    pt = layer_attention(MISTRAL, LayerSetup(**args, cp_impl="torch-sdpa"), H100, EFF)
    assert te.fwd < 0.3 * pt.fwd
    causal = layer_attention(replace(MISTRAL, sliding_window=None, sliding_layers=0),
                             LayerSetup(**args, cp_impl="torch-sdpa"), H100, EFF)
    assert pt == causal and torch_gathered.step_time_s > gathered.step_time_s
