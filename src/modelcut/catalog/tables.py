"""Specs from TOML-style tables (catalog rows, RUN.toml sections, web requests): unknown keys and
missing fields are one-line errors."""

from __future__ import annotations

from ..core.costs.context import cp_kind_name
from ..core.errors import ModelcutError
from ..core.specs import Layout, ModelSpec, Training

#: Keys a model table may hold (ModelSpec's fields); ffn_hidden defaults to 4·hidden, kv_heads to heads.
MODEL_KEYS = ("name", "layers", "hidden", "ffn_hidden", "heads", "kv_heads", "vocab", "gated_mlp",
              "tied_embeddings", "head_dim", "norm", "bias", "dropout", "max_seq", "experts", "top_k",
              "expert_ffn_hidden", "shared_experts", "dense_layers", "capacity_factor", "source",
              "learned_positions", "qkv_bias", "rope_mscale", "glu_clamp", "sliding_window", "sliding_layers",
              "moe_every", "attention_chunk", "chunked_layers", "q_lora_rank", "kv_lora_rank", "qk_nope_head_dim",
              "qk_rope_head_dim", "v_head_dim")
LAYOUT_KEYS = ("tp", "cp", "pp", "dp", "ep", "etp", "vpp", "sequence_parallel", "zero", "schedule",
               "cp_kind", "order", "dp_shard", "cp_a2a", "first_layers", "last_layers")
TRAINING_KEYS = ("seq_len", "global_batch", "micro_batch", "recompute", "precision", "fp8_recipe", "local_batch",
                 "cross_entropy", "recompute_modules", "recompute_layers", "recompute_every", "grad_reduce",
                 "fp8_param_gather", "attention", "activation_func_fp8_input_store", "adam_moments")


def _unknown(table: dict, allowed, where: str) -> None:
    for k in table:
        if k not in allowed:
            raise ModelcutError(f"{where}: unknown key {k!r} (allowed: {', '.join(allowed)})")


def model_from_table(table: dict, name: str = "", where: str = "[model]") -> ModelSpec:
    """A ModelSpec from a TOML-style table; unknown keys and missing fields are one-line errors."""
    _unknown(table, MODEL_KEYS, where)
    d = dict(table)
    for k in ("layers", "hidden", "heads", "vocab"):
        if k not in d:
            raise ModelcutError(f"{where}: missing {k!r}")
    d.setdefault("name", name)
    if not isinstance(d["hidden"], int) or isinstance(d["hidden"], bool):
        raise ModelcutError(f"{where}: hidden must be an integer, got {d['hidden']!r}")
    d.setdefault("ffn_hidden", 4 * d["hidden"])
    d.setdefault("kv_heads", d["heads"])
    cf = d.get("capacity_factor")
    if cf is not None and (isinstance(cf, bool) or not isinstance(cf, (int, float)) or not cf > 0):
        raise ModelcutError(f"{where}: capacity_factor must be a positive number (1.0: no slack), got {cf!r}")
    for k in ("experts", "top_k", "shared_experts", "dense_layers", "moe_every", "chunked_layers"):
        if k in d and (isinstance(d[k], bool) or not isinstance(d[k], int)):
            raise ModelcutError(f"{where}: {k} must be an integer, got {d[k]!r}")
    if d.get("shared_experts", 0) < 0:
        raise ModelcutError(f"{where}: shared_experts must be at least 0, got {d['shared_experts']}")
    try:
        return ModelSpec(**d)
    except TypeError as exc:
        raise ModelcutError(f"{where}: {exc}") from None
    except ModelcutError as exc:
        msg = str(exc)
        raise ModelcutError(msg if msg.startswith(where) else f"{where}: {msg}") from None


def layout_from_table(table: dict, where: str = "[layout]") -> Layout:
    _unknown(table, LAYOUT_KEYS, where)
    d = dict(table)
    if "order" in d:
        if not isinstance(d["order"], list):
            raise ModelcutError(f"{where}: order must be a list such as [\"tp\", \"cp\", \"pp\", \"dp\"]")
        d["order"] = tuple(d["order"])
    for k in ("sequence_parallel",):
        if k in d and not isinstance(d[k], bool):
            raise ModelcutError(f"{where}: {k} must be true or false, got {d[k]!r}")
    if isinstance(d.get("cp_kind"), str):   # as the stacks name it: Megatron-LM's --cp-comm-type p2p, allgather
        try:
            d["cp_kind"] = cp_kind_name(d["cp_kind"])
        except ModelcutError as exc:
            raise ModelcutError(f"{where}: {exc}") from None
    return Layout(**d)


def training_from_table(table: dict, where: str = "[training]") -> Training:
    _unknown(table, TRAINING_KEYS, where)
    for k in ("seq_len", "global_batch"):
        if k not in table:
            raise ModelcutError(f"{where}: missing {k!r}")
    return Training(**table)
