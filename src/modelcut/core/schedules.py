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


def _dualpipe_lists(p: int, m: int) -> list[tuple[list[tuple[str, int, int]], list[int]]]:
    """DualPipeV's op lists for p devices, 2p stages in a V, m micro-batches, as the DualPipe
    repository's ``DualPipeV.step`` runs them (deepseek-ai/DualPipe, dualpipe/dualpipev.py).

    Per device r, ops as (kind, micro-batch, phase): phase 0 is stage r (down the V), phase 1
    stage 2p − 1 − r (back up). A "full" backward is B immediately followed by its W; a
    deferred one (the repository's zero-bubble ``enable_zb``) queues its W, and a weight
    step runs the oldest queued W. Returns per device the list and its overlapped units
    (index, op count): a forward with a full backward, F, B, W. Steps, in the repository's
    names:

    1. nF0: 2(p − r − 1) phase-0 forwards;
    2. nF0F1: r + 1 times a phase-0 then a phase-1 forward;
    3. nB1W1F1: p − r − 1 times a deferred phase-1 backward, a weight step, a phase-1 forward;
    4. nF0B1F1B0 (main): m − 2p + r + 1 times the pairs F0&B1 and F1&B0 (full backwards);
       on the last device the first F0, B1 are not overlapped ("to further reduce bubble
       size");
    5. nB1F1B0: p − r − 1 times a full phase-1 backward, then the pair F1&B0;
    6. nB1B0: r + 1 times a phase-1 then a phase-0 backward, deferred from the middle on;
    7. nWB0: p − r − 1 times a weight step and a deferred phase-0 backward;
    8. nW: the r + 1 weight steps left.
    """
    out = []
    for r in range(p):
        ops: list[tuple[str, int, int]] = []
        units: list[tuple[int, int]] = []
        nf, nb = [0, 0], [0, 0]
        queue: list[tuple[int, int]] = []

        def fwd(ph: int) -> None:
            ops.append(("F", nf[ph], ph))
            nf[ph] += 1

        def bwd(ph: int, deferred: bool = False) -> None:
            ops.append(("B", nb[ph], ph))
            if deferred:
                queue.append((nb[ph], ph))
            else:
                ops.append(("W", nb[ph], ph))
            nb[ph] += 1

        def weight() -> None:
            mb, ph = queue.pop(0)
            ops.append(("W", mb, ph))

        def pair(f_ph: int, b_ph: int) -> None:
            start = len(ops)
            fwd(f_ph)
            bwd(b_ph)
            units.append((start, len(ops) - start))

        for _ in range(2 * (p - r - 1)):
            fwd(0)
        for _ in range(r + 1):
            fwd(0)
            fwd(1)
        for _ in range(p - r - 1):
            bwd(1, deferred=True)
            weight()
            fwd(1)
        for i in range(m - 2 * p + r + 1):
            if i == 0 and r == p - 1:
                fwd(0)
                bwd(1)
            else:
                pair(0, 1)
            pair(1, 0)
        for _ in range(p - r - 1):
            bwd(1)
            pair(1, 0)
        deferred = False
        for i in range(r + 1):
            if i == (r + 1) // 2 and r % 2 == 1:
                deferred = True
            bwd(1, deferred)
            if i == (r + 1) // 2 and r % 2 == 0:
                deferred = True
            bwd(0, deferred)
        for _ in range(p - r - 1):
            weight()
            bwd(0, deferred=True)
        while queue:
            weight()
        out.append((ops, units))
    return out


_OP = {"F": F, "B": B, "W": W}


def dualpipev(p: int, m: int, v: int = 2) -> Schedule:
    """DualPipeV (the DualPipe repository's "cut-in-half" DualPipe, after Sea AI Lab): p devices,
    two chunks each laid out in a V as in ZB-V (device d holds stages d and 2p − 1 − d), m ≥ 2p
    micro-batches. Forward and backward chunks of different micro-batches run as overlapped
    pairs (F&B) in the steady state (:func:`_dualpipe_lists`). Bubble (PP/2 − 1)(F&B + B − 3W)
    with PP = 2p stages (the repository's README; :func:`.closed_forms.dualpipe_bubble_time`)."""
    _check_sizes(p, m, v)
    if v != 2:
        raise ModelcutError(f"dualpipev runs exactly two chunks per device (v = 2), got v = {v}")
    if m < 2 * p:
        raise ModelcutError(f"dualpipev needs at least 2p = {2 * p} micro-batches (the DualPipe repository's "
                            f"rule), got m = {m}")
    orders, units = [], []
    for r, (ops, un) in enumerate(_dualpipe_lists(p, m)):
        orders.append(tuple(_OP[k](mb, r if ph == 0 else 2 * p - 1 - r) for k, mb, ph in ops))
        units.append(tuple(un))
    return Schedule("dualpipev", p, m, v, tuple(orders), tuple(units))


