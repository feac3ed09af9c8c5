"""Fitting the default model's constants as ``modelcut calibrate`` does: on the catalog's published
runs (one accelerator) or a user's CSV, with the leave-one-group-out table and the profile text
to write."""

from __future__ import annotations

from dataclasses import dataclass, replace
from pathlib import Path
from typing import Any, Callable, Optional

from .. import catalog
from ..analysis import calibrate as cal
from ..analysis.measured import Measured, catalog_measured
from ..analysis.validation import profile_text
from ..catalog import Profile
from ..core.costs.kernels import NAMES
from ..core.errors import ModelcutError
from .limits import Limits
from .requests import CalibrateInput, parse
from .runs_csv import read_runs_csv


@dataclass
class CalibrateResult:
    hardware: str
    names: tuple[str, ...]
    measured: list[Measured]
    base: Profile
    fit: cal.Fit
    folds: dict[str, dict]
    text: str           # the profile as TOML
    weigh: str = "runs"

    @property
    def loso(self) -> dict[str, Any] | None:
        """The leave-one-source-out errors over every run (:func:`..analysis.calibrate.folds_summary`);
        None without cross-validation."""
        return cal.folds_summary(self.folds) if self.folds else None

    def as_dict(self) -> dict[str, Any]:
        return {"hardware": self.hardware, "fitted": list(self.names), "weigh": self.weigh,
                "efficiency": dict(zip(NAMES, self.fit.efficiency.as_tuple())),
                "runs": self.fit.errors_pct, "mean_abs_error_pct": self.fit.mean_abs_pct,
                "max_abs_error_pct": self.fit.max_abs_pct,
                "cross_validation": {g: {"efficiency": dict(zip(NAMES, f["efficiency"].as_tuple())),
                                         "errors_pct": f["errors_pct"]} for g, f in self.folds.items()},
                "cross_validation_summary": self.loso}


#: The constants the model fits (:data:`..analysis.calibrate.FITTED`), as ``--fit`` spells them.
FITTED = ",".join(cal.FITTED)

Progress = Callable[[int, Optional[int], str], None]


def _counting(progress: Progress | None, label: list[str]):
    """The default predictor, reporting each prediction: (predictions so far, None, what runs)."""
    if progress is None:
        return None
    done = [0]

    def predictor(meas, eff):
        done[0] += 1
        if done[0] % 5 == 0:
            progress(done[0], None, label[0])
        return cal.default_predictor(meas, eff)
    return predictor


def calibrate(runs: Path | None = None, gpu: str | None = None, fit_names: str = FITTED,
              base: str | None = None, cv: bool = True, progress: Progress | None = None,
              limits: Limits | None = None, weigh: str = "runs") -> CalibrateResult:
    """Fit the named constants by least squares (:func:`..analysis.calibrate.fit`), the runs
    weighed as ``weigh`` says (each run alike, or each source); ``progress`` hears (predictions
    made, None, what is being fitted) as it goes."""
    names = tuple(x.strip() for x in fit_names.split(",") if x.strip())
    if not names:
        raise ModelcutError("--fit names no constant")
    for k in names:
        if k not in NAMES:
            raise ModelcutError(f"unknown constant {k!r} in --fit; choose among {', '.join(NAMES)}")
    parse(CalibrateInput, {"fit": list(names), "gpu": gpu.lower() if gpu else None, "cv": cv, "weigh": weigh},
          names={"fit": "--fit", "gpu": "--gpu", "weigh": "--weigh"})
    if runs is not None:
        measured = read_runs_csv(runs, limits)
        if gpu:
            want = catalog.hardware(gpu).name
            measured = [m for m in measured if m.hw.name == want]
    else:
        measured = catalog_measured(gpu)
    if not measured:
        raise ModelcutError("no runs on that accelerator")
    hws = sorted({m.hw.name for m in measured})
    hw_name = hws[0] if len(hws) == 1 else catalog.profiles.EVERY   # one accelerator's runs: its own profile
    if base is None:
        base_prof = catalog.profile_for(hw_name)
    elif base.endswith(".toml"):
        base_prof = catalog.load_profile(base)
    else:
        base_prof = catalog.profile_for(catalog.hardware(base).name)
    label = [f"fitting {', '.join(names)} on {len(measured)} runs of {len({m.family for m in measured})} sources"]
    predictor = _counting(progress, label)
    # the base profile gives the constants not fitted; the fitted ones start where every fit
    # starts (cal.START), so the result depends on the runs alone, not on the profile shipped
    # before it, and a rerun writes the same file
    start = replace(base_prof.efficiency, **{k: getattr(cal.START, k) for k in names})
    result = cal.fit(measured, names, start, predictor, weigh=weigh)
    folds = {}
    if cv:
        label[0] = f"leave one source out: {len({m.family for m in measured})} sources refitted"
        folds = cal.leave_one_family_out(measured, names, start, predictor, weigh=weigh)
    inherits = base_prof.hardware if set(names) != set(NAMES) else ""
    source = f"modelcut calibrate on {len(measured)} runs" + (f" ({runs.name})" if runs is not None else " (catalog: the published runs of shared/reference/published-runs*.md)")
    if weigh != "runs":
        source += f", each of {len({m.family for m in measured})} sources weighed alike (--weigh {weigh})"
    text = profile_text(hw_name, result, inherits=inherits, source=source, folds=folds)
    return CalibrateResult(hw_name, names, measured, base_prof, result, folds, text, weigh)
