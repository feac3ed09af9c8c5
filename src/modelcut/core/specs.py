"""The validated shapes every model in modelcut shares: a transformer, a layout, a run.

Plain dataclasses; catalogs and faces build them, the core reads them. Validation
raises :class:`ModelcutError` with one line naming the problem.
"""

from __future__ import annotations

from dataclasses import dataclass, field, fields, replace
from typing import Any, Literal, get_args

from .errors import ModelcutError
from .units import BF16_BYTES, FP32_BYTES

Recompute = Literal["none", "selective", "full"]
#: The activation-recomputation levels, least recomputed first: none, selective (Korthikanti et al.
#: 2022's attention core, or the stack's per-op policy), full (every layer's forward again).
RECOMPUTE_LEVELS: tuple[str, ...] = get_args(Recompute)
RecomputeModule = Literal["core_attn", "layernorm", "moe_act", "mla_up_proj"]
#: What selective recomputation may name, Megatron-core's ``--recompute-modules`` (with
#: ``--recompute-granularity selective``; default ``core_attn``; Megatron-LM core_v0.15.0
#: megatron/training/arguments.py and megatron/core/transformer/transformer_config.py): the attention
#: core; the norms that run as their own kernels (``layernorm``: with Transformer Engine's layer spec
#: only a mixture-of-experts layer's pre-MLP norm, the input norm being fused into the QKV product,
#: megatron/core/models/gpt/gpt_layer_specs.py and transformer_layer.py); the routed experts'
#: activation function (``moe_act``, megatron/core/transformer/moe/experts.py); a multi-head latent
#: attention layer's up-projections and RoPE (``mla_up_proj``: Q, K and V discarded after the core and
#: made again from the kept latents, megatron/core/transformer/multi_latent_attention.py
#: ``qkv_up_proj_and_rope_apply`` under ``CheckpointWithoutOutput``). With multi-head latent attention
#: the input norm is its own kernel too (the down-projections are plain ``TELinear``s,
#: gpt_layer_specs.py ``get_gpt_layer_with_transformer_engine_spec``), so ``layernorm`` covers it in
#: every layer. Megatron-core's others (mlp, moe, shared_experts) are not timed here.
RECOMPUTE_MODULES: tuple[str, ...] = get_args(RecomputeModule)
#: :class:`ModelSpec`'s multi-head latent attention widths (Hugging Face's DeepseekV3Config names).
MLA_FIELDS = ("q_lora_rank", "kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim")
#: What selective recomputation redoes where a run names no modules (Megatron-core's default).
DEFAULT_RECOMPUTE_MODULES: tuple[str, ...] = ("core_attn",)
#: The explorer's recomputation variants, least recomputed first: the levels, and between none and
#: selective the modules Megatron-Bridge's mixture-of-experts recipes name (``layernorm`` and
#: ``moe_act``, the attention core kept: Megatron-Bridge v0.2.0 scripts/performance/configs/gpt_oss/
#: workload_base_configs.py ``GPT_OSS_120B_H100_BF16_BASE_CONFIG``), memory-bound work only. A
#: variant is a level or the modules of selective recomputation joined by ``+``
#: (:func:`recompute_variant`). ``blocks``, between selective and full, is full recomputation of
#: the fewest layers of each pipeline chunk that fit (:data:`BLOCKS`); ``every``, full
#: recomputation of one layer in k on each rank, k the most that fits (:data:`EVERY`).
ExploreRecompute = Literal["none", "layernorm+moe_act", "selective", "every", "blocks", "full"]
RECOMPUTE_VARIANTS: tuple[str, ...] = get_args(ExploreRecompute)
#: The explorer's variant of Megatron-core's block method (``--recompute-granularity full
#: --recompute-method block --recompute-num-layers N``; Megatron-LM core_r0.11.0
#: megatron/core/transformer/transformer_block.py ``_checkpointed_forward``, ``layer_idx <
#: recompute_num_layers``): the first N layers of each chunk recomputed whole (:class:`Training`
#: ``recompute_layers``), N the fewest with which the layout fits, found per layout; Megatron-Bridge
#: v0.2.0 runs Llama 3 8B on H100 so (scripts/performance/configs/llama3/workload_base_configs.py,
#: ``recompute_num_layers=5``).
BLOCKS = "blocks"
#: The explorer's variant of torchtitan's per-layer selective checkpointing (``[activation_checkpoint]
#: mode = "selective"``, ``selective_ac_option = "k"``; :class:`Training` ``recompute_every``):
#: every k-th layer of a rank recomputed whole, k the most with which the layout fits, found per
#: layout.
EVERY = "every"
#: The variants that recompute some layers whole, each with its count (:func:`partial_training`).
PARTIAL = (BLOCKS, EVERY)


def recompute_variant(label: str) -> tuple[str, tuple[str, ...] | None]:
    """A recomputation variant's level and modules: a level names itself (its modules left to the
    run, None); ``"a+b"`` is selective recomputation of modules a and b; ``blocks`` is full
    recomputation (of the run's ``recompute_layers``, :data:`BLOCKS`), and so is ``every`` (of
    one layer in the run's ``recompute_every``, :data:`EVERY`)."""
    if label in RECOMPUTE_LEVELS:
        return label, None
    if label in (BLOCKS, EVERY):
        return "full", None
    mods = tuple(label.split("+"))
    bad = [m for m in mods if m not in RECOMPUTE_MODULES]
    if bad:
        raise ModelcutError(f"recompute variant {label!r}: use a level ({', '.join(RECOMPUTE_LEVELS)}), "
                            f"{BLOCKS}, {EVERY}, or modules joined by + ({', '.join(RECOMPUTE_MODULES)})")
    return "selective", mods


def partial_training(variant: str, count: int) -> dict[str, int | None]:
    """The :class:`Training` fields of a partial variant with its count: :data:`BLOCKS` recomputes
    the first ``count`` layers of each chunk (``recompute_layers``), :data:`EVERY` one layer in
    ``count`` on each rank (``recompute_every``); any other variant neither."""
    return {"recompute_layers": count if variant == BLOCKS else None,
            "recompute_every": count if variant == EVERY else None}


