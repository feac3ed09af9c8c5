"""One run's prediction with its memory per device, as every face shows it (``modelcut predict``,
``POST /api/predict``).

:class:`PredictResult.as_dict` is the documented JSON: the prediction's fields
(``step_time_s, tflops_per_gpu, mfu, breakdown, flops_per_step, microbatches, vpp, schedule, mode,
eta, stage_layers, pipeline_method, device_busy_s, notes``), ``memory`` (:func:`modelcut.core.memory.memory_report`,
or ``{"error": ...}`` where the memory model cannot describe the layout), and, when asked for,
``published`` (the catalog run's figure beside the prediction) and ``budget``.
"""

from __future__ import annotations

from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Any, Callable

from .. import catalog
from ..analysis.budget import ErrorBudget, error_budget
from ..analysis.measured import error_pct, measured_run, measured_step_time, published_flops
from ..analysis.validation import seed_eta
from ..catalog import Profile, PublishedRun
from ..core.costs import flops
from ..core.costs.context import cp_form_label
from ..core.costs.kernels import Efficiency, mfu_peak
from ..core.errors import ModelcutError
from ..core.explore.rules import violations
from ..core.memory import memory_report
from ..core.specs import (BLOCKS, EVERY, PRECISIONS, Hardware, Run, fp8_recipe_name, grad_reduce_name, precision_name,
                          recipe_among, reduce_at)
from ..core.step import MODES, predict as step_predict
from ..core.step.checks import check_run
from ..core.step.frameworks import Framework
from ..core.step.layer_budget import LayerBudget, layer_budget
from ..core.step.result import Prediction
from .inputs import model_choice, overlap_options, read_overlap
from .limits import DEFAULT, LimitError, Limits
from .requests import PredictInput
from .runfile import check_sizes


#: The one line refusing a timeline (``--trace``) in seed mode, which sums terms and simulates no step.
SEED_HAS_NO_TIMELINE = "a step's timeline is the default model's; the seed mode sums terms"


def no_timeline(framework: str) -> str:
    """The one line refusing a timeline where the stack is timed by DeepSpeed v0.3's replay."""
    return (f"{framework} is timed by replaying DeepSpeed v0.3's hooks, which keeps no timeline (--trace); "
            "--framework fsdp times ZeRO-3 with one")


def profile_on(hw: Hardware, profile: Profile | None = None) -> Profile:
    """The profile whose constants apply on ``hw``: the user's where it is for this accelerator
    (or for every one), the shipped one otherwise."""
    if profile is not None and (profile.hardware == catalog.profiles.EVERY
                                or catalog.hardware(profile.hardware).name == hw.name):
        return profile
    return catalog.profile_for(hw)


def efficiency_for(hw: Hardware, profile: Profile | None = None) -> Efficiency:
    """The default model's constants on ``hw`` (:func:`profile_on`)."""
    return profile_on(hw, profile).efficiency


def fold_constants(source: str, hw: Hardware, profile: Profile | None = None) -> Efficiency | None:
    """The constants fitted without the published runs of ``source`` (the fold of the profile on
    ``hw`` that left it out, as ``calibrate`` stored it): what ``validate --mode default``'s
    leave-one-source-out table predicts that source's runs with. None where the profile holds no
    such fold."""
    for c in profile_on(hw, profile).cv:
        if c[0] == source:
            return Efficiency(c[1], c[2], c[3])
    return None


def load_profile(path: str | Path | None) -> Profile | None:
    return catalog.load_profile(path) if path is not None else None


@dataclass
class PredictRequest:
    """What to predict: the run and how (``mode``; the default model's ``framework`` preset name,
    ``overlap`` overrides as text or a dict, a user ``profile``, an ``eta`` override); ``budget``
    asks for the error budget; ``published`` is the catalog run it came from."""

    run: Run
    mode: str = "default"
    eta: float | None = None
    framework: str | None = None
    overlap: str | dict[str, Any] | None = None   # with inputs.NOT_MODELLED: the notes of settings not modelled
    profile: Profile | None = None
    budget: bool = False
    published: PublishedRun | None = None
    precision: str | None = None       # overrides the run's [training] precision
    fp8_recipe: str | None = None      # and its FP8 recipe
    grad_reduce: str | None = None     # overrides the run's [training] grad_reduce (--grad-reduce)
    attention: str | None = None       # and its attention kernel (--attention)
    fp8_param_gather: bool | None = None   # and its FP8 weight gathering (--fp8-param-gather)
    timeline: bool = False             # keep the default model's step as a timeline (core.step.timeline)
    layers: bool = False               # itemise one micro-batch's units (core.step.layer_budget)


