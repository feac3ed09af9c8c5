"""How the training stacks name their settings, read as modelcut's: the stacks' names for the
overlap options (:data:`..frameworks.OPTIONS`) and the converse ones, PyTorch FSDP's prefetch
settings, the overlap settings modelcut takes but does not model (each with the note an answer
carries), the tuning settings it takes and leaves, and the names Megatron-LM and torchtitan give
their attention backends, sharding strategies and context-parallel forms. Tables with their
sources and the pure readers over them; the service reads ``--overlap``, the API's ``overlap``
object and the launch lines through them (``service/inputs.py``, ``service/requests.py``,
``service/megatron_args.py``) and the exporters write through them (``export/emit.py``)."""

from __future__ import annotations

from ..errors import ModelcutError
from .deepspeed_stage3 import (MAX_REUSE_DISTANCE_NUMEL, PERSISTENCE_THRESHOLD_NUMEL, PREFETCH_BUCKET_NUMEL,
                               REDUCE_BUCKET_NUMEL)
from .frameworks import OPTIONS

#: The stacks' own names for these options, as their users write them (any case, "-" or "_"):
#: Megatron-LM's flags --overlap-grad-reduce, --overlap-param-gather, --tp-comm-overlap and
#: --no-overlap-p2p-communication (dest overlap_p2p_comm; megatron/training/arguments.py @d98e8a64dd;
#: a "no-" flag is its option off, :func:`negated_option`), NeMo's tp_comm_overlap and its 1.x
#: ub_tp_comm_overlap, NeMo 1.x distributed_fused_adam's overlap_grad_sync and overlap_param_sync,
#: torchtitan's enable_async_tensor_parallel (torchtitan/config/job_config.py Parallelism),
#: DeepSpeed's ZeRO overlap_comm ("Attempts to overlap the reduction of the gradients with backward
#: computation": deepspeed/runtime/zero/config.py DeepSpeedZeroConfig.overlap_comm, docs config-json).
OPTION_ALIASES: dict[str, str] = {
    "overlap_grad_reduce": "grad_reduce", "overlap_grad_sync": "grad_reduce",
    "overlap_param_gather": "param_gather", "overlap_param_sync": "param_gather",
    "overlap_p2p_comm": "p2p_async", "overlap_p2p_communication": "p2p_async",
    "tp_comm_overlap": "tp_comm", "ub_tp_comm_overlap": "tp_comm",
    "enable_async_tensor_parallel": "tp_comm", "async_tp": "tp_comm",
    "overlap_comm": "grad_reduce",
}

#: Megatron-FSDP's ``--data-parallel-sharding-strategy`` (NeMo's ``ddp.data_parallel_sharding_strategy``)
#: by the ZeRO stage it is (Megatron-LM d98e8a64dd megatron/training/arguments.py: no_shard, optim,
#: optim_grads, optim_grads_params, the last the default): what ``--emit`` writes and ``from-megatron`` reads.
MEGATRON_FSDP_SHARDING = {"no_shard": 0, "optim": 1, "optim_grads": 2, "optim_grads_params": 3}
#: Megatron-core's --attention-backend (AttnBackend, megatron/core/transformer/enums.py; the
#: Transformer Engine backend each sets, megatron/core/models/common/language_module/language_module.py:
#: flash sets NVTE_FLASH_ATTN=1, fused NVTE_FUSED_ATTN=1) as modelcut's kernel: flash is
#: FlashAttention-2 (Transformer Engine runs FlashAttention-3 only where the container installs it:
#: a RUN.toml says attention = "flash3" then), fused cuDNN's fused attention, unfused and local the
#: unfused softmax path; auto leaves it to the stack.
ATTENTION_BACKENDS = {"flash": "flash2", "fused": "cudnn", "unfused": "unfused", "local": "unfused", "auto": None}
#: The backend ``--emit`` writes for each kernel a run names (FlashAttention-3 and -4 are Transformer
#: Engine's flash backend where the container installs them).
MEGATRON_ATTENTION_BACKEND = {"flash2": "flash", "flash3": "flash", "flash4": "flash", "cudnn": "fused",
                              "unfused": "unfused"}
#: torchtitan's ``context_parallel_rotate_method`` by modelcut's form: PyTorch's context parallelism
#: gathers K and V whole or rotates them round the ring (torch.distributed.tensor.experimental
#: ``_RotateMethod`` ALL_GATHER, ALL_TO_ALL; torchtitan v0.2.2 job_config.py): what ``--emit
#: torchtitan`` writes and ``from-torchtitan`` reads.
TORCHTITAN_ROTATE = {"allgather": "allgather", "alltoall": "ring"}

