"""Text views the commands share: a prediction with its breakdown, memory and published figure."""

from __future__ import annotations

from rich.console import Console
from rich.table import Table

from ..core.costs.context import cp_form_label
from ..core.step.layer_budget import LayerBudget
from ..service.predict import PredictResult


def console(width: int = 150) -> Console:
    """A console at least ``width`` wide (tables stay whole when written to a file or a pipe)."""
    return Console(width=max(Console().width, width))


def fits(memory: dict) -> bool | None:
    """Whether the layout fits in the accelerator's memory, None where memory could not be counted
    (the report's ``error``)."""
    return None if "error" in memory else bool(memory.get("fits"))


def extra_lines(result: PredictResult) -> list[str]:
    """The memory and published-run lines under a prediction's table."""
    mem, pub, hw = result.memory, result.published, result.hw
    out = []
    if "error" in mem:
        out.append(f"memory: {mem['error']}")
    else:
        worst = max(mem["stages"], key=lambda x: x["total_bytes"])
        out.append(f"peak memory      {mem['peak_bytes'] / 1e9:.1f} GB ({mem['peak_bytes'] / 2**30:.1f} GiB) on pipeline "
                   f"rank {worst['stage']} "
                   f"({'fits' if fits(mem) else 'does not fit'} in {hw.mem_bytes / 1e9:.1f} GB = "
                   f"{hw.mem_bytes / 2**30:.1f} GiB"
                   + ("; over by the buffers allowance, an estimate: the tensors alone fit"
                      if not fits(mem) and mem.get("tensors_fit") else "") + ")")
    if pub is not None:
        figures = [f"{pub[k]:g}{unit}" for k, unit in (("published_step_time_s", " s a step"),
                                                        ("published_tflops", " TFLOP/s per GPU"),
                                                        ("published_mfu", " MFU"),
                                                        ("published_tokens_per_s", " tokens/s per GPU"))
                   if pub.get(k) is not None]
        line = f"published        {', '.join(figures) or 'no figure'} ({pub['source']})"
        if pub.get("predicted_tflops_counted_as_published") is not None:
            line += f"; predicted, counted as published: {pub['predicted_tflops_counted_as_published']:.1f} TFLOP/s"
        if "out_of_sample" in pub:
            o = pub["out_of_sample"]
            line += (f"; error out of sample {o['error_pct']:+.1f} % (constants fitted without {o['source_left_out']}),"
                     f" in sample {pub['error_pct']:+.1f} % (measured step {pub['measured_step_time_s']:.3g} s)")
        elif "error_pct" in pub:
            line += f"; error {pub['error_pct']:+.1f} % (measured step {pub['measured_step_time_s']:.3g} s)"
        out.append(line)
    return out


def run_line(result: PredictResult) -> str:
    """A prediction's first line: the model, the GPUs and how the run is laid out (with cp > 1 the
    context-parallel form it was timed with, the stack's where the run names none)."""
    run, pred = result.run, result.prediction
    L = run.layout
    timed = result.timed_layout()
    form = cp_form_label(timed["cp_kind"], timed["cp_a2a"]) if L.cp > 1 else None
    return (f"[bold]{run.model.name}[/bold] on {L.gpus:,} × {run.gpu}  (t {L.tp}, cp {L.cp}"
            + (f" {form}" if form else "") + f", p {L.pp}, d {L.dp}"
            + (f" sharded {L.dp_shard} × replicated {L.dp // L.dp_shard}" if L.hybrid else "") + "; "
            f"{pred.schedule}, v = {pred.vpp}, m = {pred.microbatches}"
            + (f" × {pred.flushes} runs" if pred.flushes > 1 else ""))