def with_precision(run: Run, precision: str | None, fp8_recipe: str | None) -> Run:
    """The run with its products' precision (and FP8 recipe) replaced where given (``--precision``,
    ``--fp8-recipe``); a recipe given alone keeps the run's precision, so it needs an FP8 run. What
    the run says of its FP8 weights' gathering goes with FP8 only, and a 16-bit gradient reduction
    stays 16-bit in the new precision's type (bf16 or fp16)."""
    if precision is None and fp8_recipe is None:
        return run
    tr = run.training
    prec = precision_name(precision) if precision is not None else tr.precision
    recipe = (fp8_recipe_name(fp8_recipe) if fp8_recipe is not None
              else (tr.fp8_recipe if prec == "fp8" else None))
    return replace(run, training=replace(tr, precision=prec, fp8_recipe=recipe, grad_reduce=reduce_at(tr.grad_reduce, prec),
                                         fp8_param_gather=tr.fp8_param_gather if prec == "fp8" else None))


def with_choices(run: Run, grad_reduce: str | None = None, attention: str | None = None,
                 fp8_param_gather: bool | None = None) -> Run:
    """The run with the choices it may make for its stack replaced where given: its gradients'
    reduce type (``--grad-reduce``, as the stacks spell it too: "float32", "bfloat16"), its attention
    kernel (``--attention``), its FP8 weight gathering (``--fp8-param-gather``); each checked
    against the run by :class:`Training` (a 16-bit type the run's, FP8 gathering with fp8)."""
    changes = {k: v for k, v in (("grad_reduce", grad_reduce_name(grad_reduce) if grad_reduce is not None else None),
                                 ("attention", attention), ("fp8_param_gather", fp8_param_gather)) if v is not None}
    return replace(run, training=replace(run.training, **changes)) if changes else run


