"""A chosen layout as launch settings: Megatron-LM command-line arguments and a torchtitan
TOML. Mapping only, no formulas.

Megatron-LM flags (megatron/training/arguments.py): ``--tensor-model-parallel-size``,
``--context-parallel-size`` with ``--cp-comm-type``, ``--pipeline-model-parallel-size``,
``--expert-model-parallel-size`` and ``--expert-tensor-parallel-size`` (core_r0.11.0; its default is tp),
``--num-virtual-stages-per-pipeline-rank``, ``--sequence-parallel``,
``--micro-batch-size``/``--global-batch-size``/``--seq-length``,
``--use-distributed-optimizer`` (ZeRO-1) with ``--num-distributed-optimizer-instances`` (hybrid
sharding: dp/dp_shard replicas of the sharded states), Megatron-FSDP's ``--use-megatron-fsdp
--data-parallel-sharding-strategy optim_grads|optim_grads_params`` (ZeRO-2/3),
``--recompute-granularity selective|full`` (full: ``--recompute-method uniform
--recompute-num-layers 1``, or ``--recompute-method block --recompute-num-layers N`` for the first N
layers of each chunk; selective of named modules: ``--recompute-modules``), and for an uneven split ``--pipeline-model-parallel-layout``
("E" embedding, "t" a transformer layer, "L" the loss, "|" between virtual stages in
pipeline order; docs/source/user-guide/features/pipeline_parallel_layout.md), or, where the layout
gives its end ranks' layers (a lighter last rank), ``--decoder-first-pipeline-num-layers`` /
``--decoder-last-pipeline-num-layers`` (NeMo 2.0 and Megatron-Bridge: the model config's
``num_layers_in_first_pipeline_stage`` / ``num_layers_in_last_pipeline_stage``).

torchtitan (torchtitan/config/job_config.py): ``[parallelism]`` with
``data_parallel_replicate_degree``/``data_parallel_shard_degree`` (dp/dp_shard and dp_shard with
hybrid sharding; FSDP2 shards weights,
gradients and optimizer states: ZeRO-3; ``fsdp_reshard_after_forward = "never"`` keeps
the gathered weights through the backward, the memory of ZeRO-2), ``tensor_parallel_degree``,
``context_parallel_degree``/``context_parallel_rotate_method``, ``expert_parallel_degree`` and
``expert_tensor_parallel_degree`` (v0.2.2: 1, whose default it is, or tp), ``pipeline_parallel_degree``,
``pipeline_parallel_schedule`` (torch.distributed.pipelining names), ``pipeline_parallel_microbatch_size``
and ``module_fqns_per_model_part`` (the exact split); ``[activation_checkpoint] mode``;
``[training] local_batch_size (one forward's sequences without a pipeline, one schedule run's with
one: the step accumulates gradients over global_batch_size/(local_batch_size·dp) of them, v0.2.2
train.py), global_batch_size, seq_len``.

NeMo 2.0 (NeMo-Run overrides of a pretraining recipe, ``nemo llm pretrain --factory RECIPE``):
``trainer.strategy`` (``MegatronStrategy``: ``tensor_model_parallel_size``,
``pipeline_model_parallel_size``, ``virtual_pipeline_model_parallel_size``,
``context_parallel_size``, ``sequence_parallel``, ``expert_model_parallel_size`` (and
``expert_tensor_parallel_size`` where the experts are not cut as the attention),
``account_for_embedding_in_pipeline_split``/``account_for_loss_in_pipeline_split`` for the split
that gives the embedding and the loss a layer's slot, ``fsdp = "megatron"`` with
``ddp.data_parallel_sharding_strategy`` for ZeRO-2/3: NeMo v2.4 nemo/lightning/pytorch/strategies/
megatron_strategy.py, scripts/performance/helpers.py), ``optim.config.use_distributed_optimizer``
(ZeRO-1), ``model.config.recompute_granularity``/``recompute_method``/``recompute_num_layers``/``recompute_modules``,
``model.config.cp_comm_type``, and ``data.micro_batch_size``/``global_batch_size``/``seq_length``.

Precision, each stack's own names for modelcut's recipes (delayed, current, blockwise, mxfp8, and
torchao's rowwise and rowwise_with_gw_hp, which only the torchtitan arguments can name):
Megatron-LM ``--bf16``/``--fp16``, and for FP8 ``--fp8-format hybrid --fp8-recipe
delayed|tensorwise|blockwise|mxfp8`` with ``--fp8-param-gather`` where the weights are gathered in
FP8 (core_v0.15.0 megatron/training/arguments.py); torchtitan (v0.2.2 docs/float8.md and
torchtitan/config/job_config.py ``Float8Linear``/``MXLinear``) ``[model] converters =
["quantize.linear.float8"]`` with ``[quantize.linear.float8]`` tensorwise scaling (current scaling;
``enable_fsdp_float8_all_gather``, ``precompute_float8_dynamic_scale_for_fsdp``, the output layer
left in bf16 by ``filter_fqns``) or ``recipe_name = "rowwise"`` / ``"rowwise_with_gw_hp"`` (job_config.py ``Float8Linear.recipe_name``), or ``["quantize.linear.mx"]`` with ``recipe_name =
"mxfp8_cublas"``, and no delayed or blockwise recipe; NeMo 2.0 (v2.5.0rc0
nemo/lightning/pytorch/plugins/mixed_precision.py ``MegatronMixedPrecision``, as the recipes'
``bf16_with_fp8_mixed`` sets it) ``trainer.plugins.fp8=hybrid``,
``trainer.plugins.fp8_recipe=delayed|tensorwise|blockwise|mxfp8`` and
``trainer.plugins.fp8_param_gather``. Adam's moments in bf16 (``adam_moments``): Megatron-LM's
``--use-precision-aware-optimizer --exp-avg-dtype bf16 --exp-avg-sq-dtype bf16``.
"""

