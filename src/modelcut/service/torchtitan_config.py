"""A torchtitan job configuration (TOML) -> a RUN.toml document (``modelcut from-torchtitan``): the
reverse of ``modelcut explore --emit torchtitan``. Mapping only, no formulas: the document is read
by :func:`.runfile.run_from_dict`, the one boundary every run passes.

Read as torchtitan v0.2.2 reads it (pytorch/torchtitan v0.2.2 torchtitan/config/job_config.py, its
defaults where a key is absent; train.py for the batch):

* ``[model] name`` and ``flavor`` name the catalog model ``name-flavor`` (llama3 8B: llama3-8b,
  qwen3 30B-A3B: qwen3-30b-a3b, deepseek_v3 671B: deepseek-v3-671b, llama4 17bx128e: Maverick's alias
  llama4-17bx128e), unless ``--model`` names one;
  ``converters`` with ``quantize.linear.float8`` (or ``float8``) is FP8 by tensorwise scaling
  (current) or ``[quantize.linear.float8] recipe_name``'s rowwise recipes, its
  ``enable_fsdp_float8_all_gather`` (default false) the run's FP8 weight gather, with
  ``quantize.linear.mx`` MXFP8;
* ``[parallelism]``: ``tensor_parallel_degree``, ``context_parallel_degree`` with
  ``context_parallel_rotate_method`` (default allgather: K and V gathered whole; alltoall: passed
  round the ring), ``pipeline_parallel_degree`` with
  ``pipeline_parallel_schedule`` (torch.distributed.pipelining's names, default 1F1B) and
  ``pipeline_parallel_microbatch_size`` (default 1), ``module_fqns_per_model_part`` (the stages and,
  where the split is not the plan's even one, the end ranks' blocks), ``expert_parallel_degree`` and
  ``expert_tensor_parallel_degree`` (default 1), ``data_parallel_replicate_degree`` (default 1) and
  ``data_parallel_shard_degree`` (default -1: the ranks left): FSDP shards over the shard degree
  times cp (``ParallelDims.fsdp_enabled``: dp_shard > 1 or cp > 1) (ZeRO-3, or with ``fsdp_reshard_after_forward = "never"`` the weights kept after the forward,
  ZeRO-2's memory), replicated across the replicate degree (hybrid sharding where both exceed 1;
  plain replication, ZeRO-0, where the shard degree is 1); ``enable_async_tensor_parallel``
  (v0.2.2's place; ``[compile]`` in later releases) is the tp_comm overlap;
* ``[training]``: ``seq_len`` (default 2048), ``local_batch_size`` (default 8: one forward's
  sequences without a pipeline, one schedule run's with one), ``global_batch_size`` (default -1:
  local × dp; the step accumulates gradients over global/(local · dp) such batches);
  ``mixed_precision_param`` float32 is fp32 training, which modelcut does not time;
  ``mixed_precision_reduce`` (default float32; bfloat16 where a release takes it) is the FSDP
  gradients' reduce type, written only where the file gives it;
* ``[activation_checkpoint] mode`` none, selective or full (default selective), with
  ``selective_ac_option`` "op" (per op) or an integer k (one block in k whole; default "2");
* ``[compile] enable`` (default off) picks the preset: fsdp-compile (torchtitan compiled) or fsdp
  (eager), unless ``--framework`` names one.

Every other key is listed as not read.
"""

from __future__ import annotations

import re
import tomllib
from typing import Any

from .. import catalog
from ..core.errors import ModelcutError, NESTED_TOML
from ..core.sim import registry
from ..core.specs import fp8_recipe_name, grad_reduce_name
from ..core.step.stack_names import TORCHTITAN_ROTATE
from .limits import Limits
from .runfile import check_target, imported_text, split_ends

