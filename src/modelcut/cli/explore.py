"""``modelcut explore``: the layouts the stack can run that fit, ranked by predicted step time."""

from __future__ import annotations

import json
import sys
from dataclasses import replace
from pathlib import Path
from typing import Optional

import typer
from rich import box
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from .. import catalog
from ..core.costs.context import CP_KINDS, cp_form_label
from ..core.errors import ModelcutError
from ..core.explore import DEFAULT_SCHEDULES, Evaluated, why
from ..core.explore.search import DEFAULT_MARGIN
from ..core.explore.why import recompute_label
from ..export import chrome_trace
from ..export import emit as emitter
from ..service import inputs
from ..service import requests
from ..service.predict import SEED_HAS_NO_TIMELINE
from ..service.requests import CheckIn, ExploreInput
from ..service.explore import (CLOSE_TO_BEST, PARETO_WITHIN, ExploreResult, PrecisionSearches, catalog_request,
                               catalog_summary, check_row, fastest, gpu_counts, gpu_pareto, precision_requests,
                               run_explore, run_explore_each, run_explore_range, searched_recomputes, why_text)
from .app import app
from .common import check_writable, limit_option, limits, parse, write_trace
from .views import console, show_layers

GB = 1e9


def _emit(res: ExploreResult | None, emit: str, pick: int) -> None:
    """Print the launch settings of the ``pick``-th ranked layout (``--emit``)."""
    if res is None:
        raise ModelcutError("no layout fits; nothing to emit")
    note = emitter.power_note(res.request.hw)
    print((note + "\n" if note else "") + emitter.EMITTERS[emit](res.picked(pick, "emit"), res.framework))


def _write_trace(res: ExploreResult | None, pick: int, path: Path) -> None:
    """Write the ``pick``-th ranked layout's predicted step as a Chrome trace (``--trace``)."""
    if res is None:
        raise ModelcutError("no layout fits; nothing to trace")
    e, pred = res.timeline(pick)
    req = res.request
    label = (f"{req.model.name} on {req.gpus:,} × {req.hw.name}, layout #{pick}: {_describe(e)} "
             f"({res.framework.name}, {req.space.precision}), predicted step {pred.step_time_s:.4f} s")
    meta = {"step_time_s": pred.step_time_s, "rank": pick, "layout": e.as_dict(), "notes": list(pred.notes),
            "generator": "modelcut explore --trace (the default model's timeline: core/step/timeline.py)"}
    write_trace(path, chrome_trace.step_trace(pred.timeline, label, meta))


#: Terminal width the tables are laid out for.
WIDTH = 100
#: Each request field as the command line spells it (the one-line errors name the flag).
FLAGS = {"gpus": "--gpus", "seq": "--seq", "global_batch_tokens": "--global-batch-tokens", "top": "--top",
         "gpus_per_node": "--gpus-per-node", "margin": "--margin", "micro_batches": "--micro-batches",
         "schedules": "--schedules", "eps": "--eps", "cp_kinds": "--cp-kinds", "mode": "--mode",
         "framework": "--framework", "gpu": "--gpu", "pareto_within": "--pareto-within",
         "precision": "--precision", "fp8_recipe": "--fp8-recipe", "grad_reduce": "--grad-reduce", "check": "--check",
         "overlap": "--overlap", "fp8_param_gather": "--fp8-param-gather", "attention": "--attention",
         "local_batch": "--local-batch", "adam_moments": "--adam-moments",
         "activation_func_fp8_input_store": "--fp8-swiglu-input"}


def _shape(e: Evaluated) -> str:
    """tp·cp·pp·dp, with ep on an MoE model (and "e1" after it where the experts are not cut over
    tp: etp 1 with tp > 1); dp as "d[k]" where ZeRO's states are sharded over k of its ranks and
    replicated across the rest (hybrid sharding)."""
    s = e.structure
    if not e.run.model.is_moe:
        dp = f"{s.dp}[{s.dp_shard}]" if s.dp_shard else str(s.dp)
        return "·".join(str(x) for x in (s.tp, s.cp, s.pp, dp))
    ep = f"{s.ep}" + (f"e{s.expert_tp}" if s.expert_tp != s.tp else "")
    return "·".join(str(x) for x in (s.tp, s.cp, ep, s.pp, s.dp))


