"""Time of one transformer layer, the embedding and the loss, for one micro-batch on one device.

Built kernel by kernel from :mod:`.kernels`; every matrix product is timed from its own
(m, n, k) after the tensor-parallel (t) and context-parallel (cp) cuts, every memory-bound
kernel from the bytes it moves (:mod:`.elementwise` holds those counts, by stack). Tokens on the device: T = b·s/cp; with sequence parallelism
the norms, dropouts and residual adds see T/t of them (Korthikanti et al. 2022, §4.2.2).

**Forward of a layer** (Megatron-LM's ``ParallelTransformerLayer``; Llama-style layers drop
biases and dropout and use RMSNorm, RoPE and a gated MLP):

* norm 1: read and write T_n·h (T_n = T/t with sequence parallelism, else T), 4·T_n·h bytes;
* QKV product: m = T, n = (q + 2·kv)/t, k = h; with RoPE, Q and K are read and written once
  more, 4·T·(q + kv)/t bytes (latent attention's five products instead,
  :func:`..costs.context.attention_products`, with its latents' norms and RoPE on the rotary
  parts only);
* attention core over the local heads (:func:`.kernels.attention_time`);
* output projection: m = T, n = h, k = q/t;
* bias + dropout + residual add, fused (Megatron-LM's ``bias_dropout_add_fused_train``):
  read the branch and the residual, write the sum (+ a 1-byte dropout mask), 6·T_n·h (+ T_n·h);
* norm 2, then MLP up: m = T, n = f/t (2·f/t gated), k = h; the activation fused with its
  bias (``bias_gelu``; SwiGLU reads two halves, writes one): 4·T·f/t bytes (6·T·f/t gated),
  and where the run keeps the SwiGLU's input in FP8 its cast there and back
  (:data:`.elementwise.ACT_FP8_STORE_BYTES`); MLP down: m = T, n = h, k = f/t; bias + dropout + residual add again.

**Backward**: each product's data gradient and weight gradient (:func:`.kernels.gemm_fwd_bwd`),
the attention core's backward, and the memory-bound backward kernels: norm 6·T_n·h each
(read input and gradient, write gradient), dropout 5·T_n·h each, the residual gradient sums
6·T_n·h each, the activation 6·T·f/t (10·T·f/t gated), bias gradients a read of each
biased output's gradient. With ``grad_accum_fusion`` off (Megatron-LM before its fused
weight-gradient accumulation), each weight gradient is then added into the main gradient, a
read of the new gradient and a read and write of the accumulator (``grad_accum_bytes``): 6
bytes per local parameter per micro-batch into a 16-bit buffer (``megatron/model/distributed.py``,
``param.main_grad.add_``), 10 into an FP32 one in one kernel, 18 through DeepSpeed's BF16_Optimizer's
explicit cast to a temporary FP32 copy (``update_hp_grads``: :data:`..units.GRAD_ACCUM_BYTES_32_CAST`);
under PyTorch FSDP sharding the gradients, what its accumulation moves on the compute stream, the
routed experts' apart where they are held in another type
(:meth:`.frameworks.Framework.grad_accum_rule`, :func:`..costs.residency.accumulate_bytes`).

**Recomputation** re-executes (Korthikanti et al. 2022 §5): ``selective``, the attention
core's forward (QKᵀ, softmax, dropout, A·V), or the modules the run names
(``Training.recompute_modules``, Megatron-core's ``--recompute-modules``): ``core_attn`` that
same attention core, ``layernorm`` the norms that run as their own kernels (with Transformer
Engine's layer spec a mixture-of-experts layer's pre-MLP norm, its input norm being fused into the
QKV product; a dense layer has none; with multi-head latent attention the input norm as well),
``moe_act`` the routed experts' activation function, each its forward's bytes again,
``mla_up_proj`` a latent attention layer's up-projections (:func:`mla_up_products`, timed from the
tables as the other products) with the latents' norms and RoPE; ``full``, the layer's whole forward, its tensor-parallel communication
included. Under torchtitan's per-op policy (``LayerSetup.selective = "op"``, :mod:`..costs.op_sac`)
selective recomputation runs again every memory-bound kernel, the sequence-parallel all-gathers and,
of a dense layer's products, k, wo and w3 (gated; the ungated MLP's down product in place of w3),
or every one where they run in FP8 (off the policy's list); of a mixture-of-experts layer's, the
routed experts' and every second of the others in call order (router and shared experts counted):
each fused product's :func:`..costs.op_sac.recomputed_share` of its forward.

**Tensor-parallel communication** per layer (Shoeybi et al. 2019, Fig. 3): two all-reduces
of T·h·2 bytes in the forward (after attention and after the MLP), two in the backward; with
sequence parallelism each becomes an all-gather plus a reduce-scatter moving the same bytes,
and the backward gathers the inputs of QKV and MLP-up once more for their weight gradients
(only their sharded copies are kept; Korthikanti et al. 2022 §4.2.2). In FP8 the all-gathers
move FP8, 1 byte an element: Transformer Engine quantizes a norm's output before gathering it
and gathers the saved FP8 copy again in the backward (TransformerEngine v2.8
pytorch/module/layernorm_linear.py, ``gather_along_first_dim(..., quantizer=...)``), and
quantizes a row-parallel product's output gradient before its gather (module/base.py
``grad_output_preprocess``); the reduce-scatters of products' 16-bit outputs stay 16-bit. Where the framework
runs them asynchronously, a column-parallel product's backward collectives hide behind its
own gradient products and only the excess is paid. With the ``tp_comm`` overlap the products
the collectives hide behind run in chunks (:func:`_overlapped`: ring exchange, or a pipelined
reduce-scatter on fewer SMs), each timed at its own shape.
**Context parallelism** (``LayerSetup.cp_kind``), all-gather form (Grattafiori et al. 2024
§3.3.2): K and V of the whole sequence gathered in the forward, their gradients
gathered again and reduce-scattered in the backward, (cp − 1)/cp · s·2·(kv/t)·2 bytes each, per layer; ring form
(Liu et al. 2023): what the ring leaves exposed, :func:`.context.cp_attention` with the
attention kernel's own rate (its FLOPs over the time :func:`.kernels.attention_time` gives);
all-to-all form (Jacobs et al. 2023): the attention kernel over the whole sequence on
heads/(t·cp) heads, and the all-to-alls of Q, K, V and of the output in the forward, of dO and of
dQ, dK, dV in the backward, one a tensor, exposed (:func:`.context.a2a_tensors`), timed as the
layer's other collectives, and the reorders around them as memory-bound bytes
(:func:`.context.a2a_copy_bytes`).
Ring costs from :mod:`.comm` at η_net of the link each group uses. The ring's merges of its
steps' results are memory-bound bytes (:func:`.context.ring_merge_bytes`). A stack that runs
PyTorch's SDPA context parallelism (``LayerSetup.cp_impl`` "torch-sdpa") instead attends step by
step with either rotation and merges in FP32: its merges and copies are
:func:`.context.torch_merge_bytes` (fused where the stack compiles, ``LayerSetup.compiled``), its
exposed rotation :func:`.context.torch_exposed` (:mod:`.layer_comm`, which times this section's
collectives: :func:`.layer_comm.tp_comm`, :func:`.layer_comm.cp_comm`).

**Mixture-of-experts layers**: the MLP's products are :func:`.moe.moe_gemms` on the busiest
device (the router, the E/ep local experts as products of their received rows at width
f_e/etp, the shared experts at width f_e/t); the MoE block's tensor-parallel collectives are its
token dispatcher's, counted with the all-to-alls by the caller (:func:`.moe.moe_comm`), so
only attention's remain here. The dispatcher's permutations (gathering each token's rows for
its experts and summing them back) are memory-bound work of the layer,
:func:`.moe.permute_bytes` for the stack's dispatcher (``LayerSetup.moe_dispatch``).

**Megatron-core's eager paths** (``LayerSetup.mcore_layers``, the stack's ``mcore_layers``): with a
YaRN attention factor other than 1 (``ModelSpec.rope_mscale``) its RoPE is eager PyTorch, not TE's
fused kernel; a clamped GLU in the routed experts (``ModelSpec.glu_clamp``) is clamped and
concatenated eagerly; the routed experts' output biases are added expert by expert
(:data:`.elementwise.MCORE_EAGER_ROPE_FWD`, :data:`.elementwise.MCORE_GLU_CLAMP_FWD`, :data:`.elementwise.MCORE_EXPERT_BIAS_FWD` and their
backward counts).
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace

from ..costs import comm, context, flops, op_sac
from ..costs import moe as moe_mod
from ..costs import fp8 as fp8_mod
from ..costs.kernels import BYTES, AttentionTime, Efficiency, attention_time, gemm_fwd_bwd, gemm_time, mem_time
from ..specs import MLA_FIELDS, Hardware, ModelSpec
from .elementwise import CE_BYTES, memory_bytes, norm_bytes
from .layer_comm import cp_comm, tp_comm
from .layer_setup import LayerSetup

@dataclass
class PassTime:
    """Seconds of one pass, split by what bounds it."""

    gemm: float = 0.0        # matrix products (tensor cores or their operands' traffic)
    attention: float = 0.0   # the attention core's products / fused kernel
    memory: float = 0.0      # memory-bound kernels
    tp: float = 0.0          # tensor-parallel collectives
    cp: float = 0.0          # context-parallel collectives

    @property
    def compute(self) -> float:
        return self.gemm + self.attention + self.memory

    @property
    def comm(self) -> float:
        return self.tp + self.cp

    @property
    def total(self) -> float:
        return self.compute + self.comm

    def __add__(self, other: "PassTime") -> "PassTime":
        return PassTime(self.gemm + other.gemm, self.attention + other.attention, self.memory + other.memory,
                        self.tp + other.tp, self.cp + other.cp)

    def scaled(self, k: float) -> "PassTime":
        return PassTime(self.gemm * k, self.attention * k, self.memory * k, self.tp * k, self.cp * k)


@dataclass(frozen=True)
class ProductTime:
    """One linear product of a layer on one device, ``count`` alike: Y[m×n] = X[m×k]·W[k×n] in
    ``dtype``, and the seconds of its forward, data gradient and weight gradient (all ``count`` of
    them; the forward and data gradient as the tensor-parallel overlap chunks them, where it does)."""

    name: str
    m: float
    n: int
    k: int
    count: int
    dtype: str
    fwd: float
    dgrad: float
    wgrad: float

    @property
    def flops(self) -> float:
        """FLOPs of one pass of the ``count`` products: 2·m·n·k each (the data and weight gradients
        do as many)."""
        return 2.0 * self.m * self.n * self.k * self.count


@dataclass
class LayerTime:
    """One layer, one micro-batch, one device: forward, backward (data + weight gradients),
    the recomputed forward, and the weight-gradient share of the backward (for schedules
    that split it). ``products`` and ``memory_bytes`` itemise the passes' ``gemm`` and their
    memory-bound bytes outside the attention core, (name, forward bytes, backward bytes); the
    ``attention`` core is the one the passes' ``attention`` and its memory part come from."""

    fwd: PassTime
    bwd: PassTime
    recompute: PassTime
    wgrad: float = 0.0
    notes: list[str] = field(default_factory=list)
    shared: tuple[float, float] = (0.0, 0.0)   # the shared experts' products in fwd and bwd (in gemm above)
    products: tuple[ProductTime, ...] = ()
    memory_bytes: tuple[tuple[str, float, float], ...] = ()
    attention: AttentionTime | None = None


