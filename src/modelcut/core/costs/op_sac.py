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
counted and kept. So an FP8 layer keeps none of its products' outputs and runs every product again
in the backward; its scales (the saved ``aten.max``) are a few bytes. Under torch.compile the policy's
``PREFER_RECOMPUTE`` is a must (torch 2.13 torch/_functorch/partitioners.py ``must_recompute``), so
the compiled stack recomputes them as the eager one does. (torchtitan's main branch since March 2026,
pytorch/torchtitan#2357, saves every product on PyTorch's compute-intensive op list, ``_scaled_mm``
included; the presets follow v0.2.0.) Transformer Engine's products are its own extension's, on no
list either.

**Mixture-of-experts layers** (torchtitan v0.2.0 ``torchtitan/models/moe/moe.py`` ``MoE.forward``):
after the attention's products the block calls the router's gate (an ``nn.Linear``, ``aten.mm``),
the routed experts as ``torch._grouped_mm`` (``GroupedExperts``, off the list: every routed
product runs again, whatever the count) and then the shared experts, one gated MLP of
shared_experts · f_e (w1, w3, w2, ``aten.mm``). The count runs over the router and the shared
experts too, so a Llama-style MoE block keeps q, v, the router's scores and the shared w3. With
expert parallelism the token exchange is ``_c10d_functional.all_to_all_single``, which the
DeepSeek-V3 and Llama 4 lists save (models/deepseek_v3/infra/parallelize.py,
models/llama4/infra/parallelize.py): its dispatched and combined rows are kept and the exchange is
not repeated (the step time's :func:`..step.stage_costs.moe_a2a`).

A multi-head latent attention block (torchtitan models/deepseek_v3/model.py ``Attention.forward``)
calls wq_a, wq_b, wkv_a, wkv_b and wo (:func:`.context.attention_products`, in that order), so it
keeps the two latents (wq_a's and wkv_a's outputs) and wo's, runs the up projections again, and the
count goes on from there; its SDPA output is H/t·d_v wide (:func:`.context.cp_widths`).

Simplifications: a biased linear (``aten.addmm``) is counted as ``aten.mm`` is; the router runs in
16 bits as the step time runs it (``step.layers``).
"""

from __future__ import annotations

from ..specs import ModelSpec
from ..units import BF16_BYTES, FP32_BYTES
from . import flops
from .fp8 import linear_in_fp8
from .context import attention_products, cp_widths, kv_width_per_rank, query_width_per_rank
from .moe import routed_rows

#: The routed experts' products: ``torch._grouped_mm``, never kept (module doc).
ROUTED = ("expert up", "expert down")


def call_order(model: ModelSpec, t: int = 1, moe: bool = False) -> list[tuple[str, float]]:
    """The layer's ``aten.mm`` products in torchtitan's call order on one tensor-parallel rank, each as
    (the model's fused product it belongs to: ``qkv``, ``proj``, ``mlp up``, ``mlp down``, latent
    attention's own five; in a mixture-of-experts layer (``moe``) ``router``, ``shared expert up``,
    ``shared expert down`` in place of the MLP's; its output width per token on this rank, a
    row-parallel product's being the whole hidden). The routed experts' grouped products are not
    among them (:data:`ROUTED`)."""
    if model.is_mla:
        order: list[tuple[str, float]] = [(name, float(n)) for name, _, n, _ in attention_products(model, 1, t)]
    else:
        q, kv = query_width_per_rank(model, t), kv_width_per_rank(model, t)
        order = [("qkv", q), ("qkv", kv), ("qkv", kv), ("proj", model.hidden)]
    if moe:
        if flops.router_params(model):
            order.append(("router", model.experts / t))    # the gate on the rank's T/t tokens
        if not model.shared_experts:
            return order
        name, f = "shared expert", flops.expert_width(model) * model.shared_experts / t
    else:
        name, f = "mlp", model.ffn_hidden / t
    order += [(f"{name} up", f)] * flops.mlp_inputs(model)
    return order + [(f"{name} down", model.hidden)]


def kept(model: ModelSpec, t: int = 1, scaled_mm: bool = False, moe: bool = False) -> list[bool]:
    """Whether each product of :func:`call_order` is kept: the odd ``aten.mm`` ones, counting from 1;
    where the products run in FP8 (``scaled_mm``, module doc) none but the 16-bit router counts."""
    out, n = [], 0
    for name, _ in call_order(model, t, moe):
        counted = not (scaled_mm and linear_in_fp8(name))
        n += counted
        out.append(counted and n % 2 == 1)
    return out


def recomputed_share(model: ModelSpec, t: int = 1, scaled_mm: bool = False, moe: bool = False) -> dict[str, float]:
    """Per fused product of the model, the share of its forward run again in the backward: the
    recomputed parts' output width over the product's (a part's work is its width's share); all
    of it where the products run in FP8 (``scaled_mm``, module doc), and all of the routed experts'."""
    total: dict[str, float] = {}
    again: dict[str, float] = {}
    for (name, width), keep in zip(call_order(model, t, moe), kept(model, t, scaled_mm, moe)):
        total[name] = total.get(name, 0.0) + width
        again[name] = again.get(name, 0.0) + (0.0 if keep else width)
    share = {name: again[name] / total[name] for name in total}
    return share | ({name: 1.0 for name in ROUTED} if moe else {})


def recompute_flops(model: ModelSpec, batch: int, seq: int, scaled_mm: bool = False) -> float:
    """Extra forward work per step of the products the policy runs again: two FLOPs a weight a
    token of each part of :func:`call_order` not kept (its output width times its input's: h for
    the QKV, MLP-up and router parts, the attention width for the output projection, the MLP width
    for the down product), and of a mixture-of-experts layer's top_k routed experts."""
    def weights(moe: bool) -> float:
        fs = flops.expert_width(model) * model.shared_experts
        inputs = {name: k for name, _, _, k in attention_products(model, 1)} | {
            "mlp up": model.hidden, "mlp down": model.ffn_hidden, "router": model.hidden,
            "shared expert up": model.hidden, "shared expert down": fs}
        again = sum(width * inputs[name] for (name, width), keep
                    in zip(call_order(model, 1, moe), kept(model, 1, scaled_mm, moe)) if not keep)
        routed = model.top_k * flops.mlp_weights(model, flops.expert_width(model))
        return again + (routed if moe else 0.0)
    n_moe = flops.moe_layer_count(model)
    per_token = (model.layers - n_moe) * weights(False) + (n_moe * weights(True) if n_moe else 0.0)
    return float(batch) * seq * 2.0 * per_token


def kept_bytes(model: ModelSpec, t: int = 1, sequence_parallel: bool = False, scaled_mm: bool = False,
               moe: bool = False, ep: int = 1) -> float:
    """Bytes a layer keeps per token on one tensor-parallel rank under the policy (module doc): the
    block's input, the kept products' outputs (none of the FP8 ones, ``scaled_mm``), SDPA's output
    and log-sum-exp, with sequence parallelism (t > 1) the two reduce-scatters' outputs, and in a
    mixture-of-experts layer (``moe``) with expert parallelism (``ep`` > 1) the all-to-alls'
    dispatched and combined rows, 2h each, :func:`.moe.routed_rows` of them a token of the rank's
    T/t (top_k, times the capacity factor where the model has one)."""
    h = model.hidden
    sp = t if sequence_parallel else 1
    products = sum(width for (_, width), keep in zip(call_order(model, t, moe), kept(model, t, scaled_mm, moe)) if keep)
    attention = BF16_BYTES * cp_widths(model, t)[3] + FP32_BYTES * model.heads / t
    scattered = 2 * BF16_BYTES * h / t if sequence_parallel and t > 1 else 0.0
    # the dispatched and the combined rows, 2h bytes each, as many as the rank's experts receive
    exchanged = 2 * BF16_BYTES * h * routed_rows(model, 1.0 / t) if moe and ep > 1 else 0.0
    return BF16_BYTES * h / sp + BF16_BYTES * products + attention + scattered + exchanged
