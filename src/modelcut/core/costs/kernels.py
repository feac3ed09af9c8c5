"""Per-kernel time on one accelerator: matrix products, memory-bound kernels, attention.

Kernels are timed from measurements (:mod:`.tables`, read from the catalog's kernel tables) and
two fitted constants shared by every accelerator (:class:`Efficiency`, fitted by
:mod:`modelcut.analysis.calibrate`):

* ``gemm``: the fraction of the *measured* kernel throughput (matrix products and attention) a
  training step sustains: the tables are single kernels on an idle device; a step runs them
  back to back, beside communication kernels, under power and thermal limits;
* ``mem``: the fraction of the HBM bandwidth (the datasheet figure) memory-bound kernels (norms,
  activations, dropout, residual adds, softmax, the optimizer) reach;
* ``net``: the fraction of the measured collective bandwidth a step sustains; held at 1 (not
  fitted): the collective tables and NCCL's measured share of line rate already say it.

**Matrix product** C[m×n] = A[m×k]·B[k×n] (``batch`` independent copies)::

    FLOPs = 2·m·n·k·batch
    bytes = 2·(m·k + k·n + m·n)·batch                    (each operand through HBM once)
    time  = max(FLOPs / (η_gemm · measured TFLOP/s at this shape), bytes / (η_mem · HBM bandwidth))

The measured throughput at a shape is the table's (:mod:`.tables`: measured shapes interpolated,
tile and wave quantization beyond them). An accelerator without a table runs a well-quantized
product at :data:`UNMEASURED_FRACTION` of its dense peak, times the shape's quantization.

**Attention.** *Unfused* (Megatron-LM 2021-2022, ``megatron/model/transformer.py``
``CoreAttention``): QKᵀ and A·V as batched products over b·heads, the full s×s scores (no causal
saving), Megatron's fused scale-mask-softmax (one read and one write of the scores; its causal
kernel reads each query's row only up to the query, the stack's ``causal_softmax_max_seq``:
:func:`causal_softmax_rows`) and a separate dropout (read, write, 1-byte mask). *Fused* (FlashAttention-2/3/4, cuDNN): no s×s
tensor in HBM; forward FLOPs 4·b·heads·s_q·s_k·d (× ½ causal), backward 2.5 × forward, at the
kernel's measured TFLOP/s for its direction, mask, head dimension and sequence length
(:class:`.tables.AttentionCurves`), with the wave quantization of b·heads·⌈s_q/128⌉ thread blocks
relative to the benchmark's.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, replace
from functools import lru_cache

from ..errors import ModelcutError
from ..specs import ATTENTION_KINDS, Hardware, Training
from ..units import BF16_BYTES
from .tables import ATTENTION_TILE, quantization

#: 16-bit operands and activations; FP8 operands.
BYTES = BF16_BYTES
FP8_BYTES = 1.0

#: An accelerator without a measured product table runs a well-quantized product at this fraction
#: of its dense peak: the median of the maximum achievable matmul over dense peak of the five
#: NVIDIA data-centre GPUs Bekman measured (A100 SXM 86.9 %, H100 SXM 80.3 %, B200 77.6 %, B300
#: 78.6 %, GB200 72.9 %; stas00/ml-engineering compute/accelerator/README.md at commit 744d01e1).
UNMEASURED_FRACTION = 0.786

#: The kernels that skip the key blocks a sliding window masks out entirely. FlashAttention-2
#: (from v2.3) and -3 bound each query block's loop over key blocks by the window
#: (Dao-AILab/flash-attention csrc/flash_attn/src/flash_fwd_kernel.h, ``n_block_min`` when
#: ``Is_local``; hopper/ the same), FlashAttention-4 too (flash_attn/cute/block_info.py at
#: 07af8aa, ``get_n_block_min_max``: ``n_block_min`` from ``window_size_left`` when
#: ``is_local``), and PyTorch's FlexAttention runs only the blocks its BlockMask keeps
#: (torch.nn.attention.flex_attention ``create_block_mask``), which the catalog times as flash2.
#: cuDNN's fused attention skips them as well, by measurement: NVIDIA's cudnn-frontend sweep of
#: release 9.19.1 on an H200 with a 1,024-key window (catalog/kernel_checks.toml,
#: ``cudnn-fe-2026-02-window``) takes 0.358, 0.738, 1.499 and 3.021 ms forward at 4K, 8K, 16K and
#: 32K tokens, linear in the sequence, where the whole causal attention grows as its square. So
#: every fused kernel skips; only the unfused path (scores materialised, then masked) does not.
WINDOW_SKIPPING = ("flash2", "flash3", "flash4", "cudnn")

#: An attention core's backward FLOPs over its forward's. A fused kernel recomputes S = QKᵀ in
#: its backward, five products for the forward's two: 2.5, as the FlashAttention and cuDNN
#: benchmarks the tables come from count it (catalog/kernels.toml, [[attention]]: "backward 2.5 x
#: forward"). The unfused path keeps the scores and runs four (dP, dV, dQ, dK): 2 (:func:`_unfused`).
FUSED_ATTENTION_BWD_RATIO = 2.5
UNFUSED_ATTENTION_BWD_RATIO = 2.0


def attention_bwd_ratio(kind: str) -> float:
    """Backward FLOPs over forward FLOPs of the attention kernel ``kind``."""
    return UNFUSED_ATTENTION_BWD_RATIO if kind == "unfused" else FUSED_ATTENTION_BWD_RATIO


#: The attention benchmarks' shape (FlashAttention-2 and -3 papers §4.1): 16k tokens a batch,
#: hidden 2048, so b·heads = (16384/s)·(2048/d) sequences of s.
_BENCH_TOKENS, _BENCH_HIDDEN = 16384, 2048


def generation(hw: Hardware) -> str:
    """The architecture a kernel table is keyed by ("ampere", "hopper", "blackwell", ...)."""
    return hw.arch or hw.name.lower()


@dataclass(frozen=True)
class Efficiency:
    """The default model's constants (fractions in (0, 1]); see the module doc."""

    gemm: float
    mem: float
    net: float

    def __post_init__(self) -> None:
        for name in ("gemm", "mem", "net"):
            val = getattr(self, name)
            if isinstance(val, bool) or not isinstance(val, (int, float)) or not 0 < val <= 1:
                raise ModelcutError(f"efficiency {name} must be in (0, 1], got {val!r}")

    def as_tuple(self) -> tuple[float, float, float]:
        return (self.gemm, self.mem, self.net)


