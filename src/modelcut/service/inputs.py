"""Reading what a user gives: a model by catalog name, config.json path or fields; token counts with
binary suffixes; lists of integers; a layout to check. Every problem is one
:class:`~modelcut.core.errors.ModelcutError` line."""

from __future__ import annotations

import ast
import dataclasses
import json
import math
import re
from pathlib import Path
from typing import Any

from .. import catalog
from ..core.errors import ModelcutError
from ..core.specs import ModelSpec
from ..core.step.frameworks import OPTIONS
from ..core.step.stack_names import (CONVERSE_ALIASES, FSDP_SETTINGS, OFF_WORDS, ON_WORDS, OPTION_ALIASES, flag_key,
                                     fsdp_note, fsdp_setting, negated_option, option_name, unmodelled_note,
                                     unmodelled_option)
from .limits import DEFAULT, Limits

#: Keys ``--check`` (and the web's ``check``) may name, with their types.
CHECK_KEYS = {"tp": int, "cp": int, "ep": int, "etp": int, "pp": int, "dp": int, "dp_shard": int, "vpp": int,
              "micro_batch": int, "zero": int, "cp_a2a": int, "last_layers": int,
              "cp_kind": str, "schedule": str, "recompute": str}


def shown(value: object, most: int = 40) -> str:
    """A value as a one-line error quotes it: its repr, cut to ``most`` characters with "..."."""
    text = repr(value)
    return text if len(text) <= most else text[:most - 3] + "..."


def model_spec(spec: str, limits: Limits | None = None) -> ModelSpec:
    """A catalog model name, or a path to a Hugging Face ``config.json``; its sizes within the limits."""
    path = Path(spec)
    lim = limits or DEFAULT
    if spec.endswith(".json") or path.is_file():
        if not path.is_file():
            raise ModelcutError(f"no such config file: {spec}")
        if path.stat().st_size > 10_000_000:
            raise ModelcutError(f"{spec}: {path.stat().st_size:,} bytes is not a config.json (at most 10 MB)")
        try:
            cfg = json.loads(path.read_text(encoding="utf-8"))
        except (ValueError, UnicodeDecodeError, RecursionError):
            cfg = None      # load_hf_config says what is wrong, in one line
        if isinstance(cfg, dict):
            check_hf_sizes(cfg, lim)
        out = catalog.load_hf_config(path)
    else:
        out = catalog.model(spec)
    lim.check_model(out)
    return out


#: The sizes a config.json gives that modelcut reads (:mod:`..catalog.hf_config`).
HF_SIZES = ("hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "intermediate_size",
            "vocab_size", "head_dim", "max_position_embeddings", "n_embd", "n_layer", "n_head", "n_inner",
            "n_positions", "num_local_experts", "num_experts_per_tok", "num_experts", "moe_intermediate_size",
            "shared_expert_intermediate_size", "n_routed_experts", "n_shared_experts", "first_k_dense_replace",
            "kv_lora_rank", "q_lora_rank", "qk_nope_head_dim", "qk_rope_head_dim", "v_head_dim",
            "d_model", "n_layers", "n_heads", "max_seq_len", "sliding_window_pattern")


def check_hf_sizes(cfg: dict, limits: Limits | None = None) -> None:
    """A config.json's sizes within the limits, before it is read (a shape's arithmetic loops
    over its sizes)."""
    lim = limits or DEFAULT
    for k in HF_SIZES:
        v = cfg.get(k)
        if isinstance(v, int) and not isinstance(v, bool):
            lim.check("max_layers" if k in ("num_hidden_layers", "n_layer", "n_layers", "first_k_dense_replace",
                                            "sliding_window_pattern")
                      else "max_seq" if k in ("max_position_embeddings", "n_positions", "max_seq_len") else "max_width",
                      v, f"config.json {k}")


def model_arg(spec: str, limits: Limits | None = None) -> dict[str, Any]:
    """The command line's ``--model`` as a :class:`.requests.ModelChoice`'s fields: a catalog
    name (lower case, as the catalog keys it), or a config.json file read into the model's fields."""
    path = Path(spec)
    if spec.endswith(".json") or path.is_file():
        return {"model_spec": dataclasses.asdict(model_spec(spec, limits))}
    return {"model": spec.lower()}


