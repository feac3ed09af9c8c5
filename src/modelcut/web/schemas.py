"""Request and response models of the JSON API (pydantic v2); FastAPI turns them into ``/openapi.json``.

The request bodies are the service's own models (:mod:`modelcut.service.requests`), the ones the
command line and RUN.toml validate through, so the schema states every field's rule the server
applies. The simulate answer is exactly ``modelcut simulate --json``
(``modelcut.export.pipeline_json``); the models here document it and let tests check the answers
against the schema.
"""

from __future__ import annotations

from typing import Any, Literal, Union

from pydantic import BaseModel, Field, RootModel

from ..core.costs.flops import CONVENTIONS, COUNTED_BY
from ..service.limits import DEFAULT
from ..service.requests import (CheckIn, ExploreInput, LayoutIn, MeshInput, ModelChoice, ModelSpecIn,  # noqa: F401
                                OverlapIn, PredictInput, SimulateInput, TrainingIn)

SimulateRequest = SimulateInput
PredictRequest = PredictInput
ExploreRequest = ExploreInput
MeshRequest = MeshInput

#: The size caps the schema states (the service's :data:`~modelcut.service.limits.DEFAULT`).
MAX_TIME = DEFAULT.max_time
MAX_GPUS = DEFAULT.max_gpus
MAX_SEQ = DEFAULT.max_seq
MAX_WIDTH = DEFAULT.max_width
MAX_LAYERS = DEFAULT.max_layers


class OpOut(BaseModel):
    device: int
    kind: Literal["F", "B", "W"]
    microbatch: int
    chunk: int = Field(description="the op's chunk index on its device")
    stage: int = Field(description="the op's virtual stage")
    start: float
    end: float


class TimingOut(BaseModel):
    forward: float | None
    backward: float | None
    weight: float | None
    p2p: float | None
    split_backward: bool


class SimulateResponse(BaseModel):
    """``modelcut simulate --json``: see ``modelcut.export.pipeline_json``."""

    schedule: str
    devices: int
    microbatches: int
    chunks: int
    stages: int
    makespan: float
    bubble: float = Field(description="overall bubble: idle time over busy time, all devices")
    bubble_per_device: list[float]
    closed_form_bubble: float | None = Field(
        description="the schedule's closed form, null where it has none for these sizes and timings")
    peak_activations: list[float] = Field(
        description="per device, in units of one micro-batch's activations for the device's whole share")
    timing: TimingOut
    memory_timeline: list[list[list[float]]] = Field(
        description="per device, [time, activations] after each change")
    ops: list[OpOut]
    notes: list[str] = Field(description="what the timing means for this schedule (e.g. a weight time added to B)")


class ScheduleInfo(BaseModel):
    name: str
    default_chunks: int
    chunks_fixed: bool = Field(description="true when the schedule runs only its default chunk count")
    split_backward: bool
    explored_by_default: bool = Field(description="true when the explorer searches it unless the request names "
                                                  "its schedules")
    doc: str


class CpKindInfo(BaseModel):
    name: str = Field(description="a context-parallel form as requests name it (cp_kind, cp_kinds)")
    label: str = Field(description="the form in words, as the pages label it (all-to-all)")
    doc: str


class CatalogResponse(BaseModel):
    schedules: list[ScheduleInfo]
    cp_kinds: list[CpKindInfo] = Field(description="the forms of context parallelism the explorer searches "
                                                   "(every one by default, each where the stack runs it)")
    hardware: list[dict[str, Any]] = Field(description="accelerators of the catalog (SI units)")
    models: list[dict[str, Any]] = Field(description="model shapes of the catalog")
    modes: list[str] = Field(description="modes of the systems model (assumption sets)")
    frameworks: list[str] = Field(description="training-stack presets the default mode takes (framework)")
    default_framework: str = Field(description="the preset a request that names none gets")
    precisions: list[str] = Field(description="the matrix products' precisions a request may name (precision)")
    fp8_recipes: list[str] = Field(description="FP8 scaling recipes a request may name (fp8_recipe)")
    grad_reduce_dtypes: list[str] = Field(description="the types a request may reduce gradients in (grad_reduce; "
                                                      "fp32, or the run's 16-bit type)")
    attention_kinds: list[str] = Field(description="the attention kernels a request may name (attention)")
    framework_fp8_recipes: dict[str, list[str]] = Field(
        description="the FP8 recipes each preset's FP8 library runs (Transformer Engine's or torchao's)")
    framework_aliases: dict[str, str] = Field(description="other names of the presets (torchtitan, megatron-lm, …)")
    limits: dict[str, int] = Field(description="the API's limits: ops per simulation, body bytes, layouts")


