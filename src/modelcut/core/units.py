"""Element sizes and the bytes per parameter of mixed-precision training: the one definition of
each, for every model in modelcut.

Mixed-precision Adam as Megatron-LM keeps it (megatron/training/theoretical_memory_usage.py
counts 18 bytes per parameter: 2 for the 16-bit weight, 4 for the FP32 main gradient, 12 for
the FP32 main weight and the two Adam moments).
"""

from __future__ import annotations

#: Bytes of one 16-bit element (BF16 or FP16: IEEE 754 half / bfloat16): activations, weights and
#: what travels on the wire in mixed-precision training.
BF16_BYTES = 2
#: Bytes of one 32-bit float (FP32 main gradients, master weights, Adam moments, softmax of logits).
FP32_BYTES = 4
#: Token ids are int64 (the 8·s·b "input to embedding" of theoretical_memory_usage.py).
TOKEN_ID_BYTES = 8
#: 2^30 bytes.
GiB = 1 << 30

#: Bytes per parameter *held* (memory): the 16-bit weight, the FP32 gradient accumulation buffer
#: (``main_grad``), and the optimizer states, FP32 main weight + Adam m + Adam v, 4 + 4 + 4.
WEIGHT_BYTES = BF16_BYTES
GRAD_BYTES = FP32_BYTES
OPTIMIZER_STATE_BYTES = 3 * FP32_BYTES

#: Bytes of HBM *traffic* per parameter per micro-batch where a weight gradient is added into the
#: accumulator outside its product: read the new 16-bit gradient, read and write the accumulator.
#: Into a 16-bit buffer (Megatron-LM's ``param.main_grad.add_``, megatron/model/distributed.py):
#: 2 + 2 + 2; into an FP32 one in one kernel (``main_grad.add_(grad)``, the dtype promoted inside the
#: kernel): 2 + 4 + 4; into an FP32 one through an explicit cast, as DeepSpeed's BF16_Optimizer does it
#: (``hp_grad.data.add_(lp.grad.data.to(hp_grad.dtype))``, deepspeed/runtime/bf16_optimizer.py
#: ``update_hp_grads``): the cast reads 2 and writes a temporary FP32 copy, 4, and ``add_`` reads the
#: accumulator and the copy and writes the accumulator, 4 + 4 + 4: 18.
GRAD_ACCUM_BYTES_16 = 3 * BF16_BYTES
GRAD_ACCUM_BYTES_32 = BF16_BYTES + 2 * FP32_BYTES
GRAD_ACCUM_BYTES_32_CAST = (BF16_BYTES + FP32_BYTES) + 3 * FP32_BYTES

#: Bytes of HBM *traffic* per parameter of one mixed-precision Adam step (time, not memory;
#: Megatron-LM's ``Float16OptimizerWithFloat16Params``, apex ``FusedAdam`` and
#: ``multi_tensor_apply``): copy the 16-bit gradient into the fp32 main gradient (read 2, write 4),
#: unscale and check for inf/nan (read 4, write 4), the gradient norm (read 4), Adam (read
#: parameter, gradient, m, v: 16; write parameter, m, v: 12), copy the fp32 parameter back to 16
#: bits (read 4, write 2), zero the gradient buffers (write 4): 6 + 8 + 4 + 28 + 6 + 4 = 56.
OPTIMIZER_STEP_TRAFFIC_BYTES = 56.0
#: The part of that traffic that follows the optimizer states when they are sharded (ZeRO-1/2/3,
#: the distributed optimizer): unscale, norm, Adam and the copy back, 8 + 4 + 28 + 6 = 46; the rest
#: (gradient copy and zeroing, 10) stays with the device's local gradients.
OPTIMIZER_STEP_SHARDED_TRAFFIC_BYTES = 46.0


def optimizer_step_bytes(params: float, shards: int, grads_sharded: bool = False,
                         moment_bytes: float | None = None) -> float:
    """HBM bytes one device moves for the optimizer step over ``params`` parameters whose
    optimizer states are split ``shards`` ways (1: not sharded); with ``grads_sharded`` (ZeRO-2/3
    without a pipeline) the gradient copy and zeroing are split too. ``moment_bytes``: Adam's
    moments in the run's type (:attr:`.specs.Training.moment_bytes`; None: FP32, the count above),
    which Adam reads and writes: with 16-bit moments 2 bytes fewer each way for each of the two, 8 a
    parameter."""
    local = OPTIMIZER_STEP_TRAFFIC_BYTES - OPTIMIZER_STEP_SHARDED_TRAFFIC_BYTES
    sharded = OPTIMIZER_STEP_SHARDED_TRAFFIC_BYTES - (0.0 if moment_bytes is None
                                                      else 2 * 2 * (FP32_BYTES - moment_bytes))
    if grads_sharded:
        return params * (local / shards + sharded / shards)
    return params * (local + sharded / shards)
