"""The layout explorer: every way to cut a model over N accelerators, the ones that fit,
ranked by predicted step time.

**Space.** For N GPUs: tensor parallelism t dividing the heads and, with grouped-query
attention, dividing or divided by the KV heads, and the MLP width, its group inside one
node unless allowed across; context parallelism c with the sequence cut in 2c equal chunks
(Llama 3's load-balanced causal split, Grattafiori et al. 2024 §3.3.2) and at least
``min_tokens_per_cp_rank`` tokens per rank; pipeline p ≤ layers; data parallelism
d = N/(t·c·p) dividing the global batch; micro-batch b; schedule and chunks v (1F1B and
ZB-H1 with v = 1; the interleaved schedule with the v whose p·v divides l or l + 2, so
that chunks are balanced, with m a multiple of p as Megatron-LM requires; ZB-V with
v = 2; DualPipe, when asked for, with v = 2, p even, m even and m ≥ 2p, and DualPipeV with
v = 2 and m ≥ 2p, the DualPipe repository's rules); recomputation none/selective/full; ZeRO
stage 0–3. Sequence parallelism is on whenever t > 1 (same traffic, t times fewer norm and
dropout activations; Korthikanti et al. 2022 §4.2.2). Every layout uses exactly N GPUs:
t·c·p·d = N. With c > 1 both forms of context parallelism are tried (``Space.cp_kinds``: the
all-gather of Llama 3 and ring attention; :mod:`.context`). For a mixture-of-experts model,
expert parallelism e runs over the divisors of the experts that divide d (the ep group is
carved from the data-parallel ranks, :mod:`.mesh`; ``Space.eps`` narrows it), expert tensor
parallelism equal to t, and the rank order is Megatron-core's default, tp-cp-ep-dp-pp
(:data:`.mesh.MEGATRON_ORDER`), which keeps the ep group on the ranks next to tp and cp; a
dense model keeps e = 1 and Llama 3's order [tp, cp, pp, dp].

**Fit.** A layout is feasible when its peak device memory (:mod:`.memory`, buffers
allowance included) is at most the accelerator's capacity less ``margin`` (a fraction,
default 2 %, kept free for what the model does not count: the backward's activation
gradients, the logits' BF16 copy, allocator spikes).

**Pruning.** Memory before time. For each structure (t, c, e, p, d, b, schedule, v, form) the
peak memory of all its recomputation × ZeRO variants comes from one pass
(:func:`.memory.variant_peaks`: activations depend only on the recomputation, weights,
gradients and optimizer states only on the ZeRO stage); a structure where none fits is
dropped. Of the variants that fit only the cheapest are predicted: more recomputation or
more sharding only adds work or traffic, so a variant is dropped when one with no more of
either fits (for each recomputation level, the least ZeRO stage that fits, kept only if
it shards less than every cheaper recomputation level needs). In-flight activation
profiles are cached per (schedule, p, equivalent m, v) and the step-time model caches its
pipeline simulations. ``prune=False`` predicts every variant that fits and
``cached=False`` recomputes every variant's memory from the full schedule (the
benchmark's baseline).

**Rank.** By ``stepmodel.predict`` step time (any ``predictor(run, hw)`` returning an object
with ``step_time_s``, ``tflops_per_gpu``, ``mfu``, ``breakdown``, ``vpp``, ``schedule`` and
``stage_layers`` can be passed). :func:`why` names the terms that differ most between two
ranked layouts.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

from . import flops
from .context import CP_KINDS
from .errors import ModelcutError
from .memory import DEFAULT_OPTIONS, MemoryOptions, StageMemory, peak_bytes, stage_memory, variant_peaks
from .mesh import DIMS, MEGATRON_ORDER, Mesh, group_crosses_nodes
from .schedules import ALL_SCHEDULES
from .specs import Hardware, Layout, ModelSpec, Run, Training

RECOMPUTE_ORDER = ("none", "selective", "full")
ZERO_ORDER = (0, 1, 2, 3)
DEFAULT_SCHEDULES = ("1f1b", "interleaved", "zb-h1", "zbv")
#: What ``Space.schedules`` may name: every schedule the simulator builds, DualPipe's included.
ALLOWED_SCHEDULES = tuple(ALL_SCHEDULES)
#: Fraction of the accelerator's memory kept free (see module docstring).
DEFAULT_MARGIN = 0.02
BREAKDOWN_TERMS = ("compute_s", "tp_s", "cp_s", "p2p_s", "bubble_s", "dp_s", "a2a_s")
MEMORY_TERMS = ("weights_bytes", "gradients_bytes", "optimizer_bytes", "activations_bytes", "buffers_bytes")


@dataclass(frozen=True)
class Space:
    """What the explorer enumerates (module docstring)."""

    micro_batches: tuple[int, ...] = (1, 2, 4)
    schedules: tuple[str, ...] = DEFAULT_SCHEDULES
    recomputes: tuple[str, ...] = RECOMPUTE_ORDER
    zeros: tuple[int, ...] = ZERO_ORDER
    allow_tp_across_nodes: bool = False
    min_tokens_per_cp_rank: int = 1024
    balanced_vpp_only: bool = True
    eps: tuple[int, ...] | None = None       # None: every divisor of the experts dividing d
    cp_kinds: tuple[str, ...] = CP_KINDS      # tried when c > 1


@dataclass(frozen=True)
class Structure:
    tp: int
    cp: int
    pp: int
    dp: int
    micro_batch: int
    schedule: str
    vpp: int
    ep: int = 1
    cp_kind: str = "allgather"   # Layout's default; the form only matters when cp > 1


@dataclass
class Evaluated:
    """One layout: its run, memory per stage and (when predicted) its step time."""

    structure: Structure
    recompute: str
    zero: int
    run: Run
    peak_bytes: float
    feasible: bool
    prediction: Any = None
    options: MemoryOptions = DEFAULT_OPTIONS
    _stages: list[StageMemory] | None = None

    @property
    def stages(self) -> list[StageMemory]:
        """Memory per pipeline stage (computed when first asked for)."""
        if self._stages is None:
            s = self.structure
            self._stages = stage_memory(self.run, options=self.options, vpp=s.vpp, schedule=s.schedule)
        return self._stages

    @property
    def step_time_s(self) -> float:
        return self.prediction.step_time_s if self.prediction is not None else float("inf")

    @property
    def peak_stage(self) -> StageMemory:
        return max(self.stages, key=lambda s: s.total_bytes)

    def as_dict(self) -> dict[str, Any]:
        s = self.structure
        ps = self.peak_stage
        mem = {"peak_bytes": self.peak_bytes, "peak_stage": ps.stage,
               **{k: getattr(ps, k) for k in MEMORY_TERMS},
               "stages_total_bytes": [x.total_bytes for x in self.stages]}
        out = {"tp": s.tp, "cp": s.cp, "ep": s.ep, "cp_kind": s.cp_kind if s.cp > 1 else None, "pp": s.pp, "dp": s.dp, "vpp": s.vpp,
               "micro_batch": s.micro_batch, "order": list(self.run.layout.order),
               "recompute": self.recompute, "zero": self.zero, "schedule": s.schedule,
               "step_time_s": None, "tflops_per_gpu": None, "mfu": None, "feasible": self.feasible,
               "memory": mem, "breakdown": None}
        if self.prediction is not None:
            p = self.prediction
            out.update(step_time_s=p.step_time_s, tflops_per_gpu=p.tflops_per_gpu, mfu=p.mfu,
                       breakdown=p.breakdown.as_dict())
        return out


@dataclass
class Exploration:
    """The ranked feasible layouts and what the search did."""

    layouts: list[Evaluated]          # feasible and predicted, fastest first
    gpus: int
    capacity_bytes: float
    margin: float
    structures: int = 0               # (t, c, e, p, d, b, schedule, v, form) enumerated
    space: int = 0                    # layouts covered: structures × recompute × ZeRO variants
    memory_evaluations: int = 0
    predictions: int = 0
    infeasible_structures: int = 0
    feasible_seen: int = 0
    notes: list[str] = field(default_factory=list)

    @property
    def limit_bytes(self) -> float:
        return self.capacity_bytes * (1 - self.margin)

    def summary(self) -> dict[str, Any]:
        return {"gpus": self.gpus, "capacity_bytes": self.capacity_bytes, "margin": self.margin,
                "limit_bytes": self.limit_bytes, "structures": self.structures, "space": self.space,
                "memory_evaluations": self.memory_evaluations, "predictions": self.predictions,
                "infeasible_structures": self.infeasible_structures, "ranked": len(self.layouts)}


# --------------------------------------------------------------------------- enumeration


def divisors(n: int) -> list[int]:
    small, large = [], []
    i = 1
    while i * i <= n:
        if n % i == 0:
            small.append(i)
            if i * i != n:
                large.append(n // i)
        i += 1
    return small + large[::-1]


def tp_ok(model: ModelSpec, t: int) -> bool:
    """t divides the heads and the MLP width (and an MoE model's expert width: expert tensor
    parallelism is t); t and the KV heads divide one another."""
    return (model.heads % t == 0 and model.ffn_hidden % t == 0
            and (model.kv_heads % t == 0 or t % model.kv_heads == 0)
            and (not model.is_moe or flops.expert_width(model) % t == 0))


def ep_choices(model: ModelSpec, d: int, space: "Space") -> list[int]:
    """Expert-parallel sizes for d data-parallel ranks: 1 for a dense model; otherwise the
    divisors of the experts that divide d (``space.eps`` narrows them)."""
    if not model.is_moe:
        return [1]
    return [e for e in divisors(model.experts) if d % e == 0 and (space.eps is None or e in space.eps)]


def vpp_choices(model: ModelSpec, p: int, schedule: str, m: int, balanced_only: bool = True) -> list[int]:
    """Chunks per device for a schedule: 1 for 1F1B/ZB-H1, 2 for ZB-V (2p ≤ l + 2), and
    for the interleaved schedule every v ≥ 2 with p·v ≤ l + 2 and m a multiple of p
    (Megatron-LM's rule for its default micro-batch group N = p), only those where p·v
    divides l or l + 2 when ``balanced_only``."""
    L = model.layers
    if schedule in ("1f1b", "zb-h1", "gpipe"):
        return [1]
    if p == 1:
        return []
    if schedule in ("zbv", "dualpipev"):
        if schedule == "dualpipev" and m < 2 * p:
            return []  # DualPipeV needs m >= 2p
        return [2] if 2 * p <= L + 2 else []
    if schedule == "dualpipe":
        # two copies of the p stages, one per direction: p even, m even and at least 2p
        return [2] if p % 2 == 0 and m % 2 == 0 and m >= 2 * p and p <= L else []
    if schedule in ("interleaved", "looped-bfs"):
        if schedule == "interleaved" and m % p:
            return []  # Megatron-LM: m a multiple of p with the default group size N = p
        out = []
        for v in range(2, (L + 2) // p + 1):
            if not balanced_only or L % (p * v) == 0 or (L + 2) % (p * v) == 0:
                out.append(v)
        return out
    raise ModelcutError(f"unknown schedule {schedule!r}")


def structures(model: ModelSpec, gpus: int, seq: int, global_batch: int, gpus_per_node: int,
               space: Space = Space()) -> Iterator[Structure]:
    """Every (t, c, e, p, d, b, schedule, v, form) with t·c·p·d = gpus (module docstring)."""
    for t in divisors(gpus):
        if not tp_ok(model, t):
            continue
        if not space.allow_tp_across_nodes and group_crosses_nodes(Mesh.build(tp=t, dp=gpus // t), "tp",
                                                                   gpus_per_node):
            continue
        for c in divisors(gpus // t):
            if c > 1 and (seq % (2 * c) or seq // c < space.min_tokens_per_cp_rank):
                continue
            for p in divisors(gpus // (t * c)):
                if p > model.layers:
                    continue
                d = gpus // (t * c * p)
                if global_batch % d:
                    continue
                kinds = space.cp_kinds if c > 1 else ("allgather",)
                for e in ep_choices(model, d, space):
                    for b in space.micro_batches:
                        if (global_batch // d) % b:
                            continue
                        m = global_batch // (d * b)
                        for sched in space.schedules:
                            if p == 1 and sched != "1f1b":
                                continue
                            for v in vpp_choices(model, p, sched, m, space.balanced_vpp_only):
                                for kind in kinds:
                                    yield Structure(t, c, p, d, b, sched, v, e, kind)


# --------------------------------------------------------------------------- evaluation


def make_run(model: ModelSpec, gpu: str, s: Structure, seq: int, global_batch: int, recompute: str, zero: int,
             gpus_per_node: int | None = None) -> Run:
    """The run of one layout: sequence parallelism with t > 1; with e > 1 Megatron-core's rank
    order (ep next to tp and cp, the pipeline outermost), else Llama 3's [tp, cp, pp, dp]."""
    lay = Layout(tp=s.tp, cp=s.cp, pp=s.pp, dp=s.dp, ep=s.ep, vpp=s.vpp, sequence_parallel=s.tp > 1, zero=zero,
                 schedule=s.schedule, cp_kind=s.cp_kind, order=MEGATRON_ORDER if s.ep > 1 else DIMS)
    return Run(model, gpu, lay, Training(seq_len=seq, global_batch=global_batch, micro_batch=s.micro_batch,
                                         recompute=recompute), gpus_per_node=gpus_per_node)


def default_predictor(mode: str = "seed") -> Callable[[Run, Hardware], Any]:
    from . import stepmodel  # the step-time model (issue 3)

    def predict(run: Run, hw: Hardware):
        return stepmodel.predict(run, hw, mode)
    return predict


def parse_tokens(text: str | int) -> int:
    """Tokens as an integer, or with a binary suffix: 16M = 16·2^20 = 16,777,216 (2048
    sequences of 8192, Llama 3's "16M tokens")."""
    if isinstance(text, int):
        return text
    s = str(text).strip().replace("_", "").replace(",", "")
    mult = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30}.get(s[-1:].lower(), 1)
    num = s[:-1] if mult > 1 else s
    try:
        val = float(num) * mult
    except ValueError:
        raise ModelcutError(f"cannot read a token count from {text!r} (e.g. 16777216 or 16M)") from None
    import math
    if not math.isfinite(val) or val != int(val) or val < 1:
        raise ModelcutError(f"token count must be a positive whole number, got {text!r}")
    return int(val)


