"""RUN.toml -> :class:`~modelcut.core.specs.Run`: the input parser of ``modelcut predict``.

```toml
[model]            # the fields; or name = "llama3-405b" (catalog); or config = "path/config.json"
layers = 96
hidden = 12288
ffn_hidden = 49152
heads = 96
kv_heads = 96
vocab = 51200
gated_mlp = false
tied_embeddings = true
# experts = 8            # mixture of experts: routed experts (1: dense), top_k, expert_ffn_hidden,
# top_k = 2              # shared_experts, dense_layers (leading dense layers), capacity_factor,
#                        # moe_every (experts in every k-th layer past them; Llama 4 Maverick: 2)
# attention_chunk = 8192 # with chunked_layers: layers attending only within blocks of this many tokens
[hardware]
gpu = "a100-sxm4-80gb"   # a catalog name or alias; "h100@500w": held to a 500 W power limit
gpus = 64                # must equal tp·cp·pp·dp (a [layout] without dp takes gpus/(tp·cp·pp))
gpus_per_node = 8        # default: the hardware's
[layout]                 # tp, cp, pp, dp, vpp, sequence_parallel, zero, schedule, ep, etp, cp_kind, order, dp_shard, cp_a2a
tp = 8
pp = 8
dp = 1
# ep = 8                 # expert parallelism (an MoE model; divides the experts and dp)
# etp = 1                # expert tensor parallelism (default tp)
# cp_kind = "ring"       # or "allgather", "a2a" (all-to-all, Ulysses) or "a2a+p2p" (hierarchical, with
#                        # cp_a2a = its all-to-all groups' size): context parallelism's form (with cp > 1;
#                        # default: the framework's, ring for megatron-core/nemo, all-gather otherwise;
#                        # Megatron-LM's --cp-comm-type names p2p, allgather, a2a, a2a+p2p are taken too)
# zero = 3               # ZeRO stage 0-3 (default: the framework's, 3 for the FSDP presets and
#                        # deepspeed-zero3, at least 1 with Megatron's distributed optimizer)
# dp_shard = 8           # hybrid sharding (zero >= 1): ZeRO's states split over dp_shard·cp ranks and
#                        # replicated across dp/dp_shard groups (FSDP's HYBRID_SHARD, torchtitan's
#                        # data_parallel_shard_degree; default: dp)
# sequence_parallel = true   # norms and dropouts cut over tp (default: the framework's, on with
#                        # tp > 1 for megatron-core, nemo, megatron-bridge and torchtitan's fsdp)
[training]
seq_len = 2048
global_batch = 64        # sequences per step
micro_batch = 1
recompute = "full"       # none | selective | full (true / false: llm-foundry's activation_checkpointing)
# recompute_modules = ["layernorm", "moe_act"]   # with selective: Megatron-core's --recompute-modules
#                        # (core_attn, layernorm, moe_act, mla_up_proj; default: the stack's selective policy)
# activation_func_fp8_input_store = true  # the SwiGLU's input kept in FP8 for the backward (Megatron-core's)
# adam_moments = "bf16"  # Adam's two moments kept in bf16 (Megatron-core's --exp-avg-dtype and
#                        # --exp-avg-sq-dtype with --use-precision-aware-optimizer; default: the stack's)
# recompute_layers = 5   # with full: the first 5 layers of each pipeline chunk recomputed, the rest
#                        # kept whole (Megatron-core's --recompute-method block --recompute-num-layers 5;
#                        # default: every layer)
# recompute_every = 2    # with full: every 2nd layer of each pipeline rank recomputed, the rest kept
#                        # whole (torchtitan's per-layer selective checkpointing, selective_ac_option = "2")
# precision = "fp8"      # bf16 (default) | fp16 | fp8: the matrix products' precision (or as the
#                        # stacks write it: amp_bf16, bf16-mixed, bfloat16, amp_fp8)
# fp8_recipe = "delayed" # with fp8: delayed | current (tensorwise) | blockwise | mxfp8 (default: the stack's)
# local_batch = 8        # with a pipeline on torch.distributed.pipelining (nemo-automodel, torchtitan):
#                        # sequences per data-parallel rank per schedule run; the step runs
#                        # global_batch / (dp · local_batch) of them (default: one)
# attention = "flash3"   # the attention kernel: unfused | flash2 | flash3 | cudnn | flash4 (Megatron-LM's
#                        # --attention-backend: flash, fused = cudnn, unfused; default: the stack's)
# fp8_param_gather = true  # with fp8: the linear weights kept and gathered in FP8 (Megatron-LM's
#                        # --fp8-param-gather, torchtitan's enable_fsdp_float8_all_gather; default: the stack's)
# grad_reduce = "fp32"   # the type gradients are reduced in across data parallelism: fp32 or the run's
#                        # 16-bit type (float32, bfloat16 too; FSDP's reduce_dtype, torchtitan's
#                        # mixed_precision_reduce, Composer's FSDP mixed_precision DEFAULT = fp32 and
#                        # PURE = 16-bit, Megatron-LM's --grad-reduce-in-bf16; default: the stack's)
# cross_entropy = "fused"  # the loss's kernel: fp32-passes | fused | mcore-fused | torch | torch-fp32 | torch-compiled | flash-attn (default: the
#                        # framework's; Megatron-core's cross_entropy_loss_fusion off is fp32-passes)
```

Every problem is one :class:`ModelcutError` line naming the file and the problem.
"""

