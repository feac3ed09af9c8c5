"""What a data-parallel rank keeps resident between micro-batches, and so what it must move again:
the one decision that memory (:mod:`..memory.stages`) and step time (:mod:`..step.stage_costs`,
:mod:`..step.data_parallel`, :mod:`..step.zero3`) both read, so that whatever memory assumes is
resident is what time pays for.

**Weights.** Below ZeRO-3 every rank holds its weights whole (``"replicated"``); a sharded
optimizer all-gathers the updated ones once a step. ZeRO-3 / FSDP shards them and gathers them
where they are used. A stack that *reshards* after the forward frees each unit (one transformer
layer, the embedding, the output layer) once it has run, so every pass of every micro-batch
through every chunk gathers it again: forward, then backward (``"per-pass"``; memory holds the
unit in use and the one prefetched). A stack that *keeps* them gathers each unit once, in the
first micro-batch's forward, and holds the device's whole weights until the optimizer step
(``"per-step"``; Grattafiori et al. 2024 §3.3.2: "we do not reshard after forward computation to
avoid an extra all-gather communication during backward passes"). With a pipeline a stack may
choose differently than without: torchtitan resharding after the forward only without one
(``fsdp_reshard_after_forward = "default"`` is ``not pp_enabled``, torchtitan v0.2
torchtitan/models/llama3/infra/parallelize.py ``apply_fsdp``).

**Gradients.** Below ZeRO-2 the whole FP32 gradient buffer accumulates over the micro-batches and
is reduced once, through the last backward (``"per-step"``). ZeRO-2/3 keeps only this rank's shard,
so with more than one micro-batch each backward's gradients are reduce-scattered before the next
accumulates (``"per-microbatch"``: DeepSpeed's ZeRO-2/3 reduce in buckets every backward; FSDP
without ``no_sync``), unless the stack accumulates the whole gradients and reduce-scatters once
(``"per-step"``, memory pays the full buffer): torch.distributed.pipelining does so for an FSDP2
stage, turning ``requires_gradient_sync`` off for every backward of the schedule and reducing
after it (pytorch/pytorch torch/distributed/pipelining/stage.py ``backward_maybe_with_nosync``,
commit 0138610331c90b8053a0bfc6df0175b200a1cad2). Without a pipeline a stack may do the same over
its gradient-accumulation steps (``flat_grad_sync = "step"``): NeMo AutoModel turns FSDP2's
``requires_gradient_sync`` off for every micro-batch but the last
(``nemo_automodel/components/distributed/utils.py`` ``get_sync_ctx``, called by ``train_ft.py``'s
``_forward_backward_step`` with ``idx == num_batches - 1``, NVIDIA-NeMo/Automodel @89e3a9fdd), so the
unsharded gradients accumulate and are reduce-scattered once; torchtitan reduce-scatters after every
micro-batch's backward.

**FSDP2's copies.** PyTorch's ``fully_shard`` moves every gathered and every reduced byte once more
through HBM, on the compute stream (torch 2.13 ``torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py``).
After a unit's all-gather, ``foreach_all_gather_copy_out`` waits for it on the current stream and
copies the flat output into each parameter's unsharded tensor (``split_with_sizes_copy``): the
gathered bytes read and written, :func:`copy_out_bytes`. Before a unit's reduce-scatter,
``foreach_reduce`` copies the unsharded gradients into the flat input buffer in the reduce dtype
(``foreach_reduce_scatter_copy_in``, ``chunk_cat``), still on the current stream; only then does the
reduce-scatter stream wait for it: each gradient read in its own dtype and written in the reduce
dtype, :func:`copy_in_bytes`. ``Framework.fsdp2_copies`` says which stacks run it.

**FSDP1's reduction.** PyTorch's ``FullyShardedDataParallel`` (FSDP1) takes the all-gather in place
(its flat parameter) and reduces from the flat gradient, but readies that gradient first, on its
post-backward stream, the stream its reduce-scatter (or all-reduce) is issued from (torch 2.13
``torch/distributed/fsdp/_runtime_utils.py``). ``_post_backward_hook`` casts the unsharded gradient
to the reduce dtype where it is computed in another (``flat_param.grad.to(handle._reduce_dtype)``:
Composer's DEFAULT mixed precision, bf16 gradients reduced in fp32); ``_reduce_grad`` (and
``_reduce_grad_no_shard``) then divide it in place by the pre-divide factor before the collective
(``_div_if_needed(padded_unsharded_grad, state._gradient_predivide_factor)``), a factor above 1 for
every group of two or more ranks (``_init_utils.py``: ``DefaultState._get_gradient_predivide_factor``
of the data-parallel world size doubles while the size divides by it and exceeds it). So each
reduction moves :func:`fsdp1_reduce_prep_bytes` through HBM ahead of its collective, on the
communication stream. ``Framework.fsdp1_reduce`` says which stacks run it. (FSDP2 divides through
NCCL's average for bf16 and fp32 and casts in its copy-in, above.)

**Accumulating gradients under PyTorch FSDP.** Neither FSDP adds a micro-batch's weight gradients
into a buffer on the compute stream the way Megatron-LM's ``main_grad.add_`` does
(:func:`accumulate_bytes`). Reduced every micro-batch, the unsharded gradient goes to the
reduce-scatter and is dropped, so the next backward's autograd writes a fresh one; the reduced shard
is added to the last one (FSDP2: ``fsdp_param.sharded_param.grad._local_tensor += new_sharded_grad``
in ``foreach_reduce``, torch 2.13 ``_fsdp_collectives.py``; FSDP1: ``flat_param._saved_grad_shard +=
sharded_grad`` in ``_accumulate_sharded_grad``, ``_runtime_utils.py``) beside the collective, on its
stream (FSDP2's ``post_reduce_stream``: the reduce-scatter's, or the all-reduce's with hybrid
sharding; FSDP1's post-backward stream), and over 1/d of the elements: nothing on the compute
stream. Accumulated whole between reductions (``requires_gradient_sync`` off: ``"per-step"``),
FSDP2's post-backward on the compute stream casts a micro-batch's gradient to the reduce type the
first time (``FSDPParam.to_accumulated_grad_if_needed``: ``unsharded_grad.to(self.reduce_dtype)``)
and adds the later ones to it (``accumulate_unsharded_grad_if_needed``:
``self.unsharded_accumulated_grad += self.unsharded_param.grad``, torch 2.13 ``_fsdp_param.py``); a
gradient kept in its own type (no mixed-precision policy) is added by autograd into ``.grad``.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import ModelcutError

#: How often sharded weights are gathered, and how often gradients are reduced.
WEIGHT_MODES = ("replicated", "per-pass", "per-step")
GRAD_MODES = ("per-step", "per-microbatch")
#: A stack's choice for gradients under ZeRO-2/3 with a pipeline (``Framework.pipeline_grad_sync``).
PIPELINE_GRAD_SYNC = ("microbatch", "step")


@dataclass(frozen=True)
class Residency:
    """What one rank keeps between micro-batches (module doc).

    ``weights``: "replicated" (ZeRO 0-2: held whole), "per-pass" (ZeRO-3 resharding: each unit
    gathered for every forward and backward of every micro-batch, two units resident) or
    "per-step" (ZeRO-3 keeping them: gathered once, the device's whole weights resident);
    ``grads``: "per-step" (the whole buffer resident, reduced once) or "per-microbatch" (only the
    shard resident, reduce-scattered after every backward)."""

    zero: int
    weights: str
    grads: str

    @property
    def weights_sharded(self) -> bool:
        return self.zero >= 3

    @property
    def grads_sharded(self) -> bool:
        """Memory keeps only this rank's share of the gradients."""
        return self.zero >= 2 and self.grads == "per-microbatch"

    @property
    def gathers_each_pass(self) -> bool:
        """Time gathers every unit for every pass of every micro-batch."""
        return self.weights == "per-pass"

    @property
    def whole_weights_resident(self) -> bool:
        """Memory holds the device's weights whole for the step (replicated, or gathered and kept)."""
        return self.weights != "per-pass"


def residency(zero: int, pp: int, microbatches: int, *, reshard_after_forward: bool,
              reshard_with_pipeline: bool | None = None, pipeline_grad_sync: str = "microbatch",
              flat_grad_sync: str = "microbatch") -> Residency:
    """What a rank of a run with ``pp`` pipeline stages and ``microbatches`` micro-batches per step
    keeps resident under ZeRO stage ``zero`` on a stack that reshards after the forward
    (``reshard_after_forward``; with a pipeline ``reshard_with_pipeline`` where the stack chooses
    apart, None: the same) and reduces sharded gradients every micro-batch or once, with a pipeline
    (``pipeline_grad_sync``) and without one (``flat_grad_sync``), each one of
    :data:`PIPELINE_GRAD_SYNC`. The module doc gives the rules."""
    if zero not in (0, 1, 2, 3):
        raise ModelcutError(f"zero must be 0, 1, 2 or 3, got {zero!r}")
    for name, val in (("pipeline_grad_sync", pipeline_grad_sync), ("flat_grad_sync", flat_grad_sync)):
        if val not in PIPELINE_GRAD_SYNC:
            raise ModelcutError(f"{name} must be one of {', '.join(PIPELINE_GRAD_SYNC)}, got {val!r}")
    for name, val in (("pp", pp), ("microbatches", microbatches)):
        if isinstance(val, bool) or not isinstance(val, int) or val < 1:
            raise ModelcutError(f"{name} must be a positive integer, got {val!r}")
    if zero < 3:
        weights = "replicated"
    else:
        reshard = reshard_after_forward if pp == 1 or reshard_with_pipeline is None else reshard_with_pipeline
        weights = "per-pass" if reshard else "per-step"
    if zero < 2 or microbatches == 1:
        grads = "per-step" if zero < 2 else "per-microbatch"
    elif (pipeline_grad_sync if pp > 1 else flat_grad_sync) == "step":
        grads = "per-step"
    else:
        grads = "per-microbatch"
    return Residency(zero, weights, grads)


def residency_under(policy, zero: int, pp: int, microbatches: int) -> Residency:
    """:func:`residency` under the four choices ``policy`` holds as attributes of the same names
    (``reshard_after_forward``, ``reshard_with_pipeline``, ``pipeline_grad_sync``,
    ``flat_grad_sync``): a training stack (``step.frameworks.Framework``) and the memory model's
    assumptions (``memory.MemoryOptions``) both ask through it."""
    return residency(zero, pp, microbatches, reshard_after_forward=policy.reshard_after_forward,
                     reshard_with_pipeline=policy.reshard_with_pipeline,
                     pipeline_grad_sync=policy.pipeline_grad_sync, flat_grad_sync=policy.flat_grad_sync)


def copy_out_bytes(gathered_bytes: float) -> float:
    """HBM bytes of FSDP2's all-gather copy-out for a unit whose gathered weights take
    ``gathered_bytes`` (module doc): read once from the all-gather output, written once into the
    parameters, 2 × gathered_bytes."""
    if gathered_bytes < 0:
        raise ModelcutError(f"gathered bytes must be non-negative, got {gathered_bytes}")
    return 2.0 * gathered_bytes


def fsdp1_reduce_prep_bytes(params: float, grad_bytes: int, reduce_bytes: int, ranks: int) -> float:
    """HBM bytes FSDP1 moves to ready ``params`` unsharded gradient elements, computed in
    ``grad_bytes`` each, for a reduction in ``reduce_bytes`` each over ``ranks`` ranks (module doc):
    the cast where the types differ, params · (grad_bytes + reduce_bytes), then the in-place
    pre-division, params · 2 · reduce_bytes; nothing for a group of one (no collective, a factor of 1)."""
    if params < 0:
        raise ModelcutError(f"parameters must be non-negative, got {params}")
    if ranks < 2:
        return 0.0
    cast = grad_bytes + reduce_bytes if grad_bytes != reduce_bytes else 0
    return params * (cast + 2 * reduce_bytes)


def copy_in_bytes(params: float, grad_bytes: int, reduce_bytes: int) -> float:
    """HBM bytes of FSDP2's reduce-scatter copy-in for ``params`` gradient elements held in
    ``grad_bytes`` each and reduced in ``reduce_bytes`` each (module doc):
    params · (grad_bytes + reduce_bytes)."""
    if params < 0:
        raise ModelcutError(f"parameters must be non-negative, got {params}")
    return params * (grad_bytes + reduce_bytes)


def accumulate_bytes(res: Residency, window: int, computed: int, held: int) -> float:
    """HBM bytes per local parameter per micro-batch that PyTorch FSDP moves on the compute stream to
    accumulate weight gradients (module doc, "Accumulating gradients under PyTorch FSDP"), averaged
    over a ``window`` of micro-batches between reductions, each gradient computed in ``computed``
    bytes an element and held between reductions in ``held``: nothing where the shard is reduced
    every micro-batch (``res.grads == "per-microbatch"``) or the window is one micro-batch; else the
    first micro-batch's cast (computed + held, where the types differ; none where they match, autograd
    keeping the gradient as it is) and each later one's addition (read the sum and the new gradient,
    write the sum: 2·held + computed), (cast + add·(window − 1)) / window."""
    if window < 1:
        raise ModelcutError(f"window must be at least 1 micro-batch, got {window}")
    if min(computed, held) <= 0:
        raise ModelcutError(f"gradient bytes must be positive, got {computed} and {held}")
    if res.grads == "per-microbatch" or window == 1:
        return 0.0
    cast = computed + held if computed != held else 0
    return (cast + (2 * held + computed) * (window - 1)) / window
