"""Mixture-of-experts layers: their work, their all-to-alls and how their weights are cut.

An MoE layer (GShard, Lepikhin et al. 2020, arXiv 2006.16668 §2; Switch Transformers, Fedus et
al. 2021, arXiv 2101.03961 §2) replaces the MLP by E routed experts, each an MLP of width
f_e (``expert_ffn_hidden``), a router (an h × E linear layer) sending each token to its top_k
experts, and optionally ``shared_experts`` experts every token passes through (DeepSeekMoE, Dai
et al. 2024, arXiv 2401.06066 §3.2). Models may keep their first ``dense_layers`` layers dense
(DeepSeek-V3: 3, arXiv 2412.19437 §4.2).

**Work.** FLOPs count active parameters: a token passes through top_k + shared experts and the
router (:func:`.flops.layer_matmul_params`), so model FLOPs are 6 × active parameters per token
plus attention (:mod:`.flops`). The *executed* expert work on a device differs: with expert
parallelism over ``ep`` ranks each holds E/ep experts and receives the tokens routed to them.

* Tokens: the functions take the micro-batch's tokens on one context-parallel rank, b·s/cp (what
  the tensor-parallel group's dense MLP sees). Megatron-LM requires sequence parallelism for an
  MoE model with t > 1 (megatron/training/arguments.py: "When using MoE and tensor parallelism,
  sequence parallelism must be used"), so each tensor-parallel rank routes its own share,
  T = b·s/(cp·t): the set its token dispatcher sends.
* Routed rows: each token goes to top_k experts, so a rank sends T·top_k rows and, on average,
  receives as many. The ``imbalance`` factor (≥ 1) is the busiest rank's received rows over the
  mean: the busiest expert (device) sets the pace of both the all-to-all and the expert GEMMs.
* Capacity factor C (GShard §2.2; Switch §2.2): each expert's buffer holds C·(tokens·top_k/E)
  rows, padded; tokens beyond it are dropped. With C set, every rank sends and computes exactly
  C·T·top_k rows whatever the imbalance; without it (dropless, Megatron-LM's default) the
  busiest rank computes imbalance·T·top_k rows.
* Expert tensor parallelism (etp, Megatron-LM's ``--expert-tensor-parallel-size``): each expert's
  width is split over etp ranks, which first all-gather the rows they received (so each sees
  etp times as many) and reduce-scatter the outputs: the FLOPs per device do not change with
  etp, the GEMM shapes do, and two etp collectives of the received rows are added.

**All-to-all.** Per MoE layer per micro-batch: dispatch and combine in the forward, and their
transposes in the backward (the gradient of a combine is a dispatch and vice versa), four
all-to-alls over the ep group, each moving rows·h values per rank (Lepikhin et al. §3.2: "two
all-to-all per MoE layer" forward). A full recomputation repeats the forward's two. DeepSeek-V3
dispatches in FP8 and combines in BF16 (arXiv 2412.19437 §3.3.2; ``dispatch_bytes``).

**Shared experts beside the all-to-all** (:func:`shared_overlap_saving`). A stack may run the
shared experts on a second stream while the routed path dispatches, computes and combines
(NeMo AutoModel: ``MoE.forward`` launches them on ``_shared_experts_stream`` "to overlap compute
with the communication for grouped experts", NVIDIA-NeMo/Automodel 037e04a
nemo_automodel/components/moe/layers.py; their backward runs on the same stream). While an
all-to-all of A seconds holds ``comm_sms`` of the device's SMs, the shared products (S seconds
alone) run on the rest: they finish inside it when S ≤ A·(1 − comm_sms/SMs), else the remainder
runs after it at full speed. The pass saves min(S, A·(1 − comm_sms/SMs)); against the routed
experts' own products the two streams share the SMs and nothing is saved.

**Weights.** Routed experts are cut over ep·etp ranks (E/ep experts per rank, width f_e/etp),
shared experts and the router like the dense MLP (shared over t, the router replicated).
Expert gradients are reduced over the expert-data-parallel group, tp·cp·dp/(ep·etp) ranks
(Megatron-LM's expert data parallelism).
"""

from __future__ import annotations

from dataclasses import dataclass

from . import comm, flops, mesh
from ..errors import ModelcutError
from ..specs import Layout, ModelSpec
from ..units import BF16_BYTES

#: Bytes per element of BF16 activations on the wire.
BYTES = BF16_BYTES


@dataclass(frozen=True)
class Gemm:
    """``count`` matrix products of (m × k) · (k × n) on one device: 2·m·n·k FLOPs each."""

    name: str
    m: float
    n: int
    k: int
    count: int = 1

    @property
    def flops(self) -> float:
        return 2.0 * self.m * self.n * self.k * self.count


