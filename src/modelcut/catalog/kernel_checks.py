"""Published kernel benchmarks to check the measured tables against (kernel_checks.toml)."""

from __future__ import annotations

import csv
import io
import tomllib
from dataclasses import dataclass, replace
from functools import lru_cache
from typing import get_args
from importlib import resources

from ..core.costs.kernels import at_peak
from ..core.errors import ModelcutError
from ..core.specs import Hardware, Recompute
from .hardware import hardware

#: The benchmark's precisions: (precision, FP8 recipe, pre-quantized), by measured_ms key.
LINEAR_KINDS: dict[str, tuple[str, str | None, bool]] = {
    "bf16": ("bf16", None, False),
    "fp8_delayed": ("fp8", "delayed", False),
    "fp8_current": ("fp8", "current", False),
    "fp8_current_prequantized": ("fp8", "current", True),
    "mxfp8": ("fp8", "mxfp8", False),
    "mxfp8_prequantized": ("fp8", "mxfp8", True),
}


@dataclass(frozen=True)
class LinearCheck:
    """One published benchmark of a transformer layer's linear-layer products (the file's doc):
    per kind (:data:`LINEAR_KINDS`), milliseconds per layer on ``hw``."""

    id: str
    hw: Hardware
    hidden: int
    intermediate: int
    tokens: int
    measured_ms: dict[str, float]
    source: str
    date: str
    device_source: str = ""


def _device(entry: dict) -> Hardware:
    base = hardware(entry["device"])
    var = entry.get("variant")
    if not var:
        return base
    var = dict(var)
    if base.fp8_ceiling and "peak_flops_8" in var and base.peak_flops_8:
        # the base die's own FP8 maximum at the variant's clocks (the peak-ratio rule)
        var["fp8_ceiling"] = at_peak(base.fp8_ceiling, var["peak_flops_8"], base.peak_flops_8)
    return replace(base, aliases=(), source=entry.get("variant_source", ""), **var)


#: The recomputation modes a layer measurement may name: the step model's own (``core.specs.Recompute``).
LAYER_RECOMPUTE: tuple[str, ...] = get_args(Recompute)


@dataclass(frozen=True)
class LayerConfig:
    """One setting of a layer measurement: recomputation, sequence parallelism, and the published
    forward and backward (its recomputed forward included) in milliseconds."""

    recompute: str
    sequence_parallel: bool
    forward_ms: float
    backward_ms: float


@dataclass(frozen=True)
class LayerCheck:
    """A published measurement of one transformer layer inside a training step (the file's doc),
    under the settings of a published run of the catalog (``run``)."""

    id: str
    run: str
    configs: tuple[LayerConfig, ...]
    source: str


def _toml() -> dict:
    return tomllib.loads(resources.files("modelcut.catalog").joinpath("kernel_checks.toml").read_text(encoding="utf-8"))


@lru_cache(maxsize=None)
def layer_checks() -> tuple[LayerCheck, ...]:
    out = []
    for e in _toml().get("layer", []):
        configs = []
        for c in e["measured_ms"]:
            if c["recompute"] not in LAYER_RECOMPUTE:
                raise ModelcutError(f"kernel_checks.toml {e['id']}: recompute must be one of "
                                    f"{', '.join(LAYER_RECOMPUTE)}, got {c['recompute']!r}")
            configs.append(LayerConfig(c["recompute"], bool(c["sequence_parallel"]), float(c["forward"]),
                                       float(c["backward"])))
        out.append(LayerCheck(e["id"], e["run"], tuple(configs), e["source"]))
    return tuple(out)


@lru_cache(maxsize=None)
def linear_checks() -> tuple[LinearCheck, ...]:
    rows = _toml().get("linear", [])
    out = []
    for e in rows:
        unknown = set(e["measured_ms"]) - set(LINEAR_KINDS)
        if unknown:
            raise ModelcutError(f"kernel_checks.toml {e['id']}: unknown kinds {', '.join(sorted(unknown))}")
        out.append(LinearCheck(e["id"], _device(e), int(e["hidden"]), int(e["intermediate"]), int(e["tokens"]),
                               dict(e["measured_ms"]), e["source"], str(e.get("date", "")),
                               e.get("variant_source", "")))
    return tuple(out)


#: The data types a product sweep may measure (the product tables' own keys, kernels.toml).
SWEEP_DTYPES = ("bf16", "fp8")