def dualpipe(p: int, m: int, v: int = 2) -> Schedule:
    """DualPipe (DeepSeek-V3 report, arXiv 2412.19437 §3.2.1; deepseek-ai/DualPipe): p (even)
    devices hold two copies of the model's p stages, one per direction, and m (even, ≥ 2p)
    micro-batches enter from both ends, half at device 0 and half at device p − 1.

    Stages: 0 … p − 1 are the forward direction's copy (stage s on device s), p … 2p − 1 the
    reverse direction's (model stage s as stage p + s, on device p − 1 − s); micro-batches
    0 … m/2 − 1 run through the first (``spans``), m/2 … m − 1 through the second. Device r
    and device p − 1 − r run DualPipeV's list for device min(r, p − 1 − r) of p/2 with m/2
    micro-batches, its phase 0 being the direction entering on that half (the repository's
    ``DualPipe.step`` is that list with these phases), so the two halves mirror each other.
    Bubble (p/2 − 1)(F&B + B − 3W); every device holds two stages' weights."""
    _check_sizes(p, m, v)
    if v != 2:
        raise ModelcutError(f"dualpipe runs two chunks per device (one per direction, v = 2), got v = {v}")
    if p % 2 or m % 2 or m < 2 * p:
        raise ModelcutError(f"dualpipe needs an even p and an even m of at least 2p (the DualPipe repository's "
                            f"rule), got p = {p}, m = {m}")
    half = m // 2
    lists = _dualpipe_lists(p // 2, half)
    orders, units = [], []
    for r in range(p):
        h = min(r, p - 1 - r)
        first_half = r < p // 2
        ops, un = lists[h]
        o = []
        for k, mb, ph in ops:
            forward_dir = (ph == 0) == first_half
            if forward_dir:   # model stage r of the forward copy
                o.append(_OP[k](mb, r))
            else:             # model stage p − 1 − r of the reverse copy, stage p + (p − 1 − r)
                o.append(_OP[k](half + mb, 2 * p - 1 - r))
        orders.append(tuple(o))
        units.append(tuple(un))
    spans = tuple((0, p - 1) if k < half else (p, 2 * p - 1) for k in range(m))
    return Schedule("dualpipe", p, m, v, tuple(orders), tuple(units), spans)


SchedFn = Callable[[int, int, int], Schedule]

SCHEDULES: dict[str, SchedFn] = {
    "gpipe": gpipe,
    "1f1b": one_f_one_b,
    "interleaved": interleaved,
    "looped-bfs": looped_bfs,
    "zb-h1": zb_h1,
    "zbv": zbv,
}

#: Schedules with overlapped forward-and-backward units (``Schedule.units``), kept apart from
#: ``SCHEDULES`` because their lists differ in kind from the others': some micro-batches run
#: through part of the stages (DualPipe's ``spans``), they need at least 2p micro-batches, and
#: an action CSV cannot carry their units. ``build`` and ``ALL_SCHEDULES`` hold both.
OVERLAPPED: dict[str, SchedFn] = {
    "dualpipe": dualpipe,
    "dualpipev": dualpipev,
}
ALL_SCHEDULES: dict[str, SchedFn] = {**SCHEDULES, **OVERLAPPED}

DEFAULT_CHUNKS = {"gpipe": 1, "1f1b": 1, "interleaved": 2, "looped-bfs": 2, "zb-h1": 1, "zbv": 2,
                  "dualpipe": 2, "dualpipev": 2}


def build(name: str, p: int, m: int, v: int | None = None) -> Schedule:
    """Build a schedule by name (``ALL_SCHEDULES``); v defaults to the schedule's natural chunk count."""
    fn = ALL_SCHEDULES.get(name)
    if fn is None:
        raise ModelcutError(f"unknown schedule {name!r}; choose one of {', '.join(ALL_SCHEDULES)}")
    return fn(p, m, DEFAULT_CHUNKS[name] if v is None else v)
