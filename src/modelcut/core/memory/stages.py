"""Memory per device of each pipeline rank (the package docstring gives every term)."""

from __future__ import annotations

from dataclasses import asdict, dataclass, replace
from typing import Any

import numpy as np

from .. import plan as plans
from ..costs import comm
from ..costs import fp8 as fp8_mod
from ..costs import params as counts
from ..costs.fp8 import Fp8
from ..costs.residency import Residency, residency_under
from ..errors import ModelcutError
from ..plan import PipelinePlan
from ..sim import registry
from ..specs import BLOCKS, DEFAULT_RECOMPUTE_MODULES, EVERY, Hardware, Run, recompute_variant
from ..step.frameworks import Framework
from ..step.zero3 import deepspeed_resident_numel
from ..units import FP32_BYTES, GRAD_BYTES, GiB, OPTIMIZER_STATE_BYTES, WEIGHT_BYTES
from .activations import (LOGIT_BYTES, LOSS_BYTES, cp_transient_bytes, embedding_activation_bytes, layer_activation_bytes,
                          loss_activation_bytes, loss_transient_bytes)


@dataclass(frozen=True)
class MemoryOptions:
    """Assumptions the memory model does not read off the run.

    ``flash_attention``: no s² score matrix (default on; Korthikanti et al.'s Table 2 is
    without it). ``reshard_after_forward``: ZeRO-3 frees gathered weights after each
    layer's forward (FSDP's default); off, as Llama 3 ran, it keeps the stage's BF16 weights.
    ``microbatch_group``: the interleaved schedule's N (Megatron-LM's
    ``--microbatch-group-size-per-virtual-pipeline-stage``; default p).
    ``buffer_fixed_bytes``: allowance for the CUDA context and library workspaces (about
    0.5–1 GiB on current GPUs) and NCCL communicator buffers (NCCL_BUFFSIZE, 4 MiB, per
    channel and peer, over the tp, cp, pp and dp communicators): 2 GiB in all, an allowance,
    not a measurement. ``fragmentation``: the caching allocator's reserved-but-unused share,
    as a fraction of the bytes the step allocates and frees, the activations and ZeRO-3's
    gathered weights (5 %, an allowance; :func:`_total`). ``fp8``: FP8 weight copies (their own
    line, :func:`..costs.fp8.weight_copy_bytes` per linear parameter held unsharded) and linear
    inputs kept in FP8.
    ``reshard_with_pipeline``/``pipeline_grad_sync``/``flat_grad_sync``: the stack's resharding with a
    pipeline and its gradient reduction under ZeRO-2/3 with one and without (:func:`..costs.residency.residency`, the rule
    the step-time model reads too). ``grad_bytes``: bytes per element of the gradient buffer
    (4, FP32 ``main_grad``; 2 where the stack keeps it in the parameters' 16-bit dtype: the
    framework's ``grad_buffer_bytes``); ``whole_grad_bytes``: a dense parameter's gradient bytes
    where ZeRO-2/3 holds the gradients whole between reductions (the framework's
    ``unsharded_grad_bytes``; None: ``grad_bytes``). ``zero3_runtime``/``zero3_prefetch``: the stack's ZeRO-3
    runtime and whether it prefetches; under DeepSpeed v0.3's (``"deepspeed-0.3"``, no pipeline)
    the gathered weights are what its hooks hold at most, weight by weight
    (:func:`..step.zero3.deepspeed_resident_numel`, the replay the step time runs), not two whole
    layers. ``param_bytes``/``optimizer_bytes``: bytes per parameter of the
    stored weights and the optimizer states (2 + 12, 16-bit weights beside FP32 master weights and
    Adam moments; 4 + 8, FSDP's FP32 sharded parameters as the master copy; 2 + 4, bf16
    throughout: the framework's fields of the same names). ``cp_impl``: whose context
    parallelism, for its buffers (:func:`.activations.cp_transient_bytes`). ``selective``: the
    stack's selective recomputation, "attention" (Megatron-LM's) or "op" (torchtitan's per-op
    policy, :mod:`..costs.op_sac`: a dense layer keeps fewer bytes, and the layer being recomputed
    holds the rest again while its backward runs). ``cross_entropy``: the stack's loss kernel, where
    the run names none (:data:`.activations.LOSS_BYTES`: what it keeps of the logits and holds
    while it runs).
    """

    flash_attention: bool = True
    reshard_after_forward: bool = True
    microbatch_group: int | None = None
    buffer_fixed_bytes: float = 2 * GiB
    fragmentation: float = 0.05
    fp8: Fp8 | None = None      # the run's FP8 as its stack keeps it (:mod:`..costs.fp8`)
    reshard_with_pipeline: bool | None = None
    pipeline_grad_sync: str = "microbatch"
    flat_grad_sync: str = "microbatch"
    grad_bytes: float = GRAD_BYTES
    whole_grad_bytes: float | None = None
    zero3_runtime: str = "unit"
    zero3_prefetch: bool = True
    param_bytes: float = WEIGHT_BYTES
    optimizer_bytes: float = OPTIMIZER_STATE_BYTES
    cp_impl: str = "transformer-engine"
    selective: str = "attention"
    cross_entropy: str | None = None

    def residency(self, zero: int, pp: int, microbatches: int) -> Residency:
        """What a rank keeps resident under these assumptions (:func:`..costs.residency.residency`)."""
        return residency_under(self, zero, pp, microbatches)


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
    fp8_weights_bytes: float
    activations_bytes: float
    buffers_bytes: float
    total_bytes: float
    microbatches_in_flight: float  # peak, in micro-batches of this device's whole share

    def as_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d["chunk_layers"] = list(self.chunk_layers)
        return d

