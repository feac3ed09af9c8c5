"""DeepSpeed v0.3's ZeRO-3 hooks replayed (core/deepspeed_stage3.py): fetch, prefetch, release
by reuse distance, exposed reductions; and the default model's use of it."""

from __future__ import annotations

import pytest
from hypothesis import given, settings, strategies as st

from modelcut import catalog
from modelcut.catalog import profile_for
from modelcut.core.step import deepspeed_stage3 as ds
from helpers import predict_default as predict
from modelcut.core.errors import ModelcutError

BIG = 1e8      # elements: above the 5e7 prefetch bucket, below the 1e9 reuse distance


def w(name, numel=BIG, g=1.0, r=1.0):
    return ds.Weight(name, numel, g, r)


def test_compute_only_is_the_sum_of_kernels():
    trace = [ds.Step("a", (), 1.0), ds.Step("b", (), 2.0, True)]
    res = ds.replay(trace, {})
    assert res.step_s == 3.0 and res.compute_s == 3.0 and res.gathers == 0


def test_first_weight_is_fetched_then_the_next_one_prefetched_under_compute():
    weights = {"A": w("A", g=1.0), "B": w("B", g=2.0)}
    trace = [ds.Step("a", ("A",), 3.0), ds.Step("b", ("B",), 1.0)]
    res = ds.replay(trace, weights)
    # A's gather (1), then A's compute (3) with B's gather (2) under it, then B's compute (1)
    assert res.step_s == pytest.approx(1.0 + max(3.0, 2.0) + 1.0)
    assert res.gathers == 2
    no_prefetch = ds.replay(trace, weights, prefetch_numel=0.0)
    assert no_prefetch.step_s == pytest.approx(1.0 + 3.0 + 2.0 + 1.0)


def test_reuse_distance_decides_the_regather():
    """A weight used in the forward and again in the backward is kept when the weights used in
    between are fewer than stage3_max_reuse_distance elements, gathered again otherwise."""
    def run(between):
        weights = {"A": w("A"), "M": w("M", numel=between, g=0.0, r=0.0)}
        trace = [ds.Step("a", ("A",), 1.0), ds.Step("m", ("M",), 0.5), ds.Step("a", ("A",), 1.0, True)]
        return ds.replay(trace, weights)
    near, far = run(5e8), run(2e9)
    assert near.gathered_numel == BIG + 5e8
    assert far.gathered_numel == 2 * BIG + 2e9
    assert far.step_s > near.step_s


def test_most_elements_held_follow_fetch_prefetch_and_release():
    """What the hooks hold at once (memory's gathered weights): the running weight and its
    prefetch; without prefetch one at a time; a weight kept for its reuse counts until released."""
    weights = {"A": w("A"), "B": w("B", numel=2 * BIG)}
    trace = [ds.Step("a", ("A",), 1.0), ds.Step("b", ("B",), 1.0)]
    assert ds.replay(trace, weights).peak_resident_numel == 3 * BIG
    assert ds.replay(trace, weights, prefetch_numel=0.0).peak_resident_numel == 2 * BIG
    kept = {"A": w("A"), "M": w("M", numel=5e8)}
    trace = [ds.Step("a", ("A",), 1.0), ds.Step("m", ("M",), 0.5), ds.Step("a", ("A",), 1.0, True)]
    assert ds.replay(trace, kept, prefetch_numel=0.0).peak_resident_numel == BIG + 5e8


def test_reductions_wait_for_the_gradients_and_are_exposed():
    weights = {"A": w("A", g=0.0, r=2.0)}
    trace = [ds.Step("a", ("A",), 1.0, True), ds.Step("c", (), 5.0)]
    res = ds.replay(trace, weights)
    # the last bucket is reduced in the epilogue, after every kernel
    assert res.step_s == pytest.approx(1.0 + 5.0 + 2.0)
    big_bucket = {"A": w("A", numel=6e8, g=0.0, r=2.0), "B": w("B", numel=1e8, g=0.0, r=1.0)}
    trace = [ds.Step("a", ("A",), 1.0, True), ds.Step("b", ("B",), 1.0, True)]
    # B's gradient (at the end of B's kernels) overflows the 5e8 bucket holding A's: A is
    # reduced then, and B in the epilogue
    assert ds.replay(trace, big_bucket).step_s == pytest.approx(1.0 + 1.0 + 2.0 + 1.0)


def test_bad_input_is_named():
    with pytest.raises(ModelcutError, match="unknown weight"):
        ds.replay([ds.Step("a", ("X",), 1.0)], {})
    with pytest.raises(ModelcutError, match="non-negative"):
        ds.replay([ds.Step("a", (), -1.0)], {})


steps = st.lists(st.tuples(st.sampled_from(["A", "B", "C", None]), st.floats(0, 5), st.booleans()),
                 min_size=1, max_size=12)
times = st.tuples(st.floats(0, 5), st.floats(0, 5), st.floats(0, 5))


@settings(max_examples=150, deadline=None)
@given(steps, times, times, st.floats(1e7, 3e9))
def test_step_is_between_the_busiest_resource_and_everything_in_series(spec, gs, rs, numel):
    weights = {n: w(n, numel=numel, g=g, r=r) for n, g, r in zip("ABC", gs, rs)}
    trace = [ds.Step(f"m{i}", (n,) if n else (), c, b) for i, (n, c, b) in enumerate(spec)]
    res = ds.replay(trace, weights)
    assert res.step_s >= res.compute_s - 1e-9           # the kernels run one after another
    serial = res.compute_s + res.gathers * max(gs) + sum(1 for n, _, b in spec if n and b) * max(rs)
    assert res.step_s <= serial + 1e-9
    slower = {n: ds.Weight(n, x.numel, x.gather_s + 1.0, x.reduce_s) for n, x in weights.items()}
    assert ds.replay(trace, slower).step_s >= res.step_s - 1e-9


@pytest.mark.parametrize("rid", ["zero3-174.6b-384", "zero3-529.6b-640", "zero3-529.6b-2240"])
def test_zero3_rows_replay_the_2021_hooks(rid):
    """The deepspeed-zero3 preset replays the hooks and lands within 10 % of the published
    throughput with the shipped constants."""
    from modelcut.analysis.measured import catalog_measured, error_pct
    meas = next(m for m in catalog_measured("a100-sxm4-80gb") if m.id == rid)
    assert meas.framework == "deepspeed-zero3"
    p = predict(meas.run, meas.hw, profile_for(meas.hw).efficiency, meas.framework)
    assert any("DeepSpeed v0.3" in n for n in p.notes)
    assert abs(error_pct(meas, p)) < 10


def test_replay_refuses_mixture_of_experts():
    from modelcut.core.specs import Layout, Run, Training
    r = Run(model=catalog.model("mixtral-8x7b"), gpu="a100", layout=Layout(dp=16, zero=3),
            training=Training(seq_len=4096, global_batch=16, micro_batch=1, recompute="full"))
    hw = catalog.hardware("a100")
    with pytest.raises(ModelcutError, match="dense models only") as exc:
        predict(r, hw, profile_for(hw).efficiency, "deepspeed-zero3")
    # the line names the model and the way out
    assert "mixtral-8x7b is a mixture of experts" in str(exc.value) and "ZeRO stage below 3" in str(exc.value)
    below = Run(model=r.model, gpu="a100", layout=Layout(dp=16, zero=1), training=r.training)
    assert predict(below, hw, profile_for(hw).efficiency, "deepspeed-zero3").step_time_s > 0
