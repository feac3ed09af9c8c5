"""The training-step model: how long one optimizer step takes for a run on some hardware.

``predict(run, hw, mode)`` dispatches to a *mode*, a complete set of assumptions. Modes are
registered in ``MODES``; each is a function ``(run, hw, eta, simulate) -> Prediction``. A new
mode (a better physics model) is added beside the others without touching them.

``"seed"``: the deck's model, frozen once it reproduced the deck (results.md §11a): one fitted
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
  with full recomputation);
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
* η is fitted on the catalog's calibration run (Megatron's 1.7B run) by :func:`fit_eta`.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from functools import lru_cache
from typing import Callable

from . import closed_forms, comm, context, flops, moe as moe_mod
from .engine import Timing, simulate as _simulate
from .errors import ModelcutError
from .schedules import ALL_SCHEDULES, DEFAULT_CHUNKS, build
from .specs import BF16_BYTES, Hardware, Run

#: Bytes per element on the wire and in gradients: BF16 (the deck: "BF16 on the wire").
BYTES = BF16_BYTES
#: Seed mode: latency per ring step of the tensor-parallel all-reduce (70 µs per all-reduce at
#: t = 8). The deck's 1.67 s of TP time in a 10.61 s step together with its 18.6 % largest
#: error pins it; no bandwidth alone gives both (shared/reference/seed-systems-model.md).
SEED_TP_ALPHA = 5e-6
#: Calibration run per mode: the catalog id of the published run η is fitted on.
CALIBRATION = {"seed": "megatron-1.7b"}

#: Each mode's assumptions in one line each, for reports (docs/results.md).
ASSUMPTIONS = {"seed": [
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
]}


@dataclass
class Breakdown:
    """Where the step goes, in seconds, on the pipeline's busiest device; sums to the step."""

    compute_s: float
    tp_s: float
    cp_s: float
    p2p_s: float
    bubble_s: float
    dp_s: float
    a2a_s: float = 0.0

    def as_dict(self) -> dict[str, float]:
        return asdict(self)

    @property
    def total_s(self) -> float:
        return (self.compute_s + self.tp_s + self.cp_s + self.p2p_s + self.bubble_s + self.dp_s
                + self.a2a_s)


@dataclass
class Prediction:
    step_time_s: float
    tflops_per_gpu: float
    mfu: float
    breakdown: Breakdown
    flops_per_step: float
    microbatches: int
    vpp: int
    schedule: str
    notes: list[str] = field(default_factory=list)
    mode: str = "seed"
    eta: float = 0.0
    stage_layers: tuple[int, ...] = ()
    pipeline_method: str = ""   # "simulation" or "closed form (equal to the simulation)"

    def as_dict(self) -> dict:
        return {"step_time_s": self.step_time_s, "tflops_per_gpu": self.tflops_per_gpu, "mfu": self.mfu,
                "breakdown": self.breakdown.as_dict(), "flops_per_step": self.flops_per_step,
                "microbatches": self.microbatches, "vpp": self.vpp, "schedule": self.schedule,
                "mode": self.mode, "eta": self.eta, "stage_layers": list(self.stage_layers),
                "pipeline_method": self.pipeline_method, "notes": list(self.notes)}


# ---------------------------------------------------------------- checks shared by every mode

