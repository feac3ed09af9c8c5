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
