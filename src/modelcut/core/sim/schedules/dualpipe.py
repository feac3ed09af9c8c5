"""DualPipe and DualPipeV (DeepSeek-V3 report, arXiv 2412.19437 §3.2.1; deepseek-ai/DualPipe):
forward and backward chunks of different micro-batches overlapped in pairs."""

from __future__ import annotations

from ...errors import ModelcutError
from ..ops import B, F, Schedule, W
from .sizes import check_sizes


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


def check_dualpipev(p: int, m: int, v: int) -> None:
    """The DualPipe repository's size rules for DualPipeV."""
    check_sizes(p, m, v)
    if v != 2:
        raise ModelcutError(f"dualpipev runs exactly two chunks per device (v = 2), got v = {v}")
    if m < 2 * p:
        raise ModelcutError(f"dualpipev needs at least 2p = {2 * p} micro-batches (the DualPipe repository's "
                            f"rule), got m = {m}")


def dualpipev(p: int, m: int, v: int = 2) -> Schedule:
    """DualPipeV (the DualPipe repository's "cut-in-half" DualPipe, after Sea AI Lab): p devices,
    two chunks each laid out in a V as in ZB-V (device d holds stages d and 2p − 1 − d), m ≥ 2p
    micro-batches. Forward and backward chunks of different micro-batches run as overlapped
    pairs (F&B) in the steady state (:func:`_dualpipe_lists`). Bubble (PP/2 − 1)(F&B + B − 3W)
    with PP = 2p stages (the repository's README; :func:`.closed_forms.dualpipe_bubble_time`)."""
    check_dualpipev(p, m, v)
    orders, units = [], []
    for r, (ops, un) in enumerate(_dualpipe_lists(p, m)):
        orders.append(tuple(_OP[k](mb, r if ph == 0 else 2 * p - 1 - r) for k, mb, ph in ops))
        units.append(tuple(un))
    return Schedule("dualpipev", p, m, v, tuple(orders), tuple(units))


def check_dualpipe(p: int, m: int, v: int) -> None:
    """The DualPipe repository's size rules for DualPipe."""
    check_sizes(p, m, v)
    if v != 2:
        raise ModelcutError(f"dualpipe runs two chunks per device (one per direction, v = 2), got v = {v}")
    if p % 2 or m % 2 or m < 2 * p:
        raise ModelcutError(f"dualpipe needs an even p and an even m of at least 2p (the DualPipe repository's "
                            f"rule), got p = {p}, m = {m}")


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
    check_dualpipe(p, m, v)
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

