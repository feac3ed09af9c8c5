"""The FastAPI application behind ``modelcut serve``.

Pages: ``/`` (pipeline animation), ``/explorer`` (layout explorer), ``/runs`` (published runs).
JSON API (schema at ``/openapi.json``): ``POST /api/simulate``, ``POST /api/predict``,
``POST /api/explore``, ``POST /api/upload-config``, ``GET /api/runs``, ``GET /api/catalog``.

Bad input never answers 500: a :class:`~modelcut.core.errors.ModelcutError` becomes 422 with
``{"detail": message}``, a body that is not JSON 400, a body over :data:`MAX_BODY_BYTES` 413,
and work beyond the limits below 422 with a message naming the limit. The app holds no formula:
it calls the core and the exporters in :mod:`modelcut.faces`.
"""

from __future__ import annotations

import dataclasses
import functools
import importlib
import json
from importlib import resources
from typing import Any

from typing import Literal

from fastapi import File, FastAPI, HTTPException, Query, Request, UploadFile
from fastapi.exceptions import RequestValidationError
from fastapi.responses import FileResponse, JSONResponse, Response
from fastapi.staticfiles import StaticFiles

from ..core.engine import Timing
from ..core.errors import ModelcutError
from ..core.pipeline import exact_timing, run
from ..core.overlap import DEFAULT_FRAMEWORK
from ..core import schedules as _schedules
from ..core.schedules import DEFAULT_CHUNKS, build
from ..faces import pipeline_json
from . import schemas

#: Most ops one simulation may have (p·v·m·kinds); beyond it the answer would take seconds and
#: hundreds of megabytes.
MAX_OPS = 1_000_000
#: Up to this many ops the simulation runs in exact arithmetic (Fractions), like the CLI; beyond
#: it in floats, which are faster and agree to rounding.
EXACT_MAX_OPS = 50_000
#: Largest request body (JSON or uploaded config.json) accepted.
MAX_BODY_BYTES = 1_000_000
#: Most candidate layouts (structures × recomputation × ZeRO stage) one explorer search may cover;
#: Llama 3 405B on 8,192 GPUs covers about 19,000.
MAX_LAYOUTS = 50_000
#: Largest global batch, in tokens, an explorer search accepts (2^40, a trillion tokens per step).
MAX_TOKENS = 1 << 40

STATIC = resources.files("modelcut.web") / "static"

ERRORS = {400: {"model": schemas.ErrorResponse}, 413: {"model": schemas.ErrorResponse},
          422: {"model": schemas.ErrorResponse}}


class BodyTooLarge(HTTPException):
    def __init__(self, limit: int) -> None:
        super().__init__(413, f"request body over the limit of {limit:,} bytes")


class BodyLimit:
    """ASGI middleware: refuse bodies over ``limit`` bytes, by Content-Length and as they stream."""

    def __init__(self, app, limit: int = MAX_BODY_BYTES):
        self.app, self.limit = app, limit

    async def __call__(self, scope, receive, send):
        if scope["type"] != "http":
            return await self.app(scope, receive, send)
        for key, val in scope.get("headers", ()):
            if key == b"content-length":
                try:
                    n = int(val)
                except ValueError:
                    n = -1
                if n < 0 or n > self.limit:
                    msg = (BodyTooLarge(self.limit).detail if n > self.limit else "malformed Content-Length header")
                    resp = JSONResponse({"detail": msg}, status_code=413 if n > self.limit else 400)
                    return await resp(scope, receive, send)
        seen = 0

        async def limited():
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > self.limit:
                    raise BodyTooLarge(self.limit)
            return message

        return await self.app(scope, limited, send)


def _one_line(exc: RequestValidationError) -> tuple[int, str]:
    """A validation error as (status, one line): 400 for a body that is not JSON, else 422."""
    parts = []
    status = 422
    for err in exc.errors():
        loc = ".".join(str(x) for x in err.get("loc", ()) if x != "body")
        if err.get("type") == "json_invalid":
            status = 400
            ctx = err.get("ctx", {}).get("error", "")
            parts.append(f"body is not valid JSON{': ' + str(ctx) if ctx else ''}")
            continue
        msg = err.get("msg", "invalid")
        parts.append(f"{loc}: {msg}" if loc else msg)
    return status, "; ".join(parts) or "invalid request"


def all_schedules() -> dict:
    """Every schedule ``build`` knows (the overlapped DualPipe family too, where the core has it)."""
    return getattr(_schedules, "ALL_SCHEDULES", _schedules.SCHEDULES)


