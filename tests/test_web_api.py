"""The web app's JSON API, pages and limits, and the offline HTML export (no browser here)."""

from __future__ import annotations

import json
import re
import socket
import subprocess
import sys
import time
from fractions import Fraction
from pathlib import Path

import httpx
import pytest
from fastapi.testclient import TestClient

from modelcut.cli import main
from modelcut.core.sim import registry
from modelcut.core.costs.context import CP_KINDS
from modelcut.core.specs import FP8_RECIPES, PRECISIONS
from modelcut.core.sim.engine import Timing
from modelcut.core.errors import ModelcutError
from modelcut.core.sim.ops import Schedule
from modelcut.core.sim.run import run, run_named
from modelcut.core.sim.registry import build
from helpers import DEFAULT_CHUNKS, SCHEDULES
from modelcut.export import html_export, pipeline_json
from modelcut.web import app as webapp
from modelcut.web import requests as webrequests
from modelcut.web.schemas import CatalogResponse, SimulateResponse

STATIC = Path(webapp.STATIC)


@pytest.fixture(scope="module")
def client():
    with TestClient(webapp.create_app()) as c:
        yield c


def simulate(client, **body):
    return client.post("/api/simulate", json=body)


# --- POST /api/simulate ---------------------------------------------------------------------------

def test_interleaved_4_8_2_answers_the_deck_bubble(client):
    r = simulate(client, schedule="interleaved", devices=4, microbatches=8, chunks=2)
    assert r.status_code == 200
    ans = r.json()
    # The deck's row (results.md §12): (p − 1)/(v·m) = 3/16.
    assert ans["bubble"] == float(Fraction(3, 16)) == 0.1875
    assert ans["closed_form_bubble"] == float(registry.closed_form("interleaved", 4, 8, 2))
    SimulateResponse.model_validate(ans)


def test_a_pipeline_of_no_work_is_refused(client):
    r = simulate(client, schedule="1f1b", devices=4, microbatches=8, forward=0, backward=0)
    assert r.status_code == 422 and "times are all 0" in r.json()["detail"], r.text   # was a 200 with bubble 0


@pytest.mark.parametrize("args", [
    ["-s", "gpipe", "-p", "4", "-m", "8"],
    ["-s", "1f1b", "-p", "3", "-m", "5", "--p2p", "0.25"],
    ["-s", "interleaved", "-p", "4", "-m", "8", "-v", "4", "--forward", "1", "--backward", "3"],
    ["-s", "looped-bfs", "-p", "2", "-m", "3", "-v", "3"],
    ["-s", "zb-h1", "-p", "4", "-m", "6", "--weight", "0.5"],
    ["-s", "zbv", "-p", "3", "-m", "7", "--forward", "1", "--backward", "1", "--weight", "1"],
])
def test_same_answer_as_cli_json(client, capsys, args):
    """The API's body fields are simulate's options and its answer is `simulate --json`, key for key."""
    assert main(["simulate", *args, "--json"]) == 0
    cli = json.loads(capsys.readouterr().out)
    opts = dict(zip(args[::2], args[1::2]))
    body = {"schedule": opts["-s"], "devices": int(opts["-p"]), "microbatches": int(opts["-m"])}
    if "-v" in opts:
        body["chunks"] = int(opts["-v"])
    for flag in ("--forward", "--backward", "--weight", "--p2p"):
        if flag in opts:
            body[flag[2:]] = float(opts[flag])
    r = client.post("/api/simulate", json=body)
    assert r.status_code == 200, r.text
    assert r.json() == cli


def test_default_chunks_and_schema(client):
    for name in registry.names():
        r = simulate(client, schedule=name, devices=2, microbatches=4)
        assert r.status_code == 200, r.text
        ans = SimulateResponse.model_validate(r.json())
        assert ans.chunks == DEFAULT_CHUNKS[name]
        assert len(ans.ops) == build(name, 2, 4).num_ops