def _shape_head(moe: bool) -> str:
    return "tp·cp·ep·pp·dp" if moe else "tp·cp·pp·dp"


#: Short labels that keep the tables within 100 columns.
SHORT = {"allgather": "gather", "selective": "select", "layernorm+moe_act": "norm+act"}


def _recompute(e: Evaluated) -> str:
    """The variant, with the layers a chunk recomputes under the block method, or k of one layer in k
    (:func:`..core.explore.why.recompute_label`), its name shortened for the table."""
    tr = e.run.training
    label = recompute_label({"recompute": e.recompute, "recompute_layers": tr.recompute_layers,
                             "recompute_every": tr.recompute_every})
    return label.replace(e.recompute, SHORT.get(e.recompute, e.recompute), 1)


def _knobs(e: Evaluated) -> list[str]:
    s = e.structure
    return [_shape(e), SHORT.get(s.cp_kind, cp_form_label(s.cp_kind, s.cp_a2a)) if s.cp > 1 else "—", str(s.vpp), str(s.micro_batch),
            _schedule(e), _recompute(e), str(e.zero)]


def _schedule(e: Evaluated) -> str:
    """The pipeline schedule as a table shows it: "—" without a pipeline (pp 1 runs no schedule)."""
    s = e.structure
    if s.pp == 1:
        return "—"
    return s.schedule + (f", last {s.last_layers}" if s.last_layers else "")


def _layers(res: ExploreResult | None, pick: int):
    """The ``pick``-th ranked layout and one micro-batch of it itemised (``--layers``)."""
    if res is None:
        raise ModelcutError("no layout fits; nothing to itemise")
    return res.layers(pick)


def _describe(e: Evaluated) -> str:
    s = e.structure
    cp = f"cp {s.cp} ({cp_form_label(s.cp_kind, s.cp_a2a)})" if s.cp > 1 else "cp 1"
    ep = f", ep {s.ep}" if s.ep > 1 else ""
    dp = f"dp {s.dp}" + (f" (ZeRO sharded over {s.dp_shard}, replicated {s.dp // s.dp_shard}×)" if s.dp_shard else "")
    last = f" with {s.last_layers} layers on the last rank" if s.last_layers else ""
    sched = f"{s.schedule} v {s.vpp}" if s.pp > 1 else "no pipeline"
    return (f"tp {s.tp}, {cp}{ep}, pp {s.pp}{last}, {dp}, {sched}, micro-batch {s.micro_batch}, "
            f"recompute {e.recompute}" + (f" ({e.run.training.recompute_layers} layers a chunk)"
                                          if e.run.training.recompute_layers is not None else
                                          f" (one layer in {e.run.training.recompute_every} on each rank)"
                                          if e.run.training.recompute_every is not None else "")
            + f", ZeRO-{e.zero}")


def _gpus(text: str) -> tuple[int, int | None]:
    """``--gpus N`` or ``--gpus A-B``."""
    parts = text.replace(",", "").split("-")
    try:
        vals = [int(p) for p in parts]
    except ValueError:
        raise ModelcutError(f"--gpus must be a count such as 8192 or a range such as 4096-16384, got {text!r}") from None
    if len(vals) == 1:
        return vals[0], None
    if len(vals) != 2:
        raise ModelcutError(f"--gpus must be a count such as 8192 or a range such as 4096-16384, got {text!r}")
    return vals[0], vals[1]


