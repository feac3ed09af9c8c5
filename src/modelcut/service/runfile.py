"""RUN.toml -> :class:`~modelcut.core.specs.Run`: the input parser of ``modelcut predict``.

```toml
[model]            # the fields; or name = "llama3-405b" (catalog); or config = "path/config.json"
layers = 96
hidden = 12288
ffn_hidden = 49152
heads = 96
kv_heads = 96
vocab = 51200
gated_mlp = false
tied_embeddings = true
# experts = 8            # mixture of experts: routed experts (1: dense), top_k, expert_ffn_hidden,
# top_k = 2              # shared_experts, dense_layers (leading dense layers), capacity_factor
[hardware]
gpu = "a100-sxm4-80gb"   # a catalog name or alias
gpus = 64                # must equal tp·cp·pp·dp
gpus_per_node = 8        # default: the hardware's
[layout]                 # tp, cp, pp, dp, vpp, sequence_parallel, zero, schedule, ep, etp, cp_kind, order
tp = 8
pp = 8
dp = 1
# ep = 8                 # expert parallelism (an MoE model; divides the experts and dp)
# etp = 1                # expert tensor parallelism (default tp)
# cp_kind = "ring"       # or "allgather": context parallelism's form (with cp > 1; default: the
#                        # framework's, ring for megatron-core/nemo, all-gather otherwise)
[training]
seq_len = 2048
global_batch = 64        # sequences per step
micro_batch = 1
recompute = "full"       # none | selective | full
# precision = "fp8"      # bf16 (default) | fp16 | fp8: the matrix products' precision
# fp8_recipe = "delayed" # with fp8: delayed | current | blockwise | mxfp8 (default: the stack's choice)
```

Every problem is one :class:`ModelcutError` line naming the file and the problem.
"""

from __future__ import annotations

import tomllib
from pathlib import Path

from .. import catalog
from ..core.errors import ModelcutError
from ..core.specs import Run
from ..core.step.checks import check_run

SECTIONS = ("model", "hardware", "layout", "training")
HARDWARE_KEYS = ("gpu", "gpus", "gpus_per_node")


def _table(doc: dict, key: str, where: str) -> dict:
    t = doc.get(key)
    if t is None:
        raise ModelcutError(f"{where}: missing [{key}] section")
    if not isinstance(t, dict):
        raise ModelcutError(f"{where}: [{key}] must be a table")
    return t


def _prefixed(build, table: dict, where: str):
    """Build a spec; its own one-line errors get the file and section in front."""
    try:
        return build(table, where)
    except ModelcutError as exc:
        msg = str(exc)
        raise ModelcutError(msg if msg.startswith(where) else f"{where}: {msg}") from None
    except TypeError as exc:
        raise ModelcutError(f"{where}: {exc}") from None


def load_run(path: str | Path) -> Run:
    """Read and check a RUN.toml file."""
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ModelcutError(f"{p}: no such file") from None
    except IsADirectoryError:
        raise ModelcutError(f"{p}: is a directory, not a RUN.toml file") from None
    try:
        doc = tomllib.loads(text)
    except tomllib.TOMLDecodeError as exc:
        raise ModelcutError(f"{p.name}: invalid TOML: {exc}") from None
    return run_from_dict(doc, p.name, p.parent)


def run_from_dict(doc: dict, where: str = "RUN.toml", base: Path | None = None) -> Run:
    """A Run from a parsed RUN.toml document; ``base`` resolves a relative ``config`` path."""
    for k in doc:
        if k not in SECTIONS:
            raise ModelcutError(f"{where}: unknown section [{k}] (allowed: {', '.join(SECTIONS)})")

    # [model]
    mt = _table(doc, "model", where)
    if "config" in mt:
        extra = [k for k in mt if k not in ("config", "name")]
        if extra:
            raise ModelcutError(f"{where}: [model] with config takes no other fields, got {extra[0]!r}")
        cfg = Path(str(mt["config"]))
        if base is not None and not cfg.is_absolute():
            cfg = base / cfg
        model = catalog.load_hf_config(cfg, mt.get("name"))
    elif set(mt) == {"name"}:
        try:
            model = catalog.model(mt["name"])
        except ModelcutError as exc:
            raise ModelcutError(f"{where} [model]: {exc}") from None
    else:
        model = catalog.model_from_table(mt, name=str(mt.get("name", Path(where).stem)), where=f"{where} [model]")

    # [hardware]
    ht = _table(doc, "hardware", where)
    for k in ht:
        if k not in HARDWARE_KEYS:
            raise ModelcutError(f"{where} [hardware]: unknown key {k!r} (allowed: {', '.join(HARDWARE_KEYS)})")
    if "gpu" not in ht:
        raise ModelcutError(f"{where} [hardware]: missing 'gpu'")
    try:
        hw = catalog.hardware(ht["gpu"])
    except ModelcutError as exc:
        raise ModelcutError(f"{where} [hardware]: {exc}") from None
    gpn = ht.get("gpus_per_node")
    if gpn is not None and (isinstance(gpn, bool) or not isinstance(gpn, int) or gpn < 1):
        raise ModelcutError(f"{where} [hardware]: gpus_per_node must be a positive integer, got {gpn!r}")

    # [layout], [training]
    layout = _prefixed(catalog.layout_from_table, _table(doc, "layout", where), f"{where} [layout]")
    training = _prefixed(catalog.training_from_table, _table(doc, "training", where), f"{where} [training]")
    gpus = ht.get("gpus")
    if gpus is not None:
        if isinstance(gpus, bool) or not isinstance(gpus, int) or gpus < 1:
            raise ModelcutError(f"{where} [hardware]: gpus must be a positive integer, got {gpus!r}")
        if layout.gpus != gpus:
            raise ModelcutError(f"{where}: layout tp·cp·pp·dp = {layout.tp}·{layout.cp}·{layout.pp}·{layout.dp} "
                                f"= {layout.gpus} is not the GPU count {gpus}")
    run = Run(model=model, gpu=hw.name, layout=layout, training=training, gpus_per_node=gpn, name=where)
    try:
        check_run(run)
    except ModelcutError as exc:
        raise ModelcutError(f"{where}: {exc}") from None
    return run


SETTINGS_KEYS = ("framework", "overlap")


def load_run_with_settings(path: str | Path) -> tuple[Run, dict]:
    """A RUN.toml and its optional [settings] table (framework = a preset of ``modelcut predict
    --framework``, overlap = overrides as ``--overlap`` takes them)."""
    path = Path(path)
    try:
        doc = tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError):
        return load_run(path), {}        # its one-line error
    st = doc.pop("settings", None)
    if st is None:
        return load_run(path), {}
    if not isinstance(st, dict):
        raise ModelcutError(f"{path.name}: [settings] must be a table")
    for k, v in st.items():
        if k not in SETTINGS_KEYS:
            raise ModelcutError(f"{path.name} [settings]: unknown key {k!r} (allowed: {', '.join(SETTINGS_KEYS)})")
        if not isinstance(v, str):
            raise ModelcutError(f"{path.name} [settings]: {k} must be a string, got {v!r}")
    return run_from_dict(doc, path.name, path.parent), dict(st)
