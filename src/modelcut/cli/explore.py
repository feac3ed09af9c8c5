"""``modelcut explore``: the layouts that fit, ranked by predicted step time."""

from __future__ import annotations

import json
import sys
from typing import Optional

import typer
from rich.console import Console
from rich.table import Table

from ..core.costs.context import CP_KINDS
from ..core.errors import ModelcutError
from ..core.explore import DEFAULT_SCHEDULES, RECOMPUTE_ORDER, Evaluated, why
from ..core.explore.search import DEFAULT_MARGIN
from ..export import emit as emitter
from ..service import inputs
from ..service.explore import ExploreResult, explore_input, why_text
from ..service.requests import ExploreInput
from .app import app
from .common import limit_option, limits, parse, progress

GB = 1e9
FLAGS = {"gpus": "--gpus", "seq": "--seq", "global_batch_tokens": "--global-batch-tokens", "top": "--top",
         "gpus_per_node": "--gpus-per-node", "margin": "--margin", "micro_batches": "--micro-batches",
         "schedules": "--schedules", "eps": "--eps", "cp_kinds": "--cp-kinds", "mode": "--mode",
         "framework": "--framework", "gpu": "--gpu"}
ROW_KEYS = ("tp", "cp", "cp form", "ep", "pp", "dp", "v", "b", "schedule", "recompute", "zero")


def _row_name(e: Evaluated) -> list[str]:
    s = e.structure
    return [str(s.tp), str(s.cp), s.cp_kind if s.cp > 1 else "—", str(s.ep), str(s.pp), str(s.dp), str(s.vpp),
            str(s.micro_batch), s.schedule, e.recompute, str(e.zero)]


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
    framework: Optional[str] = typer.Option(None, "--framework", help="default mode: the training stack (a preset; "
                                            "default megatron-core)"),
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
    max_layouts: Optional[int] = limit_option("max_layouts"),
    max_gpus: Optional[int] = limit_option("max_gpus"),
    max_seq: Optional[int] = limit_option("max_seq"),
    max_ops: Optional[int] = limit_option("max_ops"),
    max_search_ops: Optional[int] = limit_option("max_search_ops"),
    max_tokens: Optional[int] = limit_option("max_tokens"),
    max_layers: Optional[int] = limit_option("max_layers"),
    max_width: Optional[int] = limit_option("max_width"),
) -> None:
    """Enumerate layouts (t, c and its form, e, p, v, d, micro-batch, recomputation, ZeRO, schedule), keep
    those that fit, rank them by predicted step time."""
    if top < 1:
        raise ModelcutError(f"--top must be at least 1, got {top}")
    if emit is not None and emit not in ("megatron", "torchtitan"):
        raise ModelcutError(f"--emit must be megatron or torchtitan, got {emit!r}")
    lim = limits(max_gpus=max_gpus, max_layouts=max_layouts, max_seq=max_seq, max_ops=max_ops,
                 max_search_ops=max_search_ops, max_tokens=max_tokens, max_layers=max_layers, max_width=max_width)
    fields = {**inputs.model_arg(model, lim), "gpu": gpu.lower(), "gpus": gpus, "seq": seq,
              "global_batch_tokens": inputs.parse_tokens(global_batch_tokens), "top": top, "mode": mode,
              "framework": framework.lower() if framework else None, "margin": margin,
              "gpus_per_node": gpus_per_node, "allow_tp_across_nodes": allow_tp_across_nodes,
              "micro_batches": list(inputs.int_list(micro_batches, "--micro-batches")),
              "schedules": list(inputs.names(schedules)), "flash_attention": flash, "reshard_after_forward": reshard,
              "check": inputs.check_spec(check) if check else None,
              "eps": list(inputs.int_list(eps, "--eps")) if eps is not None else None,
              "cp_kinds": list(inputs.names(cp_kinds))}
    inp = parse(ExploreInput, fields, lim, FLAGS)
    with progress("exploring layouts", enabled=not as_json) as update:
        res = explore_input(inp, lim, update)
    ranked = res.layouts
    if emit is not None:
        if not ranked:
            raise ModelcutError("no layout fits; nothing to emit")
        if not 1 <= pick <= len(ranked):
            raise ModelcutError(f"--pick must be in 1..{len(ranked)}, got {pick}")
        e = ranked[pick - 1]
        print(emitter.megatron_args(e) if emit == "megatron" else emitter.torchtitan_toml(e))
        return
    if as_json:
        print(json.dumps(res.as_dict()))
        return
    show(res, check)


def show(res: ExploreResult, check: str | None) -> None:
    """The search as text: what was searched, the ranked layouts, their time and memory, why the
    best wins, the checked layout's rank."""
    req, ex, ranked = res.request, res.exploration, res.layouts
    spec, hw, gpus, seq, top, mode = req.model, req.hw, req.gpus, req.seq, req.top, req.mode
    tokens, margin, options = req.global_batch_tokens, req.margin, req.options
    flash, want, checked = options.flash_attention, req.check, res.checked
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
        con.print(why_text(why(ranked[0], ranked[1])))
    if want is not None:
        if checked:
            c = checked[0]
            con.print(f"--check {check}: best such layout ranks {ranked.index(c) + 1} of {len(ranked)}: "
                      + " ".join(f"{k} {v}" for k, v in zip(ROW_KEYS, _row_name(c)))
                      + f", {c.step_time_s:.3f} s ({(c.step_time_s / ranked[0].step_time_s - 1) * 100:+.1f} % "
                      f"vs the best), peak {c.peak_bytes / GB:.1f} GB")
        else:
            con.print(f"--check {check}: {res.check_reason or 'no such layout fits in memory'}")
    con.print(f"[dim]memory: FlashAttention {'on' if flash else 'off'}, buffers allowance "
              f"{options.buffer_fixed_bytes / 2**30:.0f} GiB + {options.fragmentation:.0%}; "
              f"recomputation levels {', '.join(RECOMPUTE_ORDER)}[/dim]")
