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

**torchao's float8** (the FSDP stacks: torchtitan, NeMo AutoModel; ``Framework.fp8_library``)
casts differently from Transformer Engine, each ``Float8Linear`` by itself
(torchao/float8/float8_linear.py ``matmul_with_hp_or_float8_args`` @36027d8): the forward casts
the input and the weight; the backward casts the output gradient twice (row-wise for the data
gradient, column-wise for the weight gradient), the input again from its saved 16-bit copy and
the weight again; ``torch._scaled_mm`` takes its first operand row-major and its second
column-major, so three operands are copied into the other layout (float8_ops.py
``preprocess_addmm``). Nothing is cached across micro-batches. Bytes an element (:func:`_torchao`):

* in eager PyTorch (``compiled`` off) each cast is six kernels: ``abs`` and ``max`` for the amax
  (read 2, write 2; read 2: float8_utils.py ``tensor_to_amax``), then ``to(float32)`` (2 → 4),
  the scale's multiply (4 → 4), the saturating ``clamp`` (4 → 4) and ``to(float8)`` (4 → 1)
  (float8_training_tensor.py ``_ToFloat8ConstrFunc``, float8_utils.py ``to_fp8_saturated``):
  33 bytes; an input, an output gradient or a weight is cast twice and copied once (1 → 1):
  68 bytes;
* under ``torch.compile`` (TorchInductor fuses each cast: torchtitan docs "torch.compile fuses the
  float8 scaling/casting kernels") as torchao's own roofline counts them without fusing the amax
  into the producer (torchao/testing/training/roofline_utils.py
  ``get_tensor_memory_traffic_ovhd_s``): tensorwise, an input or output gradient read for its
  amax (2), then read and written in both layouts (2 + 1 + 1): 6; a weight 2 + 3 + 3 = 8; rowwise,
  an input or output gradient cast row-wise while a 16-bit transposed copy is written
  (2 + 1 + 2), then that copy cast (2 + 1): 8; a weight 3 + 4 (the 16-bit transpose) + 3 = 10;
* rowwise scaling runs the forward product with fast accumulation on PyTorch's row-wise kernel,
  and the two backward products (slow accumulation) on cuBLAS's per-tensor kernel with unit scales,
  their 16-bit outputs then multiplied by the row and column scales, read 2 and write 2 an output
  element (float8_ops.py ``addmm_float8_unwrapped``: "The rowwise CUTLASS-based kernel is so slow
  without fast-accum that we'd rather use the tensorwise cuBLAS-based kernel and do the scaling
  manually afterwards"): all three products timed from the FP8 table, as torchao's roofline times
  them (one FP8 rate for both recipes; PyTorch's row-wise kernel with fast accumulation is within
  90-100 % of the per-tensor one on most shapes, pytorch/pytorch issue 147971);
* ``rowwise_with_gw_hp`` casts the input and the output gradient once, row-wise (2 + 1 compiled,
  33 eager), the weight row-wise for the forward and per-tensor for the data gradient (3 + 3
  compiled; 33 + 33 + 2 eager), and runs the weight gradient's product on the 16-bit operands
  (config.py ``ROWWISE_WITH_GW_HP``; roofline_utils.py): timed from the bf16 table;
* with FSDP's float8 all-gather (tensorwise) the gathered weight is already FP8: only its
  column-major copy for the data gradient remains, 2 bytes a weight.

torchao's float8 converts ``nn.Linear`` modules: an MoE layer's routed experts, one grouped product on
bf16 parameters in torchtitan (models/moe/moe.py ``GroupedExperts``), stay 16-bit
(:attr:`Fp8.routed_experts_fp8`).

torchao saves the linear's 16-bit input for the backward (``ctx.save_for_backward(input_hp,
weight_hp_t)``) and keeps no FP8 weight between micro-batches: no activation saving and no
weight copy beyond the gathered FP8 weight replacing the 16-bit one (:func:`weight_copy_bytes`,
:meth:`Fp8.saves_fp8_inputs`).

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


#: The libraries that run a stack's FP8 linears (``Framework.fp8_library``), and the recipes each
#: has: Transformer Engine's (TransformerEngine v2.8 transformer_engine/common/recipe/__init__.py)
#: and torchao's (torchao/float8/config.py ``Float8LinearRecipeName``: tensorwise, i.e. current
#: scaling, rowwise and rowwise_with_gw_hp; MXFP8 through torchao.prototype.mx_formats, as
#: torchtitan's ``MXFP8LinearConverter`` runs it).
#: ``"none"``: a stack whose software predates FP8 training (the 2021-2022 Megatron-LM, DeepSpeed
#: and Megatron-DeepSpeed presets; Transformer Engine's first code is of 2022-09-27,
#: NVIDIA/TransformerEngine commit 996ea169c), which runs no FP8 recipe.
LIBRARY_RECIPES = {"transformer-engine": ("delayed", "current", "blockwise", "mxfp8"),
                   "torchao": ("current", "rowwise", "rowwise_with_gw_hp", "mxfp8"),
                   "none": ()}

