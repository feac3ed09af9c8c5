"""A valid lower bound on the default model's step time, cheap enough to compute for every layout
the explorer enumerates, so that it times only the layouts that can still win.

For a pipeline device d the step lasts at least as long as it computes, plus the time before its
first op can start, plus the time after its last op: T ≥ head_d + busy_d + tail_d.

* busy_d: every op it runs, each of its stages' forward and backward (recomputation and the
  weight gradient included) for each micro-batch through it, the very unit costs the step model
  sums (:func:`.stage_costs.unit_costs`), without what only adds to them (blocking sends, ZeRO-3's
  per-pass gathers, its data-parallel tail); overlapped F&B units (DualPipe) count their compute
  only, the all-to-all they may hide left out.
* head_d: its first op is the first micro-batch's forward through its lowest stage (stage d in
  both placements), which waits for that micro-batch's forwards through stages 0 … d − 1.
* tail_d: where the backward is not split, its last op is the last micro-batch's backward through
  stage d, after which stages d − 1 … 0 run that micro-batch's backwards (0 for split schedules,
  whose weight gradients may run alongside, and for DualPipe's two copies).

Without a pipeline under ZeRO-3 the compute stream runs every unit of every micro-batch
(:mod:`.zero3`): the bound is their sum. Where ZeRO-3 reshards (:mod:`..costs.residency`) a
pass lasts at least as long as its units' gathers on the one gather stream, so each stage's pass
counts the larger of its compute and its gathers (without a pipeline: the step at least every
gather of every micro-batch). The optimizer step and every other collective only add."""

from __future__ import annotations

import numpy as np

from ..costs import comm, params
from ..costs.kernels import Efficiency
from .. import plan as plans
from ..plan import PipelinePlan
from ..specs import Hardware, Run
from .data_parallel import dp_collective, run_residency, unit_gather_parts
from .frameworks import Framework
from .stage_costs import kernels, kind_counts, layer_tables, unit_costs


def lower_bound(run: Run, hw: Hardware, eff: Efficiency, framework: Framework, plan: PipelinePlan) -> float:
    """Seconds the step takes at least on the default model (module doc), for ``plan`` (the one the
    step model resolves for the run: :func:`.default.default_plan`, one pipeline schedule run):
    the bound of one run, times the runs a step (:func:`..plan.flushes`)."""
    framework = framework.for_training(run.training)   # the stack as the run sets it, as the step model does
    run = framework.resolve(run)      # what the run leaves open, as the step model resolves it
    return plans.flushes(run.layout, run.training) * _flush_bound(run, hw, eff, framework, plan)


def _flush_bound(run: Run, hw: Hardware, eff: Efficiency, framework: Framework, plan: PipelinePlan) -> float:
    L = run.layout
    if framework.zero_stage(L) == 3 and L.pp == 1 and framework.zero3_runtime != "unit":
        return 0.0           # DeepSpeed v0.3's replay: no bound claimed
    bw = comm.group_bandwidths(L, hw, run.gpus_per_node or hw.per_node, framework.multi_nic_rings)
    uc = unit_costs(run, hw, eff, framework, kernels(run, hw, eff, framework, bw))
    overlapped = plan.spec.overlapped

    def total(terms, hide_a2a: bool) -> float:
        return sum(terms) - (terms[3] if hide_a2a else 0.0)

    # each stage's layers as its durations count them (:func:`.stage_costs.layer_kinds`: with
    # partial recomputation the recomputed ones and the rest apart), its embedding and its loss
    kinds = layer_tables(uc)
    counts = np.array([kind_counts(run, st, uc) + (st.embedding, st.loss) for st in plan.stages], dtype=float)

    def per_unit(i: int) -> np.ndarray:   # a unit's forward (i = 0) or backward (1), in counts' columns
        return np.array([total(lc[i], overlapped) if lc is not None else 0.0 for lc in kinds]
                        + [total(uc.emb[i], False), total(uc.loss[i], False)])

    F, B = counts @ per_unit(0), counts @ per_unit(1)
    if L.dp * L.cp > 1 and run_residency(run, framework, plan.m).gathers_each_pass:
        coll = dp_collective(run, hw, eff, bw, framework.nccl_tuner, framework.replica_reduce_stream)
        mods = params.device_modules(run.model, L.tp, L.ep, L.etp,
                                     [(st.dense_layers, st.moe_layers, st.embedding, st.loss) for st in plan.stages])
        per_unit = [[coll("all-gather", a, e) for a, e in unit_gather_parts(run, hw, framework, st, units)]
                    for st, units in zip(plan.stages, mods)]
        G = np.array([sum(g) for g in per_unit])
        if L.pp == 1:
            # every unit gathered in each micro-batch's forward and backward, the output layer once
            return float(plan.m * max(F.sum() + B.sum(), 2 * G.sum() - max(max(g) for g in per_unit)))
        F, B = np.maximum(F, G), np.maximum(B, G)
    if L.pp == 1:
        return float(plan.m * (F.sum() + B.sum()))
    busy = np.zeros(plan.p)
    for st, x in zip(plan.stages, F + B):
        busy[st.device] += x
    busy *= plan.passes
    if plan.copies != 1:
        return float(busy.max())
    head = np.concatenate(([0.0], np.cumsum(F)))[:plan.p]
    tail = np.zeros(plan.p) if plan.spec.split_backward else np.concatenate(([0.0], np.cumsum(B)))[:plan.p]
    return float((head + busy + tail).max())
