"""FLOP and parameter counts for decoder-only transformers, with named conventions.

Conventions (``CONVENTIONS``):

* ``"megatron"``: Narayanan et al. 2021 (arXiv 2104.04473) eq. 3,
  F = 96·B·s·l·h²·(1 + s/(6h) + V/(16·l·h)), which counts the recomputed forward pass of full
  activation recomputation. :func:`megatron_flops` generalises it to any layer (GQA, gated MLP,
  experts) and reduces to eq. 3 exactly for a GPT with a 4h MLP and multi-head attention; with no
  recomputation it is Korthikanti et al. 2022 (arXiv 2205.05198) §6's model FLOPs,
  72·B·s·l·h²·(1 + s/(6h) + V/(12·l·h)).
* ``"palm"``: Chowdhery et al. 2022 (PaLM, arXiv 2204.02311) Appendix B, model FLOPs per token
  6N + 12·l·s·d (N all parameters, d = heads · head_dim, attention not causal-masked);
  ``"palm-causal"`` halves the attention term (6·l·s·d).
* ``"non-embedding"``: 6·N' + 12·l·s·d with N' the parameters less the input embedding and
  learned positions (the output layer counted unless tied to the input embedding): the count
  torchtitan logs (v0.2.0 torchtitan/models/utils.py ``get_dense_model_nparams_and_flops``:
  ``6 * (nparams - nparams_embedding) + 12 * l * h * q * t``, "we follow the convention and do not
  account for sparsity in causal attention"); ``"non-embedding-causal"`` halves the attention term,
  as Megatron-Bridge 25.11's performance summary counts (its TFLOP/s over tokens/s,
  shared/reference/published-runs-dev2.md: within 1 % on its Llama and Qwen3 rows). NeMo 24.07's
  summary counts ``"megatron"``'s model FLOPs (within 1 % on all twelve of its rows):
  tests/test_flops.py ``test_sources_count_as_their_conventions``.

All counts are multiply-adds × 2 for matrix products only (norms, softmax, activations are
ignored, as in both papers). ``tokens`` = global batch × sequence length.
"""

from __future__ import annotations

from ..errors import ModelcutError
from ..specs import ModelSpec, Training
from .context import attention_products

CONVENTIONS = ("megatron", "palm", "palm-causal", "non-embedding", "non-embedding-causal")
#: Whose published TFLOP/s each convention reproduces, where one does (module doc; checked by
#: tests/test_flops.py ``test_sources_count_as_their_conventions``).
COUNTED_BY = {"non-embedding": "torchtitan's log", "megatron": "NeMo 24.07's summary",
              "non-embedding-causal": "Megatron-Bridge 25.11's summary"}


# ---------------------------------------------------------------- closed forms of the papers

def megatron_eq3(batch: int, seq: int, layers: int, hidden: int, vocab: int) -> float:
    """Narayanan et al. 2021, eq. 3: FLOPs per iteration with full recomputation,
    F = 96·B·s·l·h²·(1 + s/(6h) + V/(16·l·h))."""
    B, s, l, h, V = batch, seq, layers, hidden, vocab
    return 96.0 * B * s * l * h * h * (1 + s / (6 * h) + V / (16 * l * h))


def megatron_eq2(layers: int, hidden: int, vocab: int, seq: int) -> float:
    """Narayanan et al. 2021, eq. 2: parameters of a GPT,
    P = 12·l·h²·(1 + 13/(12h) + (V + s)/(12·l·h))."""
    l, h, V, s = layers, hidden, vocab, seq
    return 12.0 * l * h * h * (1 + 13 / (12 * h) + (V + s) / (12 * l * h))


def palm_flops(tokens: float, params: float, layers: int, seq: int, width: float, causal: bool = False) -> float:
    """PaLM (Chowdhery et al. 2022, Appendix B): tokens · (6N + 12·l·s·d); with ``causal`` the
    attention term counts only the unmasked half, 6·l·s·d."""
    return float(tokens) * (6.0 * params + (6.0 if causal else 12.0) * layers * seq * width)


# ---------------------------------------------------------------- exact parameter counts

def norm_params(model: ModelSpec) -> int:
    """One norm's parameters: LayerNorm has a weight and a bias (2h), RMSNorm a weight (h)."""
    return (2 if model.norm == "layernorm" else 1) * model.hidden


def mlp_inputs(model: ModelSpec) -> int:
    """An MLP's input projections: gate and up when gated (SwiGLU), else one."""
    return 2 if model.gated_mlp else 1


