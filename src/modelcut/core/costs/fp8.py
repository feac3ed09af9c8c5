"""FP8 training: which products run in FP8, what the casts cost, what FP8 keeps in memory.

One recipe per run (:data:`..specs.FP8_RECIPES`), resolved with the accelerator and the stack
by :func:`resolve`; the step model and the memory model read the same :class:`Fp8`.

**Which products.** Transformer Engine (Megatron-core, NeMo) runs the decoder layers' linear
layers in FP8: the fused-norm QKV, the attention output projection, the MLP's two linears and
the grouped expert GEMMs (the FP8 autocast is entered per TransformerLayer, Megatron-LM
core_v0.14.0 megatron/core/transformer/transformer_block.py); the output layer (a Megatron
``ColumnParallelLinear``), the embedding, the router and the attention core stay 16-bit
(``fp8_dot_product_attention`` off by default). torchao's float8 (torchtitan) converts every
``nn.Linear`` but those its configurations filter out, "output" (torchtitan
torchtitan/components/quantization/utils.py; models/llama3/train_configs/*.toml): the same set.
All three products of a linear run in FP8 (forward, data gradient, weight gradient; HYBRID
format: E4M3 forward, E5M2 gradients), timed from the FP8 table (:func:`.kernels.gemm_time`
with ``dtype="fp8"``: operands 1 byte, output 2).

**Casts**, memory-bound work at HBM bandwidth (:func:`cast_bytes`), bytes per element:

* a linear's input X (forward) and its output gradient dY (backward) are quantized from bf16:
  read 2, write 1, and on Hopper also an FP8 transpose for the other product (its FP8 GEMMs
  take only the TN layout: TransformerEngine v2.8 transformer_engine/pytorch/utils.py
  ``is_non_tn_fp8_gemm_supported``), 1 more: 4 bytes; Blackwell runs non-TN FP8 GEMMs, 3
  bytes; MXFP8 quantizes row- and column-wise separately (recipe/__init__.py
  ``MXFP8BlockScaling``), 4 bytes plus an 8-bit scale per 32 elements;
* current (tensorwise) scaling first reads the tensor once more for its amax (+2 bytes);
  delayed scaling takes the scale from the amax history and records the amax inside the cast;
  block recipes compute each block's scale inside the cast;
* Transformer Engine's ``LayerNormLinear`` (Megatron-core's QKV and MLP-up) quantizes the
  norm's output as the recipe allows (``fp8_norm_fused``; TransformerEngine v2.8
  transformer_engine/pytorch/csrc/extensions/normalization.cpp, the ``Impl`` it picks): with
  delayed scaling the norm kernel writes FP8 itself, and on Hopper a separate transpose then
  writes the column-wise copy (common/normalization/layernorm/ln_api.cpp and
  rmsnorm/rmsnorm_api.cpp: ``nvte_transpose`` when the output has column-wise data under tensor
  scaling), read 1 and write 1: 2 bytes, none on Blackwell (the norm's own 1-byte FP8 write,
  which replaces a 2-byte bf16 one, is not credited); with current scaling the norm computes
  the amax in 16-bit and its output is then cast as any input (``FUSED_NORM_AMAX_FP8``): the
  cast's bytes without the amax pass; MXFP8 and block scaling quantize the 16-bit output apart
  (``UNFUSED``): the full cast;
* weights are quantized once per step and cached across its micro-batches (TE's weight
  workspace, refreshed on the first micro-batch: module/linear.py ``is_first_microbatch``;
  torchao's precomputed scales), 4 bytes per parameter on Hopper, 3 on Blackwell.

**FP8 weight all-gathers.** Where the stack gathers weights in FP8 (Megatron-LM
``--fp8-param-gather`` as NeMo's and Megatron-Bridge's FP8 recipes set it; torchao's
``enable_fsdp_float8_all_gather`` with tensorwise scaling), the layers' weights cross the
data-parallel group at 1 byte instead of 2 (:func:`param_gather_bytes`).

**Memory** (:func:`weight_copy_bytes`, :func:`saved_input_bytes`). TE keeps the bf16 weight
and a cached FP8 copy, plus its transpose on Hopper (linear.py; base.py
``get_weight_workspace``): +2 bytes per linear parameter on Hopper, +1 on Blackwell, +2 with
MXFP8's two directions. With FP8 parameters (``fp8_param_gather``: ``fp8_model_init``, the bf16
copy dropped, the FP32 master weights in the optimizer) the FP8 weight replaces the bf16 one:
+0 on Hopper (FP8 weight and its transpose, 2 bytes, for the 2 of bf16), −1 on Blackwell. A
linear's input saved for the backward is the FP8 (column-wise) copy, 1 byte instead of 2
(linear.py: the quantized input is saved unless ``save_original_input``).
"""

from __future__ import annotations

from dataclasses import dataclass

from ..errors import ModelcutError
from ..specs import FP8_RECIPES, Hardware, Training

#: bf16 read + FP8 write, the FP8 transpose, the extra amax pass (module doc).
READ_16, WRITE_8, TRANSPOSE_8, AMAX_PASS = 2.0, 1.0, 1.0, 2.0
#: A separate transpose of an FP8 tensor: read the row-wise copy, write the column-wise one.
TRANSPOSE_PASS = 2.0
#: MXFP8's E8M0 scale: one byte per 32 elements (recipe/__init__.py MXFP8BlockScaling).
MX_SCALE = 1.0 / 32
#: Architectures whose FP8 GEMMs take only the TN layout (an FP8 transpose per operand):
#: compute capability 8.9 and 9.0 (TE utils.py ``is_non_tn_fp8_gemm_supported``).
TN_ONLY = ("hopper", "ada")


