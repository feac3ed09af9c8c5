"""The engine's view of a schedule's op lists as flat arrays, and the checks that they are
complete: every op of every (stage, micro-batch) exactly once, each stage on one device,
overlapped units inside their lists. One-line :class:`ModelcutError` for each problem."""

from __future__ import annotations

from operator import attrgetter

import numpy as np

from ..errors import ModelcutError
from .ops import KINDS, Op, Schedule

_KIND_ID = {"F": 0, "B": 1, "W": 2}


class Flat:
    """Every op in device order as numpy arrays (device, kind id, stage, micro-batch),
    with each device's offset into them."""

    def __init__(self, schedule: Schedule):
        orders = schedule.orders
        self.orders = orders
        lens = [len(o) for o in orders]
        flat = [op for o in orders for op in o]
        self.n = n = len(flat)
        kinds = "".join(map(attrgetter("kind"), flat))
        if len(kinds) == n and kinds.isascii():
            codes = np.frombuffer(kinds.encode("ascii"), dtype=np.uint8)
            self.kinds = np.full(n, 3, dtype=np.int64)  # 3: not a kind
            for k, name in enumerate(KINDS):
                self.kinds[codes == ord(name)] = k
        else:
            self.kinds = np.fromiter((_KIND_ID.get(op.kind, 3) for op in flat), dtype=np.int64, count=n)
        del flat
        self.stages = np.fromiter((op.stage for o in orders for op in o), dtype=np.int64, count=n)
        self.mbs = np.fromiter((op.microbatch for o in orders for op in o), dtype=np.int64, count=n)
        self.dev = np.repeat(np.arange(len(orders), dtype=np.int64), lens)
        # Half the memory where every key the engine and the checks compute, (kind·S + stage)·m +
        # micro-batch, fits in 32 bits (any schedule of sensible sizes; the keys' arithmetic keeps
        # the arrays' type).
        S, m = schedule.stages, schedule.microbatches
        small = (n and 3 * S * m + 2 * n + 2 < 2**31 and 0 <= int(self.stages.min()) and int(self.stages.max()) < S
                 and 0 <= int(self.mbs.min()) and int(self.mbs.max()) < m)
        if small:
            for name in ("kinds", "stages", "mbs", "dev"):
                setattr(self, name, getattr(self, name).astype(np.int32))
        offsets = np.zeros(len(orders) + 1, dtype=np.int64)
        np.cumsum(lens, out=offsets[1:])
        self.offsets = offsets.tolist()

    def op(self, i: int) -> Op:
        d = int(self.dev[i])
        return self.orders[d][i - self.offsets[d]]

    def split(self) -> bool:
        return bool((self.kinds == 2).any())

    def homes(self, S: int):
        """(first, last) device naming each stage, P and −1 where none does. Devices are
        in ascending order, so the first is the lowest."""
        P = len(self.orders)
        lo = np.full(S, P, dtype=np.int64)
        hi = np.full(S, -1, dtype=np.int64)
        ok = (self.stages >= 0) & (self.stages < S)
        np.minimum.at(lo, self.stages[ok], self.dev[ok])
        np.maximum.at(hi, self.stages[ok], self.dev[ok])
        return lo, hi


def check_complete(schedule: Schedule) -> None:
    """Every op of every (stage, micro-batch) appears exactly once, each stage on one device."""
    check(schedule, Flat(schedule))


