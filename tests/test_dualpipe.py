"""DualPipe and DualPipeV: overlapped forward-and-backward units in the engine, the schedules'
lists, their closed-form bubble and their activation memory."""

from fractions import Fraction as Fr

import pytest
from hypothesis import given, settings, strategies as st

from modelcut.core.sim import closed_forms, metrics, registry
from modelcut.core.sim.checks import check_complete
from modelcut.core.sim.engine import Timing, simulate
from modelcut.core.errors import ModelcutError
from modelcut.core.sim.ops import B, F, Schedule, W
from modelcut.core.sim.registry import build
from helpers import ALL_SCHEDULES, DEFAULT_CHUNKS, OVERLAPPED, SCHEDULES


def uniform(x=Fr(1), fb=None):
    """F = B_input = W = x per chunk (a full backward 2x), two chunks per device; ``fb`` the F&B unit
    (forward, input gradient and weight gradient, overlapped)."""
    return Timing(forward=2 * x, backward=2 * x, weight=2 * x, overlap=None if fb is None else 2 * fb)


def idle(trace):
    return [trace.makespan - trace.busy(d) for d in range(trace.schedule.devices)]


# ---------------------------------------------------------------- the engine's overlapped units

def test_a_unit_starts_when_all_its_inputs_are_in_and_its_ops_end_together():
    """Device 1 runs F of micro-batch 1 and B of micro-batch 0 as one unit: it waits for both the
    forward from device 0 and its own loss, and both end at once."""
    orders = ((F(0, 0), F(1, 0), B(0, 0), B(1, 0)), (F(0, 1), F(1, 1), B(0, 1), B(1, 1)))
    plain = Schedule("t", 2, 2, 1, orders)
    unit = Schedule("t", 2, 2, 1, orders, units=((), ((1, 2),)))
    t0 = simulate(plain, Timing(forward=1, backward=2))
    t1 = simulate(unit, Timing(forward=1, backward=2))
    assert t0.starts[1] == [1, 2, 3, 5] and t0.makespan == 9
    assert t1.starts[1][1] == t1.starts[1][2] == 2 and t1.ends[1][1] == t1.ends[1][2] == 5
    assert t1.busy(1) == t0.busy(1) == 6               # no overlap figure: the unit lasts F + B
    t2 = simulate(unit, Timing(forward=1, backward=2, overlap=lambda f, b: max(f, b)))
    assert t2.ends[1][2] == 4 and t2.busy(1) == 5 and t2.makespan < t0.makespan


def test_unit_refusals():
    orders = ((F(0, 0), B(0, 0)), (F(0, 1), B(0, 1)))
    with pytest.raises(ModelcutError, match="depends on|and an op it depends on"):
        simulate(Schedule("t", 2, 1, 1, orders, units=(((0, 2),), ())))     # B of stage 0 needs its own F
    with pytest.raises(ModelcutError, match="is not two or more ops"):
        simulate(Schedule("t", 2, 1, 1, orders, units=(((1, 2),), ())))
    with pytest.raises(ModelcutError, match="share an op"):
        o3 = ((F(0, 0), F(1, 0), F(2, 0), B(0, 0), B(1, 0), B(2, 0)),)
        simulate(Schedule("t", 1, 3, 1, o3, units=(((0, 2), (1, 2)),)))
    with pytest.raises(ModelcutError, match="give overlap as a function"):
        simulate(build("dualpipev", 2, 4), Timing(stage_durations=[(1, 1, 1)] * 4, overlap=2))


# ---------------------------------------------------------------- the schedules

@given(st.integers(1, 6), st.integers(0, 12))
@settings(max_examples=30, deadline=None)
def test_dualpipev_lists_every_op_once_and_never_deadlocks(p, extra):
    s = build("dualpipev", p, 2 * p + extra)
    check_complete(s)
    assert s.num_ops == 3 * 2 * p * (2 * p + extra)
    where = s.stage_device()
    assert all(where[d] == d and where[2 * p - 1 - d] == d for d in range(p))   # the V
    simulate(s, uniform())


@given(st.integers(1, 4), st.integers(0, 6))
@settings(max_examples=20, deadline=None)
def test_dualpipe_runs_each_direction_through_its_own_copy(half, extra):
    p, m = 2 * half, 4 * half + 2 * extra
    s = build("dualpipe", p, m)
    check_complete(s)
    assert s.num_ops == 3 * p * m                    # each micro-batch through p of the 2p stages
    where = s.stage_device()
    assert all(where[r] == r and where[p + r] == p - 1 - r for r in range(p))
    assert s.span(0) == (0, p - 1) and s.span(m - 1) == (p, 2 * p - 1)
    simulate(s, uniform())