#: Sizes tried, smallest first, to find ones a schedule accepts (DualPipe wants an even p and m ≥ 2p).
_PROBES = ((1, 1), (2, 4), (4, 8), (4, 16))


@functools.lru_cache(maxsize=1)
def _schedule_info() -> tuple[schemas.ScheduleInfo, ...]:
    out = []
    for name, fn in all_schedules().items():
        v = DEFAULT_CHUNKS[name]
        sched = None
        for p, m in _PROBES:
            try:
                sched = build(name, p, m, v)
                break
            except ModelcutError:
                continue
        fixed = True
        if sched is not None:
            try:  # does the schedule take another chunk count?
                build(name, sched.devices, sched.microbatches, v + 1)
                fixed = False
            except ModelcutError:
                pass
        para = " ".join((fn.__doc__ or "").strip().split("\n\n")[0].split())
        doc = para if len(para) <= 160 else para[:159].rsplit(" ", 1)[0] + " …"
        out.append(schemas.ScheduleInfo(name=name, default_chunks=v, chunks_fixed=fixed,
                                        split_backward=bool(sched is not None and sched.split_backward), doc=doc))
    return tuple(out)


def simulate_request(req: schemas.SimulateRequest, max_ops: int = MAX_OPS):
    """Build and simulate the requested schedule, refusing work beyond ``max_ops`` ops."""
    name = req.schedule
    if name not in all_schedules():
        build(name, 1, 1)  # raises the core's message naming the known schedules
    v = req.chunks if req.chunks is not None else DEFAULT_CHUNKS[name]
    info = {i.name: i for i in _schedule_info()}[name]
    # Ops per stage and micro-batch: F and B, and W with a split backward. ZB-V builds its order
    # for max(m, 2p − 1) micro-batches and drops the extra ones (as torch does).
    built_m = max(req.microbatches, 2 * req.devices - 1) if name == "zbv" else req.microbatches
    ops = req.devices * v * built_m * (3 if info.split_backward else 2)

    def refuse(n: int):
        return ModelcutError(f"{name} with p = {req.devices}, m = {req.microbatches}, v = {v} needs {n:,} ops; "
                             f"the limit is {max_ops:,} ops per simulation")
    if ops > max_ops:
        raise refuse(ops)
    sched = build(name, req.devices, req.microbatches, req.chunks)
    if sched.num_ops > max_ops:
        raise refuse(sched.num_ops)
    timing = Timing(req.forward, req.backward, req.weight, req.p2p)
    if sched.num_ops <= EXACT_MAX_OPS:
        timing = exact_timing(timing)
    return run(sched, timing)


def _json(obj: Any) -> Response:
    try:
        text = json.dumps(obj, allow_nan=False)
    except ValueError:
        raise ModelcutError("the answer overflows a float: use smaller times") from None
    return Response(text, media_type="application/json")


def _page(name: str):
    def page() -> FileResponse:
        return FileResponse(str(STATIC / name), media_type="text/html")
    return page


