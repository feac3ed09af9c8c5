"""The ``"seed"`` step-time model: the deck's model, frozen once it reproduced the deck (results.md §11a): one fitted
constant η, nothing overlapped. Its assumptions, each pinned by a figure the deck states (see
docs/systems-model.md):

* micro-batches m = global batch / (d·b), b the run's micro-batch (the deck's runs: b = 1);
* interleaving v: the layout's ``vpp``, else one layer per virtual stage, v = l/p; where p does
  not divide l, the embedding and the output layer take a layer's slot each, v = ⌊(l + 2)/p⌋
  (Llama 3: 126 layers, p = 16, v = 8; the first and last chunk hold the embedding and the
  output layer and no transformer layer, Grattafiori et al. 2024 §3.3.2). A slot costs what a
  layer costs. Otherwise whole layers go to chunks as evenly as possible, the lighter chunks at
  the two ends of the pipeline;
* executed FLOPs F: with full recomputation Megatron's eq. 3 (generalised, :mod:`.flops`),
  otherwise PaLM's 6N + 12·l·s·d (plus the recomputed attention core with selective
  recomputation); the same F is the count behind the reported TFLOP/s;
* compute: F / (n · η · peak) per device, spread evenly over the slots;
* tensor-parallel all-reduce: ring, message b·(s/cp)·h·2 bytes (BF16), α = 5 µs per ring step,
  4 per layer per micro-batch (2 forward, 2 backward), 6 with full recomputation; on NVLink
  when the tp group stays in a node;
* context parallelism, all-gather form: K and V all-gathered forward and their gradients
  reduce-scattered backward, (cp − 1)/cp · s·2·(kv_dim/t)·2 bytes each per layer per micro-batch
  (a third time in the recomputed forward); ring form: what the ring leaves exposed,
  :func:`.context.cp_attention` with the attention computed at η·peak (its forward again
  with full recomputation); all-to-all form: its exchanges of Q, K, V and the output, of dO and
  dQ, dK, dV, exposed, as :func:`.context.cp_attention` times them (again with full recomputation),
  and the hierarchical form's all-to-alls over its groups with its ring across them;
* expert all-to-all (MoE layers): dispatch and combine over the ep group, T·top_k·h·2 bytes
  per GPU with T = b·(s/cp)/t (Megatron-LM's MoE needs sequence parallelism with t > 1), the
  node-mates' share over the node's links and the rest over the network at once
  (:func:`.moe.moe_comm`), in the forward and again in the backward (and the recomputed
  forward), plus expert tensor parallelism's all-gather and reduce-scatter of the received
  rows when etp > 1;
* pipeline point-to-point: Megatron's scatter/gather, b·(s/cp)·h·2/t bytes per transfer,
  (v − 1/p) transfers each way per micro-batch per device, spread evenly over its chunks;
* each chunk's per-micro-batch time (compute + tp + cp + all-to-all + p2p) split forward :
  backward as the FLOPs are, 1 : 2 (1 : 3 with full recomputation; a split backward halves B
  into B and W); the pipeline time T_pipe is the discrete-event simulation of the schedule
  (default: interleaved when v > 1, else 1F1B; where Megatron-LM's interleaved schedule
  refuses the default v, m not a multiple of p, 1F1B, said in the notes; DualPipe runs two
  copies of the p-stage split, each micro-batch through one) over those per-stage durations.
  For uniform
  stages this equals (m + (p − 1)/v)·(t_f + t_b), the closed form, which is then used directly
  (the tests check both agree);
* data-parallel gradient all-reduce after the flush: ring over the d·cp group, BF16, of the
  P/(t·p) parameters each GPU holds (P exact: :func:`.flops.param_count`); no α; expert
  parameters over the d·cp/ep group. ZeRO stages move the same bytes (reduce-scatter +
  all-gather = all-reduce) and are not distinguished;
* T = T_pipe + T_dp; TFLOP/s per GPU = F/(n·T); MFU = F/(n·T·peak);
* a local batch (``training.local_batch`` with a pipeline: torch.distributed.pipelining's stacks
  run their schedule once per local batch, :func:`..plan.flushes`): f = global batch/(d·local)
  schedule runs a step, each of local/b micro-batches with its own bubble and all-reduce, timed
  as one and repeated, T = f·(T_pipe + T_dp) (an extension: the deck's runs have none);
* η is passed in: the analysis layer fits it on the deck's calibration run, Megatron's 1.7B
  run (:func:`modelcut.analysis.validation.fit_eta`).
"""

