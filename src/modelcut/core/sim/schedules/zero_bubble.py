"""Zero-bubble schedules (Qi et al., "Zero Bubble Pipeline Parallelism", ICLR 2024): the
backward split into B (input gradient) and W (weight gradient)."""

from __future__ import annotations

from ...errors import ModelcutError
from ..ops import B, F, Op, Schedule, W
from .sizes import check_sizes, make, one_chunk


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
    check_sizes(p, m, v)
    one_chunk("zb-h1", v)
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
    return make("zb-h1", p, m, v, orders)


def check_zbv(p: int, m: int, v: int) -> None:
    """ZB-V's sizes: two chunks per device."""
    check_sizes(p, m, v)
    if v != 2:
        raise ModelcutError(f"zbv runs exactly two chunks per device (v = 2), got v = {v}")


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
    check_zbv(p, m, v)
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
    return make("zbv", p, m, v, orders)

