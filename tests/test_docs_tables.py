"""The validation and kernel-check tables quoted in the docs are what the commands print today.

A refit or a model change moves the figures; the docs quote the commands' own table rows, and a
row left at an earlier refit is a figure no command prints. Each quoted row of a run or a kernel
check (a line of a table, ``│ id │ …``) must be a row of the command's output (spacing aside:
the docs may be printed at another terminal width)."""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from modelcut import catalog
from modelcut.catalog.runs import run_settings
from modelcut.catalog.kernel_checks import attention_sweeps, gemm_sweeps, layer_checks, linear_checks, norm_sweeps
from modelcut.cli import main

DOCS = Path(__file__).resolve().parent.parent / "docs"


def _norm(line: str) -> str:
    return re.sub(r"\s+", " ", line.strip())


def _rows(out: str) -> set[str]:
    return {_norm(line) for line in out.splitlines() if line.startswith("│")}


def _quoted(ids: set[str]) -> list[tuple[str, int, str]]:
    """(file, line number, row) of every table row in the docs whose first cell is one of ``ids``."""
    found = []
    for path in sorted(DOCS.glob("*.md")):
        for n, line in enumerate(path.read_text(encoding="utf-8").splitlines(), 1):
            if line.startswith("│"):
                first = line.strip("│ ").split("│")[0].strip()
                if first in ids:
                    found.append((path.name, n, line))
    return found


@pytest.fixture(scope="module")
def outputs():
    mp = pytest.MonkeyPatch()
    mp.setenv("COLUMNS", "250")
    try:
        import io
        from contextlib import redirect_stdout
        out = {}
        for key, argv in (("default", ["validate", "--mode", "default"]), ("kernels", ["validate", "--kernels"]),
                          ("seed", ["validate"])):
            buf = io.StringIO()
            with redirect_stdout(buf):
                assert main(argv) == 0
            out[key] = buf.getvalue()
        return out
    finally:
        mp.undo()


def test_quoted_run_rows_are_todays(outputs):
    ids = {pr.id for pr in catalog.published_runs()}
    rows = _rows(outputs["default"]) | _rows(outputs["seed"])
    quoted = _quoted(ids)
    assert len(quoted) > 50                     # the docs do quote the validation tables
    stale = [(f, n, line[:100]) for f, n, line in quoted if _norm(line) not in rows]
    assert not stale, stale


def test_quoted_kernel_check_rows_are_todays(outputs):
    ids = ({c.id for c in linear_checks()} | {c.id for c in layer_checks()} | {c.id for c in gemm_sweeps()}
           | {c.id for c in attention_sweeps()} | {c.id for c in norm_sweeps()})
    rows = _rows(outputs["kernels"])
    quoted = _quoted(ids)
    assert {line.strip("│ ").split("│")[0].strip() for _, _, line in quoted} >= {"korthikanti-22b-layer",
                                                                                 "cudnn-fe-2026-02",
                                                                                 "cudnn-fe-norms-2026-02"}
    stale = [(f, n, line[:100]) for f, n, line in quoted if _norm(line) not in rows]
    assert not stale, stale


def _tables(text: str) -> list[tuple[str, int, str]]:
    """(header, line number, row) of every table row in ``text``, the header being the table's
    column names (the nearest ``┃`` line above the row, spacing aside)."""
    header, out = "", []
    for n, line in enumerate(text.splitlines(), 1):
        if line.startswith("┃"):
            header = _norm(line)
        elif line.startswith("│"):
            out.append((header, n, line))
    return out


def test_quoted_source_and_fold_rows_are_todays_in_their_own_table(outputs):
    """The per-source summary and the folds' constants share their first cells (a source's name):
    each quoted row must be a row of the same table of today's output, so a folds' row cannot stand
    where a summary row belongs, or the other way round."""
    settings = run_settings()
    groups = {settings[pr.id].group for pr in catalog.published_runs() if pr.in_validation} | {"deck", "overall"}
    printed: dict[str, set[str]] = {}
    for header, _, line in _tables(outputs["default"]):
        printed.setdefault(_colnames(header), set()).add(_norm(line))
    checked, stale = 0, []
    for path in sorted(DOCS.glob("*.md")):
        for header, n, line in _tables(path.read_text(encoding="utf-8")):
            if line.strip("│ ").split("│")[0].strip() in groups and _colnames(header) in printed:
                checked += 1
                if _norm(line) not in printed[_colnames(header)]:
                    stale.append((path.name, n, line[:100]))
    assert checked > 20
    assert not stale, stale


def _colnames(header: str) -> str:
    """A table's column names without the padding a terminal width adds."""
    return "|".join(c.strip() for c in header.strip("┃ ").split("┃"))
