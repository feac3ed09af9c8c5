"""torch.distributed.pipelining's schedules, read as modelcut op lists, without a cluster.

Each torch schedule class is built with stand-in stages, as torch's own schedule visualizer
(``torch/distributed/pipelining/_schedule_visualizer.py``, ``get_schedule_ops``) builds
them with mock stages, and then its own ``_step_microbatches`` is *run*, rank by rank,
against recording stages that do no work and no communication. The recorded calls
(``forward_one_chunk``, ``backward_one_chunk``, ``backward_weight_one_chunk``) are the order
torch executes, which is not always the order it declares:

* ``Schedule1F1B`` and ``ScheduleGPipe`` run their own loops (``_step_microbatches``), not
  ``pipeline_order``. In torch 2.13.0 ``Schedule1F1B._get_pipeline_order`` lists the last
  rank's forwards as micro-batches 1..m (not 0..m − 1) and torch's ``_validate_schedule``
  rejects it, while the loop executes the right order; :func:`torch_order` therefore
  compares with what runs and keeps the declared order beside it.
* The multi-stage runtime (``_PipelineScheduleRuntime``) executes the compute actions of
  ``pipeline_order_with_comms`` in order; an ``OVERLAP_F_B`` action (DualPipeV) runs its
  sub-actions one after the other (``for sub_a in action.sub_actions: _perform_action``),
  so it is read as that sequence, each action remembering the overlap group it came from.

Mapping to modelcut's ops (F, B, W): torch ``F`` -> F; ``I`` (input gradient) -> B;
``W`` -> W; a full backward ``B`` -> B when the schedule never splits its backward, and
B followed at once by W on the same device when it does (DualPipeV mixes both), since a
full backward computes the input and the weight gradients in one go.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from ...core.errors import ModelcutError
from ...core.sim import registry
from ...core.sim.actions import format_action
from ...core.sim.ops import Op, Schedule
from . import require_torch

#: modelcut schedule name -> the torch.distributed.pipelining class that implements it
#: (torch/distributed/pipelining/schedules.py, torch 2.13.0).
TORCH_CLASS = {name: spec.torch_class for name, spec in registry.SCHEDULES.items() if spec.torch_class}

#: Every concrete schedule class of torch 2.13.0 that :func:`torch_order` can read.
TORCH_CLASSES = ("ScheduleGPipe", "Schedule1F1B", "ScheduleInterleaved1F1B", "ScheduleLoopedBFS",
                 "ScheduleInterleavedZeroBubble", "ScheduleZBVZeroBubble", "ScheduleDualPipeV")

_COMPUTE = ("F", "B", "I", "W")


@dataclass(frozen=True)
class TorchAction:
    """One compute action as torch executes it: ``stage``, ``kind`` (F, B = full backward,
    I = input gradient, W = weight gradient), ``microbatch``; ``group`` numbers the declared
    action it came from (the sub-actions of one OVERLAP_F_B share it)."""

    stage: int
    kind: str
    microbatch: int
    group: int

    def __str__(self) -> str:  # torch's compact notation, e.g. 2I5
        return f"{self.stage}{self.kind}{self.microbatch}"


@dataclass
class TorchOrder:
    """A torch schedule's actions for sizes (p, m, v): what each rank executes, and what
    the class declares in ``pipeline_order`` (compute actions, idle slots dropped,
    OVERLAP_F_B written ``(a;b)``)."""

    class_name: str
    devices: int
    microbatches: int
    chunks: int
    executed: tuple[tuple[TorchAction, ...], ...]
    declared: tuple[tuple[str, ...], ...]
    stage_rank: dict[int, int] = field(default_factory=dict)

    @property
    def split_backward(self) -> bool:
        return any(a.kind in ("I", "W") for rank in self.executed for a in rank)

    def overlapped(self) -> list[tuple[int, tuple[TorchAction, ...]]]:
        """(rank, actions) for every group of more than one action (OVERLAP_F_B)."""
        out = []
        for r, rank in enumerate(self.executed):
            groups: dict[int, list[TorchAction]] = {}
            for a in rank:
                groups.setdefault(a.group, []).append(a)
            out += [(r, tuple(g)) for g in groups.values() if len(g) > 1]
        return out

    def executed_strings(self) -> tuple[tuple[str, ...], ...]:
        return tuple(tuple(str(a) for a in rank) for rank in self.executed)


def schedule_class(name: str):
    """torch's schedule class for a modelcut name (``1f1b``), a torch class name
    (``ScheduleDualPipeV``), torch's short name (``DualPipeV``), optionally ``torch:``-prefixed."""
    require_torch()
    from torch.distributed.pipelining import schedules as ts

    key = name.removeprefix("torch:")
    key = TORCH_CLASS.get(key, key)
    by_lower = {c.lower(): c for c in TORCH_CLASSES}
    cls_name = by_lower.get(key.lower()) or by_lower.get(f"schedule{key.lower()}")
    if cls_name is None:
        raise ModelcutError(f"unknown torch schedule {name!r}; choose one of {', '.join(TORCH_CLASSES)} "
                            f"or a modelcut name: {', '.join(TORCH_CLASS)}")
    return getattr(ts, cls_name)


