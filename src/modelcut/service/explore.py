"""The layout explorer as every face runs it (``modelcut explore``, ``POST /api/explore``).

:meth:`ExploreResult.as_dict` is the documented JSON: ``model`` and ``hardware`` (their fields),
``seq``, ``global_batch``, ``mode``, ``framework``, ``memory_assumptions``, ``summary`` (what the
search did: gpus, capacity_bytes, margin, limit_bytes, structures, space, memory_evaluations,
predictions, infeasible_structures, ranked), ``notes``, ``layouts`` (the fastest ``top``, each
with its ``rank``, knobs, step time, throughput, breakdown, memory, ``microbatches`` and
``stage_layers``), ``why`` (the best against the runner-up: ``knobs``, ``step_time_s``,
``time_terms`` and ``memory_terms`` as {term, best, runner_up, difference}, ``text``) and, with a
``check``, the best layout matching it and its rank.
"""

from __future__ import annotations

import dataclasses
import itertools
from dataclasses import dataclass, field
from typing import Any, Callable

from .. import catalog
from ..analysis.validation import seed_eta
from ..core.errors import ModelcutError
from ..core.explore import Evaluated, Exploration, Space, explore, find, structures, why
from ..core.explore.space import RECOMPUTE_ORDER, ZERO_ORDER, tp_ok
from ..core.memory import MemoryOptions
from ..core.specs import Hardware, ModelSpec, Run
from ..core.step import predict as step_predict
from . import inputs
from .limits import DEFAULT, Limits
from .predict import efficiency_for
from .requests import ExploreInput

GB = 1e9
TERM_NAMES = {"compute_s": "compute", "tp_s": "tensor-parallel", "cp_s": "context-parallel",
              "p2p_s": "pipeline sends", "bubble_s": "bubble", "dp_s": "data-parallel", "a2a_s": "expert all-to-all",
              "weights_bytes": "weights", "gradients_bytes": "gradients", "optimizer_bytes": "optimizer states",
              "activations_bytes": "activations", "buffers_bytes": "buffers"}


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
    limits: Limits = DEFAULT


def predictor(mode: str, hw: Hardware, framework: str | None = None) -> Callable[[Run, Hardware], Any]:
    """The step model the explorer ranks by: the default model on the named stack with the
    shipped constants, or the seed model with its fitted η."""
    if mode == "seed":
        eta = seed_eta()
        return lambda run, h: step_predict(run, h, "seed", eta=eta)
    if mode != "default":
        raise ModelcutError(f"unknown mode {mode!r}; choose default or seed")
    fw = catalog.framework(framework)
    eff = efficiency_for(hw)
    return lambda run, h: step_predict(run, h, "default", efficiency=eff, framework=fw)


def _knobs(w: dict) -> dict:
    """The knobs that differ, less the context-parallel form where one side has no context
    parallelism (the form of cp = 1 is no choice: cp's own difference says it)."""
    return {k: v for k, v in w["knobs"].items() if not (k == "cp_kind" and None in v)}


def why_text(w: dict) -> str:
    """The explanation of :func:`..core.explore.why` in one sentence."""
    w = {**w, "knobs": _knobs(w)}
    knobs = ", ".join(f"{k} {a} vs {b}" for k, (a, b) in w["knobs"].items()) or "no knob"
    t_best, t_other = w["step_time_s"]
    terms = [f"{TERM_NAMES[k]} {d:+.2f} s" for k, _, _, d in w["time_terms"][:3] if abs(d) > 1e-9]
    mem = [f"{TERM_NAMES[k]} {d / GB:+.1f} GB" for k, _, _, d in w["memory_terms"][:2] if abs(d) > 1e6]
    return (f"#1 beats #2 by {t_other - t_best:.3f} s ({(t_other / t_best - 1) * 100:.1f} %): they differ in {knobs}; "
            f"#2 spends {', '.join(terms) or 'the same time in every term'}"
            + (f"; its peak device holds {', '.join(mem)}" if mem else "") + ".")


def why_json(w: dict) -> dict[str, Any]:
    return {"knobs": {k: list(v) for k, v in _knobs(w).items()}, "step_time_s": list(w["step_time_s"]),
            "time_terms": [{"term": k, "best": a, "runner_up": b, "difference": d} for k, a, b, d in w["time_terms"]],
            "memory_terms": [{"term": k, "best": a, "runner_up": b, "difference": d}
                             for k, a, b, d in w["memory_terms"]],
            "text": why_text(w)}


def layout_json(e: Evaluated, rank: int) -> dict[str, Any]:
    d = e.as_dict()
    d["rank"] = rank
    d["microbatches"] = e.prediction.microbatches
    d["stage_layers"] = list(e.prediction.stage_layers)
    return d


