"""One layer's tensor- and context-parallel communication for a micro-batch, (forward, backward)
seconds exposed, as :mod:`.layers`' module doc describes it: the tensor-parallel all-reduces, or
with sequence parallelism all-gathers and reduce-scatters of each block's column-parallel input
(:func:`tp_gather_width`) and output, hidden behind the products where the stack runs them
asynchronously; context parallelism's all-gather, ring, all-to-all and hierarchical forms, and
PyTorch's SDPA context parallelism."""

from __future__ import annotations

from ..costs import comm, context
from ..costs.kernels import BYTES, FP8_BYTES, AttentionTime, Efficiency
from ..specs import Hardware, ModelSpec
from .layer_setup import LayerSetup


def tp_gather_width(model: ModelSpec) -> int:
    """Elements a token the attention block's column-parallel inputs gather under sequence
    parallelism (and reduce their gradients over without it): the hidden width; with latent
    attention its latents and shared RoPE key, r_q + r_kv + d_rope, the down projections running
    on each rank's own tokens (h + r_kv + d_rope without a query latent: the query projection takes
    the hidden) (Megatron-core core_v0.15.0 multi_latent_attention.py ``get_query_key_value_tensors``:
    the up projections' ``ColumnParallelLinear`` gathers, and ``gather_from_sequence_parallel_region``
    of ``k_pos_emb``)."""
    if not model.is_mla:
        return model.hidden
    return model.latent_width + model.qk_rope_head_dim + (0 if model.q_lora_rank else model.hidden)


def tp_comm(model: ModelSpec, setup: LayerSetup, hw: Hardware, eff: Efficiency, col) -> tuple[float, float]:
    """Tensor-parallel collectives of the layer, (forward, backward) seconds (this module's doc and
    :mod:`.layers`')."""
    t = setup.tp
    if t == 1:
        return 0.0, 0.0
    rows = setup.micro_batch * setup.seq_len // setup.cp
    msg = rows * model.hidden * BYTES
    # each block's column-parallel input: the attention block's (:func:`tp_gather_width`), the MLP's
    ins = [rows * tp_gather_width(model) * BYTES] + [msg] * (len(col) - 1)

    def coll(kind: str, nbytes: float = msg) -> float:
        return comm.collective(kind, t, nbytes, setup.tp_bw, hw, inside=setup.tp_inside, net=eff.net)
    blocks = len(col)
    if setup.sequence_parallel:
        fp8_ag = setup.fp8 is not None and setup.fp8.gathers_fp8_activations
        ag_in = [coll("all-gather", x * FP8_BYTES / BYTES if fp8_ag else x) for x in ins]   # FP8 gathers
        rs_in = [coll("reduce-scatter", x) for x in ins]
        ag = coll("all-gather", msg * FP8_BYTES / BYTES if fp8_ag else msg)
        rs = coll("reduce-scatter")
        # Only the sharded input of QKV and MLP-up is kept; the backward gathers it again for
        # their weight gradients (Korthikanti et al. 2022 §4.2.2). Forward: each block's input
        # gathered, its output reduce-scattered. Backward: the gradient all-gather before each
        # row-parallel product, the re-gather and the reduce-scatter of each column-parallel one's
        # input gradient.
        fwd = sum(ag_in) + blocks * rs
        if setup.tp_async_backward:
            return fwd, blocks * ag + sum(max(a - dg, 0.0) + max(r - wg, 0.0)
                                          for a, r, (dg, wg) in zip(ag_in, rs_in, col))
        return fwd, blocks * ag + sum(ag_in) + sum(rs_in)
    ar_in = [coll("all-reduce", x) for x in ins]    # the column-parallel inputs' gradients
    return blocks * coll("all-reduce"), (sum(max(a - wg, 0.0) for a, (_, wg) in zip(ar_in, col))
                                         if setup.tp_async_backward else sum(ar_in))


