"""What the commands share: the caps their flags raise, the request models their options fill,
and the progress bar of commands that run over a few seconds."""

from __future__ import annotations

import contextlib
import json
import sys
import time
from pathlib import Path
from typing import Any, Callable, Iterator

import typer

from ..core.errors import ModelcutError
from ..service import requests
from ..service.limits import CAPS, DEFAULT, Limits

#: The flag of each cap (``--max-ops`` …), for the commands that take them.
LIMIT_HELP = {cap: f"raise the cap on {what or 'a model’s widths, heads, vocabulary and experts'} "
                   f"(default {getattr(DEFAULT, cap):,})" for cap, (what, _) in CAPS.items()}


def limit_option(cap: str) -> Any:
    return typer.Option(None, CAPS[cap][1], help=LIMIT_HELP[cap], show_default=False)


def limits(**caps: Any) -> Limits:
    """The default caps with those the user raised (``max_ops=…``)."""
    return DEFAULT.raised(**caps)


def check_writable(path: Path) -> None:
    """Refuse, before any work, a file the command could not write: its folder must exist (no
    command makes folders) and the path must not be a folder."""
    parent = path.parent
    if not parent.is_dir():
        raise ModelcutError(f"{parent}: no such directory (modelcut writes files; it makes no directories)")
    if path.is_dir():
        raise ModelcutError(f"{path}: is a directory; give a file name")


def write_file(path: Path, text: str) -> None:
    """Write a file the user named, in one line of error if it cannot be written."""
    check_writable(path)
    try:
        path.write_text(text, encoding="utf-8")
    except OSError as exc:
        raise ModelcutError(f"{path}: cannot write ({exc.strerror})") from None


def write_trace(path: Path, trace: dict) -> None:
    """Write a step's Chrome trace (``--trace``) and say on stderr what it holds, so that stdout
    stays the command's own answer (``--json``)."""
    write_file(path, json.dumps(trace))
    spans = sum(e.get("ph") == "X" for e in trace["traceEvents"])
    tracks = sum(e.get("name") == "thread_name" for e in trace["traceEvents"])
    print(f"wrote {path}: {spans:,} spans on {tracks} tracks (open it at ui.perfetto.dev)", file=sys.stderr)


def parse(model, data: dict, lim: Limits, names: dict[str, str] | None = None):
    """The options as a request model, or the one-line error naming the flag."""
    return requests.parse(model, {k: v for k, v in data.items() if v is not None}, lim, names=names)


@contextlib.contextmanager
def progress(label: str, enabled: bool = True) -> Iterator[Callable[..., None]]:
    """A progress bar on a terminal's stderr (nothing when stderr is a file or a pipe). Yields
    ``update(done, total=None, label=None)``."""
    show = enabled and sys.stderr.isatty()
    if not show:
        yield lambda *a, **k: None
        return
    from rich.console import Console
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

    err = Console(stderr=True)
    with Progress(SpinnerColumn(), TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(),
                  TimeElapsedColumn(), console=err, transient=True) as bar:
        task = bar.add_task(label, total=None)
        last = [0.0]

        def update(done: int, total: int | None = None, text: str | None = None) -> None:
            now = time.monotonic()
            if now - last[0] < 0.05 and (total is None or done < total):
                return
            last[0] = now
            kw: dict[str, Any] = {"completed": done}
            if total is not None:
                kw["total"] = total
            if text is not None:
                kw["description"] = text
            bar.update(task, **kw)
        yield update
