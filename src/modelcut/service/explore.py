"""The layout explorer as every face runs it (``modelcut explore``, ``POST /api/explore``).

:meth:`ExploreResult.as_dict` is the documented JSON: ``model`` and ``hardware`` (their fields),
``seq``, ``global_batch``, ``mode``, ``framework``, ``memory_assumptions``, ``summary`` (what the
search did: gpus, capacity_bytes, margin, limit_bytes, structures, space, memory_evaluations,
predictions, infeasible_structures, ranked, bounded, pruned_by_bound, enumerated, rule_rejections,
framework, and ``pareto``: the ranked layouts no other beats in both step time and peak memory,
each {rank, step_time_s, peak_bytes}), ``notes``, ``layouts`` (the fastest ``top``, each with its
``rank``, knobs, step time, throughput, breakdown, memory, ``microbatches`` and ``stage_layers``),
``why`` (the best against the runner-up: ``knobs``, ``step_time_s``, ``time_terms`` and
``memory_terms`` as {term, best, runner_up, difference}, ``pipeline``: the runner-up's busiest
pipeline rank where its load is uneven, {device, busy_s, mean_s, excess, holds}, else null; ``text``) and,
with a ``check``: the
best layout matching it, its ``rank`` and ``ratio_to_best``, ``why`` (the best against it), or,
where none is ranked, ``rule`` (the stack's rule its layouts break: framework, rule, message,
source, text) or ``least_peak_bytes`` (the least memory its layouts need), and ``text``, the
answer in one line.

Progress: :func:`run_explore` calls ``progress(done, total)`` as the search settles candidate
layouts (timed, pruned by the bound, or over memory), first with done = 0 and last with
done = total; :func:`run_explore_range` calls it with the counts of all its searches together.
"""

from __future__ import annotations

import dataclasses
from collections import Counter
from dataclasses import dataclass, field, replace
from typing import Any, Callable

from .. import catalog
from ..analysis.validation import seed_eta
from ..core.errors import ModelcutError
from ..core.explore import DEFAULT_SCHEDULES, Evaluated, Exploration, Space, count_runnable, explore, find, why
from ..core.explore.rules import Capabilities
from ..core.explore.space import recompute_choices, tp_ok
from ..core.explore.search import pareto
from ..core.memory import MemoryOptions, stack_options, with_moments
from ..core.costs import fp8 as fp8_mod
from ..core.costs.context import heads_split_problem
from ..core.specs import PARTIAL, Hardware, Layout, ModelSpec, Run, Training, moment_bytes, recipe_among, reduce_at
from ..core.step import predict as step_predict
from ..core.step.bounds import lower_bound
from ..core.step.default import small_node_note
from ..core.step.frameworks import Framework
from ..core.step.layer_budget import LayerBudget, layer_budget
from ..core.step.result import Prediction
from . import inputs
from .limits import DEFAULT, Limits
from .predict import SEED_HAS_NO_TIMELINE, count_above_peak, efficiency_for, no_timeline
from .requests import ExploreInput

GB = 1e9
TERM_NAMES = {"compute_s": "compute", "tp_s": "tensor-parallel", "cp_s": "context-parallel",
              "p2p_s": "pipeline sends", "bubble_s": "bubble", "dp_s": "data-parallel", "a2a_s": "expert all-to-all",
              "weights_bytes": "weights", "gradients_bytes": "gradients", "optimizer_bytes": "optimizer states",
              "activations_bytes": "activations", "buffers_bytes": "buffers"}
#: Every layout within this fraction of the fastest is timed (the Pareto set's reach), by default.
PARETO_WITHIN = 0.05
#: The layouts the bound keeps timed at least: the table's and the runner-up's.
MIN_KEEP = 2


@dataclass
class ExploreRequest:
    model: ModelSpec
    hw: Hardware
    gpus: int
    seq: int
    global_batch_tokens: int
    gpus_per_node: int | None = None
    mode: str = "default"
    framework: str | None = None
    margin: float = 0.02
    space: Space = field(default_factory=Space)
    options: MemoryOptions = field(default_factory=MemoryOptions)
    check: dict[str, Any] | None = None
    top: int = 5
    flash: bool | None = None              # None: as the stack runs attention
    reshard: bool | None = None            # None: as the stack reshards (ZeRO-3)
    pareto_within: float = PARETO_WITHIN
    exhaustive: bool = False               # time every layout that fits (no bound)
    limits: Limits = DEFAULT               # the work a request may ask for (service/limits.py)
    overlap: dict[str, Any] | None = None   # the stack's overlap overrides (as --overlap; inputs.NOT_MODELLED)


def stack(req: ExploreRequest) -> Framework | None:
    """The training stack the search ranks for: the named preset (default mode: the default
    preset) with its overlap overrides, ``reshard`` overriding its ZeRO-3 resharding; None in seed
    mode without one."""
    if req.mode == "seed" and req.framework is None:
        if req.overlap:
            raise ModelcutError("overlap overrides apply to --mode default (or name a --framework)")
        return None
    fw = catalog.framework(req.framework).with_overlap(inputs.overlap_options(req.overlap)[0])
    fw = fw.for_training(Training(seq_len=1, global_batch=1, precision=req.space.precision,
                                  grad_reduce=req.space.grad_reduce, fp8_param_gather=req.space.fp8_param_gather,
                                  attention=req.space.attention))
    if req.reshard is not None:
        fw = replace(fw, reshard_after_forward=req.reshard, reshard_with_pipeline=req.reshard)
    return fw