def test_floats_beyond_the_exact_threshold_agree_with_exact(client, monkeypatch):
    body = {"schedule": "interleaved", "devices": 4, "microbatches": 12, "chunks": 3, "forward": 1.1,
            "backward": 2.3, "p2p": 0.05}
    exact = simulate(client, **body).json()
    monkeypatch.setattr(webrequests, "EXACT_MAX_OPS", 1)
    fast = simulate(client, **body).json()
    assert fast["makespan"] == pytest.approx(exact["makespan"], rel=1e-12)
    assert fast["bubble"] == pytest.approx(exact["bubble"], rel=1e-12)
    assert [o["start"] for o in fast["ops"]] == pytest.approx([o["start"] for o in exact["ops"]], rel=1e-12)


def test_refuses_more_than_a_million_ops_quickly(client):
    t0 = time.perf_counter()
    r = simulate(client, schedule="1f1b", devices=1000, microbatches=501)  # 1,002,000 ops
    assert r.status_code == 422
    assert "1,000,000" in r.json()["detail"] and "1,002,000" in r.json()["detail"]
    r = simulate(client, schedule="zbv", devices=10**6, microbatches=1)  # ZB-V builds 2p − 1 micro-batches
    assert r.status_code == 422 and "limit" in r.json()["detail"]
    r = simulate(client, schedule="interleaved", devices=10**12, microbatches=10**12, chunks=10**6)
    assert r.status_code == 422 and "limit" in r.json()["detail"]
    assert time.perf_counter() - t0 < 5  # refused before building anything


def test_limit_counts_exactly():
    """Just at the limit is simulated, one micro-batch more is refused (limit lowered for speed)."""
    with TestClient(webapp.create_app(max_ops=4 * 10 * 2)) as c:
        r = simulate(c, schedule="1f1b", devices=4, microbatches=10)
        assert r.status_code == 200 and len(r.json()["ops"]) == 80
        r = simulate(c, schedule="1f1b", devices=4, microbatches=11)
        assert r.status_code == 422 and "88 ops" in r.json()["detail"] and "limit is 80 ops" in r.json()["detail"]


@pytest.mark.parametrize("body, status, words", [
    (b"this is not json", 400, "not valid JSON"),
    (b'{"devices": 4,', 400, "not valid JSON"),
    (b"[1, 2]", 422, "dictionary"),
    (b'{"devices": 0}', 422, "devices"),
    (b'{"devices": "4"}', 422, "devices"),
    (b'{"devices": 4.5}', 422, "devices"),
    (b'{"forward": -1}', 422, "forward"),
    (b'{"backward": 1e300}', 422, "backward"),
    (b'{"p2p": NaN}', 422, "finite"),
    (b'{"colour": "red"}', 422, "colour"),
])
def test_malformed_bodies_get_4xx_with_a_message(client, body, status, words):
    r = client.post("/api/simulate", content=body, headers={"content-type": "application/json"})
    assert r.status_code == status, r.text
    detail = r.json()["detail"]
    assert isinstance(detail, str) and words in detail


@pytest.mark.parametrize("name, p, m, v", [("nope", 4, 8, None), ("1f1b", 4, 8, 3), ("interleaved", 4, 2, 2),
                                            ("zbv", 2, 4, 3)])
def test_the_core_s_one_line_message_comes_back_as_422(client, name, p, m, v):
    with pytest.raises(ModelcutError) as exc:
        build(name, p, m, v)
    r = simulate(client, schedule=name, devices=p, microbatches=m, chunks=v)
    assert r.status_code == 422 and r.json() == {"detail": str(exc.value)}


def test_bodies_over_a_megabyte_are_refused(client):
    big = b'{"schedule": "1f1b", "pad": "' + b"x" * webapp.MAX_BODY_BYTES + b'"}'
    r = client.post("/api/simulate", content=big, headers={"content-type": "application/json"})
    assert r.status_code == 413 and "1,000,000 bytes" in r.json()["detail"]

    def chunks():  # no Content-Length: counted as it streams
        yield b'{"pad": "'
        for _ in range(12):
            yield b"y" * 100_000
        yield b'"}'
    r = client.post("/api/simulate", content=chunks(), headers={"content-type": "application/json"})
    assert r.status_code == 413


# --- GET /api/catalog, pages, schema --------------------------------------------------------------

