"""modelcut's default training-step model: kernels from their shapes, the pipeline simulated,
communication exposed only where the framework does not overlap it.

One optimizer step of a run on some hardware, built bottom-up:

1. **Per layer, per micro-batch, per device** (:mod:`.layer_time`): every matrix product from
   its (m, n, k) with tile and wave quantization, memory-bound kernels from their bytes,
   the attention kernel the framework runs, recomputation as what it re-executes, the
   tensor- and context-parallel collectives; the embedding on the first virtual stage, the
   logits and loss on the last.
2. **Pipeline**: each virtual stage's forward and backward durations (whole layers per stage
   as the pipeline plan lays them out (:mod:`..plan`), so the first and last stages are
   heavier or lighter as they really are) go through the discrete-event engine for the
   run's schedule (interleaved when v > 1, else 1F1B). Pipeline sends either hold both
   devices (blocking, added to the ops) or travel as latency between them (asynchronous).
3. **Data parallelism**: each layer's gradients become ready when its last backward ends (read
   off the simulated trace); they are all-reduced (reduce-scattered with sharded optimizer
   states) on one communication stream, behind the backward when the framework overlaps it,
   after the flush when not (:mod:`.data_parallel`). ZeRO-3/FSDP without a pipeline runs the
   layers as a compute stream waiting on a prefetching all-gather stream (:mod:`.zero3`).
4. **Optimizer step**: memory-bound over the parameters this device updates
   (:data:`..units.OPTIMIZER_STEP_TRAFFIC_BYTES` per parameter).

Step time T = the slowest device's end of compute + its exposed communication + the
optimizer. Reported TFLOP/s per GPU = F / (n·T) with F counted as the seed mode counts it
(:func:`.flops.executed_flops`: eq. 3 with full recomputation, PaLM's 6N + 12·l·s·d
otherwise), so the two modes compare on the same scale.

The three constants (:class:`..costs.kernels.Efficiency`) are passed in (the catalog's fitted
hardware profiles, ``modelcut calibrate``); the framework preset (:class:`.frameworks.Framework`,
catalog data) says what is overlapped and which kernels run.
"""

from __future__ import annotations

from dataclasses import replace

from .. import plan as plans
from ..costs import comm, flops, op_sac
from ..costs import fp8 as fp8_mod
from ..costs.kernels import Efficiency, mfu_peak
from ..plan import PipelinePlan
from ..sim import registry
from ..sim.engine import Timing, simulate
from ..specs import Hardware, Run
from .balance import pipeline_balance
from .checks import check_run
from .data_parallel import device_ends
from .frameworks import Framework
from .elementwise import MCORE_EAGER_PATHS, mcore_eager_paths
from .pipeline_time import simulated_trace
from .timeline import device_track, optimizer_segment, pipeline_segments, repeated
from .result import DefaultBreakdown, Prediction
from .stage_costs import StageCosts, kernels, stage_costs
from .zero3 import zero3_step


def chunks(run: Run) -> int:
    """Chunks per device: the layout's ``vpp``, else the named schedule's default, else 1; 1
    without a pipeline."""
    L = run.layout
    if L.pp == 1:
        return 1
    if L.vpp is not None:
        return L.vpp
    if L.schedule is not None:
        return registry.get(L.schedule).default_chunks
    return 1


def stack_run(run: Run, framework: Framework) -> Run:
    """The run checked, and what it leaves open (ZeRO, sequence parallelism, the loss) filled as
    its stack runs it (:meth:`.frameworks.Framework.resolve`)."""
    check_run(run)
    return framework.resolve(run)


def one_schedule_run(run: Run) -> Run:
    """A run (:func:`stack_run`'s) as the default model times it: its batch one pipeline schedule
    run's (:func:`..plan.flush_training`); the step repeats that run (:func:`_finish`)."""
    return replace(run, training=plans.flush_training(run.layout, run.training))


