"""ZeRO-3 / FSDP without a pipeline in the default model: a compute stream of modules, each
waiting for its weights' all-gather on one communication stream that prefetches the next
module's (``param_gather``) and reduce-scatters each module's gradients after its backward,
every micro-batch (DeepSpeed ZeRO-3 always; FSDP unless ``no_sync`` is used). DeepSpeed
v0.3's hooks are replayed weight by weight (:mod:`.deepspeed_stage3`)."""

from __future__ import annotations

from ..costs import flops, params
from ..costs.kernels import Efficiency, mem_time
from ..errors import ModelcutError
from ..specs import Hardware, ModelSpec, Run
from ..costs.residency import Residency
from ..units import BF16_BYTES, optimizer_step_bytes
from . import deepspeed_stage3 as ds
from .exposure import exposed_tp, prefetch_timeline
from .frameworks import Framework
from .layers import LayerTime, PassTime, dense_linears
from .timeline import stream_segments
from .result import DefaultBreakdown
from ..costs import fp8 as fp8_mod
from .data_parallel import dp_collective, fsdp1_prep_s, fsdp2_copies, run_residency
from .stage_costs import Kernels, a2a_time, moe_a2a, not_recomputed
from ..plan import PipelinePlan, Stage


def zero3_step(run: Run, hw: Hardware, eff: Efficiency, fw: Framework, k: Kernels, plan: PipelinePlan,
               bw: dict[str, float], notes: list[str],
               timeline: list | None = None) -> tuple[float, DefaultBreakdown]:
    """ZeRO-3 / FSDP without a pipeline: a compute stream of modules, each waiting for its
    weights' all-gather on one communication stream that prefetches the next module's
    (``param_gather``) and reduce-scatters each module's gradients after its backward, every
    micro-batch (DeepSpeed ZeRO-3 always; FSDP unless ``no_sync`` is used). ``plan``: the run's,
    one stage holding every layer (its ``m`` micro-batches; which layers it recomputes,
    :meth:`..plan.Stage.recomputed`). ``timeline``, when given, receives the two streams'
    :class:`.timeline.Segment` s (not DeepSpeed v0.3's replay)."""
    model, L = run.model, run.layout
    if len(plan.stages) != 1:
        raise ModelcutError(f"ZeRO-3's units run without a pipeline; this plan has {len(plan.stages)} stages")
    m, whole_model = plan.m, plan.stages[0]
    t = L.tp
    ov = fw.overlap
    grad_b, grad_e = fw.grad_bytes, fw.expert_grad_b
    dense, moe_lt, emb, loss = k.dense, k.moe, k.emb, k.loss
    coll = dp_collective(run, hw, eff, bw, fw.nccl_tuner, fw.replica_reduce_stream)    # dense weights over their shard group, routed experts over their own

    layer_b = fp8_mod.param_gather_bytes(fp8_mod.for_stack(run.training, hw, fw))   # FP8 weights gathered as FP8

    def split(params) -> tuple[float, float]:
        return params if isinstance(params, tuple) else (params, 0.0)

    def gather(params, per: float = BF16_BYTES) -> float:
        a, b = split(params)
        return coll("all-gather", a * per, b * per)

    def gather_layer(params) -> float:
        return gather(params, layer_b)

    def rs(params) -> float:
        a, b = split(params)
        return coll("reduce-scatter", a * grad_b, b * grad_e) + fsdp1_prep_s(run, hw, eff, fw, a, b)

    # FSDP2's copies on the compute stream (costs.residency, data_parallel.fsdp2_copies)
    resid = run_residency(run, fw, m)
    out_s, in_s = fsdp2_copies(run, hw, eff, fw, resid, m)

    def copy_out(params, per: float = BF16_BYTES) -> float:
        a, b = split(params)
        return out_s((a * per, b * per))

    def copy_in(params) -> float:
        return in_s(split(params))

    n_moe = flops.moe_layer_count(model)
    mods = params.device_modules(model, t, L.ep, L.etp, [(model.layers - n_moe, n_moe, True, True)])[0]
    p_out, p_emb = mods[0][0], mods[-1][0]    # readiness order: output first, embedding last
    p_dense = params.layer_params(model, t, False)[0]
    p_moe = tuple(params.layer_params(model, t, True, L.ep, L.etp)) if model.is_moe else (0.0, 0.0)   # (dense, experts)

    def exposed(pt: PassTime) -> float:
        return sum(_on_stream(pt, ov.tp_comm))

    rec_d, rec_m = whole_model.recomputed(model, run.training)
    if fw.zero3_runtime == "deepspeed-0.3":
        if model.is_moe:
            raise ModelcutError(f"{model.name} is a mixture of experts, and the DeepSpeed v0.3 ZeRO-3 replay "
                                "(the deepspeed-zero3 preset without a pipeline) covers dense models only: "
                                "name another stack (fsdp, megatron-core) or a ZeRO stage below 3")
        if model.is_mla:     # the replay's layer holds four linears: QKV, projection, MLP up and down
            raise ModelcutError(f"{model.name} has multi-head latent attention, which the DeepSpeed v0.3 ZeRO-3 "
                                "replay (the deepspeed-zero3 preset without a pipeline) does not cover: "
                                "name another stack (fsdp, megatron-core) or a ZeRO stage below 3")
        if run.training.partial_recompute:
            raise ModelcutError("the DeepSpeed v0.3 ZeRO-3 replay (the deepspeed-zero3 preset without a pipeline) "
                                "recomputes every layer or none (leave recompute_layers and recompute_every out)")
        res = _deepspeed_replay(run, fw.overlap.param_gather, dense, emb, loss, m, gather, rs, exposed)
        T_c, compute_total = res.step_s, res.compute_s
        a2a_total = 0.0
        notes.append("ZeRO-3: DeepSpeed v0.3 hooks replayed (per-weight gathers, device syncs, reuse distance)")
    else:
        T_c, compute_total, a2a_total = _unit_prefetch(run, fw, dense, moe_lt, emb, loss, m, gather, rs, exposed,
                                                       (p_dense, p_moe, p_emb, p_out),
                                                       moe_a2a(moe_lt, a2a_time(run, hw, eff, fw), run.training.recompute,
                                                               fw, hw) if moe_lt is not None else (0.0, 0.0),
                                                       gather_layer, (copy_out, copy_in, layer_b), resid, timeline,
                                                       moe_a2a(moe_lt, a2a_time(run, hw, eff, fw), "none", fw, hw)
                                                       if moe_lt is not None else (0.0, 0.0), whole_model)
        notes.append("ZeRO-3: compute stream waiting on a prefetching all-gather stream")
        if copy_out(p_dense) > 0:
            notes.append("ZeRO-3: FSDP2's all-gather copy-out and reduce-scatter copy-in on the compute stream")
    P_dev = sum(a + b for a, b in mods)
    opt = mem_time(optimizer_step_bytes(P_dev, L.shard_ranks, grads_sharded=True, moment_bytes=run.training.moment_bytes), hw, eff)
    T = T_c + opt
    tp_s, cp_s = _stream_comm(model, dense, moe_lt, emb, loss, m, ov.tp_comm, (rec_d, rec_m))
    bd = DefaultBreakdown(compute_s=compute_total - tp_s - cp_s, tp_s=tp_s, cp_s=cp_s, p2p_s=0.0, bubble_s=0.0,
                          dp_s=max(T - compute_total - a2a_total - opt, 0.0),   # no rounding below zero
                          a2a_s=a2a_total, optimizer_s=opt)
    return T, bd


