"""The explorer's module-list recomputation variant (``layernorm+moe_act``, Megatron-core's
--recompute-modules as Megatron-Bridge's MoE recipes name it): how a variant is named, that its
memory on the explorer's fast path is the memory ``predict`` counts, where it is tried and where a
stack's rules refuse it, and what the launch settings say."""

from __future__ import annotations

import pytest
from hypothesis import given, settings, strategies as st

from modelcut import catalog
from modelcut.core.errors import ModelcutError
from modelcut.core.explore import Space, explore, make_run
from modelcut.core.explore.space import Structure, recompute_choices
from modelcut.core.memory import memory_plan, peak_bytes, stage_memory, variant_peaks
from modelcut.core.specs import PARTIAL, RECOMPUTE_LEVELS, RECOMPUTE_VARIANTS, recompute_variant
from modelcut.export.emit import megatron_args, nemo_overrides, torchtitan_toml
from modelcut.service.explore import predictor, timed_by
from modelcut.service.requests import CheckIn

H100 = catalog.hardware("h100")
OSS = catalog.model("gpt-oss-120b")
QWEN = catalog.model("qwen3-30b-a3b")
LLAMA = catalog.model("llama3-8b")
MODULES = "layernorm+moe_act"
#: The variants whose peaks one shared run gives (blocks takes its layers from its own run).
SHARED = tuple(r for r in RECOMPUTE_VARIANTS if r not in PARTIAL)   # the partial variants make their own runs


def test_a_variant_is_a_level_or_selective_modules():
    for level in RECOMPUTE_LEVELS:
        assert recompute_variant(level) == (level, None)
    assert recompute_variant(MODULES) == ("selective", ("layernorm", "moe_act"))
    assert RECOMPUTE_VARIANTS.index(MODULES) == 1     # between none and selective: memory-bound work only
    for bad in ("mlp", "layernorm+mlp", "", "selective+full"):
        with pytest.raises(ModelcutError, match="recompute variant"):
            recompute_variant(bad)


def test_make_run_names_the_modules():
    s = Structure(tp=1, cp=1, pp=4, dp=16, micro_batch=1, schedule="1f1b", vpp=1, ep=8)
    tr = make_run(OSS, "h100", s, 4096, 512, MODULES, 1).training
    assert (tr.recompute, tr.recompute_modules) == ("selective", ("layernorm", "moe_act"))
    tr = make_run(OSS, "h100", s, 4096, 512, "selective", 1).training
    assert (tr.recompute, tr.recompute_modules) == ("selective", None)


def test_only_moe_models_try_the_module_list():
    assert MODULES in recompute_choices(OSS, Space())
    assert MODULES not in recompute_choices(LLAMA, Space())     # on a dense model it recomputes nothing
    assert recompute_choices(OSS, Space(recomputes=("none", "full"))) == ["none", "full"]


@settings(max_examples=25, deadline=None)
@given(model=st.sampled_from([OSS, QWEN]), pp=st.sampled_from([1, 2, 4]), ep=st.sampled_from([1, 8]),
       b=st.sampled_from([1, 2]), order=st.permutations(SHARED), zero=st.sampled_from([0, 1, 3]))
