"""Pipeline schedules: pure functions (p devices, m micro-batches, v chunks) -> op lists.

Every schedule returns a :class:`~modelcut.core.ops.Schedule`; none knows the engine.
Stage numbering: stage s is the s-th chunk of layers in forward order. Unless a
schedule says otherwise, device d holds stages d, d + p, d + 2p, ... (Megatron-LM's
interleaved placement, Narayanan et al. 2021 §2.2.2).
"""

from __future__ import annotations

from typing import Callable

from .errors import ModelcutError
from .ops import B, F, Op, Schedule, W


def _check_sizes(p: int, m: int, v: int) -> None:
    for name, val in (("devices p", p), ("micro-batches m", m), ("chunks v", v)):
        if not isinstance(val, int) or isinstance(val, bool):
            raise ModelcutError(f"{name} must be an integer, got {val!r}")
        if val < 1:
            raise ModelcutError(f"{name} must be at least 1, got {val}")


def _one_chunk(name: str, v: int) -> None:
    if v != 1:
        raise ModelcutError(f"{name} runs one chunk per device (v = 1), got v = {v}; "
                            "use 'interleaved' or 'looped-bfs' for several chunks")


def _make(name: str, p: int, m: int, v: int, orders: list[list[Op]]) -> Schedule:
    return Schedule(name, p, m, v, tuple(tuple(o) for o in orders))


def gpipe(p: int, m: int, v: int = 1) -> Schedule:
    """GPipe (Huang et al. 2019): every micro-batch forward, then every one backward.

    Bubble (p − 1)/m; each device holds all m micro-batches' activations.
    """
    _check_sizes(p, m, v)
    _one_chunk("gpipe", v)
    return _make("gpipe", p, m, v, [[F(i, d) for i in range(m)] + [B(i, d) for i in range(m)]
                                    for d in range(p)])


def one_f_one_b(p: int, m: int, v: int = 1) -> Schedule:
    """1F1B (PipeDream-Flush; Narayanan et al. 2021 §2.2.1).

    Device d warms up with min(p − 1 − d, m) forwards, then alternates one forward and
    one backward, then drains the remaining backwards. Same bubble as GPipe,
    (p − 1)/m, but device d holds at most min(m, p − d) micro-batches' activations.
    """
    _check_sizes(p, m, v)
    _one_chunk("1f1b", v)
    orders = []
    for d in range(p):
        warm = min(p - 1 - d, m)
        o = [F(i, d) for i in range(warm)]
        for i in range(m - warm):
            o += [F(warm + i, d), B(i, d)]
        o += [B(i, d) for i in range(m - warm, m)]
        orders.append(o)
    return _make("1f1b", p, m, v, orders)


def megatron_schedule_table(m: int, v: int, group: int) -> list[tuple[int, int]]:
    """Megatron-LM's interleaved order of (micro-batch, chunk) pairs.

    Micro-batches go in groups of ``group`` (``--microbatch-group-size-per-virtual-
    pipeline-stage``, default p); each group runs through chunk 0, then chunk 1, ...;
    the last group takes whatever micro-batches remain (megatron/core/pipeline_parallel/
    schedules.py, ``get_schedule_table``).
    """
    table = []
    for first in range(0, m, group):
        last = min(first + group, m)
        table += [(mb, c) for c in range(v) for mb in range(first, last)]
    return table