@app.command()
def explore(
    model: Optional[str] = typer.Option(None, "--model", help="catalog model name, or a Hugging Face config.json"),
    gpu: Optional[str] = typer.Option(None, "--gpu", help="accelerator (catalog name or alias)"),
    gpus: Optional[str] = typer.Option(None, "--gpus", help="number of accelerators N (every layout uses all N), or a "
                                       "range A-B: A, 2A, 4A, … up to B, with the Pareto set over GPU counts"),
    seq: Optional[int] = typer.Option(None, "--seq", help="sequence length"),
    global_batch_tokens: Optional[str] = typer.Option(None, "--global-batch-tokens",
                                                      help="tokens per step, e.g. 16777216 or 16M (binary: 16·2^20)"),
    run: Optional[str] = typer.Option(None, "--run", help="a published run of the catalog: search its problem on its "
                                      "stack and check its published layout ('all': every run, one line each)"),
    top: int = typer.Option(5, "--top", help="how many layouts to show"),
    as_json: bool = typer.Option(False, "--json", help="print JSON: {layouts: [...]} sorted by step time"),
    emit: Optional[str] = typer.Option(None, "--emit", help="print the chosen layout's launch settings: megatron, "
                                                            "torchtitan or nemo"),
    pick: int = typer.Option(1, "--pick", help="which ranked layout --emit prints, --trace writes and --layers "
                                               "itemises (1 = the best)"),
    layers: bool = typer.Option(False, "--layers", help="also print the picked layout's micro-batch line by line, "
                                                        "as predict --layers does (with --json: its layers)"),
    trace: Optional[Path] = typer.Option(None, "--trace", dir_okay=False,
                                         help="write the picked layout's predicted step as a Chrome trace-event "
                                              "JSON (Perfetto), as predict --trace does"),
    mode: str = typer.Option("default", "--mode", help="step-time model: default (the physics model) or seed "
                             "(the deck's model, faster)"),
    framework: Optional[str] = typer.Option(None, "--framework", help="the training stack (a preset or another name "
                                            "for one, e.g. torchtitan, megatron-lm; default megatron-core): only "
                                            "layouts it can run are ranked"),
    overlap: Optional[str] = typer.Option(None, "--overlap", help="overlap overrides of the stack, e.g. "
                                          "tp_comm=on,grad_reduce=off, or the stacks' names (--tp-comm-overlap, async_tp; "
                                          "as predict's: settings not modelled are named in the notes)"),
    allow_tp_across_nodes: bool = typer.Option(False, "--allow-tp-across-nodes",
                                               help="let tensor parallelism span nodes"),
    margin: float = typer.Option(DEFAULT_MARGIN, "--margin", help="fraction of memory kept free"),
    gpus_per_node: Optional[int] = typer.Option(None, "--gpus-per-node", help="default: the hardware's"),
    micro_batches: str = typer.Option("1,2,4", "--micro-batches", help="micro-batch sizes to try"),
    schedules: str = typer.Option(",".join(DEFAULT_SCHEDULES), "--schedules", help="pipeline schedules to try"),
    flash: Optional[bool] = typer.Option(None, "--flash/--no-flash", help="FlashAttention (no s² scores); "
                                         "default: as the stack runs attention"),
    reshard: Optional[bool] = typer.Option(None, "--reshard/--no-reshard",
                                           help="ZeRO-3 reshards weights after each forward; default: as the stack "
                                                "does (memory and time follow it alike)"),
    check: Optional[str] = typer.Option(None, "--check", help="also report a layout, e.g. tp=8,cp=1,pp=16,dp=64: "
                                        "its rank and gap to the best, or the rule it breaks (with --run: "
                                        "in place of the published layout, e.g. zero=1)"),
    eps: Optional[str] = typer.Option(None, "--eps", help="expert-parallel sizes to try (MoE models; default: "
                                                          "every divisor of the experts that divides dp)"),
    cp_kinds: str = typer.Option(",".join(CP_KINDS), "--cp-kinds",
                                 help="context-parallel forms to try when cp > 1: ring, allgather, a2a, a2a+p2p (each where the stack runs it; a2a where cp divides the heads; a2a+p2p where the cp group leaves a node, its all-to-all over the cp ranks a node holds, or the largest part of them that cuts the heads)"),
    pareto_within: float = typer.Option(PARETO_WITHIN, "--pareto-within",
                                        help="time every layout within this fraction of the best (the Pareto set)"),
    exhaustive: bool = typer.Option(False, "--exhaustive", help="time every layout that fits (no lower bound)"),
    precision: Optional[str] = typer.Option(None, "--precision", help="the products' precision of every layout: bf16 "
                                            "(the default), fp16 or fp8 (docs/fp8.md); several, e.g. bf16,fp8: one "
                                            "search each, their best layouts side by side"),
    fp8_recipe: Optional[str] = typer.Option(None, "--fp8-recipe", help="with fp8: delayed, current, blockwise, "
                                                                         "mxfp8, (torchao) rowwise or rowwise_with_gw_hp (default: the stack's choice)"),
    grad_reduce: Optional[str] = typer.Option(None, "--grad-reduce", help="the type gradients are reduced in across "
                                              "data parallelism: fp32 or the 16-bit type (float32, bfloat16 too; FSDP's "
                                              "reduce_dtype, Composer's mixed_precision DEFAULT = fp32, PURE = 16-bit; "
                                              "default: the stack's)"),
    fp8_param_gather: Optional[bool] = typer.Option(None, "--fp8-param-gather/--no-fp8-param-gather",
                                                    help="with fp8: the linear weights kept and gathered in FP8 "
                                                         "(Megatron-LM's --fp8-param-gather; default: the stack's)"),
    adam_moments: Optional[str] = typer.Option(None, "--adam-moments", help="the type every layout keeps Adam's two "
                                               "moments in: fp32 or bf16 (Megatron-core's precision-aware optimizer, "
                                               "--exp-avg-dtype; default: the stack's)"),
    fp8_swiglu_input: Optional[bool] = typer.Option(None, "--fp8-swiglu-input", help="every layout keeps the "
                                                    "SwiGLU's input in FP8 for the backward (Megatron-core's "
                                                    "activation_func_fp8_input_store)"),
    attention: Optional[str] = typer.Option(None, "--attention", help="every layout's attention kernel: unfused, "
                                            "flash2, flash3, cudnn or flash4 (default: the stack's; --flash/--no-flash "
                                            "only changes memory)"),
    local_batch: Optional[int] = typer.Option(None, "--local-batch", help="with a pipeline: sequences per "
                                              "data-parallel rank per schedule run (torch.distributed.pipelining's "
                                              "local batch: torchtitan's local_batch_size, NeMo AutoModel's); "
                                              "default: one run a step"),
    max_layouts: Optional[int] = limit_option("max_layouts"),
    max_gpus: Optional[int] = limit_option("max_gpus"),
    max_seq: Optional[int] = limit_option("max_seq"),
    max_ops: Optional[int] = limit_option("max_ops"),
    max_search_ops: Optional[int] = limit_option("max_search_ops"),
    max_tokens: Optional[int] = limit_option("max_tokens"),
    max_layers: Optional[int] = limit_option("max_layers"),
    max_width: Optional[int] = limit_option("max_width"),
) -> None:
    """Enumerate layouts (t, c and its form, e, p, v, d, micro-batch, recomputation, ZeRO, schedule) the stack
    can run, keep those that fit, rank them by predicted step time."""
    if top < 1:
        raise ModelcutError(f"--top must be at least 1, got {top}")
    if emit is not None and emit not in emitter.EMITTERS:
        raise ModelcutError(f"--emit must be one of {', '.join(emitter.EMITTERS)}, got {emit!r}")
    if not 0 <= pareto_within <= 1:
        raise ModelcutError(f"--pareto-within must be a fraction in [0, 1], got {pareto_within}")
    if layers and (run is not None or emit is not None or mode == "seed"):
        raise ModelcutError("--layers with --run: predict --run ID --layers itemises the published layout" if run
                            else "--emit prints launch settings alone; drop --layers" if emit
                            else "--layers itemises the default model's layers; the seed model sums terms")
    if trace is not None:
        if run is not None:
            raise ModelcutError("--trace with --run: predict --run ID --trace FILE writes the published layout's step")
        if mode == "seed":
            raise ModelcutError(SEED_HAS_NO_TIMELINE)
        check_writable(trace)
    if run is not None:
        given = [n for n, v in (("--model", model), ("--gpu", gpu), ("--gpus", gpus), ("--seq", seq),
                                ("--global-batch-tokens", global_batch_tokens),
                                ("--framework", framework), ("--overlap", overlap), ("--precision", precision),
                                ("--fp8-recipe", fp8_recipe), ("--grad-reduce", grad_reduce),
                                ("--fp8-param-gather", fp8_param_gather), ("--attention", attention),
                                ("--local-batch", local_batch), ("--adam-moments", adam_moments),
                                ("--fp8-swiglu-input", fp8_swiglu_input)) if v is not None]
        if given:
            raise ModelcutError(f"--run takes its problem and stack from the catalog; drop {given[0]}")
        if check is not None and run == "all":
            raise ModelcutError("--run all checks each published layout; --check needs one run")
        query = (requests.parse(CheckIn, inputs.check_spec(check), where="--check").model_dump(exclude_none=True)
                 if check is not None else None)
        show_runs(run, mode, top, as_json, emit, pick, query)
        return
    missing = [n for n, v in (("--model", model), ("--gpu", gpu), ("--gpus", gpus), ("--seq", seq),
                              ("--global-batch-tokens", global_batch_tokens)) if v is None]
    if missing:
        raise ModelcutError(f"explore needs {missing[0]} (or --run with a published run)")
    lo, hi = _gpus(gpus)
    lim = limits(max_gpus=max_gpus, max_layouts=max_layouts, max_seq=max_seq, max_ops=max_ops,
                 max_search_ops=max_search_ops, max_tokens=max_tokens, max_layers=max_layers, max_width=max_width)
    # one boundary: the options validated as the web's body is (service/requests.py), errors naming the flag
    fields = {**inputs.model_arg(model, lim), "gpu": gpu.lower(), "gpus": lo, "seq": seq,
              "global_batch_tokens": inputs.parse_tokens(global_batch_tokens), "top": top, "mode": mode,
              "framework": framework.lower() if framework else None, "margin": margin,
              "overlap": inputs.parse_overlap(overlap) if overlap else None,
              "gpus_per_node": gpus_per_node, "allow_tp_across_nodes": allow_tp_across_nodes,
              "micro_batches": list(inputs.int_list(micro_batches, "--micro-batches")),
              "schedules": list(inputs.names(schedules)), "flash_attention": flash, "reshard_after_forward": reshard,
              "check": inputs.check_spec(check) if check else None,
              "eps": list(inputs.int_list(eps, "--eps")) if eps is not None else None,
              "cp_kinds": list(inputs.names(cp_kinds)), "pareto_within": pareto_within, "exhaustive": exhaustive,
              "precision": precision, "fp8_recipe": fp8_recipe, "grad_reduce": grad_reduce,
              "fp8_param_gather": fp8_param_gather, "attention": attention, "local_batch": local_batch,
              "adam_moments": adam_moments, "activation_func_fp8_input_store": bool(fp8_swiglu_input)}
    wanted = list(inputs.names(precision)) if precision is not None else []
    if len(wanted) > 1:
        if hi is not None:
            raise ModelcutError("--precision with several precisions searches one GPU count; give --gpus N")
        fields["precisions"], fields["precision"] = wanted, None
    else:
        fields["precision"] = wanted[0] if wanted else (precision or None)
    if layers and (len(wanted) > 1 or hi is not None):
        raise ModelcutError("--layers itemises a layout of one search; give one precision and --gpus N")
    reqs = precision_requests(parse(ExploreInput, fields, lim, {**FLAGS, "precisions": "--precision"}), lim)
    req = reqs[0]
    hw = req.hw
    err = Console(stderr=True)
    show_bar = sys.stderr.isatty() and not as_json
    with Progress(TextColumn("exploring layouts"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=err, transient=True, disable=not show_bar) as bar:
        task = bar.add_task("explore", total=None)

        def progress(done: int, total: int) -> None:
            bar.update(task, completed=done, total=total)
        if len(reqs) > 1:
            results = run_explore_each(reqs, progress)
        elif hi is None:
            results = [run_explore(req, progress)]
        else:
            results = run_explore_range(req, gpu_counts(lo, hi, gpus_per_node or hw.per_node), progress)
    if trace is not None:
        _write_trace(fastest(results), pick, trace)
    if emit is not None:
        res = fastest(results)
        _emit(res, emit, pick)
        return
    if len(reqs) > 1:
        if as_json:
            print(json.dumps(PrecisionSearches(results).as_dict()))
            return
        show_precisions(results)
        return
    if hi is not None:
        if as_json:
            print(json.dumps({"gpus": [r.request.gpus for r in results], "searches": [r.as_dict() for r in results],
                              "pareto_gpus": [r.request.gpus for r in gpu_pareto(results)]}))
            return
        show_range(results)
        return
    res = results[0]
    picked = _layers(res, pick) if layers else None
    if as_json:
        print(json.dumps(res.as_dict() | ({"layers": picked[1].as_dict()} if picked else {})))
        return
    show(res)
    if picked:
        con = console()
        con.print(f"layout #{pick}: {_describe(picked[0])}", markup=False)
        show_layers(con, picked[1])


def show_runs(run_id: str, mode: str, top: int, as_json: bool, emit: str | None, pick: int,
              check: dict | None = None) -> None:
    """``--run ID``: the run's search as ``show`` prints it, checking its published layout or, with
    ``check``, the layouts with those knobs (``--check zero=1``: the best ZeRO-1 layout of the
    published problem); ``--run all``: one line per published run (the validation set's), its
    published layout's rank and gap to the best and the term that differs most."""
    ids = [r.id for r in catalog.published_runs() if r.in_validation] if run_id == "all" else [run_id]
    results = []
    err = Console(stderr=True)
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeElapsedColumn(),
                  console=err, transient=True, disable=not sys.stderr.isatty() or as_json) as bar:
        task = bar.add_task("runs", total=len(ids))
        for rid in ids:
            bar.update(task, description=rid)
            req = catalog_request(rid, mode, top)
            results.append((rid, run_explore(req if check is None else replace(req, check=check))))
            bar.advance(task)
    if emit is not None:
        _emit(results[0][1], emit, pick)
        return
    if as_json:
        print(json.dumps(results[0][1].as_dict() if run_id != "all" else
                         [{"id": rid, **check_row(res)} for rid, res in results]))
        return
    if run_id != "all":
        show(results[0][1])
        return
    con = _console()
    t = _table("run", "published", "rank", "gap", "best", "differs most", title="published layouts against the "
               "explorer's best on their stack (tp·cp·(ep·)pp·dp)")
    notes = []
    rows = []
    for rid, res in results:
        row = check_row(res)
        rows.append(row)
        q = res.request.check
        pub = "·".join((f"{q['ep']}e{q['etp']}" if k == "ep" and q.get("etp", q["tp"]) != q["tp"] else str(q[k]))
                       for k in ("tp", "cp", "ep", "pp", "dp") if k in q)
        if row["rank"] is None:
            t.add_row(rid, pub, "—", "—", _shape(res.layouts[0]) if res.layouts else "", "see below")
            notes.append(f"{rid} ({row['framework']}): {row['text']}")
            continue
        term, u = row["term"], row["pipeline"]
        t.add_row(rid, pub, str(row["rank"]), f"{(row['ratio_to_best'] - 1) * 100:+.1f} %", _shape(res.layouts[0]),
                  (f"{TERMS.get(term['term'], term['term'])} {term['difference_s']:+.2f} s" if term else "")
                  + (f"; rank {u['device']} +{u['excess'] * 100:.0f} %" if u else ""))
    con.print(t)
    for line in notes:
        con.print(line, soft_wrap=True, markup=False, highlight=False)
    n = catalog_summary(rows)
    con.print(f"published layouts: {n['close']} of {n['runs']} within {CLOSE_TO_BEST * 100:.0f} % of the "
              f"explorer's best on their stack, {n['first']} ranked first ({n['ranked']} ranked)",
              soft_wrap=True, highlight=False)