from __future__ import annotations

import json
import re
import tomllib
from pathlib import Path

from .. import catalog
from ..catalog import LAYOUT_KEYS, MODEL_KEYS, TRAINING_KEYS
from ..core.errors import ModelcutError, NESTED_TOML
from ..core.plan import end_ranks
from ..core.sim import registry
from ..core.specs import Run
from ..core.step.checks import check_run
from . import inputs
from .limits import DEFAULT, LimitError, Limits
from .requests import HardwareIn, LayoutIn, ModelSpecIn, TrainingIn, parse

SECTIONS = ("model", "hardware", "layout", "training")

#: A torchtitan job configuration's sections that a RUN.toml never has (JobConfig's fields, pytorch/torchtitan
#: v0.2.2 torchtitan/config/job_config.py; both have [model] and [training]).
TORCHTITAN_SECTIONS = ("job", "profiling", "metrics", "optimizer", "lr_scheduler", "parallelism", "checkpoint",
                       "activation_checkpoint", "compile", "quantize", "comm", "memory_estimation",
                       "fault_tolerance", "experimental", "validation", "debug", "float8")
#: Flags only a Megatron-LM launch passes (megatron/training/arguments.py).
_MEGATRON_FLAG = re.compile(r"(^|\s)--(num-layers|hidden-size|tensor-model-parallel-size|pipeline-model-parallel-size|"
                            r"micro-batch-size|global-batch-size|seq-length)(\s|=|$)", re.M)
#: Keys every Hugging Face config.json of a decoder has one of (transformers' PretrainedConfig).
_HF_KEYS = ("model_type", "architectures")


def other_input(text: str, path: str | Path, doc: dict | None = None) -> str | None:
    """The one-line error for a file that is another tool's input, not a RUN.toml, naming the
    command that reads it: a torchtitan job configuration (a section of
    :data:`TORCHTITAN_SECTIONS`, and neither [hardware] nor [layout], which only a RUN.toml has),
    Megatron-LM launch arguments (a flag only they pass), a Hugging Face config.json (a model's
    shape, not a run); None where it is none of them.
    ``doc``: the file parsed as TOML, where it parses."""
    name = Path(path).name
    if doc is not None:
        found = [k for k in doc if k in TORCHTITAN_SECTIONS]
        if found and not any(k in doc for k in ("hardware", "layout")):      # a RUN.toml's own
            return (f"{name}: a torchtitan job configuration ([{found[0]}]), not a RUN.toml: convert it with "
                    f"`modelcut from-torchtitan {path} --gpu GPU --gpus N -o run.toml`")
        return None
    if _MEGATRON_FLAG.search(text):
        return (f"{name}: Megatron-LM launch arguments, not a RUN.toml: convert them with "
                f"`modelcut from-megatron {path} --gpu GPU --gpus N -o run.toml`")
    try:
        conf = json.loads(text)
    except (ValueError, RecursionError):
        return None
    if isinstance(conf, dict) and any(k in conf for k in _HF_KEYS):
        return (f"{name}: a Hugging Face config.json (a model's shape), not a RUN.toml: name it in a RUN.toml's "
                f"[model] (config = \"{path}\") or give it to `modelcut explore --model`")
    return None