@dataclass(frozen=True)
class Fp8:
    """A run's FP8: the recipe and what the stack and the accelerator make of it (module doc)."""

    recipe: str
    transposes: bool         # the accelerator needs FP8 transposes (Hopper)
    norm_fused: bool         # QKV and MLP-up inputs quantized inside the norm (TE LayerNormLinear)
    param_gather: bool       # weights gathered and kept in FP8 (FP8 parameters)

    @property
    def amax_pass(self) -> bool:
        return self.recipe == "current"

    @property
    def two_directions(self) -> bool:
        return self.recipe == "mxfp8"


def default_recipe(hw: Hardware, stack_default: str | None = None) -> str:
    """The recipe a run gets when it names none: the stack's (torchao: tensorwise, i.e.
    current scaling), else Transformer Engine's choice, MXFP8 where the accelerator runs it,
    delayed scaling otherwise (TransformerEngine v2.8 transformer_engine/pytorch/fp8.py
    ``get_default_fp8_recipe``)."""
    if stack_default is not None:
        return stack_default
    return "mxfp8" if "mxfp8" in hw.fp8_recipes else "delayed"


def resolve(training: Training, hw: Hardware, *, norm_fused: bool = True, param_gather: bool = False,
            stack_default: str | None = None) -> Fp8 | None:
    """The run's FP8, or None for a 16-bit run; a recipe the accelerator cannot run is a
    one-line error."""
    if training.precision != "fp8":
        return None
    if not hw.fp8_recipes:
        raise ModelcutError(f"precision fp8 needs FP8 tensor cores; {hw.name} has none "
                            "(Transformer Engine and torchao need compute capability 8.9 or higher)")
    recipe = training.fp8_recipe or default_recipe(hw, stack_default)
    if recipe not in FP8_RECIPES:
        raise ModelcutError(f"fp8_recipe must be one of {', '.join(FP8_RECIPES)}, got {recipe!r}")
    if recipe not in hw.fp8_recipes:
        raise ModelcutError(f"fp8_recipe {recipe} does not run on {hw.name} (it runs "
                            f"{', '.join(hw.fp8_recipes)}); MXFP8 needs a Blackwell GPU")
    # block-scaled weights are not gathered in FP8 (Megatron-Bridge's blockwise preset sets
    # fp8_param_gather = False; torchao's float8 all-gather is tensorwise only)
    gather = param_gather and recipe in ("delayed", "current", "mxfp8")
    return Fp8(recipe, transposes=hw.arch in TN_ONLY, norm_fused=norm_fused, param_gather=gather)


def for_stack(training: Training, hw: Hardware, stack) -> Fp8 | None:
    """:func:`resolve` with a training stack's FP8 settings (a ``Framework``'s
    ``fp8_norm_fused``, ``fp8_param_gather``, ``fp8_default_recipe``): the one place the step
    model and the memory model get a run's FP8 from."""
    default = stack.fp8_default_recipe
    return resolve(training, hw, norm_fused=stack.fp8_norm_fused, param_gather=stack.fp8_param_gather,
                   stack_default=None if default == "auto" else default)


def _quantize(f: Fp8) -> float:
    """Bytes per element to quantize a bf16 tensor for the FP8 products that use it."""
    if f.two_directions:
        return READ_16 + 2 * (WRITE_8 + MX_SCALE)
    return READ_16 + WRITE_8 + (TRANSPOSE_8 if f.transposes else 0.0)


def _norm_fused(f: Fp8, q: float) -> float:
    """Bytes per element to quantize a norm's output inside ``LayerNormLinear`` (module doc)."""
    if f.recipe == "delayed":
        return TRANSPOSE_PASS if f.transposes else 0.0
    return q                                                  # the norm's amax is the cast's


def cast_bytes(f: Fp8, *, inputs: float, fused_inputs: float, grads: float, weights: float) -> tuple[float, float]:
    """(forward, backward) bytes the casts of one pass move (module doc): ``inputs`` elements of
    linear inputs quantized apart, ``fused_inputs`` quantized where the norm that makes them
    allows (:func:`_norm_fused`; as inputs apart where the stack does not fuse), ``grads`` output-
    gradient elements, ``weights`` parameters quantized (the caller passes this micro-batch's
    share of the per-step cast)."""
    q = _quantize(f)
    amax = AMAX_PASS if f.amax_pass else 0.0
    fused = _norm_fused(f, q) if f.norm_fused else q + amax
    fwd = inputs * (q + amax) + fused_inputs * fused + weights * (q + amax)
    bwd = grads * (q + amax)
    return fwd, bwd


def weight_copy_bytes(f: Fp8) -> float:
    """Extra bytes per linear parameter FP8 keeps beside (or instead of) the bf16 weight."""
    copies = 2.0 if (f.transposes or f.two_directions) else 1.0
    return copies - (2.0 if f.param_gather else 0.0)


#: A linear's input saved for the backward, bytes per element, in FP8 (the column-wise copy).
SAVED_INPUT_BYTES = 1.0


def param_gather_bytes(f: Fp8 | None) -> float:
    """Bytes per layer parameter on the data-parallel wire when weights are gathered."""
    return 1.0 if f is not None and f.param_gather else 2.0
