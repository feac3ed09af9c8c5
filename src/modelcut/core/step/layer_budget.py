"""Where one micro-batch's time goes on one device, unit by unit and kernel by kernel: the
default model's own passes (:mod:`.layers`, :mod:`.stage_costs`) itemised, nothing recomputed
apart from them.

Each unit (a dense layer, a mixture-of-experts layer, the embedding, the logits and loss) is one
micro-batch's forward and backward on one device, as the pipeline's stages charge it
(:func:`.stage_costs.unit_costs`), in lines:

* each linear product: its (m, n, k) on the device, ``count`` alike, its data type, the forward
  and the backward (data gradient + weight gradient) seconds, and the TFLOP/s that makes, 2·m·n·k
  a product and pass over its seconds;
* the attention core: the kernel's forward and backward (its memory-bound part included);
* each memory-bound kernel group: its bytes and their seconds at η_mem of the measured HBM rate
  (:func:`..costs.kernels.mem_time`);
* the tensor-parallel collectives as the stack leaves them exposed (:func:`.exposure.exposed_tp`),
  the context-parallel exchanges as exposed, the expert all-to-all on the compute stream
  (:func:`.stage_costs.moe_a2a`, its backward with a full recomputation's repeat);
* the recomputed forward, in the backward column (its exposed communication included).

A unit's lines sum to its forward and backward (the memory lines to within rounding, each timed
apart). What is not a unit's is not here: the pipeline's bubble and sends, the data-parallel
reductions and ZeRO-3's gathers, the optimizer (the step's breakdown has them).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..costs import comm
from ..costs.kernels import Efficiency, attention_bwd_ratio, mem_time
from ..specs import Hardware, Run
from .exposure import exposed_tp
from .frameworks import Framework
from .layers import LayerTime, PassTime
from .default import default_plan, one_schedule_run, stack_run
from .stage_costs import kernels, not_recomputed, unit_costs

#: The kinds of line, in the order a unit lists them.
LINE_KINDS = ("product", "attention", "memory", "tp", "cp", "a2a", "recompute")


@dataclass(frozen=True)
class BudgetLine:
    """One line of a unit: ``kind`` one of :data:`LINE_KINDS`; seconds of the forward and the
    backward; for a product its shape (m, n, k, count), data type and one pass's FLOPs, for the
    attention core its forward FLOPs and its backward's, for memory-bound work its (forward, backward)
    bytes."""

    item: str
    kind: str
    fwd_s: float
    bwd_s: float
    flops: float = 0.0
    bwd_flops: float = 0.0
    shape: tuple[float, int, int, int] | None = None
    dtype: str | None = None
    nbytes: tuple[float, float] | None = None
    whole: tuple[float, float] | None = None    # a collective's (forward, backward) seconds before any overlap

    @property
    def fwd_tflops(self) -> float | None:
        """The forward's TFLOP/s, for a product or the attention core (None for the others)."""
        return self.flops / self.fwd_s / 1e12 if self.flops and self.fwd_s > 0 else None

    @property
    def bwd_tflops(self) -> float | None:
        """The backward's TFLOP/s (None for the lines without FLOPs)."""
        return self.bwd_flops / self.bwd_s / 1e12 if self.bwd_flops and self.bwd_s > 0 else None


@dataclass(frozen=True)
class UnitBudget:
    """One unit's lines and its totals as the stages charge them; ``per_device`` how many of it
    the device runs per micro-batch (summed over its pipeline chunks): the embedding and the loss
    are listed where another pipeline rank runs them, 0 here."""

    unit: str
    per_device: int
    lines: tuple[BudgetLine, ...]
    fwd_s: float
    bwd_s: float


