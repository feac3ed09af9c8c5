"""The FastAPI application behind ``modelcut serve``.

Pages: ``/`` (pipeline animation), ``/explorer`` (layout explorer), ``/runs`` (published runs).
JSON API (schema at ``/openapi.json``): ``POST /api/simulate``, ``POST /api/predict``,
``POST /api/explore`` (and ``POST /api/explore/stream``, its progress as NDJSON), ``POST /api/mesh``,
``POST /api/upload-config``, ``GET /api/runs``, ``GET /api/kernel-checks``, ``GET /api/catalog``.

Bad input never answers 500: a :class:`~modelcut.core.errors.ModelcutError` becomes 422 with
``{"detail": message}``, a body that is not JSON 400, a body over :data:`MAX_BODY_BYTES` 413,
work beyond the limits (:data:`modelcut.service.limits.WEB`) 422 with a message naming the limit.
Each refusal's ``Modelcut-Refusal`` header says what was refused: ``input`` (a field breaks its
schema), ``combination`` (fields the schema allows each, which cannot go together: tp·cp·pp·dp
against the GPUs, a chunk count the schedule does not run), ``content`` (an uploaded file that is
not a config.json), ``limit`` (work over a cap) or ``busy``.

Searches and large simulations run in a bounded worker pool (:mod:`.pool`): beyond its workers
and queue the server answers 429 with ``Retry-After`` instead of queueing without limit (503 if
its workers stopped); small requests keep answering from the server's own process meanwhile.

The app holds no formula and no use case: it turns requests into the service's calls
(:mod:`.requests`) and answers with the service's JSON.
"""

from __future__ import annotations

import asyncio
import contextlib
import json
from importlib import resources
from typing import Any, Literal

from fastapi import File, FastAPI, HTTPException, Path, Query, Request, UploadFile
from fastapi.concurrency import run_in_threadpool
from fastapi.exceptions import RequestValidationError
from fastapi.responses import FileResponse, JSONResponse, Response, StreamingResponse
from fastapi.staticfiles import StaticFiles

from ..core.errors import ModelcutError
from ..export import pipeline_json
from ..service.limits import WEB, LimitError
from ..service.requests import one_line
from . import jobs, requests, schemas
from .pool import Busy, Pool, Unavailable

#: Most ops one simulation may have (p·v·m·kinds); beyond it the answer would take seconds and
#: hundreds of megabytes.
MAX_OPS = WEB.max_ops
#: Up to this many ops the simulation runs in exact arithmetic (Fractions), like the CLI; beyond
#: it in floats, which are faster and agree to rounding.
EXACT_MAX_OPS = requests.EXACT_MAX_OPS
#: Largest request body (JSON or uploaded config.json) accepted.
MAX_BODY_BYTES = 1_000_000
#: Most candidate layouts (structures the stack runs × recomputation × ZeRO stage) one explorer
#: search may cover (service/limits.py).
MAX_LAYOUTS = WEB.max_layouts

STATIC = resources.files("modelcut.web") / "static"

REFUSAL = "Modelcut-Refusal"
_REFUSAL_HEADER = {REFUSAL: {"description": "what was refused: input, combination, content, limit or busy",
                             "schema": {"type": "string"}}}
_RETRY = {**_REFUSAL_HEADER, "Retry-After": {"description": "seconds after which a retry may find a place",
                                             "schema": {"type": "integer"}}}


def _error(description: str, headers: dict = _REFUSAL_HEADER) -> dict:
    return {"model": schemas.ErrorResponse, "description": description, "headers": headers}


ERRORS = {400: _error("the body is not JSON (or the upload not UTF-8 JSON)"),
          413: _error("the body is over the limit"),
          422: _error("a field breaks its rule, fields that cannot go together, or work over a limit")}
BUSY = {429: _error("every search worker is busy and the queue is full", _RETRY),
        503: _error("the search workers stopped; retry shortly", _RETRY)}


def refusal(status: int, detail: str, kind: str, retry_after: int | None = None) -> JSONResponse:
    headers = {REFUSAL: kind}
    if retry_after is not None:
        headers["Retry-After"] = str(retry_after)
    return JSONResponse({"detail": detail}, status_code=status, headers=headers)


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
    """A validation error as (status, one line): 400 for a body that is not JSON, else 422, in
    the words the command line uses (:func:`modelcut.service.requests.one_line`)."""
    errors = [{**e, "loc": tuple(x for x in e.get("loc", ()) if x not in ("body", "query"))} for e in exc.errors()]
    bad_json = [e for e in errors if e.get("type") == "json_invalid"]
    if bad_json:
        ctx = (bad_json[0].get("ctx") or {}).get("error", "")
        return 400, f"body is not valid JSON{': ' + str(ctx) if ctx else ''}"
    return 422, one_line(errors) or "invalid request"


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


