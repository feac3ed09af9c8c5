"""Pipeline simulation as every face runs it (``modelcut simulate``, ``POST /api/simulate``): a
schedule by name (modelcut's, or ``torch:<Class>`` as torch executes it) or from an action CSV,
its op count checked against :attr:`.limits.Limits.max_ops` before it is built, exact arithmetic
for small ones.

:func:`simulate_input` is the use case: a :class:`.requests.SimulateInput` (or the command line's
:class:`.requests.SimulateArgs`) in, the simulated pipeline and its notes out.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from ..core.errors import ModelcutError
from ..core.sim import registry
from ..core.sim.actions import from_csv
from ..core.sim.engine import Timing
from ..core.sim.ops import Schedule
from ..core.sim import run as sim_run
from ..core.sim.run import PipelineResult, exact_timing, run
from .limits import DEFAULT, Limits
from .requests import SimulateInput

#: Ops up to which a simulation runs in exact Fractions; beyond, floats (about 4x faster).
EXACT_UP_TO = 100_000
TORCH_PREFIX = "torch:"


def op_count(name: str, p: int, m: int, v: int | None) -> int:
    """The ops a named schedule builds: F and B (and W with a split backward) per stage and
    micro-batch, over the micro-batches its generator builds (:attr:`.registry.ScheduleSpec.built_for`),
    each micro-batch through one of the model's copies (DualPipe's two directions)."""
    spec = registry.get(name)
    v = spec.default_chunks if v is None else v
    return p * v * spec.built_for(p, m) * (3 if spec.split_backward else 2) // spec.copies


def op_estimate(inp: SimulateInput) -> int:
    """The ops a request's schedule will hold (an upper bound for ``torch:`` schedules)."""
    if inp.schedule.startswith(TORCH_PREFIX):
        return inp.devices * (inp.chunks or 2) * inp.microbatches * 3
    return op_count(inp.schedule, inp.devices, inp.microbatches, inp.chunks)


def named_schedule(name: str, p: int, m: int, v: int | None = None, max_ops: int | None = None,
                   limits: Limits | None = None) -> Schedule:
    """A modelcut schedule, or with ``torch:ClassName`` the order torch executes (needs
    modelcut[torch]); refused in one line when it would hold more than ``max_ops`` ops (default:
    the limits' :attr:`~.limits.Limits.max_ops`)."""
    lim = limits or DEFAULT
    if max_ops is not None:
        lim = lim.raised(max_ops=max_ops)
    if name.startswith(TORCH_PREFIX):
        from ..analysis.torchcheck.orders import torch_schedule   # imports torch: only when asked for
        chunks = 2 if v is None else v
        lim.check_ops(p * chunks * m * 3, f"{name} with p = {p}, m = {m}, v = {chunks}")
        sched = torch_schedule(name.removeprefix(TORCH_PREFIX), p, m, v)
    else:
        spec = registry.get(name)
        vv = spec.default_chunks if v is None else v
        lim.check_ops(op_count(name, p, m, v), f"{name} with p = {p}, m = {m}, v = {vv}")
        spec.validate(p, m, vv)
        sched = spec.make(p, m, v)
    lim.check_ops(sched.num_ops, f"{sched.name} with p = {p}, m = {m}, v = {sched.chunks}")
    return sched


def refusal(name: str, p: int, m: int, v: int, ops: int, max_ops: int) -> ModelcutError:
    return Limits(max_ops=max_ops).refuse("max_ops", f"{name} with p = {p}, m = {m}, v = {v} needs {ops:,} ops")


def csv_schedule(text: str, name: str, limits: Limits | None = None) -> Schedule:
    """A custom schedule from its action CSV, named by its file so that no built-in closed form is
    claimed for it; refused in one line when a complete schedule of the sizes it names would hold
    more ops than the limit."""
    lim = limits or DEFAULT
    # Every action is at least three characters and a comma: a bound on the ops before reading any.
    lim.check_ops(len(text) // 4, f"the schedule CSV ({len(text):,} characters)")
    sched = from_csv(text, name=name)
    S, m = sched.stages, sched.microbatches
    lim.check_ops(sched.num_ops, f"the schedule CSV {name}")
    # A complete schedule holds F and B of every (stage, micro-batch): the sizes it names bound it.
    lim.check_ops(2 * S * m, f"the schedule CSV {name} names {S:,} stages and micro-batches up to {m - 1:,}: "
                             "a complete schedule of that size")
    return sched


def csv_file(path: str | Path, limits: Limits | None = None) -> Schedule:
    """:func:`csv_schedule` of a file, its size checked before it is read."""
    p = Path(path)
    lim = limits or DEFAULT
    try:
        size = p.stat().st_size
    except FileNotFoundError:
        raise ModelcutError(f"{p}: no such file") from None
    except OSError as exc:
        raise ModelcutError(f"{p}: {exc.strerror}") from None
    if p.is_dir():
        raise ModelcutError(f"{p}: is a directory, not a schedule CSV")
    lim.check_ops(size // 4, f"the schedule CSV {p.name} ({size:,} bytes)")
    try:
        text = p.read_text(encoding="utf-8")
    except UnicodeDecodeError:
        raise ModelcutError(f"{p}: not a UTF-8 text file") from None
    return csv_schedule(text, p.name, lim)


def timing_notes(sched: Schedule, timing: Timing) -> list[str]:
    """What the timing means for this schedule, where a user might read it otherwise."""
    notes = []
    if timing.weight is not None and not sched.split_backward:
        notes.append(f"{sched.name} does not split the backward: the weight time W = {float(timing.weight):g} is "
                     f"added to B (B = {float(timing.backward):g} + {float(timing.weight):g} = "
                     f"{float(timing.backward + timing.weight):g})")
    return notes


def simulate(sched: Schedule, timing: Timing, exact_up_to: int = EXACT_UP_TO) -> PipelineResult:
    """Run the engine; exact arithmetic up to ``exact_up_to`` ops."""
    if sched.num_ops <= exact_up_to:
        timing = exact_timing(timing)
    return run(sched, timing)


@dataclass
class Simulation:
    """A simulated pipeline and what its timing means (:func:`timing_notes`)."""

    result: PipelineResult
    notes: list[str] = field(default_factory=list)


def simulate_input(inp: SimulateInput, limits: Limits | None = None, exact_up_to: int = EXACT_UP_TO,
                   schedule: Schedule | None = None) -> Simulation:
    """The use case: a validated request (its ``schedule`` built here, or the one given, e.g. from
    a CSV), simulated; work over the limits refused before it starts."""
    if inp.forward + inp.backward + (inp.weight or 0) == 0:
        # Every op would take no time: the bubble, idle over busy time, is 0/0 and the memory
        # timeline has no instant at which an activation is held.
        raise ModelcutError("forward, backward and weight times are all 0: a pipeline with no work has no "
                            "bubble and no timeline; give one of them a time above 0")
    sched = schedule or named_schedule(inp.schedule, inp.devices, inp.microbatches, inp.chunks, limits=limits)
    timing = Timing(inp.forward, inp.backward, inp.weight, inp.p2p)
    return Simulation(simulate(sched, timing, exact_up_to), timing_notes(sched, timing))


def bubble_table() -> list[tuple]:
    """The deck's bubble table: each row simulated in exact arithmetic beside its closed form."""
    return sim_run.bubble_table()
