"""modelcut's schedules against the orders torch.distributed.pipelining executes (no processes)."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from modelcut.core.sim.checks import check_complete
from modelcut.core.sim.engine import Timing, simulate
from modelcut.core.errors import ModelcutError
from modelcut.core.sim.ops import Op, Schedule
from modelcut.core.sim.registry import build
from modelcut.core.sim.schedules.basic import interleaved


def test_torchx_and_cli_import_without_torch():
    code = ("import sys; import modelcut.analysis.torchcheck, modelcut.analysis.torchcheck.orders, modelcut.analysis.torchcheck.runner, "
            "modelcut.analysis.torchcheck.fit, modelcut.analysis.torchcheck.report, modelcut.cli.crosscheck; "
            "assert 'torch' not in sys.modules, 'torch imported eagerly'")
    subprocess.run([sys.executable, "-c", code], check=True, timeout=60)


def test_missing_torch_is_a_one_line_error():
    code = ("import sys; sys.modules['torch'] = None\n"
            "from modelcut.cli import main\n"
            "sys.exit(main(['crosscheck', '--schedule', 'gpipe', '--order-only']))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert out.returncode == 2
    lines = out.stderr.strip().splitlines()
    assert len(lines) == 1 and "modelcut[torch]" in lines[0]


torch = pytest.importorskip("torch")
from modelcut.analysis.torchcheck import orders  # noqa: E402

pytestmark = pytest.mark.torch


@pytest.mark.parametrize("name", ["gpipe", "1f1b", "interleaved", "zbv"])
def test_orders_equal_what_torch_executes(name):
    c = orders.check(name, 4, 8)
    assert c.matches, c.first_difference
    assert c.first_difference is None
    assert c.modelcut.orders == c.torch.orders


@settings(max_examples=25, deadline=None)
@given(p=st.integers(1, 6), m=st.integers(1, 12))
def test_gpipe_1f1b_zbv_orders_equal_for_any_sizes(p, m):
    assert orders.check("gpipe", p, m).matches
    assert orders.check("zbv", p, m).matches
    if m >= p:  # torch's Schedule1F1B refuses m < p
        assert orders.check("1f1b", p, m).matches
    else:
        with pytest.raises(ModelcutError, match="Schedule1F1B refuses"):
            orders.check("1f1b", p, m)


@settings(max_examples=25, deadline=None)
@given(p=st.integers(1, 5), k=st.integers(1, 3), v=st.integers(2, 4))
def test_interleaved_equal_when_p_divides_m(p, k, v):
    assert orders.check("interleaved", p, k * p, v).matches


@settings(max_examples=20, deadline=None)
@given(p=st.integers(2, 5), m=st.integers(1, 14), v=st.integers(2, 3))
def test_interleaved_equal_to_torch_rounds_for_any_m(p, m, v):
    """Where p does not divide m torch runs rounds of m // (m // p) micro-batches, not
    Megatron-LM's groups of p: modelcut's interleaved with that group size is equal."""
    try:
        order = orders.torch_order("ScheduleInterleaved1F1B", p, m, v)
    except ModelcutError:  # torch refuses m not a multiple of its round count
        assert m % max(1, m // p) != 0
        return
    theirs, _ = orders.to_schedule(order)
    g = orders.torch_round_size(p, m)
    assert orders.first_difference(interleaved(p, m, v, group=g), theirs) is None
    c = orders.check("interleaved", p, m, v)
    assert c.matches, c.first_difference
    if m % p:  # modelcut's default group p refuses these sizes: the check says what it compared
        assert c.note is not None and f"group = {g}" in c.note
    else:
        assert c.note is None and c.modelcut == build("interleaved", p, m, v)


def test_1f1b_declared_order_is_shifted_but_executed_order_is_right():
    from torch.distributed.pipelining.schedules import _validate_schedule

    p, m = 4, 8
    c = orders.check("1f1b", p, m)
    last = p - 1
    declared_fwd = [int(a[len(str(last)) + 1:]) for a in c.order.declared[last] if a[len(str(last))] == "F"]
    executed_fwd = [a.microbatch for a in c.order.executed[last] if a.kind == "F"]
    assert declared_fwd == list(range(1, m + 1))
    assert executed_fwd == list(range(m))
    assert c.matches
    assert c.declared_difference.startswith(f"rank {last}, action 0")
    # torch's own validator rejects the declared order
    stage = orders._RecordingStage(0, p, 0, p, [])
    declared = orders.schedule_class("1f1b")(stage, m).pipeline_order
    with pytest.raises(AssertionError):
        _validate_schedule(declared, p, p, m)


def test_looped_bfs_runs_backwards_last_microbatch_first():
    p, m, v = 4, 8, 2
    c = orders.check("looped-bfs", p, m, v)
    assert not c.matches and c.first_difference.startswith(f"device 0, action {v * m}")
    # torch's order is modelcut's with each chunk's backwards reversed
    want = []
    for order in c.modelcut.orders:
        fwd = [op for op in order if op.kind == "F"]
        bwd = [op for op in order if op.kind == "B"]
        blocks = [bwd[i:i + m][::-1] for i in range(0, len(bwd), m)]
        want.append(tuple(fwd + [op for b in blocks for op in b]))
    assert c.torch.orders == tuple(want)
    t = Timing(1, 2)
    assert simulate(c.torch, t).makespan == simulate(c.modelcut, t).makespan


@pytest.mark.parametrize("name", ["ScheduleDualPipeV", "DualPipeV", "torch:ScheduleDualPipeV"])
def test_dualpipev_simulates_from_torchs_order(name):
    p, m = 4, 8
    sched = orders.torch_schedule(name, p, m)
    check_complete(sched)
    assert sched.split_backward and sched.chunks == 2
    assert sched.num_ops == 3 * sched.stages * m
    order = orders.torch_order(name, p, m)
    where = sched.stage_device()
    assert all(where[s] == r for s, r in order.stage_rank.items())
    assert {where[0], where[2 * p - 1]} == {0}  # the V: first and last stage on rank 0
    # every overlapped F+B pair stays adjacent, in torch's order, on its rank
    pairs = order.overlapped()
    assert pairs and all(len(g) == 2 and {a.kind for a in g} == {"F", "B"} for _, g in pairs)
    _, spans = orders.to_schedule(order)
    for r, acts in enumerate(order.executed):
        for i, a in enumerate(acts):
            first, last = spans[r][i]
            ops = sched.orders[r][first:last + 1]
            if a.kind == "B":  # a full backward in a split schedule: B then W at once
                assert ops == (Op("B", a.microbatch, a.stage), Op("W", a.microbatch, a.stage))
            else:
                assert len(ops) == 1 and ops[0].stage == a.stage and ops[0].microbatch == a.microbatch
    tr = simulate(sched, Timing(1, 2))
    busy = max(tr.busy(d) for d in range(p))
    assert busy <= tr.makespan < 2 * busy


@settings(max_examples=15, deadline=None)
@given(cls=st.sampled_from(orders.TORCH_CLASSES), p=st.integers(2, 4), m=st.integers(1, 10))
def test_every_torch_schedule_imports_and_simulates(cls, p, m):
    try:
        sched = orders.torch_schedule(cls, p, m)
    except ModelcutError as exc:
        assert "refuses these sizes" in str(exc) and "\n" not in str(exc)
        return
    check_complete(sched)
    tr = simulate(sched, Timing(1, 2, p2p=0.25))
    assert tr.makespan >= max(tr.busy(d) for d in range(p))


def test_first_difference_names_device_and_position():
    a = build("1f1b", 3, 4)
    orders_b = [list(o) for o in a.orders]
    orders_b[1][2] = Op("F", 9, 1)
    b = Schedule("x", 3, 4, 1, tuple(tuple(o) for o in orders_b))
    assert orders.first_difference(a, a) is None
    diff = orders.first_difference(a, b)
    assert diff == f"device 1, action 2: modelcut {a.orders[1][2]}, torch 1F9"
    short = Schedule("x", 3, 4, 1, (a.orders[0], a.orders[1][:-1], a.orders[2]))
    assert orders.first_difference(a, short).startswith(f"device 1, action {len(a.orders[1]) - 1}: only modelcut")


def test_bad_names_and_sizes_are_one_line_errors():
    for call in (lambda: orders.torch_order("NoSuchSchedule", 4, 8),
                 lambda: orders.torch_order("gpipe", 4, 8, 2),
                 lambda: orders.torch_order("interleaved", 4, 8, 1),
                 lambda: orders.torch_order("gpipe", 0, 8),
                 lambda: orders.check("zb-h1", 4, 8),
                 lambda: orders.torch_order("ScheduleDualPipeV", 4, 4)):
        with pytest.raises(ModelcutError) as exc:
            call()
        assert "\n" not in str(exc.value)


def test_cli_order_only(capsys):
    from modelcut.cli import main

    assert main(["crosscheck", "-s", "zbv,looped-bfs,ScheduleDualPipeV", "-p", "4", "-m", "8",
                 "--order-only", "--json"]) == 0
    runs = {d["schedule"]: d for d in json.loads(capsys.readouterr().out)["runs"]}
    assert runs["zbv"]["order_matches"] is True and runs["zbv"]["first_difference"] is None
    assert runs["looped-bfs"]["order_matches"] is False and "device 0" in runs["looped-bfs"]["first_difference"]
    assert runs["ScheduleDualPipeV"]["order_matches"] is None
    assert all(d["measured_makespan_s"] is None for d in runs.values())
    assert main(["crosscheck", "-s", "nope", "--order-only"]) == 2
    assert "unknown torch schedule" in capsys.readouterr().err
