"""Catalog entries by name and alias: the one lookup the hardware and model catalogs share."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Generic, Iterable, TypeVar

from ..core.errors import ModelcutError

T = TypeVar("T")


@dataclass
class NameIndex(Generic[T]):
    """Entries in catalog order, found by name or alias (case-insensitive).

    ``catalog`` names the file's catalog in the duplicate error ("hardware catalog: ..."),
    ``noun`` the thing a user asked for in the unknown-name error ("unknown GPU ...")."""

    catalog: str
    noun: str
    index: dict[str, T] = field(default_factory=dict)
    items: list[T] = field(default_factory=list)

    def add(self, item: T, name: str, aliases: Iterable[str] = ()) -> None:
        self.items.append(item)
        for key in (name, *aliases):
            if key.lower() in self.index:
                raise ModelcutError(f"{self.catalog} catalog: {key!r} names two entries")
            self.index[key.lower()] = item

    def get(self, key: str) -> T:
        item = self.index.get(str(key).lower())
        if item is None:
            names = ", ".join(getattr(i, "name") for i in self.items)
            raise ModelcutError(f"unknown {self.noun} {key!r}; choose one of {names}")
        return item

    def keys(self) -> tuple[str, ...]:
        """Every name and alias :meth:`get` takes (lower case), catalog order."""
        return tuple(self.index)
