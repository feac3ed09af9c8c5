"""Pipeline simulation as every face runs it (``modelcut simulate``, ``POST /api/simulate``): a
schedule by name (modelcut's, or ``torch:<Class>`` as torch executes it) or from an action CSV,
its op count checked against a limit before it is built, exact arithmetic for small ones."""

from __future__ import annotations

from ..core.errors import ModelcutError
from ..core.sim import registry
from ..core.sim.actions import from_csv
from ..core.sim.engine import Timing
from ..core.sim.ops import Schedule
from ..core.sim import run as sim_run
from ..core.sim.run import PipelineResult, exact_timing, run

#: Ops up to which a simulation runs in exact Fractions; beyond, floats (about 4x faster).
EXACT_UP_TO = 100_000


def op_count(name: str, p: int, m: int, v: int | None) -> int:
    """The ops a named schedule builds: F and B (and W with a split backward) per stage and
    micro-batch, over the micro-batches its generator builds (:attr:`.registry.ScheduleSpec.built_for`)."""
    spec = registry.get(name)
    v = spec.default_chunks if v is None else v
    return p * v * spec.built_for(p, m) * (3 if spec.split_backward else 2)


def named_schedule(name: str, p: int, m: int, v: int | None = None, max_ops: int | None = None) -> Schedule:
    """A modelcut schedule, or with ``torch:ClassName`` the order torch executes (needs
    modelcut[torch]); refused in one line when it would hold more than ``max_ops`` ops."""
    if name.startswith("torch:"):
        from ..analysis.torchcheck.orders import torch_schedule   # imports torch: only when asked for
        sched = torch_schedule(name.removeprefix("torch:"), p, m, v)
    else:
        spec = registry.get(name)
        if max_ops is not None:
            ops = op_count(name, p, m, v)
            if ops > max_ops:
                raise refusal(name, p, m, spec.default_chunks if v is None else v, ops, max_ops)
        sched = spec.make(p, m, v)
    if max_ops is not None and sched.num_ops > max_ops:
        raise refusal(sched.name, p, m, sched.chunks, sched.num_ops, max_ops)
    return sched


def refusal(name: str, p: int, m: int, v: int, ops: int, max_ops: int) -> ModelcutError:
    return ModelcutError(f"{name} with p = {p}, m = {m}, v = {v} needs {ops:,} ops; the limit is {max_ops:,} ops "
                         "per simulation")


def csv_schedule(text: str, name: str) -> Schedule:
    """A custom schedule from its action CSV, named by its file so that no built-in closed form is
    claimed for it."""
    return from_csv(text, name=name)


def simulate(sched: Schedule, timing: Timing, exact_up_to: int = EXACT_UP_TO) -> PipelineResult:
    """Run the engine; exact arithmetic up to ``exact_up_to`` ops."""
    if sched.num_ops <= exact_up_to:
        timing = exact_timing(timing)
    return run(sched, timing)


def bubble_table() -> list[tuple]:
    """The deck's bubble table: each row simulated in exact arithmetic beside its closed form."""
    return sim_run.bubble_table()
