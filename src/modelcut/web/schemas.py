"""Request and response models of the JSON API (pydantic v2); FastAPI turns them into ``/openapi.json``.

The simulate answer is exactly ``modelcut simulate --json`` (``modelcut.export.pipeline_json.to_dict``);
the models here document it and let tests check the answers against the schema.
"""

from __future__ import annotations

from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field

#: Largest op time, point-to-point time or F:B:W share accepted (arbitrary units). Beyond it the
#: simulated times overflow a float; no pipeline needs a ratio this wide.
MAX_TIME = 1e9


def _time(default: float | None, what: str) -> Any:
    return Field(default, ge=0, le=MAX_TIME, allow_inf_nan=False, description=what)


class SimulateRequest(BaseModel):
    """The body of ``POST /api/simulate``: the options of ``modelcut simulate``."""

    model_config = ConfigDict(extra="forbid", strict=True)

    schedule: str = Field("1f1b", min_length=1, max_length=64,
                          description="gpipe, 1f1b, interleaved, looped-bfs, zb-h1 or zbv")
    devices: int = Field(4, ge=1, description="pipeline devices p")
    microbatches: int = Field(8, ge=1, description="micro-batches m")
    chunks: int | None = Field(None, ge=1, description="chunks per device v (null: the schedule's default)")
    forward: float = _time(1.0, "forward time F for a device's whole share of layers")
    backward: float = _time(2.0, "backward time B (with a split backward and a weight time: the input gradient)")
    weight: float | None = _time(None, "weight-gradient time W (split schedules; null: B and W share backward)")
    p2p: float = _time(0.0, "point-to-point time added to each input that crosses devices")


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


class ScheduleInfo(BaseModel):
    name: str
    default_chunks: int
    chunks_fixed: bool = Field(description="true when the schedule runs only its default chunk count")
    split_backward: bool
    doc: str


class CatalogResponse(BaseModel):
    schedules: list[ScheduleInfo]
    hardware: list[dict[str, Any]] = Field(description="accelerators of the catalog (SI units)")
    models: list[dict[str, Any]] = Field(description="model shapes of the catalog")
    modes: list[str] = Field(description="modes of the systems model (assumption sets)")
    limits: dict[str, int] = Field(description="the API's limits: ops per simulation, body bytes, layouts")


class ErrorResponse(BaseModel):
    detail: str = Field(description="one line naming the problem")


# --- the systems model: predict, explore, mesh, published runs ------------------------------------

#: Bounds that keep a request's arithmetic inside floats and its loops short; far beyond any real
#: run (Llama 3 405B: 126 layers, hidden 16,384, 16,384 GPUs, 131,072-token context).
MAX_GPUS = 1 << 20
MAX_SEQ = 1 << 24
MAX_WIDTH = 10_000_000
MAX_LAYERS = 100_000


class ModelChoice(BaseModel):
    """Exactly one of: a catalog model's name, a Hugging Face config.json object, or the fields."""

    model: str | None = Field(None, min_length=1, max_length=128, description="a catalog model, e.g. llama3-405b")
    hf_config: dict[str, Any] | None = Field(None, description="a Hugging Face config.json, parsed")
    model_spec: dict[str, Any] | None = Field(
        None, description="the model's fields (layers, hidden, ffn_hidden, heads, kv_heads, vocab, ...)")


