"""The explorer's per-layer variant (``every``): torchtitan's selective checkpointing of one block in
k on each rank (``selective_ac_option = "k"``), k the most with which a layout fits, found per
layout on the memory model (by bisection where memory never falls as k grows); searched where the stack offers it (the FSDP presets)."""

from __future__ import annotations

import json
import re
from functools import lru_cache

import pytest
from hypothesis import given, settings, strategies as st

from modelcut import catalog
from modelcut.cli import main
from modelcut.core.errors import ModelcutError
from modelcut.core.explore import Space, explore, make_run
from modelcut.core.explore.search import no_more_recomputed
from modelcut.core.explore.space import Structure
from modelcut.core.memory import memory_plan, peak_bytes, stage_memory, variant_peaks
from modelcut.core.specs import BLOCKS, EVERY, RECOMPUTE_VARIANTS
from modelcut.export.emit import torchtitan_toml
from modelcut.service.explore import predictor, timed_by

from helpers import FlatStep, assert_partial_beats_full

A100_40 = catalog.hardware("a100-sxm4-40gb")
LLAMA1 = catalog.model("llama3.2-1b")
LLAMA8 = catalog.model("llama3-8b")


def test_the_variant_sits_between_selective_and_full_and_makes_its_run():
    assert RECOMPUTE_VARIANTS.index("selective") < RECOMPUTE_VARIANTS.index(EVERY) < RECOMPUTE_VARIANTS.index("full")
    s = Structure(tp=1, cp=1, pp=1, dp=8, micro_batch=1, schedule="1f1b", vpp=1)
    run = make_run(LLAMA8, "h100", s, 4096, 64, EVERY, 3, count=4)
    assert (run.training.recompute, run.training.recompute_every, run.training.recompute_layers) == ("full", 4, None)
    assert make_run(LLAMA8, "h100", s, 4096, 64, "full", 3, count=4).training.recompute_every is None
    # compared with none and full only: it redoes more than none and less than full
    assert no_more_recomputed("none", EVERY) and no_more_recomputed(EVERY, "full")
    assert not no_more_recomputed(EVERY, BLOCKS) and not no_more_recomputed(BLOCKS, EVERY)
    assert not no_more_recomputed(EVERY, "selective") and not no_more_recomputed("selective", EVERY)


@settings(max_examples=10, deadline=None)
@given(margin=st.floats(0.0, 0.3), seq=st.sampled_from([8192, 16384]))
def test_it_finds_the_most_k_that_fits_without_a_pipeline(margin, seq):
    """Each every layout without a pipeline that fits does so with one layer in k recomputed and not
    with one in k + 1 (or k is the most a rank's layers allow); its peak is stage_memory's for its run."""
    caps = catalog.capabilities("fsdp-compile")
    ex = explore(LLAMA1, A100_40, lambda run, h: FlatStep(), margin=margin, prune=False, keep=10_000, gpus=2, seq=seq,
                 global_batch_tokens=8 * seq, capabilities=caps,
                 space=Space(micro_batches=(1,), schedules=("1f1b",)))
    every = [e for e in ex.layouts if e.recompute == EVERY and e.structure.pp == 1]
    assert every
    for e in every:
        k = e.run.training.recompute_every
        assert 2 <= k <= LLAMA1.layers
        assert e.peak_bytes == pytest.approx(peak_bytes(stage_memory(e.run, plan=e.plan, cached=False)))
        assert e.peak_bytes <= ex.limit_bytes
        if k < LLAMA1.layers:
            more = make_run(LLAMA1, A100_40.name, e.structure, seq, 8, EVERY, e.zero, count=k + 1)
            assert peak_bytes(stage_memory(more, plan=e.plan)) > ex.limit_bytes


@lru_cache(maxsize=None)
def _tight():
    """Llama 3 8B on 8 A100-40GB at 16K tokens under fsdp-compile: nothing fits without recomputation."""
    fw = catalog.framework("fsdp-compile")
    return explore(LLAMA8, A100_40, predictor("default", A100_40, fw), gpus=8, seq=16384,
                   global_batch_tokens=8 * 16384, capabilities=catalog.capabilities("fsdp-compile"),
                   space=Space(micro_batches=(1,), schedules=("1f1b",)), prune=False, keep=10_000)


def test_a_layout_that_fits_with_some_layers_whole_beats_full_recomputation():
    assert_partial_beats_full(_tight(), EVERY)


def test_the_layout_reports_and_emits_its_k():
    e = next(e for e in _tight().layouts if e.recompute == EVERY)
    k = e.run.training.recompute_every
    d = e.as_dict()
    assert d["recompute"] == EVERY and d["recompute_every"] == k and d["recompute_layers"] is None
    assert f'[activation_checkpoint]\nmode = "selective"\nselective_ac_option = "{k}"' in torchtitan_toml(e)


