"""Fit, prune and rank (the package docstring, **Stack**, **Fit**, **Pruning**): the layouts the
stack can run, each structure's memory under every recomputation × ZeRO variant at once, the
cheapest variants that fit, timed in the order of a valid lower bound on their step time until
no remaining layout can reach the kept set."""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field
from typing import Any, Callable, Iterator

from ..costs.context import CP_KINDS
from ..errors import ModelcutError
from ..memory import DEFAULT_OPTIONS, MemoryOptions, StageMemory, memory_plan, peak_bytes, stage_memory, variant_peaks
from ..plan import PipelinePlan
from ..sim import registry
from ..specs import BLOCKS, DEFAULT_RECOMPUTE_MODULES, EVERY, PARTIAL, Hardware, ModelSpec, Run, recompute_variant
from .rules import Capabilities, Violation, violations
from .space import (RECOMPUTE_ORDER, ZERO_ORDER, Space, Structure, local_batch_of, make_run, recompute_choices,
                    structures)
from .why import MEMORY_TERMS

#: Fraction of the accelerator's memory kept free (see the package docstring).
DEFAULT_MARGIN = 0.02
#: Structure fields a ``must`` query (``--check``) may name besides recompute and zero.
STRUCTURE_KEYS = ("tp", "cp", "pp", "dp", "micro_batch", "schedule", "vpp", "ep", "cp_kind", "etp", "dp_shard",
                  "cp_a2a", "last_layers")


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
    lower_bound_s: float = 0.0

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

    def knobs(self) -> dict[str, Any]:
        """The layout's knobs as a query would name them (:func:`find`); ``etp`` the experts' tensor
        parallelism in effect (tp where the structure leaves it to tp)."""
        return {"recompute": self.recompute, "zero": self.zero, **self.structure.__dict__,
                "etp": self.structure.expert_tp}

    def as_dict(self) -> dict[str, Any]:
        s = self.structure
        ps = self.peak_stage
        mem = {"peak_bytes": self.peak_bytes, "peak_stage": ps.stage,
               **{k: getattr(ps, k) for k in MEMORY_TERMS},
               "stages_total_bytes": [x.total_bytes for x in self.stages]}
        out = {"tp": s.tp, "cp": s.cp, "ep": s.ep, "etp": s.expert_tp if s.ep > 1 else None,
               "cp_kind": s.cp_kind if s.cp > 1 else None, "cp_a2a": s.cp_a2a, "pp": s.pp, "dp": s.dp, "dp_shard": s.dp_shard,
               "vpp": s.vpp, "last_layers": s.last_layers, "micro_batch": s.micro_batch,
               "order": list(self.run.layout.order),
               "sequence_parallel": self.run.layout.sequence_parallel,
               "recompute": self.recompute, "recompute_modules": (list(self.run.training.recompute_modules)
                                                                  if self.run.training.recompute_modules else None),
               "recompute_layers": self.run.training.recompute_layers,
               "recompute_every": self.run.training.recompute_every,
               "local_batch": self.run.training.local_batch,
               "zero": self.zero, "schedule": s.schedule,
               "step_time_s": None, "tflops_per_gpu": None, "mfu": None, "feasible": self.feasible,
               "memory": mem, "breakdown": None}
        if self.prediction is not None:
            p = self.prediction
            out.update(step_time_s=p.step_time_s, tflops_per_gpu=p.tflops_per_gpu, mfu=p.mfu,
                       breakdown=p.breakdown.as_dict())
        return out