def is_multi(cls) -> bool:
    require_torch()
    from torch.distributed.pipelining.schedules import PipelineScheduleMulti
    return issubclass(cls, PipelineScheduleMulti)


class _RecordingStage:
    """Stands in for a PipelineStage: no module, no communication; records each compute call."""

    def __init__(self, stage_index: int, num_stages: int, rank: int, group_size: int,
                 log: list[tuple[int, str, int]]):
        self.stage_index = stage_index
        self.num_stages = num_stages
        self.group_rank = rank
        self.group_size = group_size
        self.submod = None
        self.has_backward = False
        self.output_chunks: list = []
        self.stage_index_to_group_rank: dict[int, int] = {}
        self._log = log

    @property
    def is_first(self) -> bool:
        return self.stage_index == 0

    @property
    def is_last(self) -> bool:
        return self.stage_index == self.num_stages - 1

    def get_fwd_recv_ops(self, mb):
        return []

    get_fwd_send_ops = get_bwd_recv_ops = get_bwd_send_ops = get_fwd_recv_ops

    def forward_one_chunk(self, mb, *args, **kwargs):
        self._log.append((self.stage_index, "F", mb))

    def backward_one_chunk(self, mb, loss=None, full_backward=True, last_backward=False):
        self._log.append((self.stage_index, "B" if full_backward else "I", mb))

    def backward_weight_one_chunk(self, mb, last_backward=False):
        self._log.append((self.stage_index, "W", mb))

    def set_local_fwd_input(self, *args, **kwargs):
        pass

    set_local_bwd_input = perform_reduce_grad = clear_runtime_states = set_local_fwd_input

    def get_local_bwd_output(self, mb):
        return None


def _compute_only(actions) -> list:
    return [a for a in actions if a is not None and a.is_compute_op]


def _declared_str(a) -> str:
    if a.sub_actions is not None:
        return "(" + ";".join(str(s) for s in a.sub_actions) + ")"
    return str(a)


def _expand(actions) -> list[tuple[int, str, int, int]]:
    """(stage, kind, mb, group) for compute actions, OVERLAP_F_B opened into its sub-actions."""
    out = []
    for g, a in enumerate(actions):
        subs = a.sub_actions if a.sub_actions is not None else (a,)
        out += [(s.stage_index, s.computation_type.value, s.microbatch_index, g) for s in subs]
    return out


def _torch_error(cls, exc: Exception) -> ModelcutError:
    msg = " ".join(str(exc).split())
    return ModelcutError(f"torch {cls.__name__} refuses these sizes: {msg}")


