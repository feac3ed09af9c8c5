"""modelcut's default training-step model: kernels from their shapes, the pipeline simulated,
communication exposed only where the framework does not overlap it.

One optimizer step of a run on some hardware, built bottom-up:

1. **Per layer, per micro-batch, per device** (:mod:`.layer_time`): every matrix product from
   its (m, n, k) with tile and wave quantization, memory-bound kernels from their bytes,
   the attention kernel the framework runs, recomputation as what it re-executes, the
   tensor- and context-parallel collectives; the embedding on the first virtual stage, the
   logits and loss on the last.
2. **Pipeline**: each virtual stage's forward and backward durations (whole layers per stage
   as :func:`.stepmodel.stage_layers` lays them out, so the first and last stages are
   heavier or lighter as they really are) go through the discrete-event engine for the
   run's schedule (interleaved when v > 1, else 1F1B). Pipeline sends either hold both
   devices (blocking, added to the ops) or travel as latency between them (asynchronous).
3. **Data parallelism**: each layer's gradients become ready when its last backward ends (read
   off the simulated trace); they are all-reduced (reduce-scattered with sharded optimizer
   states) on one communication stream, behind the backward when the framework overlaps it,
   after the flush when not (:mod:`.overlap`). ZeRO-3/FSDP without a pipeline runs the
   layers as a compute stream waiting on a prefetching all-gather stream.
4. **Optimizer step**: memory-bound over the parameters this device updates
   (:data:`OPTIMIZER_BYTES` per parameter).

Step time T = the slowest device's end of compute + its exposed communication + the
optimizer. Reported TFLOP/s per GPU = F / (n·T) with F counted as the seed mode counts it
(:func:`.flops.executed_flops`: eq. 3 with full recomputation, PaLM's 6N + 12·l·s·d
otherwise), so the two modes compare on the same scale.

The three constants (:class:`.kernels.Efficiency`) come from a fitted hardware profile
(``modelcut calibrate``); the framework preset (:data:`.overlap.FRAMEWORKS`) says what is
overlapped and which kernels run.
"""

from __future__ import annotations

from dataclasses import dataclass, replace
from functools import lru_cache

from . import comm, flops, moe as moe_mod
from .engine import Timing, simulate
from .errors import ModelcutError
from .kernels import BYTES, Efficiency, generation, mem_time
from .layer_time import LayerSetup, LayerTime, PassTime, dense_linears, embedding_time, layer_time, loss_time
from .overlap import Framework, exposed_after, exposed_tp, framework as get_framework, prefetch_timeline
from .schedules import DEFAULT_CHUNKS, build
from .specs import Hardware, Run
from .stepmodel import Breakdown, Prediction, check_run, microbatches, pipeline_slots, stage_layers

#: Bytes of HBM traffic per parameter of a mixed-precision Adam step (Megatron-LM's
#: ``Float16OptimizerWithFloat16Params``, apex ``FusedAdam`` and ``multi_tensor_apply``):
#: copy the 16-bit gradient into the fp32 main gradient (read 2, write 4), unscale and check
#: for inf/nan (read 4, write 4), the gradient norm (read 4), Adam (read parameter, gradient,
#: m, v: 16; write parameter, m, v: 12), copy the fp32 parameter back to 16 bits (read 4,
#: write 2), zero the gradient buffers (write 4): 6 + 8 + 4 + 28 + 6 + 4 = 56.
OPTIMIZER_BYTES = 56.0
#: The part of it that follows the optimizer states when they are sharded (ZeRO-1/2/3, the
#: distributed optimizer): unscale, norm, Adam and the copy back, 8 + 4 + 28 + 6 = 46; the
#: rest (gradient copy and zeroing, 10) stays with the device's local gradients.
OPTIMIZER_SHARDED_BYTES = 46.0


@dataclass
class DefaultBreakdown(Breakdown):
    """The seed's breakdown plus the optimizer step; sums to the step time."""

    optimizer_s: float = 0.0

    @property
    def total_s(self) -> float:
        return super().total_s + self.optimizer_s


@dataclass
class Settings:
    """The settings a prediction used (for the error budget and the report)."""

    framework: str
    micro_batch: int
    vpp: int
    recompute: str
    overlap: dict


# ---------------------------------------------------------------- helpers

