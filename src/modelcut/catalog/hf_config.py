"""Models from Hugging Face ``config.json`` files.

Field names and defaults follow the transformers configuration classes (src/transformers/models/
<family>/configuration_<family>.py): LlamaConfig, MistralConfig, Qwen2Config, MixtralConfig,
Qwen2MoeConfig, Qwen3Config, Qwen3MoeConfig, DeepseekV3Config (and DeepSeek-V2's, which has the
same fields), GptOssConfig, GPT2Config, GPTNeoXConfig, NemotronConfig, GemmaConfig, Gemma2Config,
Gemma3TextConfig, OlmoConfig, Olmo2Config, Phi3Config, GraniteConfig, GraniteMoeConfig,
Glm4MoeConfig, OlmoeConfig, PhimoeConfig, Starcoder2Config, CohereConfig, Cohere2Config, OPTConfig,
BloomConfig, FalconConfig, GPTJConfig, GPTBigCodeConfig; and MosaicML's MPTConfig (llm-foundry
llmfoundry/models/mpt/configuration_mpt.py).
The architecture is read from ``architectures[0]``, else from ``model_type``. A missing required
field or an unknown architecture is a one-line error naming it.

Mixture-of-experts fields, by family:

* Mixtral: ``num_local_experts``, ``num_experts_per_tok``; each expert is ``intermediate_size``
  wide; every layer has experts.
* Qwen2-MoE / Qwen3-MoE: ``num_experts``, ``num_experts_per_tok``, ``moe_intermediate_size``;
  Qwen2-MoE's one shared expert of ``shared_expert_intermediate_size`` counts as that width over
  ``moe_intermediate_size`` experts (Qwen1.5-MoE-A2.7B: 5632 / 1408 = 4, as its model card says:
  four shared experts); ``mlp_only_layers`` must be the leading layers and ``decoder_sparse_step``
  1 (modelcut models dense-first layers only).
* DeepSeek-V2/V3: ``n_routed_experts``, ``num_experts_per_tok``, ``moe_intermediate_size``,
  ``n_shared_experts``, ``first_k_dense_replace`` (leading dense layers of width
  ``intermediate_size``), ``moe_layer_freq`` 1. Multi-head latent attention's widths
  (``q_lora_rank``, ``kv_lora_rank``, ``qk_nope_head_dim``, ``qk_rope_head_dim``, ``v_head_dim``)
  are kept on the spec, and the default model times and counts the layer by them
  (docs/long-context-and-moe.md, "MLA"); ``kv_heads``/``head_dim`` get the equal-weight
  grouped-query shape :func:`mla_equivalent_shape` gives, which only the deck's seed model runs.
* Llama 4 (Llama4TextConfig; a Llama4ForConditionalGeneration config's ``text_config``, its vision
  encoder left out): ``num_local_experts`` routed experts and one shared expert, each
  ``intermediate_size`` wide, ``num_experts_per_tok`` of them routed; the layers ``moe_layers`` names
  (default range(step − 1, L, step), step = ``interleave_moe_layer_step``, 1) hold them, the others a
  dense MLP of ``intermediate_size_mlp``; the layers ``layer_types`` names ``"chunked_attention"``
  (default: those ``no_rope_layers`` marks 1, all but every ``no_rope_layer_interval``-th, 4) attend
  within blocks of ``attention_chunk_size`` tokens.
* Qwen2-MoE / Qwen3-MoE's ``decoder_sparse_step`` k > 1 (experts in the layers i with (i + 1) % k = 0)
  is ``moe_every``, where no ``mlp_only_layers`` are listed beside it.
* GPT-OSS: ``num_local_experts``, ``num_experts_per_tok``, experts ``intermediate_size`` wide, in
  every layer; biases on the attention projections and the experts (``attention_bias``); the
  experts' GLU clamped where ``swiglu_limit`` is set (``glu_clamp``); ``sliding_window`` keys for
  the layers ``layer_types`` names ``"sliding_attention"`` (without the list, every other layer
  from the first, GptOssConfig's default in transformers' configuration_gpt_oss.py).

Other families:

* MPT: ``d_model``, ``n_heads``, ``n_layers``, an MLP ``expansion_ratio`` × ``d_model`` wide (default 4;
  ``ffn_config.ffn_type`` ``"mptglu"`` gated), ``vocab_size``, ``max_seq_len``; biases unless ``no_bias``;
  LayerNorm; embeddings tied unless ``tie_word_embeddings`` is false; ``attn_config.attn_type``
  ``multiquery_attention`` (one KV head) or ``grouped_query_attention`` (``kv_n_heads``); learned
  positions (``learned_pos_emb``, MPTConfig's default) unless ``attn_config`` turns on ALiBi or RoPE.
  ALiBi adds its bias inside the attention kernel (FlashAttention-2's ``alibi_slopes``); modelcut times
  such a model as a RoPE one, whose rotary kernel it charges: a small overcount of elementwise work.
  Dropout where ``resid_pdrop``, ``emb_pdrop`` or ``attn_config.attn_pdrop`` is above 0.
* Nemotron (NemotronConfig): squared ReLU as a plain MLP (not gated), LayerNorm (``layernorm1p``), no
  linear biases unless ``attention_bias`` / ``mlp_bias``, untied, ``head_dim`` where given.
* Gemma, Gemma 2, Gemma 3 (text; and a Gemma3ForConditionalGeneration config's ``text_config``, its
  vision encoder left out, over Gemma3TextConfig's defaults: :data:`_TEXT_DEFAULTS`): a gated (GeGLU)
  MLP, RMSNorm, ``head_dim`` (256 for most sizes), tied embeddings (their configs' default); Gemma 2
  and 3 attend within ``sliding_window`` on the layers ``layer_types`` names ``"sliding_attention"``,
  else Gemma 2's every other layer from the first (Gemma2Config) and Gemma 3's five of every six
  (``sliding_window_pattern``, default 6: layer i global when (i + 1) % 6 == 0). Gemma 2's logit
  soft-capping and their extra norms are not timed apart.
* Mistral Small 3.1 and later (Mistral3ForConditionalGeneration): its ``text_config`` read as
  Mistral's, the vision encoder left out.
* IBM Granite (GraniteConfig) is read as Llama (the same fields: ``attention_bias``, ``mlp_bias``,
  untied unless ``tie_word_embeddings``) and Granite MoE (GraniteMoeConfig) as Mixtral
  (``num_local_experts``, ``num_experts_per_tok``, experts ``intermediate_size`` wide in every layer);
  their scalar multipliers (``embedding_multiplier``, ``residual_multiplier``, ``attention_multiplier``,
  ``logits_scaling``) are not timed apart.
* GLM-4.5 (Glm4MoeForCausalLM, transformers ``models/glm4_moe``): DeepSeek-V3's expert fields
  (``n_routed_experts``, ``num_experts_per_tok``, ``moe_intermediate_size``, ``n_shared_experts``
  shared experts of that width, ``first_k_dense_replace`` leading dense layers of
  ``intermediate_size``) around grouped-query attention of ``head_dim``; biases on q, k and v only
  (``attention_bias``; ``Glm4MoeAttention``'s output projection has none); untied unless
  ``tie_word_embeddings``. Its query and key norms (``use_qk_norm``) and half-width rotary
  (``partial_rotary_factor`` 0.5) are not timed apart; its multi-token prediction layer
  (``num_nextn_predict_layers``) is not counted, as DeepSeek-V3's is not.
* OLMo, OLMo 2: Llama-shaped (SwiGLU, RoPE, untied); OLMo 2's query and key norms not timed apart.
* OLMoE (OlmoeConfig, transformers ``models/olmoe/configuration_olmoe.py`` at 008e5743): ``num_experts``
  routed experts (class default 64), ``num_experts_per_tok`` (8) of them, each ``intermediate_size``
  wide, in every layer, no shared expert; OLMo's Llama shape otherwise (RMSNorm, SwiGLU, untied),
  biases on the attention's projections where ``attention_bias`` (counted on q, k and v); its query
  and key norms and ``clip_qkv`` are not timed apart.
* Phi-3.5-MoE (PhimoeConfig, transformers ``models/phimoe/configuration_phimoe.py`` at 040e1a7e):
  Mixtral's expert fields (``num_local_experts``, default 16; ``num_experts_per_tok``, 2; experts
  ``intermediate_size`` wide, every layer) around grouped-query attention, with LayerNorm where
  Mixtral has RMSNorm (``modeling_phimoe.py``: ``nn.LayerNorm`` in each layer and at the end); biases
  on the attention's projections where ``attention_bias`` (counted on q, k and v; the output
  projection's and ``lm_head_bias``'s are left out, a vector each); untied (its default); every layer
  within ``sliding_window`` where it is set. Its router's jitter and sparse mixer are not timed apart.
* StarCoder 2 (Starcoder2Config, transformers ``models/starcoder2/configuration_starcoder2.py`` at
  008e5743): an ungated GELU MLP (``c_fc``, ``c_proj``) ``intermediate_size`` wide, LayerNorm, biases on
  every linear layer unless ``use_bias`` is false, grouped-query attention (``num_key_value_heads``,
  class default 2), tied embeddings (its default), every layer within ``sliding_window`` where it is
  set (StarCoder2-15B: 4,096), dropout where ``residual_dropout``, ``embedding_dropout`` or
  ``attention_dropout`` is above 0.
* Cohere's Command R and R+ (CohereConfig) and Command R7B and A (Cohere2Config; transformers
  ``models/cohere`` and ``models/cohere2`` at 008e5743): Llama's fields around LayerNorm, tied
  embeddings (their default), q, k and v biases where ``attention_bias``; Cohere 2 attends within
  ``sliding_window`` keys (class default 4,096) on the layers ``layer_types`` names
  ``"sliding_attention"``, else on all but every ``sliding_window_pattern``-th (default 4). Their
  layers run attention and the MLP side by side from one norm (a parallel block; modelcut counts
  and times a norm before each, a vector a layer more, and its LayerNorm's bias, which Cohere's
  has not), and ``logit_scale`` and ``use_qk_norm`` are not timed apart.
* Phi-3 (Phi3Config, transformers v4.43.0 ``configuration_phi3.py``; Phi-3.5-mini and Phi-4 share the
  class): Llama-shaped, its fused ``qkv_proj`` and ``gate_up_proj`` the same products; no biases;
  untied (its default); ``num_key_value_heads`` default the heads; every layer within
  ``sliding_window`` keys where it is set (``modeling_phi3.py`` passes it to every layer's attention;
  Phi-3-mini-4k: 2,047); dropout where ``resid_pdrop``, ``embd_pdrop`` or ``attention_dropout`` is
  above 0; a ``partial_rotary_factor`` below 1 (Phi-4-mini) rotates fewer channels: the rotary kernel
  is timed whole, a small overcount.

The families before Llama (transformers ``models/{opt,bloom,falcon,gptj,gpt_bigcode}/configuration_*.py``):

* OPT (OPTConfig): ``hidden_size`` (or ``d_model``), ``num_hidden_layers``, ``num_attention_heads`` (multi-head),
  an ungated ReLU MLP ``ffn_dim`` wide, ``vocab_size``; learned positions over ``max_position_embeddings``
  (default 2,048; the two extra rows of OPT's position offset are not counted), LayerNorm, biases unless
  ``enable_bias`` is false, tied (its default), dropout where ``dropout`` (default 0.1),
  ``attention_dropout`` or ``activation_dropout`` is above 0. A ``word_embed_proj_dim`` other than the
  hidden size (OPT-350M's projected embeddings) is one line: not modelled.
* BLOOM (BloomConfig): ``hidden_size`` (or ``n_embed``), ``n_layer``, ``n_head`` (or their
  ``num_*`` names), multi-head, a GELU MLP 4·hidden wide, LayerNorm, biases, tied; ALiBi, which has no
  parameters, timed as the MPT's above; its LayerNorm after the embedding (2·hidden) not counted, as the
  catalog's BLOOM 176B does not; dropout where ``hidden_dropout`` or ``attention_dropout`` is above 0.
* Falcon (FalconConfig; the first remote-code files' ``RWForCausalLM`` with ``n_head``, ``n_layer`` and
  ``n_head_kv``): the new decoder (``new_decoder_architecture``, or model type ``RefinedWeb``: Falcon-40B and
  180B) keeps ``num_kv_heads`` (or ``n_head_kv``) key/value heads, the older one one (``multi_query``, its
  default) or all; a GELU MLP ``ffn_hidden_size`` wide (default 4·hidden), LayerNorm, no biases unless
  ``bias``, tied, RoPE (ALiBi timed as RoPE), ``max_position_embeddings`` default 2,048. Its attention and
  MLP run side by side (a parallel block, counted and timed as a serial one, as Cohere's); Falcon-7B's one
  norm a layer is counted as two (2·hidden a layer more).
* GPT-J (GPTJConfig): ``n_embd``, ``n_layer``, ``n_head`` (multi-head), an ungated MLP ``n_inner`` wide (default
  4·``n_embd``), RoPE on ``rotary_dim`` of each head (timed whole), LayerNorm, biases on the MLP and none on
  q, k and v (the output projection, which has none, is counted with one: a vector a layer; the output
  layer's bias is not counted), tied unless ``tie_word_embeddings`` is false (GPT-J 6B's file: false), a
  parallel block as Falcon's, ``n_positions`` default 2,048, dropout where a ``*_pdrop`` is above 0.
* GPTBigCode (GPTBigCodeConfig: StarCoder, SantaCoder): ``n_embd``, ``n_layer``, ``n_head``, one key/value head
  where ``multi_query`` (its default) else all, an ungated MLP ``n_inner`` wide (default 4·``n_embd``), learned
  positions over ``n_positions`` (default 1,024), LayerNorm, biases, tied (its default), dropout where a
  ``*_pdrop`` is above 0 (each 0.1 where the file leaves it out).

RoPE scaling: a YaRN ``rope_scaling`` gives the attention factor its cos and sin are multiplied
by (``rope_mscale``), as transformers computes it (modeling_rope_utils.py
``_compute_yarn_parameters``): ``attention_factor`` where the config sets it; else, with both
``mscale`` and ``mscale_all_dim``, m(factor, mscale)/m(factor, mscale_all_dim); else m(factor, 1),
with m(s, k) = 0.1·k·ln s + 1 for s > 1 (1 otherwise). GPT-OSS (factor 32): 1.3466; DeepSeek-V3
(factor 40, mscale = mscale_all_dim = 1): 1.
"""