def mlp_weights(model: ModelSpec, width: int) -> int:
    """Matrix weights of one MLP of inner width ``width``: its input projections and the output
    one, (inputs + 1)·h·f (3·h·f gated, 2·h·f otherwise)."""
    return (mlp_inputs(model) + 1) * model.hidden * width


def mlp_params(model: ModelSpec, width: int) -> int:
    """One MLP of inner width ``width``: :func:`mlp_weights`, biases f per input projection plus h
    on the output."""
    biases = (mlp_inputs(model) * width + model.hidden) if model.bias else 0
    return mlp_weights(model, width) + biases


def attention_params(model: ModelSpec) -> int:
    """Q, K, V and output projections: h·(q + 2·kv) + q·h, with Q/K/V biases when ``qkv_bias``
    (default ``bias``) and the output bias when ``bias``; multi-head latent attention's own
    (:func:`mla_attention_params`)."""
    if model.is_mla:
        return mla_attention_params(model.hidden, model.heads, model.q_lora_rank, model.kv_lora_rank,
                                    model.qk_nope_head_dim, model.qk_rope_head_dim, model.v_head_dim)
    h, q, kv = model.hidden, model.q_dim, model.kv_dim
    qkv_bias = model.bias if model.qkv_bias is None else model.qkv_bias
    return h * (q + 2 * kv) + q * h + ((q + 2 * kv) if qkv_bias else 0) + (h if model.bias else 0)


def mla_attention_params(hidden: int, heads: int, q_lora_rank: int | None, kv_lora_rank: int,
                         qk_nope_head_dim: int, qk_rope_head_dim: int, v_head_dim: int) -> int:
    """Multi-head latent attention (DeepSeek-V2, arXiv 2405.04434 §2.1.2; DeepSeek-V3, arXiv
    2412.19437 §2.1.1), without biases: queries through a rank-``q_lora_rank`` bottleneck,
    h·r_q + r_q + r_q·H·(d_nope + d_rope) (with no bottleneck, h·H·(d_nope + d_rope)); keys and
    values from one compressed latent plus a shared RoPE key, h·(r_kv + d_rope) + r_kv
    + r_kv·H·(d_nope + d_v); the output H·d_v·h. The r_q and r_kv terms are the two RMSNorms on
    the latents. DeepSeek-V3 (h 7168, H 128, r_q 1536, r_kv 512, d_nope 128, d_rope 64, d_v 128):
    187,107,328 per layer."""
    h, H = hidden, heads
    qk = qk_nope_head_dim + qk_rope_head_dim
    q = (h * q_lora_rank + q_lora_rank + q_lora_rank * H * qk) if q_lora_rank else h * H * qk
    kv = h * (kv_lora_rank + qk_rope_head_dim) + kv_lora_rank + kv_lora_rank * H * (qk_nope_head_dim + v_head_dim)
    return q + kv + H * v_head_dim * h



def expert_width(model: ModelSpec) -> int:
    return model.expert_ffn_hidden or model.ffn_hidden


def layer_params(model: ModelSpec, moe: bool, active: bool = False) -> int:
    """One transformer layer: attention, MLP (or experts and router), two norms.

    An MoE layer holds ``experts`` routed experts and ``shared_experts`` shared ones plus a
    router (:func:`router_params`); ``active`` counts only the top_k routed experts a token uses.
    With one expert, top_k 1 and no shared expert an MoE layer is exactly a dense one."""
    p = attention_params(model) + 2 * norm_params(model)
    if moe:
        routed = model.top_k if active else model.experts
        p += (routed + model.shared_experts) * mlp_params(model, expert_width(model))
        p += router_params(model)
    else:
        p += mlp_params(model, model.ffn_hidden)
    return p


def router_params(model: ModelSpec) -> int:
    """The gating network of an MoE layer, one h × E linear layer without bias (GShard, Lepikhin
    et al. 2020 §2.2; Switch Transformers, Fedus et al. 2021 §2.1); none with a single expert,
    which needs no routing."""
    return model.hidden * model.experts if model.experts > 1 else 0


def _moe_layers_before(model: ModelSpec, i: int) -> int:
    """MoE layers among layers 0 .. i − 1: those j ≥ d with (j − d + 1) a multiple of k
    (d = ``dense_layers``, k = ``moe_every``), ⌊(i − d)/k⌋."""
    if not model.is_moe:
        return 0
    return max(0, i - model.dense_layers) // model.moe_every


