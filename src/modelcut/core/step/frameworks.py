"""What a training stack does: which communication it overlaps with compute, which kernels it
runs, how it keeps and moves gradients and weights.

Each overlap is a named option (:data:`OPTIONS`); a :class:`Framework` gives the defaults of one
stack and era. The presets themselves are catalog data with their sources
(``modelcut/catalog/frameworks.toml``), so a user can say what their run did (``--framework``,
``--overlap grad_reduce=off``).

* ``grad_reduce``: the data-parallel gradient all-reduce (or reduce-scatter) runs in buckets
  while the backward is still going: a bucket starts when the last backward touching it ends.
  PyTorch DDP does this by default (Li et al. 2020, "PyTorch Distributed", §3.2.3, 25 MB
  buckets); Megatron-LM's own ``LocalDDP`` of 2021-2022 did not (``--DDP-impl local``: one
  all-reduce after the pipeline flush, ``megatron/model/distributed.py``); Megatron-core added
  ``--overlap-grad-reduce`` in 2023 (off by default; NeMo turns it on); FSDP and DeepSpeed
  ZeRO-2/3 (``overlap_comm``) reduce-scatter behind the backward.
* ``param_gather``: sharded weights are all-gathered ahead of use (ZeRO-3 prefetch; FSDP
  ``forward_prefetch``/``backward_prefetch``; Megatron-core ``--overlap-param-gather`` with the
  distributed optimizer); off, each gather waits for the layer that needs it.
* ``p2p_async``: pipeline sends and receives run on their own stream and do not hold the
  device (Llama 3, Grattafiori et al. 2024 §3.3.2; Megatron-core ``--overlap-p2p-comm``);
  off, as in Megatron-LM 2021-2022 (``batch_isend_irecv`` then a device synchronize in
  ``megatron/p2p_communication.py``), each transfer holds both devices.
* ``tp_comm``: tensor-parallel collectives hidden behind the neighbouring products
  (Transformer Engine userbuffers, NeMo's ``tp_comm_overlap``; Wang et al. 2023 "Overlap
  communication with dependent computation"); off, every one is on the critical path.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from ..costs.comm import NCCL_TUNERS, NcclTuner
from ..costs.context import CP_IMPLS
from ..costs.moe import DISPATCH_SMS
from ..costs.fp8 import LIBRARY_RECIPES
from ..costs.residency import PIPELINE_GRAD_SYNC, Residency, accumulate_bytes, residency_under
from ..errors import ModelcutError
from ..specs import FP8_RECIPES, Layout, Run, Training
from .elementwise import CE_BYTES
from ..units import (BF16_BYTES, GRAD_ACCUM_BYTES_16, GRAD_ACCUM_BYTES_32, GRAD_ACCUM_BYTES_32_CAST, GRAD_BYTES,
                     OPTIMIZER_STATE_BYTES, WEIGHT_BYTES)

#: Option name -> what it means (shown by the CLI).
OPTIONS: dict[str, str] = {
    "grad_reduce": "data-parallel gradient reduction in buckets behind the backward",
    "param_gather": "ZeRO-3/FSDP/distributed-optimizer weight all-gather ahead of use",
    "p2p_async": "pipeline sends on their own stream, not holding the device",
    "tp_comm": "tensor-parallel collectives hidden behind the neighbouring matrix products",
}

@dataclass(frozen=True)
class Overlap:
    """Which communication a framework overlaps with compute (module doc)."""

    grad_reduce: bool = True
    param_gather: bool = True
    p2p_async: bool = True
    tp_comm: bool = False

    def with_options(self, **kw: bool) -> "Overlap":
        for k, val in kw.items():
            if k not in OPTIONS:
                raise ModelcutError(f"unknown overlap option {k!r}; choose one of {', '.join(OPTIONS)}")
            if not isinstance(val, bool):
                raise ModelcutError(f"overlap option {k} must be on or off, got {val!r}")
        return replace(self, **kw)

    def as_dict(self) -> dict[str, bool]:
        return {k: getattr(self, k) for k in OPTIONS}


@dataclass(frozen=True)
class Framework:
    """One training stack's defaults: what it overlaps, which kernels it runs, how it keeps
    and moves gradients.

    ``attention``: the attention kernel (:data:`.kernels.ATTENTION_KINDS`), or "auto":
    Transformer Engine's choice, cuDNN fused attention on Hopper, FlashAttention-2 before it;
    ``grad_accum_fusion``: weight gradients accumulated inside the product; without it,
    ``grad_accum_bytes``: what the separate accumulation moves per local parameter per
    micro-batch, 6 (a 16-bit gradient into a 16-bit buffer: read 2, read 2, write 2), 10
    (into an FP32 one in one kernel: read 2, read 4, write 4) or 18 (into an FP32 one through an
    explicit cast to a temporary FP32 copy, DeepSpeed's BF16_Optimizer: 2 + 4, then 4 + 4 + 4;
    :data:`..units.GRAD_ACCUM_BYTES_32_CAST`);
    ``cross_entropy``: how the loss is computed, "fused" (one fused kernel), "fp32-passes"
    (Megatron-LM's separate fp32 passes), "mcore-fused" (Megatron-core's native fusion: the fp32
    passes in compiled groups), "torch" (``F.cross_entropy`` on the 16-bit logits),
    "torch-fp32" (the logits cast to fp32 first), "torch-compiled" (that loss under
    ``torch.compile``) or "flash-attn" (flash-attn's Triton kernel): :data:`..costs.loss.LOSS_KERNELS`; ``grad_bytes``: bytes per gradient element
    on the data-parallel wire (2: fp16/bf16, 4: fp32); ``expert_grad_bytes``: the same for the
    routed experts' gradients where the stack reduces them in another dtype (None: ``grad_bytes``;
    :attr:`expert_grad_b`); ``unsharded_grad_bytes``: bytes per dense parameter of the gradients
    a ZeRO-2/3 stack accumulates whole between reductions (``pipeline_grad_sync`` or
    ``flat_grad_sync`` "step"; FSDP2 keeps them in its reduce dtype; None: ``grad_buffer_bytes``); ``grad_buffer_bytes``: bytes per element of
    the gradient buffer a rank keeps between micro-batches (memory): 4, an FP32 ``main_grad``; 2
    where Megatron's DDP reduces in 16 bits and so allocates the buffer in the parameters' dtype
    (``grad_dtype = torch.float if grad_reduce_in_fp32 else param.dtype``, Megatron-LM core_v0.8.0
    megatron/core/distributed/distributed_data_parallel.py; in 2021 ``_get_buffer_type``,
    megatron/model/distributed.py at v2.5); ``grad_buffer_reduced``: that buffer is the one the
    stack reduces, in place (Megatron's DDP), so a run's ``grad_reduce`` sets its type too
    (:meth:`for_training`); elsewhere (PyTorch FSDP's sharded gradients, in the parameters' dtype)
    it does not; ``param_bytes``/``optimizer_bytes``: bytes per
    parameter of the stored weights and of the optimizer's states (memory): 2 and 12 where the
    optimizer keeps FP32 master weights and Adam moments beside 16-bit weights (Megatron,
    DeepSpeed: :data:`..units.WEIGHT_BYTES`, :data:`..units.OPTIMIZER_STATE_BYTES`); 4 and 8 where
    the stored (sharded) weights are themselves the FP32 master copy (PyTorch FSDP's mixed
    precision); 2 and 4 where the model is trained in bf16 throughout, its Adam moments in the
    parameters' dtype (a gathered copy is 16-bit in every case); ``dist_optimizer``: optimizer states
    sharded over data parallelism even at zero = 0 (Megatron's distributed optimizer);
    ``reshard_after_forward``: ZeRO-3/FSDP frees gathered weights after the forward, so the
    backward gathers them again (once: the recomputed forward and the backward share it);
    ``prefetch_backward``: the ``param_gather`` overlap also prefetches in the backward;
    ``tp_async_backward``: tensor-parallel backward collectives of the column-parallel products
    run behind their gradient products (Megatron-LM's async all-reduce, from late 2021);
    ``multi_nic_rings``: data-parallel collectives of a group with several members per node
    use all those members' network ports (NCCL's rings, :func:`..costs.comm.collective_bandwidth`);
    off, each member moves its bytes through its own port only (see the deepspeed-zero3 preset);
    ``cp_kind``: the stack's context-parallel form when the layout names none: "ring" for
    Megatron-core and NeMo (``--cp-comm-type`` defaults to ``p2p``, Transformer Engine's ring
    attention with the K/V exchange overlapped with the attention blocks), "allgather" for
    Llama 3 (Grattafiori et al. 2024 §3.3.2) and PyTorch's context parallelism (its default
    rotation, ``set_rotate_method("allgather")``);
    ``cp_impl``: whose context-parallel attention the stack runs (:data:`..costs.context.CP_IMPLS`):
    "transformer-engine" (Megatron-core, NeMo, NeMo AutoModel's TE attention; also stands for
    any form that gathers the keys once and runs one attention, as PyTorch's FlexAttention path
    does with ``flex_cp_allgather``) or "torch-sdpa", PyTorch's for SDPA (torchtitan, the FSDP
    presets): one attention call per step, merged in FP32 (:func:`..costs.context.torch_merge_bytes`),
    its rotation overlapped with the steps (:func:`..costs.context.torch_exposed`);
    ``nccl``: the NCCL release whose tuner latencies the stack's collectives pay
    (:data:`..costs.comm.NCCL_TUNERS`: "2.9" for the 2021-2022 stacks, "2.18" for 2023 to
    mid-2024, "2.23" from September 2024, the default);
    ``zero3_runtime``: how ZeRO-3 without a pipeline fetches weights: "unit", FSDP's wrapped
    units (one transformer layer each) prefetched one ahead on a communication stream;
    "deepspeed-0.3", DeepSpeed's 2021 hooks replayed weight by weight
    (:mod:`.deepspeed_stage3`); ``fused_elementwise``: norms, activations, rotary embedding and
    residual adds as fused kernels (Megatron-LM, Transformer Engine); off, PyTorch's eager ops,
    one kernel each, RMSNorm torch's own fused kernels (:data:`.elementwise.EAGER_RMSNORM_FWD`); ``selective``: what selective
    recomputation re-executes: "attention", the attention core (Megatron-LM, Korthikanti et al.
    2022 §5), or "op", torchtitan's per-op policy (every second matrix product, the norms,
    activations and other elementwise ops and the all-gathers, keeping attention's output and
    the reduce-scatters: torchtitan/distributed/activation_checkpoint.py); ``moe_dispatch``:
    how tokens reach their experts: "all-to-all", one copy per routed expert; "deepep",
    DeepEP's node-deduplicated dispatch (one copy per destination node over the network,
    forwarded over NVLink inside it: deepseek-ai/DeepEP README, DeepSeek-AI 2024 §3.2.2);
    ``shared_expert_overlap``: the shared experts run on a second stream beside the routed path,
    hiding behind its all-to-alls (:func:`..costs.moe.shared_overlap_saving`; needs a dispatcher
    whose SM share is known, :data:`..costs.moe.DISPATCH_SMS`);
    with FP8 (:mod:`..costs.fp8`): ``fp8_norm_fused``, the QKV and MLP-up inputs quantized inside
    the norm (Transformer Engine's LayerNormLinear, as Megatron-core builds its layers);
    ``fp8_param_gather``, weights kept and gathered in FP8; ``fp8_default_recipe``, the recipe
    when the run names none ("auto": Transformer Engine's choice for the accelerator);
    ``fp8_only``: the recipes of its library the stack's release runs, where it predates some of
    them (empty: all of them; NeMo 24.07's Transformer Engine has delayed scaling only);
    ``fp8_library``, what runs the FP8 linears and so which recipes exist and what their casts
    cost: "transformer-engine" (Megatron-core, NeMo, llm-foundry's ``amp_fp8``) or "torchao"
    (torchtitan, NeMo AutoModel: :data:`..costs.fp8.LIBRARY_RECIPES`), whose casts TorchInductor
    fuses where the stack runs under ``torch_compile`` and run as eager kernels otherwise;
    ``fp8_rs_overlap``: how the ``tp_comm`` overlap hides a row-parallel forward's reduce-scatter
    when the product runs in FP8 (:func:`.layers._overlapped`): "pipeline", the product in
    chunks one after another beside the collective, as with 16-bit operands (NeMo's H100 FP8
    userbuffers configurations until April 2025); "ring", by ring exchange (NeMo from then on
    and Megatron-Bridge);
    ``reshard_with_pipeline``: ZeRO-3/FSDP's resharding when the run has a pipeline, where the stack
    chooses apart from ``reshard_after_forward`` (None: the same); ``pipeline_grad_sync``: with a
    pipeline and ZeRO-2/3, "microbatch" reduce-scatters the gradients after every backward (only
    the shard is kept), "step" accumulates them whole and reduces once (:mod:`..costs.residency`,
    the one rule memory and time both read: :meth:`residency`); ``flat_grad_sync``: the same choice
    without a pipeline, over the gradient-accumulation steps;
    ``mcore_layers``: the layers are Megatron-core's modules (its Transformer Engine layer spec),
    whose paths for three model features run eager PyTorch ops (:data:`.elementwise.MCORE_EAGER_ROPE_FWD`
    and the rest): a YaRN attention factor other than 1 (``ModelSpec.rope_mscale``), a clamped
    GLU in the routed experts (``ModelSpec.glu_clamp``) and the routed experts' output biases;
    ``p2p_async_interleaved_only``: the stack overlaps pipeline sends (``p2p_async``) only in its
    interleaved schedule (:meth:`p2p_overlapped`); ``p2p_sequential``: its blocking pipeline
    exchanges send and then receive, two transfers one after the other, where Megatron-LM batches
    the send and the receive of an exchange into one ``batch_isend_irecv`` that moves both at once
    (DeepSpeed's pipeline engine: :func:`.stage_costs.exchange_time`); ``default_zero``: the ZeRO stage it runs when
    the layout does not say (3 for FSDP's stacks, whose ``fully_shard`` shards weights, gradients
    and optimizer states; :meth:`zero_stage`), ``default_zero_with_pipeline`` the one it runs
    with a pipeline where that differs (DeepSpeed's pipeline engine: below 2);
    ``sequence_parallel``: whether it cuts norms and dropouts over tp when the layout does not say
    (and tp > 1; :meth:`resolve`); ``fsdp2_copies``: under ZeRO-3 the stack is PyTorch's FSDP2,
    whose all-gather copy-out and reduce-scatter copy-in run on the compute stream
    (:mod:`..costs.residency`, "FSDP2's copies"); ``fsdp1_reduce``: the stack reduces gradients
    through PyTorch FSDP1's post-backward hook, which casts each unsharded gradient to the reduce
    type and divides it in place ahead of the collective, on the communication stream
    (:mod:`..costs.residency`, "FSDP1's reduction"); ``fsdp_grad_accum``: the stack accumulates
    weight gradients as PyTorch FSDP does (:meth:`grad_accum_rule`); ``causal_softmax_max_seq``: the longest key
    sequence the stack's fused causal softmax takes on its unfused attention path, which reads each
    score row only up to its query (:func:`..costs.kernels.causal_softmax_rows`; 0: no such kernel,
    the whole row); ``attention_unpad``: the stack's FlashAttention path gathers Q, K and V into
    unpadded rows before the kernel and scatters its output back into padded ones
    (:data:`.elementwise.UNPAD_BYTES`); ``gqa_repeat_kv``: with fewer key/value heads than query heads the
    stack copies K and V out to every query head before the attention kernel
    (:data:`.elementwise.REPEAT_KV_BYTES`); ``replica_reduce_stream``: with hybrid sharding
    the replicas' all-reduce of a unit's gradient shard runs on a stream of its own, beside the next
    unit's reduce-scatter (PyTorch FSDP; :func:`.data_parallel.dp_collective`); ``default_etp``: the routed experts' tensor
    parallelism when an MoE layout with tp > 1 names none (None: tp, Megatron-core's default;
    1: the experts whole on each rank, their ep groups laid over the tensor-parallel ranks first,
    :func:`..costs.mesh.expert_mesh`; :meth:`resolve`)."""

    name: str
    overlap: Overlap
    attention: str
    grad_accum_fusion: bool
    cross_entropy: str
    grad_bytes: int
    expert_grad_bytes: int | None = None
    unsharded_grad_bytes: int | None = None
    grad_buffer_bytes: int = GRAD_BYTES
    grad_buffer_reduced: bool = False
    grad_accum_bytes: int = GRAD_ACCUM_BYTES_16
    param_bytes: int = WEIGHT_BYTES
    optimizer_bytes: int = OPTIMIZER_STATE_BYTES
    dist_optimizer: bool = False
    default_zero: int = 0
    default_zero_with_pipeline: int | None = None
    sequence_parallel: bool = False
    reshard_after_forward: bool = True
    prefetch_backward: bool = True
    tp_async_backward: bool = True
    multi_nic_rings: bool = True
    cp_kind: str = "allgather"
    cp_impl: str = "transformer-engine"
    nccl: str = "2.23"
    zero3_runtime: str = "unit"
    fused_elementwise: bool = True
    selective: str = "attention"
    moe_dispatch: str = "all-to-all"
    shared_expert_overlap: bool = False
    fp8_norm_fused: bool = True
    fp8_param_gather: bool = False
    fp8_default_recipe: str = "auto"
    fp8_library: str = "transformer-engine"
    fp8_only: tuple[str, ...] = ()
    torch_compile: bool = False
    fp8_rs_overlap: str = "ring"
    reshard_with_pipeline: bool | None = None
    mcore_layers: bool = False
    p2p_async_interleaved_only: bool = False
    p2p_sequential: bool = False
    pipeline_grad_sync: str = "microbatch"
    flat_grad_sync: str = "microbatch"
    fsdp2_copies: bool = False
    fsdp1_reduce: bool = False
    fsdp_grad_accum: bool = False
    causal_softmax_max_seq: int = 0
    attention_unpad: bool = False
    gqa_repeat_kv: bool = False
    replica_reduce_stream: bool = False
    default_etp: int | None = None
    source: str = ""

    def __post_init__(self) -> None:
        if isinstance(self.fp8_only, list):   # as a TOML row writes it
            object.__setattr__(self, "fp8_only", tuple(self.fp8_only))
        choices = {"selective": ("attention", "op"), "moe_dispatch": ("all-to-all", "deepep"),
                   "cp_kind": ("ring", "allgather"), "cp_impl": CP_IMPLS, "nccl": tuple(NCCL_TUNERS), "zero3_runtime": ("unit", "deepspeed-0.3"),
                   "fp8_default_recipe": ("auto", *FP8_RECIPES), "fp8_rs_overlap": ("ring", "pipeline"),
                   "fp8_library": tuple(LIBRARY_RECIPES),
                   "pipeline_grad_sync": PIPELINE_GRAD_SYNC, "flat_grad_sync": PIPELINE_GRAD_SYNC, "cross_entropy": tuple(CE_BYTES)}
        for name, allowed in choices.items():
            if getattr(self, name) not in allowed:
                raise ModelcutError(f"framework {self.name}: {name} must be one of {', '.join(allowed)}, "
                                    f"got {getattr(self, name)!r}")
        for name, allowed in (("default_zero", (0, 1, 2, 3)), ("default_zero_with_pipeline", (None, 0, 1, 2, 3)), ("grad_bytes", (2, 4)), ("expert_grad_bytes", (None, 2, 4)), ("unsharded_grad_bytes", (None, 2, 4)), ("grad_buffer_bytes", (2, 4)), ("param_bytes", (2, 4)),
                              ("optimizer_bytes", (4, 8, 12)), ("grad_accum_bytes", (GRAD_ACCUM_BYTES_16, GRAD_ACCUM_BYTES_32,
                                                                  GRAD_ACCUM_BYTES_32_CAST))):
            if getattr(self, name) not in allowed:
                raise ModelcutError(f"framework {self.name}: {name} must be one of "
                                    f"{', '.join(map(str, allowed))}, got {getattr(self, name)!r}")
        # "auto" is Transformer Engine's own choice (costs.fp8.default_recipe); any other default
        # must be a recipe the stack's library runs, or an FP8 run naming no recipe could not run
        if self.fp8_library == "none" and self.fp8_default_recipe != "auto":
            raise ModelcutError(f"framework {self.name}: a stack with no FP8 library has no default FP8 recipe")
        if self.fp8_default_recipe == "auto" and self.fp8_library not in ("transformer-engine", "none"):
            raise ModelcutError(f"framework {self.name}: fp8_default_recipe auto is Transformer Engine's choice; "
                                f"a {self.fp8_library} stack names its default ({', '.join(self.fp8_recipes)})")
        if self.fp8_default_recipe != "auto" and self.fp8_default_recipe not in self.fp8_recipes:
            raise ModelcutError(f"framework {self.name}: fp8_default_recipe {self.fp8_default_recipe} is not "
                                f"{self.fp8_library}'s ({', '.join(self.fp8_recipes)})")
        if not isinstance(self.fp8_only, tuple) or not set(self.fp8_only) <= set(LIBRARY_RECIPES[self.fp8_library]):
            raise ModelcutError(f"framework {self.name}: fp8_only must list recipes of {self.fp8_library} "
                                f"({', '.join(LIBRARY_RECIPES[self.fp8_library])}), got {self.fp8_only!r}")
        if self.default_etp not in (None, 1):
            raise ModelcutError(f"framework {self.name}: default_etp must be 1 or left out (tp), got {self.default_etp!r}")
        if self.shared_expert_overlap and self.moe_dispatch not in DISPATCH_SMS:
            raise ModelcutError(f"framework {self.name}: shared_expert_overlap needs a dispatcher whose SM use is "
                                f"known ({', '.join(DISPATCH_SMS)}), got moe_dispatch {self.moe_dispatch!r}")

    @property
    def fp8_recipes(self) -> tuple[str, ...]:
        """The FP8 recipes this stack runs: its FP8 library's (:data:`..costs.fp8.LIBRARY_RECIPES`),
        those of ``fp8_only`` where its release predates some."""
        return tuple(r for r in LIBRARY_RECIPES[self.fp8_library] if not self.fp8_only or r in self.fp8_only)

    @property
    def nccl_tuner(self) -> NcclTuner:
        """The latencies of the stack's NCCL (:data:`..costs.comm.NCCL_TUNERS`)."""
        return NCCL_TUNERS[self.nccl]

    @property
    def expert_grad_b(self) -> int:
        """Bytes per routed-expert gradient element on the expert-data-parallel wire."""
        return self.grad_bytes if self.expert_grad_bytes is None else self.expert_grad_bytes

    def p2p_overlapped(self, vpp: int) -> bool:
        """Whether pipeline sends run beside the compute (``p2p_async``) with ``vpp`` chunks a device.
        Megatron-core overlaps them only in its interleaved schedule: without a virtual pipeline
        it turns ``overlap_p2p_comm`` off ("Overlap P2P communication is disabled if not using the
        interleaved schedule", Megatron-LM core_v0.15 megatron/training/arguments.py), and its
        1F1B exchanges with ``batch_isend_irecv`` then ``torch.cuda.synchronize()``
        (megatron/core/pipeline_parallel/p2p_communication.py, ``batch_p2p_sync``)."""
        return self.overlap.p2p_async and (vpp > 1 or not self.p2p_async_interleaved_only)

    def zero_stage(self, layout: Layout) -> int:
        """The ZeRO stage this stack runs ``layout`` at: the layout's ``zero`` as given (0 included: a
        Megatron stack run without its distributed optimizer, ``--use-distributed-optimizer`` being
        off by default), or where it leaves it open (None) the stack's own (``default_zero``; with a
        pipeline ``default_zero_with_pipeline`` where that differs), at least 1 under Megatron's
        distributed optimizer (``dist_optimizer``: the FP32 main weights and Adam moments sharded
        over dp·cp, on in those presets)."""
        if layout.zero is not None:
            return layout.zero
        pipe = self.default_zero_with_pipeline
        z = pipe if layout.pp > 1 and pipe is not None else self.default_zero
        return max(z, 1) if self.dist_optimizer else z

    def resolve(self, run: Run) -> Run:
        """``run`` with what it leaves open as this stack runs it: the ZeRO stage
        (:meth:`zero_stage`), sequence parallelism (the stack's ``sequence_parallel`` with tp > 1),
        context parallelism's form (``cp_kind``), the experts' tensor parallelism
        (:meth:`expert_tp`) and the loss's kernel (``cross_entropy``). The one
        place a run's open choices are filled: the step model, its lower bound, memory and the
        stack's rules read the resolved run."""
        L = run.layout
        zero = self.zero_stage(L)
        if L.hybrid and zero == 0:
            raise ModelcutError(f"dp_shard {L.dp_shard} (hybrid sharding) needs sharded data parallelism, but {self.name} "
                                "runs this layout at ZeRO 0; set zero (1-3) or leave dp_shard out")
        sp = (self.sequence_parallel and L.tp > 1) if L.sequence_parallel is None else L.sequence_parallel
        cp_kind = L.cp_kind or (self.cp_kind if L.cp > 1 else None)   # a form only where there is context parallelism
        etp = self.expert_tp(run)
        if zero != L.zero or sp is not L.sequence_parallel or cp_kind != L.cp_kind or etp != L.etp:
            run = replace(run, layout=replace(L, zero=zero, sequence_parallel=sp, cp_kind=cp_kind, etp=etp))
        if run.training.cross_entropy is None:
            run = replace(run, training=replace(run.training, cross_entropy=self.cross_entropy))
        return run

    def for_training(self, training: Training) -> "Framework":
        """This stack as a run's ``training`` sets what the stack leaves to each run: its attention
        kernel (``training.attention``; None: the stack's ``attention``), whether its FP8 weights
        are kept and gathered in FP8 (``training.fp8_param_gather``; None: the stack's
        ``fp8_param_gather``), and the type gradients are reduced in
        (``training.grad_reduce``; None: the stack's). The second sets the
        bytes on the data-parallel wire (``grad_bytes``, and ``expert_grad_bytes`` where the stack
        reduces the routed experts' in the same type); the gradients FSDP2 accumulates whole in its
        reduce dtype (``unsharded_grad_bytes``, where the stack keeps them); and, where the stack
        reduces its gradient buffer in place (``grad_buffer_reduced``: Megatron's DDP allocates it
        in the reduce type), that buffer's type and what accumulating a weight gradient into it
        moves without the fused accumulation (``grad_accum_bytes``: 6 into a 16-bit buffer, 10 into
        an FP32 one; DeepSpeed's cast through a temporary copy stays as it is). Idempotent: the
        step model, its lower bound and memory each apply it."""
        fw = self
        if training.fp8_param_gather is not None and training.fp8_param_gather != self.fp8_param_gather:
            fw = replace(fw, fp8_param_gather=training.fp8_param_gather)
        if training.attention is not None and training.attention != self.attention:
            fw = replace(fw, attention=training.attention)
        return fw.with_grad_reduce(training.grad_reduce_bytes)

    def with_grad_reduce(self, b: int | None) -> "Framework":
        """This stack reducing gradients in ``b`` bytes an element (4: FP32, 2: the 16-bit type;
        None: as it does): :meth:`for_training`."""
        if b is None:
            return self
        changes: dict = {"grad_bytes": b}
        if self.expert_grad_bytes == self.grad_bytes:
            changes["expert_grad_bytes"] = b
        if self.unsharded_grad_bytes is not None:
            changes["unsharded_grad_bytes"] = b
        if self.grad_buffer_reduced:
            changes["grad_buffer_bytes"] = b
            if self.grad_accum_bytes in (GRAD_ACCUM_BYTES_16, GRAD_ACCUM_BYTES_32):
                changes["grad_accum_bytes"] = GRAD_ACCUM_BYTES_32 if b == 4 else GRAD_ACCUM_BYTES_16
        if all(getattr(self, k) == v for k, v in changes.items()):
            return self        # already so (applied before, or the stack's own type)
        return replace(self, **changes)

    def expert_tp(self, run: Run) -> int | None:
        """The routed experts' tensor parallelism the run gets: its layout's, else the stack's
        ``default_etp`` on an MoE model with tp > 1 and ep > 1 (None: tp)."""
        L = run.layout
        if L.etp is not None or self.default_etp is None or not run.model.is_moe or L.tp == 1 or L.ep == 1:
            return L.etp
        return self.default_etp

    def residency(self, zero: int, pp: int, microbatches: int) -> Residency:
        """What a rank keeps resident between micro-batches on this stack (:func:`..costs.residency.residency`)."""
        return residency_under(self, zero, pp, microbatches)

    def grad_accum_rule(self, zero: int, pp: int, microbatches: int) -> tuple[bool, float, float | None]:
        """(``grad_accum_fusion``, ``grad_accum_bytes``, the routed experts' bytes where they differ)
        for a layer of a run at ZeRO stage ``zero`` with ``pp`` stages and ``microbatches`` per
        schedule run: the stack's own where it is not PyTorch FSDP (``fsdp_grad_accum``) sharding
        gradients (``zero`` >= 2); under PyTorch FSDP what accumulating
        moves on the compute stream (:func:`..costs.residency.accumulate_bytes`), the gradients
        computed in 16 bits and held between reductions in the reduce type (``unsharded_grad_bytes``,
        else ``grad_bytes``; the experts' ``expert_grad_bytes`` where the stack reduces them in
        another type)."""
        if not self.fsdp_grad_accum or zero < 2:
            return self.grad_accum_fusion, self.grad_accum_bytes, None
        res = self.residency(zero, pp, microbatches)
        held = self.unsharded_grad_bytes or self.grad_bytes
        dense = accumulate_bytes(res, microbatches, BF16_BYTES, held)
        expert = (accumulate_bytes(res, microbatches, BF16_BYTES, self.expert_grad_bytes)
                  if self.expert_grad_bytes not in (None, held) else None)
        return False, dense, expert

    def with_overlap(self, overrides: dict[str, bool] | None) -> "Framework":
        """This stack with some overlap options switched (``--overlap``)."""
        if not overrides:
            return self
        return replace(self, overlap=self.overlap.with_options(**overrides))