from __future__ import annotations

import math
from typing import Any

from ..core.costs import flops
from ..core.errors import ModelcutError
from ..core.specs import ModelSpec

# architecture (or model_type) -> family
_FAMILIES = {
    "LlamaForCausalLM": "llama", "llama": "llama",
    "MistralForCausalLM": "mistral", "mistral": "mistral",
    "Qwen2ForCausalLM": "qwen2", "qwen2": "qwen2",
    "MixtralForCausalLM": "mixtral", "mixtral": "mixtral",
    "GPT2LMHeadModel": "gpt2", "GPT2Model": "gpt2", "gpt2": "gpt2",
    "GPTNeoXForCausalLM": "gpt_neox", "GPTNeoXModel": "gpt_neox", "gpt_neox": "gpt_neox",
    "Qwen2MoeForCausalLM": "qwen2_moe", "qwen2_moe": "qwen2_moe",
    "Qwen3ForCausalLM": "qwen3", "qwen3": "qwen3",
    "Qwen3MoeForCausalLM": "qwen3_moe", "qwen3_moe": "qwen3_moe",
    "DeepseekV2ForCausalLM": "deepseek", "deepseek_v2": "deepseek",
    "DeepseekV3ForCausalLM": "deepseek", "deepseek_v3": "deepseek",
    "GptOssForCausalLM": "gpt_oss", "gpt_oss": "gpt_oss",
    "MPTForCausalLM": "mpt", "mpt": "mpt",
    "NemotronForCausalLM": "nemotron", "nemotron": "nemotron",
    "GemmaForCausalLM": "gemma", "gemma": "gemma",
    "Gemma2ForCausalLM": "gemma2", "gemma2": "gemma2",
    "Gemma3ForCausalLM": "gemma3", "gemma3_text": "gemma3",
    "Gemma3ForConditionalGeneration": "gemma3", "gemma3": "gemma3",   # its text_config (_TEXT_DEFAULTS)
    "Mistral3ForConditionalGeneration": "mistral", "mistral3": "mistral",   # likewise
    "OlmoForCausalLM": "olmo", "olmo": "olmo",
    "Olmo2ForCausalLM": "olmo2", "olmo2": "olmo2",
    "Phi3ForCausalLM": "phi3", "phi3": "phi3",
    "GraniteForCausalLM": "llama", "granite": "llama",            # Llama's fields and defaults
    "GraniteMoeForCausalLM": "mixtral", "granitemoe": "mixtral",  # Mixtral's expert fields
    "Glm4MoeForCausalLM": "glm4_moe", "glm4_moe": "glm4_moe",
    "Llama4ForConditionalGeneration": "llama4", "llama4": "llama4",
    "Llama4ForCausalLM": "llama4", "llama4_text": "llama4",
    "OlmoeForCausalLM": "olmoe", "olmoe": "olmoe",
    "PhimoeForCausalLM": "phimoe", "phimoe": "phimoe",
    "Starcoder2ForCausalLM": "starcoder2", "starcoder2": "starcoder2",
    "CohereForCausalLM": "cohere", "cohere": "cohere",
    "Cohere2ForCausalLM": "cohere2", "cohere2": "cohere2",
    "OPTForCausalLM": "opt", "opt": "opt",
    "BloomForCausalLM": "bloom", "bloom": "bloom",
    "FalconForCausalLM": "falcon", "falcon": "falcon",
    "RWForCausalLM": "falcon", "RefinedWebModel": "falcon", "RefinedWeb": "falcon",   # Falcon's first, remote-code files
    "GPTJForCausalLM": "gptj", "gptj": "gptj",
    "GPTBigCodeForCausalLM": "gpt_bigcode", "gpt_bigcode": "gpt_bigcode",
}