@dataclass
class PredictResult:
    run: Run
    hw: Hardware
    prediction: Prediction
    framework: Framework | None
    memory: dict[str, Any]
    published: dict[str, Any] | None = None
    budget: ErrorBudget | None = None
    extra: dict[str, Any] = field(default_factory=dict)
    layers: LayerBudget | None = None

    @property
    def counting(self) -> tuple[str, str]:
        """What the TFLOP/s per GPU and the MFU count, in words (:func:`..core.costs.flops.reported_convention`)."""
        tr = self.run.training
        if flops.reported_convention(tr) == "megatron":
            tflops = "Narayanan et al. 2021 eq. 3, full recomputation counted"
        else:
            tflops = "PaLM's 6N + 12·l·s·d a token, attention unmasked" + (
                ", recomputation added" if tr.recompute != "none" else "")
        peak = "FP8" if tr.precision == "fp8" else "16-bit"
        mfu = f"causal work, no recomputation, over the {peak} peak" if self.prediction.mode == "default" else \
            f"the same count over the {peak} peak"
        return tflops, mfu

    def trace_label(self) -> str:
        """The name a step's trace gives its process: the run, its layout and stack."""
        r, L, p = self.run, self.run.layout, self.prediction
        timed = self.timed_layout()
        form = f" {cp_form_label(timed['cp_kind'], timed['cp_a2a'])}" if L.cp > 1 else ""
        return (f"{r.model.name} on {L.gpus:,} × {self.hw.name} (tp {L.tp}, cp {L.cp}{form}, pp {L.pp}, dp {L.dp}; "
                f"{p.schedule}, v = {p.vpp}, m = {p.microbatches}; {self.framework.name if self.framework else 'seed'}; "
                f"{r.training.precision}), predicted step {p.step_time_s:.4f} s")

    def trace_metadata(self) -> dict[str, Any]:
        """What a step's trace says beside its events: the prediction's figures and notes."""
        p = self.prediction
        return {"step_time_s": p.step_time_s, "tflops_per_gpu": p.tflops_per_gpu, "mfu": p.mfu,
                "breakdown": p.breakdown.as_dict(), "flushes": p.flushes, "microbatches": p.microbatches,
                "schedule": p.schedule, "vpp": p.vpp, "notes": list(p.notes),
                "generator": "modelcut predict --trace (the default model's timeline: core/step/timeline.py)"}

    @property
    def tokens_per_s_per_gpu(self) -> float:
        """Predicted throughput as torchtitan, NeMo and llm-foundry print it: tokens a step over
        step time · GPUs."""
        return self.run.tokens_per_s_per_gpu(self.prediction.step_time_s)

    @property
    def model_tflops_per_gpu(self) -> dict[str, float]:
        """Model TFLOP/s per GPU under each FLOP convention, no recomputation
        (:func:`..core.costs.flops.model_tflops_per_gpu`): the figure to set beside a stack's own log
        (torchtitan's ``non-embedding``, NeMo's ``megatron``, Megatron-Bridge's ``non-embedding-causal``)."""
        return flops.model_tflops_per_gpu(self.run.model, self.run.training, self.run.layout.gpus,
                                          self.prediction.step_time_s)

    def timed_layout(self) -> dict[str, Any]:
        """The layout as it was timed: what the run left open filled as its stack runs it
        (:meth:`..core.step.frameworks.Framework.resolve`: ZeRO stage, sequence parallelism, the
        context-parallel form, the experts' tensor parallelism), with the prediction's chunks and
        schedule; the seed model's as given (ZeRO 0 where it names none)."""
        L = self.framework.resolve(self.run).layout if self.framework is not None else self.run.layout
        p = self.prediction
        return {"tp": L.tp, "cp": L.cp, "pp": L.pp, "dp": L.dp, "ep": L.ep,
                "etp": (L.etp or L.tp) if L.ep > 1 else None, "vpp": p.vpp, "schedule": p.schedule,
                "zero": L.zero_stage, "sequence_parallel": bool(L.sequence_parallel),
                "cp_kind": L.cp_form if L.cp > 1 else None, "cp_a2a": L.cp_a2a, "order": list(L.order),
                "dp_shard": L.dp_shard if L.hybrid else None,
                "first_layers": L.first_layers, "last_layers": L.last_layers,
                "framework": self.framework.name if self.framework is not None else None}

    def as_dict(self) -> dict[str, Any]:
        d = self.prediction.as_dict()
        d["tokens_per_s_per_gpu"] = self.tokens_per_s_per_gpu
        d["model_tflops_per_gpu"] = self.model_tflops_per_gpu
        d["layout"] = self.timed_layout()
        d["memory"] = self.memory
        if self.published is not None:
            d["published"] = self.published
        if self.budget is not None:
            b = self.budget
            d["budget"] = {"dominant": b.dominant, "dominant_share": b.dominant_share,
                           "lines": [{"input": ln.input, "alternative": ln.alternative, "change_pct": ln.change_pct}
                                     for ln in b.lines]}
        if self.layers is not None:
            d["layers"] = self.layers.as_dict()
        return d


def catalog_run(run_id: str, mode: str) -> tuple[PublishedRun, Run, dict[str, str]]:
    """A published run of the catalog as ``validate`` runs it: the seed mode the run as runs.toml
    records it; the default mode with the settings of runs_dev.toml (framework and its overlap
    overrides, micro-batch, interleaving, recomputation)."""
    pr = catalog.published_run(run_id)
    settings: dict[str, str] = {}
    run = pr.run
    if mode == "default":
        st = catalog.run_settings().get(run_id)
        run = catalog.apply_settings(pr.run, st)
        if st is not None:
            settings["framework"] = st.framework
            if st.overlap_text():
                settings["overlap"] = st.overlap_text()
    return pr, run, settings