def _positive(obj, *names: str) -> None:
    for n in names:
        val = getattr(obj, n)
        if val is None:
            continue
        if isinstance(val, bool) or not isinstance(val, int):
            raise ModelcutError(f"{n} must be an integer, got {val!r}")
        if val < 1:
            raise ModelcutError(f"{n} must be at least 1, got {val}")


#: Context parallelism's forms (:mod:`.costs.context` times each): Megatron-LM's ``--cp-comm-type``
#: p2p (the ring), allgather, a2a and a2a+p2p (the hierarchical form).
CP_KINDS = ("ring", "allgather", "a2a", "a2a+p2p")


def cp_a2a_problem(cp: int, a2a) -> str | None:
    """Why ``a2a`` cannot be the hierarchical form's all-to-all groups' size over ``cp`` ranks, or
    None: it must lie strictly between 1 and cp and divide cp (Megatron-LM's
    ``--hierarchical-context-parallel-sizes A cp/A``, whose product must be cp, each level above one
    rank). The one rule the layout, the mesh and the context-parallel timing check."""
    if isinstance(a2a, bool) or not isinstance(a2a, int) or not 1 < a2a < cp or cp % a2a:
        return (f"cp_a2a, the hierarchical form's all-to-all groups' size, must be between 1 and cp ({cp}) and "
                f"divide it (Megatron-LM's --hierarchical-context-parallel-sizes A {cp}/A), got {a2a!r}")
    return None