from __future__ import annotations

from ..core.costs.fp8 import ROWWISE
from ..core.explore import Evaluated
from ..core.sim import registry
from ..core.step.stack_names import MEGATRON_ATTENTION_BACKEND, MEGATRON_FSDP_SHARDING, TORCHTITAN_ROTATE

#: modelcut's context-parallel forms by Megatron-LM's --cp-comm-type names (NeMo's cp_comm_type spells
#: the all-gather form all_gather: Megatron-core transformer_config.py, Transformer Engine).
_CP_KIND = {"allgather": "allgather", "ring": "p2p", "a2a": "a2a", "a2a+p2p": "a2a+p2p"}
_NEMO_CP_KIND = {"allgather": "all_gather", "ring": "p2p", "a2a": "a2a", "a2a+p2p": "a2a+p2p"}
#: The stacks' names by what they mean to modelcut (the tables' inverses: core/step/frameworks.py).
_SHARDING_NAME = {z: name for name, z in MEGATRON_FSDP_SHARDING.items()}
_ROTATE_NAME = {kind: name for name, kind in TORCHTITAN_ROTATE.items()}
#: modelcut's FP8 recipes by Megatron-core's (and NeMo's) names: current scaling is "tensorwise".
_MCORE_RECIPE = {"delayed": "delayed", "current": "tensorwise", "blockwise": "blockwise", "mxfp8": "mxfp8"}


def _precision(e: Evaluated) -> tuple[str, object]:
    """The layout's precision and, with fp8, the recipe it was timed with (its memory options')."""
    return e.run.training.precision, e.options.fp8


def _split(e: Evaluated) -> tuple[int, ...]:
    """Layers per virtual stage, in pipeline order: the plan the layout was timed with."""
    if e.prediction is not None and e.prediction.stage_layers:
        return tuple(e.prediction.stage_layers)
    return e.plan.layers


def megatron_layout(split: tuple[int, ...]) -> str:
    """Megatron-LM's ``--pipeline-model-parallel-layout`` for a split (virtual stages in
    order), runs of three or more equal stages written ``(seg|)*k`` as Megatron-LM's
    examples do: Llama 3 405B on 16 × 8 stages gives "E|(t|)*126L"."""
    segs = []
    for s, n in enumerate(split):
        items = (["E"] if s == 0 else []) + ([("t" if n == 1 else f"t*{n}")] if n else [])
        if s == len(split) - 1:
            items.append("L")
        segs.append(",".join(items))
    out, i = "", 0
    while i < len(segs):
        j = i
        while j < len(segs) and segs[j] == segs[i]:
            j += 1
        k = j - i
        out += f"({segs[i]}|)*{k}" if k >= 3 else (segs[i] + "|") * k
        i = j
    return out[:-1] if out.endswith("|") else out