def published_prediction(run_id: str, mode: str = "default", layers: bool = False,
                         limits: Limits | None = None) -> PredictResult:
    """A published run predicted as ``validate`` predicts it, with its published figure
    (``modelcut predict --run ID``, ``GET /api/runs/{id}``); ``layers`` itemises one micro-batch."""
    pr, run, settings = catalog_run(run_id, mode)      # predict refuses an unknown mode
    return predict(PredictRequest(run, mode=mode, framework=settings.get("framework"), overlap=settings.get("overlap"),
                                  published=pr, layers=layers), limits)


def _left_out(pr: PublishedRun) -> str:
    """Why a published run is not in validation: the first clause of its catalog notes (which
    begin "left out of validation: ...", or else say nothing more)."""
    text = pr.notes if pr.notes.startswith("left out of validation") else "left out of validation"
    depth = 0
    for i, ch in enumerate(text):
        depth += (ch == "(") - (ch == ")")
        if depth == 0 and text[i:i + 2] in ("; ", ". "):
            text = text[:i]
            break
    return text.rstrip(".") + " (catalog/runs.toml notes)"


def published_figure(pr: PublishedRun, pred: Prediction, run: Run,
                     predict_with: Callable[[Efficiency], Prediction] | None = None) -> dict[str, Any]:
    """The prediction against what the source published, counted as ``validate`` counts it (the
    same measured step time, :func:`..analysis.measured.measured_step_time`): the published
    figures, the measured step time, the predicted TFLOP/s in the source's FLOP count (None
    where modelcut does not reproduce that count) and the error of the predicted throughput.
    With ``predict_with`` (the run predicted under given constants), out of sample first as
    validate leads: the run predicted with the shipped profile's constants fitted without its
    source (:func:`fold_constants`), its step time and error (``out_of_sample``)."""
    f = published_flops(pr)
    tflops = None if f is None else f / (run.layout.gpus * pred.step_time_s) / 1e12
    out: dict[str, Any] = {"id": pr.id, "source": pr.source, "published_tflops": pr.published_tflops,
                           "published_step_time_s": pr.published_step_time_s, "published_mfu": pr.published_mfu,
                           "published_tokens_per_s": pr.published_tokens_per_s,
                           "predicted_tflops_counted_as_published": tflops}
    try:
        meas = measured_run(pr, catalog.hardware(run.gpu), catalog.run_settings().get(pr.id))
    except ModelcutError:
        return out          # no figure modelcut can compare (the catalog row says why)
    out["measured_step_time_s"] = measured_step_time(meas)
    out["error_pct"] = error_pct(meas, pred)
    fold = fold_constants(meas.family, meas.hw) if predict_with is not None else None
    if fold is not None:
        lp = predict_with(fold)
        out["out_of_sample"] = {"source_left_out": meas.family, "step_time_s": lp.step_time_s,
                                "error_pct": error_pct(meas, lp)}
    return out


def count_above_peak(run: Run, hw: Hardware, pred: Prediction, which: str = "") -> str | None:
    """The note a prediction carries where its TFLOP/s per GPU, a convention's count, is above the
    accelerator's peak (:func:`..core.costs.kernels.mfu_peak`): the conventions count every layer's
    attention over the whole sequence, unmasked (:func:`..core.costs.flops.reported_convention`),
    which is more than a causal, windowed or chunked layer computes, by far at long sequences. MFU
    counts the work done. None where the count is at or below the peak. ``which`` names the layout
    the figures are of (an explorer's "#1")."""
    peak = mfu_peak(hw, run.training)
    if pred.tflops_per_gpu * 1e12 <= peak:
        return None
    m = run.model
    done = ["causal masking"]
    if m.sliding_layers:
        done.append(f"the {m.sliding_window:,}-key window of {m.sliding_layers} of its {m.layers} layers")
    if m.chunked_layers:
        done.append(f"the {m.attention_chunk:,}-token blocks of {m.chunked_layers} of its {m.layers} layers")
    of = f" of {which}" if which else ""
    return (f"TFLOP/s per GPU{of} ({pred.tflops_per_gpu:,.0f}) is above the {hw.name}'s "
            f"{peak / 1e12:,.0f} TFLOP/s peak: a convention's count, every layer's attention over all "
            f"{run.training.seq_len:,} positions, where {' and '.join(done)} leave less to compute; "
            f"MFU{of} ({pred.mfu * 100:.1f} %) counts the work done")