from __future__ import annotations

from dataclasses import replace

from .. import plan as plans
from ..costs import comm, context, flops
from ..costs import moe as moe_mod
from ..errors import ModelcutError
from ..plan import PipelinePlan
from ..sim import registry
from ..specs import Hardware, Run
from ..units import BF16_BYTES
from .checks import check_run
from .pipeline_time import pipeline_time
from .result import Breakdown, Prediction

#: Seed mode: latency per ring step of the tensor-parallel all-reduce (70 µs per all-reduce at
#: t = 8). The deck's 1.67 s of TP time in a 10.61 s step together with its 18.6 % largest
#: error pins it; no bandwidth alone gives both (shared/reference/seed-systems-model.md).
SEED_TP_ALPHA = 5e-6

#: The seed's assumptions in one line each, for reports (docs/results.md).
ASSUMPTIONS = [
    "Nothing is overlapped: compute, communication, bubble and the data-parallel all-reduce add up.",
    "One fitted constant: η, the fraction of dense 16-bit peak the matrix products reach, fitted on "
    "Megatron-LM's 1.7B run; every other row is a prediction.",
    "One sequence per micro-batch (b = 1) for the published rows; m = global batch / (d·b).",
    "The most interleaving the layer count allows: v = l/p, one layer per virtual stage; where p does not "
    "divide l, the embedding and the output layer take a layer's slot each (Llama 3: v = 8).",
    "FLOPs: Megatron's eq. 3 (recomputed forward counted) for fully recomputed runs; PaLM's "
    "6N + 12·l·s·d with N all parameters otherwise. The same count is the work and the reported TFLOP/s.",
    "Tensor-parallel all-reduce: ring, BF16 message b·(s/cp)·h, α = 5 µs per ring step, 4 per layer "
    "per micro-batch (6 with full recomputation), on NVLink (A100 300 GB/s, H100 450 GB/s each way).",
    "Context parallelism: K and V all-gathered forward, their gradients reduce-scattered backward, "
    "over the network.",
    "Pipeline point-to-point: Megatron's scatter/gather, b·(s/cp)·h/t BF16 values per transfer, "
    "(v − 1/p) transfers each way per micro-batch, over the network.",
    "Pipeline time: the discrete-event simulation of the interleaved (or 1F1B) schedule; "
    "(m + (p − 1)/v)·(t_f + t_b) for uniform stages.",
    "Data-parallel gradient all-reduce after the flush: ring over d·cp ranks, BF16, of the P/(t·p) "
    "parameters each GPU holds, over the network (A100 nodes 25 GB/s, H100 nodes 50 GB/s per GPU).",
]


def seed_chunks(layers: int, p: int, m: int) -> int:
    """The seed's default interleaving: one layer per virtual stage, v = l/p; where p does not
    divide l, v = ⌊(l + 2)/p⌋ (embedding and output layer as a layer each). 1 without a
    pipeline, or when m < p (Megatron-LM's interleaved schedule needs m ≥ p)."""
    if p == 1 or m < p:
        return 1
    return layers // p if layers % p == 0 else max(1, (layers + 2) // p)


def seed_plan(run: Run) -> tuple[PipelinePlan, list[str]]:
    """The pipeline the seed times: the layout's v, else a schedule's fixed chunks, else the
    most interleaving (:func:`seed_chunks`), falling back to 1F1B where the schedule refuses it;
    layers spread in slots (:func:`.plan.slot_split`)."""
    L, tr, l = run.layout, run.training, run.model.layers
    p, m = L.pp, plans.microbatches(L, tr)
    notes: list[str] = []
    spec = registry.get(L.schedule) if L.schedule is not None else None
    if L.vpp is not None:
        v = L.vpp
    elif spec is not None and spec.fixed_chunks:
        v = spec.default_chunks
    else:
        v = seed_chunks(l, p, m)
        if p > 1 and m < p:
            notes.append(f"m = {m} < p = {p}: no interleaving (Megatron-LM's interleaved schedule needs m ≥ p)")
        elif v > 1:
            try:
                (spec or registry.default_schedule(v)).validate(p, m, v)
            except ModelcutError:
                notes.append(f"m = {m} is not a multiple of p = {p}, which Megatron-LM's interleaved schedule "
                             f"needs (its default micro-batch group N = p): 1F1B instead of v = {v}")
                v = 1
    plan = plans.resolve(run.model, L, tr, v=v, schedule=L.schedule, balance="slots",
                         first_layers=L.first_layers, last_layers=L.last_layers)
    lay, slots = plan.layers, tuple(s.slots for s in plan.stages)
    if slots != lay:
        notes.append("the embedding and the output layer take a layer's slot on the first and last stage")
    elif len(set(lay)) > 1:
        notes.append(f"uneven stages: {min(lay)} to {max(lay)} layers per chunk")
    return plan, notes


