"""Fitted profiles for the default model.

A *profile* (``default.toml`` here, or any file ``modelcut calibrate --out`` writes) holds the
default model's constants (:class:`modelcut.core.costs.kernels.Efficiency`), which of them were
fitted, the runs they were fitted on, the fit's errors, and the constants of each
leave-one-source-out fold. The shipped profile is shared by every accelerator (``hardware =
"*"``): what differs between accelerators comes from their datasheets and measured kernel tables,
not from constants. A user's profile may name one accelerator.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass
from functools import lru_cache
from importlib import resources
from pathlib import Path

from ...core.costs.kernels import NAMES, Efficiency
from ...core.errors import ModelcutError, NESTED_TOML
from ...core.specs import Hardware

__all__ = ["Profile", "profile_for", "load_profile", "all_profiles", "applies", "EVERY"]


@dataclass(frozen=True)
class Profile:
    """Constants for one accelerator and where they come from."""

    hardware: str
    efficiency: Efficiency
    fitted: tuple[str, ...]
    runs: tuple[str, ...]
    source: str = ""
    inherits: str = ""            # the profile the unfitted constants were taken from
    mean_abs_error_pct: float | None = None
    max_abs_error_pct: float | None = None
    path: str = ""
    errors_pct: tuple[tuple[str, float], ...] = ()
    #: leave-one-group-out: (group, gemm, mem, net, runs, mean |error| %, largest |error| %)
    cv: tuple[tuple[str, float, float, float, int, float, float], ...] = ()


def _profile_from_table(data: dict, where: str) -> Profile:
    for k in ("hardware", "gemm", "mem", "net"):
        if k not in data:
            raise ModelcutError(f"{where}: missing {k!r}")
    try:
        eff = Efficiency(float(data["gemm"]), float(data["mem"]), float(data["net"]))
    except (TypeError, ValueError):
        raise ModelcutError(f"{where}: gemm, mem and net must be numbers") from None
    fitted = tuple(data.get("fitted", ()))
    for k in fitted:
        if k not in NAMES:
            raise ModelcutError(f"{where}: fitted names unknown constant {k!r}")
    cv = []
    for g, row in (data.get("cv") or {}).items():
        try:
            cv.append((str(g), float(row["gemm"]), float(row["mem"]), float(row["net"]), int(row["runs"]),
                       float(row["mean_abs_error_pct"]), float(row["max_abs_error_pct"])))
        except (KeyError, TypeError, ValueError):
            raise ModelcutError(f"{where}: [cv.{g}] needs gemm, mem, net, runs, mean_abs_error_pct, "
                                "max_abs_error_pct") from None
    errs = tuple((str(k), float(v)) for k, v in (data.get("errors_pct") or {}).items())
    return Profile(str(data["hardware"]), eff, fitted, tuple(data.get("runs", ())), str(data.get("source", "")),
                   str(data.get("inherits", "")), data.get("mean_abs_error_pct"), data.get("max_abs_error_pct"),
                   where, errs, tuple(cv))


@lru_cache(maxsize=None)
def all_profiles() -> tuple[Profile, ...]:
    """The profiles shipped with modelcut."""
    out = []
    for entry in sorted(resources.files(__package__).iterdir(), key=lambda e: e.name):
        if entry.name.endswith(".toml"):
            out.append(_profile_from_table(tomllib.loads(entry.read_text(encoding="utf-8")),
                                           f"profiles/{entry.name}"))
    return tuple(out)


#: ``hardware`` of a profile that applies to every accelerator.
EVERY = "*"


def applies(profile: Profile, hw: Hardware | str) -> bool:
    """Whether a profile's constants are for this accelerator (a shared profile is for all)."""
    name = hw.name if isinstance(hw, Hardware) else str(hw)
    return profile.hardware in (EVERY, name)


def profile_for(hw: Hardware | str) -> Profile:
    """The shipped profile for an accelerator: its own where one is shipped, else the shared one."""
    name = hw.name if isinstance(hw, Hardware) else str(hw)
    profiles = {p.hardware: p for p in all_profiles()}
    if name in profiles:
        return profiles[name]
    if EVERY not in profiles:
        raise ModelcutError(f"no fitted profile for {name} and no shared profile")
    return profiles[EVERY]


def load_profile(path: str | Path) -> Profile:
    """A profile file (as ``modelcut calibrate --out`` writes it)."""
    p = Path(path)
    try:
        data = tomllib.loads(p.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ModelcutError(f"{p}: no such file") from None
    except tomllib.TOMLDecodeError as exc:
        raise ModelcutError(f"{p}: not valid TOML ({exc})") from None
    except RecursionError:
        raise ModelcutError(f"{p}: not valid TOML ({NESTED_TOML})") from None
    return _profile_from_table(data, str(p))