def check_run(run: Run) -> None:
    """Refuse a run no framework would start, with one line naming the problem."""
    m, L, T = run.model, run.layout, run.training
    if m.heads % L.tp:
        raise ModelcutError(f"tp ({L.tp}) must divide the attention heads ({m.heads})")
    if m.kv_heads % L.tp and L.tp % m.kv_heads:
        raise ModelcutError(f"tp ({L.tp}) and kv_heads ({m.kv_heads}) must divide one another")
    if m.ffn_hidden % L.tp:
        raise ModelcutError(f"tp ({L.tp}) must divide ffn_hidden ({m.ffn_hidden})")
    if L.pp > m.layers:
        raise ModelcutError(f"pp ({L.pp}) exceeds the layers ({m.layers})")
    if T.seq_len % L.cp:
        raise ModelcutError(f"cp ({L.cp}) must divide seq_len ({T.seq_len})")
    if T.global_batch % (L.dp * T.micro_batch):
        raise ModelcutError(f"global_batch ({T.global_batch}) must be divisible by dp × micro_batch "
                            f"({L.dp} × {T.micro_batch})")
    moe_mod.check_moe_layout(m, L)
    if L.schedule is not None and L.schedule not in ALL_SCHEDULES:
        raise ModelcutError(f"unknown schedule {L.schedule!r}; choose one of {', '.join(ALL_SCHEDULES)}")
    if L.vpp is not None and L.pp * L.vpp > m.layers + 2 and L.schedule != "dualpipe":   # DualPipe: 2 copies of pp
        raise ModelcutError(f"pp × vpp = {L.pp * L.vpp} chunks for {m.layers} layers: at most layers + 2 "
                            "(the embedding and the output layer may take a chunk each)")
    mb = T.global_batch // (L.dp * T.micro_batch)
    if (L.vpp or 1) > 1 and L.schedule in (None, "interleaved") and L.pp > 1 and mb < L.pp:
        raise ModelcutError(f"interleaving (vpp = {L.vpp}) needs at least pp = {L.pp} micro-batches per "
                            f"pipeline, got {mb} (global_batch / (dp × micro_batch))")


def microbatches(run: Run) -> int:
    """m = global batch / (d · micro-batch): micro-batches per pipeline per step."""
    return run.training.global_batch // (run.layout.dp * run.training.micro_batch)


