"""Published runs (runs.toml, every row with its source) and how each was really run (runs_dev.toml:
framework, micro-batch, interleaving, recomputation, cross-validation group)."""

from __future__ import annotations

import difflib

import tomllib
from dataclasses import dataclass, field, replace
from functools import lru_cache
from importlib import resources
from typing import Any

from ..core.costs.flops import CONVENTIONS
from ..core.errors import ModelcutError
from ..core.sim import registry
from ..core.specs import Run
from .frameworks import framework_names, overlap_table
from .hardware import hardware
from .models import model
from .tables import layout_from_table, model_from_table, training_from_table


def _toml(name: str) -> dict:
    return tomllib.loads(resources.files("modelcut.catalog").joinpath(name).read_text(encoding="utf-8"))


@dataclass(frozen=True)
class PublishedRun:
    """One published training run, as the source reports it.

    ``family``: whose stack ran it ("megatron", "llama3", "zero3"); ``set``: "deck" for the 13
    rows the deck's model is checked on, "dev" for the development set. ``published_tflops``
    (TFLOP/s per GPU as the source counts it: ``flop_convention``, None for modelcut's own count)
    and ``published_step_time_s`` are None where the source does not print them (or, for the step
    time, the reference file does not infer it; the notes say which). ``published_tokens_per_s``
    is per GPU; ``published_mfu`` and ``published_hfu`` are fractions. ``script``: settings from
    the authors' released scripts where they differ from what the paper states (micro-batch,
    interleaving). ``precision``: "bf16" (the default) or "fp16" for 16-bit mixed precision,
    "fp8" for FP8 matrix products, with ``fp8_recipe`` (e.g. "current" scaling) where stated.
    ``validate``: false keeps a run the model cannot be compared with (or cannot express) out of
    the validation tables; ``notes`` says why."""

    id: str
    family: str
    run: Run
    published_tflops: float | None
    published_step_time_s: float | None
    source: str
    notes: str = ""
    set: str = "deck"
    gpus: int = 0
    published_mfu: float | None = None
    published_pct_peak: float | None = None
    script: dict = field(default_factory=dict)
    precision: str = "bf16"
    fp8_recipe: str | None = None
    validate: bool = True
    flop_convention: str | None = None
    published_tokens_per_s: float | None = None
    published_hfu: float | None = None

    @property
    def in_validation(self) -> bool:
        """Whether the validation tables score this run: not marked ``validate = false`` (the
        reason in ``notes``). FP8 runs are scored in FP8 (their ``Training.precision``)."""
        return self.validate


#: Run precisions: 16-bit mixed precision ("bf16", the default, or "fp16"), or FP8 matrix products.
PRECISIONS = ("bf16", "fp16", "fp8")
#: What a run's published TFLOP/s (or MFU) counts, where it is not modelcut's own count
#: (:func:`modelcut.analysis.measured.counted_flops`): a core convention's model FLOPs without
#: recomputation (:data:`modelcut.core.costs.flops.CONVENTIONS`), or "source", the source's own
#: count, which modelcut does not reproduce (the notes say what it is): such a run compares by step
#: time only.
FLOP_CONVENTIONS = CONVENTIONS + ("source",)
_RUN_KEYS = ("id", "family", "set", "model", "gpu", "gpus", "gpus_per_node", "layout", "training",
             "published_tflops", "published_step_time_s", "published_mfu", "published_pct_peak",
             "published_hfu", "published_tokens_per_s", "script", "source", "notes", "precision",
             "fp8_recipe", "validate", "flop_convention")


@lru_cache(maxsize=None)
def _runs() -> tuple[PublishedRun, ...]:
    out = []
    seen = set()
    for row in _toml("runs.toml")["run"]:
        rid = row["id"]
        where = f"runs.toml {rid!r}"
        if rid in seen:
            raise ModelcutError(f"{where}: duplicate id")
        seen.add(rid)
        for k in row:
            if k not in _RUN_KEYS:
                raise ModelcutError(f"{where}: unknown key {k!r} (allowed: {', '.join(_RUN_KEYS)})")
        precision = row.get("precision", "bf16")
        if precision not in PRECISIONS:
            raise ModelcutError(f"{where}: precision must be one of {', '.join(PRECISIONS)}, got {precision!r}")
        if "fp8_recipe" in row and precision != "fp8":
            raise ModelcutError(f"{where}: fp8_recipe given for a {precision} run")
        conv = row.get("flop_convention")
        if conv is not None and conv not in FLOP_CONVENTIONS:
            raise ModelcutError(f"{where}: flop_convention must be one of {', '.join(FLOP_CONVENTIONS)}, got {conv!r}")
        if not isinstance(row.get("validate", True), bool):
            raise ModelcutError(f"{where}: validate must be true or false")
        if row.get("validate", True) is False and not row.get("notes"):
            raise ModelcutError(f"{where}: validate = false needs the reason in notes")
        spec = model(row["model"]) if isinstance(row["model"], str) else model_from_table(
            row["model"], where=f"{where} model")
        layout = layout_from_table(row["layout"], f"{where} layout")
        if layout.gpus != row["gpus"]:
            raise ModelcutError(f"{where}: layout product {layout.gpus} != gpus {row['gpus']}")
        tr = dict(row["training"])
        tr.setdefault("precision", precision)                 # the run's precision times its products
        if row.get("fp8_recipe") is not None:
            tr.setdefault("fp8_recipe", row["fp8_recipe"])
        run = Run(model=spec, gpu=hardware(row["gpu"]).name, layout=layout,
                  training=training_from_table(tr, f"{where} training"),
                  gpus_per_node=row.get("gpus_per_node"), name=rid)
        out.append(PublishedRun(
            id=rid, family=row["family"], run=run,
            published_tflops=_num(row.get("published_tflops")),
            published_step_time_s=_num(row.get("published_step_time_s")),
            source=row["source"], notes=row.get("notes", ""), set=row.get("set", "deck"), gpus=row["gpus"],
            published_mfu=_num(row.get("published_mfu")), published_pct_peak=_num(row.get("published_pct_peak")),
            script=dict(row.get("script", {})), precision=precision, fp8_recipe=row.get("fp8_recipe"),
            validate=row.get("validate", True), flop_convention=conv,
            published_tokens_per_s=_num(row.get("published_tokens_per_s")),
            published_hfu=_num(row.get("published_hfu"))))
    return tuple(out)


