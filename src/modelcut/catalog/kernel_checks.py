"""Published kernel benchmarks to check the measured tables against (kernel_checks.toml)."""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, replace
from functools import lru_cache
from importlib import resources

from ..core.costs.kernels import at_peak
from ..core.errors import ModelcutError
from ..core.specs import Hardware
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


@lru_cache(maxsize=None)
def linear_checks() -> tuple[LinearCheck, ...]:
    rows = tomllib.loads(resources.files("modelcut.catalog").joinpath("kernel_checks.toml")
                        .read_text(encoding="utf-8")).get("linear", [])
    out = []
    for e in rows:
        unknown = set(e["measured_ms"]) - set(LINEAR_KINDS)
        if unknown:
            raise ModelcutError(f"kernel_checks.toml {e['id']}: unknown kinds {', '.join(sorted(unknown))}")
        out.append(LinearCheck(e["id"], _device(e), int(e["hidden"]), int(e["intermediate"]), int(e["tokens"]),
                               dict(e["measured_ms"]), e["source"], str(e.get("date", "")),
                               e.get("variant_source", "")))
    return tuple(out)
