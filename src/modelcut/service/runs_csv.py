"""A user's measured runs from a CSV file (``modelcut calibrate --runs``; columns :data:`CSV_COLUMNS`):
each bad row is a one-line error."""

from __future__ import annotations

import csv
import math
from pathlib import Path

from .. import catalog
from ..analysis.measured import Measured
from ..core import plan as plans
from ..core.errors import ModelcutError
from ..core.specs import Layout, Run, Training
from ..core.step.checks import check_run
from . import inputs
from .inputs import parse_overlap
from .limits import Limits
from .runfile import check_sizes


# ---------------------------------------------------------------- a user's runs (CSV)

#: Columns of ``modelcut calibrate --runs FILE.csv``: name -> meaning. Required: id, model, gpu,
#: gpus_per_node may be empty (the hardware's), tp, pp, dp, seq_len, global_batch, micro_batch
#: and one of tflops_per_gpu / step_time_s.
CSV_COLUMNS: dict[str, str] = {
    "id": "a name for the run",
    "group": "cross-validation group (default: the framework)",
    "model": "a catalog model name (modelcut models) or a path to a Hugging Face config.json",
    "gpu": "a catalog accelerator name or alias",
    "gpus_per_node": "accelerators per node (default: the hardware's)",
    "tp": "tensor-parallel size", "cp": "context-parallel size (default 1)", "pp": "pipeline stages",
    "dp": "data-parallel size", "vpp": "interleaved chunks per device (default 1)",
    "sequence_parallel": "true/false (default: the stack's, on with tp > 1 under Megatron-core and torchtitan)", "zero": "ZeRO stage 0-3 (default: the stack's, 3 under FSDP)",
    "seq_len": "tokens per sequence", "global_batch": "sequences per step",
    "micro_batch": "sequences per micro-batch", "recompute": "none, selective or full (default none)",
    "recompute_modules": "with selective: the modules recomputed, e.g. layernorm;moe_act (core_attn, layernorm, "
                         "moe_act; default: the stack's selective policy)",
    "local_batch": "with a pipeline: sequences per data-parallel rank per schedule run (default: one run a step)",
    "cross_entropy": "the loss's kernel: fp32-passes, fused, mcore-fused, torch or torch-fp32 (default: the framework's)",
    "framework": "a preset (modelcut predict --help lists them; default megatron-core)",
    "overlap": "overrides, e.g. grad_reduce=off;tp_comm=on",
    "tflops_per_gpu": "measured TFLOP/s per GPU, counted as modelcut counts them",
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


def _opt_int(row: dict, key: str, where: str) -> int | None:
    """An optional integer column: None where the cell is empty."""
    return _int(row, key, where, 0) if (row.get(key) or "").strip() else None


def _float(row: dict, key: str, where: str) -> float | None:
    val = (row.get(key) or "").strip()
    if not val:
        return None
    try:
        return float(val)
    except ValueError:
        raise ModelcutError(f"{where}: {key} must be a number, got {val!r}") from None


def read_runs_csv(path: str | Path, limits: Limits | None = None) -> list[Measured]:
    """A user's measured runs (columns :data:`CSV_COLUMNS`); each bad row is a one-line error."""
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
    if reader.fieldnames is None:
        raise ModelcutError(f"{p}: empty file")
    unknown = [c for c in reader.fieldnames if c and c.strip() not in CSV_COLUMNS]
    if unknown:
        raise ModelcutError(f"{p}: unknown column {unknown[0]!r} (columns: {', '.join(CSV_COLUMNS)})")
    out = []
    for i, row in enumerate(reader, start=2):
        row = {k.strip(): (v or "") for k, v in row.items() if k}
        where = f"{p}:{i}"
        rid = row.get("id", "").strip() or f"row{i}"
        mname = row.get("model", "").strip()
        if not mname:
            raise ModelcutError(f"{where}: missing 'model'")
        spec = inputs.model_spec(mname, limits)
        hw = catalog.hardware(row.get("gpu", "").strip() or "?")
        sp = row.get("sequence_parallel", "").strip().lower()
        if sp not in ("", "true", "false", "1", "0", "yes", "no"):
            raise ModelcutError(f"{where}: sequence_parallel must be true or false, got {sp!r}")
        vpp = _int(row, "vpp", where, 1)
        try:
            layout = Layout(tp=_int(row, "tp", where), cp=_int(row, "cp", where, 1), pp=_int(row, "pp", where),
                            dp=_int(row, "dp", where), vpp=vpp if vpp and vpp > 1 else None,
                            sequence_parallel=sp in ("true", "1", "yes") if sp else None, zero=_opt_int(row, "zero", where))
            training = Training(seq_len=_int(row, "seq_len", where), global_batch=_int(row, "global_batch", where),
                                micro_batch=_int(row, "micro_batch", where),
                                recompute=(row.get("recompute", "").strip() or "none"),
                                recompute_modules=tuple(m.strip() for m in row.get("recompute_modules", "").split(";")
                                                        if m.strip()) or None,
                                local_batch=_int(row, "local_batch", where, 0) or None,
                                cross_entropy=row.get("cross_entropy", "").strip() or None)
            plans.flushes(layout, training)      # a local batch that does not divide the step
        except ModelcutError as exc:
            msg = str(exc)
            raise ModelcutError(msg if msg.startswith(where) else f"{where}: {msg}") from None
        gpn = _int(row, "gpus_per_node", where, 0) or None
        fw = row.get("framework", "").strip() or None
        if fw is not None and fw not in catalog.framework_names():
            raise ModelcutError(f"{where}: unknown framework {fw!r}; choose one of {', '.join(catalog.framework_names())}")
        ov = parse_overlap(row.get("overlap", "").replace(";", ","))
        tflops, step = _float(row, "tflops_per_gpu", where), _float(row, "step_time_s", where)
        if tflops is None and step is None:
            raise ModelcutError(f"{where}: give tflops_per_gpu or step_time_s")
        if tflops is not None and not (math.isfinite(tflops) and tflops > 0):
            raise ModelcutError(f"{where}: tflops_per_gpu must be a positive number, got {tflops!r}")
        if step is not None and not (math.isfinite(step) and step > 0):
            raise ModelcutError(f"{where}: step_time_s must be a positive number, got {step!r}")
        run = Run(model=spec, gpu=hw.name, layout=layout, training=training, gpus_per_node=gpn, name=rid)
        try:
            check_sizes(run, limits)
            check_run(run)
        except ModelcutError as exc:
            raise ModelcutError(f"{where}: {exc}") from None
        group = row.get("group", "").strip() or (fw or "megatron-core")
        out.append(Measured(rid, group, run, hw, fw, ov, None if step is not None else tflops, step, str(p)))
    if not out:
        raise ModelcutError(f"{p}: no runs")
    return out
