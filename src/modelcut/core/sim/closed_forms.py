"""Closed-form pipeline bubbles, beside which the simulation is checked.

bubble = idle time over busy time per device, (T − busy)/busy. Each function is one paper's
formula; which schedule uses which, and under which sizes it holds, is the schedule
registry's (:mod:`.registry`). Exact for Fractions.
"""

from __future__ import annotations

from fractions import Fraction
from typing import Any


def _one(x: Any) -> Any:
    return Fraction(1) if isinstance(x, (int, Fraction)) else 1.0


def flush_bubble(p: int, m: int, t: Any = 1) -> Any:
    """GPipe and 1F1B: (p − 1)/m (Huang et al. 2019; Narayanan et al. 2021 §2.2.1)."""
    return _one(t) * (p - 1) / m


def chunked_bubble(p: int, m: int, v: int, t: Any = 1) -> Any:
    """Megatron-LM's interleaved schedule with m a multiple of p (Narayanan et al. 2021 §2.2.2) and
    the breadth-first looped schedule with m ≥ p (Lamy-Poirier 2023): (p − 1)/(v·m)."""
    return _one(t) * (p - 1) / (v * m)


def zb_h1_bubble(p: int, m: int, t_f: Any, t_b: Any, t_w: Any) -> Any:
    """ZB-H1 with m ≥ p and t_W ≤ min(t_F, t_B): (p − 1)(t_F + t_B − t_W)/(m(t_F + t_B + t_W))
    (Qi et al. 2024 §2.1 and §2.3: a bubble of (p − 1)(t_F + t_B − t_W) per device)."""
    return _one(t_f) * (p - 1) * (t_f + t_b - t_w) / (m * (t_f + t_b + t_w))


def zbv_bubble(p: int, m: int, t: Any = 1) -> Any:
    """ZB-V with t_F = t_B = t_W and m ≥ 2p − 1: (p − 1)/(6m), only the V's warm-up, one chunk
    forward per device, idle (Qi et al. 2024 §6)."""
    return _one(t) * (p - 1) / (6 * m)


def dualpipe_bubble_time(stages: int, t_f: Any, t_b: Any, t_w: Any, t_fb: Any) -> Any:
    """DualPipe's and DualPipeV's bubble, as idle time per device: (PP/2 − 1)(F&B + B − 3W),
    PP the pipeline stages (DualPipe: its p devices; DualPipeV: 2p stages on p devices). F, B, W
    are one chunk's forward, full backward and weight-gradient times, F&B an overlapped forward
    and full backward chunk's (DeepSeek-V3 report, arXiv 2412.19437, §3.2.1 Table 2;
    deepseek-ai/DualPipe README).

    The simulation of the repository's lists gives exactly this on every device when
    F = W = B/2 and F&B = F + B (the README figure's cells), and as the largest device's idle
    time when F + W ≤ F&B ≤ F + B (tests/test_dualpipe.py); outside those it is an estimate."""
    return (Fraction(stages, 2) - 1 if isinstance(t_f, (int, Fraction)) else stages / 2 - 1) * (t_fb + t_b - 3 * t_w)
