"""The bytes a layer's memory-bound kernels move, by stack: norms, residual adds, activations,
rotary embedding, the eager paths of stacks that fuse less, copies around the attention kernel,
the SwiGLU input's FP8 store; and the cross-entropy's bytes a logit.

One place for each count, with its source: the layer's time (:mod:`.layers`, which times these
bytes at the measured bandwidth, :func:`..costs.kernels.mem_time`) and the kernel checks
(:mod:`..analysis.kernel_checks`) read them. :func:`memory_bytes` sums a layer's, forward and
backward, as the module doc of :mod:`.layers` lists them; :func:`mla_up_bytes` what latent
attention's ``mla_up_proj`` recomputation runs again.
"""

from __future__ import annotations

from typing import TYPE_CHECKING

from ..costs import context
from ..costs.kernels import BYTES
from ..costs.loss import LOSS_KERNELS
from ..specs import ModelSpec

if TYPE_CHECKING:          # the setup's fields are read, not built, here
    from .layer_setup import LayerSetup


#: Bytes per logit each cross-entropy moves, (forward, backward): :data:`..costs.loss.LOSS_KERNELS`.
CE_BYTES: dict[str, tuple[float, float]] = {k: (v.moved_fwd, v.moved_bwd) for k, v in LOSS_KERNELS.items()}


#: Bytes per element of PyTorch's eager (one kernel per op) elementwise code, bf16 activations,
#: as the reference implementations write it (a framework that fuses nothing: plain PyTorch
#: modules under FSDP without ``torch.compile``). RMSNorm is ``torch.nn.RMSNorm`` in torchtitan
#: (v0.2.0 ``torchtitan/models/llama3/model/model.py``) and in llm-foundry (its ``rmsnorm``,
#: ``llmfoundry/models/layers/norm.py`` at 8c8dd48), which torch 2.13 runs as one fused kernel
#: each way (``aten::_fused_rms_norm`` and ``_fused_rms_norm_backward``, with CUDA kernels; the
#: op-by-op form, Meta's ``llama/model.py`` ``x * rsqrt(x.pow(2).mean(-1) + eps)``, would move
#: 36 and 60 bytes an element). Those kernels are slower than cuDNN's fused norm for the same
#: bytes: NVIDIA's cudnn-frontend norm sweep on an H200 (commit df73764,
#: ``benchmark/norms/results/h200/all_models_20260227_035147.csv``, ``F.rms_norm`` in the
#: nvcr.io/nvidia/pytorch:25.12 container against cuDNN 9.19.1) takes, over its ten
#: transformer-sized shapes (hidden 2,048-16,384, 2,048-16,384 rows), a median 1.235 times
#: cuDNN's forward and 2.14 times its backward (the rows and their source: ``catalog/kernel_checks.toml``
#: ``[[norm_sweep]]``); charged as the fused norm's 4 and 6 bytes scaled by those ratios
#: (:data:`TORCH_RMSNORM_RATIOS`, below :data:`NORM_BYTES`). SwiGLU, ``F.silu(w1(x)) * w3(x)``, per
#: element of the f-wide output: silu 2 + 2, product 2 + 2 + 2 = 10 forward; product backward 6 + 6, silu
#: backward 6 = 18. Rotary embedding (``apply_rotary_emb``: cast to fp32, complex product,
#: cast back), per element of Q and K: 6 + 8 + 6 = 20 each way. Dropout, when the model has
#: it, a kernel of its own: read 2, write 2 and a 1-byte mask = 5. LayerNorm and GeLU are
#: single native kernels in PyTorch (``torch.nn.LayerNorm``, ``F.gelu``): as fused.
EAGER_SWIGLU_FWD = 10.0
EAGER_SWIGLU_BWD = 18.0
EAGER_ROPE = 20.0
EAGER_DROPOUT = 5.0