def memory_options(req: ExploreRequest, fw: Framework | None) -> MemoryOptions:
    """The memory assumptions of the search: the stack's (:func:`..core.memory.stack_options`, as
    ``predict`` counts them: attention kernel, resharding, gradient reduction, data types), the
    request's flags where given."""
    o = req.options
    if fw is not None:
        o = stack_options(fw, o)
        # the search's Adam moments (Space.adam_moments), sized as a run's are
        o = with_moments(o, moment_bytes(req.space.adam_moments))
    if req.flash is not None:
        o = replace(o, flash_attention=req.flash)
    if req.reshard is not None:
        o = replace(o, reshard_after_forward=req.reshard, reshard_with_pipeline=req.reshard)
    if fw is not None and req.space.precision == "fp8":   # FP8's weight copies and FP8-kept inputs
        tr = Training(seq_len=req.seq, global_batch=1, precision="fp8", fp8_recipe=req.space.fp8_recipe)
        o = replace(o, fp8=fp8_mod.for_stack(tr, req.hw, fw))
    return o


def predictor(mode: str, hw: Hardware, framework: str | Framework | None = None) -> Callable[[Run, Hardware], Any]:
    """The step model the explorer ranks by: the default model on the named stack with the
    shipped constants, or the seed model with its fitted η."""
    if mode == "seed":
        eta = seed_eta()
        return lambda run, h: step_predict(run, h, "seed", eta=eta)
    if mode != "default":
        raise ModelcutError(f"unknown mode {mode!r}; choose default or seed")
    fw = framework if isinstance(framework, Framework) else catalog.framework(framework)
    eff = efficiency_for(hw)
    return lambda run, h: step_predict(run, h, "default", efficiency=eff, framework=fw)


def bound_for(mode: str, hw: Hardware, fw: Framework | None):
    """The lower bound on the step model's time (:func:`..core.step.bounds.lower_bound`); None for
    the seed model (fast enough to time every layout)."""
    if mode != "default" or fw is None:
        return None
    eff = efficiency_for(hw)
    return lambda run, h, plan: lower_bound(run, h, eff, fw, plan)


def why_text(w: dict, a: str = "#1", b: str = "#2") -> str:
    """The explanation of :func:`..core.explore.why` in one sentence (``a`` beats ``b``)."""
    knobs = ", ".join(f"{k} {x} vs {y}" for k, (x, y) in w["knobs"].items()) or "no knob"
    t_best, t_other = w["step_time_s"]
    terms = [f"{TERM_NAMES[k]} {d:+.2f} s" for k, _, _, d in w["time_terms"][:3] if abs(d) > 1e-9]
    mem = [f"{TERM_NAMES[k]} {d / GB:+.1f} GB" for k, _, _, d in w["memory_terms"][:2] if abs(d) >= 0.05 * GB]
    u = w.get("pipeline")
    return (f"{a} beats {b} by {t_other - t_best:.3f} s ({(t_other / t_best - 1) * 100:.1f} %): they differ in "
            f"{knobs}; {b} spends {', '.join(terms) or 'the same time in every term'}"
            + (f"; its peak device holds {', '.join(mem)}" if mem else "")
            + (f"; its pipeline rank {u.device} works {u.busy_s:.3f} s against {u.mean_s:.3f} s on the average "
               f"rank (it holds {u.holds})" if u is not None else "") + ".")


def why_json(w: dict, a: str = "#1", b: str = "#2") -> dict[str, Any]:
    return {"knobs": {k: list(v) for k, v in w["knobs"].items()}, "step_time_s": list(w["step_time_s"]),
            "time_terms": [{"term": k, "best": x, "runner_up": y, "difference": d} for k, x, y, d in w["time_terms"]],
            "memory_terms": [{"term": k, "best": x, "runner_up": y, "difference": d}
                             for k, x, y, d in w["memory_terms"]],
            "pipeline": balance_json(w.get("pipeline")),
            "text": why_text(w, a, b)}


def balance_json(u) -> dict[str, Any] | None:
    """An uneven pipeline (:class:`..core.step.balance.Balance`) as JSON: the busiest ``device``, its
    ``busy_s``, the ranks' ``mean_s``, its ``excess`` over the mean (a fraction), and what it ``holds``."""
    return None if u is None else {"device": u.device, "busy_s": u.busy_s, "mean_s": u.mean_s, "excess": u.excess,
                                   "holds": u.holds}


def layout_json(e: Evaluated, rank: int) -> dict[str, Any]:
    d = e.as_dict()
    d["rank"] = rank
    d["microbatches"] = e.prediction.microbatches
    d["stage_layers"] = list(e.prediction.stage_layers)
    return d


