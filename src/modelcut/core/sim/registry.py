"""The schedule registry: every pipeline schedule modelcut knows, its generator and its traits.

Nothing outside this module compares schedule names. A consumer asks for a schedule's
:class:`ScheduleSpec` (:func:`get`) and reads what it needs: how many chunks a device runs,
whether the backward is split, where each stage sits, what the schedule holds in memory,
its closed-form bubble, the sizes it accepts. Adding a schedule is one generator (a function
``(p, m, v) -> Schedule`` that checks its sizes) and one entry in :data:`SCHEDULES`;
docs/architecture.md walks through an example.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable

from ..errors import ModelcutError
from . import closed_forms as cf
from .ops import Schedule
from .schedules.basic import check_interleaved, gpipe, interleaved, llama3_interleaved, looped_bfs, one_f_one_b
from .schedules.dualpipe import check_dualpipe, check_dualpipev, dualpipe, dualpipev
from .schedules.sizes import check_sizes, one_chunk
from .schedules.zero_bubble import check_zbv, zb_h1, zbv

Builder = Callable[..., Schedule]
ClosedForm = Callable[[int, int, int, Any, Any, Any], Any]


def _balanced(p: int, layers: int, balanced_only: bool) -> list[int]:
    """v ≥ 2 with p·v ≤ layers + 2; with ``balanced_only`` only those where p·v divides the
    layers or the layers plus the embedding and the loss, so that chunks are even."""
    return [v for v in range(2, (layers + 2) // p + 1)
            if not balanced_only or layers % (p * v) == 0 or (layers + 2) % (p * v) == 0]


@dataclass(frozen=True)
class ScheduleSpec:
    """One schedule and what the rest of modelcut needs to know about it.

    ``check(p, m, v)`` raises the generator's own one-line error without building the lists.
    ``split_backward``: the lists hold B and W apart (zero-bubble schedules; DualPipe's full
    backward is B then its W); ``weight_apart``: the step models time W apart from B, as the
    zero-bubble schedules run it (DualPipe's pairs are timed with full backwards, W taking no time).
    ``placement``: "looped", device d holds stages d, d + p, d + 2p, … (Megatron-LM's); "v",
    device d holds stages d and 2p − 1 − d (ZB-V, DualPipeV, and DualPipe's two copies).
    ``copies``: copies of the model the stages hold (DualPipe: 2, one per direction).
    ``holds_all``: every micro-batch's activations are held at once (GPipe, breadth-first), so
    no shorter micro-batch count has the same in-flight peak; otherwise ``repeat(p, group)`` is
    (period, cap): past ``cap`` micro-batches the lists repeat every ``period``.
    ``built_for(p, m)``: the micro-batch count the generator builds before dropping extras.
    ``closed_form(p, m, v, t_f, t_b, t_w)``: the bubble, or None where no formula holds.
    ``chunk_choices(p, m, layers, balanced_only)``: the v the explorer tries.
    ``megatron``: Megatron-LM runs it (1F1B, or its interleaved schedule); ``torch_class``:
    torch.distributed.pipelining's class for it, if any."""

    name: str
    build: Builder
    check: Callable[..., None]
    default_chunks: int
    fixed_chunks: bool
    split_backward: bool
    placement: str
    closed_form: ClosedForm
    chunk_choices: Callable[[int, int, int, bool], list[int]]
    repeat: Callable[[int, int | None], tuple[int, int]] | None = None
    weight_apart: bool = False
    holds_all: bool = False
    copies: int = 1
    overlapped: bool = False
    grouped: bool = False
    built_for: Callable[[int, int], int] = lambda p, m: m
    explored_by_default: bool = False
    megatron: bool = False
    torch_class: str | None = None

    @property
    def summary(self) -> str:
        """The generator's first paragraph, at most 160 characters."""
        para = " ".join((self.build.__doc__ or "").strip().split("\n\n")[0].split())
        return para if len(para) <= 160 else para[:159].rsplit(" ", 1)[0] + " …"

    def device_of(self, stage: int, p: int) -> int:
        """The device holding virtual stage ``stage`` of p·v."""
        if self.placement == "v":
            return stage if stage < p else 2 * p - 1 - stage
        return stage % p

    def equivalent_microbatches(self, p: int, m: int, group: int | None = None) -> int:
        """A micro-batch count no larger than m whose lists hold the same in-flight candidates
        (:mod:`.inflight`): m itself when the schedule holds every micro-batch."""
        if self.holds_all or self.repeat is None:
            return m
        period, cap = self.repeat(p, group)
        return m if m <= cap else cap + (m - cap) % period

    def validate(self, p: int, m: int, v: int, group: int | None = None) -> None:
        """The generator's size rules, without building: a one-line error for sizes it refuses."""
        if group is not None and self.grouped:
            self.check(p, m, v, group)
        else:
            self.check(p, m, v)

    def make(self, p: int, m: int, v: int | None = None, group: int | None = None) -> Schedule:
        """Build the lists; ``group`` is the interleaved schedule's micro-batch group size."""
        v = self.default_chunks if v is None else v
        if group is not None and self.grouped:
            return self.build(p, m, v, group)
        return self.build(p, m, v)


def _flush(p, m, v, t_f, t_b, t_w):
    return cf.flush_bubble(p, m, t_f) if v == 1 else None


def _halves(t_b, t_w):
    return (t_b / 2, t_b / 2) if t_w is None else (t_b, t_w)


def _zb_h1_form(p, m, v, t_f, t_b, t_w):
    t_b, t_w = _halves(t_b, t_w)
    if v == 1 and m >= p and t_w <= t_f and t_w <= t_b:
        return cf.zb_h1_bubble(p, m, t_f, t_b, t_w)
    return None


def _zbv_form(p, m, v, t_f, t_b, t_w):
    t_b, t_w = _halves(t_b, t_w)
    return cf.zbv_bubble(p, m, t_f) if v == 2 and t_f == t_b == t_w and m >= 2 * p - 1 else None


def _one_chunk_check(name: str):
    def check(p: int, m: int, v: int) -> None:
        check_sizes(p, m, v)
        one_chunk(name, v)
    return check


def _v_choices(p, m, layers, balanced_only):
    return [2] if p > 1 and 2 * p <= layers + 2 else []


SCHEDULES: dict[str, ScheduleSpec] = {s.name: s for s in (
    ScheduleSpec("gpipe", gpipe, _one_chunk_check("gpipe"), 1, True, False, "looped", _flush,
                 lambda p, m, layers, b: [1], holds_all=True, torch_class="ScheduleGPipe"),
    ScheduleSpec("1f1b", one_f_one_b, _one_chunk_check("1f1b"), 1, True, False, "looped", _flush,
                 lambda p, m, layers, b: [1], repeat=lambda p, g: (1, p + 1), explored_by_default=True,
                 megatron=True, torch_class="Schedule1F1B"),
    ScheduleSpec("interleaved", interleaved, check_interleaved, 2, False, False, "looped",
                 lambda p, m, v, t_f, t_b, t_w: cf.chunked_bubble(p, m, v, t_f) if m % p == 0 else None,
                 lambda p, m, layers, b: [] if p == 1 or m % p else _balanced(p, layers, b),
                 repeat=lambda p, g: (g or p, 2 * (g or p) + 2 * p), grouped=True, explored_by_default=True,
                 megatron=True, torch_class="ScheduleInterleaved1F1B"),
    ScheduleSpec("llama3-interleaved", llama3_interleaved, check_interleaved, 2, False, False, "looped",
                 lambda p, m, v, t_f, t_b, t_w: cf.chunked_bubble(p, m, v, t_f) if m % p == 0 else None,
                 lambda p, m, layers, b: [] if p == 1 or m % p else _balanced(p, layers, b),
                 repeat=lambda p, g: (g or p, 2 * (g or p) + 2 * p), grouped=True),
    ScheduleSpec("looped-bfs", looped_bfs, check_sizes, 2, False, False, "looped",
                 lambda p, m, v, t_f, t_b, t_w: cf.chunked_bubble(p, m, v, t_f) if m >= p else None,
                 lambda p, m, layers, b: [] if p == 1 else _balanced(p, layers, b), holds_all=True,
                 torch_class="ScheduleLoopedBFS"),
    ScheduleSpec("zb-h1", zb_h1, _one_chunk_check("zb-h1"), 1, True, True, "looped", _zb_h1_form,
                 lambda p, m, layers, b: [1], repeat=lambda p, g: (1, p + 1), weight_apart=True,
                 explored_by_default=True),
    ScheduleSpec("zbv", zbv, check_zbv, 2, True, True, "v", _zbv_form, _v_choices,
                 repeat=lambda p, g: (1, 2 * p + 1), weight_apart=True, built_for=lambda p, m: max(m, 2 * p - 1),
                 explored_by_default=True, torch_class="ScheduleZBVZeroBubble"),
    ScheduleSpec("dualpipe", dualpipe, check_dualpipe, 2, True, True, "v", lambda *a: None,
                 lambda p, m, layers, b: [2] if p > 1 and p % 2 == 0 and m % 2 == 0 and m >= 2 * p and p <= layers
                 else [],
                 repeat=lambda p, g: (2, 2 * p + 4), copies=2, overlapped=True),
    ScheduleSpec("dualpipev", dualpipev, check_dualpipev, 2, True, True, "v", lambda *a: None,
                 lambda p, m, layers, b: _v_choices(p, m, layers, b) if m >= 2 * p else [],
                 repeat=lambda p, g: (1, 2 * p + 2), overlapped=True),
)}


def names() -> tuple[str, ...]:
    return tuple(SCHEDULES)


def get(name: str) -> ScheduleSpec:
    """The registry entry of ``name``, or a one-line error naming the known schedules."""
    spec = SCHEDULES.get(name) if isinstance(name, str) else None
    if spec is None:
        raise ModelcutError(f"unknown schedule {name!r}; choose one of {', '.join(SCHEDULES)}")
    return spec


def build(name: str, p: int, m: int, v: int | None = None, group: int | None = None) -> Schedule:
    """Build a schedule by name; v defaults to the schedule's natural chunk count."""
    return get(name).make(p, m, v, group)


def default_schedule(v: int) -> ScheduleSpec:
    """The schedule a run that names none gets: 1F1B, or Megatron-LM's interleaved one with v > 1."""
    return SCHEDULES["interleaved" if v > 1 else "1f1b"]


def explored_by_default() -> tuple[str, ...]:
    return tuple(n for n, s in SCHEDULES.items() if s.explored_by_default)


def closed_form(name: str, p: int, m: int, v: int, t_f: Any = 1, t_b: Any = 2, t_w: Any = None) -> Any:
    """The schedule's closed-form bubble for uniform stages and free sends, or None.

    Times t_* are for a device's whole share of layers; with a split backward and no t_W, B
    and W share t_B equally. Which formula, and when it holds: the functions of
    :mod:`.closed_forms` as each entry of :data:`SCHEDULES` applies them."""
    return get(name).closed_form(p, m, v, t_f, t_b, t_w)
