"""The shipped catalogs and Hugging Face config.json reading."""

import json
from dataclasses import replace

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


def test_the_a100s_hold_what_nvml_reports_both_in_gib():
    """The datasheets' 40 GB and 80 GB of the A100 are 40 and 80 GiB (NVML: 40,960 and 81,920 MiB):
    both counted alike, so a layout that fits in 40 GiB is not refused for a 40 GB one."""
    small, big = catalog.hardware("a100-sxm4-40gb"), catalog.hardware("a100-sxm4-80gb")
    assert small.mem_bytes == 40 * 2**30 and big.mem_bytes == 80 * 2**30


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
        assert r.published_tflops or r.published_step_time_s or r.published_mfu or r.published_tokens_per_s
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
    # MosaicML MPT-7B: ALiBi (no position table), no biases, tied, a plain 4h MLP
    ("mpt-7b.json", dict(layers=32, hidden=4096, ffn_hidden=16384, heads=32, kv_heads=32, vocab=50432,
                         gated_mlp=False, tied_embeddings=True, bias=False, learned_positions=False, dropout=False)),
    ("gemma-7b.json", dict(layers=28, hidden=3072, head_dim=256, heads=16, kv_heads=16, gated_mlp=True,
                           tied_embeddings=True, norm="rmsnorm", sliding_window=None)),
    # Gemma 2 9B: every other layer from the first within 4,096 keys (Gemma2Config without layer_types)
    ("gemma2-9b.json", dict(layers=42, kv_heads=8, head_dim=256, sliding_window=4096, sliding_layers=21,
                            tied_embeddings=True)),
    ("olmo2-7b.json", dict(layers=32, hidden=4096, ffn_hidden=11008, vocab=100352, gated_mlp=True,
                           tied_embeddings=False, qkv_bias=False)),
    # Phi-3-mini-4k: Llama-shaped, untied, every layer within 2,047 keys
    ("phi3-mini-4k.json", dict(layers=32, hidden=3072, ffn_hidden=8192, heads=32, kv_heads=32, vocab=32064,
                               gated_mlp=True, tied_embeddings=False, bias=False, norm="rmsnorm",
                               sliding_window=2047, sliding_layers=32, dropout=False)),
    # Granite MoE: read as Mixtral (experts in every layer, their width intermediate_size), tied here
    ("granite-moe-like.json", dict(layers=32, hidden=1536, heads=24, kv_heads=8, experts=40, top_k=8,
                                   expert_ffn_hidden=512, gated_mlp=True, tied_embeddings=True, bias=False)),
    # a NemotronForCausalLM config of Nemotron-4 15B's shape is the catalog's nemotron4-15b
    ("nemotron4-15b-like.json", dict(layers=32, hidden=6144, ffn_hidden=24576, heads=48, kv_heads=8, vocab=256000,
                                     gated_mlp=False, tied_embeddings=False, norm="layernorm", bias=False)),
])
def test_hf_configs(file, arch):
    m = catalog.load_hf_config(f"tests/data/hf/{file}")
    for k, v in arch.items():
        assert getattr(m, k) == v, k


def test_hf_config_parameter_counts_of_the_new_families():
    """Gemma 7B's 8,537,680,896 parameters (its model card's 8.54B); a Nemotron config of
    Nemotron-4 15B's shape counts what the catalog entry counts; MPT-7B's 6.65B within 0.01 %."""
    from modelcut.core.costs.flops import param_count
    assert param_count(catalog.load_hf_config("tests/data/hf/gemma-7b.json")) == 8_537_680_896
    assert param_count(catalog.load_hf_config("tests/data/hf/nemotron4-15b-like.json")) == \
        param_count(catalog.model("nemotron4-15b"))
    assert param_count(catalog.load_hf_config("tests/data/hf/mpt-7b.json")) == pytest.approx(6.649e9, rel=1e-4)


def test_a_phi3_config_counts_its_parameters_and_reads_its_dropout():
    """Phi-3-mini-4k's 3,821,079,552 parameters (the Phi-3 report's 3.8B: 32 layers of 113,252,352,
    two untied 32,064 × 3,072 tables and the final norm); a config with resid_pdrop above 0 keeps
    dropout, one without a window attends over the whole sequence, and a window that is not a whole
    number is one line naming the field."""
    import json

    from modelcut.core.costs.flops import param_count
    cfg = json.load(open("tests/data/hf/phi3-mini-4k.json"))
    assert param_count(catalog.model_from_hf_config(cfg)) == 3_821_079_552
    m = catalog.model_from_hf_config({**cfg, "resid_pdrop": 0.1, "sliding_window": None})
    assert m.dropout and m.sliding_window is None and not m.sliding_layers
    with pytest.raises(ModelcutError, match="sliding_window"):
        catalog.model_from_hf_config({**cfg, "sliding_window": 2047.5})


def test_a_glm45_config_reads_its_experts_and_counts_its_parameters():
    """GLM-4.5-Air (Glm4MoeForCausalLM): 128 routed experts of 1,408 and one shared expert after one
    dense layer, grouped-query attention of 96 heads of 128 with q, k and v biases; 106.85 billion
    parameters, the model card's 106B total (its multi-token prediction layer not counted)."""
    from modelcut.core.costs.flops import param_count
    m = catalog.load_hf_config("tests/data/hf/glm-4.5-air-like.json")
    assert (m.experts, m.top_k, m.expert_ffn_hidden, m.shared_experts, m.dense_layers) == (128, 8, 1408, 1, 1)
    assert (m.heads, m.kv_heads, m.head_dim, m.qkv_bias, m.bias, m.tied_embeddings) == (96, 8, 128, True, False, False)
    assert 106.0e9 <= param_count(m) < 107.0e9