class LayoutIn(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    tp: int = Field(1, ge=1, le=MAX_GPUS)
    cp: int = Field(1, ge=1, le=MAX_GPUS)
    pp: int = Field(1, ge=1, le=MAX_GPUS)
    dp: int = Field(1, ge=1, le=MAX_GPUS)
    ep: int = Field(1, ge=1, le=MAX_GPUS)
    vpp: int | None = Field(None, ge=1, le=MAX_LAYERS)
    sequence_parallel: bool = False
    zero: int = Field(0, ge=0, le=3)
    schedule: str | None = Field(None, min_length=1, max_length=64)
    etp: int | None = Field(None, ge=1, le=MAX_GPUS, description="expert tensor-parallel size")
    cp_kind: Literal["ring", "allgather"] | None = None
    order: list[Literal["tp", "cp", "pp", "dp"]] | None = Field(None, min_length=4, max_length=4,
                                                               description="rank order, innermost first")


class TrainingIn(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    seq_len: int = Field(ge=1, le=MAX_SEQ)
    global_batch: int = Field(ge=1, le=MAX_GPUS * 64, description="sequences per step")
    micro_batch: int = Field(1, ge=1, le=MAX_GPUS)
    recompute: Literal["none", "selective", "full"] = "none"
    precision: Literal["bf16", "fp16", "fp8"] = Field("bf16", description="the matrix products' precision")
    fp8_recipe: Literal["delayed", "current", "blockwise", "mxfp8"] | None = Field(
        None, description="with fp8: the scaling recipe (default: the stack's, else Transformer Engine's)")


class PredictRequest(ModelChoice):
    """One run: model, accelerator, layout and batch; the answer of ``modelcut predict --json``."""

    model_config = ConfigDict(extra="forbid", strict=True)

    gpu: str = Field("h100", min_length=1, max_length=64, description="a catalog accelerator or alias")
    gpus_per_node: int | None = Field(None, ge=1, le=4096)
    layout: LayoutIn
    training: TrainingIn
    mode: Literal["default", "seed"] = "default"
    eta: float | None = Field(None, gt=0, le=1, allow_inf_nan=False,
                              description="fraction of peak the matrix products reach (default: fitted)")
    framework: str | None = Field(None, min_length=1, max_length=64,
                                  description="default mode: the training stack, a preset (default megatron-core)")
    overlap: dict[str, bool] | None = Field(None, description="default mode: overlap overrides, e.g. "
                                                               "{\"tp_comm\": true}")


class PredictResponse(BaseModel):
    """``modelcut predict --json``: see ``modelcut.service.predict``."""

    step_time_s: float
    tflops_per_gpu: float
    mfu: float
    breakdown: dict[str, float]
    flops_per_step: float
    microbatches: int
    vpp: int
    schedule: str
    mode: str
    eta: float
    stage_layers: list[int]
    pipeline_method: str
    notes: list[str]
    memory: dict[str, Any] | None = Field(description="memory per pipeline stage: stages, peak_bytes, ...")


class ExploreRequest(ModelChoice):
    """The explorer's search: ``modelcut explore`` options."""

    model_config = ConfigDict(extra="forbid", strict=True)

    gpu: str = Field("h100", min_length=1, max_length=64)
    gpus: int = Field(ge=1, le=MAX_GPUS, description="accelerators N; every layout uses exactly N")
    seq: int = Field(ge=1, le=MAX_SEQ, description="sequence length in tokens")
    global_batch_tokens: int | str = Field(
        description="tokens per optimizer step: an integer, or with a binary suffix, 16M = 16·2^20",
        json_schema_extra={"examples": [16777216, "16M"]})
    gpus_per_node: int | None = Field(None, ge=1, le=4096)
    mode: Literal["default", "seed"] = "default"
    framework: str | None = Field(None, min_length=1, max_length=64,
                                  description="default mode: the training stack, a preset (default megatron-core)")
    check: dict[str, int | str] | None = Field(None, description="a layout to find among the ranked ones, e.g. "
                                                                  "{\"tp\": 8, \"pp\": 16}")
    margin: float = Field(0.02, ge=0, lt=1, allow_inf_nan=False,
                          description="fraction of the accelerator's memory kept free")
    top: int = Field(20, ge=1, le=500, description="how many ranked layouts to return")
    schedules: list[Literal["gpipe", "1f1b", "interleaved", "looped-bfs", "zb-h1", "zbv"]] | None = Field(
        None, min_length=1, max_length=6)
    micro_batches: list[int] | None = Field(None, min_length=1, max_length=8)
    allow_tp_across_nodes: bool = False


class ExploreResponse(BaseModel):
    """``modelcut explore --json``: see ``modelcut.service.explore``."""

    layouts: list[dict[str, Any]] = Field(description="ranked feasible layouts, fastest first (top K)")
    summary: dict[str, Any]
    why: dict[str, Any] | None = Field(description="why the best beats the runner-up")
    notes: list[str]
    model: dict[str, Any]
    hardware: dict[str, Any]
    seq: int
    global_batch: int
    mode: str
    framework: str | None
    memory_assumptions: dict[str, Any]
    check: dict[str, Any] | None = None


class MeshRequest(BaseModel):
    model_config = ConfigDict(extra="forbid", strict=True)

    tp: int = Field(1, ge=1, le=MAX_GPUS)
    cp: int = Field(1, ge=1, le=MAX_GPUS)
    pp: int = Field(1, ge=1, le=MAX_GPUS)
    dp: int = Field(1, ge=1, le=MAX_GPUS)
    ep: int = Field(1, ge=1, le=MAX_GPUS)
    gpus_per_node: int = Field(8, ge=1, le=4096)
    rank: int = Field(0, ge=0)
    order: list[Literal["tp", "cp", "pp", "dp", "ep"]] | None = Field(
        None, min_length=4, max_length=5, description="rank order, innermost first (default tp, cp, pp, dp; "
                                                       "with ep > 1 Megatron-core's tp, cp, ep, dp, pp)")


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


class RunsResponse(BaseModel):
    mode: str
    eta: float | None = Field(description="seed mode: η, fitted on the calibration run")
    calibration: str | None
    runs: list[RunRow]
    summary: dict[str, Any]


class UploadResponse(BaseModel):
    model: dict[str, Any] = Field(description="the model read from the file")
    hf_config: dict[str, Any] = Field(description="the file's JSON object, to send back in hf_config")