def memory_plan(run: Run, options: MemoryOptions = DEFAULT_OPTIONS, vpp: int | None = None,
                schedule: str | None = None, stage_layers: tuple[int, ...] | None = None) -> PipelinePlan:
    """The pipeline a run's memory describes when no step model has resolved one: ``vpp`` (or the
    layout's, or the schedule's fixed chunk count, else 1) chunks under ``schedule`` (or the
    layout's, or the registry's default), the even split unless ``stage_layers`` or the layout's
    first/last layers say otherwise, the options' micro-batch group; over the micro-batches of one
    pipeline schedule run (:func:`..plan.flush_training`), the activations one run holds."""
    lay = run.layout
    name = schedule or lay.schedule
    spec = registry.get(name) if name is not None else None
    v = vpp or lay.vpp or (spec.default_chunks if spec is not None and spec.fixed_chunks else 1)
    return plans.resolve(run.model, lay, plans.flush_training(lay, run.training), v=v, schedule=name,
                         stage_layers=stage_layers,
                         first_layers=lay.first_layers, last_layers=lay.last_layers,
                         group=options.microbatch_group)


def shard_groups(run: Run) -> tuple[int, int]:
    """(D, D_expert): how many ranks share a ZeRO shard of dense and of expert parameters.
    Dense: dp·cp, as Megatron-LM's distributed optimizer shards over the data-parallel group
    with context parallelism; with hybrid sharding the shard group's dp_shard·cp
    (:attr:`..specs.Layout.shard_ranks`), each replica holding the whole set. Experts:
    tp·cp·dp/(ep·etp), Megatron-LM's expert data-parallel group (:func:`..costs.comm.expert_dp_size`,
    the group their collectives run over too)."""
    lay = run.layout
    return lay.shard_ranks, comm.expert_dp_size(lay)


def state_bytes(params: float, expert_params: float, zero: int, d: int, de: int,
                gathered_params: float, grads_sharded: bool | None = None,
                grad_bytes: float = GRAD_BYTES, param_bytes: float = WEIGHT_BYTES,
                optimizer_bytes: float = OPTIMIZER_STATE_BYTES,
                whole_grad_bytes: float | None = None) -> tuple[float, float, float]:
    """(weights, gradients, optimizer) bytes for a device's parameters (module table).

    ``gathered_params``: parameters ZeRO-3 holds unsharded while computing (one layer being
    used and one prefetched, or the whole stage without resharding); ``grads_sharded``: only the
    shard of the gradients is kept (None: zero ≥ 2; False where the stack accumulates them whole,
    :attr:`..costs.residency.Residency.grads_sharded`); ``grad_bytes``: bytes per gradient
    element (the table's 4, or 2 for a 16-bit buffer); ``param_bytes``/``optimizer_bytes``: the stack's
    bytes per stored weight and per parameter of optimizer state (the table's 2 and 12); ZeRO-3's
    gathered copy is 16-bit whatever they are. ``whole_grad_bytes``: where ZeRO-2/3 gradients are
    held whole between reductions, the bytes a dense parameter's take (FSDP2 accumulates them in its
    reduce dtype); None: ``grad_bytes``."""
    g_shard = zero >= 2 if grads_sharded is None else grads_sharded

    def one(n: float, D: int, g_b: float) -> tuple[float, float, float]:
        w = param_bytes * n / (D if zero >= 3 else 1)
        g = g_b * n / (D if g_shard else 1)
        o = optimizer_bytes * n / (D if zero >= 1 else 1)
        return w, g, o
    dense_g = whole_grad_bytes if whole_grad_bytes is not None and zero >= 2 and not g_shard else grad_bytes
    a, b = one(params, d, dense_g), one(expert_params, de, grad_bytes)
    w = a[0] + b[0] + gathered_bytes(zero, gathered_params)
    return w, a[1] + b[1], a[2] + b[2]