#: torchao's row-wise recipes (torchao/float8/config.py ``Float8LinearRecipeName``).
ROWWISE = ("rowwise", "rowwise_with_gw_hp")

#: torchao in eager PyTorch: one cast of a 16-bit tensor, bytes an element (module doc): abs
#: (2 + 2), max (2), to(float32) (2 + 4), the scale's multiply (4 + 4), clamp (4 + 4), to(float8) (4 + 1).
TORCHAO_EAGER_CAST = 4.0 + 2.0 + 6.0 + 8.0 + 8.0 + 5.0
#: A copy of an FP8 operand into the layout ``torch._scaled_mm`` takes (read 1, write 1).
LAYOUT_COPY_8 = 2.0
#: An input, output gradient or weight in eager torchao: cast twice and copied once (module doc).
EAGER_OPERAND_BYTES = 2 * TORCHAO_EAGER_CAST + LAYOUT_COPY_8
#: torchao under torch.compile, bytes an element of a micro-batch (torchao's roofline, module doc),
#: (forward, backward) for an input, an output gradient and a weight: tensorwise, the input's amax
#: pass and its cast to both layouts in the forward (2 + 2 + 1 + 1), the output gradient's in the
#: backward, the weight's amax pass and forward cast (2 + 3) and its backward cast (3); rowwise, the
#: row-wise cast beside the 16-bit transpose in the forward (2 + 1 + 2) and that transpose's cast in
#: the backward (2 + 1), the weight's forward cast (3), its 16-bit transpose and that cast (4 + 3).
TORCHAO_COMPILED = {"current": {"input": (6.0, 0.0), "grad": (0.0, 6.0), "weight": (5.0, 3.0)},
                    "rowwise": {"input": (5.0, 3.0), "grad": (0.0, 8.0), "weight": (3.0, 7.0)},
                    # one row-wise cast each (2 + 1); the weight's, and its per-tensor cast for the
                    # data gradient (2 + 1); the weight gradient's product takes the 16-bit operands
                    "rowwise_with_gw_hp": {"input": (3.0, 0.0), "grad": (0.0, 3.0), "weight": (3.0, 3.0)}}
#: Rowwise scaling's backward products: their 16-bit outputs scaled in place (read 2, write 2).
ROWWISE_RESCALE = 4.0


def linear_in_fp8(name: str) -> bool:
    """Whether a layer's linear product (named as ``step.layers`` names them: ``qkv``, ``proj``,
    ``mlp up``, ``router``, ``expert up``, …) runs in FP8 when the run does: every one but the
    MoE router's gate (module doc, "Which products"); whether the routed experts do is the stack's
    (:attr:`Fp8.routed_experts_fp8`)."""
    return name != "router"


@dataclass(frozen=True)
class Fp8:
    """A run's FP8: the recipe and what the stack and the accelerator make of it (module doc)."""

    recipe: str
    transposes: bool         # the accelerator needs FP8 transposes (Hopper)
    norm_fused: bool         # QKV and MLP-up inputs quantized inside the norm (TE LayerNormLinear)
    param_gather: bool       # weights gathered and kept in FP8 (FP8 parameters)
    library: str = "transformer-engine"   # or "torchao" (:data:`LIBRARY_RECIPES`)
    compiled: bool = True    # torchao's casts fused by torch.compile (off: eager kernels)

    @property
    def amax_pass(self) -> bool:
        return self.recipe == "current"

    @property
    def two_directions(self) -> bool:
        return self.recipe == "mxfp8"

    @property
    def torchao(self) -> bool:
        return self.library == "torchao"

    @property
    def weight_grad_16bit(self) -> bool:
        """Whether the weight gradient's product runs on the 16-bit operands (torchao's
        ``rowwise_with_gw_hp``: ``cast_config_input_for_grad_weight`` and
        ``cast_config_grad_output_for_grad_weight`` disabled, torchao/float8/config.py)."""
        return self.recipe == "rowwise_with_gw_hp"

    @property
    def routed_experts_fp8(self) -> bool:
        """Whether an MoE layer's routed experts run in FP8: Transformer Engine's grouped GEMMs do;
        torchao's float8 converts ``nn.Linear`` modules only, and the routed experts of torchtitan's
        MoE are one grouped product on bf16 parameters (torchtitan v0.2.2 models/moe/moe.py
        ``GroupedExperts``: ``nn.Parameter`` weights, ``torch._grouped_mm(x.bfloat16(), ...)``), so
        they stay 16-bit; the shared experts, ``nn.Linear`` modules, run in FP8."""
        return not self.torchao

    @property
    def caches_weights(self) -> bool:
        """Whether the weights are cast once a step and kept for its micro-batches (Transformer
        Engine's weight workspace); torchao casts them in every forward and backward."""
        return not self.torchao

    @property
    def gathers_fp8_activations(self) -> bool:
        """Whether sequence parallelism's all-gathers of a linear's input move FP8 (Transformer
        Engine; torchao's tensorwise, torchtitan's ``Float8ColwiseParallel``) or 16 bits (torchao's
        other recipes: "for float8 with rowwise scaling, all distributed communication is done in
        high precision", torchtitan v0.2.2 docs/float8.md and models/llama3/infra/parallelize.py
        ``enable_float8_tensorwise_tp``)."""
        return not self.torchao or self.recipe == "current"

    @property
    def saves_fp8_inputs(self) -> bool:
        """Whether a linear's input is saved for the backward as its FP8 copy (Transformer Engine)
        rather than in 16 bits (torchao)."""
        return not self.torchao