#: Short names of the time terms for the catalog table.
TERMS = {"compute_s": "compute", "tp_s": "tp", "cp_s": "cp", "p2p_s": "p2p", "bubble_s": "bubble", "dp_s": "dp",
         "a2a_s": "a2a"}


def _console() -> Console:
    return Console(width=None if sys.stdout.isatty() else WIDTH)


def _table(*cols: str, title: str) -> Table:
    return Table(*cols, title=title, box=box.SIMPLE_HEAD, pad_edge=False, padding=(0, 1))


def show_range(results: list[ExploreResult]) -> None:
    """A search over GPU counts: the best layout of each count, the counts on the Pareto set."""
    con = _console()
    req = results[0].request
    on = {id(r) for r in gpu_pareto(results)}
    con.print(f"[bold]{req.model.name}[/bold] on {req.hw.name}, sequence {req.seq:,}, {req.global_batch_tokens:,} "
              f"tokens a step, framework {results[0].framework.name if results[0].framework else 'none'}")
    t = _table("GPUs", _shape_head(req.model.is_moe), "cp form", "v", "b", "schedule", "recomp", "ZeRO", "step s",
               "MFU", "peak GB", "Pareto", title="fastest layout per GPU count")
    for r in results:
        if not r.layouts:
            t.add_row(f"{r.request.gpus:,}", "no layout fits", *[""] * 10)
            continue
        e = r.layouts[0]
        t.add_row(f"{r.request.gpus:,}", *_knobs(e), f"{e.step_time_s:.3f}", f"{e.prediction.mfu:.1%}",
                  f"{e.peak_bytes / GB:.1f}", "yes" if id(r) in on else "")
    con.print(t)
    con.print("Pareto: each count on it steps faster than every smaller count; the others buy no time.")