def _on_stream(pt: PassTime, tp_overlap: bool) -> tuple[float, float, float]:
    """What one pass puts on the compute stream, (compute, exposed tp, cp) seconds: the exposed tp
    as :func:`.exposure.exposed_tp` leaves it."""
    return pt.compute, exposed_tp(pt.tp, pt.gemm, tp_overlap), pt.cp


def _stream_comm(model: ModelSpec, dense: LayerTime, moe_lt: LayerTime | None, emb: tuple[PassTime, PassTime],
                 loss: tuple[PassTime, PassTime], m: int, tp_overlap: bool,
                 recomputed: tuple[int, int]) -> tuple[float, float]:
    """The tensor- and context-parallel seconds the compute stream carries (:func:`_on_stream`),
    which the stream's units count with their compute: every micro-batch, the embedding's and the
    loss's two passes and each layer's forward and backward, and the recomputed forward of the
    (dense, MoE) layers ``recomputed`` (:meth:`..plan.Stage.recomputed`). What the breakdown
    reports as tp and cp, not compute."""
    n_moe = flops.moe_layer_count(model)
    counted = [(p, 1) for p in (*emb, *loss)] + [
        (p, n) for lt, n, r in ((dense, model.layers - n_moe, recomputed[0]), (moe_lt, n_moe, recomputed[1]))
        if lt is not None and n for p, n in ((lt.fwd, n), (lt.bwd, n), (lt.recompute, r))]
    parts = [tuple(n * x for x in _on_stream(p, tp_overlap)[1:]) for p, n in counted]
    return m * sum(tp for tp, _ in parts), m * sum(cp for _, cp in parts)