def check(schedule: Schedule, fl: Flat) -> None:
    S, m = schedule.stages, schedule.microbatches
    if schedule.devices < 1:
        raise ModelcutError(f"devices must be at least 1, got {schedule.devices}")
    if m < 1:
        raise ModelcutError(f"micro-batches must be at least 1, got {m}")
    if len(schedule.orders) != schedule.devices:
        raise ModelcutError(f"schedule has {len(schedule.orders)} op lists for {schedule.devices} devices")
    dev, kinds, stages, mbs = fl.dev, fl.kinds, fl.stages, fl.mbs

    def first(mask) -> int:
        return int(np.flatnonzero(mask)[0])

    bad = kinds == 3
    if bad.any():
        i = first(bad)
        raise ModelcutError(f"device {dev[i]}: unknown op kind {fl.op(i).kind!r} (want F, B or W)")
    bad = (stages < 0) | (stages >= S)
    if bad.any():
        i = first(bad)
        raise ModelcutError(f"device {dev[i]}: op {fl.op(i)} names stage {stages[i]}, outside 0..{S - 1}")
    bad = (mbs < 0) | (mbs >= m)
    if bad.any():
        i = first(bad)
        raise ModelcutError(
            f"device {dev[i]}: op {fl.op(i)} names micro-batch {mbs[i]}, outside 0..{m - 1}")
    span_lo, span_hi = spans(schedule)
    if schedule.spans is not None:
        bad = (stages < span_lo[mbs]) | (stages > span_hi[mbs])
        if bad.any():
            i = first(bad)
            lo_, hi_ = schedule.span(int(mbs[i]))
            raise ModelcutError(f"device {dev[i]}: op {fl.op(i)} is outside micro-batch {mbs[i]}'s stages {lo_}..{hi_}")
    check_units(schedule)
    keys = (kinds * S + stages) * m + mbs
    counts = np.bincount(keys, minlength=3 * S * m)
    if (counts > 1).any():
        i, j = np.flatnonzero(keys == int(np.argmax(counts > 1)))[:2]
        raise ModelcutError(f"op {fl.op(i)} appears twice (devices {dev[i]} and {dev[j]})")
    lo, hi = fl.homes(S)
    if (hi > lo).any():
        s = int(np.argmax(hi > lo))
        i = first((stages == s) & (dev != lo[s]))
        raise ModelcutError(f"stage {s} has ops on devices {lo[s]} and {dev[i]}")
    kinds_needed = 3 if fl.split() else 2
    present = counts.reshape(3, S, m)[:kinds_needed].transpose(1, 2, 0)  # (stage, micro-batch, kind)
    if schedule.spans is not None:  # stages outside a micro-batch's span need no ops
        s_idx = np.arange(S)[:, None]
        outside = (s_idx < span_lo[None, :]) | (s_idx > span_hi[None, :])
        present = present | outside[:, :, None]
    if not present.all():
        s, mb, k = (int(x) for x in np.argwhere(present == 0)[0])
        raise ModelcutError(f"op {s}{KINDS[k]}{mb} (stage {s}, micro-batch {mb}) is missing")


def spans(schedule: Schedule) -> tuple[np.ndarray, np.ndarray]:
    """Each micro-batch's first and last stage as arrays (all stages without ``spans``)."""
    m, S = schedule.microbatches, schedule.stages
    if schedule.spans is None:
        return np.zeros(m, dtype=np.int64), np.full(m, S - 1, dtype=np.int64)
    if len(schedule.spans) != m:
        raise ModelcutError(f"spans has {len(schedule.spans)} entries for {m} micro-batches")
    arr = np.array(schedule.spans, dtype=np.int64).reshape(m, 2)
    bad = (arr[:, 0] < 0) | (arr[:, 1] >= S) | (arr[:, 0] > arr[:, 1])
    if bad.any():
        k = int(np.flatnonzero(bad)[0])
        raise ModelcutError(f"micro-batch {k}'s span {tuple(schedule.spans[k])} is not a range of stages 0..{S - 1}")
    return arr[:, 0].copy(), arr[:, 1].copy()


def check_units(schedule: Schedule) -> None:
    """Overlapped units: per device, (first index, op count ≥ 2) inside the list, disjoint."""
    if not schedule.units:
        return
    if len(schedule.units) != schedule.devices:
        raise ModelcutError(f"units has {len(schedule.units)} lists for {schedule.devices} devices")
    for d, (order, units) in enumerate(zip(schedule.orders, schedule.units)):
        end = 0
        for unit in sorted(units):
            i, n = unit
            ok = all(isinstance(x, (int, np.integer)) and not isinstance(x, bool) for x in (i, n))
            if not ok or n < 2 or i < 0 or i + n > len(order):
                raise ModelcutError(f"device {d}: overlapped unit {tuple(unit)!r} is not two or more ops of its list")
            if i < end:
                raise ModelcutError(f"device {d}: overlapped units at ops {i} and before {end} share an op")
            end = i + n
