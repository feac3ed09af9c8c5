"""The inputs of every use case as pydantic models: the one boundary every face validates through.

The command line builds these from its options, the web API takes them as request bodies (its
OpenAPI schema is theirs), RUN.toml's tables are read with them, and the Python entry points
accept them. Each field carries its own rule here: its type, finite numbers, positive sizes, a
name the catalog or the registry knows, a size within the caps of :mod:`.limits` (the schema
states the default caps; the command line validates against the caps its flags raise, passed in
the validation context as ``{"limits": Limits(...)}``). Rules that join several fields (tp·cp·pp·dp
against the GPUs, a chunk count the schedule runs) and the caps on work (ops, layouts) are the
service's, in the functions that take these models: they need the catalog and the registry.

:func:`parse` turns a mapping into a model or a one-line :class:`ModelcutError`.
"""

from __future__ import annotations

import re
from typing import Annotated, Any, Literal, Optional, Union, get_args, get_origin

from pydantic import AfterValidator, BaseModel, BeforeValidator, ConfigDict, Field, ValidationError, ValidationInfo, model_validator

from .. import catalog
from ..analysis.calibrate import WEIGHINGS
from ..core.costs.context import CP_KINDS, cp_kind_name
from ..core.costs.kernels import NAMES as CONSTANTS
from ..core.errors import ModelcutError
from ..core.specs import (ADAM_MOMENT_DTYPES, ATTENTION_KINDS, CROSS_ENTROPY_KINDS, FP8_RECIPES, GRAD_REDUCE_DTYPES, PRECISIONS, UNTIMED_FP8_RECIPES,
                          ExploreRecompute, Recompute, RecomputeModule, fp8_recipe_name, grad_reduce_name,
                          precision_name)
from ..core.sim import registry
from ..core.step import MODES
from ..core.step.frameworks import OPTIONS
from ..core.step.stack_names import (fsdp_note, fsdp_setting, negated_option, option_name, unmodelled_note,
                                     unmodelled_option)
from .inputs import NOT_MODELLED, not_overlap, shown as _shown
from .limits import DEFAULT, LimitError, Limits

# --- names the catalog and the registry know --------------------------------------------------------

ScheduleName = Literal[registry.names()]  # type: ignore[valid-type]
ModelName = Literal[catalog.model_keys()]  # type: ignore[valid-type]


#: a catalog name or alias, or one of a GPU whose sustained share has a measured draw with
#: ``@<watts>w``: held to that power limit (catalog.hardware); a cap above the GPU's limit is refused
#: by the service, as a rule between the two parts the schema cannot state
_CAPPABLE = "|".join(re.escape(k) for k in catalog.cappable_keys())
GpuName = Union[Literal[catalog.hardware_keys()],  # type: ignore[valid-type]
                Annotated[str, Field(pattern=rf"(?i)^({_CAPPABLE})\s*@\s*[1-9][0-9]{{0,3}}(\.[0-9]{{1,3}})?\s*w$")]]
FrameworkName = Literal[catalog.framework_names()]  # type: ignore[valid-type]
ModeName = Literal[tuple(MODES)]  # type: ignore[valid-type]
Constant = Literal[CONSTANTS]  # type: ignore[valid-type]
MeshDim = Literal["tp", "cp", "pp", "dp", "ep"]


def limits_of(info: ValidationInfo | None) -> Limits:
    """The caps a validation runs under: the context's ``limits``, else :data:`.limits.DEFAULT`."""
    ctx = getattr(info, "context", None)
    lim = ctx.get("limits") if isinstance(ctx, dict) else None
    return lim if isinstance(lim, Limits) else DEFAULT


def _capped(cap: str):
    def check(value, info: ValidationInfo):
        if value is not None:
            limits_of(info).check(cap, value, info.field_name or cap)
        return value
    return AfterValidator(check)


def _unique(values):
    if values is not None and len(set(values)) != len(values):
        raise ValueError("must name each item once")
    return values


def _whole(value):
    """A float with nothing after the point, as the integer it is (JSON Schema's integers include
    4.0); anything else goes on to the strict integer check."""
    if type(value) is float and value.is_integer():
        return int(value)
    return value


def _kinds(tp: Any) -> set[str]:
    """Whether a field's type holds integers ("int") or lists of them ("list")."""
    if tp is int:
        return {"int"}
    origin, args = get_origin(tp), get_args(tp)
    if origin is list:
        return {"list"} if "int" in set().union(*(_kinds(a) for a in args)) else set()
    if origin is Annotated:
        return _kinds(args[0])
    if args:
        return set().union(*(_kinds(a) for a in args))
    return set()


def value_kind(tp: Any) -> str:
    """What a field holds, for a face that reads it as text (a CSV cell): "int", "bool", "list"
    (of anything) or "str"."""
    if tp is bool:
        return "bool"
    if tp is int:
        return "int"
    origin, args = get_origin(tp), get_args(tp)
    if origin in (list, tuple):
        return "list"
    if origin is Annotated:
        return value_kind(args[0])
    kinds = {value_kind(a) for a in args if a is not type(None)} if args else set()
    return kinds.pop() if len(kinds) == 1 else "str"


def Capped(cap: str, minimum: float = 1):
    """A number from ``minimum`` up to a cap of :mod:`.limits` (the schema states the default)."""
    return [Field(ge=minimum, json_schema_extra={"maximum": getattr(DEFAULT, cap)}), _capped(cap)]