def torch_order(name: str, p: int, m: int, v: int | None = None) -> TorchOrder:
    """Build torch's schedule ``name`` for p ranks, m micro-batches, v stages per rank and
    run its own step code against recording stages; return what each rank executes."""
    for label, val in (("devices p", p), ("micro-batches m", m)):
        if not isinstance(val, int) or val < 1:
            raise ModelcutError(f"{label} must be a positive integer, got {val!r}")
    cls = schedule_class(name)
    multi = is_multi(cls)
    if v is None:
        v = 2 if multi else 1
    if not isinstance(v, int) or v < 1:
        raise ModelcutError(f"chunks v must be a positive integer, got {v!r}")
    if not multi and v != 1:
        raise ModelcutError(f"torch {cls.__name__} runs one stage per rank (v = 1), got v = {v}")
    if multi and v < 2:
        raise ModelcutError(f"torch {cls.__name__} runs several stages per rank (v >= 2), got v = {v}")
    n_stages = p * v
    executed: list[tuple[TorchAction, ...]] = []
    declared: list[tuple[str, ...]] = []
    stage_rank: dict[int, int] = {}
    for rank in range(p):
        log: list[tuple[int, str, int]] = []
        if multi:
            stages = [_RecordingStage(rank + k * p, n_stages, rank, p, log) for k in range(v)]
            try:
                sched = cls(stages, m)
            except (ValueError, AssertionError, RuntimeError) as exc:
                raise _torch_error(cls, exc) from exc
            mapping = dict(sched.stage_index_to_group_rank)
            mine = sorted(s for s, r in mapping.items() if r == rank)
            for st, idx in zip(stages, mine):  # place the stand-ins where the class puts them
                st.stage_index = idx
                st.stage_index_to_group_rank = mapping
            sched._stages_forward_initialized = True   # skip metadata inference / p2p warm-up
            sched._stages_backward_initialized = False  # no loss_fn: has_backward is False
            plan = _expand(_compute_only(sched.pipeline_order_with_comms[rank]))
            declared.append(tuple(_declared_str(a) for a in _compute_only(sched.pipeline_order[rank])))
        else:
            stage = _RecordingStage(rank, n_stages, rank, p, log)
            try:
                sched = cls(stage, m)
            except (ValueError, AssertionError, RuntimeError) as exc:
                raise _torch_error(cls, exc) from exc
            mapping = {s: s for s in range(n_stages)}
            sched._stage_forward_initialized = True
            sched._stage_backward_initialized = False
            plan = None
            order = sched.pipeline_order or {}
            declared.append(tuple(_declared_str(a) for a in _compute_only(order.get(rank, []))))
        try:
            sched._step_microbatches()
        except (ValueError, AssertionError, RuntimeError, KeyError) as exc:
            raise _torch_error(cls, exc) from exc
        if plan is not None:
            if [(s, k, mb) for s, k, mb, _ in plan] != log:
                raise ModelcutError(f"torch {cls.__name__}: rank {rank} executed an order other than "
                                    "its pipeline_order_with_comms")
            acts = tuple(TorchAction(s, k, mb, g) for s, k, mb, g in plan)
        else:
            acts = tuple(TorchAction(s, k, mb, i) for i, (s, k, mb) in enumerate(log))
        executed.append(acts)
        stage_rank.update({s: r for s, r in mapping.items() if r == rank} if multi else {rank: rank})
    return TorchOrder(cls.__name__, p, m, v, tuple(executed), tuple(declared), stage_rank)


def to_schedule(order: TorchOrder, name: str | None = None) -> tuple[Schedule, list[list[tuple[int, int]]]]:
    """The torch order as a modelcut Schedule, and for each rank and torch action the
    (first, last) index of the modelcut ops it became (a full backward in a split
    schedule becomes B then W)."""
    split = order.split_backward
    orders: list[list[Op]] = []
    spans: list[list[tuple[int, int]]] = []
    for rank in order.executed:
        ops: list[Op] = []
        span = []
        for a in rank:
            first = len(ops)
            if a.kind == "F":
                ops.append(Op("F", a.microbatch, a.stage))
            elif a.kind == "I":
                ops.append(Op("B", a.microbatch, a.stage))
            elif a.kind == "W":
                ops.append(Op("W", a.microbatch, a.stage))
            else:  # full backward
                ops.append(Op("B", a.microbatch, a.stage))
                if split:
                    ops.append(Op("W", a.microbatch, a.stage))
            span.append((first, len(ops) - 1))
        orders.append(ops)
        spans.append(span)
    sched = Schedule(name or f"torch:{order.class_name}", order.devices, order.microbatches, order.chunks,
                     tuple(tuple(o) for o in orders))
    return sched, spans


