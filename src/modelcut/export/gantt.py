"""A Gantt chart of a simulated pipeline (matplotlib, Agg backend), as .png or .svg.

One lane per device, device 0 at the top, time to the right. Ops are coloured by
micro-batch; F is solid, B hatched ``///``, W lighter and dotted; later chunks of an
interleaved device have a dashed edge. Idle time is the grey lane showing through.
The title gives the schedule, its sizes and the bubble, simulated beside the closed
form.
"""

from __future__ import annotations

from pathlib import Path

from ..core.errors import ModelcutError
from ..core.sim.run import PipelineResult

SUFFIXES = (".png", ".svg")
IDLE_COLOUR = "#d9d9d9"
HATCH = {"F": "", "B": "///", "W": "..."}
LIGHTEN = {"F": 0.0, "B": 0.0, "W": 0.45}
MAX_LABELS = 800  # ops above which boxes carry no micro-batch numbers


def check_path(path: str | Path) -> Path:
    """The path, if its suffix is one this face writes; else a one-line error."""
    path = Path(path)
    if path.suffix.lower() not in SUFFIXES:
        raise ModelcutError(f"--plot writes .png or .svg, not {path.suffix or 'a file without a suffix'!r}: {path}")
    return path


def _colour(mb: int, kind: str, cmap):
    r, g, b, _ = cmap(mb % cmap.N)
    k = LIGHTEN.get(kind, 0.0)
    return (r + (1 - r) * k, g + (1 - g) * k, b + (1 - b) * k)


def save(result: PipelineResult, path: str | Path) -> Path:
    """Draw the timeline and write it to ``path`` (.png or .svg)."""
    path = check_path(path)
    import matplotlib
    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.patches import Patch

    sched, met = result.schedule, result.metrics
    trace = result.trace
    P, T = sched.devices, float(met.makespan)
    chunk_of = {}
    for order in sched.orders:
        for k, s in enumerate(sorted({op.stage for op in order})):
            chunk_of[s] = k
    cmap = plt.get_cmap("tab20" if sched.microbatches > 10 else "tab10")

    width = min(max(8.0, 0.25 * T + 2.5), 40.0)
    height = min(max(2.5, 0.45 * P + 1.6), 30.0)
    fig, ax = plt.subplots(figsize=(width, height))
    try:
        lane = 0.8
        for d in range(P):
            y = P - 1 - d
            ax.broken_barh([(0, T)], (y - lane / 2, lane), facecolors=IDLE_COLOUR, edgecolor="none", zorder=1)
        # Group boxes that share a look so that large pipelines draw in a few calls.
        groups: dict[tuple, list[tuple[float, float]]] = {}
        labels = []
        for d, op, a, b in trace.rows():
            a, b = float(a), float(b)
            if b <= a:
                continue
            chunk = chunk_of[op.stage]
            key = (P - 1 - d, op.microbatch % cmap.N, op.kind, chunk > 0)
            groups.setdefault(key, []).append((a, b - a))
            labels.append((a, b, P - 1 - d, op))
        for (y, mbc, kind, later), spans in groups.items():
            ax.broken_barh(spans, (y - lane / 2, lane), facecolors=[_colour(mbc, kind, cmap)],
                           edgecolor="black", linewidth=1.0 if later else 0.4,
                           linestyle="--" if later else "-",
                           hatch=HATCH.get(kind, ""), zorder=2)
        if len(labels) <= MAX_LABELS:
            px_per_unit = width * 72 / max(T, 1e-9)
            for a, b, y, op in labels:
                if (b - a) * px_per_unit >= 9:
                    ax.text((a + b) / 2, y, str(op.microbatch), ha="center", va="center",
                            fontsize=7, zorder=3,
                            bbox=dict(boxstyle="round,pad=0.1", fc="white", ec="none", alpha=0.6)
                            if op.kind != "F" else None)
        ax.set_yticks(range(P))
        ax.set_yticklabels([f"device {d}" for d in reversed(range(P))])
        ax.set_ylim(-0.6, P - 0.4)
        ax.set_xlim(0, T)
        ax.set_xlabel("time (F = 1 for a device's whole share of layers)")
        cf = result.closed_form_bubble
        cf_text = "no closed form" if cf is None else f"closed form {float(cf):.4f}"
        ax.set_title(f"{sched.name}: p = {P}, m = {sched.microbatches}, v = {sched.chunks}; "
                     f"makespan {T:g}; bubble {float(met.bubble):.4f} simulated, {cf_text}", fontsize=10)
        handles = [Patch(facecolor=_colour(0, k, cmap), edgecolor="black", hatch=HATCH[k],
                         label={"F": "F forward", "B": "B backward", "W": "W weight gradient"}[k])
                   for k in (("F", "B", "W") if sched.split_backward else ("F", "B"))]
        if sched.chunks > 1:
            handles.append(Patch(facecolor="white", edgecolor="black", linestyle="--", linewidth=1.0,
                                 label="later chunk"))
        handles.append(Patch(facecolor=IDLE_COLOUR, label="idle"))
        handles += [Patch(facecolor=_colour(i, "F", cmap), label=f"micro-batch {i}")
                    for i in range(min(sched.microbatches, 10))]
        if sched.microbatches > cmap.N:
            handles.append(Patch(facecolor="white", label=f"(colours repeat every {cmap.N})"))
        elif sched.microbatches > 10:
            handles.append(Patch(facecolor="white", label="..."))
        ax.legend(handles=handles, loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=7, frameon=False)
        fig.tight_layout()
        fig.savefig(path, format=path.suffix.lower()[1:], dpi=110)
    finally:
        plt.close(fig)
    return path