#: The stacks' overlap settings modelcut knows but does not model, each with what it would change
#: and how modelcut times the step instead. ``--overlap`` (and the API's ``overlap`` object) takes
#: them, so that a run's own settings can be given as its stack writes them, and the answer carries
#: the line as a note (:func:`unmodelled_note`; off, or ``no-``, is what modelcut times: no note).
#: Megatron-core's --overlap-moe-expert-parallel-comm (with --delay-wgrad-compute; Megatron-Bridge's
#: moe_a2a_overlap sets both: Megatron-Bridge v0.2.0 scripts/performance/utils/helpers.py) runs one
#: micro-batch's expert all-to-all under another's compute (megatron/core/pipeline_parallel/
#: combined_1f1b.py); its --defer-embedding-wgrad-compute (with --wgrad-deferral-limit),
#: --align-param-gather and --overlap-param-gather-with-optimizer-step move work into the
#: pipeline's flush or beside the optimizer step (NeMo's and Megatron-Bridge's CommOverlapConfig
#: carries the first two); its --moe-shared-expert-overlap runs the shared experts beside the
#: dispatcher's communication; --tp-comm-overlap-rs-dgrad pipelines a column-parallel data
#: gradient's reduce-scatter behind it; --ddp-bucket-size sizes the gradient buckets (core_v0.15.0
#: megatron/training/arguments.py, model_parallel_config.py, distributed_data_parallel_config.py,
#: optimizer_config.py).
UNMODELLED_OPTIONS: dict[str, str] = {
    **dict.fromkeys(
        ("overlap_moe_expert_parallel_comm", "moe_a2a_overlap", "delay_wgrad_compute"),
        "Megatron-core's overlap of one micro-batch's expert all-to-all with another's compute is not modelled: "
        "the all-to-all is timed exposed (the a2a term), so the step is timed as if it hid nothing"),
    # Megatron-core core_v0.15.0 model_parallel_config.py: "defers the embedding WGRAD GEMMs while
    # pipeline flush is taking place", for the first wgrad_deferral_limit micro-batches (0: all)
    "defer_embedding_wgrad_compute":
        "Megatron-core's deferral of the output layer's weight-gradient products to the pipeline's flush is "
        "not modelled: they are timed in each micro-batch's backward on the last stage",
    # distributed_data_parallel_config.py: "all PP stages will launch param all-gathers simultaneously"
    "align_param_gather":
        "Megatron-core's launch of every pipeline stage's parameter all-gathers at once is not modelled: "
        "each stage's gathers are timed ahead of their use (param_gather)",
    # training/arguments.py --moe-shared-expert-overlap: "Enable overlapping between shared expert
    # computations and dispatcher communications"
    "moe_shared_expert_overlap":
        "Megatron-core's run of the shared experts beside the token dispatcher's communication is not modelled "
        "for its own dispatchers: they are timed after the all-to-all (the a2a term; only the nemo-automodel "
        "preset's DeepEP runs them beside it)",
    # optimizer/optimizer_config.py: "overlap param all-gather of first bucket with optimizer step"
    "overlap_param_gather_with_optimizer_step":
        "Megatron-core's overlap of the first bucket's parameter all-gather with the optimizer step is not "
        "modelled: that gather is timed ahead of the first forward (param_gather)",
    # training/arguments.py --tp-comm-overlap-rs-dgrad: "Enables the Reduce-Scatter overlap with dgrad GEMM"
    "tp_comm_overlap_rs_dgrad":
        "Transformer Engine's reduce-scatter pipelined behind a column-parallel data gradient is not "
        "modelled: tp_comm times that backward's collectives as its bulk overlaps run them",
}

