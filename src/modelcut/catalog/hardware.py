"""The accelerator catalog (hardware.toml, every figure with its source)."""

from __future__ import annotations

import tomllib
from dataclasses import replace
from functools import lru_cache
from importlib import resources

from ..core.specs import Hardware
from .kernels import tables_for
from .names import NameIndex


@lru_cache(maxsize=None)
def _hardware_index() -> NameIndex[Hardware]:
    index: NameIndex[Hardware] = NameIndex("hardware", "GPU")
    rows = tomllib.loads(resources.files("modelcut.catalog").joinpath("hardware.toml").read_text(encoding="utf-8"))["hardware"]
    by_name = {r["name"]: r for r in rows}
    for row in rows:
        row = dict(row)
        row["aliases"] = tuple(row.get("aliases", ()))
        row["fp8_recipes"] = tuple(row.get("fp8_recipes", ()))
        hw = Hardware(**row)
        hw = replace(hw, kernels=tables_for(hw.arch, by_name))
        index.add(hw, hw.name, hw.aliases)
    return index


def hardware(name_or_alias: str) -> Hardware:
    """A catalog accelerator by name or alias (case-insensitive)."""
    return _hardware_index().get(name_or_alias)


def all_hardware() -> list[Hardware]:
    return list(_hardware_index().items)


def hardware_keys() -> tuple[str, ...]:
    """Every name and alias :func:`hardware` takes (lower case), catalog order."""
    return _hardware_index().keys()
