"""Splitting by position: sequence parallelism and context parallelism.

**Sequence parallelism** (Korthikanti et al. 2022, arXiv 2205.05198, §4.2.2): inside a tensor-
parallel group of t ranks, the LayerNorm and dropout regions are split along the sequence, so
each of the layer's all-reduces becomes a reduce-scatter (entering the sequence-parallel region)
and an all-gather (leaving it) of the same buffer. A ring reduce-scatter plus a ring all-gather
put exactly the all-reduce's 2(t − 1)/t · nbytes on the wire and take its 2(t − 1) latency steps
(:func:`~modelcut.core.costs.comm.wire_bytes`), so the communication time is unchanged; what changes
is memory: those regions' activations are divided by t (:mod:`.memory`, Korthikanti et al.
Table 2).

**Context parallelism** splits the sequence itself across cp ranks for attention too: each rank
keeps the queries of its own s/cp positions and needs every earlier position's keys and values.
Two forms, chosen per run (``Layout.cp_kind``):

* ``"ring"`` (ring attention, Liu, Zaharia & Abbeel 2023, arXiv 2310.01889 §3): K/V blocks of
  s/cp positions pass round the ring of cp ranks while each rank computes attention of its
  queries against the block it holds. Forward: cp steps, the first cp − 1 of them each sending
  one block, b·(s/cp)·2·kv_t·2 bytes (K and V, BF16), to the next rank. Every step waits for its
  slowest rank, so step k takes max(max_i compute(i, k), transfer) and the exposed time is
  Σ_k max(0, transfer − max_i compute(i, k)): zero whenever a block's compute outlasts its
  transfer. Backward: the K/V block travels with its partial gradients dK, dV (twice the bytes
  per hop) while each rank computes its share of the backward, and a last hop of dK, dV takes
  the finished gradients home, exposed.
* ``"allgather"`` (Llama 3, Grattafiori et al. 2024, arXiv 2407.21783 §3.3.2): K and V of the
  whole sequence are all-gathered before the attention, (cp − 1)/cp · b·s·2·kv_t·2 bytes,
  gathered again before the backward (only the local K and V are saved for it), and the
  gradients dK, dV reduce-scattered after it; all exposed ("the all-gather communication
  latency is exposed in the critical path"). Transformer Engine's implementation of Llama 3's
  form does so: ``AttnFuncWithCPAndKVAllGather`` saves the local q, k, v and calls
  ``gather_along_first_dim`` on k and v again in its backward
  (transformer_engine/pytorch/attention/dot_product_attention/context_parallel.py @9c61cd7e5e0c).

* ``"a2a"`` (DeepSpeed-Ulysses, Jacobs et al. 2023, arXiv 2309.14509; Megatron-LM's
  ``--cp-comm-type a2a``, Transformer Engine's ``AttnFuncWithCPAndQKVOA2A``): an all-to-all
  trades the sequence cut for a head cut before the attention, so each rank holds the whole
  sequence's Q, K and V for heads/(t·cp) of the heads, runs one ordinary causal attention over the
  whole sequence, and a second all-to-all trades the output back. Each rank sends (cp − 1)/cp of
  its b·(s/cp)·(q_t + 2·kv_t)·2 bytes of Q, K, V and of its b·(s/cp)·q_t·2 bytes of output; the
  backward sends dO one way and dQ, dK, dV the other, as many bytes, one all-to-all a tensor
  (:func:`a2a_tensors`). None of it overlaps the attention: Transformer Engine's
  ``flash_attn_a2a_communicate`` makes the compute stream wait for every exchange
  (TransformerEngine v2.18 ``context_parallel.py``), and the reorders around them are
  memory-bound copies (:func:`a2a_copy_bytes`). The heads must split: heads/t and kv heads/t
  each a multiple of cp (:func:`heads_split_problem`).

* ``"a2a+p2p"`` (hierarchical; Megatron-LM's ``--cp-comm-type a2a+p2p`` with
  ``--hierarchical-context-parallel-sizes A cp/A``, Transformer Engine's ``AttnFuncWithCPAndKVP2P``
  given ``cp_group = [a2a group, p2p group]``): the all-to-all form inside groups of A adjacent cp
  ranks, then the ring across the cp/A groups (ranks A apart) on heads/(t·A) heads, then the
  output's all-to-all back (TransformerEngine v2.18 ``context_parallel.py``: ``cp_size_a2a``,
  ``send_dst = cp_global_ranks[(rank + 1) % cp_size * cp_size_a2a + rank_a2a]``). Its ring is the
  ring above with cp/A ranks and t·A tensor-parallel ranks' worth of heads; its all-to-alls are the
  all-to-all form's over A ranks. heads/t and kv_heads/t must divide by A.

The first two put the same (cp − 1) · block bytes on the wire in the forward and compute the same
attention; the all-to-all computes it too, at the whole sequence's length on fewer heads, and
moves Q and the output instead of passing K and V round; the hierarchical form does both in
parts. All four agree on FLOPs and differ in what is exposed and in memory.

Here kv_t = kv_heads·head_dim/t, the K (or V) width on one tensor-parallel rank; with more ranks
than KV heads each rank keeps one head (Megatron-LM replicates KV heads), kv_t = head_dim.

**The load-balanced causal split.** A causal mask makes late positions attend to more keys than
early ones. Cutting the sequence into cp contiguous pieces gives the last rank almost twice the
mean work; cutting it into 2·cp chunks and giving rank i chunks i and 2·cp − 1 − i (Llama 3
§3.3.2; Megatron-LM's context parallelism) gives every rank the same number of (query, key)
pairs exactly: with n = s/(2·cp) positions per chunk, n²·(2·cp − 1) + n·(n + 1) each
(:func:`causal_pairs`).

**Memory per layer.** All-gather: only the local K and V are kept for the backward (the gathered
copy is gathered again there, above); while a layer computes, the gathered K and V of the whole
sequence, b·s·2·kv_t·2 bytes, exist in the forward, and in the backward with the whole
sequence's dK, dV, as large again, until reduce-scattered. Ring: only the local K and V are kept; two blocks are in flight while computing (the one in use
and the one arriving), four in the backward (K, V, dK, dV of the current and the next block).

Attention work is counted as executed: 2·d per (query, key) pair per head for QKᵀ and 2·d for
A·V, over the causally unmasked pairs (FlashAttention skips fully masked blocks; Dao 2023, arXiv
2307.08691 §3.1), and the backward as ``bwd_ratio`` times the forward (default 2, the
convention of :mod:`.flops`, Narayanan et al. 2021 §5.1).
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import lru_cache

from . import comm
from ..errors import ModelcutError
from ..specs import CP_KINDS, ModelSpec, cp_a2a_problem
from ..units import BF16_BYTES

#: Bytes per element on the wire and in activations: BF16.
BYTES = BF16_BYTES
#: Backward attention work over forward (Narayanan et al. 2021 §5.1: the backward pass is twice
#: the forward's matrix products).
BWD_RATIO = 2.0
#: Each form of :data:`..specs.CP_KINDS` in a line, for the faces' lists (the web explorer's checkboxes).
CP_KIND_DOCS = {
    "ring": "ring: each rank passes its K and V block on while it attends to the one it holds "
            "(Megatron-LM's p2p, ring attention)",
    "allgather": "all-gather: K and V gathered whole before the attention (Llama 3's)",
    "a2a": "all-to-all: an exchange cuts the heads instead of the sequence, each rank attending "
           "over the whole sequence (DeepSpeed-Ulysses); cp must divide the heads",
    "a2a+p2p": "hierarchical: the all-to-all within groups of cp ranks, a ring across the groups "
               "(Megatron-LM's a2a+p2p); the explorer's groups are the cp ranks a node holds (or the largest "
               "part of them that cuts the heads)",
}

#: Each form's name in words, as the faces label it (the line's first words, before its colon).
CP_KIND_LABELS = {k: doc.split(":", 1)[0] for k, doc in CP_KIND_DOCS.items()}

#: The forms as the stacks name them: Megatron-LM's ``--cp-comm-type`` p2p (Transformer Engine's
#: ring exchange) and allgather (megatron/training/arguments.py @d98e8a64dd: "p2p, a2a, allgather or
#: a2a+p2p"; NeMo's ``cp_comm_type`` passes the same names), with the spellings users write.
CP_KIND_NAMES = {"p2p": "ring", "ring": "ring", "allgather": "allgather", "all_gather": "allgather",
                 "all-gather": "allgather", "a2a": "a2a", "all-to-all": "a2a", "alltoall": "a2a",
                 "ulysses": "a2a", "a2a+p2p": "a2a+p2p", "hierarchical": "a2a+p2p"}


def cp_form_label(kind: str | None, cp_a2a: int | None = None) -> str | None:
    """A context-parallel form as modelcut's outputs name it: the form, with the hierarchical one's
    all-to-all groups' size (``a2a+p2p 8``: all-to-all over groups of 8 cp ranks, a ring across
    them); None without one."""
    return f"{kind} {cp_a2a}" if kind == "a2a+p2p" and cp_a2a else kind


def cp_kind_name(name: str) -> str:
    """A context-parallel form as the stacks name it (``p2p``, ``all_gather``) as modelcut's (every
    form of Megatron-LM's ``--cp-comm-type`` is timed); a name it does not know comes back
    lower-cased, for the caller's check."""
    key = str(name).strip().lower()
    return CP_KIND_NAMES.get(key, key)