#: Settings that size or shape a stack's collectives, which modelcut does not read: whatever their
#: value, the answer notes that it is not read (:func:`unmodelled_note`). Megatron-LM's
#: --ddp-bucket-size (NeMo's and Megatron-Bridge's ddp ``bucket_size``), and DeepSpeed ZeRO's
#: bucket, prefetch, reuse and persistence sizes and its gradient layout (the ``zero_optimization``
#: block: DeepSpeedZeroConfig, microsoft/DeepSpeed deepspeed/runtime/zero/config.py @v0.16.4).
_UNIT_BY_UNIT = "gradients are timed as reduced unit by unit as each unit's backward ends (grad_reduce)"
_DEEPSPEED_REPLAY = (f"the deepspeed-zero3 preset replays DeepSpeed v0.3.13's defaults (reduce buckets of "
                     f"{REDUCE_BUCKET_NUMEL:.0e} elements, prefetch {PREFETCH_BUCKET_NUMEL:.0e}, reuse distance "
                     f"{MAX_REUSE_DISTANCE_NUMEL:.0e}, persistence {PERSISTENCE_THRESHOLD_NUMEL:.0e}), and the other "
                     "stacks reduce and gather unit by unit").replace("e+0", "e")
NOT_READ_SETTINGS: dict[str, str] = {
    **dict.fromkeys(("ddp_bucket_size", "bucket_size"), f"the data-parallel bucket size is not read: {_UNIT_BY_UNIT}"),
    **dict.fromkeys(
        ("reduce_bucket_size", "allgather_bucket_size", "stage3_prefetch_bucket_size", "prefetch_bucket_size",
         "stage3_max_live_parameters", "max_live_parameters", "stage3_max_reuse_distance", "max_reuse_distance",
         "stage3_param_persistence_threshold", "param_persistence_threshold", "sub_group_size",
         "contiguous_gradients", "reduce_scatter", "allgather_partitions", "round_robin_gradients",
         "use_multi_rank_bucket_allreduce"),
        f"DeepSpeed ZeRO's setting is not read: {_DEEPSPEED_REPLAY}"),
}

#: Parts of Transformer Engine's tensor-parallel overlap that Megatron-LM turns on with
#: --tp-comm-overlap and its ``--disable-tp-comm-*`` flags turn off (dest ``tp_comm_overlap_ag``,
#: ``tp_comm_overlap_rs``, ``tp_comm_bulk_dgrad``, ``tp_comm_bulk_wgrad``, ``tp_comm_split_ag``,
#: ``tp_comm_split_rs``, each default True: core_v0.15.0 megatron/training/arguments.py). On is what
#: ``tp_comm`` times; off is not modelled, and the answer says so (:func:`unmodelled_note`).
TP_COMM_PARTS = ("tp_comm_overlap_ag", "tp_comm_overlap_rs", "tp_comm_bulk_dgrad", "tp_comm_bulk_wgrad",
                 "tp_comm_split_ag", "tp_comm_split_rs")
#: Settings that tune an overlap modelcut times without changing what it times, taken and left:
#: Transformer Engine's userbuffers configuration (--tp-comm-overlap-cfg, NeMo's
#: tp_comm_overlap_cfg: the tuned chunkings ``tp_comm`` times for NeMo's stacks) and its bootstrap
#: backend (--tp-comm-bootstrap-backend: how the buffers are set up, once); Megatron-core's
#: --overlap-p2p-communication-warmup-flush (overlap_p2p_comm_warmup_flush: ``p2p_async`` already
#: runs the warmup's and flush's exchanges beside compute); --wgrad-deferral-limit (how many
#: micro-batches --defer-embedding-wgrad-compute defers, 0 all: that flag carries the note); DeepSpeed
#: ZeRO's checkpoint settings (deepspeed/runtime/zero/config.py @v0.16.4).
TUNING_SETTINGS = ("tp_comm_overlap_cfg", "tp_comm_bootstrap_backend", "overlap_p2p_comm_warmup_flush",
                   "overlap_p2p_communication_warmup_flush", "wgrad_deferral_limit",
                   # DeepSpeed ZeRO's settings of checkpoints and of its module hooks, none of a step's work
                   "stage3_gather_16bit_weights_on_model_save", "gather_16bit_weights_on_model_save",
                   "stage3_gather_fp16_weights_on_model_save", "load_from_fp32_weights", "elastic_checkpoint",
                   "ignore_unused_parameters")


