"""Activation bytes per layer, embedding and loss, per micro-batch on one rank (the terms of
:mod:`modelcut.core.memory` 's module doc: Korthikanti et al. 2022 Table 2 generalized, context
parallelism's kept and transient K/V, mixture-of-experts routed rows)."""

from __future__ import annotations

from ..costs import context, op_sac
from ..costs.loss import LOSS_KERNELS
from ..errors import ModelcutError
from ..specs import DEFAULT_RECOMPUTE_MODULES, ModelSpec
from ..units import FP32_BYTES, TOKEN_ID_BYTES

#: FP32 logits/softmax kept by the vocab-parallel cross-entropy (see the package docstring).
LOGIT_BYTES = FP32_BYTES
#: Per logit (V/t a token), by the loss's kernel: (bytes kept for the backward, the most held while
#: the loss runs), :data:`..costs.loss.LOSS_KERNELS`; with no kernel named (None) the FP32 softmax
#: kept, Megatron-LM's ``theoretical_memory_usage.py`` count, and nothing more held.
LOSS_BYTES: dict[str | None, tuple[float, float]] = {
    None: (LOGIT_BYTES, LOGIT_BYTES), **{k: (v.kept, v.held) for k, v in LOSS_KERNELS.items()}}
#: FP32 log-sum-exp per head and token saved by FlashAttention's forward (Dao et al. 2022, Alg. 2).
LSE_BYTES = FP32_BYTES


