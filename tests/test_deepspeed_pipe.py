"""DeepSpeed's pipeline engine, as the Megatron-DeepSpeed presets time it: its TrainSchedule runs
each stage's passes in 1F1B's order, its blocking exchanges at each step's start leave 1F1B's
makespan as it is when they take no time, and each exchange sends and then receives, twice the
time Megatron-LM's batched send and receive hold the devices for.

The schedule below is DeepSpeed's, transcribed for the check: microsoft/DeepSpeed v0.5.4
deepspeed/runtime/pipe/schedule.py, ``TrainSchedule.steps`` and ``_step_to_micro_batch`` with
its four ``_*_step_*_id`` helpers (the same in v0.3.13 and v0.6.4)."""

from __future__ import annotations

from fractions import Fraction

from hypothesis import given, settings, strategies as st

from modelcut.catalog.frameworks import framework
from modelcut.core.sim.engine import Timing, simulate
from modelcut.core.sim.registry import build
from modelcut.core.step.stage_costs import exchange_time


def _step_to_micro_batch(p: int, s: int, t: int) -> tuple[int, bool]:
    """(micro-batch, forward?) of stage ``s`` at step ``t`` (TrainSchedule._step_to_micro_batch)."""
    if t % 2 == 0 and s % 2 == 0:
        return t // 2 - s // 2, True
    if t % 2 == 1 and s % 2 == 1:
        return (t - 1) // 2 - s // 2, True
    if t % 2 == 0 and s % 2 == 1:
        return t // 2 - p + (s + 1) // 2, False
    return (t - 1) // 2 - p + 1 + s // 2, False


def _steps(p: int, m: int, s: int) -> list[tuple[int, bool, int | None]]:
    """Stage ``s``'s 2(m + p − 1) steps: (micro-batch or −1, forward?, the stage it exchanges with
    first, or None). A forward step receives from the previous stage (RecvActivation) and sends it
    the previous step's gradient (SendGrad); a backward step sends the next stage the previous
    step's output (SendActivation) and receives its gradient (RecvGrad)."""
    out, prev = [], -1
    for t in range(2 * (m + p - 1)):
        mb, fwd = _step_to_micro_batch(p, s, t)
        mb = mb if 0 <= mb < m else -1
        talks = (mb >= 0 or prev >= 0) and (s > 0 if fwd else s < p - 1)
        out.append((mb, fwd, (s - 1 if fwd else s + 1) if talks else None))
        prev = mb
    return out


def _lockstep_makespan(p: int, m: int, f: Fraction, b: Fraction) -> Fraction:
    """Every step's exchange waits for both its devices to finish their previous step (blocking
    calls that take no time), then each runs its pass."""
    plan = [_steps(p, m, s) for s in range(p)]
    end = [Fraction(0)] * p
    for t in range(2 * (m + p - 1)):
        start = [max(end[s], end[plan[s][t][2]]) if plan[s][t][2] is not None else end[s] for s in range(p)]
        end = [start[s] + ((f if plan[s][t][1] else b) if plan[s][t][0] >= 0 else 0) for s in range(p)]
    return max(end)


@settings(max_examples=60, deadline=None)
@given(p=st.integers(1, 12), m=st.integers(1, 40))
def test_deepspeeds_train_schedule_runs_each_stage_in_1f1b_order(p, m):
    ours = build("1f1b", p, m)
    for s in range(p):
        theirs = [("F" if fwd else "B", mb) for mb, fwd, _ in _steps(p, m, s) if mb >= 0]
        assert theirs == [(op.kind, op.microbatch) for op in ours.orders[s]]


@settings(max_examples=60, deadline=None)
@given(p=st.integers(1, 10), m=st.integers(1, 30), f=st.integers(1, 9), b=st.integers(1, 19))
def test_its_blocking_exchanges_cost_nothing_when_they_take_no_time(p, m, f, b):
    """The pairwise waits of the lock-step exchanges add no idle time to 1F1B's: the makespan is
    the engine's for 1F1B, (m + p − 1)(F + B) with uniform stages."""
    f, b = Fraction(f, 4), Fraction(b, 4)
    engine = simulate(build("1f1b", p, m), Timing(forward=f, backward=b)).makespan
    assert _lockstep_makespan(p, m, f, b) == engine == (m + p - 1) * (f + b)


def test_each_exchange_sends_then_receives_twice_megatrons_time():
    for name in ("megatron-deepspeed", "megatron-deepspeed-2022", "deepspeed-zero3"):
        assert exchange_time(0.25, framework(name)) == 0.5
    for name in ("megatron-2021", "megatron-2022", "megatron-core", "nemo", "fsdp"):
        assert exchange_time(0.25, framework(name)) == 0.25


def test_the_deepspeed_rows_pay_twice_the_blocking_transfers():
    """BLOOM (pp 12 over Omni-Path) on its preset against the same run on Megatron-LM 2022's,
    which differs from it in the BF16 optimizer's accumulation and in the exchanges: the pipeline
    transfers held double."""
    from modelcut.service.predict import PredictRequest, catalog_run, predict
    pr, run, settings_ = catalog_run("bloom-176b-384", "default")
    assert settings_["framework"] == "megatron-deepspeed-2022"
    ds = predict(PredictRequest(run, framework="megatron-deepspeed-2022")).prediction
    mg = predict(PredictRequest(run, framework="megatron-2022")).prediction
    assert mg.breakdown.p2p_s > 0.5
    assert abs(ds.breakdown.p2p_s - 2 * mg.breakdown.p2p_s) < 1e-9 * ds.breakdown.p2p_s
    said = [n for n in ds.notes if "send and then a receive" in n]
    assert len(said) == 1 and not any("send and then a receive" in n for n in mg.notes)
