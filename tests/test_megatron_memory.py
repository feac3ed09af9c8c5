"""modelcut's memory model against Megatron-LM's theoretical memory estimator.

The estimator (NVIDIA/Megatron-LM, megatron/training/theoretical_memory_usage.py) is
re-derived here from its published formulas, independently of modelcut's code:

* weights + gradients + optimizer of the most loaded shard (the first pipeline stage:
  its share of the transformer block plus the word embeddings, all over t) at 18 bytes a
  parameter, or 6 + 12/d with the distributed optimizer; a layer has
  2·h·(f·g + n) + 2·h·q·(1 + G/a) parameters (g = 3/2 for SwiGLU, n = 2 for LayerNorm
  and 1 for RMSNorm, G query groups, a heads), the block adds a final norm n·h;
* activations of the first stage with sequence parallelism and selective recomputation
  (Korthikanti et al. 2022, Table 2): s·b·h·(18 + 4f/h) a layer for all l layers (p
  micro-batches of l/p layers in flight), plus 8·s·b·p (token ids) and s·b·h·p (embedding
  dropout); times 1 + (p − 1)/(p·v) when interleaved, times min(1, m/p) otherwise; plus
  4·s·b·h·(1 + V/h) for the output layer and loss when p = 1; all over t.

modelcut must agree within 1 % (weights + gradients + optimizer) and 3 % (activations)
where the estimator applies: dense models, sequence parallelism with selective
recomputation, distributed optimizer or not.
"""

from __future__ import annotations

import pytest
from hypothesis import given, settings, strategies as st

from modelcut.core.memory import MemoryOptions, stage_memory
from modelcut.core.specs import Layout, ModelSpec, Run, Training


def megatron_weight_and_optimizer(*, l, h, f, a, groups, vocab, t, p, dp, distributed, swiglu=False,
                                  rmsnorm=False, untied=False, q=None):
    q = q or h
    norm = 1 if rmsnorm else 2
    gated = 1.5 if swiglu else 1.0
    per_layer = 2 * h * (f * gated + norm) + 2 * h * q * (1 + groups / a)
    block = l * per_layer + norm * h
    emb = h * vocab
    shard = (block / p + emb) / t
    if untied and p == 1:
        shard += emb / t
    per_param = 6 + 12 / dp if distributed else 18
    return shard * per_param


def megatron_activations(*, l, h, f, s, b, t, p, v, m, vocab):
    per_layer = s * b * h * (18 + 4 * f / h)
    total = per_layer * l
    total += 8 * s * b * p + s * b * h * p
    if v is not None:
        total *= 1 + (p - 1) / (p * v)
    elif p > 1:
        total *= min(1, m / p)
    if p == 1:
        total += s * b * h * 4 * (1 + vocab / h)
    return total / t


def gpt(name, l, h, a, vocab=51200):
    return ModelSpec(name, layers=l, hidden=h, ffn_hidden=4 * h, heads=a, kv_heads=a, vocab=vocab,
                     tied_embeddings=True, norm="layernorm", bias=True, dropout=True)


# (model, t, p, v, dp, seq, global batch, micro-batch): Korthikanti et al. 2022 Table 3 shapes
# (22B, 175B, 530B, 1T) and smaller variations with data parallelism and interleaving.
CASES = [
    (gpt("22b", 48, 6144, 64), 8, 1, None, 1, 2048, 4, 4),
    (gpt("175b", 96, 12288, 96), 8, 8, None, 1, 2048, 64, 1),
    (gpt("175b-v3", 96, 12288, 96), 8, 8, 3, 1, 2048, 64, 1),
    (gpt("530b", 105, 20480, 128), 8, 35, 3, 1, 2048, 280, 1),
    (gpt("1t", 128, 25600, 160), 8, 64, None, 1, 2048, 512, 1),
    (gpt("530b-dp8", 105, 20480, 128), 8, 35, 3, 8, 2048, 2240, 1),
    (gpt("39b", 48, 8192, 64), 8, 2, None, 16, 2048, 1536, 2),
    (gpt("7.5b-m<p", 36, 4096, 32), 4, 4, None, 8, 2048, 16, 1),
]

OPTS = MemoryOptions(flash_attention=False)  # Table 2 is without FlashAttention


def make_run(model, t, p, v, dp, seq, gb, mb, zero, recompute="selective", sp=True):
    return Run(model, "a100-sxm4-80gb",
               Layout(tp=t, pp=p, dp=dp, vpp=v, sequence_parallel=sp, zero=zero,
                      schedule="interleaved" if v else "1f1b"),
               Training(seq_len=seq, global_batch=gb, micro_batch=mb, recompute=recompute))


def rel(a, b):
    return abs(a - b) / b