def moe_layer_count(model: ModelSpec) -> int:
    """Layers with experts: past the first ``dense_layers``, every ``moe_every``-th (none for a
    dense model; all but the dense ones with moe_every 1)."""
    return _moe_layers_before(model, model.layers)


def moe_layers_in(model: ModelSpec, first: int, count: int) -> int:
    """MoE layers among the ``count`` layers from layer ``first`` (a pipeline stage's)."""
    return _moe_layers_before(model, first + count) - _moe_layers_before(model, first)


def is_moe_layer(model: ModelSpec, i: int) -> bool:
    """Whether layer ``i`` (from 0) holds experts (:class:`~modelcut.core.specs.ModelSpec`)."""
    return moe_layers_in(model, i, 1) == 1


def embedding_params(model: ModelSpec) -> int:
    """Input embedding V·h, learned positions max_seq·h, and the output head V·h unless tied."""
    p = model.vocab * model.hidden
    if model.learned_positions:
        p += model.max_seq * model.hidden
    if not model.tied_embeddings:
        p += model.vocab * model.hidden
    return p


def param_count(model: ModelSpec, active: bool = False) -> int:
    """Every parameter, exactly: embeddings (+ learned positions, + untied head), each layer
    (:func:`layer_params`) and the final norm. ``active`` counts the experts one token uses.

    For a GPT with learned positions this is eq. 2 of Narayanan et al. 2021 plus the final
    LayerNorm's 2h (eq. 2 omits it). Llama 3 405B: 405.8 B (Grattafiori et al. 2024, Table 3)."""
    moe = moe_layer_count(model)
    return (embedding_params(model) + (model.layers - moe) * layer_params(model, False, active)
            + moe * layer_params(model, True, active) + norm_params(model))


def layer_matmul_params(model: ModelSpec, moe: bool) -> int:
    """Weights of one layer's matrix products that one token passes through: attention
    projections (:func:`.context.attention_products`' weights: 2·h·q + 2·h·kv, or latent attention's
    own), the MLP (top_k routed + shared experts and the router in an MoE layer)."""
    attn = sum(n * k for _, _, n, k in attention_products(model, 1))
    if moe:
        return attn + (model.top_k + model.shared_experts) * mlp_weights(model, expert_width(model)) + router_params(model)
    return attn + mlp_weights(model, model.ffn_hidden)


def _layer_forward_flops_per_token(model: ModelSpec, seq: int, moe: bool) -> float:
    """Forward FLOPs of one layer for one token: 2 per matrix weight, plus QKᵀ and A·V,
    2·2·s·q (no causal saving, as eq. 3 counts it; q the core's width, ``ModelSpec.core_width``)."""
    return 2.0 * layer_matmul_params(model, moe) + 4.0 * seq * model.core_width


def _logits_forward_flops_per_token(model: ModelSpec) -> float:
    """The output layer's forward FLOPs for one token: the logits, 2·h·V."""
    return 2.0 * model.hidden * model.vocab


def _layers_forward_flops_per_token(model: ModelSpec, seq: int) -> float:
    """Every transformer layer's forward FLOPs for one token: the products and the attention over
    the causally unmasked pairs (:func:`causal_model_flops`)."""
    moe = moe_layer_count(model)
    attn = sum(n * attention_pairs(seq, window, chunk) for n, window, chunk in attention_layer_kinds(model)) \
        * 4.0 * model.core_width / seq
    return ((model.layers - moe) * 2.0 * layer_matmul_params(model, False)
            + moe * 2.0 * layer_matmul_params(model, True) + attn)


def layer_and_output_flops_per_token(model: ModelSpec, seq: int) -> tuple[float, float]:
    """(an average transformer layer's, the output layer's) forward FLOPs for one token, counted as
    :func:`causal_model_flops` counts them: the layers' averaged over the model's layers (dense and
    MoE alike); the logits 2·h·V."""
    return _layers_forward_flops_per_token(model, seq) / model.layers, _logits_forward_flops_per_token(model)


# ---------------------------------------------------------------- per-step counts

def causal_model_flops(model: ModelSpec, batch: int, seq: int) -> float:
    """The work a step's matrix products and attention do, counted as the default model times it:
    forward + backward = 3 × the forward; every layer's products (2 per matrix weight a token
    passes through, the routed top-k experts in an MoE layer) and the logits (2·h·V per token), and
    the attention core over the causally unmasked half of the (query, key) pairs, 2·2·s·q/2 per
    token per layer, q the core's width (``ModelSpec.core_width``: latent attention's own, not its
    equal-weight grouped-query shape's) (a sliding-window or chunked layer's over its pairs, :func:`attention_pairs`); no
    recomputation. The FLOPs behind the default model's MFU, which therefore never exceeds 100 %:
    every one of them is timed at no more than the accelerator's peak."""
    return _tokens(batch, seq) * 3.0 * (_layers_forward_flops_per_token(model, seq) + _logits_forward_flops_per_token(model))