def prediction_memory(run: Run, hw: Hardware, pred: Prediction, framework: Framework | None) -> dict[str, Any]:
    """Memory of the pipeline the prediction timed, under the stack it assumed; a layout memory
    cannot describe gives its one-line reason instead."""
    try:
        return memory_report(run, hw, plan=pred.plan, framework=framework)
    except ModelcutError as exc:
        return {"error": str(exc)}


#: Recomputation modes from the least to the most recomputed (a suggestion only goes up).
_RECOMPUTE_ORDER = ("none", "selective", "full")


def fit_changes(run: Run, hw: Hardware, eff: Efficiency, stack: Framework, pred: Prediction,
                limits: Limits | None = None) -> list[str]:
    """Where a run does not fit: each single change of its settings, this stack running it, that
    makes it fit, with the step time it costs (the same model): more recomputation (selective, then
    full), a smaller micro-batch (the largest that fits), a higher ZeRO stage (the lowest that fits).
    A change the stack's rules refuse, the model cannot take, or whose prediction is over the
    ``limits`` (a smaller micro-batch simulates more of them) is not offered. The layout itself
    (tp, cp, pp, dp) is the explorer's question, not this one's."""
    tr, L = run.training, stack.resolve(run).layout
    variants: list[tuple[str, Run]] = []
    if tr.recompute_layers is None and not tr.partial_recompute and tr.recompute in _RECOMPUTE_ORDER:
        for mode in _RECOMPUTE_ORDER[_RECOMPUTE_ORDER.index(tr.recompute) + 1:]:
            variants.append((f"recompute {mode}", replace(run, training=replace(tr, recompute=mode, recompute_modules=None))))
    b = tr.micro_batch // 2
    smaller = []
    while b >= 1:
        if tr.micro_batch % b == 0:
            smaller.append((f"micro-batch {b}", replace(run, training=replace(tr, micro_batch=b))))
        b //= 2
    higher = [(f"ZeRO-{z}", replace(run, layout=replace(L, zero=z))) for z in range(L.zero_stage + 1, 4)] if L.dp > 1 else []
    out: list[str] = []
    for group, first_only in ((variants, False), (smaller, True), (higher, True)):
        for label, cand in group:
            try:
                check_sizes(cand, limits)
                # the memory alone first (no step simulated): most changes that do not fit stop here
                if not memory_report(cand, hw, framework=stack).get("fits"):
                    continue
                p = step_predict(cand, hw, "default", efficiency=eff, framework=stack)
                if stack_violations(cand, stack, p):
                    continue
                mem = memory_report(cand, hw, plan=p.plan, framework=stack)
            except ModelcutError:
                continue
            if mem.get("fits"):
                dt = (p.step_time_s / pred.step_time_s - 1) * 100
                out.append(f"{label} ({mem['peak_bytes'] / 1e9:.1f} GB, step {p.step_time_s:.4g} s, {dt:+.1f} %)")
                if first_only:
                    break
    return out


def fit_note(changes: list[str]) -> str:
    """The note a run that does not fit carries: the single changes that make it fit, or that none does."""
    if changes:
        return "to fit, one change (the rest as given): " + "; ".join(changes)
    return ("no single change of recomputation, micro-batch or ZeRO stage makes it fit; "
            "modelcut explore searches the other layouts of these GPUs")


def stack_violations(run: Run, fw: Framework, pred: Prediction) -> list:
    """The rules of the stack (catalog/framework_rules.toml) the run breaks, as it was timed: a
    prediction of a layout the stack cannot run says so in its notes."""
    L = fw.resolve(run).layout
    return violations(catalog.capabilities(fw.name), run.model, tp=L.tp, cp=L.cp, pp=L.pp, dp=L.dp, ep=L.ep,
                      vpp=pred.vpp, schedule=pred.schedule, cp_kind=L.cp_kind if L.cp > 1 else None,
                      seq=run.training.seq_len, sequence_parallel=L.sequence_parallel, zero=L.zero,
                      recompute=(BLOCKS if run.training.recompute_layers is not None
                                 else EVERY if run.training.partial_recompute else run.training.recompute),
                      dp_shard=L.dp_shard, first_layers=L.first_layers, last_layers=L.last_layers,
                      local_batch=run.training.local_batch)