def _hand_count(m, expert_layers: int = 0, biases: int = 0) -> int:
    """Parameters tensor by tensor, written out apart from modelcut's count: embeddings (twice
    untied), each layer's q, k, v, o, its MLP (three matrices gated, two not) or its experts and
    router, two norms a layer (LayerNorm: weight and bias) and the final one; ``biases`` a layer added."""
    h, d = m.hidden, (m.head_dim or m.hidden // m.heads)
    attn = h * m.heads * d * 2 + h * m.kv_heads * d * 2
    per_norm = 2 * h if m.norm == "layernorm" else h
    if m.is_moe:
        mlp = m.experts * 3 * h * m.expert_ffn_hidden + m.experts * h
    else:
        mlp = (3 if m.gated_mlp else 2) * h * m.ffn_hidden
    emb = m.vocab * h * (1 if m.tied_embeddings else 2)
    return emb + m.layers * (attn + mlp + 2 * per_norm + biases) + per_norm


def test_olmoe_phimoe_and_starcoder2_configs_read_their_fields_and_count_their_parameters():
    """OLMoE-1B-7B: 64 experts of 1,024, 8 a token, in every layer, 6,919,096,320 parameters (its
    paper's 6.9B total; the released weights add 65,536 of query and key norms, not timed apart);
    Phi-3.5-MoE: Mixtral's experts with LayerNorm and q, k, v biases, 41.87 billion (its card's
    41.9B) and 6.63 billion a token (its 6.6B active); StarCoder2-15B: an ungated 24,576-wide MLP,
    LayerNorm, biases everywhere, tied, 4,096-key windows in all 40 layers, dropout, 15.66 billion.
    Each count is also written out tensor by tensor here, apart from modelcut's."""
    import json

    from modelcut.core.costs.flops import param_count
    o = catalog.load_hf_config("tests/data/hf/olmoe-1b-7b-like.json")
    assert (o.experts, o.top_k, o.expert_ffn_hidden, o.shared_experts, o.dense_layers) == (64, 8, 1024, 0, 0)
    assert (o.norm, o.gated_mlp, o.tied_embeddings, o.qkv_bias, o.bias) == ("rmsnorm", True, False, False, False)
    assert param_count(o) == _hand_count(o) == 6_919_096_320
    p = catalog.load_hf_config("tests/data/hf/phi-3.5-moe-like.json")
    assert (p.experts, p.top_k, p.expert_ffn_hidden, p.heads, p.kv_heads) == (16, 2, 6400, 32, 8)
    assert (p.norm, p.qkv_bias, p.bias, p.tied_embeddings, p.sliding_layers) == ("layernorm", True, False, False, 32)
    qkv_bias = p.hidden + 2 * p.kv_heads * (p.hidden // p.heads)
    assert param_count(p) == _hand_count(p, biases=qkv_bias)
    assert round(param_count(p) / 1e9, 1) == 41.9
    active = param_count(p) - p.layers * (p.experts - p.top_k) * 3 * p.hidden * p.expert_ffn_hidden
    assert round(active / 1e9, 1) == 6.6
    sc = catalog.load_hf_config("tests/data/hf/starcoder2-15b-like.json")
    assert (sc.gated_mlp, sc.norm, sc.bias, sc.tied_embeddings, sc.kv_heads) == (False, "layernorm", True, True, 4)
    assert (sc.sliding_window, sc.sliding_layers, sc.dropout, sc.max_seq) == (4096, 40, True, 16384)
    d = sc.hidden // sc.heads
    all_biases = sc.hidden * 2 + 2 * sc.kv_heads * d + sc.ffn_hidden + sc.hidden
    assert param_count(sc) == _hand_count(sc, biases=all_biases) == 15_655_899_136
    # defaults where a file leaves a field out (the classes'), and no window or dropout where none is set
    cfg = json.load(open("tests/data/hf/starcoder2-15b-like.json"))
    for k in ("use_bias", "num_key_value_heads", "residual_dropout", "embedding_dropout", "attention_dropout",
              "sliding_window"):
        cfg.pop(k)
    bare = catalog.model_from_hf_config(cfg)
    assert (bare.bias, bare.kv_heads, bare.dropout, bare.sliding_window, bare.sliding_layers) == (True, 2, False, None, 0)
    with pytest.raises(ModelcutError, match="dropout probabilities must be numbers"):
        catalog.model_from_hf_config({**cfg, "residual_dropout": "high"})
    ocfg = json.load(open("tests/data/hf/olmoe-1b-7b-like.json"))
    del ocfg["num_experts"], ocfg["num_experts_per_tok"]
    assert (catalog.model_from_hf_config(ocfg).experts, catalog.model_from_hf_config(ocfg).top_k) == (64, 8)


def test_the_families_before_llama_read_their_fields_and_count_their_parameters():
    """OPT-1.3B: 1,315,753,984, the 1,315,758,080 weights of OPT's layout (its learned positions hold
    2,050 rows, max_position_embeddings plus OPT's offset of 2) less those two rows (2 × 2,048); BLOOM 176B: 176,247,242,752, its model card's 176,247,271,424 less the LayerNorm after
    the embedding (2 × 14,336), as the catalog's BLOOM counts it; Falcon-7B (one key/value head) and
    Falcon-40B in its first, remote-code file (RefinedWeb: the new decoder, n_head_kv 8); GPT-J 6B
    (untied, biases on its MLP only); StarCoder (GPTBigCode: one key/value head, learned positions,
    15.52 billion). Each count is also written out tensor by tensor here, apart from modelcut's."""
    import json

    from modelcut.core.costs.flops import param_count
    o = catalog.load_hf_config("tests/data/hf/opt-1.3b.json")
    assert (o.gated_mlp, o.norm, o.bias, o.tied_embeddings, o.learned_positions, o.dropout) == (
        False, "layernorm", True, True, True, True)
    f = o.ffn_hidden
    assert param_count(o) == _hand_count(o, biases=o.hidden * 4 + f + o.hidden) + o.max_seq * o.hidden
    assert param_count(o) == 1_315_758_080 - 2 * o.hidden
    b = catalog.load_hf_config("tests/data/hf/bloom-176b.json")
    assert param_count(b) == param_count(catalog.model("bloom-176b")) == 176_247_271_424 - 2 * 14336
    assert (b.kv_heads, b.ffn_hidden, b.learned_positions, b.max_seq) == (112, 4 * 14336, False, None)
    f7 = catalog.load_hf_config("tests/data/hf/falcon-7b-like.json")
    assert (f7.heads, f7.kv_heads, f7.bias, f7.tied_embeddings, f7.max_seq) == (71, 1, False, True, 2048)
    assert param_count(f7) == _hand_count(f7)
    f40 = catalog.load_hf_config("tests/data/hf/falcon-40b-rw-like.json")
    assert (f40.layers, f40.heads, f40.kv_heads, f40.ffn_hidden) == (60, 128, 8, 4 * 8192)
    assert param_count(f40) == _hand_count(f40)
    j = catalog.load_hf_config("tests/data/hf/gpt-j-6b.json")
    assert (j.tied_embeddings, j.bias, j.qkv_bias, j.learned_positions) == (False, True, False, False)
    assert param_count(j) == _hand_count(j, biases=j.hidden + j.ffn_hidden + j.hidden)
    sc = catalog.load_hf_config("tests/data/hf/starcoder-like.json")
    d = sc.hidden // sc.heads
    assert (sc.kv_heads, sc.learned_positions, sc.max_seq, sc.dropout) == (1, True, 8192, True)
    all_biases = sc.hidden + 2 * d + sc.hidden + sc.ffn_hidden + sc.hidden
    assert param_count(sc) == _hand_count(sc, biases=all_biases) + sc.max_seq * sc.hidden
    assert round(param_count(sc) / 1e9, 2) == 15.52
    # the classes' defaults and names where a file leaves a field out or names it otherwise
    falcon = json.load(open("tests/data/hf/falcon-7b-like.json"))
    assert catalog.model_from_hf_config({**falcon, "multi_query": False}).kv_heads == 71
    new = {**falcon, "new_decoder_architecture": True, "num_kv_heads": 71}
    assert catalog.model_from_hf_config(new).kv_heads == 71
    assert catalog.model_from_hf_config({**falcon, "new_decoder_architecture": True}).kv_heads == 71
    bloom = json.load(open("tests/data/hf/bloom-176b.json"))
    renamed = {k: v for k, v in bloom.items() if k not in ("n_embed", "n_layer", "num_attention_heads")}
    renamed.update(hidden_size=14336, num_hidden_layers=70, n_head=112)
    assert param_count(catalog.model_from_hf_config(renamed)) == param_count(b)
    starcoder = json.load(open("tests/data/hf/starcoder-like.json"))
    bare = {k: v for k, v in starcoder.items() if k not in ("multi_query", "n_inner", "n_positions")}
    m = catalog.model_from_hf_config(bare)   # GPTBigCodeConfig: multi-query, 4·n_embd, 1,024 positions, dropout 0.1
    assert (m.kv_heads, m.ffn_hidden, m.max_seq, m.dropout) == (1, 4 * 6144, 1024, True)
    opt = json.load(open("tests/data/hf/opt-1.3b.json"))
    with pytest.raises(ModelcutError, match="word_embed_proj_dim 512 is not hidden_size 2048"):
        catalog.model_from_hf_config({**opt, "word_embed_proj_dim": 512})
    with pytest.raises(ModelcutError, match=r"missing 'hidden_size' \(or 'd_model'\)"):
        catalog.model_from_hf_config({k: v for k, v in opt.items() if k != "hidden_size"})


def test_cohere_configs_read_their_norms_windows_and_count_their_parameters():
    """Command A (Cohere2ForCausalLM): LayerNorm, tied, 48 of its 64 layers within 4,096 keys (all
    but every fourth), 111.06 billion parameters (its card's 111B); Command R (CohereForCausalLM,
    CohereConfig's defaults for what the dict leaves out: multi-head, tied), 34.98 billion (35B).
    A Cohere 2 file without the window or its pattern takes Cohere2Config's 4,096 and 4; a window
    that is not a whole number is one line (Gemma 2's too)."""
    from modelcut.core.costs.flops import param_count
    a = catalog.load_hf_config("tests/data/hf/command-a-like.json")
    assert (a.norm, a.tied_embeddings, a.sliding_window, a.sliding_layers, a.kv_heads) == ("layernorm", True, 4096, 48, 8)
    assert round(param_count(a) / 1e9, 2) == 111.06
    r = {"architectures": ["CohereForCausalLM"], "hidden_size": 8192, "intermediate_size": 22528,
         "num_hidden_layers": 40, "num_attention_heads": 64, "vocab_size": 256000}
    m = catalog.model_from_hf_config(r)
    assert (m.kv_heads, m.tied_embeddings, m.norm, m.sliding_window, m.qkv_bias) == (64, True, "layernorm", None, False)
    assert round(param_count(m) / 1e9, 2) == 34.98
    bare = catalog.model_from_hf_config({**r, "architectures": ["Cohere2ForCausalLM"], "num_hidden_layers": 32})
    assert (bare.sliding_window, bare.sliding_layers) == (4096, 24)
    for arch in ("Cohere2ForCausalLM", "Gemma2ForCausalLM"):
        with pytest.raises(ModelcutError, match="sliding_window must be a positive whole number"):
            catalog.model_from_hf_config({**r, "architectures": [arch], "sliding_window": 2047.5})


def test_a_gemma3_vision_language_config_reads_its_text_model():
    """A Gemma3ForConditionalGeneration config of Gemma 3 27B's shape whose text_config leaves out the
    vocabulary and length: read over Gemma3TextConfig's defaults (262,208 words, tied), its 62
    layers attend within 1,024 keys but every sixth (52 windowed), 27.0 billion parameters (the
    vision encoder left out). A text_config that is not an object is one line."""
    import json

    from modelcut.core.costs.flops import param_count
    m = catalog.load_hf_config("tests/data/hf/gemma-3-27b-like.json")
    assert (m.layers, m.hidden, m.vocab, m.head_dim, m.heads, m.kv_heads) == (62, 5376, 262_208, 128, 32, 16)
    assert (m.sliding_window, m.sliding_layers, m.tied_embeddings, m.max_seq) == (1024, 52, True, 131_072)
    assert 26.9e9 < param_count(m) < 27.1e9
    mistral = {"architectures": ["Mistral3ForConditionalGeneration"],
               "text_config": {"hidden_size": 5120, "intermediate_size": 32768, "num_hidden_layers": 40,
                               "num_attention_heads": 32, "num_key_value_heads": 8, "head_dim": 128,
                               "vocab_size": 131072, "sliding_window": None}}
    small = catalog.model_from_hf_config(mistral)
    assert (small.layers, small.head_dim, small.vocab, small.sliding_window) == (40, 128, 131072, None)
    with pytest.raises(ModelcutError, match="vocab_size"):
        del mistral["text_config"]["vocab_size"]
        catalog.model_from_hf_config(mistral)
    cfg = json.load(open("tests/data/hf/gemma-3-27b-like.json"))
    with pytest.raises(ModelcutError, match="text_config must be an object"):
        catalog.model_from_hf_config({**cfg, "text_config": [1]})


def test_a_granite_config_reads_as_llama():
    """GraniteForCausalLM takes Llama's fields: a Granite config counts what the same fields count
    under LlamaForCausalLM, its scalar multipliers aside."""
    from modelcut.core.costs.flops import param_count
    g = {"architectures": ["GraniteForCausalLM"], "hidden_size": 4096, "intermediate_size": 12800,
         "num_hidden_layers": 40, "num_attention_heads": 32, "num_key_value_heads": 8, "vocab_size": 49155,
         "tie_word_embeddings": True, "attention_bias": False, "mlp_bias": False, "residual_multiplier": 0.22}
    m = catalog.model_from_hf_config(g)
    llama = catalog.model_from_hf_config({**g, "architectures": ["LlamaForCausalLM"]})
    assert (m.gated_mlp, m.tied_embeddings, m.bias, m.norm) == (True, True, False, "rmsnorm")
    assert param_count(m) == param_count(llama)


def test_small_llama_and_mistral_entries():
    """Llama 3.2 1B and 3B count their config.json's 1,235,814,400 and 3,212,749,824 parameters;
    Mistral 7B its 7,241,732,096, the same as the model read from its config.json."""
    from modelcut.core.costs.flops import param_count
    assert param_count(catalog.model("llama3.2-1b")) == 1_235_814_400
    assert param_count(catalog.model("Llama-3.2-3B")) == 3_212_749_824
    hf = catalog.load_hf_config("tests/data/hf/mistral-7b.json")
    assert param_count(catalog.model("mistral-7b")) == param_count(hf) == 7_241_732_096
    assert (hf.sliding_window, hf.sliding_layers) == (catalog.model("mistral-7b").sliding_window, 32)
    assert catalog.model("llama3.3-70b") is catalog.model("llama3-70b")


def test_mpt_and_gemma3_options():
    base = json.loads(open("tests/data/hf/mpt-7b.json").read())
    gqa = catalog.model_from_hf_config({**base, "attn_config": {"attn_type": "grouped_query_attention",
                                                                "kv_n_heads": 8, "rope": True},
                                        "ffn_config": {"ffn_type": "mptglu"}, "expansion_ratio": 3.5})
    assert (gqa.kv_heads, gqa.gated_mlp, gqa.ffn_hidden, gqa.learned_positions) == (8, True, 14336, False)
    mqa = catalog.model_from_hf_config({**base, "attn_config": {"attn_type": "multiquery_attention"}})
    assert mqa.kv_heads == 1 and mqa.learned_positions and mqa.max_seq == 2048   # MPTConfig's learned positions
    with pytest.raises(ModelcutError, match="kv_n_heads"):
        catalog.model_from_hf_config({**base, "attn_config": {"attn_type": "grouped_query_attention"}})
    g3 = {"architectures": ["Gemma3ForCausalLM"], "hidden_size": 1152, "intermediate_size": 6912,
          "num_attention_heads": 4, "num_key_value_heads": 1, "head_dim": 256, "num_hidden_layers": 26,
          "vocab_size": 262144, "sliding_window": 512}
    m = catalog.model_from_hf_config(g3)
    assert (m.sliding_window, m.sliding_layers, m.tied_embeddings) == (512, 26 - 4, True)   # layers 5, 11, 17, 23 global
    types = ["full_attention" if i % 2 else "sliding_attention" for i in range(26)]
    assert catalog.model_from_hf_config({**g3, "layer_types": types}).sliding_layers == 13


@pytest.mark.parametrize("change, word", [
    ({"d_model": "big"}, "d_model must be a positive whole number"),
    ({"expansion_ratio": "x"}, "expansion_ratio must be a positive number"),
    ({"attn_config": [1]}, "attn_config and ffn_config must be objects"),
    ({"attn_config": {"attn_type": "weird"}}, "unknown attn_config.attn_type 'weird'"),
    ({"resid_pdrop": "x"}, "dropout probabilities must be numbers"),
])
def test_bad_mpt_configs_are_one_line_errors(change, word):
    base = json.loads(open("tests/data/hf/mpt-7b.json").read())
    with pytest.raises(ModelcutError, match=word):
        catalog.model_from_hf_config({**base, **change})


def test_hf_config_errors():
    with pytest.raises(ModelcutError, match="unknown architecture 'FancyNewForCausalLM'"):
        catalog.load_hf_config("tests/data/hf/unknown-arch.json")
    with pytest.raises(ModelcutError, match="missing 'intermediate_size'"):
        catalog.load_hf_config("tests/data/hf/missing-field.json")
    with pytest.raises(ModelcutError, match="no 'architectures'"):
        catalog.model_from_hf_config({"hidden_size": 4})


@pytest.mark.parametrize("file, key", [("llama3-8b.json", "max_position_embeddings"), ("mpt-7b.json", "max_seq_len")])
@pytest.mark.parametrize("value", [[1, 2], 0, 1.5, "long", True])
def test_a_config_s_longest_sequence_is_a_whole_number_or_one_line(file, key, value):
    """A model's longest sequence of the wrong type was kept as it came (a list made the explorer's
    cached split of the layers raise TypeError, found by fuzzing the web API); it is refused by name."""
    base = json.loads(open(f"tests/data/hf/{file}").read())
    with pytest.raises(ModelcutError, match=f"{key} must be a positive whole number"):
        catalog.model_from_hf_config({**base, key: value})
    assert catalog.model_from_hf_config({**base, key: None}).max_seq in (None, 2048)
    with pytest.raises(ModelcutError, match="max_seq must be"):
        replace(catalog.model("llama3-8b"), max_seq=[8192])


def test_hf_config_from_dict_and_bad_json(tmp_path):
    cfg = json.loads(open("tests/data/hf/llama3-8b.json").read())
    assert catalog.model_from_hf_config(cfg, "x").layers == 32
    bad = tmp_path / "config.json"
    bad.write_text("{not json")
    with pytest.raises(ModelcutError, match="not valid JSON"):
        catalog.load_hf_config(bad)


# ---------------------------------------------------------------- development set 2

#: shared/reference/published-runs-dev2.md: cross-validation group (one per source) -> runs.
DEV2_GROUPS = {"megatron-readme-2021": 10, "palm": 1, "mt-nlg": 3, "bloom": 1, "opt": 1, "glm": 1, "nemotron4": 3,
               "nemo-24.07": 12, "megatron-bridge-25.11": 6, "deepseek-v3": 1, "nemo-automodel": 6}


def dev2_runs():
    groups = {rid: st.group for rid, st in catalog.run_settings().items()}
    return [r for r in catalog.published_runs() if groups[r.id] in DEV2_GROUPS]


def test_dev2_runs_load_with_their_sources_and_groups():
    runs = dev2_runs()
    assert len(runs) == 45
    settings = catalog.run_settings()
    count = {}
    for r in runs:
        st = settings[r.id]
        count[st.group] = count.get(st.group, 0) + 1
        assert r.set == "dev"
        assert r.run.layout.gpus == r.gpus
        assert r.run.training.global_batch > 0
        assert r.source and st.source and r.notes
        assert st.framework in catalog.framework_names()
        assert st.micro_batch is not None and st.vpp is not None and st.recompute is not None
        assert "assumed" in r.notes or "inferred" in r.notes or "stated" in r.notes
        if r.published_step_time_s is None:
            # no step time: either a figure in a FLOP count modelcut reproduces, or left out
            assert (r.flop_convention != "source" and (r.published_tflops or r.published_mfu)) or not r.validate
    assert count == DEV2_GROUPS


def test_dev2_precision_and_runs_left_out():
    from modelcut.analysis.measured import catalog_measured
    runs = {r.id: r for r in dev2_runs()}
    fp8 = {rid for rid, r in runs.items() if r.precision == "fp8"}
    nemo = {rid for rid in runs if rid.startswith("nemo2407-")}
    bridge_fp8 = {"mbridge2511-llama3-8b-8", "mbridge2511-llama3-70b-64", "mbridge2511-llama3.1-405b-1024",
                  "mbridge2511-qwen3-30b-a3b-16", "mbridge2511-qwen3-235b-a22b-256"}
    assert fp8 == nemo | bridge_fp8 | {"deepseek-v3-2048"}
    assert all(runs[r].fp8_recipe is None for r in nemo)                  # NeMo 24.07: recipe not stated
    assert all(runs[r].fp8_recipe == "current" for r in bridge_fp8)       # FP8-CS
    assert runs["deepseek-v3-2048"].fp8_recipe == "blockwise"
    assert runs["mbridge2511-gpt-oss-120b-64"].precision == "bf16"
    assert {rid for rid, r in runs.items() if not r.validate} == {"opt-175b-992", "deepseek-v3-2048",
                                                                 "mbridge2511-qwen3-30b-a3b-16"}
    # ep 32 over tp 2 · dp 16 with etp 1: the expert grid holds it (validated since it could be laid out)
    assert runs["mbridge2511-qwen3-235b-a22b-256"].validate and runs["mbridge2511-qwen3-235b-a22b-256"].run.layout.etp == 1
    assert all(runs[rid].notes.startswith("left out of validation") for rid in runs if not runs[rid].validate)
    measured = {m.id for m in catalog_measured()}
    assert {rid for rid, r in runs.items() if r.in_validation} <= measured
    assert not measured & {rid for rid, r in runs.items() if not r.in_validation}
    # the FP8 rows are scored in FP8 (issue 15): 26 16-bit rows and 16 of the 18 FP8 rows (not
    # DeepSeek-V3's, nor Megatron-Bridge's Qwen3 30B, a known software regression)
    assert len([r for r in runs.values() if r.in_validation]) == 42
    assert all(runs[r].run.training.precision == "fp8" for r in fp8)
    assert all(runs[r].run.training.fp8_recipe == "current" for r in bridge_fp8)


def test_dev2_fp8_and_unflagged_runs_stay_out_of_the_default_table():
    from modelcut.analysis.measured import measured_run
    pr = catalog.published_run("opt-175b-992")
    with pytest.raises(ModelcutError, match="validate = false"):
        measured_run(pr)          # what the flag stands for: no figure modelcut can compare


def _tokens_step(r):
    t = r.run.training
    return t.global_batch * t.seq_len / (r.published_tokens_per_s * r.gpus)


def test_dev2_step_times_round_trip_through_tokens_per_second():
    """Where a source (or the reference file) gives tokens/s per GPU beside the step time, each
    follows from the other: step = global batch x sequence / (tokens/s per GPU x GPUs)."""
    runs = [r for r in dev2_runs() if r.published_tokens_per_s and r.published_step_time_s]
    assert len(runs) == 1 + 1 + 3 + 12 + 6 + 6        # PaLM, BLOOM, Nemotron-4, NeMo, Bridge, AutoModel
    for r in runs:
        assert _tokens_step(r) == pytest.approx(r.published_step_time_s, rel=2e-3), r.id


def test_dev2_published_figures_in_their_sources_flop_conventions():
    from modelcut.analysis.measured import counted_flops, published_flops
    from modelcut.core.costs import flops
    runs = {r.id: r for r in dev2_runs()}
    # Megatron-LM README: step time = eq. 3's F / (GPUs x TFLOP/s) (inferred), modelcut's own count.
    for rid, r in runs.items():
        if rid.startswith("megatron-readme-"):
            assert r.flop_convention is None
            assert counted_flops(r.run) / (r.gpus * r.published_tflops * 1e12) == pytest.approx(
                r.published_step_time_s, rel=5e-3), rid
            assert r.published_tflops * 1e12 / 312e12 == pytest.approx(r.published_pct_peak / 100, abs=0.006)
    # MT-NLG and BLOOM: TFLOP/s count recomputation (eq. 3), modelcut's own count.
    for rid, rel in (("mtnlg-530b-2240", 5e-3), ("mtnlg-530b-2800", 6e-3), ("mtnlg-530b-3360", 5e-3),
                     ("bloom-176b-384", 1e-4)):
        r = runs[rid]
        assert counted_flops(r.run) / (r.gpus * r.published_step_time_s * 1e12) == pytest.approx(
            r.published_tflops, rel=rel), rid
    # BLOOM's log: 19.561 samples/s.
    assert 2048 / runs["bloom-176b-384"].published_step_time_s == pytest.approx(19.561, rel=1e-4)
    # PaLM: MFU = tokens/s x (6N + 12·L·H·Q·T) / peak ("palm" model FLOPs, 275 TFLOP/s per chip).
    palm = runs["palm-540b-6144"]
    assert published_flops(palm) / (palm.gpus * palm.published_step_time_s * 275e12) == pytest.approx(0.462, abs=1e-3)
    assert palm.published_tokens_per_s * palm.gpus == pytest.approx(238.3e3, rel=1e-3)
    # GLM-130B: HFU / MFU = 4/3, full recomputation in the "palm" convention.
    glm = runs["glm-130b-768"]
    hfu = flops.executed_flops(glm.run.model, glm.run.training, "palm") / published_flops(glm)
    assert hfu == pytest.approx(glm.published_hfu / glm.published_mfu, rel=4e-3)     # the percentages' rounding
    # Nemotron-4: MFU = 6·N·(tokens/s per GPU) / 989 (N ≈ 15.7B; the catalog's shape holds 15.63B).
    for rid in ("nemotron4-15b-768", "nemotron4-15b-1536", "nemotron4-15b-2304"):
        r = runs[rid]
        n = flops.param_count(r.run.model)
        assert 6 * n * r.published_tokens_per_s / 989e12 == pytest.approx(r.published_mfu, rel=1e-2), rid
    # AutoModel: MFU = TFLOP/s / 989 (inferred).
    for rid, r in runs.items():
        if rid.startswith("automodel-"):
            assert r.published_tflops / 989 == pytest.approx(r.published_mfu, abs=6e-4), rid


def _per_token(model, seq, attention):
    """6 x (transformer-layer + output-layer parameters, active experts) + attention·L·h·s."""
    from modelcut.core.costs import flops
    moe = flops.moe_layer_count(model)
    layers = ((model.layers - moe) * flops.layer_params(model, False, active=True)
              + moe * flops.layer_params(model, True, active=True))
    return 6 * (layers + model.vocab * model.hidden) + attention * model.layers * model.q_dim * seq


@pytest.mark.parametrize("prefix,attention,rel", [("nemo2407-", 12, 1.5e-3),    # attention in full (inferred)
                                                  ("mbridge2511-llama", 6, 1.5e-3),  # causal halved (inferred)
                                                  ("mbridge2511-qwen3", 6, 1e-2)])
def test_nemo_and_bridge_tflops_per_token_match_the_assumed_shapes(prefix, attention, rel):
    """The reference file's check of the FLOP conventions, which also checks the assumed model shapes:
    TFLOP/s / tokens/s = FLOPs per token of the catalog's shape, to the printed figures' rounding."""
    runs = [r for r in dev2_runs() if r.id.startswith(prefix)]
    assert runs
    for r in runs:
        ratio = r.published_tflops * 1e12 / r.published_tokens_per_s
        assert ratio == pytest.approx(_per_token(r.run.model, r.run.training.seq_len, attention), rel=rel), r.id


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


def test_dev2_bad_rows_are_one_line_errors(monkeypatch):
    from modelcut.catalog import runs as runs_mod
    base = {"id": "x", "family": "f", "model": "gpt-1.7b", "gpu": "a100", "gpus": 8,
            "layout": {"tp": 1, "pp": 1, "dp": 8}, "training": {"seq_len": 2048, "global_batch": 8}, "source": "s"}
    for extra, msg in (({"precision": "fp4"}, "precision must be"), ({"fp8_recipe": "current"}, "fp8_recipe given"),
                       ({"flop_convention": "mine"}, "flop_convention must be"), ({"validate": False}, "reason in notes"),
                       ({"published_tflop": 1}, "unknown key")):
        monkeypatch.setattr(runs_mod, "_toml", lambda name, e=extra: {"run": [{**base, **e}]})
        runs_mod._runs.cache_clear()
        with pytest.raises(ModelcutError, match=msg):
            runs_mod._runs()
    runs_mod._runs.cache_clear()


def test_run_settings_carry_overlap_overrides_into_validation(monkeypatch):
    """A run's settings may switch its preset's overlaps (as --overlap does): validation, calibration
    and ``predict --run`` all time it so; a bad table is a one-line error naming the run."""
    from modelcut.analysis.measured import measured_run
    from modelcut.catalog import runs as runs_mod
    from modelcut.service.predict import catalog_run
    st = catalog.run_settings()["nemotron4-15b-768"]
    assert st.overlap == {"tp_comm": True} and st.overlap_text() == "tp_comm=on"
    assert measured_run(catalog.published_run(st.id), st=st).overlap == {"tp_comm": True}
    assert catalog_run(st.id, "default")[2] == {"framework": "megatron-core", "overlap": "tp_comm=on"}
    assert catalog.run_settings()["megatron-1.7b"].overlap_text() is None
    for bad in ({"tp_comm": "yes"}, {"nothing": True}, "tp_comm=on"):
        monkeypatch.setattr(runs_mod, "_toml", lambda name, b=bad: {"settings": [
            {"id": "x", "framework": "nemo", "overlap": b}]})
        runs_mod.run_settings.cache_clear()
        with pytest.raises(ModelcutError, match="runs_dev.toml 'x': overlap"):
            runs_mod.run_settings()
    runs_mod.run_settings.cache_clear()


def test_mtnlg_micro_batch_from_its_scaling():
    """MT-NLG's micro-batch is not stated; runs_dev.toml infers 2 from the source's own three
    iteration times. A 1F1B step is t·(m + p − 1) slots plus c outside the pipeline (gradient sync,
    optimizer). Fitted through the three rows (dp 8, 10, 12 at a fixed batch of 1920), c is +6.0 s
    with micro-batch 1 and −0.7 s with micro-batch 2 (residual 0.3 s either way): only micro-batch 2
    leaves c near the few tenths of a second that work takes."""
    import numpy as np
    runs = [catalog.published_run(f"mtnlg-530b-{g}") for g in (2240, 2800, 3360)]
    settings = catalog.run_settings()
    assert {settings[r.id].micro_batch for r in runs} == {2} == {r.run.training.micro_batch for r in runs}
    T = np.array([r.published_step_time_s for r in runs])
    outside = {}
    for b in (1, 2):
        slots = np.array([r.run.training.global_batch / (r.run.layout.dp * b) + r.run.layout.pp - 1 for r in runs])
        t, c = np.polyfit(slots, T, 1)
        assert np.abs(T - (t * slots + c)).max() < 0.35
        outside[b] = c
    assert outside[1] == pytest.approx(6.0, abs=0.05) and outside[2] == pytest.approx(-0.7, abs=0.05)



@pytest.mark.parametrize("name,total,active,rel", [
    # each family's own stated size (paper tables and model cards), to the figure's printed precision
    ("llama-7b", 6.7e9, None, 1e-2), ("llama-13b", 13.0e9, None, 2e-3),     # Touvron et al. 2023, Table 2
    ("llama-33b", 32.5e9, None, 2e-3), ("llama-65b", 65.2e9, None, 2e-3),
    ("codellama-34b", 33.7e9, None, 2e-3),
    ("gpt3-125m", 125e6, None, 5e-3), ("gpt3-350m", 350e6, None, 2e-2),    # Brown et al. 2020, Table 2.1
    ("gpt3-760m", 760e6, None, 5e-3), ("gpt3-1.3b", 1.3e9, None, 2e-2),
    ("gpt3-2.7b", 2.7e9, None, 2e-2), ("gpt3-6.7b", 6.7e9, None, 1e-2), ("gpt3-13b", 13.0e9, None, 2e-2),
    ("mpt-7b", 6.7e9, None, 1e-2), ("mpt-30b", 30e9, None, 1e-2),
    ("qwen2.5-7b", 7.61e9, None, 2e-3), ("qwen2.5-72b", 72.7e9, None, 2e-3),  # Qwen2.5 model cards
    ("qwen3-8b", 8.2e9, None, 5e-3), ("qwen3-32b", 32.8e9, None, 5e-3),      # Qwen3 model cards
    ("deepseek-v2", 236e9, 21e9, 1e-2), ("deepseek-v2-lite", 15.7e9, 2.4e9, 1e-2),  # DeepSeek-V2 report
    # Llama 4 model card: 400B (Maverick); Scout's 109B holds its vision encoder, the text model 107.8B
    ("llama4-maverick", 400e9, None, 2e-3), ("llama4-scout", 109e9, None, 1.5e-2),
])
def test_further_families_count_their_stated_sizes(name, total, active, rel):
    """Active parameters less the input embedding (a lookup, which DeepSeek's activated counts leave
    out: V2-Lite's 2.4B is 2.45B without it, 2.66B with it)."""
    from modelcut.core.costs import flops
    m = catalog.model(name)
    assert m.source
    assert flops.param_count(m) == pytest.approx(total, rel=rel)
    if active is not None:
        assert flops.param_count(m, active=True) - m.vocab * m.hidden == pytest.approx(active, rel=3 * rel)


def test_deepseek_v2_entries_are_what_their_configs_read_as():
    """The catalog's DeepSeek-V2 shapes are the ones a config.json with the report's fields reads as
    (MLA as the equal-weight GQA shape both ways)."""
    from dataclasses import replace
    from modelcut.catalog.hf_config import model_from_hf_config
    base = dict(architectures=["DeepseekV2ForCausalLM"], qk_nope_head_dim=128, qk_rope_head_dim=64, v_head_dim=128,
                kv_lora_rank=512, n_shared_experts=2, num_experts_per_tok=6, first_k_dense_replace=1,
                vocab_size=102400, tie_word_embeddings=False, hidden_act="silu", moe_layer_freq=1)
    cfgs = {"deepseek-v2": dict(base, num_hidden_layers=60, hidden_size=5120, num_attention_heads=128,
                                num_key_value_heads=128, q_lora_rank=1536, n_routed_experts=160,
                                moe_intermediate_size=1536, intermediate_size=12288),
            "deepseek-v2-lite": dict(base, num_hidden_layers=27, hidden_size=2048, num_attention_heads=16,
                                     num_key_value_heads=16, q_lora_rank=None, n_routed_experts=64,
                                     moe_intermediate_size=1408, intermediate_size=10944)}
    for name, cfg in cfgs.items():
        cat = catalog.model(name)
        hf = model_from_hf_config(dict(cfg, max_position_embeddings=cat.max_seq), name)
        assert replace(hf, source=cat.source) == cat


@pytest.mark.parametrize("spelling,name", [
    ("meta-llama/Llama-3.1-8B", "llama3-8b"), ("meta-llama/Meta-Llama-3-70B", "llama3-70b"),
    ("Meta-Llama-3.1-405B", "llama3-405b"), ("meta-llama/Llama-2-7b-hf", "llama2-7b"),
    ("huggyllama/llama-65b", "llama-65b"), ("mosaicml/mpt-30b", "mpt-30b"), ("Qwen/Qwen2.5-72B", "qwen2.5-72b"),
    ("Qwen/Qwen3-8B", "qwen3-8b"), ("mistralai/Mixtral-8x7B-v0.1", "mixtral-8x7b"),
    ("deepseek-ai/DeepSeek-V2-Lite", "deepseek-v2-lite"), ("GPT3-XL", "gpt3-1.3b"), ("gpt3-5b", "nemo-gpt3-5b"),
])
def test_models_by_their_hub_and_stack_names(spelling, name):
    """A model is found under its Hugging Face repository id (owner, "-hf" and Meta's "Meta-" dropped)
    and under the names NeMo gives its GPT-3 configurations."""
    assert catalog.model(spelling).name == name


def test_an_unknown_hub_id_is_still_a_one_line_error():
    with pytest.raises(ModelcutError, match="unknown model 'acme/Llama-9-1B'"):
        catalog.model("acme/Llama-9-1B")


@pytest.mark.parametrize("name", [m.name for m in catalog.all_models()])
def test_every_catalog_model_predicts_on_one_node(name):
    """Each model of the catalog runs through the default model on one node of H100s under FSDP
    (experts cut over the eight ranks where they divide): a positive step and an MFU within (0, 1]."""
    from math import gcd
    from modelcut.core.costs import flops
    from modelcut.core.specs import Layout, Run, Training
    from helpers import predict_default
    m = catalog.model(name)
    ep = gcd(m.experts, 8) if m.is_moe else 1
    run = Run(m, "h100-sxm5-80gb", Layout(tp=1, pp=1, dp=8, ep=ep),
              Training(seq_len=2048, global_batch=8, micro_batch=1, recompute="full"))
    pred = predict_default(run, catalog.hardware(run.gpu), framework="fsdp")
    assert pred.step_time_s > 0
    assert 0 < pred.mfu <= 1
    assert flops.param_count(m) > 0


@pytest.mark.parametrize("arch,change,word", [
    ("Qwen2MoeForCausalLM", {"mlp_only_layers": 3}, "mlp_only_layers must be a list of layer numbers"),
    ("DeepseekV3ForCausalLM", {"first_k_dense_replace": "x"}, "first_k_dense_replace must be a whole number"),
    ("DeepseekV3ForCausalLM", {"num_attention_heads": 10**12, "hidden_size": 0}, "hidden_size must be a positive"),
    ("LlamaForCausalLM", {"head_dim": {"a": 1}}, "head_dim must be a positive whole number"),
    ("GPT2LMHeadModel", {"n_embd": [1]}, "n_embd must be a positive whole number"),
    ("Qwen2MoeForCausalLM", {"shared_expert_intermediate_size": "x"}, "shared_expert_intermediate_size must be"),
    ("MixtralForCausalLM", {"num_local_experts": [1, "a"]}, "experts must be an integer"),
])
def test_malformed_config_fields_are_one_line_errors(arch, change, word, tmp_path):
    """A field of the wrong type or an absurd size is one line naming the file's architecture (and the
    field where the reader checks it), by the catalog reader as by the run file; never a traceback or a
    search over a trillion head counts."""
    cfg = {"architectures": [arch], "hidden_size": 512, "num_hidden_layers": 4, "num_attention_heads": 8,
           "num_key_value_heads": 2, "intermediate_size": 1536, "vocab_size": 32000, "n_embd": 512, "n_layer": 4,
           "n_head": 8, "n_positions": 1024, "num_local_experts": 4, "num_experts_per_tok": 2, "num_experts": 4,
           "moe_intermediate_size": 256, "n_routed_experts": 4, "kv_lora_rank": 64, "qk_nope_head_dim": 32,
           "qk_rope_head_dim": 16, "v_head_dim": 32, **change}
    with pytest.raises(ModelcutError) as e:
        catalog.model_from_hf_config(cfg)
    assert word in str(e.value) and "\n" not in str(e.value)
    path = tmp_path / "config.json"
    path.write_text(json.dumps(cfg))
    with pytest.raises(ModelcutError, match="config.json"):
        catalog.load_hf_config(path)


def test_llama4_counts_as_docs_long_context_and_moe_gives_them():
    """The figures docs/long-context-and-moe.md prints for Llama 4: total and active (with the input
    embedding) parameters, 107.8 B / 17.2 B (Scout) and 400.7 B / 17.2 B (Maverick)."""
    from modelcut.core.costs import flops
    for name, total, active in (("llama4-scout", 107.8e9, 17.2e9), ("llama4-maverick", 400.7e9, 17.2e9)):
        m = catalog.model(name)
        assert round(flops.param_count(m) / 1e8) == round(total / 1e8)
        assert round(flops.param_count(m, active=True) / 1e8) == round(active / 1e8)


def test_a_left_out_run_the_model_cannot_take_is_refused_by_name(capsys):
    """OPT-175B's catalogued batch (1,024 sequences, inferred) is no multiple of its dp 124: predict
    --run and GET /api/runs/{id} refuse it in one line that names the run, the rule it breaks and
    why it is left out of validation, not with the bare rule."""
    from fastapi.testclient import TestClient
    from modelcut.cli import main
    from modelcut.web.app import create_app
    assert main(["predict", "--run", "opt-175b-992"]) == 2
    err = capsys.readouterr().err.strip()
    assert "\n" not in err
    assert err.startswith("modelcut: error: opt-175b-992 cannot be predicted as catalogued: global_batch (1024)")
    assert "left out of validation" in err
    r = TestClient(create_app()).get("/api/runs/opt-175b-992")
    assert r.status_code == 422 and r.json()["detail"] == err.removeprefix("modelcut: error: ")