def gathered_bytes(zero: int, gathered_params: float) -> float:
    """Bytes of ZeRO-3's gathered 16-bit copy of ``gathered_params`` parameters (none below
    ZeRO-3)."""
    return WEIGHT_BYTES * gathered_params if zero >= 3 else 0.0


def _activations(run: Run, options: MemoryOptions, plan: PipelinePlan, recompute: str,
                 cached: bool = True) -> tuple[np.ndarray, np.ndarray]:
    """Per device: peak activation bytes (with full recomputation's one-layer working set and the
    context-parallel buffers of the one layer being computed) and the bytes of one micro-batch
    through all its chunks, under the recomputation variant ``recompute`` (a level or a module
    list, :func:`..specs.recompute_variant`)."""
    model, lay, tr = run.model, run.layout, run.training
    sp = bool(lay.sequence_parallel) and lay.tp > 1
    kw = dict(micro_batch=tr.micro_batch, seq=tr.seq_len, t=lay.tp, cp=lay.cp, sequence_parallel=sp)
    ce = tr.cross_entropy or options.cross_entropy
    # a variant's own modules; else the run's for the run's own level, the default at another level
    recompute, named = recompute_variant(recompute)
    modules = named or (tr.selective_modules if recompute == tr.recompute else DEFAULT_RECOMPUTE_MODULES)
    akw = dict(kw, recompute=recompute, flash_attention=options.flash_attention, etp=lay.etp, cp_kind=lay.cp_form,
               fp8=options.fp8 is not None and options.fp8.saves_fp8_inputs, recompute_modules=modules,
               selective=options.selective, fp8_products=options.fp8 is not None, ep=lay.ep,
               act_fp8_input=tr.activation_func_fp8_input_store)
    unit = np.array([layer_activation_bytes(model, **akw),
                     layer_activation_bytes(model, moe=True, **akw) if model.is_moe else 0.0,
                     embedding_activation_bytes(model, **kw),
                     loss_activation_bytes(model, cross_entropy=ce, **kw)])
    # each stage's counts of the units: (dense, MoE layers, embedding, loss); with a partial rule
    # (recompute_layers: a stage's first layers; recompute_every: every k-th of its rank's) the layers
    # the plan recomputes keep their input, the rest all they save
    partial = recompute == "full" and tr.partial_recompute
    if partial:
        whole = dict(akw, recompute="none")
        unit = np.array([unit[0], layer_activation_bytes(model, **whole), unit[1],
                         layer_activation_bytes(model, moe=True, **whole) if model.is_moe else 0.0, unit[2], unit[3]])
        split = {st.index: st.recomputed(model, tr) for st in plan.stages}
        rows = {st.index: (split[st.index][0], st.dense_layers - split[st.index][0], split[st.index][1],
                           st.moe_layers - split[st.index][1], float(st.embedding), float(st.loss))
                for st in plan.stages}
        coefs = plan.in_flight(cached, tuple(rows[st.index] for st in plan.stages))
    else:
        rows = {st.index: (st.dense_layers, st.moe_layers, float(st.embedding), float(st.loss)) for st in plan.stages}
        coefs = plan.in_flight(cached)
    share = np.array([sum(sum(n * u for n, u in zip(rows[st.index], unit)) for st in plan.on_device(d))
                      for d in range(plan.p)])
    peaks = np.array([float((c @ unit).max()) if len(c) else 0.0 for _, c in coefs])
    transient = cp_transient_bytes(model, micro_batch=tr.micro_batch, seq=tr.seq_len, t=lay.tp, cp=lay.cp,
                                   cp_kind=lay.cp_form, cp_impl=options.cp_impl)
    work_d = work_m = 0.0
    if recompute == "full":
        work_d = layer_activation_bytes(model, **dict(akw, recomputing=True))
        work_m = layer_activation_bytes(model, moe=True, **dict(akw, recomputing=True)) if model.is_moe else 0.0
    elif recompute == "selective" and options.selective == "op":
        # the per-op policy's layer being recomputed holds what it did not keep again
        work_d = layer_activation_bytes(model, **dict(akw, recomputing=True)) - unit[0]
        work_m = (layer_activation_bytes(model, moe=True, **dict(akw, recomputing=True)) - unit[1]
                  if model.is_moe else 0.0)
    loss_work = loss_transient_bytes(model, micro_batch=tr.micro_batch, seq=tr.seq_len, t=lay.tp, cp=lay.cp,
                                     cross_entropy=ce)
    for d in range(plan.p):
        mine = plan.on_device(d)
        if any(st.loss for st in mine):
            peaks[d] += loss_work
        if any(st.layers for st in mine):
            peaks[d] += transient
            # the layer being recomputed: a device's recomputed layers (all, or the block method's)
            rec = [split[st.index] for st in mine] if partial else [(st.dense_layers, st.moe_layers) for st in mine]
            peaks[d] += max(work_m if any(r_m for _, r_m in rec) else 0.0,
                            work_d if any(r_d for r_d, _ in rec) else 0.0)
    return peaks, share


