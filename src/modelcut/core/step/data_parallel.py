"""What data parallelism adds to each pipeline device's step in the default model, read off the
simulated trace: the gradient reduction (behind the backward where the framework overlaps it,
after the flush where not), the tied embedding's all-reduce between the end stages, the
optimizer step, and sharded weights' all-gather."""

from __future__ import annotations

from dataclasses import dataclass

from ..costs import comm, params
from ..costs.kernels import Efficiency, mem_time
from ..plan import PipelinePlan
from ..sim.engine import Trace
from ..specs import Hardware, Run
from ..units import BF16_BYTES, optimizer_step_bytes
from ..costs import fp8 as fp8_mod
from .stage_costs import run_fp8
from .exposure import exposed_after
from .frameworks import Framework


@dataclass
class DeviceEnd:
    """One pipeline device's end of step and what its data parallelism exposed."""

    end: float
    exposed: float     # gradient reduction, tied-embedding all-reduce, weight gathers
    optimizer: float


def last_backwards(plan: PipelinePlan, trace: Trace) -> dict[int, tuple[float, float]]:
    """Each stage's last backward (B, or W when split): its start and end. A device's list runs
    in time order."""
    out: dict[int, tuple[float, float]] = {}
    sched = plan.schedule
    for dev, order in enumerate(sched.orders):
        starts, stops = trace.starts[dev], trace.ends[dev]
        for i in range(len(order) - 1, -1, -1):
            op = order[i]
            if op.kind != "F" and op.stage not in out:
                out[op.stage] = (float(starts[i]), float(stops[i]))
                if len(out) == len(plan.stages):
                    return out
    return out


def device_ends(run: Run, hw: Hardware, eff: Efficiency, framework: Framework, plan: PipelinePlan,
                trace: Trace, bw: dict[str, float]) -> list[DeviceEnd]:
    """Per pipeline device (module doc). A stage's gradients become ready through its last
    backward, last layer first; they are reduce-scattered (sharded optimizer states) or
    all-reduced over dp·cp on one stream; the optimizer step is memory-bound over the device's
    parameters; with sharded states the weights are all-gathered, ahead of use where the
    framework prefetches."""
    model, L = run.model, run.layout
    ov = framework.overlap
    t, p = L.tp, L.pp
    dp_group = L.dp * L.cp
    sharded = L.zero >= 1 or framework.dist_optimizer
    grad_b = framework.grad_bytes
    gpn = run.gpus_per_node or hw.per_node
    alpha = comm.dp_ring_alpha(L, gpn)
    inside = not comm.group_spans_nodes(L, ("cp", "dp"), gpn)

    def coll(kind: str, nbytes: float) -> float:
        return comm.collective(kind, dp_group, nbytes, bw["dp"], hw, alpha, inside, eff.net)

    def reduce_time(params: float) -> float:
        return coll("reduce-scatter" if sharded else "all-reduce", params * grad_b)

    tied_extra = 0.0
    if model.tied_embeddings and p > 1:   # the end stages' two copies of the word embeddings agree
        tied_extra = comm.ring_allreduce(2, model.vocab * model.hidden / t * grad_b, bw["pp"] * eff.net)
    ends = [float(e[-1]) if e else 0.0 for e in trace.ends]
    last_b = last_backwards(plan, trace)
    # weights gathered in FP8 where the stack keeps FP8 parameters (:func:`..costs.fp8.param_gather_bytes`)
    layer_gather_b = fp8_mod.param_gather_bytes(run_fp8(run, hw, framework))
    dense_l = sum(params.layer_params(model, t, False))
    moe_l = sum(params.layer_params(model, t, True, L.ep, L.etp)) if model.is_moe else 0.0
    out = []
    for dev in range(p):
        requests, params_dev, layers_dev = [], 0.0, 0
        mine = plan.on_device(dev)
        mods = params.device_modules(model, t, L.ep, L.etp,
                                     [(st.dense_layers, st.moe_layers, st.embedding, st.loss) for st in mine])
        layer_params_dev = 0.0
        for st, units in zip(mine, mods):
            b_start, b_end = last_b[st.index]
            params_dev += sum(a + b for a, b in units)
            layers_dev += st.layers
            layer_params_dev += st.dense_layers * dense_l + st.moe_layers * moe_l
            for j, (a, b) in enumerate(units):   # finished in this order through the last backward
                requests.append((b_start + (b_end - b_start) * (j + 1) / len(units), reduce_time(a + b)))
        exp_dp = exposed_after(ends[dev], requests, ov.grad_reduce) if dp_group > 1 else 0.0
        tied = tied_extra if (dev in (0, p - 1) and p > 1) else 0.0
        opt = mem_time(optimizer_step_bytes(params_dev, dp_group if sharded else 1), hw, eff)
        gather = 0.0
        if sharded and dp_group > 1:
            g = coll("all-gather", params_dev * BF16_BYTES - layer_params_dev * (BF16_BYTES - layer_gather_b))
            # gathered ahead of use: only the first layer's share waits, the rest hides behind the forward
            gather = g / max(1, layers_dev) if ov.param_gather else g
        out.append(DeviceEnd(ends[dev] + exp_dp + tied + opt + gather, exp_dp + tied + gather, opt))
    return out