def create_app(*, max_ops: int = MAX_OPS, max_layouts: int = MAX_LAYOUTS,
               max_body_bytes: int = MAX_BODY_BYTES) -> FastAPI:
    """The web app: pages, static files and the JSON API, with its limits (tests lower them)."""
    app = FastAPI(
        title="modelcut",
        version="0.1.0",
        description="Cut a large model across many accelerators: pipeline simulation, training-systems "
                    "model, layout explorer.",
        docs_url=None, redoc_url=None,  # their pages load scripts from a CDN; the schema is at /openapi.json
    )
    app.add_middleware(BodyLimit, limit=max_body_bytes)

    @app.middleware("http")
    async def no_network(request: Request, call_next):
        response = await call_next(request)
        # Everything the pages use is served from here: forbid any other origin.
        response.headers.setdefault(
            "Content-Security-Policy",
            "default-src 'self'; img-src 'self' data:; object-src 'none'; frame-ancestors 'self'")
        response.headers.setdefault("X-Content-Type-Options", "nosniff")
        return response

    @app.exception_handler(ModelcutError)
    async def modelcut_error(request: Request, exc: ModelcutError):
        return JSONResponse({"detail": str(exc)}, status_code=422)

    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, exc: RequestValidationError):
        status, line = _one_line(exc)
        return JSONResponse({"detail": line}, status_code=status)

    app.mount("/static", StaticFiles(directory=str(STATIC)), name="static")
    for path, name in (("/", "index.html"), ("/explorer", "explorer.html"), ("/runs", "runs.html")):
        app.add_api_route(path, _page(name), methods=["GET"], include_in_schema=False)

    @app.post("/api/simulate", response_model=None,
              responses={200: {"model": schemas.SimulateResponse}, **ERRORS},
              summary="Simulate a pipeline schedule (the answer of `modelcut simulate --json`)")
    def api_simulate(req: schemas.SimulateRequest) -> Response:
        result = simulate_request(req, max_ops)
        return _json(pipeline_json.to_dict(result))

    @app.get("/api/catalog", response_model=schemas.CatalogResponse,
             summary="Schedules, accelerators and model shapes the app knows, and its limits")
    def api_catalog() -> schemas.CatalogResponse:
        hardware: list[dict] = []
        models: list[dict] = []
        cat = _catalog()
        if hasattr(cat, "all_hardware"):
            hardware = [dataclasses.asdict(h) for h in cat.all_hardware()]
        if hasattr(cat, "all_models"):
            models = [dataclasses.asdict(m) for m in cat.all_models()]
        stepmodel = _optional("modelcut.core.stepmodel")
        modes = list(getattr(stepmodel, "MODES", ()))
        return schemas.CatalogResponse(
            schedules=list(_schedule_info()), hardware=hardware, models=models, modes=modes,
            limits={"max_ops": max_ops, "max_body_bytes": max_body_bytes, "max_layouts": max_layouts})

    @app.post("/api/predict", response_model=schemas.PredictResponse, responses=ERRORS,
              summary="Predict one run's step time, throughput, breakdown and memory (`modelcut predict --json`)")
    def api_predict(req: schemas.PredictRequest) -> dict:
        return predict_request(req, max_ops)

    @app.post("/api/explore", response_model=schemas.ExploreResponse, responses=ERRORS,
              summary="Rank the layouts that fit (`modelcut explore --json`)")
    def api_explore(req: schemas.ExploreRequest) -> dict:
        return explore_request(req, max_ops, max_layouts)

    @app.post("/api/mesh", response_model=schemas.MeshResponse, responses=ERRORS,
              summary="A rank's coordinates and groups, and which groups leave a node (`modelcut mesh --json`)")
    def api_mesh(req: schemas.MeshRequest) -> dict:
        return mesh_request(req)

    @app.get("/api/runs", response_model=schemas.RunsResponse, responses=ERRORS,
             summary="The validation table: the systems model against published runs (`modelcut validate`)")
    def api_runs(mode: str = Query("seed", min_length=1, max_length=32),
                 set: Literal["deck", "all"] = Query("deck", description="the deck's rows, or every run")) -> dict:
        return runs_table(mode, set)

    @app.post("/api/upload-config", response_model=schemas.UploadResponse, responses=ERRORS,
              summary="Read a Hugging Face config.json (multipart upload, at most 1 MB)")
    async def api_upload(file: UploadFile = File(..., description="a Hugging Face config.json")) -> dict:
        data = await file.read()
        return read_config(data, file.filename or "config.json")

    return app


def _catalog():
    """The catalog package, or None while it is not installed."""
    return _optional("modelcut.catalog")


def _optional(module: str):
    """A module another part of modelcut provides, or None while it does not exist."""
    try:
        return importlib.import_module(module)
    except ModuleNotFoundError as exc:
        if exc.name != module:
            raise
        return None


# --- the systems model --------------------------------------------------------------------------------

def _need(module: str):
    mod = _optional(module)
    if mod is None:
        raise ModelcutError(f"this build of modelcut has no {module.rsplit('.', 1)[-1]} module")
    return mod


def _check_model(spec) -> None:
    """Refuse shapes beyond the app's bounds before any arithmetic overflows a float."""
    for name in ("hidden", "ffn_hidden", "heads", "kv_heads", "vocab", "head_dim", "experts",
                 "expert_ffn_hidden"):
        val = getattr(spec, name, None)
        if isinstance(val, int) and val > schemas.MAX_WIDTH:
            raise ModelcutError(f"model {name} = {val:,} is beyond this app's limit of {schemas.MAX_WIDTH:,}")
    if spec.layers > schemas.MAX_LAYERS:
        raise ModelcutError(f"model layers = {spec.layers:,} is beyond this app's limit of {schemas.MAX_LAYERS:,}")


