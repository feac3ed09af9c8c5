"""The default model's per-stage costs: each virtual stage's forward, backward and weight-gradient
durations for one micro-batch, built from its layers (:mod:`.layers`), the embedding on the
first stage of each model copy and the logits and loss on the last, the communication the
framework leaves on the path, the pipeline sends, and, where ZeRO-3 reshards, the weight gathers
of every pass (:func:`.data_parallel.pass_gathers`)."""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import lru_cache
from typing import Callable

from ..costs import comm
from ..costs import fp8 as fp8_mod
from ..costs import moe as moe_mod
from ..costs.kernels import Efficiency, generation
from .. import plan as plans
from ..plan import PipelinePlan
from ..specs import Hardware, ModelSpec, Run
from ..units import BF16_BYTES
from .data_parallel import pass_gathers
from .exposure import exposed_tp
from .frameworks import Framework
from .layer_setup import LayerSetup
from .layers import LayerTime, PassTime, embedding_time, layer_time, loss_time


@dataclass
class Kernels:
    """One micro-batch's passes on one device: a dense layer, an MoE layer (if any), the
    embedding and the loss (forward, backward each)."""

    setup: LayerSetup
    dense: LayerTime
    moe: LayerTime | None
    emb: tuple[PassTime, PassTime]
    loss: tuple[PassTime, PassTime]


#: "auto", in order of preference where each is measured: cuDNN fused attention first on
#: compute capability 9.0 and later (Transformer Engine gives FusedAttention preference on Hopper+,
#: transformer_engine/pytorch/attention/dot_product_attention/utils.py ``get_attention_backend``;
#: torchtitan's SDPA backend priority is cuDNN > Flash > Efficient, torchtitan/models/attention.py),
#: then the newest FlashAttention measured on the architecture.
AUTO_ATTENTION = ("cudnn", "flash4", "flash3", "flash2")


def attention_kind(framework: Framework, hw: Hardware) -> str:
    """The attention kernel the stack runs; "auto" is :data:`AUTO_ATTENTION`'s first measured one
    (FlashAttention-2 where nothing is measured, and on the A100, where Transformer Engine runs
    FlashAttention)."""
    if framework.attention != "auto":
        return framework.attention
    measured = hw.kernels.attention if hw.kernels is not None else {}
    if generation(hw) != "ampere":
        for kind in AUTO_ATTENTION:
            if kind in measured:
                return kind
    return "flash2"


def kernels(run: Run, hw: Hardware, eff: Efficiency, framework: Framework, bw: dict[str, float]) -> Kernels:
    """Time every pass of one micro-batch (:mod:`.layers`) of ``run`` as ``framework`` resolved it
    (:meth:`.frameworks.Framework.resolve`)."""
    model, L, tr = run.model, run.layout, run.training
    gpn = run.gpus_per_node or hw.per_node
    f8 = fp8_mod.for_stack(run.training, hw, framework)
    runs_m = plans.microbatches(L, tr)        # the micro-batches of this run (one schedule run's)
    fusion, accum, accum_expert = framework.grad_accum_rule(framework.zero_stage(L), L.pp, runs_m)
    setup = LayerSetup(micro_batch=tr.micro_batch, seq_len=tr.seq_len, tp=L.tp, cp=L.cp,
                       sequence_parallel=L.sequence_parallel, recompute=tr.recompute,
                       recompute_modules=tr.selective_modules,
                       act_fp8_input=tr.activation_func_fp8_input_store,
                       attention=attention_kind(framework, hw), grad_accum_fusion=fusion,
                       grad_accum_bytes=accum, grad_accum_expert_bytes=accum_expert,
                       cross_entropy=tr.cross_entropy,
                       tp_async_backward=framework.tp_async_backward, tp_bw=bw["tp"], cp_bw=bw["cp"],
                       cp_kind=L.cp_kind, etp=L.etp,
                       fused_elementwise=framework.fused_elementwise, selective=framework.selective,
                       mcore_layers=framework.mcore_layers,
                       tp_inside=not comm.group_spans_nodes(L, "tp", gpn),
                       cp_inside=not comm.group_spans_nodes(L, "cp", gpn),
                       cp_local=comm.group_members_in_node(L, "cp", gpn), cp_a2a=L.cp_a2a or 1,
                       cp_a2a_local=comm.group_members_in_node(L, "cp_a2a", gpn) if L.cp_a2a else 1,
                       tp_overlap_split=framework.overlap.tp_comm,
                       tp_overlap_fp8_ring=framework.fp8_rs_overlap == "ring", moe_dispatch=framework.moe_dispatch,
                       cp_impl=framework.cp_impl, compiled=framework.torch_compile,
                       causal_softmax_max_seq=framework.causal_softmax_max_seq,
                       attention_unpad=framework.attention_unpad, gqa_repeat_kv=framework.gqa_repeat_kv,
                       fp8=f8, weight_cast_share=1.0 / runs_m)
    return _kernels(model, setup, hw, eff, L.ep)