def interleaved(p: int, m: int, v: int = 2, group: int | None = None) -> Schedule:
    """Megatron-LM's interleaved 1F1B (Narayanan et al. 2021 §2.2.2).

    Device d holds chunks d, d + p, ..., d + (v − 1)p. The k-th forward runs the
    schedule table's k-th (micro-batch, chunk); the k-th backward the same entry with
    the chunk order reversed. Device d warms up with 2·(p − 1 − d) + (v − 1)·N chunk
    forwards (N the group size, default p), capped at m·v, then alternates forward and
    backward, then drains. Bubble (p − 1)/(v·m) when m is a multiple of p.

    With v > 1 the sizes must pass Megatron-LM's checks in
    ``forward_backward_pipelining_with_interleaving`` (megatron/core/pipeline_parallel/
    schedules.py): p ≤ N ≤ m, and the last group, m mod N, is 0 or at least p (a shorter
    last group waits on itself: such orders deadlock or leave "dependency bubbles").
    With the default N = p that means m a multiple of p. One exception to Megatron-LM:
    a single group N = m < p is accepted, which is what torch.distributed.pipelining's
    ScheduleInterleaved1F1B runs when m < p.
    """
    _check_sizes(p, m, v)
    N = p if group is None else group
    if not isinstance(N, int) or isinstance(N, bool) or N < 1:
        raise ModelcutError(f"micro-batch group size must be a positive integer, got {N!r}")
    if v > 1 and m < N:
        raise ModelcutError(
            f"interleaved needs m >= N, its micro-batch group size (Megatron-LM's "
            f"microbatch-group-size-per-virtual-pipeline-stage, default p): m = {m}, N = {N}")
    if v > 1 and N < p and N != m:
        raise ModelcutError(f"interleaved needs group size N >= p (Megatron-LM's rule): N = {N}, p = {p}")
    if v > 1 and 0 < m % N < p:
        raise ModelcutError(
            f"interleaved needs m mod N = 0 or >= p (Megatron-LM's rule for its micro-batch group "
            f"size N, default p: so m a multiple of p): m = {m}, N = {N}, p = {p}")
    table = megatron_schedule_table(m, v, N)
    total = m * v
    orders = []
    for d in range(p):
        def fwd(k: int) -> Op:
            mb, c = table[k]
            return F(mb, c * p + d)

        def bwd(k: int) -> Op:
            mb, c = table[k]
            return B(mb, (v - 1 - c) * p + d)

        warm = min((p - 1 - d) * 2 + (v - 1) * N, total)
        o = [fwd(k) for k in range(warm)]
        for k in range(total - warm):
            o += [fwd(warm + k), bwd(k)]
        o += [bwd(k) for k in range(total - warm, total)]
        orders.append(o)
    return _make("interleaved", p, m, v, orders)


def looped_bfs(p: int, m: int, v: int = 2) -> Schedule:
    """Breadth-first looped pipeline (Lamy-Poirier 2023, "Breadth-First Pipeline Parallelism").

    Device d holds chunks d, d + p, ...; it runs every micro-batch's forward through its
    first chunk, then through its second, and so on, then the backwards chunk by chunk
    in reverse. Bubble (p − 1)/(v·m) when m ≥ p; each device holds all m micro-batches.
    """
    _check_sizes(p, m, v)
    orders = []
    for d in range(p):
        o = [F(i, c * p + d) for c in range(v) for i in range(m)]
        o += [B(i, c * p + d) for c in reversed(range(v)) for i in range(m)]
        orders.append(o)
    return _make("looped-bfs", p, m, v, orders)


def zb_h1(p: int, m: int, v: int = 1) -> Schedule:
    """ZB-H1 (Qi et al., "Zero Bubble Pipeline Parallelism", ICLR 2024, §2.1).

    The backward is split into B (input gradient, on the critical path) and W (weight
    gradient, free to move). Device d keeps 1F1B's order of F and B (warm-up
    min(p − 1 − d, m) forwards) and runs each W d backwards late, so the B chain
    reaches the first device sooner and the W fill the drain. Every device then peaks
    at p micro-batches of activations, as 1F1B's first device does, and with m ≥ p and
    t_W ≤ min(t_F, t_B) the bubble is (p − 1)(t_F + t_B − t_W) / (m(t_F + t_B + t_W)),
    a third of 1F1B's when t_F = t_B = t_W.
    """
    _check_sizes(p, m, v)
    _one_chunk("zb-h1", v)
    orders = []
    for d in range(p):
        warm = min(p - 1 - d, m)
        o = [F(i, d) for i in range(warm)]
        done_b = done_w = 0

        def backward(i: int) -> None:
            nonlocal done_b, done_w
            o.append(B(i, d))
            done_b += 1
            if done_b > d:  # W lags its B by d backwards on device d
                o.append(W(done_w, d))
                done_w += 1

        for i in range(m - warm):
            o.append(F(warm + i, d))
            backward(i)
        for i in range(m - warm, m):
            backward(i)
        o += [W(j, d) for j in range(done_w, m)]
        orders.append(o)
    return _make("zb-h1", p, m, v, orders)