@dataclass(frozen=True)
class ModelSpec:
    """A decoder-only transformer.

    ``ffn_hidden`` is the MLP's inner width (4h for GPT; with ``gated_mlp`` the width of
    each of the gate and up projections, SwiGLU). ``kv_heads`` < ``heads`` is grouped-query
    attention. Mixture-of-experts fields: ``experts`` (E, 1 = dense), ``top_k``,
    ``expert_ffn_hidden`` (each routed expert's inner width; default ``ffn_hidden``),
    ``shared_experts`` and ``dense_layers`` (leading layers with a dense MLP); past those, every
    ``moe_every``-th layer holds the experts and the others a dense MLP of ``ffn_hidden``: layer i
    (from 0) is an MoE layer when i ≥ dense_layers and (i − dense_layers + 1) is a multiple of
    moe_every (Llama 4 Maverick: 2, its odd layers; Hugging Face Llama4TextConfig's
    ``interleave_moe_layer_step``, whose MoE layers are range(step − 1, L, step)). Sliding-window
    attention: ``sliding_layers`` of the layers attend only to the ``sliding_window`` keys up to
    each query, itself included (GPT-OSS: every other layer, 128 keys). Chunked attention:
    ``chunked_layers`` of the layers attend causally within their own block of ``attention_chunk``
    tokens only (Llama 4: 8192 tokens in three layers of every four, ``attention_chunk_size``).
    Multi-head latent attention (DeepSeek-V2/V3, Kimi K2): ``kv_lora_rank`` and the head widths
    ``qk_nope_head_dim``, ``qk_rope_head_dim`` and ``v_head_dim`` (``q_lora_rank`` where queries
    pass a bottleneck too), Hugging Face's DeepseekV3Config names. The latent widths give the layer's
    products (:func:`.costs.context.attention_products`), its attention core (:attr:`core_width`),
    what it keeps for its backward (:func:`.memory.activations.layer_activation_bytes`) and what
    recomputing its up-projections (``mla_up_proj``) runs again; ``kv_heads``/``head_dim`` hold the
    equal-weight grouped-query shape (catalog ``hf_config.mla_equivalent_shape``), which only the
    deck's seed model, knowing no latent attention, runs.
    """

    name: str
    layers: int
    hidden: int
    ffn_hidden: int
    heads: int
    kv_heads: int
    vocab: int
    gated_mlp: bool = False
    tied_embeddings: bool = False
    head_dim: int | None = None        # default hidden / heads
    norm: str = "layernorm"            # "layernorm" (GPT) or "rmsnorm" (Llama)
    bias: bool = True                  # linear-layer biases (GPT yes, Llama no)
    dropout: bool = True               # GPT-3/Megatron train with dropout; Llama 3 without
    max_seq: int | None = None
    experts: int = 1
    top_k: int = 1
    expert_ffn_hidden: int | None = None
    shared_experts: int = 0
    dense_layers: int = 0
    capacity_factor: float | None = None
    source: str = ""
    learned_positions: bool = False    # GPT-2/GPT-3: a learned max_seq × hidden position table
    qkv_bias: bool | None = None       # biases on Q, K, V only (Qwen2); None: as ``bias``
    rope_mscale: float = 1.0           # YaRN's attention factor on RoPE's cos and sin (1: plain RoPE)
    glu_clamp: bool = False            # the gated MLP clamps its two halves first (GPT-OSS's swiglu_limit)
    sliding_window: int | None = None  # keys a sliding-window layer's query attends, itself included
    sliding_layers: int = 0            # how many layers attend within that window (the rest: causal)
    moe_every: int = 1                 # with experts: every moe_every-th layer past dense_layers holds them
    attention_chunk: int | None = None  # tokens of a chunked-attention layer's block (Llama 4: 8192)
    chunked_layers: int = 0            # how many layers attend only within their block
    q_lora_rank: int | None = None     # multi-head latent attention: the queries' latent width (None: no bottleneck)
    kv_lora_rank: int | None = None    # the keys' and values' shared latent width (None: not latent attention)
    qk_nope_head_dim: int | None = None  # a query's or key's width per head without RoPE
    qk_rope_head_dim: int | None = None  # its RoPE part (the key's shared by the heads)
    v_head_dim: int | None = None      # a value's width per head

    def __post_init__(self) -> None:
        _positive(self, "layers", "hidden", "ffn_hidden", "heads", "kv_heads", "vocab", "experts", "top_k")
        _positive(self, "head_dim", "expert_ffn_hidden", "max_seq")
        if self.heads % self.kv_heads:
            raise ModelcutError(f"{self.name}: heads ({self.heads}) must be a multiple of kv_heads ({self.kv_heads})")
        if self.head_dim is None and self.hidden % self.heads:
            raise ModelcutError(f"{self.name}: hidden ({self.hidden}) is not a multiple of heads ({self.heads})")
        if self.top_k > self.experts:
            raise ModelcutError(f"{self.name}: top_k ({self.top_k}) exceeds experts ({self.experts})")
        if not 0 <= self.dense_layers <= self.layers:
            raise ModelcutError(f"{self.name}: dense_layers ({self.dense_layers}) outside 0..{self.layers}")
        if not (isinstance(self.rope_mscale, (int, float)) and not isinstance(self.rope_mscale, bool)
                and self.rope_mscale > 0):
            raise ModelcutError(f"{self.name}: rope_mscale must be a positive number (1: plain RoPE), "
                                f"got {self.rope_mscale!r}")
        if self.learned_positions and self.max_seq is None:
            raise ModelcutError(f"{self.name}: learned_positions needs max_seq (the position table's length)")
        _positive(self, "sliding_window")
        if isinstance(self.sliding_layers, bool) or not isinstance(self.sliding_layers, int) \
                or not 0 <= self.sliding_layers <= self.layers:
            raise ModelcutError(f"{self.name}: sliding_layers ({self.sliding_layers!r}) must be a whole number "
                                f"of layers, 0 to {self.layers}")
        if (self.sliding_window is None) != (self.sliding_layers == 0):
            raise ModelcutError(f"{self.name}: sliding_window and sliding_layers go together (a window needs "
                                "the layers that use it, and those layers a window)")
        if isinstance(self.moe_every, bool) or not isinstance(self.moe_every, int) or self.moe_every < 1:
            raise ModelcutError(f"{self.name}: moe_every must be a positive whole number (1: every layer past "
                                f"dense_layers holds experts), got {self.moe_every!r}")
        _positive(self, "attention_chunk")
        if isinstance(self.chunked_layers, bool) or not isinstance(self.chunked_layers, int) \
                or not 0 <= self.chunked_layers <= self.layers - self.sliding_layers:
            raise ModelcutError(f"{self.name}: chunked_layers ({self.chunked_layers!r}) must be a whole number "
                                f"of layers, 0 to {self.layers - self.sliding_layers} (the layers less the "
                                "sliding-window ones)")
        if (self.attention_chunk is None) != (self.chunked_layers == 0):
            raise ModelcutError(f"{self.name}: attention_chunk and chunked_layers go together (a chunk needs "
                                "the layers that use it, and those layers a chunk)")
        _positive(self, *MLA_FIELDS)
        widths = ("kv_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim")
        given = [f for f in widths if getattr(self, f) is not None]
        if given and len(given) != len(widths) or self.q_lora_rank is not None and not given:
            raise ModelcutError(f"{self.name}: multi-head latent attention needs {', '.join(widths)} together "
                                f"(q_lora_rank with them), got {', '.join(given) or 'q_lora_rank alone'}")

    @property
    def d_head(self) -> int:
        return self.head_dim or self.hidden // self.heads

    @property
    def kv_dim(self) -> int:
        """Width of K (and of V): kv_heads · head_dim."""
        return self.kv_heads * self.d_head

    @property
    def q_dim(self) -> int:
        return self.heads * self.d_head

    @property
    def is_moe(self) -> bool:
        return self.experts > 1

    @property
    def is_mla(self) -> bool:
        """Multi-head latent attention: its latent widths given (class doc)."""
        return self.kv_lora_rank is not None

    @property
    def latent_width(self) -> int:
        """Elements a token of latent attention's two latents, r_q + r_kv (no query latent: r_kv),
        which its two latent norms normalise (``q_layernorm``, ``kv_layernorm``; Megatron-core
        core_v0.15.0 multi_latent_attention.py); 0 without latent attention."""
        return (self.q_lora_rank or 0) + self.kv_lora_rank if self.is_mla else 0

    @property
    def core_width(self) -> float:
        """The attention core's width: its forward does 4·core_width FLOPs per (query, key) pair,
        QKᵀ and A·V. heads·head_dim (:attr:`q_dim`) for multi-head and grouped-query attention;
        with multi-head latent attention, whose cores run on up-projected heads,
        heads·(d_nope + d_rope + d_v)/2 (2·H·(d_nope + d_rope) + 2·H·d_v: DeepSeek-V3 128·160,
        where its grouped-query stand-in's head_dim of 96 would count 60 % of it)."""
        if self.is_mla:
            return self.heads * (self.qk_nope_head_dim + self.qk_rope_head_dim + self.v_head_dim) / 2
        return self.q_dim


#: The rank order a layout gets when it names none, innermost first: tensor, context and expert
#: parallelism next to each other, the pipeline outermost. It is Megatron-core's default
#: (megatron/core/parallel_state.py, ``initialize_model_parallel(order="tp-cp-ep-dp-pp")``), and
#: the stacks modelcut models place the pipeline outermost too: Megatron-LM 2021 (v2.5
#: megatron/mpu/initialize.py: pipeline groups are ranks ``world/pp`` apart), DeepSpeed's 3-D
#: topology (deepspeed/runtime/pipe/topology.py ``PipeModelDataParallelTopology``: axes pipe,
#: data, model, the last varying fastest) and torchtitan's device mesh (v0.2.0
#: torchtitan/distributed/parallel_dims.py: ["pp", "dp_replicate", "dp_shard", "cp", "tp"],
#: outermost first). Llama 3's order differs: [tp, cp, pp, dp] (Grattafiori et al. 2024 §3.3.2),
#: which its runs name.
DEFAULT_ORDER = ("tp", "cp", "ep", "dp", "pp")