def show_prediction(result: PredictResult) -> None:
    """A prediction as text: header, step time, TFLOP/s, MFU, the breakdown table, notes, memory,
    the published figure, the error budget."""
    run, pred = result.run, result.prediction
    con = console()
    label = f"mode {pred.mode}" + (f", η = {pred.eta:.4f}" if pred.mode == "seed" else "")
    tr = run.training
    recipe = result.memory.get("assumptions", {}).get("fp8_recipe") if "error" not in result.memory else None
    label += f"; {tr.precision}" + (f", {recipe} scaling" if recipe else "")
    con.print(run_line(result) + f"; {label})")
    # a published run ran on its accelerators: where the memory model over-counts it, a note says so instead
    over = fits(result.memory) is False and result.published is None
    con.print(f"step time        {pred.step_time_s:.4f} s"
              + ("  (were it to fit: this layout does not fit in memory, peak memory below)" if over else ""))
    counts_tflops, counts_mfu = result.counting
    con.print(f"TFLOP/s per GPU  {pred.tflops_per_gpu:.1f}  ({counts_tflops})")
    con.print(f"MFU              {pred.mfu * 100:.1f} %  ({counts_mfu})")
    con.print(f"tokens/s per GPU {result.tokens_per_s_per_gpu:,.0f}  (global batch · sequence over step time · GPUs)")
    model_tf = result.model_tflops_per_gpu
    con.print(f"model TFLOP/s    {model_tf['non-embedding']:.1f} as torchtitan counts (6·(N − embedding) + 12·l·s·d a "
              f"token), {model_tf['megatron']:.1f} as NeMo, {model_tf['non-embedding-causal']:.1f} as Megatron-Bridge "
              f"(attention halved); no recomputation (--json: model_tflops_per_gpu)")
    table = Table("Term", "Seconds", "Share")
    for k, x in pred.breakdown.as_dict().items():
        table.add_row(k.removesuffix("_s"), f"{x:.4f}", f"{x / pred.step_time_s * 100:.1f} %")
    con.print(table)
    for n in pred.notes:      # the notes quote sources, whose brackets are not markup ([activation_checkpoint])
        con.print(f"note: {n}", markup=False)
    for line in extra_lines(result):
        con.print(line, markup=False)
    mem = result.memory
    if "error" not in mem:
        worst = max(mem["stages"], key=lambda x: x["total_bytes"])
        mt = Table("Memory on the fullest device", "GB", "Data type")
        for key in ("weights_bytes", "fp8_weights_bytes", "gradients_bytes", "optimizer_bytes", "activations_bytes",
                    "buffers_bytes"):
            if key == "fp8_weights_bytes" and not worst.get(key):
                continue
            mt.add_row(key.removesuffix("_bytes").replace("_", " "), f"{worst[key] / 1e9:.2f}",
                       mem.get("dtypes", {}).get(key, "allowance (CUDA context, NCCL buffers, fragmentation)"))
        con.print(mt)
    b = result.budget
    if b is not None:
        con.print(f"dominant term: {b.dominant.removesuffix('_s')} ({b.dominant_share * 100:.0f} % of the step)")
        for ln in b.lines:
            con.print(f"  {ln.input} {ln.alternative}: {ln.change_pct:+.1f} %")
    if result.layers is not None:
        show_layers(con, result.layers)


#: How a budget line's kind reads in the layer table.
_KIND_WORDS = {"product": "product", "attention": "attention", "memory": "memory-bound", "tp": "tp comm",
               "cp": "cp comm", "a2a": "all-to-all", "recompute": "recompute"}
#: And how their sums over a micro-batch read.
_KIND_TOTALS = {"product": "products", "attention": "attention cores", "memory": "memory-bound kernels",
                "tp": "exposed tp collectives", "cp": "exposed cp exchanges", "a2a": "expert all-to-all",
                "recompute": "recomputed forwards"}


def _detail(ln: dict) -> str:
    """A line's shape, data type and TFLOP/s, or its bytes."""
    if "m" in ln:
        shape = f"{ln['m']:,.0f} × {ln['n']:,} × {ln['k']:,}" + (f" × {ln['count']}" if ln["count"] > 1 else "")
        return f"{shape} {ln['dtype']}, {ln['fwd_tflops']:.0f} / {ln['bwd_tflops']:.0f} TFLOP/s"
    if "fwd_tflops" in ln and ln["fwd_tflops"] is not None:
        return f"{ln['fwd_tflops']:.0f} / {ln['bwd_tflops']:.0f} TFLOP/s"
    if "fwd_bytes" in ln:
        return f"{ln['fwd_bytes'] / 1e6:,.1f} / {ln['bwd_bytes'] / 1e6:,.1f} MB"
    if "fwd_whole_s" in ln:
        return f"of {ln['fwd_whole_s'] * 1e3:.3f} / {ln['bwd_whole_s'] * 1e3:.3f} ms before the overlap"
    return ""