def test_only_the_fsdp_presets_offer_it():
    for name in ("fsdp", "fsdp-compile"):
        assert EVERY in catalog.capabilities(name).recompute
    for name in ("megatron-2022", "megatron-core", "nemo", "megatron-bridge", "deepspeed-zero3", "llm-foundry",
                 "nemo-automodel"):
        assert EVERY not in catalog.capabilities(name).recompute


@pytest.mark.parametrize("variant", [BLOCKS, EVERY])
def test_the_seed_model_leaves_the_partial_variants_out_and_a_seed_check_of_one_is_one_line(capsys, variant):
    """The seed model recomputes every layer or none: a seed search leaves both partial variants out,
    and a seed check naming one is refused in one line."""
    assert variant not in timed_by(Space(), "seed").recomputes and variant in timed_by(Space(), "default").recomputes
    assert main(["explore", "--model", "llama3-8b", "--gpu", "a100-sxm4-40gb", "--gpus", "8", "--seq", "32768",
                 "--global-batch-tokens", "1M", "--mode", "seed", "--json"]) == 0
    layouts = json.loads(capsys.readouterr().out)["layouts"]
    assert layouts and all(x["recompute"] != variant for x in layouts)
    assert main(["explore", "--model", "llama3-8b", "--gpu", "a100-sxm4-40gb", "--gpus", "8", "--seq", "32768",
                 "--global-batch-tokens", "1M", "--mode", "seed", "--check", f"recompute={variant}"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "seed model recomputes every layer or none" in err


@pytest.mark.parametrize("variant, field", [(BLOCKS, "recompute_layers"), (EVERY, "recompute_every")])
def test_the_shared_path_refuses_a_partial_variant_without_its_count(variant, field):
    s = Structure(tp=1, cp=1, pp=2, dp=4, micro_batch=1, schedule="1f1b", vpp=1)
    run = make_run(LLAMA8, "h100", s, 4096, 64, "none", 1)
    with pytest.raises(ModelcutError, match=field):
        variant_peaks(run, memory_plan(run), [(variant, 1)])


def test_the_cli_names_k(capsys):
    assert main(["explore", "--model", "llama3-8b", "--gpu", "h100", "--gpus", "8", "--seq", "16384",
                 "--global-batch-tokens", "256K", "--framework", "torchtitan", "--top", "3",
                 "--check", "tp=1,cp=1,pp=1,dp=8,recompute=every"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "recomputation variants none, selective, every, full" in out
    assert "recompute=every: best such layout ranks" in out
    assert re.search(r"recompute \S+ vs every \d+", out)      # the explanation names the k


def test_where_memory_does_not_rise_with_k_the_most_k_that_fits_is_found():
    """On a model whose layers differ (every other one a mixture of experts, as Llama 4 Maverick's),
    which blocks are the multiples of k matters, not only how many: memory does not rise with k
    everywhere. With the limit at k = 6's peak, k = 6 is the most that fits; bisection over 12 … 2
    would stop at 4 (it tries 7, then 5, then 4), so the explorer tries such a model's k one after
    another from the most down."""
    from modelcut.core.specs import ModelSpec
    m = ModelSpec(name="alt-moe", layers=12, hidden=1024, ffn_hidden=4096, heads=16, kv_heads=8, vocab=32000,
                  experts=8, top_k=2, expert_ffn_hidden=4096, moe_every=2, gated_mlp=True)
    s = Structure(tp=1, cp=1, pp=1, dp=2, micro_batch=1, schedule="1f1b", vpp=1)
    plan = memory_plan(make_run(m, A100_40.name, s, 8192, 8, "none", 3))
    peak = {k: peak_bytes(stage_memory(make_run(m, A100_40.name, s, 8192, 8, EVERY, 3, count=k), plan=plan))
            for k in range(2, 13)}
    assert any(peak[k] > peak[k + 1] for k in range(2, 12))          # memory does not rise with k everywhere
    limit = peak[6] * (1 + 1e-9)
    fits = [k for k in peak if peak[k] <= limit]
    assert max(fits) == 6 and peak[7] > limit and peak[4] <= limit and peak[5] > limit
    ex = explore(m, A100_40, lambda run, h: FlatStep(), margin=1 - limit / A100_40.mem_bytes, prune=False,
                 keep=10_000, gpus=2, seq=8192, global_batch_tokens=8 * 8192,
                 capabilities=catalog.capabilities("fsdp-compile"),
                 space=Space(micro_batches=(1,), schedules=("1f1b",), zeros=(3,), eps=(1,)))
    found = [e for e in ex.layouts if e.recompute == EVERY and e.structure == s]
    assert [e.run.training.recompute_every for e in found] == [6]