#: NCCL's own latency model for ring collectives (NCCL 2.8-2.9, ``src/graph/tuning.cc``, the
#: release of the 2021 runs; Ring/Simple, the protocol of large messages): a base latency of
#: 8.4 µs per collective plus, per ring step, 3.4 µs over NVLink or 9.6 µs over the network
#: (``baseLat`` and ``hwLat``; ``latencies = baseLat + (nsteps − nInterSteps)·intraLat +
#: nInterSteps·interLat`` with nsteps = n − 1 and nInterSteps = nodes − 1 for an all-gather or
#: reduce-scatter). Documented figures, not fitted.
NCCL_RING_BASE_S = 8.4e-6
NCCL_RING_STEP_NVLINK_S = 3.4e-6
NCCL_RING_STEP_NET_S = 9.6e-6


def ring_alpha(n: int, members_per_node: int) -> float:
    """Per-step latency α of an n-rank ring with ``members_per_node`` ranks in each node, such
    that (n − 1)·α is NCCL's latency of one all-gather or reduce-scatter
    (:data:`NCCL_RING_BASE_S`): α = (base + (n − nodes)·α_nvlink + (nodes − 1)·α_net)/(n − 1),
    nodes = ⌈n / members_per_node⌉. An all-reduce (2(n − 1) steps) pays it twice."""
    if n <= 1:
        return 0.0
    k = max(1, min(members_per_node, n))
    nodes = -(-n // k)
    return (NCCL_RING_BASE_S + (n - nodes) * NCCL_RING_STEP_NVLINK_S
            + (nodes - 1) * NCCL_RING_STEP_NET_S) / (n - 1)


def _layer_params_local(run: Run, moe: bool) -> float:
    """Weights of one layer on one device (tensor-parallel cut; experts cut over ep)."""
    model, L = run.model, run.layout
    p = flops.layer_params(model, moe)
    if moe:
        expert = model.experts * flops.mlp_params(model, flops.expert_width(model))
        return (p - expert) / L.tp + expert / (L.ep * (L.etp or L.tp))
    return p / L.tp


def _bandwidths(run: Run, hw: Hardware, fw: Framework) -> dict[str, float]:
    """Per-accelerator bandwidth each way of each group's traffic: tp, cp and pp exchanges are
    bounded by one hop (:func:`.comm.group_bandwidth`); the data-parallel collectives are rings
    over all the group's network ports (:func:`.comm.collective_bandwidth`); each at the share
    of line rate NCCL's own tests reach on that kind of link (:func:`.comm.achievable`), which
    the fitted ``net`` then scales."""
    gpn = run.gpus_per_node or hw.per_node
    L = run.layout
    out = {dim: comm.achievable(comm.group_bandwidth(L, dim, hw, gpn), hw) for dim in ("tp", "cp", "pp")}
    out["dp"] = comm.achievable(comm.collective_bandwidth(L, ("cp", "dp"), hw, gpn, multi_nic=fw.multi_nic_rings), hw)
    return out


def _dp_alpha(run: Run, hw: Hardware) -> float:
    """:func:`ring_alpha` of the data-parallel (× context-parallel) group."""
    L = run.layout
    gpn = run.gpus_per_node or hw.per_node
    return ring_alpha(L.dp * L.cp, comm.group_members_in_node(L, ("cp", "dp"), gpn))


def _choose_v(run: Run) -> int:
    """Chunks per device: the layout's ``vpp``, else the named schedule's default, else 1."""
    L = run.layout
    if L.vpp is not None:
        return L.vpp
    if L.schedule is not None:
        return DEFAULT_CHUNKS[L.schedule]
    return 1


@lru_cache(maxsize=64)
def _build(name: str, p: int, m: int, v: int):
    return build(name, p, m, v)


@lru_cache(maxsize=64)
def _homes(name: str, p: int, m: int, v: int) -> dict[int, int]:
    return _build(name, p, m, v).stage_device()


# ---------------------------------------------------------------- the model

def predict(run: Run, hw: Hardware, eff: Efficiency, fw: str | Framework | None = None,
            overlap: dict | None = None) -> Prediction:
    """One run's step time under the default model (module doc).

    ``fw``: a framework preset name or :class:`.overlap.Framework` (default: a current
    Megatron-core stack); ``overlap``: option overrides, e.g. {"grad_reduce": False}."""
    check_run(run)
    framework = get_framework(fw)
    if overlap:
        framework = replace(framework, overlap=framework.overlap.with_options(**overlap))
    ov = framework.overlap
    model, L, tr = run.model, run.layout, run.training
    t, cp, p, d = L.tp, L.cp, L.pp, L.dp
    b, s, l = tr.micro_batch, tr.seq_len, model.layers
    m = microbatches(run)
    v = _choose_v(run)
    notes: list[str] = [f"framework {framework.name}"]
    if p == 1 and v > 1:
        v = 1
    name = L.schedule or ("interleaved" if v > 1 else "1f1b")
    if name == "interleaved" and m < p:
        raise ModelcutError(f"interleaved schedule needs micro-batches m ({m}) >= pp ({p})")
    S = p * v
    if S > l + 2 and name != "dualpipe":   # DualPipe's 2p stages are two copies of p
        raise ModelcutError(f"pp × vpp = {S} chunks for {l} layers: more than layers + 2")
    if (s // cp) * cp != s:
        raise ModelcutError(f"cp ({cp}) must divide seq_len ({s})")
    bw = _bandwidths(run, hw, framework)
    attention = framework.attention
    if attention == "auto":
        attention = "cudnn" if generation(hw) == "hopper" else "flash2"
    setup = LayerSetup(micro_batch=b, seq_len=s, tp=t, cp=cp, sequence_parallel=L.sequence_parallel,
                       recompute=tr.recompute, attention=attention,
                       grad_accum_fusion=framework.grad_accum_fusion,
                       fused_cross_entropy=framework.fused_cross_entropy,
                       tp_async_backward=framework.tp_async_backward, tp_bw=bw["tp"], cp_bw=bw["cp"],
                       cp_kind=L.cp_kind or framework.cp_kind, etp=L.etp,
                       fused_elementwise=framework.fused_elementwise)
    dense = layer_time(model, setup, hw, eff)
    moe_lt = layer_time(model, setup, hw, eff, moe=True, ep=L.ep) if model.is_moe else None
    emb_f, emb_b = embedding_time(model, setup, hw, eff)
    loss_f, loss_b = loss_time(model, setup, hw, eff)

    if L.zero == 3 and p == 1:
        return _zero3(run, hw, eff, framework, dense, moe_lt, (emb_f, emb_b), (loss_f, loss_b), m, bw, notes)

    # Per-pass exposed time: compute + the communication the framework leaves on the path.
    def cost(pt: PassTime) -> tuple[float, float, float]:
        tp = exposed_tp(pt.tp, pt.gemm, ov.tp_comm)
        return pt.compute, tp, pt.cp

    # An MoE layer's dispatch and combine (and expert-tensor-parallel gather and scatter), per
    # pass: the ep group's node-mates over the links, the rest over the network (moe.moe_comm).
    a2a = 0.0
    if model.is_moe:
        gpn = run.gpus_per_node or hw.per_node
        mc = moe_mod.moe_comm(model, b * s / cp, ep=L.ep, tp=t, etp=L.etp,
                              link_bw=comm.achievable(hw.link_bw, hw) * eff.net,
                              net_bw=comm.achievable(hw.net_bw, hw) * eff.net,
                              local=comm.group_members_in_node(L, "ep", gpn))
        a2a = mc.a2a_fwd_s + mc.etp_s

    def layer_cost(lt: LayerTime, is_moe: bool) -> tuple[tuple[float, ...], tuple[float, ...], float]:
        fc = cost(lt.fwd)
        bc = tuple(x + y for x, y in zip(cost(lt.bwd), cost(lt.recompute)))
        # forward; backward (the transposed exchanges) and, with full recomputation, the forward's again
        n_bwd = 2 if tr.recompute == "full" else 1
        return fc + (a2a if is_moe else 0.0,), bc + (n_bwd * a2a if is_moe else 0.0,), lt.wgrad

    # DualPipe: two copies of the p-stage split, the second starting the model again
    copies = 2 if name == "dualpipe" else 1
    layers_of = pipeline_slots(name, l, p, v)[0] if name == "dualpipe" else stage_layers(l, S)
    first_moe = model.dense_layers if model.is_moe else l
    emb_stages = {0, S // 2} if copies == 2 else {0}
    loss_stages = {S // 2 - 1, S - 1} if copies == 2 else {S - 1}
    # p2p per transfer: Megatron's scatter/gather (Narayanan et al. 2021 §4.1): each tp rank
    # sends 1/t of the activation over its own link, then an all-gather inside the node;
    # with sequence parallelism the activation is already cut t ways.
    tau = 0.0
    if p > 1:
        act = b * (s // cp) * model.hidden * BYTES
        tau = comm.p2p(act / t, bw["pp"] * eff.net)
        if t > 1 and not L.sequence_parallel:
            tau += comm.all_gather(t, act, bw["tp"] * eff.net)
    split = name in ("zb-h1", "zbv")
    parts: list[tuple[float, ...]] = []     # per stage, per micro-batch: compute, tp, cp, a2a, p2p
    durations: list[tuple[float, float, float]] = []
    a2a_fb: list[tuple[float, float]] = []  # per stage: the forward's and the backward's all-to-all
    start = 0
    for c, n_c in enumerate(layers_of):
        if copies == 2 and c == S // 2:
            start = 0
        n_moe = max(0, start + n_c - max(start, first_moe))
        n_dense = n_c - n_moe
        fsum = [0.0] * 4
        bsum = [0.0] * 4
        w = 0.0
        for cnt, lt, is_moe in ((n_dense, dense, False), (n_moe, moe_lt, True)):
            if cnt == 0 or lt is None:
                continue
            fc, bc, wg = layer_cost(lt, is_moe)
            fsum = [x + cnt * y for x, y in zip(fsum, fc)]
            bsum = [x + cnt * y for x, y in zip(bsum, bc)]
            w += cnt * wg
        if c in emb_stages:
            fsum = [x + y for x, y in zip(fsum, cost(emb_f) + (0.0,))]
            bsum = [x + y for x, y in zip(bsum, cost(emb_b) + (0.0,))]
        if c in loss_stages:
            fsum = [x + y for x, y in zip(fsum, cost(loss_f) + (0.0,))]
            bsum = [x + y for x, y in zip(bsum, cost(loss_b) + (0.0,))]
        p2p_f = tau if (p > 1 and not ov.p2p_async and c not in loss_stages) else 0.0
        p2p_b = tau if (p > 1 and not ov.p2p_async and c not in emb_stages) else 0.0
        F = sum(fsum) + p2p_f
        B = sum(bsum) + p2p_b
        parts.append((fsum[0] + bsum[0], fsum[1] + bsum[1], fsum[2] + bsum[2], fsum[3] + bsum[3], p2p_f + p2p_b))
        a2a_fb.append((fsum[3], bsum[3]))
        if split:
            w = min(w, B)
            durations.append((F, B - w, w))
        else:
            durations.append((F, B, 0.0))
        start += n_c

    sched = _build(name, p, m, v)
    unit = _overlapped_unit(durations, a2a_fb) if sched.units and any(a or b for a, b in a2a_fb) else None
    trace = simulate(sched, Timing(stage_durations=durations, p2p=tau if ov.p2p_async else 0.0, overlap=unit),
                     validate=False)
    home = _homes(name, p, m, v)

    # Data-parallel gradient reduction, per device, from the trace.
    dp_group = d * cp
    sharded = L.zero >= 1 or framework.dist_optimizer
    dp_bw = bw["dp"] * eff.net
    grad_b = framework.grad_bytes
    alpha = _dp_alpha(run, hw)

    def reduce_time(params: float) -> float:
        nbytes = params * grad_b
        if sharded:
            return comm.reduce_scatter(dp_group, nbytes, dp_bw, alpha)
        return comm.ring_allreduce(dp_group, nbytes, dp_bw, alpha)

    def gather_time(params: float) -> float:
        return comm.all_gather(dp_group, params * BYTES, dp_bw, alpha)

    p_dense = _layer_params_local(run, False)
    p_moe = _layer_params_local(run, True) if model.is_moe else 0.0
    p_emb = model.vocab * model.hidden / t
    p_pos = (model.max_seq or 0) * model.hidden if model.learned_positions else 0.0
    tied_extra = 0.0
    if model.tied_embeddings and p > 1:
        tied_extra = comm.ring_allreduce(2, p_emb * grad_b, bw["pp"] * eff.net)

    ends = [float(e[-1]) if e else 0.0 for e in trace.ends]
    # Last backward of each stage: its start and end (a device's list runs in time order).
    last_b: dict[int, tuple[float, float]] = {}
    for dev, order in enumerate(sched.orders):
        starts, stops = trace.starts[dev], trace.ends[dev]
        for i in range(len(order) - 1, -1, -1):
            op = order[i]
            if op.kind != "F" and op.stage not in last_b:
                last_b[op.stage] = (float(starts[i]), float(stops[i]))
                if len(last_b) == S:
                    break
    step_ends = []
    per_device = []
    for dev in range(p):
        stages = [c for c in range(S) if home[c] == dev]
        requests = []
        params_dev = 0.0
        start_layer = {c: sum(layers_of[:c]) % l for c in stages}
        for c in stages:
            st, en = last_b[c]
            n_c = layers_of[c]
            units: list[float] = []
            for j in range(n_c):
                idx = start_layer[c] + j
                units.append(p_moe if (model.is_moe and idx >= first_moe) else p_dense)
            if c in loss_stages and not model.tied_embeddings:
                units.append(p_emb)
            if c in loss_stages and model.tied_embeddings and p > 1:
                units.append(p_emb)      # Megatron keeps a copy of the tied output weights on the last stage
            if c in emb_stages:
                units.append(p_emb + p_pos)
            params_dev += sum(units)
            # Gradients of the chunk's units become ready through its last backward, last layer first.
            k = len(units)
            for j, u in enumerate(reversed(units)):
                requests.append((st + (en - st) * (j + 1) / k, reduce_time(u)))
        exp_dp = exposed_after(ends[dev], requests, ov.grad_reduce) if dp_group > 1 else 0.0
        tied = tied_extra if (dev in (0, p - 1) and p > 1) else 0.0
        # Optimizer over this device's parameters (states sharded over dp·cp when sharded).
        shard = dp_group if sharded else 1
        opt = mem_time(params_dev * ((OPTIMIZER_BYTES - OPTIMIZER_SHARDED_BYTES) + OPTIMIZER_SHARDED_BYTES / shard),
                       hw, eff)
        gather = 0.0
        if sharded and dp_group > 1:
            g = gather_time(params_dev)
            # Gathered ahead of use: only the first layer's share waits, the rest hides behind the forward.
            n_units = max(1, sum(layers_of[c] for c in stages))
            gather = g / n_units if ov.param_gather else g
        end = ends[dev] + exp_dp + tied + opt + gather
        step_ends.append(end)
        per_device.append((exp_dp + tied + gather, opt))

    T = max(step_ends)
    # The breakdown of the busiest device (the most op time; with uneven stages, e.g. an MoE
    # model's dense first layers, the device that ends last may be a light one that mostly
    # waits); its idle time until the step ends is the bubble. (DualPipe: m/2 micro-batches
    # pass each stage.)
    crit = max(range(p), key=lambda i: (float(trace.busy(i)), step_ends[i]))
    mine = [parts[c] for c in range(S) if home[c] == crit]
    sums = [m / copies * sum(x[i] for x in mine) for i in range(5)]
    dp_exp, opt_crit = per_device[crit]
    hidden = 0.0   # all-to-all hidden inside the device's overlapped F&B units
    if unit is not None:
        kind = {"F": 0, "B": 1, "W": 2}
        for i, k in sched.units[crit]:
            d = [durations[op.stage][kind[op.kind]] for op in sched.orders[crit][i:i + k]]
            hidden += sum(d) - unit(*d)
        notes.append(f"{name}: all-to-all hidden behind the paired chunk's compute, "
                     f"{hidden / max(sums[3], 1e-30):.0%} of the busiest device's")
    bd = DefaultBreakdown(compute_s=sums[0], tp_s=sums[1], cp_s=sums[2], p2p_s=sums[4], bubble_s=0.0,
                          dp_s=dp_exp, a2a_s=max(sums[3] - hidden, 0.0), optimizer_s=opt_crit)
    bd.bubble_s = max(T - bd.total_s, 0.0)
    if layers_of and len(set(layers_of)) > 1:
        notes.append(f"uneven stages: {min(layers_of)} to {max(layers_of)} layers per chunk")
    return _finish(run, hw, eff, T, bd, m, v, name, notes, layers_of, framework)


def _overlapped_unit(durations: list[tuple[float, float, float]], a2a_fb: list[tuple[float, float]]):
    """Duration of DualPipe's overlapped F&B unit (DeepSeek-V3 report §3.2.1, Fig. 4: one chunk's
    dispatch and combine run while the other chunk computes, on separate SMs): the compute of the
    pair and the all-to-alls of the pair as two streams, max(compute, all-to-all). The engine passes
    the unit's op durations (F, B, W); each op's all-to-all is looked up by its stage's duration."""
    f_a2a = {d[0]: a for d, (a, _) in zip(durations, a2a_fb)}
    b_a2a = {d[1]: a for d, (_, a) in zip(durations, a2a_fb)}

    def unit(*d: float) -> float:
        comm_s = f_a2a.get(d[0], 0.0) + (b_a2a.get(d[1], 0.0) if len(d) > 1 else 0.0)
        total = sum(d)
        return max(total - comm_s, comm_s)
    return unit


def _finish(run: Run, hw: Hardware, eff: Efficiency, T: float, bd: Breakdown, m: int, v: int, name: str,
            notes: list[str], layers_of, framework: Framework) -> Prediction:
    tr = run.training
    convention = "megatron" if tr.recompute == "full" else "palm"
    F = flops.executed_flops(run.model, tr, convention)
    n = run.layout.gpus
    pred = Prediction(step_time_s=T, tflops_per_gpu=F / (n * T) / 1e12, mfu=F / (n * T * hw.peak_flops_16),
                      breakdown=bd, flops_per_step=F, microbatches=m, vpp=v, schedule=name, notes=notes,
                      mode="default", eta=eff.gemm, stage_layers=tuple(layers_of), pipeline_method="simulation")
    return pred


def _zero3(run: Run, hw: Hardware, eff: Efficiency, fw: Framework, dense: LayerTime,
           moe_lt: LayerTime | None, emb: tuple[PassTime, PassTime], loss: tuple[PassTime, PassTime], m: int,
           bw: dict, notes: list[str]) -> Prediction:
    """ZeRO-3 / FSDP without a pipeline: a compute stream of modules, each waiting for its
    weights' all-gather on one communication stream that prefetches the next module's
    (``param_gather``) and reduce-scatters each module's gradients after its backward, every
    micro-batch (DeepSpeed ZeRO-3 always; FSDP unless ``no_sync`` is used)."""
    model, L = run.model, run.layout
    t = L.tp
    ov = fw.overlap
    dp_group = L.dp * L.cp
    dp_bw = bw["dp"] * eff.net
    grad_b = fw.grad_bytes
    alpha = _dp_alpha(run, hw)

    def gather(params: float) -> float:
        return comm.all_gather(dp_group, params * BYTES, dp_bw, alpha)

    def rs(params: float) -> float:
        return comm.reduce_scatter(dp_group, params * grad_b, dp_bw, alpha)

    p_dense = _layer_params_local(run, False)
    p_emb = model.vocab * model.hidden / t + ((model.max_seq or 0) * model.hidden if model.learned_positions else 0)
    first_moe = model.dense_layers if model.is_moe else model.layers
    p_moe = _layer_params_local(run, True) if model.is_moe else 0.0

    def exposed(pt: PassTime) -> float:
        return pt.compute + exposed_tp(pt.tp, pt.gemm, ov.tp_comm) + pt.cp

    if fw.zero3_runtime == "deepspeed-0.3":
        T_c, compute_total = _deepspeed_replay(run, fw, dense, emb, loss, m, gather, rs, exposed)
        notes.append("ZeRO-3: DeepSpeed v0.3 hooks replayed (per-weight gathers, device syncs, reuse distance)")
    else:
        T_c, compute_total = _unit_prefetch(run, fw, dense, moe_lt, emb, loss, m, gather, rs, exposed,
                                            p_dense, p_emb, p_moe, first_moe)
        notes.append("ZeRO-3: compute stream waiting on a prefetching all-gather stream")
    P_dev = model.layers * p_dense + p_emb
    opt = mem_time(P_dev * ((OPTIMIZER_BYTES - OPTIMIZER_SHARDED_BYTES) / dp_group
                            + OPTIMIZER_SHARDED_BYTES / dp_group), hw, eff)
    T = T_c + opt
    bd = DefaultBreakdown(compute_s=compute_total, tp_s=0.0, cp_s=0.0, p2p_s=0.0, bubble_s=0.0,
                          dp_s=T - compute_total - opt, optimizer_s=opt)
    return _finish(run, hw, eff, T, bd, m, 1, "1f1b", notes, (model.layers,), fw)


def _unit_prefetch(run: Run, fw: Framework, dense: LayerTime, moe_lt: LayerTime | None,
                   emb: tuple[PassTime, PassTime], loss: tuple[PassTime, PassTime], m: int, gather, rs, exposed,
                   p_dense: float, p_emb: float, p_moe: float, first_moe: int) -> tuple[float, float]:
    """FSDP-style units (one layer each): a compute stream waiting on one communication stream
    that prefetches the next unit's weights and reduce-scatters each unit's gradients after
    its backward (:func:`.overlap.prefetch_timeline`). Returns (seconds to the end of the
    last collective, compute seconds)."""
    model = run.model
    ov = fw.overlap
    pf_f = ov.param_gather
    pf_b = ov.param_gather and fw.prefetch_backward
    tasks: list[tuple[float, float, bool]] = []
    after: list[tuple[int, float]] = []
    for mb in range(m):
        gather_fwd = mb == 0 or fw.reshard_after_forward
        # Forward: embedding, layers, loss (the loss uses the (tied) output weights).
        tasks.append((gather(p_emb) if gather_fwd else 0.0, exposed(emb[0]), pf_f))
        for i in range(model.layers):
            lt, pp_ = (moe_lt, p_moe) if (model.is_moe and i >= first_moe) else (dense, p_dense)
            tasks.append((gather(pp_) if gather_fwd else 0.0, exposed(lt.fwd), pf_f))
        tasks.append((0.0, exposed(loss[0]) + exposed(loss[1]), pf_f))
        for i in reversed(range(model.layers)):
            lt, pp_ = (moe_lt, p_moe) if (model.is_moe and i >= first_moe) else (dense, p_dense)
            # One gather serves the recomputed forward and the backward that follows it
            # (DeepSpeed keeps weights reused within stage3_max_reuse_distance; FSDP recomputes
            # inside the unit's backward, its weights gathered).
            g = gather(pp_) if fw.reshard_after_forward else 0.0
            tasks.append((g, exposed(lt.recompute) + exposed(lt.bwd), pf_b))
            after.append((len(tasks) - 1, rs(pp_)))
        tasks.append((gather(p_emb) if fw.reshard_after_forward else 0.0, exposed(emb[1]), pf_b))
        after.append((len(tasks) - 1, rs(p_emb)))
    compute_total = sum(c for _, c, _ in tasks)
    if not ov.grad_reduce:
        rs_total = sum(d for _, d in after)
        after = []
    else:
        rs_total = 0.0
    end_c, end_comm = prefetch_timeline(tasks, after)
    return max(end_c, end_comm) + rs_total, compute_total


def _deepspeed_replay(run: Run, fw: Framework, dense: LayerTime, emb: tuple[PassTime, PassTime],
                      loss: tuple[PassTime, PassTime], m: int, gather, rs, exposed) -> tuple[float, float]:
    """DeepSpeed v0.3's ZeRO-3 hooks replayed sub-module by sub-module (:mod:`.deepspeed_stage3`).

    A layer's sub-modules with weights are its four linears (QKV, output projection, MLP up
    (gate and up fused when gated), MLP down); each linear's share of the layer's
    matrix-product time is its share of the weights (its products' FLOPs are 2·tokens·weights);
    the attention core, the norms and the other memory-bound kernels run between QKV and
    the projection, where the parameterless attention sub-modules sit. Norms and biases
    (under 1e5 elements) stay whole (``stage3_param_persistence_threshold``). The tied output
    layer re-uses the word embeddings (gathered for it, its gradient reduced once, with the
    embedding's). Returns (seconds to the end of the epilogue, compute seconds)."""
    from . import deepspeed_stage3 as ds
    model = run.model
    if model.is_moe:
        raise ModelcutError("the deepspeed-zero3 (2021) runtime replays dense models only; "
                            "use --framework fsdp for a mixture-of-experts ZeRO-3 run")
    t, h = run.layout.tp, model.hidden
    linears = [(name, n * k * c) for name, (_, n, k, c) in
               zip(("qkv", "proj", "up", "down"), dense_linears(model, 1, t))]
    lin_total = sum(n for _, n in linears)
    weights: dict[str, ds.Weight] = {}

    def weight(name: str, numel: float) -> str:
        weights[name] = ds.Weight(name, numel, gather(numel), rs(numel))
        return name

    emb_w = [weight("embedding", model.vocab * h / t)]
    if model.learned_positions and (model.max_seq or 0) * h >= ds.PERSISTENCE_THRESHOLD_NUMEL:
        emb_w.append(weight("positions", (model.max_seq or 0) * h))
    out_w = emb_w[:1] if model.tied_embeddings else [weight("output", model.vocab * h / t)]
    layer_w = [[weight(f"{i}.{n}", numel) for n, numel in linears] for i in range(model.layers)]

    def split(pt: PassTime) -> list[float]:
        """(qkv, core, proj, up, down) seconds of one pass."""
        g = [pt.gemm * numel / lin_total for _, numel in linears]
        core = exposed(pt) - pt.gemm
        return [g[0], core, g[1], g[2], g[3]]

    f_s, r_s, b_s = split(dense.fwd), split(dense.recompute), split(dense.bwd)
    recomputes = run.training.recompute == "full"

    def forward(i: int, secs: list[float]) -> list[ds.Step]:
        w = layer_w[i]
        return [ds.Step(w[0], (w[0],), secs[0]), ds.Step(f"{i}.core", (), secs[1]), ds.Step(w[1], (w[1],), secs[2]),
                ds.Step(w[2], (w[2],), secs[3]), ds.Step(w[3], (w[3],), secs[4])]

    def backward(i: int) -> list[ds.Step]:
        w = layer_w[i]
        core = b_s[1] + (0.0 if recomputes else r_s[1])   # selective: the core's forward again
        return [ds.Step(w[3], (w[3],), b_s[4], True), ds.Step(w[2], (w[2],), b_s[3], True),
                ds.Step(w[1], (w[1],), b_s[2], True), ds.Step(f"{i}.core", (), core, True),
                ds.Step(w[0], (w[0],), b_s[0], True)]

    trace: list[ds.Step] = []
    for _ in range(m):
        trace.append(ds.Step("embedding", tuple(emb_w), exposed(emb[0])))
        for i in range(model.layers):
            trace += forward(i, f_s)
        trace.append(ds.Step("output", tuple(out_w), exposed(loss[0])))
        trace.append(ds.Step("output", tuple(out_w), exposed(loss[1]), True,
                             grads=() if model.tied_embeddings else tuple(out_w)))
        for i in reversed(range(model.layers)):
            if recomputes:
                trace += forward(i, r_s)
            trace += backward(i)
        trace.append(ds.Step("embedding", tuple(emb_w), exposed(emb[1]), True))
    pf = ds.PREFETCH_BUCKET_NUMEL if fw.overlap.param_gather else 0.0
    res = ds.replay(trace, weights, prefetch_numel=pf)
    return res.step_s, res.compute_s


def predict_default(run: Run, hw: Hardware, eta: float | None = None, *, framework: str | Framework | None = None,
                    overlap: dict | None = None, profile=None) -> Prediction:
    """The ``"default"`` mode's entry point (``stepmodel.predict(..., mode="default")``).

    Constants from ``profile`` (a :class:`modelcut.catalog.profiles.Profile` or an
    :class:`.kernels.Efficiency`; default: the shipped profile fitted for ``hw``); ``eta``
    replaces the matrix-product fraction; ``framework`` and ``overlap`` as :func:`predict`."""
    if profile is None:
        from ..catalog.profiles import profile_for  # package data, read lazily
        eff = profile_for(hw).efficiency
    elif isinstance(profile, Efficiency):
        eff = profile
    else:
        eff = getattr(profile, "efficiency", None)
        if not isinstance(eff, Efficiency):
            raise ModelcutError("profile must be a fitted profile or an Efficiency")
    if eta is not None:
        eff = replace(eff, gemm=float(eta))
    return predict(run, hw, eff, framework, overlap)