def default_plan(run: Run) -> PipelinePlan:
    """The pipeline the default model times: :func:`chunks` per device, layers spread evenly
    (:func:`..plan.even_split`) or as the layout's first/last layers say, over the micro-batches
    of one schedule run (:func:`..plan.flush_training`)."""
    return plans.resolve(run.model, run.layout, plans.flush_training(run.layout, run.training), v=chunks(run),
                         schedule=run.layout.schedule, first_layers=run.layout.first_layers,
                         last_layers=run.layout.last_layers)


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


def _breakdown(plan: PipelinePlan, trace, costs: StageCosts, unit, ends,
               notes: list[str]) -> tuple[DefaultBreakdown, tuple[float, ...]]:
    """The busiest device's terms (the most op time; with uneven stages, e.g. an MoE model's dense
    first layers, the device that ends last may be a light one that mostly waits); its idle time
    until the step ends is the bubble. Also each device's op time (:mod:`.balance`)."""
    step_ends = [e.end for e in ends]
    if unit is None:    # a device's busy time is its ops' durations
        busy = [plan.passes * sum(sum(costs.durations[st.index]) for st in plan.on_device(d)) for d in range(plan.p)]
    else:
        busy = [float(trace.busy(d)) for d in range(plan.p)]
    crit = max(range(plan.p), key=lambda i: (busy[i], step_ends[i]))
    mine = [costs.parts[st.index] for st in plan.on_device(crit)]
    sums = [plan.passes * sum(x[i] for x in mine) for i in range(6)]
    hidden = 0.0   # all-to-all hidden inside the device's overlapped F&B units
    if unit is not None:
        sched = plan.schedule
        kind = {"F": 0, "B": 1, "W": 2}
        for i, k in sched.units[crit]:
            d = [costs.durations[op.stage][kind[op.kind]] for op in sched.orders[crit][i:i + k]]
            hidden += sum(d) - unit(*d)
        notes.append(f"{plan.name}: all-to-all hidden behind the paired chunk's compute, "
                     f"{hidden / max(sums[3], 1e-30):.0%} of the busiest device's")
    bd = DefaultBreakdown(compute_s=sums[0], tp_s=sums[1], cp_s=sums[2], p2p_s=sums[4], bubble_s=0.0,
                          dp_s=ends[crit].exposed + sums[5], a2a_s=max(sums[3] - hidden, 0.0), optimizer_s=ends[crit].optimizer)
    bd.bubble_s = max(max(step_ends) - bd.total_s, 0.0)
    return bd, tuple(float(b) for b in busy)


def reported_step_flops(run: Run, plan: PipelinePlan, selective: str = "attention") -> float:
    """FLOPs per step behind the reported TFLOP/s per GPU (:func:`..costs.flops.reported_flops`),
    the recomputed work as the stack recomputes it: torchtitan's per-op policy (``selective``
    "op": :func:`..costs.op_sac.recompute_flops`), Megatron-core's block method (the layers
    ``plan`` recomputes, :meth:`..plan.PipelinePlan.recomputed_layers`), else the level's count."""
    tr = run.training
    if tr.recompute == "selective" and selective == "op":
        recomputed = op_sac.recompute_flops(run.model, tr.global_batch, tr.seq_len, tr.precision == "fp8")
    elif tr.partial_recompute:
        recomputed = flops.recomputed_layers_flops(run.model, tr.global_batch, tr.seq_len,
                                                   *plan.recomputed_layers(run.model, tr))
    else:
        recomputed = None
    return flops.reported_flops(run.model, tr, recomputed)


