"""The loss's cross-entropy kernels, one table read by the step time (the bytes each pass moves,
``step.layers``) and the memory model (what each keeps of the logits and holds while it runs,
``memory.activations``). Per logit: V/t of them a token on a tensor-parallel rank.

**Bytes moved**, (forward, backward), by how the stack computes the loss:

* ``"fp32-passes"``: Megatron-LM (2021-2022) casts the logits to fp32 and runs max, subtract,
  exp, sum, divide as separate passes (``megatron/mpu/cross_entropy.py``): convert 2 + 4, max 4,
  subtract 8, exp 8, sum 4, divide 8 forward (38); scale 8 and the cast back 6 backward (14).
* ``"fused"``: a one-kernel fused cross-entropy on the 16-bit logits (Transformer Engine's
  ``parallel_cross_entropy``, which Megatron-core runs with ``cross_entropy_loss_fusion`` and
  ``cross_entropy_fusion_impl = "te"``, as Megatron-Bridge v0.2.0's performance scripts set it:
  scripts/performance/utils/helpers.py ``set_common_perf_overrides``): read the logits twice
  forward (2 + 2), write the gradient backward (2).
* ``"mcore-fused"``: Megatron-core's own "fused" cross-entropy (``cross_entropy_loss_fusion``
  with the native implementation, Megatron-LM commit 7b4a6d7, 2024-06-14, in core_v0.8.0
  ``megatron/core/fusions/fused_cross_entropy.py``): the same fp32 steps as the unfused one,
  grouped into four ``jit_fuser`` functions (``torch.compile`` on PyTorch 2.2 and later,
  ``megatron/core/jit.py``), each one pass that reads its input and writes its output: the
  cast to an fp32 copy with the row maximum 2 + 4, the in-place subtract and exp with the row
  sum 4 + 4, the in-place divide 4 + 4 forward (22); the in-place scale of the saved softmax
  with the cast back to 16 bits 4 + 4 + 2 backward (10).
* ``"torch"``: ``F.cross_entropy`` on the 16-bit logits, log_softmax then nll_loss (PyTorch
  aten/src/ATen/native/cuda/SoftMax.cu ``cunn_SoftMaxForward``, whose row of a large vocabulary
  does not fit shared memory: a max pass 2, a sum-of-exponentials pass 2, the write pass 2 + 2 = 8
  forward; backward nll_loss's zero-filled input gradient 2, then ``cunn_SoftMaxBackward``'s sum
  of the output gradient 2 and its write pass 2 + 2 + 2 = 10). NeMo AutoModel's MaskedCrossEntropy
  with ``fp32_upcast: false``, as its benchmark configurations set it.
* ``"torch-fp32"``: the logits cast to fp32 first (torchtitan's ``cross_entropy_loss``,
  ``pred.flatten(0, 1).float()``): the cast 2 + 4 and the same kernels at 4 bytes, 16 forward
  (22); the zero fill 4, the softmax backward 16 and the gradient's cast back 4 + 2 (26).
* ``"torch-compiled"``: that loss under ``torch.compile`` (torchtitan compiles it with the model:
  v0.2.0 ``torchtitan/config/job_config.py`` ``Compile.components`` default ``["model", "loss"]``,
  ``torchtitan/components/loss.py`` ``build_cross_entropy_loss``). AOTAutograd's min-cut partitioner
  with Inductor's decompositions (torch 2.13 ``torch/_functorch/partitioners.py``
  ``min_cut_rematerialization_partition``, ``torch/_inductor/decomposition.py``) keeps the 16-bit
  logits and the rows' maximum and log-sum-exp, and recomputes the fp32 log-softmax in the
  backward (``tests/test_loss_kernel.py`` runs the partitioner): the row maximum 2, the sum of
  exponentials 2 forward (4); one fused pass reading the logits and writing the gradient 2 + 2
  backward (4).
* ``"flash-attn"``: flash-attn's cross-entropy (``flash_attn/ops/triton/cross_entropy.py``
  ``CrossEntropyLoss``, llm-foundry's default ``loss_fn: fused_crossentropy``): the forward kernel
  reads each row once for its online maximum and sum of exponentials (2); the backward kernel
  reads the logits and writes the gradient into a new tensor (``inplace_backward`` off) (2 + 2).

**Bytes kept and held**, (kept for the backward, the most held while the loss runs, forward or
backward); with no stack named the memory model keeps the FP32 softmax, 4, and holds nothing more
(Megatron-LM's ``theoretical_memory_usage.py`` count):

* "fp32-passes" and "mcore-fused", Megatron-core's vocab-parallel cross-entropy, unfused and under
  jit fusion (Megatron-LM ``megatron/core/tensor_parallel/cross_entropy.py``,
  ``megatron/core/fusions/fused_cross_entropy.py``): an FP32 copy of the 16-bit logits
  (``.float()``) beside them, then subtract, exp and divide in place; the FP32 softmax is kept and
  becomes the gradient in place, cast back to 16 bits beside it: 4 kept, 2 + 4 held.
* "fused", Transformer Engine's ``parallel_cross_entropy`` (``transformer_engine/pytorch/
  cross_entropy.py`` ``CrossEntropyFunction``): the 16-bit logits kept, the gradient computed into
  them (assumed in place): 2, 2.
* "torch", ``F.cross_entropy`` on the 16-bit logits: log_softmax's 16-bit output kept; its
  backward holds it, nll_loss's gradient and its own output: 2, 6.
* "torch-fp32", torchtitan's eager loss (``torchtitan/components/loss.py`` ``cross_entropy_loss``:
  ``pred.flatten(0, 1).float()``; the 16-bit logits dropped after it, ``del pred`` in train.py):
  log_softmax's FP32 output kept; the forward holds the 16-bit logits, their FP32 copy and that
  output (10), the backward the output, nll_loss's FP32 gradient and its own (12): 4, 12.
* "torch-compiled", that loss under ``torch.compile`` (above): the 16-bit
  logits kept (with each row's maximum and log-sum-exp), the 16-bit gradient beside them: 2, 4.
* "flash-attn", flash-attn's cross-entropy (``ctx.save_for_backward(logits, lse, labels)``, the
  gradient in a new tensor, ``torch.empty_like(logits)``): 2, 4.
"""

from __future__ import annotations

from dataclasses import dataclass

from ..specs import CROSS_ENTROPY_KINDS


@dataclass(frozen=True)
class LossKernel:
    """One cross-entropy kernel, per logit: the bytes its forward and backward move, the bytes it
    keeps for the backward and the most it holds while it runs (module doc)."""

    moved_fwd: float
    moved_bwd: float
    kept: float
    held: float


LOSS_KERNELS: dict[str, LossKernel] = {
    "fp32-passes": LossKernel(38.0, 14.0, kept=4.0, held=6.0),
    "fused": LossKernel(4.0, 2.0, kept=2.0, held=2.0),
    "mcore-fused": LossKernel(22.0, 10.0, kept=4.0, held=6.0),
    "torch": LossKernel(8.0, 10.0, kept=2.0, held=6.0),
    "torch-fp32": LossKernel(22.0, 26.0, kept=4.0, held=12.0),
    "torch-compiled": LossKernel(4.0, 4.0, kept=2.0, held=4.0),
    "flash-attn": LossKernel(2.0, 4.0, kept=2.0, held=4.0),
}
assert tuple(LOSS_KERNELS) == CROSS_ENTROPY_KINDS, "LOSS_KERNELS must describe every cross-entropy kind"