@lru_cache(maxsize=4096)
def _kernels(model: ModelSpec, setup: LayerSetup, hw: Hardware, eff: Efficiency, ep: int) -> Kernels:
    """The passes of one setup, computed once (layouts that differ only in pp, dp, the schedule or
    the ZeRO stage share them; pure, so cached)."""
    return Kernels(setup, layer_time(model, setup, hw, eff),
                   layer_time(model, setup, hw, eff, moe=True, ep=ep) if model.is_moe else None,
                   embedding_time(model, setup, hw, eff), loss_time(model, setup, hw, eff))


@dataclass
class StageCosts:
    """Per virtual stage: the engine's (F, B, W) durations, the seconds per micro-batch by term
    (compute, tp, cp, all-to-all, p2p, ZeRO-3's exposed weight gathers), and the forward's and
    backward's all-to-all; ``tau`` is one pipeline send."""

    durations: list[tuple[float, float, float]]
    parts: list[tuple[float, float, float, float, float, float]]
    a2a_fb: list[tuple[float, float]]
    tau: float


def a2a_time(run: Run, hw: Hardware, eff: Efficiency, fw: Framework) -> float:
    """An MoE layer's dispatch and combine (and expert-tensor-parallel gather and scatter) per
    pass: the ep group's node-mates over the links, the rest over the network (:func:`.moe.moe_comm`)."""
    model, L, tr = run.model, run.layout, run.training
    if not model.is_moe:
        return 0.0
    gpn = run.gpus_per_node or hw.per_node
    mc = moe_mod.moe_comm(model, tr.micro_batch * tr.seq_len / L.cp, ep=L.ep, tp=L.tp, etp=L.etp,
                          link_bw=comm.achievable(hw.link_bw, hw) * eff.net,
                          net_bw=comm.achievable(hw.net_bw, hw) * eff.net,
                          local=comm.group_members_in_node(L, "ep", gpn),
                          node_dedup=fw.moe_dispatch == "deepep")
    return mc.a2a_fwd_s + mc.etp_s


def moe_a2a(lt: LayerTime, a2a: float, recompute: str, framework: Framework, hw: Hardware) -> tuple[float, float]:
    """An MoE layer's all-to-all seconds on the compute stream per micro-batch, (forward, backward
    with its recomputation), from one pass's dispatch and combine ``a2a`` (:func:`a2a_time`): the
    backward's are the forward's transposes and a full recomputation repeats the forward's. Where
    the stack runs the shared experts beside them (``shared_expert_overlap``) each pass's
    all-to-all hides the shared products it covers (:func:`..costs.moe.shared_overlap_saving`:
    the forward's, the backward's, the recomputed forward's). The one rule the pipeline's stages
    and ZeRO-3's units both read."""
    full = recompute == "full"
    f, b = a2a, (2 if full else 1) * a2a
    if framework.shared_expert_overlap and a2a > 0:
        sms = moe_mod.DISPATCH_SMS[framework.moe_dispatch]

        def hidden(shared_s: float) -> float:     # what one pass's all-to-all hides
            return moe_mod.shared_overlap_saving(shared_s, a2a, sms, hw.sms)
        shared_f, shared_b = lt.shared
        f -= hidden(shared_f)
        b -= hidden(shared_b) + (hidden(shared_f) if full else 0.0)
    return f, b


Terms = tuple[float, float, float, float]   # compute, exposed tp, cp, all-to-all


@dataclass
class UnitCosts:
    """One micro-batch's pass through each kind of unit on one device, by term (:data:`Terms`):
    ``layers[False]``/``layers[True]`` a dense and an MoE layer as (forward, backward with its
    recomputation, weight-gradient seconds), None where the model has no MoE layer; ``cost``
    turns a pass into (compute, exposed tp, cp). What :func:`stage_costs` sums per stage and
    :func:`.bounds.lower_bound` per device."""

    layers: dict[bool, tuple[Terms, Terms, float] | None]
    emb: tuple[Terms, Terms]
    loss: tuple[Terms, Terms]
    cost: Callable[[PassTime], tuple[float, float, float]]
    kept: dict[bool, tuple[Terms, Terms, float] | None] | None = None   # layers not recomputed (block method)