def explore(model: ModelSpec, hw: Hardware, *, gpus: int, seq: int, global_batch_tokens: int,
            gpus_per_node: int | None = None, mode: str = "seed", margin: float = DEFAULT_MARGIN,
            space: Space = Space(), options: MemoryOptions = DEFAULT_OPTIONS,
            predictor: Callable[[Run, Hardware], Any] | None = None, prune: bool = True,
            progress: Callable[[int, int], None] | None = None, cached: bool = True) -> Exploration:
    """Enumerate, keep what fits, rank by predicted step time (module docstring)."""
    for name, val in (("gpus", gpus), ("seq", seq), ("global_batch_tokens", global_batch_tokens)):
        if isinstance(val, bool) or not isinstance(val, int) or val < 1:
            raise ModelcutError(f"{name} must be a positive integer, got {val!r}")
    if not 0 <= margin < 1:
        raise ModelcutError(f"margin must be a fraction in [0, 1), got {margin!r}")
    if global_batch_tokens % seq:
        raise ModelcutError(f"global batch of {global_batch_tokens} tokens is not a whole number of "
                            f"{seq}-token sequences")
    for sch in space.schedules:
        if sch not in ALLOWED_SCHEDULES:
            raise ModelcutError(f"unknown schedule {sch!r}; choose from {', '.join(ALLOWED_SCHEDULES)}")
    for kind in space.cp_kinds:
        if kind not in CP_KINDS:
            raise ModelcutError(f"unknown context-parallel form {kind!r}; choose from {', '.join(CP_KINDS)}")
    if not space.cp_kinds:
        raise ModelcutError("cp_kinds must name at least one context-parallel form")
    if space.eps is not None:
        if not model.is_moe and set(space.eps) != {1}:
            raise ModelcutError(f"{model.name or 'the model'} is dense: expert parallelism needs experts")
        bad = [e for e in space.eps if isinstance(e, bool) or not isinstance(e, int) or e < 1
               or (model.is_moe and model.experts % e)]
        if bad:
            raise ModelcutError(f"ep {bad[0]!r} does not divide the {model.experts} experts")
    gb = global_batch_tokens // seq
    gpn = gpus_per_node or hw.per_node
    predictor = predictor or default_predictor(mode)
    ex = Exploration([], gpus, hw.mem_bytes, margin)
    limit = ex.limit_bytes
    structs = list(structures(model, gpus, seq, gb, gpn, space))
    ex.structures = len(structs)
    variants = [(r, z) for r in RECOMPUTE_ORDER if r in space.recomputes for z in ZERO_ORDER if z in space.zeros]
    ex.space = len(structs) * len(variants)
    if not structs:
        ex.notes.append("no layout of these sizes divides the GPUs, heads, sequence and batch")

    def evaluate(s: Structure) -> list[Evaluated]:
        """Every variant's peak memory; the fast path shares the work between variants, the
        baseline (``cached=False``) computes each variant's stages from scratch."""
        if cached:
            base = make_run(model, hw.name, s, seq, gb, variants[0][0], variants[0][1], gpus_per_node)
            peaks = variant_peaks(base, variants, options=options, vpp=s.vpp, schedule=s.schedule)
        else:
            peaks = {}
            for r, z in variants:
                run = make_run(model, hw.name, s, seq, gb, r, z, gpus_per_node)
                peaks[(r, z)] = peak_bytes(stage_memory(run, options=options, vpp=s.vpp, schedule=s.schedule,
                                                        cached=False))
        ex.memory_evaluations += len(variants)
        return [Evaluated(s, r, z, make_run(model, hw.name, s, seq, gb, r, z, gpus_per_node), pk, pk <= limit,
                          options=options) for (r, z), pk in peaks.items()]

    ranked: list[Evaluated] = []
    for i, s in enumerate(structs):
        if progress is not None:
            progress(i, len(structs))
        evs = [e for e in evaluate(s) if e.feasible]
        if not evs:
            ex.infeasible_structures += 1
            continue
        kept = frugal(evs) if prune else evs
        ex.feasible_seen += len(evs)
        for e in kept:
            e.prediction = predictor(e.run, hw)
            ex.predictions += 1
            ranked.append(e)
    if progress is not None:
        progress(len(structs), len(structs))
    ranked.sort(key=lambda e: (e.step_time_s, e.peak_bytes))
    ex.layouts = ranked
    return ex


