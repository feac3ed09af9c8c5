"""The attention block's products (``context.attention_products``), one list for the step's
products, the layer's weights and the per-rank parameters: properties over the catalog's models."""

from __future__ import annotations

from hypothesis import given, settings, strategies as st

from modelcut import catalog
from modelcut.core.costs import context, flops, params

MODELS = [m for m in catalog.all_models()]


@st.composite
def model_and_t(draw):
    m = draw(st.sampled_from(MODELS))
    t = draw(st.sampled_from([d for d in (1, 2, 4, 8, 16) if m.heads % d == 0]))
    return m, t


@settings(max_examples=200, deadline=None)
@given(model_and_t(), st.integers(1, 1 << 16), st.booleans())
def test_the_ranks_hold_every_weight_once_but_the_duplicated_and_replicated_ones(mt, tokens, sp):
    """Over t ranks the products hold the layer's weights, each once, but for K and V heads replicated
    when t exceeds them and latent attention's down projections, whole on every rank; every product
    has a positive shape, and the one weight count behind the FLOPs is the products' at t = 1."""
    m, t = mt
    one = context.attention_products(m, tokens, 1)
    mine = context.attention_products(m, tokens, t, sp)
    assert [p[0] for p in one] == [p[0] for p in mine]
    assert all(r > 0 and n > 0 and k > 0 for _, r, n, k in mine)
    w1 = sum(n * k for _, _, n, k in one)
    wt = sum(n * k for _, _, n, k in mine)
    down = sum(n * k for name, _, n, k in one if name in ("q down", "kv down"))
    if m.is_mla:
        assert t * wt == w1 + (t - 1) * down
        rows = {name: r for name, r, _, _ in mine}
        assert rows["kv down"] == (tokens / t if sp and t > 1 else tokens) and rows["proj"] == tokens
    elif m.kv_heads >= t:
        assert t * wt == w1
    else:
        assert t * wt > w1
    assert flops.layer_matmul_params(m, False) - flops.mlp_weights(m, m.ffn_hidden) == w1
    # a rank's parameters hold its products' weights (and the norms and biases beside them)
    assert params.layer_params(m, t, False)[0] >= wt
