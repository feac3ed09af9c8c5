"""Step-time models: how long one optimizer step takes for a run on some hardware.

Two *modes*, each a complete set of assumptions: ``"seed"``, the deck's model, frozen once it
reproduced the deck (:mod:`.seed`, one constant η passed in), and ``"default"``, modelcut's own
model built from kernels, the simulated pipeline and the framework's overlaps
(:mod:`.default`, its constants and the training stack passed in). :func:`predict` dispatches.
"""

from __future__ import annotations

from dataclasses import replace

from ..costs.kernels import Efficiency
from ..errors import ModelcutError
from ..specs import Hardware, Run
from . import default, seed
from .frameworks import Framework
from .result import Prediction

#: The modes, with what each is.
MODES: dict[str, str] = {
    "seed": "the deck's model: one fitted constant η, nothing overlapped",
    "default": "modelcut's model: kernels by shape, the pipeline simulated, the framework's overlaps",
}


def predict(run: Run, hw: Hardware, mode: str = "default", *, eta: float | None = None,
            efficiency: Efficiency | None = None, framework: Framework | None = None,
            force_simulation: bool = False, timeline: bool = False) -> Prediction:
    """One run's step under ``mode``. The seed needs ``eta``; the default model ``efficiency``
    and ``framework`` (``eta``, when given, replaces its matrix-product fraction); ``timeline``
    keeps the default model's step as a timeline (:mod:`.timeline`)."""
    if mode not in MODES:
        raise ModelcutError(f"unknown mode {mode!r}; choose one of {', '.join(MODES)}")
    if eta is not None and (isinstance(eta, bool) or not isinstance(eta, (int, float)) or not 0 < eta <= 1):
        raise ModelcutError(f"eta must be in (0, 1], got {eta!r}")
    if mode == "seed":
        if eta is None:
            raise ModelcutError("the seed model needs η, the fraction of peak its matrix products reach")
        return seed.predict(run, hw, float(eta), force_simulation)
    if efficiency is None or framework is None:
        raise ModelcutError("the default model needs its fitted constants and a training stack")
    if eta is not None:
        efficiency = replace(efficiency, gemm=float(eta))
    return default.predict(run, hw, efficiency, framework, timeline)
