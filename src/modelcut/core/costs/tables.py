"""Measured kernel throughput by shape, interpolated: matrix products, attention, collectives.

The catalog reads the measurements (``modelcut/catalog/kernels/``, each table with its source) and
builds these objects; the core only interpolates. Nothing here is fitted.

**Matrix products.** A product C[m×n] = A[m×k]·B[k×n] is timed from the measured throughput of the
nearest measured shapes, with tile and wave quantization as the physics between and beyond them
(NVIDIA, "Matrix Multiplication Background User's Guide": a product is cut into output tiles that
run in waves of one tile per SM; :func:`quantization`). Each measured point is first divided by
its own quantization q(m, n, k), which leaves the throughput a perfectly quantized product of
that size would reach; that *dequantized* throughput is interpolated (log throughput, linear in
log2 of each dimension) and multiplied by the quantization of the product asked for. At a
measured shape this returns the measurement exactly; beyond the largest measured dimension the
dequantized throughput is held (the kernels have saturated: XLA's H100 table reaches 780 TFLOP/s
at 4096³, Bekman's maximum achievable matmul 794.5 over all shapes); below the smallest the time is
held (launch-bound: 256³ takes 3-7 µs on every GPU measured).

Two kinds of measurement: a grid over (m, n, k) (:class:`GemmGrid`: XLA's per-architecture tables,
powers of two 256..4096) and square products only (:class:`GemmCurve`: NVIDIA's A100 cuBLAS
chart), where a product of any shape is taken at the square size of the same work,
s = (m·n·k)^(1/3). Checked on the H100 grid, that rule reproduces the 27 measured shapes whose
dimensions are all ≥ 1024 (a transformer's) from the square ones to a median 5 %, at most 14 %
(tests/test_kernels.py).

**Attention** (:class:`AttentionCurves`): TFLOP/s by implementation, direction (forward,
backward), causal or not, head dimension and sequence length, interpolated in log sequence
length and head dimension, held beyond the longest measured sequence (the kernels have
saturated); the FLOPs counted as the kernels' own benchmarks count them: forward 4·b·h·s²·d,
halved for a causal mask, backward 2.5 × forward. Below the shortest measured sequence the rate
is not held but follows the kernels' own structure (:func:`short_sequence_tflops`): each block
of ATTENTION_TILE queries runs n key blocks, s/T of them, or (s/T + 1)/2 on average under a
causal mask (the diagonal block run whole, counted half), in a time a + b·n (a: loading the
queries, the softmax's last rescale and writing the output; b: one key block), with a and b
from the two shortest measurements.

**Collectives** (:class:`CollectiveCurves`): nccl-tests time by message size for 2, 4 and 8
ranks inside one node, interpolated log-log in size (the out-of-place time, which holds the
latency floor at small sizes and the bus bandwidth at large ones), held at the largest measured
bus bandwidth beyond the largest size.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Sequence

import numpy as np

from ..errors import ModelcutError

#: Output tiles cuBLAS/CUTLASS choose among for 16-bit tensor-core products on Ampere and Hopper
#: (CUTLASS's default threadblock shapes 128×256, 256×128, 128×128; the smaller ones, which the
#: libraries pick for small products, 128×64, 64×128 and 64×64).
TILES: tuple[tuple[int, int], ...] = ((128, 256), (256, 128), (128, 128), (128, 64), (64, 128), (64, 64))
#: Split-K factors a library may use when a product has fewer tiles than SMs (an assumption: cuBLAS
#: picks split-K heuristically and does not document its choices; 1-4 covers CUTLASS's examples).
SPLIT_K = (1, 2, 3, 4)
#: A split keeps at least this much k per slice (an assumption: one 32-deep main loop of 8 stages,
#: the depth of CUTLASS's multistage Ampere/Hopper mainloops).
MIN_K_PER_SPLIT = 256


def quantization(m: int, n: int, k: int, sms: int | None, batch: int = 1) -> tuple[float, float]:
    """(q, extra bytes): the best tile/split-K efficiency of an m×n×k product (``batch`` copies) on
    ``sms`` SMs, and the split-K reduction's extra HBM bytes for that choice.

    q = (m·n / padded area) · (tiles / (waves · SMs)); with split-K factor c the tiles are
    c·⌈m/tm⌉·⌈n/tn⌉·batch and the partial sums cost 2·c·m·n·4 bytes (fp32, written and read back).
    Without an SM count, q = tile efficiency alone."""
    if min(m, n, k, batch) < 1:
        raise ModelcutError(f"matrix product sizes must be positive, got m={m}, n={n}, k={k}, batch={batch}")
    best_q, best_extra = 0.0, 0.0
    for tm, tn in TILES:
        gm, gn = -(-m // tm), -(-n // tn)
        tile_eff = (m * n) / (gm * tm * gn * tn)
        for c in SPLIT_K:
            if c > 1 and (not sms or k // c < MIN_K_PER_SPLIT or gm * gn * batch >= sms):
                continue
            tiles = gm * gn * batch * c
            wave_eff = tiles / (-(-tiles // sms) * sms) if sms else 1.0
            q = tile_eff * wave_eff
            if q > best_q + 1e-12:
                best_q, best_extra = q, (0.0 if c == 1 else 2.0 * c * m * n * 4 * batch)
    return best_q, best_extra


def _interp1(xs: np.ndarray, ys: np.ndarray, x: float) -> float:
    """Piecewise-linear in x, held at the ends."""
    return float(np.interp(x, xs, ys))


#: The tile of queries × keys a fused attention kernel works in, 128 × 128 (query block × key
#: block). FlexAttention's BlockMask default block size is 128 (``create_block_mask``'s
#: BLOCK_SIZE, torch/nn/attention/flex_attention.py), and FlashAttention-2's forward for head
#: dimension 64 runs 128 × 128 tiles (``run_mha_fwd_hdim64``, kBlockM = kBlockN = 128,
#: csrc/flash_attn/src/flash_fwd_launch_template.h); other head dimensions' key blocks may be
#: narrower, which this does not follow. The sliding-window rules (kernels.window_tile_share)
#: and the short-sequence reading (:func:`short_sequence_tflops`) count in it.
ATTENTION_TILE = 128


def _key_blocks(seq: float, causal: bool) -> tuple[float, float]:
    """(key blocks a block of queries runs, key blocks' worth of pairs it is credited with) on
    average over a sequence of ``seq``: s/T and s/T; under a causal mask (s/T + 1)/2, the
    diagonal block run whole, and s/(2T), the pairs the benchmarks count (s²/2)."""
    n = seq / ATTENTION_TILE
    return ((n + 1) / 2, n / 2) if causal else (n, n)


def short_sequence_tflops(seq: float, causal: bool, s0: float, r0: float, s1: float, r1: float) -> float:
    """An attention kernel's rate at a sequence ``seq`` shorter than the two shortest measured,
    ``s0`` < ``s1`` at ``r0``, ``r1`` TFLOP/s (module doc): a block of queries takes a + b·n for
    its n key blocks, the two measurements giving a and b, and is credited with its pairs, so the
    rate is credited / (a + b·n). Held at ``r0`` where the two do not give a positive a and b
    (a rate that does not fall with the sequence: nothing to follow)."""
    (n0, c0), (n1, c1), (n, c) = (_key_blocks(v, causal) for v in (s0, s1, seq))
    t0, t1 = c0 / r0, c1 / r1
    b = (t1 - t0) / (n1 - n0)
    a = t0 - b * n0
    if not (a > 0 and b > 0):
        return r0
    return c / (a + b * n)


@dataclass(frozen=True, eq=False)
class GemmGrid:
    """Measured product throughput on a grid of (m, n, k), b = 1 (module doc).

    ``axes``: the log2 of the measured sizes of m, n and k; ``log_deq``: log of the dequantized
    TFLOP/s at each grid point, shape (len(m), len(n), len(k))."""

    name: str
    sms: int
    axes: tuple[np.ndarray, np.ndarray, np.ndarray] = field(repr=False)
    log_deq: np.ndarray = field(repr=False)
    source: str = ""

    @classmethod
    def from_points(cls, name: str, sms: int, points: Sequence[tuple[int, int, int, float]],
                    source: str = "") -> "GemmGrid":
        """From (m, n, k, TFLOP/s) measurements of a full grid."""
        ms, ns, ks = (sorted({p[i] for p in points}) for i in range(3))
        table = np.full((len(ms), len(ns), len(ks)), np.nan)
        for m, n, k, tf in points:
            if not tf > 0:
                raise ModelcutError(f"{name}: throughput must be positive at {m}×{n}×{k}, got {tf}")
            table[ms.index(m), ns.index(n), ks.index(k)] = math.log(tf / quantization(m, n, k, sms)[0])
        if np.isnan(table).any():
            raise ModelcutError(f"{name}: the measured shapes are not a full (m, n, k) grid")
        axes = tuple(np.log2(np.array(a, dtype=float)) for a in (ms, ns, ks))
        return cls(name, sms, axes, table, source)

    def _deq(self, m: float, n: float, k: float) -> float:
        x = [min(max(math.log2(v), a[0]), a[-1]) for v, a in zip((m, n, k), self.axes)]
        vals = self.log_deq
        for dim, (xi, a) in enumerate(zip(x, self.axes)):   # trilinear, one axis at a time
            j = int(np.clip(np.searchsorted(a, xi) - 1, 0, len(a) - 2))
            t = (xi - a[j]) / (a[j + 1] - a[j])
            vals = np.take(vals, j, axis=0) * (1 - t) + np.take(vals, j + 1, axis=0) * t
        return math.exp(float(vals))

    def tflops(self, m: int, n: int, k: int, batch: int = 1, sms: int | None = None) -> float:
        """TFLOP/s of ``batch`` m×n×k products (the batch folds into m), quantized for ``sms`` SMs
        (the measuring device's by default)."""
        return _scaled(self._deq, self.axes, m, n, k, batch, sms or self.sms)


@dataclass(frozen=True, eq=False)
class GemmCurve:
    """Measured throughput of square products by size (module doc); a product is taken at the
    square size of the same work. ``log_size``/``log_deq``: log2 of the sizes, log of the
    dequantized TFLOP/s, its running maximum (a larger product is never less efficient once
    quantization is taken out)."""

    name: str
    sms: int
    log_size: np.ndarray = field(repr=False)
    log_deq: np.ndarray = field(repr=False)
    source: str = ""
    ceiling: float | None = None    # TFLOP/s no product exceeds (another measurement's maximum)

    @classmethod
    def from_points(cls, name: str, sms: int, points: Sequence[tuple[int, float]], source: str = "",
                    ceiling: float | None = None) -> "GemmCurve":
        pts = sorted(points)
        deq = np.maximum.accumulate([tf / quantization(s, s, s, sms)[0] for s, tf in pts])
        return cls(name, sms, np.log2([float(s) for s, _ in pts]), np.log(deq), source, ceiling)

    def tflops(self, m: int, n: int, k: int, batch: int = 1, sms: int | None = None,
               ceiling: float | None = None) -> float:
        """As :meth:`GemmGrid.tflops`, held at ``ceiling`` if given, else at the table's own."""
        def deq(m_: float, n_: float, k_: float) -> float:
            return math.exp(_interp1(self.log_size, self.log_deq, math.log2(m_ * n_ * k_) / 3))
        axes = (self.log_size,) * 3
        tf = _scaled(deq, axes, m, n, k, batch, sms or self.sms)
        cap = ceiling or self.ceiling
        return min(tf, cap) if cap else tf


@dataclass(frozen=True, eq=False)
class GemmRatio:
    """A data type measured only at its maximum on this architecture: the architecture's
    measured table of another type (``base``) times the two types' throughput ratio by shape
    where both are measured on one device (``num``/``den``, another architecture's tables),
    the ratio held in [1, ``max_ratio``] (the dense peaks' ratio), and no product above
    ``ceiling`` (the type's measured maximum here). H100 FP8: XLA's sm_90 FP8 entries exceed
    the FP8 dense peak on some shapes and are not used; its bf16 table times B200's FP8/bf16
    ratio (1.0 at 256³, 1.45 at 2048³, 1.95 at 4096³), held at Bekman's 1402.6 TFLOP/s."""

    name: str
    base: object
    num: object
    den: object
    max_ratio: float
    ceiling: float
    source: str = ""

    def tflops(self, m: int, n: int, k: int, batch: int = 1, sms: int | None = None,
               ceiling: float | None = None) -> float:
        """TFLOP/s (module doc), held at ``ceiling`` if given (another device's own measured
        maximum, in this table's units), else at the table's."""
        ratio = self.num.tflops(m, n, k, batch) / self.den.tflops(m, n, k, batch)
        ratio = min(max(ratio, 1.0), self.max_ratio)
        return min(self.base.tflops(m, n, k, batch, sms) * ratio, ceiling or self.ceiling)


def _scaled(deq, axes, m: int, n: int, k: int, batch: int, sms: int) -> float:
    """Dequantized throughput at the shape (clamped to the measured range) times the shape's own
    quantization; below the smallest measured size the time of the smallest is held."""
    mb = m * batch
    lo = [2.0 ** a[0] for a in axes]
    shrink = 1.0
    dims = []
    for v, floor in zip((mb, n, k), lo):
        if v < floor:
            shrink *= v / floor
            v = floor
        dims.append(v)
    q = quantization(int(math.ceil(dims[0])), int(math.ceil(dims[1])), int(math.ceil(dims[2])), sms)[0]
    return deq(*dims) * q * shrink


# ---------------------------------------------------------------- attention

@dataclass(frozen=True, eq=False)
class AttentionCurves:
    """Measured attention-kernel throughput of one implementation on one architecture (module
    doc): ``curves[(direction, causal, head_dim)]`` = (log2 sequence lengths, TFLOP/s)."""

    impl: str
    arch: str
    curves: dict = field(repr=False)
    source: str = ""

    def tflops(self, direction: str, causal: bool, head_dim: int, seq: float) -> float:
        dims = sorted({d for (dr, c, d) in self.curves if dr == direction and c == causal})
        if not dims:
            raise ModelcutError(f"no {direction} {'causal' if causal else 'non-causal'} measurement for {self.impl}")
        x = math.log2(max(seq, 1.0))

        def at(d: int) -> float:
            xs, ys = self.curves[(direction, causal, d)]
            if x < xs[0] and len(xs) > 1:
                return short_sequence_tflops(2.0 ** x, causal, 2.0 ** xs[0], ys[0], 2.0 ** xs[1], ys[1])
            return _interp1(xs, ys, x)
        if head_dim <= dims[0] or len(dims) == 1:
            return at(dims[0])
        if head_dim >= dims[-1]:
            return at(dims[-1])
        j = max(i for i, d in enumerate(dims) if d <= head_dim)
        a, b = dims[j], dims[j + 1]
        t = (math.log2(head_dim) - math.log2(a)) / (math.log2(b) - math.log2(a))
        return at(a) * (1 - t) + at(b) * t


# ---------------------------------------------------------------- collectives

@dataclass(frozen=True, eq=False)
class CollectiveCurves:
    """nccl-tests out-of-place times inside one node (module doc): ``curves[(collective, ranks)]``
    = (log2 bytes, log2 µs). Collectives: all-reduce, all-gather, reduce-scatter, all-to-all;
    sizes in nccl-tests' convention (the whole buffer)."""

    arch: str
    curves: dict = field(repr=False)
    source: str = ""

    def ranks(self, collective: str) -> list[int]:
        return sorted(n for (c, n) in self.curves if c == collective)

    def time(self, collective: str, ranks: int, nbytes: float, slower: float = 1.0) -> float | None:
        """Seconds, or None where no curve covers ``ranks`` (the caller's model then applies).
        ``slower``: the measuring node's link bandwidth over this node's; the time above the
        curve's latency floor (its smallest size) stretches by it, the floor does not."""
        key = (collective, ranks)
        if key not in self.curves or nbytes <= 0:
            return None
        xs, ys = self.curves[key]
        x = math.log2(nbytes)
        if x <= xs[-1]:
            t = 2.0 ** _interp1(xs, ys, x) * 1e-6
        else:   # beyond the largest size: that size's time plus the rest at its bandwidth
            t = 2.0 ** float(ys[-1]) * 1e-6 * nbytes / 2.0 ** float(xs[-1])
        if slower == 1.0:
            return t
        floor = 2.0 ** float(ys[0]) * 1e-6
        return floor + max(t - floor, 0.0) * slower


@dataclass(frozen=True)
class Reference:
    """The device the tables of an architecture were measured on: its dense peaks (FLOP/s, by data
    type), SMs and link bandwidth each way. Another device of the architecture scales the
    measurements by its own figures over these (:mod:`.kernels`)."""

    name: str
    peak_flops: dict = field(default_factory=dict)   # {"bf16": FLOP/s, "fp8": FLOP/s}
    sms: int | None = None
    link_bw: float = 0.0


@dataclass(frozen=True, eq=False)
class KernelTables:
    """Every measured table of one architecture: products by data type, attention by
    implementation, collectives inside a node, and the device they were measured on."""

    arch: str
    gemm: dict = field(default_factory=dict, repr=False)
    attention: dict = field(default_factory=dict, repr=False)
    collectives: CollectiveCurves | None = field(default=None, repr=False)
    reference: Reference | None = None