def query_text(q: dict[str, Any]) -> str:
    return ",".join(f"{k}={v}" for k, v in q.items())


@dataclass
class ExploreResult:
    request: ExploreRequest
    exploration: Exploration
    checked: list[Evaluated]
    options: MemoryOptions = field(default_factory=MemoryOptions)
    framework: Framework | None = None

    @property
    def layouts(self) -> list[Evaluated]:
        return self.exploration.layouts

    def rank(self, e: Evaluated) -> int:
        return self.exploration.layouts.index(e) + 1

    @property
    def pareto(self) -> list[Evaluated]:
        """The ranked layouts within ``pareto_within`` of the fastest (every one of them is timed)
        that no other beats in both step time and peak memory."""
        ranked = self.exploration.layouts
        if not ranked:
            return []
        reach = ranked[0].step_time_s * (1 + self.request.pareto_within)
        return pareto([e for e in ranked if e.step_time_s <= reach])

    def check_answer(self) -> dict[str, Any] | None:
        """What became of the ``check`` layout (module doc)."""
        req, ex = self.request, self.exploration
        if req.check is None:
            return None
        q = query_text(req.check)
        out: dict[str, Any] = {"query": req.check, "best": None, "rank": None, "ratio_to_best": None, "why": None,
                               "rule": None, "least_peak_bytes": None}
        if self.checked:
            c = self.checked[0]
            best = ex.layouts[0]
            out.update(best=layout_json(c, self.rank(c)), rank=self.rank(c), ratio_to_best=c.step_time_s / best.step_time_s)
            if c is not best:
                out["why"] = why_json(why(best, c), "#1", f"#{self.rank(c)}")
            gap = (c.step_time_s / best.step_time_s - 1) * 100
            out["text"] = (f"{q}: best such layout ranks {self.rank(c)} of {len(ex.layouts)} timed, "
                           f"{c.step_time_s:.3f} s ({gap:+.1f} % vs the best), peak {c.peak_bytes / GB:.1f} GB")
            return out
        v = None
        if ex.check_violations:
            counts = Counter((x.rule, x.message) for x in ex.check_violations)
            (rule, message), _ = counts.most_common(1)[0]
            v = next(x for x in ex.check_violations if (x.rule, x.message) == (rule, message))
        if ex.check_least_peak is not None:      # some of its layouts the stack runs: memory refused them
            out["least_peak_bytes"] = ex.check_least_peak
            out["text"] = (f"{q}: does not fit: the layouts {self.framework.name if self.framework else 'one'} can run "
                           f"need at least {ex.check_least_peak / GB:.1f} GB, the limit is {ex.limit_bytes / GB:.1f} GB"
                           + (f"; the others break a rule: {v.message} (rule {v.rule})" if v is not None else ""))
        elif v is not None:
            out["rule"] = v.as_dict()
            out["text"] = f"{q}: {v.line()}"
        else:
            hier = ("; the a2a+p2p form only where the cp group leaves a node, its all-to-all groups the cp "
                    "ranks a node holds, or the largest part of them that cuts the heads"
                    if req.check.get("cp_kind") == "a2a+p2p" else "")
            out["text"] = (f"{q}: no layout of the searched space is like it ({ex.gpus:,} GPUs; schedules, "
                           f"micro-batch sizes, chunks, tensor parallelism within a node: see the options{hier})")
        return out

    def picked(self, pick: int, use: str = "pick") -> Evaluated:
        """The ``pick``-th ranked layout (1 = the best), or a one-line error (``use``: what the
        layout was wanted for, "emit" or "trace")."""
        ranked = self.exploration.layouts
        if not ranked:
            raise ModelcutError(f"no layout fits; nothing to {use}")
        if isinstance(pick, bool) or not isinstance(pick, int) or not 1 <= pick <= len(ranked):
            raise ModelcutError(f"--pick must be in 1..{len(ranked)}, got {pick}")
        return ranked[pick - 1]

    def timeline(self, pick: int = 1) -> tuple[Evaluated, Prediction]:
        """The ``pick``-th ranked layout and its step predicted again with its timeline
        (:mod:`..core.step.timeline`), on the stack and constants the search ranked it with: the
        same step time."""
        e = self.picked(pick, "trace")
        if self.request.mode != "default" or self.framework is None:
            raise ModelcutError(SEED_HAS_NO_TIMELINE)
        pred = step_predict(e.run, self.request.hw, "default", efficiency=efficiency_for(self.request.hw),
                            framework=self.framework, timeline=True)
        if not pred.timeline:
            raise ModelcutError(no_timeline(self.framework.name))
        return e, pred

    def layers(self, pick: int = 1) -> tuple[Evaluated, LayerBudget]:
        """The ``pick``-th ranked layout and one micro-batch of it itemised
        (:func:`..core.step.layer_budget.layer_budget`), on the stack and constants the search ranked
        it with."""
        e = self.picked(pick, "itemise")
        if self.request.mode != "default" or self.framework is None:
            raise ModelcutError("--layers itemises the default model's layers; the seed model sums terms")
        return e, layer_budget(e.run, self.request.hw, efficiency_for(self.request.hw), self.framework)

    def none_reason(self) -> str | None:
        """Why the search ranked no layout (None when it ranked some): the stack runs none of the
        layouts of these GPUs (the rule that left out the most, in words), or none of those it
        runs fits in memory."""
        ex = self.exploration
        if ex.layouts:
            return None
        if ex.space == 0 and ex.rule_rejections:
            rule = max(ex.rule_rejections, key=ex.rule_rejections.get)
            v = ex.rule_examples[rule]
            return (f"{v.framework} runs none of the {ex.enumerated:,} layouts of {self.request.gpus:,} GPUs: "
                    f"it cannot run {v.message} (rule {rule}: {v.source})")
        return "no layout fits in memory: try more GPUs, a shorter sequence or a smaller batch"

    def as_dict(self) -> dict[str, Any]:
        req, ex = self.request, self.exploration
        top = ex.layouts[:req.top]
        o = self.options
        ranks = {id(e): i for i, e in enumerate(ex.layouts, 1)}
        summary = ex.summary()
        summary["pareto"] = [{"rank": ranks[id(e)], "step_time_s": e.step_time_s, "peak_bytes": e.peak_bytes}
                             for e in self.pareto]
        out: dict[str, Any] = {
            "model": dataclasses.asdict(req.model), "hardware": req.hw.as_dict(), "seq": req.seq,
            "global_batch": req.global_batch_tokens // req.seq, "mode": req.mode,
            "framework": self.framework.name if self.framework is not None else None,
            "precision": req.space.precision, "fp8_recipe": req.space.fp8_recipe, "grad_reduce": req.space.grad_reduce,
            "fp8_param_gather": req.space.fp8_param_gather, "attention": req.space.attention,
            "local_batch": req.space.local_batch,
            "memory_assumptions": {"flash_attention": o.flash_attention, "reshard_after_forward": o.reshard_after_forward,
                                   "reshard_with_pipeline": o.reshard_with_pipeline,
                                   "pipeline_grad_sync": o.pipeline_grad_sync, "flat_grad_sync": o.flat_grad_sync,
                                   "buffer_fixed_bytes": o.buffer_fixed_bytes, "fragmentation": o.fragmentation},
            "summary": summary, "notes": list(ex.notes),
            "layouts": [layout_json(e, i) for i, e in enumerate(top, 1)],
            "why": why_json(why(top[0], top[1])) if len(top) >= 2 else None,
            "none_reason": self.none_reason(),
        }
        if req.check is not None:
            out["check"] = self.check_answer()
        return out


