"""Per-kernel time on one accelerator: matrix products, memory-bound kernels, attention.

Three achievable fractions, the only fitted constants of the default model
(:class:`Efficiency`, fitted by :mod:`.calibrate`), turn hardware peaks into times:

* ``gemm``: fraction of the dense 16-bit tensor peak a large, well-quantized matrix product
  reaches;
* ``mem``: fraction of the HBM bandwidth a streaming (memory-bound) kernel reaches;
* ``net``: fraction of a link's bandwidth a collective reaches (bus bandwidth over line rate).

**Matrix product** C[m×n] = A[m×k]·B[k×n] (``batch`` independent copies), 16-bit operands
(NVIDIA, "Matrix Multiplication Background User's Guide", Deep Learning Performance docs,
sections "Math And Memory Bounds", "Tile Quantization", "Wave Quantization")::

    FLOPs  = 2·m·n·k·batch
    bytes  = 2·(m·k + k·n + m·n)·batch                     (each operand through HBM once)
    q      = tile efficiency × wave efficiency               (best tile, see below)
    time   = max(FLOPs / (η_gemm · q · peak), bytes / (η_mem · HBM bandwidth))

The output is cut into tiles (128×256, 256×128 or 128×128, the tensor-core tiles of
cuBLAS/CUTLASS on Ampere and Hopper); tiles run in *waves* of one tile per streaming
multiprocessor (A100: 108 SMs, H100 SXM: 132, from the hardware catalog). Tile efficiency is
m·n over the padded tiles' area; wave efficiency is tiles / (waves · SMs). When a product has
fewer tiles than SMs and a long k, the library splits k over up to 4 SMs (split-K, the
reduction paid as an extra fp32 write and read of C). The library picks the best variant,
which this model does too.

**Memory-bound kernels** (norms, activations, dropout, residual adds, softmax, the optimizer):
time = bytes / (η_mem · HBM bandwidth).

**Attention.** *Unfused* (Megatron-LM 2021-2022, ``megatron/model/transformer.py``
``CoreAttention``): QKᵀ and A·V as batched products over b·heads, the full s×s scores (no
causal saving), Megatron's fused scale-mask-softmax (one read and one write of the scores)
and a separate dropout (read, write, 1-byte mask). *Flash* (Dao et al. 2022; Dao 2023): no
s×s tensor in HBM; causal masking skips half the work; forward FLOPs 4·b·heads·s_q·s_k·d
(× ½ causal), backward 2.5 × forward (five products against two, the scores recomputed), at
the kernel's documented fraction of peak (:data:`FLASH_FRACTION`), quantized over
b·heads·⌈s_q/128⌉ thread blocks.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

from ..errors import ModelcutError
from ..specs import Hardware
from ..units import BF16_BYTES

#: 16-bit operands and activations.
BYTES = BF16_BYTES

#: Output tiles cuBLAS/CUTLASS use for large 16-bit tensor-core products on Ampere and Hopper
#: (CUTLASS default threadblock shapes 128×256 and 256×128; 128×128 is the tile of NVIDIA's
#: Matrix Multiplication Background guide, "Tile Quantization").
TILES: tuple[tuple[int, int], ...] = ((128, 256), (256, 128), (128, 128))

#: Split-K factors the library may use when a product has fewer tiles than SMs.
SPLIT_K = (1, 2, 3, 4)
#: A split keeps at least this much k per slice (one 32-deep main loop of 8 stages).
MIN_K_PER_SPLIT = 256

#: Fraction of the dense 16-bit peak each fused-attention kernel reaches, (forward, backward),
#: per GPU generation, at head dimension 128, causal, long sequences (2k-16k), many thread blocks
#: (quantization over the SMs is applied on top). Sources: FlashAttention-2 (Dao 2023, arXiv
#: 2307.08691, §4.1): on A100 "up to 73 %" of peak forward and "up to 63 %" backward; the
#: causal head-dim-128 curves sit below those maxima, taken as 0.65 and 0.55.
#: FlashAttention-3 (Shah et al. 2024, arXiv 2407.08608, §4.1, Figs. 5-6, H100 SXM5, head dim
#: 128): FlashAttention-2 forward (causal) 333-335 TFLOP/s at 8k-16k, backward 318-322;
#: FlashAttention-3 forward (causal) 602-616, backward 559-561; cuDNN forward 529-539,
#: backward 516-518 (of 989). An accelerator without a figure here runs attention at η_gemm.
FLASH_FRACTION: dict[tuple[str, str], tuple[float, float]] = {
    ("flash2", "ampere"): (0.65, 0.55),
    ("flash2", "hopper"): (0.34, 0.32),
    ("flash3", "hopper"): (0.61, 0.56),
    ("cudnn", "hopper"): (0.54, 0.52),
}

ATTENTION_KINDS = ("unfused", "flash2", "flash3", "cudnn")


def generation(hw: Hardware) -> str:
    """The GPU generation a kernel table is keyed by: "ampere" (A100, 108 SMs), "hopper"
    (H100/H200, 132 SMs); otherwise the hardware's name."""
    name = hw.name.lower()
    if name.startswith("a100"):
        return "ampere"
    if name.startswith(("h100", "h200", "h800", "gh200")):
        return "hopper"
    return name