def show_layers(con: Console, budget: LayerBudget) -> None:
    """``--layers``: one micro-batch's units on the busiest device, line by line
    (:mod:`..core.step.layer_budget`), milliseconds."""
    lb = budget.as_dict()
    b = lb["micro_batch"]
    con.print(f"one micro-batch ({b} sequence{'s' if b != 1 else ''}, {lb['tokens']:,} tokens a device) on the "
              "busiest device; products: m × n × k (× count), forward / backward TFLOP/s; memory-bound: forward / "
              "backward bytes. The pipeline, data-parallel and optimizer terms are the step's, above.")
    kinds = {k: v for k, v in lb["by_kind_s"].items() if v > 0}
    total = sum(kinds.values())
    if total > 0:
        con.print("the micro-batch on this device, " + f"{total * 1e3:,.1f} ms: " + ", ".join(
            f"{_KIND_TOTALS[k]} {v * 1e3:,.1f} ms ({v / total * 100:.0f} %)" for k, v in kinds.items()), markup=False)
    for u in lb["units"]:
        where = f"× {u['per_device']} on this device" if u["per_device"] else "on another pipeline rank"
        con.print(f"[bold]{u['unit']}[/bold] {where}: forward {u['fwd_s'] * 1e3:.3f} ms, "
                  f"backward {u['bwd_s'] * 1e3:.3f} ms each")
        t = Table("Line", "Kind", "Forward ms", "Backward ms", "Detail")
        for ln in u["lines"]:
            t.add_row(ln["item"], _KIND_WORDS[ln["kind"]], f"{ln['fwd_s'] * 1e3:.3f}", f"{ln['bwd_s'] * 1e3:.3f}",
                      _detail(ln))
        con.print(t)


def show_precisions(results: list[PredictResult]) -> None:
    """One run at each precision (``predict --precision bf16,fp8``): time, throughput and the
    fullest device's memory side by side, each against the first."""
    first = results[0]
    con = console()
    con.print(run_line(first) + f"; mode {first.prediction.mode}): the run at each precision")
    names = []
    for r in results:
        recipe = r.memory.get("assumptions", {}).get("fp8_recipe") if "error" not in r.memory else None
        names.append(r.run.training.precision + (f" ({recipe})" if recipe else ""))
    table = Table("", *names, *(f"{n} / {names[0]}" for n in names[1:]))

    def row(label: str, vals: list[float | None], fmt: str, ratio: bool = True) -> None:
        cells = ["-" if v is None else format(v, fmt) for v in vals]
        ratios = ["-" if not ratio or v is None or not vals[0] else f"{v / vals[0]:.3f}" for v in vals[1:]]
        table.add_row(label, *cells, *ratios)

    row("step time (s)", [r.prediction.step_time_s for r in results], ".4f")
    row("TFLOP/s per GPU", [r.prediction.tflops_per_gpu for r in results], ".1f")
    row("MFU % (over each one's peak)", [r.prediction.mfu * 100 for r in results], ".1f", ratio=False)
    row("tokens/s per GPU", [r.tokens_per_s_per_gpu for r in results], ",.0f")

    def worst(r: PredictResult) -> dict | None:
        return None if "error" in r.memory else max(r.memory["stages"], key=lambda x: x["total_bytes"])
    stages = [worst(r) for r in results]
    for key in ("total_bytes", "weights_bytes", "fp8_weights_bytes", "gradients_bytes", "optimizer_bytes",
                "activations_bytes", "buffers_bytes"):
        vals = [None if st is None else st.get(key, 0.0) / 1e9 for st in stages]
        if key == "fp8_weights_bytes" and not any(vals):
            continue
        label = "peak memory (GB)" if key == "total_bytes" else f"  {key.removesuffix('_bytes').replace('_', ' ')} (GB)"
        row(label, vals, ".2f")
    table.add_row(f"fits in {first.hw.mem_bytes / 1e9:.1f} GB",
                  *[{None: "-", True: "yes", False: "no"}[fits(r.memory)] for r in results],
                  *["" for _ in results[1:]])
    con.print(table)
    con.print("each precision in full: modelcut predict with one --precision")
