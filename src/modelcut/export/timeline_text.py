"""A text timeline, one row per device, like the papers' figures.

Time runs left to right in steps of the largest unit that every start and end is a
whole multiple of; each step takes 3, 2 or 1 characters, the widest that fits the
width asked for. Each op is a block of cells that reads without colour:

* F shows its micro-batch (``F3``, or ``3`` when the block is too short for the
  letter, or the last digit when one cell is all there is);
* B and W show their letter first (``B3``, ``W3``; ``B`` or ``W`` alone in one cell);
* later chunks of an interleaved device carry a ``'`` (chunk 1), ``"`` (chunk 2) or
  ``cK`` when there is room;
* ``·`` is idle.

Where the terminal takes colour, every op is coloured by its micro-batch: F as a
solid block, B in bold, W dim, and chunks after the first underlined.
"""

from __future__ import annotations

from fractions import Fraction
from math import gcd
from typing import Any

from rich.text import Text

from ..core.sim.engine import Trace

PALETTE = ["red", "green", "blue", "magenta", "cyan", "yellow", "bright_red", "bright_green",
           "bright_blue", "bright_magenta", "bright_cyan", "bright_yellow"]
CELL_WIDTHS = (3, 2, 1)  # characters per time unit, widest first
IDLE = "·"
#: The key to a timeline with every mark (:func:`legend` gives the one for a drawn timeline).
LEGEND = "F3 B3 W3 = forward, backward, weight gradient of micro-batch 3; ' \" = chunks 1, 2; · = idle"


def _fraction(x: Any) -> Fraction | None:
    if isinstance(x, float):
        f = Fraction(x).limit_denominator(10_000)
        return f if abs(float(f) - x) <= 1e-9 * max(1.0, abs(x)) else None
    return Fraction(x)


def time_unit(trace: Trace) -> Fraction | None:
    """The largest time step that every start and end is a whole multiple of, or None
    (times that are not fractions with a small denominator)."""
    den, fr = 1, []
    for row in trace.starts + trace.ends:
        for x in row:
            if x:
                f = _fraction(x)
                if f is None:
                    return None
                fr.append(f)
                den = den * f.denominator // gcd(den, f.denominator)
    num = 0
    for f in fr:
        num = gcd(num, int(f * den))
    return Fraction(num, den) if num else None


def _steps(x: Any, unit: Fraction) -> int:
    return round(_fraction(x) / unit)


def _chunk_mark(chunk: int) -> str:
    return "" if chunk == 0 else "'" if chunk == 1 else '"' if chunk == 2 else f"c{chunk}"


def label(kind: str, microbatch: int, chunk: int, cells: int) -> str:
    """The op's text in exactly ``cells`` characters (see the module docstring)."""
    mb, mark = str(microbatch), _chunk_mark(chunk)
    if kind == "F":
        choices = ["F" + mb + mark, "F" + mb, mb + mark, mb, mb[-1]]
    else:
        choices = [kind + mb + mark, kind + mb, kind]
    for text in choices:
        if len(text) <= cells:
            return text.ljust(cells)
    return choices[-1][:cells]


def _style(kind: str, microbatch: int, chunk: int) -> str:
    colour = PALETTE[microbatch % len(PALETTE)]
    style = {"F": f"reverse {colour}", "B": f"bold {colour}"}.get(kind, f"dim {colour}")
    return style + (" underline" if chunk else "")


def _ruler(width_steps: int, unit: Fraction, cell: int, indent: int) -> str:
    """Time labels above the rows, at round times (1, 2 or 5 × a power of ten) at least 6
    characters apart, preferring times that fall on a step boundary."""
    per_char = unit / cell  # time per character
    scales = [Fraction(10) ** k for k in range(-3, 7)]
    candidates = sorted(base * scale for base in (1, 2, 5) for scale in scales if base * scale / per_char >= 6)
    if not candidates:
        return ""
    on_steps = [c for c in candidates if (c / unit).denominator == 1]
    step = on_steps[0] if on_steps and on_steps[0] <= 10 * candidates[0] else candidates[0]
    line = [" "] * (indent + width_steps * cell + 8)
    t, end = Fraction(0), width_steps * unit
    while t <= end:
        col = indent + int(t / per_char)
        text = f"{float(t):g}"
        line[col:col + len(text)] = text
        t += step
    return "".join(line).rstrip()


def _layout(trace: Trace, max_width: int) -> tuple[int, Fraction] | None:
    """(characters per time step, the step) that fit ``max_width``, or None."""
    indent = len(f"d{trace.schedule.devices - 1}") + 2
    # every op takes at least one character: a quick no before looking at the times
    if indent + max((len(o) for o in trace.schedule.orders), default=0) > max_width:
        return None
    unit = time_unit(trace)
    if unit is None:
        return None
    steps = _steps(trace.makespan, unit)
    for cell in CELL_WIDTHS:
        if indent + steps * cell <= max_width:
            return cell, unit
    return None


