"""What data parallelism adds to each pipeline device's step in the default model, read off the
simulated trace: the gradient reduction (behind the backward where the framework overlaps it,
after the flush where not; after every micro-batch's backward where only a shard of the
gradients is kept), the tied embedding's all-reduce between the end stages, the optimizer step,
and sharded weights' all-gather (once a step, or, where ZeRO-3 reshards, every pass of every
micro-batch through every chunk: :func:`pass_gathers`, paid inside the stages' durations). What
is resident, and so what is moved, is :func:`..costs.residency.residency`'s, the rule memory
reads too."""

from __future__ import annotations

from dataclasses import dataclass

from ..costs import comm, params
from ..costs.kernels import Efficiency, mem_time
from ..plan import PipelinePlan
from ..sim.engine import Trace
from ..specs import Hardware, Run
from ..units import BF16_BYTES, optimizer_step_bytes
from ..costs import fp8 as fp8_mod
from ..costs import residency
from ..costs.residency import Residency
from .exposure import exposed_after, prefetch_timeline
from .frameworks import Framework


@dataclass
class DeviceEnd:
    """One pipeline device's end of step and what its data parallelism exposed."""

    end: float
    exposed: float     # gradient reduction, tied-embedding all-reduce, weight gathers
    optimizer: float


def run_residency(run: Run, framework: Framework, microbatches: int) -> Residency:
    """What a rank of the run keeps resident on the stack (the distributed optimizer counts as
    ZeRO-1): the same rule memory applies (:func:`..memory.stages.for_framework`)."""
    return framework.residency(framework.zero_stage(run.layout), run.layout.pp, microbatches)


def dp_collective(run: Run, hw: Hardware, eff: Efficiency, bw: dict[str, float],
                  tuner: comm.NcclTuner = comm.NCCL_2_9, replica_stream: bool = False):
    """A data-parallel collective, as ``coll(kind, bytes, expert_bytes=0) -> seconds``: ``bytes``
    of dense weights (or their gradients) over the data-parallel group (dp·cp ranks, which shard
    ZeRO's states), then ``expert_bytes`` of routed experts over the expert-data-parallel group
    (:func:`..costs.comm.expert_dp_size` ranks, the ones holding the same experts, at their own
    bandwidth ``bw["edp"]``; none when each rank's experts are its own), one after the other on
    the stream (Megatron-LM reduces the two groups' buckets in turn; FSDP2 gathers each group's
    parameters with its own collective). ``tuner``: the latencies of the stack's NCCL
    (:attr:`.frameworks.Framework.nccl_tuner`).

    Hybrid sharding (``layout.dp_shard`` < dp, :func:`..costs.comm.hybrid_groups`): weights are
    all-gathered over the shard group (dp_shard·cp ranks) only; gradients are reduce-scattered over
    it and the shard, 1/(dp_shard·cp) of the bytes, is then all-reduced across the dp/dp_shard
    replicas: one after the other (Megatron-core's partial distributed optimizer on its
    communication stream, ``param_and_grad_buffer.py`` ``start_grad_sync``), or with
    ``replica_stream`` (the stack's ``replica_reduce_stream``: PyTorch FSDP, 1 and 2, runs the
    all-reduce on a stream of its own, which waits for the reduce-scatter and leaves the next
    unit's reduce-scatter free to start) the two pipelined over the units, each unit costing the
    slower of the two (the tail of the last unit's all-reduce not counted)."""
    L = run.layout
    gpn = run.gpus_per_node or hw.per_node
    full = comm.ring_group(L, ("cp", "dp"), L.dp * L.cp, bw["dp"], gpn, tuner)
    experts = (comm.ring_group(L, comm.EXPERT_DP, comm.expert_dp_size(L), bw.get("edp", bw["dp"]), gpn, tuner)
               if L.ep > 1 else full)
    hybrid = comm.hybrid_groups(L, bw, gpn, tuner) if L.hybrid else None

    def dense(kind: str, nbytes: float) -> float:
        if hybrid is not None and kind != "all-reduce":
            shard, replica = hybrid
            t = shard.time(kind, nbytes, hw, eff.net, tuner)
            if kind == "reduce-scatter":    # then the shard's all-reduce across the replicas
                ar = replica.time("all-reduce", nbytes / shard.n, hw, eff.net, tuner)
                t = max(t, ar) if replica_stream else t + ar
            return t
        return full.time(kind, nbytes, hw, eff.net, tuner)

    def coll(kind: str, nbytes: float, expert_bytes: float = 0.0) -> float:
        # a unit of experts alone issues no dense collective
        t = dense(kind, nbytes) if nbytes > 0 or expert_bytes <= 0 else 0.0
        if expert_bytes > 0 and experts.n > 1:
            t += experts.time(kind, expert_bytes, hw, eff.net, tuner)
        return t
    return coll