def test_catalog_lists_the_schedules(client):
    r = client.get("/api/catalog")
    assert r.status_code == 200
    cat = CatalogResponse.model_validate(r.json())
    assert [s.name for s in cat.schedules] == list(registry.names())
    assert set(SCHEDULES) <= {s.name for s in cat.schedules}
    for s in cat.schedules:
        assert s.default_chunks == DEFAULT_CHUNKS[s.name]
        assert s.split_backward == build(s.name, 2, 4).split_backward
        other = s.default_chunks + 1
        try:
            build(s.name, 2, 4, other)
            takes_other = True
        except Exception:
            takes_other = False
        assert s.chunks_fixed == (not takes_other)
    assert cat.limits["max_ops"] == webapp.MAX_OPS
    assert [s.name for s in cat.schedules if s.explored_by_default] == list(registry.explored_by_default())
    assert (cat.precisions, cat.fp8_recipes) == (list(PRECISIONS), list(FP8_RECIPES))
    assert [k.name for k in cat.cp_kinds] == list(CP_KINDS) and all(k.doc for k in cat.cp_kinds)
    assert [k.label for k in cat.cp_kinds] == ["ring", "all-gather", "all-to-all", "hierarchical"]


def test_openapi_documents_the_api(client):
    spec = client.get("/openapi.json").json()
    assert "/api/simulate" in spec["paths"] and "/api/catalog" in spec["paths"]
    body = spec["paths"]["/api/simulate"]["post"]["requestBody"]["content"]["application/json"]["schema"]
    ref = body["$ref"].split("/")[-1]
    props = spec["components"]["schemas"][ref]["properties"]
    assert {"schedule", "devices", "microbatches", "chunks", "forward", "backward", "weight", "p2p"} <= set(props)


@pytest.mark.parametrize("path, marker", [("/", "timeline.js"), ("/explorer", "explorer.js"),
                                          ("/runs", "runs.js")])
def test_pages_are_served_without_network(client, path, marker):
    r = client.get(path)
    assert r.status_code == 200 and marker in r.text
    assert "default-src 'self'" in r.headers["content-security-policy"]
    for ref in re.findall(r'(?:src|href)="([^"]+)"', r.text):
        assert ref.startswith(("/", "#", "data:")), ref
        if ref.startswith("/static/"):
            assert client.get(ref).status_code == 200, ref


def test_static_files_reference_no_other_origin():
    for f in STATIC.rglob("*"):
        if f.is_file():
            text = f.read_text(encoding="utf-8")
            # The only absolute URL allowed is the SVG namespace, which is a name, not a fetch.
            urls = set(re.findall(r"https?://[^\s'\"`)]+", text)) - {"http://www.w3.org/2000/svg"}
            assert not urls, (f.name, urls)


def test_docs_pages_that_need_a_cdn_are_off(client):
    assert client.get("/docs").status_code == 404
    assert client.get("/redoc").status_code == 404


# --- offline HTML export --------------------------------------------------------------------------

def _payload(doc: str) -> dict:
    m = re.search(r'<script id="modelcut-data" type="application/json">(.*?)</script>', doc, re.S)
    assert m
    return json.loads(m.group(1))


def test_html_export_is_self_contained():
    result = run_named("interleaved", 4, 8, 2, exact=True)
    doc = html_export.render(result)
    assert _payload(doc) == pipeline_json.to_dict(result)
    # The served page's own player script and style, inlined.
    assert (STATIC / "timeline.js").read_text(encoding="utf-8") in doc
    assert (STATIC / "style.css").read_text(encoding="utf-8") in doc
    assert "default-src 'none'" in doc
    assert not re.search(r"<(?:script|img|link|iframe)[^>]*\s(?:src|href)=", doc)


def test_html_export_keeps_hostile_names_inert():
    name = "</script><script>alert(1)</script><!--"
    sched = build("1f1b", 2, 3)
    hostile = Schedule(name, sched.devices, sched.microbatches, sched.chunks, sched.orders)
    doc = html_export.render(run(hostile, Timing()))
    assert _payload(doc)["schedule"] == name
    assert doc.count("</script>") == 3  # data, player, start-up: nothing closed early
    assert "<script>alert(1)" not in doc


def test_simulate_html_flag_writes_the_export(tmp_path):
    out = tmp_path / "timeline.html"
    assert main(["simulate", "-s", "zbv", "-p", "4", "-m", "8", "--html", str(out)]) == 0
    data = _payload(out.read_text(encoding="utf-8"))
    assert data["schedule"] == "zbv" and data["devices"] == 4 and len(data["ops"]) == build("zbv", 4, 8).num_ops


