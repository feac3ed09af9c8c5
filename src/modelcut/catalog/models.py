"""The model catalog (models.toml, every shape with its source) and Hugging Face config.json files."""

from __future__ import annotations

import json
import tomllib
from functools import lru_cache
from importlib import resources
from pathlib import Path

from ..core.errors import ModelcutError, NESTED_JSON
from ..core.specs import ModelSpec
from .hf_config import model_from_hf_config
from .names import NameIndex
from .tables import model_from_table


@lru_cache(maxsize=None)
def _model_index() -> NameIndex[ModelSpec]:
    data = tomllib.loads(resources.files("modelcut.catalog").joinpath("models.toml").read_text(encoding="utf-8"))
    defaults = data.get("defaults", {})
    index: NameIndex[ModelSpec] = NameIndex("model", "model", listed="modelcut list models")
    for row in data["model"]:
        row = dict(row)
        aliases = row.pop("aliases", [])
        base = defaults[row.pop("defaults")] if "defaults" in row else {}
        spec = model_from_table({**base, **row}, where=f"models.toml {row.get('name')!r}")
        index.add(spec, spec.name, aliases)
    return index


def model(name: str) -> ModelSpec:
    """A catalog model by name or alias (case-insensitive), e.g. "gpt-18.4b", "llama3.1-405b"."""
    return _model_index().get(name)


def all_models() -> list[ModelSpec]:
    return list(_model_index().items)


def model_aliases(name: str) -> tuple[str, ...]:
    """The other names of the catalog model ``name`` (lower case)."""
    return _model_index().aliases(name)


def model_keys() -> tuple[str, ...]:
    """Every name and alias :func:`model` takes (lower case), catalog order."""
    return _model_index().keys()


def load_hf_config(path: str | Path, name: str | None = None) -> ModelSpec:
    """A ModelSpec from a Hugging Face ``config.json`` file."""
    p = Path(path)
    try:
        cfg = json.loads(p.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ModelcutError(f"{p}: no such file") from None
    except json.JSONDecodeError as exc:
        raise ModelcutError(f"{p}: not valid JSON ({exc.msg}, line {exc.lineno})") from None
    except RecursionError:
        raise ModelcutError(f"{p}: not valid JSON ({NESTED_JSON})") from None
    if not isinstance(cfg, dict):
        raise ModelcutError(f"{p}: a config.json must hold a JSON object")
    default = p.parent.name if p.stem == "config" and p.parent.name else p.stem
    try:
        return model_from_hf_config(cfg, name or default)
    except ModelcutError as exc:
        msg = str(exc)
        raise ModelcutError(p.name + msg[len("config.json"):] if msg.startswith("config.json")
                            else f"{p.name}: {msg}") from None