def _pos_int(name: str, x) -> None:
    if isinstance(x, bool) or not isinstance(x, int) or x < 1:
        raise ModelcutError(f"{name} must be a positive integer, got {x!r}")


# ---------------------------------------------------------------- sequence parallelism

def tp_collectives(t: int, nbytes: float, sequence_parallel: bool) -> tuple[tuple[str, int, float], ...]:
    """The tensor-parallel collectives of one layer's forward pass, (kind, group size, buffer
    bytes): two all-reduces of the layer's activations (after attention and after the MLP,
    Shoeybi et al. 2019 §3), or with sequence parallelism an all-gather and a reduce-scatter in
    place of each (Korthikanti et al. 2022 §4.2.2). The backward mirrors them. ``nbytes``: the
    full b·s·h activation buffer of the micro-batch on this rank's context-parallel share."""
    _pos_int("t", t)
    if nbytes < 0:
        raise ModelcutError(f"message size must be non-negative, got {nbytes}")
    if sequence_parallel:
        return (("all-gather", t, nbytes), ("reduce-scatter", t, nbytes)) * 2
    return (("all-reduce", t, nbytes),) * 2


def collectives_time(collectives, bw: float, alpha: float = 0.0) -> float:
    """Time of a sequence of (kind, n, nbytes) ring collectives (:mod:`.comm`), one after another."""
    f = {"all-reduce": comm.ring_allreduce, "reduce-scatter": comm.reduce_scatter,
         "all-gather": comm.all_gather, "all-to-all": comm.all_to_all}
    return sum(f[k](n, b, bw, alpha) for k, n, b in collectives)


