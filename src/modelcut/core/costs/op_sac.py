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

Simplifications: a biased linear (``aten.addmm``) is counted as ``aten.mm`` is; FP8 products
(torchao's ``_scaled_mm``) are counted as 16-bit ones (torchtitan v0.2.0's list names no
``_scaled_mm``, later ones save it through PyTorch's compute-intensive op list); mixture-of-experts
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


def kept(model: ModelSpec, t: int = 1) -> list[bool]:
    """Whether each product of :func:`call_order` is kept: the odd ones, counting from 1."""
    return [i % 2 == 0 for i in range(len(call_order(model, t)))]


def recomputed_share(model: ModelSpec, t: int = 1) -> dict[str, float]:
    """Per fused product of the model, the share of its forward run again in the backward: the
    recomputed parts' output width over the product's (a part's work is its width's share)."""
    total: dict[str, float] = {}
    again: dict[str, float] = {}
    for (name, width), keep in zip(call_order(model, t), kept(model, t)):
        total[name] = total.get(name, 0.0) + width
        again[name] = again.get(name, 0.0) + (0.0 if keep else width)
    return {name: again[name] / total[name] for name in total}


def kept_bytes(model: ModelSpec, t: int = 1, sequence_parallel: bool = False) -> float:
    """Bytes a dense layer keeps per token on one tensor-parallel rank under the policy (module
    doc): the block's input, the kept products' outputs, SDPA's output and log-sum-exp, and with
    sequence parallelism (t > 1) the two reduce-scatters' outputs."""
    h = model.hidden
    sp = t if sequence_parallel else 1
    products = sum(width for (_, width), keep in zip(call_order(model, t), kept(model, t)) if keep)
    attention = BF16_BYTES * query_width_per_rank(model, t) + FP32_BYTES * model.heads / t
    scattered = 2 * BF16_BYTES * h / t if sequence_parallel and t > 1 else 0.0
    return BF16_BYTES * h / sp + BF16_BYTES * products + attention + scattered