def cp_comm(model: ModelSpec, setup: LayerSetup, hw: Hardware, eff: Efficiency, att: AttentionTime
             ) -> tuple[float, float]:
    """Context-parallel exchanges of the layer, (forward, backward) seconds exposed (this module's doc
    and :mod:`.layers`')."""
    b, s, t, cp = setup.micro_batch, setup.seq_len, setup.tp, setup.cp
    if cp == 1:
        return 0.0, 0.0
    kv_bytes = context.block_bytes(model, b, s, 1, t)    # K and V of the whole sequence
    if setup.cp_impl == "torch-sdpa":
        return _torch_cp_comm(model, setup, hw, eff, att, kv_bytes)
    if setup.cp_kind == "a2a":   # Q, K, V there and the output back; dO there and dQ, dK, dV back
        return _a2a_exchanges(model, setup, hw, eff, cp, setup.cp_local)
    if setup.cp_kind == "a2a+p2p":   # the a2a groups' exchanges, and the ring across them
        a = setup.cp_a2a
        f, bk = _a2a_exchanges(model, setup, hw, eff, a, setup.cp_a2a_local)
        ring = context.hierarchical_ring(model, micro_batch=b, seq=s, cp=cp, a2a=a, bw=setup.cp_bw * eff.net,
                                         attention_flops_per_s=_cp_step_rate(model, setup, eff, hw, att), t=t)
        return f + ring.exposed_fwd_s, bk + ring.exposed_bwd_s
    if setup.cp_kind == "ring":
        ring = context.cp_attention(model, micro_batch=b, seq=s, cp=cp, kind="ring", bw=setup.cp_bw * eff.net,
                                    attention_flops_per_s=_cp_step_rate(model, setup, eff, hw, att), t=t)
        return ring.exposed_fwd_s, ring.exposed_bwd_s
    ag = comm.collective("all-gather", cp, kv_bytes, setup.cp_bw, hw, inside=setup.cp_inside, net=eff.net)
    # the backward gathers K and V again (only the local ones are kept: :mod:`..costs.context`)
    return ag, ag + comm.collective("reduce-scatter", cp, kv_bytes, setup.cp_bw, hw, inside=setup.cp_inside,
                                    net=eff.net)


def _a2a_exchanges(model: ModelSpec, setup: LayerSetup, hw: Hardware, eff: Efficiency, n: int, local: int
                   ) -> tuple[float, float]:
    """(forward, backward) seconds of the all-to-all form's exchanges over n ranks, ``local`` of them in
    a node (:func:`..costs.context.a2a_tensors`, one all-to-all a tensor): inside a node the measured
    all-to-all curve, across nodes the node-mates' share over the links and the rest over the
    network at once, as the MoE dispatch is timed."""
    b, s, t, cp = setup.micro_batch, setup.seq_len, setup.tp, setup.cp
    if local >= n:       # a hierarchical form's group may sit in a node its cp group leaves: the links' rate
        bw = setup.cp_bw if setup.cp_inside else comm.achievable(hw.link_bw, hw)

        def one(x: float) -> float:
            return comm.collective("all-to-all", n, x, bw, hw, inside=True, net=eff.net)
    else:
        link, net = (comm.achievable(bw, hw) * eff.net for bw in (hw.link_bw, hw.net_bw))

        def one(x: float) -> float:
            return comm.all_to_all_two_level(n, x, local, link, net)
    return tuple(sum(one(x) for xs in sets for x in xs) for sets in context.a2a_tensors(model, b, s, cp, t))


def _cp_step_rate(model: ModelSpec, setup: LayerSetup, eff: Efficiency, hw: Hardware, att: AttentionTime) -> float:
    """The attention FLOP rate of the layer's kernel on one rank, its forward work over its
    forward seconds: what each step of a ring or of PyTorch's chunked attention runs at."""
    whole = context.cp_attention(model, micro_batch=setup.micro_batch, seq=setup.seq_len, cp=setup.cp,
                                 kind="allgather", bw=1.0, attention_flops_per_s=1.0, t=setup.tp)
    return whole.flops_fwd / att.fwd_math if att.fwd_math > 0 else eff.gemm * hw.peak_flops_16


def _torch_cp_comm(model: ModelSpec, setup: LayerSetup, hw: Hardware, eff: Efficiency, att: AttentionTime,
                   kv_bytes: float) -> tuple[float, float]:
    """PyTorch's SDPA context parallelism (:func:`..costs.context.torch_exposed`): its all-gather
    timed as the layer's other collectives, its K, V and FP32 dK, dV hops as point-to-point sends
    over the cp group's links, against the busiest rank's attention seconds per step."""
    b, s, t, cp = setup.micro_batch, setup.seq_len, setup.tp, setup.cp
    rate = _cp_step_rate(model, setup, eff, hw, att)
    per_pair = b * context.attention_flops_per_pair(model, t)
    fwd = tuple(p * per_pair / rate for p in context.ring_step_pairs(s, cp))
    bwd = tuple(context.BWD_RATIO * f for f in fwd)
    gather = comm.collective("all-gather", cp, kv_bytes, setup.cp_bw, hw, inside=setup.cp_inside, net=eff.net)
    blk = context.block_bytes(model, b, s, cp, t)
    bw = setup.cp_bw * eff.net
    return context.torch_exposed(setup.cp_kind, fwd, bwd, gather, comm.p2p(blk, bw),
                                 comm.p2p(2 * blk, bw))    # dK, dV in FP32: twice the 16-bit K, V