def _device_params(run: Run, plan: PipelinePlan) -> list[tuple[float, float, float, dict[str, Any]]]:
    """Per device: (dense parameters, expert parameters, largest unit ZeRO-3 gathers, info), from the
    modules its stages hold (:func:`..costs.params.device_modules`, the count the data-parallel
    collectives move too)."""
    model, lay = run.model, run.layout
    out = []
    for d in range(plan.p):
        mine = plan.on_device(d)
        mods = [m for ms in counts.device_modules(model, lay.tp, lay.ep, lay.etp,
                                                  [(st.dense_layers, st.moe_layers, st.embedding, st.loss)
                                                   for st in mine]) for m in ms]
        info = dict(layers=sum(st.layers for st in mine), chunk_layers=tuple(st.layers for st in mine),
                    embedding=any(st.embedding for st in mine), output=any(st.loss for st in mine))
        # the transformer layers' weights (the linears FP8 copies; norms are negligible beside them)
        dense_l = sum(counts.layer_params(model, lay.tp, False))
        moe_l = sum(counts.layer_params(model, lay.tp, True, lay.ep, lay.etp)) if model.is_moe else 0.0
        layer_p = sum(st.dense_layers * dense_l + st.moe_layers * moe_l for st in mine)
        info["_layer_params"] = layer_p
        out.append((sum(a for a, _ in mods), sum(b for _, b in mods), max((a + b for a, b in mods), default=0.0),
                    info))
    return out


def _fp8_copies(run: Run, options: MemoryOptions, params, zero: int, plan: PipelinePlan) -> np.ndarray:
    """Per device: the FP8 weight copies' bytes (:func:`..costs.fp8.weight_copy_bytes` per
    transformer-layer parameter it holds unsharded; with ZeRO-3 only the layers it has gathered)."""
    f8 = options.fp8
    if f8 is None:
        return np.zeros(len(params))
    per = fp8_mod.weight_copy_bytes(f8)
    res = options.residency(zero, plan.p, plan.m)
    rows = []
    for dense, expert, unit, info in params:
        held = info["_layer_params"]
        if zero >= 3 and not res.whole_weights_resident:
            held = min(2 * unit, held)
        rows.append(per * held)
    return np.array(rows)


def _replays_hooks(run: Run, options: MemoryOptions, zero: int, plan: PipelinePlan) -> bool:
    """Whether the gathered weights are DeepSpeed v0.3's replay's (:func:`..step.zero3.deepspeed_resident_numel`):
    ZeRO-3 on that runtime, no pipeline, a dense model. The replay follows the run's recomputation
    (a recomputed forward gathers its weights again), so its count is each variant's own."""
    return zero >= 3 and options.zero3_runtime == "deepspeed-0.3" and plan.p == 1 and not run.model.is_moe


