"""benchmarks/bench_engine.py's SimPy baseline agrees with the engine on every schedule of the
registry (DualPipe's two directions and overlapped pairs included), with and without send time,
and the script refuses sizes a schedule refuses in one line (exit 2), never a traceback."""

from __future__ import annotations

import importlib.util
from pathlib import Path

import pytest

pytest.importorskip("simpy")

from modelcut.core.sim import registry  # noqa: E402
from modelcut.core.sim.engine import Timing, simulate  # noqa: E402

PATH = Path(__file__).resolve().parent.parent / "benchmarks" / "bench_engine.py"
spec = importlib.util.spec_from_file_location("bench_engine", PATH)
bench = importlib.util.module_from_spec(spec)
spec.loader.exec_module(bench)


@pytest.mark.parametrize("name", registry.names())
@pytest.mark.parametrize("p,m,p2p", [(4, 8, 0.0), (4, 16, 0.3), (2, 4, 1.5)])
def test_simpy_baseline_agrees_with_the_engine(name, p, m, p2p):
    s = registry.get(name)
    v = s.default_chunks if s.fixed_chunks else 2
    try:
        sched = registry.build(name, p, m, v)
    except Exception:
        pytest.skip(f"{name} refuses p = {p}, m = {m}")
    timing = Timing(1.0, 2.0, None, p2p)
    assert bench.simpy_makespan(sched, timing) == pytest.approx(simulate(sched, timing).makespan, rel=1e-12)


def test_the_script_agrees_and_refuses_in_one_line(capsys):
    assert bench.main(["-s", "dualpipe", "-p", "4", "-m", "8", "--repeat", "1"]) == 0
    assert "makespans agree" in capsys.readouterr().out
    assert bench.main(["-s", "dualpipe", "-p", "3", "-m", "8", "--repeat", "1"]) == 2
    err = capsys.readouterr().err
    assert err.startswith("bench_engine: error: ") and err.count("\n") == 1