class ErrorResponse(BaseModel):
    detail: str = Field(description="one line naming the problem")


class ExploreProgress(BaseModel):
    """One line of ``POST /api/explore/stream`` (NDJSON): the search's progress while it runs,
    then its answer or its refusal."""

    progress: dict[str, Any] | None = Field(None, description="{done, total, running}: structures searched of the "
                                                              "total; running false while queued")
    result: dict[str, Any] | None = Field(None, description="the answer of POST /api/explore (one search, or one per "
                                                           "precision when the request names precisions)")
    error: dict[str, Any] | None = Field(None, description="{status, detail}: the refusal POST /api/explore "
                                                           "would give")


# --- the systems model: predict, explore, mesh, published runs ------------------------------------


class PredictResponse(BaseModel):
    """``modelcut predict --json``: see ``modelcut.service.predict``."""

    step_time_s: float
    tflops_per_gpu: float
    mfu: float
    tokens_per_s_per_gpu: float = Field(description="tokens a step over step time · GPUs")
    model_tflops_per_gpu: dict[str, float] = Field(description="model TFLOP/s per GPU under each FLOP convention, "
                                                               "no recomputation: " + ", ".join(
                                                                   f"{c} ({COUNTED_BY[c]})" if c in COUNTED_BY else c
                                                                   for c in CONVENTIONS))
    breakdown: dict[str, float]
    flops_per_step: float
    microbatches: int
    vpp: int
    schedule: str
    mode: str
    eta: float
    stage_layers: list[int]
    pipeline_method: str
    device_busy_s: list[float] = Field(description="each pipeline device's op time over the step (default mode "
                                                   "with a pipeline, one entry without; empty in the seed mode "
                                                   "and for ZeRO-3 without a pipeline): the busiest sets the "
                                                   "schedule's pace")
    notes: list[str]
    layout: dict[str, Any] = Field(description="the layout as timed, what the run left open filled as its stack "
                                               "runs it: tp, cp, pp, dp, ep, etp, vpp, schedule, zero, "
                                               "sequence_parallel, cp_kind, order, dp_shard, first_layers, "
                                               "last_layers, framework")
    memory: dict[str, Any] | None = Field(description="memory per pipeline stage: stages, peak_bytes, ...")
    layers: dict[str, Any] | None = Field(None, description="with layers: one micro-batch on the busiest device, "
                                                        "{micro_batch, tokens, by_kind_s, units: [{unit, per_device, "
                                                        "fwd_s, bwd_s, lines}]}")


class PrecisionPredictionsResponse(BaseModel):
    """``modelcut predict --precision bf16,fp8 --json`` (a request naming ``precisions``): the run at
    each precision."""

    precisions: list[str] = Field(description="the precisions, in the request's order")
    predictions: list[PredictResponse] = Field(description="the run at each, as a one-precision request answers")


class PredictAnswer(RootModel[Union[PredictResponse, PrecisionPredictionsResponse]]):
    """``POST /api/predict``: the run's prediction, or one per precision when the request names
    ``precisions``."""


class TraceResponse(BaseModel):
    """``modelcut predict --trace``: Chrome's trace-event format (one process, a track per pipeline
    rank or stream, a complete event per span; Perfetto opens it)."""

    traceEvents: list[dict[str, Any]] = Field(description="metadata events naming the tracks, then one complete "
                                                          "event (ph X, ts and dur in µs) per span")
    displayTimeUnit: str
    otherData: dict[str, Any] = Field(description="the prediction's figures and notes")


