"""Fitted hardware profiles for the default model, and the runs they are fitted on.

A *profile* (``<hardware>.toml`` here, or any file ``modelcut calibrate --out`` writes) holds
the default model's three constants (:class:`modelcut.core.kernels.Efficiency`) for one
accelerator, which of them were fitted, the runs they were fitted on and the fit's errors.
``runs_dev.toml`` (next to ``runs.toml``) says how each published run was really run
(framework, micro-batch, interleaving) and its cross-validation group.

A user's own measured runs come from a CSV file (:func:`read_runs_csv`; columns in
:data:`CSV_COLUMNS`).
"""

from __future__ import annotations

import csv
import tomllib
from dataclasses import dataclass, replace
from functools import lru_cache
from importlib import resources
from pathlib import Path

from ...core.calibrate import Fit, Measured, counted_flops
from ...core.errors import ModelcutError
from ...core.kernels import NAMES, Efficiency
from ...core.overlap import FRAMEWORKS, parse_overlap
from ...core.specs import Hardware, Layout, Run, Training

__all__ = ["Profile", "profile_for", "load_profile", "write_profile", "run_settings", "catalog_measured",
           "read_runs_csv", "CSV_COLUMNS", "all_profiles"]


@dataclass(frozen=True)
class Profile:
    """Constants for one accelerator and where they come from."""

    hardware: str
    efficiency: Efficiency
    fitted: tuple[str, ...]
    runs: tuple[str, ...]
    source: str = ""
    inherits: str = ""            # the profile the unfitted constants were taken from
    mean_abs_error_pct: float | None = None
    max_abs_error_pct: float | None = None
    path: str = ""
    errors_pct: tuple[tuple[str, float], ...] = ()
    #: leave-one-group-out: (group, gemm, mem, net, runs, mean |error| %, largest |error| %)
    cv: tuple[tuple[str, float, float, float, int, float, float], ...] = ()


def _profile_from_table(data: dict, where: str) -> Profile:
    for k in ("hardware", "gemm", "mem", "net"):
        if k not in data:
            raise ModelcutError(f"{where}: missing {k!r}")
    try:
        eff = Efficiency(float(data["gemm"]), float(data["mem"]), float(data["net"]))
    except (TypeError, ValueError):
        raise ModelcutError(f"{where}: gemm, mem and net must be numbers") from None
    fitted = tuple(data.get("fitted", ()))
    for k in fitted:
        if k not in NAMES:
            raise ModelcutError(f"{where}: fitted names unknown constant {k!r}")
    cv = []
    for g, row in (data.get("cv") or {}).items():
        try:
            cv.append((str(g), float(row["gemm"]), float(row["mem"]), float(row["net"]), int(row["runs"]),
                       float(row["mean_abs_error_pct"]), float(row["max_abs_error_pct"])))
        except (KeyError, TypeError, ValueError):
            raise ModelcutError(f"{where}: [cv.{g}] needs gemm, mem, net, runs, mean_abs_error_pct, "
                                "max_abs_error_pct") from None
    errs = tuple((str(k), float(v)) for k, v in (data.get("errors_pct") or {}).items())
    return Profile(str(data["hardware"]), eff, fitted, tuple(data.get("runs", ())), str(data.get("source", "")),
                   str(data.get("inherits", "")), data.get("mean_abs_error_pct"), data.get("max_abs_error_pct"),
                   where, errs, tuple(cv))


@lru_cache(maxsize=None)
def all_profiles() -> tuple[Profile, ...]:
    """The profiles shipped with modelcut."""
    out = []
    for entry in sorted(resources.files(__package__).iterdir(), key=lambda e: e.name):
        if entry.name.endswith(".toml"):
            out.append(_profile_from_table(tomllib.loads(entry.read_text(encoding="utf-8")),
                                           f"profiles/{entry.name}"))
    return tuple(out)


#: The profile used for hardware that has none of its own.
FALLBACK = "a100-sxm4-80gb"