# --- modelcut serve -------------------------------------------------------------------------------

def test_serve_prints_its_address_and_answers():
    proc = subprocess.Popen([sys.executable, "-m", "modelcut", "serve", "--port", "0"],
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        line = proc.stdout.readline()
        m = re.search(r"http://127\.0\.0\.1:(\d+)/", line)
        assert m, line
        url = m.group(0)
        for _ in range(100):
            try:
                r = httpx.post(url + "api/simulate", json={"schedule": "interleaved", "devices": 4,
                                                           "microbatches": 8, "chunks": 2}, timeout=5)
                break
            except httpx.ConnectError:
                time.sleep(0.05)
        assert r.status_code == 200 and r.json()["bubble"] == 0.1875
    finally:
        proc.terminate()
        proc.wait(timeout=10)


def test_serve_reports_a_busy_port_in_one_line(capsys):
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        s.listen()
        port = s.getsockname()[1]
        assert main(["serve", "--port", str(port)]) == 2
    err = capsys.readouterr().err.strip().splitlines()
    assert len(err) == 1 and err[0].startswith("modelcut: error: cannot listen on 127.0.0.1:")


# --- the systems model: predict, explore, mesh, runs, uploads -------------------------------------

DATA = Path(__file__).parent / "data"


def _predict_body(toml_file: Path) -> dict:
    import tomllib

    doc = tomllib.loads(toml_file.read_text())
    body = {"gpu": doc["hardware"]["gpu"], "layout": doc["layout"], "training": doc["training"]}
    if "gpus_per_node" in doc["hardware"]:
        body["gpus_per_node"] = doc["hardware"]["gpus_per_node"]
    if "config" in doc["model"]:
        body["hf_config"] = json.loads((toml_file.parent / doc["model"]["config"]).read_text())
    else:
        body["model"] = doc["model"]["name"]
    return body


@pytest.mark.parametrize("name", ["llama3-405b-named.toml", "llama3-8b-config.toml", "gpt3-175b.toml"])
def test_predict_answers_as_the_cli_does(client, capsys, name):
    toml_file = DATA / name
    if name == "gpt3-175b.toml":  # model given by its fields
        import tomllib
        doc = tomllib.loads(toml_file.read_text())
        body = _predict_body(toml_file.with_name("llama3-405b-named.toml"))
        body.update(gpu=doc["hardware"]["gpu"], layout=doc["layout"], training=doc["training"])
        body.pop("model")
        body["model_spec"] = doc["model"]
    else:
        body = _predict_body(toml_file)
    assert main(["predict", str(toml_file), "--json"]) == 0
    cli = json.loads(capsys.readouterr().out)
    r = client.post("/api/predict", json=body)
    assert r.status_code == 200, r.text
    ans = r.json()
    for key in ("step_time_s", "tflops_per_gpu", "mfu", "breakdown", "microbatches", "vpp", "schedule", "eta"):
        assert ans[key] == cli[key], key
    assert ans["memory"]["peak_bytes"] == max(s["total_bytes"] for s in ans["memory"]["stages"])


def test_predict_refuses_bad_runs_in_one_line(client):
    body = _predict_body(DATA / "llama3-405b-named.toml")
    for change, words in [({"model": "gpt-nope"}, "unknown model"), ({"gpu": "tpu-v9"}, "unknown GPU"),
                          ({"layout": {**body["layout"], "tp": 7}}, "tp (7)"),
                          ({"hf_config": {"architectures": ["LlamaForCausalLM"]}}, "exactly one of")]:
        r = client.post("/api/predict", json={**body, **change})
        assert r.status_code == 422 and words in r.json()["detail"], r.text
    heavy = {**body, "layout": {**body["layout"], "dp": 1, "tp": 8, "pp": 16},
             "training": {**body["training"], "global_batch": 1 << 20}}
    r = client.post("/api/predict", json=heavy)
    assert r.status_code == 422 and "1,000,000 ops" in r.json()["detail"]


def test_predict_at_several_precisions_answers_as_the_cli_does(client, capsys):
    """precisions: the run at each precision, {precisions, predictions}, as predict --precision bf16,fp8
    --json gives it; training.fp8_recipe goes with fp8; FP8 on an A100 among them is one line."""
    import tomllib
    toml_file = DATA / "llama3-70b-64-h100.toml"
    body = {**_predict_body(toml_file), "precisions": ["bf16", "fp8"],
            **tomllib.loads(toml_file.read_text()).get("settings", {})}
    body["training"] = {**body["training"], "fp8_recipe": "current"}
    r = client.post("/api/predict", json=body)
    assert r.status_code == 200, r.text
    web = r.json()
    assert main(["predict", str(toml_file), "--precision", "bf16,fp8", "--fp8-recipe", "current", "--json"]) == 0
    cli = json.loads(capsys.readouterr().out)
    assert web["precisions"] == cli["precisions"] == ["bf16", "fp8"]
    assert [p["step_time_s"] for p in web["predictions"]] == [p["step_time_s"] for p in cli["predictions"]]
    assert web["predictions"][1]["memory"]["assumptions"]["fp8_recipe"] == "current"
    r = client.post("/api/predict", json={**body, "gpu": "a100"})
    assert r.status_code == 422 and "FP8" in r.json()["detail"] and "\n" not in r.json()["detail"]


EXPLORE = {"model": "gpt-1.7b", "gpu": "a100", "gpus": 8, "seq": 2048, "global_batch_tokens": "128k", "top": 10}


def test_explore_answers_the_core_s_ranking(client):
    from modelcut import catalog
    from modelcut.core import explore as ex
    from modelcut.core.step.bounds import lower_bound
    from modelcut.service.explore import memory_options, predictor, stack, ExploreRequest
    from modelcut.service.predict import efficiency_for

    r = client.post("/api/explore", json=EXPLORE)
    assert r.status_code == 200, r.text
    ans = r.json()
    a100 = catalog.hardware("a100")
    fw = stack(ExploreRequest(catalog.model("gpt-1.7b"), a100, 8, 2048, 128 * 1024))
    eff = efficiency_for(a100)
    core = ex.explore(catalog.model("gpt-1.7b"), a100, predictor("default", a100), gpus=8, seq=2048,
                      global_batch_tokens=128 * 1024, capabilities=catalog.capabilities(None),
                      options=memory_options(ExploreRequest(catalog.model("gpt-1.7b"), a100, 8, 2048, 128 * 1024), fw),
                      lower_bound=lambda run, h, plan: lower_bound(run, h, eff, fw, plan), keep=10,
                      pareto_within=0.05, space=ex.Space(uneven_split=catalog.capabilities(None).uneven_split))
    want = [e.as_dict() for e in core.layouts[:10]]
    assert [{k: v for k, v in x.items() if k not in ("rank", "microbatches", "stage_layers")}
            for x in ans["layouts"]] == want
    assert [x["rank"] for x in ans["layouts"]] == list(range(1, 11))
    assert ans["summary"]["ranked"] == len(core.layouts)
    assert ans["why"]["step_time_s"] == [want[0]["step_time_s"], want[1]["step_time_s"]]


def test_explore_refuses_a_space_beyond_its_bound():
    with TestClient(webapp.create_app(max_layouts=100)) as c:
        r = c.post("/api/explore", json=EXPLORE)
        assert r.status_code == 422 and "more than 100 layouts" in r.json()["detail"]
        r = c.post("/api/explore", json={**EXPLORE, "gpus": 1, "schedules": ["1f1b"], "micro_batches": [1]})
        assert r.status_code == 200  # one shape × 12 variants fits under 100


@pytest.mark.parametrize("change, status, words", [
    ({"global_batch_tokens": "1e400"}, 422, "token count"),
    ({"global_batch_tokens": 1000}, 422, "whole number"),
    ({"gpus": 0}, 422, "gpus"),
    ({"schedules": ["zz"]}, 422, "schedules"),
    ({"overlap": {"tp_comm": "on"}}, 422, "overlap"),
    ({"overlap": {"warp": True}}, 422, "overlap"),
    ({"overlap": {"defer_embedding_wgrad_compute": [1]}}, 422, "must be a boolean, a number or a string"),
    ({"mode": "seed", "overlap": {"tp_comm": True}}, 422, "overlap overrides apply to --mode default"),
    ({"model": None, "model_spec": {"layers": 2}}, 422, "missing"),
])
def test_explore_bad_requests(client, change, status, words):
    r = client.post("/api/explore", json={**EXPLORE, **change})
    assert r.status_code == status and words in r.json()["detail"], r.text


def test_explore_at_several_precisions_answers_as_the_cli_does(client, capsys):
    """precisions: one search per precision, the answer the CLI's --precision bf16,fp8 --json gives;
    FP8 on an A100 among them is refused before any search, in one line."""
    body = {**EXPLORE, "gpu": "h100", "top": 2, "precisions": ["bf16", "fp8"], "fp8_recipe": "tensorwise"}
    r = client.post("/api/explore", json=body)
    assert r.status_code == 200, r.text
    web = r.json()
    assert main(["explore", "--model", "gpt-1.7b", "--gpu", "h100", "--gpus", "8", "--seq", "2048",
                 "--global-batch-tokens", "128k", "--top", "2", "--precision", "bf16,fp8", "--fp8-recipe", "current",
                 "--json"]) == 0
    cli = json.loads(capsys.readouterr().out)
    assert web["precisions"] == cli["precisions"] == ["bf16", "fp8"] and web["fastest"] == cli["fastest"]
    assert [s["layouts"] for s in web["searches"]] == [s["layouts"] for s in cli["searches"]]
    assert web["searches"][1]["fp8_recipe"] == "current"
    for change, words in (({"gpu": "a100"}, "FP8"), ({"precisions": ["bf16"]}, "at least 2"),
                          ({"precisions": ["bf16", "fp16"], "fp8_recipe": "delayed"}, "needs fp8")):
        r = client.post("/api/explore", json={**body, **change})
        assert r.status_code == 422 and words in r.json()["detail"], r.text


def test_mesh_answers_as_the_cli_does(client, capsys):
    assert main(["mesh", "--tp", "8", "--pp", "16", "--dp", "64", "--gpus-per-node", "8", "--rank", "9",
                 "--json"]) == 0
    cli = json.loads(capsys.readouterr().out)
    r = client.post("/api/mesh", json={"tp": 8, "pp": 16, "dp": 64, "gpus_per_node": 8, "rank": 9})
    assert r.status_code == 200 and r.json() == cli
    r = client.post("/api/mesh", json={"tp": 8, "rank": 8})
    assert r.status_code == 422 and "rank" in r.json()["detail"]
    assert main(["mesh", "--tp", "2", "--cp", "16", "--cp-a2a", "4", "--rank", "5", "--json"]) == 0
    cli = json.loads(capsys.readouterr().out)
    r = client.post("/api/mesh", json={"tp": 2, "cp": 16, "cp_a2a": 4, "rank": 5})
    assert r.status_code == 200 and r.json() == cli and "cp_ring" in r.json()["coords"]
    r = client.post("/api/mesh", json={"cp": 16, "cp_a2a": 16})
    assert r.status_code == 422 and "cp_a2a" in r.json()["detail"]


def test_runs_are_the_validation_table(client):
    from modelcut import catalog
    from modelcut.analysis.validation import validate

    ans = client.get("/api/runs").json()
    val = validate(catalog.published_runs("deck"), catalog.hardware, "seed").as_dict()
    assert ans["eta"] == val["eta"]
    assert [(r["id"], r["predicted_tflops"], r["error_pct"]) for r in ans["runs"]] == \
        [(r["id"], r["predicted_tflops"], r["error_pct"]) for r in val["runs"]]
    assert ans["summary"]["max_error_pct"] == val["summary"]["max_error_pct"]
    assert client.get("/api/runs?set=all").json()["runs"][0]["id"] == ans["runs"][0]["id"]
    assert client.get("/api/runs?mode=nope").status_code == 422
    assert client.get("/api/runs?set=some").status_code == 422


def test_the_default_models_runs_lead_with_their_out_of_sample_predictions(client):
    """Under the default model each run carries its prediction out of sample (the constants of the
    fold that left its source out) beside the in-sample one, and the summary both figures, as
    ``validate --mode default --json`` gives them; the seed model's rows have none."""
    from modelcut.service.validation import default_table
    ans = client.get("/api/runs?mode=default&set=all").json()
    table = default_table().as_dict()
    want = {r["id"]: r for r in table["runs"]}
    assert len(ans["runs"]) == len(want) > 70
    for r in ans["runs"]:
        w = want[r["id"]]
        assert r["error_pct"] == w["default"]["error_pct"]
        assert r["out_of_sample"]["error_pct"] == w["loso"]["error_pct"]
        assert r["out_of_sample"]["predicted"] == w["loso"]["predicted"]
        assert r["out_of_sample"]["step_time_s"] == w["loso"]["step_time_s"]
    oos, ins = table["summary"]["overall"]["loso"], table["summary"]["overall"]["default"]
    assert ans["summary"]["out_of_sample"] == {"runs": oos["runs"], "mean_abs_error_pct": oos["mean_abs_pct"],
                                               "max_abs_error_pct": oos["max_abs_pct"],
                                               "mean_signed_error_pct": oos["mean_signed_pct"]}
    assert ans["summary"]["mean_abs_error_pct"] == ins["mean_abs_pct"]
    deck = client.get("/api/runs?mode=default").json()
    assert deck["summary"]["out_of_sample"]["runs"] == 13
    assert all(r["out_of_sample"] is None for r in client.get("/api/runs").json()["runs"])


def test_kernel_checks_are_validate_kernels(client):
    from modelcut.service import validation
    ans = client.get("/api/kernel-checks")
    assert ans.status_code == 200
    assert ans.json() == validation.kernel_rows()
    assert "te-gemm-h200-nvl" in ans.json()["sources"]


def test_uploads_read_configs_and_refuse_bad_ones(client):
    from modelcut import catalog

    cfg = json.loads((DATA / "hf" / "mixtral-8x7b.json").read_text())
    r = client.post("/api/upload-config", files={"file": ("config.json", json.dumps(cfg).encode())})
    assert r.status_code == 200
    want = catalog.model_from_hf_config(cfg)
    assert r.json()["model"]["experts"] == want.experts and r.json()["model"]["layers"] == want.layers
    assert r.json()["hf_config"] == cfg
    cases = [(b"\xff\xfe", 400, "UTF-8"), (b"{not json", 400, "not valid JSON"), (b"[1]", 422, "JSON object"),
             (b'{"architectures": ["BertModel"]}', 422, "unknown architecture 'BertModel'"),
             ((DATA / "hf" / "missing-field.json").read_bytes(), 422, "missing")]
    for data, status, words in cases:
        r = client.post("/api/upload-config", files={"file": ("config.json", data)})
        assert r.status_code == status and words in r.json()["detail"], r.text
    r = client.post("/api/upload-config", files={"file": ("config.json", b"[" * 200_000 + b"]" * 200_000)})
    assert r.status_code == 400 and "nested more deeply" in r.json()["detail"], r.text   # was a 500
    r = client.post("/api/upload-config", files={"file": ("config.json", b"{" + b" " * 1_000_001 + b"}")})
    assert r.status_code == 413
    r = client.post("/api/upload-config", content=b"{}", headers={"content-type": "application/json"})
    assert r.status_code == 422 and "file" in r.json()["detail"]


# --- the pool: large simulations, streamed searches, refusals when full ---------------------------

def test_large_simulations_run_in_the_pool_and_answer_as_the_cli(client, capsys):
    args = ["-s", "1f1b", "-p", "250", "-m", "250"]           # 125,000 ops: past the pool's threshold
    assert main(["simulate", *args, "--json"]) == 0
    cli = json.loads(capsys.readouterr().out)
    r = simulate(client, schedule="1f1b", devices=250, microbatches=250)
    assert r.status_code == 200 and r.json() == cli and len(cli["ops"]) == 125_000


def test_the_stream_reports_progress_then_the_answer(client):
    lines = []
    with client.stream("POST", "/api/explore/stream", json=EXPLORE) as r:
        assert r.status_code == 200 and r.headers["content-type"].startswith("application/x-ndjson")
        for line in r.iter_lines():
            if line.strip():
                lines.append(json.loads(line))
    assert all(set(x) <= {"progress", "result", "error"} and len(x) == 1 for x in lines)
    progress = [x["progress"] for x in lines if "progress" in x]
    assert progress and "result" in lines[-1]
    done = [p["done"] for p in progress if p["total"]]
    assert done == sorted(done) and done[-1] == progress[-1]["total"]
    assert lines[-1]["result"] == client.post("/api/explore", json=EXPLORE).json()
    r = client.post("/api/explore/stream", json={**EXPLORE, "global_batch_tokens": 1000})
    assert r.status_code == 422 and r.headers["modelcut-refusal"] == "combination"   # refused before it streams


def test_the_streams_last_progress_is_the_searchs_own_count(monkeypatch):
    """Where the search's progress never reaches the pool (its queue's reader behind, as it may be
    when a small search ends), the last progress line still carries the search's own count, done of
    total, before the answer."""
    from modelcut.web import jobs
    monkeypatch.setattr(jobs, "in_thread", lambda events, fn, *args: fn(*args))   # no queue: progress lost
    with TestClient(webapp.create_app(workers=1, pool="thread")) as c:
        with c.stream("POST", "/api/explore/stream", json=EXPLORE) as r:
            lines = [json.loads(line) for line in r.iter_lines() if line.strip()]
    assert "result" in lines[-1] and "progress" in lines[-2]
    last = lines[-2]["progress"]
    assert last["total"] and last["done"] == last["total"]


def test_a_full_pool_answers_429_with_retry_after():
    import threading

    with TestClient(webapp.create_app(workers=1, queue=0, pool="thread")) as c:
        slow = {**EXPLORE, "model": "llama3-8b", "gpu": "h100", "gpus": 16, "seq": 8192, "global_batch_tokens": "1M"}
        first = {}
        t = threading.Thread(target=lambda: first.setdefault("r", c.post("/api/explore", json=slow)))
        t.start()
        deadline = time.monotonic() + 30
        while c.app.state.pool.admitted == 0:
            assert time.monotonic() < deadline
            time.sleep(0.01)
        r = c.post("/api/explore", json=EXPLORE)
        assert r.status_code == 429 and int(r.headers["retry-after"]) >= 1
        assert r.headers["modelcut-refusal"] == "busy" and "busy" in r.json()["detail"]
        assert c.get("/api/catalog").status_code == 200       # small requests still answer
        t.join(timeout=120)
        assert first["r"].status_code == 200
        assert c.post("/api/explore", json=EXPLORE).status_code == 200   # a place again


def test_refusals_say_what_they_refused(client):
    r = simulate(client, devices=0)
    assert r.status_code == 422 and r.headers["modelcut-refusal"] == "input"
    r = simulate(client, schedule="1f1b", chunks=2)
    assert r.status_code == 422 and r.headers["modelcut-refusal"] == "combination"
    r = simulate(client, schedule="1f1b", devices=1000, microbatches=1000)
    assert r.status_code == 422 and r.headers["modelcut-refusal"] == "limit"
    r = client.post("/api/upload-config", files={"file": ("config.json", b"{not json")})
    assert r.status_code == 400 and r.headers["modelcut-refusal"] == "content"


def test_the_api_writes_the_predicted_step_as_a_trace(client, monkeypatch):
    """POST /api/predict/trace answers predict --trace's Chrome trace for the same body POST
    /api/predict takes: its last span ends at that prediction's step time; the seed mode, several
    precisions and a trace over the server's span cap are 422 with one line."""
    from modelcut.web import requests as web_requests
    body = {"model": "llama3-70b", "gpu": "h100", "layout": {"tp": 4, "pp": 4, "dp": 4, "vpp": 5},
            "training": {"seq_len": 8192, "global_batch": 64}, "framework": "nemo"}
    step = client.post("/api/predict", json=body).json()["step_time_s"]
    r = client.post("/api/predict/trace", json=body)
    assert r.status_code == 200, r.text
    spans = [e for e in r.json()["traceEvents"] if e["ph"] == "X"]
    assert max(e["ts"] + e["dur"] for e in spans) == pytest.approx(step * 1e6, rel=1e-9)
    assert r.json()["otherData"]["step_time_s"] == step
    for change, words in (({"mode": "seed", "framework": None}, "the default model's"),
                          ({"precisions": ["bf16", "fp8"]}, "one precision")):
        r = client.post("/api/predict/trace", json={**body, **change})
        assert r.status_code == 422 and words in r.json()["detail"] and "\n" not in r.json()["detail"]
    monkeypatch.setattr(web_requests, "MAX_TRACE_SPANS", 10)
    r = client.post("/api/predict/trace", json=body)
    assert r.status_code == 422 and "spans, over the server's 10" in r.json()["detail"]
