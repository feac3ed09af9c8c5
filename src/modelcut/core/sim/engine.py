"""The discrete-event pipeline engine. It knows no schedule.

Each device runs its op list in order. An op starts when its device is free and its
inputs have arrived:

* F of stage s needs F of stage s − 1 (same micro-batch);
* B of stage s needs B of stage s + 1 (same micro-batch) and its own F;
* W of stage s needs B of stage s (same micro-batch).

(With ``Schedule.spans`` a micro-batch's first stage needs no F before it and its last
stage no B after it.) Consecutive ops a schedule marks as one overlapped unit
(``Schedule.units``: DualPipe's F&B) start together, when the device is free and each has
its inputs, and end together ``Timing.overlap`` later.

An input produced on another device arrives ``p2p`` time units after it ends. The
engine is exact for any number type that supports + and max (``fractions.Fraction``
gives exact arithmetic; floats are fast). A set of lists that cannot complete raises
:class:`DeadlockError` naming the blocked ops; it never hangs.
"""

from __future__ import annotations

from array import array
from bisect import bisect_right
from dataclasses import dataclass, field
from typing import Any, Sequence

import numpy as np

from ..errors import DeadlockError, ModelcutError
from .checks import Flat, check, check_units, spans
from .ops import KINDS, Schedule


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

    ``overlap`` is the duration of an overlapped unit of ops (``Schedule.units``; DualPipe's
    F&B, DeepSeek-V3 report §3.2.1: a forward chunk with a full backward chunk, B and W when
    the backward is split). None (the default): the sum of its ops' durations, so the
    overlap saves no compute time; what it hides is communication, which a caller that
    counts communication in the op durations takes out of the unit itself. A number: the
    unit's duration for a device's whole share, like ``forward`` (each chunk's unit takes
    1/v of it), with uniform stages only. A function of the unit's op durations, in list
    order, for any stages.
    """

    forward: Any = 1
    backward: Any = 2
    weight: Any = None
    p2p: Any = 0
    stage_scale: Sequence[Any] | None = None
    stage_durations: Sequence[tuple[Any, Any, Any]] | None = None
    overlap: Any = None

    def unit_duration(self, durations: Sequence[Any], chunks: int) -> Any:
        """Duration of an overlapped unit whose ops take ``durations`` alone."""
        if self.overlap is None:
            return sum(durations[1:], start=durations[0])
        if callable(self.overlap):
            return self.overlap(*durations)
        if self.stage_durations is not None or self.stage_scale is not None:
            raise ModelcutError("with stage_durations or stage_scale, give overlap as a function of the "
                                "two ops' durations")
        return self.overlap / chunks

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
        """Time the device computes: every op's span, an overlapped unit's once."""
        st, en = self.starts[device], self.ends[device]
        total = sum((e - s for s, e in zip(st, en)), start=0 * self.makespan)
        units = self.schedule.units[device] if self.schedule.units else ()
        return total - sum(((n - 1) * (en[i] - st[i]) for i, n in units), start=0 * self.makespan)

    def rows(self):
        """(device, op, start, end) for every op, device by device."""
        for d, order in enumerate(self.schedule.orders):
            for op, s, e in zip(order, self.starts[d], self.ends[d]):
                yield d, op, s, e


_INF = float("inf")  # the end time of an op that has not run yet


def _inputs(schedule: Schedule, fl: Flat) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Each op's two inputs (keys ``dep1``, ``dep2``) and the indices of the ops that produce
    them (``j1``, ``j2``): F needs F of stage s − 1, B its own F and B of stage s + 1, W its own
    B. A missing input points at op N, which ended at time zero; one that no list holds at op
    N + 1, which never ends."""
    S, m = schedule.stages, schedule.microbatches
    kinds, stages, mbs, N = fl.kinds, fl.stages, fl.mbs, fl.n
    n_keys = 3 * S * m
    keys = (kinds * S + stages) * m + mbs
    is_f, is_b = kinds == 0, kinds == 1
    first, last = spans(schedule)
    dep1 = np.where(is_f, np.where(stages != first[mbs], keys - m, n_keys), keys - S * m)
    dep2 = np.where(is_b & (stages != last[mbs]), keys + m, n_keys)
    small = n_keys + 1 < 2**31 and N + 2 < 2**31   # halve the index arrays of a large schedule
    idx = np.int32 if small else np.int64
    if small:
        dep1, dep2 = dep1.astype(np.int32), dep2.astype(np.int32)
    where = np.full(n_keys + 1, N + 1, dtype=idx)
    where[keys] = np.arange(N, dtype=idx)
    del keys, is_f, is_b
    where[n_keys] = N
    return dep1, where[dep1], dep2, where[dep2]


