"""The error budget of a prediction: which term dominates the step, and how far the prediction
moves when each uncertain input takes its other plausible values."""

from __future__ import annotations

from dataclasses import dataclass, replace

from .. import catalog
from ..core.costs.kernels import Efficiency
from ..core.errors import ModelcutError
from ..core.specs import RECOMPUTE_LEVELS, Hardware, Run
from ..core.step import default


@dataclass
class BudgetLine:
    input: str
    alternative: str
    change_pct: float     # change of predicted throughput (steps per second), %


@dataclass
class ErrorBudget:
    dominant: str                 # the largest term of the step
    dominant_share: float         # its share of the step time
    terms: dict[str, float]       # every term, seconds
    lines: list[BudgetLine]


def alternatives(run: Run, fw_overlap: dict[str, bool]) -> list[tuple[str, str, Run, dict]]:
    """The other plausible values of the uncertain inputs: micro-batch halved and doubled
    (where the batch allows; a local batch, where given, stays unless the doubled micro-batch
    outgrows it, then it grows with it), each overlap option that applies to the layout flipped,
    the other recomputation modes, interleaving one step up and down (with a pipeline)."""
    out: list[tuple[str, str, Run, dict]] = []
    tr, L = run.training, run.layout
    b = tr.micro_batch
    per_replica = tr.global_batch // L.dp
    for nb in (b // 2, b * 2):
        if nb >= 1 and nb != b and per_replica % nb == 0:
            lb = tr.local_batch if tr.local_batch is None or tr.local_batch % nb == 0 else nb
            out.append(("micro-batch", str(nb), replace(run, training=replace(tr, micro_batch=nb, local_batch=lb)),
                        {}))
    applies = {"grad_reduce": L.dp * L.cp > 1, "param_gather": L.dp * L.cp > 1, "p2p_async": L.pp > 1,
               "tp_comm": L.tp > 1}
    for k, val in fw_overlap.items():
        if applies.get(k, True):
            out.append((f"overlap {k}", "on" if not val else "off", run, {k: not val}))
    for rc in RECOMPUTE_LEVELS:
        if rc != tr.recompute:
            out.append(("recompute", rc, replace(run, training=replace(tr, recompute=rc, recompute_modules=None,
                                                                       recompute_layers=None, recompute_every=None)), {}))
    if tr.partial_recompute:      # some layers (the block method's, every k-th) against every layer
        out.append(("recompute", "full, every layer",
                    replace(run, training=replace(tr, recompute_layers=None, recompute_every=None)), {}))
    if L.pp > 1:
        v = L.vpp or 1
        for nv in (v - 1, v + 1):
            if nv >= 1 and L.pp * nv <= run.model.layers + 2:
                out.append(("interleaving", f"v={nv}", run.with_layout(vpp=nv if nv > 1 else None), {}))
    return out


def error_budget(run: Run, hw: Hardware, eff: Efficiency, framework: str | None = None,
                 overlap: dict | None = None) -> ErrorBudget:
    """Which term dominates ``run``'s predicted step, and how far the prediction moves when
    each uncertain input takes its other plausible values (:func:`alternatives`). An
    alternative the model refuses (a layout no framework would run) is skipped."""
    fw = catalog.framework(framework)
    base = default.predict(run, hw, eff, fw.with_overlap(overlap))
    bd = base.breakdown
    terms = {k: float(v) for k, v in bd.as_dict().items()}
    dominant = max(terms, key=lambda k: terms[k])
    ov = fw.overlap.with_options(**(overlap or {})).as_dict()
    if fw.zero3_runtime == "deepspeed-0.3" and fw.zero_stage(run.layout) == 3 and run.layout.pp == 1:
        ov.pop("grad_reduce", None)   # the replayed hooks decide when gradients are reduced
    lines = []
    for name, alt, r2, ov2 in alternatives(run, ov):
        try:
            p2 = default.predict(r2, hw, eff, fw.with_overlap({**(overlap or {}), **ov2}))
        except ModelcutError:
            continue
        lines.append(BudgetLine(name, alt, (base.step_time_s / p2.step_time_s - 1) * 100))
    return ErrorBudget(dominant, terms[dominant] / base.step_time_s, terms, lines)