HARDWARE_KEYS = ("gpu", "gpus", "gpus_per_node")


def _table(doc: dict, key: str, where: str) -> dict:
    t = doc.get(key)
    if t is None:
        raise ModelcutError(f"{where}: missing [{key}] section")
    if not isinstance(t, dict):
        raise ModelcutError(f"{where}: [{key}] must be a table")
    return t


def _prefixed(build, table: dict, where: str):
    """Build a spec; its own one-line errors get the file and section in front."""
    try:
        return build(table, where)
    except ModelcutError as exc:
        msg = str(exc)
        raise ModelcutError(msg if msg.startswith(where) else f"{where}: {msg}") from None
    except TypeError as exc:
        raise ModelcutError(f"{where}: {exc}") from None


def _catalog_entry(lookup, value, field: str, where: str):
    """A catalog entry named by a RUN.toml string field; a non-string or an unknown name is one
    line with the file and section in front."""
    if not isinstance(value, str):
        raise ModelcutError(f"{where}: {field} must be a string, got {value!r}")
    try:
        return lookup(value)
    except ModelcutError as exc:
        raise ModelcutError(f"{where}: {exc}") from None


def load_run(path: str | Path, limits: Limits | None = None) -> Run:
    """Read and check a RUN.toml file."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ModelcutError(f"{p}: no such file") from None
    except IsADirectoryError:
        raise ModelcutError(f"{p}: is a directory, not a RUN.toml file") from None
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ModelcutError(other_input(text, path) or f"{p.name}: invalid TOML: {exc}") from None
    except RecursionError:
        raise ModelcutError(f"{p.name}: invalid TOML: {NESTED_TOML}") from None
    hint = other_input(text, path, doc)
    if hint:
        raise ModelcutError(hint)
    return run_from_dict(doc, p.name, p.parent, limits)


#: Fields whose request type reads other spellings as modelcut's names (requests.Precision, Fp8Recipe,
#: RecomputeIn).
_SPELLED = ("precision", "fp8_recipe", "recompute", "grad_reduce")


def _fields(model, table: dict, where: str, lim: Limits, allowed=None) -> dict:
    """A section read through its request model: unknown keys named with the allowed ones, then
    each field's own rule; the fields the file gave, as it gave them (:data:`_SPELLED` as read)."""
    allowed = tuple(model.model_fields) if allowed is None else allowed
    for k in table:
        if k not in allowed:
            raise ModelcutError(f"{where}: unknown key {k!r} (allowed: {', '.join(allowed)})")
    parsed = parse(model, table, lim, where=where)
    out = dict(table)
    for k in _SPELLED:      # a precision or recipe as a stack spells it ("amp_bf16"), as modelcut's
        if k in out:
            out[k] = getattr(parsed, k)
    return out