def check_problems(check: dict[str, Any], model: ModelSpec, gpus: int, seq: int) -> list[str]:
    """Why no layout of ``gpus`` GPUs can be the checked one, whatever fits: its sizes against
    the GPUs, the heads and the sequence (empty when it could be a layout)."""
    dims = {k: check[k] for k in ("tp", "cp", "pp", "dp") if check.get(k) is not None}
    out = []
    if len(dims) == 4:
        prod = dims["tp"] * dims["cp"] * dims["pp"] * dims["dp"]
        if prod != gpus:
            out.append(f"tp·cp·pp·dp = {prod:,} ≠ {gpus:,} GPUs")
    elif len(dims) > 1:     # one size alone is the loop's below
        prod = 1
        for k, v in dims.items():
            prod *= v
        if gpus % prod:
            out.append(f"{'·'.join(dims)} = {prod:,} does not divide the {gpus:,} GPUs")
    for k, v in dims.items():
        if gpus % v:
            out.append(f"{k} {v:,} does not divide the {gpus:,} GPUs")
    tp = check.get("tp")
    if tp is not None and not tp_ok(model, tp):
        if model.heads % tp:
            out.append(f"tp {tp:,} does not divide the model's {model.heads} heads")
        else:
            out.append(f"tp {tp:,} does not split the model's heads ({model.heads}, {model.kv_heads} KV) "
                       f"and MLP ({model.ffn_hidden}) evenly")
    cp = check.get("cp")
    if cp is not None and cp > 1 and seq % (2 * cp):
        out.append(f"cp {cp:,} does not split the {seq:,}-token sequence into 2·cp equal pieces")
    if check.get("cp_a2a") is not None and check.get("cp_kind") != "a2a+p2p":
        out.append("cp_a2a is the all-to-all groups' size of the a2a+p2p form; name cp_kind=a2a+p2p with it")
    if cp is not None and cp > 1 and check.get("cp_kind") == "a2a" and tp is not None and tp_ok(model, tp):
        why = heads_split_problem(model, tp, cp)
        if why is not None:
            out.append(why)
    pp = check.get("pp")
    if pp is not None and pp > model.layers:
        out.append(f"pp {pp:,} is more stages than the model's {model.layers} layers")
    rc = check.get("recompute")
    if rc is not None and not model.is_moe and rc not in recompute_choices(model, Space()):
        out.append(f"recompute {rc} names modules of a mixture-of-experts layer; on a dense model it "
                   "recomputes nothing (use none, selective, every, blocks or full)")
    ep = check.get("ep")
    if ep is not None and ep > 1 and not model.is_moe:
        out.append(f"ep {ep:,} needs a mixture-of-experts model; {model.name} is dense")
    elif ep is not None and ep > 1 and model.experts % ep:
        out.append(f"ep {ep:,} does not divide the model's {model.experts} experts")
    return list(dict.fromkeys(out))


