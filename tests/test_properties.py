"""Properties of the simulator over many (p, m, v), in exact arithmetic.

Every timeline is checked against the engine's rules by code that does not share the
engine's: no device runs two ops at once, every input arrives before its op starts,
every op runs exactly once, and each op starts as soon as its device and inputs allow.
The bubble is checked against the closed forms, peak memory against the papers.
"""

from __future__ import annotations

from fractions import Fraction as Fr

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from modelcut.core.sim import closed_forms, registry
from modelcut.core.sim.actions import from_csv, to_csv
from modelcut.core.sim.engine import Timing, Trace, simulate
from modelcut.core.errors import DeadlockError
from modelcut.core.sim.ops import Schedule
from modelcut.core.sim.run import run, run_named
from modelcut.core.sim.registry import build

FAST = settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])


@st.composite
def sized(draw, name: str, min_m_is_p: bool = False):
    """(p, m, v) that ``name`` accepts."""
    p = draw(st.integers(1, 6))
    lo = p if min_m_is_p else 1
    m = draw(st.integers(lo, max(lo, 12)))
    if name in ("gpipe", "1f1b", "zb-h1"):
        v = 1
    elif name == "zbv":
        v = 2
    elif name in ("interleaved", "llama3-interleaved"):
        v = draw(st.integers(1, 4))
        if v > 1:  # Megatron-LM's rule with its default group size N = p
            m = p * draw(st.integers(1, 3))
    else:
        v = draw(st.integers(1, 3))
    return p, m, v


ANY = st.sampled_from(["gpipe", "1f1b", "interleaved", "llama3-interleaved", "looped-bfs", "zb-h1", "zbv"]).flatmap(
    lambda name: sized(name).map(lambda pmv: (name, *pmv)))

TIMES = st.sampled_from([Fr(1, 2), Fr(1), Fr(3, 2), Fr(2), Fr(3)])
TIMINGS = st.builds(Timing, TIMES, TIMES, st.one_of(st.none(), TIMES),
                    st.sampled_from([Fr(0), Fr(1, 4), Fr(1)]))


def check_timeline(trace: Trace) -> None:
    """The engine's rules, restated independently of the engine."""
    s = trace.schedule
    S, m, split = s.stages, s.microbatches, s.split_backward
    durs, c = trace.durations, trace.p2p
    at: dict[tuple[str, int, int], tuple[int, Fr, Fr]] = {}
    for d, op, a, b in trace.rows():
        key = (op.kind, op.stage, op.microbatch)
        assert key not in at, f"{op} ran twice"
        at[key] = (d, a, b)
        assert b - a == durs[op.stage]["FBW".index(op.kind)], f"{op} has the wrong duration"
    kinds = "FBW" if split else "FB"
    assert set(at) == {(k, st_, mb) for k in kinds for st_ in range(S) for mb in range(m)}, "an op is missing"

    def ready(key, d):  # when an input is available to device d
        dd, _, b = at[key]
        return b + (c if dd != d else 0)

    for d in range(s.devices):
        prev_end = Fr(0)
        for op, a, b in zip(s.orders[d], trace.starts[d], trace.ends[d]):
            assert a >= prev_end, f"device {d} runs {op} while busy"
            k, stg, mb = op.kind, op.stage, op.microbatch
            inputs = []
            if k == "F" and stg > 0:
                inputs.append(ready(("F", stg - 1, mb), d))
            if k == "B":
                inputs.append(ready(("F", stg, mb), d))
                if stg < S - 1:
                    inputs.append(ready(("B", stg + 1, mb), d))
            if k == "W":
                inputs.append(ready(("B", stg, mb), d))
            for t in inputs:
                assert a >= t, f"{op} starts before its input arrives"
            assert a == max([prev_end, *inputs]), f"{op} waits longer than it must"
            prev_end = b


@FAST
@given(ANY, TIMINGS)
def test_timelines_obey_the_rules(case, timing):
    name, p, m, v = case
    check_timeline(simulate(build(name, p, m, v), timing))


@FAST
@given(ANY)
def test_bubble_is_idle_over_busy(case):
    name, p, m, v = case
    r = run_named(name, p, m, v, exact=True)
    T, busy = r.metrics.makespan, r.metrics.busy
    assert busy == [sum((b - a for a, b in zip(r.trace.starts[d], r.trace.ends[d])), Fr(0)) for d in range(p)]
    # every device does the same work: its share of F + B (+ W) for every micro-batch
    assert all(x == m * 3 for x in busy)
    assert r.metrics.bubble == (p * T - sum(busy)) / sum(busy)
    assert r.metrics.bubble_per_device == [(T - x) / x for x in busy]


@FAST
@given(st.sampled_from(["gpipe", "1f1b"]).flatmap(lambda n: sized(n).map(lambda pmv: (n, *pmv))))
def test_gpipe_and_1f1b_bubble_is_p_minus_1_over_m(case):
    name, p, m, v = case
    assert run_named(name, p, m, v, exact=True).metrics.bubble == Fr(p - 1, m)


