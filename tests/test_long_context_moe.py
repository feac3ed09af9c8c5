"""Long-context and mixture-of-experts runs through the step model and the CLI (issue 8):
context parallelism's two forms, the expert all-to-all, DualPipe, the catalog run and RUN.toml
settings, and `predict --json`'s memory."""

from __future__ import annotations

import json
from dataclasses import replace
from pathlib import Path

import pytest

from modelcut import catalog
from modelcut.cli import main
from modelcut.core.costs import comm, context, moe
from modelcut.core.errors import ModelcutError
from modelcut.core.memory import memory_report
from modelcut.core.step.checks import check_run
from modelcut.service.runfile import load_run, load_run_with_settings as load_runfile
from helpers import predict_default, predict_seed


class stepmodel:
    """The step models as the CLI runs them: the seed with its fitted η, the default model with the
    shipped profile and the default preset."""

    check_run = staticmethod(check_run)

    @staticmethod
    def predict(run, hw, mode="seed"):
        return predict_seed(run, hw) if mode == "seed" else predict_default(run, hw)

    @staticmethod
    def default_eta():
        from modelcut.analysis.validation import seed_eta
        return seed_eta()

LONG = "tests/data/llama3-405b-128k.toml"
DSV3 = "tests/data/deepseek-v3-2048.toml"
H100 = catalog.hardware("h100")


def cli_json(capsys, *argv) -> dict:
    assert main(list(argv) + ["--json"]) == 0
    return json.loads(capsys.readouterr().out)


@pytest.mark.parametrize("mode", ["seed", "default"])
def test_predict_shows_the_cp_and_all_to_all_terms(capsys, mode):
    """Sequence 128K over cp 16 and a DeepSeek-V3-shaped run over ep 64 and pp 16: the breakdown
    carries the context-parallel and all-to-all terms and sums to the step; memory comes along."""
    long = cli_json(capsys, "predict", LONG, "--mode", mode)
    assert long["breakdown"]["cp_s"] > 0 and long["breakdown"]["a2a_s"] == 0
    ds = cli_json(capsys, "predict", DSV3, "--mode", mode)
    assert ds["breakdown"]["a2a_s"] > 0.1 * ds["step_time_s"] and ds["breakdown"]["cp_s"] == 0
    for d in (long, ds):
        assert sum(d["breakdown"].values()) == pytest.approx(d["step_time_s"], rel=1e-9)
        mem = d["memory"]
        assert mem["peak_bytes"] == max(s["total_bytes"] for s in mem["stages"]) and "fits" in mem
        assert len(mem["stages"]) == 16
    assert main(["predict", DSV3, "--mode", mode]) == 0
    text = capsys.readouterr().out
    assert "a2a" in text and "peak memory" in text


def test_seed_all_to_all_is_moe_comm():
    """Seed: per MoE layer and micro-batch, the forward's dispatch and combine and the backward's,
    from moe.moe_comm over the ep group with its node-mates read off the rank order."""
    run = load_run(DSV3)
    pred = stepmodel.predict(run, H100)
    L = run.layout
    local = comm.group_members_in_node(L, "ep", 8)
    assert local == 8   # Megatron-core's order keeps 8 ep ranks in a node
    mc = moe.moe_comm(run.model, 4096, ep=64, link_bw=H100.link_bw, net_bw=H100.net_bw, local=local)
    # the busiest device holds 4 MoE layers (61 layers over 16 stages: 3, 3, 4, …, 4, 3; the first 3 dense)
    assert max(pred.stage_layers) == 4 and pred.stage_layers[0] == run.model.dense_layers
    assert pred.breakdown.a2a_s == pytest.approx(pred.microbatches * 4 * 2 * mc.a2a_fwd_s)
    # Llama 3's order instead puts each ep rank on its own node: slower
    spread = stepmodel.predict(run.with_layout(order=("tp", "cp", "pp", "dp")), H100)
    assert spread.breakdown.a2a_s > pred.breakdown.a2a_s