def dense_linears(model: ModelSpec, tokens: float, t: int) -> list[tuple[float, int, int, int]]:
    """A dense layer's products on one rank, (m, n, k, count): the attention block's
    (:func:`..costs.context.attention_products`: QKV and the output projection, or latent
    attention's five), MLP up (gate and up fused when gated), MLP down; a weight is n·k of them."""
    return [(m, n, k, 1) for _, m, n, k in context.attention_products(model, tokens, t)] + [
        (g.m, g.n, g.k, g.count) for g in moe_mod.dense_mlp_gemms(model, tokens, t)]


#: The attention block's products fed by a column-parallel input (gathered under sequence
#: parallelism, their input gradients reduced): QKV, or latent attention's up projections and,
#: without a query latent, its query projection (:func:`..costs.context.attention_products`).
COLUMN_PARALLEL_ATTENTION = ("qkv", "q", "q up", "kv up")
#: Products whose input a Transformer Engine LayerNormLinear normalises and, with FP8, quantizes
#: in the same kernel: QKV and a dense MLP's up product (the layer's two norms), latent attention's
#: up projections (their latents' norms: Megatron-core core_v0.15.0 gpt_layer_specs.py,
#: ``column_parallel_layer_norm_linear`` for ``linear_q_up_proj`` and ``linear_kv_up_proj`` with
#: ``qk_layernorm``, DeepSeek's configurations' setting).
NORM_FED = ("qkv", "mlp up", "q up", "kv up")


