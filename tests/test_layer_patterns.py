"""Layers that differ along the model: experts in every k-th layer (``moe_every``, Llama 4 Maverick)
and attention within blocks of tokens (``attention_chunk`` / ``chunked_layers``, Llama 4's chunked
layers). modelcut.core.costs.flops.moe_layers_in, attention_pairs, attention_layer_kinds;
modelcut.core.step.layers.layer_attention."""

from __future__ import annotations

from dataclasses import replace

import pytest
from hypothesis import given, settings, strategies as st

from modelcut import catalog
from modelcut.catalog.hf_config import model_from_hf_config
from modelcut.core import plan as plans
from modelcut.core.costs import flops
from modelcut.core.costs.kernels import Efficiency
from modelcut.core.errors import ModelcutError
from modelcut.core.specs import Layout, ModelSpec, Run, Training
from modelcut.core.step.layers import LayerSetup, layer_attention

from helpers import predict_default

H100 = catalog.hardware("h100")
EFF = Efficiency(0.8, 0.8, 0.9)
MAVERICK = catalog.model("llama4-maverick")
SCOUT = catalog.model("llama4-scout")


def moe_model(layers: int, dense: int, every: int) -> ModelSpec:
    return ModelSpec("m", layers=layers, hidden=512, ffn_hidden=2048, heads=8, kv_heads=8, vocab=1000,
                     gated_mlp=True, experts=8, top_k=2, expert_ffn_hidden=1024, dense_layers=dense, moe_every=every)


@settings(max_examples=80, deadline=None)
@given(layers=st.integers(1, 90), dense=st.integers(0, 10), every=st.integers(1, 6), data=st.data())
def test_moe_layers_are_every_kth_past_the_dense_ones(layers, dense, every, data):
    """The closed form counts what the rule says layer by layer, for any span of layers."""
    dense = min(dense, layers)
    m = moe_model(layers, dense, every)
    rule = [i >= dense and (i - dense + 1) % every == 0 for i in range(layers)]
    assert [flops.is_moe_layer(m, i) for i in range(layers)] == rule
    assert flops.moe_layer_count(m) == sum(rule)
    first = data.draw(st.integers(0, layers - 1))
    count = data.draw(st.integers(0, layers - first))
    assert flops.moe_layers_in(m, first, count) == sum(rule[first:first + count])


def test_maverick_holds_experts_in_its_odd_layers_and_its_stages_split_them():
    assert [i for i in range(48) if flops.is_moe_layer(MAVERICK, i)] == list(range(1, 48, 2))
    assert flops.moe_layer_count(SCOUT) == 48
    run = Run(MAVERICK, "h100", Layout(tp=1, pp=4, dp=8, ep=8), Training(seq_len=8192, global_batch=64))
    plan = plans.resolve(run.model, run.layout, run.training, v=1)
    assert [st.moe_layers for st in plan.stages] == [6, 6, 6, 6]
    assert sum(st.dense_layers for st in plan.stages) == 24


@settings(max_examples=60, deadline=None)
@given(s=st.integers(1, 1 << 17), c=st.integers(1, 1 << 15))
def test_chunk_pairs_are_the_blocks_causal_halves(s, c):
    q, r = divmod(s, c)
    pairs = flops.attention_pairs(s, chunk=c)
    assert pairs == pytest.approx((q * c * c + r * r) / 2)
    assert 0 < pairs <= flops.attention_pairs(s)
    if s <= c:
        assert pairs == flops.attention_pairs(s)


def test_a_chunked_layer_is_a_causal_one_up_to_its_chunk_and_cheaper_past_it():
    """At 8,192 tokens Llama 4's chunked layers attend as causal ones; at 65,536 they do an eighth
    of the causal work, and take far less time than a causal layer."""
    causal = replace(SCOUT, attention_chunk=None, chunked_layers=0)
    for s, cp in ((8192, 1), (65536, 1), (65536, 4)):
        setup = LayerSetup(micro_batch=1, seq_len=s, cp=cp, attention="cudnn")
        full, mixed = layer_attention(causal, setup, H100, EFF), layer_attention(SCOUT, setup, H100, EFF)
        if s == 8192:
            assert mixed == pytest.approx(full)
        else:
            assert mixed.fwd < 0.5 * full.fwd and mixed.bwd < 0.5 * full.bwd
            # the 12 causal layers' share alone is a floor
            assert mixed.fwd > 12 / 48 * full.fwd
    work = flops.causal_model_flops(SCOUT, 1, 65536) - flops.causal_model_flops(causal, 1, 65536)
    assert work < 0