NAMES = ("gemm", "mem", "net")


# ---------------------------------------------------------------- kernels

@lru_cache(maxsize=65536)
def _measured_tflops(table, m: int, n: int, k: int, batch: int, sms: int | None,
                     ceiling: float | None = None) -> float:
    """A table's TFLOP/s; ``ceiling`` (the table's units) replaces the table's own maximum where it
    keeps one (the ratio and square-curve kinds), else caps the measured grid."""
    if ceiling is None:
        return table.tflops(m, n, k, batch, sms)
    if getattr(table, "ceiling", None):
        return table.tflops(m, n, k, batch, sms, ceiling=ceiling)
    return min(table.tflops(m, n, k, batch, sms), ceiling)


def at_peak(value: float, peak: float, measured_peak: float) -> float:
    """A throughput measured on a device of dense peak ``measured_peak``, taken to another device
    of the same die at dense peak ``peak``: value · peak / measured_peak (the peak-ratio rule:
    fewer SMs or lower clocks scale every kernel alike)."""
    return value * peak / measured_peak


def peak_scale(hw: Hardware, dtype: str = "bf16") -> float:
    """This device's dense peak over that of the device its architecture's tables were measured
    on (1 for that device; an H100 PCIe's 756 over the H100 SXM's 989: fewer SMs, lower clocks),
    :func:`at_peak`."""
    ref = hw.kernels.reference if hw.kernels is not None else None
    if ref is None or dtype not in ref.peak_flops:
        return 1.0
    peak = hw.peak_flops_16 if dtype != "fp8" else (hw.peak_flops_8 or hw.peak_flops_16)
    return at_peak(1.0, peak, ref.peak_flops[dtype])