def _cp_layer(run: Run, hw: Hardware, eta: float, gpn: int) -> float:
    """Context-parallel time per layer per micro-batch: the all-gather form's exposed gathers and
    reduce-scatters, or what the ring form leaves exposed, or the all-to-all form's exchanges
    (each with its forward again under full recomputation)."""
    model, L, tr = run.model, run.layout, run.training
    b, s, t, cp = tr.micro_batch, tr.seq_len, L.tp, L.cp
    if cp == 1:
        return 0.0
    cp_bw = comm.group_bandwidth(L, "cp", hw, gpn)
    if L.cp_form in ("ring", "a2a", "a2a+p2p"):
        att = context.cp_attention(model, micro_batch=b, seq=s, cp=cp, kind=L.cp_form, bw=cp_bw, a2a=L.cp_a2a or 1,
                                   attention_flops_per_s=eta * hw.peak_flops_16, t=t)
        return att.exposed_s + (att.exposed_fwd_s if tr.recompute == "full" else 0.0)
    kv_bytes = b * s * 2 * context.kv_width_per_rank(model, t) * BF16_BYTES   # K and V of the whole sequence
    return (3 if tr.recompute == "full" else 2) * comm.all_gather(cp, kv_bytes, cp_bw)


def _per_layer(run: Run, hw: Hardware, eta: float, v: int) -> tuple[float, float, float, float]:
    """(tensor-parallel, context-parallel, expert all-to-all) seconds per layer per micro-batch,
    and the pipeline sends per chunk (module doc)."""
    model, L, tr = run.model, run.layout, run.training
    t, cp, p = L.tp, L.cp, L.pp
    b, s, h = tr.micro_batch, tr.seq_len, model.hidden
    gpn = run.gpus_per_node or hw.per_node
    n_passes = 6 if tr.recompute == "full" else 4   # 2 forward + 2 backward (+ 2 recomputed)
    tp_bw = comm.group_bandwidth(L, "tp", hw, gpn)
    tp_layer = n_passes * comm.ring_allreduce(t, b * (s / cp) * h * BF16_BYTES, tp_bw, SEED_TP_ALPHA)
    a2a_layer = 0.0
    if model.is_moe and L.ep > 1:
        mc = moe_mod.moe_comm(model, b * s / cp, ep=L.ep, tp=t, etp=L.etp, link_bw=hw.link_bw, net_bw=hw.net_bw,
                              local=comm.group_members_in_node(L, "ep", gpn))
        passes = 3 if tr.recompute == "full" else 2   # forward, backward (and the recomputed forward)
        a2a_layer = passes * (mc.a2a_fwd_s + mc.etp_s)
    p2p_chunk = 0.0
    if p > 1:
        pp_bw = comm.group_bandwidth(L, "pp", hw, gpn)
        transfers = 2 * (v - 1 / p)   # both directions, per micro-batch per device
        p2p_chunk = transfers * comm.p2p(b * (s / cp) * h * BF16_BYTES / t, pp_bw) / v
    return tp_layer, _cp_layer(run, hw, eta, gpn), a2a_layer, p2p_chunk