def zbv(p: int, m: int, v: int = 2) -> Schedule:
    """ZB-V (Qi et al. 2024, §6): two chunks per device laid out in a V.

    Device d holds stage d (chunk 0, on the way down) and stage 2p − 1 − d (chunk 1, on
    the way back), so the last stage sits on device 0 beside the first. The order is
    the paper's, as torch.distributed.pipelining's ScheduleZBVZeroBubble builds it:
    warm up with 2(p − d) − 1 chunk-0 forwards, then d pairs of (chunk-1 F, chunk-0 F),
    then p − d rounds of chunk-1 (F, B, W); a steady state of chunk-0 (F, B, W) then
    chunk-1 (F, B, W); a drain of d pairs of B and p − d chunk-0 (B, W); then the
    outstanding W. The order is built for max(m, 2p − 1) micro-batches and the
    missing ones dropped, as torch does. Zero bubble in the steady state when
    t_F = t_B = t_W.
    """
    _check_sizes(p, m, v)
    if v != 2:
        raise ModelcutError(f"zbv runs exactly two chunks per device (v = 2), got v = {v}")
    n = max(2 * p - 1, m)
    orders = []
    for d in range(p):
        s0, s1 = d, 2 * p - 1 - d
        o: list[Op] = []
        f0 = f1 = b0 = b1 = 0
        for _ in range(2 * (p - d) - 1):
            o.append(F(f0, s0)); f0 += 1
        for _ in range(d):
            o.append(F(f1, s1)); f1 += 1
            o.append(F(f0, s0)); f0 += 1
        for _ in range(p - d):
            o += [F(f1, s1), B(b1, s1), W(b1, s1)]
            f1 += 1; b1 += 1
        while f1 < f0 or f0 < n:
            if f0 < n:
                o.append(F(f0, s0)); f0 += 1
            o += [B(b0, s0), W(b0, s0)]; b0 += 1
            o += [F(f1, s1), B(b1, s1), W(b1, s1)]
            f1 += 1; b1 += 1
        w0, w1 = b0, b1
        for _ in range(d):
            o.append(B(b0, s0)); b0 += 1
            o.append(B(b1, s1)); b1 += 1
        for _ in range(p - d):
            o.append(B(b0, s0)); b0 += 1
            o.append(W(w0, s0)); w0 += 1
        o += [W(i, s1) for i in range(w1, b1)]
        o += [W(i, s0) for i in range(w0, b0)]
        orders.append([op for op in o if op.microbatch < m])
    return _make("zbv", p, m, v, orders)


SchedFn = Callable[[int, int, int], Schedule]

SCHEDULES: dict[str, SchedFn] = {
    "gpipe": gpipe,
    "1f1b": one_f_one_b,
    "interleaved": interleaved,
    "looped-bfs": looped_bfs,
    "zb-h1": zb_h1,
    "zbv": zbv,
}

DEFAULT_CHUNKS = {"gpipe": 1, "1f1b": 1, "interleaved": 2, "looped-bfs": 2, "zb-h1": 1, "zbv": 2}


def build(name: str, p: int, m: int, v: int | None = None) -> Schedule:
    """Build a schedule by name; v defaults to the schedule's natural chunk count."""
    fn = SCHEDULES.get(name)
    if fn is None:
        raise ModelcutError(f"unknown schedule {name!r}; choose one of {', '.join(SCHEDULES)}")
    return fn(p, m, DEFAULT_CHUNKS[name] if v is None else v)