def model_choice(model: str | None = None, hf_config: dict | None = None, model_spec_table: Any = None,
                 limits: Limits | None = None) -> ModelSpec:
    """A request's model: a catalog name, a config.json object or the fields (a mapping or a
    :class:`.requests.ModelSpecIn`), exactly one; its sizes within the limits."""
    lim = limits or DEFAULT
    if isinstance(hf_config, dict):
        check_hf_sizes(hf_config, lim)
    if hasattr(model_spec_table, "model_dump"):
        model_spec_table = model_spec_table.model_dump(exclude_none=True)
    given = [k for k, v in (("model", model), ("hf_config", hf_config), ("model_spec", model_spec_table))
             if v is not None]
    if len(given) != 1:
        raise ModelcutError("give exactly one of model (a catalog name), hf_config (a config.json object) "
                            f"or model_spec (the fields); got {', '.join(given) or 'none'}")
    try:
        if model is not None:
            spec = catalog.model(model)
        elif hf_config is not None:
            spec = catalog.model_from_hf_config(hf_config)
        else:
            spec = catalog.model_from_table(model_spec_table, name=str(model_spec_table.get("name", "model")),
                                            where="model_spec")
        lim.check_model(spec)
        return spec
    except ModelcutError:
        raise
    except (TypeError, ValueError, KeyError, AttributeError) as exc:
        # A field of the wrong type deep inside the file: still the user's input, still one line.
        what = "config.json" if hf_config is not None else "model_spec"
        raise ModelcutError(f"{what}: a field has the wrong type ({exc})") from None


def parse_tokens(text: str | int) -> int:
    """Tokens as an integer, or with a binary suffix: 16M = 16·2^20 = 16,777,216 (2048 sequences of
    8192, Llama 3's "16M tokens")."""
    if isinstance(text, int) and not isinstance(text, bool):
        if text < 1:
            raise ModelcutError(f"token count must be a positive whole number, got {text!r}")
        return text
    s = str(text).strip().replace("_", "").replace(",", "")
    if len(s) > 32:
        raise ModelcutError("a token count is a number such as 16777216 or 16M")
    mult = {"k": 1 << 10, "m": 1 << 20, "g": 1 << 30}.get(s[-1:].lower(), 1)
    num = s[:-1] if mult > 1 else s
    try:
        val = float(num) * mult
    except (ValueError, OverflowError):
        raise ModelcutError(f"cannot read a token count from {text!r} (e.g. 16777216 or 16M)") from None
    if not math.isfinite(val) or val != int(val) or val < 1:
        raise ModelcutError(f"token count must be a positive whole number, got {text!r}")
    return int(val)


def int_list(text: str, what: str) -> tuple[int, ...]:
    """Comma-separated positive integers."""
    try:
        vals = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise ModelcutError(f"{what} must be comma-separated integers, got {text!r}") from None
    if not vals or min(vals) < 1:
        raise ModelcutError(f"{what} must be positive integers, got {text!r}")
    return vals


def names(text: str) -> tuple[str, ...]:
    """Comma-separated names, each once, in order."""
    return tuple(dict.fromkeys(s.strip() for s in text.split(",") if s.strip()))


def pairs(text: str, what: str, example: str, keys) -> list[tuple[str, str]]:
    """``a=1,b=2`` as [("a", "1"), ("b", "2")]; every key one of ``keys``."""
    out = []
    for part in (p.strip() for p in text.split(",")):
        if not part:
            continue
        if "=" not in part:
            raise ModelcutError(f"{what}: write key=value pairs such as {example}, got {part!r}")
        k, v = (x.strip() for x in part.split("=", 1))
        if k not in keys:
            raise ModelcutError(f"{what}: unknown key {k!r}; choose one of {', '.join(keys)}")
        out.append((k, v))
    return out