@dataclass(frozen=True)
class SweepPoint:
    """One measured product of a sweep: m×n×k, the call's milliseconds and the milliseconds of the
    input quantization it includes (0 for a 16-bit product)."""

    m: int
    n: int
    k: int
    ms: float
    quant_ms: float = 0.0

    @property
    def product_ms(self) -> float:
        """The product alone: the call less its input quantization."""
        return self.ms - self.quant_ms


@dataclass(frozen=True)
class GemmSweep:
    """An independent sweep of single products by shape on one device and data type (the file's
    ``[[gemm_sweep]]`` doc)."""

    id: str
    hw: Hardware
    dtype: str
    points: tuple[SweepPoint, ...]
    source: str
    date: str


def _csv_rows(entry: dict, columns: set[str]) -> list[dict[str, str]]:
    """The rows of an entry's ``file``, refused in one line when it lacks one of ``columns``."""
    text = resources.files("modelcut.catalog").joinpath(entry["file"]).read_text(encoding="utf-8")
    reader = csv.DictReader(io.StringIO(text))
    missing = columns - set(reader.fieldnames or ())
    if missing:
        raise ModelcutError(f"kernel_checks.toml {entry['id']}: {entry['file']} lacks the columns "
                            f"{', '.join(sorted(missing))}")
    return list(reader)


def _sweep_points(entry: dict) -> tuple[SweepPoint, ...]:
    points = []
    for row in _csv_rows(entry, {"device", "dtype", "m", "n", "k", "ms", "quant_ms"}):
        if row["device"] != entry["device"] or row["dtype"] != entry["dtype"]:
            continue
        q = float(row["quant_ms"]) if row.get("quant_ms") else 0.0
        p = SweepPoint(int(row["m"]), int(row["n"]), int(row["k"]), float(row["ms"]), q)
        if min(p.m, p.n, p.k) < 1 or not p.product_ms > 0 or q < 0:
            raise ModelcutError(f"kernel_checks.toml {entry['id']}: a product must have positive sizes and "
                                f"time left after its quantization, got {row}")
        if entry["dtype"] == "fp8" and not row.get("quant_ms"):
            raise ModelcutError(f"kernel_checks.toml {entry['id']}: an FP8 row needs its quant_ms, got {row}")
        points.append(p)
    if not points:
        raise ModelcutError(f"kernel_checks.toml {entry['id']}: no {entry['dtype']} rows for {entry['device']} "
                            f"in {entry['file']}")
    return tuple(points)


@lru_cache(maxsize=None)
def gemm_sweeps() -> tuple[GemmSweep, ...]:
    out = []
    for e in _toml().get("gemm_sweep", []):
        if e["dtype"] not in SWEEP_DTYPES:
            raise ModelcutError(f"kernel_checks.toml {e['id']}: dtype must be one of {', '.join(SWEEP_DTYPES)}, "
                                f"got {e['dtype']!r}")
        out.append(GemmSweep(e["id"], _device(e), e["dtype"], _sweep_points(e), e["source"], str(e.get("date", ""))))
    return tuple(out)


@dataclass(frozen=True)
class AttentionPoint:
    """One measured attention call (the file's ``[[attention_sweep]]`` doc): its shape and its
    forward and backward TFLOP/s in the tables' count."""

    batch: int
    heads: int
    kv_heads: int
    head_dim_qk: int
    head_dim_v: int
    seq_len: int
    causal: bool
    fwd_tflops: float
    bwd_tflops: float
    window: int | None = None   # a causal sliding window of keys (each query's own among them); None: none


@dataclass(frozen=True)
class AttentionSweep:
    """An independent benchmark of one fused attention kernel by sequence length on one device,
    checked against the attention table of ``impl`` (the file's ``[[attention_sweep]]`` doc)."""

    id: str
    hw: Hardware
    impl: str
    kernel: str
    points: tuple[AttentionPoint, ...]
    source: str
    date: str
    device_source: str = ""     # a variant's figures and their source (the file's doc)