def default_recipe(hw: Hardware, stack_default: str | None = None) -> str:
    """The recipe a run gets when it names none: the stack's (torchao: tensorwise, i.e.
    current scaling), else Transformer Engine's choice, MXFP8 where the accelerator runs it,
    delayed scaling otherwise (TransformerEngine v2.8 transformer_engine/pytorch/fp8.py
    ``get_default_fp8_recipe``)."""
    if stack_default is not None:
        return stack_default
    return "mxfp8" if "mxfp8" in hw.fp8_recipes else "delayed"


def resolve(training: Training, hw: Hardware, *, norm_fused: bool = True, param_gather: bool = False,
            stack_default: str | None = None, library: str = "transformer-engine",
            compiled: bool = True, stack: str | None = None, only: tuple[str, ...] = ()) -> Fp8 | None:
    """The run's FP8, or None for a 16-bit run; a recipe the accelerator or the stack's FP8
    library (:data:`LIBRARY_RECIPES`; ``stack`` names the stack in the error; ``only``: the library's
    recipes the stack's release runs, empty for all) cannot run is a one-line error."""
    if training.precision != "fp8":
        return None
    if not hw.fp8_recipes:
        raise ModelcutError(f"precision fp8 needs FP8 tensor cores; {hw.name} has none "
                            "(Transformer Engine and torchao run FP8 on NVIDIA GPUs of compute capability 8.9 or higher)")
    if library not in LIBRARY_RECIPES:
        raise ModelcutError(f"FP8 library must be one of {', '.join(LIBRARY_RECIPES)}, got {library!r}")
    if not LIBRARY_RECIPES[library]:
        who = stack or "this stack"
        raise ModelcutError(f"{who} has no FP8 training (its software predates FP8 recipes); run it in bf16 "
                            "or fp16, or name a stack that trains in FP8 (megatron-core, nemo, torchtitan, ...)")
    recipe = training.fp8_recipe or default_recipe(hw, stack_default)
    if recipe not in FP8_RECIPES:
        raise ModelcutError(f"fp8_recipe must be one of {', '.join(FP8_RECIPES)}, got {recipe!r}")
    if recipe not in LIBRARY_RECIPES[library]:
        who = f"{stack} runs" if stack else "the stack runs"
        raise ModelcutError(f"fp8_recipe {recipe} is not {library}'s: {who} FP8 through {library}, whose "
                            f"recipes are {', '.join(LIBRARY_RECIPES[library])}")
    if only and recipe not in only:
        raise ModelcutError(f"fp8_recipe {recipe} is not one {stack or 'the stack'} runs: its {library} "
                            f"predates it (it runs {', '.join(only)})")
    # torchao's rowwise recipes run wherever torch._scaled_mm has FP8 (torchtitan's float8 converter
    # checks compute capability 8.9: torchtitan/components/quantization/float8.py); the others as
    # Transformer Engine lists them for the accelerator
    if recipe not in ROWWISE and recipe not in hw.fp8_recipes:
        raise ModelcutError(f"fp8_recipe {recipe} does not run on {hw.name} (it runs "
                            f"{', '.join(hw.fp8_recipes)}); MXFP8 needs a Blackwell GPU")
    # block-scaled weights are not gathered in FP8 (Megatron-Bridge's blockwise preset sets
    # fp8_param_gather = False; torchao's float8 all-gather is tensorwise only)
    gather = param_gather and (recipe == "current" if library == "torchao" else recipe in ("delayed", "current", "mxfp8"))
    return Fp8(recipe, transposes=hw.arch in TN_ONLY, norm_fused=norm_fused, param_gather=gather,
               library=library, compiled=compiled)