#: Bytes per element of the three eager paths in Megatron-core's layers (Megatron-LM 0d8e0714, the
#: core_dev_r0.15.0 commit Megatron-Bridge v0.2.0 pins), bf16.
#: RoPE with a YaRN attention factor other than 1: ``apply_rotary_pos_emb`` warns that TE's fused
#: RoPE does not take ``mscale`` and runs ``_apply_rotary_pos_emb_bshd``
#: (megatron/core/models/common/embeddings/rope_utils.py), per element of Q and K: t·cos 2 + 2,
#: ``_rotate_half``'s negation of one half 1 + 1 and its concatenation 2 + 2, ·sin 2 + 2, the sum
#: 4 + 2, the final ``torch.cat((t, t_pass))`` 2 + 2 = 24 forward; backward: the two products' input
#: gradients 4 + 4, the negation 2, the chunk's gradient concatenated 4, the two paths summed 6 = 20
#: (the fused kernel: 4 each way).
MCORE_EAGER_ROPE_FWD = 24.0
MCORE_EAGER_ROPE_BWD = 20.0
#: A clamped GLU in the routed experts (``activation_func_clamp_value``, GPT-OSS):
#: ``weighted_bias_quick_geglu_impl`` (megatron/core/fusions/fused_bias_geglu.py) clamps both
#: halves and concatenates them eagerly before its compiled kernel, per element of the up product's
#: output: clamps 2 + 2, ``torch.cat`` 2 + 2 = 8 forward; the clamps' backward (read the gradient
#: and the input, write) 6 and the chunk's gradient concatenated 4 = 10 backward.
MCORE_GLU_CLAMP_FWD = 8.0
MCORE_GLU_CLAMP_BWD = 10.0
#: The routed experts' output biases: ``TEGroupedMLP._apply_bias``
#: (megatron/core/transformer/moe/experts.py) adds them expert by expert in Python,
#: ``torch.cat([t + b * p ...])``, per element of the down product's output: b·p written 2, the sum
#: 2 + 2 + 2, the concatenation 2 + 2 = 12 forward; backward: the bias gradient (g·p written and
#: read 2 + 2, from g 2) 6, the probability gradient (g·b likewise) 6, the split's gradient
#: concatenated 4 = 16.
MCORE_EXPERT_BIAS_FWD = 12.0
MCORE_EXPERT_BIAS_BWD = 16.0


#: Megatron-core's eager paths by name, as a prediction's notes describe them.
MCORE_EAGER_PATHS = {"rope": "RoPE (a YaRN attention factor: not TE's fused kernel)",
                     "glu clamp": "the experts' clamped GLU",
                     "expert bias": "the experts' output biases, expert by expert"}


def mcore_eager_paths(model: ModelSpec) -> tuple[str, ...]:
    """Which of Megatron-core's eager paths (:data:`MCORE_EAGER_PATHS`) a model takes (:mod:`.layers`' module doc):
    "rope" (a YaRN attention factor other than 1), "glu clamp" (a clamped GLU in routed experts),
    "expert bias" (routed experts with output biases). The one rule the layer's bytes and the
    step's notes read."""
    out = []
    if not model.learned_positions and model.rope_mscale != 1.0:
        out.append("rope")
    if model.is_moe and model.gated_mlp and model.glu_clamp:
        out.append("glu clamp")
    if model.is_moe and model.bias:
        out.append("expert bias")
    return tuple(out)