def unit_gather_parts(run: Run, hw: Hardware, framework: Framework, stage, units) -> list[tuple[float, float]]:
    """Bytes each of a stage's units (:func:`..costs.params.device_modules`' order: the output layer
    and final norm where the stage has the loss, its transformer layers, the embedding where it has
    it) moves when its weights are all-gathered, as (dense, routed-expert) bytes, the two gathered
    over different groups (:func:`dp_collective`): 16-bit, except the transformer layers' where the
    stack keeps FP8 parameters (:func:`..costs.fp8.param_gather_bytes`). The one rule every
    weight gather reads (once a step, every pass, the lower bound)."""
    layer_b = fp8_mod.param_gather_bytes(fp8_mod.for_stack(run.training, hw, framework))
    last = len(units) - 1
    out = []
    for j, (a, b) in enumerate(units):
        per = BF16_BYTES if (j == 0 and stage.loss) or (j == last and stage.embedding) else layer_b
        out.append((a * per, b * per))
    return out


def pass_gathers(run: Run, hw: Hardware, eff: Efficiency, framework: Framework, plan: PipelinePlan,
                 unit_costs: list[tuple[list[float], list[float]]], bw: dict[str, float]
                 ) -> list[tuple[float, float]]:
    """Per virtual stage, the (forward, backward) seconds ZeRO-3's weight gathers add to one pass of
    one micro-batch where the stack reshards (:attr:`..costs.residency.Residency.gathers_each_pass`),
    else zeros. ``unit_costs``: per stage, the seconds of each unit (output layer and final norm,
    transformer layers last to first, embedding: :func:`..costs.params.device_modules`' order) in
    the forward and in the backward. Each pass is a compute stream waiting on a gather stream
    that, with ``param_gather``, prefetches the next unit (:func:`.exposure.prefetch_timeline`);
    one gather serves a recomputed forward and the backward that follows."""
    L = run.layout
    zeros = [(0.0, 0.0)] * len(plan.stages)
    if L.dp * L.cp == 1 or not run_residency(run, framework, plan.m).gathers_each_pass:
        return zeros
    coll = dp_collective(run, hw, eff, bw, framework.nccl_tuner, framework.replica_reduce_stream)
    pf = framework.overlap.param_gather
    pf_b = pf and framework.prefetch_backward
    mods = params.device_modules(run.model, L.tp, L.ep, L.etp,
                                 [(st.dense_layers, st.moe_layers, st.embedding, st.loss) for st in plan.stages])
    out = []
    for st, units, (fwd, bwd) in zip(plan.stages, mods, unit_costs):
        g = [coll("all-gather", a, b) for a, b in unit_gather_parts(run, hw, framework, st, units)]
        f_tasks = [(gi, ci, pf) for gi, ci in zip(reversed(g), fwd)]      # forward order
        b_tasks = [(gi, ci, pf_b) for gi, ci in zip(g, bwd)]              # backward order
        f_end, _ = prefetch_timeline(f_tasks)
        b_end, _ = prefetch_timeline(b_tasks)
        out.append((max(f_end - sum(fwd), 0.0), max(b_end - sum(bwd), 0.0)))
    return out