@dataclass(frozen=True)
class Layout:
    """How a run is cut: tp, cp, pp, dp (and ep carved from dp), plus experts and schedule.

    ``vpp`` is chunks per device (None: the mode's default). ``zero`` is the data-parallel
    sharding stage: 0 none, 1 optimizer states (Megatron's distributed optimizer),
    2 + gradients, 3 + weights (FSDP); None leaves it to the training stack (the default
    model's framework preset, ``Framework.zero_stage``: FSDP's presets shard all three) and
    otherwise means none (:attr:`zero_stage`). ``sequence_parallel``: norms and dropouts cut over
    tp (Korthikanti et al. 2022); None leaves it to the stack as well (``Framework.resolve``) and
    otherwise means off. ``order`` is the rank order, innermost first (default
    :data:`DEFAULT_ORDER`).
    ``cp_kind`` is context parallelism's form, "ring", "allgather", "a2a" or "a2a+p2p"; None leaves
    it to the training stack (the default model's framework preset) and otherwise means the
    all-gather form (:attr:`cp_form`). ``cp_a2a``, with "a2a+p2p" (hierarchical), is the size of
    its all-to-all groups, adjacent cp ranks, the ring running across the cp/cp_a2a such groups
    (Megatron-LM's ``--hierarchical-context-parallel-sizes cp_a2a cp/cp_a2a``).
    ``dp_shard`` is hybrid sharding: ZeRO's sharded states split over dp_shard·cp ranks and
    replicated across dp/dp_shard such groups (PyTorch FSDP's ``HYBRID_SHARD`` and FSDP2's 2-D
    mesh, torchtitan's ``data_parallel_shard_degree`` beside ``data_parallel_replicate_degree``;
    Megatron-LM's ``--num-distributed-optimizer-instances`` = dp/dp_shard). The shard group is the
    inner part of dp in the rank order, as torchtitan's mesh [..., "dp_replicate", "dp_shard", "cp",
    "tp"] places it. None (or dp) shards over the whole data-parallel group (:attr:`shard_dp`).
    ``first_layers``/``last_layers``: the transformer layers on the first and the last pipeline
    rank, each shared evenly by that rank's chunks, the rest evenly over the middle ranks
    (Megatron-LM's ``--decoder-first-pipeline-num-layers``/``--decoder-last-pipeline-num-layers``,
    at least 1 each, core_v0.15.0 ``transformer_config.py`` "Uneven PP"; :func:`..plan.first_last_split`);
    one given, the other end takes a middle rank's share; None: the plan's even split.
    """

    tp: int = 1
    cp: int = 1
    pp: int = 1
    dp: int = 1
    ep: int = 1
    etp: int | None = None
    vpp: int | None = None
    sequence_parallel: bool | None = None
    zero: int | None = None
    schedule: str | None = None
    cp_kind: str | None = None
    order: tuple[str, ...] = DEFAULT_ORDER
    dp_shard: int | None = None
    cp_a2a: int | None = None
    first_layers: int | None = None
    last_layers: int | None = None

    def __post_init__(self) -> None:
        _positive(self, "tp", "cp", "pp", "dp", "ep", "etp", "vpp", "dp_shard")
        for name in ("first_layers", "last_layers"):
            n = getattr(self, name)
            if n is not None and (isinstance(n, bool) or not isinstance(n, int) or n < 1):
                raise ModelcutError(f"{name} must be a whole number of layers, 1 or more, got {n!r}")
        if (self.first_layers is not None or self.last_layers is not None) and self.pp < 2:
            raise ModelcutError("first_layers/last_layers place layers on the first and the last pipeline rank: "
                                f"they need pp of 2 or more (pp is {self.pp})")
        if self.dp_shard is not None and self.dp % self.dp_shard:
            raise ModelcutError(f"dp_shard ({self.dp_shard}) must divide dp ({self.dp}): the data-parallel ranks "
                                "are dp/dp_shard replicas of one shard group")
        if self.hybrid and self.ep > 1:
            raise ModelcutError(f"dp_shard {self.dp_shard} below dp {self.dp} (hybrid sharding) with expert parallelism "
                                "is not modelled; leave dp_shard out (shard over the whole data-parallel group)")
        if self.sequence_parallel not in (None, True, False):
            raise ModelcutError(f"sequence_parallel must be true or false, got {self.sequence_parallel!r}")
        if self.zero not in (None, 0, 1, 2, 3):
            raise ModelcutError(f"zero must be 0, 1, 2 or 3, got {self.zero!r}")
        if self.cp_kind is not None and self.cp_kind not in CP_KINDS:
            raise ModelcutError(f"cp_kind must be one of {', '.join(CP_KINDS)}, got {self.cp_kind!r}")
        if self.cp_a2a is not None and self.cp_kind != "a2a+p2p":
            raise ModelcutError("cp_a2a is the all-to-all groups' size of cp_kind \"a2a+p2p\" (hierarchical); "
                                "name that form or leave cp_a2a out")
        if self.cp_kind == "a2a+p2p":
            _positive(self, "cp_a2a")
            if self.cp_a2a is None:
                raise ModelcutError(f"cp_kind \"a2a+p2p\" needs cp_a2a, its all-to-all groups' size "
                                    f"(Megatron-LM's --hierarchical-context-parallel-sizes A {self.cp}/A)")
            if (why := cp_a2a_problem(self.cp, self.cp_a2a)) is not None:
                raise ModelcutError(f"cp_kind \"a2a+p2p\": {why}")

    @property
    def gpus(self) -> int:
        return self.tp * self.cp * self.pp * self.dp

    @property
    def shard_dp(self) -> int:
        """The data-parallel ranks one ZeRO shard group spans (context parallelism's ranks join it):
        ``dp_shard``, or dp where the layout leaves it open."""
        return self.dp if self.dp_shard is None else self.dp_shard

    @property
    def shard_ranks(self) -> int:
        """Ranks one ZeRO shard is split over: the shard group's dp ranks times cp."""
        return self.shard_dp * self.cp

    @property
    def hybrid(self) -> bool:
        """Whether the sharded states are replicated across shard groups (``dp_shard`` < dp)."""
        return self.shard_dp < self.dp

    @property
    def zero_stage(self) -> int:
        """``zero``, or no sharding when the layout leaves it open and no stack chooses."""
        return 0 if self.zero is None else self.zero

    @property
    def cp_form(self) -> str:
        """``cp_kind``, or the all-gather form when the layout leaves it open."""
        return self.cp_kind or "allgather"