def frugal(feasible: list[Evaluated]) -> list[Evaluated]:
    """The feasible variants of one structure worth predicting (module docstring: Pruning):
    for each recomputation level, cheapest first, the least ZeRO stage that fits, kept only
    when it is less than every cheaper level's."""
    best: dict[str, Evaluated] = {}
    for e in feasible:
        if e.recompute not in best or e.zero < best[e.recompute].zero:
            best[e.recompute] = e
    kept, bound = [], None
    for r in RECOMPUTE_ORDER:
        e = best.get(r)
        if e is not None and (bound is None or e.zero < bound):
            kept.append(e)
            bound = e.zero
    return kept


def find(ex: Exploration, **want: Any) -> list[Evaluated]:
    """Ranked layouts matching the given fields (tp, cp, ep, cp_kind, pp, dp, vpp, micro_batch,
    schedule, recompute, zero)."""
    out = []
    for e in ex.layouts:
        d = {"recompute": e.recompute, "zero": e.zero, **e.structure.__dict__}
        if all(d.get(k) == v for k, v in want.items()):
            out.append(e)
    return out


def why(best: Evaluated, other: Evaluated) -> dict[str, Any]:
    """Why ``best`` beats ``other``: the knobs that differ, and the time and memory terms in
    order of how much they differ (other − best)."""
    a, b = best.as_dict(), other.as_dict()
    knobs = {k: (a[k], b[k]) for k in ("tp", "cp", "ep", "cp_kind", "pp", "dp", "vpp", "micro_batch", "recompute",
                                        "zero", "schedule") if a[k] != b[k]}
    time_terms = []
    if best.prediction is not None and other.prediction is not None:
        for k in BREAKDOWN_TERMS:
            x, y = getattr(best.prediction.breakdown, k), getattr(other.prediction.breakdown, k)
            time_terms.append((k, x, y, y - x))
        time_terms.sort(key=lambda t: -abs(t[3]))
    mem_terms = []
    pa, pb = best.peak_stage, other.peak_stage
    for k in MEMORY_TERMS:
        x, y = getattr(pa, k), getattr(pb, k)
        mem_terms.append((k, x, y, y - x))
    mem_terms.sort(key=lambda t: -abs(t[3]))
    return {"knobs": knobs, "step_time_s": (best.step_time_s, other.step_time_s),
            "time_terms": time_terms, "memory_terms": mem_terms}