@pytest.mark.parametrize("case", CASES, ids=[c[0].name for c in CASES])
@pytest.mark.parametrize("zero", [0, 1])
def test_weights_gradients_optimizer_within_1pct(case, zero):
    model, t, p, v, dp, seq, gb, mb = case
    first = stage_memory(make_run(model, t, p, v, dp, seq, gb, mb, zero), options=OPTS)[0]
    ours = first.weights_bytes + first.gradients_bytes + first.optimizer_bytes
    theirs = megatron_weight_and_optimizer(l=model.layers, h=model.hidden, f=model.ffn_hidden, a=model.heads,
                                           groups=model.kv_heads, vocab=model.vocab, t=t, p=p, dp=dp,
                                           distributed=zero == 1)
    assert rel(ours, theirs) < 0.01, (ours, theirs)


@pytest.mark.parametrize("case", CASES, ids=[c[0].name for c in CASES])
def test_activations_within_3pct(case):
    model, t, p, v, dp, seq, gb, mb = case
    first = stage_memory(make_run(model, t, p, v, dp, seq, gb, mb, 1), options=OPTS)[0]
    m = gb // (dp * mb)
    theirs = megatron_activations(l=model.layers, h=model.hidden, f=model.ffn_hidden, s=seq, b=mb, t=t, p=p,
                                  v=v, m=m, vocab=model.vocab)
    assert rel(first.activations_bytes, theirs) < 0.03, (first.activations_bytes, theirs)


def test_llama_shapes_weights_within_1pct():
    """The estimator's parameter count covers SwiGLU, GQA, RMSNorm and untied embeddings."""
    llama70 = ModelSpec("llama3-70b", layers=80, hidden=8192, ffn_hidden=28672, heads=64, kv_heads=8,
                        vocab=128256, gated_mlp=True, norm="rmsnorm", bias=False, dropout=False)
    for t, p, dp, zero in [(8, 4, 4, 1), (8, 1, 2, 0), (4, 8, 8, 1), (2, 2, 1, 0)]:
        run = make_run(llama70, t, p, None, dp, 8192, 64 * dp, 1, zero)
        first = stage_memory(run)[0]
        ours = first.weights_bytes + first.gradients_bytes + first.optimizer_bytes
        theirs = megatron_weight_and_optimizer(l=80, h=8192, f=28672, a=64, groups=8, vocab=128256, t=t, p=p,
                                               dp=dp, distributed=zero == 1, swiglu=True, rmsnorm=True,
                                               untied=True)
        assert rel(ours, theirs) < 0.01, (t, p, dp, zero, ours, theirs)


@settings(max_examples=25, deadline=None)
@given(l_per=st.integers(1, 4), p=st.sampled_from([1, 2, 4, 8]), t=st.sampled_from([1, 2, 4, 8]),
       heads_per_t=st.integers(1, 4), hd=st.sampled_from([64, 128]), mb=st.integers(1, 4),
       m_mult=st.integers(1, 3), dp=st.sampled_from([1, 2, 4]), vocab_k=st.integers(8, 64),
       interleave=st.booleans())
def test_random_dense_configs_agree(l_per, p, t, heads_per_t, hd, mb, m_mult, dp, vocab_k, interleave):
    a = heads_per_t * t
    h = a * hd
    v = 2 if interleave and p > 1 else None
    layers = l_per * p * (v or 1)
    model = gpt("rand", layers, h, a, vocab=vocab_k * 128 * t)
    # the estimator's interleaving factor assumes a steady state: at m = p every forward
    # runs before the first backward (see test_interleaved_m_equal_p_holds_everything)
    gb = (m_mult + (1 if v else 0)) * p * dp * mb
    run = make_run(model, t, p, v, dp, 2048, gb, mb, 1)
    first = stage_memory(run, options=OPTS)[0]
    ours = first.weights_bytes + first.gradients_bytes + first.optimizer_bytes
    theirs = megatron_weight_and_optimizer(l=layers, h=h, f=4 * h, a=a, groups=a, vocab=model.vocab, t=t, p=p,
                                           dp=dp, distributed=True)
    assert rel(ours, theirs) < 0.01
    acts = megatron_activations(l=layers, h=h, f=4 * h, s=2048, b=mb, t=t, p=p, v=v, m=gb // (dp * mb),
                                vocab=model.vocab)
    assert rel(first.activations_bytes, acts) < 0.03


def test_interleaved_m_equal_p_holds_everything():
    """Where the estimator's fixed factor does not apply: interleaved with m = p warms up
    through all m·v chunk forwards (Megatron-LM's schedules.py runs them all before the
    first backward), so the first stage holds m micro-batches of its whole share, not
    1 + (p − 1)/(p·v) of p."""
    model = gpt("small", 8, 1024, 16)
    p, v, t = 4, 2, 2
    run = make_run(model, t, p, v, 1, 2048, p, 1, 1)
    first = stage_memory(run, options=OPTS)[0]
    assert first.microbatches_in_flight == pytest.approx(p)
    est = megatron_activations(l=8, h=1024, f=4096, s=2048, b=1, t=t, p=p, v=v, m=p, vocab=model.vocab)
    assert first.activations_bytes < est / (1 + (p - 1) / (p * v)) * 1.01