def _check_text(check: dict[str, Any]) -> str:
    return ",".join(f"{k}={v}" for k, v in check.items())


#: Structures a count enumerates, runnable or not, per layout the cap admits, before it stops and
#: calls the space too large: the stack's rules leave out most of a large space (Qwen3-235B-A22B on
#: 256 H100 under megatron-bridge: 88,545 of 567,327 layouts), at a small cost per structure.
ENUMERATED_PER_LAYOUT = 4


def count_layouts(req: ExploreRequest, cap: int) -> tuple[int, bool, int]:
    """(layouts the search would cover: the structures the stack runs × their recomputation and
    ZeRO variants, as :func:`run_explore` searches them; whether they are more than ``cap``; the
    pipeline ops their shapes would simulate, each p·v·m·3), counting no further than ``cap``
    (:func:`..core.explore.count_runnable`)."""
    fw = stack(req)
    caps = catalog.capabilities(fw.name) if fw is not None else None
    return count_runnable(req.model, req.hw, gpus=req.gpus, seq=req.seq, global_batch_tokens=req.global_batch_tokens,
                          gpus_per_node=req.gpus_per_node, space=searched_space(req, fw, caps),
                          capabilities=caps, cap=cap, enumerated_cap=ENUMERATED_PER_LAYOUT * cap)


def _within_limits(req: ExploreRequest) -> None:
    """Refuse in one line, before any search, what is over the request's limits or a check no
    layout of these GPUs can be."""
    lim = req.limits
    lim.check("max_gpus", req.gpus, "gpus")
    lim.check("max_seq", req.seq, "seq")
    lim.check("max_tokens", req.global_batch_tokens, "global_batch_tokens")
    if req.gpus_per_node is not None:
        if isinstance(req.gpus_per_node, bool) or not isinstance(req.gpus_per_node, int) or req.gpus_per_node < 1:
            raise ModelcutError(f"gpus_per_node must be a positive integer, got {req.gpus_per_node!r}")
        lim.check("max_gpus", req.gpus_per_node, "gpus_per_node")
    lim.check_model(req.model)
    if req.global_batch_tokens % req.seq:
        raise ModelcutError(f"global batch of {req.global_batch_tokens:,} tokens is not a whole number of "
                            f"{req.seq:,}-token sequences")
    gb = req.global_batch_tokens // req.seq
    lim.check_pipeline(req.model.layers, gb)
    if req.check:
        problems = check_problems(req.check, req.model, req.gpus, req.seq)
        if problems:
            raise ModelcutError(f"check {_check_text(req.check)} cannot be a layout of {req.gpus:,} GPUs: "
                                + "; ".join(problems))
        if req.check.get("recompute") in PARTIAL and req.mode != "default":
            raise ModelcutError(f"check recompute={req.check['recompute']}: the seed model recomputes every layer "
                                "or none; some layers (the block method, one layer in k) are the default model's "
                                "(--mode default)")
    n, more, ops = count_layouts(req, lim.max_layouts)
    lim.check_layouts(n, more)
    if ops > lim.max_search_ops:
        raise lim.refuse("max_search_ops", f"the explorer's shapes would simulate over {ops:,} pipeline ops "
                                           f"(their p·v·m·3, m up to {gb:,} micro-batches): use longer sequences, "
                                           "fewer tokens or fewer schedules")


def timed_by(space: Space, mode: str) -> Space:
    """The space the step model of ``mode`` can time: the seed model recomputes every layer or none,
    so it is searched without :data:`..core.specs.PARTIAL` (some layers recomputed whole)."""
    if mode == "default" or not set(PARTIAL) & set(space.recomputes):
        return space
    return replace(space, recomputes=tuple(r for r in space.recomputes if r not in PARTIAL))


def searched_recomputes(req: ExploreRequest) -> list[str]:
    """The recomputation variants the request's search tries, least recomputed first: those its
    step model times (:func:`timed_by`) that the model has and its stack offers."""
    fw = stack(req)
    offered = catalog.capabilities(fw.name).recompute if fw is not None else None
    return [r for r in recompute_choices(req.model, timed_by(req.space, req.mode)) if offered is None or r in offered]


