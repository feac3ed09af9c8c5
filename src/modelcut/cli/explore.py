"""``modelcut explore``: the layouts that fit, ranked by predicted step time."""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Optional

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from ..core.errors import ModelcutError
from ..core.context import CP_KINDS
from ..core.explore import DEFAULT_MARGIN, DEFAULT_SCHEDULES, RECOMPUTE_ORDER, Evaluated, Space, find, parse_tokens, why
from ..core.explore import explore as run_explore
from ..core.memory import MemoryOptions
from . import app

GB = 1e9
_TERM = {"compute_s": "compute", "tp_s": "tensor-parallel", "cp_s": "context-parallel", "p2p_s": "pipeline sends",
         "bubble_s": "bubble", "dp_s": "data-parallel", "a2a_s": "expert all-to-all",
         "weights_bytes": "weights", "gradients_bytes": "gradients", "optimizer_bytes": "optimizer states",
         "activations_bytes": "activations", "buffers_bytes": "buffers"}


def _model(spec: str):
    from .. import catalog
    path = Path(spec)
    if spec.endswith(".json") or path.is_file():
        if not path.is_file():
            raise ModelcutError(f"no such config file: {spec}")
        return catalog.load_hf_config(path)
    return catalog.model(spec)


def _ints(text: str, what: str) -> tuple[int, ...]:
    try:
        vals = tuple(int(x) for x in text.split(",") if x.strip())
    except ValueError:
        raise ModelcutError(f"{what} must be comma-separated integers, got {text!r}") from None
    if not vals or min(vals) < 1:
        raise ModelcutError(f"{what} must be positive integers, got {text!r}")
    return vals


def _check_spec(text: str) -> dict:
    want = {}
    for part in text.split(","):
        if not part.strip():
            continue
        if "=" not in part:
            raise ModelcutError(f"--check wants key=value pairs such as tp=8,pp=16, got {part!r}")
        k, v = (x.strip() for x in part.split("=", 1))
        if k not in ("tp", "cp", "ep", "cp_kind", "pp", "dp", "vpp", "micro_batch", "zero", "schedule", "recompute"):
            raise ModelcutError(f"--check: unknown key {k!r}")
        want[k] = v if k in ("schedule", "recompute", "cp_kind") else int(v) if v.isdigit() else v
    return want


ROW_KEYS = ("tp", "cp", "cp form", "ep", "pp", "dp", "v", "b", "schedule", "recompute", "zero")


def _row_name(e: Evaluated) -> list[str]:
    s = e.structure
    return [str(s.tp), str(s.cp), s.cp_kind if s.cp > 1 else "—", str(s.ep), str(s.pp), str(s.dp), str(s.vpp),
            str(s.micro_batch), s.schedule, e.recompute, str(e.zero)]


def _why_text(w: dict) -> str:
    knobs = ", ".join(f"{k} {a} vs {b}" for k, (a, b) in w["knobs"].items()) or "no knob"
    t_best, t_other = w["step_time_s"]
    terms = [f"{_TERM[k]} {d:+.2f} s" for k, _, _, d in w["time_terms"][:3] if abs(d) > 1e-9]
    mem = [f"{_TERM[k]} {d / GB:+.1f} GB" for k, _, _, d in w["memory_terms"][:2] if abs(d) > 1e6]
    return (f"#1 beats #2 by {t_other - t_best:.3f} s ({(t_other / t_best - 1) * 100:.1f} %): they differ in {knobs}; "
            f"#2 spends {', '.join(terms) or 'the same time in every term'}"
            + (f"; its peak device holds {', '.join(mem)}" if mem else "") + ".")