def burst_tflops(m: int, n: int, k: int, hw: Hardware, batch: int = 1, dtype: str = "bf16") -> float:
    """The TFLOP/s an m×n×k product (``batch`` copies) reaches on ``hw`` in a short burst, as the
    tables measure it: the measured table of its architecture and data type (quantized for this
    device's SMs, scaled by its peak over the measuring device's, :func:`peak_scale`), at most the
    dense peak, else :data:`UNMEASURED_FRACTION` of the dense peak times the shape's quantization.
    Where the device has its own measured FP8 maximum (``hw.fp8_ceiling``), FP8 products are held
    at it instead of at the measuring device's maximum scaled by peak."""
    table = hw.kernels.gemm.get(dtype) if hw.kernels is not None else None
    peak = (hw.peak_flops_16 if dtype != "fp8" else (hw.peak_flops_8 or hw.peak_flops_16)) / 1e12
    if table is not None:
        scale = peak_scale(hw, dtype)
        # a device's own measured FP8 maximum replaces the measuring device's, scaled
        own = hw.fp8_ceiling / 1e12 / scale if dtype == "fp8" and hw.fp8_ceiling else None
        tf = _measured_tflops(table, m, n, k, batch, hw.sms, own) * scale
        return min(tf, peak)   # no product outruns the dense peak
    return UNMEASURED_FRACTION * quantization(m, n, k, hw.sms, batch)[0] * peak


def product_tflops(m: int, n: int, k: int, hw: Hardware, batch: int = 1, dtype: str = "bf16") -> float:
    """The TFLOP/s an m×n×k product (``batch`` copies) sustains on ``hw`` alone: its burst rate
    (:func:`burst_tflops`) times ``hw.sustained_frac``, the measured share of a short burst's
    matmul throughput the device holds once it runs at its power limit (the tables are bursts:
    Bekman's MAMF at the boost clock, XLA's a few timed runs a shape)."""
    return burst_tflops(m, n, k, hw, batch, dtype) * hw.sustained_frac


def power_capped_share(share: float, measured_w: float, cap_w: float) -> float:
    """The sustained matmul share of a device held to ``cap_w`` watts, from the share ``share``
    measured on the same die drawing ``measured_w`` watts:

        share · min(1, (cap_w / measured_w))^(1/3)

    A saturated matrix product is power-bound (the device's draw sits at its limit while its clock
    settles below the boost clock), and CMOS dynamic power is P = α·C·V²·f (Weste and Harris, *CMOS
    VLSI Design*, power chapter) with the supply voltage
    scaled in proportion to the clock over the DVFS range, so P ∝ f³ and the settled clock goes as
    the cube root of the power the device may draw. Static and memory power are left out, so this is
    the smallest slowdown a cap can cost: with a static share, or a voltage already at its floor
    (P ∝ f), the clock falls further. A cap at or above the measured draw changes nothing."""
    if not (0 < share <= 1) or measured_w <= 0 or cap_w <= 0:
        raise ModelcutError(f"power_capped_share needs a share in (0, 1] and positive watts, got {share}, {measured_w}, {cap_w}")
    return share * min(1.0, cap_w / measured_w) ** (1.0 / 3.0)