def _unit_prefetch(run: Run, fw: Framework, dense: LayerTime, moe_lt: LayerTime | None,
                   emb: tuple[PassTime, PassTime], loss: tuple[PassTime, PassTime], m: int, gather, rs, exposed,
                   sizes: tuple[float, float, float, float],
                   a2a: tuple[float, float] = (0.0, 0.0), gather_layer=None,
                   copies=None, resid: Residency | None = None,
                   timeline: list | None = None, a2a_kept: tuple[float, float] = (0.0, 0.0),
                   stage: Stage | None = None) -> tuple[float, float, float]:
    """FSDP-style units (the embedding, each layer, the output layer and final norm): a compute
    stream waiting on one communication stream that prefetches the next unit's weights and
    reduce-scatters each unit's gradients after its backward (:func:`.exposure.prefetch_timeline`),
    every micro-batch, or in the last one only where the stack accumulates them unsharded
    (``flat_grad_sync = "step"``, :mod:`..costs.residency`).
    ``sizes``: the parameters of a dense layer, an MoE layer ((dense, routed experts): gathered
    and reduced over their own groups), the embedding and the output;
    ``a2a``: an MoE layer's token dispatch and combine in its forward and in its backward with the
    recomputation (:func:`.stage_costs.moe_a2a`), on the compute stream's critical path (the
    experts wait for their tokens); ``copies``: (copy_out(params, bytes per weight), copy_in(params),
    a layer's gathered bytes per weight), the seconds FSDP2's copies add to the compute stream after
    each gather and before each reduce-scatter (:mod:`..costs.residency`; None: none), counted in
    the step but not in the compute seconds. ``resid``: the run's residency (:func:`.data_parallel.run_residency`;
    None: found here). ``timeline``: where to put the two streams' segments (:func:`.timeline.stream_segments`).
    With Megatron-core's block method (``recompute_layers``) only the layers ``stage`` (the whole
    model's) recomputes are (:meth:`..plan.Stage.recomputes`); the others' backward runs without
    the recomputed forward (:func:`.stage_costs.not_recomputed`) and its all-to-all as ``a2a_kept``
    (:func:`.stage_costs.moe_a2a` without recomputation).
    Returns (seconds to the end of the last collective, compute seconds, all-to-all seconds)."""
    p_dense, p_moe, p_emb, p_out = sizes
    gather_layer = gather_layer or gather          # a layer's weights (FP8 where gathered so)
    model = run.model
    ov = fw.overlap
    pf_f = ov.param_gather
    pf_b = ov.param_gather and fw.prefetch_backward
    # what stays resident is the rule memory reads too (:mod:`..costs.residency`)
    res = resid or run_residency(run, fw, m)
    reshard = res.gathers_each_pass
    once = res.grads == "per-step"      # accumulated unsharded, reduce-scattered in the last backward only
    copy_out, copy_in, layer_b = copies or (lambda params, per=0.0: 0.0, lambda params: 0.0, BF16_BYTES)
    partial = run.training.partial_recompute and stage is not None
    tasks: list[tuple[float, float, bool]] = []
    after: list[tuple[int, float]] = []
    labels: list[tuple[str, str]] = []     # (name, kind) of each task, for a timeline
    a2a_total = copies_total = 0.0

    def task(label: str, gathered: bool, params, compute: float, prefetch: bool, reduced: bool = False,
             layer: bool = False) -> None:
        """A unit on the compute stream (a transformer ``layer`` or not): its gather (if any), its
        compute, FSDP2's copy-out after the gather and copy-in before its reduce-scatter
        (``reduced``)."""
        nonlocal copies_total
        extra = ((copy_out(params, layer_b if layer else BF16_BYTES) if gathered else 0.0)
                 + (copy_in(params) if reduced else 0.0))
        copies_total += extra
        g = ((gather_layer if layer else gather)(params)) if gathered else 0.0
        tasks.append((g, compute + extra, prefetch))
        labels.append((label, "backward" if label.endswith(" backward") else "forward"))
        if reduced:
            after.append((len(tasks) - 1, rs(params)))

    for mb in range(m):
        gather_fwd = mb == 0 or reshard
        reduce = not once or mb == m - 1
        # Forward: embedding, layers, loss (the loss uses the (tied) output weights).
        task(f"embedding, micro-batch {mb} forward", gather_fwd, p_emb, exposed(emb[0]), pf_f)
        for i in range(model.layers):
            is_moe = flops.is_moe_layer(model, i)
            lt, pp_ = (moe_lt, p_moe) if is_moe else (dense, p_dense)
            x = a2a[0] if is_moe else 0.0
            a2a_total += x
            task(f"layer {i}, micro-batch {mb} forward", gather_fwd, pp_, exposed(lt.fwd) + x, pf_f, layer=True)
        task(f"output layer and loss, micro-batch {mb}", gather_fwd, p_out,
             exposed(loss[0]) + exposed(loss[1]), pf_f, reduce)
        for i in reversed(range(model.layers)):
            is_moe = flops.is_moe_layer(model, i)
            lt, pp_ = (moe_lt, p_moe) if is_moe else (dense, p_dense)
            whole = partial and not stage.recomputes(run.training, i)    # the block method leaves it whole
            if whole:
                lt = not_recomputed(lt)
            x = (a2a_kept[1] if whole else a2a[1]) if is_moe else 0.0
            a2a_total += x
            # One gather serves the recomputed forward and the backward that follows it
            # (DeepSpeed keeps weights reused within stage3_max_reuse_distance; FSDP recomputes
            # inside the unit's backward, its weights gathered).
            task(f"layer {i}, micro-batch {mb} backward", reshard, pp_, exposed(lt.recompute) + exposed(lt.bwd) + x,
                 pf_b, reduce, layer=True)
        task(f"embedding, micro-batch {mb} backward", reshard, p_emb, exposed(emb[1]), pf_b, reduce)
    compute_total = sum(c for _, c, _ in tasks) - a2a_total - copies_total
    if not ov.grad_reduce:
        rs_total = sum(d for _, d in after)
        after = []
    else:
        rs_total = 0.0
    events: list | None = [] if timeline is not None else None
    end_c, end_comm = prefetch_timeline(tasks, after, events)
    if timeline is not None:
        timeline += stream_segments(labels, events, rs_total)
    return max(end_c, end_comm) + rs_total, compute_total, a2a_total