@dataclass(frozen=True)
class LayerBudget:
    """Every unit of one micro-batch on the busiest device (its units the longest)."""

    micro_batch: int
    tokens: int            # a micro-batch's tokens on one device, b·s/cp
    units: tuple[UnitBudget, ...]

    def by_kind(self) -> dict[str, float]:
        """Seconds of one micro-batch on the device by kind of line (:data:`LINE_KINDS`), forward and
        backward, over every unit as many times as the device runs it: what the step's compute, tp,
        cp and all-to-all terms are made of."""
        out = dict.fromkeys(LINE_KINDS, 0.0)
        for u in self.units:
            for ln in u.lines:
                out[ln.kind] += u.per_device * (ln.fwd_s + ln.bwd_s)
        return out

    def as_dict(self) -> dict:
        """Seconds as they are; each product's and the attention core's TFLOP/s beside them."""
        def line(ln: BudgetLine) -> dict:
            d = {"item": ln.item, "kind": ln.kind, "fwd_s": ln.fwd_s, "bwd_s": ln.bwd_s}
            if ln.shape is not None:
                d.update(m=ln.shape[0], n=ln.shape[1], k=ln.shape[2], count=ln.shape[3], dtype=ln.dtype)
            if ln.flops:
                d.update(fwd_flops=ln.flops, fwd_tflops=ln.fwd_tflops, bwd_tflops=ln.bwd_tflops)
            if ln.nbytes is not None:
                d.update(fwd_bytes=ln.nbytes[0], bwd_bytes=ln.nbytes[1])
            if ln.whole is not None:
                d.update(fwd_whole_s=ln.whole[0], bwd_whole_s=ln.whole[1])
            return d
        return {"micro_batch": self.micro_batch, "tokens": self.tokens, "by_kind_s": self.by_kind(),
                "units": [{"unit": u.unit, "per_device": u.per_device, "fwd_s": u.fwd_s, "bwd_s": u.bwd_s,
                           "lines": [line(ln) for ln in u.lines]} for u in self.units]}


def _pass_lines(fwd: PassTime, bwd: PassTime, tp_comm: bool) -> list[BudgetLine]:
    """The embedding's or the loss's passes by part (they are not itemised further)."""
    lines = [BudgetLine("products", "product", fwd.gemm, bwd.gemm),
             BudgetLine("attention", "attention", fwd.attention, bwd.attention),
             BudgetLine("memory-bound kernels", "memory", fwd.memory, bwd.memory),
             BudgetLine("tensor-parallel collectives (exposed)", "tp", exposed_tp(fwd.tp, fwd.gemm, tp_comm),
                        exposed_tp(bwd.tp, bwd.gemm, tp_comm), whole=(fwd.tp, bwd.tp)),
             BudgetLine("context-parallel exchanges", "cp", fwd.cp, bwd.cp)]
    return [ln for ln in lines if ln.fwd_s or ln.bwd_s or ln.whole and any(ln.whole)]


def _layer_lines(lt: LayerTime, a2a: tuple[float, float], tp_comm: bool, attention: str, hw: Hardware,
                 eff: Efficiency) -> list[BudgetLine]:
    """A layer's lines (module doc): its products (the data and weight gradients twice the forward's
    FLOPs), the ``attention`` kernel's core, memory-bound groups, exposed collectives, the all-to-all
    ``a2a`` (forward, backward) the stages charge, the recomputed forward."""
    lines = [BudgetLine(p.name, "product", p.fwd, p.dgrad + p.wgrad, p.flops, 2.0 * p.flops,
                        (p.m, p.n, p.k, p.count), p.dtype) for p in lt.products]
    att = lt.attention
    if att is not None and (att.fwd or att.bwd):
        lines.append(BudgetLine("attention core", "attention", att.fwd, att.bwd, att.flops_fwd,
                                attention_bwd_ratio(attention) * att.flops_fwd))
    lines += [BudgetLine(name, "memory", mem_time(f, hw, eff), mem_time(b, hw, eff), nbytes=(f, b))
              for name, f, b in lt.memory_bytes]
    tp_f, tp_b = (exposed_tp(pt.tp, pt.gemm, tp_comm) for pt in (lt.fwd, lt.bwd))
    if lt.fwd.tp or lt.bwd.tp:
        lines.append(BudgetLine("tensor-parallel collectives (exposed)", "tp", tp_f, tp_b,
                                whole=(lt.fwd.tp, lt.bwd.tp)))
    if lt.fwd.cp or lt.bwd.cp:
        lines.append(BudgetLine("context-parallel exchanges (exposed)", "cp", lt.fwd.cp, lt.bwd.cp))
    if a2a[0] or a2a[1]:
        lines.append(BudgetLine("expert all-to-all", "a2a", *a2a))
    r = lt.recompute
    again = r.compute + exposed_tp(r.tp, r.gemm, tp_comm) + r.cp
    if again:
        lines.append(BudgetLine("recomputed forward", "recompute", 0.0, again))
    return lines


