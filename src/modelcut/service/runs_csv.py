"""A user's measured runs from a CSV file (``modelcut calibrate --runs``; columns :data:`CSV_COLUMNS`):
each bad row is a one-line error."""

from __future__ import annotations

import csv
import dataclasses
import math
from pathlib import Path

from .. import catalog
from ..analysis.measured import Measured, measured_mfu
from ..core import plan as plans
from ..core.costs import flops
from ..core.costs.kernels import mfu_peak
from ..core.errors import ModelcutError
from ..core.specs import CROSS_ENTROPY_KINDS
from .inputs import read_overlap
from .limits import Limits
from .requests import HardwareIn, LayoutIn, TrainingIn, value_kind
from .runfile import run_from_dict


# ---------------------------------------------------------------- a user's runs (CSV)

#: Columns of ``modelcut calibrate --runs FILE.csv``: name -> meaning. Required: id, model, gpu,
#: gpus_per_node may be empty (the hardware's), tp, pp, dp, seq_len, global_batch, micro_batch
#: and one of tflops_per_gpu / tokens_per_s_per_gpu / step_time_s.
CSV_COLUMNS: dict[str, str] = {
    "id": "a name for the run",
    "group": "cross-validation group (default: the framework)",
    "model": "a catalog model name (modelcut list models) or a path to a Hugging Face config.json",
    "gpu": "a catalog accelerator name or alias",
    "gpus_per_node": "accelerators per node (default: the hardware's)",
    "tp": "tensor-parallel size", "cp": "context-parallel size (default 1)", "pp": "pipeline stages",
    "dp": "data-parallel size", "vpp": "interleaved chunks per device (default 1)",
    "ep": "expert-parallel size (an MoE model; default 1)", "etp": "expert tensor-parallel size (default tp)",
    "cp_kind": "with cp > 1: ring, allgather, a2a or a2a+p2p (default: the stack's)",
    "cp_a2a": "with cp_kind a2a+p2p: its all-to-all groups' size (Megatron-LM's --hierarchical-context-parallel-sizes)",
    "schedule": "a pipeline schedule of the registry (modelcut list schedules; default: 1F1B, interleaved with vpp > 1)",
    "order": "rank order, innermost first, e.g. tp;cp;pp;dp (default: Megatron-core's, tp;cp;ep;dp;pp)",
    "sequence_parallel": "true/false (default: the stack's, on with tp > 1 under Megatron-core and torchtitan)", "zero": "ZeRO stage 0-3 (default: the stack's, 3 under FSDP)",
    "dp_shard": "hybrid sharding: the data-parallel ranks one ZeRO shard group spans, replicated across dp/dp_shard "
                "groups (default: dp)",
    "seq_len": "tokens per sequence", "global_batch": "sequences per step",
    "micro_batch": "sequences per micro-batch", "recompute": "none, selective or full (default none; true/false as "
                                                              "llm-foundry's activation_checkpointing)",
    "recompute_modules": "with selective: the modules recomputed, e.g. layernorm;moe_act (core_attn, layernorm, "
                         "moe_act, mla_up_proj; default: the stack's selective policy)",
    "activation_func_fp8_input_store": "true/false: the SwiGLU's input kept in FP8 for the backward "
                                       "(Megatron-core's; default false)",
    "adam_moments": "fp32 or bf16: the type Adam's two moments are kept in (Megatron-core's --exp-avg-dtype; "
                    "default: the stack's)",
    "recompute_layers": "with full: the first N layers of each pipeline chunk recomputed, the rest kept whole "
                        "(Megatron-core's --recompute-method block --recompute-num-layers N; default: every layer)",
    "recompute_every": "with full: k, every k-th layer of each pipeline rank recomputed, the rest kept whole "
                       "(torchtitan's selective_ac_option = \"k\"; default: every layer)",
    "local_batch": "with a pipeline: sequences per data-parallel rank per schedule run (default: one run a step)",
    "precision": "the matrix products' precision: bf16, fp16 or fp8 (default bf16)",
    "fp8_recipe": "with fp8: delayed, current, blockwise, mxfp8, (torchao) rowwise or rowwise_with_gw_hp (default: the stack's)",
    "cross_entropy": f"the loss's kernel: {', '.join(CROSS_ENTROPY_KINDS)} (default: the framework's)",
    "attention": "the attention kernel: unfused, flash2, flash3, cudnn or flash4 (default: the framework's)",
    "fp8_param_gather": "with fp8: true/false, the linear layers' weights kept and gathered in FP8 (default: the framework's)",
    "grad_reduce": "the gradients' reduce type across data parallelism: fp32 or the run's 16-bit type (float32, "
                   "bfloat16 too; Composer's FSDP mixed_precision DEFAULT is fp32, PURE 16-bit; default: the framework's)",
    "framework": "a preset or another name for one, e.g. torchtitan (modelcut list frameworks; default megatron-core)",
    "overlap": "overrides, e.g. grad_reduce=off;tp_comm=on",
    "tflops_per_gpu": "measured TFLOP/s per GPU, counted as modelcut counts them, or as flop_convention says",
    "flop_convention": "what tflops_per_gpu counts, with no recomputation: "
                       f"{', '.join(flops.CONVENTIONS)} ("
                       + "; ".join(f"{c}: {who}" for c, who in flops.COUNTED_BY.items())
                       + "; default: modelcut's own count)",
    "tokens_per_s_per_gpu": "measured tokens per second per GPU, as torchtitan, llm-foundry and NeMo print "
                            "them (the step time is global_batch·seq_len over gpus·this)",
    "step_time_s": "measured seconds per step (used when given)",
}