def _stack(framework) -> tuple[dict[str, bool] | None, str | None]:
    """The overlaps (``Overlap.as_dict``) and the loss kernel of the stack a layout was timed on;
    (None, None) without one (the seed mode)."""
    if framework is None:
        return None, None
    return framework.overlap.as_dict(), framework.cross_entropy


def megatron_args(e: Evaluated, framework=None) -> str:
    """Megatron-LM arguments for the layout, one per line, with ``#`` notes where a setting
    has no Megatron-LM flag. ``framework``: the stack the layout was timed on; its overlaps are
    given as Megatron-LM's flags, each off where absent:
    ``--overlap-grad-reduce``, ``--overlap-param-gather`` (with the distributed optimizer, which
    Megatron-LM requires for it), ``--tp-comm-overlap`` (with tp > 1) and
    ``--no-overlap-p2p-communication`` (with a pipeline, where the sends are not overlapped); its
    loss as ``--cross-entropy-loss-fusion`` (Megatron-core's native fusion, mcore-fused) with
    ``--cross-entropy-fusion-impl te`` (Transformer Engine's, fused); without either flag Megatron-LM
    runs its separate fp32 passes."""
    s, run = e.structure, e.run
    tr, lay = run.training, run.layout
    overlap, loss = _stack(framework)
    loss = tr.cross_entropy or loss
    lines = [f"--tensor-model-parallel-size {s.tp}"]
    if s.tp > 1:
        lines.append("--sequence-parallel")
    if s.cp > 1:
        lines += [f"--context-parallel-size {s.cp}", f"--cp-comm-type {_CP_KIND.get(lay.cp_kind or 'ring', 'p2p')}"]
        if lay.cp_a2a:     # the all-to-all groups, then the ring across them (Megatron-LM arguments.py)
            lines.append(f"--hierarchical-context-parallel-sizes {lay.cp_a2a} {s.cp // lay.cp_a2a}")
    lines.append(f"--pipeline-model-parallel-size {s.pp}")
    ep = s.ep
    if ep > 1:
        lines.append(f"--expert-model-parallel-size {ep}")
        if s.expert_tp != s.tp:
            lines.append(f"--expert-tensor-parallel-size {s.expert_tp}")
    split = _split(e)
    uneven = len(set(split)) > 1
    if lay.first_layers is not None or lay.last_layers is not None:   # Megatron-core's uneven split, as given
        if s.vpp > 1:
            lines.append(f"--num-virtual-stages-per-pipeline-rank {s.vpp}")
        lines += [f"--decoder-{end}-pipeline-num-layers {n}"
                  for end, n in (("first", lay.first_layers), ("last", lay.last_layers)) if n is not None]
    elif uneven:
        lines.append(f'--pipeline-model-parallel-layout "{megatron_layout(split)}"')
    elif s.vpp > 1:
        lines.append(f"--num-virtual-stages-per-pipeline-rank {s.vpp}")
    lines += [f"--micro-batch-size {tr.micro_batch}", f"--global-batch-size {tr.global_batch}",
              f"--seq-length {tr.seq_len}"]
    if e.zero == 1:
        lines.append("--use-distributed-optimizer")
    elif e.zero in (2, 3):
        strategy = _SHARDING_NAME[e.zero]
        lines += ["--use-distributed-optimizer", "--use-megatron-fsdp",
                  f"--data-parallel-sharding-strategy {strategy}"]
    if s.dp_shard and e.zero >= 1:
        lines.append(f"--num-distributed-optimizer-instances {s.dp // s.dp_shard}")
    if overlap:
        lines += [flag for flag, on in (("--overlap-grad-reduce", overlap.get("grad_reduce")),
                                        ("--overlap-param-gather", overlap.get("param_gather") and e.zero >= 1),
                                        ("--tp-comm-overlap", overlap.get("tp_comm") and s.tp > 1),
                                        ("--no-overlap-p2p-communication",
                                         s.pp > 1 and not overlap.get("p2p_async", True))) if on]
    if tr.recompute == "selective":
        lines.append("--recompute-granularity selective")
        if tr.recompute_modules:
            lines.append("--recompute-modules " + " ".join(tr.recompute_modules))
    elif tr.recompute_layers is not None:
        lines += ["--recompute-granularity full", "--recompute-method block",
                  f"--recompute-num-layers {tr.recompute_layers}"]
    elif tr.recompute_every is not None:
        lines.append(f"# one layer in {tr.recompute_every} recomputed whole (torchtitan's per-layer rule): Megatron-LM "
                     "has the block and uniform methods only")
    elif tr.recompute == "full":
        lines += ["--recompute-granularity full", "--recompute-method uniform", "--recompute-num-layers 1"]
    if loss in ("mcore-fused", "fused"):
        lines.append("--cross-entropy-loss-fusion")
        if loss == "fused":
            lines.append("--cross-entropy-fusion-impl te")
    elif loss not in (None, "fp32-passes"):
        lines.append(f"# the loss timed as {loss}: Megatron-LM runs its fp32 passes, or its fused kernels with "
                     "--cross-entropy-loss-fusion")
    if tr.attention is not None:      # the kernel the run names, as Megatron-LM's backend (auto: the stack's)
        lines.append(f"--attention-backend {MEGATRON_ATTENTION_BACKEND[tr.attention]}")
    precision, f8 = _precision(e)
    lines.append("--fp16" if precision == "fp16" else "--bf16")
    # the gradients' reduce type as timed, against Megatron-LM's own rule (fp32 with --bf16, 16-bit with --fp16)
    if framework is not None and precision == "fp16" and framework.grad_bytes == 4:
        lines.append("--accumulate-allreduce-grads-in-fp32")
    elif framework is not None and precision != "fp16" and framework.grad_bytes == 2:
        lines.append("--grad-reduce-in-bf16")
    if f8 is not None and f8.recipe not in _MCORE_RECIPE:
        lines.append(f"# fp8 with {f8.recipe} scaling: torchao's recipe, which Megatron-LM has no flag for")
    elif f8 is not None:
        lines += ["--fp8-format hybrid", f"--fp8-recipe {_MCORE_RECIPE[f8.recipe]}"]
        if f8.param_gather and e.zero >= 1:
            lines.append("--fp8-param-gather")
    if tr.adam_moments == "bf16":     # Megatron-core's precision-aware optimizer (arguments.py)
        lines += ["--use-precision-aware-optimizer", "--exp-avg-dtype bf16", "--exp-avg-sq-dtype bf16"]
    if tr.activation_func_fp8_input_store:
        lines.append("# the SwiGLU's input kept in FP8: TransformerConfig.activation_func_fp8_input_store, which "
                     "Megatron-LM's arguments do not set (a NeMo or Megatron-Bridge configuration does)")
    notes = [f"# data-parallel size {s.dp} follows from the world size {run.layout.gpus} (launch that many ranks)"]
    if not registry.get(s.schedule).megatron:
        notes.append(f"# schedule {s.schedule}: modelcut knows no Megatron-LM flag for it; Megatron-LM runs "
                     f"{'1F1B' if s.vpp == 1 else 'its interleaved schedule'} with these arguments")
    return "\n".join(notes + lines)