def _counts(stages, run: Run, partial: bool) -> dict[str, int]:
    """How many of each unit a device's ``stages`` run per micro-batch."""
    dense = sum(st.dense_layers for st in stages)
    moe = sum(st.moe_layers for st in stages)
    out = {"embedding": sum(st.embedding for st in stages), "logits and loss": sum(st.loss for st in stages)}
    if not partial:
        return {"dense layer": dense, "MoE layer": moe, **out}
    r_d = sum(st.recomputed(run.model, run.training)[0] for st in stages)
    r_m = sum(st.recomputed(run.model, run.training)[1] for st in stages)
    return {"dense layer, recomputed": r_d, "dense layer, kept whole": dense - r_d,
            "MoE layer, recomputed": r_m, "MoE layer, kept whole": moe - r_m, **out}


def layer_budget(run: Run, hw: Hardware, eff: Efficiency, framework: Framework) -> LayerBudget:
    """The units of one micro-batch of ``run`` (its stack's open choices filled, one schedule run's
    batch: :func:`.default.one_schedule_run`) on the busiest device of its pipeline
    (:func:`.default.default_plan`), the one whose units take the longest (module doc)."""
    run = one_schedule_run(stack_run(run, framework))
    L, tr = run.layout, run.training
    plan = default_plan(run)
    bw = comm.group_bandwidths(L, hw, run.gpus_per_node or hw.per_node, framework.multi_nic_rings)
    k = kernels(run, hw, eff, framework, bw)
    uc = unit_costs(run, hw, eff, framework, k)
    ov = framework.overlap.tp_comm
    # every unit the model has: its passes' lines and its (forward, backward) as the stages charge them
    kinds: dict[str, tuple[list[BudgetLine], float, float]] = {}

    def layer_unit(name: str, lt: LayerTime | None, costs) -> None:
        if lt is not None and costs is not None:
            kinds[name] = (_layer_lines(lt, (costs[0][3], costs[1][3]), ov, k.setup.attention, hw, eff),
                           sum(costs[0]), sum(costs[1]))

    if uc.kept is None:
        layer_unit("dense layer", k.dense, uc.layers[False])
        layer_unit("MoE layer", k.moe, uc.layers[True])
    else:
        layer_unit("dense layer, recomputed", k.dense, uc.layers[False])
        layer_unit("dense layer, kept whole", None if k.dense is None else not_recomputed(k.dense), uc.kept[False])
        layer_unit("MoE layer, recomputed", k.moe, uc.layers[True])
        layer_unit("MoE layer, kept whole", None if k.moe is None else not_recomputed(k.moe), uc.kept[True])
    for name, (f, b), (cf, cb) in (("embedding", k.emb, uc.emb), ("logits and loss", k.loss, uc.loss)):
        kinds[name] = (_pass_lines(f, b, ov), sum(cf), sum(cb))
    per_device = [_counts(plan.on_device(d), run, uc.kept is not None) for d in range(plan.p)]

    def busy(counts: dict[str, int]) -> float:
        return sum(n * (kinds[u][1] + kinds[u][2]) for u, n in counts.items() if u in kinds)
    counts = max(per_device, key=busy)
    units = tuple(UnitBudget(u, counts[u], tuple(lines), f, b) for u, (lines, f, b) in kinds.items()
                  if counts[u] or u in ("embedding", "logits and loss"))
    return LayerBudget(tr.micro_batch, tr.micro_batch * tr.seq_len // L.cp, units)