def for_stack(training: Training, hw: Hardware, stack) -> Fp8 | None:
    """:func:`resolve` with a training stack's FP8 settings (a ``Framework``'s
    ``fp8_norm_fused``, ``fp8_param_gather``, ``fp8_default_recipe``, ``fp8_library``, and
    ``torch_compile`` for whether torchao's casts are compiled): the one place the step model and
    the memory model get a run's FP8 from."""
    default = stack.fp8_default_recipe
    return resolve(training, hw, norm_fused=stack.fp8_norm_fused, param_gather=stack.fp8_param_gather,
                   stack_default=None if default == "auto" else default, library=stack.fp8_library,
                   compiled=stack.torch_compile, stack=stack.name, only=stack.fp8_only)


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


def _torchao(f: Fp8, inputs: float, grads: float, weights: float) -> tuple[float, float]:
    """(forward, backward) bytes of torchao's casts for one micro-batch (module doc): ``inputs``
    linear-input elements, ``grads`` output-gradient elements, ``weights`` parameters."""
    if f.recipe == "mxfp8":
        # torchao's MXFP8 linear quantizes each operand both ways as Transformer Engine's does
        q = _quantize(f)
        return (inputs + weights) * q, (grads + weights) * q
    gathered = f.param_gather          # the weight arrives in FP8: only its layout copy remains
    if f.compiled:
        per = TORCHAO_COMPILED[f.recipe]
        w_f, w_b = (0.0, LAYOUT_COPY_8) if gathered else per["weight"]
        fwd = inputs * per["input"][0] + grads * per["grad"][0] + weights * w_f
        bwd = inputs * per["input"][1] + grads * per["grad"][1] + weights * w_b
    elif f.weight_grad_16bit:
        # the input and the output gradient cast once (row-wise, already in the layout their
        # product takes); the weight row-wise for the forward, per-tensor and copied for the data gradient
        fwd = inputs * TORCHAO_EAGER_CAST + weights * TORCHAO_EAGER_CAST
        bwd = grads * TORCHAO_EAGER_CAST + weights * (TORCHAO_EAGER_CAST + LAYOUT_COPY_8)
    else:
        twice = EAGER_OPERAND_BYTES
        w_f = 0.0 if gathered else TORCHAO_EAGER_CAST
        w_b = LAYOUT_COPY_8 if gathered else TORCHAO_EAGER_CAST + LAYOUT_COPY_8
        fwd = inputs * TORCHAO_EAGER_CAST + weights * w_f
        bwd = inputs * (TORCHAO_EAGER_CAST + LAYOUT_COPY_8) + grads * twice + weights * w_b
    if f.recipe == "rowwise":       # (rowwise_with_gw_hp's data gradient takes a per-tensor weight: no rescale)
        # the data gradient (an input's shape) and the weight gradient, rescaled in 16 bits
        bwd += (inputs + weights) * ROWWISE_RESCALE
    return fwd, bwd


def cast_bytes(f: Fp8, *, inputs: float, fused_inputs: float, grads: float, weights: float) -> tuple[float, float]:
    """(forward, backward) bytes the casts of one pass move (module doc): ``inputs`` elements of
    linear inputs quantized apart, ``fused_inputs`` quantized where the norm that makes them
    allows (:func:`_norm_fused`; as inputs apart where the stack does not fuse), ``grads`` output-
    gradient elements, ``weights`` parameters quantized (the caller passes this micro-batch's
    share of the per-step cast where the library caches the cast weights, :attr:`Fp8.caches_weights`;
    all of them with torchao, :func:`_torchao`)."""
    if f.torchao:
        return _torchao(f, inputs + fused_inputs, grads, weights)
    q = _quantize(f)
    amax = AMAX_PASS if f.amax_pass else 0.0
    fused = _norm_fused(f, q) if f.norm_fused else q + amax
    fwd = inputs * (q + amax) + fused_inputs * fused + weights * (q + amax)
    bwd = grads * (q + amax)
    return fwd, bwd


def weight_copy_bytes(f: Fp8) -> float:
    """Extra bytes per linear parameter FP8 keeps beside (or instead of) the bf16 weight: with
    torchao none, its casts living only while a product runs (the gathered FP8 weight replaces
    the 16-bit one: −1)."""
    if f.torchao:
        return -1.0 if f.param_gather else 0.0
    copies = 2.0 if (f.transposes or f.two_directions) else 1.0
    return copies - (2.0 if f.param_gather else 0.0)


#: A linear's input saved for the backward, bytes per element, in FP8 (the column-wise copy).
SAVED_INPUT_BYTES = 1.0


def param_gather_bytes(f: Fp8 | None) -> float:
    """Bytes per layer parameter on the data-parallel wire when weights are gathered."""
    return 1.0 if f is not None and f.param_gather else 2.0