def stage_slots(layers: int, stages: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(transformer layers, slots) per virtual stage, in forward order.

    When p·v divides l + 2 but not l, the embedding and the output layer take one layer's slot
    each, on the first and the last stage (Llama 3: Grattafiori et al. 2024 §3.3.2; Megatron-LM's
    --account-for-embedding-in-pipeline-split and --account-for-loss-in-pipeline-split, which
    exist because each costs about a layer): every stage has the same slots, the end ones one
    transformer layer fewer. Otherwise slots are the layers, spread by :func:`stage_layers`."""
    if stages > 1 and layers % stages and (layers + 2) % stages == 0:
        k = (layers + 2) // stages
        slots = (k,) * stages
        return (k - 1,) + (k,) * (stages - 2) + (k - 1,), slots
    lay = stage_layers(layers, stages)
    return lay, lay


def pipeline_slots(name: str, layers: int, p: int, v: int) -> tuple[tuple[int, ...], tuple[int, ...]]:
    """(layers, slots) of each of the schedule's p·v stages: :func:`stage_slots` over p·v
    stages, except DualPipe, whose 2p stages are two copies of the model's p-stage split
    (stage p + s is model stage s; DeepSeek-V3 report §3.2.1)."""
    if name == "dualpipe":
        lay, slots = stage_slots(layers, p)
        return lay + lay, slots + slots
    return stage_slots(layers, p * v)


def stage_layers(layers: int, stages: int) -> tuple[int, ...]:
    """Whole layers per virtual stage, in forward order: as even as possible, the stages with
    one layer fewer at the two ends of the pipeline (alternately first, last, second, …),
    where the embedding and the output layer sit."""
    if stages < 1:
        raise ModelcutError(f"stages must be at least 1, got {stages}")
    q, r = divmod(layers, stages)
    light = stages - r if r else 0
    out = [q + 1 if r else q] * stages
    lo, hi = 0, stages - 1
    for k in range(light):
        if k % 2 == 0:
            out[lo] = q
            lo += 1
        else:
            out[hi] = q
            hi -= 1
    return tuple(out)


def seed_chunks(layers: int, p: int, m: int) -> int:
    """The seed's default interleaving: one layer per virtual stage, v = l/p; where p does not
    divide l, v = ⌊(l + 2)/p⌋ (embedding and output layer as a layer each). 1 without a
    pipeline, or when m < p (Megatron-LM's interleaved schedule needs m ≥ p)."""
    if p == 1 or m < p:
        return 1
    return layers // p if layers % p == 0 else max(1, (layers + 2) // p)


# ---------------------------------------------------------------- the pipeline term

@lru_cache(maxsize=2048)
def _simulated(name: str, p: int, m: int, v: int, durations: tuple) -> tuple[float, tuple[float, ...]]:
    trace = _simulate(build(name, p, m, v), Timing(stage_durations=list(durations)), validate=False)
    return float(trace.makespan), tuple(float(trace.busy(d)) for d in range(p))


@lru_cache(maxsize=256)
def _stage_devices(name: str, p: int, m: int, v: int) -> tuple[int, ...]:
    where = build(name, p, m, v).stage_device()
    return tuple(where[c] for c in range(p * v))


def simulate_pipeline(name: str, p: int, m: int, v: int, durations: list[tuple[float, float, float]]
                      ) -> tuple[float, list[float]]:
    """Makespan and per-device busy time of schedule ``name`` with per-stage (F, B, W) durations,
    from the discrete-event engine. Memoised: makespans scale with durations, so the cache key
    is the durations over their largest (12 significant digits)."""
    scale = max((x for d in durations for x in d), default=0.0)
    if scale <= 0:
        return 0.0, [0.0] * p
    key = tuple(tuple(float(f"{x / scale:.12g}") for x in d) for d in durations)
    T, busy = _simulated(name, p, m, v, key)
    return T * scale, [b * scale for b in busy]


def pipeline_time(name: str, p: int, m: int, v: int, durations: list[tuple[float, float, float]],
                  force_simulation: bool = False) -> tuple[float, list[float], str]:
    """(T_pipe, busy per device, method). Uniform stages whose schedule has a closed form use
    it (equal to the simulation: tests/test_stepmodel.py checks); anything else is simulated."""
    uniform = all(d == durations[0] for d in durations)
    if uniform and not force_simulation and durations:
        F, B, W = durations[0]
        sched_split = name in ("zb-h1", "zbv")
        cf = closed_forms.bubble(name, p, m, v, v * F, v * B, v * W if sched_split else None)
        if cf is not None and not (sched_split and W == 0):
            busy = m * v * (F + B + W)
            return busy * (1 + cf), [busy] * p, "closed form (equal to the simulation)"
    T, busy = simulate_pipeline(name, p, m, v, durations)
    return T, busy, "simulation"


# ---------------------------------------------------------------- the seed mode

def _seed(run: Run, hw: Hardware, eta: float, force_simulation: bool = False) -> Prediction:
    check_run(run)
    model, L, tr = run.model, run.layout, run.training
    t, cp, p, d = L.tp, L.cp, L.pp, L.dp
    n = L.gpus
    gpn = run.gpus_per_node or hw.per_node
    b, s, h, l = tr.micro_batch, tr.seq_len, model.hidden, model.layers
    m = microbatches(run)
    notes: list[str] = []

    # Interleaving and schedule.
    if L.vpp is not None:
        v = L.vpp
    elif L.schedule is not None and L.schedule != "interleaved":
        v = DEFAULT_CHUNKS[L.schedule]
    else:
        v = seed_chunks(l, p, m)
        if p > 1 and m < p:
            notes.append(f"m = {m} < p = {p}: no interleaving (Megatron-LM's interleaved schedule needs m ≥ p)")
        elif v > 1 and m % p:
            notes.append(f"m = {m} is not a multiple of p = {p}, which Megatron-LM's interleaved schedule "
                         f"needs (its default micro-batch group N = p): 1F1B instead of v = {v}")
            v = 1
    name = L.schedule or ("interleaved" if v > 1 else "1f1b")
    copies = 2 if name == "dualpipe" else 1
    layers_of, slots_of = pipeline_slots(name, l, p, v)
    if slots_of != layers_of:
        notes.append("the embedding and the output layer take a layer's slot on the first and last stage")
    elif len(set(layers_of)) > 1:
        notes.append(f"uneven stages: {min(layers_of)} to {max(layers_of)} layers per chunk")

    # Work: F spread over the pipeline's slots. A slot (a layer, or the embedding or output layer
    # in its own slot) costs a layer: its share of F and a layer's TP and CP communication.
    convention = "megatron" if tr.recompute == "full" else "palm"
    F = flops.executed_flops(model, tr, convention)
    # (DualPipe: each micro-batch passes one of the two copies, sum(slots)/2 slots)
    per_slot_compute = F * p * copies / (n * m * sum(slots_of)) / (eta * hw.peak_flops_16)

    # Communication per layer per micro-batch.
    n_passes = 6 if tr.recompute == "full" else 4   # 2 forward + 2 backward (+ 2 recomputed)
    tp_bw = comm.group_bandwidth(L, "tp", hw, gpn)
    tp_layer = n_passes * comm.ring_allreduce(t, b * (s / cp) * h * BYTES, tp_bw, SEED_TP_ALPHA)
    cp_layer = 0.0
    if cp > 1:
        cp_bw = comm.group_bandwidth(L, "cp", hw, gpn)
        if L.cp_form == "ring":
            att = context.cp_attention(model, micro_batch=b, seq=s, cp=cp, kind="ring", bw=cp_bw,
                                       attention_flops_per_s=eta * hw.peak_flops_16, t=t)
            cp_layer = att.exposed_s + (att.exposed_fwd_s if tr.recompute == "full" else 0.0)
        else:
            kv_per_rank = model.d_head * max(model.kv_heads // t, 1)
            kv_bytes = b * s * 2 * kv_per_rank * BYTES   # K and V of the whole sequence
            cp_layer = (3 if tr.recompute == "full" else 2) * comm.all_gather(cp, kv_bytes, cp_bw)
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
        p2p_chunk = transfers * comm.p2p(b * (s / cp) * h * BYTES / t, pp_bw) / v

    # Per-stage durations (one micro-batch through one chunk).
    phi = 0.25 if tr.recompute == "full" else 1 / 3
    split = name in ("zb-h1", "zbv")
    first_moe = model.dense_layers if model.is_moe else l
    parts, durations, start = [], [], 0
    for c, (L_c, S_c) in enumerate(zip(layers_of, slots_of)):
        if copies == 2 and c == p:
            start = 0   # DualPipe's second copy starts the model again
        moe_c = max(0, start + L_c - max(start, first_moe))
        part = (S_c * per_slot_compute, S_c * tp_layer, S_c * cp_layer, moe_c * a2a_layer, p2p_chunk)
        parts.append(part)
        total = sum(part)
        fwd, bwd = phi * total, (1 - phi) * total
        durations.append((fwd, bwd / 2, bwd / 2) if split else (fwd, bwd, 0.0))
        start += L_c
    T_pipe, busy, method = pipeline_time(name, p, m, v, durations, force_simulation)

    # Data-parallel gradient all-reduce after the flush.
    dp_group = d * cp
    dp_bw = comm.group_bandwidth(L, ("cp", "dp"), hw, gpn)
    P = flops.param_count(model)
    expert = 0
    if model.is_moe:
        expert = flops.moe_layer_count(model) * model.experts * flops.mlp_params(model, flops.expert_width(model))
    T_dp = comm.ring_allreduce(dp_group, (P - expert) / (t * p) * BYTES, dp_bw)
    if expert:
        etp = L.etp or t
        T_dp += comm.ring_allreduce(max(dp_group // L.ep, 1), expert / (p * L.ep * etp) * BYTES, dp_bw)

    T = T_pipe + T_dp
    # Breakdown on the busiest device (DualPipe: m/2 micro-batches pass each stage).
    k = max(range(p), key=lambda i: busy[i])
    home = _stage_devices(name, p, m, v) if method == "simulation" else [c % p for c in range(p * v)]
    mine = [parts[c] for c in range(p * v) if home[c] == k]
    sums = [m / copies * sum(x[i] for x in mine) for i in range(5)]
    bd = Breakdown(compute_s=sums[0], tp_s=sums[1], cp_s=sums[2], p2p_s=sums[4],
                   bubble_s=max(T_pipe - busy[k], 0.0), dp_s=T_dp, a2a_s=sums[3])
    tflops = F / (n * T) / 1e12
    return Prediction(step_time_s=T, tflops_per_gpu=tflops, mfu=F / (n * T * hw.peak_flops_16), breakdown=bd,
                      flops_per_step=F, microbatches=m, vpp=v, schedule=name, notes=notes, mode="seed",
                      eta=eta, stage_layers=layers_of, pipeline_method=method)


ModeFn = Callable[..., Prediction]


def _default(run: Run, hw: Hardware, eta: float | None = None, force_simulation: bool = False, **options) -> Prediction:
    """The ``"default"`` mode: modelcut's own model (:mod:`.default_model`). ``eta``, when
    given, replaces the profile's fraction of peak for matrix products; ``options``:
    framework, overlap, profile (see :func:`.default_model.predict_default`)."""
    from .default_model import predict_default  # imported late: it builds on this module
    return predict_default(run, hw, eta, **options)


MODES: dict[str, ModeFn] = {"seed": _seed, "default": _default}


def _mode(mode: str) -> ModeFn:
    fn = MODES.get(mode)
    if fn is None:
        raise ModelcutError(f"unknown mode {mode!r}; choose one of {', '.join(MODES)}")
    return fn


def predict(run: Run, hw: Hardware, mode: str = "seed", eta: float | None = None, *,
            force_simulation: bool = False, **options) -> Prediction:
    """One run's step time, TFLOP/s per GPU, MFU and breakdown under ``mode``.

    ``eta`` (fraction of peak the matrix products reach) defaults to the mode's calibrated
    value (:func:`default_eta`). ``force_simulation`` simulates the pipeline even where the
    closed form is exact. Mode ``"default"`` takes its constants from a fitted hardware
    profile (``eta`` then overrides its matrix-product fraction) and ``options``: framework,
    overlap, profile."""
    fn = _mode(mode)
    if mode == "default":
        if eta is not None and not (isinstance(eta, (int, float)) and 0 < eta <= 1):
            raise ModelcutError(f"eta must be in (0, 1], got {eta!r}")
        return fn(run, hw, eta, force_simulation, **options)
    if options:
        raise ModelcutError(f"mode {mode!r} takes no options ({', '.join(options)})")
    if eta is None:
        eta = default_eta(mode)
    if not (isinstance(eta, (int, float)) and 0 < eta <= 1):
        raise ModelcutError(f"eta must be in (0, 1], got {eta!r}")
    return fn(run, hw, float(eta), force_simulation)


def fit_eta(run: Run, hw: Hardware, published_tflops: float, mode: str = "seed") -> float:
    """The η at which ``mode`` predicts exactly ``published_tflops`` per GPU for ``run``.

    Predicted throughput rises monotonically with η; solved by bisection to 1e-13."""
    fn = _mode(mode)
    if not published_tflops > 0:
        raise ModelcutError(f"published TFLOP/s must be positive, got {published_tflops}")
    if fn(run, hw, 1.0).tflops_per_gpu < published_tflops:
        raise ModelcutError(f"{run.name or 'run'}: {published_tflops} TFLOP/s per GPU is out of reach "
                            "even at the full peak (η = 1)")
    lo, hi = 0.0, 1.0
    while hi - lo > 1e-13:
        mid = (lo + hi) / 2
        if fn(run, hw, mid).tflops_per_gpu < published_tflops:
            lo = mid
        else:
            hi = mid
    return (lo + hi) / 2


@lru_cache(maxsize=None)
def default_eta(mode: str = "seed") -> float:
    """η fitted on the mode's calibration run (``CALIBRATION``) from the catalog (package
    data, read once)."""
    _mode(mode)
    from .. import catalog  # the catalog is package data; imported lazily to keep core import-light
    pr = catalog.published_run(CALIBRATION[mode])
    return fit_eta(pr.run, catalog.hardware(pr.run.gpu), pr.published_tflops, mode)