def backward_ends(plan: PipelinePlan, trace: Trace) -> dict[int, list[tuple[float, float]]]:
    """Each stage's backward ops that finish its weight gradients (W where the lists split the
    backward, else B), (start, end) in time order."""
    sched = plan.schedule
    kind = "W" if plan.spec.split_backward else "B"
    out: dict[int, list[tuple[float, float]]] = {st.index: [] for st in plan.stages}
    for dev, order in enumerate(sched.orders):
        starts, stops = trace.starts[dev], trace.ends[dev]
        for i, op in enumerate(order):
            if op.kind == kind:
                out[op.stage].append((float(starts[i]), float(stops[i])))
    return out


def last_backwards(plan: PipelinePlan, trace: Trace) -> dict[int, tuple[float, float]]:
    """Each stage's last backward (B, or W when split): its start and end. A device's list runs
    in time order."""
    out: dict[int, tuple[float, float]] = {}
    sched = plan.schedule
    for dev, order in enumerate(sched.orders):
        starts, stops = trace.starts[dev], trace.ends[dev]
        for i in range(len(order) - 1, -1, -1):
            op = order[i]
            if op.kind != "F" and op.stage not in out:
                out[op.stage] = (float(starts[i]), float(stops[i]))
                if len(out) == len(plan.stages):
                    return out
    return out


def unit_requests(start: float, end: float, units, reduce_time) -> list[tuple[float, float]]:
    """One backward's gradient reductions, unit by unit: the units' gradients are finished in
    order through the backward (start, end), unit j of n at start + (end − start)·(j + 1)/n, each
    then reduced (``reduce_time(dense, expert)`` seconds)."""
    n = len(units)
    return [(start + (end - start) * (j + 1) / n, reduce_time(a, b)) for j, (a, b) in enumerate(units)]


def fsdp1_prep_s(run: Run, hw: Hardware, eff: Efficiency, framework: Framework, dense: float,
                 expert: float = 0.0) -> float:
    """Seconds FSDP1 spends readying ``dense`` (and routed ``expert``) unsharded gradient elements,
    computed in the run's 16-bit type, for their reduction over the data-parallel group (dp·cp
    ranks, FSDP1's world for its pre-divide factor), on the communication stream ahead of the
    collective: :func:`..costs.residency.fsdp1_reduce_prep_bytes` at HBM speed; none unless the
    stack reduces through FSDP1 (``fsdp1_reduce``)."""
    if not framework.fsdp1_reduce:
        return 0.0
    ranks = run.layout.dp * run.layout.cp
    n = (residency.fsdp1_reduce_prep_bytes(dense, BF16_BYTES, framework.grad_bytes, ranks)
         + residency.fsdp1_reduce_prep_bytes(expert, BF16_BYTES, framework.expert_grad_b, ranks))
    return mem_time(n, hw, eff) if n else 0.0


def blocking_stage_reduce(run: Run, framework: Framework) -> bool:
    """Whether each pipeline stage's gradient reduce-scatter holds the compute stream: with a
    pipeline, sharded gradients (FSDP, ZeRO ≥ 2) and a stack that reduces them once a schedule run
    (``pipeline_grad_sync = "step"``, torch.distributed.pipelining). The schedule's ``REDUCE_GRAD``
    action, placed just after a stage's last backward (torch/distributed/pipelining/schedules.py
    ``_add_reduce_grad``), runs the stage's FSDP post-backward, issuing the reduce-scatter of all
    its gradients then, and FSDP's final callback, where the current (compute) stream waits for the
    reduce-scatters to finish (stage.py ``perform_reduce_grad``; torch/distributed/fsdp/
    _fully_shard/_fsdp_state.py ``_root_post_backward_final_callback`` and _fsdp_param_group.py
    ``finalize_backward``, torch 2.13; in torch 2.8 the same calls from stage.py's
    ``backward_maybe_with_nosync`` on the last backward). So each stage's reduction is exposed on
    its device, whole, after its last backward: :func:`device_ends` adds it to the device's end,
    not letting a later stage's slack absorb it (an upper bound of that stall)."""
    return run.layout.pp > 1 and framework.zero_stage(run.layout) >= 2 and framework.pipeline_grad_sync == "step"