def _finish(run: Run, hw: Hardware, eff: Efficiency, framework: Framework, T: float, bd: DefaultBreakdown,
            plan: PipelinePlan, notes: list[str], stage_layers: tuple[int, ...],
            segments: tuple[list, list] | None = None, busy: tuple[float, ...] = ()) -> Prediction:
    """The step of ``flushes`` schedule runs (:func:`..plan.flushes`), each timed as ``T`` with its
    breakdown ``bd``: every term repeats with each run, the optimizer steps once. ``segments``:
    one run's timeline and its optimizer steps (:mod:`.timeline`), repeated as the step is;
    ``busy``: one run's op time on each pipeline device, repeated too."""
    tr = run.training
    f = plans.flushes(run.layout, tr)
    line = repeated(segments[0], f, T - bd.optimizer_s, segments[1]) if segments is not None else ()
    if f > 1:
        opt = bd.optimizer_s
        T = f * (T - opt) + opt
        bd = DefaultBreakdown(**{k: (v if k == "optimizer_s" else f * v) for k, v in bd.as_dict().items()})
        notes.append(plans.flushes_note(f, plan.m, tr.local_batch))
    F = reported_step_flops(run, plan, framework.selective)
    n = run.layout.gpus
    work = flops.causal_model_flops(run.model, tr.global_batch, tr.seq_len)
    return Prediction(step_time_s=T, tflops_per_gpu=F / (n * T) / 1e12, mfu=work / (n * T * mfu_peak(hw, tr)),
                      breakdown=bd, flops_per_step=F, microbatches=plan.m, vpp=plan.v, schedule=plan.name,
                      notes=notes, mode="default", eta=eff.gemm, stage_layers=stage_layers,
                      pipeline_method="simulation", plan=plan, flushes=f, timeline=line,
                      device_busy_s=tuple(f * b for b in busy))


def small_node_note(hw: Hardware, gpus_per_node: int | None) -> str | None:
    """What a run or search is told when its nodes hold fewer accelerators than ``hw``'s fast links
    join (``hw.per_node``: an NVLink domain, 72 on a GB200 NVL72 rack, or a TPU pod's ICI domain):
    modelcut's node is that domain, so every group past ``gpus_per_node`` is charged the network.
    None where the nodes are whole domains (or ``gpus_per_node`` is None: the device's own)."""
    gpn = gpus_per_node or hw.per_node
    if gpn >= hw.per_node:
        return None
    return (f"nodes of {gpn}: {hw.name}'s fast links can join {hw.per_node} (modelcut's node is what they join: "
            f"an NVLink or ICI domain), so groups past {gpn} are charged the network "
            f"(gpus_per_node = {hw.per_node} for whole domains)")


