"""torch.distributed.pipelining's compact action IR, as text.

An action reads ``{stage}{kind}{microbatch}``: ``0F1`` is stage 0's forward of
micro-batch 1. Kinds: ``F`` forward; ``B`` full backward; ``I`` backward for the input
only and ``W`` backward for the weights (the zero-bubble split). A CSV holds one row
per rank, one action per cell (torch's ``_dump_csv`` / ``_load_csv`` layout);
communication actions (``SEND_F``, ``RECV_B``, ...) and empty cells are skipped on
reading, since the engine models transfers itself.

In modelcut a split backward is written B (input) + W (weights); in this IR it is
``I`` + ``W``.
"""

from __future__ import annotations

import re

from ..errors import ModelcutError
from .ops import Op, Schedule

_ACTION = re.compile(r"^(\d+)(F|B|I|W)(\d+)$")
_COMM = re.compile(r"^\d+(SEND_F|RECV_F|SEND_B|RECV_B|UNSHARD|RESHARD|REDUCE_GRAD|BATCH_SEND_F|BATCH_SEND_B|BATCH_RECV_F|BATCH_RECV_B|SEND_F_RECV_B|SEND_B_RECV_F)\d*$")


def format_action(op: Op, split: bool) -> str:
    kind = "I" if (op.kind == "B" and split) else op.kind
    return f"{op.stage}{kind}{op.microbatch}"


def to_csv(schedule: Schedule) -> str:
    split = schedule.split_backward
    return "".join(",".join(format_action(op, split) for op in order) + "\n" for order in schedule.orders)


def parse_action(cell: str, where: str) -> Op | None:
    cell = cell.strip()
    if not cell or cell.lower() == "none" or _COMM.match(cell):
        return None
    mt = _ACTION.match(cell)
    if not mt:
        raise ModelcutError(f"{where}: cannot read action {cell!r} (want e.g. 0F1, 2B0, 1I3, 1W3)")
    stage, kind, mb = int(mt.group(1)), mt.group(2), int(mt.group(3))
    return Op("B" if kind == "I" else kind, mb, stage)


def from_csv(text: str, name: str = "custom") -> Schedule:
    """Read a schedule from the action CSV: one row per device.

    p is the number of rows, m one more than the largest micro-batch named, and the
    stage count must be a multiple of p (v = stages / p).
    """
    rows = [line for line in text.splitlines() if line.strip()]
    if not rows:
        raise ModelcutError("schedule CSV is empty: want one row of actions per device")
    orders: list[list[Op]] = []
    for r, line in enumerate(rows):
        ops = []
        for c, cell in enumerate(line.split(",")):
            op = parse_action(cell, f"row {r + 1}, cell {c + 1}")
            if op is not None:
                ops.append(op)
        orders.append(ops)
    all_ops = [op for o in orders for op in o]
    if not all_ops:
        raise ModelcutError("schedule CSV names no compute actions")
    p = len(orders)
    m = max(op.microbatch for op in all_ops) + 1
    stages = max(op.stage for op in all_ops) + 1
    if stages % p:
        raise ModelcutError(f"schedule CSV names {stages} stages on {p} devices; stages must be a multiple of devices")
    return Schedule(name, p, m, stages // p, tuple(tuple(o) for o in orders))