@app.command()
def explore(
    model: str = typer.Option(..., "--model", help="catalog model name, or a Hugging Face config.json"),
    gpu: str = typer.Option(..., "--gpu", help="accelerator (catalog name or alias)"),
    gpus: int = typer.Option(..., "--gpus", help="number of accelerators N; every layout uses all N"),
    seq: int = typer.Option(..., "--seq", help="sequence length"),
    global_batch_tokens: str = typer.Option(..., "--global-batch-tokens",
                                            help="tokens per step, e.g. 16777216 or 16M (binary: 16·2^20)"),
    top: int = typer.Option(5, "--top", help="how many layouts to show"),
    as_json: bool = typer.Option(False, "--json", help="print JSON: {layouts: [...]} sorted by step time"),
    emit: Optional[str] = typer.Option(None, "--emit", help="print the chosen layout as megatron or torchtitan"),
    pick: int = typer.Option(1, "--pick", help="which ranked layout --emit prints (1 = the best)"),
    mode: str = typer.Option("default", "--mode", help="step-time model: default (the physics model) or seed "
                             "(the deck's model, faster)"),
    allow_tp_across_nodes: bool = typer.Option(False, "--allow-tp-across-nodes",
                                               help="let tensor parallelism span nodes"),
    margin: float = typer.Option(DEFAULT_MARGIN, "--margin", help="fraction of memory kept free"),
    gpus_per_node: Optional[int] = typer.Option(None, "--gpus-per-node", help="default: the hardware's"),
    micro_batches: str = typer.Option("1,2,4", "--micro-batches", help="micro-batch sizes to try"),
    schedules: str = typer.Option(",".join(DEFAULT_SCHEDULES), "--schedules", help="pipeline schedules to try"),
    flash: bool = typer.Option(True, "--flash/--no-flash", help="FlashAttention (no s² scores)"),
    reshard: bool = typer.Option(True, "--reshard/--no-reshard",
                                 help="ZeRO-3 reshards weights after each forward (FSDP's default)"),
    check: Optional[str] = typer.Option(None, "--check", help="also report a layout, e.g. tp=8,cp=1,pp=16,dp=64"),
    eps: Optional[str] = typer.Option(None, "--eps", help="expert-parallel sizes to try (MoE models; default: "
                                                          "every divisor of the experts that divides dp)"),
    cp_kinds: str = typer.Option(",".join(CP_KINDS), "--cp-kinds",
                                 help="context-parallel forms to try when cp > 1: ring, allgather"),
) -> None:
    """Enumerate layouts (t, c and its form, e, p, v, d, micro-batch, recomputation, ZeRO, schedule), keep
    those that fit, rank them by predicted step time."""
    from .. import catalog
    if top < 1:
        raise ModelcutError(f"--top must be at least 1, got {top}")
    if emit is not None and emit not in ("megatron", "torchtitan"):
        raise ModelcutError(f"--emit must be megatron or torchtitan, got {emit!r}")
    want = _check_spec(check) if check else None
    spec = _model(model)
    hw = catalog.hardware(gpu)
    tokens = parse_tokens(global_batch_tokens)
    space = Space(micro_batches=_ints(micro_batches, "--micro-batches"),
                  schedules=tuple(s.strip() for s in schedules.split(",") if s.strip()),
                  allow_tp_across_nodes=allow_tp_across_nodes,
                  eps=_ints(eps, "--eps") if eps is not None else None,
                  cp_kinds=tuple(k.strip() for k in cp_kinds.split(",") if k.strip()))
    options = MemoryOptions(flash_attention=flash, reshard_after_forward=reshard)
    err = Console(stderr=True)
    show_bar = sys.stderr.isatty() and not as_json
    with Progress(TextColumn("exploring layouts"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=err, transient=True, disable=not show_bar) as bar:
        task = bar.add_task("explore", total=None)

        def progress(done: int, total: int) -> None:
            bar.update(task, completed=done, total=total)
        ex = run_explore(spec, hw, gpus=gpus, seq=seq, global_batch_tokens=tokens, gpus_per_node=gpus_per_node,
                         mode=mode, margin=margin, space=space, options=options, progress=progress)
    ranked = ex.layouts
    checked = find(ex, **want) if want else []
    if emit is not None:
        if not ranked:
            raise ModelcutError("no layout fits; nothing to emit")
        if not 1 <= pick <= len(ranked):
            raise ModelcutError(f"--pick must be in 1..{len(ranked)}, got {pick}")
        from ..faces import emit as emitter
        e = ranked[pick - 1]
        print(emitter.megatron_args(e) if emit == "megatron" else emitter.torchtitan_toml(e))
        return
    if as_json:
        out = {"layouts": [e.as_dict() for e in ranked[:top]], "search": ex.summary(),
               "model": spec.name, "gpu": hw.name, "seq": seq, "global_batch": tokens // seq, "mode": mode,
               "memory_assumptions": {"flash_attention": flash, "reshard_after_forward": reshard,
                                      "buffer_fixed_bytes": options.buffer_fixed_bytes,
                                      "fragmentation": options.fragmentation}}
        if len(ranked) >= 2:
            w = why(ranked[0], ranked[1])
            out["why"] = {"knobs": {k: list(v) for k, v in w["knobs"].items()},
                          "time_terms": [{"term": k, "best": a, "runner_up": b, "difference": d}
                                         for k, a, b, d in w["time_terms"]],
                          "memory_terms": [{"term": k, "best": a, "runner_up": b, "difference": d}
                                           for k, a, b, d in w["memory_terms"]],
                          "text": _why_text(w)}
        if want is not None:
            out["check"] = {"query": want, "best": checked[0].as_dict() if checked else None,
                            "rank": ranked.index(checked[0]) + 1 if checked else None,
                            "ratio_to_best": checked[0].step_time_s / ranked[0].step_time_s if checked else None}
        print(json.dumps(out))
        return
    con = Console(width=None if sys.stdout.isatty() else 150)
    s = ex.summary()
    con.print(f"[bold]{spec.name}[/bold] on {gpus:,} × {hw.name}, sequence {seq:,}, {tokens:,} tokens a step "
              f"({tokens // seq:,} sequences), mode {mode}")
    con.print(f"searched {s['space']:,} layouts ({s['structures']:,} shapes × recomputation × ZeRO), "
              f"{s['memory_evaluations']:,} memory checks, {s['predictions']:,} step-time predictions; "
              f"memory limit {s['limit_bytes'] / GB:.1f} GB = {hw.mem_bytes / GB:.0f} GB less {margin:.0%}")
    if not ranked:
        con.print("[red]no layout fits in memory[/red]")
        raise typer.Exit(1)
    shown = ranked[:top]
    t = Table("#", *ROW_KEYS, "step s", "TFLOP/s", "MFU", "peak GB", title="fastest layouts that fit")
    for i, e in enumerate(shown, 1):
        p = e.prediction
        t.add_row(str(i), *_row_name(e), f"{p.step_time_s:.3f}", f"{p.tflops_per_gpu:.0f}", f"{p.mfu:.1%}",
                  f"{e.peak_bytes / GB:.1f}")
    con.print(t)
    tb = Table("#", "compute", "tp", "cp", "p2p", "bubble", "dp", "a2a", title="time breakdown (s, busiest device)")
    for i, e in enumerate(shown, 1):
        b = e.prediction.breakdown
        tb.add_row(str(i), *(f"{getattr(b, k):.3f}" for k in ("compute_s", "tp_s", "cp_s", "p2p_s", "bubble_s",
                                                                  "dp_s", "a2a_s")))
    con.print(tb)
    mb = Table("#", "stage", "weights", "grads", "optimizer", "activations", "buffers", "total",
               title="memory breakdown (GB, the fullest device)")
    for i, e in enumerate(shown, 1):
        st = e.peak_stage
        mb.add_row(str(i), str(st.stage), *(f"{x / GB:.1f}" for x in (st.weights_bytes, st.gradients_bytes,
                                                                       st.optimizer_bytes, st.activations_bytes,
                                                                       st.buffers_bytes, st.total_bytes)))
    con.print(mb)
    if len(ranked) >= 2:
        con.print(_why_text(why(ranked[0], ranked[1])))
    if want is not None:
        if checked:
            c = checked[0]
            con.print(f"--check {check}: best such layout ranks {ranked.index(c) + 1} of {len(ranked)}: "
                      + " ".join(f"{k} {v}" for k, v in zip(ROW_KEYS, _row_name(c)))
                      + f", {c.step_time_s:.3f} s ({(c.step_time_s / ranked[0].step_time_s - 1) * 100:+.1f} % "
                      f"vs the best), peak {c.peak_bytes / GB:.1f} GB")
        else:
            con.print(f"--check {check}: no such layout fits in memory")
    con.print(f"[dim]memory: FlashAttention {'on' if flash else 'off'}, buffers allowance "
              f"{options.buffer_fixed_bytes / 2**30:.0f} GiB + {options.fragmentation:.0%}; "
              f"recomputation levels {', '.join(RECOMPUTE_ORDER)}[/dim]")