def run_explore(req: ExploreRequest, progress: Callable[[int, int], None] | None = None,
                search: bool = True) -> ExploreResult | None:
    """Search the layouts the stack runs, rank them, and find the ``check`` layout among them
    (module doc for ``progress``); refuse in one line, before searching, a check no layout of
    these GPUs can be and a search over the request's limits. ``search=False`` stops after those
    checks (a server refuses a request before queueing it)."""
    for name, val in (("gpus", req.gpus), ("seq", req.seq), ("global_batch_tokens", req.global_batch_tokens),
                      ("top", req.top)):
        if isinstance(val, bool) or not isinstance(val, int) or val < 1:
            raise ModelcutError(f"{name} must be a positive integer, got {val!r}")
    if req.mode not in ("default", "seed"):
        raise ModelcutError(f"unknown mode {req.mode!r}; choose default or seed")
    _within_limits(req)
    if not search:
        return None
    fw = stack(req)
    caps: Capabilities | None = catalog.capabilities(fw.name) if fw is not None else None
    space = searched_space(req, fw, caps)
    options = memory_options(req, fw)
    pred = predictor(req.mode, req.hw, fw) if req.mode == "default" else predictor("seed", req.hw)
    ex = explore(req.model, req.hw, pred, gpus=req.gpus, seq=req.seq, global_batch_tokens=req.global_batch_tokens,
                 gpus_per_node=req.gpus_per_node, margin=req.margin, space=space, options=options,
                 progress=progress, capabilities=caps,
                 lower_bound=None if req.exhaustive else bound_for(req.mode, req.hw, fw),
                 keep=max(req.top, MIN_KEEP), pareto_within=req.pareto_within, must=req.check)
    small = small_node_note(req.hw, req.gpus_per_node)
    if small:
        ex.notes.append(small)
    ex.notes += inputs.overlap_options(req.overlap)[1]
    if ex.layouts:
        # the layouts shown share the model and sequence: the first ranked's count stands for them
        above = count_above_peak(ex.layouts[0].run, req.hw, ex.layouts[0].prediction, "#1")
        if above is not None:
            ex.notes.append(above)
    checked = find(ex, **req.check) if req.check else []
    return ExploreResult(req, ex, checked, options, fw)


def searched_space(req: ExploreRequest, fw: Framework | None, caps: Capabilities | None) -> Space:
    """The space a search covers: the request's, as the stack ``fw`` (its rules ``caps``) and the
    step model of ``req.mode`` take it."""
    space = req.space
    if fw is not None and fw.default_etp is not None:
        space = replace(space, default_etp=fw.default_etp)     # the experts as the stack cuts them by default
    space = timed_by(space, req.mode)
    if space.hybrid_shard and (req.mode != "default" or (caps is not None and not caps.hybrid_shard)):
        # the seed model has no ZeRO to shard; a stack without hybrid sharding is not offered it
        space = replace(space, hybrid_shard=False)
    if space.uneven_split is not False:
        # a lighter last rank where the stack takes one; the deck's seed model is searched on the even split
        space = replace(space, uneven_split=req.mode == "default" and caps is not None and caps.uneven_split)
    if space.balanced_vpp_only is None:
        # a stack whose chunks take any number of layers (interleave "any": torch.distributed.pipelining's
        # stage builders, torchtitan's and NeMo AutoModel's) runs unequal ones too, and is searched so
        space = replace(space, balanced_vpp_only=not (req.mode == "default" and caps is not None
                                                      and caps.interleave == "any"))
    if caps is not None and space.schedules == DEFAULT_SCHEDULES:
        # by default: the registry's explored schedules and every other one the stack runs
        space = replace(space, schedules=tuple(dict.fromkeys(DEFAULT_SCHEDULES + caps.schedules)))
    return space


def gpu_counts(lo: int, hi: int, per_node: int) -> list[int]:
    """The GPU counts a range searches: lo, doubling, up to hi (hi itself included)."""
    for name, val in (("lowest GPU count", lo), ("highest GPU count", hi)):
        if isinstance(val, bool) or not isinstance(val, int) or val < 1:
            raise ModelcutError(f"{name} must be a positive integer, got {val!r}")
    if hi < lo:
        raise ModelcutError(f"GPU range {lo}-{hi}: the first count must not exceed the second")
    out, n = [], lo
    while n <= hi:
        out.append(n)
        n *= 2
    if out[-1] != hi:
        out.append(hi)
    if len(out) > 16:
        raise ModelcutError(f"GPU range {lo}-{hi} spans {len(out)} doublings; at most 16")
    del per_node
    return out


def run_explore_range(req: ExploreRequest, counts: list[int],
                      progress: Callable[[int, int], None] | None = None) -> list[ExploreResult]:
    """One search per GPU count (the check applies to each where it fits the count); ``progress``
    sees the candidates of all the searches as one count."""
    results: list[ExploreResult] = []
    done_before = [0]
    totals: dict[int, int] = {}

    for n in counts:
        sub = replace(req, gpus=n)
        if sub.check and any(k in sub.check for k in ("tp", "cp", "pp", "dp")):
            q = sub.check
            if all(k in q for k in ("tp", "cp", "pp", "dp")) and q["tp"] * q["cp"] * q["pp"] * q["dp"] != n:
                sub = replace(sub, check=None)

        def prog(done: int, total: int, n=n) -> None:
            totals[n] = total
            if progress is not None:
                progress(done_before[0] + done, done_before[0] + total + sum(1 for c in counts if c > n))
        results.append(run_explore(sub, prog))
        done_before[0] += totals.get(n, 0)
    if progress is not None:
        progress(done_before[0], done_before[0])
    return results


