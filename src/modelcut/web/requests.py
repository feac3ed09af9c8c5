"""The API's requests turned into the service's calls, under the app's limits; the answers are the
service's JSON, the same the command line prints. The request bodies arrive validated by their
models (:mod:`modelcut.service.requests`); the rules across fields and the caps on work are the
service's."""

from __future__ import annotations

import dataclasses
import json
from functools import lru_cache
from typing import Any

from fastapi import HTTPException

from ..core.errors import ModelcutError, NESTED_JSON
from ..core.sim.run import PipelineResult
from ..export import chrome_trace
from ..service import catalog_info, inputs, predict as service_predict, simulate as simulation, validation
from ..service.explore import explore_input
from ..service.limits import Limits
from ..service.mesh import mesh_input
from ..service.requests import ExploreInput, MeshInput, ModelChoice, PredictInput, SimulateInput

#: Up to this many ops the simulation runs in exact arithmetic (Fractions), like the CLI; beyond
#: it in floats, which are faster and agree to rounding.
EXACT_MAX_OPS = 50_000
#: Simulations of more ops run in the worker pool, like searches; smaller ones in the server.
POOLED_FROM_OPS = 100_000


def simulate(req: SimulateInput, limits: Limits) -> simulation.Simulation:
    return simulation.simulate_input(req, limits, EXACT_MAX_OPS)


def simulate_result(req: SimulateInput, limits: Limits) -> PipelineResult:
    return simulate(req, limits).result


def pooled(req: SimulateInput, limits: Limits) -> bool:
    """Whether a simulation is long enough for the worker pool (refusals over the cap included:
    :func:`simulate` answers them at once)."""
    ops = simulation.op_estimate(req)
    return POOLED_FROM_OPS < ops <= limits.max_ops


def catalog_listing() -> dict[str, Any]:
    return catalog_info.listing()


def predict(req: PredictInput, limits: Limits) -> dict:
    return service_predict.predict_input(req, limits).as_dict()


#: The most spans a step's trace the server writes (``POST /api/predict/trace``); ``modelcut predict
#: --trace`` writes any.
MAX_TRACE_SPANS = 200_000


def predict_trace(req: PredictInput, limits: Limits) -> dict:
    """The predicted step as a Chrome trace (``modelcut predict --trace``), refused in one line
    over :data:`MAX_TRACE_SPANS` spans."""
    result = service_predict.predict_input(req, limits, timeline=True)
    spans = len(result.prediction.timeline)
    if spans > MAX_TRACE_SPANS:
        raise ModelcutError(f"the step's trace holds {spans:,} spans, over the server's {MAX_TRACE_SPANS:,}: "
                            "write it with modelcut predict --trace")
    return chrome_trace.step_trace(result.prediction.timeline, result.trace_label(), result.trace_metadata())


def explore_checks(req: ExploreInput, limits: Limits) -> None:
    """Every refusal of a search that comes before it (a check no layout can be, a space over
    the cap): the server answers them before queueing."""
    explore_input(req, limits, search=False)


def explore(req: ExploreInput, limits: Limits) -> dict:
    return explore_input(req, limits).as_dict()


def mesh(req: MeshInput, limits: Limits) -> dict:
    return mesh_input(req, limits)[1]


@lru_cache(maxsize=8)
def runs(mode: str = "seed", which: str = "deck") -> dict:
    """The validation table (cached: the catalog is package data)."""
    return validation.runs_page(mode, which)


def published_run(run_id: str, mode: str, layers: bool, limits: Limits) -> dict:
    """One published run predicted as validate predicts it (``modelcut predict --run ID --json``)."""
    return service_predict.published_prediction(run_id, mode, layers, limits).as_dict()


def kernel_checks() -> dict:
    """The kernel tables against published kernel benchmarks (``modelcut validate --kernels``)."""
    return validation.kernel_rows()


def read_config(data: bytes, filename: str, limits: Limits) -> dict:
    """An uploaded config.json: JSON, an object, an architecture modelcut reads."""
    try:
        cfg = json.loads(data.decode("utf-8"))
    except UnicodeDecodeError:
        raise HTTPException(400, f"{filename} is not UTF-8 text") from None
    except json.JSONDecodeError as exc:
        raise HTTPException(400, f"{filename} is not valid JSON ({exc.msg}, line {exc.lineno})") from None
    except RecursionError:
        raise HTTPException(400, f"{filename} is not valid JSON ({NESTED_JSON})") from None
    if not isinstance(cfg, dict):
        raise ModelcutError(f"{filename} must hold a JSON object, the model's configuration")
    choice = ModelChoice(hf_config=cfg)
    spec = inputs.model_choice(choice.model, choice.hf_config, choice.model_spec, limits)
    return {"model": dataclasses.asdict(spec), "hf_config": cfg}
