"""Training-stack presets (frameworks.toml, each with its source) as
:class:`~modelcut.core.step.frameworks.Framework` objects."""

from __future__ import annotations

import dataclasses
import re
import tomllib
from functools import lru_cache
from importlib import resources

from ..core.errors import ModelcutError
from ..core.step.frameworks import OPTIONS, Framework, Overlap
from .names import NameIndex

_FIELDS = {f.name for f in dataclasses.fields(Framework)}


def overlap_table(table, where: str) -> dict[str, bool]:
    """A TOML ``overlap = { tp_comm = true, ... }`` table checked (each key an overlap option, each
    value true or false): the presets' and the run settings' (runs_dev.toml) alike."""
    if table is None:
        return {}
    if not isinstance(table, dict):
        raise ModelcutError(f"{where}: overlap must be a table of {', '.join(OPTIONS)} set to true or false")
    for k, val in table.items():
        if k not in OPTIONS or not isinstance(val, bool):
            raise ModelcutError(f"{where}: overlap {k!r} must be one of {', '.join(OPTIONS)} set to true or false")
    return dict(table)


def _overlap(row: dict, where: str) -> Overlap:
    return Overlap(**overlap_table(row.get("overlap", {}), where))


@lru_cache(maxsize=None)
def _presets() -> tuple[dict[str, Framework], str, dict[str, tuple[str, ...]]]:
    data = tomllib.loads(resources.files("modelcut.catalog").joinpath("frameworks.toml").read_text(encoding="utf-8"))
    out: dict[str, Framework] = {}
    aliases: dict[str, tuple[str, ...]] = {}
    for row in data["framework"]:
        row = dict(row)
        name = row.get("name")
        where = f"frameworks.toml {name!r}"
        if name in out:
            raise ModelcutError(f"{where}: named twice")
        names = row.pop("aliases", [])
        if not isinstance(names, list) or not all(isinstance(a, str) and a for a in names):
            raise ModelcutError(f"{where}: aliases must be a list of names")
        aliases[name] = tuple(names)   # a preset's own: one built on it (base) does not inherit them
        base = row.pop("base", None)
        if base is not None:
            if base not in out:
                raise ModelcutError(f"{where}: base {base!r} must come before it")
            out[name] = dataclasses.replace(out[base], **row)
            continue
        unknown = set(row) - _FIELDS
        if unknown:
            raise ModelcutError(f"{where}: unknown field {sorted(unknown)[0]!r}")
        row["overlap"] = _overlap(row, where)
        out[name] = Framework(**row)
    default = data["defaults"]["framework"]
    if default not in out:
        raise ModelcutError(f"frameworks.toml: the default framework {default!r} is not a preset")
    return out, default, aliases


def framework_names() -> tuple[str, ...]:
    return tuple(_presets()[0])


def framework_aliases(name: str) -> tuple[str, ...]:
    """The other names of the preset ``name`` (lower case)."""
    return _index().aliases(name)


def default_framework() -> str:
    """The preset a run gets when it names none: a current Megatron-core-style stack."""
    return _presets()[1]


@lru_cache(maxsize=None)
def _index() -> NameIndex[Framework]:
    index: NameIndex[Framework] = NameIndex("framework", "framework", listed="modelcut list frameworks")
    presets, _, aliases = _presets()
    for name, fw in presets.items():
        index.add(fw, name, aliases[name])
    return index


#: A release written after a stack's name: "nemo-25.09", "Megatron-Core 0.12", "torchtitan v0.2.2".
_RELEASE = re.compile(r"^(?P<stack>.*?[a-z].*?)[\s_-]*v?\d+(\.\d+)*$", re.I)


def framework(name: str | None) -> Framework:
    """A preset by name, found as the other catalogs find theirs (:class:`.names.NameIndex`: any
    case, else with other separators); None: the default. A stack's name with a release no preset
    has ("nemo-25.09") is a one-line error naming the stack's preset, which the user may choose."""
    if name is None:
        return _presets()[0][_presets()[1]]
    try:
        return _index().get(name)
    except ModelcutError:
        m = _RELEASE.match(str(name).strip())
        try:
            stack = _index().get(m["stack"]) if m else None
        except ModelcutError:
            stack = None
        if stack is None:
            raise
        raise ModelcutError(f"unknown framework {name!r}: modelcut has no preset for that release; its preset "
                            f"for the stack is {stack.name} (modelcut list frameworks gives each preset's source "
                            "and era, and the few release presets)") from None
