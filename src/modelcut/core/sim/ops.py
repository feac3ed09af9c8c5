"""The op: one pass of one micro-batch through one pipeline stage.

A *stage* is a virtual stage (a chunk of layers) numbered 0 .. p·v − 1 in the order
activations flow forward. Kinds:

* ``F``: forward;
* ``B``: backward; for zero-bubble schedules only the input gradient (Qi et al. 2024);
* ``W``: weight gradient (zero-bubble schedules only).
"""

from __future__ import annotations

from dataclasses import dataclass

KINDS = ("F", "B", "W")


@dataclass(frozen=True, slots=True, order=True)
class Op:
    kind: str
    microbatch: int
    stage: int

    def __str__(self) -> str:  # torch.distributed.pipelining style: stage, kind, micro-batch
        return f"{self.stage}{self.kind}{self.microbatch}"


#: One int object for each micro-batch and stage index below 2^16, shared by every op that names
#: it: a schedule of millions of ops holds each index once rather than once per op.
_SHARED = tuple(range(1 << 16))


def _shared(x: int) -> int:
    return _SHARED[x] if type(x) is int and 0 <= x < 65536 else x


def F(mb: int, stage: int) -> Op:
    return Op("F", _shared(mb), _shared(stage))


def B(mb: int, stage: int) -> Op:
    return Op("B", _shared(mb), _shared(stage))


def W(mb: int, stage: int) -> Op:
    return Op("W", _shared(mb), _shared(stage))


@dataclass(frozen=True)
class Schedule:
    """Each device's ordered op list, plus the sizes it was built for.

    ``orders[d]`` is device d's list. ``split_backward`` is true when the backward is
    split into B (input gradient) and W (weight gradient).

    ``units[d]`` (optional) lists (i, n): ops i … i + n − 1 of device d's list run
    overlapped as one unit (DualPipe's F&B, DeepSeek-V3 report §3.2.1: a forward chunk and
    a backward chunk, with a split backward its B and W): they start together when the
    device is free and every one has its inputs, and end together (the engine's
    ``Timing.overlap`` gives the unit's duration).

    ``spans`` (optional) gives each micro-batch's (first, last) stage: a micro-batch then
    runs through those stages only (DualPipe's two directions, each through its own copy
    of the stages). None: every micro-batch runs through all stages.
    """

    name: str
    devices: int
    microbatches: int
    chunks: int
    orders: tuple[tuple[Op, ...], ...]
    units: tuple[tuple[tuple[int, int], ...], ...] = ()
    spans: tuple[tuple[int, int], ...] | None = None

    def span(self, microbatch: int) -> tuple[int, int]:
        """(first, last) stage micro-batch ``microbatch`` runs through."""
        return self.spans[microbatch] if self.spans is not None else (0, self.stages - 1)

    @property
    def stages(self) -> int:
        return self.devices * self.chunks

    @property
    def split_backward(self) -> bool:
        return any(op.kind == "W" for order in self.orders for op in order)

    @property
    def num_ops(self) -> int:
        return sum(len(o) for o in self.orders)

    def stage_device(self) -> dict[int, int]:
        """Which device holds each stage, read off the op lists."""
        where: dict[int, int] = {}
        for d, order in enumerate(self.orders):
            for op in order:
                where.setdefault(op.stage, d)
        return where