def _states(run: Run, options: MemoryOptions, params, zero: int, plan: PipelinePlan) -> np.ndarray:
    """Per device: (weights, gradients, optimizer, gathered) bytes under a ZeRO stage, what is
    resident as :func:`..costs.residency.residency` says (the rule the step time reads); the
    weights include ZeRO-3's gathered copy, and ``gathered`` repeats it apart (the weights the step
    gathers and frees, which :func:`_total`'s fragmentation counts)."""
    d, de = shard_groups(run)
    res = options.residency(zero, plan.p, plan.m)
    rows = []
    hooks = _replays_hooks(run, options, zero, plan)
    for dense, expert, unit, _ in params:
        if hooks:
            gathered = min(deepspeed_resident_numel(run, plan.m, options.zero3_prefetch), dense + expert)
        elif zero >= 3:
            gathered = dense + expert if res.whole_weights_resident else min(2 * unit, dense + expert)
        else:
            gathered = 0.0
        rows.append(state_bytes(dense, expert, zero, d, de, gathered, res.grads_sharded, options.grad_bytes,
                                options.param_bytes, options.optimizer_bytes, options.whole_grad_bytes)
                    + (gathered_bytes(zero, gathered),))
    return np.array(rows).reshape(len(rows), 4)


def _total(options: MemoryOptions, tensors: np.ndarray, churned: np.ndarray) -> np.ndarray:
    """Device bytes: the ``tensors``, the fixed allowance, and ``fragmentation`` times the bytes
    the step allocates and frees (``churned``: the activations and ZeRO-3's gathered weights).
    The weights, the gradients, the optimizer states and FP8 weight copies are allocated at the
    same sizes step after step and held through it (gradients a stack sets to None come back at
    the same sizes in the same order), so they leave no freed blocks of other sizes behind: the
    caching allocator fragments where freed blocks cannot serve later requests of other sizes
    (blocks of different segments never merge; a segment is its request rounded up to 2 MiB,
    20 MiB between 1 and 10 MiB: E. Yang, "When does fragmentation occur in the CUDA caching
    allocator?", pytorch/devlogs content/eager/2026-06-01-cuda-caching-allocator.md)."""
    return tensors + options.buffer_fixed_bytes + options.fragmentation * churned


def stage_memory(run: Run, hw: Hardware | None = None, *, options: MemoryOptions = DEFAULT_OPTIONS,
                 plan: PipelinePlan | None = None, vpp: int | None = None, schedule: str | None = None,
                 stage_layers: tuple[int, ...] | None = None, cached: bool = True) -> list[StageMemory]:
    """Memory of one device of each pipeline rank (the package docstring gives every term), for
    ``plan`` (pass a prediction's, so memory and time describe the same pipeline), or for the
    plan :func:`memory_plan` resolves from ``vpp``, ``schedule`` and ``stage_layers``."""
    plan = plan or memory_plan(run, options, vpp, schedule, stage_layers)
    acts, share = _activations(run, options, plan, run.training.recompute, cached)
    params = _device_params(run, plan)
    held = _states(run, options, params, run.layout.zero_stage, plan)
    states, gathered = held[:, :3], held[:, 3]
    copies = _fp8_copies(run, options, params, run.layout.zero_stage, plan)
    if options.fp8 is not None and options.fp8.param_gather:
        states[:, 0] += copies          # FP8 parameters: the FP8 weights are the weights
        copies = np.zeros_like(copies)
    totals = _total(options, states.sum(axis=1) + copies + acts, acts + gathered)
    out = []
    for dev in range(plan.p):
        w, g, o = (float(x) for x in states[dev])
        tensors = w + g + o + float(copies[dev]) + float(acts[dev])
        info = {k: v for k, v in params[dev][3].items() if not k.startswith("_")}
        out.append(StageMemory(
            stage=dev, **info, weights_bytes=w, gradients_bytes=g, optimizer_bytes=o,
            fp8_weights_bytes=float(copies[dev]),
            activations_bytes=float(acts[dev]), buffers_bytes=float(totals[dev]) - tensors,
            total_bytes=float(totals[dev]),
            microbatches_in_flight=float(acts[dev] / share[dev]) if share[dev] else 0.0))
    return out