@pytest.mark.parametrize("framework,layout", [
    ("megatron-core", Layout(tp=1, pp=2, dp=8, ep=8)), ("fsdp", Layout(tp=1, pp=1, dp=8, ep=8)),
])
def test_experts_in_every_other_layer_halve_the_all_to_all(framework, layout):
    every_layer = replace(MAVERICK, moe_every=1)
    train = Training(seq_len=8192, global_batch=16, micro_batch=1, recompute="full")
    half = predict_default(Run(MAVERICK, "h100", layout, train), H100, framework=framework)
    whole = predict_default(Run(every_layer, "h100", layout, train), H100, framework=framework)
    assert half.breakdown.a2a_s == pytest.approx(whole.breakdown.a2a_s / 2, rel=0.15)
    assert 0 < half.mfu <= 1 and half.step_time_s < whole.step_time_s


LLAMA4_TEXT = {"hidden_size": 5120, "num_hidden_layers": 48, "num_attention_heads": 40, "num_key_value_heads": 8,
               "head_dim": 128, "intermediate_size": 8192, "intermediate_size_mlp": 16384, "vocab_size": 202048,
               "num_experts_per_tok": 1, "attention_chunk_size": 8192, "max_position_embeddings": 1048576}


@pytest.mark.parametrize("name,experts,step,nested", [("llama4-scout", 16, 1, True),
                                                     ("llama4-maverick", 128, 2, False)])
def test_llama4_configs_read_as_the_catalog_entries(name, experts, step, nested):
    """A Llama 4 config (Llama4TextConfig's fields; nested in text_config for the multimodal
    architecture) reads as the catalog's shape: the experts, their interleave, the chunked layers."""
    text = dict(LLAMA4_TEXT, num_local_experts=experts, interleave_moe_layer_step=step)
    cfg = ({"architectures": ["Llama4ForConditionalGeneration"], "text_config": text} if nested
           else dict(text, architectures=["Llama4ForCausalLM"]))
    cat = catalog.model(name)
    hf = model_from_hf_config(cfg, name)
    assert replace(hf, source=cat.source, max_seq=cat.max_seq) == cat
    assert (hf.chunked_layers, hf.attention_chunk, hf.moe_every) == (36, 8192, step)


def test_qwen_moe_sparse_step_is_moe_every():
    cfg = {"architectures": ["Qwen2MoeForCausalLM"], "hidden_size": 1024, "num_hidden_layers": 12,
           "num_attention_heads": 16, "intermediate_size": 2816, "vocab_size": 32000, "num_experts": 8,
           "num_experts_per_tok": 2, "moe_intermediate_size": 704, "decoder_sparse_step": 3}
    m = model_from_hf_config(cfg)
    assert (m.moe_every, m.dense_layers, flops.moe_layer_count(m)) == (3, 0, 4)
    with pytest.raises(ModelcutError, match="decoder_sparse_step 3 beside mlp_only_layers"):
        model_from_hf_config(dict(cfg, mlp_only_layers=[0]))


@pytest.mark.parametrize("change,word", [
    (dict(moe_every=0), "moe_every must be a positive whole number"),
    (dict(chunked_layers=4), "attention_chunk and chunked_layers go together"),
    (dict(attention_chunk=4096), "attention_chunk and chunked_layers go together"),
    (dict(attention_chunk=4096, chunked_layers=49), "chunked_layers (49) must be a whole number"),
    (dict(attention_chunk=0, chunked_layers=4), "attention_chunk"),
])
def test_bad_patterns_are_one_line_errors(change, word):
    base = {f: getattr(SCOUT, f) for f in SCOUT.__dataclass_fields__}
    base.update(attention_chunk=None, chunked_layers=0)
    with pytest.raises(ModelcutError, match=word.replace("(", r"\(").replace(")", r"\)")) as e:
        ModelSpec(**{**base, **change})
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("change,word", [
    (dict(moe_layers="odd"), "moe_layers must be a list of whole numbers"),
    (dict(moe_layers=[0, 2]), "are not every 2-th layer"),
    (dict(no_rope_layer_interval=0), "no_rope_layer_interval must be a positive whole number"),
    (dict(no_rope_layers=7), "no_rope_layers must be a list of whole numbers"),
    (dict(layer_types="chunked"), "layer_types must be a list"),
    (dict(head_dim="x"), "head_dim must be a positive whole number"),
    (dict(attention_chunk_size=-1), "attention_chunk"),
    (dict(num_hidden_layers=0), "num_hidden_layers must be a positive whole number"),
    (dict(num_local_experts=None), "missing 'num_local_experts'"),
])
def test_bad_llama4_configs_are_one_line_errors(change, word):
    cfg = dict(LLAMA4_TEXT, num_local_experts=128, interleave_moe_layer_step=2, architectures=["Llama4ForCausalLM"])
    cfg.update(change)
    with pytest.raises(ModelcutError, match=word) as e:
        model_from_hf_config(cfg)
    assert "\n" not in str(e.value)