@pytest.mark.parametrize("half,m", [(2, 8), (2, 12), (4, 16), (3, 14)])
def test_dualpipe_is_two_mirrored_dualpipev(half, m):
    """The repository's DualPipe runs on each half of its devices the DualPipeV list of p/2 devices
    with m/2 micro-batches: the same timeline, device r and p − 1 − r alike."""
    d, v = simulate(build("dualpipe", 2 * half, m), uniform()), simulate(build("dualpipev", half, m // 2), uniform())
    assert d.makespan == v.makespan
    for r in range(half):
        assert d.starts[r] == d.starts[2 * half - 1 - r] == v.starts[r]


@pytest.mark.parametrize("name,p", [("dualpipev", 2), ("dualpipev", 3), ("dualpipev", 4), ("dualpipev", 8),
                                    ("dualpipe", 4), ("dualpipe", 6), ("dualpipe", 8), ("dualpipe", 12)])
@pytest.mark.parametrize("extra", [0, 2, 7])
def test_simulated_bubble_is_the_papers_formula(name, p, extra):
    """(PP/2 − 1)(F&B + B − 3W), PP the stages: on every device when F = W = B/2 and F&B = F + B (the
    README figure), as the largest device's idle time for F + W ≤ F&B ≤ F + B."""
    m = 2 * p + 2 * extra
    s = build(name, p, m)
    stages = 2 * p if name == "dualpipev" else p
    f = w = Fr(1)
    b = 2 * f
    for fb in (f + b, f + w, Fr(9, 4), Fr(5, 2), Fr(11, 4)):
        t = simulate(s, uniform(f, fb))              # the unit holds F, B and W: the paper's F&B
        expected = closed_forms.dualpipe_bubble_time(stages, f, b, w, fb)
        if fb == f + b:
            assert idle(t) == [expected] * p
        assert max(idle(t)) == expected


def test_readme_figure_dualpipev_4_devices_10_micro_batches():
    """The repository's figure: 4 devices, 8 stages, 10 micro-batches, F one cell, B two, W one:
    6 idle cells per device, 66 cells in all."""
    t = simulate(build("dualpipev", 4, 10), uniform())
    assert idle(t) == [6] * 4 and t.makespan == 66


@pytest.mark.parametrize("name,p,m", [("dualpipev", 4, 10), ("dualpipev", 8, 20), ("dualpipe", 8, 16)])
def test_activation_peak_is_pp_plus_one_chunks(name, p, m):
    """The unit allocates its forward's activations when it starts and frees its backward's when it
    ends, so a device holds one chunk more than ZB-V: PP + 1 chunks (Table 2 of the report)."""
    t = simulate(build(name, p, m), uniform())
    stages = 2 * p if name == "dualpipev" else p
    peaks = metrics.measure(t).peak_activations
    assert all(x * 2 == stages + 1 for x in peaks)


@pytest.mark.parametrize("call,msg", [
    (lambda: build("dualpipev", 4, 7), "at least 2p = 8"),
    (lambda: build("dualpipev", 4, 8, 1), "exactly two chunks"),
    (lambda: build("dualpipe", 3, 12), "even p"),
    (lambda: build("dualpipe", 4, 9), "even m"),
    (lambda: build("dualpipe", 4, 6), "at least 2p"),
    (lambda: build("dualpipe", 4, 8, 3), "two chunks"),
])
def test_refusals(call, msg):
    with pytest.raises(ModelcutError, match=msg):
        call()


def test_registry():
    assert set(OVERLAPPED) == {"dualpipe", "dualpipev"} and not set(OVERLAPPED) & set(SCHEDULES)
    assert set(ALL_SCHEDULES) == set(SCHEDULES) | set(OVERLAPPED)
    assert all(build(n, 4, 8).chunks == DEFAULT_CHUNKS[n] == 2 for n in OVERLAPPED)
    # the registry's placement is where the lists put each stage
    for n in ALL_SCHEDULES:
        spec = registry.get(n)
        p = 4
        s = build(n, p, 8)
        where = s.stage_device()
        assert all(spec.device_of(c, p) == where[c] for c in range(s.stages)), n


def test_floats_agree_with_fractions():
    s = build("dualpipev", 4, 12)
    exact = simulate(s, Timing(forward=Fr(3, 2), backward=Fr(5, 4), weight=Fr(3, 4), overlap=Fr(7, 2)))
    fast = simulate(s, Timing(forward=1.5, backward=1.25, weight=0.75, overlap=3.5))
    assert float(exact.makespan) == pytest.approx(fast.makespan, rel=1e-12)