def test_seed_ring_cp_is_what_the_ring_exposes():
    """Seed, ring form: the cp term is context.cp_attention's exposed time at η·peak; the all-gather
    form keeps the seed's figure (the deck's row)."""
    run, _ = load_runfile(Path(LONG))
    ag = stepmodel.predict(run, H100)
    ring = stepmodel.predict(run.with_layout(cp_kind="ring"), H100)
    eta = stepmodel.default_eta()
    att = context.cp_attention(run.model, micro_batch=1, seq=131072, cp=16, kind="ring", bw=H100.net_bw,
                               attention_flops_per_s=eta * H100.peak_flops_16, t=8)
    # 126 layers + embedding and output slots over 16 × 8 chunks: every device runs 8 slots of a layer's cost
    assert ring.vpp == 8 and len(ring.stage_layers) == 128
    assert ring.breakdown.cp_s == pytest.approx(ring.microbatches * 8 * att.exposed_s, rel=1e-9)
    assert 0 < ring.breakdown.cp_s < ag.breakdown.cp_s
    assert ring.breakdown.compute_s == ag.breakdown.compute_s


def test_catalog_run_predicts_as_validate_does(capsys):
    """`predict --run ID` is validate's row: the Llama 3 128K row within 7 % in the default
    model (too slow: see tests/test_default_model.py DECK_OUTSIDE); the RUN.toml stating the
    same settings ([settings] framework) gives the same step."""
    by_run = cli_json(capsys, "predict", "--run", "llama3-405b-128k-16384", "--mode", "default")
    val = cli_json(capsys, "validate", "--mode", "default")
    row = next(r for r in val["runs"] if r["id"] == "llama3-405b-128k-16384")
    assert by_run["step_time_s"] == pytest.approx(row["default"]["step_time_s"], rel=1e-12)
    assert by_run["published"]["error_pct"] == pytest.approx(row["default"]["error_pct"], rel=1e-9)
    assert abs(by_run["published"]["error_pct"]) <= 7.0
    by_file = cli_json(capsys, "predict", LONG, "--mode", "default")
    assert by_file["step_time_s"] == pytest.approx(by_run["step_time_s"], rel=1e-12)
    assert "framework llama3" in by_file["notes"]
    seed = cli_json(capsys, "predict", "--run", "llama3-405b-128k-16384", "--mode", "seed")
    seed_row = next(r for r in cli_json(capsys, "validate")["runs"] if r["id"] == "llama3-405b-128k-16384")
    assert seed["step_time_s"] == pytest.approx(seed_row["step_time_s"], rel=1e-12)


@pytest.mark.parametrize("argv, needle", [
    (["predict"], "one of the two"),
    (["predict", LONG, "--run", "llama3-405b-128k-16384"], "one of the two"),
    (["predict", "--run", "no-such-run"], "unknown published run"),
    (["predict", "--run", "automodel-qwen3-30b-a3b"], "closest: automodel-qwen3-30b-a3b-8"),
])
def test_predict_input_errors(capsys, argv, needle):
    assert main(argv) == 2
    err = capsys.readouterr().err
    assert needle in err and len(err.strip().splitlines()) == 1


def test_runfile_settings_table(tmp_path, capsys):
    text = open(LONG).read()
    bad = tmp_path / "bad.toml"
    bad.write_text(text.replace('framework = "llama3"', 'framework = "llama3"\nspeed = "fast"'))
    assert main(["predict", str(bad), "--mode", "default"]) == 2
    assert "unknown key 'speed'" in capsys.readouterr().err
    plain = tmp_path / "plain.toml"
    plain.write_text(text.replace('[settings]\nframework = "llama3"\n', ""))
    a = cli_json(capsys, "predict", str(plain), "--mode", "default", "--framework", "llama3")
    b = cli_json(capsys, "predict", LONG, "--mode", "default")
    assert a["step_time_s"] == b["step_time_s"]
    # the command-line flag overrides the file
    c = cli_json(capsys, "predict", LONG, "--mode", "default", "--framework", "megatron-core")
    assert c["step_time_s"] != b["step_time_s"]


def test_seed_falls_back_from_interleaving_megatron_refuses():
    """DeepSeek-V3's 120 micro-batches over 16 stages: the seed's default v = 3 needs m a multiple of
    p; it runs 1F1B and says so. A run that asks for the interleaved schedule still gets the error."""
    run = load_run(DSV3)
    pred = stepmodel.predict(run, H100)
    assert pred.schedule == "1f1b" and pred.vpp == 1
    assert any("1F1B instead" in n for n in pred.notes)
    with pytest.raises(ModelcutError, match="interleaved"):
        stepmodel.predict(run.with_layout(schedule="interleaved", vpp=3), H100)


