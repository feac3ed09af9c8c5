"""Behaviour kept: every golden output (tests/golden/capture.py) printed again, to 1e-9 relative."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent / "golden"))
from capture import COMMANDS, HERE, output  # noqa: E402

REL = 1e-9
KNOBS = ("tp", "cp", "cp_kind", "ep", "pp", "dp", "vpp", "micro_batch", "recompute", "zero", "schedule")


def same(a, b, where: str = "") -> None:
    """a and b agree: numbers to REL relative (1e-12 absolute near zero), the rest exactly."""
    if isinstance(a, bool) or isinstance(b, bool) or a is None or b is None or isinstance(a, str):
        assert a == b, f"{where}: {a!r} != {b!r}"
    elif isinstance(a, (int, float)) and isinstance(b, (int, float)):
        assert math.isclose(a, b, rel_tol=REL, abs_tol=1e-12), f"{where}: {a!r} != {b!r}"
    elif isinstance(a, dict):
        assert isinstance(b, dict) and set(a) == set(b), f"{where}: keys {sorted(a)} != {sorted(b)}"
        for k in a:
            same(a[k], b[k], f"{where}.{k}")
    elif isinstance(a, list):
        assert isinstance(b, list) and len(a) == len(b), f"{where}: length {len(a)} != {len(b)}"
        for i, (x, y) in enumerate(zip(a, b)):
            same(x, y, f"{where}[{i}]")
    else:
        assert a == b, f"{where}: {a!r} != {b!r}"


def same_exploration(gold: dict, new: dict) -> None:
    """Layouts compared by their knobs, since layouts tied in step time may swap places."""
    same([x["step_time_s"] for x in gold["layouts"]], [x["step_time_s"] for x in new["layouts"]], "step times")
    key = lambda x: tuple(x[k] for k in KNOBS)  # noqa: E731
    by_key = {key(x): x for x in new["layouts"]}
    last = gold["layouts"][-1]["step_time_s"]
    for x in gold["layouts"]:
        y = by_key.get(key(x))
        if y is None:  # pushed out of the list by a tie at its end
            assert math.isclose(x["step_time_s"], last, rel_tol=REL), f"layout {key(x)} missing"
            continue
        same(x, y, f"layout {key(x)}")
    rest = {k: v for k, v in gold.items() if k not in ("layouts", "why")}
    same(rest, {k: v for k, v in new.items() if k not in ("layouts", "why")}, "explore")
    if [key(x) for x in gold["layouts"][:2]] == [key(x) for x in new["layouts"][:2]]:
        same(gold.get("why"), new.get("why"), "why")


@pytest.mark.parametrize("name", sorted(COMMANDS))
def test_golden(name):
    gold = json.loads((HERE / f"{name}.json").read_text())
    new = output(COMMANDS[name])
    if name.startswith("explore"):
        same_exploration(gold, new)
    else:
        same(gold, new, name)