def _deepspeed_replay(run: Run, prefetch: bool, dense: LayerTime, emb: tuple[PassTime, PassTime],
                      loss: tuple[PassTime, PassTime], m: int, gather, rs, exposed) -> ds.Stage3Result:
    """DeepSpeed v0.3's ZeRO-3 hooks replayed sub-module by sub-module (:mod:`.deepspeed_stage3`).

    A layer's sub-modules with weights are its four linears (QKV, output projection, MLP up
    (gate and up fused when gated), MLP down); each linear's share of the layer's
    matrix-product time is its share of the weights (its products' FLOPs are 2·tokens·weights);
    the attention core, the norms and the other memory-bound kernels run between QKV and
    the projection, where the parameterless attention sub-modules sit. Norms and biases
    (under 1e5 elements) stay whole (``stage3_param_persistence_threshold``). The tied output
    layer re-uses the word embeddings (gathered for it, its gradient reduced once, with the
    embedding's). Returns the replay's result (step and compute seconds, most elements gathered)."""
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
    pf = ds.PREFETCH_BUCKET_NUMEL if prefetch else 0.0
    return ds.replay(trace, weights, prefetch_numel=pf)


def deepspeed_resident_numel(run: Run, m: int, prefetch: bool = True) -> float:
    """Most weight elements DeepSpeed v0.3's ZeRO-3 holds gathered at once on a rank (the sub-module
    running, what it prefetched, what the reuse distance kept): the same replay as the step time
    (:func:`_deepspeed_replay`), whose fetch, prefetch and release decisions depend on the trace's
    order and sizes only, run with no durations (``prefetch``: the stack's ``param_gather``
    overlap). What memory counts as gathered weights. Every micro-batch repeats the same calls,
    so two of them hold every state the step reaches (its start, a boundary between micro-batches,
    its end): the replay runs min(m, 2)."""
    zero = PassTime()
    none = LayerTime(zero, zero, zero)
    res = _deepspeed_replay(run, prefetch, none, (zero, zero), (zero, zero), min(m, 2), lambda n: 0.0,
                            lambda n: 0.0, lambda pt: 0.0)
    return res.peak_resident_numel
