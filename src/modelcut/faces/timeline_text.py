"""A text timeline, one row per device, like the papers' figures."""

from __future__ import annotations

from fractions import Fraction
from math import gcd

from rich.text import Text

from ..core.engine import Trace

PALETTE = ["red", "green", "blue", "magenta", "cyan", "yellow", "bright_red", "bright_green",
           "bright_blue", "bright_magenta", "bright_cyan", "bright_yellow"]
CELL = 3  # characters per time unit


def _unit(trace: Trace):
    """The largest time step that every start and end is a whole multiple of, if any."""
    vals = {x for row in trace.starts + trace.ends for x in row if x}
    if not vals:
        return None
    fr = []
    for x in vals:
        f = Fraction(x).limit_denominator(10_000) if isinstance(x, float) else Fraction(x)
        if isinstance(x, float) and abs(float(f) - x) > 1e-9 * max(1.0, abs(x)):
            return None
        fr.append(f)
    den = 1
    for f in fr:
        den = den * f.denominator // gcd(den, f.denominator)
    num = 0
    for f in fr:
        num = gcd(num, int(f * den))
    return Fraction(num, den)


def render(trace: Trace, max_width: int = 240) -> Text | None:
    """The timeline as rich Text (colours by micro-batch; F plain, B bold, W dim and
    lower-case), or None when it would be wider than ``max_width`` characters."""
    unit = _unit(trace)
    if unit is None:
        return None
    width = int(Fraction(trace.makespan) / unit) if not isinstance(trace.makespan, float) else \
        round(trace.makespan / float(unit))
    if width * CELL + 6 > max_width:
        return None
    out = Text()
    for d, order in enumerate(trace.schedule.orders):
        out.append(f"d{d:<3} ")
        pos = 0
        for op, s, e in zip(order, trace.starts[d], trace.ends[d]):
            a = round(Fraction(s) / unit) if not isinstance(s, float) else round(s / float(unit))
            b = round(Fraction(e) / unit) if not isinstance(e, float) else round(e / float(unit))
            if a > pos:
                out.append("·" * ((a - pos) * CELL), style="dim")
            label = (op.kind if op.kind != "W" else "w") + str(op.microbatch)
            if trace.schedule.chunks > 1:
                label += "'" * (op.stage // trace.schedule.devices) if op.stage // trace.schedule.devices < 3 \
                    else f"c{op.stage // trace.schedule.devices}"
            cells = (b - a) * CELL
            if cells <= 0:
                pos = b
                continue
            label = label[:cells - 1] if cells > 1 else label[:1]
            style = PALETTE[op.microbatch % len(PALETTE)]
            if op.kind == "F":
                style = f"reverse {style}"
            elif op.kind == "B":
                style = f"bold {style}"
            else:
                style = f"dim {style}"
            out.append("[" + label.ljust(cells - 1)[: cells - 1] if cells > 1 else label, style=style)
            pos = b
        out.append("\n")
    return out