def _int(row: dict, key: str, where: str, default: int | None = None) -> int | None:
    val = (row.get(key) or "").strip()
    if not val:
        if default is None:
            raise ModelcutError(f"{where}: missing {key!r}")
        return default
    try:
        return int(val)
    except ValueError:
        raise ModelcutError(f"{where}: {key} must be an integer, got {val!r}") from None


def _float(row: dict, key: str, where: str) -> float | None:
    val = (row.get(key) or "").strip()
    if not val:
        return None
    try:
        return float(val)
    except ValueError:
        raise ModelcutError(f"{where}: {key} must be a number, got {val!r}") from None


#: The columns a row's run is built from, by the run file's section, each read as the section's
#: request model types it (:func:`.requests.value_kind`).
_SECTIONS = {"hardware": (HardwareIn, ("gpu", "gpus_per_node")),
             "layout": (LayoutIn, catalog.LAYOUT_KEYS),
             "training": (TrainingIn, catalog.TRAINING_KEYS)}


def _cell(row: dict, key: str, kind: str, where: str):
    """A non-empty cell as the run file would give it: an integer, true/false, a list (";"-separated)
    or a string."""
    val = row[key].strip()
    if kind == "int":
        return _int(row, key, where)
    if kind == "bool":
        low = val.lower()
        if low not in ("true", "false", "1", "0", "yes", "no"):
            raise ModelcutError(f"{where}: {key} must be true or false, got {val!r}")
        return low in ("true", "1", "yes")
    if kind == "list":
        return [x.strip() for x in val.split(";") if x.strip()]
    return val


def _row_doc(row: dict, model: str, where: str) -> dict:
    """A CSV row as a RUN.toml document, read by the run file's own reader (:func:`.runfile.run_from_dict`:
    the same request models, defaults and one-line errors): the model a catalog name or a config.json path."""
    is_config = model.endswith(".json") or Path(model).is_file()
    doc: dict = {"model": {"config": model} if is_config else {"name": model}}
    for section, (model_in, keys) in _SECTIONS.items():
        doc[section] = {k: _cell(row, k, value_kind(model_in.model_fields[k].annotation), where)
                        for k in keys if k in row and row[k].strip()}
    if doc["layout"].get("vpp") == 1:
        del doc["layout"]["vpp"]                  # one chunk a device: the schedule's default, as before
    return doc


def read_runs_csv(path: str | Path, limits: Limits | None = None) -> list[Measured]:
    """A user's measured runs (columns :data:`CSV_COLUMNS`); the first bad row is a one-line error."""
    measured, bad = read_runs_rows(path, limits)
    if bad:
        raise ModelcutError(bad[0].error)
    if not measured:
        raise ModelcutError(f"{path}: no runs")
    return measured


@dataclasses.dataclass(frozen=True)
class BadRow:
    """A row of a runs table that is not a run modelcut can predict, and why (one line, naming the
    file and line)."""

    id: str
    error: str