#: How the loss's cross-entropy is computed (the bytes a logit each moves, keeps and holds:
#: :data:`.costs.loss.LOSS_KERNELS`): Megatron-LM's separate fp32 passes, a one-kernel fused loss,
#: Megatron-core's native "fused" loss (the fp32 passes grouped into compiled functions),
#: PyTorch's ``F.cross_entropy`` on the 16-bit logits or on logits cast to fp32, or that fp32 loss
#: under ``torch.compile``, or flash-attn's Triton cross-entropy.
CROSS_ENTROPY_KINDS = ("fp32-passes", "fused", "mcore-fused", "torch", "torch-fp32", "torch-compiled", "flash-attn")

#: The precisions a step's matrix products may run in: bf16 and fp16 (16-bit tensor cores, the
#: same peak) or fp8 (the stack's FP8 recipe for its linear layers, :mod:`.costs.fp8`).
PRECISIONS = ("bf16", "fp16", "fp8")
#: FP8 scaling recipes (Transformer Engine's names as Megatron-LM's ``--fp8-recipe`` spells
#: them, TransformerEngine v2.8 transformer_engine/common/recipe/__init__.py): per-tensor scales
#: from an amax history (``delayed``) or from the tensor itself (``current``, torchao's
#: tensorwise float8 too); 1×128 / 128×128 blocks (``blockwise``, DeepSeek-V3's); 32-element
#: blocks with power-of-two scales (``mxfp8``, Blackwell); and torchao's ``rowwise`` (one scale a
#: row of each product's operands, torchao/float8/config.py ``Float8LinearRecipeName.ROWWISE``,
#: torchtitan's default float8 recipe) and ``rowwise_with_gw_hp`` (rowwise, the weight gradient's
#: product in 16 bits), which only torchao runs (:mod:`.costs.fp8`).
FP8_RECIPES = ("delayed", "current", "blockwise", "mxfp8", "rowwise", "rowwise_with_gw_hp")

#: Other names the stacks give the precisions: Composer's (llm-foundry's YAMLs write ``precision:
#: amp_bf16``; Composer's Precision enum, composer/core/precision.py, also has amp_fp16 and amp_fp8),
#: PyTorch Lightning's as NeMo's ``trainer.precision`` takes them ("bf16-mixed", "16-mixed"), torch's
#: dtype names.
PRECISION_NAMES = {"bfloat16": "bf16", "amp_bf16": "bf16", "bf16-mixed": "bf16", "bf16_mixed": "bf16",
                   "float16": "fp16", "half": "fp16", "amp_fp16": "fp16", "16-mixed": "fp16", "fp16-mixed": "fp16",
                   "float8": "fp8", "amp_fp8": "fp8"}
#: The attention kernels the step model times (:mod:`.costs.kernels`): the unfused softmax path,
#: FlashAttention-2, -3 and -4, cuDNN's fused attention (Transformer Engine's FusedAttention).
ATTENTION_KINDS = ("unfused", "flash2", "flash3", "cudnn", "flash4")

#: The data types gradients may cross the data-parallel wire in (``Training.grad_reduce``): FP32,
#: or the run's 16-bit type. Each stack has a name for the switch: PyTorch FSDP's
#: ``MixedPrecision(reduce_dtype=...)`` / FSDP2's ``MixedPrecisionPolicy(reduce_dtype=...)``,
#: torchtitan's ``mixed_precision_reduce`` ("float32" or "bfloat16"), Composer's FSDP
#: ``mixed_precision`` (DEFAULT: ``reduce_dtype=torch.float32``; PURE: the precision's 16-bit type;
#: mosaicml/composer composer/distributed/mosaic_parallelism.py ``get_mixed_precision``),
#: Megatron-LM's ``--accumulate-allreduce-grads-in-fp32`` and ``--grad-reduce-in-bf16`` (with
#: ``--bf16`` it reduces in FP32 unless ``--grad-reduce-in-bf16``: megatron/training/arguments.py
#: ``validate_args`` at d98e8a64dd), NeMo's ``ddp.grad_reduce_in_fp32``.
GRAD_REDUCE_DTYPES = ("fp32", "bf16", "fp16")
#: Other names of those types: torch's dtype names.
GRAD_REDUCE_NAMES = {"float32": "fp32", "float": "fp32", "bfloat16": "bf16", "float16": "fp16", "half": "fp16"}
#: The types Adam's two moments may be kept in where a run says (:class:`Training` ``adam_moments``):
#: Megatron-core's precision-aware optimizer, ``--use-precision-aware-optimizer`` with ``--exp-avg-dtype``
#: and ``--exp-avg-sq-dtype`` (core_v0.15.0 megatron/core/optimizer/optimizer_config.py ``exp_avg_dtype``,
#: ``exp_avg_sq_dtype``: fp32 by default; bf16 among the choices); DeepSeek-V3 keeps both in BF16
#: (DeepSeek-AI 2024, arXiv 2412.19437, §3.3.2 "Low-Precision Optimizer States").
ADAM_MOMENT_DTYPES = ("fp32", "bf16")