def layer_activation_bytes(model: ModelSpec, *, micro_batch: int, seq: int, t: int = 1, cp: int = 1,
                           sequence_parallel: bool = False, recompute: str = "none",
                           flash_attention: bool = True, moe: bool = False, etp: int | None = None,
                           recomputing: bool = False, cp_kind: str = "ring", fp8: bool = False,
                           recompute_modules: tuple[str, ...] = DEFAULT_RECOMPUTE_MODULES,
                           selective: str = "attention", fp8_products: bool = False, ep: int = 1,
                           act_fp8_input: bool = False) -> float:
    """Bytes one transformer layer keeps for its backward, for one micro-batch, on one rank.

    Korthikanti et al. 2022 Table 2 generalized (module docstring). ``recompute``: none,
    selective or full; ``recomputing`` gives the full activations of a layer being
    recomputed (the working set of full recomputation) whatever ``recompute`` says.
    ``cp_kind``: with cp > 1, every form keeps only as many K and V bytes as the rank's own (the
    all-gather form gathers the others again in the backward, the ring passes them round again:
    :func:`cp_kept_extra_bytes`); their buffers in flight are :func:`cp_transient_bytes`. ``fp8``: the
    linear layers' inputs are kept as their FP8 copies, 1 byte an element instead of 2 (the two
    norms' outputs, the attention output, the second MLP linear's input; an MoE layer's routed
    rows into and out of the experts' activation: :mod:`..costs.fp8`). ``recompute_modules``, with
    selective recomputation, what it recomputes (Megatron-core's ``--recompute-modules``): ``core_attn``
    keeps no score matrix (an unfused attention's), ``layernorm`` drops an MoE layer's pre-MLP norm
    output and ``moe_act`` the routed experts' activation output (both output-discarding checkpoints:
    megatron/core/tensor_parallel/random.py ``CheckpointWithoutOutput``; what a recomputed norm or
    activation feeds is refilled in the backward). ``selective``: the stack's selective policy,
    "attention" (Megatron-LM's, above) or "op", torchtitan's per-op policy, under which a dense
    layer keeps :func:`..costs.op_sac.kept_bytes` a token (a mixture-of-experts layer its router's
    and shared experts' kept products, no routed expert's, and with expert parallelism, ``ep``, the
    all-to-alls' rows); ``fp8_products``: the linears run in FP8, whose products that policy keeps
    none of (:mod:`..costs.op_sac`).

    Multi-head latent attention (``ModelSpec.is_mla``) keeps its own Q, K and V, H·(d_nope + d_rope)
    elements each for Q and K and H·d_v for V, and its output, H·d_v (H the heads on this rank), in
    place of the grouped-query shape's; with ``mla_up_proj`` recomputed it keeps instead the latents
    the up-projections start from, r_q + r_kv + d_rope a token (megatron/core/transformer/
    multi_latent_attention.py: q_compressed, kv_compressed and k_pos_emb are the checkpoint's
    inputs; the down-projections are plain linears, so the latents are whole on each tensor-parallel
    rank, cut by sequence parallelism), and ``layernorm`` drops its input norm's output too (a kernel
    of its own there). ``act_fp8_input``: the SwiGLU's input, the up product's output, kept at 1 byte
    an element (Megatron-core's ``activation_func_fp8_input_store``, :class:`..specs.Training`); where
    ``moe_act`` recomputes the routed experts' activation their checkpoint keeps that input in 16 bits
    (core_v0.15.0 moe/experts.py: ``CheckpointWithoutOutput`` saves the function's inputs, and runs it
    without a graph), so there it saves nothing.
    """
    n = micro_batch * seq / cp            # tokens of the micro-batch on this rank
    h, a = model.hidden, model.heads
    sp = t if sequence_parallel else 1
    if recompute == "full" and not recomputing:
        return n * 2 * h / sp
    gathered = cp_kept_extra_bytes(model, micro_batch=micro_batch, seq=seq, t=t, cp=cp, cp_kind=cp_kind)
    if recompute == "selective" and selective == "op" and not recomputing:
        return n * op_sac.kept_bytes(model, t, sequence_parallel, scaled_mm=fp8_products, moe=moe, ep=ep) + gathered
    replicated = 8 * h + (2 * h if model.dropout else 0)
    # Q, K, V (K and V replicated when t exceeds the KV heads; latent attention's own) and the
    # attention output, the output projection's input
    selected = recompute == "selective" and not recomputing and selective != "op"
    q_w, k_w, v_w, out = context.cp_widths(model, t)
    if model.is_mla and selected and "mla_up_proj" in recompute_modules:
        attn = 2 * (model.latent_width + model.qk_rope_head_dim) / sp + 2 * out
    else:
        attn = 2 * (q_w + k_w + v_w) + 2 * out
    if flash_attention:
        core = LSE_BYTES * a / t
    else:
        core = a * seq * (5 if model.dropout else 2) / t
        if recompute == "selective" and not recomputing and "core_attn" in recompute_modules:
            core = 0.0
    if moe:
        fe = model.expert_ffn_hidden or model.ffn_hidden
        et = etp or t
        per = 6 * fe if model.gated_mlp else 4 * fe
        routed = model.top_k * (model.capacity_factor or 1.0)
        mlp = routed * (per / et + 2 * h / sp) + 4 * model.experts  # + FP32 router logits
        if model.shared_experts:
            mlp += model.shared_experts * per / t
    else:
        f = model.ffn_hidden
        mlp = (6 * f if model.gated_mlp else 4 * f) / t
    if fp8:
        # each saved linear input drops from 2 bytes an element to 1: half of what it was
        replicated -= 2 * h                       # the QKV and MLP-up inputs (the norms' outputs)
        attn -= out                               # the output projection's input
        if moe:
            fe = model.expert_ffn_hidden or model.ffn_hidden
            routed = model.top_k * (model.capacity_factor or 1.0)
            mlp -= routed * (fe / (etp or t) + h / sp)
            if model.shared_experts:
                mlp -= model.shared_experts * fe / t
        else:
            mlp -= model.ffn_hidden / t           # the second linear's input
    moe_act = moe and selected and "moe_act" in recompute_modules
    if act_fp8_input and model.gated_mlp:
        # the SwiGLU's input, 2 elements an activation output, from 2 bytes to 1
        if moe:
            fe = model.expert_ffn_hidden or model.ffn_hidden
            if not moe_act:
                mlp -= model.top_k * (model.capacity_factor or 1.0) * 2 * fe / (etp or t)
            mlp -= model.shared_experts * 2 * fe / t
        else:
            mlp -= 2 * model.ffn_hidden / t
    if selected:
        el = 1 if fp8 else 2                      # bytes an element of a saved linear input
        if "layernorm" in recompute_modules:
            if moe:
                replicated -= el * h              # the pre-MLP norm's output
            if model.is_mla:
                replicated -= el * h              # the input norm's output
        if moe_act:
            fe = model.expert_ffn_hidden or model.ffn_hidden
            mlp -= model.top_k * (model.capacity_factor or 1.0) * el * fe / (etp or t)
    return n * (replicated / sp + attn + core + mlp) + gathered


def _cp_check(cp: int, cp_kind: str) -> None:
    if cp_kind not in context.CP_KINDS:
        raise ModelcutError(f"cp_kind must be one of {', '.join(context.CP_KINDS)}, got {cp_kind!r}")


def cp_kept_extra_bytes(model: ModelSpec, *, micro_batch: int, seq: int, t: int = 1, cp: int = 1,
                        cp_kind: str = "ring") -> float:
    """K and V one layer keeps for its backward beyond the rank's own, per micro-batch,
    ``kv_kept_bytes`` − block (:func:`.context.cp_attention`): none for any form (the
    all-gather form gathers K and V again in the backward, the ring passes them round again, and
    the all-to-all form keeps the whole sequence's K and V of its kv_heads/(t·cp) heads, as many
    bytes as its own positions' of kv_heads/t)."""
    _cp_check(cp, cp_kind)
    return 0.0


