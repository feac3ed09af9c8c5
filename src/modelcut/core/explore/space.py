"""What the explorer enumerates: every (t, c, e, p, d, b, schedule, v, form) that divides the GPUs,
the heads, the sequence and the batch (the package docstring, **Space**); the hierarchical form of
context parallelism with one all-to-all group size, the cp ranks a node holds or the largest part of
them that cuts the heads (:func:`hierarchical_a2a`)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Iterator

from ..costs import flops
from ..costs.context import CP_KINDS, heads_split_problem
from ..costs.mesh import Mesh, group_crosses_nodes, members_in_node
from ..plan import lighter_last
from ..sim import registry
from ..specs import DEFAULT_ORDER, RECOMPUTE_VARIANTS, Layout, ModelSpec, Run, Training, partial_training, recompute_variant

RECOMPUTE_ORDER = RECOMPUTE_VARIANTS   # the explorer tries them least recomputed first
ZERO_ORDER = (0, 1, 2, 3)
#: The schedules searched unless the caller names others (the registry's ``explored_by_default``).
DEFAULT_SCHEDULES = registry.explored_by_default()


@dataclass(frozen=True)
class Space:
    """What the explorer enumerates (module docstring)."""

    micro_batches: tuple[int, ...] = (1, 2, 4)
    schedules: tuple[str, ...] = DEFAULT_SCHEDULES
    recomputes: tuple[str, ...] = RECOMPUTE_ORDER
    zeros: tuple[int, ...] = ZERO_ORDER
    allow_tp_across_nodes: bool = False
    min_tokens_per_cp_rank: int = 1024
    balanced_vpp_only: bool | None = None    # interleaved chunks only where p·v divides the layers; False: unequal
    #                                           ones too where no equal split exists at that depth (chunk_counts);
    #                                           None: the caller's default (the core: equal only; the service: False
    #                                           where the stack splits freely)
    eps: tuple[int, ...] | None = None       # None: every divisor of the experts dividing d
    expert_tp_one: bool = True                # with t > 1 on an MoE model, ep groups over tp ranks (etp 1)
    default_etp: int | None = None            # the stack's experts' tensor parallelism (Framework.default_etp)
    cp_kinds: tuple[str, ...] = CP_KINDS      # tried when c > 1
    precision: str = "bf16"                   # the products' precision of every layout searched
    fp8_recipe: str | None = None             # with fp8: the recipe (None: the stack's choice)
    grad_reduce: str | None = None            # the gradients' reduce type (None: the stack's; ..specs.GRAD_REDUCE_DTYPES)
    fp8_param_gather: bool | None = None      # with fp8: the weights kept and gathered in FP8 (None: the stack's)
    attention: str | None = None              # the attention kernel (None: the stack's; ..specs.ATTENTION_KINDS)
    cross_entropy: str | None = None          # the loss's kernel (None: the stack's; ..specs.CROSS_ENTROPY_KINDS)
    act_fp8_input: bool = False               # the SwiGLU's input kept in FP8 (..specs.Training's
    #                                           activation_func_fp8_input_store)
    adam_moments: str | None = None           # Adam's moments' type (None: the stack's; ..specs.ADAM_MOMENT_DTYPES)
    order: tuple[str, ...] = DEFAULT_ORDER    # the rank order of every layout searched
    hybrid_shard: bool = True                 # also shard ZeRO's states within a node (node_shard)
    uneven_split: bool | None = None          # also a lighter last pipeline rank (..plan.lighter_last);
    #                                           None: the caller's default (the service: where the stack takes one)
    local_batch: int | None = None            # with a pipeline, sequences a data-parallel rank puts through one
    #                                           schedule run (..specs.Training.local_batch); layouts with p > 1
    #                                           whose dp·local_batch does not divide the batch, or whose
    #                                           micro-batch does not divide it, are not searched; None: one run


@dataclass(frozen=True)
class Structure:
    tp: int
    cp: int
    pp: int
    dp: int
    micro_batch: int
    schedule: str
    vpp: int
    ep: int = 1
    cp_kind: str = "allgather"   # Layout's default; the form only matters when cp > 1
    etp: int | None = None       # expert tensor parallelism (None: tp, Megatron-core's default)
    dp_shard: int | None = None  # hybrid sharding's shard group (None: the whole of dp)
    cp_a2a: int | None = None    # the a2a+p2p form's all-to-all groups' size (:func:`hierarchical_a2a`)
    last_layers: int | None = None  # a lighter last pipeline rank's layers (None: the even split)

    @property
    def expert_tp(self) -> int:
        return self.etp or self.tp


def recompute_choices(model: ModelSpec, space: "Space") -> list[str]:
    """The recomputation variants tried for a model, least recomputed first: a module list only on
    a mixture-of-experts model (on a dense one ``layernorm`` and ``moe_act`` recompute nothing, the
    input norm being fused into the QKV product); the stack's rules then keep what it offers."""
    return [r for r in RECOMPUTE_ORDER if r in space.recomputes
            and (model.is_moe or recompute_variant(r)[1] is None)]