def create_app(*, max_ops: int = MAX_OPS, max_layouts: int = MAX_LAYOUTS, max_body_bytes: int = MAX_BODY_BYTES,
               workers: int | None = None, queue: int | None = None, pool: str = "process") -> FastAPI:
    """The web app: pages, static files and the JSON API, with its limits (tests lower them) and
    its worker pool for searches (``workers`` at once, ``queue`` waiting; ``pool="thread"`` runs
    them in threads of the server's process instead)."""
    limits = WEB.raised(max_ops=max_ops, max_layouts=max_layouts)
    searches = Pool(workers, queue, pool)

    @contextlib.asynccontextmanager
    async def lifespan(app: FastAPI):
        searches.open()
        yield
        searches.close()

    app = FastAPI(
        title="modelcut",
        version="0.1.0",
        description="Cut a large model across many accelerators: pipeline simulation, training-systems "
                    "model, layout explorer.",
        docs_url=None, redoc_url=None,  # their pages load scripts from a CDN; the schema is at /openapi.json
        lifespan=lifespan,
    )
    app.state.limits, app.state.pool = limits, searches
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
        return refusal(422, str(exc), "limit" if isinstance(exc, LimitError) else "combination")

    @app.exception_handler(RequestValidationError)
    async def validation_error(request: Request, exc: RequestValidationError):
        status, line = _one_line(exc)
        return refusal(status, line, "input")

    @app.exception_handler(HTTPException)
    async def http_error(request: Request, exc: HTTPException):
        kind = "content" if request.url.path == "/api/upload-config" and exc.status_code == 400 else "input"
        return JSONResponse({"detail": exc.detail}, status_code=exc.status_code,
                            headers={**(exc.headers or {}), **({REFUSAL: kind} if exc.status_code < 500 else {})})

    @app.exception_handler(Busy)
    async def busy(request: Request, exc: Busy):
        return refusal(429, str(exc), "busy", exc.retry_after)

    @app.exception_handler(Unavailable)
    async def unavailable(request: Request, exc: Unavailable):
        return refusal(503, str(exc), "busy", exc.retry_after)

    app.mount("/static", StaticFiles(directory=str(STATIC)), name="static")
    for path, name in (("/", "index.html"), ("/explorer", "explorer.html"), ("/runs", "runs.html")):
        app.add_api_route(path, _page(name), methods=["GET"], include_in_schema=False)

    async def pooled(fn, *args, place=None):
        """Run a job of :mod:`.jobs` in the pool; its refusal raised here as the service's."""
        job = searches.submit(fn, *args, place=place)
        out = await searches.result(job)
        _raise_refusal(out)
        return out

    @app.post("/api/simulate", response_model=None,
              responses={200: {"model": schemas.SimulateResponse}, **ERRORS, **BUSY},
              summary="Simulate a pipeline schedule (the answer of `modelcut simulate --json`)")
    async def api_simulate(req: schemas.SimulateRequest) -> Response:
        if requests.pooled(req, limits):
            out = await pooled(jobs.simulate, req, limits, EXACT_MAX_OPS)
            return Response(out["text"], media_type="application/json")
        sim = await run_in_threadpool(requests.simulate, req, limits)
        return _json(pipeline_json.to_dict(sim.result, notes=sim.notes))

    @app.get("/api/catalog", response_model=schemas.CatalogResponse,
             summary="Schedules, accelerators and model shapes the app knows, and its limits")
    def api_catalog() -> schemas.CatalogResponse:
        return schemas.CatalogResponse(
            **requests.catalog_listing(),
            limits={"max_ops": limits.max_ops, "max_body_bytes": max_body_bytes, "max_layouts": limits.max_layouts,
                    "max_gpus": limits.max_gpus, "max_seq": limits.max_seq, "search_workers": searches.workers,
                    "search_queue": searches.queue})

    @app.post("/api/predict", response_model=None, responses={200: {"model": schemas.PredictAnswer}, **ERRORS},
              summary="Predict one run's step time, throughput, breakdown and memory (`modelcut predict --json`)")
    def api_predict(req: schemas.PredictRequest) -> Response:
        return _json(requests.predict(req, limits))

    @app.post("/api/predict/trace", response_model=None, responses={200: {"model": schemas.TraceResponse}, **ERRORS},
              summary="The predicted step as a Chrome trace-event JSON for Perfetto (`modelcut predict --trace`)")
    def api_predict_trace(req: schemas.PredictRequest) -> Response:
        return _json(requests.predict_trace(req, limits))

    @app.post("/api/explore", response_model=None,
              responses={200: {"model": schemas.ExploreAnswer}, **ERRORS, **BUSY},
              summary="Rank the layouts that fit (`modelcut explore --json`)")
    async def api_explore(req: schemas.ExploreRequest) -> Response:
        with searches.admit() as place:   # a place first: refusing a flood costs nothing
            await run_in_threadpool(requests.explore_checks, req, limits)
            out = await pooled(jobs.explore, req, limits, place=place)
        return _json(out["result"])

    @app.post("/api/explore/stream", response_model=None,
              responses={200: {"description": "one JSON object a line (NDJSON): the search's progress while it "
                                              "runs, then its answer or refusal (schema: ExploreProgress)",
                               "content": {"application/x-ndjson": {
                                   "schema": schemas.ExploreProgress.model_json_schema()}}},
                         **ERRORS, **BUSY},
              summary="The explorer's search with its progress, streamed as NDJSON lines")
    async def api_explore_stream(req: schemas.ExploreRequest) -> StreamingResponse:
        with searches.admit() as place:
            await run_in_threadpool(requests.explore_checks, req, limits)
            job = searches.submit(jobs.explore, req, limits, place=place)

        async def lines():
            last = None
            while not job.future.done():
                now = job.progress()
                if now != last:
                    last = now
                    yield json.dumps({"progress": now}) + "\n"
                with contextlib.suppress(asyncio.TimeoutError):
                    await asyncio.wait_for(asyncio.shield(asyncio.wrap_future(job.future)), 0.1)
            try:
                out = await searches.result(job)
            except Unavailable as exc:
                yield json.dumps({"error": {"status": 503, "detail": str(exc)}}) + "\n"
                return
            if "error" in out:
                yield json.dumps({"error": {"status": 422, "detail": out["error"]}}) + "\n"
                return
            # the search's own last count: the queue's reader may not have passed it on yet
            seen = out.get("progress") or {}
            total = job.total if job.total is not None else seen.get("total")
            yield json.dumps({"progress": {"done": total if total is not None else max(job.done, seen.get("done", 0)),
                                           "total": total, "running": True}}) + "\n"
            yield json.dumps({"result": out["result"]}, allow_nan=False) + "\n"

        return StreamingResponse(lines(), media_type="application/x-ndjson",
                                 headers={"Cache-Control": "no-store", "X-Accel-Buffering": "no"})

    @app.post("/api/mesh", response_model=schemas.MeshResponse, responses=ERRORS,
              summary="A rank's coordinates and groups, and which groups leave a node (`modelcut mesh --json`)")
    def api_mesh(req: schemas.MeshRequest) -> dict:
        return requests.mesh(req, limits)

    @app.get("/api/runs", response_model=schemas.RunsResponse, responses=ERRORS,
             summary="The validation table: the systems model against published runs (`modelcut validate`)")
    def api_runs(mode: Literal["seed", "default"] = Query("seed"),
                 set: Literal["deck", "all"] = Query("deck", description="the deck's rows, or every run")) -> dict:
        return requests.runs(mode, set)

    @app.get("/api/runs/{run_id}", response_model=None, responses={200: {"model": schemas.PredictResponse}, **ERRORS},
             summary="One published run predicted as validate predicts it (`modelcut predict --run ID --json`)")
    def api_run(run_id: str = Path(description="a published run's id (GET /api/runs lists them)", max_length=200),
                mode: Literal["seed", "default"] = Query("default"),
                layers: bool = Query(False, description="default mode: one micro-batch itemised, as --layers")) -> Response:
        return _json(requests.published_run(run_id, mode, layers, limits))

    @app.get("/api/kernel-checks", response_model=schemas.KernelChecksResponse, responses=ERRORS,
             summary="The kernel tables against published kernel benchmarks (`modelcut validate --kernels`)")
    def api_kernel_checks() -> dict:
        return requests.kernel_checks()

    @app.post("/api/upload-config", response_model=schemas.UploadResponse, responses=ERRORS,
              summary="Read a Hugging Face config.json (multipart upload, at most 1 MB)")
    async def api_upload(file: UploadFile = File(..., description="a Hugging Face config.json")) -> dict:
        data = await file.read()
        try:
            return requests.read_config(data, file.filename or "config.json", limits)
        except ModelcutError as exc:   # what the file holds: the form's schema cannot state it
            return refusal(422, str(exc), "limit" if isinstance(exc, LimitError) else "content")

    return app


def _raise_refusal(out: dict) -> None:
    """A job's one-line refusal (:mod:`.jobs`) raised as the service raises it."""
    if "error" in out:
        raise (LimitError(out["error"], "") if out.get("limit") else ModelcutError(out["error"]))