GpuCount = Annotated[int, *Capped("max_gpus")]
Width = Annotated[int, *Capped("max_width")]
Layers = Annotated[int, *Capped("max_layers")]
SeqLen = Annotated[int, *Capped("max_seq")]
Tokens = Annotated[int, *Capped("max_tokens")]
Time = Annotated[float, Field(ge=0, allow_inf_nan=False, json_schema_extra={"maximum": DEFAULT.max_time}),
                 _capped("max_time")]
Fraction01 = Annotated[float, Field(ge=0, lt=1, allow_inf_nan=False)]
Unique = AfterValidator(_unique)


def _order(values):
    if values is not None and (sorted(x for x in values if x != "ep") != sorted(("tp", "cp", "pp", "dp"))
                               or values.count("ep") > 1):
        raise ValueError("must name tp, cp, pp and dp once each (ep at most once)")
    return values


#: A rank order, innermost first: tp, cp, pp and dp once each, ep at most once (the schema says so).
RankOrder = Annotated[list[MeshDim], Field(json_schema_extra={
    "minItems": 4, "maxItems": 5, "uniqueItems": True,
    "allOf": [{"contains": {"const": d}} for d in ("tp", "cp", "pp", "dp")]}), AfterValidator(_order)]

#: Token counts as text: digits, or digits and a binary suffix (k = 2^10, M = 2^20, G = 2^30), at
#: most the default cap of 2^40 tokens (so the schema holds no count the server refuses).
TOKEN_PATTERN = r"^([1-9][0-9]{0,11}|[1-9][0-9]{0,8}[kK]|[1-9][0-9]{0,5}[mM]|[1-9][0-9]{0,2}[gG])$"


def _token_text(text: str) -> str:
    if not re.fullmatch(TOKEN_PATTERN, text):
        raise ValueError("must be a whole token count such as 16777216 or 16M (k, M, G: 2^10, 2^20, 2^30), "
                         "at most 2^40")
    return text


TokenText = Annotated[str, Field(json_schema_extra={"pattern": TOKEN_PATTERN}), AfterValidator(_token_text)]


def _spelled(read, refused: dict[str, str] | None = None):
    """A name as the stacks spell it read as modelcut's (:func:`..core.specs.precision_name`); one of
    ``refused`` is its reason as the error; what it does not know passes on to the Literal check."""
    def before(value):
        if not isinstance(value, str):
            return value
        if refused and value.strip().lower() in refused:
            raise ValueError(refused[value.strip().lower()])      # the field and the value are named apart
        return read(value)
    return BeforeValidator(before)


Precision = Annotated[Literal[PRECISIONS], _spelled(precision_name)]  # type: ignore[valid-type]
#: context parallelism's form, as the stacks name it too (Megatron-LM's --cp-comm-type p2p, allgather, a2a, a2a+p2p)
CpKind = Annotated[Literal[CP_KINDS], _spelled(cp_kind_name)]  # type: ignore[valid-type]
Fp8Recipe = Annotated[Literal[FP8_RECIPES],  # type: ignore[valid-type]
                      _spelled(fp8_recipe_name, UNTIMED_FP8_RECIPES)]
CrossEntropy = Literal[CROSS_ENTROPY_KINDS]  # type: ignore[valid-type]
#: the gradients' reduce type, as torch names it too ("float32", "bfloat16")
GradReduce = Annotated[Literal[GRAD_REDUCE_DTYPES], _spelled(grad_reduce_name)]  # type: ignore[valid-type]
#: Adam's moments' types a run may name (:data:`..core.specs.ADAM_MOMENT_DTYPES`).
AdamMoments = Literal[ADAM_MOMENT_DTYPES]  # type: ignore[valid-type]
_ADAM_MOMENTS_HELP = ("the type Adam's two moments are kept in, fp32 or bf16 (Megatron-core's precision-aware optimizer, "
                      "--exp-avg-dtype and --exp-avg-sq-dtype; default: the stack's)")
_FP8_SWIGLU_HELP = ("the SwiGLU's input kept for the backward in FP8 (Megatron-core's activation_func_fp8_input_store; "
                    "a gated MLP only)")
_GRAD_REDUCE_HELP = ("the type gradients are reduced in across data parallelism: fp32 or the run's 16-bit type "
                     "(float32, bfloat16 as torch names them; PyTorch FSDP's reduce_dtype, torchtitan's "
                     "mixed_precision_reduce, Composer's FSDP mixed_precision DEFAULT = fp32 and PURE = 16-bit, "
                     "Megatron-LM's --grad-reduce-in-bf16; default: the stack's)")


def _recompute_spelled(value):
    """Recomputation as the stacks write it: llm-foundry's ``activation_checkpointing: true`` (every
    block checkpointed, full recomputation; false: none), and any case ("Full")."""
    if isinstance(value, bool):
        return "full" if value else "none"
    if isinstance(value, str):
        key = value.strip().lower()
        return {"true": "full", "false": "none"}.get(key, key)
    return value


#: Two or three precisions, each once: one search or prediction each (``--precision bf16,fp8``).
Precisions = Annotated[list[Precision], Field(min_length=2, max_length=3, json_schema_extra={"uniqueItems": True}),
                       Unique]


#: true/false in the schema too (the JSON a request may send), read as full/none before the check.
RecomputeIn = Annotated[Union[Recompute, bool], BeforeValidator(_recompute_spelled)]