def divisors(n: int) -> list[int]:
    small, large = [], []
    i = 1
    while i * i <= n:
        if n % i == 0:
            small.append(i)
            if i * i != n:
                large.append(n // i)
        i += 1
    return small + large[::-1]


def tp_ok(model: ModelSpec, t: int) -> bool:
    """t divides the heads and the MLP width (and an MoE model's expert width: expert tensor
    parallelism is t); t and the KV heads divide one another."""
    return (model.heads % t == 0 and model.ffn_hidden % t == 0
            and (model.kv_heads % t == 0 or t % model.kv_heads == 0)
            and (not model.is_moe or flops.expert_width(model) % t == 0))


def ep_choices(model: ModelSpec, d: int, space: "Space", t: int = 1) -> list[tuple[int, int | None]]:
    """(ep, etp) pairs for t tensor- and d data-parallel ranks: (1, None) for a dense model;
    otherwise each divisor e of the experts that divides d with the experts cut over tp (etp
    None: tp), and, with t > 1 (``space.expert_tp_one``), each divisor e of the experts that
    divides t·d but not d with the experts whole (etp 1): an ep group larger than the
    data-parallel ranks hold, which Megatron-core's expert grid lays over the tensor-parallel
    ranks first (:func:`..costs.mesh.expert_mesh`; Megatron-Bridge's Qwen3 235B recipe: tp 2,
    ep 32 over dp 16). etp 1 beside an ep that d holds is not searched (it would add a variant to
    every MoE layout with tp > 1); a layout names it. On a stack whose experts are whole by
    default (``space.default_etp`` 1: torchtitan, NeMo AutoModel) every divisor e of the experts
    that divides t·d comes with etp 1, as the stack runs it. ``space.eps`` narrows e."""
    if not model.is_moe:
        return [(1, None)]
    pick = [e for e in divisors(model.experts) if space.eps is None or e in space.eps]
    if t > 1 and space.default_etp == 1:
        return [(e, None if e == 1 else 1) for e in pick if (t * d) % e == 0]
    out: list[tuple[int, int | None]] = [(e, None) for e in pick if d % e == 0]
    if t > 1 and space.expert_tp_one:
        out += [(e, 1) for e in pick if d % e and (t * d) % e == 0]
    return out


def vpp_choices(model: ModelSpec, p: int, schedule: str, m: int, balanced_only: bool = True) -> list[int]:
    """Chunks per device the explorer tries for a schedule (the registry's
    :attr:`~..sim.registry.ScheduleSpec.chunk_choices`: 1 for one-chunk schedules, 2 for the V
    schedules where they fit, and for the interleaved schedule every v ≥ 2 with p·v ≤ l + 2 and m
    a multiple of p, only those where p·v divides l or l + 2 when ``balanced_only``)."""
    return registry.get(schedule).chunk_choices(p, m, model.layers, balanced_only)


def chunk_counts(model: ModelSpec, p: int, schedule: str, m: int, balanced_only: bool | None) -> list[int]:
    """The chunk counts the search tries at pipeline depth p: :func:`vpp_choices`' equal splits,
    and where ``balanced_only`` is False and the layers split evenly for no chunk count at this
    depth (DeepSeek-V3's 61 over 4 stages), its unequal ones (the chunks one layer apart): a stack
    that splits freely runs them where nothing else interleaves, and a search over every unequal
    count where equal ones exist would hold about three times the layouts."""
    even = vpp_choices(model, p, schedule, m, True)
    return even if balanced_only is not False or even else vpp_choices(model, p, schedule, m, False)


def node_shard(t: int, c: int, p: int, d: int, gpus_per_node: int, order: tuple[str, ...] = DEFAULT_ORDER) -> int | None:
    """Hybrid sharding's shard group as practitioners lay it (FSDP's ``HYBRID_SHARD`` shards within
    a node and replicates across nodes; torchtitan's HSDP over a node's GPUs): the data-parallel
    ranks one node holds, where the data-parallel group leaves the node and more than one of its
    ranks share one, else None."""
    k = members_in_node(Mesh.build(tp=t, cp=c, pp=p, dp=d, order=order), "dp", gpus_per_node)
    return k if 1 < k < d and d % k == 0 else None


def hierarchical_a2a(model: ModelSpec, t: int, c: int, p: int, d: int, gpus_per_node: int,
                     order: tuple[str, ...] = DEFAULT_ORDER) -> int | None:
    """The all-to-all groups' size the explorer gives the hierarchical form (a2a+p2p): the cp
    ranks one node holds, so that the all-to-all runs over the node's links and the ring over the
    network between nodes, as Megatron-LM's hierarchical context parallelism is meant to be laid
    (``--hierarchical-context-parallel-sizes``: the all-to-all over adjacent cp ranks, "a2a+p2p":
    all-to-all inside a node, point-to-point across; core_v0.19.0 arguments.py and
    parallel_state.py ``create_hierarchical_groups``). Where those ranks do not cut the heads
    (:func:`..costs.context.heads_split_problem`: Qwen3-30B-A3B's 4 KV heads over a node's 8), the
    largest divisor of them that does and that divides c: the all-to-all then stays inside the
    node, and the ring runs partly over the node's links, partly over the network. None where no
    such size above 1 exists, or where the cp group lies inside one node: there is no hierarchy
    to run, and the all-to-all and ring forms cover it."""
    node = members_in_node(Mesh.build(tp=t, cp=c, pp=p, dp=d, order=order), "cp", gpus_per_node)
    if node >= c:
        return None
    for a in range(node, 1, -1):
        if node % a == 0 and c % a == 0 and heads_split_problem(model, t, a, "a2a+p2p") is None:
            return a
    return None


def cp_forms(model: ModelSpec, t: int, c: int, p: int, d: int, gpus_per_node: int,
             space: "Space") -> tuple[tuple[str, int | None], ...]:
    """(form, all-to-all groups' size) pairs tried for a layout: every form of ``space.cp_kinds``
    that cuts the model's heads, the hierarchical one with :func:`hierarchical_a2a`'s group; with
    c = 1 the layouts' default form alone."""
    if c == 1:
        return (("allgather", None),)
    out: list[tuple[str, int | None]] = []
    for k in space.cp_kinds:
        if k == "a2a" and heads_split_problem(model, t, c) is not None:
            continue
        a = hierarchical_a2a(model, t, c, p, d, gpus_per_node, space.order) if k == "a2a+p2p" else None
        if k == "a2a+p2p" and a is None:
            continue
        out.append((k, a))
    return tuple(out)


def structures(model: ModelSpec, gpus: int, seq: int, global_batch: int, gpus_per_node: int,
               space: Space = Space()) -> Iterator[Structure]:
    """Every (t, c, e, p, d, b, schedule, v, form) with t·c·p·d = gpus (module docstring); without
    a pipeline only the registry's one-stage default is tried. With ``space.hybrid_shard``, a dense
    model's layout whose data-parallel group leaves a node comes twice: sharded over the whole
    group, and with its ZeRO states sharded within a node and replicated across nodes
    (:func:`node_shard`). With ``space.uneven_split``, a layout with a pipeline comes twice where
    a lighter last rank balances the output layer (:func:`..plan.lighter_last`): with the even split,
    and with that rank's layers (Megatron-core's ``num_layers_in_last_pipeline_stage``)."""
    single = registry.default_schedule(1)
    for t in divisors(gpus):
        if not tp_ok(model, t):
            continue
        tp_mesh = Mesh.build(tp=t, dp=gpus // t, order=space.order)
        if not space.allow_tp_across_nodes and group_crosses_nodes(tp_mesh, "tp", gpus_per_node):
            continue
        for c in divisors(gpus // t):
            if c > 1 and (seq % (2 * c) or seq // c < space.min_tokens_per_cp_rank):
                continue
            for p in divisors(gpus // (t * c)):
                if p > model.layers:
                    continue
                d = gpus // (t * c * p)
                if global_batch % d:
                    continue
                kinds = cp_forms(model, t, c, p, d, gpus_per_node, space)
                shard = node_shard(t, c, p, d, gpus_per_node, space.order) if space.hybrid_shard else None
                for e, et in ep_choices(model, d, space, t):
                    shards = (None, shard) if shard is not None and e == 1 else (None,)
                    for b in space.micro_batches:
                        if (global_batch // d) % b:
                            continue
                        lb = local_batch_of(space, p)
                        if lb is not None and (global_batch % (d * lb) or lb % b):
                            continue
                        m = (lb if lb is not None else global_batch // d) // b   # micro-batches a schedule run
                        for sched in space.schedules:
                            if p == 1 and registry.get(sched) is not single:
                                continue
                            for v in chunk_counts(model, p, sched, m, space.balanced_vpp_only):
                                lasts: tuple[int | None, ...] = (None,)
                                if space.uneven_split and p > 1 and registry.get(sched).placement != "v":
                                    n = lighter_last(model, p, v, seq)
                                    lasts = (None, n) if n is not None else lasts
                                for kind, a in kinds:
                                    for sh in shards:
                                        for n in lasts:
                                            yield Structure(t, c, p, d, b, sched, v, e, kind, et, sh, a, n)


def local_batch_of(space: Space, p: int) -> int | None:
    """The local batch a layout of pipeline depth p runs with: ``space.local_batch`` with a
    pipeline, none without one (a stack without a pipeline accumulates micro-batches, not runs)."""
    return space.local_batch if p > 1 else None


def make_run(model: ModelSpec, gpu: str, s: Structure, seq: int, global_batch: int, recompute: str, zero: int,
             gpus_per_node: int | None = None, sequence_parallel: bool = True, precision: str = "bf16",
             fp8_recipe: str | None = None, order: tuple[str, ...] = DEFAULT_ORDER,
             count: int = 1, grad_reduce: str | None = None, fp8_param_gather: bool | None = None,
             attention: str | None = None, cross_entropy: str | None = None, local_batch: int | None = None,
             act_fp8_input: bool = False, adam_moments: str | None = None) -> Run:
    """The run of one layout under a recomputation variant (:func:`..specs.recompute_variant`):
    sequence parallelism with t > 1 (where the stack has it,
    ``sequence_parallel``); the rank order ``order``, by default the layouts' default,
    Megatron-core's (ep next to tp and cp, the pipeline outermost: :data:`..specs.DEFAULT_ORDER`);
    under :data:`..specs.BLOCKS` the first ``count`` layers of each chunk recomputed whole, under
    :data:`..specs.EVERY` one layer in ``count`` on each rank (:func:`..specs.partial_training`);
    ``local_batch``: the sequences a data-parallel rank puts through one schedule run (:func:`local_batch_of`);
    ``act_fp8_input`` and ``adam_moments``: the memory settings of :class:`..specs.Training` of those names
    (``activation_func_fp8_input_store``), the same for every layout."""
    lay = Layout(tp=s.tp, cp=s.cp, pp=s.pp, dp=s.dp, ep=s.ep, etp=s.etp, vpp=s.vpp, sequence_parallel=s.tp > 1 and sequence_parallel,
                 zero=zero,
                 schedule=s.schedule, cp_kind=s.cp_kind, cp_a2a=s.cp_a2a, order=order, dp_shard=s.dp_shard,
                 last_layers=s.last_layers)
    level, modules = recompute_variant(recompute)
    return Run(model, gpu, lay, Training(seq_len=seq, global_batch=global_batch, micro_batch=s.micro_batch,
                                         recompute=level, recompute_modules=modules, precision=precision,
                                         fp8_recipe=fp8_recipe, grad_reduce=grad_reduce,
                                         fp8_param_gather=fp8_param_gather, attention=attention,
                                         cross_entropy=cross_entropy, local_batch=local_batch,
                                         activation_func_fp8_input_store=act_fp8_input, adam_moments=adam_moments,
                                         **partial_training(recompute, count)),
               gpus_per_node=gpus_per_node)