def _dp_time(run: Run, hw: Hardware) -> float:
    """The gradient all-reduce after the flush: a ring over the dp·cp group, BF16, of the
    P/(t·p) parameters each GPU holds (experts over the dp·cp/ep group); no latency term."""
    model, L = run.model, run.layout
    t, p = L.tp, L.pp
    dp_group = L.dp * L.cp
    gpn = run.gpus_per_node or hw.per_node
    dp_bw = comm.group_bandwidth(L, ("cp", "dp"), hw, gpn)
    P = flops.param_count(model)
    expert = 0
    if model.is_moe:
        expert = flops.moe_layer_count(model) * model.experts * flops.mlp_params(model, flops.expert_width(model))
    T_dp = comm.ring_allreduce(dp_group, (P - expert) / (t * p) * BF16_BYTES, dp_bw)
    if expert:
        etp = L.etp or t
        T_dp += comm.ring_allreduce(max(dp_group // L.ep, 1), expert / (p * L.ep * etp) * BF16_BYTES, dp_bw)
    return T_dp


def predict(run: Run, hw: Hardware, eta: float, force_simulation: bool = False) -> Prediction:
    """One run's step under the seed's assumptions (module doc), η the fraction of peak."""
    check_run(run)
    if run.training.precision == "fp8":
        raise ModelcutError("the seed model times 16-bit products only; FP8 is the default model's "
                            "(--mode default)")
    if run.training.partial_recompute:
        raise ModelcutError("the seed model recomputes every layer or none; recompute_layers and recompute_every "
                            "(some layers) are the default model's (--mode default)")
    f = plans.flushes(run.layout, run.training)
    if f > 1:
        one = predict(replace(run, training=plans.flush_training(run.layout, run.training)), hw, eta,
                      force_simulation)
        return _repeated(run, hw, one, f)
    model, L, tr = run.model, run.layout, run.training
    n = L.gpus
    plan, notes = seed_plan(run)
    if L.hybrid:
        notes.append(f"dp_shard {L.dp_shard} not modelled: the deck's model shards nothing (one gradient all-reduce "
                     "over dp); --mode default times hybrid sharding")
    if tr.grad_reduce is not None and tr.grad_reduce_bytes != BF16_BYTES:
        notes.append(f"grad_reduce {tr.grad_reduce} not modelled: the deck's model all-reduces gradients in BF16; "
                     "--mode default times the run's reduce type")
    p, m, v = plan.p, plan.m, plan.v
    F = flops.reported_flops(model, tr)
    # Work: F spread over the pipeline's slots (DualPipe: each micro-batch passes one of the two copies).
    slots = [st.slots for st in plan.stages]
    per_slot_compute = F * p * plan.copies / (n * m * sum(slots)) / (eta * hw.peak_flops_16)
    tp_layer, cp_layer, a2a_layer, p2p_chunk = _per_layer(run, hw, eta, v)
    phi = 0.25 if tr.recompute == "full" else 1 / 3   # forward : backward = 1 : 2 (1 : 3 recomputing)
    parts, durations = [], []
    for st in plan.stages:
        part = (st.slots * per_slot_compute, st.slots * tp_layer, st.slots * cp_layer, st.moe_layers * a2a_layer,
                p2p_chunk)
        parts.append(part)
        total = sum(part)
        fwd, bwd = phi * total, (1 - phi) * total
        durations.append((fwd, bwd / 2, bwd / 2) if plan.weight_apart else (fwd, bwd, 0.0))
    T_pipe, busy, method = pipeline_time(plan, durations, force_simulation)
    T_dp = _dp_time(run, hw)
    T = T_pipe + T_dp
    k = max(range(p), key=lambda i: busy[i])
    mine = [parts[st.index] for st in plan.on_device(k)]
    sums = [plan.passes * sum(x[i] for x in mine) for i in range(5)]
    bd = Breakdown(compute_s=sums[0], tp_s=sums[1], cp_s=sums[2], p2p_s=sums[4],
                   bubble_s=max(T_pipe - busy[k], 0.0), dp_s=T_dp, a2a_s=sums[3])
    return Prediction(step_time_s=T, tflops_per_gpu=F / (n * T) / 1e12, mfu=F / (n * T * hw.peak_flops_16),
                      breakdown=bd, flops_per_step=F, microbatches=m, vpp=v, schedule=plan.name, notes=notes,
                      mode="seed", eta=eta, stage_layers=plan.layers, pipeline_method=method, plan=plan)


def _repeated(run: Run, hw: Hardware, one: Prediction, f: int) -> Prediction:
    """The step of ``f`` schedule runs (module doc, a local batch), each the prediction ``one`` of
    one run's batch: every term f times, the FLOPs the whole step's."""
    T = f * one.step_time_s
    F = flops.reported_flops(run.model, run.training)
    n = run.layout.gpus
    bd = Breakdown(**{k: f * v for k, v in one.breakdown.as_dict().items()})
    notes = [*one.notes, plans.flushes_note(f, one.microbatches, run.training.local_batch)]
    return replace(one, step_time_s=T, tflops_per_gpu=F / (n * T) / 1e12, mfu=F / (n * T * hw.peak_flops_16),
                   breakdown=bd, flops_per_step=F, notes=notes, flushes=f)