class Strict(BaseModel):
    """Strict types, no unknown fields; a whole-number float (4.0) stands for its integer, as in
    JSON Schema, wherever an integer is asked for."""

    model_config = ConfigDict(extra="forbid", strict=True)

    @model_validator(mode="before")
    @classmethod
    def _whole_numbers(cls, data: Any) -> Any:
        if not isinstance(data, dict):
            return data
        out = None
        for name, field in cls.model_fields.items():
            if name not in data:
                continue
            kinds = _kinds(field.annotation)
            val = data[name]
            new = val
            if "int" in kinds:
                new = _whole(val)
            if "list" in kinds and isinstance(val, list):
                new = [_whole(x) for x in val]
            if new is not val:
                out = dict(data) if out is None else out
                out[name] = new
        return data if out is None else out

    @model_validator(mode="before")
    @classmethod
    def _catalog_spellings(cls, data: Any) -> Any:
        """A GPU, model or framework written another way the catalog recognises ("H100 80GB HBM3",
        "Llama-3.1-8B", "megatron_core": any case, other separators) stands for its catalog name, as
        the run file's reader takes it; a name the catalog does not know is left for the field's
        own error."""
        if not isinstance(data, dict):
            return data
        out = None
        for name, look in (("gpu", catalog.hardware), ("model", catalog.model), ("framework", catalog.framework)):
            val = data.get(name)
            if name not in cls.model_fields or not isinstance(val, str):
                continue
            try:
                canon = look(val).name
            except ModelcutError:
                continue
            if canon != val:
                out = dict(data) if out is None else out
                out[name] = canon
        return data if out is None else out


# --- pipeline simulation -------------------------------------------------------------------------


class SimulateInput(Strict):
    """``modelcut simulate`` and ``POST /api/simulate``: a named schedule and its timing."""

    model_config = ConfigDict(extra="forbid", strict=True, title="SimulateRequest")

    schedule: ScheduleName = Field("1f1b", description="a schedule of the registry (GET /api/catalog lists them)")
    devices: int = Field(4, ge=1, description="pipeline devices p")
    microbatches: int = Field(8, ge=1, description="micro-batches m")
    chunks: Optional[int] = Field(None, ge=1, description="chunks per device v (null: the schedule's default)")
    forward: Time = Field(1.0, description="forward time F for a device's whole share of layers")
    backward: Time = Field(2.0, description="backward time B (with a split backward and a weight time: the input "
                                            "gradient)")
    weight: Optional[Time] = Field(None, description="weight-gradient time W (split schedules; null: B and W share "
                                                     "the backward; other schedules add it to B)")
    p2p: Time = Field(0.0, description="point-to-point time added to each input that crosses devices")


class SimulateArgs(SimulateInput):
    """The command line's simulate: a registry schedule, or ``torch:<Class>`` as torch executes it."""

    schedule: Union[ScheduleName, Annotated[str, Field(pattern=r"^torch:[A-Za-z_][A-Za-z0-9_]{0,63}$")]] = "1f1b"


# --- models, layouts, runs -----------------------------------------------------------------------


class ModelSpecIn(Strict):
    """A model's fields (those of a RUN.toml's [model] table)."""

    name: Optional[str] = Field(None, max_length=128)
    layers: Layers
    hidden: Width
    ffn_hidden: Optional[Width] = Field(None, description="default 4·hidden")
    heads: Width
    kv_heads: Optional[Width] = Field(None, description="default heads")
    vocab: Width
    gated_mlp: bool = False
    tied_embeddings: bool = False
    head_dim: Optional[Width] = None
    norm: Literal["layernorm", "rmsnorm"] = "layernorm"
    bias: bool = True
    dropout: bool = True
    max_seq: Optional[SeqLen] = None
    experts: Width = 1
    top_k: Width = 1
    expert_ffn_hidden: Optional[Width] = None
    shared_experts: Annotated[int, *Capped("max_width", 0)] = 0
    dense_layers: Annotated[int, *Capped("max_layers", 0)] = 0
    capacity_factor: Optional[Annotated[float, Field(gt=0, le=1000, allow_inf_nan=False)]] = None
    source: str = Field("", max_length=1000)
    learned_positions: bool = False
    qkv_bias: Optional[bool] = None
    rope_mscale: Annotated[float, Field(gt=0, le=100, allow_inf_nan=False,
                                        description="YaRN's attention factor on RoPE (1: plain RoPE)")] = 1.0
    glu_clamp: bool = Field(False, description="the gated MLP clamps its two halves (GPT-OSS's swiglu_limit)")
    sliding_window: Optional[SeqLen] = Field(None, description="keys a sliding-window layer attends (with "
                                                               "sliding_layers)")
    sliding_layers: Annotated[int, *Capped("max_layers", 0)] = Field(0, description="layers attending within "
                                                                                    "sliding_window")
    moe_every: Annotated[int, *Capped("max_layers", 1)] = Field(
        1, description="with experts: every moe_every-th layer past dense_layers holds them (Llama 4 Maverick: 2)")
    attention_chunk: Optional[SeqLen] = Field(None, description="tokens of a chunked-attention layer's block "
                                                                "(with chunked_layers; Llama 4: 8192)")
    chunked_layers: Annotated[int, *Capped("max_layers", 0)] = Field(0, description="layers attending only "
                                                                                    "within their block")
    q_lora_rank: Optional[Width] = Field(None, description="multi-head latent attention: the queries' latent width")
    kv_lora_rank: Optional[Width] = Field(None, description="multi-head latent attention: the keys' and values' "
                                                            "latent width (with the three head widths)")
    qk_nope_head_dim: Optional[Width] = Field(None, description="multi-head latent attention: Q and K per head "
                                                                "without RoPE")
    qk_rope_head_dim: Optional[Width] = Field(None, description="multi-head latent attention: Q and K per head, RoPE")
    v_head_dim: Optional[Width] = Field(None, description="multi-head latent attention: V per head")