def _pos(name: str, x, integer: bool = True) -> None:
    if integer and (isinstance(x, bool) or not isinstance(x, int) or x < 1):
        raise ModelcutError(f"{name} must be a positive integer, got {x!r}")
    if not integer and (isinstance(x, bool) or not isinstance(x, (int, float)) or not x > 0):
        raise ModelcutError(f"{name} must be a positive number, got {x!r}")


def check_moe_layout(model: ModelSpec, layout: Layout) -> None:
    """Refuse an expert layout no framework would start, in one line: ep needs experts and must
    divide them; ep·etp must divide each pipeline stage's tp·cp·dp ranks, over which the expert
    grid lays them (:func:`.mesh.expert_mesh`; with another rank order the ep group is carved from
    the data-parallel ranks, and ep must divide dp); etp must divide the expert width."""
    ep, etp = layout.ep, layout.etp or layout.tp
    if ep > 1 and not model.is_moe:
        raise ModelcutError(f"ep ({ep}) needs a mixture-of-experts model; {model.name or 'the model'} is dense")
    if model.is_moe:
        if model.experts % ep:
            raise ModelcutError(f"ep ({ep}) must divide the experts ({model.experts})")
        mesh.check_expert_groups(layout)
        if flops.expert_width(model) % etp:
            raise ModelcutError(f"etp ({etp}) must divide expert_ffn_hidden ({flops.expert_width(model)})")
        if model.shared_experts and flops.expert_width(model) % layout.tp:
            raise ModelcutError(f"tp ({layout.tp}) must divide the shared experts' width "
                                f"({flops.expert_width(model)})")
    if model.capacity_factor is not None and not model.capacity_factor > 0:
        raise ModelcutError(f"capacity_factor must be positive, got {model.capacity_factor}")


def routed_rows(model: ModelSpec, tokens: float, imbalance: float = 1.0,
                capacity_factor: float | None = None) -> float:
    """Rows the busiest rank's experts process (and its all-to-all receives) for ``tokens``
    routed per rank: C·T·top_k with a capacity factor C (padded buffers), else
    imbalance·T·top_k (module docstring)."""
    _pos("imbalance", imbalance, integer=False)
    if imbalance < 1:
        raise ModelcutError(f"imbalance is the busiest rank's load over the mean, at least 1, got {imbalance}")
    if tokens < 0:
        raise ModelcutError(f"tokens must be non-negative, got {tokens}")
    cf = model.capacity_factor if capacity_factor is None else capacity_factor
    if cf is not None:
        _pos("capacity_factor", cf, integer=False)
        return cf * tokens * model.top_k
    return imbalance * tokens * model.top_k


def mlp_gemms(model: ModelSpec, rows: float, width: int, split: int, name: str, count: int = 1) -> tuple[Gemm, ...]:
    """Forward GEMMs of ``count`` MLPs of inner width ``width`` split over ``split`` ranks on
    ``rows`` tokens: gated (SwiGLU) [rows, h] × [h, 2·width/split] then [rows, width/split] ×
    [width/split, h]; ungated one input projection of width/split. Shapes (m, n, k)."""
    _pos("split", split)
    if width % split:
        raise ModelcutError(f"{split} ranks cannot split an MLP of width {width}")
    w = width // split
    h = model.hidden
    up = Gemm(f"{name} up", rows, flops.mlp_inputs(model) * w, h, count)
    down = Gemm(f"{name} down", rows, h, w, count)
    return up, down


def moe_gemms(model: ModelSpec, tokens: float, *, tp: int = 1, ep: int = 1, etp: int | None = None,
              imbalance: float = 1.0, capacity_factor: float | None = None) -> tuple[Gemm, ...]:
    """Forward GEMMs of one MoE layer on the busiest device, ``tokens`` = b·s/cp (module
    docstring): the router [T, h] × [h, E] on the rank's T = tokens/tp (none with one expert),
    the E/ep local experts as a grouped product of etp·rows/(E/ep) rows each at width f_e/etp
    (rows: :func:`routed_rows` of T), and the shared experts on all ``tokens`` at width f_e/tp,
    the dense MLP's cut. ``etp`` defaults to tp.

    With E = 1, top_k = 1, ep = 1, etp = tp and no shared expert this is :func:`dense_mlp_gemms`
    of an MLP of width f_e, exactly."""
    etp = etp or tp
    for n, x in (("ep", ep), ("etp", etp), ("tp", tp)):
        _pos(n, x)
    if model.experts % ep:
        raise ModelcutError(f"ep ({ep}) must divide the experts ({model.experts})")
    local = model.experts // ep
    T = tokens / tp
    rows = routed_rows(model, T, imbalance, capacity_factor) * etp
    f = flops.expert_width(model)
    out: list[Gemm] = []
    if flops.router_params(model):
        out.append(Gemm("router", T, model.experts, model.hidden))
    out += mlp_gemms(model, rows / local, f, etp, "expert", local)
    if model.shared_experts:
        out += mlp_gemms(model, tokens, f, tp, "shared expert", model.shared_experts)
    return tuple(out)