def variant_peaks(run: Run, plan: PipelinePlan, variants: list[tuple[str, int]], *,
                  options: MemoryOptions = DEFAULT_OPTIONS) -> dict[tuple[str, int], float]:
    """Peak device bytes of the run under each (recompute, zero) variant, sharing the pipeline,
    activation and parameter work between variants (the explorer's fast path; the same numbers
    as :func:`stage_memory`). A :data:`..specs.BLOCKS` variant recomputes the run's own
    ``recompute_layers``, an :data:`..specs.EVERY` variant its ``recompute_every``."""
    if run.training.recompute_layers is None and any(r == BLOCKS for r, _ in variants):
        raise ModelcutError(f"the {BLOCKS} variant needs the run's recompute_layers (how many layers a chunk "
                            "recomputes whole)")
    if run.training.recompute_every is None and any(r == EVERY for r, _ in variants):
        raise ModelcutError(f"the {EVERY} variant needs the run's recompute_every (one layer in how many a rank "
                            "recomputes whole)")
    params = _device_params(run, plan)
    # each variant's own modules: none from the run the variants share
    bare = replace(run, training=replace(run.training, recompute_modules=None))
    acts = {r: _activations(bare, options, plan, r)[0] for r in {r for r, _ in variants}}

    def state_key(r: str, z: int) -> tuple[str | None, int]:   # the replay's count is the variant's own
        return (r if _replays_hooks(run, options, z, plan) else None, z)

    def own(r: str) -> Run:
        level, modules = recompute_variant(r)
        return replace(run, training=replace(run.training, recompute=level, recompute_modules=modules))

    keys = {state_key(r, z): r for r, z in variants}     # each state once (one per ZeRO stage but the replay's)
    states = {k: _states(own(r) if k[0] else run, options, params, k[1], plan) for k, r in keys.items()}
    held = {k: st[:, :3].sum(axis=1) + _fp8_copies(run, options, params, k[1], plan) for k, st in states.items()}
    return {(r, z): float(_total(options, acts[r] + held[state_key(r, z)], acts[r] + states[state_key(r, z)][:, 3]).max())
            for r, z in variants}


def peak_bytes(stages: list[StageMemory]) -> float:
    """The largest device total: what the accelerator must hold."""
    return max(s.total_bytes for s in stages)


def stack_options(framework: Framework, options: MemoryOptions = DEFAULT_OPTIONS) -> MemoryOptions:
    """The memory assumptions a training stack sets, whatever the run: its attention kernel (the
    score matrix or not), its ZeRO-3 resharding and runtime, its gradient reduction under a
    pipeline, the data types it keeps weights, gradients and optimizer states in. The one place
    that reads a :class:`..step.frameworks.Framework` for memory (``predict`` and the explorer)."""
    return replace(options, flash_attention=framework.attention != "unfused",
                   reshard_after_forward=framework.reshard_after_forward,
                   reshard_with_pipeline=framework.reshard_with_pipeline,
                   pipeline_grad_sync=framework.pipeline_grad_sync, flat_grad_sync=framework.flat_grad_sync,
                   grad_bytes=float(framework.grad_buffer_bytes), zero3_runtime=framework.zero3_runtime,
                   whole_grad_bytes=(None if framework.unsharded_grad_bytes is None
                                     else float(framework.unsharded_grad_bytes)),
                   zero3_prefetch=framework.overlap.param_gather, param_bytes=float(framework.param_bytes),
                   optimizer_bytes=float(framework.optimizer_bytes), cp_impl=framework.cp_impl,
                   selective=framework.selective, cross_entropy=framework.cross_entropy)