#: Exactly one of the three ways to name a model, as the schema says it.
_ONE_MODEL = {"oneOf": [{"required": [k], "properties": {k: {"type": t}}}
                        for k, t in (("model", "string"), ("hf_config", "object"), ("model_spec", "object"))]}


class ModelChoice(Strict):
    """Exactly one of: a catalog model's name, a Hugging Face config.json object, or the fields."""

    model_config = ConfigDict(extra="forbid", strict=True, json_schema_extra=_ONE_MODEL)

    model: Optional[ModelName] = Field(None, description="a catalog model or alias, e.g. llama3-405b")
    hf_config: Optional[dict[str, Any]] = Field(None, description="a Hugging Face config.json, parsed")
    model_spec: Optional[ModelSpecIn] = Field(None, description="the model's fields")


class LayoutIn(Strict):
    """A layout (RUN.toml's [layout], the web's ``layout``)."""

    tp: GpuCount = 1
    cp: GpuCount = 1
    pp: GpuCount = 1
    dp: GpuCount = 1
    ep: GpuCount = 1
    vpp: Optional[Layers] = None
    sequence_parallel: Optional[bool] = Field(
        None, description="norms and dropouts cut over tp (default: the training stack's: on with tp > 1 under "
                          "megatron-core, nemo, megatron-bridge and torchtitan's fsdp presets)")
    zero: Optional[Annotated[int, Field(ge=0, le=3)]] = Field(
        None, description="ZeRO stage 0-3 (default: the training stack's: 3 under the FSDP and "
                          "DeepSpeed ZeRO-3 presets (DeepSpeed's 1 with a pipeline), at least 1 with Megatron's "
                          "distributed optimizer, else 0)")
    schedule: Optional[ScheduleName] = None
    etp: Optional[GpuCount] = Field(None, description="expert tensor-parallel size")
    cp_kind: Optional[CpKind] = None
    order: Optional[RankOrder] = Field(None, description="rank order, innermost first (ep may be placed)")
    dp_shard: Optional[GpuCount] = Field(
        None, description="hybrid sharding: ZeRO's states split over dp_shard·cp ranks and replicated across "
                          "dp/dp_shard groups (FSDP's HYBRID_SHARD, torchtitan's data_parallel_shard_degree; "
                          "default: dp, sharded over the whole data-parallel group)")
    cp_a2a: Optional[GpuCount] = Field(
        None, description="with cp_kind a2a+p2p: its all-to-all groups' size, adjacent cp ranks, the ring across "
                          "cp/cp_a2a groups (Megatron-LM's --hierarchical-context-parallel-sizes cp_a2a cp/cp_a2a)")
    first_layers: Optional[Layers] = Field(
        None, description="transformer layers on the first pipeline rank, shared by its chunks, the rest even over "
                          "the middle ranks (Megatron-LM's --decoder-first-pipeline-num-layers; default: the even "
                          "split)")
    last_layers: Optional[Layers] = Field(
        None, description="transformer layers on the last pipeline rank, which also holds the output layer and the "
                          "loss (Megatron-LM's --decoder-last-pipeline-num-layers; default: the even split)")


class TrainingIn(Strict):
    """Batch and sequence (RUN.toml's [training], the web's ``training``)."""

    seq_len: SeqLen
    global_batch: Tokens = Field(description="sequences per step")
    micro_batch: Tokens = 1
    recompute: RecomputeIn = Field("none", description="none, selective or full (true/false as llm-foundry's "
                                                        "activation_checkpointing writes it)")
    precision: Precision = Field("bf16", description="the matrix products' precision (also as the stacks write it: "
                                                     "amp_bf16, bf16-mixed, bfloat16, amp_fp8, …; any case)")
    fp8_recipe: Optional[Fp8Recipe] = Field(None, description="with fp8: the scaling recipe, tensorwise being current (default: the stack's, "
                                                              "else Transformer Engine's)")
    local_batch: Optional[Tokens] = Field(None, description="with a pipeline: sequences per data-parallel rank "
                                                            "per pipeline schedule run (torch.distributed."
                                                            "pipelining's local batch; default: the whole step's, "
                                                            "one run)")
    cross_entropy: Optional[CrossEntropy] = Field(None, description="the loss's kernel, one of "
                                                  f"{', '.join(CROSS_ENTROPY_KINDS)} (core/costs/loss.py: fp32-passes "
                                                  "Megatron-core's unfused vocab-parallel cross-entropy, fused Transformer "
                                                  "Engine's one kernel; default: the stack's)")
    recompute_modules: Optional[list[RecomputeModule]] = Field(
        None, description="with recompute selective: the modules recomputed, Megatron-core's --recompute-modules "
                          "(core_attn, layernorm, moe_act, mla_up_proj; default: the stack's selective policy)")
    recompute_layers: Optional[Layers] = Field(
        None, description="with recompute full: the layers of each pipeline chunk recomputed, its first ones, "
                          "Megatron-core's --recompute-method block --recompute-num-layers (default: every layer)")
    recompute_every: Optional[Layers] = Field(
        None, description="with recompute full: k, every k-th layer of each pipeline rank recomputed whole, the "
                          "rest kept, torchtitan's per-layer selective checkpointing (selective_ac_option = \"k\"; "
                          "default: every layer)")
    grad_reduce: Optional[GradReduce] = Field(None, description=_GRAD_REDUCE_HELP)
    fp8_param_gather: Optional[bool] = Field(None, description="with fp8: the linear layers' weights kept and "
                                                               "gathered in FP8 (Megatron-LM's --fp8-param-gather, "
                                                               "torchtitan's enable_fsdp_float8_all_gather; default: "
                                                               "the stack's)")
    attention: Optional[Literal[ATTENTION_KINDS]] = Field(  # type: ignore[valid-type]
        None, description="the attention kernel: unfused, flash2, flash3, cudnn (Transformer Engine's fused "
                          "attention) or flash4 (Megatron-LM's --attention-backend; default: the stack's)")
    activation_func_fp8_input_store: bool = Field(False, description=_FP8_SWIGLU_HELP)
    adam_moments: Optional[AdamMoments] = Field(None, description=_ADAM_MOMENTS_HELP)