def moment_bytes(adam_moments: str | None) -> int | None:
    """Bytes of each Adam moment element kept in ``adam_moments`` (:data:`ADAM_MOMENT_DTYPES`; None:
    the stack's, None)."""
    if adam_moments not in (None, *ADAM_MOMENT_DTYPES):
        raise ModelcutError(f"adam_moments must be one of {', '.join(ADAM_MOMENT_DTYPES)}, got {adam_moments!r}")
    return None if adam_moments is None else (FP32_BYTES if adam_moments == "fp32" else BF16_BYTES)


def half_type(precision: str) -> str:
    """A precision's 16-bit type: fp16 for fp16, else bf16 (FP8 runs keep bf16 beside their products)."""
    return "fp16" if precision == "fp16" else "bf16"


def reduce_at(grad_reduce: str | None, precision: str) -> str | None:
    """A gradient reduce type carried to ``precision``: fp32 (or None, the stack's) as it is, a
    16-bit one as that precision's own 16-bit type (:func:`half_type`)."""
    return half_type(precision) if grad_reduce in ("bf16", "fp16") else grad_reduce


def grad_reduce_name(name: str) -> str:
    """A gradient-reduction type as a stack spells it ("float32", "bfloat16", any case) as
    modelcut's; a name it does not know comes back lower-cased, for the caller's check."""
    key = str(name).strip().lower()
    return GRAD_REDUCE_NAMES.get(key, key)


#: Other names of the FP8 recipes: Megatron-core's ``--fp8-recipe tensorwise`` (Transformer Engine's
#: Float8CurrentScaling) and torchao's TENSORWISE float8 recipe (dynamic per-tensor scales) are
#: current scaling.
FP8_RECIPE_NAMES = {"tensorwise": "current", "per-tensor": "current", "rowwise-with-gw-hp": "rowwise_with_gw_hp"}
#: Recipes stacks name that modelcut does not time, with the reason their error gives.
UNTIMED_FP8_RECIPES = {
    "nvfp4": "names NVFP4, 4-bit training (Transformer Engine's NVFP4BlockScaling), which modelcut does not "
             "time: it has no FP4 product table"}


def recipe_among(precisions, fp8_recipe: str | None) -> None:
    """Refuse an FP8 recipe given beside several precisions none of which is FP8 (one line)."""
    if fp8_recipe is not None and "fp8" not in precisions:
        raise ModelcutError(f"fp8_recipe {fp8_recipe!r} needs fp8 among the precisions")


def precision_name(name: str) -> str:
    """A precision as the stacks spell it (any case: "amp_bf16", "bf16-mixed", "BF16") as modelcut's;
    a name it does not know comes back lower-cased, for the caller's check."""
    key = str(name).strip().lower()
    return PRECISION_NAMES.get(key, key)


def fp8_recipe_name(name: str) -> str:
    """An FP8 recipe as the stacks spell it ("tensorwise", "Delayed") as modelcut's; a recipe modelcut
    does not time (:data:`UNTIMED_FP8_RECIPES`) is a one-line error with the reason."""
    key = str(name).strip().lower()
    if key in UNTIMED_FP8_RECIPES:
        raise ModelcutError(f"fp8_recipe {name!r} {UNTIMED_FP8_RECIPES[key]}")
    return FP8_RECIPE_NAMES.get(key, key)


