"""Memory per device, per pipeline stage: weights, gradients, optimizer states, activations.

Everything is in bytes, for one device (one tensor-, context-, data-parallel rank) of each
pipeline rank. Pure: no I/O.

**Weights, gradients, optimizer states** (mixed-precision Adam as Megatron-LM keeps it:
BF16 weights, FP32 gradient accumulation buffer ``main_grad``, FP32 main parameters, FP32
Adam moments m and v; megatron/training/theoretical_memory_usage.py counts 18 bytes per
parameter, 6 + 12/d with the distributed optimizer). ZeRO stages (Rajbhandari et al. 2020,
"ZeRO", §5) shard over the data-parallel group times the context-parallel group, as
Megatron-LM shards its distributed optimizer over dp·cp:

====== ============== =============== ================
zero   weights        gradients       optimizer
====== ============== =============== ================
0      2              4               12
1      2              4               12/D
2      2              4/D             12/D
3      2/D + gathered 4/D             12/D
====== ============== =============== ================

ZeRO-3 (FSDP) also holds the weights it has gathered: with ``reshard_after_forward``
(FSDP's default) one layer being used and one prefetched, 2·2·P_layer; without it (Llama 3
§3.3.2: "does not reshard the weights after the forward pass") the whole stage's BF16
weights, 2·P_stage, for the duration of the step.

**Activations per layer** after Korthikanti et al. 2022 ("Reducing Activation Recomputation
in Large Transformer Models", §4 and Table 2), per token of the micro-batch on this rank
(n = b·s/cp tokens), in bytes, with h the hidden size, q = heads·head_dim, k = kv_heads·
head_dim (grouped-query attention), f the MLP width, a the heads, s the full sequence, t
the tensor-parallel size:

* kept whole on every tensor-parallel rank (divided by t only with sequence parallelism):
  the two norms' inputs 2h + 2h, the QKV and MLP inputs (the norms' outputs) 2h + 2h, and,
  with dropout, the attention and MLP dropout masks h + h — 10h as in Table 2 (8h without
  dropout);
* divided by t: Q, K, V 2(q + 2k), the attention output (input to the output projection)
  2q, the MLP 4f (input of GeLU 2f, input of the second linear 2f) or, gated (SwiGLU), 6f
  (the first linear's 2f-wide output 4f, the gated product 2f) — 24h for GPT (q = k = h,
  f = 4h) as in Table 2;
* the attention core, divided by t: without FlashAttention the s-long score rows of each
  query, a·s·(2 softmax + 1 dropout mask + 2 dropout output) = 5as (2as without dropout);
  with FlashAttention (Dao et al. 2022) no score matrix at all, only the FP32 log-sum-exp
  per head and token, 4a.

Selective recomputation (Korthikanti §5) drops the attention core (nothing to drop with
FlashAttention). Full recomputation keeps only each layer's input, 2h (divided by t with
sequence parallelism), plus, while one layer is recomputed in the backward, that one
layer's activations. Mixture-of-experts layers hold the routed tokens' expert MLP
activations top_k times (times the capacity factor, if any), plus the permuted input 2h·top_k.

**Context parallelism** (:mod:`.context`, the per-token terms above are on n = b·s/cp
tokens). The all-gather form (Llama 3 §3.3.2) keeps the gathered K and V of the whole
sequence for the backward: cp blocks where the local K and V above are one, so
(cp − 1)·block more per layer per micro-batch in flight, block = b·(s/cp)·2·kv_t·2 bytes
(:func:`.context.block_bytes`); its backward's dK, dV of the whole sequence, cp blocks, exist
until reduce-scattered. The ring form keeps only the local block; two blocks are in flight in
its forward and four in its backward (K, V, dK, dV of the current and the next step). Those
transient buffers (``CPAttention.transient_fwd_bytes``/``transient_bwd_bytes``) belong to the
one layer being computed: each device adds the larger once, like full recomputation's
working set. Full recomputation keeps neither copy of K and V.

**DualPipe** (DeepSeek-V3 report, arXiv 2412.19437 §3.2.1, Table 2) holds two copies of the
model's p pipeline stages, one per direction: device d holds stage d of one and stage
p − 1 − d of the other, so every device holds two stages' weights, gradients and optimizer
states (2× parameters) and devices 0 and p − 1 hold both an embedding and an output layer.
DualPipeV holds one V of 2p stages, two chunks per device, as ZB-V.

**Expert parameters** (:mod:`.moe`): an MoE layer's routed experts are cut over ep·etp ranks
(:func:`layer_params`) and sharded by ZeRO over the expert-data-parallel group,
tp·cp·dp/(ep·etp) ranks (:func:`shard_groups`); everything else as the dense model's.

**First and last stages.** The first stage also keeps the token ids (int64, 8 bytes a
token, for the embedding's backward) and, with dropout, the embedding dropout mask h. The
last keeps the final norm's input and output, 2h + 2h (divided by t with sequence
parallelism), and the FP32 softmax of the logits, 4·V/t per token: Megatron-LM's
vocab-parallel cross-entropy casts the logits to FP32 and saves ``exp_logits`` for its
backward (megatron/core/tensor_parallel/cross_entropy.py, ``VocabParallelCrossEntropy``);
theoretical_memory_usage.py counts the same 4·s·b·h·(1 + V/h).

**Micro-batches in flight** come from the pipeline schedule itself: each forward of a
stage allocates that stage's activations, each backward frees them (a split backward frees
all but the weight-gradient share, ``metrics.W_FRACTION``, which W frees). The peak is the
one ``pipeline.run(...).metrics.peak_activations`` reports, weighted by what each stage
really holds (uneven stages, the embedding, the logits); because a device's allocations and
frees are serialized in its op list, it depends on the op order only, so it is read off the
schedule's op lists and cached.

**Uneven splits.** The layers go to the p·v virtual stages as the step-time model puts
them (:func:`modelcut.core.stepmodel.stage_layers`: as even as possible, the lighter stages
at the two ends of the pipeline, where the embedding and the loss sit), so memory and time
describe the same pipeline; pass a prediction's ``stage_layers`` to be sure. For Llama 3
405B (126 layers) on 16 stages this gives 7, 8, ..., 8, 7 layers: "one Transformer layer
removed from the first and the last stages" (Grattafiori et al. 2024, §3.3.2); with v = 8
the first chunk holds only the embedding and the last only the output and the loss, as the
paper says; it is also what Megatron-LM's ``--account-for-embedding-in-pipeline-split
--account-for-loss-in-pipeline-split`` and torchtitan's ``generate_llm_fqn_per_model_part``
(input and output weight 1) give whenever l + 2 divides evenly. Megatron-LM's
``--decoder-first-pipeline-num-layers``/``--decoder-last-pipeline-num-layers`` can be given
instead (``MemoryOptions.first_layers``/``last_layers``).

**Framework buffers** are a stated allowance, reported apart: ``buffer_fixed_bytes`` for
the CUDA context, cuBLAS/cuDNN workspaces and NCCL communicator buffers, and
``fragmentation`` times the tensors above for the caching allocator's fragmentation.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from functools import lru_cache
from operator import attrgetter
from typing import Any

import numpy as np

from . import context, flops
from .errors import ModelcutError
from .metrics import W_FRACTION
from .schedules import DEFAULT_CHUNKS, build, interleaved
from .specs import BF16_BYTES, Hardware, ModelSpec, Run

GiB = 1 << 30

#: Bytes per parameter, mixed-precision Adam as Megatron-LM keeps it (BF16 weights; FP32
#: main gradients; FP32 main parameters + Adam m + Adam v), matching the 18 bytes of
#: megatron/training/theoretical_memory_usage.py.
WEIGHT_BYTES = BF16_BYTES
GRAD_BYTES = 4
OPTIMIZER_BYTES = 12
#: Token ids are int64 (the 8·s·b "input to embedding" of theoretical_memory_usage.py).
TOKEN_ID_BYTES = 8
#: FP32 logits/softmax kept by the vocab-parallel cross-entropy (see module docstring).
LOGIT_BYTES = 4
#: FP32 log-sum-exp per head and token saved by FlashAttention's forward (Dao et al. 2022, Alg. 2).
LSE_BYTES = 4


@dataclass(frozen=True)
class MemoryOptions:
    """Assumptions the memory model does not read off the run.

    ``flash_attention``: no s² score matrix (default on; Korthikanti et al.'s Table 2 is
    without it). ``reshard_after_forward``: ZeRO-3 frees gathered weights after each
    layer's forward (FSDP's default); off, as Llama 3 ran, it keeps the stage's BF16 weights.
    ``microbatch_group``: the interleaved schedule's N (Megatron-LM's
    ``--microbatch-group-size-per-virtual-pipeline-stage``; default p).
    ``first_layers``/``last_layers``: Megatron-LM's ``--decoder-first/last-pipeline-num-layers``.
    ``buffer_fixed_bytes``: allowance for the CUDA context and library workspaces (about
    0.5–1 GiB on current GPUs) and NCCL communicator buffers (NCCL_BUFFSIZE, 4 MiB, per
    channel and peer, over the tp, cp, pp and dp communicators): 2 GiB in all, an allowance,
    not a measurement. ``fragmentation``: the caching allocator's reserved-but-unused share,
    as a fraction of the tensors (5 %, an allowance).
    """

    flash_attention: bool = True
    reshard_after_forward: bool = True
    microbatch_group: int | None = None
    first_layers: int | None = None
    last_layers: int | None = None
    buffer_fixed_bytes: float = 2 * GiB
    fragmentation: float = 0.05


DEFAULT_OPTIONS = MemoryOptions()


@dataclass(frozen=True)
class StageMemory:
    """One pipeline rank's device: its chunks' layers and the bytes it holds at its peak."""

    stage: int                    # pipeline rank
    layers: int                   # transformer layers on this device (all its chunks)
    chunk_layers: tuple[int, ...]  # layers in each of its chunks, forward order
    embedding: bool
    output: bool
    weights_bytes: float
    gradients_bytes: float
    optimizer_bytes: float
    activations_bytes: float
    buffers_bytes: float
    total_bytes: float
    microbatches_in_flight: float  # peak, in micro-batches of this device's whole share

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["chunk_layers"] = list(self.chunk_layers)
        return d


# --------------------------------------------------------------------------- split


def layer_split(layers: int, p: int, v: int = 1, first: int | None = None,
                last: int | None = None) -> tuple[int, ...]:
    """Transformer layers in each of the p·v virtual stages, forward order (module doc:
    the step-time model's split, unless ``first``/``last`` are given).

    ``first``/``last``: layers on the first and last pipeline ranks (Megatron-LM's
    ``--decoder-first/last-pipeline-num-layers``), each shared evenly by that rank's v chunks;
    the rest share the middle ranks evenly.
    """
    S = p * v
    if layers < 1 or p < 1 or v < 1:
        raise ModelcutError(f"layers, p and v must be positive, got {layers}, {p}, {v}")
    if first is not None or last is not None:
        if p < 2:
            raise ModelcutError("first/last pipeline-stage layers need at least two pipeline stages")
        mid_ranks = p - 2
        if first is None or last is None:
            # the end not given takes the same share as each middle rank
            given = first if first is not None else last
            rest, share = layers - given, mid_ranks + 1
            if rest < 0 or rest % share:
                raise ModelcutError(f"{rest} layers do not divide evenly over {share} pipeline ranks")
            first = rest // share if first is None else first
            last = rest // share if last is None else last
        rest = layers - first - last
        if rest < 0 or (mid_ranks and rest % mid_ranks) or (not mid_ranks and rest):
            raise ModelcutError(f"{layers} layers cannot be split as first {first}, last {last} "
                                f"and {mid_ranks} even middle ranks")
        mid = rest // mid_ranks if mid_ranks else 0
        per_rank = [first] + [mid] * mid_ranks + [last]
        for r, n in enumerate(per_rank):
            if n % v:
                raise ModelcutError(f"pipeline rank {r}'s {n} layers do not divide into {v} chunks")
        # virtual stage c·p + r is chunk c of rank r
        return tuple(per_rank[s % p] // v for s in range(S))
    if S > layers + 2:
        raise ModelcutError(f"{S} pipeline stages exceed {layers} layers plus embedding and loss")
    from .stepmodel import stage_layers  # one rule for memory and time
    return stage_layers(layers, S)


# --------------------------------------------------------------------------- parameters


def _kv_extra(model: ModelSpec, t: int) -> float:
    """Parameters a tensor-parallel rank holds beyond kv/t when t exceeds the KV heads: each
    rank then keeps one whole K and V head (replicated), Megatron-LM's and vLLM's practice."""
    if model.kv_heads >= t:
        return 0.0
    qkv_bias = model.bias if model.qkv_bias is None else model.qkv_bias
    extra = model.d_head - model.kv_dim / t
    return 2 * extra * (model.hidden + (1 if qkv_bias else 0))


def layer_params(model: ModelSpec, t: int, moe: bool, ep: int = 1, etp: int | None = None) -> tuple[float, float]:
    """(dense, expert) parameters of one transformer layer held by one tensor-parallel rank.

    The layer's exact count (:func:`modelcut.core.flops.layer_params`) split as Megatron-LM
    splits it: the projections and the input biases over t (column/row parallel), the two
    norms and the output biases of attention and MLP on every rank; an MoE layer's routed
    experts over ep·etp (etp default t), its router h·E on every rank, shared experts over t.
    """
    h = model.hidden
    norms = 2 * flops.norm_params(model)
    out_bias = h if model.bias else 0
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


# --------------------------------------------------------------------------- activations


def layer_activation_bytes(model: ModelSpec, *, micro_batch: int, seq: int, t: int = 1, cp: int = 1,
                           sequence_parallel: bool = False, recompute: str = "none",
                           flash_attention: bool = True, moe: bool = False, etp: int | None = None,
                           recomputing: bool = False, cp_kind: str = "ring") -> float:
    """Bytes one transformer layer keeps for its backward, for one micro-batch, on one rank.

    Korthikanti et al. 2022 Table 2 generalized (module docstring). ``recompute``: none,
    selective or full; ``recomputing`` gives the full activations of a layer being
    recomputed (the working set of full recomputation) whatever ``recompute`` says.
    ``cp_kind``: with cp > 1, ``"allgather"`` also keeps the gathered K and V of the other
    cp − 1 ranks, :func:`cp_kept_extra_bytes`; ``"ring"`` only the local ones.
    """
    n = micro_batch * seq / cp            # tokens of the micro-batch on this rank
    h, q, a = model.hidden, model.q_dim, model.heads
    sp = t if sequence_parallel else 1
    if recompute == "full" and not recomputing:
        return n * 2 * h / sp
    gathered = cp_kept_extra_bytes(model, micro_batch=micro_batch, seq=seq, t=t, cp=cp, cp_kind=cp_kind)
    kv_heads_per_rank = max(model.kv_heads / t, 1)
    replicated = 8 * h + (2 * h if model.dropout else 0)
    # Q, K, V (K and V replicated when t exceeds the KV heads) and the attention output
    attn = 2 * q / t + 4 * kv_heads_per_rank * model.d_head + 2 * q / t
    if flash_attention:
        core = LSE_BYTES * a / t
    else:
        core = a * seq * (5 if model.dropout else 2) / t
        if recompute == "selective" and not recomputing:
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
    return n * (replicated / sp + attn + core + mlp) + gathered


def _cp_check(cp: int, cp_kind: str) -> None:
    if cp_kind not in context.CP_KINDS:
        raise ModelcutError(f"cp_kind must be 'ring' or 'allgather', got {cp_kind!r}")


def cp_kept_extra_bytes(model: ModelSpec, *, micro_batch: int, seq: int, t: int = 1, cp: int = 1,
                        cp_kind: str = "ring") -> float:
    """K and V one layer keeps for its backward beyond the rank's own, per micro-batch: the
    all-gather form's gathered copy, ``kv_kept_bytes`` − block = (cp − 1)·block
    (:func:`.context.cp_attention`); none for the ring form or without context parallelism."""
    _cp_check(cp, cp_kind)
    if cp == 1 or cp_kind == "ring":
        return 0.0
    return (cp - 1) * context.block_bytes(model, micro_batch, seq, cp, t)


def cp_transient_bytes(model: ModelSpec, *, micro_batch: int, seq: int, t: int = 1, cp: int = 1,
                       cp_kind: str = "ring") -> float:
    """The context-parallel buffers alive while one layer's attention runs, beyond what it
    keeps: max(forward, backward) of ``CPAttention.transient_*_bytes`` — ring: 4 blocks in the
    backward (K, V, dK, dV of this step and the next); all-gather: the whole sequence's dK, dV,
    cp blocks, until reduce-scattered."""
    _cp_check(cp, cp_kind)
    if cp == 1:
        return 0.0
    blk = context.block_bytes(model, micro_batch, seq, cp, t)
    return 4 * blk if cp_kind == "ring" else cp * blk   # ring: 2 blocks forward, 4 backward


def embedding_activation_bytes(model: ModelSpec, *, micro_batch: int, seq: int, t: int = 1, cp: int = 1,
                               sequence_parallel: bool = False) -> float:
    """First stage: int64 token ids (8 bytes a token) and, with dropout, the embedding's
    dropout mask (h bytes a token, /t with sequence parallelism)."""
    n = micro_batch * seq / cp
    sp = t if sequence_parallel else 1
    return n * (TOKEN_ID_BYTES + (model.hidden / sp if model.dropout else 0))


def loss_activation_bytes(model: ModelSpec, *, micro_batch: int, seq: int, t: int = 1, cp: int = 1,
                          sequence_parallel: bool = False) -> float:
    """Last stage: the final norm's input and output (2h + 2h, /t with sequence parallelism)
    and the FP32 softmax of the vocab-parallel logits, 4·V/t a token."""
    n = micro_batch * seq / cp
    sp = t if sequence_parallel else 1
    return n * (4 * model.hidden / sp + LOGIT_BYTES * model.vocab / t)


# --------------------------------------------------------------------------- in flight


def default_schedule(p: int, v: int) -> str:
    return "1f1b" if v == 1 else "interleaved"


def equivalent_microbatches(name: str, p: int, m: int, group: int | None = None) -> int:
    """A smaller micro-batch count with the same in-flight candidates as m.

    After its warm-up a device repeats one pattern of forwards and backwards per
    micro-batch (per group of N micro-batches for the interleaved schedule), and the
    drain only frees; so beyond a few micro-batches more, removing whole groups changes
    no candidate: past p + 1 for 1F1B and ZB-H1, 2p + 1 for ZB-V, 2N + 2p for the
    interleaved schedule, keeping m mod N, 2p + 2 for DualPipeV and 2p + 4 for DualPipe (tests/test_memory.py checks these against the
    full count). GPipe and the looped breadth-first schedule hold all m: never shortened."""
    if name in ("gpipe", "looped-bfs"):
        return m
    if name == "interleaved":
        n = group or p
        cap = 2 * n + 2 * p
    elif name in ("dualpipe", "dualpipev"):
        # DualPipeV's main loop repeats one F&B pair per micro-batch (DualPipe: per two, one
        # from each end); m must stay at least 2p, and even for DualPipe
        n, cap = (2, 2 * p + 4) if name == "dualpipe" else (1, 2 * p + 2)
    else:
        n = 1
        cap = 2 * p + 1 if name == "zbv" else p + 1
    return m if m <= cap else cap + (m - cap) % n


def inflight_profile(name: str, p: int, m: int, v: int, group: int | None = None
                     ) -> tuple[tuple[tuple[int, ...], np.ndarray], ...]:
    """For each device: (its stages in ascending order, candidate in-flight vectors).

    A candidate vector gives, right after one of the device's forwards, how many micro-
    batches of each of its stages are held (a split backward leaves ``W_FRACTION`` of one
    until its W), one row of an array. The device's peak for per-stage bytes w is the
    largest c·w;
    with w = 1/v for every stage it is ``metrics.peak_activations``. Cached, on the
    equivalent micro-batch count (:func:`equivalent_microbatches`).
    """
    return _profile(name, p, equivalent_microbatches(name, p, m, group), v, group)


@lru_cache(maxsize=4096)
def _profile(name: str, p: int, m: int, v: int, group: int | None = None):
    if name == "zbv" and m < 2 * p - 1:
        # ZB-V's lists for m < 2p − 1 are those for 2p − 1 with the missing micro-batches
        # dropped (schedules.zbv); derive them from the one cached build
        full = _zbv_orders(p)
        return _profile_of([[op for op in o if op.microbatch < m] for o in full], True)
    return profile_uncached(name, p, m, v, group)


@lru_cache(maxsize=256)
def _zbv_orders(p: int):
    return build("zbv", p, 2 * p - 1, 2).orders


def profile_uncached(name: str, p: int, m: int, v: int, group: int | None = None):
    """:func:`inflight_profile` built from the full schedule, without the cache."""
    if name == "interleaved" and group is not None:
        sched = interleaved(p, m, v, group)
    else:
        sched = build(name, p, m, v)
    return _profile_of(sched.orders, sched.split_backward)


_KIND = {"F": 0, "B": 1, "W": 2}


def _profile_of(orders, split: bool):
    """Per device: (stages, distinct in-flight vectors right after each forward). Each op
    changes its stage's count: F +1 awaiting B; B −1 (and, with a split backward, +1
    awaiting W); W −1; a vector is held + W_FRACTION · awaiting W."""
    wf = float(W_FRACTION)
    out = []
    for order in orders:
        n = len(order)
        if not n:
            out.append(((), np.zeros((0, 0))))
            continue
        kinds = np.fromiter((_KIND[k] for k in map(attrgetter("kind"), order)), dtype=np.int8, count=n)
        stg = np.fromiter(map(attrgetter("stage"), order), dtype=np.int64, count=n)
        stages, idx = np.unique(stg, return_inverse=True)
        k = len(stages)
        delta = np.zeros((n, 2 * k), dtype=np.int32)
        rows = np.arange(n)
        f, b, w = kinds == 0, kinds == 1, kinds == 2
        delta[rows[f], idx[f]] = 1
        delta[rows[b], idx[b]] = -1
        if split:
            delta[rows[b], k + idx[b]] = 1
            delta[rows[w], k + idx[w]] = -1
        held = np.cumsum(delta, axis=0)[f]
        vecs = np.unique(held[:, :k] + wf * held[:, k:], axis=0)
        out.append((tuple(int(x) for x in stages), vecs))
    return tuple(out)


def device_peaks(name: str, p: int, m: int, v: int, stage_bytes: list[float],
                 group: int | None = None, cached: bool = True) -> list[float]:
    """Peak activation bytes of each device, given each virtual stage's bytes per micro-batch.
    ``cached=False`` rebuilds the full schedule (a benchmark's baseline)."""
    prof = inflight_profile(name, p, m, v, group) if cached else profile_uncached(name, p, m, v, group)
    w = np.asarray(stage_bytes, dtype=float)
    return [float((cands @ w[list(stages)]).max()) if len(stages) else 0.0 for stages, cands in prof]


def end_stages(name: str, S: int) -> tuple[frozenset[int], frozenset[int]]:
    """(virtual stages holding an embedding, those holding the output layer and loss): the
    first and the last, and for DualPipe the reverse copy's too (stages p and p − 1)."""
    if name == "dualpipe":
        p = S // 2
        return frozenset((0, p)), frozenset((p - 1, S - 1))
    return frozenset((0,)), frozenset((S - 1,))


def _coefficients(prof, split: tuple[int, ...], moe: tuple[int, ...], name: str = ""
                  ) -> tuple[tuple[tuple[int, ...], np.ndarray], ...]:
    """Per device: its stages and, per in-flight candidate, the micro-batch-weighted counts
    (dense layers, MoE layers, embedding, loss), so that a peak is one matrix product."""
    emb, loss = end_stages(name, len(split))
    out = []
    for stages, cands in prof:
        basis = np.array([[split[s] - moe[s], moe[s], s in emb, s in loss] for s in stages], dtype=float)
        coef = cands @ basis if len(stages) else np.zeros((0, 4))
        out.append((stages, np.unique(coef, axis=0)))
    return tuple(out)


@lru_cache(maxsize=8192)
def _cached_coefficients(name: str, p: int, m: int, v: int, group: int | None, split: tuple[int, ...],
                         moe: tuple[int, ...]):
    return _coefficients(inflight_profile(name, p, m, v, group), split, moe, name)


def stage_coefficients(name: str, p: int, m: int, v: int, group: int | None, split: tuple[int, ...],
                       moe: tuple[int, ...], cached: bool = True):
    """:func:`_coefficients` of the schedule's in-flight profile, cached on the equivalent
    micro-batch count; ``cached=False`` rebuilds the full schedule."""
    if cached:
        return _cached_coefficients(name, p, equivalent_microbatches(name, p, m, group), v, group, split, moe)
    return _coefficients(profile_uncached(name, p, m, v, group), split, moe, name)


def device_stages(name: str, p: int, m: int, v: int, group: int | None = None) -> list[tuple[int, ...]]:
    """The virtual stages each device holds (ascending)."""
    return [st for st, _ in inflight_profile(name, p, m, v, group)]


# --------------------------------------------------------------------------- per stage


def microbatches(run: Run) -> int:
    """Micro-batches per step per pipeline: global batch / (dp · micro-batch)."""
    tr, lay = run.training, run.layout
    per = lay.dp * tr.micro_batch
    if tr.global_batch % per:
        raise ModelcutError(f"global batch {tr.global_batch} is not divisible by dp·micro_batch = {per}")
    return tr.global_batch // per


def shard_groups(run: Run) -> tuple[int, int]:
    """(D, D_expert): how many ranks share a ZeRO shard of dense and of expert parameters.
    Dense: dp·cp, as Megatron-LM's distributed optimizer shards over the data-parallel group
    with context parallelism. Experts: tp·cp·dp/(ep·etp), Megatron-LM's expert data-parallel group."""
    lay = run.layout
    d = lay.dp * lay.cp
    etp = lay.etp or lay.tp
    de = max(1, lay.tp * lay.cp * lay.dp // (lay.ep * etp))
    return d, de


def state_bytes(params: float, expert_params: float, zero: int, d: int, de: int,
                gathered_params: float) -> tuple[float, float, float]:
    """(weights, gradients, optimizer) bytes for a device's parameters (module table).

    ``gathered_params``: parameters ZeRO-3 holds unsharded while computing (one layer being
    used and one prefetched, or the whole stage without resharding)."""
    def one(n: float, D: int) -> tuple[float, float, float]:
        w = WEIGHT_BYTES * n / (D if zero >= 3 else 1)
        g = GRAD_BYTES * n / (D if zero >= 2 else 1)
        o = OPTIMIZER_BYTES * n / (D if zero >= 1 else 1)
        return w, g, o
    a, b = one(params, d), one(expert_params, de)
    w = a[0] + b[0] + (WEIGHT_BYTES * gathered_params if zero >= 3 else 0.0)
    return w, a[1] + b[1], a[2] + b[2]


@dataclass(frozen=True)
class _Pipe:
    name: str
    p: int
    v: int
    m: int
    group: int | None
    split: tuple[int, ...]
    moe: tuple[int, ...]            # MoE layers per virtual stage
    stages_of: tuple[tuple[int, ...], ...]
    coefs: tuple[np.ndarray, ...]   # per device, rows (dense, moe, embedding, loss)


def _pipe(run: Run, options: MemoryOptions, vpp: int | None, schedule: str | None,
          stage_layers: tuple[int, ...] | None, cached: bool) -> _Pipe:
    """The pipeline a run's memory describes: schedule, chunks, split, in-flight profile."""
    model, lay, tr = run.model, run.layout, run.training
    p = lay.pp
    name = schedule or lay.schedule
    # schedules with two chunks per device by construction take v = 2 unless told otherwise
    v = vpp or lay.vpp or (2 if name in ("zbv", "dualpipe", "dualpipev") else 1)
    name = name or default_schedule(p, v)
    if name not in DEFAULT_CHUNKS:
        raise ModelcutError(f"unknown schedule {name!r}; choose one of {', '.join(DEFAULT_CHUNKS)}")
    if name in ("1f1b", "gpipe", "zb-h1") and v != 1:
        raise ModelcutError(f"{name} runs one chunk per device, got vpp = {v}")
    if name in ("zbv", "dualpipe", "dualpipev") and v != 2:
        raise ModelcutError(f"{name} runs two chunks per device, got vpp = {v}")
    if tr.seq_len % lay.cp:
        raise ModelcutError(f"sequence {tr.seq_len} is not divisible by cp = {lay.cp}")
    m = microbatches(run)
    if name in ("zbv", "dualpipev") and (options.first_layers is not None or options.last_layers is not None):
        raise ModelcutError(f"first/last pipeline-stage layers assume Megatron-LM's placement, not {name}'s V")
    if name == "dualpipe":
        split = _dualpipe_split(model.layers, p, stage_layers, options)
    elif stage_layers is not None:
        split = tuple(stage_layers)
        if len(split) != p * v or sum(split) != model.layers or min(split) < 0:
            raise ModelcutError(f"stage_layers must give {p * v} stages summing to {model.layers} layers")
    else:
        split = layer_split(model.layers, p, v, options.first_layers, options.last_layers)
    group = options.microbatch_group if name == "interleaved" else None
    if name == "interleaved" and v > 1 and m < (group or p):
        raise ModelcutError(f"the interleaved schedule needs at least {group or p} micro-batches, got {m}")
    # MoE layers per stage, along the model (DualPipe: along one copy, then the other)
    copies = 2 if name == "dualpipe" else 1
    model_split = split[:len(split) // copies]
    moe = [0] * len(model_split)
    if model.is_moe:
        start = 0
        for s, n in enumerate(model_split):
            moe[s] = max(0, start + n - max(start, model.dense_layers))
            start += n
    moe_t = tuple(moe) * copies
    coefs = stage_coefficients(name, p, m, v, group, split, moe_t, cached)
    return _Pipe(name, p, v, m, group, split, moe_t, tuple(st for st, _ in coefs), tuple(c for _, c in coefs))


def _dualpipe_split(layers: int, p: int, stage_layers: tuple[int, ...] | None,
                    options: MemoryOptions) -> tuple[int, ...]:
    """DualPipe's 2p stages: the model's p-stage split, once per direction (stage p + s is
    model stage s). ``stage_layers`` may give the model's p stages or all 2p (equal halves)."""
    if stage_layers is None:
        base = layer_split(layers, p, 1, options.first_layers, options.last_layers)
    else:
        base = tuple(stage_layers)
        if len(base) == 2 * p and base[:p] == base[p:]:
            base = base[:p]
        if len(base) != p or sum(base) != layers or min(base) < 0:
            raise ModelcutError(f"dualpipe's stage_layers must give the model's {p} stages summing to "
                                f"{layers} layers (each device holds one of each direction's copy)")
    return base + base


def _activations(run: Run, options: MemoryOptions, pipe: _Pipe, recompute: str) -> tuple[np.ndarray, np.ndarray]:
    """Per device: peak activation bytes (with full recomputation's one-layer working set)
    and the bytes of one micro-batch through all its chunks."""
    model, lay, tr = run.model, run.layout, run.training
    sp = lay.sequence_parallel and lay.tp > 1
    kw = dict(micro_batch=tr.micro_batch, seq=tr.seq_len, t=lay.tp, cp=lay.cp, sequence_parallel=sp)
    akw = dict(kw, recompute=recompute, flash_attention=options.flash_attention, etp=lay.etp, cp_kind=lay.cp_form)
    unit = np.array([layer_activation_bytes(model, **akw),
                     layer_activation_bytes(model, moe=True, **akw) if model.is_moe else 0.0,
                     embedding_activation_bytes(model, **kw), loss_activation_bytes(model, **kw)])
    peaks = np.array([float((c @ unit).max()) if len(c) else 0.0 for c in pipe.coefs])
    emb, loss = end_stages(pipe.name, len(pipe.split))
    share = np.array([sum((pipe.split[s] - pipe.moe[s]) * unit[0] + pipe.moe[s] * unit[1]
                          + (unit[2] if s in emb else 0.0) + (unit[3] if s in loss else 0.0) for s in sts)
                      for sts in pipe.stages_of])
    # the context-parallel buffers of the one layer being computed
    transient = cp_transient_bytes(model, micro_batch=tr.micro_batch, seq=tr.seq_len, t=lay.tp, cp=lay.cp,
                                   cp_kind=lay.cp_form)
    for d, sts in enumerate(pipe.stages_of):
        if any(pipe.split[s] for s in sts):
            peaks[d] += transient
    if recompute == "full":
        work_d = layer_activation_bytes(model, **dict(akw, recomputing=True))
        work_m = layer_activation_bytes(model, moe=True, **dict(akw, recomputing=True)) if model.is_moe else 0.0
        for d, sts in enumerate(pipe.stages_of):
            nl = sum(pipe.split[s] for s in sts)
            nm = sum(pipe.moe[s] for s in sts)
            if nl:
                peaks[d] += work_m if nm else work_d
    return peaks, share


def _device_params(run: Run, pipe: _Pipe) -> list[tuple[float, float, float, dict[str, Any]]]:
    """Per device: (dense parameters, expert parameters, largest unit ZeRO-3 gathers, info)."""
    model, lay = run.model, run.layout
    t = lay.tp
    dense_l, _ = layer_params(model, t, False, lay.ep, lay.etp)
    dense_m, exp_m = layer_params(model, t, True, lay.ep, lay.etp) if model.is_moe else (0.0, 0.0)
    emb = embedding_params(model, t)
    out_p = output_params(model, t)
    emb_st, out_st = end_stages(pipe.name, len(pipe.split))
    out = []
    for sts in pipe.stages_of:
        nl = sum(pipe.split[s] for s in sts)
        nm = sum(pipe.moe[s] for s in sts)
        params = (nl - nm) * dense_l + nm * dense_m
        has_emb, has_out = bool(emb_st & set(sts)), bool(out_st & set(sts))
        if has_emb:
            params += emb
        if has_out:
            # untied: the output layer; tied with pp > 1: Megatron-LM keeps a copy of the
            # word embeddings on the last stage (megatron/core/models/common/language_module)
            params += out_p if (not model.tied_embeddings or not has_emb) else out_p - model.vocab * model.hidden / t
        unit = max(dense_m + exp_m if nm else 0.0, dense_l if nl > nm else 0.0,
                   emb if has_emb else 0.0, out_p if has_out else 0.0)
        info = dict(layers=nl, chunk_layers=tuple(pipe.split[s] for s in sts), embedding=has_emb, output=has_out)
        out.append((params, nm * exp_m, unit, info))
    return out


def _states(run: Run, options: MemoryOptions, params, zero: int) -> np.ndarray:
    """Per device: (weights, gradients, optimizer) bytes under a ZeRO stage."""
    d, de = shard_groups(run)
    rows = []
    for dense, expert, unit, _ in params:
        if zero >= 3:
            gathered = min(2 * unit, dense + expert) if options.reshard_after_forward else dense + expert
        else:
            gathered = 0.0
        rows.append(state_bytes(dense, expert, zero, d, de, gathered))
    return np.array(rows).reshape(len(rows), 3)


def _total(options: MemoryOptions, tensors: np.ndarray) -> np.ndarray:
    return tensors + options.buffer_fixed_bytes + options.fragmentation * tensors


def stage_memory(run: Run, hw: Hardware | None = None, *, options: MemoryOptions = DEFAULT_OPTIONS,
                 vpp: int | None = None, schedule: str | None = None,
                 stage_layers: tuple[int, ...] | None = None, cached: bool = True) -> list[StageMemory]:
    """Memory of one device of each pipeline rank (module docstring for every term).

    ``vpp``/``schedule``/``stage_layers`` override the layout's (pass a prediction's own
    ``vpp``, ``schedule`` and ``stage_layers`` so memory and time describe the same
    pipeline); with none, v = 1 and 1F1B, or the interleaved schedule when v > 1.
    """
    pipe = _pipe(run, options, vpp, schedule, stage_layers, cached)
    acts, share = _activations(run, options, pipe, run.training.recompute)
    params = _device_params(run, pipe)
    states = _states(run, options, params, run.layout.zero)
    totals = _total(options, states.sum(axis=1) + acts)
    out = []
    for dev in range(pipe.p):
        w, g, o = (float(x) for x in states[dev])
        tensors = w + g + o + float(acts[dev])
        out.append(StageMemory(
            stage=dev, **params[dev][3], weights_bytes=w, gradients_bytes=g, optimizer_bytes=o,
            activations_bytes=float(acts[dev]), buffers_bytes=float(totals[dev]) - tensors,
            total_bytes=float(totals[dev]),
            microbatches_in_flight=float(acts[dev] / share[dev]) if share[dev] else 0.0))
    return out


def variant_peaks(run: Run, variants: list[tuple[str, int]], *, options: MemoryOptions = DEFAULT_OPTIONS,
                  vpp: int | None = None, schedule: str | None = None,
                  stage_layers: tuple[int, ...] | None = None, cached: bool = True) -> dict[tuple[str, int], float]:
    """Peak device bytes of the run under each (recompute, zero) variant, sharing the
    pipeline, activation and parameter work between variants (the explorer's fast path;
    the same numbers as :func:`stage_memory`)."""
    pipe = _pipe(run, options, vpp, schedule, stage_layers, cached)
    params = _device_params(run, pipe)
    acts = {r: _activations(run, options, pipe, r)[0] for r in {r for r, _ in variants}}
    states = {z: _states(run, options, params, z).sum(axis=1) for z in {z for _, z in variants}}
    return {(r, z): float(_total(options, acts[r] + states[z]).max()) for r, z in variants}


def peak_bytes(stages: list[StageMemory]) -> float:
    """The largest device total: what the accelerator must hold."""
    return max(s.total_bytes for s in stages)


def for_framework(run: Run, framework: Any, options: MemoryOptions = DEFAULT_OPTIONS) -> tuple[Run, MemoryOptions]:
    """The run and memory assumptions a training stack implies (``framework``: a preset name or
    :class:`.overlap.Framework`).

    * Megatron-LM's distributed optimizer (``--use-distributed-optimizer``, on in Megatron-core's
      and NeMo's recipes) shards the FP32 main parameters and Adam moments over dp·cp and keeps
      the whole FP32 gradient buffer: ZeRO-1's row of the module table, 6 + 12/D bytes per
      parameter (megatron/training/theoretical_memory_usage.py), so the run is counted with
      zero ≥ 1;
    * FlashAttention (no s² score matrix) unless the stack runs the unfused softmax attention;
    * ZeRO-3/FSDP keep or free the gathered weights after the forward as the stack does;
    * context parallelism in the stack's form when the layout leaves it open."""
    from .overlap import framework as get_framework  # the presets live with the overlap options
    fw = get_framework(framework)
    lay = run.layout
    zero = max(lay.zero, 1) if fw.dist_optimizer else lay.zero
    if zero != lay.zero or lay.cp_kind is None:
        run = replace(run, layout=replace(lay, zero=zero, cp_kind=lay.cp_kind or fw.cp_kind))
    opts = replace(options, flash_attention=fw.attention != "unfused",
                   reshard_after_forward=fw.reshard_after_forward)
    return run, opts


def memory_report(run: Run, hw: Hardware | None = None, *, options: MemoryOptions = DEFAULT_OPTIONS,
                  vpp: int | None = None, schedule: str | None = None,
                  stage_layers: tuple[int, ...] | None = None, prediction: Any = None,
                  framework: Any = None) -> dict[str, Any]:
    """The JSON piece for ``predict --json``: ``{"stages": [{"stage", "layers", "weights_bytes",
    "gradients_bytes", "optimizer_bytes", "activations_bytes", "buffers_bytes", "total_bytes",
    ...}, ...], "peak_bytes", "assumptions", "capacity_bytes", "fits"}``.

    Pass the step-time ``prediction`` (anything with ``vpp``, ``schedule`` and
    ``stage_layers``) so memory describes the pipeline the prediction simulated, and the
    ``framework`` it assumed (:func:`for_framework`) so memory describes the same stack."""
    fw_name = None
    if framework is not None:
        run, options = for_framework(run, framework, options)
        fw_name = getattr(framework, "name", framework)
    if prediction is not None:
        vpp = vpp or prediction.vpp
        schedule = schedule or prediction.schedule
        stage_layers = stage_layers or (tuple(prediction.stage_layers) or None)
    stages = stage_memory(run, hw, options=options, vpp=vpp, schedule=schedule, stage_layers=stage_layers)
    peak = peak_bytes(stages)
    rep: dict[str, Any] = {
        "stages": [s.as_dict() for s in stages],
        "peak_bytes": peak,
        "assumptions": {
            "flash_attention": options.flash_attention,
            "reshard_after_forward": options.reshard_after_forward,
            "buffer_fixed_bytes": options.buffer_fixed_bytes,
            "fragmentation": options.fragmentation,
            "zero": run.layout.zero,
            "framework": fw_name,
        },
    }
    if hw is not None:
        rep["capacity_bytes"] = hw.mem_bytes
        rep["fits"] = peak <= hw.mem_bytes
    return rep
