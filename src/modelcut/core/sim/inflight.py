"""Activations in flight: how many micro-batches of each of its stages a device holds.

Each forward of a stage allocates that stage's activations and each backward frees them (a
split backward frees all but the weight-gradient share, :data:`.metrics.W_FRACTION`, which W
frees). Because a device's allocations and frees are serialized in its op list, its peak for
any per-stage bytes depends on the op order only: it is read off the lists once and cached.
With 1/v per stage it is :attr:`.metrics.PipelineMetrics.peak_activations`.
"""

from __future__ import annotations

from functools import lru_cache
from operator import attrgetter

import numpy as np

from . import registry
from .metrics import W_FRACTION

Profile = tuple[tuple[tuple[int, ...], np.ndarray], ...]


def inflight_profile(name: str, p: int, m: int, v: int, group: int | None = None) -> Profile:
    """For each device: (its stages in ascending order, candidate in-flight vectors).

    A candidate vector gives, right after one of the device's forwards, how many micro-batches
    of each of its stages are held, one row of an array; the device's peak for per-stage bytes
    w is the largest c·w. Cached on the schedule's equivalent micro-batch count
    (:meth:`.registry.ScheduleSpec.equivalent_microbatches`: past a few micro-batches a device
    repeats one pattern per micro-batch, or per group, and the drain only frees)."""
    spec = registry.get(name)
    return _profile(name, p, spec.equivalent_microbatches(p, m, group), v, group)


@lru_cache(maxsize=4096)
def _profile(name: str, p: int, m: int, v: int, group: int | None = None) -> Profile:
    spec = registry.get(name)
    built = spec.built_for(p, m)
    if built > m:
        # lists built for more micro-batches with the extra ones dropped: derive them from the
        # one cached build of the larger count
        full = _orders(name, p, built, v)
        return profile_of([[op for op in o if op.microbatch < m] for o in full], spec.split_backward)
    return profile_uncached(name, p, m, v, group)


@lru_cache(maxsize=256)
def _orders(name: str, p: int, m: int, v: int):
    return registry.build(name, p, m, v).orders


def profile_uncached(name: str, p: int, m: int, v: int, group: int | None = None) -> Profile:
    """:func:`inflight_profile` built from the full schedule, without the cache."""
    sched = registry.build(name, p, m, v, group)
    return profile_of(sched.orders, sched.split_backward)


_KIND = {"F": 0, "B": 1, "W": 2}


def profile_of(orders, split: bool) -> Profile:
    """Per device: (stages, distinct in-flight vectors right after each forward). Each op
    changes its stage's count: F +1 awaiting B; B −1 (and, with a split backward, +1
    awaiting W); W −1; a vector is held + W_FRACTION · awaiting W."""
    wf = float(W_FRACTION)
    out = []
    for order in orders:
        n = len(order)
        if not n:
            out.append(((), np.zeros((0, 0))))
            continue
        kinds = np.fromiter((_KIND[k] for k in map(attrgetter("kind"), order)), dtype=np.int8, count=n)
        stg = np.fromiter(map(attrgetter("stage"), order), dtype=np.int64, count=n)
        stages, idx = np.unique(stg, return_inverse=True)
        k = len(stages)
        delta = np.zeros((n, 2 * k), dtype=np.int32)
        rows = np.arange(n)
        f, b, w = kinds == 0, kinds == 1, kinds == 2
        delta[rows[f], idx[f]] = 1
        delta[rows[b], idx[b]] = -1
        if split:
            delta[rows[b], k + idx[b]] = 1
            delta[rows[w], k + idx[w]] = -1
        held = np.cumsum(delta, axis=0)[f]
        vecs = np.unique(held[:, :k] + wf * held[:, k:], axis=0)
        out.append((tuple(int(x) for x in stages), vecs))
    return tuple(out)


def device_peaks(name: str, p: int, m: int, v: int, stage_bytes: list[float],
                 group: int | None = None, cached: bool = True) -> list[float]:
    """Peak activation bytes of each device, given each virtual stage's bytes per micro-batch.
    ``cached=False`` rebuilds the full schedule (a benchmark's baseline)."""
    prof = inflight_profile(name, p, m, v, group) if cached else profile_uncached(name, p, m, v, group)
    w = np.asarray(stage_bytes, dtype=float)
    return [float((cands @ w[list(stages)]).max()) if len(stages) else 0.0 for stages, cands in prof]