def predict(run: Run, hw: Hardware, eff: Efficiency, framework: Framework, timeline: bool = False) -> Prediction:
    """One run's step time under the default model (module doc), on the stack ``framework``
    (a :class:`.frameworks.Framework`, its overlap overrides applied). With several pipeline
    schedule runs a step (:func:`..plan.flushes`) one run is timed, its batch
    :func:`..plan.flush_training`'s, and the step repeats it (:func:`_finish`). ``timeline``: keep
    the step's :mod:`.timeline` in the prediction (not for DeepSpeed v0.3's ZeRO-3 replay).
    The stack as the run sets it (:meth:`.frameworks.Framework.for_training`: its gradients'
    reduce type)."""
    framework = framework.for_training(run.training)
    full = stack_run(run, framework)
    run = one_schedule_run(full)
    L = run.layout
    notes: list[str] = [f"framework {framework.name}"]
    if run.training.grad_reduce is not None:
        notes.append(f"gradients reduced in {run.training.grad_reduce} across data parallelism "
                     f"({framework.grad_bytes} bytes an element on the wire; the run's grad_reduce)")
    plan = default_plan(run)
    eager = mcore_eager_paths(run.model) if framework.mcore_layers else ()
    if eager:
        notes.append("Megatron-core runs eagerly: " + ", ".join(MCORE_EAGER_PATHS[e] for e in eager)
                     + (f" (YaRN attention factor {run.model.rope_mscale:.4g})" if "rope" in eager else ""))
    if run.training.recompute_layers is not None:
        d, e = plan.recomputed_layers(run.model, run.training)
        notes.append(f"full recomputation of the first {run.training.recompute_layers} layers of each pipeline chunk "
                     f"(Megatron-core's --recompute-method block): {d + e:g} of {run.model.layers} layers a "
                     "micro-batch, the rest kept whole")
    elif run.training.partial_recompute:
        d, e = plan.recomputed_layers(run.model, run.training)
        notes.append(f"full recomputation of one layer in {run.training.recompute_every} on each pipeline rank "
                     f"(torchtitan's per-layer selective checkpointing, selective_ac_option "
                     f"\"{run.training.recompute_every}\"): {d + e:g} of {run.model.layers} layers a micro-batch, "
                     "the rest kept whole")
    mods = run.training.recompute_modules
    if mods:
        idle = [] if run.model.is_moe else [m for m in mods if m != "core_attn"]
        notes.append("selective recomputation of " + ", ".join(mods)
                     + (f" ({', '.join(idle)}: nothing to recompute in a dense layer, whose input norm is fused "
                        "into its QKV product)" if idle else ""))
    f8 = fp8_mod.for_stack(run.training, hw, framework)
    if f8 is not None and f8.torchao and not f8.compiled:
        notes.append(f"FP8 through torchao in eager PyTorch: every cast runs as six kernels "
                     f"({fp8_mod.EAGER_OPERAND_BYTES:g} bytes an input, output-gradient or weight element a "
                     f"micro-batch); torchao's float8 needs torch.compile to pay off (--framework fsdp-compile, torchtitan's)")
    if plan.p > 1 and framework.overlap.p2p_async and not framework.p2p_overlapped(plan.v):
        notes.append("pipeline sends hold both devices: Megatron-core overlaps them only in its interleaved schedule")
    if plan.p > 1 and framework.p2p_sequential and not framework.p2p_overlapped(plan.v):
        notes.append("pipeline exchanges hold both devices for a send and then a receive, one after the other "
                     "(DeepSpeed's pipeline engine), twice Megatron-LM's batched pair")
    gpn = run.gpus_per_node or hw.per_node
    small = small_node_note(hw, gpn)
    if small:
        notes.append(small)
    if L.tp > 1 and comm.group_spans_nodes(L, "tp", gpn):
        notes.append(f"tensor parallelism spans nodes: its groups of {L.tp} reach past a node of {gpn}, so every "
                     "layer's tensor-parallel collectives cross the network (explore keeps tp inside a node "
                     "unless --allow-tp-across-nodes)")
    bw = comm.group_bandwidths(L, hw, gpn, framework.multi_nic_rings)
    k = kernels(run, hw, eff, framework, bw)
    if L.zero == 3 and L.pp == 1:
        streams: list | None = [] if timeline else None
        T, bd = zero3_step(run, hw, eff, framework, k, plan, bw, notes, streams)
        segs = None
        if streams:      # DeepSpeed v0.3's replay keeps none
            segs = (streams, [optimizer_segment("compute", T - bd.optimizer_s, bd.optimizer_s)])
        return _finish(full, hw, eff, framework, T, bd, plan, notes, (run.model.layers,), segs)
    costs = stage_costs(run, hw, eff, framework, plan, k, bw)
    sched = plan.schedule
    unit = (_overlapped_unit(costs.durations, costs.a2a_fb) if sched.units and any(a or b for a, b in costs.a2a_fb)
            else None)
    p2p = costs.tau if framework.p2p_overlapped(plan.v) else 0.0
    if unit is None:    # layouts of one schedule shape share their simulation (scaled)
        trace = simulated_trace(plan, costs.durations, p2p)
    else:
        trace = simulate(sched, Timing(stage_durations=costs.durations, p2p=p2p, overlap=unit), validate=False)
    ends = device_ends(run, hw, eff, framework, plan, trace, bw)
    bd, busy = _breakdown(plan, trace, costs, unit, ends, notes)
    if len(set(plan.layers)) > 1:
        notes.append(f"uneven stages: {min(plan.layers)} to {max(plan.layers)} layers per chunk")
    uneven = pipeline_balance(plan, busy)
    if uneven is not None:
        notes.append(uneven.sentence())
    segs = None
    if timeline:
        lasts = [e.end - e.exposed - e.optimizer for e in ends]
        segs = (pipeline_segments(sched.orders, trace.starts, trace.ends,
                                  [(last, e.exposed) for last, e in zip(lasts, ends)]),
                [optimizer_segment(device_track(d), e.end - e.optimizer, e.optimizer) for d, e in enumerate(ends)])
    return _finish(full, hw, eff, framework, max(e.end for e in ends), bd, plan, notes, plan.layers, segs, busy)