def device_ends(run: Run, hw: Hardware, eff: Efficiency, framework: Framework, plan: PipelinePlan,
                trace: Trace, bw: dict[str, float]) -> list[DeviceEnd]:
    """Per pipeline device (module doc). A stage's gradients become ready through its last
    backward, last layer first; they are reduce-scattered (sharded optimizer states) or
    all-reduced over dp·cp on one stream; the optimizer step is memory-bound over the device's
    parameters; with sharded states the weights are all-gathered, ahead of use where the
    framework prefetches."""
    model, L = run.model, run.layout
    ov = framework.overlap
    t, p = L.tp, L.pp
    dp_group = L.dp * L.cp
    sharded = framework.zero_stage(L) >= 1
    res = run_residency(run, framework, plan.m)
    per_mb = res.grads == "per-microbatch" and res.zero >= 2 and plan.m > 1
    waits = blocking_stage_reduce(run, framework)
    grad_b, grad_e = framework.grad_bytes, framework.expert_grad_b
    coll = dp_collective(run, hw, eff, bw, framework.nccl_tuner, framework.replica_reduce_stream)

    def reduce_time(dense: float, expert: float = 0.0) -> float:
        return (coll("reduce-scatter" if sharded else "all-reduce", dense * grad_b, expert * grad_e)
                + fsdp1_prep_s(run, hw, eff, framework, dense, expert))

    tied_extra = 0.0
    if model.tied_embeddings and p > 1:   # the end stages' two copies of the word embeddings agree
        tied_extra = comm.ring_allreduce(2, model.vocab * model.hidden / t * grad_b, bw["pp"] * eff.net)
    ends = [float(e[-1]) if e else 0.0 for e in trace.ends]
    last_b = last_backwards(plan, trace)
    every_b = backward_ends(plan, trace) if per_mb else {}
    out = []
    for dev in range(p):
        requests, held, params_dev, layers_dev, gather_bytes, gather_expert = [], [], 0.0, 0, 0.0, 0.0
        mine = plan.on_device(dev)
        mods = params.device_modules(model, t, L.ep, L.etp,
                                     [(st.dense_layers, st.moe_layers, st.embedding, st.loss) for st in mine])
        for st, units in zip(mine, mods):
            b_start, b_end = last_b[st.index]
            params_dev += sum(a + b for a, b in units)
            layers_dev += st.layers
            parts = unit_gather_parts(run, hw, framework, st, units)
            gather_bytes += sum(a for a, _ in parts)
            gather_expert += sum(b for _, b in parts)
            # only a shard is kept: every micro-batch's gradients are reduce-scattered unit by unit
            # as its backward finishes each unit, the earlier ones as the last (FSDP's post-backward
            # hook per unit, DeepSpeed's buckets as gradients become ready)
            for s, e in every_b.get(st.index, [])[:-1] + [(b_start, b_end)]:
                requests += unit_requests(s, e, units, reduce_time)
            held.append(reduce_time(sum(a for a, _ in units), sum(b for _, b in units)))
        if waits and dp_group > 1:
            # each stage's reduce-scatter issued after its last backward, the compute stream waiting
            exp_dp = sum(held)
        else:
            exp_dp = exposed_after(ends[dev], requests, ov.grad_reduce) if dp_group > 1 else 0.0
        tied = tied_extra if (dev in (0, p - 1) and p > 1) else 0.0
        opt = mem_time(optimizer_step_bytes(params_dev, L.shard_ranks if sharded else 1, res.grads_sharded,
                                                  run.training.moment_bytes), hw, eff)
        gather = 0.0
        if sharded and dp_group > 1 and not res.gathers_each_pass:
            g = coll("all-gather", gather_bytes, gather_expert)
            # gathered ahead of use: only the first layer's share waits, the rest hides behind the forward
            gather = g / max(1, layers_dev) if ov.param_gather else g
        copies = fsdp2_copies_s(run, hw, eff, framework, res, plan.m, mods, (gather_bytes, gather_expert))
        out.append(DeviceEnd(ends[dev] + exp_dp + tied + opt + gather + copies, exp_dp + tied + gather + copies, opt))
    return out