#: The keys read, by table (module doc).
_READ = {
    "model": ("name", "flavor", "converters"),
    "parallelism": ("tensor_parallel_degree", "context_parallel_degree", "context_parallel_rotate_method",
                    "pipeline_parallel_degree", "pipeline_parallel_schedule", "pipeline_parallel_microbatch_size",
                    "expert_parallel_degree", "expert_tensor_parallel_degree", "data_parallel_replicate_degree",
                    "data_parallel_shard_degree", "fsdp_reshard_after_forward", "enable_async_tensor_parallel",
                    "module_fqns_per_model_part", "pipeline_parallel_layers_per_stage",
                    "pipeline_parallel_first_stage_less_layers", "pipeline_parallel_last_stage_less_layers"),
    "training": ("seq_len", "local_batch_size", "global_batch_size", "mixed_precision_param", "mixed_precision_reduce"),
    "activation_checkpoint": ("mode", "selective_ac_option"),
    "compile": ("enable", "enable_async_tensor_parallel"),
}
_FLOAT8 = ("quantize.linear.float8", "float8")
#: torchtitan's float8 recipe names (v0.2.2 job_config.py Float8Linear.recipe_name), read as modelcut's
#: by :func:`..core.specs.fp8_recipe_name` (tensorwise is current scaling).
_TORCHAO_RECIPES = ("tensorwise", "rowwise", "rowwise_with_gw_hp")
_MX = ("quantize.linear.mx", "mx")


def _table(conf: dict, name: str) -> dict:
    t = conf.get(name, {})
    if not isinstance(t, dict):
        raise ModelcutError(f"[{name}] must be a table")
    return t


def _whole(table: dict, where: str, key: str, default: int, low: int = 1) -> int:
    v = table.get(key, default)
    if isinstance(v, bool) or not isinstance(v, int) or v < low:
        raise ModelcutError(f"[{where}] {key} must be a whole number of at least {low}, got {v!r}")
    return v


def _schedule(name: Any) -> str:
    """modelcut's schedule for torch.distributed.pipelining's name (:mod:`..core.sim.registry`'s
    ``torch_class``, "Schedule" dropped)."""
    for s in registry.names():
        spec = registry.get(s)
        if spec.torch_class is not None and spec.torch_class.removeprefix("Schedule").lower() == str(name).lower():
            return s
    known = [registry.get(s).torch_class.removeprefix("Schedule") for s in registry.names()
             if registry.get(s).torch_class]
    raise ModelcutError(f"[parallelism] pipeline_parallel_schedule {name!r}: modelcut times {', '.join(known)}")