#: Settings a stack's overlap configuration sits beside (PyTorch FSDP's and Composer's ``fsdp_config``,
#: Megatron-LM's flags, DeepSpeed's ``zero_optimization``) that are no overlap: where a run says each
#: instead (runfile.py's template), or that modelcut does not time.
NOT_OVERLAPS = {
    **dict.fromkeys(("sharding_strategy", "shard_strategy"),   # FSDP's name; llm-foundry's sweep flag
                    "the layout's [layout] zero (FULL_SHARD 3, SHARD_GRAD_OP 2, NO_SHARD 0; HYBRID_SHARD "
                    "with dp_shard)"),
    # FSDP2's fully_shard(reshard_after_forward=...) (torch 2.13 torch/distributed/fsdp/_fully_shard/
    # _fully_shard.py: False keeps the unsharded parameters from the forward to the backward and avoids
    # the backward's all-gather) and torchtitan's parallelism.fsdp_reshard_after_forward (config/configs.py:
    # "default", "always", "never"); Megatron-LM's --data-parallel-sharding-strategy (arguments.py:
    # no_shard, optim, optim_grads, optim_grads_params)
    **dict.fromkeys(("reshard_after_forward", "fsdp_reshard_after_forward"),
                    "the layout's [layout] zero (resharded after the forward, FSDP's default: 3; kept "
                    "gathered until the backward: 2)"),
    "data_parallel_sharding_strategy": "the layout's [layout] zero (no_shard 0, optim 1, optim_grads 2, "
                                       "optim_grads_params 3)",
    "mixed_precision": "the run's [training] precision and grad_reduce (--precision, --grad-reduce)",
    "activation_checkpointing": "the run's [training] recompute",
    "use_distributed_optimizer": "the layout's [layout] zero = 1",
    "sequence_parallel": "the layout's [layout] sequence_parallel",
    "stage": "the layout's [layout] zero (DeepSpeed ZeRO's stage)",
    # DeepSpeed ZeRO's offload and ZeRO++ (deepspeed/runtime/zero/config.py @v0.16.4), which move work off
    # the GPU or change what the collectives carry: no [layout] field says them, and a step without them
    # is not theirs
    **dict.fromkeys(("offload_optimizer", "offload_param", "cpu_offload", "cpu_offload_param"),
                    "CPU or NVMe offload, which modelcut does not time (leave it out for the run without it)"),
    **dict.fromkeys(("zero_quantized_weights", "zero_quantized_gradients", "zero_quantized_nontrainable_weights",
                     "zero_hpz_partition_size", "mics_shard_size"),
                    "ZeRO++ or MiCS, which modelcut does not time (leave it out for the run without it)"),
}


def not_overlap(key: str) -> str | None:
    """Where a run says the setting ``key`` (:data:`NOT_OVERLAPS`), None where it is none of them."""
    return NOT_OVERLAPS.get(flag_key(key).removeprefix("fsdp_config_").removeprefix("zero_optimization."))


def _is_key(word: str) -> bool:
    """Whether a word of an overlap text names an option or a stack's flag (else it may be a value)."""
    return (word.startswith("-") or option_name(word) is not None or negated_option(word) is not None
            or unmodelled_option(word) is not None or fsdp_setting(word, "true") is not None
            or not_overlap(word) is not None)


def _mapping_parts(text: str) -> list[tuple[str, str | None]] | None:
    """A JSON object or a Python dict written out (``{"tp_comm_overlap": true}``, a configuration's
    ``{'overlap_grad_reduce': True}``) as its (key, value) pairs, a null value as the key alone kept
    out; None where the text is no such mapping."""
    t = text.strip()
    if not (t.startswith("{") and t.endswith("}")):
        return None
    try:
        d = json.loads(t)
    except (ValueError, RecursionError):
        try:
            d = ast.literal_eval(t)
        except (ValueError, SyntaxError, MemoryError, RecursionError):
            raise ModelcutError("overlap: a {...} must be a JSON object or a Python dict of names and values") from None
    if not isinstance(d, dict) or not all(isinstance(k, str) for k in d):
        raise ModelcutError("overlap: a {...} must map names to values")
    out = []
    for k, v in d.items():
        if v is None:
            continue                                 # null: as the stack sets it
        if not isinstance(v, (bool, int, float, str)):
            raise ModelcutError(f"overlap option {k}: {v!r} is not a value (on, off, a number or a name)")
        out.append((k, str(v).lower() if isinstance(v, bool) else str(v)))
    return out


def _overlap_parts(text: str) -> list[tuple[str, str | None]]:
    """An overlap text's (key, value) pairs, value None where a key stands alone: "key=value", a
    launch line's ``--key value`` (a word that names no option after a key is its value:
    ``--fsdp_config_backward_prefetch BACKWARD_PRE``), separated by commas or spaces; or a JSON
    object or Python dict of them (:func:`_mapping_parts`)."""
    mapped = _mapping_parts(text)
    if mapped is not None:
        return mapped
    text = re.sub(r"\s*[=:]\s*", "=", text)         # "tp_comm = on", "tp_comm_overlap: true" as "key=value"
    words = [w for w in re.split(r"[,\s]+", text) if w]   # commas, or a launch line's flags pasted as they are
    out: list[tuple[str, str | None]] = []
    i = 0
    while i < len(words):
        w = words[i]
        if "=" in w:
            k, val = (x.strip() for x in w.split("=", 1))
            out.append((k, val))
        elif i + 1 < len(words) and "=" not in words[i + 1] and not _is_key(words[i + 1]) and _is_key(w):
            out.append((w, words[i + 1]))
            i += 1
        else:
            out.append((w, None))
        i += 1
    return out