def predict(req: PredictRequest, limits: Limits | None = None) -> PredictResult:
    """The prediction, its memory and, when asked, the published figure and the error budget;
    a run over the limits refused before any of it. A published run left out of validation that
    the model cannot take as catalogued is refused naming the run and why it is left out."""
    try:
        return _predict(req, limits)
    except LimitError:
        raise
    except ModelcutError as exc:
        pr = req.published
        if pr is None or pr.in_validation:
            raise
        raise ModelcutError(f"{pr.id} cannot be predicted as catalogued: {exc}; {_left_out(pr)}") from None


def _predict(req: PredictRequest, limits: Limits | None = None) -> PredictResult:
    if req.mode not in MODES:
        raise ModelcutError(f"unknown mode {req.mode!r}; choose one of {', '.join(MODES)}")
    if req.eta is not None and (isinstance(req.eta, bool) or not isinstance(req.eta, (int, float))
                                or not 0.01 <= req.eta <= 1):
        raise ModelcutError(f"eta must be a fraction of peak from 0.01 to 1, got {req.eta!r}")
    run = with_choices(with_precision(req.run, req.precision, req.fp8_recipe), req.grad_reduce, req.attention,
                       req.fp8_param_gather)
    hw = catalog.hardware(req.run.gpu)
    check_sizes(run, limits)
    layers = None
    if req.mode == "seed":
        if (req.framework is not None or req.overlap is not None or req.profile is not None or req.budget
                or req.layers):
            raise ModelcutError("--framework, --overlap, --profile, --budget and --layers apply to --mode default")
        if req.timeline:
            raise ModelcutError(SEED_HAS_NO_TIMELINE)
        pred = step_predict(run, hw, "seed", eta=seed_eta() if req.eta is None else req.eta)
        fw = None
    else:
        overlap, unmodelled = (read_overlap(req.overlap) if isinstance(req.overlap, str)
                               else overlap_options(req.overlap))
        fw = catalog.framework(req.framework)
        # the profile's constants, the matrix products' fraction replaced where --eta gives it
        eff = efficiency_for(hw, req.profile)
        if req.eta is not None:
            eff = replace(eff, gemm=float(req.eta))
        stack = fw.with_overlap(overlap)
        pred = step_predict(run, hw, "default", efficiency=eff, framework=stack, timeline=req.timeline)
        if req.timeline and not pred.timeline:
            raise ModelcutError(no_timeline(fw.name))
        if req.layers:
            layers = layer_budget(run, hw, eff, stack)
        pred.notes += unmodelled
    if fw is not None:
        pred.notes += [f"stack rule: {v.line()}" for v in stack_violations(run, fw, pred)]
    above = count_above_peak(run, hw, pred)
    if above is not None:
        pred.notes.append(above)
    result = PredictResult(run, hw, pred, fw, prediction_memory(run, hw, pred, fw), layers=layers)
    if fw is not None and req.published is None and result.memory.get("fits") is False:
        pred.notes.append(fit_note(fit_changes(run, hw, eff, stack, pred, limits)))
    if req.published is not None:
        # under the shipped constants, the run out of sample too, as validate's table predicts it
        shipped = req.mode == "default" and req.profile is None and req.eta is None
        result.published = published_figure(
            req.published, pred, run,
            (lambda e: step_predict(run, hw, "default", efficiency=e, framework=stack)) if shipped else None)
        if not req.published.in_validation:
            pred.notes.append(_left_out(req.published))
        if result.memory.get("fits") is False:
            # it ran: say why the count cannot be the run's
            if fw is None:
                pred.notes.append("memory: seed mode counts it without the run's stack and settings; "
                                  "--mode default counts it as they keep it")
            else:
                pred.notes.append("memory: this published run ran on its accelerators, so the memory model "
                                  "over-counts it (what its stack saves is not modelled"
                                  + ("; it is left out of validation" if not req.published.in_validation else "")
                                  + ")")
    if req.budget:       # the constants and overlaps of the prediction above (default mode)
        result.budget = error_budget(run, hw, eff, fw.name, overlap)
    return result