@dataclass
class Exploration:
    """The ranked layouts and what the search did. ``layouts``: every layout timed, fastest first
    (with pruning, every layout whose step time could beat the ``keep``-th fastest, or come within
    ``pareto_within`` of the fastest, is among them). ``rule_rejections``: layouts (structures ×
    variants) left out per broken rule of the stack. ``check``: what became of a ``must`` query:
    the rules its layouts break, or the least memory its layouts need."""

    layouts: list[Evaluated]          # feasible and predicted, fastest first
    gpus: int
    capacity_bytes: float
    margin: float
    structures: int = 0               # (t, c, e, p, d, b, schedule, v, form) the stack runs
    space: int = 0                    # layouts covered: structures × recompute × ZeRO variants
    memory_evaluations: int = 0
    predictions: int = 0
    infeasible_structures: int = 0
    feasible_seen: int = 0
    bounded: int = 0                  # candidates whose lower bound was computed
    pruned_by_bound: int = 0          # candidates never timed: their lower bound could not win
    enumerated: int = 0               # structures of the whole space, before the stack's rules
    rule_rejections: dict[str, int] = field(default_factory=dict)
    rule_examples: dict[str, Violation] = field(default_factory=dict)   # one broken rule's words per rule
    framework: str | None = None
    notes: list[str] = field(default_factory=list)
    check_violations: list[Violation] = field(default_factory=list)
    check_least_peak: float | None = None
    check_seen: int = 0
    keep: int = 1
    pareto_within: float = 0.0

    @property
    def limit_bytes(self) -> float:
        return self.capacity_bytes * (1 - self.margin)

    def summary(self) -> dict[str, Any]:
        return {"gpus": self.gpus, "capacity_bytes": self.capacity_bytes, "margin": self.margin,
                "limit_bytes": self.limit_bytes, "structures": self.structures, "space": self.space,
                "memory_evaluations": self.memory_evaluations, "predictions": self.predictions,
                "infeasible_structures": self.infeasible_structures, "ranked": len(self.layouts),
                "bounded": self.bounded, "pruned_by_bound": self.pruned_by_bound, "enumerated": self.enumerated,
                "rule_rejections": dict(self.rule_rejections), "framework": self.framework}


def _check_inputs(model: ModelSpec, gpus: int, seq: int, global_batch_tokens: int, margin: float, space: Space) -> None:
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


def _matches(s: Structure, want: dict[str, Any]) -> bool:
    return all((s.expert_tp if k == "etp" else getattr(s, k)) == v for k, v in want.items() if k in STRUCTURE_KEYS)


def explore(model: ModelSpec, hw: Hardware, predictor: Callable[[Run, Hardware], Any], *, gpus: int, seq: int,
            global_batch_tokens: int, gpus_per_node: int | None = None, margin: float = DEFAULT_MARGIN,
            space: Space = Space(), options: MemoryOptions = DEFAULT_OPTIONS, prune: bool = True,
            progress: Callable[[int, int], None] | None = None, cached: bool = True,
            capabilities: Capabilities | None = None,
            lower_bound: Callable[[Run, Hardware, PipelinePlan], float] | None = None,
            keep: int = 5, pareto_within: float = 0.0, must: dict[str, Any] | None = None) -> Exploration:
    """Enumerate the layouts ``capabilities`` allows (None: every layout), keep what fits, rank by
    ``predictor(run, hw)`` step time (the package docstring). ``predictor`` returns an object with
    ``step_time_s``, ``tflops_per_gpu``, ``mfu``, ``breakdown``, ``vpp``, ``schedule`` and
    ``stage_layers`` (a step model's prediction). With ``lower_bound(run, hw, plan)`` (seconds the
    predictor's step takes at least) and ``prune``, candidates are timed cheapest bound first and
    the search stops once no remaining bound can beat the ``keep``-th fastest time or come within
    ``pareto_within`` of the fastest; every layout matching ``must`` is timed whatever its bound,
    and so is every layout whose bound is under the fastest of them (its rank is then exact).
    ``progress(done, total)`` is called as candidates are settled (timed, pruned or over memory)."""
    _check_inputs(model, gpus, seq, global_batch_tokens, margin, space)
    if isinstance(keep, bool) or not isinstance(keep, int) or keep < 1:
        raise ModelcutError(f"keep must be a positive integer, got {keep!r}")
    if not 0 <= pareto_within:
        raise ModelcutError(f"pareto_within must be a non-negative fraction, got {pareto_within!r}")
    ex = Exploration([], gpus, hw.mem_bytes, margin,
                     framework=capabilities.framework if capabilities else None, keep=keep, pareto_within=pareto_within)
    search = _Search(model, hw, predictor, ex, seq, global_batch_tokens // seq, gpus_per_node, space, options,
                     prune, cached, capabilities, lower_bound, keep, pareto_within, dict(must or {}))
    kept = search.runnable(gpus, gpus_per_node or hw.per_node)
    search.rank(kept, progress)
    return ex


