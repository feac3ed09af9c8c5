"""The catalogs shipped with modelcut: hardware, models and published runs (TOML package data,
every figure with its source), and models read from Hugging Face ``config.json`` files.

>>> hardware("a100").name
'a100-sxm4-80gb'
"""

from __future__ import annotations

import json
import tomllib
from functools import lru_cache
from importlib import resources
from pathlib import Path
from typing import Any

from ..core.errors import ModelcutError
from ..core.specs import Hardware, Layout, ModelSpec, Run, Training
from ..core.validate import PublishedRun
from .hf_config import model_from_hf_config

__all__ = ["hardware", "all_hardware", "model", "all_models", "published_runs", "published_run",
           "model_from_hf_config", "load_hf_config", "model_from_table", "layout_from_table",
           "training_from_table", "PublishedRun", "MODEL_KEYS", "LAYOUT_KEYS", "TRAINING_KEYS"]

#: Keys a model table may hold (ModelSpec's fields); ffn_hidden defaults to 4·hidden, kv_heads to heads.
MODEL_KEYS = ("name", "layers", "hidden", "ffn_hidden", "heads", "kv_heads", "vocab", "gated_mlp",
              "tied_embeddings", "head_dim", "norm", "bias", "dropout", "max_seq", "experts", "top_k",
              "expert_ffn_hidden", "shared_experts", "dense_layers", "capacity_factor", "source",
              "learned_positions", "qkv_bias")
LAYOUT_KEYS = ("tp", "cp", "pp", "dp", "ep", "etp", "vpp", "sequence_parallel", "zero", "schedule",
               "cp_kind", "order")
TRAINING_KEYS = ("seq_len", "global_batch", "micro_batch", "recompute")


@lru_cache(maxsize=None)
def _toml(name: str) -> dict:
    text = resources.files(__package__).joinpath(name).read_text(encoding="utf-8")
    return tomllib.loads(text)


def _unknown(table: dict, allowed, where: str) -> None:
    for k in table:
        if k not in allowed:
            raise ModelcutError(f"{where}: unknown key {k!r} (allowed: {', '.join(allowed)})")


# ---------------------------------------------------------------- building specs from tables

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
    for k in ("experts", "top_k", "shared_experts", "dense_layers"):
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
    return Layout(**d)


def training_from_table(table: dict, where: str = "[training]") -> Training:
    _unknown(table, TRAINING_KEYS, where)
    for k in ("seq_len", "global_batch"):
        if k not in table:
            raise ModelcutError(f"{where}: missing {k!r}")
    return Training(**table)


# ---------------------------------------------------------------- hardware

@lru_cache(maxsize=None)
def _hardware_index() -> tuple[dict[str, Hardware], tuple[Hardware, ...]]:
    index: dict[str, Hardware] = {}
    items = []
    for row in _toml("hardware.toml")["hardware"]:
        row = dict(row)
        row["aliases"] = tuple(row.get("aliases", ()))
        hw = Hardware(**row)
        items.append(hw)
        for key in (hw.name, *hw.aliases):
            if key.lower() in index:
                raise ModelcutError(f"hardware catalog: {key!r} names two entries")
            index[key.lower()] = hw
    return index, tuple(items)


def hardware(name_or_alias: str) -> Hardware:
    """A catalog accelerator by name or alias (case-insensitive)."""
    index, items = _hardware_index()
    hw = index.get(str(name_or_alias).lower())
    if hw is None:
        raise ModelcutError(f"unknown GPU {name_or_alias!r}; choose one of {', '.join(h.name for h in items)}")
    return hw


def all_hardware() -> list[Hardware]:
    return list(_hardware_index()[1])


# ---------------------------------------------------------------- models