def precision_list(text: str) -> list[str]:
    """``--precision bf16,fp8`` as modelcut's names (:func:`..core.specs.precision_name`), each once,
    two or three of them; one name alone is a list of one."""
    names = [precision_name(x) for x in text.split(",") if x.strip()]
    bad = [x for x in names if x not in PRECISIONS]
    if bad or not names:
        raise ModelcutError(f"--precision must be bf16, fp16 or fp8, or a list of them, got {text!r}")
    if len(set(names)) != len(names):
        raise ModelcutError(f"--precision names {names[0] if names.count(names[0]) > 1 else 'a precision'} twice: "
                            f"{text!r}")
    return names


@dataclass
class PrecisionPredictions:
    """The same run at each precision: what FP8 buys in time and costs or saves in memory."""

    results: list[PredictResult]

    def as_dict(self) -> dict[str, Any]:
        return {"precisions": [r.run.training.precision for r in self.results],
                "predictions": [r.as_dict() for r in self.results]}


def predict_each_precision(req: PredictRequest, precisions: list[str],
                           limits: Limits | None = None) -> PrecisionPredictions:
    """The same run at each precision (:func:`predict` with ``precision`` replaced; the request's
    FP8 recipe and FP8 gathering with the FP8 one, a 16-bit reduction in each one's 16-bit type),
    side by side."""
    recipe_among(precisions, req.fp8_recipe)
    if req.layers and len(precisions) > 1:
        raise ModelcutError("one micro-batch itemised (--layers, layers) takes one precision; give one, not several")
    flag = grad_reduce_name(req.grad_reduce) if req.grad_reduce is not None else None
    return PrecisionPredictions([predict(replace(req, precision=p, fp8_recipe=req.fp8_recipe if p == "fp8" else None,
                                                 fp8_param_gather=req.fp8_param_gather if p == "fp8" else None,
                                                 grad_reduce=reduce_at(flag, p)),
                                         limits) for p in precisions])


def predict_input(inp: PredictInput, limits: Limits | None = None,
                  timeline: bool = False) -> PredictResult | PrecisionPredictions:
    """The use case from a validated request (``POST /api/predict``): the run built from its
    model, layout and batch, then :func:`predict`, or the run at each of ``precisions``
    (:func:`predict_each_precision`); ``timeline`` keeps the step's timeline (one precision only:
    ``POST /api/predict/trace``)."""
    lim = limits or DEFAULT
    spec = model_choice(inp.model, inp.hf_config, inp.model_spec, lim)
    hw = catalog.hardware(inp.gpu)
    layout = catalog.layout_from_table(inp.layout.model_dump(exclude_none=True), "layout")
    tt = inp.training.model_dump()
    recipe = tt.get("fp8_recipe")
    if inp.precisions:          # each precision's own: the table's precision and recipe replaced below
        tt = {**tt, "precision": "bf16", "fp8_recipe": None}
    training = catalog.training_from_table(tt, "training")
    run = Run(model=spec, gpu=hw.name, layout=layout, training=training, gpus_per_node=inp.gpus_per_node, name="web")
    check_sizes(run, lim)
    check_run(run)
    overlap = inp.overlap.model_dump(exclude_none=True) if inp.overlap is not None else None
    req = PredictRequest(run, mode=inp.mode, eta=inp.eta, framework=inp.framework, overlap=overlap,
                         timeline=timeline, layers=inp.layers)
    if inp.precisions:
        if timeline:
            raise ModelcutError("a step's trace takes one precision; give precision alone, not precisions")
        return predict_each_precision(replace(req, fp8_recipe=recipe), list(inp.precisions), lim)
    return predict(req, lim)