def run_document(conf: dict, *, gpu: str, gpus: int, model: str | None = None,
                 gpus_per_node: int | None = None, framework: str | None = None
                 ) -> tuple[dict[str, Any], list[str]]:
    """(the RUN.toml document, the keys not read) of a parsed torchtitan job configuration (module
    doc) on ``gpus`` of ``gpu``."""
    mt, par, tr = _table(conf, "model"), _table(conf, "parallelism"), _table(conf, "training")
    ac, comp = _table(conf, "activation_checkpoint"), _table(conf, "compile")
    if model is None:
        if "name" not in mt or "flavor" not in mt:
            raise ModelcutError("[model] needs name and flavor (torchtitan's), or name a catalog model with --model")
        model = f"{mt['name']}-{mt['flavor']}".lower().replace("_", "-")
        try:
            catalog.model(model)
        except ModelcutError:
            raise ModelcutError(f"torchtitan's {mt['name']} {mt['flavor']} is not in the catalog as {model!r}: "
                                "name a catalog model with --model (modelcut list models)") from None
    tp, cp, pp = (_whole(par, "parallelism", f"{k}_parallel_degree", 1) for k in ("tensor", "context", "pipeline"))
    ep = _whole(par, "parallelism", "expert_parallel_degree", 1)
    replicate = _whole(par, "parallelism", "data_parallel_replicate_degree", 1)
    shard = par.get("data_parallel_shard_degree", -1)
    if shard == -1:
        rest = tp * cp * pp * replicate
        if gpus % rest:
            raise ModelcutError(f"the world size {gpus} is not a multiple of tp·cp·pp·replicate = {rest}")
        shard = gpus // rest
    elif isinstance(shard, bool) or not isinstance(shard, int) or shard < 1:
        raise ModelcutError(f"[parallelism] data_parallel_shard_degree must be -1 or a whole number, got {shard!r}")
    dp = replicate * shard
    if tp * cp * pp * dp != gpus:
        raise ModelcutError(f"tp·cp·pp·replicate·shard = {tp}·{cp}·{pp}·{replicate}·{shard} is not the world "
                            f"size {gpus}")
    layout: dict[str, Any] = {"tp": tp, "cp": cp, "pp": pp, "dp": dp}
    if cp > 1:      # K and V gathered whole, or passed round the ring (PyTorch's rotation by all-to-all)
        rotate = par.get("context_parallel_rotate_method", "allgather")
        if not isinstance(rotate, str) or rotate not in TORCHTITAN_ROTATE:
            raise ModelcutError(f"[parallelism] context_parallel_rotate_method must be allgather or alltoall, "
                                f"got {rotate!r}")
        layout["cp_kind"] = TORCHTITAN_ROTATE[rotate]
    reshard = par.get("fsdp_reshard_after_forward", "default")
    if reshard not in ("default", "always", "never"):
        raise ModelcutError(f"[parallelism] fsdp_reshard_after_forward must be default, always or never, got {reshard!r}")
    fsdp = shard > 1 or cp > 1      # FSDP shards over dp_shard·cp (v0.2.2 parallel_dims.py fsdp_enabled)
    layout["zero"] = 0 if not fsdp else 2 if reshard == "never" else 3
    if replicate > 1 and fsdp:
        layout["dp_shard"] = shard
    if ep > 1:
        layout["ep"] = ep
        layout["etp"] = _whole(par, "parallelism", "expert_tensor_parallel_degree", 1)
    local = _whole(tr, "training", "local_batch_size", 8)
    training: dict[str, Any] = {"seq_len": _whole(tr, "training", "seq_len", 2048)}
    if pp > 1:
        mb = _whole(par, "parallelism", "pipeline_parallel_microbatch_size", 1)
        if local % mb:
            raise ModelcutError(f"[training] local_batch_size {local} is not a multiple of pipeline_parallel_microbatch_size {mb}")
        layout["schedule"] = _schedule(par.get("pipeline_parallel_schedule", "1F1B"))
        layers = catalog.model(model).layers
        stages = _virtual_stages(par, pp, layers)
        if stages is not None and stages > 1:
            layout["vpp"] = stages
        if par.get("module_fqns_per_model_part") is not None:
            layout.update(split_ends(_part_blocks(par["module_fqns_per_model_part"]), pp, layers,
                                     "[parallelism] module_fqns_per_model_part"))
        training.update(micro_batch=mb, local_batch=local)
    else:
        training["micro_batch"] = local
    glob = tr.get("global_batch_size", -1)
    if glob == -1:
        glob = local * dp
    elif isinstance(glob, bool) or not isinstance(glob, int) or glob < 1:
        raise ModelcutError(f"[training] global_batch_size must be -1 or a whole number, got {glob!r}")
    training["global_batch"] = glob
    if tr.get("mixed_precision_param", "bfloat16") == "float32":
        raise ModelcutError("[training] mixed_precision_param float32 is fp32 training, which modelcut does not time")
    if "mixed_precision_reduce" in tr:
        reduce = tr["mixed_precision_reduce"]
        if reduce not in ("float32", "bfloat16"):
            raise ModelcutError(f"[training] mixed_precision_reduce must be \"float32\" or \"bfloat16\", got {reduce!r}")
        training["grad_reduce"] = grad_reduce_name(reduce)
    mode = ac.get("mode", "selective")
    if mode not in ("none", "selective", "full"):
        raise ModelcutError(f"[activation_checkpoint] mode must be none, selective or full, got {mode!r}")
    option = str(ac.get("selective_ac_option", "2"))
    if mode == "selective" and option != "op":
        try:
            k = int(option)
        except ValueError:
            raise ModelcutError(f"[activation_checkpoint] selective_ac_option must be \"op\" or a whole number, "
                                f"got {option!r}") from None
        training.update(recompute="full", recompute_every=k) if k > 1 else training.update(recompute="full")
    else:
        training["recompute"] = mode
    converters = mt.get("converters", [])
    if not isinstance(converters, list):
        raise ModelcutError("[model] converters must be a list")
    if any(c in _FLOAT8 for c in converters):
        recipe = _float8_recipe(conf)
        training.update(precision="fp8", fp8_recipe=recipe, fp8_param_gather=_float8_all_gather(conf))
    elif any(c in _MX for c in converters):
        training.update(precision="fp8", fp8_recipe="mxfp8")
    else:
        training["precision"] = "bf16"
    compiled = bool(comp.get("enable", False))
    async_tp = bool(par.get("enable_async_tensor_parallel", comp.get("enable_async_tensor_parallel", False)))
    doc: dict[str, Any] = {"model": {"name": model}, "hardware": {"gpu": gpu, "gpus": gpus}, "layout": layout,
                           "training": training,
                           "settings": {"framework": framework or ("fsdp-compile" if compiled else "fsdp"),
                                        "overlap": f"tp_comm={'on' if async_tp and tp > 1 else 'off'}"}}
    if gpus_per_node is not None:
        doc["hardware"]["gpus_per_node"] = gpus_per_node
    unread = [f"[{t}] {k}" for t, table in conf.items() if isinstance(table, dict) and t in _READ
              for k in table if k not in _READ[t]]
    unread += [f"[{t}]" for t in conf if t not in _READ and t not in ("quantize", "float8", "mx")]
    # the float8 options besides the recipe and the FP8 all-gather are the stack's (fsdp-compile leaves
    # the output layer in bf16: frameworks.toml), not the run's
    for where, q in (("quantize.linear.float8", conf.get("quantize", {}).get("linear", {}).get("float8", {})),
                     ("float8", conf.get("float8", {}))):
        if isinstance(q, dict):
            unread += [f"[{where}] {k}" for k in q if k not in ("recipe_name", "enable_fsdp_float8_all_gather")]
    return doc, unread


