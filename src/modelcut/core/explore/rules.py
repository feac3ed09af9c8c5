"""What a training stack can run: each preset's capabilities (catalog data,
``catalog/framework_rules.toml``, every field with its source) and the one check that says which
rule a layout breaks. The explorer ranks only layouts with no violation; ``explore --check`` of
one names the rule it breaks in one line. Pure: the capabilities are passed in."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from ..costs.context import CP_KINDS
from ..errors import ModelcutError
from ..sim import registry
from ..specs import RECOMPUTE_VARIANTS, ModelSpec

#: How chunks may split the layers (``Capabilities.interleave``).
INTERLEAVE = ("layers", "layers+2", "any")
#: The fields of a stack's capabilities (the TOML's keys besides ``framework``, ``base``, ``sources``).
FIELDS = ("zero", "zero_with_pipeline", "zero0_flat_mesh_only", "hybrid_shard", "schedules", "context_parallel", "cp_kinds",
          "cp_window_kinds", "cp_seq_multiple_tp", "sequence_parallel", "mixture_of_experts", "expert_parallel", "ep_with_tp_needs_sp",
          "moe_tensor_parallel", "interleave", "interleave_min_pp", "uneven_split", "local_batch", "recompute")


@dataclass(frozen=True)
class Capabilities:
    """What one stack runs (``catalog/framework_rules.toml``'s header says what each field means).

    ``zero``: ZeRO stages; ``zero_with_pipeline``: those allowed with pp > 1;
    ``zero0_flat_mesh_only``: plain data parallelism only without tp, cp, pp; ``hybrid_shard``:
    ZeRO's states sharded over part of the data-parallel group and replicated across the rest
    (:attr:`..specs.Layout.dp_shard`); ``schedules``: the
    registry's schedules with pp > 1; ``context_parallel`` and its ``cp_kinds``; ``cp_window_kinds``:
    the forms it runs for a model with sliding-window layers (None: no restriction known);
    ``cp_seq_multiple_tp``: the sequence splits into 2·cp·tp pieces; ``sequence_parallel``;
    ``mixture_of_experts``, ``expert_parallel``, ``ep_with_tp_needs_sp``, ``moe_tensor_parallel``
    (tp > 1 on a mixture-of-experts model); ``interleave``
    (:data:`INTERLEAVE`) and ``interleave_min_pp`` for v > 1; ``uneven_split``: a last pipeline
    rank given its own layer count (:attr:`..specs.Layout.last_layers`); ``local_batch``: with a
    pipeline, the schedule run once per local batch, gradients accumulated over the runs
    (:attr:`..specs.Training.local_batch`; otherwise one schedule a step over every micro-batch); ``recompute`` variants
    (:data:`..specs.RECOMPUTE_VARIANTS`: the levels and selective recomputation's module lists). ``sources``:
    field -> where it was read."""

    framework: str
    zero: tuple[int, ...] = (0, 1, 2, 3)
    zero_with_pipeline: tuple[int, ...] = (0, 1, 2, 3)
    zero0_flat_mesh_only: bool = False
    hybrid_shard: bool = True
    schedules: tuple[str, ...] = ()
    context_parallel: bool = True
    cp_kinds: tuple[str, ...] = ("ring", "allgather")
    cp_window_kinds: tuple[str, ...] | None = None
    cp_seq_multiple_tp: bool = False
    sequence_parallel: bool = True
    mixture_of_experts: bool = True
    expert_parallel: bool = True
    ep_with_tp_needs_sp: bool = False
    moe_tensor_parallel: bool = True
    interleave: str = "any"
    interleave_min_pp: int = 2
    uneven_split: bool = False
    local_batch: bool = False
    recompute: tuple[str, ...] = RECOMPUTE_VARIANTS
    sources: dict[str, str] = field(default_factory=dict, compare=False, hash=False)

    def __post_init__(self) -> None:
        where = f"framework rules {self.framework!r}"
        for z in self.zero + self.zero_with_pipeline:
            if z not in (0, 1, 2, 3):
                raise ModelcutError(f"{where}: ZeRO stages are 0-3, got {z!r}")
        for s in self.schedules:
            registry.get(s)
        if self.interleave not in INTERLEAVE:
            raise ModelcutError(f"{where}: interleave must be one of {', '.join(INTERLEAVE)}, got {self.interleave!r}")
        for r in self.recompute:
            if r not in RECOMPUTE_VARIANTS:
                raise ModelcutError(f"{where}: recompute variants are {', '.join(RECOMPUTE_VARIANTS)}, got {r!r}")
        for k in self.cp_kinds + (self.cp_window_kinds or ()):
            if k not in CP_KINDS:
                raise ModelcutError(f"{where}: cp_kinds are {', '.join(CP_KINDS)}, got {k!r}")

    def source(self, name: str) -> str:
        return self.sources.get(name, "")


@dataclass(frozen=True)
class Violation:
    """One broken rule: the capability (``rule``), what the layout does that the stack does not
    (``message``), and where the rule was read (``source``)."""

    framework: str
    rule: str
    message: str
    source: str

    def line(self) -> str:
        """The violation in one line."""
        return f"{self.framework} cannot run it: {self.message} (rule {self.rule}: {self.source})"

    def as_dict(self) -> dict[str, str]:
        return {"framework": self.framework, "rule": self.rule, "message": self.message, "source": self.source,
                "text": self.line()}


def violations(caps: Capabilities, model: ModelSpec, *, tp: int = 1, cp: int = 1, pp: int = 1, dp: int = 1,
               ep: int = 1, vpp: int = 1, schedule: str | None = None, cp_kind: str | None = None,
               seq: int | None = None, sequence_parallel: bool | None = None, zero: int | None = None,
               recompute: str | None = None, dp_shard: int | None = None,
               first_layers: int | None = None, last_layers: int | None = None,
               local_batch: int | None = None) -> list[Violation]:
    """Every rule of ``caps`` the layout breaks, in the order of :data:`FIELDS` (empty: the stack
    runs it). Knobs left None are not checked (the explorer checks a structure before its
    recomputation and ZeRO variants)."""
    out: list[Violation] = []

    def bad(rule: str, message: str) -> None:
        out.append(Violation(caps.framework, rule, message, caps.source(rule)))

    if zero is not None:
        if zero not in caps.zero:
            bad("zero", f"ZeRO-{zero} (it runs {_list(caps.zero, 'ZeRO-')})")
        elif pp > 1 and zero not in caps.zero_with_pipeline:
            bad("zero_with_pipeline", f"ZeRO-{zero} with pp = {pp} (with a pipeline it runs "
                                      f"{_list(caps.zero_with_pipeline, 'ZeRO-') or 'no ZeRO stage'})")
        elif zero == 0 and caps.zero0_flat_mesh_only and dp * cp > 1 and (tp > 1 or cp > 1 or pp > 1):
            # with cp > 1 the stack shards over the cp ranks whatever dp is (torchtitan v0.2.2
            # parallel_dims.py: fsdp_enabled = dp_shard > 1 or cp > 1)
            bad("zero0_flat_mesh_only", "plain data parallelism (ZeRO-0) together with tp, cp or pp")
    if dp_shard is not None and dp_shard < dp and not caps.hybrid_shard:
        bad("hybrid_shard", f"hybrid sharding (dp_shard {dp_shard} of dp {dp})")
    if pp > 1 and schedule is not None and schedule not in caps.schedules:
        bad("schedules", f"the {schedule} schedule (it runs {', '.join(caps.schedules) or 'none'})")
    if cp > 1:
        if not caps.context_parallel:
            bad("context_parallel", f"context parallelism (cp = {cp})")
        elif cp_kind is not None and cp_kind not in caps.cp_kinds:
            bad("cp_kinds", f"the {cp_kind} form of context parallelism (it runs {', '.join(caps.cp_kinds)})")
        elif (cp_kind is not None and caps.cp_window_kinds is not None and model.sliding_layers
              and cp_kind not in caps.cp_window_kinds):
            bad("cp_window_kinds", f"the {cp_kind} form of context parallelism on a model with sliding-window "
                                   f"layers (with a window it runs {', '.join(caps.cp_window_kinds) or 'none'})")
        elif caps.cp_seq_multiple_tp and seq is not None and seq % (2 * cp * tp):
            bad("cp_seq_multiple_tp", f"a sequence of {seq} not divisible by 2·cp·tp = {2 * cp * tp}")
    if tp > 1 and sequence_parallel and not caps.sequence_parallel:
        bad("sequence_parallel", "sequence parallelism")
    if model.is_moe and not caps.mixture_of_experts:
        bad("mixture_of_experts", "a mixture-of-experts model")
    elif model.is_moe and tp > 1 and not caps.moe_tensor_parallel:
        bad("moe_tensor_parallel", f"tensor parallelism (tp = {tp}) on a mixture-of-experts model")
    elif ep > 1:
        if not caps.expert_parallel:
            bad("expert_parallel", f"expert parallelism (ep = {ep})")
        elif caps.ep_with_tp_needs_sp and tp > 1 and sequence_parallel is False:
            bad("ep_with_tp_needs_sp", "ep > 1 with tp > 1 without sequence parallelism")
    if pp > 1 and vpp > 1:
        if pp < caps.interleave_min_pp:
            bad("interleave_min_pp", f"{vpp} chunks per device with pp = {pp} (interleaving needs pp ≥ "
                                     f"{caps.interleave_min_pp})")
        else:
            stages, l = pp * vpp, model.layers
            even = l % stages == 0 or (caps.interleave == "layers+2" and (l + 2) % stages == 0)
            if caps.interleave != "any" and not even:
                what = f"{l} layers" + (f" (or {l} + 2 with the embedding and the loss)" if caps.interleave ==
                                        "layers+2" else "")
                bad("interleave", f"pp·v = {stages} chunks that do not divide {what}")
    if pp > 1 and (first_layers is not None or last_layers is not None) and not caps.uneven_split:
        ends = ", ".join(f"{n} layers on the {end} rank" for end, n in (("first", first_layers), ("last", last_layers))
                         if n is not None)
        bad("uneven_split", f"an uneven pipeline split ({ends})")
    if pp > 1 and local_batch is not None and not caps.local_batch:
        bad("local_batch", f"a local batch of {local_batch} (its pipeline schedule runs once a step, over every "
                           "micro-batch)")
    if recompute is not None and recompute not in caps.recompute:
        bad("recompute", f"{recompute} recomputation (it offers {', '.join(caps.recompute)})")
    return out


def _list(xs: tuple[int, ...], prefix: str) -> str:
    return ", ".join(f"{prefix}{x}" for x in xs)


def from_table(name: str, row: dict[str, Any], base: Capabilities | None = None,
               sources: dict[str, str] | None = None) -> Capabilities:
    """Capabilities from one table of data (the catalog's loader passes each ``[[stack]]``):
    ``base``'s fields where the row names none."""
    unknown = set(row) - set(FIELDS)
    if unknown:
        raise ModelcutError(f"framework rules {name!r}: unknown field {sorted(unknown)[0]!r}")
    kw: dict[str, Any] = {}
    if base is not None:
        kw = {f: getattr(base, f) for f in FIELDS}
        kw["sources"] = dict(base.sources)
    for k, v in row.items():
        kw[k] = tuple(v) if isinstance(v, list) else v
    kw.setdefault("sources", {})
    kw["sources"] = {**kw["sources"], **(sources or {})}
    caps = Capabilities(framework=name, **kw)
    missing = [f for f in FIELDS if f in row and not caps.source(f)]
    if missing:
        raise ModelcutError(f"framework rules {name!r}: field {missing[0]!r} has no source")
    return caps