def run_from_dict(doc: dict, where: str = "RUN.toml", base: Path | None = None, limits: Limits | None = None) -> Run:
    """A Run from a parsed RUN.toml document; ``base`` resolves a relative ``config`` path. Each
    section is read through the request models (:mod:`.requests`) under ``limits``."""
    lim = limits or DEFAULT
    for k in doc:
        if k not in SECTIONS:
            raise ModelcutError(f"{where}: unknown section [{k}] (allowed: {', '.join(SECTIONS)})")

    # [model]
    mt = _table(doc, "model", where)
    if "config" in mt:
        extra = [k for k in mt if k not in ("config", "name")]
        if extra:
            raise ModelcutError(f"{where}: [model] with config takes no other fields, got {extra[0]!r}")
        if not isinstance(mt["config"], str) or (mt.get("name") is not None and not isinstance(mt["name"], str)):
            raise ModelcutError(f"{where} [model]: config and name must be strings")
        cfg = Path(mt["config"])
        if base is not None and not cfg.is_absolute():
            cfg = base / cfg
        try:
            inputs.model_spec(str(cfg), lim)       # its sizes within the limits, before it is read
            model = catalog.load_hf_config(cfg, mt.get("name"))
        except LimitError:
            raise
        except ModelcutError as exc:
            raise ModelcutError(f"{where} [model]: {exc}") from None
    elif set(mt) == {"name"}:
        model = _catalog_entry(catalog.model, mt["name"], "name", f"{where} [model]")
    else:
        table = _fields(ModelSpecIn, mt, f"{where} [model]", lim, MODEL_KEYS)
        model = catalog.model_from_table(table, name=str(mt.get("name") or Path(where).stem), where=f"{where} [model]")
    lim.check_model(model)

    # [hardware]
    ht = _table(doc, "hardware", where)
    for k in ht:
        if k not in HARDWARE_KEYS:
            raise ModelcutError(f"{where} [hardware]: unknown key {k!r} (allowed: {', '.join(HARDWARE_KEYS)})")
    if "gpu" not in ht:
        raise ModelcutError(f"{where} [hardware]: missing 'gpu'")
    hw = _catalog_entry(catalog.hardware, ht["gpu"], "gpu", f"{where} [hardware]")
    parse(HardwareIn, {**ht, "gpu": hw.name}, lim, where=f"{where} [hardware]")
    gpn = ht.get("gpus_per_node")

    # [layout], [training]
    lt = _fields(LayoutIn, _table(doc, "layout", where), f"{where} [layout]", lim, LAYOUT_KEYS)
    gpus = ht.get("gpus")
    if "dp" not in lt and isinstance(gpus, int) and not isinstance(gpus, bool):
        # as Megatron-LM and torchtitan do, the data-parallel size follows from the world size
        rest = lt.get("tp", 1) * lt.get("cp", 1) * lt.get("pp", 1)
        if gpus % rest:
            raise ModelcutError(f"{where}: [layout] gives no dp, and the GPU count {gpus} is not a multiple of "
                                f"tp·cp·pp = {rest}")
        lt = {**lt, "dp": gpus // rest}
    tt = _table(doc, "training", where)
    for k in ("seq_len", "global_batch"):
        if k not in tt:
            raise ModelcutError(f"{where} [training]: missing {k!r}")
    tt = _fields(TrainingIn, tt, f"{where} [training]", lim, TRAINING_KEYS)
    layout = _prefixed(catalog.layout_from_table, lt, f"{where} [layout]")
    training = _prefixed(catalog.training_from_table, tt, f"{where} [training]")
    if gpus is not None and layout.gpus != gpus:
        raise ModelcutError(f"{where}: layout tp·cp·pp·dp = {layout.tp}·{layout.cp}·{layout.pp}·{layout.dp} "
                            f"= {layout.gpus} is not the GPU count {gpus}")
    run = Run(model=model, gpu=hw.name, layout=layout, training=training, gpus_per_node=gpn, name=where)
    try:
        check_sizes(run, lim)
        check_run(run)
    except LimitError as exc:
        raise LimitError(f"{where}: {exc}", exc.cap) from None
    except ModelcutError as exc:
        raise ModelcutError(f"{where}: {exc}") from None
    return run


def check_sizes(run: Run, limits: Limits | None = None) -> None:
    """A run's sizes and the work predicting it takes, within the limits (before any of it):
    the model, the GPUs, the tokens of a step and the pipeline the step models simulate."""
    lim = limits or DEFAULT
    lim.check_model(run.model)
    lay, tr = run.layout, run.training
    lim.check("max_gpus", lay.gpus, "tp·cp·pp·dp")
    lim.check("max_seq", tr.seq_len, "seq_len")
    lim.check("max_tokens", tr.global_batch * tr.seq_len, "global_batch · seq_len (tokens per step)")
    if run.gpus_per_node is not None:
        lim.check("max_gpus", run.gpus_per_node, "gpus_per_node")
    per = lay.dp * tr.micro_batch
    m = tr.global_batch // per if tr.global_batch % per == 0 else tr.global_batch // max(per, 1) + 1
    spec = registry.get(lay.schedule) if lay.schedule is not None else registry.default_schedule(lay.vpp or 1)
    v = lay.vpp or spec.default_chunks
    # The plan simulates its schedule, a one-stage 1F1B without a pipeline.
    stages = min(lay.pp * v * spec.copies, run.model.layers + 2) if lay.pp > 1 else 1
    lim.check_pipeline(run.model.layers, spec.built_for(lay.pp, m) if lay.pp > 1 else m, stages)


SETTINGS_KEYS = ("framework", "overlap")


def load_run_with_settings(path: str | Path, limits: Limits | None = None) -> tuple[Run, dict]:
    """A RUN.toml and its optional [settings] table (framework = a preset of ``modelcut predict
    --framework``, overlap = overrides as ``--overlap`` takes them)."""
    path = Path(path)
    try:
        doc = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError, RecursionError):
        return load_run(path, limits), {}        # its one-line error
    st = doc.pop("settings", None)
    if st is None:
        return load_run(path, limits), {}
    if not isinstance(st, dict):
        raise ModelcutError(f"{path.name}: [settings] must be a table")
    for k, v in st.items():
        if k not in SETTINGS_KEYS:
            raise ModelcutError(f"{path.name} [settings]: unknown key {k!r} (allowed: {', '.join(SETTINGS_KEYS)})")
        if not isinstance(v, str):
            raise ModelcutError(f"{path.name} [settings]: {k} must be a string, got {v!r}")
    return run_from_dict(doc, path.name, path.parent, limits), dict(st)


