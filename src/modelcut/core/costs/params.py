"""Parameters one device holds: the one count that memory stores and data-parallel collectives
move.

The layer's exact count (:func:`.flops.layer_params`) split as Megatron-LM splits it: the
projections and the input biases over the t tensor-parallel ranks (column and row parallel),
the two norms and the output biases of attention and MLP on every rank; K and V replicated when
t exceeds the KV heads; latent attention's down projections and latent norms whole on every rank
(:func:`.context.attention_products`); an MoE layer's routed experts over ep·etp (etp default t), its router
h·E on every rank, shared experts over t. The first pipeline stage adds the vocab-parallel
embedding (and learned positions), the last the final norm and the vocab-parallel output layer.
"""

from __future__ import annotations

from ..specs import ModelSpec
from . import flops
from .context import attention_products


def _kv_extra(model: ModelSpec, t: int) -> float:
    """Parameters a tensor-parallel rank holds beyond kv/t when t exceeds the KV heads: each
    rank then keeps one whole K and V head (replicated), Megatron-LM's and vLLM's practice."""
    if model.kv_heads >= t:
        return 0.0
    qkv_bias = model.bias if model.qkv_bias is None else model.qkv_bias
    extra = model.d_head - model.kv_dim / t
    return 2 * extra * (model.hidden + (1 if qkv_bias else 0))


def layer_params(model: ModelSpec, t: int, moe: bool, ep: int = 1, etp: int | None = None) -> tuple[float, float]:
    """(dense, expert) parameters of one transformer layer held by one tensor-parallel rank
    (module doc)."""
    h = model.hidden
    norms = 2 * flops.norm_params(model)
    out_bias = h if model.bias else 0
    if model.is_mla:    # the down projections whole on every rank, the latents' norms too
        dense = sum(n * k for _, _, n, k in attention_products(model, 1, t)) + model.latent_width + norms
    else:
        attn = flops.attention_params(model)
        dense = (attn - out_bias) / t + out_bias + norms + _kv_extra(model, t)
    if not moe:
        mlp = flops.mlp_params(model, model.ffn_hidden)
        return dense + (mlp - out_bias) / t + out_bias, 0.0
    one = flops.mlp_params(model, flops.expert_width(model))
    expert = model.experts * one / (ep * (etp or t))
    dense += h * model.experts + model.shared_experts * (one - out_bias) / t + (out_bias if model.shared_experts else 0)
    return dense, expert


def embedding_params(model: ModelSpec, t: int) -> float:
    """First stage: the vocab-parallel embedding table V·h/t (Megatron-LM's
    VocabParallelEmbedding) and, for GPT-2/3, the learned position table max_seq·h (on every
    tensor-parallel rank)."""
    p = model.vocab * model.hidden / t
    if model.learned_positions:
        p += model.max_seq * model.hidden
    return p


def output_params(model: ModelSpec, t: int) -> float:
    """Last stage: the final norm (every rank) and the vocab-parallel output layer V·h/t."""
    return flops.norm_params(model) + model.vocab * model.hidden / t


#: One module's parameters on one device: (dense, routed-expert). Experts are kept apart because
#: ZeRO shards them over another group (the expert data-parallel ranks).
Module = tuple[float, float]


def device_modules(model: ModelSpec, t: int, ep: int, etp: int | None,
                   stages: list[tuple[int, int, bool, bool]]) -> list[list[Module]]:
    """The modules each of a device's stages holds, in the order their gradients are finished in
    the backward: the output layer and final norm first (the loss stage), then the transformer
    layers last to first, then the embedding. ``stages``: (dense layers, MoE layers, embedding,
    loss) of each stage the device holds.

    With tied embeddings the output layer reuses the word embeddings: a device that holds both
    counts the table once (with the final norm); a last stage without the embedding keeps its own
    copy of the table (Megatron-LM: megatron/core/models/common/language_module)."""
    dense = layer_params(model, t, False)
    moe = layer_params(model, t, True, ep, etp) if model.is_moe else (0.0, 0.0)
    holds_embedding = any(emb for _, _, emb, _ in stages)
    table = model.vocab * model.hidden / t
    out = []
    for n_dense, n_moe, emb, loss in stages:
        mods: list[Module] = []
        if loss:
            shared = model.tied_embeddings and holds_embedding
            mods.append((output_params(model, t) - (table if shared else 0.0), 0.0))
        mods += [moe] * n_moe + [(dense[0], 0.0)] * n_dense
        if emb:
            mods.append((embedding_params(model, t), 0.0))
        out.append(mods)
    return out