@lru_cache(maxsize=None)
def _model_index() -> tuple[dict[str, ModelSpec], tuple[ModelSpec, ...]]:
    data = _toml("models.toml")
    defaults = data.get("defaults", {})
    index: dict[str, ModelSpec] = {}
    items = []
    for row in data["model"]:
        row = dict(row)
        aliases = row.pop("aliases", [])
        base = defaults[row.pop("defaults")] if "defaults" in row else {}
        spec = model_from_table({**base, **row}, where=f"models.toml {row.get('name')!r}")
        items.append(spec)
        for key in (spec.name, *aliases):
            if key.lower() in index:
                raise ModelcutError(f"model catalog: {key!r} names two entries")
            index[key.lower()] = spec
    return index, tuple(items)


def model(name: str) -> ModelSpec:
    """A catalog model by name or alias (case-insensitive), e.g. "gpt-18.4b", "llama3.1-405b"."""
    index, items = _model_index()
    spec = index.get(str(name).lower())
    if spec is None:
        raise ModelcutError(f"unknown model {name!r}; choose one of {', '.join(m.name for m in items)}")
    return spec


def all_models() -> list[ModelSpec]:
    return list(_model_index()[1])


def load_hf_config(path: str | Path, name: str | None = None) -> ModelSpec:
    """A ModelSpec from a Hugging Face ``config.json`` file."""
    p = Path(path)
    try:
        cfg = json.loads(p.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ModelcutError(f"{p}: no such file") from None
    except json.JSONDecodeError as exc:
        raise ModelcutError(f"{p}: not valid JSON ({exc.msg}, line {exc.lineno})") from None
    if not isinstance(cfg, dict):
        raise ModelcutError(f"{p}: a config.json must hold a JSON object")
    default = p.parent.name if p.stem == "config" and p.parent.name else p.stem
    try:
        return model_from_hf_config(cfg, name or default)
    except ModelcutError as exc:
        msg = str(exc)
        raise ModelcutError(p.name + msg[len("config.json"):] if msg.startswith("config.json")
                            else f"{p.name}: {msg}") from None


# ---------------------------------------------------------------- published runs

@lru_cache(maxsize=None)
def _runs() -> tuple[PublishedRun, ...]:
    out = []
    seen = set()
    for row in _toml("runs.toml")["run"]:
        rid = row["id"]
        where = f"runs.toml {rid!r}"
        if rid in seen:
            raise ModelcutError(f"{where}: duplicate id")
        seen.add(rid)
        spec = model(row["model"]) if isinstance(row["model"], str) else model_from_table(
            row["model"], where=f"{where} model")
        layout = layout_from_table(row["layout"], f"{where} layout")
        if layout.gpus != row["gpus"]:
            raise ModelcutError(f"{where}: layout product {layout.gpus} != gpus {row['gpus']}")
        run = Run(model=spec, gpu=hardware(row["gpu"]).name, layout=layout,
                  training=training_from_table(row["training"], f"{where} training"),
                  gpus_per_node=row.get("gpus_per_node"), name=rid)
        out.append(PublishedRun(
            id=rid, family=row["family"], run=run,
            published_tflops=_num(row.get("published_tflops")),
            published_step_time_s=_num(row.get("published_step_time_s")),
            source=row["source"], notes=row.get("notes", ""), set=row.get("set", "deck"), gpus=row["gpus"],
            published_mfu=_num(row.get("published_mfu")), published_pct_peak=_num(row.get("published_pct_peak")),
            script=dict(row.get("script", {}))))
    return tuple(out)


def _num(x: Any) -> float | None:
    return None if x is None else float(x)


def published_runs(which: str | None = None) -> list[PublishedRun]:
    """Published runs: ``which="deck"`` the 13 rows of the deck's table, ``"dev"`` the
    development set, None all of them."""
    runs = _runs()
    if which is None:
        return list(runs)
    if which not in ("deck", "dev"):
        raise ModelcutError(f"run set must be 'deck' or 'dev', got {which!r}")
    return [r for r in runs if r.set == which]


def published_run(run_id: str) -> PublishedRun:
    for r in _runs():
        if r.id == run_id:
            return r
    raise ModelcutError(f"unknown published run {run_id!r}; choose one of {', '.join(r.id for r in _runs())}")