class ExploreResponse(BaseModel):
    """``modelcut explore --json``: see ``modelcut.service.explore``."""

    layouts: list[dict[str, Any]] = Field(description="ranked feasible layouts, fastest first (top K)")
    summary: dict[str, Any]
    why: dict[str, Any] | None = Field(description="why the best beats the runner-up")
    none_reason: str | None = Field(None, description="why no layout is ranked (the stack runs none of them, "
                                                      "or none fits in memory); None when some are")
    notes: list[str]
    model: dict[str, Any]
    hardware: dict[str, Any]
    seq: int
    global_batch: int
    mode: str
    framework: str | None
    precision: str = Field(description="the products' precision of every layout searched")
    fp8_recipe: str | None = Field(description="with fp8: the scaling recipe asked for (None: the stack's)")
    local_batch: int | None = Field(None, description="with a pipeline: sequences a data-parallel rank puts through "
                                                      "one schedule run (None: one run a step)")
    memory_assumptions: dict[str, Any]
    check: dict[str, Any] | None = None


class PrecisionSearchesResponse(BaseModel):
    """``modelcut explore --precision bf16,fp8 --json`` (a request naming ``precisions``): one search
    per precision, the same problem on the same stack."""

    precisions: list[str] = Field(description="the precisions searched, in the request's order")
    searches: list[ExploreResponse] = Field(description="each precision's search, as one-precision requests answer")
    fastest: str | None = Field(description="the precision whose best layout steps fastest (None: none fits)")


class ExploreAnswer(RootModel[Union[ExploreResponse, PrecisionSearchesResponse]]):
    """``POST /api/explore``: one search's answer, or one per precision when the request names
    ``precisions``."""


class MeshResponse(BaseModel):
    world: int
    order: list[str]
    gpus_per_node: int
    nodes: int
    rank: int
    coords: dict[str, int]
    node: int
    groups: list[dict[str, Any]]
    dims: dict[str, str] = Field(description="each dimension: inside a node, across nodes, or mixed")
    node_ranks: list[dict[str, int]]
    experts: dict[str, Any] | None = Field(None, description="with ep > 1: the expert grid (megatron-core, or dp: "
                                                            "carved from the data-parallel ranks), etp, ep, edp")


class OutOfSample(BaseModel):
    predicted: float = Field(description="the prediction in the published unit, with the constants fitted without "
                                         "the run's source (leave one source out)")
    predicted_tflops: float
    error_pct: float
    step_time_s: float


class RunRow(BaseModel):
    id: str
    family: str
    model: str
    gpu: str
    gpus: int
    layout: dict[str, Any]
    unit: Literal["TFLOP/s", "s"] = Field(description="what the source published: TFLOP/s per GPU or seconds a step")
    published: float
    predicted: float = Field(description="the prediction in the published unit")
    published_tflops: float | None
    predicted_tflops: float
    error_pct: float
    fitted: bool
    step_time_s: float
    breakdown: dict[str, float]
    source: str
    notes: str
    out_of_sample: OutOfSample | None = Field(None, description="default model: the run predicted with the constants "
                                              "fitted without its source; the fields above are in sample")


class RunsResponse(BaseModel):
    mode: str
    eta: float | None = Field(description="seed mode: η, fitted on the calibration run")
    calibration: str | None
    runs: list[RunRow]
    summary: dict[str, Any]


class KernelCheckRow(BaseModel):
    check: str
    device: str
    kind: str = Field(description="bf16, fp8_delayed, fp8_current, fp8_current_prequantized, mxfp8, ...")
    predicted_ms: float = Field(description="modelcut's time for one layer's linear products, ms")
    measured_ms: float = Field(description="the published time, ms")
    error_pct: float
    predicted_speedup: float | None
    measured_speedup: float | None
    speedup_error_pct: float | None


class LayerCheckRow(BaseModel):
    check: str
    device: str
    recompute: str
    sequence_parallel: bool
    predicted_fwd_ms: float = Field(description="the step model's forward of one layer, ms")
    measured_fwd_ms: float = Field(description="the published forward, ms")
    fwd_error_pct: float
    predicted_bwd_ms: float = Field(description="the step model's backward, its recomputed forward included, ms")
    measured_bwd_ms: float = Field(description="the published backward, ms")
    bwd_error_pct: float
    fwd_parts_ms: dict[str, float] = Field(description="the step model's forward by part: products, attention, "
                                                       "memory, communication, ms")
    fwd_products_tflops: float = Field(description="the forward's linear-layer products, TFLOP/s")