#: PyTorch FSDP's own prefetch settings (FullyShardedDataParallel's ``forward_prefetch``,
#: ``backward_prefetch`` and ``limit_all_gathers``, torch 2.13 torch/distributed/fsdp/
#: fully_sharded_data_parallel.py and api.py ``BackwardPrefetch``), as Composer's ``fsdp_config`` passes
#: them through and llm-foundry's benchmark sweep sets them (``--fsdp_config_forward_prefetch true
#: --fsdp_config_backward_prefetch BACKWARD_PRE --fsdp_config_limit_all_gathers true``,
#: mosaicml/llm-foundry scripts/train/benchmarking/sweep.py @8c8dd48f7), read as modelcut's options
#: (:func:`fsdp_setting`). ``fsdp_config_`` before a name is dropped.
FSDP_SETTINGS = ("forward_prefetch", "backward_prefetch", "limit_all_gathers")
#: ``backward_prefetch``'s values that prefetch: BACKWARD_PRE issues the next unit's gather before the
#: current unit's gradient products, BACKWARD_POST after them but before its reduce-scatter, so that
#: with the host ahead of the device, as modelcut times a step, each runs beside the current unit's
#: backward (FSDP1's ``_pre_backward_hook`` and ``_post_backward_reshard`` call ``_prefetch_handle``;
#: torch 2.13 torch/distributed/fsdp/_runtime_utils.py).
BACKWARD_PREFETCHES = ("backward_pre", "backward_post")
#: The words an option's value may be, on or off (``--overlap tp_comm=yes``, a YAML line's ``false``).
ON_WORDS, OFF_WORDS = ("on", "true", "1", "yes"), ("off", "false", "0", "no")
#: The words a value may be that leave a setting as the stack sets it (a YAML or JSON null, Python's None).
NULL_WORDS = ("none", "null")


def flag_key(key: str) -> str:
    """A flag as the option tables key it: no leading dashes, lower case, "_" for "-"."""
    return key.strip().lstrip("-").lower().replace("-", "_")


def fsdp_setting(key: str, value: object) -> dict[str, bool] | None:
    """The overlap options PyTorch FSDP's setting ``key`` = ``value`` (:data:`FSDP_SETTINGS`) stands for,
    None where ``key`` is none of them:

    * ``backward_prefetch`` BACKWARD_PRE or BACKWARD_POST (``BackwardPrefetch.BACKWARD_PRE`` too; on,
      or the key alone, as a launch line's bare flag): ``param_gather`` on, the backward's gathers
      ahead of use (:data:`BACKWARD_PREFETCHES`). None changes no option and is noted
      (:func:`fsdp_note`): FSDP then issues each unit's gather after the previous unit's
      reduce-scatter, on the one NCCL stream ("This has no overlap", api.py), which ``param_gather``
      on (both passes prefetched) or off (neither) does not describe.
    * ``forward_prefetch``, true or false: no change. FSDP issues a unit's forward gather when the
      host reaches it, ahead of a device-bound forward, and the explicit prefetch "is only useful
      for CPU-bound workloads" (its docstring); modelcut times the forward's gathers ahead of use
      with ``param_gather``.
    * ``limit_all_gathers``, true or false: no change. The rate limiter keeps two units gathered,
      the one computing and the next (its docstring), as ``param_gather``'s one-unit prefetch does
      (:func:`.exposure.prefetch_timeline`); without it more gathers may be in flight, which a
      device-bound step does not need."""
    k = flag_key(key).removeprefix("fsdp_config_")
    if k not in FSDP_SETTINGS:
        return None
    v = str(value).strip().lower().rsplit(".", 1)[-1]
    if k == "backward_prefetch":
        if v in BACKWARD_PREFETCHES + ON_WORDS:
            return {"param_gather": True}
        if v in NULL_WORDS + OFF_WORDS:
            return {}                      # taken; its note: fsdp_note
        raise ModelcutError(f"overlap option {key}: {value!r} is not BACKWARD_PRE, BACKWARD_POST or None")
    if v not in ON_WORDS + OFF_WORDS:
        raise ModelcutError(f"overlap option {key}: {value!r} is not true or false")
    return {}


def fsdp_note(key: str, value: object) -> str | None:
    """The note an answer carries for PyTorch FSDP's setting ``key`` = ``value`` (:func:`fsdp_setting`)
    where it asks for what modelcut does not model: ``backward_prefetch`` None (or off), with which FSDP
    issues each unit's backward gather after the previous unit's reduce-scatter, on the one NCCL stream
    ("This has no overlap", torch 2.13 torch/distributed/fsdp/api.py ``BackwardPrefetch``); the step is
    timed with the stack's ``param_gather`` as it is, which with it on hides those gathers."""
    k = flag_key(key).removeprefix("fsdp_config_")
    v = str(value).strip().lower().rsplit(".", 1)[-1]
    if k == "backward_prefetch" and v in NULL_WORDS + OFF_WORDS:
        return (f"{key.strip()[:60]}{_shown(value)}: PyTorch FSDP without backward prefetching queues each "
                "unit's gather behind the previous unit's reduce-scatter, which is not modelled: the step is "
                "timed with the stack's param_gather as set (on: the backward's gathers ahead of use)")
    return None


