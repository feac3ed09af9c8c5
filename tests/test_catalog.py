"""The shipped catalogs and Hugging Face config.json reading."""

import json

import pytest

from modelcut import catalog
from modelcut.core.errors import ModelcutError

HW_NAMES = ("a100-sxm4-40gb", "a100-sxm4-80gb", "h100-sxm5-80gb", "h800-sxm5-80gb", "h200-sxm-141gb", "b200", "tpu-v4",
            "tpu-v5p")


@pytest.mark.parametrize("name", HW_NAMES)
def test_hardware_entries_are_complete_and_sourced(name):
    hw = catalog.hardware(name)
    assert hw.name == name
    assert hw.source
    for f in ("peak_flops_16", "peak_flops_8", "mem_bytes", "mem_bw", "link_bw", "net_bw"):
        assert getattr(hw, f) > 0, f
    assert hw.per_node >= 1
    assert hw.link_bw > hw.net_bw          # a node's links beat its network
    assert hw.peak_flops_8 >= hw.peak_flops_16


@pytest.mark.parametrize("alias,name", [("a100", "a100-sxm4-80gb"), ("H100", "h100-sxm5-80gb"),
                                        ("h200", "h200-sxm-141gb"), ("v5p", "tpu-v5p")])
def test_aliases(alias, name):
    assert catalog.hardware(alias).name == name


def test_deck_hardware_figures():
    """The figures the deck's model uses (shared/reference/published-runs.md)."""
    a100, h100 = catalog.hardware("a100-sxm4-80gb"), catalog.hardware("h100-sxm5-80gb")
    assert (a100.peak_flops_16, a100.link_bw, a100.net_bw, a100.per_node) == (312e12, 300e9, 25e9, 8)
    assert (h100.peak_flops_16, h100.link_bw, h100.net_bw, h100.per_node) == (989e12, 450e9, 50e9, 8)


def test_hardware_catalog_lines_carry_sources():
    from importlib import resources
    text = resources.files("modelcut.catalog").joinpath("hardware.toml").read_text()
    for line in text.splitlines():
        key = line.split("=")[0].strip()
        if key in ("peak_flops_16", "peak_flops_8", "mem_bytes", "mem_bw", "link_bw", "net_bw", "per_node"):
            assert "#" in line, f"figure without a source: {line}"


def test_unknown_names_are_one_line_errors():
    with pytest.raises(ModelcutError, match="unknown GPU 'a200'"):
        catalog.hardware("a200")
    with pytest.raises(ModelcutError, match="unknown model"):
        catalog.model("gpt-5")


def test_models():
    names = {m.name for m in catalog.all_models()}
    assert {"gpt-1.7b", "gpt-1t", "gpt3-175b", "llama3-8b", "llama3-70b", "llama3-405b"} <= names
    table1 = {"gpt-1.7b", "gpt-3.6b", "gpt-7.5b", "gpt-18.4b", "gpt-39.1b", "gpt-76.1b", "gpt-145.6b", "gpt-310.1b",
              "gpt-529.6b", "gpt-1t"}           # Narayanan et al. 2021, Table 1
    assert table1 <= names
    assert {n for n in names if catalog.model(n).source.startswith("Narayanan et al. 2021")} == table1
    assert catalog.model("llama3.1-405b") == catalog.model("llama3-405b")
    l405 = catalog.model("llama3-405b")
    assert (l405.layers, l405.hidden, l405.ffn_hidden, l405.heads, l405.kv_heads) == (126, 16384, 53248, 128, 8)
    assert l405.gated_mlp and not l405.tied_embeddings
    assert all(m.source for m in catalog.all_models())


def test_published_runs():
    deck = catalog.published_runs("deck")
    assert len(deck) == 13
    assert sum(r.family == "megatron" for r in deck) == 10
    assert sum(r.family == "llama3" for r in deck) == 3
    for r in catalog.published_runs():
        assert r.run.layout.gpus == r.gpus
        assert r.source
        assert r.published_tflops or r.published_step_time_s
        catalog.hardware(r.run.gpu)
    assert catalog.published_run("llama3-405b-128k-16384").run.layout.cp == 16
    with pytest.raises(ModelcutError):
        catalog.published_run("nope")


