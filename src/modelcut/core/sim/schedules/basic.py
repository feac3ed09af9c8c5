"""Pipeline schedules: pure functions (p devices, m micro-batches, v chunks) -> op lists.

Every schedule returns a :class:`~modelcut.core.sim.ops.Schedule`; none knows the engine.
Stage numbering: stage s is the s-th chunk of layers in forward order. Unless a
schedule says otherwise, device d holds stages d, d + p, d + 2p, ... (Megatron-LM's
interleaved placement, Narayanan et al. 2021 §2.2.2).
"""

from __future__ import annotations

from ...errors import ModelcutError
from ..ops import B, F, Op, Schedule
from .sizes import check_sizes, make, one_chunk


def gpipe(p: int, m: int, v: int = 1) -> Schedule:
    """GPipe (Huang et al. 2019): every micro-batch forward, then every one backward.

    Bubble (p − 1)/m; each device holds all m micro-batches' activations.
    """
    check_sizes(p, m, v)
    one_chunk("gpipe", v)
    return make("gpipe", p, m, v, [[F(i, d) for i in range(m)] + [B(i, d) for i in range(m)]
                                    for d in range(p)])


def one_f_one_b(p: int, m: int, v: int = 1) -> Schedule:
    """1F1B (PipeDream-Flush; Narayanan et al. 2021 §2.2.1).

    Device d warms up with min(p − 1 − d, m) forwards, then alternates one forward and
    one backward, then drains the remaining backwards. Same bubble as GPipe,
    (p − 1)/m, but device d holds at most min(m, p − d) micro-batches' activations.
    """
    check_sizes(p, m, v)
    one_chunk("1f1b", v)
    orders = []
    for d in range(p):
        warm = min(p - 1 - d, m)
        o = [F(i, d) for i in range(warm)]
        for i in range(m - warm):
            o += [F(warm + i, d), B(i, d)]
        o += [B(i, d) for i in range(m - warm, m)]
        orders.append(o)
    return make("1f1b", p, m, v, orders)


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


def check_interleaved(p: int, m: int, v: int, group: int | None = None) -> int:
    """Megatron-LM's size rules for its interleaved schedule (:func:`interleaved`); returns the
    micro-batch group size N."""
    check_sizes(p, m, v)
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
    return N


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
    N = check_interleaved(p, m, v, group)
    return make("interleaved", p, m, v, _interleaved_orders(p, m, v, N, 2))


def _interleaved_orders(p: int, m: int, v: int, N: int, per_rank: int) -> list[list[Op]]:
    """The interleaved lists in Megatron-LM's table order, device d warming up with
    ``per_rank``·(p − 1 − d) + (v − 1)·N chunk forwards (capped at m·v)."""
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

        warm = min((p - 1 - d) * per_rank + (v - 1) * N, total)
        o = [fwd(k) for k in range(warm)]
        for k in range(total - warm):
            o += [fwd(warm + k), bwd(k)]
        o += [bwd(k) for k in range(total - warm, total)]
        orders.append(o)
    return orders


def llama3_interleaved(p: int, m: int, v: int = 2, group: int | None = None) -> Schedule:
    """Llama 3's interleaved 1F1B (Grattafiori et al. 2024 §3.3.2, Fig. 6): Megatron-LM's order
    of (micro-batch, chunk) pairs in groups of N (tunable, N ≥ p), warming up with one chunk
    forward per downstream rank, (v − 1)·N + (p − 1 − d), where Megatron-LM runs two.

    Assumed, as the paper draws the schedule but gives no warm-up: with asynchronous
    point-to-point sends (§3.3.2) the second forward per downstream rank, which covers
    Megatron-LM's blocking batched send/receive pairs, is not needed to keep the devices
    busy: with free sends the bubble is Megatron-LM's, (p − 1)/(v·m) for m a multiple of p,
    and each device holds p − 1 − d fewer chunks' activations at its peak (the paper's
    "memory imbalance" and "best communication and memory efficiency"). Size rules as
    :func:`interleaved`'s."""
    N = check_interleaved(p, m, v, group)
    return make("llama3-interleaved", p, m, v, _interleaved_orders(p, m, v, N, 1))


def looped_bfs(p: int, m: int, v: int = 2) -> Schedule:
    """Breadth-first looped pipeline (Lamy-Poirier 2023, "Breadth-First Pipeline Parallelism").

    Device d holds chunks d, d + p, ...; it runs every micro-batch's forward through its
    first chunk, then through its second, and so on, then the backwards chunk by chunk
    in reverse. Bubble (p − 1)/(v·m) when m ≥ p; each device holds all m micro-batches.
    """
    check_sizes(p, m, v)
    orders = []
    for d in range(p):
        o = [F(i, c * p + d) for c in range(v) for i in range(m)]
        o += [B(i, c * p + d) for c in reversed(range(v)) for i in range(m)]
        orders.append(o)
    return make("looped-bfs", p, m, v, orders)