def dense_mlp_gemms(model: ModelSpec, tokens: float, tp: int = 1, width: int | None = None) -> tuple[Gemm, ...]:
    """Forward GEMMs of a dense MLP (``width``, default ffn_hidden) on one tensor-parallel rank:
    all ``tokens`` = b·s/cp rows (gathered, with sequence parallelism), width/tp wide."""
    return mlp_gemms(model, tokens, width or model.ffn_hidden, tp, "mlp")


def gemm_flops(gemms) -> float:
    return sum(g.flops for g in gemms)


# ---------------------------------------------------------------- all-to-all

@dataclass(frozen=True)
class MoEComm:
    """One MoE layer's expert communication for one micro-batch on the busiest rank.

    ``dispatch_s``/``combine_s``: one forward all-to-all each; ``etp_s``: the expert-tensor-
    parallel all-gather and reduce-scatter of the received rows (forward); ``forward_s`` and
    ``backward_s`` the totals per pass (the backward mirrors the forward);
    ``wire_bytes_fwd``: bytes one rank sends in the forward."""

    dispatch_s: float
    combine_s: float
    etp_s: float
    wire_bytes_fwd: float

    @property
    def forward_s(self) -> float:
        return self.dispatch_s + self.combine_s + self.etp_s

    @property
    def backward_s(self) -> float:
        return self.forward_s

    @property
    def a2a_fwd_s(self) -> float:
        return self.dispatch_s + self.combine_s


def a2a_bytes(model: ModelSpec, tokens: float, *, tp: int = 1, imbalance: float = 1.0,
              capacity_factor: float | None = None, bytes_per_value: float = BYTES) -> float:
    """The busiest rank's all-to-all buffer, ``tokens`` = b·s/cp: rows · h · bytes, rows the
    :func:`routed_rows` of the rank's T = tokens/tp; it exchanges (ep − 1)/ep of it with the
    other ranks (:func:`.comm.all_to_all`)."""
    _pos("tp", tp)
    return routed_rows(model, tokens / tp, imbalance, capacity_factor) * model.hidden * bytes_per_value


def _groups_hit(model: ModelSpec, groups: int) -> float:
    """Expected number of the ``groups`` equal groups of the E routed experts (ranks, or nodes)
    holding at least one of a token's k distinct experts: groups·(1 − C(E − E/groups, k)/C(E, k))
    (a group misses all k picks with the hypergeometric probability)."""
    E, k = model.experts, model.top_k
    per = E / groups
    miss = 1.0
    for i in range(k):
        miss *= max(E - per - i, 0.0) / (E - i)
    return groups * (1.0 - miss)


def remote_node_copies(model: ModelSpec, ep: int, local: int) -> float:
    """Expected copies of one token a node-deduplicated dispatch sends over the network: the
    number of *other* nodes holding at least one of its top-k experts, with the E routed experts
    spread evenly over the ep group's N = ep/local nodes and the k experts distinct:
    (N − 1)·(1 − C(E − E/N, k) / C(E, k)) (:func:`_groups_hit`, less this node). DeepEP's
    internode dispatch sends a token once per destination node and forwards it over NVLink there
    (deepseek-ai/DeepEP README; DeepSeek-AI 2024, arXiv 2412.19437, §3.2.2)."""
    nodes = ep // local
    if nodes <= 1:
        return 0.0
    return _groups_hit(model, nodes) * (nodes - 1) / nodes


