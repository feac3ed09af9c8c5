"""The accelerator catalog (hardware.toml, every figure with its source)."""

from __future__ import annotations

import re
import tomllib
from dataclasses import replace
from functools import lru_cache
from importlib import resources

from ..core.costs import comm, kernels
from ..core.errors import ModelcutError
from ..core.specs import Hardware, Layout
from .kernels import tables_for
from .names import NameIndex


@lru_cache(maxsize=None)
def _hardware_index() -> NameIndex[Hardware]:
    index: NameIndex[Hardware] = NameIndex("hardware", "GPU", listed="modelcut list hardware")
    rows = tomllib.loads(resources.files("modelcut.catalog").joinpath("hardware.toml").read_text(encoding="utf-8"))["hardware"]
    by_name = {r["name"]: r for r in rows}
    built: dict[str, Hardware] = {}
    for row in rows:
        row = dict(row)
        row["aliases"] = tuple(row.get("aliases", ()))
        row["fp8_recipes"] = tuple(row.get("fp8_recipes", ()))
        row.pop("net_half_device", None)
        src = row.pop("sustained_from", None)   # a power-capped variant: its die's measured share, held to its limit
        if src is not None and src not in by_name:
            raise ModelcutError(f"hardware.toml {row['name']!r}: sustained_from names no row ({src!r})")
        ref = by_name[src] if src is not None else None
        if ref is not None:
            row.update(sustained_frac=ref["sustained_frac"], sustained_power_w=ref["sustained_power_w"])
        hw = Hardware(**row)
        if ref is not None:
            hw = kernels.at_power(hw, hw.power_w)
        built[hw.name] = replace(hw, kernels=tables_for(hw.arch, by_name))
    for row in rows:
        hw = built[row["name"]]
        if "net_half_device" in row:
            hw = replace(hw, net_half_bw=_two_node_busbw(built[row["net_half_device"]]))
        index.add(hw, hw.name, hw.aliases)
    return index


def _two_node_busbw(dev: Hardware) -> float:
    """The bus bandwidth per accelerator modelcut gives a data-parallel ring over two whole nodes of
    ``dev``, the setup of the network's half-bandwidth sweep (``net_half_bytes``): the one rule of
    :func:`..core.costs.comm.collective_bandwidth` at the share of line rate it reaches."""
    g = dev.per_node
    lay = Layout(dp=2 * g)
    return comm.achievable(comm.collective_bandwidth(lay, ("cp", "dp"), dev, g), dev)


#: ``<gpu>@<watts>w``: a catalog accelerator held to a power limit (``h100@500w``, ``a100 @ 300 W``)
_CAPPED = re.compile(r"^(?P<gpu>.*?)\s*@\s*(?P<watts>[0-9]+(?:\.[0-9]+)?)\s*w$", re.IGNORECASE)


def hardware(name_or_alias: str) -> Hardware:
    """A catalog accelerator by name or alias (case-insensitive); ``<gpu>@<watts>w`` gives it held
    to that power limit (:func:`..core.costs.kernels.held_to`)."""
    m = _CAPPED.match(name_or_alias.strip()) if isinstance(name_or_alias, str) else None
    if m is None:
        return _hardware_index().get(name_or_alias)
    return kernels.held_to(_hardware_index().get(m["gpu"]), float(m["watts"]))


def all_hardware() -> list[Hardware]:
    return list(_hardware_index().items)


def cappable_keys() -> tuple[str, ...]:
    """The names and aliases (lower case) of the GPUs a power cap can hold (``<gpu>@<watts>w``):
    those whose sustained share has a measured draw."""
    return tuple(k.lower() for h in all_hardware() if h.cappable for k in (h.name, *h.aliases))


def hardware_keys() -> tuple[str, ...]:
    """Every name and alias :func:`hardware` takes (lower case), catalog order."""
    return _hardware_index().keys()
