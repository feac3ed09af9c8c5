"""Closed-form pipeline bubbles, beside which the simulation is checked.

bubble = idle time over busy time per device, (T − busy)/busy.
"""

from __future__ import annotations

from fractions import Fraction
from typing import Any


def bubble(schedule: str, p: int, m: int, v: int, t_f: Any = 1, t_b: Any = 2, t_w: Any = None) -> Any | None:
    """The schedule's closed-form bubble for uniform stages and free sends, or None.

    * gpipe, 1f1b: (p − 1)/m (Huang et al. 2019; Narayanan et al. 2021 §2.2.1);
    * interleaved: (p − 1)/(v·m) when m is a multiple of p (Narayanan et al. 2021 §2.2.2);
    * looped-bfs: (p − 1)/(v·m) when m ≥ p (Lamy-Poirier 2023);
    * zb-h1: (p − 1)(t_F + t_B − t_W)/(m(t_F + t_B + t_W)) when m ≥ p and
      t_W ≤ min(t_F, t_B) (Qi et al. 2024 §2.1 and §2.3: a bubble of (p − 1)(t_F + t_B − t_W)
      per device; B and W the two halves of the backward);
    * zbv: (p − 1)/(6m) when t_F = t_B = t_W and m ≥ 2p − 1: only the V's warm-up, one
      chunk forward per device, is idle (Qi et al. 2024 §6).

    Times t_* are for a device's whole share of layers; with a split backward and no
    t_W, B and W share t_B equally. Exact for Fractions.
    """
    one = Fraction(1) if isinstance(t_f, (int, Fraction)) else 1.0
    if schedule in ("gpipe", "1f1b") and v == 1:
        return one * (p - 1) / m
    if schedule == "interleaved" and m % p == 0:
        return one * (p - 1) / (v * m)
    if schedule == "looped-bfs" and m >= p:
        return one * (p - 1) / (v * m)
    if schedule in ("zb-h1", "zbv"):
        if t_w is None:
            t_b, t_w = t_b / 2, t_b / 2
        if schedule == "zb-h1" and v == 1 and m >= p and t_w <= t_f and t_w <= t_b:
            return one * (p - 1) * (t_f + t_b - t_w) / (m * (t_f + t_b + t_w))
        if schedule == "zbv" and v == 2 and t_f == t_b == t_w and m >= 2 * p - 1:
            return one * (p - 1) / (6 * m)
    return None


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