class HardwareIn(Strict):
    """RUN.toml's [hardware]."""

    gpu: GpuName
    gpus: Optional[GpuCount] = Field(None, description="must equal tp·cp·pp·dp")
    gpus_per_node: Optional[GpuCount] = Field(None, description="default: the hardware's")


class OverlapIn(Strict):
    """Overlap overrides of the default model's framework preset (null keeps the preset's)."""

    grad_reduce: Optional[bool] = None
    param_gather: Optional[bool] = None
    p2p_async: Optional[bool] = None
    tp_comm: Optional[bool] = None
    not_modelled: Optional[list[Annotated[str, Field(max_length=400)]]] = Field(
        None, max_length=16, description="the stack's settings given here that modelcut takes but does not model "
                                         "(filled from them, e.g. {\"defer_embedding_wgrad_compute\": true}): each "
                                         "is a note of the answer")

    @model_validator(mode="before")
    @classmethod
    def _stack_names(cls, data: Any) -> Any:
        """An option under a stack's own name (``tp_comm_overlap``, ``async_tp``: ``option_name``) stands
        for modelcut's, as ``--overlap`` takes it; given beside modelcut's name it is left to fail. A
        stack's setting modelcut knows but does not model is taken, its note in ``not_modelled`` where
        it asks for what modelcut does not time, as ``--overlap`` takes it (``unmodelled_note``).
        PyTorch FSDP's prefetch settings stand for the options ``fsdp_setting`` says
        (``{"backward_prefetch": "BACKWARD_PRE"}``: param_gather on; ``forward_prefetch`` and
        ``limit_all_gathers``: none)."""
        if not isinstance(data, dict):
            return data
        out = dict(data)

        def noted(note: str | None) -> None:
            if note is not None:
                out[NOT_MODELLED] = [*(out.get(NOT_MODELLED) or []), note]

        for k in data:
            if not isinstance(k, str) or k in cls.model_fields:
                continue
            if unmodelled_option(k) is not None:     # taken; where it asks for what is not modelled, a note
                val = out.pop(k)
                if val is None:                         # null: as the preset runs, as for every option
                    continue
                if not isinstance(val, (bool, int, float, str)):
                    raise ValueError(f"{k} must be a boolean, a number or a string, got {val!r}")
                try:
                    noted(unmodelled_note(k, val))
                except ModelcutError as e:
                    raise ValueError(str(e)) from None
                continue
            if fsdp_setting(k, "true") is not None:    # PyTorch FSDP's prefetch settings: the options they stand for
                val = out.pop(k)
                if val is None:                         # null keeps the preset's, as for every option
                    continue
                try:
                    fsdp = fsdp_setting(k, val)
                except ModelcutError as e:
                    raise ValueError(str(e)) from None
                noted(fsdp_note(k, val))
                for name, on in fsdp.items():
                    if out.setdefault(name, on) != on:
                        raise ValueError(f"overlap option {name} is given both on and off")
                continue
            if (where := not_overlap(k)) is not None:
                raise ValueError(f"{k} is no overlap: it is {where}")
            name = option_name(k)
            if name is not None and name not in out:
                out[name] = out.pop(k)
            elif name is None and (name := negated_option(k)) is not None and name not in out:
                val = out.pop(k)    # a "no-" flag, or a setting saying an option's converse (batch_p2p_comm)
                out[name] = (not val) if isinstance(val, bool) else val
        return out


assert set(OverlapIn.model_fields) == {*OPTIONS, NOT_MODELLED}, "OverlapIn must hold every overlap option"


class PredictOptions(Strict):
    """How to predict: the model mode and the default model's stack."""

    mode: ModeName = "default"
    eta: Optional[Annotated[float, Field(ge=0.01, le=1, allow_inf_nan=False)]] = Field(
        None, description="fraction of peak the matrix products reach, 0.01 to 1 (default: fitted)")
    framework: Optional[FrameworkName] = Field(None, description="default mode: the training stack, a preset "
                                                                 "(default megatron-core)")
    overlap: Optional[OverlapIn] = Field(None, description="default mode: overlap overrides, e.g. "
                                                           "{\"tp_comm\": true}")
    layers: bool = Field(False, description="default mode: one micro-batch on the busiest device (its units "
                                            "the longest), unit by unit and kernel by kernel (the answer's layers)")