def fsdp2_copies(run: Run, hw: Hardware, eff: Efficiency, framework: Framework, res: Residency, m: int):
    """FSDP2's copies (:mod:`..costs.residency`) as ``(copy_out, copy_in)``: ``copy_out((dense,
    expert) gathered bytes) -> seconds`` after a gather, ``copy_in((dense, expert) gradient
    elements) -> seconds`` before a reduce-scatter, each group counted where it shards over more
    than one rank (the dense weights over their shard group, dp·cp unless hybrid, the routed experts over their own group,
    :func:`dp_collective`'s groups); gradients read as bf16, or in the dtype the stack accumulates
    them whole in between reductions (``unsharded_grad_bytes``), written in the reduce dtype. Both
    give 0 unless the stack runs FSDP2 (``fsdp2_copies``) under ZeRO-3."""
    L = run.layout
    on = framework.fsdp2_copies and res.zero >= 3
    n_e = comm.expert_dp_size(L) if L.ep > 1 else L.shard_ranks
    dense_on, expert_on = on and L.shard_ranks > 1, on and n_e > 1
    accumulated = res.grads == "per-step" and m > 1
    held = ((framework.unsharded_grad_bytes or framework.grad_buffer_bytes) if accumulated else BF16_BYTES,
            BF16_BYTES)

    def copy_out(gathered: tuple[float, float]) -> float:
        n = (gathered[0] if dense_on else 0.0) + (gathered[1] if expert_on else 0.0)
        return mem_time(residency.copy_out_bytes(n), hw, eff) if n else 0.0

    def copy_in(grads: tuple[float, float]) -> float:
        n = ((residency.copy_in_bytes(grads[0], held[0], framework.grad_bytes) if dense_on else 0.0)
             + (residency.copy_in_bytes(grads[1], held[1], framework.expert_grad_b) if expert_on else 0.0))
        return mem_time(n, hw, eff) if n else 0.0

    return copy_out, copy_in


def fsdp2_copies_s(run: Run, hw: Hardware, eff: Efficiency, framework: Framework, res: Residency, m: int,
                   mods, gathered: tuple[float, float]) -> float:
    """Seconds FSDP2's copies (:func:`fsdp2_copies`) add to one pipeline device's compute stream in
    a step, ``mods`` its stages' units (:func:`..costs.params.device_modules`): a copy-out of its
    ``gathered`` (dense, routed-expert) bytes for every gather (once a
    step where the weights are kept; every pass of every micro-batch, forward and backward, where
    they are resharded) and a copy-in of its gradients for every reduction (every micro-batch
    where only a shard is kept, else once). Charged at the device's end, after its last backward:
    the copies of earlier passes are not moved into the pipeline's schedule (with a pipeline the
    FSDP2 stacks keep the weights and reduce once, ``reshard_with_pipeline``,
    ``pipeline_grad_sync``)."""
    copy_out, copy_in = fsdp2_copies(run, hw, eff, framework, res, m)
    gathers = 2 * m if res.gathers_each_pass else 1
    reductions = m if res.grads == "per-microbatch" else 1
    grads = (sum(a for units in mods for a, _ in units), sum(b for units in mods for _, b in units))
    return gathers * copy_out(gathered) + reductions * copy_in(grads)