@dataclass(frozen=True)
class Training:
    """Batch and sequence: ``global_batch`` sequences per step of ``seq_len`` tokens,
    ``micro_batch`` sequences per micro-batch; ``recompute`` none | selective | full;
    ``precision`` of the matrix products (:data:`PRECISIONS`) and, with fp8, the scaling
    ``fp8_recipe`` (:data:`FP8_RECIPES`; None: the accelerator's default, as Transformer
    Engine picks it); ``local_batch``, with a pipeline, the sequences a data-parallel rank
    runs through one pipeline schedule (None: the whole step's, global_batch/dp, in one
    flush): a stack built on torch.distributed.pipelining runs its schedule once per local
    batch and accumulates gradients over global_batch/(dp·local_batch) such runs
    (:func:`.plan.flushes`; the default model times them, the seed model, the deck's, runs every
    step as one flush); ``cross_entropy``, the loss's kernel (:data:`CROSS_ENTROPY_KINDS`; None:
    the training stack's, ``Framework.cross_entropy``), a model-configuration switch in Megatron-core
    (``cross_entropy_loss_fusion``); ``recompute_modules``, with selective recomputation, the modules
    recomputed (:data:`RECOMPUTE_MODULES`, Megatron-core's ``--recompute-modules``; None: the stack's
    selective policy, the attention core or its per-op one); ``recompute_layers``, with full
    recomputation, how many layers of each pipeline chunk are recomputed, its first ones
    (Megatron-core's ``--recompute-method block --recompute-num-layers N``: TransformerBlock
    ``_checkpointed_forward`` checkpoints layer l of a chunk when l < N and runs the rest whole;
    None: every layer), the rest keeping all they save (:meth:`.plan.Stage.recomputed`);
    ``recompute_every``, with full recomputation, k: every k-th layer a rank holds is recomputed
    whole, counting the rank's layers from 1 in order, the rest kept as without recomputation
    (torchtitan's per-layer selective checkpointing, ``activation_checkpoint.mode = "selective"``
    with ``selective_ac_option = "k"``: v0.2.0 torchtitan/distributed/activation_checkpoint.py
    ``_apply_layer_sac``, a module-global count of the blocks wrapped, checkpointing block n when
    n % k == 0; job_config.py's default option is "2"); ``grad_reduce``, the data type gradients
    cross the data-parallel wire in (:data:`GRAD_REDUCE_DTYPES`: "fp32", or the run's 16-bit
    type; None: the stack's, ``Framework.grad_bytes``), which where the stack reduces its gradient
    buffer in place is that buffer's type too (:meth:`.step.frameworks.Framework.for_training`);
    ``fp8_param_gather``, with fp8, whether the linear layers' weights are kept and gathered in FP8
    (Megatron-LM's ``--fp8-param-gather``, NeMo's ``fp8_param_gather``, torchtitan's
    ``enable_fsdp_float8_all_gather``; None: the stack's, ``Framework.fp8_param_gather``; where the
    recipe cannot, :func:`.costs.fp8.resolve` keeps them 16-bit); ``attention``, the attention
    kernel (:data:`ATTENTION_KINDS`; None: the stack's, ``Framework.attention``), as Megatron-LM's
    ``--attention-backend`` or NeMo's ``attention_backend`` choose it;
    ``activation_func_fp8_input_store``, the SwiGLU's input kept for its backward in FP8, 1 byte an
    element, cast back before the backward (Megatron-core's ``activation_func_fp8_input_store``,
    core_v0.15.0 megatron/core/fusions/fused_bias_swiglu.py, in the dense MLP, shared and routed
    experts: transformer/mlp.py, moe/experts.py; SwiGLU only, transformer_config.py), whatever the
    products' precision; ``adam_moments``, the type Adam's two moments are kept in
    (:data:`ADAM_MOMENT_DTYPES`; None: the stack's), as Megatron-core's precision-aware optimizer keeps
    them."""

    seq_len: int
    global_batch: int
    micro_batch: int = 1
    recompute: str = "none"
    precision: str = "bf16"
    fp8_recipe: str | None = None
    local_batch: int | None = None
    cross_entropy: str | None = None
    recompute_modules: tuple[str, ...] | None = None
    recompute_layers: int | None = None
    recompute_every: int | None = None
    grad_reduce: str | None = None
    fp8_param_gather: bool | None = None
    attention: str | None = None
    activation_func_fp8_input_store: bool = False
    adam_moments: str | None = None

    def __post_init__(self) -> None:
        _positive(self, "seq_len", "global_batch", "micro_batch")
        if not isinstance(self.activation_func_fp8_input_store, bool):
            raise ModelcutError("activation_func_fp8_input_store must be true or false, got "
                                f"{self.activation_func_fp8_input_store!r}")
        if self.recompute_modules is not None:
            mods = self.recompute_modules
            if isinstance(mods, str) or not isinstance(mods, (tuple, list)):
                raise ModelcutError(f"recompute_modules must be a list of module names, got {mods!r}")
            object.__setattr__(self, "recompute_modules", tuple(mods))
            bad = [m for m in mods if m not in RECOMPUTE_MODULES]
            if bad:
                raise ModelcutError(f"recompute_modules: {bad[0]!r} is not one modelcut times; use "
                                    f"{', '.join(RECOMPUTE_MODULES)}")
            if not mods or len(set(mods)) != len(mods):
                raise ModelcutError("recompute_modules must name at least one module, each once")
            if self.recompute != "selective":
                raise ModelcutError(f"recompute_modules needs recompute = \"selective\", got {self.recompute!r}")
        if self.cross_entropy not in (None, *CROSS_ENTROPY_KINDS):
            raise ModelcutError(f"cross_entropy must be one of {', '.join(CROSS_ENTROPY_KINDS)}, "
                                f"got {self.cross_entropy!r}")
        if self.local_batch is not None:
            _positive(self, "local_batch")
            if self.local_batch % self.micro_batch:
                raise ModelcutError(f"local_batch ({self.local_batch}) must be a multiple of micro_batch "
                                    f"({self.micro_batch})")
        if self.recompute not in RECOMPUTE_LEVELS:
            raise ModelcutError(f"recompute must be none, selective or full, got {self.recompute!r}")
        for name, what in (("recompute_layers", "the layers recomputed whole"),
                           ("recompute_every", "every k-th layer recomputed whole")):   # the partial rules
            n = getattr(self, name)
            if n is None:
                continue
            if isinstance(n, bool) or not isinstance(n, int) or n < 1:
                raise ModelcutError(f"{name} must be a whole number of layers, at least 1, got {n!r}")
            if self.recompute != "full":
                raise ModelcutError(f"{name} needs recompute = \"full\" ({what}), got {self.recompute!r}")
        if self.recompute_layers is not None and self.recompute_every is not None:
            raise ModelcutError("recompute_layers (the first layers of each chunk) and recompute_every "
                                "(every k-th layer) are two rules; give one")
        if self.precision not in PRECISIONS:
            raise ModelcutError(f"precision must be one of {', '.join(PRECISIONS)}, got {self.precision!r}")
        if self.fp8_recipe is not None:
            if self.fp8_recipe not in FP8_RECIPES:
                raise ModelcutError(f"fp8_recipe must be one of {', '.join(FP8_RECIPES)}, got {self.fp8_recipe!r}")
            if self.precision != "fp8":
                raise ModelcutError(f"fp8_recipe {self.fp8_recipe!r} needs precision = \"fp8\"")
        if self.attention is not None and self.attention not in ATTENTION_KINDS:
            raise ModelcutError(f"attention must be one of {', '.join(ATTENTION_KINDS)}, got {self.attention!r}")
        if self.fp8_param_gather is not None:
            if not isinstance(self.fp8_param_gather, bool):
                raise ModelcutError(f"fp8_param_gather must be true or false, got {self.fp8_param_gather!r}")
            if self.fp8_param_gather and self.precision != "fp8":
                raise ModelcutError(f"fp8_param_gather needs precision = \"fp8\", got {self.precision!r}")
        moment_bytes(self.adam_moments)          # refuses a type it does not know, in one line
        if self.grad_reduce is not None:
            if self.grad_reduce not in GRAD_REDUCE_DTYPES:
                raise ModelcutError(f"grad_reduce must be one of {', '.join(GRAD_REDUCE_DTYPES)}, got {self.grad_reduce!r}")
            if self.grad_reduce != "fp32" and self.grad_reduce != self.half:
                raise ModelcutError(f"grad_reduce {self.grad_reduce!r} is not this run's 16-bit type: a {self.precision} "
                                    f"run reduces gradients in fp32 or {self.half}")

    @property
    def half(self) -> str:
        """The run's 16-bit type (:func:`half_type`)."""
        return half_type(self.precision)

    @property
    def moment_bytes(self) -> int | None:
        """Bytes of each Adam moment element as the run says (None: the stack's): :func:`moment_bytes`."""
        return moment_bytes(self.adam_moments)

    @property
    def grad_reduce_bytes(self) -> int | None:
        """Bytes a gradient element takes on the data-parallel wire as the run says (None: the stack's)."""
        return None if self.grad_reduce is None else (FP32_BYTES if self.grad_reduce == "fp32" else BF16_BYTES)

    @property
    def tokens_per_step(self) -> int:
        """Tokens a step trains on: global_batch · seq_len (throughput in tokens/s per GPU is this
        over step time · GPUs)."""
        return self.global_batch * self.seq_len

    @property
    def partial_recompute(self) -> bool:
        """Whether full recomputation covers only some layers (``recompute_layers`` or
        ``recompute_every``), the rest kept whole: :meth:`.plan.Stage.recomputes` says which."""
        return self.recompute == "full" and (self.recompute_layers is not None or self.recompute_every is not None)

    @property
    def selective_modules(self) -> tuple[str, ...]:
        """The modules selective recomputation redoes: the run's, else :data:`DEFAULT_RECOMPUTE_MODULES`."""
        return self.recompute_modules or DEFAULT_RECOMPUTE_MODULES