def at_power(hw: Hardware, cap_w: float) -> Hardware:
    """``hw`` at a power limit of ``cap_w`` watts: its sustained matmul share by
    :func:`power_capped_share` from the draw it was measured at (``hw.sustained_power_w``), which
    the cap then bounds; its name and other figures its own (a capped catalog row keeps its own)."""
    return replace(hw, power_w=float(cap_w),
                   sustained_frac=power_capped_share(hw.sustained_frac, hw.sustained_power_w, cap_w),
                   sustained_power_w=min(float(cap_w), hw.sustained_power_w))


def held_to(hw: Hardware, cap_w: float) -> Hardware:
    """``hw`` held to a power limit of ``cap_w`` watts (``nvidia-smi -pl``) and named so
    (``<name>@<watts>w``): :func:`at_power`. A cap needs the draw behind the sustained share and lies
    within the limits the device takes (``hw.power_min_w`` to ``hw.power_w``: ``hw.cappable``)."""
    if isinstance(cap_w, bool) or not isinstance(cap_w, (int, float)) or not math.isfinite(cap_w) or cap_w <= 0:
        raise ModelcutError(f"a power cap must be a positive number of watts, got {cap_w!r}")
    if hw.sustained_power_w is None or hw.power_w is None:
        raise ModelcutError(f"{hw.name}: no power draw is known for its sustained matmul share, so a power "
                            "cap cannot be applied to it")
    if hw.power_min_w is None:
        raise ModelcutError(f"{hw.name}: the lowest power limit it takes is not in the catalog, so a power cap "
                            "cannot be checked against its limits")
    if cap_w > hw.power_w:
        raise ModelcutError(f"{hw.name}: a power cap of {cap_w:g} W is above its {hw.power_w:g} W limit")
    if cap_w < hw.power_min_w:
        raise ModelcutError(f"{hw.name}: a power cap of {cap_w:g} W is below its {hw.power_min_w:g} W minimum")
    return replace(at_power(hw, cap_w), name=f"{hw.name}@{cap_w:g}w", aliases=(),
                   source=f"{hw.source}; held to {cap_w:g} W (its sustained matmul share by kernels.power_capped_share)")


def gemm_time(m: int, n: int, k: int, hw: Hardware, eff: Efficiency, batch: int = 1, dtype: str = "bf16") -> float:
    """Seconds for C[m×n] = A[m×k]·B[k×n], ``batch`` copies (module doc); ``dtype`` "fp8":
    FP8 operands (1 byte each) and a 16-bit output, at the FP8 table's rate."""
    m, n, k = int(math.ceil(m)), int(math.ceil(n)), int(math.ceil(k))
    if min(m, n, k, batch) < 1:
        raise ModelcutError(f"matrix product sizes must be positive, got m={m}, n={n}, k={k}, batch={batch}")
    flops = 2.0 * m * n * k * batch
    operand = FP8_BYTES if dtype == "fp8" else BYTES
    nbytes = (operand * (m * k + k * n) + BYTES * m * n) * batch
    return max(flops / (eff.gemm * product_tflops(m, n, k, hw, batch, dtype) * 1e12), nbytes / (eff.mem * hbm_bandwidth(hw)))


def gemm_fwd_bwd(m: int, n: int, k: int, hw: Hardware, eff: Efficiency, dtype: str = "bf16"
                 ) -> tuple[float, float, float]:
    """A linear layer Y[m×n] = X[m×k]·W[k×n]: (forward, data gradient, weight gradient) seconds.
    dX[m×k] = dY[m×n]·Wᵀ is an m×k×n product; dW[k×n] = Xᵀ·dY a k×n×m one."""
    return (gemm_time(m, n, k, hw, eff, dtype=dtype), gemm_time(m, k, n, hw, eff, dtype=dtype),
            gemm_time(k, n, m, hw, eff, dtype=dtype))


def mfu_peak(hw: Hardware, training: Training) -> float:
    """The dense peak MFU is counted against: the 16-bit tensor-core peak, or the FP8 peak for a
    run whose products run in FP8 (its attention and output layer stay 16-bit and are timed at
    no more than the 16-bit peak, so MFU stays below 1 either way)."""
    if training.precision == "fp8" and hw.peak_flops_8:
        return hw.peak_flops_8
    return hw.peak_flops_16