def _virtual_stages(par: dict, pp: int, layers: int) -> int | None:
    """Stages a pipeline rank holds, as torchtitan v0.2.2 counts them
    (torchtitan/distributed/pipeline_parallel.py ``pipeline_llm``): the parts of
    ``module_fqns_per_model_part`` over pp where given; else with ``pipeline_parallel_layers_per_stage``
    L, ceil((layers + first + last) / L) over pp (``pipeline_parallel_first_stage_less_layers`` and
    ``..._last_...``, 1 each by default); else 2 for a multi-stage schedule, which the schedule's
    own check settles (None: the schedule's default)."""
    parts = par.get("module_fqns_per_model_part")
    if parts is not None:
        if not isinstance(parts, list) or not parts or len(parts) % pp:
            raise ModelcutError(f"[parallelism] module_fqns_per_model_part: {len(parts) if isinstance(parts, list) else parts!r} "
                                f"parts are not a multiple of pp ({pp})")
        return len(parts) // pp
    per = par.get("pipeline_parallel_layers_per_stage")
    if per is not None:
        if isinstance(per, bool) or not isinstance(per, int) or per < 1:
            raise ModelcutError(f"[parallelism] pipeline_parallel_layers_per_stage must be a whole number, got {per!r}")
        first = _whole(par, "parallelism", "pipeline_parallel_first_stage_less_layers", 1, 0)
        last = _whole(par, "parallelism", "pipeline_parallel_last_stage_less_layers", 1, 0)
        stages = -(-(layers + first + last) // per)
        if stages % pp:
            raise ModelcutError(f"[parallelism] pipeline_parallel_layers_per_stage {per}: {stages} stages are not a "
                                f"multiple of pp ({pp})")
        return stages // pp
    return None


def _part_blocks(parts: list) -> tuple[int, ...]:
    """``module_fqns_per_model_part``'s transformer blocks a part (``layers.N``; the embedding, norm
    and output hold none)."""
    if not all(isinstance(part, list) and all(isinstance(x, str) for x in part) for part in parts):
        raise ModelcutError("[parallelism] module_fqns_per_model_part must be lists of module names")
    return tuple(sum(1 for x in part if re.fullmatch(r"layers\.\d+", x)) for part in parts)


def _float8_all_gather(conf: dict) -> bool:
    """torchtitan's ``enable_fsdp_float8_all_gather`` (default false: v0.2.2 job_config.py Float8Linear)."""
    q = conf.get("quantize", {}).get("linear", {}).get("float8", conf.get("float8", {}))
    v = q.get("enable_fsdp_float8_all_gather", False) if isinstance(q, dict) else False
    if not isinstance(v, bool):
        raise ModelcutError(f"[quantize.linear.float8] enable_fsdp_float8_all_gather must be true or false, got {v!r}")
    return v


def _float8_recipe(conf: dict) -> str:
    """The FP8 recipe of torchtitan's float8 converter: tensorwise (current scaling) unless
    ``recipe_name`` says rowwise or rowwise_with_gw_hp."""
    q = conf.get("quantize", {}).get("linear", {}).get("float8", conf.get("float8", {}))
    name = q.get("recipe_name") if isinstance(q, dict) else None
    if name is None:
        return "current"
    if name in _TORCHAO_RECIPES:
        return fp8_recipe_name(name)
    raise ModelcutError(f"[quantize.linear.float8] recipe_name {name!r}: torchtitan's are tensorwise, rowwise and "
                        "rowwise_with_gw_hp")


#: A line only Python opens with: an import, a function or class definition, a decorator.
_PYTHON_LINE = re.compile(r"^(from\s+[\w.]+\s+import\s|import\s+\w|def\s+\w+\s*\(|class\s+\w+\b.*:|@\w)", re.M)


def _looks_like_python(text: str, source: str) -> bool:
    """Whether a file that is not TOML is Python: named ``.py``, or a line of it opens as only
    Python's do (:data:`_PYTHON_LINE`), as torchtitan's ``config_registry.py`` files do."""
    return source.endswith(".py") or bool(_PYTHON_LINE.search(text))


def run_file_text(text: str, source: str, *, gpu: str, gpus: int, model: str | None = None,
                  gpus_per_node: int | None = None, framework: str | None = None,
                  limits: Limits | None = None) -> str:
    """The use case of ``modelcut from-torchtitan``: the RUN.toml text of a torchtitan job
    configuration (``source`` names its file, or "-"), read back through
    :func:`.runfile.run_from_dict` first, so that every problem is one line now."""
    check_target(gpu, gpus, limits)
    if framework is not None:
        framework = catalog.framework(framework).name
    try:
        conf = tomllib.loads(text)
    except RecursionError:
        raise ModelcutError(f"{source}: invalid TOML: {NESTED_TOML}") from None
    except tomllib.TOMLDecodeError as exc:
        if _looks_like_python(text, source):
            raise ModelcutError(
                f"{source}: Python, not a TOML job configuration: torchtitan's configurations moved to Python "
                "registries (config_registry.py) in February 2026 (pytorch/torchtitan #2386), which this reader "
                "does not run; it reads the TOML job files of torchtitan v0.2.2 and before (write the run as a "
                "RUN.toml instead: modelcut predict --help)") from None
        raise ModelcutError(f"{source}: not TOML ({exc})") from None
    doc, unread = run_document(conf, gpu=gpu, gpus=gpus, model=model, gpus_per_node=gpus_per_node,
                               framework=framework)
    header = [f"from the torchtitan job configuration {source}: modelcut from-torchtitan"]
    if unread:
        header.append("keys not read: " + ", ".join(unread))
    return imported_text(doc, source, header, limits)