class SweepCheckRow(BaseModel):
    check: str
    device: str
    dtype: str = Field(description="bf16 or fp8")
    shapes: int = Field(description="products the sweep measured")
    median_ratio: float = Field(description="modelcut's burst time over the measured, the median over shapes")
    p10_ratio: float
    p90_ratio: float
    time_ratio: float = Field(description="the sum of modelcut's times over the sum of the measured")
    worst_shape: list[int] = Field(description="m, n, k of the shape furthest off")
    worst_ratio: float
    measured_speedup: float | None = Field(description="FP8 over bf16, the median over shapes both sweeps hold")
    predicted_speedup: float | None
    speedup_shapes: int


class AttentionPointRow(BaseModel):
    seq_len: int
    causal: bool
    heads: int
    kv_heads: int
    head_dim: int = Field(description="the mean of Q·Kᵀ's and V's head dimensions, at which the table is read")
    measured_fwd_tflops: float
    measured_bwd_tflops: float
    table_fwd_tflops: float = Field(description="the attention table's burst rate at this point")
    table_bwd_tflops: float
    fwd_ratio: float = Field(description="the table's time over the measured")
    bwd_ratio: float
    window: int | None = Field(default=None, description="a causal sliding window of this many keys (the rates "
                                                         "count the window's pairs); null: none")


class _RatioSpan(BaseModel):
    """A sweep's ratios of modelcut's time over the measured: the median and range over its points,
    forward and backward."""

    check: str
    device: str
    kernel: str = Field(description="the kernel (and release) measured")
    fwd_median_ratio: float = Field(description="modelcut's time over the measured, the median over points")
    fwd_min_ratio: float
    fwd_max_ratio: float
    bwd_median_ratio: float
    bwd_min_ratio: float
    bwd_max_ratio: float


class AttentionCheckRow(_RatioSpan):
    impl: str = Field(description="the attention table checked (kernels.toml)")
    points: list[AttentionPointRow]
    fwd_furthest: dict[str, Any] = Field(description="the point furthest off forward: seq_len, causal, head_dim, "
                                                     "window, ratio")
    bwd_furthest: dict[str, Any]


class NormPointRow(BaseModel):
    model: str
    rows: int
    hidden: int
    fwd_ratio: float = Field(description="modelcut's memory-bound time for the fused norm over the measured")
    bwd_ratio: float


class NormCheckRow(_RatioSpan):
    eta_mem: float = Field(description="the default profile's η_mem the step model charges the norm at")
    points: list[NormPointRow]


class KernelChecksResponse(BaseModel):
    rows: list[KernelCheckRow]
    sources: dict[str, dict[str, str]] = Field(description="per benchmark: its source, device, device source, date")
    layers: list[LayerCheckRow] = Field(description="layer measurements beside the step model's layer times")
    layer_sources: dict[str, dict[str, str]] = Field(description="per layer measurement: its source and published run")
    sweeps: list[SweepCheckRow] = Field(description="independent product sweeps by shape against the product tables")
    sweep_sources: dict[str, dict[str, str]] = Field(description="per sweep: its source, device, date")
    attention: list[AttentionCheckRow] = Field(description="independent attention-kernel benchmarks against the "
                                                            "attention tables")
    attention_sources: dict[str, dict[str, str]] = Field(description="per attention sweep: its source, device, "
                                                                     "device source (a variant's), kernel release, "
                                                                     "date")
    norms: list[NormCheckRow] = Field(description="independent fused-norm benchmarks against the step model's "
                                                  "memory-bound time")
    norm_sources: dict[str, dict[str, str]] = Field(description="per norm sweep: its source, device, kernel, date")


class UploadResponse(BaseModel):
    model: dict[str, Any] = Field(description="the model read from the file")
    hf_config: dict[str, Any] = Field(description="the file's JSON object, to send back in hf_config")