def unit_costs(run: Run, hw: Hardware, eff: Efficiency, framework: Framework, k: Kernels) -> UnitCosts:
    """Per pass: compute, plus the tensor-parallel time the framework leaves exposed, plus context
    parallelism's; MoE layers add their all-to-all (:func:`moe_a2a`)."""
    ov = framework.overlap
    a2a = a2a_time(run, hw, eff, framework)

    def cost(pt: PassTime) -> tuple[float, float, float]:
        return pt.compute, exposed_tp(pt.tp, pt.gemm, ov.tp_comm), pt.cp

    def layer_cost(lt: LayerTime, is_moe: bool, recompute: str):
        fc = cost(lt.fwd)
        bc = tuple(x + y for x, y in zip(cost(lt.bwd), cost(lt.recompute)))
        a_f, a_b = moe_a2a(lt, a2a, recompute, framework, hw) if is_moe else (0.0, 0.0)
        return fc + (a_f,), bc + (a_b,), lt.wgrad

    def costs(recompute: str, take: Callable[[LayerTime], LayerTime]):
        return {False: layer_cost(take(k.dense), False, recompute),
                True: layer_cost(take(k.moe), True, recompute) if k.moe is not None else None}

    partial = run.training.partial_recompute
    return UnitCosts(costs(run.training.recompute, lambda lt: lt),
                     (cost(k.emb[0]) + (0.0,), cost(k.emb[1]) + (0.0,)),
                     (cost(k.loss[0]) + (0.0,), cost(k.loss[1]) + (0.0,)), cost,
                     costs("none", not_recomputed) if partial else None)


def layer_kinds(run: Run, st, uc: UnitCosts) -> tuple[tuple[int, bool, tuple[Terms, Terms, float] | None], ...]:
    """A stage's layers as (count, MoE, that layer's (forward, backward, weight-gradient) terms),
    always four, in this order: dense layers at ``uc.layers``, dense at ``uc.kept``, MoE at
    ``uc.layers``, MoE at ``uc.kept``. Where full recomputation covers only some layers (the block
    method, every k-th layer: :meth:`..plan.Stage.recomputed`) the recomputed ones are at
    ``uc.layers`` and the rest at ``uc.kept``; otherwise every layer is at ``uc.layers``. The one
    count the stages' durations and the lower bound read."""
    return tuple((n, moe, lc) for n, moe, lc in zip(kind_counts(run, st, uc), (False, False, True, True),
                                                    layer_tables(uc)))


def kind_counts(run: Run, st, uc: UnitCosts) -> tuple[int, int, int, int]:
    """How many of a stage's layers :func:`layer_kinds` puts in each of its four entries (dense
    recomputed as the run says, dense kept whole, MoE recomputed, MoE kept whole): the counts alone,
    which the lower bound reads for every stage of every candidate."""
    if uc.kept is None:
        return st.dense_layers, 0, st.moe_layers, 0
    r_d, r_m = st.recomputed(run.model, run.training)
    return r_d, st.dense_layers - r_d, r_m, st.moe_layers - r_m


def layer_tables(uc: UnitCosts) -> tuple[tuple[Terms, Terms, float] | None, ...]:
    """The four per-layer cost entries :func:`layer_kinds` counts, in its order: dense recomputed as
    the run says, dense kept whole, MoE recomputed, MoE kept whole (None where there is none)."""
    kept = uc.kept or {}
    return uc.layers[False], kept.get(False), uc.layers[True], kept.get(True)


def not_recomputed(lt: LayerTime) -> LayerTime:
    """A layer of a fully recomputing run that the block method leaves whole
    (:class:`..specs.Training` ``recompute_layers``): its passes without the recomputed forward."""
    return replace(lt, recompute=PassTime())