def check_each(reqs: list[ExploreRequest]) -> None:
    """Refuse in one line, before any search, a request of the list that :func:`run_explore` or its
    memory assumptions would refuse (FP8 the accelerator or the stack cannot run)."""
    for sub in reqs:
        run_explore(sub, search=False)
        memory_options(sub, stack(sub))


def run_explore_each(reqs: list[ExploreRequest],
                     progress: Callable[[int, int], None] | None = None) -> list[ExploreResult]:
    """One search per request (:func:`precision_requests`: the same problem at each precision).
    Every request is checked before any search, so an accelerator that cannot run one precision
    is refused at once; ``progress`` sees the searches' candidates as one count."""
    check_each(reqs)
    results: list[ExploreResult] = []
    done_before = [0]
    totals: dict[int, int] = {}
    for i, sub in enumerate(reqs):
        def prog(done: int, total: int, i=i) -> None:
            totals[i] = total
            if progress is not None:
                progress(done_before[0] + done, done_before[0] + total + (len(reqs) - 1 - i))
        results.append(run_explore(sub, prog))
        done_before[0] += totals.get(i, 0)
    if progress is not None:
        progress(done_before[0], done_before[0])
    return results


def fastest(results: list[ExploreResult]) -> ExploreResult | None:
    """The search whose best layout steps fastest (None if no layout fits in any)."""
    return min((r for r in results if r.layouts), key=lambda r: r.layouts[0].step_time_s, default=None)


@dataclass
class PrecisionSearches:
    """The same problem searched at each precision (``precisions``): what FP8 buys where the
    layouts may change with it (FP8's weight copies and smaller saved inputs move what fits)."""

    results: list[ExploreResult]

    @property
    def fastest(self) -> ExploreResult | None:
        return fastest(self.results)

    def as_dict(self) -> dict[str, Any]:
        best = self.fastest
        return {"precisions": [r.request.space.precision for r in self.results],
                "searches": [r.as_dict() for r in self.results],
                "fastest": best.request.space.precision if best is not None else None}


def precision_requests(inp: ExploreInput, limits: Limits | None = None) -> list[ExploreRequest]:
    """The searches a request asks for: one, or one per ``precisions`` entry (``fp8_recipe`` and
    ``fp8_param_gather`` with the FP8 one, a 16-bit ``grad_reduce`` in each one's 16-bit type),
    each built as a one-precision request is."""
    if not inp.precisions:
        return [explore_request(inp, limits)]
    recipe_among(inp.precisions, inp.fp8_recipe)
    return [explore_request(inp.model_copy(update={"precision": p, "precisions": None,
                                                   "fp8_recipe": inp.fp8_recipe if p == "fp8" else None,
                                                   "fp8_param_gather": inp.fp8_param_gather if p == "fp8" else None,
                                                   "grad_reduce": reduce_at(inp.grad_reduce, p)}),
                            limits)
            for p in inp.precisions]


def gpu_pareto(results: list[ExploreResult]) -> list[ExploreResult]:
    """The GPU counts where more GPUs buy a faster step: each one's best step time is below every
    smaller count's."""
    out, best = [], float("inf")
    for r in sorted(results, key=lambda r: r.request.gpus):
        if r.layouts and r.layouts[0].step_time_s < best:
            out.append(r)
            best = r.layouts[0].step_time_s
    return out


#: Layouts a published run's search may hold: the catalog's own problems are searched whole (the
#: largest, Megatron-Bridge's Qwen3 235B on 256 GPUs with its expert grid, holds 287,430: `modelcut explore
#: --run mbridge2511-qwen3-235b-a22b-256` prints 61,905 layouts the stack runs and 225,525 it cannot).
CATALOG_MAX_LAYOUTS = 1_000_000


def catalog_request(run_id: str, mode: str = "default", top: int = 5) -> ExploreRequest:
    """The search a published run of the catalog answers: its model, accelerator, GPU count,
    sequence and tokens a step, on its stack (runs_dev.toml), checking its published layout
    (tp, cp, pp, dp, and ep for an MoE model); the run's micro-batch among those tried, every layout
    in the run's rank order and at the run's precision (an FP8 run's layouts all in FP8, with its
    recipe), with the run's own kernel choices (attention, loss), gradient reduction, memory settings
    (the SwiGLU's FP8 input, Adam's moments' type) and local batch (how many schedule runs a
    pipelined layout makes a step, as predict times the run)."""
    pr = catalog.published_run(run_id)
    st = catalog.run_settings().get(run_id)
    run = catalog.apply_settings(pr.run, st)
    L, tr = run.layout, run.training
    check: dict[str, Any] = {"tp": L.tp, "cp": L.cp, "pp": L.pp, "dp": L.dp}
    if run.model.is_moe:
        check["ep"] = L.ep
        check["etp"] = L.etp or L.tp
    space = Space(micro_batches=tuple(sorted({1, 2, 4, tr.micro_batch})), order=L.order,
                  precision=tr.precision, fp8_recipe=tr.fp8_recipe, grad_reduce=tr.grad_reduce,
                  fp8_param_gather=tr.fp8_param_gather, attention=tr.attention, cross_entropy=tr.cross_entropy,
                  local_batch=tr.local_batch, act_fp8_input=tr.activation_func_fp8_input_store,
                  adam_moments=tr.adam_moments)
    return ExploreRequest(run.model, catalog.hardware(run.gpu), L.gpus, tr.seq_len, tr.global_batch * tr.seq_len,
                          run.gpus_per_node, mode, st.framework if st is not None else None,
                          overlap=dict(st.overlap) if st is not None and st.overlap else None, space=space,
                          check=check, top=top, limits=replace(DEFAULT, max_layouts=CATALOG_MAX_LAYOUTS))


