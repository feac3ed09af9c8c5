"""torchtitan's per-op selective activation checkpointing (``selective_ac_option = "op"``): which
of a dense transformer layer's products it keeps for the backward and which it runs again, and
the bytes a layer keeps. The one place the step time (``step.layers``, the recomputed forward)
and the memory model (``memory.activations``) read the policy from.

The policy (torchtitan v0.2.0 ``torchtitan/distributed/activation_checkpoint.py``
``_apply_op_sac``, with ``_op_sac_save_list`` of ``torchtitan/models/llama3/infra/parallelize.py``;
the same rule in later releases' ``SelectiveAC``): inside each checkpointed block, the outputs of
the ops on the save list are kept (the matrix products ``aten.mm``, SDPA's fused attention, the
functional reduce-scatters, ``max``), except every second ``aten.mm``, counted in call order
from the block's start, which is recomputed; every op off the list (norms, activations, rotary
embedding, residual adds, the sequence-parallel all-gathers) is recomputed too.

torchtitan's Llama block calls its products in the order wq, wk, wv, wo, w1, w3, w2
(``torchtitan/models/llama3/model/model.py``: ``xq, xk, xv = self.wq(x), self.wk(x), self.wv(x)``
… ``self.wo(output)``; ``self.w2(F.silu(self.w1(x)) * self.w3(x))``); an ungated MLP calls two,
up then down. So it keeps q, v, w1 and w2's outputs (gated), or q, v and the MLP's up product
(ungated), and runs k, wo and w3 (gated), or k, wo and the MLP's down product (ungated), again.

Kept per token on one tensor-parallel rank (:func:`kept_bytes`, 16-bit outputs): the block's
input, the kept products' outputs (a row-parallel product's is its whole-width partial sum), SDPA's
output and FP32 log-sum-exp, and with sequence parallelism the reduce-scatters' outputs after wo and
the MLP's down product.

**FP8 products** (``scaled_mm``): torchao's ``Float8Linear`` runs its products as
``aten._scaled_mm`` (torchao/float8/float8_linear.py ``matmul_with_hp_or_float8_args``), which
torchtitan's save list does not name, from December 2024 through v0.2.2 (``_save_list`` in
torchtitan/parallelisms/parallelize_llama.py @e846b69, which saved ``aten.abs`` too;
``_op_sac_save_list`` in models/llama3/infra/parallelize.py of v0.1.0 to v0.2.2): only ``aten.mm`` is
counted and kept. So an
FP8 layer keeps none of its products' outputs and runs every product again in the backward; its
scales (the saved ``aten.max``) are a few bytes. Under torch.compile the policy's
``PREFER_RECOMPUTE`` is a must (torch 2.13 torch/_functorch/partitioners.py ``must_recompute``), so
the compiled stack recomputes them as the eager one does. (torchtitan's main branch since March 2026,
pytorch/torchtitan#2357, saves every product on PyTorch's compute-intensive op list, ``_scaled_mm``
included; the presets follow v0.2.0.) Transformer Engine's products are its own extension's, on no
list either.

Simplifications: a biased linear (``aten.addmm``) is counted as ``aten.mm`` is; mixture-of-experts
layers keep the attention policy's count (their router, grouped expert products and token
exchange follow other rules, not modelled here).
"""

from __future__ import annotations

from ..specs import ModelSpec
from ..units import BF16_BYTES, FP32_BYTES
from .context import kv_width_per_rank, query_width_per_rank


def call_order(model: ModelSpec, t: int = 1) -> list[tuple[str, int]]:
    """The layer's matrix products in torchtitan's call order on one tensor-parallel rank, each as
    (the model's fused product it belongs to: ``qkv``, ``proj``, ``mlp up``, ``mlp down``; its
    output width per token on this rank, a row-parallel product's being the whole hidden)."""
    q, kv, f = query_width_per_rank(model, t), kv_width_per_rank(model, t), model.ffn_hidden // t
    order = [("qkv", q), ("qkv", kv), ("qkv", kv), ("proj", model.hidden), ("mlp up", f)]
    if model.gated_mlp:
        order.append(("mlp up", f))
    return order + [("mlp down", model.hidden)]


def kept(model: ModelSpec, t: int = 1, scaled_mm: bool = False) -> list[bool]:
    """Whether each product of :func:`call_order` is kept: the odd ones, counting from 1; none
    where the products run in FP8 (``scaled_mm``, module doc)."""
    return [i % 2 == 0 and not scaled_mm for i in range(len(call_order(model, t)))]


def recomputed_share(model: ModelSpec, t: int = 1, scaled_mm: bool = False) -> dict[str, float]:
    """Per fused product of the model, the share of its forward run again in the backward: the
    recomputed parts' output width over the product's (a part's work is its width's share); all
    of it where the products run in FP8 (``scaled_mm``, module doc)."""
    total: dict[str, float] = {}
    again: dict[str, float] = {}
    for (name, width), keep in zip(call_order(model, t), kept(model, t, scaled_mm)):
        total[name] = total.get(name, 0.0) + width
        again[name] = again.get(name, 0.0) + (0.0 if keep else width)
    return {name: again[name] / total[name] for name in total}


def recomputed_matmul_params(model: ModelSpec, scaled_mm: bool = False) -> float:
    """Weights of a dense layer's products that run again in the backward, the full layer's (t = 1):
    each part of :func:`call_order` not kept, its output width times its input's (h for the QKV and
    MLP-up parts, the attention width for the output projection, the MLP width for the down
    product). The recomputed forward's FLOPs are two a weight a token (:func:`.flops.recompute_flops`)."""
    inputs = {"qkv": model.hidden, "proj": query_width_per_rank(model, 1), "mlp up": model.hidden,
              "mlp down": model.ffn_hidden}
    return float(sum(width * inputs[name]
                     for (name, width), keep in zip(call_order(model, 1), kept(model, 1, scaled_mm)) if not keep))


def kept_bytes(model: ModelSpec, t: int = 1, sequence_parallel: bool = False, scaled_mm: bool = False) -> float:
    """Bytes a dense layer keeps per token on one tensor-parallel rank under the policy (module
    doc): the block's input, the kept products' outputs (none where they run in FP8,
    ``scaled_mm``), SDPA's output and log-sum-exp, and with sequence parallelism (t > 1) the two
    reduce-scatters' outputs."""
    h = model.hidden
    sp = t if sequence_parallel else 1
    products = sum(width for (_, width), keep in zip(call_order(model, t), kept(model, t, scaled_mm)) if keep)
    attention = BF16_BYTES * query_width_per_rank(model, t) + FP32_BYTES * model.heads / t
    scattered = 2 * BF16_BYTES * h / t if sequence_parallel and t > 1 else 0.0
    return BF16_BYTES * h / sp + BF16_BYTES * products + attention + scattered
