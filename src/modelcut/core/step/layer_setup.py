"""What one layer's time is computed for: the micro-batch, the cuts, the kernels and the stack's
choices (:class:`LayerSetup`), checked where it is built. :mod:`.layers` times a layer for it and
:mod:`.elementwise` counts its memory-bound bytes; the stage costs (:mod:`.stage_costs`) build one
from the run and the stack's preset."""

from __future__ import annotations

from dataclasses import dataclass

from ..costs import context
from ..costs.fp8 import Fp8
from ..costs.kernels import ATTENTION_KINDS
from ..costs.loss import LOSS_KERNELS
from ..errors import ModelcutError
from ..specs import DEFAULT_RECOMPUTE_MODULES, RECOMPUTE_LEVELS, RECOMPUTE_MODULES
from ..units import GRAD_ACCUM_BYTES_16


@dataclass(frozen=True)
class LayerSetup:
    """What one device computes for one micro-batch: sizes and the framework's kernels.

    ``attention``: "unfused", "flash2" or "flash3" (:data:`.kernels.ATTENTION_KINDS`);
    ``grad_accum_fusion``: weight gradients accumulated inside the product (no extra pass); without
    it ``grad_accum_bytes`` per local parameter per micro-batch, the routed experts'
    ``grad_accum_expert_bytes`` where they differ (:meth:`.frameworks.Framework.grad_accum_rule`);
    ``tp_async_backward``: a column-parallel product's input-gradient collective runs while its
    weight gradient is computed (and the input re-gather while its data gradient is),
    Megatron-LM's ``async_tensor_model_parallel_allreduce`` (on by default since late 2021)
    and its sequence-parallel form (``LinearWithGradAccumulationAndAsyncCommunication``);
    ``tp_bw``/``cp_bw``: link bandwidth (bytes/s each way) of the tp and cp groups, and
    ``tp_inside``/``cp_inside`` whether each stays inside one node (then its collectives are timed
    from the measured curves, :func:`..costs.comm.collective`); ``cp_local``: the cp group's
    members in one node (an all-to-all across nodes sends the node-mates' share over the links);
    ``cp_kind``: context parallelism's form, "allgather", "ring", "a2a" or "a2a+p2p"; ``cp_a2a``: the
    hierarchical form's all-to-all groups' size (adjacent cp ranks) and ``cp_a2a_local`` their members
    in one node (:data:`..costs.mesh.CP_LEVELS`); ``etp``: expert tensor
    parallelism (default tp); ``fused_elementwise``: norms, activation, rotary embedding and
    bias-dropout-residual run as fused kernels (Megatron-LM, Transformer Engine, compiled
    code); off, as PyTorch's eager ops (:data:`.elementwise.EAGER_RMSNORM_FWD` and the rest);
    ``tp_overlap_split``: the ``tp_comm`` overlap is on, so the products its collectives overlap
    run cut into the chunks those collectives deliver (:func:`_overlapped`); ``tp_overlap_fp8_ring``:
    with FP8 a row-parallel forward overlaps its reduce-scatter by ring exchange (the stack's
    ``fp8_rs_overlap``), else it is pipelined as a 16-bit one is."""

    micro_batch: int
    seq_len: int
    tp: int = 1
    cp: int = 1
    sequence_parallel: bool = False
    recompute: str = "none"
    attention: str = "flash2"
    grad_accum_fusion: bool = True
    grad_accum_bytes: float = GRAD_ACCUM_BYTES_16   # per local parameter per micro-batch, without the fusion
    grad_accum_expert_bytes: float | None = None    # the routed experts' where they differ (None: the same)
    cross_entropy: str = "fp32-passes"   # a key of :data:`.elementwise.CE_BYTES`
    tp_async_backward: bool = False
    tp_bw: float = 0.0
    cp_bw: float = 0.0
    cp_kind: str = "allgather"
    etp: int | None = None
    fused_elementwise: bool = True
    tp_inside: bool = True
    cp_inside: bool = True
    cp_local: int = 1
    cp_a2a: int = 1
    cp_a2a_local: int = 1
    selective: str = "attention"
    fp8: Fp8 | None = None           # the run's FP8 (:mod:`..costs.fp8`), None for 16-bit products
    weight_cast_share: float = 1.0   # this micro-batch's share of the per-step FP8 weight casts (1/m)
    tp_overlap_split: bool = False   # tp_comm overlap: overlapped products run in chunks (_overlapped)
    tp_overlap_fp8_ring: bool = True  # FP8 row-parallel forwards by ring exchange (else pipelined)
    mcore_layers: bool = False        # Megatron-core's eager paths (:data:`.elementwise.MCORE_EAGER_ROPE_FWD` and the rest)
    moe_dispatch: str = "all-to-all"  # the token dispatcher: its permutations (:func:`..costs.moe.permute_bytes`)
    cp_impl: str = "transformer-engine"  # whose context parallelism (:data:`..costs.context.CP_IMPLS`)
    compiled: bool = False            # the stack compiles its blocks (TorchInductor fuses elementwise chains)
    recompute_modules: tuple[str, ...] = DEFAULT_RECOMPUTE_MODULES   # selective's modules (module doc)
    causal_softmax_max_seq: int = 0   # the stack's fused causal softmax, unfused path (kernels.causal_softmax_rows)
    attention_unpad: bool = False     # FlashAttention called on unpadded rows (:data:`.elementwise.UNPAD_BYTES`)
    gqa_repeat_kv: bool = False       # K and V copied out to the query heads (:data:`.elementwise.REPEAT_KV_BYTES`)
    act_fp8_input: bool = False       # the SwiGLU's input kept in FP8 (:data:`.elementwise.ACT_FP8_STORE_BYTES`)

    def __post_init__(self) -> None:
        if self.cross_entropy not in LOSS_KERNELS:
            raise ModelcutError(f"cross_entropy must be one of {', '.join(LOSS_KERNELS)}, got {self.cross_entropy!r}")
        if self.attention not in ATTENTION_KINDS:
            raise ModelcutError(f"attention must be one of {', '.join(ATTENTION_KINDS)}, got {self.attention!r}")
        if self.selective not in ("attention", "op"):
            raise ModelcutError(f"selective recomputation must be 'attention' or 'op', got {self.selective!r}")
        if self.cp_impl not in context.CP_IMPLS:
            raise ModelcutError(f"cp_impl must be one of {', '.join(context.CP_IMPLS)}, got {self.cp_impl!r}")
        if self.recompute not in RECOMPUTE_LEVELS:
            raise ModelcutError(f"recompute must be none, selective or full, got {self.recompute!r}")
        bad = [m for m in self.recompute_modules if m not in RECOMPUTE_MODULES]
        if bad or not self.recompute_modules:
            raise ModelcutError(f"recompute_modules must name some of {', '.join(RECOMPUTE_MODULES)}, "
                                f"got {self.recompute_modules!r}")
        if self.recompute_modules != DEFAULT_RECOMPUTE_MODULES and (self.selective == "op" or not self.mcore_layers):
            raise ModelcutError("recompute_modules are Megatron-core's (--recompute-modules): this stack is not "
                                "built on Megatron-core's layers (the megatron-core, nemo and megatron-bridge presets are)")