#: Latent attention's up projections, the products ``mla_up_proj`` runs again.
MLA_UP = ("q up", "kv up")


#: Most chunk products Transformer Engine's ring-exchange overlap keeps in flight (its compute
#: streams, ``_NUM_MAX_UB_STREAMS = 3``, transformer_engine/pytorch/module/base.py).
UB_STREAMS = 3


#: Transformer Engine's default for a pipelined (reduce-scatter) overlap: the output cut into 4
#: row chunks, the collective on 16 SMs the product gives up (``num_splits = 4``, ``num_sm = 16``,
#: ``set_sm_margin = True``; transformer_engine/pytorch/module/base.py ``initialize_ub``).
UB_PIPELINE_SPLITS = 4
UB_PIPELINE_SMS = 16
#: The products whose forward (column-parallel, and row-parallel) or data gradient (row-parallel)
#: a tensor-parallel collective overlaps chunk by chunk.
_OVERLAPPED = ("qkv", "proj", "mlp up", "mlp down")


def ring_exchange_time(m: float, n: int, k: int, t: int, hw: Hardware, eff: Efficiency, dtype: str) -> float:
    """A product overlapped with its tensor-parallel collective by ring exchange: t chunk
    products of m/t rows each, up to :data:`UB_STREAMS` in flight at once (run as one batch)."""
    rows = max(1, int(m) // t)
    total, left = 0.0, t
    while left > 0:
        c = min(UB_STREAMS, left)
        total += gemm_time(rows, n, k, hw, eff, batch=c, dtype=dtype)
        left -= c
    return total


def pipeline_overlap_time(m: float, n: int, k: int, hw: Hardware, eff: Efficiency, dtype: str) -> float:
    """A row-parallel product whose reduce-scatter is pipelined behind it: :data:`UB_PIPELINE_SPLITS`
    row chunks one after another, on the SMs the collective leaves (throughput in proportion)."""
    rows = max(1, int(m) // UB_PIPELINE_SPLITS)
    share = max(hw.sms - UB_PIPELINE_SMS, 1) / hw.sms if hw.sms else 1.0
    return UB_PIPELINE_SPLITS * gemm_time(rows, n, k, hw, eff, dtype=dtype) / share


def _overlapped(name: str, m: float, n: int, k: int, t: int, hw: Hardware, eff: Efficiency, dtype: str,
                dgrad: float, fp8_ring: bool = True) -> tuple[float, float]:
    """(forward, data gradient) of a product under Transformer Engine's userbuffers overlap, as
    NeMo's tuned H100 configurations run it (Megatron-Bridge training/comm_overlap.py and NeMo
    nemo/collections/llm/recipes/tp_overlap_configs/userbuffers.py ``userbuffers_*_h100_*``;
    NeMo-Framework-Launcher 24.07 launcher_scripts/conf/training/tp_overlap/ub_cfg_h100_*):
    column-parallel forwards (QKV, MLP up) and row-parallel data gradients (projection, MLP
    down) by ring exchange (:func:`ring_exchange_time`); row-parallel forwards pipelined
    (:func:`pipeline_overlap_time`) with 16-bit operands, and with FP8 by ring exchange where
    ``fp8_ring`` (NeMo's FP8 configurations from 2025-04-22, commit 566b438, and
    Megatron-Bridge's) or pipelined like the 16-bit ones (NeMo's FP8 configurations before it:
    ``PipelineOverlapCfg(num_sm=24, ..., fp8_buf=True)``). The bulk overlaps of the
    column-parallel backward take 2 to 24 SMs beside a product that keeps all of them
    (``set_sm_margin = False``): not charged, so a column-parallel data gradient (``dgrad``,
    timed whole) is returned as it is."""
    if name in ("qkv", "mlp up"):
        return ring_exchange_time(m, n, k, t, hw, eff, dtype), dgrad
    fwd = (ring_exchange_time(m, n, k, t, hw, eff, dtype) if dtype == "fp8" and fp8_ring
           else pipeline_overlap_time(m, n, k, hw, eff, dtype))
    return fwd, ring_exchange_time(m, k, n, t, hw, eff, dtype)


def _products(model: ModelSpec, setup: LayerSetup, hw: Hardware, eff: Efficiency, moe: bool, ep: int):
    """The layer's linear products on this device: (forward, backward, weight-gradient seconds,
    (data gradient, weight gradient) of each column-parallel product, the MLP's products, the
    local weights, the FP8 casts' (forward, backward) bytes, the shared experts' (forward,
    backward) seconds, the forward seconds torchtitan's per-op recomputation runs again). With FP8
    every linear but the router runs in FP8 (:mod:`..costs.fp8`)."""
    T, t = setup.micro_batch * setup.seq_len // setup.cp, setup.tp
    mlp = moe_mod.moe_gemms(model, T, tp=t, ep=ep, etp=setup.etp) if moe else moe_mod.dense_mlp_gemms(model, T, t)
    # (m, n, k, count, name): QKV and a dense MLP's up product take a norm's output
    linears = ([(m_, n_, k_, 1, nm) for nm, m_, n_, k_ in
                context.attention_products(model, T, t, setup.sequence_parallel)]
               + [(g.m, g.n, g.k, g.count, g.name) for g in mlp])
    fwd_g = bwd_g = wgrad = 0.0
    shared_f = shared_b = 0.0
    f8 = setup.fp8
    again = op_sac.recomputed_share(model, t, scaled_mm=f8 is not None, moe=moe) if setup.selective == "op" else {}
    per_linear = []
    records: list[ProductTime] = []
    inputs = fused_inputs = grads = weights = op_again = 0.0
    for m_, n_, k_, c_, name in linears:
        in_fp8 = (f8 is not None and fp8_mod.linear_in_fp8(name)
                  and (f8.routed_experts_fp8 or not name.startswith("expert ")))
        dt = "fp8" if in_fp8 else "bf16"
        f_, dg, wg = gemm_fwd_bwd(m_, n_, k_, hw, eff, dt)
        if in_fp8 and f8.weight_grad_16bit:      # the weight gradient's product on the 16-bit operands
            wg = gemm_fwd_bwd(m_, n_, k_, hw, eff)[2]
        if setup.tp_overlap_split and t > 1 and name in _OVERLAPPED:
            f_, dg = _overlapped(name, m_, n_, k_, t, hw, eff, dt, dg, setup.tp_overlap_fp8_ring)
        per_linear.append((c_ * dg, c_ * wg))
        records.append(ProductTime(name, m_, n_, k_, c_, dt, c_ * f_, c_ * dg, c_ * wg))
        fwd_g += c_ * f_
        op_again += c_ * f_ * (again[name] if again else 0.0)
        bwd_g += c_ * (dg + wg)
        wgrad += c_ * wg
        if name.startswith("shared expert"):
            shared_f += c_ * f_
            shared_b += c_ * (dg + wg)
        if in_fp8:
            if name in NORM_FED:
                fused_inputs += c_ * m_ * k_
            else:
                inputs += c_ * m_ * k_
            grads += c_ * m_ * n_
            weights += c_ * n_ * k_
    casts = (0.0, 0.0) if f8 is None else fp8_mod.cast_bytes(
        f8, inputs=inputs, fused_inputs=fused_inputs, grads=grads,
        weights=weights * (setup.weight_cast_share if f8.caches_weights else 1.0))
    # Column-parallel products: the attention block's (one block, its products' sums) and a dense
    # layer's MLP up. An MoE block's collectives are its dispatcher's (module doc): attention's only.
    att_col = [pl for pl, (*_, nm) in zip(per_linear, linears) if nm in COLUMN_PARALLEL_ATTENTION]
    col = [(sum(d for d, _ in att_col), sum(w for _, w in att_col))] + [
        pl for pl, (*_, nm) in zip(per_linear, linears) if nm == "mlp up" and not moe]
    local_params = sum(n_ * k_ * c_ for _, n_, k_, c_, _ in linears)
    return fwd_g, bwd_g, wgrad, col, mlp, local_params, casts, (shared_f, shared_b), op_again, tuple(records)


def mla_up_products(model: ModelSpec, setup: LayerSetup) -> tuple[tuple[int, int, int, str], ...]:
    """The up-projections ``mla_up_proj`` runs again, (m, n, k, name) on this rank: queries from
    their latent, m = T, n = H/t·(d_nope + d_rope), k = r_q (none without a query latent: the
    queries are then projected from the layer's input, not recomputed); keys and values from theirs,
    n = H/t·(d_nope + d_v), k = r_kv (column-parallel products of the latent attention layer,
    megatron/core/transformer/multi_latent_attention.py ``linear_q_up_proj``, ``linear_kv_up_proj``).
    They are the layer's own ``q up`` and ``kv up`` (:func:`..costs.context.attention_products`)."""
    T = setup.micro_batch * setup.seq_len // setup.cp
    return tuple((m, n, k, name) for name, m, n, k in
                 context.attention_products(model, T, setup.tp, setup.sequence_parallel) if name in MLA_UP)


def _mla_up_seconds(model: ModelSpec, setup: LayerSetup, hw: Hardware, eff: Efficiency) -> float:
    """Forward seconds of :func:`mla_up_products`, in FP8 where the run's linears are: what
    ``mla_up_proj`` runs again where it is recomputed (:func:`_recomputed` says where)."""
    dt = "bf16" if setup.fp8 is None else "fp8"
    return sum(gemm_fwd_bwd(m_, n_, k_, hw, eff, dt)[0] for m_, n_, k_, _ in mla_up_products(model, setup))


def _fields(a: AttentionTime) -> tuple[float, ...]:
    return (a.fwd, a.bwd, a.fwd_math, a.bwd_math, a.flops_fwd)


def _chunked_attention(model: ModelSpec, setup: LayerSetup, hw: Hardware, eff: Efficiency) -> AttentionTime:
    """A chunked layer's attention core: the sequence's s = q·c + r tokens in q causal attentions
    of c = ``attention_chunk`` tokens (run as one kernel of q times the batch) and one of r; with
    context parallelism each rank does 1/cp of that work (its queries' blocks), the all-gather or
    ring that brings it the keys timed as a whole-sequence layer's."""
    s, c = setup.seq_len, model.attention_chunk
    q, r = divmod(s, c) if c < s else (1, 0)
    c = min(c, s)
    parts = [attention_time(setup.attention, setup.micro_batch * q, model.heads // setup.tp, c, c, model.d_head,
                            True, model.dropout, hw, eff, softmax_max_seq=setup.causal_softmax_max_seq)]
    if r:
        parts.append(attention_time(setup.attention, setup.micro_batch, model.heads // setup.tp, r, r, model.d_head,
                                    True, model.dropout, hw, eff, softmax_max_seq=setup.causal_softmax_max_seq))
    return AttentionTime(*[sum(v) / setup.cp for v in zip(*(_fields(a) for a in parts))])


def layer_attention(model: ModelSpec, setup: LayerSetup, hw: Hardware, eff: Efficiency) -> AttentionTime:
    """One layer's attention core for a micro-batch (:func:`_layer_attention`). Multi-head latent
    attention runs its cores on up-projected heads of d_nope + d_rope (QKᵀ) and d_v (A·V): its work,
    ``ModelSpec.core_width``, at the rate the tables give heads of d_v. NVIDIA's cuDNN 9.19.1 sweep on
    the H200 (the catalog's attention sweep cudnn-fe-2026-02, NVIDIA/cudnn-frontend
    benchmark/sdpa_benchmark_training dsv3 and llama3.1 results) runs DeepSeek-V3's 192/128 heads'
    forward at the TFLOP/s of 128/128 heads from 4,096 tokens (599 against 591 at 4K, 643 against
    644 at 8K; 522 against 484 at 2K); its backward there is the deterministic one, no comparison,
    and is taken at the same rate. The memory-bound parts (an unfused softmax's) are the heads'
    score matrices, unscaled."""
    if not model.is_mla:
        return _layer_attention(model, setup, hw, eff)
    stand = replace(model, head_dim=model.v_head_dim, **{f: None for f in MLA_FIELDS})
    a = _layer_attention(stand, setup, hw, eff)
    k = model.core_width / stand.q_dim
    return AttentionTime(a.fwd + (k - 1) * a.fwd_math, a.bwd + (k - 1) * a.bwd_math, k * a.fwd_math,
                         k * a.bwd_math, k * a.flops_fwd)


def _layer_attention(model: ModelSpec, setup: LayerSetup, hw: Hardware, eff: Efficiency) -> AttentionTime:
    """One layer's attention core for a micro-batch, the average layer's: with sliding-window
    layers (``ModelSpec.sliding_layers``) or chunked ones (``chunked_layers``, :func:`_chunked_attention`)
    the causal, windowed and chunked attention weighted by their share of the layers
    (:func:`..costs.flops.attention_layer_kinds`; the stage costs time an average layer, and a
    stage's own mix differs by at most one layer's)."""
    s, cp = setup.seq_len, setup.cp
    if setup.cp_kind == "a2a" and cp > 1:   # the whole sequence on heads/(t·cp) heads (..costs.context)
        args = (setup.attention, setup.micro_batch, model.heads // (setup.tp * cp), s, s, model.d_head, True,
                model.dropout, hw, eff)
    elif setup.cp_kind == "a2a+p2p" and cp > 1:   # the a2a group's s·a/cp queries on heads/(t·a) heads
        a = setup.cp_a2a
        args = (setup.attention, setup.micro_batch, model.heads // (setup.tp * a), s * a // cp, s, model.d_head,
                True, model.dropout, hw, eff)
    else:                                   # the rank's s/cp queries against the whole sequence's keys
        args = (setup.attention, setup.micro_batch, model.heads // setup.tp, s // cp, s, model.d_head, True,
                model.dropout, hw, eff)
    # a window under context parallelism: Transformer Engine's all-to-all and all-gather forms hand
    # the kernel the window (the ring refuses it: the stack rule cp_window_kinds); PyTorch's
    # SDPA steps take no window, so they are charged the whole causal attention
    windowed = cp == 1 or setup.cp_kind == "a2a" or (setup.cp_kind == "allgather"
                                                      and setup.cp_impl == "transformer-engine")
    kinds = flops.attention_layer_kinds(model)
    fused_softmax = setup.causal_softmax_max_seq
    if len(kinds) == 1 and kinds[0][1] is None and kinds[0][2] is None:
        return attention_time(*args, softmax_max_seq=fused_softmax)
    mix = [0.0] * 5
    for n, window, chunk in kinds:
        a = (_chunked_attention(model, setup, hw, eff) if chunk is not None
             else attention_time(*args, window=window if windowed else None, softmax_max_seq=fused_softmax))
        mix = [acc + n / model.layers * v for acc, v in zip(mix, _fields(a))]
    return AttentionTime(*mix)


def layer_time(model: ModelSpec, setup: LayerSetup, hw: Hardware, eff: Efficiency, moe: bool = False,
               ep: int = 1) -> LayerTime:
    """Forward, backward and recomputation of one transformer layer (module doc)."""
    fwd_g, bwd_g, wgrad, col, mlp, local_params, casts, shared, op_again, records = _products(
        model, setup, hw, eff, moe, ep)
    s, cp = setup.seq_len, setup.cp
    att = layer_attention(model, setup, hw, eff)
    expert_params = sum(r.n * r.k * r.count for r in records if r.name.startswith("expert "))
    mem_f, mem_b, modules, items = memory_bytes(model, setup, mlp, local_params, expert_params)
    mem_f, mem_b = mem_f + casts[0], mem_b + casts[1]
    items.append(("FP8 casts", *casts))
    if setup.cp_impl == "torch-sdpa" and cp > 1:   # PyTorch's merges and copies around its steps
        merge_f, merge_b = context.torch_merge_bytes(model, setup.micro_batch, s, cp, setup.tp, setup.compiled)
        mem_f, mem_b = mem_f + merge_f, mem_b + merge_b
        items.append(("context-parallel merges and copies", merge_f, merge_b))
    elif cp > 1:
        a = setup.cp_a2a if setup.cp_kind == "a2a+p2p" else 1      # the hierarchical form: both below
        if setup.cp_kind in ("ring", "a2a+p2p"):   # the ring's merges of its per-step results
            merge_f, merge_b = context.ring_merge_bytes(model, setup.micro_batch, s, cp // a, setup.tp * a)
            mem_f, mem_b = mem_f + merge_f, mem_b + merge_b
            items.append(("context-parallel ring merges", merge_f, merge_b))
        if setup.cp_kind in ("a2a", "a2a+p2p"):    # the reorders around the all-to-alls
            copy_f, copy_b = context.a2a_copy_bytes(model, setup.micro_batch, s, cp, setup.tp)
            mem_f, mem_b = mem_f + copy_f, mem_b + copy_b
            items.append(("context-parallel all-to-all reorders", copy_f, copy_b))
    if moe:
        perm_f, perm_b = moe_mod.permute_bytes(model, setup.micro_batch * s // cp, ep=ep, tp=setup.tp,
                                               etp=setup.etp, dispatch=setup.moe_dispatch)
        mem_f, mem_b = mem_f + perm_f, mem_b + perm_b
        items.append(("token permutations", perm_f, perm_b))
    tp_f, tp_b = tp_comm(model, setup, hw, eff, col)
    cp_f, cp_b = cp_comm(model, setup, hw, eff, att)
    fwd = PassTime(gemm=fwd_g, attention=att.fwd_math, memory=mem_time(mem_f, hw, eff) + att.fwd_mem,
                   tp=tp_f, cp=cp_f)
    bwd = PassTime(gemm=bwd_g, attention=att.bwd_math, memory=mem_time(mem_b, hw, eff) + att.bwd_mem,
                   tp=tp_b, cp=cp_b)
    return LayerTime(fwd, bwd, _recomputed(setup, fwd, att, {k: mem_time(v, hw, eff) for k, v in modules.items()},
                                           op_again, {"mla_up_proj": _mla_up_seconds(model, setup, hw, eff)}),
                     wgrad, shared=shared, products=records,
                     memory_bytes=tuple(it for it in items if it[1] or it[2]), attention=att)


def _recomputed(setup: LayerSetup, fwd: PassTime, att: AttentionTime, module_s: dict[str, float],
                op_gemm: float = 0.0, module_gemm: dict[str, float] | None = None) -> PassTime:
    """What recomputation re-executes in the backward (module doc): full, the whole forward;
    selective, the attention core (Megatron-LM) and the other modules the run names (``module_s``:
    their forward seconds), or torchtitan's per-op policy (``op_gemm``, the products' forward
    seconds it runs again, :mod:`..costs.op_sac`; every memory-bound kernel, the all-gathers: half the
    sequence-parallel collectives, all of an all-reduce); ``module_gemm``, the forward seconds of the
    products a module runs again, by module (``mla_up_proj``'s up-projections, :func:`mla_up_products`)."""
    if setup.recompute == "full":
        return PassTime(fwd.gemm, fwd.attention, fwd.memory, fwd.tp, fwd.cp)
    if setup.recompute != "selective":
        return PassTime()
    if setup.selective == "op":
        return PassTime(gemm=op_gemm, memory=fwd.memory - att.fwd_mem,
                        tp=fwd.tp / 2 if setup.sequence_parallel else fwd.tp)
    core = "core_attn" in setup.recompute_modules
    gemm = sum((module_gemm or {}).get(m, 0.0) for m in setup.recompute_modules)
    return PassTime(gemm=gemm, attention=att.fwd_math if core else 0.0,
                    memory=(att.fwd_mem if core else 0.0) + sum(module_s.get(m, 0.0) for m in setup.recompute_modules))


def embedding_time(model: ModelSpec, setup: LayerSetup, hw: Hardware, eff: Efficiency) -> tuple[PassTime, PassTime]:
    """The input embedding for a micro-batch: (forward, backward).

    Forward: the vocab-parallel lookup writes T·h (reads the rows it gathers), plus the learned
    position add and embedding dropout where the model has them; with t > 1 the partial
    lookups are all-reduced over the tp group (Megatron-LM ``VocabParallelEmbedding``; a
    reduce-scatter with sequence parallelism). Backward: the gradient table (V/t·h, zeroed and
    scattered into: 2 + 2 bytes per entry) and the scatter of T·h gradients (read 2, read and
    write the row 4)."""
    b, s, t, cp = setup.micro_batch, setup.seq_len, setup.tp, setup.cp
    h, V = model.hidden, model.vocab
    T = b * s // cp
    fwd_bytes = 4.0 * T * h
    if model.learned_positions:
        fwd_bytes += 6.0 * T * h
    if model.dropout:
        fwd_bytes += 5.0 * T * h
    bwd_bytes = 4.0 * (V // t) * h + 6.0 * T * h
    tp = comm.collective("reduce-scatter" if setup.sequence_parallel else "all-reduce", t, T * h * BYTES,
                         setup.tp_bw, hw, inside=setup.tp_inside, net=eff.net)
    fwd = PassTime(memory=mem_time(fwd_bytes, hw, eff), tp=tp)
    bwd = PassTime(memory=mem_time(bwd_bytes, hw, eff), tp=tp if setup.sequence_parallel else 0.0)
    return fwd, bwd


def loss_time(model: ModelSpec, setup: LayerSetup, hw: Hardware, eff: Efficiency) -> tuple[PassTime, PassTime]:
    """Final norm, output projection (logits) and cross-entropy for a micro-batch:
    (forward, backward). Logits: m = T, n = V/t, k = h; cross-entropy over T·V/t logits
    (:data:`.elementwise.CE_BYTES` per logit, forward and backward, for the stack's ``cross_entropy``). With
    sequence parallelism the final norm's output is
    all-gathered first (and its gradient reduce-scattered)."""
    b, s, t, cp = setup.micro_batch, setup.seq_len, setup.tp, setup.cp
    h, V = model.hidden, model.vocab
    T = b * s // cp
    Tn = T // t if setup.sequence_parallel else T
    f_, dg, wg = gemm_fwd_bwd(T, V // t, h, hw, eff)
    ce_f, ce_b = (x * T * (V // t) for x in CE_BYTES[setup.cross_entropy])
    tp = 0.0
    if setup.sequence_parallel:
        tp = comm.collective("all-gather", t, T * h * BYTES, setup.tp_bw, hw, inside=setup.tp_inside, net=eff.net)
    nb, nb_b = norm_bytes(model, setup)
    fwd = PassTime(gemm=f_, memory=mem_time(nb * Tn * h + ce_f, hw, eff), tp=tp)
    bwd = PassTime(gemm=dg + wg, memory=mem_time(nb_b * Tn * h + ce_b, hw, eff), tp=tp)
    return fwd, bwd