@dataclass(frozen=True)
class Efficiency:
    """The default model's three fitted constants (fractions in (0, 1]); see the module doc."""

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


# ---------------------------------------------------------------- quantization

def quantization(m: int, n: int, k: int, sms: int | None, batch: int = 1) -> tuple[float, float]:
    """(q, extra bytes): the best tile/split-K efficiency of an m×n×k product (``batch``
    copies) on ``sms`` SMs, and the split-K reduction's extra HBM bytes for that choice.

    q = (m·n / padded area) · (tiles / (waves · SMs)); with split-K factor c the tiles are
    c·⌈m/tm⌉·⌈n/tn⌉·batch and the partial sums cost 2·c·m·n·4 bytes (fp32, written and read
    back). Without an SM count, q = tile efficiency alone."""
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
            extra = 0.0 if c == 1 else 2.0 * c * m * n * 4 * batch
            if q > best_q + 1e-12:
                best_q, best_extra = q, extra
    return best_q, best_extra


# ---------------------------------------------------------------- kernels

def gemm_time(m: int, n: int, k: int, hw: Hardware, eff: Efficiency, batch: int = 1) -> float:
    """Seconds for C[m×n] = A[m×k]·B[k×n], ``batch`` copies: the roofline of the module doc,
    max(FLOPs / (η_gemm·q·peak), bytes / (η_mem·HBM bw))."""
    m, n, k = int(math.ceil(m)), int(math.ceil(n)), int(math.ceil(k))
    q, extra = quantization(m, n, k, hw.sms, batch)
    flops = 2.0 * m * n * k * batch
    nbytes = BYTES * (m * k + k * n + m * n) * batch + extra
    return max(flops / (eff.gemm * q * hw.peak_flops_16), nbytes / (eff.mem * hw.mem_bw))


def gemm_fwd_bwd(m: int, n: int, k: int, hw: Hardware, eff: Efficiency) -> tuple[float, float, float]:
    """A linear layer Y[m×n] = X[m×k]·W[k×n]: (forward, data gradient, weight gradient) seconds.
    dX[m×k] = dY[m×n]·Wᵀ is an m×k×n product; dW[k×n] = Xᵀ·dY a k×n×m one."""
    return gemm_time(m, n, k, hw, eff), gemm_time(m, k, n, hw, eff), gemm_time(k, n, m, hw, eff)


def mem_time(nbytes: float, hw: Hardware, eff: Efficiency) -> float:
    """Seconds to stream ``nbytes`` through HBM: nbytes / (η_mem · HBM bandwidth)."""
    if nbytes < 0:
        raise ModelcutError(f"bytes moved must be non-negative, got {nbytes}")
    return nbytes / (eff.mem * hw.mem_bw)