@pytest.mark.parametrize("mode", ["seed", "default"])
def test_dualpipe_runs_two_copies(mode):
    """DualPipe's stages are two copies of the p-stage split; each device does a 1F1B device's work
    (the same compute); in the default model its F&B pairs hide all-to-all behind compute."""
    run = load_run(DSV3)
    one = stepmodel.predict(run.with_layout(schedule="1f1b"), H100, mode)
    dual = stepmodel.predict(run.with_layout(schedule="dualpipe"), H100, mode)
    assert dual.stage_layers == one.stage_layers * 2 and dual.vpp == 2
    assert dual.breakdown.compute_s == pytest.approx(one.breakdown.compute_s, rel=1e-9)
    assert dual.breakdown.total_s == pytest.approx(dual.step_time_s, rel=1e-9)
    if mode == "default":
        assert dual.breakdown.a2a_s < one.breakdown.a2a_s and dual.step_time_s < one.step_time_s
    else:   # the seed overlaps nothing
        assert dual.breakdown.a2a_s == pytest.approx(one.breakdown.a2a_s, rel=1e-9)
    mem = memory_report(run.with_layout(schedule="dualpipe"), H100, plan=dual.plan)
    one_mem = memory_report(run.with_layout(schedule="1f1b"), H100, plan=one.plan)
    w = [s["weights_bytes"] for s in one_mem["stages"]]
    assert [s["weights_bytes"] for s in mem["stages"]] == pytest.approx([w[d] + w[15 - d] for d in range(16)])
    v = stepmodel.predict(run.with_layout(schedule="dualpipev"), H100, mode)
    assert len(v.stage_layers) == 32 and sum(v.stage_layers) == run.model.layers


def test_check_run_takes_the_moe_checks():
    run = load_run(DSV3)
    with pytest.raises(ModelcutError, match="etp"):
        stepmodel.check_run(run.with_layout(etp=3))
    with pytest.raises(ModelcutError, match="divide the experts"):
        stepmodel.check_run(run.with_layout(ep=3))
    dense = replace(run, model=catalog.model("llama3-8b"))
    with pytest.raises(ModelcutError, match="dense"):
        stepmodel.check_run(dense)


def test_explore_takes_both_runs(capsys):
    """The explorer on the DeepSeek-V3-shaped run (ep 64, pp 16 among the layouts, with its
    all-to-all term) and on a 128K sequence (cp 16 in both forms, with its cp term)."""
    ds = cli_json(capsys, "explore", "--model", "deepseek-v3", "--gpu", "h100", "--gpus", "2048", "--seq", "4096",
                  "--global-batch-tokens", "62914560", "--micro-batches", "1", "--schedules", "1f1b,dualpipe",
                  "--eps", "64", "--check", "ep=64,pp=16", "--top", "3")
    best = ds["check"]["best"]
    assert best["ep"] == 64 and best["pp"] == 16 and best["breakdown"]["a2a_s"] > 0
    assert best["order"] == ["tp", "cp", "ep", "dp", "pp"]
    lc = cli_json(capsys, "explore", "--model", "llama3-8b", "--gpu", "h100", "--gpus", "256", "--seq", "131072",
                  "--global-batch-tokens", "4M", "--micro-batches", "1", "--schedules", "1f1b",
                  "--check", "cp=16", "--top", "3")
    c = lc["check"]["best"]
    assert c["cp"] == 16 and c["cp_kind"] in ("ring", "allgather", "a2a+p2p") and c["breakdown"]["cp_s"] > 0


def test_a_run_left_out_of_validation_says_why(capsys):
    """`predict --run` on a published run validation leaves out prints the reason's first clause
    (catalog notes): the Megatron-Bridge Qwen3 30B row, a known software regression; a validated
    row gets no such note."""
    left = cli_json(capsys, "predict", "--run", "mbridge2511-qwen3-30b-a3b-16", "--mode", "default")
    why = [n for n in left["notes"] if n.startswith("left out of validation")]
    assert len(why) == 1 and "issue 1998" in why[0] and why[0].endswith("(catalog/runs.toml notes)")
    assert "error_pct" in left["published"]                           # still compared with what was published
    kept = cli_json(capsys, "predict", "--run", "mbridge2511-gpt-oss-120b-64", "--mode", "default")
    assert not any(n.startswith("left out of validation") for n in kept["notes"])
