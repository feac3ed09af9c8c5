"""Published runs (runs.toml, every row with its source) and how each was really run (runs_dev.toml:
framework, micro-batch, interleaving, recomputation, cross-validation group)."""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, field, replace
from functools import lru_cache
from importlib import resources
from typing import Any

from ..core.errors import ModelcutError
from ..core.specs import Run
from .frameworks import framework_names
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
    (TFLOP/s per GPU as the source counts it) and ``published_step_time_s`` are None where the
    source does not print them. ``script``: settings from the authors' released scripts where
    they differ from what the paper states (micro-batch, interleaving)."""

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
        spec = model(row["model"]) if isinstance(row["model"], str) else model_from_table(
            row["model"], where=f"{where} model")
        layout = layout_from_table(row["layout"], f"{where} layout")
        if layout.gpus != row["gpus"]:
            raise ModelcutError(f"{where}: layout product {layout.gpus} != gpus {row['gpus']}")
        run = Run(model=spec, gpu=hardware(row["gpu"]).name, layout=layout,
                  training=training_from_table(row["training"], f"{where} training"),
                  gpus_per_node=row.get("gpus_per_node"), name=rid)
        out.append(PublishedRun(
            id=rid, family=row["family"], run=run,
            published_tflops=_num(row.get("published_tflops")),
            published_step_time_s=_num(row.get("published_step_time_s")),
            source=row["source"], notes=row.get("notes", ""), set=row.get("set", "deck"), gpus=row["gpus"],
            published_mfu=_num(row.get("published_mfu")), published_pct_peak=_num(row.get("published_pct_peak")),
            script=dict(row.get("script", {}))))
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
    raise ModelcutError(f"unknown published run {run_id!r}; choose one of {', '.join(r.id for r in _runs())}")



@dataclass(frozen=True)
class RunSettings:
    id: str
    framework: str
    group: str
    micro_batch: int | None = None
    vpp: int | None = None
    recompute: str | None = None
    source: str = ""


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
        out[rid] = RunSettings(rid, row["framework"], row.get("group", row["framework"]), row.get("micro_batch"),
                               row.get("vpp"), row.get("recompute"), row.get("source", ""))
    return out


def apply_settings(run: Run, st: RunSettings | None) -> Run:
    """The run as it was really run: micro-batch and interleaving from its settings."""
    if st is None:
        return run
    if st.micro_batch is not None:
        run = replace(run, training=replace(run.training, micro_batch=st.micro_batch))
    if st.recompute is not None:
        run = replace(run, training=replace(run.training, recompute=st.recompute))
    if st.vpp is not None:
        run = run.with_layout(vpp=st.vpp if st.vpp > 1 else None)
    return run