@dataclass
class ExploreResult:
    request: ExploreRequest
    exploration: Exploration
    checked: list[Evaluated]
    check_reason: str | None = None     # why no ranked layout matches the check

    @property
    def layouts(self) -> list[Evaluated]:
        return self.exploration.layouts

    def as_dict(self) -> dict[str, Any]:
        req, ex = self.request, self.exploration
        top = ex.layouts[:req.top]
        o = req.options
        out: dict[str, Any] = {
            "model": dataclasses.asdict(req.model), "hardware": dataclasses.asdict(req.hw), "seq": req.seq,
            "global_batch": req.global_batch_tokens // req.seq, "mode": req.mode,
            "framework": catalog.framework(req.framework).name if req.mode == "default" else None,
            "memory_assumptions": {"flash_attention": o.flash_attention, "reshard_after_forward": o.reshard_after_forward,
                                   "buffer_fixed_bytes": o.buffer_fixed_bytes, "fragmentation": o.fragmentation},
            "summary": ex.summary(), "notes": list(ex.notes),
            "layouts": [layout_json(e, i) for i, e in enumerate(top, 1)],
            "why": why_json(why(top[0], top[1])) if len(top) >= 2 else None,
        }
        if req.check is not None:
            c = self.checked[0] if self.checked else None
            out["check"] = {"query": req.check, "best": layout_json(c, ex.layouts.index(c) + 1) if c else None,
                            "rank": ex.layouts.index(c) + 1 if c else None,
                            "ratio_to_best": c.step_time_s / ex.layouts[0].step_time_s if c else None,
                            "reason": None if c else self.check_reason}
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
    else:
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
    pp = check.get("pp")
    if pp is not None and pp > model.layers:
        out.append(f"pp {pp:,} is more stages than the model's {model.layers} layers")
    ep = check.get("ep")
    if ep is not None and ep > 1 and (not model.is_moe or model.experts % ep):
        out.append(f"ep {ep:,} does not divide the model's {model.experts} experts")
    return list(dict.fromkeys(out))


def _check_text(check: dict[str, Any]) -> str:
    return ",".join(f"{k}={v}" for k, v in check.items())


def count_layouts(req: ExploreRequest, cap: int, ops_cap: int | None = None) -> tuple[int, bool, int]:
    """(layouts the space holds, whether it holds more than ``cap``, the pipeline ops its shapes
    would simulate: each p·v·m·3), counting structures no further than the caps allow."""
    space = req.space
    variants = len([r for r in RECOMPUTE_ORDER if r in space.recomputes]) * len(
        [z for z in ZERO_ORDER if z in space.zeros])
    gb = req.global_batch_tokens // req.seq
    gpn = req.gpus_per_node or req.hw.per_node
    n, ops = 0, 0
    for s in itertools.islice(structures(req.model, req.gpus, req.seq, gb, gpn, space), cap // max(variants, 1) + 1):
        n += 1
        ops += s.pp * s.vpp * (gb // (s.dp * s.micro_batch)) * 3
        if ops_cap is not None and ops > ops_cap:
            break
    return n * variants, n * variants > cap, ops


def _check_reason(req: ExploreRequest) -> str:
    """Why the ranked layouts hold none like the check: none of the space is, or none fits."""
    gb = req.global_batch_tokens // req.seq
    gpn = req.gpus_per_node or req.hw.per_node
    want = {k: v for k, v in req.check.items() if k not in ("recompute", "zero")}
    for s in structures(req.model, req.gpus, req.seq, gb, gpn, req.space):
        if all(getattr(s, k) == v for k, v in want.items()):
            return "no such layout fits in memory"
    return ("no layout of the searched space is like it (schedules, micro-batch sizes, chunks, tensor "
            "parallelism within a node: see the options)")


def run_explore(req: ExploreRequest, progress: Callable[[int, int], None] | None = None,
                search: bool = True) -> ExploreResult | None:
    """Search, rank, and find the ``check`` layout among the ranked ones; refuse in one line,
    before searching, a check no layout of these GPUs can be and a space over the limits.
    ``search=False`` stops after those checks (a server refuses a request before queueing it)."""
    for name, val in (("gpus", req.gpus), ("seq", req.seq), ("global_batch_tokens", req.global_batch_tokens),
                      ("top", req.top)):
        if isinstance(val, bool) or not isinstance(val, int) or val < 1:
            raise ModelcutError(f"{name} must be a positive integer, got {val!r}")
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
    n, more, ops = count_layouts(req, lim.max_layouts, lim.max_search_ops)
    lim.check_layouts(n, more)
    if ops > lim.max_search_ops:
        raise lim.refuse("max_search_ops", f"the explorer's shapes would simulate over {ops:,} pipeline ops "
                                           f"(their p·v·m·3, m up to "
                                           f"{gb:,} micro-batches): use longer sequences, fewer tokens or fewer "
                                           "schedules")
    if not search:
        return None
    ex = explore(req.model, req.hw, predictor(req.mode, req.hw, req.framework), gpus=req.gpus, seq=req.seq,
                 global_batch_tokens=req.global_batch_tokens, gpus_per_node=req.gpus_per_node, margin=req.margin,
                 space=req.space, options=req.options, progress=progress)
    checked = find(ex, **req.check) if req.check else []
    reason = _check_reason(req) if req.check and not checked else None
    return ExploreResult(req, ex, checked, reason)


def explore_input(inp: ExploreInput, limits: Limits | None = None,
                  progress: Callable[[int, int], None] | None = None, search: bool = True) -> ExploreResult | None:
    """The use case from a validated request: the model resolved, the space built, then
    :func:`run_explore` (``search=False``: its checks only)."""
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
    space = Space(allow_tp_across_nodes=inp.allow_tp_across_nodes, **kw)
    check = inp.check.model_dump(exclude_none=True) if inp.check is not None else None
    req = ExploreRequest(spec, hw, inp.gpus, inp.seq, inputs.parse_tokens(inp.global_batch_tokens),
                         inp.gpus_per_node, inp.mode, inp.framework, inp.margin, space,
                         MemoryOptions(flash_attention=inp.flash_attention,
                                       reshard_after_forward=inp.reshard_after_forward),
                         check, inp.top, lim)
    return run_explore(req, progress, search)