def send_time(run: Run, hw: Hardware, eff: Efficiency, bw: dict[str, float]) -> float:
    """One pipeline send, Megatron's scatter/gather (Narayanan et al. 2021 §4.1): each tp rank
    sends 1/t of the activation over its own link, then an all-gather inside the node; with
    sequence parallelism the activation is already cut t ways."""
    L, tr = run.layout, run.training
    if L.pp == 1:
        return 0.0
    act = tr.micro_batch * (tr.seq_len // L.cp) * run.model.hidden * BF16_BYTES
    tau = comm.p2p(act / L.tp, bw["pp"] * eff.net)
    if L.tp > 1 and not L.sequence_parallel:
        inside = not comm.group_spans_nodes(L, "tp", run.gpus_per_node or hw.per_node)
        tau += comm.collective("all-gather", L.tp, act, bw["tp"], hw, inside=inside, net=eff.net)
    return tau


def exchange_time(tau: float, framework: Framework) -> float:
    """What a blocking exchange between neighbouring stages holds both devices for: one send's
    time ``tau`` where the stack moves the exchange's send and receive together (Megatron-LM:
    ``send_forward_recv_backward`` and ``send_backward_recv_forward`` post both in one
    ``batch_isend_irecv``), twice it where it sends and then receives (``p2p_sequential``).

    DeepSpeed's pipeline engine runs each step of its ``TrainSchedule`` as blocking calls, one
    after the other, before the step's pass: a backward step ``SendActivation`` of the previous
    forward's output, then ``RecvGrad``; a forward step ``RecvActivation``, then ``SendGrad``
    (microsoft/DeepSpeed deepspeed/runtime/pipe/schedule.py ``TrainSchedule.steps``, the same
    order from v0.3.13 through v0.6.4; ``p2p.send`` and ``p2p.recv``: a two-rank ``dist.broadcast``
    each way up to v0.5.3, from v0.5.4 ``dist.send``/``dist.recv`` on PyTorch 1.8 or later, each
    waited before the next). Its steps run each stage's passes in 1F1B's order
    (tests/test_deepspeed_pipe.py), so the schedule is 1F1B's and only the exchange costs twice as
    long: per micro-batch a middle stage makes two exchanges of two transfers, where Megatron-LM's
    make two of one."""
    return 2 * tau if framework.p2p_sequential else tau


def stage_costs(run: Run, hw: Hardware, eff: Efficiency, framework: Framework, plan: PipelinePlan,
                k: Kernels, bw: dict[str, float]) -> StageCosts:
    """Every stage's durations (module doc). Per pass: compute, plus the tensor-parallel time the
    framework leaves exposed, plus context parallelism's; MoE layers add their all-to-all (twice
    in the backward with full recomputation); blocking exchanges hold both devices
    (:func:`exchange_time`)."""
    uc = unit_costs(run, hw, eff, framework, k)
    tau = send_time(run, hw, eff, bw)
    blocking = plan.p > 1 and not framework.p2p_overlapped(plan.v)
    held = exchange_time(tau, framework)
    out = StageCosts([], [], [], tau)
    sums = []
    units = []   # per stage: each unit's forward seconds (forward order), backward seconds (backward order)
    for st in plan.stages:
        fsum, bsum, w = [0.0] * 4, [0.0] * 4, 0.0
        f_units: list[float] = []
        b_units: list[float] = []
        for cnt, is_moe, lc in layer_kinds(run, st, uc):
            if cnt == 0 or lc is None:
                continue
            fc, bc, wg = lc
            fsum = [x + cnt * y for x, y in zip(fsum, fc)]
            bsum = [x + cnt * y for x, y in zip(bsum, bc)]
            w += cnt * wg
            f_units += [sum(fc)] * cnt           # dense layers come first in the forward
            b_units = [sum(bc)] * cnt + b_units  # and last in the backward
        for present, (fc, bc), first in ((st.embedding, uc.emb, True), (st.loss, uc.loss, False)):
            if present:
                fsum = [x + y for x, y in zip(fsum, fc)]
                bsum = [x + y for x, y in zip(bsum, bc)]
                f_units = [sum(fc)] + f_units if first else f_units + [sum(fc)]
                b_units = b_units + [sum(bc)] if first else [sum(bc)] + b_units
        sums.append((fsum, bsum, w))
        units.append((f_units, b_units))
    gathers = pass_gathers(run, hw, eff, framework, plan, units, bw)
    for st, (fsum, bsum, w), (g_f, g_b) in zip(plan.stages, sums, gathers):
        p2p_f = held if blocking and not st.loss else 0.0
        p2p_b = held if blocking and not st.embedding else 0.0
        F, B = sum(fsum) + p2p_f + g_f, sum(bsum) + p2p_b + g_b
        out.parts.append((fsum[0] + bsum[0], fsum[1] + bsum[1], fsum[2] + bsum[2], fsum[3] + bsum[3], p2p_f + p2p_b,
                          g_f + g_b))
        out.a2a_fb.append((fsum[3], bsum[3]))
        if plan.weight_apart:
            w = min(w, B)
            out.durations.append((F, B - w, w))
        else:
            out.durations.append((F, B, 0.0))
    return out