def test_the_fast_path_counts_what_predict_counts(model, pp, ep, b, order, zero):
    """Every variant's peak on the explorer's shared path equals stage_memory's for the run the
    variant makes, whichever variant the shared run was made from; the module list keeps no more
    than no recomputation and no less than full recomputation (blocks and every, whose count each
    layout finds, have their own runs: tests/test_explore_blocks.py, tests/test_explore_every.py)."""
    s = Structure(tp=1, cp=1, pp=pp, dp=64 // pp, micro_batch=b, schedule="1f1b", vpp=1, ep=ep)
    variants = [(r, zero) for r in order]
    base = make_run(model, "h100", s, 4096, 64 // pp * b * 4, order[0], zero)
    fast = variant_peaks(base, memory_plan(base), variants)
    for r, z in variants:
        run = make_run(model, "h100", s, 4096, 64 // pp * b * 4, r, z)
        assert fast[(r, z)] == pytest.approx(peak_bytes(stage_memory(run, cached=False)))
    assert fast[("full", zero)] <= fast[(MODULES, zero)] < fast[("none", zero)]


def _explore(model, framework, **kw):
    caps = catalog.capabilities(framework)
    return explore(model, H100, predictor("seed", H100), gpus=64, seq=4096, global_batch_tokens=512 * 4096,
                   capabilities=caps, space=timed_by(Space(micro_batches=(1,), **kw), "seed"), keep=50, prune=False)


def test_megatron_stacks_offer_it_and_the_fsdp_stacks_refuse_it():
    """Only stacks built on Megatron-core's layers run --recompute-modules (their rules list it); on
    another stack the variant is a rule rejection, never a ranked layout."""
    mc = _explore(OSS, "megatron-bridge", eps=(8,))
    assert any(e.recompute == MODULES for e in mc.layouts)
    for e in mc.layouts:
        if e.recompute == MODULES:
            assert e.run.training.recompute_modules == ("layernorm", "moe_act")
            assert e.as_dict()["recompute_modules"] == ["layernorm", "moe_act"]
    fs = _explore(OSS, "fsdp", eps=(8,))
    assert fs.layouts and all(e.recompute != MODULES for e in fs.layouts)
    assert fs.rule_rejections.get("recompute", 0) > 0
    for name in ("megatron-core", "nemo", "megatron-bridge"):
        assert MODULES in catalog.capabilities(name).recompute
    for name in ("fsdp", "fsdp-compile", "deepspeed-zero3", "megatron-2022", "nemo-24.07", "nemo-automodel"):
        assert MODULES not in catalog.capabilities(name).recompute


def test_launch_settings_name_the_modules():
    ex = _explore(OSS, "megatron-bridge", eps=(8,), recomputes=(MODULES,))
    e = ex.layouts[0]
    assert e.recompute == MODULES
    assert "--recompute-granularity selective\n--recompute-modules layernorm moe_act" in megatron_args(e)
    assert "model.config.recompute_modules=[layernorm,moe_act]" in nemo_overrides(e)
    assert 'mode = "selective"' in torchtitan_toml(e) and "torchtitan names no modules" in torchtitan_toml(e)


def test_a_query_may_name_the_variant():
    assert CheckIn.model_validate({"recompute": MODULES}).recompute == MODULES
    with pytest.raises(ValueError):
        CheckIn.model_validate({"recompute": "moe_act"})


@settings(max_examples=10, deadline=None)
@given(model=st.sampled_from([OSS, QWEN]), pp=st.sampled_from([1, 4]), b=st.sampled_from([1, 2]),
       seq=st.sampled_from([1024, 4096]))
def test_redoing_no_more_work_is_never_slower(model, pp, b, seq):
    """What pruning assumes, on the default model and a Megatron-core stack: a variant that redoes a
    subset of another's work never takes longer (none ≤ the module list ≤ full, selective ≤ full)."""
    from modelcut.core.explore.search import no_more_recomputed
    pred = predictor("default", H100, catalog.framework("megatron-bridge"))
    s = Structure(tp=1, cp=1, pp=pp, dp=64 // pp, micro_batch=b, schedule="1f1b", vpp=1, ep=8)
    times = {r: pred(make_run(model, "h100", s, seq, 64 // pp * b * 4, r, 1), H100).step_time_s
             for r in RECOMPUTE_VARIANTS}
    for a in RECOMPUTE_VARIANTS:
        for c in RECOMPUTE_VARIANTS:
            if no_more_recomputed(a, c):
                assert times[a] <= times[c] * (1 + 1e-9), (a, c, times)
    assert not no_more_recomputed(MODULES, "selective") and not no_more_recomputed("selective", MODULES)


def test_a_dense_model_check_of_the_module_list_is_one_line(capsys):
    from modelcut.cli import main
    assert main(["explore", "--model", "llama3-8b", "--gpu", "h100", "--gpus", "8", "--seq", "4096",
                 "--global-batch-tokens", "1M", "--check", "recompute=layernorm+moe_act"]) == 2
    err = capsys.readouterr().err.strip()
    assert len(err.splitlines()) == 1 and "on a dense model it recomputes nothing" in err