def cp_transient_bytes(model: ModelSpec, *, micro_batch: int, seq: int, t: int = 1, cp: int = 1,
                       cp_kind: str = "ring", cp_impl: str = "transformer-engine") -> float:
    """The context-parallel buffers alive while one layer's attention runs, beyond what it
    keeps. Transformer Engine's (``cp_impl``): max(forward, backward) of
    ``CPAttention.transient_*_bytes`` — ring: 4 blocks in the backward (K, V, dK, dV of this step
    and the next); all-gather: the whole sequence's K, V gathered again and its dK, dV until
    reduce-scattered, 2·cp blocks; all-to-all: the exchanged copies of the rank's Q, K, V and, in
    the backward, of its dO with them (:func:`.context.a2a_tensors`); hierarchical: those and the
    ring's 4 blocks (a block of its cp/a ranks on heads/(t·a) is as many bytes as one of cp on heads/t).

    PyTorch's SDPA context parallelism ("torch-sdpa", torch 2.13 ``_context_parallel/
    _attention.py``): the K, V it rotates (the all-gather rotation's whole-sequence buffer, cp
    blocks; the ring's this step's and the next, 2) and FP32 accumulators of E_q query elements
    (b·(s/cp)·(heads/t)·d): forward, the running output and one temporary of ``_SDPAMerger``'s,
    2·4·E_q; backward, dQ (4·E_q) and dK, dV three times in FP32 (the sum, the buffer sent on and
    the one received, 3·2 blocks): max(rotated + 8·E_q, rotated + 4·E_q + 6 blocks) (with latent
    attention the forward's E_q counts the output's elements: :func:`..costs.context.cp_widths`)."""
    _cp_check(cp, cp_kind)
    if cp_impl not in context.CP_IMPLS:
        raise ModelcutError(f"cp_impl must be one of {', '.join(context.CP_IMPLS)}, got {cp_impl!r}")
    if cp == 1:
        return 0.0
    blk = context.block_bytes(model, micro_batch, seq, cp, t)
    if cp_impl == "torch-sdpa":
        rotated = cp * blk if cp_kind == "allgather" else 2 * blk
        q, _, _, o = context.cp_widths(model, t)          # dQ's width and the output's (latent attention's own)
        rows = FP32_BYTES * micro_batch * seq / cp
        return rotated + max(2 * rows * o, rows * q + 6 * blk)
    if cp_kind in ("a2a", "a2a+p2p"):
        (qkv, out), _ = context.a2a_tensors(model, micro_batch, seq, cp, t)
        ring = 4 * blk if cp_kind == "a2a+p2p" else 0.0     # the hierarchical ring's blocks: as many bytes
        return sum(qkv) + sum(out) + ring                   # the backward's dO and dQ, dK, dV
    return 4 * blk if cp_kind == "ring" else 2 * cp * blk   # ring: 2 blocks forward, 4 backward


def embedding_activation_bytes(model: ModelSpec, *, micro_batch: int, seq: int, t: int = 1, cp: int = 1,
                               sequence_parallel: bool = False) -> float:
    """First stage: int64 token ids (8 bytes a token) and, with dropout, the embedding's
    dropout mask (h bytes a token, /t with sequence parallelism)."""
    n = micro_batch * seq / cp
    sp = t if sequence_parallel else 1
    return n * (TOKEN_ID_BYTES + (model.hidden / sp if model.dropout else 0))


def loss_activation_bytes(model: ModelSpec, *, micro_batch: int, seq: int, t: int = 1, cp: int = 1,
                          sequence_parallel: bool = False, cross_entropy: str | None = None) -> float:
    """Last stage: the final norm's input and output (2h + 2h, /t with sequence parallelism)
    and what the loss's kernel keeps of the vocab-parallel logits, :data:`LOSS_BYTES`·V/t a token
    (FP32, 4, with no kernel named)."""
    n = micro_batch * seq / cp
    sp = t if sequence_parallel else 1
    return n * (4 * model.hidden / sp + _loss_bytes(cross_entropy)[0] * model.vocab / t)


def loss_transient_bytes(model: ModelSpec, *, micro_batch: int, seq: int, t: int = 1, cp: int = 1,
                         cross_entropy: str | None = None) -> float:
    """What the loss's kernel holds beyond what it keeps while it runs (:data:`LOSS_BYTES`), on
    the device holding the loss, once: (held − kept)·V/t a token."""
    kept, held = _loss_bytes(cross_entropy)
    return micro_batch * seq / cp * (held - kept) * model.vocab / t


def _loss_bytes(cross_entropy: str | None) -> tuple[float, float]:
    if cross_entropy not in LOSS_BYTES:
        raise ModelcutError(f"cross_entropy must be one of {', '.join(k for k in LOSS_BYTES if k)}, "
                            f"got {cross_entropy!r}")
    return LOSS_BYTES[cross_entropy]