def attention_pairs(seq: int, window: int | None = None, chunk: int | None = None) -> float:
    """(query, key) pairs a causal attention over ``seq`` tokens scores, s²/2 (the masked half
    left out, as the time model counts it); within a sliding ``window`` of keys (each query's
    own among them) s·w − w²/2 when w < s; within blocks of ``chunk`` tokens, q·c²/2 + r²/2
    (s = q·c + r: q causal attentions of c tokens and one of the r left)."""
    if chunk is not None and chunk < seq:
        q, r = divmod(seq, chunk)
        return (q * chunk * chunk + r * r) / 2.0
    if window is None or window >= seq:
        return seq * seq / 2.0
    return seq * window - window * window / 2.0


def attention_layer_kinds(model: ModelSpec) -> tuple[tuple[int, int | None, int | None], ...]:
    """The layers by how they attend, (count, window, chunk): causally over the whole sequence,
    within a sliding window (``sliding_layers``), within blocks (``chunked_layers``); kinds of no
    layer left out."""
    full = model.layers - model.sliding_layers - model.chunked_layers
    kinds = ((full, None, None), (model.sliding_layers, model.sliding_window, None),
             (model.chunked_layers, None, model.attention_chunk))
    return tuple(k for k in kinds if k[0] > 0)


def _tokens(batch: int, seq: int) -> float:
    return float(batch) * seq


def megatron_model_flops(model: ModelSpec, batch: int, seq: int) -> float:
    """Model FLOPs per step without recomputation, eq. 3's way: forward + backward = 3 × the
    forward of every layer, plus the logits 6·h·V per token (Korthikanti et al. 2022 §6:
    72·B·s·l·h²·(1 + s/(6h) + V/(12·l·h)) for a GPT)."""
    moe = moe_layer_count(model)
    per_token = 3.0 * ((model.layers - moe) * _layer_forward_flops_per_token(model, seq, False)
                       + moe * _layer_forward_flops_per_token(model, seq, True))
    return _tokens(batch, seq) * (per_token + 3.0 * _logits_forward_flops_per_token(model))


def recompute_flops(model: ModelSpec, batch: int, seq: int, recompute: str,
                    modules: tuple[str, ...] | None = None) -> float:
    """Extra forward work of activation recomputation per step: ``full`` re-runs every layer's
    forward; ``selective`` only the attention core QKᵀ, softmax, A·V (Korthikanti et al. 2022
    §5), 4·s·q per layer per token, where it is among the ``modules`` recomputed (None: it is; the
    norms and activations the others name are no products); ``none`` nothing. (torchtitan's per-op
    policy recomputes products instead: :func:`.op_sac.recompute_flops`.)"""
    if recompute == "none":
        return 0.0
    tokens = _tokens(batch, seq)
    if recompute == "selective":
        if modules is not None and "core_attn" not in modules:
            return 0.0
        return tokens * model.layers * 4.0 * seq * model.core_width
    if recompute == "full":
        moe = moe_layer_count(model)
        return recomputed_layers_flops(model, batch, seq, model.layers - moe, moe)
    raise ModelcutError(f"recompute must be none, selective or full, got {recompute!r}")


def recomputed_layers_flops(model: ModelSpec, batch: int, seq: int, dense: float, moe: float) -> float:
    """The forward FLOPs per step of ``dense`` dense and ``moe`` MoE layers a micro-batch runs again
    (full recomputation all of them; Megatron-core's block method some, whole:
    :meth:`..plan.Stage.recomputed`)."""
    return _tokens(batch, seq) * (dense * _layer_forward_flops_per_token(model, seq, False)
                                  + moe * _layer_forward_flops_per_token(model, seq, True))


def megatron_flops(model: ModelSpec, batch: int, seq: int, recompute: str = "full") -> float:
    """Eq. 3 of Narayanan et al. 2021 generalised: model FLOPs plus the recomputation's.

    For a GPT (4h MLP, multi-head attention, tied embeddings) with ``recompute="full"`` this
    is exactly 96·B·s·l·h²·(1 + s/(6h) + V/(16·l·h))."""
    return megatron_model_flops(model, batch, seq) + recompute_flops(model, batch, seq, recompute)