def _prepare(schedule: Schedule, fl: Flat, timing: Timing, durs, p2p, zero, validate: bool):
    """What the event loop reads, as plain lists: each op's one awaited input (``dep``), its
    duration, its input's latency and, at an overlapped unit's first op, the unit's length.
    The arrays that compute them are freed on return (a schedule of millions of ops needs them
    only here)."""
    S, N = schedule.stages, fl.n
    dev, kinds, stages, offsets = fl.dev, fl.kinds, fl.stages, fl.offsets
    _, j1, _, j2 = _inputs(schedule, fl)
    is_f, is_b = kinds == 0, kinds == 1
    first, last = spans(schedule)
    # Each op waits on one input only. B's own F and W's own B run on the same device
    # (same stage); earlier in its list they have ended before the op can start, and later
    # they never will (a deadlock). So B waits on B of stage s + 1 when its F comes first,
    # W on nothing when its B does; otherwise each waits on the own op that comes later.
    own_done = ~is_f & (j1 < np.arange(N, dtype=j1.dtype)) & (np.append(dev, [-1, -1])[j1] == dev)
    dep = np.where(own_done, j2, j1)
    table = np.empty(3 * S, dtype=object)
    table[:] = [durs[s][k] for k in range(3) for s in range(S)]
    dur = table[kinds * S + stages].tolist()
    lat: list[Any] = []
    if p2p:
        mbs = fl.mbs
        at_first, at_last = stages == first[mbs], stages == last[mbs]
        home = np.full(S, -1, dtype=np.int64)
        home[stages] = dev
        from_prev = is_f & ~at_first & (home[np.maximum(stages - 1, 0)] != dev)
        from_next = is_b & own_done & ~at_last & (home[np.minimum(stages + 1, S - 1)] != dev)
        cross = from_prev | from_next
        lat_of = np.empty(2, dtype=object)
        lat_of[:] = [zero, p2p]
        lat = lat_of[cross.astype(np.int64)].tolist()
    dep_l = array("i", dep.astype(np.int32).tobytes()) if N + 2 < 2**31 else array("q", dep.astype(np.int64).tobytes())
    del dep, own_done, is_f, is_b
    ulen: list[int] = []   # at a unit's first op, its op count; 0 elsewhere
    if schedule.units:
        if not validate:
            check_units(schedule)
        ulen = [0] * N
        j1_l = j1.tolist()
        for d, units in enumerate(schedule.units):
            for i, n in units:
                k = offsets[d] + int(i)
                inside = range(k, k + int(n))
                for x in inside:
                    # an op may not wait on another op of its unit; a B's own F may not be in it either
                    if dep_l[x] in inside or (kinds[x] == 1 and j1_l[x] in inside and j1_l[x] != x):
                        raise ModelcutError(f"device {d}: overlapped unit from op {fl.op(k)} holds {fl.op(x)} "
                                            "and an op it depends on")
                ulen[k] = int(n)
                u = timing.unit_duration([dur[x] for x in inside], schedule.chunks)
                if not 0 <= u < _INF:
                    raise ModelcutError(f"overlapped unit from op {fl.op(k)}: duration must be finite and "
                                        f"non-negative, got {u}")
                for x in inside:
                    dur[x] = u
        if not p2p:
            lat = [zero] * N
    return dep_l, dur, lat, ulen


