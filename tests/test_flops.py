"""FLOP and parameter counts: the papers' closed forms, exact counts, conventions."""

from dataclasses import replace

import pytest
from hypothesis import given, settings, strategies as st

from modelcut import catalog
from modelcut.core.costs import flops
from modelcut.core.errors import ModelcutError
from modelcut.core.specs import ModelSpec, Training


def gpt(l, h, a, V=51200, s=2048):
    return ModelSpec(name="gpt", layers=l, hidden=h, ffn_hidden=4 * h, heads=a, kv_heads=a, vocab=V,
                     tied_embeddings=True, learned_positions=True, max_seq=s)


gpt_shapes = st.tuples(st.integers(1, 128), st.sampled_from([64, 128]), st.integers(1, 64),
                       st.integers(1000, 200_000), st.sampled_from([512, 2048, 8192]), st.integers(1, 4096))


@given(gpt_shapes)
def test_generalised_eq3_is_eq3_for_a_gpt(shape):
    l, d_head, a, V, s, B = shape
    h = d_head * a
    m = gpt(l, h, a, V, s)
    assert flops.megatron_flops(m, B, s, "full") == pytest.approx(flops.megatron_eq3(B, s, l, h, V), rel=1e-12)


@given(gpt_shapes)
def test_model_flops_is_korthikanti_for_a_gpt(shape):
    """Korthikanti et al. 2022 §6: 72·B·s·l·h²·(1 + s/(6h) + V/(12·l·h)) without recomputation."""
    l, d_head, a, V, s, B = shape
    h = d_head * a
    expected = 72.0 * B * s * l * h * h * (1 + s / (6 * h) + V / (12 * l * h))
    assert flops.megatron_flops(gpt(l, h, a, V, s), B, s, "none") == pytest.approx(expected, rel=1e-12)


@given(gpt_shapes)
def test_exact_count_is_eq2_plus_final_norm(shape):
    l, d_head, a, V, s, _ = shape
    h = d_head * a
    assert flops.param_count(gpt(l, h, a, V, s)) == pytest.approx(flops.megatron_eq2(l, h, V, s) + 2 * h, rel=1e-12)


@pytest.mark.parametrize("name,billions", [
    ("gpt-1.7b", 1.7), ("gpt-3.6b", 3.6), ("gpt-7.5b", 7.5), ("gpt-18.4b", 18.4), ("gpt-39.1b", 39.1),
    ("gpt-76.1b", 76.1), ("gpt-145.6b", 145.6), ("gpt-310.1b", 310.1), ("gpt-529.6b", 529.6), ("gpt-1t", 1008.0)])
def test_table1_parameter_counts(name, billions):
    """Narayanan et al. 2021 Table 1 prints each model's size to 0.1 B (eq. 2)."""
    assert flops.param_count(catalog.model(name)) / 1e9 == pytest.approx(billions, abs=0.051)


@pytest.mark.parametrize("file,count", [
    ("gpt2.json", 124_439_808),            # Hugging Face gpt2 model card: 124M (124,439,808)
    ("llama3-8b.json", 8_030_261_248),     # Meta-Llama-3-8B safetensors index: 8.03B
    ("mistral-7b.json", 7_241_732_096),    # Mistral-7B-v0.1: 7.24B
    ("qwen2-7b.json", 7_615_616_512),      # Qwen2-7B: 7.62B (7,615,616,512)
    ("pythia-1b.json", 1_011_781_632),     # Biderman et al. 2023 (Pythia), Table 1: 1,011,781,632
    ("mixtral-8x7b.json", 46_702_792_704),  # Mixtral 8x7B: 46.7B total
])
def test_exact_counts_match_published(file, count):
    assert flops.param_count(catalog.load_hf_config(f"tests/data/hf/{file}")) == count


def test_llama3_405b_is_405_8_billion():
    """Grattafiori et al. 2024 Table 3 shapes give N = 405.8 B with the untied output layer."""
    assert flops.param_count(catalog.model("llama3-405b")) / 1e9 == pytest.approx(405.8, abs=0.05)


def test_mixtral_8x22b_is_141b_with_39b_active():
    """Mistral AI's announcement (2024-04-17): 141B parameters, 39B active."""
    m = catalog.model("mixtral-8x22b")
    assert flops.param_count(m) / 1e9 == pytest.approx(141, abs=0.5)
    assert flops.param_count(m, active=True) / 1e9 == pytest.approx(39, abs=0.3)


def test_moe_active_parameters():
    m = catalog.load_hf_config("tests/data/hf/mixtral-8x7b.json")
    assert flops.param_count(m, active=True) / 1e9 == pytest.approx(12.9, abs=0.05)  # Mixtral paper: 13B active
    assert flops.param_count(m, active=True) < flops.param_count(m)


