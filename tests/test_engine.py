"""The engine: exact timings on hand-derived cases, deadlocks reported by name, and
one-line refusals of lists or timings it cannot run."""

from __future__ import annotations

from fractions import Fraction as Fr

import pytest

from modelcut.core.sim.checks import check_complete
from modelcut.core.sim.engine import Timing, simulate
from modelcut.core.errors import DeadlockError, ModelcutError
from modelcut.core.sim.ops import B, F, Op, Schedule, W
from modelcut.core.sim.run import run, run_named
from modelcut.core.sim.registry import build


def sched(orders, m, v=1, name="custom") -> Schedule:
    return Schedule(name, len(orders), m, v, tuple(tuple(o) for o in orders))


@pytest.mark.parametrize("p,m", [(1, 1), (2, 3), (4, 8), (5, 2)])
@pytest.mark.parametrize("tf,tb,c", [(1, 2, 0), (Fr(1, 2), Fr(3, 2), Fr(1, 4)), (2, 1, 1)])
def test_gpipe_makespan_with_sends(p, m, tf, tb, c):
    # Forwards ripple down, one (t_f + c) per device, then m forwards on the last
    # device; backwards ripple back the same way: T = (m + p − 1)(t_f + t_b) + 2(p − 1)c.
    tr = simulate(build("gpipe", p, m), Timing(Fr(tf), Fr(tb), None, Fr(c)))
    assert tr.makespan == (m + p - 1) * (Fr(tf) + Fr(tb)) + 2 * (p - 1) * Fr(c)


def test_single_device_runs_back_to_back():
    tr = simulate(build("1f1b", 1, 5), Timing(Fr(1), Fr(2)))
    assert tr.makespan == 5 * 3
    assert tr.starts[0] == [sum((1 if k == "F" else 2) for k in "".join(
        op.kind for op in build("1f1b", 1, 5).orders[0])[:i]) for i in range(10)]


def test_chunk_durations_divide_by_v():
    s = build("interleaved", 2, 2, 4)
    tr = simulate(s, Timing(Fr(1), Fr(2)))
    for d, op, a, b in tr.rows():
        assert b - a == (Fr(1, 4) if op.kind == "F" else Fr(2, 4))


def test_split_backward_shares_b_unless_weight_given():
    s = build("zb-h1", 2, 2)
    for timing, want in ((Timing(Fr(1), Fr(2)), {"F": 1, "B": 1, "W": 1}),
                         (Timing(Fr(1), Fr(3, 2), Fr(1, 2)), {"F": 1, "B": Fr(3, 2), "W": Fr(1, 2)})):
        tr = simulate(s, timing)
        assert {op.kind: b - a for _, op, a, b in tr.rows()} == want


def test_weight_without_split_is_added_to_b():
    tr = simulate(build("1f1b", 2, 2), Timing(Fr(1), Fr(2), Fr(1, 2)))
    assert {op.kind: b - a for _, op, a, b in tr.rows()} == {"F": 1, "B": Fr(5, 2)}


def test_per_stage_durations():
    # an embedding-heavy first stage and a loss-heavy last one
    durs = [(Fr(2), Fr(3), Fr(0)), (Fr(1), Fr(2), Fr(0)), (Fr(1), Fr(2), Fr(0)), (Fr(1), Fr(4), Fr(0))]
    s = build("1f1b", 4, 6)
    tr = simulate(s, Timing(stage_durations=durs))
    for d, op, a, b in tr.rows():
        assert b - a == durs[op.stage]["FBW".index(op.kind)]
    scaled = simulate(s, Timing(Fr(1), Fr(2), stage_scale=[Fr(2), 1, 1, Fr(1, 2)]))
    for d, op, a, b in scaled.rows():
        assert b - a == (1 if op.kind == "F" else 2) * [Fr(2), 1, 1, Fr(1, 2)][op.stage]


def test_floats_and_fractions_agree():
    for name, p, m, v in [("interleaved", 4, 8, 2), ("zbv", 3, 7, 2), ("1f1b", 5, 9, 1)]:
        exact = run_named(name, p, m, v, Timing(1, 2, None, Fr(1, 8)), exact=True)
        fast = run_named(name, p, m, v, Timing(1.0, 2.0, None, 0.125))
        assert float(exact.trace.makespan) == pytest.approx(fast.trace.makespan, abs=1e-12)
        assert [float(x) for x in exact.metrics.peak_activations] == pytest.approx(fast.metrics.peak_activations)