def resolve_model(req: schemas.ModelChoice):
    """The request's model: a catalog name, a config.json object or the fields, exactly one."""
    cat = _need("modelcut.catalog")
    given = [k for k in ("model", "hf_config", "model_spec") if getattr(req, k) is not None]
    if len(given) != 1:
        raise ModelcutError("give exactly one of model (a catalog name), hf_config (a config.json object) "
                            f"or model_spec (the fields); got {', '.join(given) or 'none'}")
    try:
        if req.model is not None:
            spec = cat.model(req.model)
        elif req.hf_config is not None:
            spec = cat.model_from_hf_config(req.hf_config)
        else:
            spec = cat.model_from_table(req.model_spec, name=str(req.model_spec.get("name", "model")),
                                        where="model_spec")
    except ModelcutError:
        raise
    except (TypeError, ValueError, KeyError, AttributeError) as exc:
        # A field of the wrong type deep inside the file: still the user's input, still one line.
        what = "config.json" if req.hf_config is not None else "model_spec"
        raise ModelcutError(f"{what}: a field has the wrong type ({exc})") from None
    _check_model(spec)
    return spec


def _check_pipeline_work(layers: int, microbatches: int, max_ops: int) -> None:
    """A prediction simulates at most (layers + 2) stages × m micro-batches × 3 op kinds."""
    ops = (layers + 2) * microbatches * 3
    if ops > max_ops:
        raise ModelcutError(f"{microbatches:,} micro-batches through {layers:,} layers may need {ops:,} simulated "
                            f"ops; the limit is {max_ops:,} ops per simulation")


def predict_request(req: schemas.PredictRequest, max_ops: int = MAX_OPS) -> dict:
    cat = _need("modelcut.catalog")
    stepmodel = _need("modelcut.core.stepmodel")
    from ..core.specs import Run

    spec = resolve_model(req)
    hw = cat.hardware(req.gpu)
    layout = cat.layout_from_table(req.layout.model_dump(exclude_none=True), "layout")
    training = cat.training_from_table(req.training.model_dump(), "training")
    if layout.gpus > schemas.MAX_GPUS:
        raise ModelcutError(f"tp·cp·pp·dp = {layout.gpus:,} GPUs is beyond this app's limit of {schemas.MAX_GPUS:,}")
    run = Run(model=spec, gpu=hw.name, layout=layout, training=training, gpus_per_node=req.gpus_per_node,
              name="web")
    stepmodel.check_run(run)
    _check_pipeline_work(spec.layers, stepmodel.microbatches(run), max_ops)
    pred = stepmodel.predict(run, hw, req.mode, req.eta)
    out = pred.as_dict()
    memory = _optional("modelcut.core.memory")
    # The default mode predicts a Megatron-core-style stack (overlap.DEFAULT_FRAMEWORK): count
    # memory for the same stack (its distributed optimizer, FlashAttention).
    fw = DEFAULT_FRAMEWORK if req.mode == "default" else None
    out["memory"] = (memory.memory_report(run, hw, vpp=pred.vpp, schedule=pred.schedule, framework=fw)
                     if memory is not None else None)
    return out


def _why_json(why: dict) -> dict:
    return {"knobs": {k: list(v) for k, v in why["knobs"].items()},
            "step_time_s": list(why["step_time_s"]),
            "time_terms": [{"term": k, "best": a, "other": b, "difference": d} for k, a, b, d in why["time_terms"]],
            "memory_terms": [{"term": k, "best": a, "other": b, "difference": d}
                             for k, a, b, d in why["memory_terms"]]}