def count_runnable(model: ModelSpec, hw: Hardware, *, gpus: int, seq: int, global_batch_tokens: int,
                   gpus_per_node: int | None = None, space: Space = Space(),
                   capabilities: Capabilities | None = None, cap: int,
                   enumerated_cap: int | None = None) -> tuple[int, bool, int]:
    """What :func:`explore` would search, counted before any memory check or timing: (layouts, i.e.
    structures the stack runs times each one's variants; whether the count went past ``cap``,
    where it stops; the pipeline ops their shapes would simulate, each p·v·m·3). The same
    enumeration and rules as the search (:meth:`_Search.runnable_each`). ``enumerated_cap``: stop,
    counted as past ``cap``, after enumerating that many structures, runnable or not."""
    _check_inputs(model, gpus, seq, global_batch_tokens, DEFAULT_MARGIN, space)
    gb = global_batch_tokens // seq
    ex = Exploration([], gpus, hw.mem_bytes, DEFAULT_MARGIN)
    search = _Search(model, hw, None, ex, seq, gb, gpus_per_node, space, DEFAULT_OPTIONS, True, True,
                     capabilities, None, 1, 0.0, {})
    n = ops = 0
    for s, variants in search.runnable_each(gpus, gpus_per_node or hw.per_node):
        n += len(variants)
        ops += s.pp * s.vpp * (gb // (s.dp * s.micro_batch)) * 3
        if n > cap or (enumerated_cap is not None and ex.enumerated > enumerated_cap):
            return n, True, ops
    return n, False, ops


class _Search:
    """One search's state (:func:`explore`): the stack's rules, the memory of each structure, the
    layouts timed so far."""

    def __init__(self, model, hw, predictor, ex: Exploration, seq: int, gb: int, gpus_per_node, space: Space,
                 options: MemoryOptions, prune: bool, cached: bool, caps: Capabilities | None, lower_bound,
                 keep: int, pareto_within: float, want: dict[str, Any]) -> None:
        self.model, self.hw, self.predictor, self.ex = model, hw, predictor, ex
        self.seq, self.gb, self.gpus_per_node, self.space, self.options = seq, gb, gpus_per_node, space, options
        self.prune, self.cached, self.caps, self.lower_bound = prune, cached, caps, lower_bound
        self.keep, self.pareto_within, self.want = keep, pareto_within, want
        self.sp_ok = caps.sequence_parallel if caps is not None else True
        self.plans: dict[Structure, PipelinePlan] = {}
        self.memory: dict[Structure, list[Evaluated]] = {}
        self.timed: list[Evaluated] = []
        self.times: list[float] = []          # sorted step times of ``timed``
        self.named_s: float | None = None     # the fastest layout the query names (``must``), once timed

    # 1. the structures and variants the stack runs
    def _rejected(self, bad, count: int, matched: bool) -> bool:
        for v in bad:
            self.ex.rule_rejections[v.rule] = self.ex.rule_rejections.get(v.rule, 0) + count
            self.ex.rule_examples.setdefault(v.rule, v)
        if bad and matched:
            self.ex.check_violations += bad
        return bool(bad)

    def allowed_variants(self, s: Structure) -> list[tuple[str, int]]:
        out = []
        for r in recompute_choices(self.model, self.space):
            for z in (z for z in ZERO_ORDER if z in self.space.zeros):
                if s.dp_shard is not None and z == 0:
                    continue            # nothing sharded to replicate
                if self.caps is not None:
                    bad = violations(self.caps, self.model, tp=s.tp, cp=s.cp, pp=s.pp, dp=s.dp, zero=z, recompute=r)
                    matched = (_matches(s, self.want) and self.want.get("zero", z) == z
                               and self.want.get("recompute", r) == r)
                    if self._rejected(bad, 1, matched):
                        continue
                out.append((r, z))
        return out

    def runnable_each(self, gpus: int, gpn: int) -> Iterator[tuple[Structure, list[tuple[str, int]]]]:
        """Each structure the stack runs with its (recomputation, ZeRO stage) variants, as the
        space enumerates them; what the stack rejects is tallied in the exploration."""
        ex, caps, space = self.ex, self.caps, self.space
        n_variants = len(recompute_choices(self.model, space)) * sum(1 for z in ZERO_ORDER if z in space.zeros)
        for s in structures(self.model, gpus, self.seq, self.gb, gpn, space):
            ex.enumerated += 1
            if caps is not None:
                bad = violations(caps, self.model, tp=s.tp, cp=s.cp, pp=s.pp, dp=s.dp, ep=s.ep, vpp=s.vpp,
                                 schedule=s.schedule, cp_kind=s.cp_kind if s.cp > 1 else None, seq=self.seq,
                                 sequence_parallel=s.tp > 1 and self.sp_ok, dp_shard=s.dp_shard,
                                 last_layers=s.last_layers, local_batch=local_batch_of(space, s.pp))
                if self._rejected(bad, n_variants, _matches(s, self.want)):
                    continue
            variants = self.allowed_variants(s)
            if variants:
                yield s, variants

    def runnable(self, gpus: int, gpn: int) -> list[tuple[Structure, list[tuple[str, int]]]]:
        ex, caps = self.ex, self.caps
        kept = list(self.runnable_each(gpus, gpn))
        ex.structures = len(kept)
        ex.space = sum(len(v) for _, v in kept)
        if not kept:
            ex.notes.append("no layout of these sizes divides the GPUs, heads, sequence and batch"
                            + (f" and runs on {caps.framework}" if caps is not None and ex.enumerated else ""))
        return kept

    # memory, once per structure
    def run_of(self, s: Structure, r: str, z: int, count: int | None = None) -> Run:
        """The layout's run; under :data:`..specs.BLOCKS` with ``count`` layers recomputed a chunk,
        under :data:`..specs.EVERY` one layer in ``count`` on each rank. Without a count, the least
        recomputation, where a lower bound asks before the layout's memory is known: one layer a
        chunk, or one in as many as the model has (at most one on a rank)."""
        if count is None:
            count = self.model.layers if r == EVERY else 1
        return make_run(self.model, self.hw.name, s, self.seq, self.gb, r, z, self.gpus_per_node,
                        sequence_parallel=self.sp_ok, precision=self.space.precision,
                        fp8_recipe=self.space.fp8_recipe, order=self.space.order, count=count,
                        grad_reduce=self.space.grad_reduce, fp8_param_gather=self.space.fp8_param_gather,
                        attention=self.space.attention, cross_entropy=self.space.cross_entropy,
                        local_batch=local_batch_of(self.space, s.pp), act_fp8_input=self.space.act_fp8_input,
                        adam_moments=self.space.adam_moments)

    def _peak(self, run: Run, plan: PipelinePlan, r: str, z: int) -> float:
        """One variant's peak bytes: the shared fast path, or from the full schedule (``cached=False``)."""
        if self.cached:
            return variant_peaks(run, plan, [(r, z)], options=self.options)[(r, z)]
        return peak_bytes(stage_memory(run, options=self.options, plan=plan, cached=False))

    def fewest_blocks(self, s: Structure, z: int, plan: PipelinePlan,
                      known: dict[tuple[str, int], float]) -> tuple[int, float] | None:
        """:data:`..specs.BLOCKS` at ZeRO stage z: the fewest layers a chunk recomputes whole with
        which the layout fits, and its peak bytes (the most short of a whole chunk, and its peak,
        where none fits), by bisection (:meth:`least_recomputation`): fewer recomputed layers never
        need less memory (``tests/test_recompute_layers.py``). None where every chunk holds one
        layer (the variant is full recomputation)."""
        most = max(st.layers for st in plan.stages) - 1
        if most < 1:
            return None
        return self.least_recomputation(s, BLOCKS, z, plan, known, list(range(1, most + 1)))

    def most_every(self, s: Structure, z: int, plan: PipelinePlan,
                   known: dict[tuple[str, int], float]) -> tuple[int, float] | None:
        """:data:`..specs.EVERY` at ZeRO stage z: the most k (one layer in k recomputed whole on each
        rank) with which the layout fits, and its peak bytes (k = 2, the most recomputation short
        of full, and its peak, where none fits), over the most layers a rank holds … 2
        (:meth:`least_recomputation`). A larger k recomputes no more of a rank's layers (⌊n/k⌋);
        where each rank holds one stage of like layers that count is the whole rule, memory never
        falls as k grows, and bisection finds the most k. Where a rank holds several chunks (the
        chunks hold different counts of micro-batches) or its layers differ (an MoE model's dense
        layers, sliding or chunked attention), which layers are the multiples of k matters too and
        memory need not rise with k: the k are then tried from the most down, the first that fits
        being the most. None where no rank holds two layers (the variant is full or none)."""
        held: dict[int, int] = {}
        for st in plan.stages:
            held[st.device] = held.get(st.device, 0) + st.layers
        most = max(held.values())
        if most < 2:
            return None
        m = self.model
        like = (not (m.is_moe and (m.dense_layers or m.moe_every > 1)) and not m.sliding_layers
                and not m.chunked_layers)
        return self.least_recomputation(s, EVERY, z, plan, known, list(range(most, 1, -1)),
                                        monotone=like and len(held) == len(plan.stages))

    def least_recomputation(self, s: Structure, r: str, z: int, plan: PipelinePlan,
                            known: dict[tuple[str, int], float], counts: list[int],
                            monotone: bool = True) -> tuple[int, float]:
        """The first of a partial variant's ``counts`` (least recomputation first) with which the
        layout fits, and its peak bytes; the last, with its peak, where none fits. Where no
        recomputation fits (``known`` peaks) the first is taken as it is (the layout without
        recomputation fits and is the faster); where full recomputation does not fit, none does (a
        partial rule keeps more than full); else by bisection where memory never rises along
        ``counts`` (``monotone``), or one count after another from the first."""
        limit = self.ex.limit_bytes

        def peak(i: int) -> float:
            self.ex.memory_evaluations += 1
            return self._peak(self.run_of(s, r, z, counts[i]), plan, r, z)

        last = len(counts) - 1
        if known.get(("none", z), float("inf")) <= limit:
            return counts[0], peak(0)
        if known.get(("full", z), 0.0) > limit:
            return counts[last], peak(last)
        hi, at_hi = last, peak(last)           # the least recomputation known to fit
        if at_hi > limit or last == 0:
            return counts[hi], at_hi
        at_first = peak(0)
        if at_first <= limit:
            return counts[0], at_first
        if not monotone:
            for i in range(1, hi):
                at = peak(i)
                if at <= limit:
                    return counts[i], at
            return counts[hi], at_hi
        lo = 0                                 # the most recomputation known not to fit
        while hi - lo > 1:
            mid = (lo + hi) // 2
            at_mid = peak(mid)
            if at_mid <= limit:
                hi, at_hi = mid, at_mid
            else:
                lo = mid
        return counts[hi], at_hi

    def plan_of(self, s: Structure, variants) -> PipelinePlan:
        if s not in self.plans:
            self.plans[s] = memory_plan(self.run_of(s, *variants[0]), self.options, vpp=s.vpp, schedule=s.schedule)
        return self.plans[s]

    def evaluate(self, s: Structure, variants) -> list[Evaluated]:
        """Every variant's peak memory; the fast path shares the work between variants, the
        baseline (``cached=False``) computes each variant's stages from scratch."""
        if s in self.memory:
            return self.memory[s]
        ex, options = self.ex, self.options
        plan = self.plan_of(s, variants)
        plain = [(r, z) for r, z in variants if r not in PARTIAL]
        if self.cached and plain:
            peaks = variant_peaks(self.run_of(s, *plain[0]), plan, plain, options=options)
        else:
            peaks = {(r, z): self._peak(self.run_of(s, r, z), plan, r, z) for r, z in plain}
        ex.memory_evaluations += len(plain)
        counts: dict[tuple[str, int], int] = {}
        for r, z in variants:
            found = (self.fewest_blocks(s, z, plan, peaks) if r == BLOCKS
                     else self.most_every(s, z, plan, peaks) if r == EVERY else None)
            if found is not None:
                counts[(r, z)], peaks[(r, z)] = found
        evs = [Evaluated(s, r, z, self.run_of(s, r, z, counts.get((r, z))), pk,
                         pk <= ex.limit_bytes, options=options, plan=plan)
               for (r, z), pk in peaks.items()]
        feas = [e for e in evs if e.feasible]
        if not feas:
            ex.infeasible_structures += 1
        ex.feasible_seen += len(feas)
        if _matches(s, self.want):
            ex.check_seen += 1
            matching = [e for e in evs if self.want.get("zero", e.zero) == e.zero
                        and self.want.get("recompute", e.recompute) == e.recompute]
            if matching:
                least = min(e.peak_bytes for e in matching)
                ex.check_least_peak = least if ex.check_least_peak is None else min(ex.check_least_peak, least)
        self.memory[s] = evs
        return evs

    # 2. timing, cheapest lower bound first
    def time_it(self, e: Evaluated) -> None:
        e.prediction = self.predictor(e.run, self.hw)
        self.ex.predictions += 1
        self.timed.append(e)
        bisect.insort(self.times, e.step_time_s)

    def bound(self) -> float:
        """The step time a candidate's lower bound must stay under to be timed: the ``keep``-th
        fastest so far or ``pareto_within`` of the fastest, and at least the fastest layout the query
        names, so that every layout faster than it is timed and its rank is exact, whatever ``keep``."""
        if not self.prune or self.lower_bound is None or len(self.times) < self.keep:
            return float("inf")
        return max(self.times[self.keep - 1], self.times[0] * (1 + self.pareto_within), self.named_s or 0.0)

    def worth(self, s: Structure, variants, r: str) -> list[Evaluated]:
        """The frugal variant(s) of recomputation level r that fit (none if dominated)."""
        feas = [e for e in self.evaluate(s, variants) if e.feasible]
        chosen = frugal(feas) if self.prune else feas
        return [e for e in chosen if e.recompute == r]

    def candidates(self, kept, tick) -> list[tuple[float, int, Structure, Any, str]]:
        """(structure, recomputation level) pairs with their lower bounds, cheapest first;
        ``tick()`` after each bound (the search's first half of progress)."""
        cands = []
        for i, (s, variants) in enumerate(kept):
            for r in dict.fromkeys(r for r, _ in variants):
                lb = 0.0
                if self.lower_bound is not None and self.prune:
                    z = min(z for rr, z in variants if rr == r)
                    lb = self.lower_bound(self.run_of(s, r, z), self.hw, self.plan_of(s, variants))
                    self.ex.bounded += 1
                cands.append((lb, i, s, variants, r))
                tick()
        cands.sort(key=lambda c: (c[0], c[1]))
        return cands

    def _named(self, c) -> list[Evaluated]:
        """The variants of a candidate the query names (its ZeRO stage where it names one)."""
        if "zero" not in self.want:
            return self.worth(c[2], c[3], c[4])
        return [e for e in self.evaluate(c[2], c[3]) if e.feasible and e.recompute == c[4]
                and e.zero == self.want["zero"]]

    def rank(self, kept, progress: Callable[[int, int], None] | None) -> None:
        """Bound every candidate, then time them cheapest first until none can win. ``progress``
        counts both: each candidate once when bounded and once when settled (timed, pruned or
        over memory)."""
        ex, want = self.ex, self.want
        n = sum(len(dict.fromkeys(r for r, _ in variants)) for _, variants in kept)
        total = 2 * n
        step = max(1, total // 100)
        done = [0]

        def tick(force: bool = False) -> None:
            if not force:
                done[0] += 1
            if progress is not None and (force or done[0] % step == 0):
                progress(done[0], total)

        tick(True)
        cands = self.candidates(kept, tick)
        rest = []
        for c in cands:        # layouts the query names are timed first, whatever their bound
            if want and _matches(c[2], want) and want.get("recompute", c[4]) == c[4]:
                for e in self._named(c):
                    e.lower_bound_s = c[0]
                    self.time_it(e)
                    self.named_s = e.step_time_s if self.named_s is None else min(self.named_s, e.step_time_s)
                if "zero" in want:
                    rest.append(c)     # its other ZeRO stages compete for the best as any layout does
                else:
                    tick()
            else:
                rest.append(c)
        for k, (lb, _, s, variants, r) in enumerate(rest):
            if lb >= self.bound():
                ex.pruned_by_bound += len(rest) - k
                break
            least_zero = min(z for rr, z in variants if rr == r)
            for e in self.worth(s, variants, r):
                if e.prediction is not None:     # timed already: the query named it
                    continue
                e.lower_bound_s = lb
                # bounded again on its own run where that differs from the candidate's: another ZeRO
                # stage, or the layers a partial recomputation redoes now that its memory fixed them
                if self.lower_bound is not None and self.prune and (e.zero != least_zero or r in PARTIAL):
                    e.lower_bound_s = self.lower_bound(e.run, self.hw, e.plan)
                    if e.lower_bound_s >= self.bound():
                        ex.pruned_by_bound += 1
                        continue
                self.time_it(e)
            tick()
        done[0] = total
        tick(True)
        ex.layouts = ranked(self.timed)


#: Step times within this fraction of each other are a tie between layouts of the same shape (tp, cp,
#: ep, pp, dp and the shard group): a thousandth is far below what the model resolves (its errors on
#: published runs are percents, docs/default-model.md), so the explorer does not prefer, say, 41
#: virtual stages a device to 20 for 0.03 % of a step.
TIE_FRACTION = 0.001


def _shape_key(e: Evaluated) -> tuple:
    s = e.structure
    return (s.tp, s.cp, s.ep, s.expert_tp, s.pp, s.dp, s.dp_shard)


def _simplicity(e: Evaluated) -> tuple:
    """Less to run first: fewer chunks a device, a lower ZeRO stage, less recomputation, less memory."""
    return (e.structure.vpp, e.zero, RECOMPUTE_ORDER.index(e.recompute), e.peak_bytes)


def ranked(timed: list[Evaluated]) -> list[Evaluated]:
    """The timed layouts, fastest first, where layouts of one shape tie (:data:`TIE_FRACTION` of its
    fastest) the simplest first (:func:`_simplicity`); otherwise by step time, then peak memory."""
    best: dict[tuple, float] = {}
    for e in timed:
        k = _shape_key(e)
        best[k] = min(best.get(k, float("inf")), e.step_time_s)

    def key(e: Evaluated) -> tuple:
        t0 = best[_shape_key(e)]
        if e.step_time_s <= t0 * (1 + TIE_FRACTION):
            return (t0, 0, _simplicity(e), e.step_time_s)
        return (e.step_time_s, 1, (), e.peak_bytes)
    return sorted(timed, key=key)


def _recomputed(variant: str) -> frozenset[str] | None:
    """What a recomputation variant redoes, to compare variants: none nothing, selective its
    modules (the attention core by default), full everything (None)."""
    level, modules = recompute_variant(variant)
    if level == "full":
        return None
    return frozenset() if level == "none" else frozenset(modules or DEFAULT_RECOMPUTE_MODULES)


def no_more_recomputed(a: str, b: str) -> bool:
    """Variant a redoes no more than variant b (a subset of its work), so it is never slower.
    :data:`..specs.BLOCKS` and :data:`..specs.EVERY` (some layers whole) redo more than none and
    less than full, and are not compared with a module list, the attention core or each other."""
    if (a in PARTIAL or b in PARTIAL) and a != b:
        return a == "none" or b == "full"
    ra, rb = _recomputed(a), _recomputed(b)
    return rb is None or (ra is not None and ra <= rb)


def frugal(feasible: list[Evaluated]) -> list[Evaluated]:
    """The feasible variants of one structure worth predicting (module docstring: Pruning):
    for each recomputation variant, cheapest first, the least ZeRO stage that fits, kept only
    when it is less than that of every variant redoing no more of its work
    (:func:`no_more_recomputed`: the module list and the attention core are not compared). Where
    that stage is 0 and data parallelism has more than one rank, ZeRO-1 of the same variant too, if
    the stack runs it: the distributed optimizer reduce-scatters the gradients behind the backward
    and gathers the weights ahead of the next forward, each half of the all-reduce's bytes, and
    steps over a shard of the states, so it can beat plain data parallelism in time, not only in
    memory. From 1 up, each stage only adds communication and is kept for memory alone."""
    best: dict[str, Evaluated] = {}
    for e in feasible:
        if e.recompute not in best or e.zero < best[e.recompute].zero:
            best[e.recompute] = e
    kept = []
    for r in RECOMPUTE_ORDER:
        e = best.get(r)
        if e is not None and all(e.zero < c.zero for q, c in best.items() if q != r and no_more_recomputed(q, r)):
            kept.append(e)
            if e.zero == 0 and e.structure.dp * e.structure.cp > 1:
                kept += [c for c in feasible if c.recompute == r and c.zero == 1]
    return kept


def find(ex: Exploration, **want: Any) -> list[Evaluated]:
    """Ranked layouts matching the given fields (tp, cp, ep, etp, cp_kind, pp, dp, vpp, micro_batch,
    schedule, recompute, zero)."""
    return [e for e in ex.layouts if all(e.knobs().get(k) == v for k, v in want.items())]


def pareto(layouts: list[Evaluated], key: Callable[[Evaluated], float] = lambda e: e.peak_bytes) -> list[Evaluated]:
    """The layouts no other beats in both step time and ``key`` (peak memory by default), fastest
    first: each one needs less of ``key`` than every faster one."""
    out: list[Evaluated] = []
    least = float("inf")
    for e in sorted(layouts, key=lambda e: (e.step_time_s, key(e))):
        if key(e) < least:
            out.append(e)
            least = key(e)
    return out
