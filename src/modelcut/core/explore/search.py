"""Fit, prune and rank: each structure's memory under every recomputation × ZeRO variant at
once, the cheapest variants that fit predicted, the rest ranked by step time (the package
docstring, **Fit** and **Pruning**)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

from ..costs.context import CP_KINDS
from ..errors import ModelcutError
from ..memory import DEFAULT_OPTIONS, MemoryOptions, StageMemory, memory_plan, peak_bytes, stage_memory, variant_peaks
from ..plan import PipelinePlan
from ..sim import registry
from ..specs import Hardware, Run, ModelSpec
from .space import RECOMPUTE_ORDER, ZERO_ORDER, Space, Structure, make_run, structures
from .why import MEMORY_TERMS

#: Fraction of the accelerator's memory kept free (see the package docstring).
DEFAULT_MARGIN = 0.02


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
    plan: PipelinePlan | None = None
    _stages: list[StageMemory] | None = None

    @property
    def stages(self) -> list[StageMemory]:
        """Memory per pipeline stage (computed when first asked for)."""
        if self._stages is None:
            self._stages = stage_memory(self.run, options=self.options, plan=self.plan)
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


def explore(model: ModelSpec, hw: Hardware, predictor: Callable[[Run, Hardware], Any], *, gpus: int, seq: int,
            global_batch_tokens: int, gpus_per_node: int | None = None, margin: float = DEFAULT_MARGIN,
            space: Space = Space(), options: MemoryOptions = DEFAULT_OPTIONS, prune: bool = True,
            progress: Callable[[int, int], None] | None = None, cached: bool = True) -> Exploration:
    """Enumerate, keep what fits, rank by ``predictor(run, hw)`` step time (the package docstring).
    ``predictor`` returns an object with ``step_time_s``, ``tflops_per_gpu``, ``mfu``,
    ``breakdown``, ``vpp``, ``schedule`` and ``stage_layers`` (a step model's prediction)."""
    for name, val in (("gpus", gpus), ("seq", seq), ("global_batch_tokens", global_batch_tokens)):
        if isinstance(val, bool) or not isinstance(val, int) or val < 1:
            raise ModelcutError(f"{name} must be a positive integer, got {val!r}")
    if not 0 <= margin < 1:
        raise ModelcutError(f"margin must be a fraction in [0, 1), got {margin!r}")
    if global_batch_tokens % seq:
        raise ModelcutError(f"global batch of {global_batch_tokens} tokens is not a whole number of "
                            f"{seq}-token sequences")
    for sch in space.schedules:
        registry.get(sch)
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
        base = make_run(model, hw.name, s, seq, gb, variants[0][0], variants[0][1], gpus_per_node)
        plan = memory_plan(base, options, vpp=s.vpp, schedule=s.schedule)
        if cached:
            peaks = variant_peaks(base, plan, variants, options=options)
        else:
            peaks = {}
            for r, z in variants:
                run = make_run(model, hw.name, s, seq, gb, r, z, gpus_per_node)
                peaks[(r, z)] = peak_bytes(stage_memory(run, options=options, plan=plan, cached=False))
        ex.memory_evaluations += len(variants)
        return [Evaluated(s, r, z, make_run(model, hw.name, s, seq, gb, r, z, gpus_per_node), pk, pk <= limit,
                          options=options, plan=plan) for (r, z), pk in peaks.items()]

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