def show_precisions(results: list[ExploreResult]) -> None:
    """One search per precision: the best layout of each, its time and memory beside the first's,
    then the fastest precision's search in full."""
    con = _console()
    req, first = results[0].request, results[0]
    con.print(f"[bold]{req.model.name}[/bold] on {req.gpus:,} × {req.hw.name}, sequence {req.seq:,}, "
              f"{req.global_batch_tokens:,} tokens a step, framework "
              f"{first.framework.name if first.framework else 'none'}: one search per precision")
    t = _table("precision", f"layout ({_shape_head(req.model.is_moe)}, cp form, schedule v, micro-batch, "
               "recomputation, ZeRO)", "step s", "MFU", "peak GB", "speed-up",
               title=f"fastest layout per precision (MFU over each one's peak; speed-up over "
                     f"{first.request.space.precision})")
    base = first.layouts[0].step_time_s if first.layouts else None
    recipes = []
    for r in results:
        name = r.request.space.precision
        if r.options.fp8 is not None:
            recipes.append(f"{name}: {r.options.fp8.recipe} scaling")
        if not r.layouts:
            t.add_row(name, "no layout fits", *[""] * 4)
            continue
        e = r.layouts[0]
        k = _knobs(e)
        sched = f"{k[4]} v{k[2]}" if k[4] != "—" else "no pipeline"
        t.add_row(name, f"{k[0]}{' ' + k[1] if k[1] != '—' else ''}, {sched}, b {k[3]}, {k[5]}, ZeRO-{k[6]}",
                  f"{e.step_time_s:.3f}", f"{e.prediction.mfu:.1%}", f"{e.peak_bytes / GB:.1f}",
                  f"{base / e.step_time_s:.2f}×" if base else "—")
    con.print(t)
    if recipes:
        con.print("; ".join(recipes))
    best = fastest(results)
    if best is None:
        con.print("[red]no layout fits in memory at any precision[/red]")
        raise typer.Exit(1)
    con.print(f"the fastest, {best.request.space.precision}, in full:")
    show(best)


