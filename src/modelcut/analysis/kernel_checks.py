"""The measured kernel tables checked against published kernel benchmarks (no fitting).

**Linear-layer benchmarks** (:func:`linear_rows`, the catalog's ``kernel_checks.toml``): a
transformer layer's twelve linear-layer products, Y[M×N] = X[M×K]·W[K×N] for QKV (K = h,
N = 3h), the attention output (h, h), MLP up (h, i) and MLP down (i, h) with M the tokens, and
for each its data gradient (M, N, K) and weight gradient (K, M, N), as Transformer Engine's
``benchmarks/gemm/benchmark_gemm.py`` (``compute_gemm_shapes``) derives and times them: each one
te.Linear forward of its shape. Its time here is the product at its data type's measured rate
(:func:`..core.costs.kernels.gemm_time`, the constants at 1: the kernels alone) plus, in FP8
autocast, the casts of its input and of its weight, both quantized every call, at the recipe's
bytes per element (:func:`..core.costs.fp8.cast_bytes`); pre-quantized: the product alone.

**Layer measurements** (:func:`layer_rows`, the file's ``[[layer]]`` entries): one transformer
layer's forward and backward (its recomputed forward included) inside a training step, under a
published run's settings with each measured recomputation and sequence-parallel setting. Its time
here is the step model's own for that layer (:func:`..core.step.stage_costs.kernels`, the dense
layer's passes: compute plus the tensor-parallel time the stack leaves exposed), with the run's
profile constants, as a step is timed.

**Product sweeps** (:func:`sweep_rows`, the file's ``[[gemm_sweep]]`` entries): another project's
measurements of single products by shape, each shape's time here the product tables' burst rate
(:func:`..core.costs.kernels.burst_tflops`: the tables are bursts, as the sweeps are), 2·m·n·k over
it, against the sweep's time for the product alone (an FP8 call less its measured input
quantization). Summarised as the ratio modelcut/measured: its median, 10th and 90th percentiles,
the time-weighted ratio Σ modelcut / Σ measured (what a layer of such products would see) and the
shape furthest off; with an FP8 sweep, FP8's speed-up over bf16 at the shapes both sweeps of the
device measured, modelcut's beside the measured.

**Attention sweeps** (:func:`attention_rows`, the file's ``[[attention_sweep]]`` entries): another
benchmark of a fused attention kernel by sequence length, each point's rate here the attention
table's burst rate for that kernel (:func:`..core.costs.kernels.fused_tflops` with
``sustained=False``) at the point's mask, sequence length and head dimension (the mean of Q·Kᵀ's and
V's, as the FLOPs weigh them). Summarised per direction as the time ratio modelcut/measured
(= measured rate over the table's): its median, range and the point furthest off.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace

from .. import catalog
from ..catalog.kernel_checks import (LINEAR_KINDS, AttentionSweep, GemmSweep, LayerCheck, LinearCheck, NormSweep,
                                     attention_sweeps, gemm_sweeps, layer_checks, linear_checks, norm_sweeps)
from ..core.costs import comm
from ..core.costs import fp8 as fp8_mod
from ..core.costs.flops import attention_pairs
from ..core.costs.kernels import Efficiency, burst_tflops, fused_tflops, gemm_time, mem_time, window_work
from ..core.errors import ModelcutError
from ..core.specs import Hardware, ModelSpec, Training
from ..core.step.elementwise import NORM_BYTES, NORM_BYTES_BWD
from ..core.step.layers import dense_linears
from ..core.step.stage_costs import kernels
from .measured import measured_run

#: The kernels alone: no training-step constant applies to a kernel benchmark.
KERNELS_ONLY = Efficiency(gemm=1.0, mem=1.0, net=1.0)


def layer_linear_shapes(hidden: int, intermediate: int, tokens: int) -> list[tuple[int, int, int]]:
    """The twelve (M, K, N) products of one layer (module doc), forward, data gradient, weight
    gradient: the step model's own four products of a dense layer (:func:`..core.step.layers.dense_linears`,
    for multi-head attention and an ungated MLP, as the benchmark derives them; the head count
    does not change a shape), in Transformer Engine's (rows, inner, output) order, with their
    gradients as :func:`..core.costs.kernels.gemm_fwd_bwd` times them."""
    model = ModelSpec("kernel-check", layers=1, hidden=hidden, ffn_hidden=intermediate, heads=1, kv_heads=1,
                      vocab=1, gated_mlp=False)
    fwd = [(int(m), k, n) for m, n, k, _ in dense_linears(model, tokens, 1)]
    dgrad = [(m, n, k) for m, k, n in fwd]
    wgrad = [(k, m, n) for m, k, n in fwd]
    return fwd + dgrad + wgrad


def linear_call_time(shape: tuple[int, int, int], hw: Hardware, kind: str, eff: Efficiency = KERNELS_ONLY) -> float:
    """Seconds of one te.Linear forward of ``shape`` (M, K, N) of a benchmark kind
    (:data:`..catalog.kernel_checks.LINEAR_KINDS`), module doc."""
    precision, recipe, prequantized = LINEAR_KINDS[kind]
    m, k, n = shape
    dtype = "fp8" if precision == "fp8" else "bf16"
    t = gemm_time(m, n, k, hw, eff, dtype=dtype)
    if dtype == "fp8" and not prequantized:
        f = fp8_mod.resolve(Training(seq_len=1, global_batch=1, micro_batch=1, precision="fp8", fp8_recipe=recipe), hw)
        fwd, _ = fp8_mod.cast_bytes(f, inputs=m * k, fused_inputs=0, grads=0, weights=k * n)
        t += mem_time(fwd, hw, eff)
    return t


@dataclass(frozen=True)
class LinearRow:
    """One benchmark kind: modelcut's and the published milliseconds per layer, and each one's
    speed-up over its own bf16 time (the ratio holds whatever clock the device ran at: modelcut's
    times are at the device's sustained share, ``sustained_frac``, as in a training step; the
    benchmark's are a short burst on a 600 W card)."""

    check: str
    device: str
    kind: str
    predicted_ms: float
    measured_ms: float
    predicted_speedup: float | None = None
    measured_speedup: float | None = None

    @property
    def error_pct(self) -> float:
        return (self.predicted_ms - self.measured_ms) / self.measured_ms * 100

    @property
    def speedup_error_pct(self) -> float | None:
        if self.predicted_speedup is None or self.measured_speedup is None:
            return None
        return (self.predicted_speedup - self.measured_speedup) / self.measured_speedup * 100

    def as_dict(self) -> dict:
        return {"check": self.check, "device": self.device, "kind": self.kind, "predicted_ms": self.predicted_ms,
                "measured_ms": self.measured_ms, "error_pct": self.error_pct,
                "predicted_speedup": self.predicted_speedup, "measured_speedup": self.measured_speedup,
                "speedup_error_pct": self.speedup_error_pct}


def check_rows(check: LinearCheck) -> list[LinearRow]:
    shapes = layer_linear_shapes(check.hidden, check.intermediate, check.tokens)
    ms = {kind: sum(linear_call_time(s, check.hw, kind) for s in shapes) * 1e3 for kind in check.measured_ms}
    base_p, base_m = ms.get("bf16"), check.measured_ms.get("bf16")
    return [LinearRow(check.id, check.hw.name, kind, ms[kind], measured,
                      base_p / ms[kind] if base_p else None, base_m / measured if base_m else None)
            for kind, measured in check.measured_ms.items()]


def linear_rows() -> list[LinearRow]:
    """Every published linear-layer benchmark, kind by kind."""
    return [row for c in linear_checks() for row in check_rows(c)]


@dataclass(frozen=True)
class LayerRow:
    """One setting of a layer measurement: modelcut's and the published forward and backward."""

    check: str
    device: str
    recompute: str
    sequence_parallel: bool
    predicted_fwd_ms: float
    predicted_bwd_ms: float
    measured_fwd_ms: float
    measured_bwd_ms: float
    fwd_parts_ms: dict[str, float]        # the forward's products, attention core, memory-bound kernels, communication
    fwd_products_tflops: float            # the forward's linear-layer products: their FLOPs over their time

    @property
    def fwd_error_pct(self) -> float:
        return (self.predicted_fwd_ms - self.measured_fwd_ms) / self.measured_fwd_ms * 100

    @property
    def bwd_error_pct(self) -> float:
        return (self.predicted_bwd_ms - self.measured_bwd_ms) / self.measured_bwd_ms * 100

    def as_dict(self) -> dict:
        return {"check": self.check, "device": self.device, "recompute": self.recompute,
                "sequence_parallel": self.sequence_parallel,
                "predicted_fwd_ms": self.predicted_fwd_ms, "measured_fwd_ms": self.measured_fwd_ms,
                "fwd_error_pct": self.fwd_error_pct, "predicted_bwd_ms": self.predicted_bwd_ms,
                "measured_bwd_ms": self.measured_bwd_ms, "bwd_error_pct": self.bwd_error_pct,
                "fwd_parts_ms": dict(self.fwd_parts_ms), "fwd_products_tflops": self.fwd_products_tflops}


def layer_check_rows(check: LayerCheck) -> list[LayerRow]:
    """Each setting of one layer measurement beside the step model's time for that layer (module doc)."""
    try:
        pr = catalog.published_run(check.run)
    except ModelcutError:
        raise ModelcutError(f"kernel_checks.toml {check.id}: no published run {check.run!r}") from None
    meas = measured_run(pr, st=catalog.run_settings().get(pr.id))
    fw = catalog.framework(meas.framework).with_overlap(meas.overlap)      # as validation times the run
    eff = catalog.profile_for(meas.hw).efficiency
    rows = []
    for c in check.configs:
        run = fw.resolve(replace(meas.run, layout=replace(meas.run.layout, sequence_parallel=c.sequence_parallel),
                                 training=replace(meas.run.training, recompute=c.recompute, recompute_modules=None,
                                                  recompute_layers=None)))
        L = run.layout
        bw = comm.group_bandwidths(L, meas.hw, run.gpus_per_node or meas.hw.per_node, fw.multi_nic_rings)
        layer = kernels(run, meas.hw, eff, fw, bw).dense
        f = layer.fwd
        parts = {"products": f.gemm * 1e3, "attention": f.attention * 1e3, "memory": f.memory * 1e3,
                 "communication": f.comm * 1e3}
        tokens = run.training.micro_batch * run.training.seq_len // L.cp
        flops = sum(2 * m * n * k * cnt for m, n, k, cnt in dense_linears(run.model, tokens, L.tp))
        rows.append(LayerRow(check.id, meas.hw.name, c.recompute, c.sequence_parallel, f.total * 1e3,
                             (layer.bwd.total + layer.recompute.total) * 1e3, c.forward_ms, c.backward_ms,
                             parts, flops / f.gemm / 1e12 if f.gemm else 0.0))
    return rows


def layer_rows() -> list[LayerRow]:
    """Every published layer measurement, setting by setting."""
    return [row for c in layer_checks() for row in layer_check_rows(c)]


def sweep_time_ms(sweep: GemmSweep, m: int, n: int, k: int) -> float:
    """modelcut's burst milliseconds for one m×n×k product of the sweep's data type on its device."""
    return 2.0 * m * n * k / (burst_tflops(m, n, k, sweep.hw, dtype=sweep.dtype) * 1e12) * 1e3


def _quantile(xs: list[float], q: float) -> float:
    """The q-quantile of ``xs`` by linear interpolation between order statistics."""
    ys = sorted(xs)
    pos = q * (len(ys) - 1)
    lo = int(math.floor(pos))
    hi = min(lo + 1, len(ys) - 1)
    return ys[lo] + (ys[hi] - ys[lo]) * (pos - lo)


@dataclass(frozen=True)
class SweepRow:
    """One sweep summarised (module doc): ratios are modelcut's time over the measured."""

    check: str
    device: str
    dtype: str
    shapes: int
    median_ratio: float
    p10_ratio: float
    p90_ratio: float
    time_ratio: float
    worst_shape: tuple[int, int, int]
    worst_ratio: float
    measured_speedup: float | None = None    # FP8 over bf16, the median over shapes both sweeps hold
    predicted_speedup: float | None = None
    speedup_shapes: int = 0

    def as_dict(self) -> dict:
        return {"check": self.check, "device": self.device, "dtype": self.dtype, "shapes": self.shapes,
                "median_ratio": self.median_ratio, "p10_ratio": self.p10_ratio, "p90_ratio": self.p90_ratio,
                "time_ratio": self.time_ratio, "worst_shape": list(self.worst_shape), "worst_ratio": self.worst_ratio,
                "measured_speedup": self.measured_speedup, "predicted_speedup": self.predicted_speedup,
                "speedup_shapes": self.speedup_shapes}


def sweep_summary(sweep: GemmSweep, bf16: GemmSweep | None = None) -> SweepRow:
    """One sweep against the tables (module doc); ``bf16``: the same device's 16-bit sweep, for an
    FP8 sweep's speed-up."""
    ours = [sweep_time_ms(sweep, p.m, p.n, p.k) for p in sweep.points]
    meas = [p.product_ms for p in sweep.points]
    ratios = [a / b for a, b in zip(ours, meas)]
    worst = max(range(len(ratios)), key=lambda i: abs(math.log(ratios[i])))
    w = sweep.points[worst]
    sp_m = sp_p = None
    n_sp = 0
    if bf16 is not None:
        base = {(p.m, p.n, p.k): p.product_ms for p in bf16.points}
        pairs = [(base[(p.m, p.n, p.k)] / p.product_ms,
                  sweep_time_ms(bf16, p.m, p.n, p.k) / t)
                 for p, t in zip(sweep.points, ours) if (p.m, p.n, p.k) in base]
        if pairs:
            n_sp = len(pairs)
            sp_m = _quantile([a for a, _ in pairs], 0.5)
            sp_p = _quantile([b for _, b in pairs], 0.5)
    return SweepRow(sweep.id, sweep.hw.name, sweep.dtype, len(ratios), _quantile(ratios, 0.5),
                    _quantile(ratios, 0.1), _quantile(ratios, 0.9), sum(ours) / sum(meas),
                    (w.m, w.n, w.k), ratios[worst], sp_m, sp_p, n_sp)


def sweep_rows() -> list[SweepRow]:
    """Every product sweep summarised; an FP8 sweep with its device's bf16 sweep's speed-up."""
    sweeps = gemm_sweeps()
    bf16 = {s.hw.name: s for s in sweeps if s.dtype == "bf16"}
    return [sweep_summary(s, bf16.get(s.hw.name) if s.dtype != "bf16" else None) for s in sweeps]


@dataclass(frozen=True)
class AttentionPointRow:
    """One measured attention call beside the table: the measured and the table's burst TFLOP/s,
    forward and backward."""

    seq_len: int
    causal: bool
    heads: int
    kv_heads: int
    head_dim: int              # the mean of Q·Kᵀ's and V's, at which the table is read
    measured_fwd_tflops: float
    measured_bwd_tflops: float
    table_fwd_tflops: float
    table_bwd_tflops: float
    window: int | None = None  # a causal sliding window's keys; the rates count the window's pairs

    @property
    def fwd_ratio(self) -> float:
        """modelcut's time over the measured."""
        return self.measured_fwd_tflops / self.table_fwd_tflops

    @property
    def bwd_ratio(self) -> float:
        return self.measured_bwd_tflops / self.table_bwd_tflops

    def as_dict(self) -> dict:
        return {"seq_len": self.seq_len, "causal": self.causal, "heads": self.heads, "kv_heads": self.kv_heads,
                "head_dim": self.head_dim, "measured_fwd_tflops": self.measured_fwd_tflops,
                "measured_bwd_tflops": self.measured_bwd_tflops, "table_fwd_tflops": self.table_fwd_tflops,
                "table_bwd_tflops": self.table_bwd_tflops, "fwd_ratio": self.fwd_ratio, "bwd_ratio": self.bwd_ratio,
                "window": self.window}


class _RatioSpan:
    """A sweep's points' ratios of modelcut's time over the measured (each point's ``fwd_ratio`` and
    ``bwd_ratio``): their median and range, forward or backward."""

    points: tuple

    def _ratios(self, direction: str) -> list[float]:
        return [p.fwd_ratio if direction == "fwd" else p.bwd_ratio for p in self.points]

    def median(self, direction: str) -> float:
        return _quantile(self._ratios(direction), 0.5)

    def span(self, direction: str) -> tuple[float, float]:
        r = self._ratios(direction)
        return min(r), max(r)

    def spans(self) -> dict[str, float]:
        """``fwd_median_ratio``, ``fwd_min_ratio``, ``fwd_max_ratio`` and the backward's."""
        out = {}
        for dr in ("fwd", "bwd"):
            lo, hi = self.span(dr)
            out.update({f"{dr}_median_ratio": self.median(dr), f"{dr}_min_ratio": lo, f"{dr}_max_ratio": hi})
        return out


@dataclass(frozen=True)
class AttentionRow(_RatioSpan):
    """One attention sweep summarised (module doc): ratios are modelcut's time over the measured."""

    check: str
    device: str
    impl: str
    kernel: str
    points: tuple[AttentionPointRow, ...]

    def furthest(self, direction: str) -> AttentionPointRow:
        """The point whose ratio in ``direction`` is furthest from 1 (either way)."""
        return max(self.points, key=lambda p: abs(math.log(p.fwd_ratio if direction == "fwd" else p.bwd_ratio)))

    def as_dict(self) -> dict:
        out = {"check": self.check, "device": self.device, "impl": self.impl, "kernel": self.kernel,
               "points": [p.as_dict() for p in self.points], **self.spans()}
        for dr in ("fwd", "bwd"):
            far = self.furthest(dr)
            out[f"{dr}_furthest"] = {"seq_len": far.seq_len, "causal": far.causal, "head_dim": far.head_dim,
                                     "window": far.window, "ratio": far.fwd_ratio if dr == "fwd" else far.bwd_ratio}
        return out


def attention_summary(sweep: AttentionSweep) -> AttentionRow:
    """One attention sweep against its table (module doc). A windowed point is read as the step
    model times it (:func:`..core.costs.kernels.window_work`): the tiles the window keeps, a share
    of the causal attention's s²/2 pairs, at the table's rate at the length it names; in the
    benchmark's count of the window's pairs that is the rate × pairs / (share · s²/2)."""
    points = []
    for p in sweep.points:
        d = (p.head_dim_qk + p.head_dim_v) // 2
        share, s_rate = window_work(sweep.impl, p.causal, p.seq_len, p.seq_len, p.window)
        rates = fused_tflops(sweep.impl, sweep.hw, p.causal, d, s_rate, sustained=False)
        if rates is None:
            raise ModelcutError(f"kernel_checks.toml {sweep.id}: {sweep.hw.name} has no {sweep.impl!r} attention table")
        if p.window is not None:
            counted = attention_pairs(p.seq_len, p.window) / (share * attention_pairs(p.seq_len))
            rates = (rates[0] * counted, rates[1] * counted)
        points.append(AttentionPointRow(p.seq_len, p.causal, p.heads, p.kv_heads, d, p.fwd_tflops, p.bwd_tflops,
                                        rates[0], rates[1], p.window))
    return AttentionRow(sweep.id, sweep.hw.name, sweep.impl, sweep.kernel, tuple(points))


def attention_rows() -> list[AttentionRow]:
    """Every attention sweep summarised."""
    return [attention_summary(s) for s in attention_sweeps()]


@dataclass(frozen=True)
class NormPointRow:
    """One measured norm shape: modelcut's memory-bound time for a fused norm of it over the
    measured fused kernel's, forward and backward."""

    model: str
    rows: int
    hidden: int
    fwd_ratio: float
    bwd_ratio: float

    def as_dict(self) -> dict:
        return {"model": self.model, "rows": self.rows, "hidden": self.hidden, "fwd_ratio": self.fwd_ratio,
                "bwd_ratio": self.bwd_ratio}


@dataclass(frozen=True)
class NormRow(_RatioSpan):
    """One norm sweep summarised: per point, modelcut's memory-bound time for a fused norm of the
    shape (:data:`..core.step.elementwise.NORM_BYTES` and ``NORM_BYTES_BWD`` an element at η_mem of the
    streaming bandwidth, the default profile's) over the measured fused kernel's."""

    check: str
    device: str
    kernel: str
    eta_mem: float
    points: tuple[NormPointRow, ...]

    def as_dict(self) -> dict:
        return {"check": self.check, "device": self.device, "kernel": self.kernel, "eta_mem": self.eta_mem,
                "points": [p.as_dict() for p in self.points], **self.spans()}


def norm_summary(sweep: NormSweep) -> NormRow:
    """One norm sweep against the step model's fused norm (:class:`NormRow`)."""
    eff = catalog.profile_for(sweep.hw).efficiency
    points = []
    for p in sweep.points:
        elems = p.rows * p.hidden
        fwd = mem_time(NORM_BYTES * elems, sweep.hw, eff) * 1e3 / p.fused_fwd_ms
        bwd = mem_time(NORM_BYTES_BWD * elems, sweep.hw, eff) * 1e3 / p.fused_bwd_ms
        points.append(NormPointRow(p.model, p.rows, p.hidden, fwd, bwd))
    return NormRow(sweep.id, sweep.hw.name, sweep.kernel, eff.mem, tuple(points))


def norm_rows() -> list[NormRow]:
    """Every norm sweep summarised."""
    return [norm_summary(s) for s in norm_sweeps()]