def for_framework(run: Run, framework: Framework, options: MemoryOptions = DEFAULT_OPTIONS,
                  hw: Hardware | None = None) -> tuple[Run, MemoryOptions]:
    """The run and memory assumptions a training stack implies.

    * Megatron-LM's distributed optimizer (``--use-distributed-optimizer``, on in Megatron-core's
      and NeMo's recipes) shards the FP32 main parameters and Adam moments over dp·cp and keeps
      the whole FP32 gradient buffer: ZeRO-1's row of the package table, 6 + 12/D bytes per
      parameter (megatron/training/theoretical_memory_usage.py), so the run is counted with
      zero ≥ 1; a layout that leaves its ZeRO stage or sequence parallelism open gets the
      stack's (``Framework.resolve``, as the step model does: FSDP's presets at ZeRO-3);
    * FlashAttention (no s² score matrix) unless the stack runs the unfused softmax attention;
    * ZeRO-3/FSDP keep or free the gathered weights after the forward as the stack does;
    * the gradient buffer in the stack's dtype (``grad_buffer_bytes``: FP32, or 16-bit where the
      stack reduces gradients in 16 bits), or in the run's ``grad_reduce`` type where the stack
      reduces that buffer in place (``Framework.for_training``);
    * context parallelism in the stack's form when the layout leaves it open;
    * FP8 as the stack runs it on ``hw`` (its weight copies, its FP8-kept inputs);
    * Adam's moments in the run's ``adam_moments`` type where it names one (:func:`optimizer_state_bytes`)."""
    framework = framework.for_training(run.training)
    run = framework.resolve(run)
    opts = stack_options(framework, options)
    opts = with_moments(opts, run.training.moment_bytes)
    if hw is not None and run.training.precision == "fp8":
        opts = replace(opts, fp8=fp8_mod.for_stack(run.training, hw, framework))
    return run, opts


def _state_parts(options: MemoryOptions) -> tuple[float, float]:
    """(master-weight bytes, bytes of each Adam moment) per parameter in ``optimizer_bytes``: with
    FP32 weights (``param_bytes`` 4, FSDP's sharded parameters) no master copy; with 16-bit weights
    an FP32 master copy where the states hold more than two 16-bit moments (12: FP32 moments, 8:
    16-bit ones beside it), none where they hold just those (4, NeMo AutoModel's bf16 throughout)."""
    ob = options.optimizer_bytes
    master = 0.0 if options.param_bytes >= 4 or ob <= 4 else float(FP32_BYTES)
    return master, (ob - master) / 2


def optimizer_state_bytes(options: MemoryOptions, moment_bytes: float) -> float:
    """Optimizer-state bytes per parameter with Adam's moments of ``moment_bytes`` each (the run's
    ``adam_moments``): the stack's master copy, :func:`_state_parts`, and the two moments. A stack
    that keeps 16-bit weights and moments with no master copy takes no FP32 moments (one line)."""
    master, moment = _state_parts(options)
    if moment_bytes > moment and master == 0.0 and options.param_bytes < 4:
        raise ModelcutError("adam_moments fp32: this stack keeps its weights and Adam's moments in 16 bits with no "
                            "master copy (bf16 throughout)")
    return master + 2 * moment_bytes


def with_moments(options: MemoryOptions, moment_bytes: float | None) -> MemoryOptions:
    """The options with Adam's moments of ``moment_bytes`` each (a run's ``adam_moments``,
    :attr:`..specs.Training.moment_bytes`; None: the stack's, unchanged): :func:`optimizer_state_bytes`.
    ``predict`` (:func:`for_framework`) and the explorer's memory checks both apply it here."""
    if moment_bytes is None:
        return options
    return replace(options, optimizer_bytes=optimizer_state_bytes(options, moment_bytes))