def option_name(key: str) -> str | None:
    """An overlap option as a user may write it (``tp_comm``, ``--tp-comm-overlap``, ``Async_TP``): its
    name in :data:`OPTIONS`, or None where it is none of them."""
    k = flag_key(key)
    return k if k in OPTIONS else OPTION_ALIASES.get(k)


def unmodelled_option(key: str) -> str | None:
    """What an overlap setting a stack has is, where it is none of modelcut's options: the note of
    :data:`UNMODELLED_OPTIONS` (a ``no-`` flag too) or :data:`NOT_READ_SETTINGS`, for a part of the tensor-parallel overlap
    (:data:`TP_COMM_PARTS`, ``disable_`` flags too) what turning it off leaves unmodelled, "" for a
    tuning setting (:data:`TUNING_SETTINGS`); None where it is no such setting."""
    k = flag_key(key).removeprefix("zero_optimization.")
    for name in (k, k.removeprefix("no_"), k.removeprefix("disable_")):
        if name in UNMODELLED_OPTIONS:
            return UNMODELLED_OPTIONS[name]
        if name in NOT_READ_SETTINGS:
            return NOT_READ_SETTINGS[name]
        if name in TP_COMM_PARTS:
            return (f"Megatron-LM's {name} off (a part of Transformer Engine's tensor-parallel overlap) is not "
                    "modelled: tp_comm times every part on or every part off")
        if name in TUNING_SETTINGS:
            return ""
    return None


def unmodelled_note(key: str, value: object) -> str | None:
    """The note an answer carries for the stack's setting ``key`` = ``value`` (None: the key alone,
    as a launch line's flag) where it asks for what modelcut does not model (:func:`unmodelled_option`);
    None where it asks for what modelcut times: an unmodelled overlap off (a ``no-`` flag, false, 0,
    none), a tensor-parallel part on (its ``disable-`` flag off), a tuning setting at any value, a
    setting not read (:data:`NOT_READ_SETTINGS`) left null. Raises for a key that is no such setting."""
    why = unmodelled_option(key)
    if why is None:
        raise ModelcutError(f"overlap option: unknown key {key!r}")
    k = flag_key(key).removeprefix("zero_optimization.")
    v = None if value is None else str(value).strip().lower()
    if k in NOT_READ_SETTINGS:                 # not read, whatever its value; null leaves it as the stack sets it
        return None if v in NULL_WORDS else f"{key.strip()[:60]}{_shown(value)}: {why}"
    on = v is None or v not in OFF_WORDS + NULL_WORDS
    if k.startswith(("no_", "disable_")):
        on = not on
    part = k.removeprefix("disable_") in TP_COMM_PARTS
    if not why or on == part:         # a tuning setting; an unmodelled overlap off; a part of tp_comm on
        return None
    return f"{key.strip()[:60]}{_shown(value)}: {why}"


def _shown(value: object) -> str:
    """A setting's value as a note shows it: "=value", cut at 40 characters; nothing for a flag alone."""
    shown = "" if value is None else "=" + str(value).strip()
    return shown if len(shown) <= 41 else shown[:40] + "…"


#: The stacks' settings that say the converse of an option: Megatron-core's ``batch_p2p_comm``
#: ("Use batch_isend_irecv instead of individual isend/irecv calls. Must be False if
#: overlap_p2p_comm is True", core_v0.15.0 megatron/core/model_parallel_config.py), which Megatron-LM
#: sets to ``not overlap_p2p_comm`` (megatron/training/arguments.py) and NeMo's and Megatron-Bridge's
#: CommOverlapConfig to the converse of overlap_p2p_comm with a pipeline (Megatron-Bridge v0.2.0
#: src/megatron/bridge/training/comm_overlap.py).
CONVERSE_ALIASES: dict[str, str] = {"batch_p2p_comm": "p2p_async"}


def negated_option(key: str) -> str | None:
    """The option a "no-" flag turns off (``--no-overlap-p2p-communication``: p2p_async), or a
    setting that says its converse (:data:`CONVERSE_ALIASES`) turns off when on, None where ``key``
    is no such flag."""
    k = flag_key(key)
    return option_name(k[3:]) if k.startswith("no_") else CONVERSE_ALIASES.get(k)