def explore_request(req: schemas.ExploreRequest, max_ops: int = MAX_OPS, max_layouts: int = MAX_LAYOUTS) -> dict:
    import itertools

    cat = _need("modelcut.catalog")
    ex = _need("modelcut.core.explore")
    spec = resolve_model(req)
    hw = cat.hardware(req.gpu)
    if isinstance(req.global_batch_tokens, str) and len(req.global_batch_tokens) > 32:
        raise ModelcutError("global_batch_tokens: write a number such as 16777216 or 16M")
    try:
        tokens = ex.parse_tokens(req.global_batch_tokens)
    except ModelcutError:
        raise
    except (OverflowError, ValueError):  # "1e400", "nan": not a count
        raise ModelcutError(f"cannot read a token count from {req.global_batch_tokens!r} (e.g. 16777216 or 16M)"
                            ) from None
    if not 1 <= tokens <= MAX_TOKENS:
        raise ModelcutError(f"global_batch_tokens must be between 1 and {MAX_TOKENS:,}, got {tokens:,}")
    if tokens % req.seq:
        raise ModelcutError(f"global batch of {tokens:,} tokens is not a whole number of {req.seq:,}-token sequences")
    gb = tokens // req.seq
    _check_pipeline_work(spec.layers, gb, max_ops)
    kw = {}
    if req.schedules is not None:
        kw["schedules"] = tuple(dict.fromkeys(req.schedules))
    if req.micro_batches is not None:
        if any(b < 1 for b in req.micro_batches):
            raise ModelcutError("micro_batches must be positive integers")
        kw["micro_batches"] = tuple(sorted(set(req.micro_batches)))
    space = ex.Space(allow_tp_across_nodes=req.allow_tp_across_nodes, **kw)
    variants = len(space.recomputes) * len(space.zeros)
    gpn = req.gpus_per_node or hw.per_node
    # Count the space before searching it: stop counting one past the bound.
    cap = max_layouts // variants + 1
    n = sum(1 for _ in itertools.islice(ex.structures(spec, req.gpus, req.seq, gb, gpn, space), cap))
    if n * variants > max_layouts:
        raise ModelcutError(f"the explorer space holds more than {max_layouts:,} layouts (structures × "
                            f"recomputation × ZeRO stage), the limit per search: fix schedules or micro_batches, "
                            f"or use the command line (modelcut explore)")
    found = ex.explore(spec, hw, gpus=req.gpus, seq=req.seq, global_batch_tokens=tokens,
                       gpus_per_node=req.gpus_per_node, mode=req.mode, margin=req.margin, space=space)
    top = found.layouts[:req.top]
    layouts = []
    for rank, e in enumerate(top, 1):
        d = e.as_dict()
        d["rank"] = rank
        d["microbatches"] = e.prediction.microbatches
        d["stage_layers"] = list(getattr(e.prediction, "stage_layers", ()))
        layouts.append(d)
    why = _why_json(ex.why(top[0], top[1])) if len(top) >= 2 else None
    return {"layouts": layouts, "summary": found.summary(), "why": why, "notes": list(found.notes),
            "model": dataclasses.asdict(spec), "hardware": dataclasses.asdict(hw)}


def mesh_request(req: schemas.MeshRequest) -> dict:
    mesh = _need("modelcut.core.mesh")
    m = mesh.Mesh.build(req.tp, req.cp, req.pp, req.dp, req.ep, req.order)
    if m.world > schemas.MAX_GPUS:
        raise ModelcutError(f"tp·cp·pp·dp = {m.world:,} ranks is beyond this app's limit of {schemas.MAX_GPUS:,}")
    gpn = req.gpus_per_node
    coords = m.coords(req.rank)
    node = req.rank // gpn
    groups = []
    for d in (*mesh.DIMS, *(("ep",) if req.ep > 1 else ())):
        spanned = mesh.nodes_spanned(m, req.rank, d, gpn)
        groups.append({"dim": d, "size": m.size(d), "stride": m.stride(d), "peers": m.group(req.rank, d),
                       "nodes": spanned, "crosses_nodes": spanned > 1,
                       "groups_crossing_fraction": mesh.crossing_fraction(m, d, gpn)})
    return {"world": m.world, "order": list(m.order), "gpus_per_node": gpn, "nodes": -(-m.world // gpn),
            "rank": req.rank, "coords": coords, "node": node, "groups": groups, "dims": mesh.dims_in_node(m, gpn),
            "node_ranks": [{"rank": r, **c} for r, c in mesh.node_ranks(m, node, gpn)]}


@functools.lru_cache(maxsize=8)
def runs_table(mode: str = "seed", which: str = "deck") -> dict:
    """The validation table (cached: the catalog is package data)."""
    cat = _need("modelcut.catalog")
    validate = _need("modelcut.core.validate")
    runs = cat.published_runs("deck" if which == "deck" else None)
    val = validate.validate(runs, cat.hardware, mode)
    by_id = {r.id: r for r in runs}
    rows = []
    for r in val.rows:
        pr = by_id[r.id]
        lay = pr.run.layout
        rows.append({
            "id": r.id, "family": r.family, "model": pr.run.model.name, "gpu": pr.run.gpu,
            "gpus": lay.gpus, "layout": {"tp": lay.tp, "cp": lay.cp, "pp": lay.pp, "dp": lay.dp,
                                         "vpp": r.prediction.vpp, "schedule": r.prediction.schedule},
            "published_tflops": r.published_tflops, "predicted_tflops": r.predicted_tflops,
            "error_pct": r.error_pct, "fitted": r.fitted, "step_time_s": r.step_time_s,
            "breakdown": r.prediction.breakdown.as_dict(), "source": pr.source, "notes": pr.notes})
    summary = {"max_error_pct": dict(val.max_error_pct), "mean_abs_error_pct": val.mean_abs_error_pct,
               "all_low": val.all_low, "predicted": sum(not r["fitted"] for r in rows)}
    return {"mode": mode, "eta": val.eta, "calibration": val.calibration, "runs": rows, "summary": summary}


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
