"""The measured kernel tables (kernels.toml and the files it names) as the core's table objects,
one :class:`~modelcut.core.costs.tables.KernelTables` per architecture."""

from __future__ import annotations

import csv
import io
import math
import tomllib
from collections import defaultdict
from functools import lru_cache
from importlib import resources

import numpy as np

from ..core.costs.tables import (AttentionCurves, CollectiveCurves, GemmCurve, GemmGrid, GemmRatio, KernelTables,
                                 Reference)
from ..core.errors import ModelcutError


def _text(name: str) -> str:
    return resources.files("modelcut.catalog").joinpath(name).read_text(encoding="utf-8")


def _rows(name: str) -> list[dict]:
    return list(csv.DictReader(io.StringIO(_text(name))))


@lru_cache(maxsize=None)
def _index() -> dict:
    return tomllib.loads(_text("kernels.toml"))


def _gemm(entry: dict, sms: int, tables: dict | None = None):
    if entry["kind"] == "ratio":
        arch_b, num_t, den_t = entry["ratio_of"]
        other = {e["dtype"]: e for e in _index()["gemm"] if e["arch"] == arch_b}
        if tables is None or entry["base"] not in tables or num_t not in other or den_t not in other:
            raise ModelcutError(f"kernels.toml: the {entry['arch']} {entry['dtype']} ratio table names a table not loaded")
        return GemmRatio(f"{entry['arch']} {entry['dtype']}", tables[entry["base"]], _gemm(other[num_t], None),
                         _gemm(other[den_t], None), float(entry["max_ratio"]), float(entry["ceiling_tflops"]),
                         entry["source"])
    rows = _rows(entry["file"])
    if entry["kind"] == "grid":
        pts = [(int(r["m"]), int(r["n"]), int(r["k"]), 2e-3 * int(r["m"]) * int(r["n"]) * int(r["k"]) / float(r["time_ns"]))
               for r in rows if r["b"] == "1"]
        return GemmGrid.from_points(entry["file"], sms, pts, entry["source"])
    if entry["kind"] == "square":
        return GemmCurve.from_points(entry["file"], sms, [(int(r["size"]), float(r["tflops"])) for r in rows],
                                     entry["source"], entry.get("ceiling_tflops"))
    raise ModelcutError(f"kernels.toml: unknown gemm kind {entry['kind']!r}")


@lru_cache(maxsize=None)
def _attention(arch: str) -> dict[str, AttentionCurves]:
    entry = _index()["attention"][0]
    by_impl: dict[str, dict] = defaultdict(lambda: defaultdict(list))
    for r in _rows(entry["file"]):
        if r["arch"] == arch:
            key = (r["direction"], r["causal"] == "1", int(r["head_dim"]))
            by_impl[r["impl"]][key].append((int(r["seq_len"]), float(r["tflops"])))
    out = {}
    for impl, curves in by_impl.items():
        arrays = {k: (np.log2([s for s, _ in sorted(v)]).astype(float), np.array([t for _, t in sorted(v)]))
                  for k, v in curves.items()}
        out[impl] = AttentionCurves(impl, arch, arrays, entry["source"])
    return out


@lru_cache(maxsize=None)
def _collectives(arch: str) -> CollectiveCurves | None:
    entry = _index()["collectives"][0]
    pts: dict = defaultdict(list)
    for r in _rows(entry["file"]):
        if r["arch"] == arch:
            pts[(r["collective"], int(r["ranks"]))].append((int(r["size_bytes"]), float(r["time_us"])))
    if not pts:
        return None
    curves = {}
    for key, v in pts.items():
        v = sorted(v)
        curves[key] = (np.array([math.log2(s) for s, _ in v]), np.array([math.log2(t) for _, t in v]))
    return CollectiveCurves(arch, curves, entry["source"])


def _reference(arch: str, hardware_rows: dict[str, dict]) -> Reference | None:
    name = _index().get("measured_on", {}).get(arch)
    if name is None:
        return None
    row = hardware_rows.get(name)
    if row is None:
        raise ModelcutError(f"kernels.toml: measured_on.{arch} names {name!r}, not in hardware.toml")
    peaks = {"bf16": row["peak_flops_16"]}
    if row.get("peak_flops_8"):
        peaks["fp8"] = row["peak_flops_8"]
    return Reference(name, peaks, row.get("sms"), row["link_bw"])


def tables_for(arch: str, hardware_rows: dict[str, dict]) -> KernelTables | None:
    """Every table measured on ``arch`` (None where there is none), with the device they were
    measured on (``measured_on`` in kernels.toml; its figures from ``hardware_rows``)."""
    if not arch:
        return None
    key = (arch, tuple(sorted((k, v.get("sms"), v["peak_flops_16"]) for k, v in hardware_rows.items())))
    if key not in _TABLES:
        ref = _reference(arch, hardware_rows)
        sms = ref.sms if ref is not None else None
        gemm: dict = {}
        mine = [e for e in _index()["gemm"] if e["arch"] == arch]
        for e in sorted(mine, key=lambda e: e["kind"] == "ratio"):     # measured tables first
            gemm[e["dtype"]] = _gemm(e, sms, gemm)
        att = _attention(arch)
        coll = _collectives(arch)
        _TABLES[key] = None if not gemm and not att and coll is None else KernelTables(arch, gemm, att, coll, ref)
    return _TABLES[key]


_TABLES: dict = {}
