"""What each training-stack preset can run (framework_rules.toml, every field with its source) as
:class:`~modelcut.core.explore.rules.Capabilities`."""

from __future__ import annotations

import tomllib
from functools import lru_cache
from importlib import resources

from ..core.errors import ModelcutError
from ..core.explore.rules import Capabilities, from_table
from .frameworks import framework, framework_names


@lru_cache(maxsize=None)
def _stacks() -> dict[str, Capabilities]:
    text = resources.files("modelcut.catalog").joinpath("framework_rules.toml").read_text(encoding="utf-8")
    out: dict[str, Capabilities] = {}
    for row in tomllib.loads(text).get("stack", []):
        row = dict(row)
        name = row.pop("framework", None)
        where = f"framework_rules.toml {name!r}"
        if name not in framework_names():
            raise ModelcutError(f"{where}: not a preset of frameworks.toml")
        if name in out:
            raise ModelcutError(f"{where}: named twice")
        base_name = row.pop("base", None)
        if base_name is not None and base_name not in out:
            raise ModelcutError(f"{where}: base {base_name!r} must come before it")
        sources = row.pop("sources", {})
        out[name] = from_table(name, row, out.get(base_name), sources)
    missing = [n for n in framework_names() if n not in out]
    if missing:
        raise ModelcutError(f"framework_rules.toml: preset {missing[0]!r} has no [[stack]]")
    return out


def capabilities(name: str | None) -> Capabilities:
    """The capabilities of a preset by name (case-insensitive); None: the default preset's."""
    fw = framework(name)
    return _stacks()[fw.name]