def _num(x: Any) -> float | None:
    return None if x is None else float(x)


def published_runs(which: str | None = None) -> list[PublishedRun]:
    """Published runs: ``which="deck"`` the 13 rows of the deck's table, ``"dev"`` the
    development set, None all of them."""
    runs = _runs()
    if which is None:
        return list(runs)
    if which not in ("deck", "dev"):
        raise ModelcutError(f"run set must be 'deck' or 'dev', got {which!r}")
    return [r for r in runs if r.set == which]


def published_run(run_id: str) -> PublishedRun:
    for r in _runs():
        if r.id == run_id:
            return r
    ids = [r.id for r in _runs()]
    close = difflib.get_close_matches(str(run_id), ids, n=4, cutoff=0.6)
    hint = f"closest: {', '.join(close)}; " if close else ""
    raise ModelcutError(f"unknown published run {run_id!r}; {hint}all {len(ids)}: modelcut list runs")



@dataclass(frozen=True)
class RunSettings:
    id: str
    framework: str
    group: str
    micro_batch: int | None = None
    vpp: int | None = None
    recompute: str | None = None
    source: str = ""
    schedule: str | None = None
    sequence_parallel: bool | None = None
    overlap: dict[str, bool] = field(default_factory=dict)   # overlap overrides of the preset, as --overlap
    cross_entropy: str | None = None                         # the loss's kernel where the run's configuration chose it
    recompute_modules: tuple[str, ...] | None = None         # selective recomputation's modules, where named
    recompute_layers: int | None = None                      # full recomputation of each chunk's first N layers

    def overlap_text(self) -> str | None:
        """The overrides as ``--overlap`` writes them (``tp_comm=on``), None without any."""
        return ",".join(f"{k}={'on' if v else 'off'}" for k, v in self.overlap.items()) or None


@lru_cache(maxsize=None)
def run_settings() -> dict[str, RunSettings]:
    """runs_dev.toml: how each published run was really run."""
    out = {}
    for row in _toml("runs_dev.toml").get("settings", []):
        rid = row["id"]
        if rid in out:
            raise ModelcutError(f"runs_dev.toml: {rid!r} appears twice")
        if row["framework"] not in framework_names():
            raise ModelcutError(f"runs_dev.toml {rid!r}: unknown framework {row['framework']!r}")
        if row.get("schedule") is not None:
            registry.get(row["schedule"])
        if not isinstance(row.get("sequence_parallel", False), bool):
            raise ModelcutError(f"runs_dev.toml {rid!r}: sequence_parallel must be true or false")
        out[rid] = RunSettings(rid, row["framework"], row.get("group", row["framework"]), row.get("micro_batch"),
                               row.get("vpp"), row.get("recompute"), row.get("source", ""), row.get("schedule"),
                               row.get("sequence_parallel"),
                               overlap_table(row.get("overlap"), f"runs_dev.toml {rid!r}"), row.get("cross_entropy"),
                               tuple(row["recompute_modules"]) if row.get("recompute_modules") is not None else None,
                               row.get("recompute_layers"))
    return out


def apply_settings(run: Run, st: RunSettings | None) -> Run:
    """The run as it was really run: micro-batch, recomputation, interleaving, schedule, sequence
    parallelism and the loss's kernel from its settings."""
    if st is None:
        return run
    if st.micro_batch is not None:
        run = replace(run, training=replace(run.training, micro_batch=st.micro_batch))
    if st.recompute is not None:
        run = replace(run, training=replace(run.training, recompute=st.recompute,
                                            recompute_modules=st.recompute_modules,
                                            recompute_layers=st.recompute_layers))
    if st.vpp is not None:
        run = run.with_layout(vpp=st.vpp if st.vpp > 1 else None)
    if st.schedule is not None:
        run = run.with_layout(schedule=st.schedule)
    if st.sequence_parallel is not None:
        run = run.with_layout(sequence_parallel=st.sequence_parallel)
    if st.cross_entropy is not None:
        run = replace(run, training=replace(run.training, cross_entropy=st.cross_entropy))
    return run