def _yarn_m(scale: float, k: float) -> float:
    return 0.1 * k * math.log(scale) + 1.0 if scale > 1 else 1.0


def rope_attention_factor(cfg: dict, arch: str) -> float:
    """The attention factor a YaRN ``rope_scaling`` puts on RoPE's cos and sin, 1 for any other
    RoPE (module doc)."""
    rs = cfg.get("rope_scaling")
    if not isinstance(rs, dict) or (rs.get("rope_type") or rs.get("type")) != "yarn":
        return 1.0
    if rs.get("attention_factor") is not None:
        return float(rs["attention_factor"])
    factor = float(_get(rs, "factor", arch))
    mscale, mscale_all = rs.get("mscale"), rs.get("mscale_all_dim")
    if mscale is not None and mscale_all is not None:
        return _yarn_m(factor, float(mscale)) / _yarn_m(factor, float(mscale_all))
    return _yarn_m(factor, 1.0)


def mla_equivalent_shape(hidden: int, heads: int, q_lora_rank: int | None, kv_lora_rank: int,
                         qk_nope_head_dim: int, qk_rope_head_dim: int, v_head_dim: int) -> tuple[int, int]:
    """(kv_heads, head_dim) of the grouped-query layer with ``heads`` heads whose projections hold
    as many weights as the multi-head latent attention layer (:func:`~modelcut.core.costs.flops.
    mla_attention_params`): 2·h·head_dim·(heads + kv_heads) closest to it, kv_heads a divisor of
    heads; among equally close shapes the widest head_dim, nearest MLA's attention core
    ((d_nope + d_rope + d_v)/2 per head). DeepSeek-V3: 8 KV heads of 96 (187,170,816 weights
    against MLA's 187,107,328, +0.03 %)."""
    target = flops.mla_attention_params(hidden, heads, q_lora_rank, kv_lora_rank, qk_nope_head_dim,
                                        qk_rope_head_dim, v_head_dim)
    best = None
    small = [k for k in range(1, math.isqrt(heads) + 1) if heads % k == 0]   # the divisors, in O(√heads)
    for kv in sorted({*small, *(heads // k for k in small)}):
        per = 2 * hidden * (heads + kv)          # weights per unit of head_dim
        for d in {max(1, target // per), target // per + 1}:
            key = (abs(per * d - target), -d)
            if best is None or key < best[0]:
                best = (key, kv, d)
    return best[1], best[2]


def _arch(cfg: dict) -> tuple[str, str]:
    archs = cfg.get("architectures")
    if isinstance(archs, list) and archs:
        arch = str(archs[0])
    elif "model_type" in cfg:
        arch = str(cfg["model_type"])
    else:
        raise ModelcutError("config.json: no 'architectures' or 'model_type' to tell the architecture")
    fam = _FAMILIES.get(arch)
    if fam is None:
        known = sorted(k for k in _FAMILIES if k[0].isupper())
        raise ModelcutError(f"config.json: unknown architecture {arch!r}; modelcut reads {', '.join(known)}")
    return arch, fam


def _whole(cfg: dict, key: str, arch: str, default: Any = ..., minimum: int = 1) -> int:
    """A whole number of the config of at least ``minimum`` (``default`` where the field is absent;
    required without one), read before any arithmetic is done with it: one line naming the field
    otherwise."""
    v = _get(cfg, key, arch, default)
    if isinstance(v, bool) or not isinstance(v, int) or v < minimum:
        what = "a positive whole number" if minimum == 1 else "a whole number"
        raise ModelcutError(f"config.json ({arch}): {key} must be {what}, got {v!r}")
    return v


def _length(cfg: dict, key: str, arch: str, default: Any = None) -> int | None:
    """The model's longest sequence (``max_position_embeddings`` and its other names): a positive
    whole number, or ``default`` where the field is absent or null; one line naming it otherwise."""
    return default if cfg.get(key) is None else _whole(cfg, key, arch)


def _whole_list(cfg: dict, key: str, arch: str, default: Any = ..., what: str = "whole numbers") -> list[int]:
    """A list of whole numbers of the config (layer indices, flags): one line naming the field otherwise."""
    v = _get(cfg, key, arch, default)
    if not isinstance(v, list) or not all(isinstance(i, int) and not isinstance(i, bool) for i in v):
        raise ModelcutError(f"config.json ({arch}): {key} must be a list of {what}, got {v!r}")
    return v


def _get(cfg: dict, key: str, arch: str, default: Any = ...) -> Any:
    if key in cfg and cfg[key] is not None:
        return cfg[key]
    if default is ...:
        raise ModelcutError(f"config.json ({arch}): missing {key!r}")
    return default


def _dropout(values, arch: str) -> bool:
    """Whether a config trains with dropout: any of its dropout probabilities (None or absent: 0) above 0;
    one that is not a number is one line."""
    vals = [0 if v is None else v for v in values]
    for v in vals:
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise ModelcutError(f"config.json ({arch}): dropout probabilities must be numbers, got {v!r}")
    return any(v > 0 for v in vals)


def _every_layer_window(cfg: dict, arch: str, layers: int) -> dict[str, Any]:
    """Every layer within ``sliding_window`` keys where the config sets one (Mistral, Phi-3, Phi-3.5-MoE,
    StarCoder 2), else none."""
    if not cfg.get("sliding_window"):
        return {}
    return dict(sliding_window=_whole(cfg, "sliding_window", arch), sliding_layers=layers)


#: A vision-language wrapper whose ``text_config`` is the language model modelcut reads (its vision
#: encoder left out), with the text configuration class's defaults for the fields the released
#: files leave out: Gemma3TextConfig (huggingface/transformers src/transformers/models/gemma3/
#: configuration_gemma3.py at 008f5c8c): vocab_size 262,208, max_position_embeddings 131,072, head_dim
#: 256, sliding_window 4,096, sliding_window_pattern 6, tied embeddings, and the class's default sizes
#: (hidden 2,304, intermediate 9,216, 26 layers, 8 heads, 4 KV heads) where a file leaves them out.
_TEXT_DEFAULTS: dict[str, dict[str, Any]] = {
    "Gemma3ForConditionalGeneration": dict(
        vocab_size=262_208, hidden_size=2304, intermediate_size=9216, num_hidden_layers=26, num_attention_heads=8,
        num_key_value_heads=4, head_dim=256, max_position_embeddings=131_072, tie_word_embeddings=True,
        attention_bias=False, sliding_window=4096, sliding_window_pattern=6),
}
_TEXT_DEFAULTS["gemma3"] = _TEXT_DEFAULTS["Gemma3ForConditionalGeneration"]
# Mistral Small 3.1 and later (Mistral3ForConditionalGeneration): a MistralConfig text_config, read as
# given (a field it leaves out is a one-line error naming it).
_TEXT_DEFAULTS["Mistral3ForConditionalGeneration"] = _TEXT_DEFAULTS["mistral3"] = {}


def _text_of(cfg: dict, arch: str) -> dict:
    """A wrapper's language model (:data:`_TEXT_DEFAULTS`): its ``text_config`` over the text class's
    defaults, keeping the file's name."""
    text = cfg.get("text_config", {})
    if not isinstance(text, dict):
        raise ModelcutError(f"config.json ({arch}): text_config must be an object")
    out = {**_TEXT_DEFAULTS[arch], **text}
    out.pop("architectures", None)
    if "_name_or_path" in cfg:
        out["_name_or_path"] = cfg["_name_or_path"]
    return out


def model_from_hf_config(cfg: dict, name: str | None = None) -> ModelSpec:
    """A ModelSpec from a parsed ``config.json``: layers, hidden, FFN, heads, KV heads,
    vocabulary, tied embeddings, gated MLP (and experts for Mixtral). A field of the wrong type
    that the reader does not check by name is still one line (never a traceback), naming the
    architecture."""
    if not isinstance(cfg, dict):
        raise ModelcutError("config.json must hold a JSON object")
    try:
        return _model_from_hf_config(cfg, name)
    except ModelcutError:
        raise
    except (TypeError, ValueError, KeyError, AttributeError, IndexError, ZeroDivisionError, OverflowError) as exc:
        archs = cfg.get("architectures")
        arch = archs[0] if isinstance(archs, list) and archs else cfg.get("model_type", "?")
        raise ModelcutError(f"config.json ({arch}): a field has the wrong type or value ({exc})") from None


def _model_from_hf_config(cfg: dict, name: str | None = None) -> ModelSpec:
    arch, fam = _arch(cfg)
    if arch in _TEXT_DEFAULTS:
        cfg = _text_of(cfg, arch)
    name = name or str(cfg.get("_name_or_path") or arch)
    if fam == "gpt2":
        gpt = _gpt_names(cfg, arch)
        return ModelSpec(
            name=name, **gpt, kv_heads=gpt["heads"],
            vocab=_get(cfg, "vocab_size", arch), gated_mlp=False,
            tied_embeddings=bool(_get(cfg, "tie_word_embeddings", arch, True)),  # PretrainedConfig default
            norm="layernorm", bias=True, max_seq=_whole(cfg, "n_positions", arch), learned_positions=True,
            source=f"Hugging Face config.json ({arch})")
    if fam == "gpt_neox":
        return ModelSpec(
            name=name, layers=_get(cfg, "num_hidden_layers", arch), hidden=_get(cfg, "hidden_size", arch),
            ffn_hidden=_get(cfg, "intermediate_size", arch),
            heads=_get(cfg, "num_attention_heads", arch), kv_heads=_get(cfg, "num_attention_heads", arch),
            vocab=_get(cfg, "vocab_size", arch), gated_mlp=False,
            tied_embeddings=bool(_get(cfg, "tie_word_embeddings", arch, False)),  # GPTNeoXConfig default
            norm="layernorm", bias=bool(_get(cfg, "attention_bias", arch, True)),
            max_seq=_length(cfg, "max_position_embeddings", arch), source=f"Hugging Face config.json ({arch})")
    if fam in _OWN_READERS:
        return _OWN_READERS[fam](cfg, arch, name)
    if fam == "nemotron":
        heads = _whole(cfg, "num_attention_heads", arch)
        hidden = _whole(cfg, "hidden_size", arch)
        head_dim = _whole(cfg, "head_dim", arch) if cfg.get("head_dim") is not None else None
        return ModelSpec(
            name=name, layers=_get(cfg, "num_hidden_layers", arch), hidden=hidden,
            ffn_hidden=_get(cfg, "intermediate_size", arch), heads=heads,
            kv_heads=_get(cfg, "num_key_value_heads", arch, heads), vocab=_get(cfg, "vocab_size", arch),
            gated_mlp=False, tied_embeddings=bool(_get(cfg, "tie_word_embeddings", arch, False)),
            head_dim=None if head_dim is None or head_dim * heads == hidden else head_dim, norm="layernorm",
            bias=bool(cfg.get("attention_bias", False)) and bool(cfg.get("mlp_bias", False)),
            qkv_bias=bool(cfg.get("attention_bias", False)), dropout=False,
            max_seq=_length(cfg, "max_position_embeddings", arch), source=f"Hugging Face config.json ({arch})")
    # Llama-like: Llama, Mistral, Qwen2/3, Mixtral, Qwen MoE, DeepSeek, Phi-3 (RMSNorm, SwiGLU, RoPE).
    heads = _whole(cfg, "num_attention_heads", arch)
    hidden = _whole(cfg, "hidden_size", arch)
    layers = _whole(cfg, "num_hidden_layers", arch)
    head_dim = _whole(cfg, "head_dim", arch) if cfg.get("head_dim") is not None else None
    kv_heads = _get(cfg, "num_key_value_heads", arch, heads)       # default: multi-head attention
    kw: dict[str, Any] = {}
    if fam in ("mixtral", "gpt_oss", "phimoe"):
        defaults = (16, 2) if fam == "phimoe" else (..., ...)      # PhimoeConfig's; the others' are required
        kw = dict(experts=_get(cfg, "num_local_experts", arch, defaults[0]),
                  top_k=_get(cfg, "num_experts_per_tok", arch, defaults[1]),
                  expert_ffn_hidden=_get(cfg, "intermediate_size", arch))
        if fam == "phimoe":
            kw.update(_every_layer_window(cfg, arch, layers))
        if fam == "gpt_oss":
            kw["glu_clamp"] = bool(cfg.get("swiglu_limit"))
            window = cfg.get("sliding_window")
            if window:
                types = cfg.get("layer_types")
                sliding = (sum(1 for t in types if t == "sliding_attention") if isinstance(types, list)
                           else (layers + 1) // 2)
                if sliding:
                    kw.update(sliding_window=_get(cfg, "sliding_window", arch), sliding_layers=sliding)
    elif fam == "olmoe":
        kw = dict(experts=_get(cfg, "num_experts", arch, 64), top_k=_get(cfg, "num_experts_per_tok", arch, 8),
                  expert_ffn_hidden=_get(cfg, "intermediate_size", arch))     # OlmoeConfig's defaults
    elif fam in ("qwen2_moe", "qwen3_moe"):
        kw = _qwen_moe(cfg, arch, fam, layers)
    elif fam in ("gemma2", "gemma3", "cohere2"):
        kw = _gemma_sliding(cfg, arch, fam, layers)
    elif fam in ("mistral", "phi3"):
        # MistralConfig, Phi3Config: every layer attends within sliding_window (Mistral's null from v0.2 on: none)
        kw = _every_layer_window(cfg, arch, layers)
    elif fam == "glm4_moe":
        kw = _deepseek_moe(cfg, arch)   # DeepSeek-V3's expert fields, grouped-query attention
    elif fam == "deepseek":
        kw = _deepseek_moe(cfg, arch)
        q_lora = cfg.get("q_lora_rank")
        mla = dict(q_lora_rank=_whole(cfg, "q_lora_rank", arch) if q_lora else None,
                   kv_lora_rank=_whole(cfg, "kv_lora_rank", arch),
                   qk_nope_head_dim=_whole(cfg, "qk_nope_head_dim", arch),
                   qk_rope_head_dim=_whole(cfg, "qk_rope_head_dim", arch), v_head_dim=_whole(cfg, "v_head_dim", arch))
        kv_heads, head_dim = mla_equivalent_shape(hidden, heads, *mla.values())
        kw.update(mla)
    if head_dim is not None and head_dim * heads == hidden:
        head_dim = None
    attention_bias = bool(cfg.get("attention_bias", False))
    return ModelSpec(
        name=name, layers=layers, hidden=hidden,
        ffn_hidden=_get(cfg, "intermediate_size", arch), heads=heads, kv_heads=kv_heads,
        vocab=_get(cfg, "vocab_size", arch), gated_mlp=True,
        tied_embeddings=bool(_get(cfg, "tie_word_embeddings", arch, fam.startswith(("gemma", "cohere")))),  # their configs: True
        head_dim=head_dim, norm="layernorm" if fam in ("phimoe", "cohere", "cohere2") else "rmsnorm",
        bias=(attention_bias and bool(cfg.get("mlp_bias", False)) if fam == "llama"
              else attention_bias if fam == "gpt_oss" else False),
        qkv_bias=(True if fam in ("qwen2", "qwen2_moe")
                  else (attention_bias if fam in ("llama", "qwen3", "qwen3_moe", "gemma", "gemma2", "gemma3",
                                                  "olmo", "olmo2", "glm4_moe", "olmoe", "phimoe", "cohere",
                                                  "cohere2") else None)),
        dropout=fam == "phi3" and _dropout([cfg.get(k) for k in ("resid_pdrop", "embd_pdrop", "attention_dropout")],
                                           arch),
        max_seq=_length(cfg, "max_position_embeddings", arch),
        rope_mscale=rope_attention_factor(cfg, arch), source=f"Hugging Face config.json ({arch})", **kw)


def _mpt(cfg: dict, arch: str, name: str) -> ModelSpec:
    """An MPT config (module doc): MPTConfig's field names and defaults."""
    hidden = _whole(cfg, "d_model", arch)
    heads = _get(cfg, "n_heads", arch)
    attn = cfg.get("attn_config") or {}
    ffn = cfg.get("ffn_config") or {}
    if not isinstance(attn, dict) or not isinstance(ffn, dict):
        raise ModelcutError(f"config.json ({arch}): attn_config and ffn_config must be objects")
    kind = attn.get("attn_type", "multihead_attention")
    if kind == "multiquery_attention":
        kv = 1
    elif kind == "grouped_query_attention":
        kv = attn.get("kv_n_heads")
        if kv is None:
            raise ModelcutError(f"config.json ({arch}): grouped_query_attention needs attn_config.kv_n_heads")
    elif kind == "multihead_attention":
        kv = heads
    else:
        raise ModelcutError(f"config.json ({arch}): unknown attn_config.attn_type {kind!r}")
    ratio = _get(cfg, "expansion_ratio", arch, 4)
    if isinstance(ratio, bool) or not isinstance(ratio, (int, float)) or not ratio > 0:
        raise ModelcutError(f"config.json ({arch}): expansion_ratio must be a positive number, got {ratio!r}")
    ffn_hidden = ffn.get("ffn_hidden_size") or int(hidden * ratio)   # llm-foundry ffn.py resolve_ffn_hidden_size
    learned = bool(_get(cfg, "learned_pos_emb", arch, True)) and not (attn.get("alibi") or attn.get("rope"))
    dropout = _dropout((cfg.get("resid_pdrop"), cfg.get("emb_pdrop"), attn.get("attn_pdrop")), arch)
    max_seq = _length(cfg, "max_seq_len", arch, 2048)
    return ModelSpec(
        name=name, layers=_get(cfg, "n_layers", arch), hidden=hidden, ffn_hidden=ffn_hidden, heads=heads,
        kv_heads=kv, vocab=_get(cfg, "vocab_size", arch), gated_mlp=ffn.get("ffn_type", "mptmlp") == "mptglu",
        tied_embeddings=bool(_get(cfg, "tie_word_embeddings", arch, True)), norm="layernorm",
        bias=not bool(_get(cfg, "no_bias", arch, False)), dropout=dropout,
        max_seq=max_seq, learned_positions=learned, source=f"Hugging Face config.json ({arch}, MosaicML MPTConfig)")


def _starcoder2(cfg: dict, arch: str, name: str) -> ModelSpec:
    """A StarCoder 2 config (module doc): Starcoder2Config's field names and defaults."""
    heads = _whole(cfg, "num_attention_heads", arch)
    layers = _whole(cfg, "num_hidden_layers", arch)
    return ModelSpec(
        name=name, layers=layers, hidden=_whole(cfg, "hidden_size", arch),
        ffn_hidden=_get(cfg, "intermediate_size", arch), heads=heads,
        kv_heads=_get(cfg, "num_key_value_heads", arch, 2), vocab=_get(cfg, "vocab_size", arch), gated_mlp=False,
        tied_embeddings=bool(_get(cfg, "tie_word_embeddings", arch, True)), norm="layernorm",
        bias=bool(_get(cfg, "use_bias", arch, True)),
        dropout=_dropout([cfg.get(k) for k in ("residual_dropout", "embedding_dropout", "attention_dropout")], arch),
        max_seq=_length(cfg, "max_position_embeddings", arch), source=f"Hugging Face config.json ({arch})",
        **_every_layer_window(cfg, arch, layers))


def _named(cfg: dict, keys: tuple[str, ...], arch: str, default: Any = ...) -> int:
    """A whole number the config may give under any of ``keys`` (a class's own name and the ones
    its ``attribute_map`` or an older file uses), the first one present; ``default`` where none is."""
    for k in keys:
        if cfg.get(k) is not None:
            return _whole(cfg, k, arch)
    if default is ...:
        raise ModelcutError(f"config.json ({arch}): missing {keys[0]!r}" + (f" (or {', '.join(map(repr, keys[1:]))})"
                                                                         if len(keys) > 1 else ""))
    return default


def _opt(cfg: dict, arch: str, name: str) -> ModelSpec:
    """An OPT config (module doc): OPTConfig's fields and defaults; projected embeddings refused."""
    hidden = _named(cfg, ("hidden_size", "d_model"), arch)
    proj = cfg.get("word_embed_proj_dim")
    if proj is not None and proj != hidden:
        raise ModelcutError(f"config.json ({arch}): word_embed_proj_dim {proj!r} is not hidden_size {hidden}: OPT's "
                            f"projected embeddings (OPT-350M's project_in and project_out) are not modelled")
    heads = _whole(cfg, "num_attention_heads", arch)
    return ModelSpec(
        name=name, layers=_whole(cfg, "num_hidden_layers", arch), hidden=hidden, ffn_hidden=_whole(cfg, "ffn_dim", arch),
        heads=heads, kv_heads=heads, vocab=_whole(cfg, "vocab_size", arch), gated_mlp=False,
        tied_embeddings=bool(_get(cfg, "tie_word_embeddings", arch, True)), norm="layernorm",
        bias=bool(_get(cfg, "enable_bias", arch, True)),
        dropout=_dropout([cfg.get(k, d) for k, d in (("dropout", 0.1), ("attention_dropout", 0.0),
                                                     ("activation_dropout", 0.0))], arch),
        max_seq=_length(cfg, "max_position_embeddings", arch, 2048), learned_positions=True,
        source=f"Hugging Face config.json ({arch})")


def _bloom(cfg: dict, arch: str, name: str) -> ModelSpec:
    """A BLOOM config (module doc): BloomConfig's fields (its older names too) and defaults."""
    hidden = _named(cfg, ("hidden_size", "n_embed"), arch)
    heads = _named(cfg, ("n_head", "num_attention_heads"), arch)
    return ModelSpec(
        name=name, layers=_named(cfg, ("n_layer", "num_hidden_layers"), arch), hidden=hidden, ffn_hidden=4 * hidden,
        heads=heads, kv_heads=heads, vocab=_whole(cfg, "vocab_size", arch), gated_mlp=False,
        tied_embeddings=bool(_get(cfg, "tie_word_embeddings", arch, True)), norm="layernorm", bias=True,
        dropout=_dropout([cfg.get("hidden_dropout"), cfg.get("attention_dropout")], arch),
        source=f"Hugging Face config.json ({arch})")


def _falcon(cfg: dict, arch: str, name: str) -> ModelSpec:
    """A Falcon config (module doc): FalconConfig's fields and defaults, and the first remote-code
    files' names (``n_head``, ``n_layer``, ``n_head_kv``; model type ``RefinedWeb`` the new decoder)."""
    hidden = _named(cfg, ("hidden_size", "n_embed"), arch)
    heads = _named(cfg, ("num_attention_heads", "n_head"), arch)
    if bool(_get(cfg, "new_decoder_architecture", arch, cfg.get("model_type") == "RefinedWeb")):
        kv_heads = _named(cfg, ("num_kv_heads", "n_head_kv"), arch, heads)
    else:
        kv_heads = 1 if bool(_get(cfg, "multi_query", arch, True)) else heads
    return ModelSpec(
        name=name, layers=_named(cfg, ("num_hidden_layers", "n_layer"), arch), hidden=hidden,
        ffn_hidden=_named(cfg, ("ffn_hidden_size",), arch, 4 * hidden), heads=heads, kv_heads=kv_heads,
        vocab=_whole(cfg, "vocab_size", arch), gated_mlp=False,
        tied_embeddings=bool(_get(cfg, "tie_word_embeddings", arch, True)), norm="layernorm",
        bias=bool(_get(cfg, "bias", arch, False)),
        dropout=_dropout([cfg.get("hidden_dropout"), cfg.get("attention_dropout")], arch),
        max_seq=_length(cfg, "max_position_embeddings", arch, 2048), source=f"Hugging Face config.json ({arch})")


def _gpt_names(cfg: dict, arch: str) -> dict[str, int]:
    """GPT-2's names for the shape, which GPT-J and GPTBigCode keep: ``n_embd``, ``n_layer``, ``n_head``
    and an MLP ``n_inner`` wide (None: 4·``n_embd``, GPT2Config's rule)."""
    hidden = _whole(cfg, "n_embd", arch)
    return dict(layers=_whole(cfg, "n_layer", arch), hidden=hidden, heads=_whole(cfg, "n_head", arch),
                ffn_hidden=_named(cfg, ("n_inner",), arch, 4 * hidden))


def _gptj(cfg: dict, arch: str, name: str) -> ModelSpec:
    """A GPT-J config (module doc): GPTJConfig's fields and defaults."""
    gpt = _gpt_names(cfg, arch)
    return ModelSpec(
        name=name, **gpt, kv_heads=gpt["heads"], vocab=_whole(cfg, "vocab_size", arch), gated_mlp=False,
        tied_embeddings=bool(_get(cfg, "tie_word_embeddings", arch, True)), norm="layernorm", bias=True, qkv_bias=False,
        dropout=_dropout([cfg.get(k) for k in ("resid_pdrop", "embd_pdrop", "attn_pdrop")], arch),
        max_seq=_length(cfg, "n_positions", arch, 2048), source=f"Hugging Face config.json ({arch})")


def _gpt_bigcode(cfg: dict, arch: str, name: str) -> ModelSpec:
    """A GPTBigCode config (StarCoder, SantaCoder; module doc): GPTBigCodeConfig's fields and defaults."""
    gpt = _gpt_names(cfg, arch)
    return ModelSpec(
        name=name, **gpt, kv_heads=1 if bool(_get(cfg, "multi_query", arch, True)) else gpt["heads"],
        vocab=_whole(cfg, "vocab_size", arch), gated_mlp=False,
        tied_embeddings=bool(_get(cfg, "tie_word_embeddings", arch, True)), norm="layernorm", bias=True,
        dropout=_dropout([cfg.get(k, 0.1) for k in ("resid_pdrop", "embd_pdrop", "attn_pdrop")], arch),
        max_seq=_length(cfg, "n_positions", arch, 1024), learned_positions=True,
        source=f"Hugging Face config.json ({arch})")




def _gemma_sliding(cfg: dict, arch: str, fam: str, layers: int) -> dict[str, Any]:
    """Gemma 2 / 3's and Cohere 2's sliding-window layers (module doc): ``layer_types`` where the
    config lists them, else every other layer from the first (Gemma 2) or all but every sixth (Gemma 3)
    or fourth (Cohere 2, whose window is 4,096 keys where the file leaves it out: Cohere2Config)."""
    raw = cfg.get("sliding_window", 4096 if fam == "cohere2" else None)
    if not raw:
        return {}
    window = _whole({"sliding_window": raw}, "sliding_window", arch)
    types = cfg.get("layer_types")
    if isinstance(types, list):
        sliding = sum(1 for t in types if t == "sliding_attention")
    elif fam == "gemma2":
        sliding = (layers + 1) // 2
    else:
        pattern = _whole(cfg, "sliding_window_pattern", arch, 4 if fam == "cohere2" else 6)
        sliding = layers - layers // pattern     # all but each pattern-th layer (i + 1) % pattern == 0
    return dict(sliding_window=window, sliding_layers=sliding) if sliding else {}


def _dense_prefix(cfg: dict, arch: str, layers: int) -> tuple[int, int]:
    """(leading dense layers, moe_every) of a Qwen MoE config (Qwen2MoeConfig: layer i has experts
    iff i ∉ mlp_only_layers and (i + 1) % decoder_sparse_step == 0): ``mlp_only_layers`` must be
    0 … d − 1, and with a ``decoder_sparse_step`` above 1 none may be listed."""
    only = sorted(_whole_list(cfg, "mlp_only_layers", arch, [], what="layer numbers"))
    step = _whole(cfg, "decoder_sparse_step", arch, 1)
    if only != list(range(len(only))) or len(only) > layers:
        raise ModelcutError(f"config.json ({arch}): mlp_only_layers {only} are not the leading layers; "
                            "modelcut models dense-first layers only")
    if step != 1 and only:
        raise ModelcutError(f"config.json ({arch}): decoder_sparse_step {step} beside mlp_only_layers {only}: "
                            "modelcut models leading dense layers or every k-th layer with experts, not both")
    return len(only), step


def _qwen_moe(cfg: dict, arch: str, fam: str, layers: int) -> dict[str, Any]:
    width = _get(cfg, "moe_intermediate_size", arch)
    dense, every = _dense_prefix(cfg, arch, layers)
    kw: dict[str, Any] = dict(experts=_get(cfg, "num_experts", arch), top_k=_get(cfg, "num_experts_per_tok", arch),
                              expert_ffn_hidden=width, dense_layers=dense, moe_every=every)
    shared = _whole(cfg, "shared_expert_intermediate_size", arch, 0, minimum=0) if fam == "qwen2_moe" else 0
    if shared:
        if shared % width:
            raise ModelcutError(f"config.json ({arch}): shared_expert_intermediate_size {shared} is not a "
                                f"multiple of moe_intermediate_size {width}")
        kw["shared_experts"] = shared // width
    return kw


def _deepseek_moe(cfg: dict, arch: str) -> dict[str, Any]:
    if "n_routed_experts" not in cfg or cfg["n_routed_experts"] is None:   # a dense DeepSeek
        return {}
    freq = _get(cfg, "moe_layer_freq", arch, 1)
    if freq != 1:
        raise ModelcutError(f"config.json ({arch}): moe_layer_freq {freq}: modelcut models experts in every "
                            "layer after the leading dense ones (moe_layer_freq 1)")
    dense = _whole(cfg, "first_k_dense_replace", arch, 0, minimum=0)
    return dict(experts=_get(cfg, "n_routed_experts", arch), top_k=_get(cfg, "num_experts_per_tok", arch),
                expert_ffn_hidden=_get(cfg, "moe_intermediate_size", arch),
                shared_experts=_get(cfg, "n_shared_experts", arch, 0), dense_layers=dense)


def _llama4(cfg: dict, arch: str, name: str) -> ModelSpec:
    """A Llama 4 config (module doc): Llama4TextConfig's field names and defaults (huggingface/transformers
    @ 008e574391 src/transformers/models/llama4/configuration_llama4.py: interleave_moe_layer_step 1,
    no_rope_layer_interval 4, attention_chunk_size 8192, head_dim 128, intermediate_size_mlp 16384,
    num_experts_per_tok 1, tie_word_embeddings false)."""
    text = cfg.get("text_config", cfg) if arch in ("Llama4ForConditionalGeneration", "llama4") else cfg
    if not isinstance(text, dict):
        raise ModelcutError(f"config.json ({arch}): text_config must be an object")
    layers = _whole(text, "num_hidden_layers", arch)
    heads = _whole(text, "num_attention_heads", arch)
    hidden = _whole(text, "hidden_size", arch)
    step = _whole(text, "interleave_moe_layer_step", arch, 1)
    moe = text.get("moe_layers")
    every = range(step - 1, layers, step)       # a range: its length and items without a list of layers
    if moe is not None and (len(_whole_list(text, "moe_layers", arch)) != len(every) or sorted(moe) != list(every)):
        raise ModelcutError(f"config.json ({arch}): moe_layers {moe} are not every {step}-th layer; modelcut "
                            "models experts in every k-th layer")
    types = text.get("layer_types")
    chunk = text.get("attention_chunk_size", 8192)
    if types is None:
        interval = _whole(text, "no_rope_layer_interval", arch, 4)
        # every layer but each interval-th uses RoPE and attends in chunks (Llama4TextConfig's default)
        roped = (sum(1 for r in _whole_list(text, "no_rope_layers", arch) if r) if text.get("no_rope_layers")
                 else layers - layers // interval)
    elif isinstance(types, list):
        roped = sum(1 for t in types if t == "chunked_attention")
    else:
        raise ModelcutError(f"config.json ({arch}): layer_types must be a list")
    chunked = roped if chunk else 0
    head_dim = _whole(text, "head_dim", arch, 128)
    return ModelSpec(
        name=name, layers=layers, hidden=hidden, ffn_hidden=_get(text, "intermediate_size_mlp", arch, 16384),
        heads=heads, kv_heads=_get(text, "num_key_value_heads", arch, heads), vocab=_get(text, "vocab_size", arch),
        gated_mlp=True, tied_embeddings=bool(_get(cfg, "tie_word_embeddings", arch, False)),
        head_dim=None if head_dim * heads == hidden else head_dim, norm="rmsnorm", bias=False, qkv_bias=False,
        dropout=False, max_seq=_length(text, "max_position_embeddings", arch),
        experts=_get(text, "num_local_experts", arch), top_k=_get(text, "num_experts_per_tok", arch, 1),
        expert_ffn_hidden=_get(text, "intermediate_size", arch), shared_experts=1, moe_every=step,
        attention_chunk=chunk if chunked else None, chunked_layers=chunked,
        source=f"Hugging Face config.json ({arch})")


#: The families read by a reader of their own, by family name (the rest: GPT-2, GPT-NeoX, Nemotron
#: and the Llama-like families, in :func:`_model_from_hf_config`).
_OWN_READERS = {"mpt": _mpt, "llama4": _llama4, "starcoder2": _starcoder2, "opt": _opt, "bloom": _bloom,
                "falcon": _falcon, "gptj": _gptj, "gpt_bigcode": _gpt_bigcode}