def profile_for(hw: Hardware | str) -> Profile:
    """The shipped profile for an accelerator (by catalog name); hardware without one gets
    the A100's (its ``source`` says so)."""
    name = hw.name if isinstance(hw, Hardware) else str(hw)
    profiles = {p.hardware: p for p in all_profiles()}
    if name in profiles:
        return profiles[name]
    if FALLBACK not in profiles:
        from ...core.calibrate import START
        return Profile(name, START, (), (), source="no fitted profile shipped: the fit's starting values")
    fb = profiles[FALLBACK]
    return replace(fb, hardware=name, source=f"no profile fitted for {name}: {FALLBACK}'s constants")


def load_profile(path: str | Path) -> Profile:
    """A profile file (as ``modelcut calibrate --out`` writes it)."""
    p = Path(path)
    try:
        data = tomllib.loads(p.read_text(encoding="utf-8"))
    except FileNotFoundError:
        raise ModelcutError(f"{p}: no such file") from None
    except tomllib.TOMLDecodeError as exc:
        raise ModelcutError(f"{p}: not valid TOML ({exc})") from None
    return _profile_from_table(data, str(p))


def profile_text(hardware: str, fit: Fit, inherits: str = "", source: str = "", folds: dict | None = None) -> str:
    """The TOML text of a fitted profile; ``folds``: :func:`modelcut.core.calibrate.leave_one_family_out`."""
    e = fit.efficiency
    lines = [
        "# A fitted hardware profile for modelcut's default model (modelcut calibrate).",
        "# gemm: fraction of dense 16-bit peak for large matrix products; mem: fraction of HBM",
        "# bandwidth for memory-bound kernels; net: fraction of link bandwidth for collectives.",
        f'hardware = "{hardware}"',
        f"gemm = {e.gemm:.4f}",
        f"mem = {e.mem:.4f}",
        f"net = {e.net:.4f}",
        "fitted = [" + ", ".join(f'"{k}"' for k in fit.fitted) + "]",
        "runs = [" + ", ".join(f'"{r}"' for r in fit.runs) + "]",
        f"mean_abs_error_pct = {fit.mean_abs_pct:.2f}",
        f"max_abs_error_pct = {fit.max_abs_pct:.2f}",
    ]
    if inherits:
        lines.append(f'inherits = "{inherits}"')
    if source:
        lines.append(f'source = "{source}"')
    lines.append("")
    lines.append("[errors_pct]")
    for k, v in fit.errors_pct.items():
        lines.append(f'"{k}" = {v:.2f}')
    for g, f in (folds or {}).items():
        errs = [abs(x) for x in f["errors_pct"].values()]
        fe = f["efficiency"]
        lines += ["", f'[cv."{g}"]', f"gemm = {fe.gemm:.4f}", f"mem = {fe.mem:.4f}", f"net = {fe.net:.4f}",
                  f"runs = {len(errs)}", f"mean_abs_error_pct = {sum(errs) / len(errs):.2f}",
                  f"max_abs_error_pct = {max(errs):.2f}"]
    return "\n".join(lines) + "\n"


def write_profile(path: str | Path, text: str) -> None:
    p = Path(path)
    try:
        p.write_text(text, encoding="utf-8")
    except OSError as exc:
        raise ModelcutError(f"{p}: cannot write ({exc.strerror})") from None


# ---------------------------------------------------------------- published runs' real settings

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
    text = resources.files("modelcut.catalog").joinpath("runs_dev.toml").read_text(encoding="utf-8")
    out = {}
    for row in tomllib.loads(text).get("settings", []):
        rid = row["id"]
        if rid in out:
            raise ModelcutError(f"runs_dev.toml: {rid!r} appears twice")
        if row["framework"] not in FRAMEWORKS:
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