#: A norm's forward moves its input in and its output out, 2 + 2 bytes per element, LayerNorm
#: and RMSNorm alike (the statistics are per token, negligible).
NORM_BYTES = 4.0
#: Its backward reads the input and the output's gradient and writes the input's, 2 + 2 + 2.
NORM_BYTES_BWD = 6.0
#: PyTorch's fused RMSNorm kernels' time over cuDNN's for the same shape, forward and backward
#: (the eager-code note above): the medians of NVIDIA's cudnn-frontend H200 norm sweep.
TORCH_RMSNORM_RATIOS = (1.235, 2.14)
EAGER_RMSNORM_FWD = NORM_BYTES * TORCH_RMSNORM_RATIOS[0]
EAGER_RMSNORM_BWD = NORM_BYTES_BWD * TORCH_RMSNORM_RATIOS[1]
#: Bytes per element of the copies around a FlashAttention call on unpadded rows, as MosaicML's
#: llm-foundry makes it (``llmfoundry/models/layers/attention.py`` ``flash_attn_fn``, the same from its
#: first version, c4f8c7540 of 2023-04-28, through 8c8dd48: Q, K and V each through
#: ``bert_padding.index_first_axis``, the output through ``bert_padding.pad_input``), timed as
#: flash-attn's ``flash_attn/bert_padding.py`` runs them, 16-bit: forward, Q, K and V each gathered
#: (``torch.gather``: read 2, write 2) and the output scattered into a zeroed padded tensor
#: (``torch.zeros``, then ``output[indices] = values``: 2 + 2 + 2); backward, each gather's gradient
#: scattered into zeros (``scatter_``: 2 + 2 + 2) and the output's gathered back (2 + 2).
#: (forward, backward) per element of Q, K and V, then of the output.
UNPAD_BYTES = ((4.0, 6.0), (6.0, 4.0))
#: The kernels those copies surround: flash-attn's (its ``flash_attn_varlen_func``), not cuDNN's or
#: the unfused path, which take the padded tensors.
UNPAD_KERNELS = ("flash2", "flash3", "flash4")
#: Bytes K and V each move where a stack repeats them out to the query heads before the attention
#: kernel, torchtitan's ``repeat_kv`` (``unsqueeze``, ``expand``, then ``reshape``: a copy), called on
#: both before SDPA (torchtitan v0.2.0 and v0.2.1 ``torchtitan/models/llama3/model/model.py``; the
#: repeat was removed for SDPA's ``enable_gqa`` on 2026-01-27, commit ff0829c10, "GQA without kv
#: repeats", first released in v0.2.2): forward, read the kv-wide tensor and write the q-wide copy,
#: 2 bytes an element each; backward, the copy's gradient summed back over the repeats, read q-wide
#: and write kv-wide. (per kv-wide element, per q-wide element), each way.
REPEAT_KV_BYTES = (2.0, 2.0)
#: Megatron-core's ``activation_func_fp8_input_store`` (:class:`..specs.Training`): the forward casts the
#: SwiGLU's input to FP8 for its backward (``input.to(torch.float8_e4m3fn)``: read 2, write 1) and the
#: backward casts it back (``input.to(ctx.ori_input_dtype)``: read 1, write 2), core_v0.15.0
#: megatron/core/fusions/fused_bias_swiglu.py ``BiasSwiGLUFunction``/``SwiGLUFunction``. (forward,
#: backward) bytes per element of the input, the up product's output.
ACT_FP8_STORE_BYTES = (3.0, 3.0)
#: TorchInductor's RMSNorm (``F.rms_norm`` under ``torch.compile``, as torchtitan compiles each block
#: with its ``nn.RMSNorm``) over cuDNN's for the same shapes, the medians of the same sweep's
#: torch_compile columns: its forward runs as cuDNN's, its backward (the input's gradient and a
#: second reduction over the rows for the weight's) at about twice cuDNN's time. Charged as the fused
#: norm's 4 and 6 bytes scaled by them, where a stack compiles its blocks (``LayerSetup.compiled``).
COMPILED_RMSNORM_RATIOS = (1.044, 1.976)
COMPILED_RMSNORM_FWD = NORM_BYTES * COMPILED_RMSNORM_RATIOS[0]
COMPILED_RMSNORM_BWD = NORM_BYTES_BWD * COMPILED_RMSNORM_RATIOS[1]