def _toml_str(x: str) -> str:
    return '"' + x.replace("\\", "\\\\").replace('"', '\\"') + '"'


def torchtitan_toml(e: Evaluated, framework=None) -> str:
    """A torchtitan job-config fragment: [parallelism], [activation_checkpoint], [training]; the
    stack's tp_comm overlap (with tp > 1) as asynchronous tensor parallelism
    (``enable_async_tensor_parallel``, in [parallelism] in v0.2.2, which needs the model compiled)
    and its compilation as ``[compile] enable``."""
    s, run = e.structure, e.run
    tr, lay = run.training, run.layout
    overlap, _ = _stack(framework)
    out = ["[parallelism]"]
    replicate, shard = (s.dp, 1) if e.zero == 0 else (s.dp // (s.dp_shard or s.dp), s.dp_shard or s.dp)
    out += [f"data_parallel_replicate_degree = {replicate}", f"data_parallel_shard_degree = {shard}"]
    if e.zero in (1, 2):
        out += ['fsdp_reshard_after_forward = "never"',
                f"# ZeRO-{e.zero}: torchtitan has no optimizer-only sharding; FSDP2 without resharding after "
                "forward keeps the gathered weights, the memory of ZeRO-2"]
    elif e.zero == 3:
        out.append('fsdp_reshard_after_forward = "always"')
    out += [f"tensor_parallel_degree = {s.tp}", f"context_parallel_degree = {s.cp}"]
    if overlap and overlap.get("tp_comm") and s.tp > 1:
        out += ["enable_async_tensor_parallel = true", "# asynchronous tensor parallelism needs [compile] enable = true"]
    if s.ep > 1:
        # torchtitan's default expert tensor parallelism is 1; modelcut's layout says which it timed
        out += [f"expert_parallel_degree = {s.ep}", f"expert_tensor_parallel_degree = {s.expert_tp}"]
    if s.cp > 1 and lay.cp_form in ("a2a", "a2a+p2p"):
        out.append(f"# the layout's {'all-to-all (Ulysses)' if lay.cp_form == 'a2a' else 'hierarchical (a2a+p2p)'} "
                   "context parallelism: torchtitan rotates K and V (allgather or alltoall) and has no head-cut form")
    elif s.cp > 1:
        rotate = _ROTATE_NAME[lay.cp_form]
        out.append(f"context_parallel_rotate_method = {_toml_str(rotate)}")
    out.append(f"pipeline_parallel_degree = {s.pp}")
    if s.pp > 1:
        torch_class = registry.get(s.schedule).torch_class
        if torch_class is not None:
            out.append(f"pipeline_parallel_schedule = {_toml_str(torch_class.removeprefix('Schedule'))}")
        else:
            m = tr.global_batch // (s.dp * tr.micro_batch)
            out += [f'pipeline_parallel_schedule_csv = "{s.schedule}.csv"',
                    f"# torch.distributed.pipelining has no single-stage {s.schedule}; write its action CSV with "
                    f"`modelcut simulate --schedule {s.schedule} -p {s.pp} -m {m} --export-csv {s.schedule}.csv`"]
        out.append(f"pipeline_parallel_microbatch_size = {tr.micro_batch}")
        split = _split(e)
        parts, layer = [], 0
        for k, n in enumerate(split):
            names = (["tok_embeddings"] if k == 0 else []) + [f"layers.{layer + i}" for i in range(n)]
            layer += n
            if k == len(split) - 1:
                names += ["norm", "output"]
            parts.append("  [" + ", ".join(_toml_str(x) for x in names) + "],")
        out += ["module_fqns_per_model_part = ["] + parts + ["]"]
    if tr.recompute_every is not None:      # torchtitan's per-layer rule: one block in k checkpointed whole
        out += ["", "[activation_checkpoint]", 'mode = "selective"',
                f"selective_ac_option = {_toml_str(str(tr.recompute_every))}"]
    else:
        out += ["", "[activation_checkpoint]", f"mode = {_toml_str(tr.recompute)}"]
    if tr.recompute == "selective":
        out.append('selective_ac_option = "op"')
        if tr.recompute_modules:
            out.append(f"# recompute_modules {', '.join(tr.recompute_modules)}: torchtitan names no modules; "
                       "its op-level policy is the nearest")
    if tr.recompute_layers is not None:
        out.append(f"# recompute_layers {tr.recompute_layers} (the first layers of each chunk): torchtitan "
                   "recomputes every layer, or every k-th (selective_ac_option = k); every layer is the nearest "
                   "that fits")
    # torchtitan's local batch is one forward's without a pipeline (the step accumulates gradients
    # over global/(local·dp) of them: v0.2.2 train.py gradient_accumulation_steps) and one schedule
    # run's with one, cut into micro-batches of pipeline_parallel_microbatch_size
    local = tr.micro_batch if s.pp == 1 else (tr.local_batch or tr.global_batch // s.dp)
    out += ["", "[training]", f"local_batch_size = {local}",
            f"global_batch_size = {tr.global_batch}", f"seq_len = {tr.seq_len}"]
    precision, f8 = _precision(e)
    if precision == "fp16":
        out.append('# fp16: torchtitan\'s mixed_precision_param takes "bfloat16" or "float32" only (v0.2.2 job_config.py)')
    if framework is not None and framework.grad_bytes == 2:   # FSDP's reduce type as timed (torchtitan's default float32)
        out.append('mixed_precision_reduce = "bfloat16"   # later torchtitan releases; v0.2.2 takes "float32" only')
    if f8 is not None:
        if f8.recipe == "current":
            gather = "true" if f8.param_gather else "false"
            out += ["", "[model]", 'converters = ["quantize.linear.float8"]', "",
                    "[quantize.linear.float8]", f"enable_fsdp_float8_all_gather = {gather}",
                    f"precompute_float8_dynamic_scale_for_fsdp = {gather}", 'filter_fqns = ["output"]']
        elif f8.recipe in ROWWISE:
            out += ["", "[model]", 'converters = ["quantize.linear.float8"]', "",
                    "[quantize.linear.float8]", f'recipe_name = "{f8.recipe}"', 'filter_fqns = ["output"]']
        elif f8.recipe == "mxfp8":
            out += ["", "[model]", 'converters = ["quantize.linear.mx"]', "",
                    "[quantize.linear.mx]", 'recipe_name = "mxfp8_cublas"']
        else:
            out.append(f"# fp8 with {f8.recipe} scaling: torchtitan's float8 scales tensorwise (current scaling) "
                       "or rowwise, or runs MXFP8; it has no such recipe")
        if framework is None or not framework.torch_compile:
            out.append("# float8 needs [compile] enable = true to fuse its casts (torchtitan docs/float8.md)")
    if framework is not None and framework.torch_compile:      # the stack the layout was timed on compiles
        out += ["", "[compile]", "enable = true"]
    return "\n".join(out)


def nemo_overrides(e: Evaluated, framework=None) -> str:
    """NeMo 2.0 recipe overrides for the layout, one per line after the command, with ``#`` notes
    where a setting has no NeMo field. The stack's DDP overlaps as the recipes' own
    ``DistributedDataParallelConfig`` fields (``trainer.strategy.ddp.overlap_grad_reduce``,
    ``overlap_param_gather``: NeMo 8cfedd7203 nemo/collections/llm/recipes/gpt3_175b.py), the
    tensor-parallel one as a note (the recipes' ``MegatronCommOverlapCallback``); its loss as
    Megatron-core's ``cross_entropy_loss_fusion`` and ``cross_entropy_fusion_impl``."""
    s, run = e.structure, e.run
    tr, lay = run.training, run.layout
    overlap, loss = _stack(framework)
    loss = tr.cross_entropy or loss
    lines = [f"trainer.strategy.tensor_model_parallel_size={s.tp}",
             f"trainer.strategy.pipeline_model_parallel_size={s.pp}",
             f"trainer.strategy.virtual_pipeline_model_parallel_size={s.vpp if s.vpp > 1 else 'null'}",
             f"trainer.strategy.context_parallel_size={s.cp}",
             f"trainer.strategy.sequence_parallel={'true' if lay.sequence_parallel else 'false'}"]
    if s.ep > 1:
        lines.append(f"trainer.strategy.expert_model_parallel_size={s.ep}")
        if s.expert_tp != s.tp:
            lines.append(f"trainer.strategy.expert_tensor_parallel_size={s.expert_tp}")
    split = _split(e)
    ends = [f"model.config.num_layers_in_{end}_pipeline_stage={n}"   # Megatron-core's TransformerConfig fields
            for end, n in (("first", lay.first_layers), ("last", lay.last_layers)) if n is not None]
    lines += ends
    if not ends and s.pp > 1 and len(set(split)) > 1 and sum(split) + 2 == len(split) * (max(split)):
        lines += ["trainer.strategy.account_for_embedding_in_pipeline_split=true",
                  "trainer.strategy.account_for_loss_in_pipeline_split=true"]
    if s.cp > 1:
        lines.append(f"model.config.cp_comm_type={_NEMO_CP_KIND[lay.cp_form]}")
        if lay.cp_a2a:     # Megatron-core's ModelParallelConfig field, which NeMo passes to its process groups
            lines.append(f"model.config.hierarchical_context_parallel_sizes=[{lay.cp_a2a},{s.cp // lay.cp_a2a}]")
    if e.zero == 1:
        lines.append("optim.config.use_distributed_optimizer=true")
    elif e.zero in (2, 3):
        lines += ["optim.config.use_distributed_optimizer=true", "trainer.strategy.fsdp=megatron",
                  f"trainer.strategy.ddp.data_parallel_sharding_strategy="
                  f"{_SHARDING_NAME[e.zero]}"]
    if s.dp_shard and e.zero >= 1:
        lines.append(f"trainer.strategy.ddp.num_distributed_optimizer_instances={s.dp // s.dp_shard}")
    if overlap:
        lines += [f"trainer.strategy.ddp.overlap_grad_reduce={'true' if overlap.get('grad_reduce') else 'false'}",
                  f"trainer.strategy.ddp.overlap_param_gather="
                  f"{'true' if overlap.get('param_gather') and e.zero >= 1 else 'false'}"]
        if overlap.get("tp_comm") and s.tp > 1:
            lines.append("# tensor-parallel overlap: the recipe's MegatronCommOverlapCallback(tp_comm_overlap=True)")
    if tr.recompute == "selective":
        lines.append("model.config.recompute_granularity=selective")
        if tr.recompute_modules:
            lines.append(f"model.config.recompute_modules=[{','.join(tr.recompute_modules)}]")
    elif tr.recompute_layers is not None:
        lines += ["model.config.recompute_granularity=full", "model.config.recompute_method=block",
                  f"model.config.recompute_num_layers={tr.recompute_layers}"]
    elif tr.recompute_every is not None:
        lines.append(f"# one layer in {tr.recompute_every} recomputed whole (torchtitan's per-layer rule): NeMo's "
                     "Megatron-core has the block and uniform methods only")
    elif tr.recompute == "full":
        lines += ["model.config.recompute_granularity=full", "model.config.recompute_method=uniform",
                  "model.config.recompute_num_layers=1"]
    if loss in ("mcore-fused", "fused", "fp32-passes"):     # Megatron-core's ModelParallelConfig fields
        lines.append(f"model.config.cross_entropy_loss_fusion={'false' if loss == 'fp32-passes' else 'true'}")
        if loss == "fused":
            lines.append("model.config.cross_entropy_fusion_impl=te")
    lines += [f"data.micro_batch_size={tr.micro_batch}", f"data.global_batch_size={tr.global_batch}",
              f"data.seq_length={tr.seq_len}"]
    if tr.attention is not None:      # Megatron-core's AttnBackend, which NeMo's model config takes
        lines.append(f"model.config.attention_backend={MEGATRON_ATTENTION_BACKEND[tr.attention]}")
    if framework is not None:     # the gradients' reduce type as timed (Megatron-Bridge v0.2.0's recipes set it true,
        #                             recipes/llama/llama3.py; its performance scripts false, scripts/performance/utils/helpers.py)
        lines.append(f"trainer.strategy.ddp.grad_reduce_in_fp32={'true' if framework.grad_bytes == 4 else 'false'}")
    precision, f8 = _precision(e)
    if f8 is not None and f8.recipe not in _MCORE_RECIPE:
        lines.append(f"# fp8 with {f8.recipe} scaling: torchao's recipe, which NeMo 2.0's plugins have no name for")
    elif f8 is not None:
        lines += ["trainer.plugins.fp8=hybrid", f"trainer.plugins.fp8_recipe={_MCORE_RECIPE[f8.recipe]}",
                  f"trainer.plugins.fp8_param_gather={'true' if f8.param_gather else 'false'}"]
    notes = [f"# nemo llm pretrain --factory RECIPE (the model's pretraining recipe) with these overrides; "
             f"data-parallel size {s.dp} follows from the {run.layout.gpus} ranks"]
    if precision == "fp16":
        notes.append("# fp16: set trainer.plugins to the recipe's fp16_mixed() plugin")
    if not registry.get(s.schedule).megatron and s.pp > 1:
        notes.append(f"# schedule {s.schedule}: NeMo runs Megatron-core's "
                     f"{'1F1B' if s.vpp == 1 else 'interleaved schedule'} with these settings")
    if s.pp > 1 and len(set(split)) > 1 and not any("account_for" in x or "pipeline_stage=" in x for x in lines):
        notes.append(f"# uneven split {list(split)}: give it as trainer.strategy.pipeline_model_parallel_layout")
    return "\n".join(notes + lines)


#: The launch formats ``--emit`` knows, each a function of the chosen layout.
def power_note(hw) -> str:
    """The power limit a GPU held to one (``h100@500w``, :func:`..core.costs.kernels.held_to`) was
    searched at, as the command that sets it; empty for a GPU at its own limit."""
    if "@" not in hw.name or hw.power_w is None:
        return ""
    return (f"# the search held each GPU to {hw.power_w:g} W: set it on every node with "
            f"nvidia-smi -pl {hw.power_w:g}")


EMITTERS = {"megatron": megatron_args, "torchtitan": torchtitan_toml, "nemo": nemo_overrides}