def simulate(schedule: Schedule, timing: Timing | None = None, *, validate: bool = True) -> Trace:
    """Run the schedule's op lists; return every op's start and end.

    Each op starts at max(its device's previous end, each input's end + its latency)
    and ends its duration later. Devices are advanced in turn, each as far as its
    inputs allow; a device that waits is parked on the op it waits for and woken when
    that op ends, so the work is linear in the number of ops.
    """
    timing = timing or Timing()
    fl = Flat(schedule)
    if validate:
        check(schedule, fl)
    S, m = schedule.stages, schedule.microbatches
    split = fl.split()
    durs = timing.per_stage(S, schedule.chunks, split)
    p2p = timing.p2p
    for s, row in enumerate(durs):
        for k, x in zip(KINDS, row):
            if not 0 <= x < _INF:  # also refuses NaN
                raise ModelcutError(f"stage {s}: {k} time must be finite and non-negative, got {x}")
    if not 0 <= p2p < _INF:
        raise ModelcutError(f"p2p time must be finite and non-negative, got {p2p}")
    zero = 0 * durs[0][0] if durs else 0
    offsets = fl.offsets
    N, P = fl.n, len(schedule.orders)
    dep_l, dur, lat, ulen = _prepare(schedule, fl, timing, durs, p2p, zero, validate)
    del fl   # the loop reads plain lists; a deadlock's message reads the arrays again

    # A device that waits is parked on the op it waits for, with that op's device; each
    # device knows the lowest op index anyone is parked on (``wake``) and wakes them
    # when it gets there. ``en`` holds infinity for ops that have not run.
    INF, NONE = _INF, N + 2
    en: list[Any] = [INF] * (N + 2)
    en[N] = zero
    st: list[Any] = [None] * N
    ptr, stop = offsets[:-1], offsets[1:]
    free = [zero] * P
    parked: list[list[tuple[int, int]]] = [[] for _ in range(P)]
    wake = [NONE] * P
    work = list(range(P - 1, -1, -1))
    pop, push = work.pop, work.append

    def wake_parked(d: int, i: int) -> int:
        """Op i of device d has ended: requeue the devices parked on it; return the next
        op index anyone is parked on."""
        here = parked[d]
        if len(here) == 1:
            push(here[0][1])
            here.clear()
            return NONE
        parked[d] = [(j, other) for j, other in here if j != i]
        for j, other in here:
            if j == i:
                push(other)
        return min((j for j, _ in parked[d]), default=NONE)

    while work:
        d = pop()
        i, n, t, wk = ptr[d], stop[d], free[d], wake[d]
        if ulen:
            while i < n:
                a = en[dep_l[i]] + lat[i]
                c = ulen[i]
                for x in range(i + 1, i + c):
                    a2 = en[dep_l[x]] + lat[x]
                    if a2 > a:
                        a = a2
                if a > t:
                    if a == INF:
                        break
                    t = a
                if c:  # an overlapped unit: same start, same end (dur holds the unit's)
                    e = t + dur[i]
                    for x in range(i, i + c):
                        st[x] = t
                        en[x] = e
                        if x == wk:
                            wk = wake_parked(d, x)
                    t = e
                    i += c
                    continue
                st[i] = t
                t = t + dur[i]
                en[i] = t
                if i == wk:
                    wk = wake_parked(d, i)
                i += 1
        elif p2p:
            while i < n:
                a = en[dep_l[i]] + lat[i]
                if a > t:
                    if a == INF:
                        break
                    t = a
                st[i] = t
                t = t + dur[i]
                en[i] = t
                if i == wk:
                    wk = wake_parked(d, i)
                i += 1
        else:
            while i < n:
                a = en[dep_l[i]]
                if a > t:
                    if a == INF:
                        break
                    t = a
                st[i] = t
                t = t + dur[i]
                en[i] = t
                if i == wk:
                    wk = wake_parked(d, i)
                i += 1
        ptr[d], free[d], wake[d] = i, t, wk
        if i < n:  # park on the first input that has not arrived
            j = dep_l[i]
            if ulen and ulen[i]:
                j = next(dep_l[x] for x in range(i, i + ulen[i]) if en[dep_l[x]] == INF)
            o = bisect_right(offsets, j) - 1 if j < N else -1   # the device whose list holds op j
            if o >= 0:
                parked[o].append((j, d))
                if j < wake[o]:
                    wake[o] = j

    if any(ptr[d] < stop[d] for d in range(P)):
        fl = Flat(schedule)
        dep1, j1, dep2, j2 = _inputs(schedule, fl)
        S, m = schedule.stages, schedule.microbatches
        blocked = []
        for d in range(P):
            i = ptr[d]
            if i < stop[d]:
                unit = range(i, i + ulen[i]) if ulen and ulen[i] else (i,)
                missing = [_key_name(int(k), S, m) for x in unit for k, j in ((dep1[x], j1[x]), (dep2[x], j2[x]))
                           if en[j] == INF and j not in unit]
                blocked.append(f"device {d} at {fl.op(i)} waits for {', '.join(missing)}")
        raise DeadlockError("deadlock: " + "; ".join(blocked), blocked)
    # Each device's share, cut from the end so that the whole lists shrink as their parts are made.
    del en[N:], dep_l, dur, lat
    starts, ends = [], []
    for d in reversed(range(P)):
        a = offsets[d]
        starts.append(st[a:])
        ends.append(en[a:])
        del st[a:], en[a:]
    starts.reverse()
    ends.reverse()
    return Trace(schedule, starts, ends, durs, p2p)


def _key_name(key: int, S: int, m: int) -> str:
    k, rest = divmod(key, S * m)
    s, mb = divmod(rest, m)
    return f"{s}{KINDS[k]}{mb}"