def read_runs_rows(path: str | Path, limits: Limits | None = None) -> tuple[list[Measured], list[BadRow]]:
    """Every row of a user's runs table (columns :data:`CSV_COLUMNS`): the runs, and the rows that are
    none, each with its one-line error; a file that is no runs table at all is a one-line error."""
    p = Path(path)
    try:
        if p.stat().st_size > 50_000_000:
            raise ModelcutError(f"{p}: {p.stat().st_size:,} bytes is more than a runs table (at most 50 MB)")
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ModelcutError(f"{p}: no such file") from None
    except UnicodeDecodeError:
        raise ModelcutError(f"{p}: not a UTF-8 text file") from None
    except IsADirectoryError:
        raise ModelcutError(f"{p}: is a directory, not a CSV file") from None
    reader = csv.DictReader(text.splitlines())
    try:
        fields = reader.fieldnames
        rows = list(reader)
    except csv.Error as exc:      # a cell past the csv module's field limit, a stray NUL, ...
        raise ModelcutError(f"{p}: not a CSV table the reader takes ({exc})") from None
    if fields is None:
        raise ModelcutError(f"{p}: empty file")
    unknown = [c for c in fields if c and c.strip() not in CSV_COLUMNS]
    if unknown:
        raise ModelcutError(f"{p}: unknown column {unknown[0]!r} (columns: {', '.join(CSV_COLUMNS)})")
    out: list[Measured] = []
    bad: list[BadRow] = []
    for i, row in enumerate(rows, start=2):
        row = {k.strip(): (v or "") for k, v in row.items() if k}
        rid = row.get("id", "").strip() or f"row{i}"
        try:
            out.append(_row_run(row, rid, f"{p}:{i}", str(p), limits))
        except ModelcutError as exc:
            bad.append(BadRow(rid, str(exc)))
    return out, bad


def _row_run(row: dict, rid: str, where: str, source: str, limits: Limits | None) -> Measured:
    """One row of a runs table as a measured run; a bad row is a one-line error naming ``where``."""
    mname = row.get("model", "").strip()
    if not mname:
        raise ModelcutError(f"{where}: missing 'model'")
    for k in ("tp", "pp", "dp"):
        _int(row, k, where)                  # required here, as the columns say
    run = run_from_dict(_row_doc(row, mname, where), where, None, limits)
    run = dataclasses.replace(run, name=rid)
    hw = catalog.hardware(run.gpu)
    try:
        plans.flushes(run.layout, run.training)      # a local batch that does not divide the step
    except ModelcutError as exc:
        raise ModelcutError(f"{where}: {exc}") from None
    fw = row.get("framework", "").strip() or None
    if fw is not None:
        try:   # any spelling the presets' index takes ("torchtitan", "Megatron-LM"), as --framework does
            fw = catalog.framework(fw).name
        except ModelcutError as exc:
            raise ModelcutError(f"{where}: {exc}") from None
    try:
        ov, unmodelled = read_overlap(row.get("overlap", "").replace(";", ","))
    except ModelcutError as exc:
        raise ModelcutError(f"{where}: {exc}") from None
    figures = {k: _float(row, k, where) for k in ("tflops_per_gpu", "tokens_per_s_per_gpu", "step_time_s")}
    if all(v is None for v in figures.values()):
        raise ModelcutError(f"{where}: give tflops_per_gpu, tokens_per_s_per_gpu or step_time_s")
    for k, v in figures.items():
        if v is not None and not (math.isfinite(v) and v > 0):
            raise ModelcutError(f"{where}: {k} must be a positive number, got {v!r}")
    tflops, tps, step = figures.values()
    if step is None and tps is not None:
        step = run.step_time_s(tps)
    conv = row.get("flop_convention", "").strip() or None
    if conv is not None and conv not in flops.CONVENTIONS:
        raise ModelcutError(f"{where}: flop_convention must be one of {', '.join(flops.CONVENTIONS)}, got {conv!r}")
    counted = flops.model_flops(run.model, run.training, conv) if conv is not None else None
    group = row.get("group", "").strip() or (fw or catalog.default_framework())
    meas = Measured(rid, group, run, hw, fw, ov, None if step is not None else tflops, step, source,
                    counted, tuple(unmodelled))
    # (FP8 on an accelerator without it is refused when the row is predicted, in its own words.)
    mfu = measured_mfu(meas) if run.training.precision != "fp8" or hw.fp8_recipes else 0.0
    if mfu > 1:
        given = next(k for k in ("step_time_s", "tokens_per_s_per_gpu", "tflops_per_gpu") if figures[k] is not None)
        raise ModelcutError(f"{where}: {given} {figures[given]:g} means an MFU of {100 * mfu:,.0f} % (the step's "
                            f"causal work over the {hw.name}'s {mfu_peak(hw, run.training) / 1e12:,.0f} TFLOP/s "
                            "peak): no step does more work than the GPUs can; check the figure and its unit")
    return meas