#: The key under which a parsed overlap carries the notes of the settings modelcut takes but does
#: not model (:func:`..core.step.stack_names.unmodelled_note`): ``parse_overlap``'s dict and the
#: request model's ``OverlapIn.not_modelled``; :func:`overlap_options` splits them off.
NOT_MODELLED = "not_modelled"


def read_overlap(text: str) -> tuple[dict[str, bool], list[str]]:
    """``"grad_reduce=off,tp_comm=on"`` -> ({"grad_reduce": False, "tp_comm": True}, notes) (:data:`OPTIONS`).
    A key may be written as the stacks name it (:func:`..core.step.stack_names.option_name`:
    ``--tp-comm-overlap=on``, ``async_tp=on``), a key alone means on (``tp_comm``, as the
    stacks' flags are given), a YAML line's colon means "=" (``tp_comm_overlap: true``), a launch
    line's ``--key value`` is ``key=value``, and ``none`` / ``all`` switch every option off / on.
    PyTorch FSDP's prefetch settings (``backward_prefetch=BACKWARD_PRE``, ``forward_prefetch``,
    ``limit_all_gathers``) stand for the options :func:`..core.step.stack_names.fsdp_setting` says.
    A stack's setting that modelcut knows but does not model (``--defer-embedding-wgrad-compute``,
    ``moe_a2a_overlap``, :func:`..core.step.stack_names.unmodelled_option`) is taken: where it asks
    for what modelcut does not time, its note is in ``notes``."""
    out: dict[str, bool] = {}
    notes: list[str] = []
    if text.strip().lower() in ("none", "all"):
        return dict.fromkeys(OPTIONS, text.strip().lower() == "all"), notes

    def put(name: str, on: bool) -> None:
        if name in out and out[name] != on:
            raise ModelcutError(f"overlap option {name} is given both on and off")
        out[name] = on

    for k, val in _overlap_parts(text):
        given = "true" if val is None else val       # a flag alone: on
        fsdp = fsdp_setting(k, given)
        if fsdp is not None:
            for name, on in fsdp.items():
                put(name, on)
            note = fsdp_note(k, given)
            if note is not None and note not in notes:
                notes.append(note)
            continue
        name, flip = option_name(k), False
        if name is None and negated_option(k) is not None:   # --no-overlap-p2p-communication: off
            name, flip = negated_option(k), True
        if name is None and unmodelled_option(k) is not None:
            note = unmodelled_note(k, val)
            if note is not None and note not in notes:
                notes.append(note)
            continue
        val = "on" if val is None else val
        if name is None and (where := not_overlap(k)) is not None:
            raise ModelcutError(f"overlap option {k!r} is no overlap: it is {where}")
        if name is None:
            raise ModelcutError(f"overlap option: unknown key {k!r}; choose one of {', '.join(OPTIONS)} "
                                f"(or the stacks' names: {', '.join(OPTION_ALIASES)}, PyTorch FSDP's "
                                f"{', '.join(FSDP_SETTINGS)}, a \"no-\" flag for off, "
                                f"{', '.join(CONVERSE_ALIASES)} for the converse)")
        if val.lower() not in ON_WORDS + OFF_WORDS:
            raise ModelcutError(f"overlap option {k}: {val!r} is not on or off")
        put(name, (val.lower() in ON_WORDS) != flip)
    return out, notes


def parse_overlap(text: str) -> dict[str, Any]:
    """An overlap text (:func:`read_overlap`) as the request models take it: the options, and under
    :data:`NOT_MODELLED` the notes of the settings modelcut takes but does not model, where any."""
    options, notes = read_overlap(text)
    return {**options, NOT_MODELLED: notes} if notes else options


def overlap_options(overlap: dict[str, Any] | None) -> tuple[dict[str, bool] | None, list[str]]:
    """A parsed overlap (:func:`parse_overlap`'s, an ``OverlapIn``'s dump) as the options a stack
    takes (``Framework.with_overlap``) and the notes an answer carries."""
    if not overlap:
        return overlap, []
    rest = {k: v for k, v in overlap.items() if k != NOT_MODELLED}
    return rest or None, list(overlap.get(NOT_MODELLED) or [])


def check_spec(text: str) -> dict[str, Any]:
    """``tp=8,cp=1,pp=16,dp=64`` as {"tp": 8, ...} (keys :data:`CHECK_KEYS`)."""
    want: dict[str, Any] = {}
    for k, v in pairs(text, "--check", "tp=8,pp=16", CHECK_KEYS):
        if CHECK_KEYS[k] is int:
            if not v.isdigit() or int(v) < 1 and k != "zero":
                raise ModelcutError(f"--check: {k} must be a positive integer, got {v!r}")
            want[k] = int(v)
        else:
            want[k] = v
    return want
