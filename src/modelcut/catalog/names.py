"""Catalog entries by name and alias: the one lookup the hardware and model catalogs share."""

from __future__ import annotations

import difflib
import re
from dataclasses import dataclass, field
from typing import Generic, Iterable, TypeVar

from ..core.errors import ModelcutError

T = TypeVar("T")

#: The most entries an unknown-name error lists in full.
SHOWN = 20


def loose_key(key: str) -> str:
    """A name as :class:`NameIndex` matches it when the exact spelling is not in the catalog: lower
    case, without a leading vendor "nvidia", spaces, hyphens and underscores ("NVIDIA A100-SXM4-80GB",
    nvidia-smi's name, and "a100_sxm4_80gb" both give "a100sxm480gb"; "Llama-3.1-8B" gives "llama3.18b")."""
    k = re.sub(r"[\s_-]+", "", str(key).lower())
    return k[len("nvidia"):] if k.startswith("nvidia") and len(k) > len("nvidia") else k


def hub_spellings(key: str) -> list[str]:
    """The spellings of ``key`` tried in turn against the loose names: itself, then as a Hugging Face
    repository names a model: without its owner ("meta-llama/Llama-3.1-8B" is "Llama-3.1-8B"), without
    the "-hf" of a converted checkpoint ("Llama-2-7b-hf"), without the suffix of a tuned checkpoint of
    the same shape ("-Instruct", "-Chat", "-Base", "-it") and without the "Meta-" of Meta's own names
    ("Meta-Llama-3-70B")."""
    out = [key]
    name = key.rsplit("/", 1)[-1]
    if re.search(r"[-_]hf$", name, flags=re.I):
        name = name[:-3]
    name = re.sub(r"[-_](instruct|chat|base|it)(?=$|[-_]v[\d.]+$)", "", name, flags=re.I)
    if re.match(r"meta[-_]llama", name, flags=re.I):
        name = name[5:]
    if name != key:
        out.append(name)
    return out


@dataclass
class NameIndex(Generic[T]):
    """Entries in catalog order, found by name or alias (case-insensitive), else by the same name
    written with other separators (:func:`loose_key`), where that spelling names one entry only.

    ``catalog`` names the file's catalog in the duplicate error ("hardware catalog: ..."),
    ``noun`` the thing a user asked for in the unknown-name error ("unknown GPU ..."), ``listed``
    where the whole list is, for an unknown-name error in a catalog too long to print in one line
    (more than :data:`SHOWN` entries): that error names the closest names instead."""

    catalog: str
    noun: str
    listed: str = ""
    index: dict[str, T] = field(default_factory=dict)
    items: list[T] = field(default_factory=list)
    loose: dict[str, list[T]] = field(default_factory=dict)

    def add(self, item: T, name: str, aliases: Iterable[str] = ()) -> None:
        self.items.append(item)
        for key in (name, *aliases):
            if key.lower() in self.index:
                raise ModelcutError(f"{self.catalog} catalog: {key!r} names two entries")
            self.index[key.lower()] = item
            hits = self.loose.setdefault(loose_key(key), [])
            if not any(h is item for h in hits):
                hits.append(item)

    def get(self, key: str) -> T:
        item = self.index.get(str(key).lower())
        if item is not None:
            return item
        hits: list[T] = []
        for spelling in hub_spellings(str(key)):
            hits = self.loose.get(loose_key(spelling), [])
            if hits:
                break
        if len(hits) == 1:
            return hits[0]
        if hits:
            names = ", ".join(getattr(i, "name") for i in hits)
            raise ModelcutError(f"{self.noun} {key!r} could be any of {names}; write one of them")
        if len(self.items) <= SHOWN or not self.listed:
            names = ", ".join(getattr(i, "name") for i in self.items)
            raise ModelcutError(f"unknown {self.noun} {key!r}; choose one of {names}")
        close = self.closest(str(key))
        hint = f"closest: {', '.join(close)}; " if close else ""
        raise ModelcutError(f"unknown {self.noun} {key!r}; {hint}all {len(self.items)}: {self.listed}")

    def closest(self, key: str, n: int = 4) -> list[str]:
        """The entries' names nearest ``key`` written loosely (difflib's ratio over
        :func:`loose_key` of every name and alias, 0.6 or more), nearest first, each once."""
        by_loose = {lk: getattr(items[0], "name") for lk, items in self.loose.items()}
        out: list[str] = []
        for lk in difflib.get_close_matches(loose_key(key), list(by_loose), n=3 * n, cutoff=0.6):
            if by_loose[lk] not in out:
                out.append(by_loose[lk])
        return out[:n]

    def aliases(self, name: str) -> tuple[str, ...]:
        """The other names the entry called ``name`` is found by (lower case, catalog order)."""
        item = self.index[name.lower()]
        return tuple(k for k, v in self.index.items() if v is item and k != name.lower())

    def keys(self) -> tuple[str, ...]:
        """Every name and alias :meth:`get` takes (lower case), catalog order."""
        return tuple(self.index)