def permute_bytes(model: ModelSpec, tokens: float, *, ep: int = 1, tp: int = 1, etp: int | None = None,
                  dispatch: str = "all-to-all", imbalance: float = 1.0,
                  capacity_factor: float | None = None) -> tuple[float, float]:
    """Bytes the token dispatcher's permutations move on the busiest device per MoE layer,
    (forward, backward): memory-bound gathers of h-wide BF16 rows, each row read once and
    written once, h·2 bytes each time; ``tokens`` = b·s/cp as for :func:`moe_gemms`. With
    T = tokens/tp routed here, S = T·top_k rows sent (C·T·top_k with a capacity factor),
    R = etp·(the busiest rank's received rows), the rows its experts compute (:func:`routed_rows`),
    and U = R·c/top_k the distinct tokens a rank-deduplicated dispatch delivers
    (c = :func:`rank_copies`), the rows read plus written are:

    * ``"all-to-all"``, Megatron-core's ``MoEAlltoAllTokenDispatcher`` with fused permutation
      (core_v0.15.0 ``megatron/core/transformer/moe/token_dispatcher.py``, Transformer Engine's
      ``moe_permute`` kernels): *permutation 1* gathers the T tokens into their S sent rows
      (S + S), *permutation 2* sorts the R received rows by local expert (``sort_chunks_by_idxs``,
      R + R, only with more than one local expert), the combine sorts them back (R + R) and
      *unpermutation 1* sums each token's rows back into T (S + T): 3S + 4R + T.
    * ``"deepep"``, the flex dispatcher's DeepEP path (the same file's ``_DeepepManager``; NeMo
      AutoModel ``nemo_automodel/components/moe/megatron/token_dispatcher.py``): DeepEP writes
      the U tokens straight into its receive buffer; ``get_permuted_hidden_states_by_experts``
      expands them to the local experts' R rows (R + R) and the combine's unpermutation sums
      them back (R + U): 3R + U.

    The backward runs each kernel's transpose (a gather's is a scatter-sum of the same rows): the
    same bytes. The router's probabilities, 4 bytes a row, are 1/h of that and left out."""
    if dispatch not in ("all-to-all", "deepep"):
        raise ModelcutError(f"dispatch must be 'all-to-all' or 'deepep', got {dispatch!r}")
    etp = etp or tp
    T = tokens / tp
    R = routed_rows(model, T, imbalance, capacity_factor) * etp
    if dispatch == "deepep":
        rows = 3.0 * R + R * rank_copies(model, ep) / model.top_k
    else:
        S = routed_rows(model, T, 1.0, capacity_factor)
        rows = 3.0 * S + (4.0 * R if model.experts // ep > 1 else 0.0) + T
    b = rows * model.hidden * BYTES
    return b, b


#: SMs the token dispatcher's kernels hold while they run: DeepEP's high-throughput kernels take
#: ``Buffer.num_sms`` = 20 (deepseek-ai/DeepEP deep_ep/buffer.py), which NeMo AutoModel keeps unless
#: DEEP_EP_SM_NUMS says otherwise (nemo_automodel/components/moe/megatron/fused_a2a.py at 037e04a:
#: ``Buffer.set_num_sms(int(os.environ.get("DEEP_EP_SM_NUMS", 20)))``).
DISPATCH_SMS = {"deepep": 20}


def shared_overlap_saving(shared_s: float, a2a_s: float, comm_sms: int, sms: int | None) -> float:
    """Seconds a pass saves by running ``shared_s`` seconds of shared-expert products beside
    ``a2a_s`` seconds of all-to-all that hold ``comm_sms`` of ``sms`` SMs (module doc):
    min(S, A·(1 − comm_sms/sms)); all of A's span when the SM count is unknown."""
    if shared_s < 0 or a2a_s < 0:
        raise ModelcutError(f"shared-expert and all-to-all seconds must be non-negative, got {shared_s}, {a2a_s}")
    free = 1.0 - comm_sms / sms if sms else 1.0
    return min(shared_s, a2a_s * max(free, 0.0))


def rank_copies(model: ModelSpec, ep: int) -> float:
    """Expected copies of one token a rank-deduplicated dispatch delivers: the ranks of the ep
    group holding at least one of its top-k experts, ep·(1 − C(E − E/ep, k)/C(E, k)) (at most k).
    DeepEP sends a token once to each rank it is routed to, whatever the number of that rank's
    experts it picks, and combines it once per rank (``get_dispatch_layout``'s
    ``is_token_in_rank``, [tokens, ranks] booleans; deepseek-ai/DeepEP v1.2.1 deep_ep/buffer.py)."""
    return min(_groups_hit(model, ep), float(model.top_k))


def moe_comm(model: ModelSpec, tokens: float, *, ep: int, link_bw: float, net_bw: float, local: int = 1,
             tp: int = 1, etp: int | None = None, etp_bw: float | None = None, alpha: float = 0.0,
             imbalance: float = 1.0, capacity_factor: float | None = None, dispatch_bytes: float = BYTES,
             combine_bytes: float = BYTES, node_dedup: bool = False) -> MoEComm:
    """Dispatch and combine all-to-alls over ep ranks, ``local`` of which share a node
    (:func:`.comm.group_members_in_node`): the node-mates' part over the links, the rest over the
    network (:func:`.comm.all_to_all_two_level`); then, with etp > 1, the all-gather and
    reduce-scatter of the received rows in the etp group (``etp_bw``, default ``link_bw``).
    ``tokens`` = b·s/cp; ``etp`` defaults to tp. ``node_dedup`` (DeepEP): a token reaches each
    rank holding its experts once (:func:`rank_copies` rows instead of k); across nodes the
    network carries :func:`remote_node_copies` per token and the links forward what arrives to
    the node's other ranks."""
    etp = etp or tp
    _pos("ep", ep)
    _pos("etp", etp)
    if not 1 <= local <= ep:
        raise ModelcutError(f"ranks in a node must be between 1 and ep = {ep}, got {local}")
    kw = dict(tp=tp, imbalance=imbalance, capacity_factor=capacity_factor)
    d_b = a2a_bytes(model, tokens, bytes_per_value=dispatch_bytes, **kw)
    c_b = a2a_bytes(model, tokens, bytes_per_value=combine_bytes, **kw)
    dedup_on = node_dedup and model.is_moe
    per_rank = rank_copies(model, ep) / model.top_k if dedup_on else 1.0   # rows delivered, as a share of k copies
    if dedup_on:
        if local < ep:
            copies = remote_node_copies(model, ep, local)

            def dedup(nbytes: float) -> float:
                across = nbytes / model.top_k * copies / net_bw                 # one copy per other node
                inside = (local - 1) / local * nbytes * per_rank / link_bw      # on to the node's ranks
                return max(across, inside) + (ep // local - 1) * alpha
        else:
            def dedup(nbytes: float) -> float:
                return comm.all_to_all(ep, nbytes * per_rank, link_bw, alpha)   # one node: once per rank
        disp, comb = dedup(d_b), dedup(c_b)
    else:
        disp = comm.all_to_all_two_level(ep, d_b, local, link_bw, net_bw, alpha)
        comb = comm.all_to_all_two_level(ep, c_b, local, link_bw, net_bw, alpha)
    etp_s = 0.0
    wire = per_rank * (comm.wire_bytes("all-to-all", ep, d_b) + comm.wire_bytes("all-to-all", ep, c_b))
    if etp > 1:
        gathered = a2a_bytes(model, tokens, bytes_per_value=BYTES, **kw) * etp
        bw = etp_bw or link_bw
        etp_s = comm.all_gather(etp, gathered, bw, alpha) + comm.reduce_scatter(etp, gathered, bw, alpha)
        wire += comm.wire_bytes("all-gather", etp, gathered) + comm.wire_bytes("reduce-scatter", etp, gathered)
    return MoEComm(dispatch_s=disp, combine_s=comb, etp_s=etp_s, wire_bytes_fwd=wire)


# ---------------------------------------------------------------- weights

@dataclass(frozen=True)
class ExpertSharding:
    """How a layout cuts the routed experts: ``local_experts`` E/ep per device, each
    ``width`` = f_e/etp wide; ``params_per_layer`` the routed-expert weights one device holds
    in one MoE layer, E·P_e/(ep·etp) (P_e: :func:`.flops.mlp_params` of one expert);
    ``data_parallel`` the ranks sharing those weights and reducing their gradients,
    tp·cp·dp/(ep·etp) (Megatron-LM's expert data-parallel group). Everything else in an MoE
    layer (attention, norms, router, shared experts) is cut like the dense model's
    (:func:`.memory.layer_params` holds the per-device bytes of both)."""

    local_experts: int
    width: int
    params_per_layer: float
    data_parallel: int


def expert_sharding(model: ModelSpec, layout: Layout) -> ExpertSharding:
    """The routed experts' cut under ``layout`` (:class:`ExpertSharding`)."""
    check_moe_layout(model, layout)
    etp = layout.etp or layout.tp
    f = flops.expert_width(model)
    one = flops.mlp_params(model, f)
    dp = comm.expert_dp_size(layout)
    return ExpertSharding(local_experts=model.experts // layout.ep, width=f // etp,
                          params_per_layer=model.experts * one / (layout.ep * etp) if model.is_moe else 0.0,
                          data_parallel=dp)


def expert_param_counts(model: ModelSpec) -> tuple[int, int]:
    """(all routed-expert weights, the rest) of the whole model: what is cut over ep·etp and what
    like a dense model's weights."""
    expert = flops.moe_layer_count(model) * model.experts * flops.mlp_params(model, flops.expert_width(model))
    return expert, flops.param_count(model) - expert