@dataclass(frozen=True)
class AttentionTime:
    """One attention core (QKᵀ, softmax, dropout, A·V) for a micro-batch on one device:
    forward and backward seconds, split into tensor-core and memory-bound parts."""

    fwd: float
    bwd: float
    fwd_math: float
    bwd_math: float

    @property
    def fwd_mem(self) -> float:
        return self.fwd - self.fwd_math

    @property
    def bwd_mem(self) -> float:
        return self.bwd - self.bwd_math


def attention_time(kind: str, b: int, heads: int, s_q: int, s_k: int, d: int, causal: bool,
                   dropout: bool, hw: Hardware, eff: Efficiency) -> AttentionTime:
    """Attention core of ``heads`` local heads of width ``d``, ``s_q`` queries against ``s_k``
    keys, ``b`` sequences (see the module doc for each ``kind``)."""
    if kind not in ATTENTION_KINDS:
        raise ModelcutError(f"attention kind must be one of {', '.join(ATTENTION_KINDS)}, got {kind!r}")
    if min(b, heads, s_q, s_k, d) < 1:
        raise ModelcutError("attention sizes must be positive")
    bh = b * heads
    if kind == "unfused":
        # Forward: S = QKᵀ (s_q×s_k×d), fused scale-mask-softmax, dropout, O = P·V (s_q×d×s_k).
        qk = gemm_time(s_q, s_k, d, hw, eff, bh)
        av = gemm_time(s_q, d, s_k, hw, eff, bh)
        elems = bh * s_q * s_k
        soft_f = mem_time(elems * 2 * BYTES, hw, eff)                      # read S, write P
        drop_f = mem_time(elems * (2 * BYTES + 1), hw, eff) if dropout else 0.0  # read, write, mask
        # Backward: dP = dO·Vᵀ, dV = Pᵀ·dO, dropout backward, softmax backward, dQ = dS·K, dK = dSᵀ·Q.
        d_p = gemm_time(s_q, s_k, d, hw, eff, bh)
        d_v = gemm_time(s_k, d, s_q, hw, eff, bh)
        d_q = gemm_time(s_q, d, s_k, hw, eff, bh)
        d_k = gemm_time(s_k, d, s_q, hw, eff, bh)
        drop_b = mem_time(elems * (2 * BYTES + 1), hw, eff) if dropout else 0.0
        soft_b = mem_time(elems * 3 * BYTES, hw, eff)                      # read P, dP; write dS
        fwd_math, bwd_math = qk + av, d_p + d_v + d_q + d_k
        return AttentionTime(fwd_math + soft_f + drop_f, bwd_math + drop_b + soft_b, fwd_math, bwd_math)
    frac = FLASH_FRACTION.get((kind, generation(hw)))
    if frac is None:
        if kind == "flash3" and generation(hw) == "ampere":
            raise ModelcutError("FlashAttention-3 runs on Hopper GPUs only; use flash2 on the A100")
        # No published figure for this kernel on this accelerator: the matrix-product rate.
        frac = (eff.gemm, eff.gemm)
    flops = 4.0 * bh * s_q * s_k * d * (0.5 if causal else 1.0)
    blocks = bh * -(-s_q // 128)
    wave = blocks / (-(-blocks // hw.sms) * hw.sms) if hw.sms else 1.0
    fwd = flops / (frac[0] * wave * hw.peak_flops_16)
    bwd = 2.5 * flops / (frac[1] * wave * hw.peak_flops_16)
    # Q, K, V and O (and their gradients) stream through HBM once each way: a floor.
    io = BYTES * bh * (2 * s_q + 2 * s_k) * d
    fwd = max(fwd, mem_time(io, hw, eff))
    bwd = max(bwd, mem_time(2 * io, hw, eff))
    return AttentionTime(fwd, bwd, fwd, bwd)
