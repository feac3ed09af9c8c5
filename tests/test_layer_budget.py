"""``modelcut predict --layers``: one micro-batch's units itemised (core/step/layer_budget.py). The
lines must add up to what the pipeline's stages charge, products and attention never above their
peak, and the faces must show and refuse it as they show and refuse the rest."""

from __future__ import annotations

import json
import math

from hypothesis import HealthCheck, assume, given, settings

from modelcut import catalog
from modelcut.cli import main
from modelcut.core.costs import comm
from modelcut.core.errors import ModelcutError
from modelcut.core.step.default import default_plan, one_schedule_run, stack_run
from modelcut.core.step.layer_budget import LINE_KINDS, layer_budget
from modelcut.core.step.stage_costs import kernels, stage_costs

from test_mfu_bound import runs


def run_cli(capsys, *argv):
    code = main(list(argv))
    out, err = capsys.readouterr()
    return code, out, err


def _close(a: float, b: float) -> bool:
    return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-15)


@settings(max_examples=120, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(runs())
def test_the_lines_add_up_to_the_stages(case):
    """Each unit's lines sum to its forward and backward; the units, as many as the busiest device
    runs, sum to the busiest device's stages' compute, tensor-, context-parallel and all-to-all seconds
    (stage_costs' parts: what the pipeline is simulated with); every product and attention core
    runs at no more than its peak."""
    run, name = case
    hw = catalog.hardware(run.gpu)
    fw = catalog.framework(name)
    eff = catalog.profile_for(hw).efficiency
    try:
        lb = layer_budget(run, hw, eff, fw)
    except ModelcutError:
        assume(False)
        return
    assert lb.units
    for u in lb.units:
        assert (u.per_device >= 1 or u.unit in ("embedding", "logits and loss")) and u.lines
        assert _close(sum(ln.fwd_s for ln in u.lines), u.fwd_s)
        assert _close(sum(ln.bwd_s for ln in u.lines), u.bwd_s)
        for ln in u.lines:
            assert ln.kind in LINE_KINDS and ln.fwd_s >= 0 and ln.bwd_s >= 0
            peak = (hw.peak_flops_8 if ln.dtype == "fp8" else hw.peak_flops_16) / 1e12
            for rate in (ln.fwd_tflops, ln.bwd_tflops):
                assert rate is None or 0 < rate <= peak * (1 + 1e-9)
    # tied to the pipeline's stages: the same units, as many as the device runs
    r = one_schedule_run(stack_run(run, fw))
    plan = default_plan(r)
    bw = comm.group_bandwidths(r.layout, hw, r.gpus_per_node or hw.per_node, fw.multi_nic_rings)
    sc = stage_costs(r, hw, eff, fw, plan, kernels(r, hw, eff, fw, bw), bw)
    charged = [sum(sum(sc.parts[s.index][:4]) for s in plan.on_device(d)) for d in range(plan.p)]
    itemised = sum(u.per_device * (u.fwd_s + u.bwd_s) for u in lb.units)
    assert _close(itemised, max(charged))      # the busiest device's
    assert _close(sum(lb.by_kind().values()), itemised)
    dev = max(range(plan.p), key=lambda d: charged[d])
    layers = sum(u.per_device for u in lb.units if "layer" in u.unit)
    if _close(charged[dev], max(c for d, c in enumerate(charged) if d != dev) if plan.p > 1 else -1.0):
        return     # two devices alike to the last digit: either may be the one shown
    assert layers == sum(s.layers for s in plan.on_device(dev))


def test_a_dense_layers_products_are_its_four():
    """Llama 3 405B at tp 8: QKV [T, h] × [h, (q + 2·kv)/t], the projection, the gated MLP's fused up
    and its down product, each timed forward and backward; RoPE among the memory-bound lines."""
    run = catalog.published_run("llama3-405b-8k-8192").run
    hw = catalog.hardware(run.gpu)
    lb = layer_budget(run, hw, catalog.profile_for(hw).efficiency, catalog.framework("megatron-core"))
    dense = next(u for u in lb.units if u.unit == "dense layer")
    products = [ln for ln in dense.lines if ln.kind == "product"]
    assert [p.item for p in products] == ["qkv", "proj", "mlp up", "mlp down"]
    m = run.training.micro_batch * run.training.seq_len
    h, t = run.model.hidden, run.layout.tp
    assert products[0].shape == (m, (run.model.q_dim + 2 * run.model.kv_heads * run.model.d_head) // t, h, 1)
    assert products[3].shape[1:3] == (h, run.model.ffn_hidden // t)
    assert any(ln.item == "rotary embedding" for ln in dense.lines)


def test_predict_layers_prints_and_answers_json(capsys):
    code, out, _ = run_cli(capsys, "predict", "--run", "automodel-qwen3-30b-a3b-8", "--layers")
    assert code == 0
    assert "MoE layer × 48 on this device" in out
    assert "the micro-batch on this device, 1,596.7 ms: products 567.7 ms (36 %)" in out
    assert "expert all-to-all" in out and "token permutations" in out
    code, out, _ = run_cli(capsys, "predict", "--run", "automodel-qwen3-30b-a3b-8", "--layers", "--json")
    d = json.loads(out)
    moe = next(u for u in d["layers"]["units"] if u["unit"] == "MoE layer")
    up = next(ln for ln in moe["lines"] if ln["item"] == "expert up")
    assert up["count"] == 16 and up["dtype"] == "bf16" and up["fwd_tflops"] > 0
    # without --layers the answer has none
    code, out, _ = run_cli(capsys, "predict", "--run", "automodel-qwen3-30b-a3b-8", "--json")
    assert "layers" not in json.loads(out)


def test_layers_are_the_default_models_and_one_precisions(capsys):
    for args, words in ((["--mode", "seed"], "apply to --mode default"),
                        (["--precision", "bf16,fp8"], "(--layers, layers) takes one precision")):
        code, out, err = run_cli(capsys, "predict", "--run", "llama3-405b-8k-8192", "--layers", *args)
        assert code == 2 and out == ""
        assert err.count("\n") == 1 and words in err


def test_the_api_answers_layers_as_the_cli_does(capsys):
    """POST /api/predict with layers: the units predict --layers --json prints; with precisions, one line."""
    from fastapi.testclient import TestClient

    from modelcut.web import app as webapp
    from test_web_api import DATA, _predict_body
    toml_file = DATA / "llama3-70b-64-h100.toml"
    import tomllib
    body = {**_predict_body(toml_file), **tomllib.loads(toml_file.read_text()).get("settings", {}), "layers": True}
    with TestClient(webapp.create_app()) as client:
        r = client.post("/api/predict", json=body)
        assert r.status_code == 200, r.text
        web = r.json()["layers"]
        assert main(["predict", str(toml_file), "--layers", "--json"]) == 0
        assert web == json.loads(capsys.readouterr().out)["layers"]
        r = client.post("/api/predict", json={**body, "precisions": ["bf16", "fp8"]})
        assert r.status_code == 422 and "takes one precision" in r.json()["detail"]
        r = client.post("/api/predict", json={**body, "layers": "yes"})
        assert r.status_code == 422


def test_the_budget_follows_the_block_method():
    """Megatron-core's block method recomputes the first layers of each chunk and keeps the rest
    whole: two units, the kept one without a recomputed forward."""
    run = catalog.published_run("mbridge2511-llama3-8b-8").run
    st = catalog.run_settings()["mbridge2511-llama3-8b-8"]
    run = catalog.apply_settings(run, st)
    hw = catalog.hardware(run.gpu)
    lb = layer_budget(run, hw, catalog.profile_for(hw).efficiency, catalog.framework(st.framework))
    names = {u.unit: u for u in lb.units}
    assert set(names) >= {"dense layer, recomputed", "dense layer, kept whole"}
    assert names["dense layer, recomputed"].per_device == run.training.recompute_layers
    assert not any(ln.kind == "recompute" for ln in names["dense layer, kept whole"].lines)
    assert any(ln.kind == "recompute" for ln in names["dense layer, recomputed"].lines)


def test_the_docs_quote_what_predict_layers_prints(capsys):
    """docs/default-model.md's --layers table is the command's (spacing aside)."""
    import re
    from pathlib import Path
    text = (Path(__file__).resolve().parent.parent / "docs" / "default-model.md").read_text()
    block = text.split("$ modelcut predict --run automodel-qwen3-30b-a3b-8 --layers\n", 1)[1].split("```", 1)[0]
    quoted = [re.sub(r"\s+", " ", ln.strip()) for ln in block.splitlines() if ln.startswith("│")]
    assert len(quoted) >= 10
    code, out, _ = run_cli(capsys, "predict", "--run", "automodel-qwen3-30b-a3b-8", "--layers")
    printed = {re.sub(r"\s+", " ", ln.strip()) for ln in out.splitlines() if ln.startswith("│")}
    assert code == 0 and not [q for q in quoted if q not in printed]


def test_a_published_run_over_the_api_is_predict_run(capsys):
    """GET /api/runs/{id} is modelcut predict --run ID --json (with layers, --layers); an unknown id or
    layers under the seed model is one line, 422."""
    from fastapi.testclient import TestClient

    from modelcut.web import app as webapp
    with TestClient(webapp.create_app()) as client:
        for run_id, query, args in (("automodel-qwen3-30b-a3b-8", "?layers=true", ["--layers"]),
                                    ("megatron-1.7b", "?mode=seed", ["--mode", "seed"]),
                                    ("llama3-405b-128k-16384", "", [])):
            r = client.get(f"/api/runs/{run_id}{query}")
            assert r.status_code == 200, r.text
            assert main(["predict", "--run", run_id, "--json", *args]) == 0
            assert r.json() == json.loads(capsys.readouterr().out)
        for query, words in (("nope", "unknown published run 'nope'"),
                             ("megatron-1.7b?mode=seed&layers=true", "--layers apply to --mode default")):
            r = client.get(f"/api/runs/{query}")
            assert r.status_code == 422 and words in r.json()["detail"] and "\n" not in r.json()["detail"]


def test_explore_layers_itemises_the_picked_layout(capsys):
    """explore --layers prints the picked layout's micro-batch line by line (with --json, its layers: the
    budget of that ranked layout on the searched stack); with --run, --emit, the seed model, several
    precisions or a GPU range it is one line."""
    from modelcut.service.explore import precision_requests, run_explore
    from modelcut.service.requests import ExploreInput

    def problem(gpus: str = "16") -> list[str]:
        return ["explore", "--model", "llama3-8b", "--gpu", "h100", "--gpus", gpus, "--seq", "8192",
                "--global-batch-tokens", "1M", "--top", "3"]
    code, out, _ = run_cli(capsys, *problem(), "--layers", "--pick", "2")
    assert code == 0 and "layout #2: tp" in out and "dense layer × " in out and "attention core" in out
    code, out, _ = run_cli(capsys, *problem(), "--layers", "--pick", "2", "--json")
    req = precision_requests(ExploreInput(model="llama3-8b", gpu="h100", gpus=16, seq=8192,
                                          global_batch_tokens=1 << 20, top=3))[0]
    assert json.loads(out)["layers"] == run_explore(req).layers(2)[1].as_dict()
    for args, words in ((["explore", "--run", "megatron-1.7b"], "predict --run ID --layers"),
                        (problem() + ["--emit", "megatron"], "drop --layers"),
                        (problem() + ["--mode", "seed"], "seed model sums terms"),
                        (problem() + ["--precision", "bf16,fp8"], "one precision"),
                        (problem("8-16"), "one precision")):
        code, out, err = run_cli(capsys, *args, "--layers")
        assert code == 2 and out == "" and words in err and err.count("\n") == 1, (args, err)
