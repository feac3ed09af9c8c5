"""The commands the docs show, run: every code block of docs/*.md and README.md that opens with a
``$ `` command is run as one bash script and must print exactly what the block shows after its
commands (trailing spaces aside), so a figure in the docs is one the project prints today.

A block that elides part of the output (a line ``...`` or a ``(...)`` placeholder standing for
what it leaves out) must show the rest as printed, each line whole and in order. A block is left
out only where it needs a running server, times the machine, or refits the constants (minutes):
:data:`NOT_REPLAYED`. The commands run in a fresh folder holding links to the checkout's
``src``, ``tests`` and ``benchmarks``, so the files they write land there, with the test's own
Python's ``bin`` first on PATH (``modelcut``, ``python3``) and no ``COLUMNS`` (output to a pipe).
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
DOCS = sorted((ROOT / "docs").glob("*.md")) + [ROOT / "README.md"]

#: Commands whose blocks are not replayed, and why.
NOT_REPLAYED = {
    "modelcut serve": "starts a server that runs until stopped (tests/test_web_api.py and the browser tests cover it)",
    "curl ": "needs a running server",
    "benchmarks/bench_": "times this machine: a benchmark's figures vary from run to run",
    "modelcut calibrate": "refits the constants (minutes; tests/test_calibrate.py)",
}


def _elided(line: str) -> bool:
    s = line.strip()
    return s in ("...", "…") or (s.startswith("(") and s.endswith(")"))


def _blocks() -> list[tuple[str, list[str], list[str]]]:
    """(where, the block's lines, what it shows after its commands) for each block that opens with
    a ``$`` command."""
    out = []
    for path in DOCS:
        lines = path.read_text(encoding="utf-8").split("\n")
        i = 0
        while i < len(lines):
            if not lines[i].lstrip(" ").startswith("```"):
                i += 1
                continue
            indent = len(lines[i]) - len(lines[i].lstrip(" "))    # a block inside a list item is indented
            j = i + 1
            while j < len(lines) and not lines[j].lstrip(" ").startswith("```"):
                j += 1
            block = [line[indent:] if line[:indent].strip() == "" else line for line in lines[i + 1:j]]
            if block and block[0].startswith("$ "):
                out.append((f"{path.relative_to(ROOT)}:{i + 2}", block))
            i = j + 1
    return [(where, block, _shown(block)) for where, block in out]


def _script(block: list[str]) -> tuple[str, list[str]]:
    """The block's commands as one bash script, and the lines it shows as their output: a ``$``
    line is a command, continued on the lines after it where it ends in a backslash, holds a
    here-document (to its ``EOF``) or leaves a double quote open; every other line is output."""
    cmds, shown, k = [], [], 0
    while k < len(block):
        line = block[k]
        if not line.startswith("$ "):
            shown.append(line)
            k += 1
            continue
        cmd = line[2:]
        k += 1
        while cmd.endswith("\\") and k < len(block):     # bash joins a line ending in a backslash to the next
            cmd += "\n" + block[k]
            k += 1
        if "<<'EOF'" in cmd:
            while k < len(block) and block[k] != "EOF":
                cmd += "\n" + block[k]
                k += 1
            cmd += "\nEOF"
            k += 1
        while cmd.count('"') % 2 and k < len(block):
            cmd += "\n" + block[k]
            k += 1
        cmds.append(cmd)
    return "\n".join(cmds) + "\n", shown


def _shown(block: list[str]) -> list[str]:
    return _script(block)[1]


def _replayed(block: list[str]) -> str | None:
    """Why a block is not replayed (None: it is)."""
    script = _script(block)[0]
    for cmd, why in NOT_REPLAYED.items():
        if cmd in script:
            return why
    return None


BLOCKS = _blocks()
REPLAYED = [(where, block, shown) for where, block, shown in BLOCKS if _replayed(block) is None]


def test_most_documented_commands_are_replayed():
    """The docs show commands in a few dozen blocks; all but a handful are replayed here."""
    assert len(BLOCKS) >= 50 and len(BLOCKS) - len(REPLAYED) <= 5, (len(BLOCKS), len(REPLAYED))


def _in_order(shown: list[str], got: list[str]) -> list[str]:
    """The lines of ``shown`` (elision lines aside) missing from ``got`` in that order: a block
    that elides part of the output must show the rest as printed, each line whole."""
    missing, at = [], 0
    for line in shown:
        if _elided(line) or not line:      # an excerpt's blank lines only space it
            continue
        try:
            at = got.index(line, at) + 1
        except ValueError:
            missing.append(line)
    return missing


@pytest.mark.parametrize("where, block, shown", REPLAYED, ids=[w for w, _, _ in REPLAYED])
def test_a_documented_command_prints_what_the_docs_show(where, block, shown, tmp_path):
    for name in ("src", "tests", "benchmarks"):
        (tmp_path / name).symlink_to(ROOT / name)
    env = {k: v for k, v in os.environ.items() if k != "COLUMNS"}
    env["PATH"] = f"{Path(sys.executable).parent}{os.pathsep}{env.get('PATH', '')}"
    script, _ = _script(block)
    done = subprocess.run(["bash", "-c", script], cwd=tmp_path, env=env, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, timeout=600)
    text = done.stdout   # both streams, in the order printed
    got = [line.rstrip() for line in text.rstrip("\n").split("\n")] if text.strip() else []
    want = [line.rstrip() for line in shown]
    if any(_elided(line) for line in want):
        assert not _in_order(want, got), f"{where}: lines the docs show that the command does not print"
    else:
        assert got == want, f"{where}: the docs show other output than the command prints"
