"""The schedules as pure functions: complete op lists, the papers' orders and placements,
and one-line refusals of sizes they cannot run."""

from __future__ import annotations

import pytest

from modelcut.core.sim.checks import check_complete
from modelcut.core.errors import ModelcutError
from modelcut.core.sim.registry import build
from modelcut.core.sim.schedules.basic import interleaved, megatron_schedule_table
from helpers import DEFAULT_CHUNKS, SCHEDULES

GRID = [(p, m) for p in (1, 2, 3, 4, 5) for m in (1, 2, 3, 4, 5, 7, 8, 12)]


def chunk_choices(name: str, p: int, m: int) -> list[int]:
    if name in ("gpipe", "1f1b", "zb-h1"):
        return [1]
    if name == "zbv":
        return [2]
    if name in ("interleaved", "llama3-interleaved"):
        return [1] + ([2, 3, 4] if m % p == 0 else [])
    return [1, 2, 3]


@pytest.mark.parametrize("name", sorted(SCHEDULES))
def test_every_schedule_lists_every_op_once(name):
    for p, m in GRID:
        for v in chunk_choices(name, p, m):
            s = build(name, p, m, v)
            assert (s.devices, s.microbatches, s.chunks, s.name) == (p, m, v, name)
            check_complete(s)  # every (kind, stage, micro-batch) once, each stage on one device
            kinds = 3 if name in ("zb-h1", "zbv") else 2
            assert s.num_ops == kinds * p * v * m
            assert s.split_backward == (name in ("zb-h1", "zbv"))


def test_default_chunks():
    for name, v in DEFAULT_CHUNKS.items():
        assert build(name, 4, 8).chunks == v


def test_gpipe_runs_every_forward_then_every_backward():
    s = build("gpipe", 3, 5)
    for d, order in enumerate(s.orders):
        assert [op.kind for op in order] == ["F"] * 5 + ["B"] * 5
        assert [op.microbatch for op in order] == list(range(5)) * 2
        assert {op.stage for op in order} == {d}


@pytest.mark.parametrize("p,m", [(4, 8), (4, 2), (6, 3), (1, 4), (5, 5)])
def test_1f1b_warms_up_then_alternates(p, m):
    s = build("1f1b", p, m)
    for d, order in enumerate(s.orders):
        kinds = "".join(op.kind for op in order)
        warm = min(p - 1 - d, m)
        assert kinds.startswith("F" * warm)
        steady = kinds[warm:warm + 2 * (m - warm)]
        assert steady == "FB" * (m - warm)
        assert kinds.endswith("B" * warm)
        # micro-batches go in order within each kind
        for k in "FB":
            assert [op.microbatch for op in order if op.kind == k] == list(range(m))


@pytest.mark.parametrize("p,m,v", [(4, 8, 2), (4, 8, 4), (2, 6, 3), (3, 9, 2)])
def test_interleaved_places_chunk_c_of_device_d_at_stage_d_plus_cp(p, m, v):
    s = build("interleaved", p, m, v)
    for d, order in enumerate(s.orders):
        assert {op.stage for op in order} == {d + c * p for c in range(v)}
        forwards = [op for op in order if op.kind == "F"]
        # Megatron-LM's table: groups of p micro-batches run through chunk 0, then chunk 1, ...
        table = megatron_schedule_table(m, v, p)
        assert [(op.microbatch, op.stage) for op in forwards] == [(mb, c * p + d) for mb, c in table]


def test_interleaved_accepts_what_megatron_accepts_and_never_deadlocks():
    # Megatron-LM: p <= N <= m and m mod N in {0} or >= p (plus a single group N = m < p,
    # as torch runs it). Every accepted order completes; every refused one is a one-line
    # ModelcutError, not a deadlock.
    from modelcut.core.sim.engine import simulate

    accepted = refused = 0
    for p in range(1, 6):
        for m in range(1, 13):
            for v in (2, 3):
                for group in range(1, m + 2):
                    legal = p <= group <= m and (m % group == 0 or m % group >= p) or group == m < p
                    try:
                        s = interleaved(p, m, v, group=group)
                    except ModelcutError as exc:
                        assert not legal and "Megatron-LM" in str(exc)
                        refused += 1
                        continue
                    assert legal
                    simulate(s)  # raises DeadlockError if the order cannot complete
                    accepted += 1
    assert accepted and refused


def test_megatron_schedule_table_groups():
    # m = 6 with groups of 4: the last group holds micro-batches 4 and 5 only
    assert megatron_schedule_table(6, 2, 4) == [
        (0, 0), (1, 0), (2, 0), (3, 0), (0, 1), (1, 1), (2, 1), (3, 1),
        (4, 0), (5, 0), (4, 1), (5, 1)]


def test_looped_bfs_runs_each_chunk_breadth_first():
    p, m, v = 3, 4, 2
    s = build("looped-bfs", p, m, v)
    for d, order in enumerate(s.orders):
        f = [(op.stage, op.microbatch) for op in order if op.kind == "F"]
        assert f == [(c * p + d, i) for c in range(v) for i in range(m)]
        b = [(op.stage, op.microbatch) for op in order if op.kind == "B"]
        assert b == [(c * p + d, i) for c in reversed(range(v)) for i in range(m)]


def test_zb_h1_keeps_1f1b_order_of_f_and_b():
    for p, m in [(4, 8), (3, 3), (5, 2)]:
        zb, ob = build("zb-h1", p, m), build("1f1b", p, m)
        for d in range(p):
            assert [op for op in zb.orders[d] if op.kind != "W"] == list(ob.orders[d])
            ws = [op.microbatch for op in zb.orders[d] if op.kind == "W"]
            assert ws == list(range(m))
            # each W comes after its own B
            pos = {(op.kind, op.microbatch): i for i, op in enumerate(zb.orders[d])}
            assert all(pos[("W", i)] > pos[("B", i)] for i in range(m))


def test_zbv_places_two_chunks_in_a_v():
    p = 4
    s = build("zbv", p, 8)
    for d, order in enumerate(s.orders):
        assert {op.stage for op in order} == {d, 2 * p - 1 - d}
    # the first and last stages share device 0
    assert s.stage_device()[0] == s.stage_device()[2 * p - 1] == 0


@pytest.mark.parametrize("call,words", [
    (lambda: build("1f1b", 0, 4), "devices p must be at least 1, got 0"),
    (lambda: build("gpipe", 4, 0), "micro-batches m must be at least 1, got 0"),
    (lambda: build("interleaved", 4, 8, 0), "chunks v must be at least 1, got 0"),
    (lambda: build("1f1b", 4.5, 8), "devices p must be an integer"),
    (lambda: build("pipedream", 4, 8), "unknown schedule 'pipedream'"),
    (lambda: build("gpipe", 4, 8, 2), "gpipe runs one chunk per device"),
    (lambda: build("zb-h1", 4, 8, 2), "zb-h1 runs one chunk per device"),
    (lambda: build("zbv", 4, 8, 3), "zbv runs exactly two chunks per device"),
    (lambda: build("interleaved", 4, 3, 2), "interleaved needs m >= N, its micro-batch group size"),
    (lambda: build("interleaved", 4, 6, 2), "interleaved needs m mod N = 0 or >= p"),
    (lambda: interleaved(4, 8, 2, group=2), "interleaved needs group size N >= p"),
])
def test_bad_sizes_are_one_line_errors(call, words):
    with pytest.raises(ModelcutError) as exc:
        call()
    msg = str(exc.value)
    assert words in msg
    assert "\n" not in msg