def show(res: ExploreResult) -> None:
    """The search as text: what was searched, the ranked layouts, their time and memory, the
    Pareto set, why the best wins, the checked layout."""
    req, ex, ranked = res.request, res.exploration, res.layouts
    spec, hw, gpus, seq, top, mode = req.model, req.hw, req.gpus, req.seq, req.top, req.mode
    tokens, margin, options = req.global_batch_tokens, req.margin, res.options
    con = _console()
    s = ex.summary()
    fw = res.framework.name if res.framework is not None else "none (every layout)"
    con.print(f"[bold]{spec.name}[/bold] on {gpus:,} × {hw.name}, sequence {seq:,}, {tokens:,} tokens a step "
              f"({tokens // seq:,} sequences), mode {mode}, framework {fw}"
              + (f", {req.space.precision}" + (f" ({options.fp8.recipe} scaling)" if options.fp8 is not None else "")
                 if req.space.precision != "bf16" else "")
              + (f", gradients reduced in {req.space.grad_reduce}" if req.space.grad_reduce else ""))
    rejected = sum(s["rule_rejections"].values())
    con.print(f"searched {s['space']:,} layouts the stack runs ({s['structures']:,} shapes × recomputation × ZeRO"
              + (f"; {rejected:,} it cannot run left out" if rejected else "") + f"), {s['memory_evaluations']:,} "
              f"memory checks, {s['predictions']:,} timed, {s['pruned_by_bound']:,} pruned by a lower bound on "
              f"step time; memory limit {s['limit_bytes'] / GB:.1f} GB = {hw.mem_bytes / GB:.1f} GB less {margin:.0%}")
    for line in ex.notes:
        con.print(f"note: {line}", soft_wrap=True, markup=False, highlight=False)
    if not ranked:
        con.print(res.none_reason(), style="red", markup=False, highlight=False, soft_wrap=True)
        if req.check is not None:
            con.print(f"--check {res.check_answer()['text']}", soft_wrap=True, markup=False, highlight=False)
        raise typer.Exit(1)
    shown = ranked[:top]
    cols = ("#", _shape_head(spec.is_moe), "cp form", "v", "b", "schedule", "recomp", "ZeRO", "step s", "MFU",
            "peak GB")
    t = _table(*cols, title="fastest layouts that fit")
    for i, e in enumerate(shown, 1):
        p = e.prediction
        t.add_row(str(i), *_knobs(e), f"{p.step_time_s:.3f}", f"{p.mfu:.1%}", f"{e.peak_bytes / GB:.1f}")
    con.print(t)
    if any(e.structure.dp_shard for e in shown):
        con.print("dp d[k]: hybrid sharding, ZeRO's states split over k data-parallel ranks and "
                  "replicated across the d/k groups", markup=False, highlight=False)
    tb = _table("#", "compute", "tp", "cp", "p2p", "bubble", "dp", "a2a", "optimizer",
                title="time breakdown (s, busiest device)")
    for i, e in enumerate(shown, 1):
        b = e.prediction.breakdown
        tb.add_row(str(i), *(f"{getattr(b, k, 0.0):.3f}" for k in ("compute_s", "tp_s", "cp_s", "p2p_s", "bubble_s",
                                                                      "dp_s", "a2a_s", "optimizer_s")))
    con.print(tb)
    mb = _table("#", "stage", "weights", "grads", "optimizer", "activations", "buffers", "total",
                title="memory breakdown (GB, the fullest device)")
    for i, e in enumerate(shown, 1):
        st = e.peak_stage
        mb.add_row(str(i), str(st.stage), *(f"{x / GB:.1f}" for x in (st.weights_bytes, st.gradients_bytes,
                                                                       st.optimizer_bytes, st.activations_bytes,
                                                                       st.buffers_bytes, st.total_bytes)))
    con.print(mb)
    front = res.pareto
    pt = _table("rank", _shape_head(spec.is_moe), "cp form", "v", "b", "schedule", "recomp", "ZeRO", "step s",
                "peak GB", title=f"Pareto set: step time against peak memory (all layouts within "
                                 f"{req.pareto_within:.0%} of the best timed)")
    for e in front:
        pt.add_row(str(res.rank(e)), *_knobs(e), f"{e.step_time_s:.3f}", f"{e.peak_bytes / GB:.1f}")
    con.print(pt)
    con.print(f"#1: {_describe(ranked[0])}.")
    if len(ranked) >= 2:
        con.print(why_text(why(ranked[0], ranked[1])))
    if req.check is not None:
        ans = res.check_answer()
        con.print(f"--check {ans['text']}", soft_wrap=True, markup=False, highlight=False)
        if ans["why"] is not None:
            con.print(ans["why"]["text"])
    con.print(f"[dim]memory: FlashAttention {'on' if options.flash_attention else 'off'}, ZeRO-3 "
              f"{'reshards' if options.reshard_after_forward else 'keeps weights'} (with a pipeline: "
              f"{'as without' if options.reshard_with_pipeline is None else ('reshards' if options.reshard_with_pipeline else 'keeps them')}), "
              f"buffers allowance {options.buffer_fixed_bytes / 2**30:.0f} GiB + {options.fragmentation:.0%} of the activations and gathers; "
              f"recomputation variants {', '.join(searched_recomputes(req))}[/dim]")