def check_row(res: ExploreResult) -> dict[str, Any]:
    """One line of the catalog table (``modelcut explore --run all``): the published layout's rank
    and gap to the best, the best layout, the time term that differs most between them, and
    ``pipeline``: the published layout's busiest pipeline rank where its load is uneven
    (:func:`balance_json`; None otherwise)."""
    ans = res.check_answer() or {}
    best = res.layouts[0] if res.layouts else None
    row: dict[str, Any] = {"framework": res.framework.name if res.framework else None, "rank": ans.get("rank"),
                           "ratio_to_best": ans.get("ratio_to_best"), "text": ans.get("text"),
                           "best": layout_json(best, 1) if best is not None else None, "term": None,
                           "pipeline": None}
    if ans.get("why"):
        terms = ans["why"]["time_terms"]
        if terms:
            t = terms[0]
            row["term"] = {"term": t["term"], "difference_s": t["difference"]}
        row["pipeline"] = ans["why"].get("pipeline")
    return row


#: A published layout counts as the explorer's choice too when it is within this share of the best.
CLOSE_TO_BEST = 0.05


def catalog_summary(rows: list[dict[str, Any]]) -> dict[str, int]:
    """How the published layouts of :func:`check_row` rows stand: ``runs``, ``ranked`` (the
    explorer timed them), ``close`` (within :data:`CLOSE_TO_BEST` of the best) and ``first``."""
    ranked = [r for r in rows if r.get("rank") is not None and r.get("ratio_to_best") is not None]
    return {"runs": len(rows), "ranked": len(ranked),
            "close": sum(1 for r in ranked if r["ratio_to_best"] <= 1 + CLOSE_TO_BEST),
            "first": sum(1 for r in ranked if r["rank"] == 1)}


def explore_request(inp: ExploreInput, limits: Limits | None = None) -> ExploreRequest:
    """The search a validated request asks for (the CLI's options and the web's body alike)."""
    lim = limits or DEFAULT
    spec = inputs.model_choice(inp.model, inp.hf_config, inp.model_spec, lim)
    hw = catalog.hardware(inp.gpu)
    kw: dict[str, Any] = {}
    if inp.schedules is not None:
        kw["schedules"] = tuple(inp.schedules)
    if inp.micro_batches is not None:
        kw["micro_batches"] = tuple(sorted(inp.micro_batches))
    if inp.eps is not None:
        kw["eps"] = tuple(inp.eps)
    if inp.cp_kinds is not None:
        kw["cp_kinds"] = tuple(inp.cp_kinds)
    # the memory settings checked against the model once, by the run's own rules (Run.__post_init__)
    Run(spec, hw.name, Layout(), Training(seq_len=inp.seq, global_batch=1, adam_moments=inp.adam_moments,
                                          activation_func_fp8_input_store=inp.activation_func_fp8_input_store))
    space = Space(allow_tp_across_nodes=inp.allow_tp_across_nodes, precision=inp.precision,
                  fp8_recipe=inp.fp8_recipe, grad_reduce=inp.grad_reduce, fp8_param_gather=inp.fp8_param_gather,
                  attention=inp.attention, local_batch=inp.local_batch,
                  act_fp8_input=inp.activation_func_fp8_input_store, adam_moments=inp.adam_moments, **kw)
    check = inp.check.model_dump(exclude_none=True) if inp.check is not None else None
    return ExploreRequest(spec, hw, inp.gpus, inp.seq, inputs.parse_tokens(inp.global_batch_tokens),
                          inp.gpus_per_node, inp.mode, inp.framework, inp.margin, space, check=check, top=inp.top,
                          flash=inp.flash_attention, reshard=inp.reshard_after_forward,
                          pareto_within=inp.pareto_within, exhaustive=inp.exhaustive, limits=lim,
                          overlap=inp.overlap.model_dump(exclude_none=True) or None if inp.overlap is not None else None)


def explore_input(inp: ExploreInput, limits: Limits | None = None,
                  progress: Callable[[int, int], None] | None = None,
                  search: bool = True) -> ExploreResult | PrecisionSearches | None:
    """The use case from a validated request: :func:`precision_requests`, then :func:`run_explore`,
    or one search per precision (:class:`PrecisionSearches`); ``search=False``: the checks only."""
    reqs = precision_requests(inp, limits)
    if len(reqs) == 1:
        return run_explore(reqs[0], progress, search)
    if not search:
        check_each(reqs)
        return None
    return PrecisionSearches(run_explore_each(reqs, progress))
