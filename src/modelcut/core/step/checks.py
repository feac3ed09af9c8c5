"""The checks every step-time model shares: a run no framework would start is refused in one
line naming the problem."""

from __future__ import annotations

from .. import plan as plans
from ..costs.context import heads_split_problem
from ..costs.moe import check_moe_layout
from ..errors import ModelcutError
from ..sim import registry
from ..specs import Run


def check_run(run: Run) -> None:
    """Refuse a run no framework would start: tensor parallelism that does not divide the heads,
    the KV heads or the MLP, more stages than layers, a sequence context parallelism cannot cut,
    a batch that is no whole number of micro-batches (or of local batches), an expert layout that does not divide, an
    unknown schedule, or chunks the schedule refuses (the plan's own checks, :func:`.plan.resolve`)."""
    m, L, T = run.model, run.layout, run.training
    if m.heads % L.tp:
        raise ModelcutError(f"tp ({L.tp}) must divide the attention heads ({m.heads})")
    if m.kv_heads % L.tp and L.tp % m.kv_heads:
        raise ModelcutError(f"tp ({L.tp}) and kv_heads ({m.kv_heads}) must divide one another")
    if L.cp > 1 and L.cp_kind == "a2a" and (why := heads_split_problem(m, L.tp, L.cp)) is not None:
        raise ModelcutError(why)
    if L.cp_kind == "a2a+p2p" and (why := heads_split_problem(m, L.tp, L.cp_a2a, "a2a+p2p")) is not None:
        raise ModelcutError(why)
    if m.ffn_hidden % L.tp:
        raise ModelcutError(f"tp ({L.tp}) must divide ffn_hidden ({m.ffn_hidden})")
    if L.pp > m.layers:
        raise ModelcutError(f"pp ({L.pp}) exceeds the layers ({m.layers})")
    if T.recompute_layers is not None and T.recompute_layers > m.layers:
        raise ModelcutError(f"recompute_layers ({T.recompute_layers}) exceeds the model's layers ({m.layers}); "
                            "leave it out to recompute every layer")
    if T.recompute_every is not None and T.recompute_every > m.layers:
        raise ModelcutError(f"recompute_every ({T.recompute_every}) exceeds the model's layers ({m.layers}): no "
                            "layer would be recomputed; use recompute = \"none\"")
    check_moe_layout(m, L)
    if L.pp == 1:   # no pipeline: a model runs every layer on each device, whatever chunks it names
        plans.resolve(m, L, T, v=1, schedule=None)
        if L.schedule is not None:
            registry.get(L.schedule)
        return
    v = L.vpp or (registry.get(L.schedule).default_chunks if L.schedule is not None else 1)
    plans.resolve(m, L, plans.flush_training(L, T), v=v, schedule=L.schedule)   # one schedule run's size rules