def hbm_bandwidth(hw: Hardware) -> float:
    """Bytes/s a streaming kernel measures on the accelerator: the datasheet's HBM bandwidth times
    the share STREAM-style copy and triad kernels reach on it (``hw.mem_bw_frac``, measured,
    with its source in the hardware catalog)."""
    return hw.mem_bw * hw.mem_bw_frac


def mem_time(nbytes: float, hw: Hardware, eff: Efficiency) -> float:
    """Seconds to stream ``nbytes`` through HBM: nbytes / (η_mem · measured HBM bandwidth); η_mem
    is what a training step's elementwise kernels sustain of a streaming benchmark's rate."""
    if nbytes < 0:
        raise ModelcutError(f"bytes moved must be non-negative, got {nbytes}")
    return nbytes / (eff.mem * hbm_bandwidth(hw))


@dataclass(frozen=True)
class AttentionTime:
    """One attention core (QKᵀ, softmax, dropout, A·V) for a micro-batch on one device:
    forward and backward seconds, split into tensor-core and memory-bound parts, and the FLOPs
    the fused kernels are credited with (the unfused path: its products' FLOPs)."""

    fwd: float
    bwd: float
    fwd_math: float
    bwd_math: float
    flops_fwd: float = 0.0

    @property
    def fwd_mem(self) -> float:
        return self.fwd - self.fwd_math

    @property
    def bwd_mem(self) -> float:
        return self.bwd - self.bwd_math


