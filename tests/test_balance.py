"""The pipeline's balance: each device's op time over the step (``device_busy_s``), the note a
prediction gives where the busiest device works well above the others, and the explorer's "why"
naming it."""

from __future__ import annotations

import json

from hypothesis import given, settings, strategies as st

from modelcut import catalog
from modelcut.cli import main
from modelcut.core.plan import resolve
from modelcut.core.specs import Layout, Run, Training
from modelcut.core.step.balance import UNEVEN_SHARE, pipeline_balance
from modelcut.core.step.default import predict
from modelcut.service.explore import why_text
from modelcut.service.predict import efficiency_for, published_prediction

LLAMA8 = catalog.model("llama3-8b")


def test_nemotron_22b_last_rank_carries_the_output_layer():
    """NeMo 24.07's Nemotron-22B (tp 2, pp 4, vpp 10: one layer a chunk) puts its 256,000-word
    output layer and loss on the last rank beside its 10 layers: that rank works about a third
    more than the average, and the prediction says so."""
    pred = published_prediction("nemo2407-nemotron-22b-64").prediction
    busy = pred.device_busy_s
    assert len(busy) == 4
    assert max(range(4), key=lambda i: busy[i]) == 3
    assert max(busy) <= pred.step_time_s
    u = pipeline_balance(pred.plan, busy)
    assert u is not None and u.device == 3 and u.loss and not u.embedding and u.layers == 10
    assert 0.25 < u.excess < 0.5
    note = [n for n in pred.notes if n.startswith("pipeline rank 3 works")]
    assert note and "the output layer and loss" in note[0]


def test_even_pipeline_gives_no_note():
    """Llama 3 405B as Meta ran it (one layer fewer on the first and last stages) is within
    :data:`UNEVEN_SHARE` of even; without a pipeline there is one device and nothing to compare."""
    pred = published_prediction("llama3-405b-8k-8192").prediction
    assert len(pred.device_busy_s) == 16
    assert max(pred.device_busy_s) <= (1 + UNEVEN_SHARE) * sum(pred.device_busy_s) / 16
    assert not any(n.startswith("pipeline rank") for n in pred.notes)
    one = published_prediction("nemo2407-llama2-7b-8").prediction
    assert len(one.device_busy_s) <= 1 and pipeline_balance(one.plan, one.device_busy_s) is None


def test_balance_needs_one_figure_a_device():
    plan = resolve(LLAMA8, Layout(pp=4, dp=2), Training(seq_len=8192, global_batch=16), v=1)
    assert pipeline_balance(plan, (1.0, 1.0, 1.0)) is None          # not one a device
    assert pipeline_balance(plan, (1.0, 1.0, 1.0, 1.04)) is None    # within the threshold
    u = pipeline_balance(plan, (1.0, 1.0, 1.0, 2.0))
    assert u.device == 3 and u.loss and u.layers == 8 and abs(u.mean_s - 1.25) < 1e-12
    assert "+60%" in u.sentence()


@settings(max_examples=20, deadline=None)
@given(pp=st.sampled_from([2, 4, 8]), v=st.sampled_from([1, 2]), mb=st.sampled_from([1, 2]),
       m=st.sampled_from([8, 16]))
def test_busy_per_device_is_within_the_step(pp, v, mb, m):
    """Every pipeline device's op time is at most the step (ops plus waits plus the bubble)."""
    hw = catalog.hardware("h100")
    run = Run(model=LLAMA8, gpu=hw.name, layout=Layout(pp=pp, dp=16 // pp * 2, vpp=v if v > 1 else None),
              training=Training(seq_len=4096, global_batch=mb * m * (16 // pp * 2), micro_batch=mb))
    pred = predict(run, hw, efficiency_for(hw), catalog.framework("megatron-core"))
    assert len(pred.device_busy_s) == pp
    assert all(0 < b <= pred.step_time_s * (1 + 1e-9) for b in pred.device_busy_s)


def test_explorer_why_names_the_uneven_rank(capsys):
    """A checked layout with a pipeline: the explanation names its busiest rank and what it holds;
    the JSON carries it as ``why.pipeline``."""
    assert main(["explore", "--model", "llama3-8b", "--gpu", "h100", "--gpus", "64", "--seq", "8192",
                 "--global-batch-tokens", "2M", "--json", "--top", "2", "--check", "tp=1,pp=8"]) == 0
    out = json.loads(capsys.readouterr().out)
    u = out["check"]["why"]["pipeline"]
    assert u["device"] == 7 and u["busy_s"] > u["mean_s"] and "output layer and loss" in u["holds"]
    assert f"its pipeline rank 7 works {u['busy_s']:.3f} s" in out["check"]["why"]["text"]
    w = {"knobs": {}, "step_time_s": (1.0, 1.0), "time_terms": [], "memory_terms": [], "pipeline": None}
    assert "pipeline rank" not in why_text(w)


def test_run_all_row_names_the_uneven_rank():
    """``explore --run all``'s row for a published layout with an uneven pipeline carries its busiest
    rank (Megatron-Bridge's Llama 3 70B on 64 H100: the last of 8 ranks holds the output layer and
    loss beside its 10 layers)."""
    from modelcut.service.explore import catalog_request, check_row, run_explore
    row = check_row(run_explore(catalog_request("mbridge2511-llama3-70b-64", "default", 1)))
    u = row["pipeline"]
    assert u["device"] == 7 and "output layer and loss" in u["holds"] and u["busy_s"] > 1.05 * u["mean_s"]
