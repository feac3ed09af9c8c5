"""Property-based fuzzing of the web API from its own OpenAPI schema: every check schemathesis has.

Schemathesis generates bodies that fit the schema (positive) and bodies that break it (negative),
and runs all its checks on each answer: no server error, status codes and content types and
headers as documented, answers that match the response schema, schema-breaking requests refused.
Its schema-valid-request-accepted check (``positive_data_acceptance``) is the one run with a
rule of its own: a body the schema accepts must be answered, unless the server says, in its
``Modelcut-Refusal`` header, that what it refused is a rule across fields the schema cannot state
(``combination``: tp·cp·pp·dp against the GPUs, a chunk count the schedule does not run, a rank
beyond the world), work over a cap (``limit``), an uploaded file's content (``content``) or a
full pool (``busy``). A refusal of a field the schema allows on its own (``input``) fails the test:
the schema is then looser than the validation.

The app runs with small limits so each generated request answers in milliseconds (the limits
themselves are tested in test_web_api.py).
"""

from __future__ import annotations

import json

import pytest

schemathesis = pytest.importorskip("schemathesis")
from hypothesis import HealthCheck, settings  # noqa: E402
from schemathesis.checks import CHECKS  # noqa: E402
from schemathesis.specs.openapi.checks import positive_data_acceptance  # noqa: E402

from modelcut.web.app import create_app  # noqa: E402

schema = schemathesis.openapi.from_asgi(
    "/openapi.json", create_app(max_ops=4_000, max_layouts=2_000, max_body_bytes=20_000))
schema.config.generation.update(
    modes=[schemathesis.GenerationMode.POSITIVE, schemathesis.GenerationMode.NEGATIVE])

#: Refusals of a schema-valid body that the schema cannot express, by the server's own account.
BEYOND_THE_SCHEMA = {"combination", "limit", "busy"}


def schema_valid_requests_are_answered(ctx, response, case):
    """positive_data_acceptance, less the refusals the schema cannot state (module docstring)."""
    meta = case.meta
    if meta is None or not meta.generation.mode.is_positive or response.status_code < 400:
        return None
    kind = response.headers.get("modelcut-refusal")
    kind = kind[0] if isinstance(kind, list) else kind
    if response.status_code in (422, 429, 503) and kind in BEYOND_THE_SCHEMA:
        return None
    if kind == "content" and case.operation.path == "/api/upload-config":
        return None   # the bytes of an uploaded file: a multipart form's schema cannot describe them
    raise AssertionError(f"schema-valid request rejected ({response.status_code}, {kind}): {response.text[:300]}")


CHECKED = [c for c in CHECKS.get_all() if c is not positive_data_acceptance] + [schema_valid_requests_are_answered]


def test_every_check_is_run():
    names = {c.__name__ for c in CHECKED}
    assert {"not_a_server_error", "status_code_conformance", "content_type_conformance",
            "response_schema_conformance", "response_headers_conformance", "negative_data_rejection",
            "unsupported_method", "schema_valid_requests_are_answered"} <= names


@schema.parametrize()
@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
def test_no_server_errors(case):
    response = case.call_and_validate(checks=CHECKED)
    if response.status_code >= 300:
        assert response.json().get("detail"), "an error answer names the problem in 'detail'"


# --- deeper: bodies that reach the systems model, not just the validators ---------------------------

from fastapi.testclient import TestClient  # noqa: E402
from hypothesis import given  # noqa: E402
from hypothesis import strategies as st  # noqa: E402

from modelcut import catalog  # noqa: E402
from modelcut.web.schemas import ExploreResponse, PredictResponse  # noqa: E402

client = TestClient(create_app(max_ops=200_000, max_layouts=3_000))
MODELS = [m.name for m in catalog.all_models()]
GPUS = [h.name for h in catalog.all_hardware()]
small = st.sampled_from([1, 2, 3, 4, 8, 16])
odd_values = st.one_of(st.integers(-3, 10**6), st.integers(min_value=10**12, max_value=10**30), st.floats(),
                       st.text(max_size=5), st.none(), st.booleans(), st.lists(st.integers(), max_size=2),
                       st.dictionaries(st.text(max_size=3), st.integers(), max_size=2))
HF_KEYS = ["hidden_size", "num_hidden_layers", "num_attention_heads", "num_key_value_heads", "intermediate_size",
           "vocab_size", "head_dim", "tie_word_embeddings", "max_position_embeddings", "n_embd", "n_layer",
           "n_head", "n_inner", "n_positions", "num_local_experts", "num_experts_per_tok", "attention_bias",
           "interleave_moe_layer_step", "attention_chunk_size", "moe_layers", "no_rope_layers", "intermediate_size_mlp"]
LLAMA = {"architectures": ["LlamaForCausalLM"], "hidden_size": 512, "num_hidden_layers": 4,
         "num_attention_heads": 8, "num_key_value_heads": 2, "intermediate_size": 1536, "vocab_size": 32000}