@FAST
@given(st.integers(1, 6), st.integers(1, 3), st.integers(1, 4))
def test_interleaved_bubble_with_m_a_multiple_of_p(p, k, v):
    m = k * p
    assert run_named("interleaved", p, m, v, exact=True).metrics.bubble == Fr(p - 1, v * m)


@FAST
@given(sized("looped-bfs", min_m_is_p=True))
def test_looped_bfs_bubble_when_m_at_least_p(pmv):
    p, m, v = pmv
    assert run_named("looped-bfs", p, m, v, exact=True).metrics.bubble == Fr(p - 1, v * m)


@FAST
@given(sized("zb-h1", min_m_is_p=True), st.sampled_from([(1, 2, None), (2, 2, 1), (3, 2, Fr(1, 2)), (1, 1, 1)]))
def test_zb_h1_bubble_when_m_at_least_p(pmv, times):
    # (p − 1)(t_F + t_B − t_W) / (m(t_F + t_B + t_W)), with t_W <= min(t_F, t_B)
    p, m, _ = pmv
    tf, tb, tw = (None if x is None else Fr(x) for x in times)
    r = run(build("zb-h1", p, m), Timing(tf, tb, tw))
    if tw is None:
        tb, tw = tb / 2, tb / 2
    assert r.metrics.bubble == Fr(p - 1) * (tf + tb - tw) / (m * (tf + tb + tw))
    assert r.closed_form_bubble == r.metrics.bubble


@FAST
@given(st.integers(1, 6), st.integers(0, 6))
def test_zbv_bubble_when_m_at_least_2p_minus_1(p, extra):
    m = 2 * p - 1 + extra
    assert run_named("zbv", p, m, 2, exact=True).metrics.bubble == Fr(p - 1, 6 * m)


@FAST
@given(ANY)
def test_simulation_equals_closed_form_wherever_there_is_one(case):
    name, p, m, v = case
    r = run_named(name, p, m, v, exact=True)
    cf = registry.closed_form(name, p, m, v, Fr(1), Fr(2))
    assert r.closed_form_bubble == cf
    if cf is not None:
        assert r.metrics.bubble == cf


@FAST
@given(sized("gpipe"))
def test_gpipe_holds_all_m_micro_batches_on_every_device(pmv):
    p, m, _ = pmv
    assert run_named("gpipe", p, m, exact=True).metrics.peak_activations == [m] * p


@FAST
@given(sized("1f1b"))
def test_1f1b_device_d_holds_min_m_p_minus_d(pmv):
    p, m, _ = pmv
    assert run_named("1f1b", p, m, exact=True).metrics.peak_activations == [min(m, p - d) for d in range(p)]


def test_interleaved_4_8_2_first_device_peaks_at_5_5():
    # warm-up of 2(p − 1) + (v − 1)p = 10 chunk forwards, then one more before the
    # first backward frees one: 11 chunks of 1/2 each
    assert run_named("interleaved", 4, 8, 2, exact=True).metrics.peak_activations[0] == Fr(11, 2)


@FAST
@given(st.integers(2, 6), st.integers(1, 12))
def test_zb_h1_keeps_1f1b_peak_with_a_smaller_bubble(p, m):
    zb, ob = run_named("zb-h1", p, m, exact=True), run_named("1f1b", p, m, exact=True)
    assert max(zb.metrics.peak_activations) <= max(ob.metrics.peak_activations)
    assert zb.metrics.bubble < ob.metrics.bubble


@FAST
@given(ANY)
def test_memory_returns_to_zero_and_peaks_where_the_timeline_says(case):
    name, p, m, v = case
    met = run_named(name, p, m, v, exact=True).metrics
    for d in range(p):
        line = met.memory_timeline[d]
        assert line[-1][1] == 0
        assert max(x for _, x in line) == met.peak_activations[d]
        assert [t for t, _ in line] == sorted(t for t, _ in line)


@FAST
@given(ANY, TIMINGS)
def test_action_csv_round_trip_keeps_the_makespan(case, timing):
    name, p, m, v = case
    s = build(name, p, m, v)
    back = from_csv(to_csv(s))
    assert (back.devices, back.microbatches, back.chunks) == (p, m, v)
    assert [list(o) for o in back.orders] == [list(o) for o in s.orders]
    assert simulate(back, timing).makespan == simulate(s, timing).makespan


@FAST
@given(ANY, st.randoms(use_true_random=False))
def test_any_reordering_completes_or_deadlocks_never_hangs(case, rnd):
    name, p, m, v = case
    s = build(name, p, m, v)
    orders = [list(o) for o in s.orders]
    for o in orders:
        if rnd.random() < 0.5:
            rnd.shuffle(o)
    shuffled = Schedule("shuffled", p, m, v, tuple(tuple(o) for o in orders))
    try:
        tr = simulate(shuffled, Timing(Fr(1), Fr(2), None, Fr(1, 2)))
    except DeadlockError as exc:
        assert exc.blocked and all(line.startswith("device ") for line in exc.blocked)
    else:
        check_timeline(tr)
