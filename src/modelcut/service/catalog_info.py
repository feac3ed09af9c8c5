"""What the faces list: schedules with their traits, accelerators, models, frameworks, modes."""

from __future__ import annotations

import dataclasses
from typing import Any

from .. import catalog
from ..core.sim import registry
from ..core.specs import FP8_RECIPES, PRECISIONS
from ..core.step import MODES


def schedules() -> list[dict[str, Any]]:
    """Every schedule of the registry: name, default and fixed chunks, split backward, whether the
    explorer searches it unless told otherwise, summary."""
    return [{"name": s.name, "default_chunks": s.default_chunks, "chunks_fixed": s.fixed_chunks,
             "split_backward": s.split_backward, "explored_by_default": s.explored_by_default,
             "doc": s.summary} for s in registry.SCHEDULES.values()]


def schedule_help() -> str:
    """The schedules for a ``--schedule`` help line."""
    return ", ".join(registry.names()) + ", or torch:<Class> (modelcut[torch]) for torch's own"


def listing() -> dict[str, Any]:
    return {"schedules": schedules(), "hardware": [h.as_dict() for h in catalog.all_hardware()],
            "models": [dataclasses.asdict(m) for m in catalog.all_models()], "modes": list(MODES),
            "frameworks": list(catalog.framework_names()),
            "default_framework": catalog.default_framework(),
            "precisions": list(PRECISIONS), "fp8_recipes": list(FP8_RECIPES)}
