"""Models from Hugging Face ``config.json`` files.

Field names and defaults follow the transformers configuration classes (src/transformers/models/
<family>/configuration_<family>.py): LlamaConfig, MistralConfig, Qwen2Config, MixtralConfig,
GPT2Config, GPTNeoXConfig. The architecture is read from ``architectures[0]``, else from
``model_type``. A missing required field or an unknown architecture is a one-line error naming it.
"""

from __future__ import annotations

from typing import Any

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
}


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


def _get(cfg: dict, key: str, arch: str, default: Any = ...) -> Any:
    if key in cfg and cfg[key] is not None:
        return cfg[key]
    if default is ...:
        raise ModelcutError(f"config.json ({arch}): missing {key!r}")
    return default


def model_from_hf_config(cfg: dict, name: str | None = None) -> ModelSpec:
    """A ModelSpec from a parsed ``config.json``: layers, hidden, FFN, heads, KV heads,
    vocabulary, tied embeddings, gated MLP (and experts for Mixtral)."""
    if not isinstance(cfg, dict):
        raise ModelcutError("config.json must hold a JSON object")
    arch, fam = _arch(cfg)
    name = name or str(cfg.get("_name_or_path") or arch)
    if fam == "gpt2":
        hidden = _get(cfg, "n_embd", arch)
        return ModelSpec(
            name=name, layers=_get(cfg, "n_layer", arch), hidden=hidden,
            ffn_hidden=_get(cfg, "n_inner", arch, 4 * hidden),          # GPT2Config: n_inner None -> 4·n_embd
            heads=_get(cfg, "n_head", arch), kv_heads=_get(cfg, "n_head", arch),
            vocab=_get(cfg, "vocab_size", arch), gated_mlp=False,
            tied_embeddings=bool(_get(cfg, "tie_word_embeddings", arch, True)),  # PretrainedConfig default
            norm="layernorm", bias=True, max_seq=_get(cfg, "n_positions", arch), learned_positions=True,
            source=f"Hugging Face config.json ({arch})")
    if fam == "gpt_neox":
        return ModelSpec(
            name=name, layers=_get(cfg, "num_hidden_layers", arch), hidden=_get(cfg, "hidden_size", arch),
            ffn_hidden=_get(cfg, "intermediate_size", arch),
            heads=_get(cfg, "num_attention_heads", arch), kv_heads=_get(cfg, "num_attention_heads", arch),
            vocab=_get(cfg, "vocab_size", arch), gated_mlp=False,
            tied_embeddings=bool(_get(cfg, "tie_word_embeddings", arch, False)),  # GPTNeoXConfig default
            norm="layernorm", bias=bool(_get(cfg, "attention_bias", arch, True)),
            max_seq=_get(cfg, "max_position_embeddings", arch, None), source=f"Hugging Face config.json ({arch})")
    # Llama-like: Llama, Mistral, Qwen2, Mixtral (RMSNorm, SwiGLU, RoPE, GQA).
    heads = _get(cfg, "num_attention_heads", arch)
    hidden = _get(cfg, "hidden_size", arch)
    head_dim = cfg.get("head_dim")
    if head_dim is not None and head_dim * heads == hidden:
        head_dim = None
    kw: dict[str, Any] = {}
    if fam == "mixtral":
        kw = dict(experts=_get(cfg, "num_local_experts", arch), top_k=_get(cfg, "num_experts_per_tok", arch))
    attention_bias = bool(cfg.get("attention_bias", False))
    return ModelSpec(
        name=name, layers=_get(cfg, "num_hidden_layers", arch), hidden=hidden,
        ffn_hidden=_get(cfg, "intermediate_size", arch), heads=heads,
        kv_heads=_get(cfg, "num_key_value_heads", arch, heads),       # default: multi-head attention
        vocab=_get(cfg, "vocab_size", arch), gated_mlp=True,
        tied_embeddings=bool(_get(cfg, "tie_word_embeddings", arch, False)),
        head_dim=head_dim, norm="rmsnorm",
        bias=attention_bias and bool(cfg.get("mlp_bias", False)) if fam == "llama" else False,
        qkv_bias=True if fam == "qwen2" else (attention_bias if fam == "llama" else None),
        dropout=False, max_seq=_get(cfg, "max_position_embeddings", arch, None),
        source=f"Hugging Face config.json ({arch})", **kw)
