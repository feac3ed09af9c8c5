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
from dataclasses import dataclass, field
from typing import Any, Callable

from .. import catalog
from ..analysis.validation import seed_eta
from ..core.errors import ModelcutError
from ..core.explore import Evaluated, Exploration, Space, explore, find, why
from ..core.memory import MemoryOptions
from ..core.specs import Hardware, ModelSpec, Run
from ..core.step import predict as step_predict
from .predict import efficiency_for

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


def why_text(w: dict) -> str:
    """The explanation of :func:`..core.explore.why` in one sentence."""
    knobs = ", ".join(f"{k} {a} vs {b}" for k, (a, b) in w["knobs"].items()) or "no knob"
    t_best, t_other = w["step_time_s"]
    terms = [f"{TERM_NAMES[k]} {d:+.2f} s" for k, _, _, d in w["time_terms"][:3] if abs(d) > 1e-9]
    mem = [f"{TERM_NAMES[k]} {d / GB:+.1f} GB" for k, _, _, d in w["memory_terms"][:2] if abs(d) > 1e6]
    return (f"#1 beats #2 by {t_other - t_best:.3f} s ({(t_other / t_best - 1) * 100:.1f} %): they differ in {knobs}; "
            f"#2 spends {', '.join(terms) or 'the same time in every term'}"
            + (f"; its peak device holds {', '.join(mem)}" if mem else "") + ".")


def why_json(w: dict) -> dict[str, Any]:
    return {"knobs": {k: list(v) for k, v in w["knobs"].items()}, "step_time_s": list(w["step_time_s"]),
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

    @property
    def layouts(self) -> list[Evaluated]:
        return self.exploration.layouts

    def as_dict(self) -> dict[str, Any]:
        req, ex = self.request, self.exploration
        top = ex.layouts[:req.top]
        o = req.options
        out: dict[str, Any] = {
            "model": dataclasses.asdict(req.model), "hardware": req.hw.as_dict(), "seq": req.seq,
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
                            "ratio_to_best": c.step_time_s / ex.layouts[0].step_time_s if c else None}
        return out


def run_explore(req: ExploreRequest, progress: Callable[[int, int], None] | None = None) -> ExploreResult:
    """Search, rank, and find the ``check`` layout among the ranked ones."""
    for name, val in (("gpus", req.gpus), ("seq", req.seq), ("global_batch_tokens", req.global_batch_tokens),
                      ("top", req.top)):
        if isinstance(val, bool) or not isinstance(val, int) or val < 1:
            raise ModelcutError(f"{name} must be a positive integer, got {val!r}")
    ex = explore(req.model, req.hw, predictor(req.mode, req.hw, req.framework), gpus=req.gpus, seq=req.seq,
                 global_batch_tokens=req.global_batch_tokens, gpus_per_node=req.gpus_per_node, margin=req.margin,
                 space=req.space, options=req.options, progress=progress)
    checked = find(ex, **req.check) if req.check else []
    return ExploreResult(req, ex, checked)