def palm_model_flops(model: ModelSpec, batch: int, seq: int, causal: bool = False) -> float:
    """PaLM's model FLOPs per step, tokens · (6N + 12·l·s·d), N = :func:`param_count` with the
    active experts only, d = heads · head_dim, or latent attention's ``ModelSpec.core_width``,
    H·(d_nope + d_rope + d_v)/2, as torchtitan counts DeepSeek-V3 (models/deepseek_v3/model.py
    ``get_nparams_and_flops``: its heads and d_nope + d_rope + d_v into 6·l·heads·dims·s)."""
    return palm_flops(_tokens(batch, seq), param_count(model, active=True), model.layers, seq,
                      model.core_width, causal)


def input_embedding_params(model: ModelSpec) -> int:
    """The input embedding V·h and learned positions max_seq·h: what the ``"non-embedding"``
    convention leaves out of N (an output head tied to the input embedding goes with it)."""
    return model.vocab * model.hidden + (model.max_seq * model.hidden if model.learned_positions else 0)


def non_embedding_model_flops(model: ModelSpec, batch: int, seq: int, causal: bool = False) -> float:
    """torchtitan's model FLOPs per step (module doc, ``"non-embedding"``): tokens · (6N' + 12·l·s·d),
    N' = :func:`param_count` (active experts) less :func:`input_embedding_params`; with ``causal``
    the attention term halved (Megatron-Bridge 25.11's count)."""
    n = param_count(model, active=True) - input_embedding_params(model)
    return palm_flops(_tokens(batch, seq), n, model.layers, seq, model.core_width, causal)


def model_flops(model: ModelSpec, training: Training, convention: str) -> float:
    """Model FLOPs per step (no recomputation) under a named convention."""
    if convention == "megatron":
        return megatron_model_flops(model, training.global_batch, training.seq_len)
    if convention in ("palm", "palm-causal"):
        return palm_model_flops(model, training.global_batch, training.seq_len, convention == "palm-causal")
    if convention in ("non-embedding", "non-embedding-causal"):
        return non_embedding_model_flops(model, training.global_batch, training.seq_len,
                                         convention == "non-embedding-causal")
    raise ModelcutError(f"unknown FLOP convention {convention!r}; choose one of {', '.join(CONVENTIONS)}")


def model_tflops_per_gpu(model: ModelSpec, training: Training, gpus: int, step_s: float) -> dict[str, float]:
    """Model TFLOP/s per GPU of a step of ``step_s`` seconds on ``gpus`` GPUs under each of
    :data:`CONVENTIONS` (:func:`model_flops`: no recomputation), to set beside a log or a table
    that counts one of them: model FLOPs over gpus · step time."""
    if gpus < 1 or not step_s > 0:
        raise ModelcutError(f"model TFLOP/s needs at least one GPU and a positive step time, got {gpus}, {step_s}")
    return {c: model_flops(model, training, c) / (gpus * step_s) / 1e12 for c in CONVENTIONS}


def executed_flops(model: ModelSpec, training: Training, convention: str,
                   recomputed: float | None = None) -> float:
    """Work actually executed per step: the convention's model FLOPs plus recomputation
    (:func:`recompute_flops`, or ``recomputed`` where the stack's policy counts it otherwise:
    :func:`.op_sac.recompute_flops`)."""
    if recomputed is None:
        recomputed = recompute_flops(model, training.global_batch, training.seq_len, training.recompute,
                                     training.recompute_modules)
    return model_flops(model, training, convention) + recomputed


def reported_convention(training: Training) -> str:
    """The count behind the TFLOP/s per GPU modelcut reports (the deck's, as its sources count):
    Narayanan et al. 2021 eq. 3 ("megatron") with full recomputation, PaLM's 6N + 12·l·s·d
    (attention over every (query, key) pair) otherwise; the recomputed work added
    (:func:`reported_flops`). MFU counts :func:`causal_model_flops` instead, the work the time
    model charges, so the two differ by the masked half of attention and by recomputation."""
    return "megatron" if training.recompute == "full" else "palm"


def reported_flops(model: ModelSpec, training: Training, recomputed: float | None = None) -> float:
    """FLOPs per step behind the reported TFLOP/s per GPU (:func:`reported_convention`), the
    recomputed work as :func:`executed_flops` takes it."""
    return executed_flops(model, training, reported_convention(training), recomputed)