class PredictInput(PredictOptions, ModelChoice):
    """One run: model, accelerator, layout and batch (``modelcut predict``, ``POST /api/predict``)."""

    model_config = ConfigDict(extra="forbid", strict=True, title="PredictRequest", json_schema_extra=_ONE_MODEL)

    gpu: GpuName = Field("h100", description="a catalog accelerator or alias")
    gpus_per_node: Optional[GpuCount] = None
    layout: LayoutIn
    training: TrainingIn
    precisions: Optional[Precisions] = Field(
        None, description="the run at each of these precisions in place of training.precision: the answer is "
                          "{precisions, predictions}; training.fp8_recipe goes with fp8")


class CheckIn(Strict):
    """A layout to find among the ranked ones: any of its knobs."""

    tp: Optional[GpuCount] = None
    cp: Optional[GpuCount] = None
    ep: Optional[GpuCount] = None
    etp: Optional[GpuCount] = Field(None, description="expert tensor-parallel size (an ep > 1 layout's; tp when "
                                                      "the experts are cut as the attention)")
    pp: Optional[GpuCount] = None
    dp: Optional[GpuCount] = None
    dp_shard: Optional[GpuCount] = Field(None, description="hybrid sharding's shard group (the explorer's layouts "
                                                           "with ZeRO's states sharded within a node)")
    vpp: Optional[Layers] = None
    micro_batch: Optional[Tokens] = None
    zero: Optional[Annotated[int, Field(ge=0, le=3)]] = None
    cp_kind: Optional[CpKind] = None
    cp_a2a: Optional[GpuCount] = Field(None, description="with cp_kind a2a+p2p: its all-to-all groups' size (the "
                                                         "explorer's: the cp ranks one node holds, or the largest "
                                                         "part of them that cuts the heads)")
    schedule: Optional[ScheduleName] = None
    last_layers: Optional[Layers] = Field(None, description="a lighter last pipeline rank's layers (the explorer "
                                                            "tries one where the stack takes it and it balances "
                                                            "the output layer)")
    recompute: Optional[ExploreRecompute] = Field(
        None, description="a recomputation variant: none, selective, full, layernorm+moe_act (selective "
                          "recomputation of those modules, on a mixture-of-experts model), or blocks (full "
                          "recomputation of the fewest layers of each pipeline chunk that fit, Megatron-core's "
                          "block method), or every (full recomputation of one layer in k on each rank, k the most "
                          "that fits, torchtitan's per-layer selective checkpointing)")


class ExploreInput(ModelChoice):
    """The explorer's search (``modelcut explore``, ``POST /api/explore``)."""

    model_config = ConfigDict(extra="forbid", strict=True, title="ExploreRequest", json_schema_extra=_ONE_MODEL)

    gpu: GpuName = "h100"
    gpus: GpuCount = Field(description="accelerators N; every layout uses exactly N")
    seq: SeqLen = Field(description="sequence length in tokens")
    global_batch_tokens: Union[Tokens, TokenText] = Field(
        description="tokens per optimizer step: an integer, or with a binary suffix, 16M = 16·2^20",
        json_schema_extra={"examples": [16777216, "16M"]})
    gpus_per_node: Optional[GpuCount] = Field(None, description="default: the hardware's")
    mode: ModeName = "default"
    framework: Optional[FrameworkName] = Field(None, description="default mode: the training stack, a preset "
                                                                 "(default megatron-core)")
    overlap: Optional[OverlapIn] = Field(None, description="default mode: overlap overrides of the stack, e.g. "
                                                           "{\"tp_comm\": true}")
    check: Optional[CheckIn] = Field(None, description="a layout to find among the ranked ones, e.g. "
                                                       "{\"tp\": 8, \"pp\": 16}")
    margin: Fraction01 = Field(0.02, description="fraction of the accelerator's memory kept free")
    top: int = Field(20, ge=1, le=500, description="how many ranked layouts to return")
    schedules: Optional[Annotated[list[ScheduleName], Field(min_length=1, max_length=len(registry.names()),
                                                            json_schema_extra={"uniqueItems": True}), Unique]] = None
    micro_batches: Optional[Annotated[list[Annotated[int, Field(ge=1, le=65536)]],
                                      Field(min_length=1, max_length=8, json_schema_extra={"uniqueItems": True}),
                                      Unique]] = Field(None, description="micro-batch sizes to try (default 1, 2, 4)")
    eps: Optional[Annotated[list[GpuCount], Field(min_length=1, max_length=16, json_schema_extra={"uniqueItems": True}),
                            Unique]] = Field(None, description="expert-parallel sizes to try (MoE models)")
    cp_kinds: Optional[Annotated[list[CpKind], Field(min_length=1, max_length=len(CP_KINDS),
                                                     json_schema_extra={"uniqueItems": True}), Unique]] = None
    allow_tp_across_nodes: bool = False
    flash_attention: Optional[bool] = Field(None, description="FlashAttention: no s² attention scores held "
                                                              "(default: as the stack runs attention)")
    reshard_after_forward: Optional[bool] = Field(None, description="ZeRO-3 reshards weights after each forward "
                                                                    "(default: as the stack does)")
    pareto_within: Fraction01 = Field(0.05, description="time every layout within this fraction of the best "
                                                        "(the Pareto set's reach)")
    exhaustive: bool = Field(False, description="time every layout that fits (no lower bound)")
    precision: Precision = Field("bf16", description="the products' precision of every layout searched")
    fp8_recipe: Optional[Fp8Recipe] = Field(None, description="with fp8: the scaling recipe")
    grad_reduce: Optional[GradReduce] = Field(None, description=_GRAD_REDUCE_HELP)
    fp8_param_gather: Optional[bool] = Field(None, description="with fp8: every layout's linear weights kept and "
                                                               "gathered in FP8 (default: the stack's)")
    activation_func_fp8_input_store: bool = Field(False, description="every layout: " + _FP8_SWIGLU_HELP)
    adam_moments: Optional[AdamMoments] = Field(None, description="every layout: " + _ADAM_MOMENTS_HELP)
    attention: Optional[Literal[ATTENTION_KINDS]] = Field(  # type: ignore[valid-type]
        None, description="every layout's attention kernel: unfused, flash2, flash3, cudnn or flash4 (default: the "
                          "stack's)")
    precisions: Optional[Precisions] = Field(
        None, description="search each of these precisions in place of precision, one search each: the answer "
                          "is {precisions, searches, fastest}; fp8_recipe goes with fp8")
    local_batch: Optional[Tokens] = Field(None, description="with a pipeline: sequences per data-parallel rank per "
                                                            "schedule run (torch.distributed.pipelining's local "
                                                            "batch); pipelined layouts it does not fit are not "
                                                            "searched (default: one run a step)")