def _attention_points(entry: dict) -> tuple[AttentionPoint, ...]:
    cols = {"check", "batch", "heads", "kv_heads", "head_dim_qk", "head_dim_v", "seq_len", "causal", "fwd_tflops",
            "bwd_tflops"}
    points = []
    for row in _csv_rows(entry, cols):
        if row["check"] != entry["id"]:
            continue
        if row["causal"] not in ("0", "1"):
            raise ModelcutError(f"kernel_checks.toml {entry['id']}: causal must be 0 or 1, got {row}")
        window = row.get("window") or None
        p = AttentionPoint(int(row["batch"]), int(row["heads"]), int(row["kv_heads"]), int(row["head_dim_qk"]),
                           int(row["head_dim_v"]), int(row["seq_len"]), row["causal"] == "1",
                           float(row["fwd_tflops"]), float(row["bwd_tflops"]), int(window) if window else None)
        if p.window is not None and (p.window < 1 or not p.causal):
            raise ModelcutError(f"kernel_checks.toml {entry['id']}: a window must be a positive count of keys "
                                f"on a causal point, got {row}")
        if min(p.batch, p.heads, p.kv_heads, p.head_dim_qk, p.head_dim_v, p.seq_len) < 1 or p.heads % p.kv_heads \
                or not (p.fwd_tflops > 0 and p.bwd_tflops > 0):
            raise ModelcutError(f"kernel_checks.toml {entry['id']}: a point needs positive sizes and rates, and "
                                f"query heads a multiple of the key/value heads, got {row}")
        points.append(p)
    if not points:
        raise ModelcutError(f"kernel_checks.toml {entry['id']}: no rows in {entry['file']}")
    return tuple(points)


@lru_cache(maxsize=None)
def attention_sweeps() -> tuple[AttentionSweep, ...]:
    out = []
    for e in _toml().get("attention_sweep", []):
        hw = _device(e)
        kinds = hw.kernels.attention if hw.kernels is not None else {}
        if e["impl"] not in kinds:
            raise ModelcutError(f"kernel_checks.toml {e['id']}: {hw.name} has no {e['impl']!r} attention table "
                                f"(it has {', '.join(sorted(kinds)) or 'none'})")
        out.append(AttentionSweep(e["id"], hw, e["impl"], e["kernel"], _attention_points(e), e["source"],
                                  str(e.get("date", "")), e.get("variant_source", "")))
    return tuple(out)


@dataclass(frozen=True)
class NormPoint:
    """One measured RMSNorm shape (the file's ``[[norm_sweep]]`` doc): ``rows`` × ``hidden`` 16-bit
    elements, the fused kernel's, PyTorch's and ``torch.compile``'s forward and backward milliseconds."""

    model: str
    rows: int
    hidden: int
    fused_fwd_ms: float
    fused_bwd_ms: float
    torch_fwd_ms: float
    torch_bwd_ms: float
    compiled_fwd_ms: float
    compiled_bwd_ms: float


@dataclass(frozen=True)
class NormSweep:
    """An independent benchmark of a fused norm kernel by shape on one device, checked against the
    step model's memory-bound time for the same bytes (the file's ``[[norm_sweep]]`` doc)."""

    id: str
    hw: Hardware
    kernel: str
    points: tuple[NormPoint, ...]
    source: str
    date: str


@lru_cache(maxsize=None)
def norm_sweeps() -> tuple[NormSweep, ...]:
    out = []
    cols = {"model", "N", "C", "cudnn_fwd_ms", "cudnn_bwd_ms", "pytorch_fwd_ms", "pytorch_bwd_ms",
            "torch_compile_fwd_ms", "torch_compile_bwd_ms"}
    for e in _toml().get("norm_sweep", []):
        points = []
        for row in _csv_rows(e, cols):
            p = NormPoint(row["model"], int(row["N"]), int(row["C"]), float(row["cudnn_fwd_ms"]),
                          float(row["cudnn_bwd_ms"]), float(row["pytorch_fwd_ms"]), float(row["pytorch_bwd_ms"]),
                          float(row["torch_compile_fwd_ms"]), float(row["torch_compile_bwd_ms"]))
            times = (p.fused_fwd_ms, p.fused_bwd_ms, p.torch_fwd_ms, p.torch_bwd_ms, p.compiled_fwd_ms, p.compiled_bwd_ms)
            if min(p.rows, p.hidden) < 1 or not min(times) > 0:
                raise ModelcutError(f"kernel_checks.toml {e['id']}: a point needs positive sizes and times, got {row}")
            points.append(p)
        if not points:
            raise ModelcutError(f"kernel_checks.toml {e['id']}: no rows in {e['file']}")
        out.append(NormSweep(e["id"], _device(e), e["kernel"], tuple(points), e["source"], str(e.get("date", ""))))
    return tuple(out)