def dtypes(options: MemoryOptions, half: str = "bf16", whole_grads: bool = False,
           cross_entropy: str | None = None) -> dict[str, str]:
    """The data type of each line of the memory table, as the memory model counts it; ``half``
    names the run's 16-bit type ("fp16" for an fp16 run, else "bf16"); ``whole_grads``: ZeRO-2/3
    holds the gradients whole between reductions (in ``whole_grad_bytes`` where the stack sets it);
    ``cross_entropy``: the run's loss kernel (None: the stack's), what it keeps of the logits."""
    f8 = options.fp8
    layers = ("fp8 weight and its fp8 transpose" if f8 is not None and f8.transposes and not f8.torchao
              else "fp8 weight")
    plain = {4: f"fp32 (the optimizer's master copy); {half} while gathered"}.get(int(options.param_bytes), half)
    master, moment = _state_parts(options)
    kind = "fp32" if moment >= FP32_BYTES else "bf16"      # a 16-bit moment beside a master copy: Megatron-core's
    optim = (f"fp32 master weights + {kind} Adam m and v" if master else
             f"{kind} Adam m and v (the fp32 weights are the master copy)" if options.param_bytes >= 4 else
             f"{half} Adam m and v ({half} weights, no master copy)")
    out = {"weights_bytes": f"transformer layers: {layers} (FP8 parameters); embedding, output, norms: {half}"
           if f8 is not None and f8.param_gather else plain,
           "gradients_bytes": ("fp32 (held whole between reductions, in the reduce dtype)" if whole_grads
                               else "fp32 (sharded, in the fp32 parameters' dtype)")
           if options.grad_bytes >= 4 and options.param_bytes >= 4      # FSDP with fp32 sharded parameters
           else "fp32 (main_grad accumulation buffer)" if options.grad_bytes >= 4
           else (f"fp32 for the dense weights' (accumulated whole in the reduce dtype), {half} for any routed experts'"
                 if whole_grads and (options.whole_grad_bytes or 0) >= 4
                 else f"{half} (the gradient buffer in the parameters' dtype)"),
           "optimizer_bytes": optim,
           "fp8_weights_bytes": "none" if f8 is None else
           (("gathered fp8 weight replacing the bf16 one" if f8.param_gather
             else "none kept (torchao casts the weights in each pass)") if f8.torchao else
            ("fp8 weight and its transpose (Hopper)" if f8.transposes else "fp8 weight")
            + (" replacing the bf16 copy" if f8.param_gather else " beside the bf16 copy")),
           "activations_bytes": f"{half} (fp32 log-sum-exp; "
           + (f"the loss keeps {half} logits)" if LOSS_BYTES[cross_entropy or options.cross_entropy][0] < LOGIT_BYTES
              else "the loss keeps fp32 logits)")
           + ("" if f8 is None else "; linear inputs in fp8" if f8.saves_fp8_inputs
              else f"; linear inputs in {half} (torchao saves them unquantized)")}
    return out




def memory_report(run: Run, hw: Hardware | None = None, *, plan: PipelinePlan | None = None,
                  options: MemoryOptions = DEFAULT_OPTIONS, framework: Framework | None = None) -> dict[str, Any]:
    """The JSON piece for ``predict --json``: ``{"stages": [{"stage", "layers", "weights_bytes",
    "gradients_bytes", "optimizer_bytes", "activations_bytes", "buffers_bytes", "total_bytes",
    ...}, ...], "peak_bytes", "assumptions", "capacity_bytes", "fits", "tensors_fit"}``, for
    ``plan`` (a prediction's) under the ``framework`` it assumed (:func:`for_framework`);
    ``tensors_fit``: every stage's tensors fit without the buffers allowance (where ``fits`` is
    false, the allowance, an estimate, is what takes the peak over)."""
    fw_name = None
    if framework is not None:
        run, options = for_framework(run, framework, options, hw)
        fw_name = framework.name
    plan = plan or memory_plan(run, options)
    stages = stage_memory(run, hw, options=options, plan=plan)
    peak = peak_bytes(stages)
    res = options.residency(run.layout.zero_stage, plan.p, plan.m)
    rep: dict[str, Any] = {
        "stages": [s.as_dict() for s in stages],
        "peak_bytes": peak,
        "assumptions": {
            "flash_attention": options.flash_attention,
            "reshard_after_forward": options.reshard_after_forward,
            "residency": {"weights": res.weights, "grads": res.grads},
            "buffer_fixed_bytes": options.buffer_fixed_bytes,
            "fragmentation": options.fragmentation,
            "zero": run.layout.zero_stage,
            "framework": fw_name,
            "fp8_recipe": options.fp8.recipe if options.fp8 is not None else None,
        },
        "dtypes": dtypes(options, run.training.half,
                         res.zero >= 2 and not res.grads_sharded, run.training.cross_entropy),
    }
    if hw is not None:
        rep["capacity_bytes"] = hw.mem_bytes
        rep["fits"] = peak <= hw.mem_bytes
        # over only by the allowance: the counted tensors of every stage fit, the estimate of the
        # context, NCCL buffers and fragmentation (MemoryOptions) takes it over
        rep["tensors_fit"] = max(s.total_bytes - s.buffers_bytes for s in stages) <= hw.mem_bytes
    return rep