class MeshInput(Strict):
    """``modelcut mesh``, ``POST /api/mesh``."""

    model_config = ConfigDict(extra="forbid", strict=True, title="MeshRequest")

    tp: GpuCount = 1
    cp: GpuCount = 1
    pp: GpuCount = 1
    dp: GpuCount = 1
    ep: GpuCount = 1
    etp: Optional[GpuCount] = Field(None, description="expert tensor-parallel size (default tp); with the default "
                                                      "order ep·etp must divide tp·cp·dp")
    gpus_per_node: GpuCount = 8
    rank: Annotated[int, *Capped("max_gpus", 0)] = 0
    order: Optional[RankOrder] = Field(None, description="rank order, innermost first (default Megatron-core's "
                                                         "tp, cp, ep, dp, pp)")
    dp_shard: Optional[GpuCount] = Field(None, description="hybrid sharding: the data-parallel ranks of a ZeRO "
                                                           "shard group (dividing dp); adds its shard and replica groups")
    cp_a2a: Optional[GpuCount] = Field(None, description="hierarchical context parallelism: the all-to-all groups' "
                                                         "size (between 1 and cp, dividing it); adds its all-to-all "
                                                         "and ring groups")


# --- the command line's other commands ---------------------------------------------------------------


class CrosscheckInput(Strict):
    """``modelcut crosscheck``: times in milliseconds, one process per pipeline rank."""

    schedules: Annotated[list[Annotated[str, Field(min_length=1, max_length=64)]], Field(min_length=1, max_length=16)]
    devices: int = Field(4, ge=1, le=64, description="pipeline ranks p, one process each")
    microbatches: int = Field(8, ge=1, le=4096)
    chunks: Optional[int] = Field(None, ge=1, le=64)
    forward_ms: float = Field(20.0, gt=0, le=1e6, allow_inf_nan=False)
    backward_ms: float = Field(40.0, gt=0, le=1e6, allow_inf_nan=False)
    weight_ms: Optional[float] = Field(None, ge=0, le=1e6, allow_inf_nan=False)
    steps: int = Field(3, ge=1, le=1000)
    fit_on: Optional[str] = Field(None, min_length=1, max_length=64)
    timeout: float = Field(300.0, gt=0, le=86400, allow_inf_nan=False)
    order_only: bool = False


class CalibrateInput(Strict):
    """``modelcut calibrate``'s constants."""

    fit: Annotated[list[Constant], Field(min_length=1, max_length=len(CONSTANTS)), Unique]
    gpu: Optional[GpuName] = None
    cv: bool = True
    weigh: Literal[WEIGHINGS] = "runs"  # type: ignore[valid-type]


# --- one line out of a validation error --------------------------------------------------------------

_PHRASES = {
    "greater_than_equal": "must be at least {ge}", "greater_than": "must be more than {gt}",
    "less_than_equal": "must be at most {le}", "less_than": "must be less than {lt}",
    "finite_number": "must be a finite number", "int_type": "must be an integer", "int_parsing": "must be an integer",
    "int_from_float": "must be a whole number", "float_type": "must be a number", "float_parsing": "must be a number",
    "bool_type": "must be true or false", "bool_parsing": "must be true or false", "string_type": "must be a string",
    "missing": "is missing", "extra_forbidden": "is not a known field", "too_short": "needs at least {min_length} items",
    "too_long": "takes at most {max_length} items", "string_too_long": "takes at most {max_length} characters",
    "string_too_short": "needs at least {min_length} characters", "list_type": "must be a list",
    "dict_type": "must be a table (an object, a dictionary of fields)",
    "model_type": "must be a table (an object, a dictionary of fields)",
    "model_attributes_type": "must be a table (an object, a dictionary of fields)", "string_pattern_mismatch": "is not in the expected form",
}


_TYPE_ERRORS = {"int_type", "float_type", "string_type", "bool_type", "list_type", "dict_type", "model_type",
                "int_parsing", "float_parsing", "bool_parsing", "model_attributes_type"}


