"""Checks every schedule generator shares, and the one way they package their op lists."""

from __future__ import annotations

from ...errors import ModelcutError
from ..ops import Op, Schedule


def check_sizes(p: int, m: int, v: int) -> None:
    for name, val in (("devices p", p), ("micro-batches m", m), ("chunks v", v)):
        if not isinstance(val, int) or isinstance(val, bool):
            raise ModelcutError(f"{name} must be an integer, got {val!r}")
        if val < 1:
            raise ModelcutError(f"{name} must be at least 1, got {val}")


def one_chunk(name: str, v: int) -> None:
    if v != 1:
        raise ModelcutError(f"{name} runs one chunk per device (v = 1), got v = {v}; "
                            "use 'interleaved' or 'looped-bfs' for several chunks")


def make(name: str, p: int, m: int, v: int, orders: list[list[Op]]) -> Schedule:
    return Schedule(name, p, m, v, tuple(tuple(o) for o in orders))

