"""The FastAPI application behind ``modelcut serve``.

Pages: ``/`` (pipeline animation), ``/explorer`` (layout explorer), ``/runs`` (published runs).
JSON API (schema at ``/openapi.json``): ``POST /api/simulate``, ``POST /api/predict``,
``POST /api/explore``, ``POST /api/upload-config``, ``GET /api/runs``, ``GET /api/catalog``.

Bad input never answers 500: a :class:`~modelcut.core.errors.ModelcutError` becomes 422 with
``{"detail": message}``, a body that is not JSON 400, a body over :data:`MAX_BODY_BYTES` 413,
and work beyond the limits below 422 with a message naming the limit. The app holds no formula
and no use case: it turns requests into the service's calls (:mod:`.requests`) and answers with
the service's JSON.
"""

from __future__ import annotations

import json
from importlib import resources
from typing import Any, Literal

from fastapi import File, FastAPI, HTTPException, Query, Request, UploadFile
from fastapi.exceptions import RequestValidationError
from fastapi.responses import FileResponse, JSONResponse, Response
from fastapi.staticfiles import StaticFiles

from ..core.errors import ModelcutError
from ..export import pipeline_json
from . import requests, schemas

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
        result = requests.simulate(req, max_ops)
        return _json(pipeline_json.to_dict(result))

    @app.get("/api/catalog", response_model=schemas.CatalogResponse,
             summary="Schedules, accelerators and model shapes the app knows, and its limits")
    def api_catalog() -> schemas.CatalogResponse:
        return schemas.CatalogResponse(
            **requests.catalog_listing(),
            limits={"max_ops": max_ops, "max_body_bytes": max_body_bytes, "max_layouts": max_layouts})

    @app.post("/api/predict", response_model=schemas.PredictResponse, responses=ERRORS,
              summary="Predict one run's step time, throughput, breakdown and memory (`modelcut predict --json`)")
    def api_predict(req: schemas.PredictRequest) -> dict:
        return requests.predict(req, max_ops)

    @app.post("/api/explore", response_model=schemas.ExploreResponse, responses=ERRORS,
              summary="Rank the layouts that fit (`modelcut explore --json`)")
    def api_explore(req: schemas.ExploreRequest) -> dict:
        return requests.explore(req, max_ops, max_layouts)

    @app.post("/api/mesh", response_model=schemas.MeshResponse, responses=ERRORS,
              summary="A rank's coordinates and groups, and which groups leave a node (`modelcut mesh --json`)")
    def api_mesh(req: schemas.MeshRequest) -> dict:
        return requests.mesh(req)

    @app.get("/api/runs", response_model=schemas.RunsResponse, responses=ERRORS,
             summary="The validation table: the systems model against published runs (`modelcut validate`)")
    def api_runs(mode: Literal["seed", "default"] = Query("seed"),
                 set: Literal["deck", "all"] = Query("deck", description="the deck's rows, or every run")) -> dict:
        return requests.runs(mode, set)

    @app.post("/api/upload-config", response_model=schemas.UploadResponse, responses=ERRORS,
              summary="Read a Hugging Face config.json (multipart upload, at most 1 MB)")
    async def api_upload(file: UploadFile = File(..., description="a Hugging Face config.json")) -> dict:
        data = await file.read()
        return requests.read_config(data, file.filename or "config.json")

    return app