def _phrase(err: dict) -> str:
    kind, ctx = err.get("type", ""), err.get("ctx") or {}
    if kind == "value_error":
        exc = ctx.get("error")
        return str(exc) if exc is not None else err.get("msg", "invalid")
    if kind == "literal_error":
        return f"must be one of {ctx.get('expected', '')}"
    template = _PHRASES.get(kind)
    if template is None:
        return err.get("msg", "invalid")[:1].lower() + err.get("msg", "invalid")[1:]
    shown = {k: (f"{v:g}" if isinstance(v, float) else v) for k, v in ctx.items()}
    try:
        return template.format(**shown)
    except (KeyError, IndexError):
        return template


def _known(field: str) -> tuple[str, tuple[str, ...]] | None:
    """What a name field names, and the canonical names to offer, for the catalog's own wording
    ("unknown GPU 'a200'; choose one of …")."""
    last = field.rsplit(".", 1)[-1].split("[")[0]
    if last == "gpu":
        return "GPU", tuple(h.name for h in catalog.all_hardware())
    if last == "model":
        return "model", tuple(m.name for m in catalog.all_models())
    if last == "framework":
        return "framework", catalog.framework_names()
    if last in ("schedule", "schedules"):
        return "schedule", registry.names()
    if last in ("mode",):
        return "mode", tuple(MODES)
    return None


#: The catalog lookups whose own refusal words an unknown name best: the closest names where the
#: catalog is too long to list in a line, and why ``<gpu>@<watts>w`` names no GPU.
_LOOKUPS = {"GPU": catalog.hardware, "model": catalog.model, "framework": catalog.framework}


def _catalog_problem(what: str, name: object) -> str | None:
    """Why ``name`` names no catalog entry, in the catalog's words (None: it does, or no lookup)."""
    lookup = _LOOKUPS.get(what)
    if lookup is None or not isinstance(name, str):
        return None
    try:
        lookup(name)
    except ModelcutError as exc:
        return str(exc)
    return None


def _branch(part: str) -> bool:
    """A union branch's tag pydantic puts in an error's location (not a field name)."""
    return part in ("int", "str", "float", "bool", "list", "dict") or "[" in part or part.startswith(
        ("function-", "constrained-", "literal"))


def one_line(exc: ValidationError | list[dict], where: str = "", names: dict[str, str] | None = None) -> str:
    """A validation error (or its ``errors()``) in one line: each problem as ``field must …, got
    value``; ``names`` maps a field to what the face calls it (a command-line flag)."""
    parts, seen = [], set()
    errors = exc.errors(include_url=False) if isinstance(exc, ValidationError) else list(exc)
    fields = [tuple(x for x in e.get("loc", ()) if isinstance(x, int) or not _branch(str(x))) for e in errors]
    for i, err in enumerate(errors):
        # A union's branches each report: keep the branch the input's type chose.
        peers = [e for e, f in zip(errors, fields) if f == fields[i]]
        if len(peers) > 1:
            kinds = {e.get("type") for e in peers}
            if err.get("type") in _TYPE_ERRORS and kinds - _TYPE_ERRORS:
                continue
            if err.get("type") == "string_pattern_mismatch" and "literal_error" in kinds:
                continue
        field = ""
        for x in err.get("loc", ()):
            if isinstance(x, int):
                field += f"[{x}]"
            elif not _branch(str(x)):
                field += ("." if field else "") + str(x)
        raw = field
        if names and field in names:
            field = names[field]
        elif names and field.split("[")[0] in names:   # an item of a list option: the flag with its item
            field = names[field.split("[")[0]] + field[field.index("["):]
        ctx = err.get("ctx") or {}
        known = _known(raw) if err.get("type") == "literal_error" else None
        if isinstance(ctx.get("error"), LimitError):   # the cap's own line says it all
            line = str(ctx["error"])
            leaf = str(err.get("loc", ("",))[-1])
            if field != leaf and line.startswith(leaf + " "):   # the face's name for the field
                line = field + line[len(leaf):]
        elif known is not None:
            what, choices = known
            line = (_catalog_problem(what, err.get("input"))
                    or f"unknown {what} {_shown(err.get('input'))}; choose one of {', '.join(choices)}")
            if raw not in ("gpu", "model", "framework", "schedule", "mode"):   # say where, unless it is plain
                line = f"{field}: {line}"
        else:
            line = f"{field} {_phrase(err)}" if field else _phrase(err)
            if err.get("type") not in ("missing", "extra_forbidden") and "input" in err:
                line += f", got {_shown(err['input'])}"
        if line not in seen:
            seen.add(line)
            parts.append(line)
    text = "; ".join(parts[:3]) + ("; …" if len(parts) > 3 else "")
    return f"{where}: {text}" if where else text


def parse(model: type[BaseModel], data: Any, limits: Limits | None = None, where: str = "",
          names: dict[str, str] | None = None, strict: bool | None = None):
    """``data`` validated as ``model`` under ``limits``; a problem is one :class:`ModelcutError` line
    (prefixed with ``where``)."""
    if isinstance(data, model):
        data = data.model_dump(exclude_unset=True)
    try:
        return model.model_validate(data, context={"limits": limits or DEFAULT}, strict=strict)
    except ValidationError as exc:
        raise ModelcutError(one_line(exc, where, names)) from None


def limits_error(exc: ValidationError) -> LimitError | None:
    """The cap a validation error refused, if one did."""
    for err in exc.errors(include_url=False):
        e = (err.get("ctx") or {}).get("error")
        if isinstance(e, LimitError):
            return e
    return None
