"""The accelerator catalog (hardware.toml, every figure with its source)."""

from __future__ import annotations

import tomllib
from dataclasses import replace
from functools import lru_cache
from importlib import resources

from ..core.errors import ModelcutError
from ..core.specs import Hardware
from .kernels import tables_for


@lru_cache(maxsize=None)
def _hardware_index() -> tuple[dict[str, Hardware], tuple[Hardware, ...]]:
    index: dict[str, Hardware] = {}
    items = []
    rows = tomllib.loads(resources.files("modelcut.catalog").joinpath("hardware.toml").read_text(encoding="utf-8"))["hardware"]
    by_name = {r["name"]: r for r in rows}
    for row in rows:
        row = dict(row)
        row["aliases"] = tuple(row.get("aliases", ()))
        row["fp8_recipes"] = tuple(row.get("fp8_recipes", ()))
        hw = Hardware(**row)
        hw = replace(hw, kernels=tables_for(hw.arch, by_name))
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


def hardware_keys() -> tuple[str, ...]:
    """Every name and alias :func:`hardware` takes (lower case), catalog order."""
    return tuple(_hardware_index()[0])