ARCHS = ["LlamaForCausalLM", "MistralForCausalLM", "Qwen2ForCausalLM", "MixtralForCausalLM", "GPT2LMHeadModel",
         "GPTNeoXForCausalLM", "Llama4ForCausalLM", "BertModel", ""]


@given(model=st.sampled_from(MODELS), gpu=st.sampled_from(GPUS), tp=small, cp=st.sampled_from([1, 2]), pp=small,
       dp=small, vpp=st.sampled_from([None, 1, 2, 3]), zero=st.integers(0, 3), sp=st.booleans(),
       schedule=st.sampled_from([None, "1f1b", "interleaved", "zb-h1", "zbv", "gpipe", "looped-bfs", "x"]),
       seq=st.sampled_from([1, 128, 2048, 8192]), gb=st.integers(1, 512), mb=st.sampled_from([1, 2, 4]),
       recompute=st.sampled_from(["none", "selective", "full"]))
@settings(max_examples=60, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
def test_predict_answers_or_explains(model, gpu, tp, cp, pp, dp, vpp, zero, sp, schedule, seq, gb, mb, recompute):
    layout = {"tp": tp, "cp": cp, "pp": pp, "dp": dp, "zero": zero, "sequence_parallel": sp}
    if vpp is not None:
        layout["vpp"] = vpp
    if schedule is not None:
        layout["schedule"] = schedule
    r = client.post("/api/predict", json={"model": model, "gpu": gpu, "layout": layout, "training": {
        "seq_len": seq, "global_batch": gb, "micro_batch": mb, "recompute": recompute}})
    assert r.status_code in (200, 422), r.text
    if r.status_code == 200:
        ans = PredictResponse.model_validate(r.json())
        assert ans.step_time_s > 0
    else:
        assert r.json()["detail"]


@given(arch=st.sampled_from(ARCHS), changes=st.dictionaries(st.sampled_from(HF_KEYS), odd_values, max_size=3),
       drop=st.lists(st.sampled_from(HF_KEYS), max_size=2))
@settings(max_examples=80, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
def test_any_config_json_is_read_or_refused_in_one_line(arch, changes, drop):
    cfg = {**LLAMA, "architectures": [arch], "n_embd": 512, "n_layer": 4, "n_head": 8, "n_positions": 1024,
           "num_local_experts": 4, "num_experts_per_tok": 2, **changes}
    for k in drop:
        cfg.pop(k, None)
    r = client.post("/api/upload-config", files={"file": ("config.json", json.dumps(cfg).encode())})
    assert r.status_code in (200, 400, 422), r.text
    assert r.json()["detail"] if r.status_code != 200 else r.json()["model"]["layers"] >= 1
    # json.dumps writes the non-finite floats the strategy draws as NaN and Infinity, which an
    # encoder that keeps to the JSON standard refuses to send; the server must refuse them itself
    body = {"hf_config": cfg, "gpu": "h100", "gpus": 8, "seq": 1024, "global_batch_tokens": 8192, "top": 3}
    r = client.post("/api/explore", content=json.dumps(body), headers={"content-type": "application/json"})
    assert r.status_code in (200, 422), r.text
    if r.status_code == 200:
        ExploreResponse.model_validate(r.json())


@given(model=st.sampled_from(["llama3-8b", "gpt-1.7b", "gpt-3.6b"]), gpus=st.sampled_from([1, 2, 6, 8, 12, 16, 64]),
       seq=st.sampled_from([512, 2048, 4096]), seqs=st.integers(1, 64),
       scheds=st.none() | st.lists(st.sampled_from(["1f1b", "interleaved", "zb-h1", "zbv"]), min_size=1, max_size=4))
@settings(max_examples=25, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)
def test_explore_ranks_only_layouts_that_use_every_gpu(model, gpus, seq, seqs, scheds):
    body = {"model": model, "gpu": "a100", "gpus": gpus, "seq": seq, "global_batch_tokens": seq * seqs, "top": 50}
    if scheds:
        body["schedules"] = scheds
    r = client.post("/api/explore", json=body)
    assert r.status_code in (200, 422), r.text
    if r.status_code == 200:
        ans = ExploreResponse.model_validate(r.json())
        # fastest first, but for ties inside one shape, simplest first (explore.search.TIE_FRACTION)
        from modelcut.core.explore.search import TIE_FRACTION
        shape = lambda x: tuple(x.get(k) for k in ("tp", "cp", "ep", "etp", "pp", "dp", "dp_shard"))  # noqa: E731
        best: dict = {}
        for x in ans.layouts:
            best[shape(x)] = min(best.get(shape(x), float("inf")), x["step_time_s"])
        for a, b in zip(ans.layouts, ans.layouts[1:]):
            if b["step_time_s"] < a["step_time_s"]:
                t0 = best[shape(a)]
                assert a["step_time_s"] <= t0 * (1 + TIE_FRACTION) and t0 <= b["step_time_s"]
        for x in ans.layouts:
            assert x["tp"] * x["cp"] * x["pp"] * x["dp"] == gpus and x["feasible"]
            assert x["memory"]["peak_bytes"] <= ans.summary["limit_bytes"]
    else:
        assert r.json()["detail"]