@dataclass(frozen=True)
class Run:
    """Everything a prediction needs."""

    model: ModelSpec
    gpu: str                 # a hardware catalog name
    layout: Layout
    training: Training
    gpus_per_node: int | None = None  # default: the hardware's
    name: str = ""

    def __post_init__(self) -> None:
        tr, m = self.training, self.model
        if tr.recompute == "selective" and "mla_up_proj" in (tr.recompute_modules or ()) and not m.is_mla:
            who = m.name or "the model"
            raise ModelcutError(f"recompute_modules: mla_up_proj needs multi-head latent attention; {who} has "
                                "none (its kv_lora_rank and head widths not given)")
        if tr.activation_func_fp8_input_store and not m.gated_mlp:
            raise ModelcutError(f"activation_func_fp8_input_store stores a SwiGLU's input; {m.name or 'the model'} "
                                "has no gated MLP")

    def with_layout(self, **kw) -> "Run":
        return replace(self, layout=replace(self.layout, **kw))

    def tokens_per_s_per_gpu(self, step_s: float) -> float:
        """Throughput as torchtitan, NeMo and llm-foundry print it: tokens a step
        (:attr:`Training.tokens_per_step`) over ``step_s`` · GPUs."""
        return self.training.tokens_per_step / (step_s * self.layout.gpus)

    def step_time_s(self, tokens_per_s_per_gpu: float) -> float:
        """The step time a throughput in tokens/s per GPU means (:meth:`tokens_per_s_per_gpu` inverted)."""
        return self.training.tokens_per_step / (tokens_per_s_per_gpu * self.layout.gpus)


@dataclass(frozen=True)
class Hardware:
    """One accelerator and the node around it, in SI units (FLOP/s, bytes, bytes/s).

    ``link_bw``: accelerator-to-accelerator bandwidth inside a node, each way;
    ``net_bw``: scale-out network bandwidth per accelerator, each way. ``kernels``: the measured
    kernel tables of its ``arch`` (:class:`.costs.tables.KernelTables`), None where none is known.
    """

    name: str
    peak_flops_16: float       # dense BF16/FP16 tensor-core peak
    peak_flops_8: float | None  # dense FP8/INT8 peak
    mem_bytes: float
    mem_bw: float
    link_bw: float
    net_bw: float
    per_node: int
    sms: int | None = None     # streaming multiprocessors (or TPU cores) for wave quantization
    link_busbw_frac: float = 1.0  # NCCL-measured ring bus bandwidth / line rate, intra-node links
    net_busbw_frac: float = 1.0   # the same over the scale-out network
    aliases: tuple[str, ...] = ()
    source: str = ""
    arch: str = ""                # the key of its measured kernel tables (catalog/kernels.toml)
    net_half_bytes: float = 0.0   # collective buffer at which the network reaches half its bus bandwidth
    net_half_bw: float = 0.0      # the bus bandwidth (B/s per accelerator) of the setup that measured it
    mem_bw_frac: float = 1.0      # measured streaming-kernel bandwidth / ``mem_bw`` (STREAM copy, triad)
    fp8_recipes: tuple[str, ...] = ()   # FP8 recipes its tensor cores run (none: no FP8)
    sustained_frac: float = 1.0   # measured sustained / burst matmul throughput (power-limited clocks)
    fp8_ceiling: float | None = None   # its own measured maximum achievable FP8 matmul (burst, FLOP/s)
    power_w: float | None = None       # the power limit it runs at (W): the datasheet's, or a cap
    power_min_w: float | None = None   # the lowest power limit it takes (W); None: unknown
    sustained_power_w: float | None = None   # the draw (W) at which ``sustained_frac`` holds; None: unknown
    kernels: Any = field(default=None, compare=False, repr=False)   # KernelTables, the catalog attaches them

    @property
    def cappable(self) -> bool:
        """Whether a lower power limit can be derived for it (``<gpu>@<watts>w``,
        :func:`.costs.kernels.held_to`): the draw behind its sustained share and its limits known."""
        return None not in (self.sustained_power_w, self.power_w, self.power_min_w)

    def as_dict(self) -> dict:
        """The figures as JSON, without the kernel tables; ``cappable`` beside them."""
        return {**{f.name: getattr(self, f.name) for f in fields(self) if f.name != "kernels"},
                "cappable": self.cappable}

    def __post_init__(self) -> None:
        for k in ("link_busbw_frac", "net_busbw_frac", "mem_bw_frac", "sustained_frac"):
            x = getattr(self, k)
            if isinstance(x, bool) or not isinstance(x, (int, float)) or not 0 < x <= 1:
                raise ModelcutError(f"hardware {self.name}: {k} must be in (0, 1], got {x!r}")