def catalog_measured(hardware: str | None = None) -> list[Measured]:
    """Every published run of the catalog (deck and dev sets) as a :class:`Measured`, with
    its real settings; ``hardware`` keeps those on one accelerator (catalog name or alias)."""
    from .. import hardware as hw_lookup, published_runs
    settings = run_settings()
    want = hw_lookup(hardware).name if hardware else None
    out = []
    for pr in published_runs():
        hw = hw_lookup(pr.run.gpu)
        if want and hw.name != want:
            continue
        st = settings.get(pr.id)
        run = apply_settings(pr.run, st)
        step = pr.published_step_time_s
        # Published TFLOP/s count the FLOPs of the run as the source describes it (runs.toml).
        out.append(Measured(pr.id, st.group if st else pr.family, run, hw, st.framework if st else None, {},
                            None if step is not None else pr.published_tflops, step, pr.source,
                            counted_flops(pr.run)))
    return out


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
    "sequence_parallel": "true/false (default false)", "zero": "ZeRO stage 0-3 (default 0)",
    "seq_len": "tokens per sequence", "global_batch": "sequences per step",
    "micro_batch": "sequences per micro-batch", "recompute": "none, selective or full (default none)",
    "framework": "a preset: " + ", ".join(FRAMEWORKS) + " (default megatron-core)",
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


def _float(row: dict, key: str, where: str) -> float | None:
    val = (row.get(key) or "").strip()
    if not val:
        return None
    try:
        return float(val)
    except ValueError:
        raise ModelcutError(f"{where}: {key} must be a number, got {val!r}") from None


def read_runs_csv(path: str | Path) -> list[Measured]:
    """A user's measured runs (columns :data:`CSV_COLUMNS`); each bad row is a one-line error."""
    from .. import hardware as hw_lookup, load_hf_config, model as model_lookup
    p = Path(path)
    try:
        text = p.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ModelcutError(f"{p}: no such file") from None
    except UnicodeDecodeError:
        raise ModelcutError(f"{p}: not a UTF-8 text file") from None
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
        spec = load_hf_config(mname) if mname.endswith(".json") else model_lookup(mname)
        hw = hw_lookup(row.get("gpu", "").strip() or "?")
        sp = row.get("sequence_parallel", "").strip().lower()
        if sp not in ("", "true", "false", "1", "0", "yes", "no"):
            raise ModelcutError(f"{where}: sequence_parallel must be true or false, got {sp!r}")
        vpp = _int(row, "vpp", where, 1)
        layout = Layout(tp=_int(row, "tp", where), cp=_int(row, "cp", where, 1), pp=_int(row, "pp", where),
                        dp=_int(row, "dp", where), vpp=vpp if vpp and vpp > 1 else None,
                        sequence_parallel=sp in ("true", "1", "yes"), zero=_int(row, "zero", where, 0))
        training = Training(seq_len=_int(row, "seq_len", where), global_batch=_int(row, "global_batch", where),
                            micro_batch=_int(row, "micro_batch", where),
                            recompute=(row.get("recompute", "").strip() or "none"))
        gpn = _int(row, "gpus_per_node", where, 0) or None
        fw = row.get("framework", "").strip() or None
        if fw is not None and fw not in FRAMEWORKS:
            raise ModelcutError(f"{where}: unknown framework {fw!r}; choose one of {', '.join(FRAMEWORKS)}")
        ov = parse_overlap(row.get("overlap", "").replace(";", ","))
        tflops, step = _float(row, "tflops_per_gpu", where), _float(row, "step_time_s", where)
        if tflops is None and step is None:
            raise ModelcutError(f"{where}: give tflops_per_gpu or step_time_s")
        run = Run(model=spec, gpu=hw.name, layout=layout, training=training, gpus_per_node=gpn, name=rid)
        group = row.get("group", "").strip() or (fw or "megatron-core")
        out.append(Measured(rid, group, run, hw, fw, ov, None if step is not None else tflops, step, str(p)))
    if not out:
        raise ModelcutError(f"{p}: no runs")
    return out
