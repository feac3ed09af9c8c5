"""The API's requests turned into the service's calls, with the app's bounds; the answers are the
service's JSON, the same the command line prints."""

from __future__ import annotations

import dataclasses
import itertools
import json
from functools import lru_cache
from typing import Any

from fastapi import HTTPException

from .. import catalog
from ..core.errors import ModelcutError
from ..core.explore import Space, structures
from ..core.sim.engine import Timing
from ..core.sim.run import PipelineResult
from ..core.plan import microbatches
from ..core.specs import ModelSpec, Run
from ..service import catalog_info, inputs, predict as service_predict, simulate as simulation, validation
from ..service.explore import ExploreRequest, run_explore
from ..service.mesh import build_mesh, mesh_json
from . import schemas

#: Up to this many ops the simulation runs in exact arithmetic (Fractions), like the CLI; beyond
#: it in floats, which are faster and agree to rounding.
EXACT_MAX_OPS = 50_000
#: Largest global batch, in tokens, an explorer search accepts (2^40, a trillion tokens per step).
MAX_TOKENS = 1 << 40


def simulate(req: schemas.SimulateRequest, max_ops: int) -> PipelineResult:
    sched = simulation.named_schedule(req.schedule, req.devices, req.microbatches, req.chunks, max_ops)
    return simulation.simulate(sched, Timing(req.forward, req.backward, req.weight, req.p2p), EXACT_MAX_OPS)


def catalog_listing() -> dict[str, Any]:
    out = catalog_info.listing()
    out.pop("frameworks")
    return out


def _check_model(spec: ModelSpec) -> None:
    """Refuse shapes beyond the app's bounds before any arithmetic overflows a float."""
    for name in ("hidden", "ffn_hidden", "heads", "kv_heads", "vocab", "head_dim", "experts", "expert_ffn_hidden"):
        val = getattr(spec, name, None)
        if isinstance(val, int) and val > schemas.MAX_WIDTH:
            raise ModelcutError(f"model {name} = {val:,} is beyond this app's limit of {schemas.MAX_WIDTH:,}")
    if spec.layers > schemas.MAX_LAYERS:
        raise ModelcutError(f"model layers = {spec.layers:,} is beyond this app's limit of {schemas.MAX_LAYERS:,}")


def resolve_model(req: schemas.ModelChoice) -> ModelSpec:
    spec = inputs.model_choice(req.model, req.hf_config, req.model_spec)
    _check_model(spec)
    return spec


def _check_pipeline_work(layers: int, microbatches: int, max_ops: int) -> None:
    """A prediction simulates at most (layers + 2) stages × m micro-batches × 3 op kinds."""
    ops = (layers + 2) * microbatches * 3
    if ops > max_ops:
        raise ModelcutError(f"{microbatches:,} micro-batches through {layers:,} layers may need {ops:,} simulated "
                            f"ops; the limit is {max_ops:,} ops per simulation")


def predict(req: schemas.PredictRequest, max_ops: int) -> dict:
    spec = resolve_model(req)
    hw = catalog.hardware(req.gpu)
    layout = catalog.layout_from_table(req.layout.model_dump(exclude_none=True), "layout")
    training = catalog.training_from_table(req.training.model_dump(), "training")
    if layout.gpus > schemas.MAX_GPUS:
        raise ModelcutError(f"tp·cp·pp·dp = {layout.gpus:,} GPUs is beyond this app's limit of {schemas.MAX_GPUS:,}")
    run = Run(model=spec, gpu=hw.name, layout=layout, training=training, gpus_per_node=req.gpus_per_node, name="web")
    _check_pipeline_work(spec.layers, microbatches(layout, training), max_ops)
    return service_predict.predict(service_predict.PredictRequest(
        run, mode=req.mode, eta=req.eta, framework=req.framework, overlap=req.overlap)).as_dict()


def explore(req: schemas.ExploreRequest, max_ops: int, max_layouts: int) -> dict:
    spec = resolve_model(req)
    hw = catalog.hardware(req.gpu)
    tokens = inputs.parse_tokens(req.global_batch_tokens)
    if not 1 <= tokens <= MAX_TOKENS:
        raise ModelcutError(f"global_batch_tokens must be between 1 and {MAX_TOKENS:,}, got {tokens:,}")
    if tokens % req.seq:
        raise ModelcutError(f"global batch of {tokens:,} tokens is not a whole number of {req.seq:,}-token sequences")
    gb = tokens // req.seq
    _check_pipeline_work(spec.layers, gb, max_ops)
    kw: dict[str, Any] = {}
    if req.schedules is not None:
        kw["schedules"] = tuple(dict.fromkeys(req.schedules))
    if req.micro_batches is not None:
        if any(b < 1 for b in req.micro_batches):
            raise ModelcutError("micro_batches must be positive integers")
        kw["micro_batches"] = tuple(sorted(set(req.micro_batches)))
    space = Space(allow_tp_across_nodes=req.allow_tp_across_nodes, **kw)
    variants = len(space.recomputes) * len(space.zeros)
    gpn = req.gpus_per_node or hw.per_node
    # Count the space before searching it: stop counting one past the bound.
    cap = max_layouts // variants + 1
    n = sum(1 for _ in itertools.islice(structures(spec, req.gpus, req.seq, gb, gpn, space), cap))
    if n * variants > max_layouts:
        raise ModelcutError(f"the explorer space holds more than {max_layouts:,} layouts (structures × "
                            f"recomputation × ZeRO stage), the limit per search: fix schedules or micro_batches, "
                            f"or use the command line (modelcut explore)")
    result = run_explore(ExploreRequest(spec, hw, req.gpus, req.seq, tokens, req.gpus_per_node, req.mode,
                                        req.framework, req.margin, space, top=req.top,
                                        check=req.check))
    return result.as_dict()


def mesh(req: schemas.MeshRequest) -> dict:
    m = build_mesh(req.tp, req.cp, req.pp, req.dp, req.ep, ",".join(req.order) if req.order else None)
    if m.world > schemas.MAX_GPUS:
        raise ModelcutError(f"tp·cp·pp·dp = {m.world:,} ranks is beyond this app's limit of {schemas.MAX_GPUS:,}")
    return mesh_json(m, req.rank, req.gpus_per_node)


@lru_cache(maxsize=8)
def runs(mode: str = "seed", which: str = "deck") -> dict:
    """The validation table (cached: the catalog is package data)."""
    return validation.runs_page(mode, which)


def read_config(data: bytes, filename: str = "config.json") -> dict:
    """An uploaded config.json: JSON, an object, an architecture modelcut reads."""
    try:
        cfg = json.loads(data.decode("utf-8"))
    except UnicodeDecodeError:
        raise HTTPException(400, f"{filename} is not UTF-8 text") from None
    except json.JSONDecodeError as exc:
        raise HTTPException(400, f"{filename} is not valid JSON ({exc.msg}, line {exc.lineno})") from None
    if not isinstance(cfg, dict):
        raise ModelcutError(f"{filename} must hold a JSON object, the model's configuration")
    spec = resolve_model(schemas.ModelChoice(hf_config=cfg))
    return {"model": dataclasses.asdict(spec), "hf_config": cfg}