def fits(trace: Trace, max_width: int) -> int | None:
    """Characters per time step that make the timeline fit ``max_width``, or None."""
    layout = _layout(trace, max_width)
    return None if layout is None else layout[0]


def _mark_cell(chunk: int, cells: int) -> str:
    mark = _chunk_mark(chunk)
    return (mark if len(mark) <= cells else mark[-1]).ljust(cells)


def _blocks(trace: Trace, cell: int, unit: Fraction):
    """Per device, (first step, last step, op, chunk) of every op that takes a cell or more."""
    chunk_of = {}
    for order in trace.schedule.orders:
        for k, s in enumerate(sorted({op.stage for op in order})):
            chunk_of[s] = k
    for d, order in enumerate(trace.schedule.orders):
        yield d, [(a, b, op, chunk_of[op.stage]) for op, s, e in zip(order, trace.starts[d], trace.ends[d])
                  for a, b in [(_steps(s, unit), _steps(e, unit))] if b > a]


def _draw(trace: Trace, max_width: int, ruler: bool) -> tuple[Text, dict[str, bool]] | None:
    """The timeline and what it shows: W ops, forwards without their letter, chunk marks, and
    whether some marks sit on a line of their own (ops too short to carry them)."""
    layout = _layout(trace, max_width)
    if layout is None:
        return None
    cell, unit = layout
    sched = trace.schedule
    indent = len(f"d{sched.devices - 1}") + 2
    total = _steps(trace.makespan, unit)
    rows = list(_blocks(trace, cell, unit))
    labels = {(d, i): label(op.kind, op.microbatch, chunk, (b - a) * cell)
              for d, blocks in rows for i, (a, b, op, chunk) in enumerate(blocks)}
    lost = {key for key, text in labels.items()
            if rows[key[0]][1][key[1]][3] > 0 and _chunk_mark(rows[key[0]][1][key[1]][3]) not in text}
    seen = {"W": any(op.kind == "W" for _, blocks in rows for _, _, op, _ in blocks),
            "bare_forward": any(rows[d][1][i][2].kind == "F" and not t.startswith("F") for (d, i), t in labels.items()),
            "chunks": sched.chunks > 1, "mark_rows": bool(lost)}
    out = Text()
    if ruler:
        out.append(_ruler(total, unit, cell, indent) + "\n", style="dim")
    for d, blocks in rows:
        out.append(f"d{d}".ljust(indent))
        pos, marks = 0, []
        for i, (a, b, op, chunk) in enumerate(blocks):
            if a > pos:
                out.append(IDLE * ((a - pos) * cell), style="dim")
                marks.append(" " * ((a - pos) * cell))
            cells = (b - a) * cell
            out.append(labels[(d, i)], style=_style(op.kind, op.microbatch, chunk))
            marks.append(_mark_cell(chunk, cells) if (d, i) in lost else " " * cells)
            pos = max(pos, b)
        if total > pos:
            out.append(IDLE * ((total - pos) * cell), style="dim")
        out.append("\n")
        if lost:   # every device gets its mark line, so that the rows pair up
            out.append((" " * indent + "".join(marks)).rstrip() + "\n", style="dim")
    return out, seen


def render(trace: Trace, max_width: int = 100, ruler: bool = True) -> Text | None:
    """The timeline as rich Text, at most ``max_width`` characters wide, or None when it
    cannot fit even at one character per time step. Where an op of a later chunk is too short
    to carry its chunk mark, the mark goes on a line below the device's row, under the op."""
    drawn = _draw(trace, max_width, ruler)
    return None if drawn is None else drawn[0]


def legend(trace: Trace, max_width: int = 100) -> str:
    """The key to :func:`render`'s timeline at this width: what its cells show, and only that."""
    drawn = _draw(trace, max_width, False)
    seen = drawn[1] if drawn is not None else {"W": trace.schedule.split_backward, "bare_forward": False,
                                               "chunks": trace.schedule.chunks > 1, "mark_rows": False}
    kinds = "F3 B3 W3 = forward, backward, weight gradient" if seen["W"] else "F3 B3 = forward, backward"
    parts = [kinds + " of micro-batch 3" + ("; 3 alone = its forward (F3 where there is room)"
                                          if seen["bare_forward"] else "")]
    if seen["chunks"]:
        marks = "' \" = chunks 1, 2 (c3 … later ones)" if trace.schedule.chunks > 3 else (
            "' \" = chunks 1, 2" if trace.schedule.chunks > 2 else "' = chunk 1")
        parts.append(marks + ("; the line below a device's row marks the ops too short to carry it"
                              if seen["mark_rows"] else ""))
    parts.append(f"{IDLE} = idle")
    return "; ".join(parts)