def _waves(blocks: float, sms: int | None) -> float:
    if not sms:
        return 1.0
    blocks = max(1, int(math.ceil(blocks)))
    return blocks / (-(-blocks // sms) * sms)


def causal_softmax_rows(s_q: int, s_k: int, bh: int, max_seq: int) -> float:
    """The share of each score row Megatron-LM's causal softmax reads: (s + 1)/(2·s), the keys at or
    before each query (the lower triangle with its diagonal), where its fused upper-triangular
    kernel runs; 1 (the whole row) where it does not. The kernel loads a row's elements only up to
    its query (``local_seq = blockIdx.x + 1``, ``batch_element_count = local_seq``) and writes the
    whole row, zeros past the query (``copy_zero_vector``); its backward loads the output gradient
    and the softmax output the same way and writes the whole row (Megatron-LM 0fa7175f09,
    2021-03-19, and 7fccd6a17a, 2022-06-01: ``megatron/fused_kernels/scaled_upper_triang_masked_softmax.h``).
    It runs for self-attention (s_q = s_k) with 16 < s_k ≤ ``max_seq`` (the kernel's
    ``TORCH_INTERNAL_ASSERT(softmax_elements <= 2048)`` at both commits), s_q and b·heads multiples
    of 4 (``megatron/model/fused_softmax.py`` ``FusedScaleMaskSoftmax``); ``max_seq`` 0: the stack
    has no such kernel."""
    if s_q == s_k and 16 < s_k <= max_seq and s_q % 4 == 0 and bh % 4 == 0:
        return (s_k + 1) / (2 * s_k)
    return 1.0


def _unfused(b: int, bh: int, s_q: int, s_k: int, d: int, dropout: bool, hw: Hardware, eff: Efficiency,
             rows: float = 1.0) -> AttentionTime:
    """Forward: S = QKᵀ (s_q×s_k×d), fused scale-mask-softmax, dropout, O = P·V (s_q×d×s_k);
    backward: dP = dO·Vᵀ, dV = Pᵀ·dO, dropout backward, softmax backward, dQ = dS·K, dK = dSᵀ·Q.
    ``rows``: the share of each score row the softmax reads (:func:`causal_softmax_rows`); it
    writes them whole."""
    qk = gemm_time(s_q, s_k, d, hw, eff, bh)
    av = gemm_time(s_q, d, s_k, hw, eff, bh)
    elems = bh * s_q * s_k
    soft_f = mem_time(elems * (rows + 1) * BYTES, hw, eff)                  # read S, write P
    drop_f = mem_time(elems * (2 * BYTES + 1), hw, eff) if dropout else 0.0  # read, write, mask
    d_p = gemm_time(s_q, s_k, d, hw, eff, bh)
    d_v = gemm_time(s_k, d, s_q, hw, eff, bh)
    d_q = gemm_time(s_q, d, s_k, hw, eff, bh)
    d_k = gemm_time(s_k, d, s_q, hw, eff, bh)
    drop_b = mem_time(elems * (2 * BYTES + 1), hw, eff) if dropout else 0.0
    soft_b = mem_time(elems * (2 * rows + 1) * BYTES, hw, eff)              # read P, dP; write dS
    fwd_math, bwd_math = qk + av, d_p + d_v + d_q + d_k
    return AttentionTime(fwd_math + soft_f + drop_f, bwd_math + drop_b + soft_b, fwd_math, bwd_math,
                         4.0 * bh * s_q * s_k * d)


def fused_tflops(kind: str, hw: Hardware, causal: bool, d: int, s_q: int,
                 sustained: bool = True) -> tuple[float, float] | None:
    """(forward, backward) TFLOP/s the fused kernel ``kind`` reaches at this mask, head dimension
    and (local) sequence length on ``hw``, from its measurements (scaled by the device's peak over
    the measuring one's, :func:`peak_scale`, and in a training step by its sustained share, as the
    products are; ``sustained=False``: the burst rate the measurements are); None where none are known."""
    curves = hw.kernels.attention.get(kind) if hw.kernels is not None else None
    if curves is None:
        return None
    scale = peak_scale(hw) * (hw.sustained_frac if sustained else 1.0)
    return curves.tflops("fwd", causal, d, s_q) * scale, curves.tflops("bwd", causal, d, s_q) * scale


def _window_blocks(window: int, tile: int = ATTENTION_TILE) -> int:
    """Key blocks a query block past the window's reach touches (:func:`window_tile_share`)."""
    q, r = divmod(window - 1, tile)
    return q + (2 if r else 1)


def window_rate_length(window: int, tile: int = ATTENTION_TILE) -> int:
    """The causal sequence whose query blocks run, on average, as many key blocks as a windowed
    query block does (:func:`_window_blocks`, n of them): (s/tile + 1)/2 = n at s = tile·(2n − 1).
    A skipping kernel's windowed attention is read at its measured causal rate at that length."""
    return tile * (2 * _window_blocks(window, tile) - 1)


def window_tile_share(s: int, window: int | None, tile: int = ATTENTION_TILE) -> float:
    """The share of a causal attention's tiles (``tile`` × ``tile`` blocks of queries × keys, the
    diagonal ones included) that a sliding window of ``window`` keys (each query's own among them)
    still touches, for a sequence of ``s``: query block i needs the key blocks from the one holding
    key i·tile − window + 1 to its own. With window − 1 = tile·q + r, that is q + 2 blocks (q + 1
    when r = 0) once i·tile ≥ window − 1, and i + 1 before. 1 without a window or when the window
    covers the sequence."""
    if window is None or window >= s:
        return 1.0
    n = -(-s // tile)
    per = _window_blocks(window, tile)
    i0 = min(n, -(-(window - 1) // tile))
    kept = i0 * (i0 + 1) / 2 + (n - i0) * per
    return min(1.0, kept / (n * (n + 1) / 2))


def window_work(kind: str, causal: bool, s_q: int, s_k: int, window: int | None) -> tuple[float, int]:
    """(the share of a causal attention's tiles the kernel runs, the sequence length its measured
    rate is read at) for ``s_q`` queries against ``s_k`` keys: with a causal sliding ``window`` a
    skipping kernel (:data:`WINDOW_SKIPPING`) runs :func:`window_tile_share` of the tiles at its
    rate at :func:`window_rate_length`; otherwise (1, s_q). Fewer queries than keys are a
    context-parallel rank's load-balanced share of the sequence against all of its keys (Transformer
    Engine's all-gather form, which hands the kernel each chunk's window of the gathered keys): the
    causal count credits them s_q·s_k/2 pairs, s_k/(2·tile) key blocks a block of queries, where
    within the window each runs the window's blocks (:func:`_window_blocks`; the sequence's first
    window, where queries see fewer, is left out)."""
    if not (causal and kind in WINDOW_SKIPPING and window is not None and window < s_k and s_q <= s_k):
        return 1.0, s_q
    if s_q == s_k:
        share = window_tile_share(s_k, window)
    else:
        share = min(1.0, _window_blocks(window) * 2 * ATTENTION_TILE / s_k)
    return share, (s_q if share == 1.0 else min(s_q, window_rate_length(window)))


def attention_time(kind: str, b: int, heads: int, s_q: int, s_k: int, d: int, causal: bool,
                   dropout: bool, hw: Hardware, eff: Efficiency, window: int | None = None,
                   softmax_max_seq: int = 0) -> AttentionTime:
    """Attention core of ``heads`` local heads of width ``d``, ``s_q`` queries against ``s_k``
    keys, ``b`` sequences (module doc for each ``kind``). With a causal sliding ``window`` a
    kernel that skips the masked blocks (:data:`WINDOW_SKIPPING`) does :func:`window_tile_share`
    of the causal work; the others the whole causal attention. ``softmax_max_seq``: the longest
    keys the stack's fused causal softmax takes, for the unfused path (:func:`causal_softmax_rows`;
    0, none)."""
    if kind not in ATTENTION_KINDS:
        raise ModelcutError(f"attention kind must be one of {', '.join(ATTENTION_KINDS)}, got {kind!r}")
    if min(b, heads, s_q, s_k, d) < 1:
        raise ModelcutError("attention sizes must be positive")
    bh = b * heads
    if kind == "unfused":
        rows = causal_softmax_rows(s_q, s_k, bh, softmax_max_seq) if causal else 1.0
        return _unfused(b, bh, s_q, s_k, d, dropout, hw, eff, rows)
    share, s_rate = window_work(kind, causal, s_q, s_k, window)
    rates = fused_tflops(kind, hw, causal, d, s_rate)
    if rates is None:
        if kind == "flash3" and generation(hw) == "ampere":
            raise ModelcutError("FlashAttention-3 runs on Hopper GPUs only; use flash2 on the A100")
        # no measurement of this kernel here: the products' rate at a long sequence's shape
        rate = product_tflops(s_q, s_k, d, hw, bh)
        rates = (rate, rate)
    peak = hw.peak_flops_16 / 1e12
    rates = (min(rates[0], peak), min(rates[1], peak))
    flops = 4.0 * bh * s_q * s_k * d * (0.5 if causal else 1.0) * share
    bench = (_BENCH_TOKENS / max(s_q, 1)) * (_BENCH_HIDDEN / d) * -(-s_q // 128)
    wave = min(1.0, _waves(bh * -(-s_q // 128), hw.sms) / _waves(max(bench, 1.0), hw.sms))
    fwd = flops / (eff.gemm * rates[0] * 1e12 * wave)
    bwd = FUSED_ATTENTION_BWD_RATIO * flops / (eff.gemm * rates[1] * 1e12 * wave)
    # Q, K, V and O (and their gradients) stream through HBM once each way: a floor.
    io = BYTES * bh * (2 * s_q + 2 * s_k) * d
    fwd = max(fwd, mem_time(io, hw, eff))
    bwd = max(bwd, mem_time(2 * io, hw, eff))
    return AttentionTime(fwd, bwd, fwd, bwd, flops)