def collectives_wire_bytes(collectives) -> float:
    """Bytes one rank sends for a sequence of (kind, n, nbytes) collectives."""
    return sum(comm.wire_bytes(k, n, b) for k, n, b in collectives)


# ---------------------------------------------------------------- the causal split

@lru_cache(maxsize=1024)
def causal_chunks(cp: int, balanced: bool = True) -> tuple[tuple[int, ...], ...]:
    """Chunk indices per rank. Balanced: 2·cp chunks, rank i takes i and 2·cp − 1 − i (Llama 3
    §3.3.2). Naive: cp chunks, rank i takes chunk i."""
    _pos_int("cp", cp)
    if balanced:
        return tuple((i, 2 * cp - 1 - i) for i in range(cp))
    return tuple((i,) for i in range(cp))


def _chunk_len(seq: int, cp: int, balanced: bool) -> int:
    _pos_int("seq_len", seq)
    parts = 2 * cp if balanced else cp
    if seq % parts:
        raise ModelcutError(f"seq_len ({seq}) must be a multiple of {'2·cp' if balanced else 'cp'} = {parts} "
                            f"for the {'load-balanced' if balanced else 'contiguous'} causal split")
    return seq // parts


def _pairs(q_chunk: int, k_chunk: int, n: int) -> int:
    """Unmasked (query, key) pairs between two chunks of n positions under a causal mask."""
    if k_chunk < q_chunk:
        return n * n
    if k_chunk == q_chunk:
        return n * (n + 1) // 2
    return 0


def block_pairs(seq: int, cp: int, rank: int, source: int, balanced: bool = True) -> int:
    """Unmasked pairs between rank ``rank``'s queries and rank ``source``'s keys."""
    n = _chunk_len(seq, cp, balanced)
    chunks = causal_chunks(cp, balanced)
    return sum(_pairs(a, b, n) for a in chunks[rank] for b in chunks[source])


@lru_cache(maxsize=1024)
def causal_pairs(seq: int, cp: int, balanced: bool = True) -> tuple[int, ...]:
    """Unmasked (query, key) pairs each rank computes, for one sequence and one head. Balanced:
    n²·(2·cp − 1) + n·(n + 1) on every rank, n = s/(2·cp); naive: N²·i + N·(N + 1)/2 on rank i,
    N = s/cp. Either way they sum to s·(s + 1)/2."""
    return tuple(sum(block_pairs(seq, cp, r, j, balanced) for j in range(cp)) for r in range(cp))


def causal_imbalance(seq: int, cp: int, balanced: bool = True) -> float:
    """The busiest rank's attention work over the mean: exactly 1 for the balanced split; for
    the naive one (N·(2·cp − 1) + 1)/(cp·N + 1), N = s/cp, which tends to (2·cp − 1)/cp."""
    pairs = causal_pairs(seq, cp, balanced)
    return max(pairs) * cp / sum(pairs)


@lru_cache(maxsize=1024)
def ring_step_pairs(seq: int, cp: int, balanced: bool = True) -> tuple[int, ...]:
    """The busiest rank's unmasked pairs at each ring step k (rank i holds rank (i − k) mod cp's
    block): max_i :func:`block_pairs`; cached, the step model asks for the same (s, cp) often."""
    return tuple(max(block_pairs(seq, cp, i, (i - k) % cp, balanced) for i in range(cp)) for k in range(cp))


# ---------------------------------------------------------------- context-parallel attention

