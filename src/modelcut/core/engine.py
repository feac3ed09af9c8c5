"""The discrete-event pipeline engine. It knows no schedule.

Each device runs its op list in order. An op starts when its device is free and its
inputs have arrived:

* F of stage s needs F of stage s − 1 (same micro-batch);
* B of stage s needs B of stage s + 1 (same micro-batch) and its own F;
* W of stage s needs B of stage s (same micro-batch).

An input produced on another device arrives ``p2p`` time units after it ends. The
engine is exact for any number type that supports + and max (``fractions.Fraction``
gives exact arithmetic; floats are fast). A set of lists that cannot complete raises
:class:`DeadlockError` naming the blocked ops; it never hangs.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable, Sequence

from .errors import DeadlockError, ModelcutError
from .ops import KINDS, Op, Schedule

_KIND_ID = {"F": 0, "B": 1, "W": 2}


@dataclass(frozen=True)
class Timing:
    """Op durations in arbitrary time units.

    ``forward``/``backward``/``weight`` are for a device's *whole share* of layers
    (the deck's F = 1, B = 2): each of v chunks takes 1/v of it. With a split
    backward (zero-bubble schedules), B is the input gradient and W the weight
    gradient; when ``weight`` is None they share ``backward`` equally (B = W = 1).
    Without a split, ``weight`` (if given) is added to B.

    ``stage_scale`` optionally multiplies every op of a stage (length p·v): an
    embedding-heavy first stage, a loss-heavy last one. ``stage_durations`` instead
    gives each stage's (F, B, W) per chunk outright. ``p2p`` is added to every input
    that crosses devices.
    """

    forward: Any = 1
    backward: Any = 2
    weight: Any = None
    p2p: Any = 0
    stage_scale: Sequence[Any] | None = None
    stage_durations: Sequence[tuple[Any, Any, Any]] | None = None

    def per_stage(self, stages: int, chunks: int, split: bool) -> list[tuple[Any, Any, Any]]:
        """(F, B, W) duration of each stage's op, one chunk each."""
        if self.stage_durations is not None:
            if len(self.stage_durations) != stages:
                raise ModelcutError(
                    f"stage_durations has {len(self.stage_durations)} entries for {stages} stages")
            return [tuple(x) for x in self.stage_durations]
        for name, val in (("forward", self.forward), ("backward", self.backward),
                          ("weight", self.weight), ("p2p", self.p2p)):
            if val is not None and val < 0:
                raise ModelcutError(f"{name} time must be non-negative, got {val}")
        f, b = self.forward, self.backward
        if split:
            if self.weight is None:
                b, w = b / 2, b / 2
            else:
                w = self.weight
        else:
            w = 0
            if self.weight is not None:
                b = b + self.weight
        base = (f / chunks, b / chunks, w / chunks)
        if self.stage_scale is None:
            return [base] * stages
        if len(self.stage_scale) != stages:
            raise ModelcutError(f"stage_scale has {len(self.stage_scale)} entries for {stages} stages")
        out = []
        for s, k in enumerate(self.stage_scale):
            if k < 0:
                raise ModelcutError(f"stage_scale[{s}] must be non-negative, got {k}")
            out.append((base[0] * k, base[1] * k, base[2] * k))
        return out


@dataclass
class Trace:
    """What the engine computed: every op's start and end, per device, in list order."""

    schedule: Schedule
    starts: list[list[Any]]
    ends: list[list[Any]]
    durations: list[tuple[Any, Any, Any]]
    p2p: Any
    makespan: Any = field(init=False)

    def __post_init__(self) -> None:
        self.makespan = max((e[-1] for e in self.ends if e), default=0)

    def busy(self, device: int) -> Any:
        return sum((e - s for s, e in zip(self.starts[device], self.ends[device])), start=0 * self.makespan)

    def rows(self):
        """(device, op, start, end) for every op, device by device."""
        for d, order in enumerate(self.schedule.orders):
            for op, s, e in zip(order, self.starts[d], self.ends[d]):
                yield d, op, s, e


def check_complete(schedule: Schedule) -> None:
    """Every op of every (stage, micro-batch) appears exactly once, each stage on one device."""
    S, m = schedule.stages, schedule.microbatches
    if schedule.devices < 1:
        raise ModelcutError(f"devices must be at least 1, got {schedule.devices}")
    if m < 1:
        raise ModelcutError(f"micro-batches must be at least 1, got {m}")
    if len(schedule.orders) != schedule.devices:
        raise ModelcutError(f"schedule has {len(schedule.orders)} op lists for {schedule.devices} devices")
    split = schedule.split_backward
    seen: dict[tuple[str, int, int], int] = {}
    home: dict[int, int] = {}
    for d, order in enumerate(schedule.orders):
        for op in order:
            if op.kind not in KINDS:
                raise ModelcutError(f"device {d}: unknown op kind {op.kind!r} (want F, B or W)")
            if not 0 <= op.stage < S:
                raise ModelcutError(f"device {d}: op {op} names stage {op.stage}, outside 0..{S - 1}")
            if not 0 <= op.microbatch < m:
                raise ModelcutError(
                    f"device {d}: op {op} names micro-batch {op.microbatch}, outside 0..{m - 1}")
            key = (op.kind, op.microbatch, op.stage)
            if key in seen:
                raise ModelcutError(f"op {op} appears twice (devices {seen[key]} and {d})")
            seen[key] = d
            if home.setdefault(op.stage, d) != d:
                raise ModelcutError(f"stage {op.stage} has ops on devices {home[op.stage]} and {d}")
    kinds = ("F", "B", "W") if split else ("F", "B")
    for s in range(S):
        for mb in range(m):
            for k in kinds:
                if (k, mb, s) not in seen:
                    raise ModelcutError(f"op {s}{k}{mb} (stage {s}, micro-batch {mb}) is missing")


def simulate(schedule: Schedule, timing: Timing | None = None, *, validate: bool = True) -> Trace:
    """Run the schedule's op lists; return every op's start and end."""
    timing = timing or Timing()
    if validate:
        check_complete(schedule)
    S, m = schedule.stages, schedule.microbatches
    split = schedule.split_backward
    durs = timing.per_stage(S, schedule.chunks, split)
    p2p = timing.p2p
    where = schedule.stage_device()
    zero = 0 * durs[0][0] if durs else 0

    n_keys = 3 * S * m
    end: list[Any] = [None] * n_keys
    waiters: dict[int, list[int]] = {}

    # Precompile each device's list: (key, duration, dep keys with their latencies).
    compiled: list[list[tuple]] = []
    for d, order in enumerate(schedule.orders):
        lst = []
        for op in order:
            k, s, mb = _KIND_ID[op.kind], op.stage, op.microbatch
            key = (k * S + s) * m + mb
            deps: list[tuple[int, Any]] = []
            if k == 0:
                if s > 0:
                    deps.append(((0 * S + s - 1) * m + mb, p2p if where[s - 1] != d else zero))
            elif k == 1:
                deps.append(((0 * S + s) * m + mb, zero))
                if s < S - 1:
                    deps.append(((1 * S + s + 1) * m + mb, p2p if where[s + 1] != d else zero))
            else:
                deps.append(((1 * S + s) * m + mb, zero))
            lst.append((key, durs[s][k], tuple(deps)))
        compiled.append(lst)

    P = len(compiled)
    ptr = [0] * P
    free = [zero] * P
    starts: list[list[Any]] = [[] for _ in range(P)]
    ends: list[list[Any]] = [[] for _ in range(P)]
    work = list(range(P))
    while work:
        d = work.pop()
        lst, i, t = compiled[d], ptr[d], free[d]
        st, en = starts[d], ends[d]
        n = len(lst)
        while i < n:
            key, dur, deps = lst[i]
            ready = t
            blocked = -1
            for dk, lat in deps:
                e = end[dk]
                if e is None:
                    blocked = dk
                    break
                e = e + lat
                if e > ready:
                    ready = e
            if blocked >= 0:
                waiters.setdefault(blocked, []).append(d)
                break
            t = ready + dur
            end[key] = t
            st.append(ready)
            en.append(t)
            i += 1
            w = waiters.pop(key, None)
            if w:
                work.extend(w)
        ptr[d], free[d] = i, t

    if any(ptr[d] < len(compiled[d]) for d in range(P)):
        blocked = []
        for d in range(P):
            if ptr[d] < len(compiled[d]):
                op = schedule.orders[d][ptr[d]]
                missing = [_key_name(dk, S, m) for dk, _ in compiled[d][ptr[d]][2] if end[dk] is None]
                blocked.append(f"device {d} at {op} waits for {', '.join(missing)}")
        raise DeadlockError("deadlock: " + "; ".join(blocked), blocked)
    return Trace(schedule, starts, ends, durs, p2p)


def _key_name(key: int, S: int, m: int) -> str:
    k, rest = divmod(key, S * m)
    s, mb = divmod(rest, m)
    return f"{s}{KINDS[k]}{mb}"
