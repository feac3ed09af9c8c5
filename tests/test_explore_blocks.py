"""The explorer's block-method variant (``blocks``): full recomputation of the fewest layers of each
pipeline chunk with which a layout fits (Megatron-core's --recompute-method block
--recompute-num-layers N), found per layout by bisection on the memory model."""

from __future__ import annotations

from functools import lru_cache

import pytest
from hypothesis import given, settings, strategies as st

from modelcut import catalog
from modelcut.cli import main
from modelcut.core.explore import Space, explore, make_run
from modelcut.core.explore.space import Structure
from modelcut.core.memory import peak_bytes, stage_memory
from modelcut.core.specs import BLOCKS, RECOMPUTE_VARIANTS
from modelcut.export.emit import megatron_args, nemo_overrides, torchtitan_toml
from modelcut.service.explore import predictor

from helpers import FlatStep, assert_partial_beats_full

A100_40 = catalog.hardware("a100-sxm4-40gb")
LLAMA1 = catalog.model("llama3.2-1b")
LLAMA8 = catalog.model("llama3-8b")


def _memory_only(model, hw, margin: float, **kw):
    return explore(model, hw, lambda run, h: FlatStep(), margin=margin, prune=False, keep=10_000, **kw)


def test_the_variant_sits_between_selective_and_full():
    assert RECOMPUTE_VARIANTS.index("selective") < RECOMPUTE_VARIANTS.index(BLOCKS) < RECOMPUTE_VARIANTS.index("full")
    s = Structure(tp=1, cp=1, pp=2, dp=4, micro_batch=1, schedule="1f1b", vpp=1)
    run = make_run(LLAMA8, "h100", s, 4096, 64, BLOCKS, 1, count=3)
    assert (run.training.recompute, run.training.recompute_layers) == ("full", 3)
    assert make_run(LLAMA8, "h100", s, 4096, 64, "full", 1, count=3).training.recompute_layers is None


@settings(max_examples=12, deadline=None)
@given(margin=st.floats(0.0, 0.3), seq=st.sampled_from([8192, 16384]))
def test_it_finds_the_fewest_layers_that_fit(margin, seq):
    """Each blocks layout that fits does so with its N layers a chunk recomputed and not with N − 1
    (N is 1, or N − 1 does not fit), N short of a whole chunk; its peak is stage_memory's for its run.
    Llama 3.2 1B on two A100-40GB at these margins holds such layouts (at least one each)."""
    ex = _memory_only(LLAMA1, A100_40, margin, gpus=2, seq=seq, global_batch_tokens=8 * seq,
                      space=Space(micro_batches=(1,), schedules=("1f1b",)))
    blocks = [e for e in ex.layouts if e.recompute == BLOCKS]      # every variant that fits (prune=False)
    assert blocks
    for e in blocks:
        n = e.run.training.recompute_layers
        assert 1 <= n < max(s.layers for s in e.plan.stages)
        assert e.peak_bytes == pytest.approx(peak_bytes(stage_memory(e.run, plan=e.plan, cached=False)))
        assert e.peak_bytes <= ex.limit_bytes
        if n > 1:
            fewer = make_run(LLAMA1, A100_40.name, e.structure, seq, 8, BLOCKS, e.zero, count=n - 1)
            assert peak_bytes(stage_memory(fewer, plan=e.plan)) > ex.limit_bytes


@lru_cache(maxsize=None)
def _tight():
    """Llama 3 8B on 8 A100-40GB at 32K tokens: nothing fits without recomputation; the default model
    on Megatron-core's stack."""
    fw = catalog.framework("megatron-core")
    return explore(LLAMA8, A100_40, predictor("default", A100_40, fw), gpus=8, seq=32768,
                   global_batch_tokens=32 * 32768, capabilities=catalog.capabilities("megatron-core"),
                   space=Space(micro_batches=(1,), schedules=("1f1b",)), prune=False, keep=10_000)


def test_a_tight_layout_recomputes_only_what_it_must_and_is_faster_for_it():
    """Where a layout fits with some layers whole, the explorer ranks it above the same layout with
    every layer recomputed (the block method redoes a subset of full recomputation's work)."""
    ex = _tight()
    best = ex.layouts[0]
    assert best.recompute == BLOCKS and best.run.training.recompute_layers is not None
    assert_partial_beats_full(ex, BLOCKS)


def test_the_layout_reports_and_emits_its_layers():
    e = _tight().layouts[0]
    n = e.run.training.recompute_layers
    d = e.as_dict()
    assert d["recompute"] == BLOCKS and d["recompute_layers"] == n
    assert f"--recompute-granularity full\n--recompute-method block\n--recompute-num-layers {n}" in megatron_args(e)
    assert f"model.config.recompute_method=block\nmodel.config.recompute_num_layers={n}" in nemo_overrides(e)
    assert f"# recompute_layers {n}" in torchtitan_toml(e)


def test_only_megatron_stacks_offer_it():
    for name in ("megatron-2022", "megatron-core", "nemo", "nemo-24.07", "megatron-bridge"):
        assert BLOCKS in catalog.capabilities(name).recompute
    for name in ("megatron-2021", "fsdp", "fsdp-compile", "llm-foundry", "deepspeed-zero3", "nemo-automodel"):
        assert BLOCKS not in catalog.capabilities(name).recompute


# The seed model's search without the variant, a seed check of it, and the shared path's refusal of
# it without its layers: tests/test_explore_every.py, for both partial variants.


def test_the_cli_table_names_the_layers(capsys):
    assert main(["explore", "--model", "llama3-8b", "--gpu", "a100-sxm4-40gb", "--gpus", "8", "--seq", "32768",
                 "--global-batch-tokens", "1M", "--top", "3"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "blocks " in out and "layers a chunk)" in out


def test_predict_notes_a_stack_without_the_block_method_in_its_own_words(tmp_path, capsys):
    """recompute_layers on torchtitan's stack: the prediction says the stack cannot run it, and the
    rule's source is printed as written (its ``[activation_checkpoint]`` is text, not markup)."""
    run = tmp_path / "run.toml"
    run.write_text('[model]\nname = "llama3-8b"\n[hardware]\ngpu = "h100-sxm5-80gb"\ngpus = 8\n[layout]\ntp = 1\n'
                   'pp = 1\ndp = 8\n[training]\nseq_len = 8192\nglobal_batch = 64\nmicro_batch = 1\n'
                   'recompute = "full"\nrecompute_layers = 5\n')
    assert main(["predict", str(run), "--framework", "fsdp"]) == 0
    out = " ".join(capsys.readouterr().out.split())
    assert "fsdp cannot run it: blocks recomputation" in out and "torchtitan [activation_checkpoint] mode" in out
    assert main(["predict", str(run), "--framework", "megatron-core"]) == 0
    assert "cannot run it" not in capsys.readouterr().out