def rotary_width(model: ModelSpec, t: int) -> int:
    """Elements a token rotary embedding turns on one tensor-parallel rank: the queries' and keys'
    widths, q/t + kv_t; with latent attention the queries' rotary parts and the one shared rotary
    key, (H/t + 1)·d_rope (``apply_rotary_pos_emb`` on ``q_pos_emb`` and ``k_pos_emb``,
    core_v0.15.0 multi_latent_attention.py)."""
    if model.is_mla:
        return (model.heads // t + 1) * model.qk_rope_head_dim
    q, k, _, _ = context.cp_widths(model, t)
    return q + k


def norm_bytes(model: ModelSpec, setup: LayerSetup) -> tuple[float, float]:
    """Bytes an element one norm moves, (forward, backward), as the stack runs it: a fused norm's
    :data:`NORM_BYTES` and :data:`NORM_BYTES_BWD` (LayerNorm everywhere, RMSNorm in Megatron-LM and
    Transformer Engine); RMSNorm in eager PyTorch (:data:`EAGER_RMSNORM_FWD`) or compiled by
    TorchInductor (:data:`COMPILED_RMSNORM_FWD`) at their measured time over cuDNN's."""
    if model.norm == "rmsnorm" and not setup.fused_elementwise:
        return EAGER_RMSNORM_FWD, EAGER_RMSNORM_BWD
    if model.norm == "rmsnorm" and setup.compiled:
        return COMPILED_RMSNORM_FWD, COMPILED_RMSNORM_BWD
    return NORM_BYTES, NORM_BYTES_BWD


def memory_bytes(model: ModelSpec, setup: LayerSetup, mlp, local_params: float, expert_params: float = 0.0
                  ) -> tuple[float, float, dict[str, float], list[tuple[str, float, float]]]:
    """Bytes the layer's memory-bound kernels move, (forward, backward) (:mod:`.layers`' module doc), the
    forward bytes of the modules selective recomputation may name (``layernorm``, ``moe_act``),
    and the two sums' terms by kernel, (name, forward, backward). ``local_params``: the layer's
    weights on this device, ``expert_params`` of them the routed experts'."""
    t = setup.tp
    T = setup.micro_batch * setup.seq_len // setup.cp
    Tn = T // t if setup.sequence_parallel else T
    h = model.hidden
    q_w, k_w, v_w, o_w = context.cp_widths(model, t)     # the attention core's Q, K, V and output
    gated, drop, rope = model.gated_mlp, model.dropout, not model.learned_positions
    ups = [g for g in mlp if g.name.endswith(" up")]
    # rows × local width of the MLP's activation (each up product's output, halved when gated)
    act_elems = sum(g.m * g.count * (g.n // 2 if gated else g.n) for g in ups)
    up_out = sum(g.m * g.count * g.n for g in ups)
    fused = setup.fused_elementwise
    nb, nb_b = norm_bytes(model, setup)
    if fused:
        resid_f = (6.0 + (1.0 if drop else 0.0)) * Tn * h       # bias+dropout+residual, fused
    else:
        resid_f = (6.0 + (EAGER_DROPOUT if drop else 0.0)) * Tn * h
    act_coef = (6.0 if fused else EAGER_SWIGLU_FWD) if gated else 4.0   # forward bytes an activation element
    act_f = act_coef * act_elems
    rope_elems = T * rotary_width(model, t) if rope else 0.0
    rope_per = 4.0 if fused else EAGER_ROPE          # forward bytes an element
    rope_f = rope_b = rope_per * rope_elems
    clamp_f, extra_f, extra_b = 0.0, 0.0, 0.0
    eager = mcore_eager_paths(model) if setup.mcore_layers else ()
    if "rope" in eager:
        rope_per = MCORE_EAGER_ROPE_FWD
        rope_f, rope_b = MCORE_EAGER_ROPE_FWD * rope_elems, MCORE_EAGER_ROPE_BWD * rope_elems
    expert_up = sum(g.m * g.count * g.n for g in ups if g.name == "expert up")
    expert_down = sum(g.m * g.count * g.n for g in mlp if g.name == "expert down")
    if "glu clamp" in eager:
        clamp_f = MCORE_GLU_CLAMP_FWD * expert_up
        extra_f, extra_b = clamp_f, MCORE_GLU_CLAMP_BWD * expert_up
    if "expert bias" in eager:
        extra_f, extra_b = extra_f + MCORE_EXPERT_BIAS_FWD * expert_down, extra_b + MCORE_EXPERT_BIAS_BWD * expert_down
    latents = nb * Tn * model.latent_width     # latent attention's two latent norms
    norms_f, resid2_f = 2 * nb * Tn * h + latents, 2 * resid_f
    unpad_f = unpad_b = 0.0
    if setup.attention_unpad and setup.attention in UNPAD_KERNELS:
        (qkv_f, qkv_b), (out_f, out_b) = UNPAD_BYTES
        qkv_el, out_el = T * (q_w + k_w + v_w), T * o_w
        unpad_f, unpad_b = qkv_f * qkv_el + out_f * out_el, qkv_b * qkv_el + out_b * out_el
    rep_f = rep_b = 0.0
    if setup.gqa_repeat_kv and k_w < q_w:
        per_kv, per_q = REPEAT_KV_BYTES
        rep_f = rep_b = 2 * T * (per_kv * k_w + per_q * q_w)    # K and V
    store_f = store_b = 0.0
    if setup.act_fp8_input and gated:
        store_f, store_b = (c * up_out for c in ACT_FP8_STORE_BYTES)
    mem_f = norms_f + resid2_f + act_f + rope_f + extra_f + unpad_f + rep_f + store_f
    expert_act = sum(g.m * g.count * (g.n // 2 if gated else g.n) for g in ups if g.name == "expert up")
    # moe_act checkpoints the activation function, its clamped GLU included; the output biases are
    # added after the down product, outside it (Megatron-LM core_v0.15.0 megatron/core/transformer/moe/
    # experts.py TEGroupedMLP.forward: the checkpoint wraps bias_act_func, _apply_bias follows linear_fc2)
    # the MoE layer's own pre-MLP norm; with latent attention the input norm too (its own kernel there)
    modules = {"layernorm": nb * Tn * h * ((1 if expert_up else 0) + (1 if model.is_mla else 0)),
               "moe_act": act_coef * expert_act + clamp_f,
               "mla_up_proj": mla_up_bytes(model, setup, nb, rope_per if rope else 0.0)}
    resid_b = (5.0 * Tn * h if drop else 0.0) + 6.0 * Tn * h   # dropout backward, gradient sum
    act_b = ((10.0 if fused else EAGER_SWIGLU_BWD) if gated else 6.0) * act_elems
    # the bias gradients read each biased output's gradient: QKV, MLP up, and the two row-parallel
    # outputs (projection, MLP down); the routed experts' down bias is the eager path's own where charged
    row_outputs = 1 if "expert bias" in eager else 2
    bias_b = BYTES * (T * (q_w + k_w + v_w) + up_out + row_outputs * Tn * h) if model.bias else 0.0
    norms_b, resid2_b = 2 * nb_b * Tn * h + nb_b / nb * latents, 2 * resid_b
    mem_b = norms_b + resid2_b + act_b + rope_b + bias_b + extra_b + unpad_b + rep_b + store_b
    adds = ", ".join([w for w, on in (("bias", model.bias), ("dropout", drop)) if on] + ["residual adds"])
    items = [("norms", norms_f, norms_b), (adds, resid2_f, resid2_b), ("MLP activation", act_f, act_b),
             ("rotary embedding", rope_f, rope_b), ("eager clamps and expert biases", extra_f, extra_b),
             ("bias gradients", 0.0, bias_b), ("attention unpad and pad copies", unpad_f, unpad_b),
             ("K and V repeated to the query heads", rep_f, rep_b),
             ("SwiGLU input to FP8 and back", store_f, store_b)]
    if not setup.grad_accum_fusion:
        expert_b = setup.grad_accum_bytes if setup.grad_accum_expert_bytes is None else setup.grad_accum_expert_bytes
        accum = setup.grad_accum_bytes * (local_params - expert_params) + expert_b * expert_params
        mem_b += accum
        if accum > 0:
            items.append(("weight-gradient accumulation", 0.0, accum))
    return mem_f, mem_b, modules, items


def mla_up_bytes(model: ModelSpec, setup: LayerSetup, norm_bytes: float, rope_bytes: float) -> float:
    """Forward bytes of the memory-bound part of ``mla_up_proj``'s recomputation: the latents' two
    norms (``q_layernorm``, ``kv_layernorm``: ``ModelSpec.latent_width`` elements a token at the stack's
    norm bytes, on the rank's own T/t tokens under sequence parallelism, before the up projections
    gather them) and RoPE on the queries' and the shared key's rotary parts (:func:`rotary_width`,
    ``rope_bytes`` an element, the stack's RoPE as the layer's forward charges it), per micro-batch
    on this rank (megatron/core/transformer/multi_latent_attention.py ``qkv_up_proj_and_rope_apply``);
    the forward charges both the same way. 0 for a model without latent attention."""
    if not model.is_mla:
        return 0.0
    T = setup.micro_batch * setup.seq_len // setup.cp
    Tn = T // setup.tp if setup.sequence_parallel else T
    return Tn * norm_bytes * model.latent_width + T * rope_bytes * rotary_width(model, setup.tp)