def torch_schedule(class_name: str, p: int, m: int, v: int | None = None) -> Schedule:
    """torch's schedule ``class_name`` (e.g. ``ScheduleDualPipeV``) for p ranks, m
    micro-batches, v stages per rank, as the modelcut Schedule it executes; it simulates
    like any other (``modelcut.core.sim.engine.simulate``)."""
    return to_schedule(torch_order(class_name, p, m, v))[0]


def first_difference(ours: Schedule, theirs: Schedule) -> str | None:
    """None when both schedules have the same op lists, else the first difference, named."""
    split = ours.split_backward or theirs.split_backward
    if ours.devices != theirs.devices:
        return f"modelcut has {ours.devices} devices, torch {theirs.devices}"
    for d, (a, b) in enumerate(zip(ours.orders, theirs.orders)):
        for i, (x, y) in enumerate(zip(a, b)):
            if x != y:
                return (f"device {d}, action {i}: modelcut {format_action(x, split)}, "
                        f"torch {format_action(y, split)}")
        if len(a) != len(b):
            i = min(len(a), len(b))
            extra = a[i] if len(a) > len(b) else b[i]
            who = "modelcut" if len(a) > len(b) else "torch"
            return (f"device {d}, action {i}: only {who} has {format_action(extra, split)} "
                    f"(modelcut {len(a)} actions, torch {len(b)})")
    return None


def declared_difference(order: TorchOrder) -> str | None:
    """Where torch's declared ``pipeline_order`` departs from what it executes (None: nowhere)."""
    for r, (dec, ex) in enumerate(zip(order.declared, order.executed)):
        # Regroup the executed actions as declared (OVERLAP_F_B in parentheses).
        groups: dict[int, list[str]] = {}
        for a in ex:
            groups.setdefault(a.group, []).append(str(a))
        ex_groups = [g[0] if len(g) == 1 else "(" + ";".join(g) + ")" for g in groups.values()]
        for i, (x, y) in enumerate(zip(dec, ex_groups)):
            if x != y:
                return f"rank {r}, action {i}: declared {x}, executed {y}"
        if len(dec) != len(ex_groups):
            return f"rank {r}: declared {len(dec)} actions, executed {len(ex_groups)}"
    return None


def torch_round_size(p: int, m: int) -> int:
    """Micro-batches per round in torch's interleaved schedules: m // max(1, m // p)
    (``ScheduleInterleaved1F1B.__init__``: ``number_of_rounds = max(1, n_microbatches //
    pp_group_size)``, ``microbatches_per_round = n_microbatches // number_of_rounds``).
    modelcut's default group (Megatron-LM's) is p, which needs p | m; both agree then."""
    return m // max(1, m // p)


@dataclass
class OrderCheck:
    """modelcut's schedule against the order torch executes for the same sizes."""

    name: str
    class_name: str
    devices: int
    microbatches: int
    chunks: int
    matches: bool
    first_difference: str | None
    declared_difference: str | None
    modelcut: Schedule
    torch: Schedule
    order: TorchOrder
    note: str | None = None  # how modelcut's side was built, where not by its defaults


def check(name: str, p: int, m: int, v: int | None = None) -> OrderCheck:
    """Compare modelcut's schedule ``name`` (one of :data:`TORCH_CLASS`) with torch's."""
    if name not in TORCH_CLASS:
        raise ModelcutError(f"torch has no counterpart of modelcut schedule {name!r}; "
                            f"compare one of {', '.join(TORCH_CLASS)}")
    spec = registry.get(name)
    v = spec.default_chunks if v is None else v
    order = torch_order(TORCH_CLASS[name], p, m, v)
    note = None
    try:
        ours = spec.make(p, m, v)
    except ModelcutError as exc:
        if not spec.grouped:
            raise
        # Megatron-LM's groups of p need p | m; torch runs rounds of m // (m // p) instead.
        g = torch_round_size(p, m)
        ours = spec.make(p, m, v, group=g)
        note = (f"modelcut's default group of p = {p} refuses m = {m} ({exc}); compared with "
                f"group = {g}, torch's round size m // max(1, m // p)")
    theirs, _ = to_schedule(order)
    diff = first_difference(ours, theirs)
    return OrderCheck(name, order.class_name, p, m, v, diff is None, diff, declared_difference(order),
                      ours, theirs, order, note)