def test_deadlock_between_two_devices_names_the_blocked_ops():
    # v = 2: device 0 holds stages 0 and 2, device 1 stages 1 and 3. Device 0 starts with
    # stage 2's forward, which needs stage 1's; device 1 starts with stage 3's, which
    # needs stage 2's: each waits for the other.
    s = sched([[F(0, 2), F(0, 0), B(0, 2), B(0, 0)],
               [F(0, 3), F(0, 1), B(0, 3), B(0, 1)]], m=1, v=2)
    with pytest.raises(DeadlockError) as exc:
        simulate(s)
    assert exc.value.blocked == ["device 0 at 2F0 waits for 1F0", "device 1 at 3F0 waits for 2F0"]
    assert str(exc.value).startswith("deadlock: device 0 at 2F0 waits for 1F0")
    assert "\n" not in str(exc.value)


def test_deadlock_on_own_later_op():
    s = sched([[F(0, 0), B(0, 0)], [B(0, 1), F(0, 1)]], m=1)
    with pytest.raises(DeadlockError) as exc:
        simulate(s)
    assert exc.value.blocked == ["device 0 at 0B0 waits for 1B0", "device 1 at 1B0 waits for 1F0"]


def test_unchecked_list_missing_an_op_is_a_deadlock_not_a_hang():
    s = sched([[F(0, 0), B(0, 0)], [B(0, 1)]], m=1)
    with pytest.raises(DeadlockError) as exc:
        simulate(s, validate=False)
    assert "device 1 at 1B0 waits for 1F0" in exc.value.blocked


@pytest.mark.parametrize("orders,m,v,words", [
    ([[F(0, 0), B(0, 0)], [F(0, 1)]], 1, 1, "op 1B0 (stage 1, micro-batch 0) is missing"),
    ([[F(0, 0), B(0, 0), F(0, 0)], [F(0, 1), B(0, 1)]], 1, 1, "op 0F0 appears twice (devices 0 and 0)"),
    ([[F(0, 0), B(0, 0), F(0, 1)], [B(0, 1)]], 1, 1, "stage 1 has ops on devices 0 and 1"),
    ([[F(0, 0), B(0, 0)], [F(0, 1), B(0, 5)]], 1, 1, "names stage 5, outside 0..1"),
    ([[F(0, 0), B(0, 0)], [F(0, 1), B(3, 1)]], 1, 1, "names micro-batch 3, outside 0..0"),
    ([[F(0, 0), Op("X", 0, 0)], [F(0, 1), B(0, 1)]], 1, 1, "unknown op kind 'X'"),
    ([[F(0, 0), B(0, 0), W(0, 0)], [F(0, 1), B(0, 1)]], 1, 1, "op 1W0 (stage 1, micro-batch 0) is missing"),
])
def test_incomplete_lists_are_one_line_errors(orders, m, v, words):
    s = sched(orders, m, v)
    for call in (lambda: check_complete(s), lambda: simulate(s)):
        with pytest.raises(ModelcutError) as exc:
            call()
        assert words in str(exc.value)
        assert not isinstance(exc.value, DeadlockError)


@pytest.mark.parametrize("timing,words", [
    (Timing(-1), "forward time must be non-negative"),
    (Timing(1, 2, None, -1), "p2p time must be non-negative"),
    (Timing(float("inf")), "F time must be finite"),
    (Timing(1, float("nan")), "B time must be finite"),
    (Timing(stage_durations=[(1, -2, 0)] * 4), "B time must be finite and non-negative"),
    (Timing(stage_durations=[(1, 2, 0)] * 3), "stage_durations has 3 entries for 4 stages"),
    (Timing(stage_scale=[1, 1]), "stage_scale has 2 entries for 4 stages"),
])
def test_bad_timings_are_one_line_errors(timing, words):
    with pytest.raises(ModelcutError) as exc:
        simulate(build("1f1b", 4, 4), timing)
    assert words in str(exc.value)


def test_result_bundles_trace_metrics_and_closed_form():
    r = run(build("1f1b", 4, 8), Timing(Fr(1), Fr(2)))
    assert r.metrics.makespan == r.trace.makespan == (8 + 3) * 3
    assert r.closed_form_bubble == Fr(3, 8)
    # sends or uneven stages have no closed form
    assert run(build("1f1b", 4, 8), Timing(Fr(1), Fr(2), None, Fr(1, 10))).closed_form_bubble is None
    assert run(build("1f1b", 4, 8), Timing(Fr(1), Fr(2), stage_scale=[2, 1, 1, 1])).closed_form_bubble is None
