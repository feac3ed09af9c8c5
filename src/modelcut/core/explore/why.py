"""Why one ranked layout beats another: the knobs that differ and the time and memory terms that
differ most."""

from __future__ import annotations

from typing import Any

from ..costs.context import cp_form_label
from ..step.balance import Balance, pipeline_balance

BREAKDOWN_TERMS = ("compute_s", "tp_s", "cp_s", "p2p_s", "bubble_s", "dp_s", "a2a_s")
MEMORY_TERMS = ("weights_bytes", "gradients_bytes", "optimizer_bytes", "activations_bytes", "buffers_bytes")


def recompute_label(d: dict[str, Any]) -> str:
    """A layout's recomputation as its knobs name it: the variant, with its count where it has one
    (``blocks 14``: the first 14 layers of each chunk; ``every 2``: one layer in 2 on each rank)."""
    n = d.get("recompute_layers") or d.get("recompute_every")
    return f"{d['recompute']} {n}" if n else d["recompute"]


def _balance(e) -> Balance | None:
    """An evaluated layout's uneven pipeline (:func:`..step.balance.pipeline_balance`), if any."""
    p = e.prediction
    return None if p is None else pipeline_balance(p.plan, p.device_busy_s)


def why(best, other) -> dict[str, Any]:
    """Why ``best`` beats ``other``: the knobs that differ (the recomputation with its count,
    :func:`recompute_label`; the context-parallel form with its groups,
    :func:`..costs.context.cp_form_label`), the
    time and memory terms in order of how much they differ (other − best), and ``pipeline``:
    ``other``'s busiest pipeline device where its load is uneven and more so than ``best``'s
    (:class:`..step.balance.Balance`; None otherwise)."""
    a, b = best.as_dict(), other.as_dict()
    a["recompute"], b["recompute"] = recompute_label(a), recompute_label(b)
    a["cp_kind"], b["cp_kind"] = cp_form_label(a["cp_kind"], a["cp_a2a"]), cp_form_label(b["cp_kind"], b["cp_a2a"])
    for d in (a, b):
        d["last_layers"] = d["last_layers"] or "even"      # a lighter last rank's layers, else the even split
    knobs = {k: (a[k], b[k]) for k in ("tp", "cp", "ep", "etp", "cp_kind", "pp", "dp", "dp_shard", "vpp", "last_layers", "micro_batch",
                                        "recompute", "zero", "schedule") if a[k] != b[k]
             and not (k == "cp_kind" and None in (a[k], b[k]))}     # a form only where both split the sequence
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
    ub, uo = _balance(best), _balance(other)
    pipeline = uo if uo is not None and (ub is None or uo.excess > ub.excess) else None
    return {"knobs": knobs, "step_time_s": (best.step_time_s, other.step_time_s),
            "time_terms": time_terms, "memory_terms": mem_terms, "pipeline": pipeline}