def toml_text(doc: dict, header=()) -> str:
    """The document as RUN.toml text: its tables in order, strings quoted, booleans lower case,
    lists of strings as arrays; ``header`` lines first, as comments."""
    def value(v) -> str:
        if isinstance(v, bool):
            return "true" if v else "false"
        if isinstance(v, str):
            return '"' + v.replace("\\", "\\\\").replace('"', '\\"') + '"'
        if isinstance(v, list):
            return "[" + ", ".join(value(x) for x in v) + "]"
        return repr(v)

    lines = [f"# {h}" for h in header]
    for name, table in doc.items():
        lines.append(f"[{name}]")
        lines += [f"{k} = {value(v)}" for k, v in table.items()]
    return "\n".join(lines) + "\n"


def check_target(gpu: str, gpus: int, limits: Limits | None = None) -> None:
    """An importer's target (``from-megatron``, ``from-torchtitan``): a catalog GPU and a world
    size of at least one GPU within the limits, each one line before the source is read."""
    if isinstance(gpus, bool) or not isinstance(gpus, int) or gpus < 1:
        raise ModelcutError(f"--gpus must be at least 1, got {gpus!r}")
    (limits or DEFAULT).check("max_gpus", gpus, "--gpus")
    catalog.hardware(gpu)


def split_ends(split: tuple[int, ...], pp: int, layers: int | None, where: str) -> dict[str, int]:
    """An imported split (a stack's own per-stage layer list, ``where`` naming it) as a layout gives it
    (:func:`..core.plan.end_ranks`): {} for the plan's even split, else ``first_layers``/``last_layers``;
    any other split, or one whose transformer layers are not the model's, is one line."""
    if layers is not None and sum(split) != layers:
        raise ModelcutError(f"{where} holds {sum(split)} transformer layers, the model {layers}")
    ends = end_ranks(split, pp)
    if ends is None:
        raise ModelcutError(f"{where}: modelcut times the even split or end ranks of their own size "
                            f"(first_layers/last_layers), not {list(split)}")
    return ends


def imported_text(doc: dict, source: str, header: list[str], limits: Limits | None = None) -> str:
    """An imported RUN.toml document as text (:func:`toml_text`, ``header`` first), read back
    through :func:`run_from_dict` first, its [settings] aside, so that every problem is one line
    now and not at predict."""
    body = {k: v for k, v in doc.items() if k != "settings"}
    run_from_dict(body, where=f"{source} (as a RUN.toml)", limits=limits)
    return toml_text(doc, header)