@pytest.mark.parametrize("file,arch", [
    ("llama3-8b.json", dict(layers=32, hidden=4096, ffn_hidden=14336, heads=32, kv_heads=8, vocab=128256,
                            gated_mlp=True, tied_embeddings=False)),
    ("mistral-7b.json", dict(layers=32, kv_heads=8, vocab=32000, gated_mlp=True)),
    ("qwen2-7b.json", dict(layers=28, hidden=3584, heads=28, kv_heads=4, qkv_bias=True, bias=False)),
    ("gpt2.json", dict(layers=12, hidden=768, ffn_hidden=3072, heads=12, kv_heads=12, tied_embeddings=True,
                       learned_positions=True, max_seq=1024, gated_mlp=False)),
    ("pythia-1b.json", dict(layers=16, hidden=2048, ffn_hidden=8192, heads=8, tied_embeddings=False,
                            gated_mlp=False)),
    ("mixtral-8x7b.json", dict(experts=8, top_k=2, gated_mlp=True)),
])
def test_hf_configs(file, arch):
    m = catalog.load_hf_config(f"tests/data/hf/{file}")
    for k, v in arch.items():
        assert getattr(m, k) == v, k


def test_hf_config_errors():
    with pytest.raises(ModelcutError, match="unknown architecture 'FancyNewForCausalLM'"):
        catalog.load_hf_config("tests/data/hf/unknown-arch.json")
    with pytest.raises(ModelcutError, match="missing 'intermediate_size'"):
        catalog.load_hf_config("tests/data/hf/missing-field.json")
    with pytest.raises(ModelcutError, match="no 'architectures'"):
        catalog.model_from_hf_config({"hidden_size": 4})


def test_hf_config_from_dict_and_bad_json(tmp_path):
    cfg = json.loads(open("tests/data/hf/llama3-8b.json").read())
    assert catalog.model_from_hf_config(cfg, "x").layers == 32
    bad = tmp_path / "config.json"
    bad.write_text("{not json")
    with pytest.raises(ModelcutError, match="not valid JSON"):
        catalog.load_hf_config(bad)


# ---------------------------------------------------------------- development set 2

@pytest.mark.parametrize("name,total,active,rel", [
    ("gpt-290.8b", 290.8e9, None, 1e-3),           # Megatron-LM README, Jan 2021
    ("palm-540b", 540.35e9, None, 1e-4),           # Chowdhery et al. 2022, Table 1
    ("bloom-176b", 176_247_271_424, None, 1e-6),   # BLOOM model card (less the embedding LayerNorm's 2h)
    ("opt-175b", 175e9, None, 1e-2),               # Zhang et al. 2022
    ("glm-130b", 130e9, None, 2e-2),               # Zeng et al. 2022
    ("nemotron4-15b", 15.7e9, None, 1e-2),         # the reference file: N ≈ 15.7B
    ("llama2-7b", 6_738_415_616, None, 0),         # the released checkpoints' parameter counts
    ("llama2-13b", 13_015_864_320, None, 0),
    ("llama2-70b", 68_976_648_192, None, 0),
    ("gpt-oss-120b", 116.83e9, None, 2e-3),        # gpt-oss model card
    ("gpt-oss-20b", 20.91e9, None, 2e-3),
    ("qwen3-235b-a22b", 235e9, 22e9, 1e-2),        # Qwen3 report: 235B, 22B activated
    ("kimi-k2", 1.04e12, 32e9, 3e-2),              # Kimi K2 report: 1.04T, 32B activated
])
def test_dev2_model_parameter_counts(name, total, active, rel):
    from modelcut.core.costs import flops
    m = catalog.model(name)
    assert m.source
    assert flops.param_count(m) == pytest.approx(total, rel=rel)
    if active is not None:
        assert flops.param_count(m, active=True) == pytest.approx(active, rel=2 * rel)
