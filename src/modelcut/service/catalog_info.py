"""What the faces list: schedules with their traits, accelerators, models, frameworks, modes."""

from __future__ import annotations

import dataclasses
from typing import Any

from .. import catalog
from ..core.errors import ModelcutError
from ..core.costs.context import CP_KIND_DOCS, CP_KIND_LABELS, CP_KINDS
from ..core.costs.flops import param_count
from ..core.sim import registry
from ..core.specs import ATTENTION_KINDS, FP8_RECIPES, GRAD_REDUCE_DTYPES, PRECISIONS
from ..core.units import FP32_BYTES
from ..core.step import MODES


def schedules() -> list[dict[str, Any]]:
    """Every schedule of the registry: name, default and fixed chunks, split backward, whether the
    explorer searches it unless told otherwise, summary."""
    return [{"name": s.name, "default_chunks": s.default_chunks, "chunks_fixed": s.fixed_chunks,
             "split_backward": s.split_backward, "explored_by_default": s.explored_by_default,
             "doc": s.summary} for s in registry.SCHEDULES.values()]


def schedule_help() -> str:
    """The schedules for a ``--schedule`` help line."""
    return ", ".join(registry.names()) + ", or torch:<Class> (modelcut[torch]) for torch's own"


def listing() -> dict[str, Any]:
    return {"schedules": schedules(),
            "cp_kinds": [{"name": k, "label": CP_KIND_LABELS[k], "doc": CP_KIND_DOCS[k]} for k in CP_KINDS],
            "hardware": [h.as_dict() for h in catalog.all_hardware()],
            "models": [dataclasses.asdict(m) for m in catalog.all_models()], "modes": list(MODES),
            "frameworks": list(catalog.framework_names()),
            "default_framework": catalog.default_framework(),
            "precisions": list(PRECISIONS), "fp8_recipes": list(FP8_RECIPES),
            "grad_reduce_dtypes": list(GRAD_REDUCE_DTYPES), "attention_kinds": list(ATTENTION_KINDS),
            "framework_fp8_recipes": {name: list(catalog.framework(name).fp8_recipes)
                                      for name in catalog.framework_names()},
            "framework_aliases": {alias: name for name in catalog.framework_names()
                                  for alias in catalog.frameworks.framework_aliases(name)}}


# ---------------------------------------------------------------- what ``modelcut list`` shows

#: What ``modelcut list KIND`` lists, with a line on each.
KINDS = {"models": "the catalog's models: shape, parameters (total and active), source",
         "hardware": "the accelerators: peaks, memory, bandwidths, power limit (Cap: a GPU name with @<watts>w holds it to a lower one), FP8 recipes, source",
         "frameworks": "the training-stack presets: other names, kernels, overlaps, sharding, source",
         "schedules": "the pipeline schedules of the registry",
         "runs": "the published runs: layout, batch, precision, the published figure, source"}


def _models() -> list[dict[str, Any]]:
    return [{"name": m.name, "aliases": list(catalog.models.model_aliases(m.name)),
             "params_b": param_count(m) / 1e9, "active_params_b": param_count(m, active=True) / 1e9,
             "layers": m.layers, "hidden": m.hidden, "heads": m.heads, "kv_heads": m.kv_heads,
             "kv_lora_rank": m.kv_lora_rank,
             "vocab": m.vocab, "experts": m.experts, "top_k": m.top_k, "max_seq": m.max_seq,
             "source": m.source} for m in catalog.all_models()]


def _hardware() -> list[dict[str, Any]]:
    return [{"name": h.name, "aliases": list(h.aliases), "peak_tflops_16": h.peak_flops_16 / 1e12,
             "peak_tflops_8": (h.peak_flops_8 / 1e12) if h.fp8_recipes else None,
             "memory_gb": h.mem_bytes / 1e9, "memory_gib": h.mem_bytes / 2**30, "memory_tb_s": h.mem_bw / 1e12,
             "link_gb_s": h.link_bw / 1e9, "net_gb_s": h.net_bw / 1e9, "per_node": h.per_node,
             "power_w": h.power_w, "power_cap": h.cappable,
             "fp8_recipes": list(h.fp8_recipes), "source": h.source} for h in catalog.all_hardware()]


def _frameworks() -> list[dict[str, Any]]:
    out = []
    for name in catalog.framework_names():
        fw = catalog.framework(name)
        out.append({"name": name, "aliases": list(catalog.frameworks.framework_aliases(name)),
                    "default": name == catalog.default_framework(), "attention": fw.attention,
                    "default_zero": fw.default_zero,
                    "overlaps": [k for k, on in dataclasses.asdict(fw.overlap).items() if on],
                    "selective": fw.selective, "compiled": fw.torch_compile, "cp_impl": fw.cp_impl,
                    "cp_kind": fw.cp_kind, "nccl": fw.nccl, "fp8_library": fw.fp8_library,
                    "fp8_recipes": list(fw.fp8_recipes), "fp8_param_gather": fw.fp8_param_gather,
                    "grad_reduce": "fp32" if fw.grad_bytes == FP32_BYTES else "16-bit", "source": fw.source})
    return out


def _runs() -> list[dict[str, Any]]:
    out = []
    settings = catalog.run_settings()
    for pr in catalog.published_runs():
        lay, tr = pr.run.layout, pr.run.training
        st = settings.get(pr.id)
        out.append({"id": pr.id, "group": st.group if st else pr.family,
                    "framework": st.framework if st else None, "model": pr.run.model.name, "gpu": pr.run.gpu,
                    "gpus": lay.gpus, "tp": lay.tp, "cp": lay.cp, "pp": lay.pp, "dp": lay.dp, "ep": lay.ep,
                    "seq_len": tr.seq_len, "global_batch": tr.global_batch, "precision": pr.precision,
                    "published_tflops": pr.published_tflops, "published_step_time_s": pr.published_step_time_s,
                    "in_validation": pr.in_validation, "source": pr.source})
    return out


def rows(kind: str) -> list[dict[str, Any]]:
    """The entries ``modelcut list KIND`` shows (:data:`KINDS`), as JSON-ready dicts."""
    if kind not in KINDS:
        raise ModelcutError(f"unknown list {kind!r}; choose one of {', '.join(KINDS)}")
    if kind == "schedules":
        return schedules()
    return {"models": _models, "hardware": _hardware, "frameworks": _frameworks, "runs": _runs}[kind]()