def test_palm_formula_and_causal_halving():
    m = catalog.model("llama3-405b")
    N = flops.param_count(m)
    tokens, s = 2048 * 8192, 8192
    assert flops.palm_model_flops(m, 2048, s) == pytest.approx(tokens * (6 * N + 12 * 126 * s * 16384))
    full = flops.palm_model_flops(m, 2048, s)
    causal = flops.palm_model_flops(m, 2048, s, causal=True)
    assert full - causal == pytest.approx(tokens * 6 * 126 * s * 16384)


def test_torchtitan_count_by_hand():
    """torchtitan v0.2.0 ``get_dense_model_nparams_and_flops``: 6·(nparams − nparams_embedding) +
    12·l·h·q·t a token, the input embedding left out and the (untied) output layer kept."""
    m = catalog.model("llama3-8b")
    N = flops.param_count(m)
    s, B = 8192, 16
    per_token = 6 * (N - 128000 * 4096) + 12 * 32 * 32 * 128 * s      # vocabulary 128,000, 32 heads of 128
    assert flops.model_flops(m, Training(s, B), "non-embedding") == pytest.approx(B * s * per_token, rel=1e-12)
    halved = flops.model_flops(m, Training(s, B), "non-embedding-causal")
    assert B * s * per_token - halved == pytest.approx(B * s * 6 * 32 * s * 4096, rel=1e-12)
    tied = replace(m, tied_embeddings=True)   # a tied head goes with the input embedding
    assert flops.model_flops(tied, Training(s, B), "non-embedding") == pytest.approx(
        B * s * (per_token - 6 * 128000 * 4096), rel=1e-12)


def test_sources_count_as_their_conventions():
    """Each catalog run whose TFLOP/s is marked with a named convention prints, over its tokens/s,
    that convention's FLOPs a token (NeMo 24.07: ``megatron``; Megatron-Bridge 25.11:
    ``non-embedding-causal``), within 1 %; and the marks cover both summaries."""
    seen = set()
    for r in catalog.published_runs():
        conv, tps = r.flop_convention, r.published_tokens_per_s
        if conv in (None, "source") or r.published_tflops is None or tps is None:
            continue
        tr = r.run.training
        per_token = flops.model_flops(r.run.model, tr, conv) / (tr.global_batch * tr.seq_len)
        assert per_token == pytest.approx(r.published_tflops * 1e12 / tps, rel=0.01), r.id
        seen.add((r.id.split("-")[0], conv))
    assert {("nemo2407", "megatron"), ("mbridge2511", "non-embedding-causal")} <= seen


@settings(max_examples=50)
@given(gpt_shapes, st.sampled_from([1, 8, 64]), st.floats(0.01, 100.0))
def test_model_tflops_per_gpu_orders_the_conventions(shape, gpus, step):
    l, d_head, a, V, s, B = shape
    m = replace(gpt(l, d_head * a, a, V, s), tied_embeddings=False, learned_positions=False)
    tr = Training(s, B)
    tf = flops.model_tflops_per_gpu(m, tr, gpus, step)
    assert set(tf) == set(flops.CONVENTIONS)
    for c, x in tf.items():
        assert x * gpus * step * 1e12 == pytest.approx(flops.model_flops(m, tr, c), rel=1e-12)
    assert tf["non-embedding-causal"] < tf["non-embedding"] < tf["palm"]
    assert tf["palm-causal"] < tf["palm"]
    assert tf["palm"] - tf["non-embedding"] == pytest.approx(6 * V * d_head * a * B * s / (gpus * step * 1e12), rel=1e-9)


def test_model_tflops_needs_gpus_and_time():
    with pytest.raises(ModelcutError, match="positive step time"):
        flops.model_tflops_per_gpu(catalog.model("llama3-8b"), Training(2048, 8), 8, 0.0)


@settings(max_examples=50)
@given(gpt_shapes)
def test_recomputation_only_adds_work(shape):
    l, d_head, a, V, s, B = shape
    m = gpt(l, d_head * a, a, V, s)
    none, sel, full = (flops.executed_flops(m, Training(s, B, 1, r), "palm") for r in ("none", "selective", "full"))
    assert none < sel < full
    assert flops.recompute_flops(m, B, s, "full") == pytest.approx(full - none)


def test_gated_and_gqa_change_counts_as_expected():
    base = ModelSpec(name="x", layers=2, hidden=256, ffn_hidden=512, heads=8, kv_heads=8, vocab=1000, bias=False,
                     norm="rmsnorm")
    gqa = replace(base, kv_heads=2)
    gated = replace(base, gated_mlp=True)
    h, kv = 256, 64
    assert flops.layer_params(base, False) - flops.layer_params(gqa, False) == 2 * h * (h - kv)
    assert flops.layer_params(gated, False) - flops.layer_params(base, False) == h * 512
    tied = replace(base, tied_embeddings=True)
    assert flops.param_count(base) - flops.param_count(tied) == 1000 * 256


def test_unknown_convention_is_an_error():
    with pytest.raises(ModelcutError, match="unknown FLOP convention"):
        flops.model_flops(catalog.model("gpt-1.7b"), Training(2048, 8), "chinchilla")