def kv_width_per_rank(model: ModelSpec, t: int = 1) -> int:
    """K (or V) width held by one tensor-parallel rank: kv_heads·head_dim/t, at least one head."""
    _pos_int("t", t)
    return model.d_head * max(model.kv_heads // t, 1)


def query_width_per_rank(model: ModelSpec, t: int = 1) -> int:
    """Q (and the attention output) width held by one tensor-parallel rank: heads·head_dim/t (a
    run's check has t divide the heads)."""
    _pos_int("t", t)
    return model.heads // t * model.d_head


def cp_widths(model: ModelSpec, t: int = 1) -> tuple[int, int, int, int]:
    """(Q, K, V, output) widths on one tensor-parallel rank as context parallelism moves and merges
    them: Q and the output :func:`query_width_per_rank`, K and V :func:`kv_width_per_rank`. Multi-head
    latent attention (``ModelSpec.is_mla``) runs its attention on up-projected tensors, one K and V
    per query head (Megatron-core core_v0.15.0 multi_latent_attention.py ``qkv_up_proj_and_rope_apply``:
    query and key [tokens, heads, d_nope + d_rope], value [tokens, heads, d_v]; its context
    parallelism passes those), so its widths are H/t·(d_nope + d_rope) for Q and K and H/t·d_v for V
    and the output, not those of its equal-weight grouped-query shape (``kv_heads``, ``head_dim``)."""
    _pos_int("t", t)
    if model.is_mla:
        heads = model.heads // t
        qk = heads * (model.qk_nope_head_dim + model.qk_rope_head_dim)
        return qk, qk, heads * model.v_head_dim, heads * model.v_head_dim
    q, kv = query_width_per_rank(model, t), kv_width_per_rank(model, t)
    return q, kv, kv, q


def attention_products(model: ModelSpec, tokens: float, t: int = 1, sequence_parallel: bool = False
                       ) -> tuple[tuple[str, float, int, int], ...]:
    """The attention block's linear products on one tensor-parallel rank, (name, m, n, k): X[m×k]
    times W[k×n], a weight n·k of them.

    Multi-head and grouped-query attention: ``qkv`` [T, h]×[h, q/t + 2·kv_t] and ``proj``
    [T, q/t]×[q/t, h], kv_t = :func:`kv_width_per_rank` (K and V heads replicated when t exceeds
    them).

    Multi-head latent attention (``ModelSpec.is_mla``; DeepSeek-V2, arXiv 2405.04434 §2.1.2), in
    torchtitan's call order (torchtitan models/deepseek_v3/model.py ``Attention.forward``: wq_a, wq_b,
    wkv_a, wkv_b, wo), Megatron-core's modules (core_v0.15.0 multi_latent_attention.py) named:
    ``q down`` [T_d, h]×[h, r_q] and ``q up`` [T, r_q]×[r_q, H/t·(d_nope + d_rope)] (without a
    query latent one ``q`` [T, h]×[h, H/t·(d_nope + d_rope)], column-parallel), ``kv down``
    [T_d, h]×[h, r_kv + d_rope], ``kv up`` [T, r_kv]×[r_kv, H/t·(d_nope + d_v)] and ``proj``
    [T, H/t·d_v]×[H/t·d_v, h]. The down projections' weights are whole on every rank
    (``linear_q_down_proj`` and ``linear_kv_down_proj`` built with ``parallel_mode="duplicated"``),
    each rank projecting its own T/t tokens under sequence parallelism and all T without it (T_d);
    the up projections are column-parallel, the output row-parallel.
    DeepSeek-V3 at t = 1: 11.0M + 37.7M + 4.1M + 16.8M + 117.4M weights, against its grouped-query
    stand-in's 99.1M QKV and 88.1M output."""
    h = model.hidden
    q_w, k_w, v_w, o_w = cp_widths(model, t)      # the core's Q, K, V and output on this rank
    if not model.is_mla:
        return (("qkv", tokens, q_w + k_w + v_w, h), ("proj", tokens, h, o_w))
    down = tokens / t if sequence_parallel and t > 1 else tokens
    r_q, r_kv, rope = model.q_lora_rank, model.kv_lora_rank, model.qk_rope_head_dim
    q = (("q down", down, r_q, h), ("q up", tokens, q_w, r_q)) if r_q else (("q", tokens, q_w, h),)
    # kv up makes K's non-RoPE part (its RoPE part is kv down's shared key) and V
    return (*q, ("kv down", down, r_kv + rope, h),
            ("kv up", tokens, k_w - model.heads // t * rope + v_w, r_kv), ("proj", tokens, h, o_w))


def heads_split_problem(model: ModelSpec, t: int, cp: int, form: str = "a2a") -> str | None:
    """Why an all-to-all over cp ranks cannot cut this model's heads, or None: each rank takes
    heads/(t·cp) query heads and kv_heads/(t·cp) K and V heads, so both per-tensor-parallel
    counts must be multiples of cp (TransformerEngine v2.18 ``context_parallel.py``
    ``AttnFuncWithCPAndQKVOA2A.forward``: "cp_comm_type='a2a' requires num_heads % cp_size == 0 for
    Q, K, V"; DeepSpeed v0.19.5 ``deepspeed/sequence/layer.py`` asserts "Number of heads ... must be
    divisible by the sequence parallel size" on its even path). ``form``: "a2a", the all-to-all over
    the whole cp group, or "a2a+p2p", over its all-to-all groups of cp (``cp_a2a``) ranks."""
    _pos_int("t", t)
    _pos_int("cp", cp)
    who = ("the a2a form of context parallelism needs cp" if form == "a2a"
           else "the a2a+p2p form of context parallelism needs its all-to-all groups' size cp_a2a")
    # latent attention's up-projected K and V have a head per query head (:func:`cp_widths`)
    q_heads, kv_heads = model.heads // t, max((model.heads if model.is_mla else model.kv_heads) // t, 1)
    if q_heads % cp:
        return f"{who} ({cp}) to divide the heads per tensor-parallel rank ({q_heads})"
    if kv_heads % cp:
        return f"{who} ({cp}) to divide the KV heads per tensor-parallel rank ({kv_heads}); use ring or allgather"
    return None


#: Bytes a 16-bit element each reorder around Transformer Engine's all-to-alls moves (TransformerEngine
#: v2.18 ``context_parallel.py`` ``flash_attn_a2a_communicate``): towards the head cut (Q, K, V; dO)
#: one ``movedim(...).contiguous()`` copy before the send, read 2 + write 2, and after the receive
#: another with the ``index_select`` that undoes the load-balanced chunk order, 4 + 4; towards the
#: sequence cut (the output; dQ, dK, dV) the reverse, ``reorder_seq_chunks_for_a2a_after_attn``'s
#: copy and select before, one copy after.
A2A_COPY_BYTES = {"to_heads": (2 * BYTES, 4 * BYTES), "to_sequence": (4 * BYTES, 2 * BYTES)}


def a2a_tensors(model: ModelSpec, micro_batch: int, seq: int, cp: int, t: int = 1
                ) -> tuple[tuple[tuple[float, ...], tuple[float, ...]], tuple[tuple[float, ...], tuple[float, ...]]]:
    """The bytes one rank holds of each tensor the all-to-all form exchanges, per layer and
    micro-batch, 16-bit, in the order it sends them (one ``all_to_all_single`` a tensor:
    TransformerEngine v2.18 ``AttnFuncWithCPAndQKVOA2A``): forward ((Q, K, V), (O,)), backward
    ((dO,), (dQ, dK, dV)), with Q, O, dO, dQ b·(s/cp)·q_t·2 bytes and K, V, dK, dV
    b·(s/cp)·kv_t·2 (latent attention's own widths: :func:`cp_widths`). Each all-to-all sends (cp − 1)/cp of its tensor (:func:`.comm.all_to_all`).
    The backward exchanges no output: the forward keeps its head-cut output for it (v2.8 on)."""
    _pos_int("micro_batch", micro_batch)
    _pos_int("cp", cp)
    rows = micro_batch * seq / cp
    q, k, v, o = (rows * w * BYTES for w in cp_widths(model, t))
    return ((q, k, v), (o,)), ((o,), (q, k, v))


def a2a_copy_bytes(model: ModelSpec, micro_batch: int, seq: int, cp: int, t: int = 1) -> tuple[float, float]:
    """(forward, backward) bytes of the all-to-all form's reorders on the compute stream, per layer
    and micro-batch (:data:`A2A_COPY_BYTES` an element): of each exchange, the first tensor's
    reorder before its send and the last one's after its receive. The reorders between run on
    Transformer Engine's ``cp_stream`` while the next tensor is in flight, so the exchange hides
    them (``flash_attn_a2a_communicate``). Zero without context parallelism."""
    if cp <= 1:
        return 0.0, 0.0
    fwd, bwd = a2a_tensors(model, micro_batch, seq, cp, t)

    def pass_bytes(sets, directions) -> float:
        total = 0.0
        for tensors, way in zip(sets, directions):
            pre, post = A2A_COPY_BYTES[way]
            total += (tensors[0] * pre + tensors[-1] * post) / BYTES
        return total

    return pass_bytes(fwd, ("to_heads", "to_sequence")), pass_bytes(bwd, ("to_heads", "to_sequence"))


def attention_flops_per_pair(model: ModelSpec, t: int = 1) -> float:
    """Forward FLOPs of one (query, key) pair on one tensor-parallel rank: QKᵀ and A·V, 2·d each,
    over the rank's heads/t query heads (latent attention's own widths: ``ModelSpec.core_width``)."""
    _pos_int("t", t)
    return 4.0 * model.core_width / t


@dataclass(frozen=True)
class CPAttention:
    """One layer's attention for one micro-batch on the busiest context-parallel rank.

    ``attention_fwd_s``/``_bwd_s``: compute time at the pace of the slowest rank; ``comm_*_s``:
    the whole communication time, hidden or not; ``exposed_*_s``: what compute does not hide;
    ``wire_*_bytes``: bytes each rank sends; ``kv_kept_bytes``: K/V kept for the backward;
    ``transient_*_bytes``: K/V (and gradient) buffers alive during the pass beyond those."""

    kind: str
    cp: int
    flops_fwd: float
    flops_bwd: float
    attention_fwd_s: float
    attention_bwd_s: float
    comm_fwd_s: float
    comm_bwd_s: float
    exposed_fwd_s: float
    exposed_bwd_s: float
    wire_fwd_bytes: float
    wire_bwd_bytes: float
    kv_kept_bytes: float
    transient_fwd_bytes: float
    transient_bwd_bytes: float

    @property
    def exposed_s(self) -> float:
        return self.exposed_fwd_s + self.exposed_bwd_s

    @property
    def fwd_s(self) -> float:
        return self.attention_fwd_s + self.exposed_fwd_s

    @property
    def bwd_s(self) -> float:
        return self.attention_bwd_s + self.exposed_bwd_s


def block_bytes(model: ModelSpec, micro_batch: int, seq: int, cp: int, t: int = 1) -> float:
    """One rank's K and V, b·(s/cp)·2·kv_t·2 bytes: what a ring step passes on (latent attention's
    up-projected K and V: :func:`cp_widths`)."""
    _pos_int("micro_batch", micro_batch)
    _, k, v, _ = cp_widths(model, t)
    return micro_batch * (seq / cp) * (k + v) * BYTES


#: Bytes per element of one step's partial result that ring attention's merge moves: it reads the
#: step's result and the running sum and writes the sum back, 16-bit each (Transformer Engine v2.8
#: ``AttnFuncWithCPAndKVP2P``, transformer_engine/pytorch/attention/dot_product_attention/
#: context_parallel.py: the forward's ``flash_attn_fwd_out_correction``, ``out.add_(out_per_step ·
#: exp(lse_step − lse))``, jit-fused; the backward's ``dq.add_(dq_)`` and the travelling ``dkv``
#: buffer's ``dk.add_(dk_)``, ``dv.add_(dv_)``, in the inputs' dtype outside FP8). The log-sum-exp
#: merges, 4 bytes a head and token, are 1/d of it and left out.
RING_MERGE_BYTES = 3 * BYTES


def ring_merge_bytes(model: ModelSpec, micro_batch: int, seq: int, cp: int, t: int = 1) -> tuple[float, float]:
    """(forward, backward) bytes ring attention's merges of its per-step results move on the
    busiest rank for one layer and micro-batch (:data:`RING_MERGE_BYTES` an element): each of the
    cp steps merges its queries' partial output (forward) and dQ (backward), and the backward adds
    each step's dK, dV into the block that travels on. With the load-balanced split the busiest
    rank (the last) runs every step on all of its b·s/cp queries: b·s rows in all, of the rank's
    heads/t query heads (and its K, V widths for dK, dV). Zero without context parallelism."""
    if cp <= 1:
        return 0.0, 0.0
    rows = micro_batch * seq
    q, k, v, o = cp_widths(model, t)
    return rows * o * RING_MERGE_BYTES, rows * (q + k + v) * RING_MERGE_BYTES


# ---------------------------------------------------------------- PyTorch's context parallelism

#: Whose context-parallel attention a stack runs (``Framework.cp_impl``): Transformer Engine's
#: (above: the ring merges in fused 16-bit kernels, the all-gather form runs one attention over
#: the gathered keys) or PyTorch's for SDPA (torch 2.13
#: ``torch/distributed/tensor/experimental/_context_parallel/_attention.py``,
#: ``_templated_ring_attention`` and its backward), which :func:`torch_merge_bytes` and
#: :func:`torch_exposed` describe.
CP_IMPLS = ("transformer-engine", "torch-sdpa")

#: Bytes per element of PyTorch's merges and copies (torch 2.13 ``_attention.py``, BF16 inputs,
#: ``_cp_options.convert_to_f32`` true by default): a cast of a 16-bit tensor to FP32 or back,
#: read 2 + write 4 (``out.to(torch.float32)`` in ``_SDPAMerger.step``, ``.to(self._out_dtype)``
#: in ``results``, ``grad_query.to(query.dtype)``);
TORCH_CAST_BYTES = 6
#: one eager merge of a step's output into the FP32 running one, ``_SDPAMerger._merge_one``:
#: the cast (6), ``out - block_out`` (read 4 + 4, write 4), ``sigmoid(·) * (·)`` (read 4, write
#: 4; the log-sum-exp operand is 1/d of it) and ``out - (·)`` (read 4 + 4, write 4): 38;
TORCH_EAGER_MERGE_BYTES = 6 + 12 + 8 + 12
#: an FP32 accumulation of a 16-bit gradient, ``grad_query += grad_query_``: read 4 + 2, write 4;
#: compiled, a merge is the same pass (TorchInductor of torch 2.13 fuses ``_merge_one``'s ops, the
#: log-sum-exp's with them, into one kernel that reads the FP32 sum and the 16-bit step output and
#: writes the sum: its generated code under ``TORCH_LOGS=output_code``);
TORCH_ACCUM_BYTES = 10
#: an FP32 copy, read 4 + write 4 (``torch.cat`` of ``_partial_update`` and of the dK, dV sent on);
TORCH_COPY32_BYTES = 8
#: a 16-bit copy, read 2 + write 2 (``torch.cat([key.flatten(), value.flatten()])`` before each
#: rotation but the last); and a fresh FP32 buffer, write 4 (``torch.zeros_like(…, float32)``).
TORCH_COPY16_BYTES = 4
TORCH_ZEROS_BYTES = 4


def torch_merge_bytes(model: ModelSpec, micro_batch: int, seq: int, cp: int, t: int = 1,
                      compiled: bool = False) -> tuple[float, float]:
    """(forward, backward) bytes PyTorch's SDPA context parallelism moves around its cp attention
    calls on the busiest rank for one layer and micro-batch, the last rank of the load-balanced
    split (every step after the first attends all its queries). With E_q = b·(s/cp)·(heads/t)·d
    query elements and E_kv = b·(s/cp)·2·kv_t key and value ones (:func:`cp_widths`; with latent
    attention the forward's E_q counts the output's elements, H/t·d_v a token):

    forward  = E_q·(2·6 + m·(cp − 1)) + E_kv·4·(cp − 1), m = 38 eager, 10 compiled;
    backward = E_q·(4 + 10·cp + 6) + E_kv·(4 + 10 + 13·(cp − 1) + 8·cp + 6 + 4·(cp − 1)) eager,
               E_q·(2·6 + 10·(cp − 1)) + E_kv·(2·6 + 14·(cp − 1)) compiled.

    Forward: step 0's output cast to FP32, a merge per later step, the result cast back, and the
    K, V concatenated before each rotation. Backward: dQ, dK, dV zeroed in FP32; dQ accumulated
    every step; dK, dV added into the first halves of the received FP32 buffers
    (``_partial_update``: half an accumulation, then a whole FP32 copy), concatenated to be sent on
    every step, cast back at the end; the K, V concatenated as in the forward. Compiled
    (``compiled``: the stack compiles its blocks, so TorchInductor fuses each merge and
    accumulation into one pass, :data:`TORCH_ACCUM_BYTES`), the casts stay, zeroing and copies
    fold into the passes, and the K, V copies before each rotation stay. Zero without context
    parallelism."""
    if cp <= 1:
        return 0.0, 0.0
    rows = micro_batch * seq / cp
    q, k, v, o = cp_widths(model, t)
    e_o, e_q, e_kv = rows * o, rows * q, rows * (k + v)   # the outputs merged forward, dQ backward
    steps = cp - 1
    if compiled:
        fwd = e_o * (2 * TORCH_CAST_BYTES + TORCH_ACCUM_BYTES * steps)
        bwd = (e_q * (2 * TORCH_CAST_BYTES + TORCH_ACCUM_BYTES * steps)
               + e_kv * (2 * TORCH_CAST_BYTES + TORCH_ACCUM_BYTES * steps))
    else:
        fwd = e_o * (2 * TORCH_CAST_BYTES + TORCH_EAGER_MERGE_BYTES * steps)
        bwd = (e_q * (TORCH_ZEROS_BYTES + TORCH_ACCUM_BYTES * cp + TORCH_CAST_BYTES)
               + e_kv * (TORCH_ZEROS_BYTES + TORCH_ACCUM_BYTES + (TORCH_ACCUM_BYTES / 2 + TORCH_COPY32_BYTES) * steps
                         + TORCH_COPY32_BYTES * cp + TORCH_CAST_BYTES))
    return fwd + e_kv * TORCH_COPY16_BYTES * steps, bwd + e_kv * TORCH_COPY16_BYTES * steps


def torch_exposed(kind: str, step_fwd_s: tuple[float, ...], step_bwd_s: tuple[float, ...], gather_s: float,
                  hop_s: float, grad_hop_s: float) -> tuple[float, float]:
    """(forward, backward) seconds PyTorch's SDPA context parallelism leaves exposed, from the
    busiest rank's attention seconds per step (``step_fwd_s``, ``step_bwd_s``, cp of each) and
    the times of its transfers: ``gather_s`` the all-gather of every rank's K, V; ``hop_s`` one
    rank's K, V sent to the next; ``grad_hop_s`` one rank's dK, dV in FP32 (twice ``hop_s``'s
    bytes) sent to the next.

    Its rotation (``_cp_options.rotate_method``, ``kind``): "allgather" (the default,
    ``_AllGatherRotater``) launches one all-gather before step 0 and waits for it before step 1,
    so max(0, gather − step 0) is exposed; "ring" (``_AllToAllRotater``, ``set_rotate_method
    ("alltoall")``) sends the K, V on before each step's attention and waits before the next:
    Σ_{k<cp−1} max(0, hop − step k), as Transformer Engine's ring. The backward rotates K, V the
    same way again, and passes the dK, dV accumulated so far to the next rank after every step
    (always ``_AllToAllRotater``), waiting for the previous rank's after the next step's attention:
    Σ_{k≥1} max(0, grad hop − step k), and the last one, sent after the last step, in full."""
    if kind not in ("ring", "allgather"):
        raise ModelcutError(f"cp_kind {kind!r}: PyTorch's context parallelism, which this stack runs, rotates K and V as a ring or an all-gather only")
    cp = len(step_fwd_s)
    if cp <= 1:
        return 0.0, 0.0
    if kind == "allgather":
        kv_f, kv_b = max(0.0, gather_s - step_fwd_s[0]), max(0.0, gather_s - step_bwd_s[0])
    else:
        kv_f = sum(max(0.0, hop_s - c) for c in step_fwd_s[:-1])
        kv_b = sum(max(0.0, hop_s - c) for c in step_bwd_s[:-1])
    grads = sum(max(0.0, grad_hop_s - c) for c in step_bwd_s[1:]) + grad_hop_s
    return kv_f, kv_b + grads


def _a2a_exchange(model: ModelSpec, micro_batch: int, seq: int, cp: int, t: int, n: int, bw: float, alpha: float
                  ) -> tuple[float, float, float, float, float, float]:
    """The all-to-all form's exchanges of a rank's tensors (:func:`a2a_tensors`, cp ranks' cut) over n
    ranks: (forward s, backward s, forward wire bytes, backward wire bytes, its Q, K, V bytes, its
    output's bytes)."""
    fwd, bwd = a2a_tensors(model, micro_batch, seq, cp, t)
    secs = [sum(comm.all_to_all(n, x, bw, alpha) for xs in p for x in xs) for p in (fwd, bwd)]
    wire = [sum(comm.wire_bytes("all-to-all", n, x) for xs in p for x in xs) for p in (fwd, bwd)]
    return secs[0], secs[1], wire[0], wire[1], sum(fwd[0]), sum(fwd[1])


def hierarchical_ring(model: ModelSpec, *, micro_batch: int, seq: int, cp: int, a2a: int, t: int = 1,
                      **ring) -> CPAttention:
    """The hierarchical form's ring: over the cp/a2a groups, each rank holding the heads/(t·a2a)
    heads its all-to-all group handed it, so the ring form over cp/a2a ranks at tensor-parallel
    width t·a2a (module docstring; ``ring``: :func:`cp_attention`'s bw, attention_flops_per_s,
    alpha, balanced, bwd_ratio). The one place the two levels are composed: the seed model's
    :func:`cp_attention` and the default model's layer time add the all-to-all over a2a ranks to it."""
    if (why := cp_a2a_problem(cp, a2a)) is not None:
        raise ModelcutError(why)
    return cp_attention(model, micro_batch=micro_batch, seq=seq, cp=cp // a2a, kind="ring", t=t * a2a, **ring)


def cp_attention(model: ModelSpec, *, micro_batch: int, seq: int, cp: int, kind: str, bw: float,
                 attention_flops_per_s: float, t: int = 1, alpha: float = 0.0, balanced: bool = True,
                 bwd_ratio: float = BWD_RATIO, a2a: int = 1) -> CPAttention:
    """One layer's context-parallel attention for one micro-batch (module docstring).

    ``bw``: the cp group's bandwidth each way (:func:`.comm.group_bandwidth`);
    ``attention_flops_per_s``: the rate the attention kernel reaches on one rank; ``alpha``: the
    latency of one ring step or point-to-point send; ``a2a``: the hierarchical form's all-to-all
    groups' size."""
    if kind not in CP_KINDS:
        raise ModelcutError(f"cp_kind must be one of {', '.join(CP_KINDS)}, got {kind!r}")
    _pos_int("cp", cp)
    if kind == "a2a+p2p":        # the all-to-all over a ranks, then the ring over cp/a on heads/(t·a)
        ring = hierarchical_ring(model, micro_batch=micro_batch, seq=seq, cp=cp, a2a=a2a, bw=bw,
                                 attention_flops_per_s=attention_flops_per_s, t=t, alpha=alpha,
                                 balanced=balanced, bwd_ratio=bwd_ratio)
        c_f, c_b, w_f, w_b, qkv, out = _a2a_exchange(model, micro_batch, seq, cp, t, a2a, bw, alpha)
        return replace(ring, kind=kind, cp=cp, comm_fwd_s=ring.comm_fwd_s + c_f, comm_bwd_s=ring.comm_bwd_s + c_b,
                       exposed_fwd_s=ring.exposed_fwd_s + c_f, exposed_bwd_s=ring.exposed_bwd_s + c_b,
                       wire_fwd_bytes=ring.wire_fwd_bytes + w_f, wire_bwd_bytes=ring.wire_bwd_bytes + w_b,
                       transient_fwd_bytes=ring.transient_fwd_bytes + qkv,
                       transient_bwd_bytes=ring.transient_bwd_bytes + qkv + out)
    if not attention_flops_per_s > 0:
        raise ModelcutError(f"attention FLOP rate must be positive, got {attention_flops_per_s}")
    if not bwd_ratio > 0:
        raise ModelcutError(f"bwd_ratio must be positive, got {bwd_ratio}")
    if not bw > 0:
        raise ModelcutError(f"bandwidth must be positive, got {bw}")
    per_pair = micro_batch * attention_flops_per_pair(model, t)
    pairs = causal_pairs(seq, cp, balanced)
    blk = block_bytes(model, micro_batch, seq, cp, t)
    flops_fwd = max(pairs) * per_pair
    flops_bwd = bwd_ratio * flops_fwd
    kv_local = blk

    if kind == "a2a":
        # every rank runs the whole sequence's causal attention on its heads: the mean work
        flops_fwd = sum(pairs) / cp * per_pair
        att_f = flops_fwd / attention_flops_per_s
        c_f, c_b, w_f, w_b, qkv, out = _a2a_exchange(model, micro_batch, seq, cp, t, cp, bw, alpha)
        return CPAttention(
            kind=kind, cp=cp, flops_fwd=flops_fwd, flops_bwd=bwd_ratio * flops_fwd, attention_fwd_s=att_f,
            attention_bwd_s=bwd_ratio * att_f, comm_fwd_s=c_f, comm_bwd_s=c_b, exposed_fwd_s=c_f,
            exposed_bwd_s=c_b, wire_fwd_bytes=w_f, wire_bwd_bytes=w_b, kv_kept_bytes=kv_local,
            transient_fwd_bytes=qkv if cp > 1 else 0.0, transient_bwd_bytes=qkv + out if cp > 1 else 0.0)

    if kind == "allgather":
        att_f = flops_fwd / attention_flops_per_s
        ag = comm.all_gather(cp, cp * blk, bw, alpha)
        rs = comm.reduce_scatter(cp, cp * blk, bw, alpha)
        return CPAttention(
            kind=kind, cp=cp, flops_fwd=flops_fwd, flops_bwd=flops_bwd, attention_fwd_s=att_f,
            attention_bwd_s=bwd_ratio * att_f, comm_fwd_s=ag, comm_bwd_s=ag + rs, exposed_fwd_s=ag,
            exposed_bwd_s=ag + rs, wire_fwd_bytes=comm.wire_bytes("all-gather", cp, cp * blk),
            wire_bwd_bytes=comm.wire_bytes("all-gather", cp, cp * blk) + comm.wire_bytes("reduce-scatter", cp, cp * blk),
            kv_kept_bytes=kv_local, transient_fwd_bytes=cp * kv_local if cp > 1 else 0.0,
            transient_bwd_bytes=2 * cp * kv_local if cp > 1 else 0.0)

    # Ring: step k, rank i holds the block of rank (i − k) mod cp.
    hop = comm.p2p(blk, bw, alpha) if cp > 1 else 0.0
    hop_b = comm.p2p(2 * blk, bw, alpha) if cp > 1 else 0.0
    att_f = att_b = exp_f = exp_b = 0.0
    for k, busiest in enumerate(ring_step_pairs(seq, cp, balanced)):
        step = busiest * per_pair
        c_f, c_b = step / attention_flops_per_s, bwd_ratio * step / attention_flops_per_s
        att_f += c_f
        att_b += c_b
        if k < cp - 1:
            exp_f += max(0.0, hop - c_f)
            exp_b += max(0.0, hop_b - c_b)
    last = comm.p2p(blk, bw, alpha) if cp > 1 else 0.0   # dK, dV home
    exp_b += last
    return CPAttention(
        kind=kind, cp=cp, flops_fwd=flops_fwd, flops_bwd=flops_bwd, attention_fwd_s=att_f, attention_bwd_s=att_b,
        comm_fwd_s=(cp - 1) * hop, comm_bwd_s=(cp - 1) * hop_b + last, exposed_fwd_s=exp_f, exposed_bwd_s=exp_b,
        wire_fwd_bytes=(cp - 1) * blk, wire_bwd_bytes=(cp - 1) * 2 * blk + (blk if cp > 1 else 0.0),
        kv_kept_bytes=kv_local, transient_fwd_bytes=2 * blk if cp > 1 else 0.0,
        transient_bwd_bytes=4 * blk if cp > 1 else 0.0)
