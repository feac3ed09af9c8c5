"""Megatron-LM launch arguments -> a RUN.toml document (``modelcut from-megatron``): the reverse of
``modelcut explore --emit megatron``. Mapping only, no formulas: the document is read by
:func:`.runfile.run_from_dict`, the one boundary every run passes.

Flags read, with Megatron-LM's defaults where a flag is absent (NVIDIA/Megatron-LM at d98e8a64dd:
megatron/training/arguments.py, and the TransformerConfig and ModelParallelConfig fields its
argument groups are made from, megatron/core/transformer/transformer_config.py and
megatron/core/model_parallel_config.py):

* **the model** (unless ``--model`` names a catalog one): ``--num-layers``, ``--hidden-size``,
  ``--ffn-hidden-size`` (default 4·h, or int(4·h·2/3 / 64)·64 with ``--swiglu``: arguments.py
  ``validate_args``), ``--num-attention-heads``, ``--group-query-attention`` with
  ``--num-query-groups`` (KV heads; default 1 with the flag, the heads without it),
  ``--kv-channels`` (head width), ``--swiglu`` (a gated MLP), ``--untie-embeddings-and-output-weights``
  (default tied), ``--normalization`` (default LayerNorm), ``--disable-bias-linear`` (default
  biases), ``--add-qkv-bias``, ``--attention-dropout``/``--hidden-dropout`` (default 0.1 each),
  ``--position-embedding-type`` (default learned_absolute: a position table of
  ``--max-position-embeddings``), and the vocabulary, ``--vocab-size`` or the command's ``--vocab``,
  padded to a multiple of ``--make-vocab-size-divisible-by`` (default 128) × tp as Megatron-LM
  pads it (megatron/training/vocab_utils.py); mixture of experts: ``--num-experts``,
  ``--moe-router-topk`` (default 2), ``--moe-ffn-hidden-size`` (default the FFN's),
  ``--moe-shared-expert-intermediate-size`` (shared experts of that width over the expert width),
  ``--moe-layer-freq`` (an integer k: every k-th layer, which Megatron-LM places at layers 0, k, 2k, …
  and modelcut at k − 1, 2k − 1, …, the same count where k divides the layers; a list expression such as
  ``([0]*3+[1]*58)``: its leading dense layers, then every k-th, :func:`moe_pattern`); multi-head
  latent attention,
  ``--multi-latent-attention`` with ``--q-lora-rank`` (default none), ``--kv-lora-rank`` (32),
  ``--qk-head-dim`` (128), ``--qk-pos-emb-head-dim`` (64) and ``--v-head-dim`` (128), with the
  equal-weight grouped-query shape a DeepSeek config.json reads as for the seed model
  (:func:`..catalog.hf_config.mla_equivalent_shape`);
* **the layout**: ``--tensor-model-parallel-size``, ``--context-parallel-size`` with
  ``--cp-comm-type`` (default p2p, the ring) and ``--hierarchical-context-parallel-sizes``,
  ``--pipeline-model-parallel-size`` with ``--num-virtual-stages-per-pipeline-rank`` or
  ``--num-layers-per-virtual-pipeline-stage`` and an uneven split's
  ``--decoder-first-pipeline-num-layers``/``--decoder-last-pipeline-num-layers``,
  ``--expert-model-parallel-size``,
  ``--expert-tensor-parallel-size``, ``--sequence-parallel`` (default off), the data-parallel
  size from the world size (the command's ``--gpus``), ZeRO from ``--use-distributed-optimizer``
  (1) and ``--use-megatron-fsdp`` with ``--data-parallel-sharding-strategy`` (optim 1,
  optim_grads 2, optim_grads_params 3, its default), ``--num-distributed-optimizer-instances``
  (dp over it: the shard group);
* **training**: ``--seq-length``, ``--micro-batch-size``, ``--global-batch-size`` (default
  micro-batch × dp), ``--recompute-granularity``, ``--recompute-method``, ``--recompute-num-layers``,
  ``--recompute-modules``, ``--bf16``/``--fp16`` (neither: fp32, which modelcut does not time),
  ``--fp8-format`` with ``--fp8-recipe`` (default delayed; tensorwise is current scaling) and
  ``--fp8-param-gather`` (default off), Adam's moments from ``--exp-avg-dtype`` and
  ``--exp-avg-sq-dtype`` with ``--use-precision-aware-optimizer`` (default fp32), ``--attention-backend`` (:data:`..core.step.stack_names.ATTENTION_BACKENDS`; default
  auto, the stack's kernel),
  ``--cross-entropy-loss-fusion`` with ``--cross-entropy-fusion-impl`` (default native), the
  gradients' reduce type from ``--grad-reduce-in-bf16`` and ``--accumulate-allreduce-grads-in-fp32``
  (with ``--bf16`` fp32 unless the first; with ``--fp16`` fp16 unless the second: ``validate_args``);
* **the overlaps**, each as Megatron-LM's default leaves it where its flag is absent:
  ``--overlap-grad-reduce`` and ``--overlap-param-gather`` (off), ``--tp-comm-overlap`` (off),
  ``--no-overlap-p2p-communication`` (overlap on); the overlap flags modelcut knows but does not
  model (``--defer-embedding-wgrad-compute``, ``--align-param-gather``, ...:
  :func:`..core.step.stack_names.unmodelled_option`) go into the overlap settings as given, where
  ``predict`` notes them.

Every other flag is listed as not read; a flag's value that is not a literal (``$TP``) is one line
naming the flag.
"""

from __future__ import annotations

import re
import shlex
from pathlib import Path
from typing import Any

from .. import catalog
from ..catalog.hf_config import mla_equivalent_shape
from ..core.costs.context import cp_kind_name
from ..core.errors import ModelcutError
from ..core.specs import CP_KINDS, fp8_recipe_name
from ..core.step.stack_names import ATTENTION_BACKENDS, MEGATRON_FSDP_SHARDING, unmodelled_option
from .limits import Limits
from .inputs import shown
from .runfile import check_target, imported_text, split_ends

#: The flags that take several values (argparse nargs "+" or "*"): --cp-comm-type may name one form a
#: layer; the others list sizes or module names.
_MULTI = ("cp-comm-type", "hierarchical-context-parallel-sizes", "recompute-modules")

#: Flags that take no value (store_true / store_false).
_SWITCHES = ("sequence-parallel", "use-distributed-optimizer", "use-megatron-fsdp", "swiglu", "group-query-attention",
             "untie-embeddings-and-output-weights", "disable-bias-linear", "add-qkv-bias", "bf16", "fp16",
             "cross-entropy-loss-fusion", "overlap-grad-reduce", "overlap-param-gather", "tp-comm-overlap",
             "no-overlap-p2p-communication", "fp8-param-gather", "grad-reduce-in-bf16",
             "accumulate-allreduce-grads-in-fp32", "multi-latent-attention", "use-precision-aware-optimizer")

_MODEL_FLAGS = ("num-layers", "hidden-size", "ffn-hidden-size", "num-attention-heads", "group-query-attention",
                "num-query-groups", "kv-channels", "swiglu", "untie-embeddings-and-output-weights", "normalization",
                "disable-bias-linear", "add-qkv-bias", "attention-dropout", "hidden-dropout",
                "position-embedding-type", "max-position-embeddings", "vocab-size", "make-vocab-size-divisible-by",
                "num-experts", "moe-router-topk", "moe-ffn-hidden-size", "moe-shared-expert-intermediate-size",
                "moe-layer-freq", "multi-latent-attention", "q-lora-rank", "kv-lora-rank", "qk-head-dim",
                "qk-pos-emb-head-dim", "v-head-dim")
_RUN_FLAGS = ("tensor-model-parallel-size", "context-parallel-size", "cp-comm-type",
              "hierarchical-context-parallel-sizes", "pipeline-model-parallel-size", "pipeline-model-parallel-layout",
              "decoder-first-pipeline-num-layers", "decoder-last-pipeline-num-layers",
              "num-virtual-stages-per-pipeline-rank", "num-layers-per-virtual-pipeline-stage",
              "expert-model-parallel-size", "expert-tensor-parallel-size", "sequence-parallel",
              "use-distributed-optimizer", "use-megatron-fsdp", "data-parallel-sharding-strategy",
              "num-distributed-optimizer-instances", "seq-length", "micro-batch-size", "global-batch-size",
              "recompute-granularity", "recompute-method", "recompute-num-layers", "recompute-modules", "bf16",
              "fp16", "fp8-format", "fp8-recipe", "cross-entropy-loss-fusion", "cross-entropy-fusion-impl",
              "overlap-grad-reduce", "overlap-param-gather", "tp-comm-overlap", "no-overlap-p2p-communication",
              "grad-reduce-in-bf16", "accumulate-allreduce-grads-in-fp32", "fp8-param-gather",
              "attention-backend", "use-precision-aware-optimizer", "exp-avg-dtype", "exp-avg-sq-dtype")
#: Megatron-LM's --exp-avg-dtype and --exp-avg-sq-dtype choices (core_v0.15.0 megatron/training/arguments.py;
#: default fp32); modelcut times fp32 and bf16 moments (:data:`..core.specs.ADAM_MOMENT_DTYPES`).
_MOMENT_DTYPES = ("fp32", "fp16", "bf16", "fp8")
#: Megatron-LM's latent-attention flags, the ModelSpec field each gives and its default where absent
#: (core_v0.15.0 megatron/training/arguments.py: no query latent, --kv-lora-rank 32, --qk-head-dim 128,
#: --qk-pos-emb-head-dim 64, --v-head-dim 128).
_MLA_FLAGS = (("q-lora-rank", "q_lora_rank", None), ("kv-lora-rank", "kv_lora_rank", 32),
              ("qk-head-dim", "qk_nope_head_dim", 128), ("qk-pos-emb-head-dim", "qk_rope_head_dim", 64),
              ("v-head-dim", "v_head_dim", 128))
#: Megatron-core's --fp8-recipe names (TransformerConfig.fp8_recipe; "custom" is not timed), read as
#: modelcut's recipes by :func:`..core.specs.fp8_recipe_name` (tensorwise is current scaling).
_MCORE_RECIPES = ("delayed", "tensorwise", "blockwise", "mxfp8")


#: A shell variable assigned a literal on a line of its own (``TP_SIZE=2``, ``export SEQ=8192``,
#: ``NAME="value"``): what :func:`expand_literals` substitutes.
_ASSIGN = re.compile(r"^\s*(?:export\s+)?([A-Za-z_][A-Za-z0-9_]*)=(\"[^\"$`]*\"|'[^']*'|[^\s\"'$`();|&<>]*)\s*(?:#.*)?$")
_ANY_ASSIGN = re.compile(r"^\s*(?:export\s+)?([A-Za-z_][A-Za-z0-9_]*)=")
#: A reference to a variable, ``$NAME``, ``${NAME}`` or ``${NAME:-default}`` (also a positional ``${1:-...}``).
_REF = re.compile(r"\$\{([A-Za-z_][A-Za-z0-9_]*|[0-9]+)(?::?-(\"[^\"$`]*\"|'[^']*'|[^}$`\"']*))?\}|\$([A-Za-z_][A-Za-z0-9_]*)")
#: Words of shell syntax that end a flag's values in a script: a bash array's parentheses and
#: assignment (``ARGS=(``, ``ARGS+=(``, ``)``), another assignment, an array's expansion
#: (``${ARGS[@]}``), the keywords of a conditional or a loop.
_SHELL_WORDS = frozenset({"(", ")", "if", "then", "elif", "else", "fi", "for", "do", "done", "while", "case", "esac",
                          "[[", "]]", "[", "]", ";", "&&", "||", "!"})
_ARRAY_OPEN = re.compile(r"^[A-Za-z_][A-Za-z0-9_]*\+?=\((.*)$")
_SHELL_WORD = re.compile(r"^(?:[A-Za-z_][A-Za-z0-9_]*\+?=.*|\$\{?[A-Za-z_][A-Za-z0-9_]*\[[@*]\]\}?)$")


def expand_literals(text: str) -> str:
    """A script's variables replaced where it assigns them a literal: ``NAME=value`` lines (the
    last assignment before a use wins, as the shell runs them top to bottom), a reference's
    ``:-default`` where the script assigns none (a positional argument's too). What is assigned
    from a command, arithmetic or another variable stays as written, and a flag that reads it is
    one line asking for the script's variables expanded."""
    known: dict[str, str] = {}
    out = []

    def lit(v: str) -> str:
        return v[1:-1] if len(v) >= 2 and v[0] == v[-1] and v[0] in "\"'" else v

    def sub(m: re.Match) -> str:
        name = m.group(1) or m.group(3)
        if name in known:
            return known[name]
        if m.group(1) and m.group(2) is not None:          # ${NAME:-default}, NAME unassigned
            return lit(m.group(2))
        return m.group(0)

    for line in text.splitlines():
        line = _REF.sub(sub, line)
        a = _ASSIGN.match(line)
        if a:
            known[a.group(1)] = lit(a.group(2))
        elif (other := _ANY_ASSIGN.match(line)) is not None:
            known.pop(other.group(1), None)      # reassigned from a command or arithmetic: no longer known
        out.append(line)
    return "\n".join(out)


def parse_flags(text: str) -> dict[str, list[str]]:
    """A launch line or script's Megatron-LM flags: {name without "--": its values}, the last
    occurrence winning as argparse lets it. Words before the first flag (``torchrun``,
    ``pretrain_gpt.py``) and ``#`` comments are passed over; a backslash ends a line as the shell
    reads it; ``--name=value`` is ``--name value``. A script's literal variables are substituted
    (:func:`expand_literals`), its bash arrays read (``ARGS=(`` ... ``)`` and shell keywords end a
    flag's values) and a quoted ``"--flag value"`` word split as the unquoted array expansion
    splits it, so that Megatron-LM's own example scripts read as written."""
    try:
        words = shlex.split(expand_literals(text).replace("\\\n", " "), comments=True)
    except ValueError as exc:
        raise ModelcutError(f"cannot read the arguments: {exc}") from None
    out: dict[str, list[str]] = {}
    name: str | None = None
    for w in words:
        opened = _ARRAY_OPEN.match(w)        # ARGS=(--first ...: the assignment ends a flag, its first word is read
        if opened:
            name, w = None, opened.group(1)
        closes = (w.endswith(")") and w.count(")") > w.count("(")) or (w.endswith(";") and w != ";")   # --last) / --x 2;
        if closes:
            w = w[:-1]
        if not w:
            name = None if closes else name
            continue
        if w.startswith("--") and len(w) > 2 and " " in w.strip():
            w, *rest = w.split()          # "--fp8-format hybrid" in an array: two words once expanded
        else:
            rest = []
        if w.startswith("--") and len(w) > 2:
            name, _, value = w[2:].partition("=")
            out[name] = [value] if value else []
            out[name] += rest
        elif w in _SHELL_WORDS or _SHELL_WORD.match(w):
            name = None                   # shell syntax: no flag's value
        elif name is not None:
            out[name].append(w)
        if closes:
            name = None
    return out


def _one(flags: dict[str, list[str]], name: str) -> str | None:
    vals = flags.get(name)
    if vals is None:
        return None
    if name in _SWITCHES:
        if vals:
            raise ModelcutError(f"--{name} takes no value, got {' '.join(vals)!r}")
        return ""
    if len(vals) != 1 and name not in _MULTI:
        raise ModelcutError(f"--{name} takes one value, got {len(vals)}: {' '.join(vals) or 'none'}")
    return vals[0] if vals else None


def _on(flags: dict[str, list[str]], name: str) -> bool:
    """Whether a switch (no value) is given."""
    return _one(flags, name) is not None


def _int(flags: dict[str, list[str]], name: str, default: int | None = None) -> int | None:
    v = _one(flags, name)
    return default if v is None else _whole(name, v)


def _whole(name: str, v: str) -> int:
    try:
        out = int(v)
    except ValueError:
        raise ModelcutError(f"--{name}: cannot read {v!r} as a whole number (expand the script's variables "
                            "first)") from None
    if out < 1:
        raise ModelcutError(f"--{name} must be a positive whole number, got {v}")
    return out


def _float(flags: dict[str, list[str]], name: str, default: float) -> float:
    v = _one(flags, name)
    if v is None:
        return default
    try:
        return float(v)
    except ValueError:
        raise ModelcutError(f"--{name}: cannot read {v!r} as a number") from None


def _choice(flags: dict[str, list[str]], name: str, default: str | None, choices) -> str | None:
    v = _one(flags, name)
    if v is None:
        return default
    if v not in choices:
        raise ModelcutError(f"--{name} must be one of {', '.join(choices)}, got {v!r}")
    return v


def _model(flags: dict[str, list[str]], tp: int, vocab: int | None) -> dict[str, Any]:
    """The [model] table the flags describe (module doc)."""
    for need in ("num-layers", "hidden-size", "num-attention-heads"):
        if need not in flags:
            raise ModelcutError(f"--{need} is missing: give the model's shape, or name a catalog model with --model")
    h, heads = _int(flags, "hidden-size"), _int(flags, "num-attention-heads")
    gated = _on(flags, "swiglu")
    ffn = _int(flags, "ffn-hidden-size", int(4 * h * 2 / 3 / 64) * 64 if gated else 4 * h)
    kv = _int(flags, "num-query-groups", 1) if _on(flags, "group-query-attention") else heads
    given = _int(flags, "vocab-size", vocab)
    if given is None:
        raise ModelcutError("the vocabulary is not in the arguments (Megatron-LM reads it from the tokenizer): "
                            "give --vocab, or name a catalog model with --model")
    multiple = _int(flags, "make-vocab-size-divisible-by", 128) * tp
    positions = _choice(flags, "position-embedding-type", "learned_absolute",
                        ("learned_absolute", "rope", "yarn", "mrope", "relative", "none"))
    table: dict[str, Any] = {
        "layers": _int(flags, "num-layers"), "hidden": h, "ffn_hidden": ffn, "heads": heads, "kv_heads": kv,
        "vocab": -(-given // multiple) * multiple, "gated_mlp": gated,
        "tied_embeddings": not _on(flags, "untie-embeddings-and-output-weights"),
        "norm": "rmsnorm" if _choice(flags, "normalization", "LayerNorm", ("LayerNorm", "RMSNorm")) == "RMSNorm"
        else "layernorm",
        "bias": not _on(flags, "disable-bias-linear"),
        "dropout": _float(flags, "attention-dropout", 0.1) > 0 or _float(flags, "hidden-dropout", 0.1) > 0,
    }
    if _on(flags, "add-qkv-bias"):
        table["qkv_bias"] = True
    width = _int(flags, "kv-channels")
    if width is not None and width * heads != h:
        table["head_dim"] = width
    if _on(flags, "multi-latent-attention"):
        # Megatron-LM's MLA widths (_MLA_FLAGS), with the equal-weight grouped-query shape a DeepSeek
        # config.json reads as (the seed model's)
        mla = {name: _int(flags, flag, default) for flag, name, default in _MLA_FLAGS}   # _int: positive
        kv_heads, head_dim = mla_equivalent_shape(h, heads, *mla.values())
        table.update(kv_heads=kv_heads, **{k: v for k, v in mla.items() if v is not None})
        table.pop("head_dim", None)
        if head_dim * heads != h:
            table["head_dim"] = head_dim
    if positions == "learned_absolute":
        table["learned_positions"] = True
        table["max_seq"] = _int(flags, "max-position-embeddings", _int(flags, "seq-length"))
    experts = _int(flags, "num-experts")
    if experts is not None and experts > 1:
        expert_ffn = _int(flags, "moe-ffn-hidden-size", ffn)
        table.update(experts=experts, top_k=_int(flags, "moe-router-topk", 2), expert_ffn_hidden=expert_ffn)
        shared = _int(flags, "moe-shared-expert-intermediate-size")
        if shared:
            if shared % expert_ffn:
                raise ModelcutError(f"--moe-shared-expert-intermediate-size ({shared}) is not a whole number of "
                                    f"experts of width {expert_ffn}")
            table["shared_experts"] = shared // expert_ffn
        freq = _one(flags, "moe-layer-freq")
        if freq is not None:
            try:
                table["moe_every"] = int(freq)
            except ValueError:
                dense, every = moe_pattern(freq, table["layers"])
                table.update(dense_layers=dense, moe_every=every)
    return table


#: The longest ``--pipeline-model-parallel-layout`` its repeats may spell out, in characters (a layer,
#: the embedding, the loss or a stage's bar each one): far above any model's layers and stages.
_MAX_LAYOUT = 1_000_000

#: How deep a ``--moe-layer-freq`` expression may nest its brackets, and how many characters it may
#: hold: far beyond any launch script's pattern (DeepSeek-V3's is "([0]*3+[1]*58)").
_MAX_NESTING = 20
_MAX_EXPRESSION = 10_000


def _layer_list(text: str, most: int) -> list[int]:
    """The layer pattern a ``--moe-layer-freq`` list expression gives (Megatron-LM evaluates it as
    Python: ``"([0]*3+[1]*58)"``, ``"[1]*48"``, ``"[0,1]*24"``), read without evaluating it: lists
    of 0 and 1, ``*`` a whole number, ``+`` and brackets nested at most :data:`_MAX_NESTING` deep.
    Anything else, or a pattern longer than ``most`` layers, is one line."""
    tokens = re.findall(r"\d+|[\[\](),*+]|\S", text.strip().strip("'\""))
    pos = 0

    def bad(why: str) -> ModelcutError:
        return ModelcutError(f"--moe-layer-freq {shown(text, 60)}: {why}; give an integer or a list expression "
                             "such as ([0]*3+[1]*58)")

    def peek() -> str | None:
        return tokens[pos] if pos < len(tokens) else None

    def take(want: str | None = None) -> str:
        nonlocal pos
        tok = peek()
        if tok is None or (want is not None and tok != want):
            raise bad(f"expected {want or 'more'} at {tok or 'the end'!r}")
        pos += 1
        return tok

    def longest(out: list[int], times: int = 1) -> list[int]:
        if len(out) * times > most:
            raise bad(f"more than the {most} layers")
        return out * times

    def factor(depth: int) -> list[int]:
        if depth > _MAX_NESTING:
            raise bad(f"brackets nested more than {_MAX_NESTING} deep")
        tok = peek()
        if tok == "[":
            take("[")
            items: list[int] = []
            while peek() != "]":
                v = take()
                if v not in ("0", "1"):
                    raise bad(f"a layer is 0 (dense) or 1 (experts), got {v!r}")
                items.append(int(v))
                longest(items)
                if peek() == ",":
                    take(",")
            take("]")
            return items
        if tok == "(":
            take("(")
            inner = expr(depth + 1)
            take(")")
            return inner
        if tok is not None and tok.isdigit():
            n = int(take())
            take("*")
            return longest(factor(depth + 1), n)
        raise bad(f"unexpected {tok or 'end'!r}")

    def term(depth: int) -> list[int]:
        out = factor(depth)
        while peek() == "*":
            take("*")
            n = take()
            if not n.isdigit():
                raise bad(f"a list repeats a whole number of times, got {n!r}")
            out = longest(out, int(n))
        return out

    def expr(depth: int = 0) -> list[int]:
        out = term(depth)
        while peek() == "+":
            take("+")
            out = longest(out + term(depth))
        return out

    if len(text) > _MAX_EXPRESSION:
        raise bad("too long")
    layers = expr()
    if peek() is not None:
        raise bad(f"unexpected {peek()!r}")
    return layers


def moe_pattern(text: str, num_layers: int) -> tuple[int, int]:
    """(leading dense layers, every k-th layer past them with experts) of a ``--moe-layer-freq`` list
    expression (1 an expert layer, 0 a dense one: megatron/core/models/gpt/gpt_layer_specs.py
    ``get_moe_layer_pattern``, core_v0.15.0), as :class:`..core.specs.ModelSpec` holds them: d zeros,
    then layer i ≥ d with experts where (i − d + 1) is a multiple of k. A pattern of another shape, or
    not one entry a layer, is one line."""
    pattern = _layer_list(text, num_layers)
    if len(pattern) != num_layers:
        raise ModelcutError(f"--moe-layer-freq {shown(text, 60)} gives {len(pattern)} layers, --num-layers {num_layers}")
    experts = [i for i, v in enumerate(pattern) if v]
    if not experts:
        raise ModelcutError(f"--moe-layer-freq {shown(text, 60)} gives no layer with experts")
    # The first expert layer is layer d + k − 1 and the second d + 2k − 1, so two of them give k and d;
    # one alone is the shape with d = 0 and k past the last layer's half, or none.
    k = experts[1] - experts[0] if len(experts) > 1 else experts[0] + 1
    d = experts[0] - k + 1
    if d >= 0 and pattern == [1 if i >= d and (i - d + 1) % k == 0 else 0 for i in range(num_layers)]:
        return d, k
    raise ModelcutError(f"--moe-layer-freq {shown(text, 60)}: modelcut models leading dense layers, then every k-th "
                        "layer with experts; this pattern is not of that shape")


def _layout_split(text: str, pp: int) -> tuple[int, ...]:
    """The transformer layers of each virtual stage, in the string's order, under
    ``--pipeline-model-parallel-layout``: its stages "|" apart, "(...)*k" and "x*k" repeating,
    commas cosmetic; "t" a transformer layer, "E" the embedding, "L" the loss, "m" a multi-token
    prediction layer, which modelcut does not time (core_v0.15.0
    megatron/core/transformer/pipeline_parallel_layer_layout.py ``parse_str_to_list``). The stage
    count is a multiple of pp."""
    expanded = text.replace(" ", "").replace(",", "")
    pattern = re.compile(r"\(([^()]*)\)\*(\d+)")

    def repeat(part: str, times: str, rest: int) -> str:
        if len(part) * int(times) + rest > _MAX_LAYOUT:
            raise ModelcutError(f"--pipeline-model-parallel-layout {shown(text, 60)}: its repeats spell more than "
                                f"{_MAX_LAYOUT:,} characters")
        return part * int(times)

    while (m := pattern.search(expanded)) is not None:
        expanded = (expanded[:m.start()] + repeat(m.group(1), m.group(2), len(expanded) - len(m.group(0)))
                    + expanded[m.end():])
    if "(" in expanded or ")" in expanded:
        raise ModelcutError(f"--pipeline-model-parallel-layout {shown(text, 60)}: cannot read its repeats")
    pieces, end, total = [], 0, 0
    for m in re.finditer(r"(.)\*(\d+)", expanded):
        piece = expanded[end:m.start()] + repeat(m.group(1), m.group(2), total + len(expanded) - end)
        pieces.append(piece)
        total += len(piece)
        end = m.end()
    expanded = "".join(pieces) + expanded[end:]
    unknown = sorted(set(expanded) - set("ELtm|"))
    if unknown:
        raise ModelcutError(f"--pipeline-model-parallel-layout {shown(text, 60)}: {unknown[0]!r} is no layer type "
                            "(E, t, m, L)")
    stages = expanded.split("|")
    if len(stages) % pp:
        raise ModelcutError(f"--pipeline-model-parallel-layout {shown(text, 60)}: {len(stages)} stages are not a multiple of "
                            f"pp ({pp})")
    return tuple(st.count("t") for st in stages)


def _recompute(flags: dict[str, list[str]]) -> dict[str, Any]:
    gran = _choice(flags, "recompute-granularity", None, ("full", "selective"))
    if gran is None:
        return {"recompute": "none"}
    if gran == "selective":
        out: dict[str, Any] = {"recompute": "selective"}
        if flags.get("recompute-modules"):
            out["recompute_modules"] = list(flags["recompute-modules"])
        return out
    method = _choice(flags, "recompute-method", None, ("uniform", "block"))
    n = _int(flags, "recompute-num-layers", 1)
    if method is None:
        raise ModelcutError("--recompute-granularity full needs --recompute-method uniform or block")
    if method == "block":
        return {"recompute": "full", "recompute_layers": n}
    if n != 1:
        raise ModelcutError(f"--recompute-method uniform --recompute-num-layers {n}: checkpoints of {n} layers "
                            "at a time are not modelled (uniform with 1 is full recomputation)")
    return {"recompute": "full"}


def run_document(text: str, *, gpu: str, gpus: int, model: str | None = None, vocab: int | None = None,
                 gpus_per_node: int | None = None, framework: str = "megatron-core"
                 ) -> tuple[dict[str, Any], list[str]]:
    """(the RUN.toml document, the flags not read) of Megatron-LM launch arguments (module doc) on
    ``gpus`` of ``gpu``; ``model`` names a catalog model instead of the shape flags."""
    flags = parse_flags(text)
    tp, cp, pp = (_int(flags, f"{k}-parallel-size", 1) for k in ("tensor-model", "context", "pipeline-model"))
    if gpus % (tp * cp * pp):
        raise ModelcutError(f"the world size {gpus} is not a multiple of tp·cp·pp = {tp}·{cp}·{pp}")
    dp = gpus // (tp * cp * pp)
    doc: dict[str, Any] = {"model": {"name": model} if model else _model(flags, tp, vocab),
                           "hardware": {"gpu": gpu, "gpus": gpus}}
    if gpus_per_node is not None:
        doc["hardware"]["gpus_per_node"] = gpus_per_node
    layout: dict[str, Any] = {"tp": tp, "cp": cp, "pp": pp, "dp": dp}
    if cp > 1:
        kinds = {cp_kind_name(k) for k in flags.get("cp-comm-type") or ["p2p"]}
        bad = sorted(kinds - set(CP_KINDS))
        if bad:
            raise ModelcutError(f"--cp-comm-type {bad[0]!r}: Megatron-LM's forms are p2p, a2a, allgather, a2a+p2p")
        if len(kinds) > 1:
            raise ModelcutError(f"--cp-comm-type names a form a layer ({', '.join(sorted(kinds))}): modelcut times one")
        layout["cp_kind"] = kinds.pop()
        sizes = flags.get("hierarchical-context-parallel-sizes")
        if sizes:
            if len(sizes) != 2:
                raise ModelcutError(f"--hierarchical-context-parallel-sizes takes two sizes, got {' '.join(sizes)}")
            a2a, ring = (_whole("hierarchical-context-parallel-sizes", x) for x in sizes)
            if a2a * ring != cp:
                raise ModelcutError(f"--hierarchical-context-parallel-sizes {a2a} {ring}: their product is not "
                                    f"the context-parallel size {cp}")
            layout["cp_a2a"] = a2a
    layers = _int(flags, "num-layers")
    vpp = _int(flags, "num-virtual-stages-per-pipeline-rank")
    split = _one(flags, "pipeline-model-parallel-layout")
    stage_layers = _layout_split(split, pp) if split is not None else None
    if stage_layers is not None and vpp is None:
        vpp = len(stage_layers) // pp
    per_stage = _int(flags, "num-layers-per-virtual-pipeline-stage")
    if vpp is None and per_stage is not None:
        if layers is None or layers % (pp * per_stage):
            raise ModelcutError(f"--num-layers-per-virtual-pipeline-stage {per_stage} needs --num-layers, a multiple "
                                f"of pp × it ({pp} × {per_stage})")
        vpp = layers // (pp * per_stage)
    if vpp is not None and vpp > 1:
        layout["vpp"] = vpp
    for end in ("first", "last"):     # Megatron-core's uneven split: that rank's layers, the rest even
        n = _int(flags, f"decoder-{end}-pipeline-num-layers")
        if n is not None:
            if split is not None:
                raise ModelcutError(f"--decoder-{end}-pipeline-num-layers with --pipeline-model-parallel-layout: "
                                    "Megatron-LM refuses the two together")
            layout[f"{end}_layers"] = n
    if stage_layers is not None:
        layout.update(split_ends(stage_layers, pp, catalog.model(model).layers if model else layers,
                                 f"--pipeline-model-parallel-layout {split!r}"))
    layout["schedule"] = "interleaved" if pp > 1 and (vpp or 1) > 1 else "1f1b"
    ep = _int(flags, "expert-model-parallel-size", 1)
    if ep > 1:
        layout["ep"] = ep
        etp = _int(flags, "expert-tensor-parallel-size")
        if etp is not None:
            layout["etp"] = etp
    layout["sequence_parallel"] = _on(flags, "sequence-parallel") and tp > 1
    zero = 1 if _on(flags, "use-distributed-optimizer") else 0
    if _on(flags, "use-megatron-fsdp"):
        zero = MEGATRON_FSDP_SHARDING[_choice(flags, "data-parallel-sharding-strategy", "optim_grads_params",
                                              tuple(MEGATRON_FSDP_SHARDING))]
    layout["zero"] = zero
    instances = _int(flags, "num-distributed-optimizer-instances", 1)
    if instances > 1:
        if dp % instances:
            raise ModelcutError(f"--num-distributed-optimizer-instances {instances} does not divide dp ({dp})")
        layout["dp_shard"] = dp // instances
    doc["layout"] = layout

    if "seq-length" not in flags:
        raise ModelcutError("--seq-length is missing")
    mb = _int(flags, "micro-batch-size")
    if mb is None:
        raise ModelcutError("--micro-batch-size is missing")
    training: dict[str, Any] = {"seq_len": _int(flags, "seq-length"), "micro_batch": mb,
                                "global_batch": _int(flags, "global-batch-size", mb * dp), **_recompute(flags)}
    if "fp8-format" in flags:
        _choice(flags, "fp8-format", None, ("e4m3", "hybrid"))
        training["precision"] = "fp8"
        training["fp8_recipe"] = fp8_recipe_name(_choice(flags, "fp8-recipe", "delayed", _MCORE_RECIPES))
        training["fp8_param_gather"] = _on(flags, "fp8-param-gather")     # Megatron-LM's default: off
    elif _on(flags, "fp16"):
        training["precision"] = "fp16"
    elif _on(flags, "bf16"):
        training["precision"] = "bf16"
    else:
        raise ModelcutError("neither --bf16 nor --fp16: Megatron-LM would train in fp32, which modelcut does not time")
    # the gradients' reduce type as validate_args sets it: with --bf16, fp32 unless --grad-reduce-in-bf16
    # (which wins over --accumulate-allreduce-grads-in-fp32); with --fp16, the 16-bit type unless
    # --accumulate-allreduce-grads-in-fp32
    if training["precision"] == "fp16":
        training["grad_reduce"] = "fp32" if _on(flags, "accumulate-allreduce-grads-in-fp32") else "fp16"
    else:
        training["grad_reduce"] = "bf16" if _on(flags, "grad-reduce-in-bf16") else "fp32"
    moments = {_choice(flags, f, "fp32", _MOMENT_DTYPES) for f in ("exp-avg-dtype", "exp-avg-sq-dtype")}
    if moments != {"fp32"}:
        if not _on(flags, "use-precision-aware-optimizer"):
            raise ModelcutError("--exp-avg-dtype and --exp-avg-sq-dtype other than fp32 need "
                                "--use-precision-aware-optimizer (Megatron-core's OptimizerConfig asserts it)")
        if moments != {"bf16"}:
            raise ModelcutError(f"Adam's moments in {' and '.join(sorted(moments))}: modelcut keeps both in fp32 or "
                                "both in bf16")
        training["adam_moments"] = "bf16"
    kernel = ATTENTION_BACKENDS[_choice(flags, "attention-backend", "auto", tuple(ATTENTION_BACKENDS))]
    if kernel is not None:
        training["attention"] = kernel
    if _on(flags, "cross-entropy-loss-fusion"):
        impl = _choice(flags, "cross-entropy-fusion-impl", "native", ("native", "te"))
        training["cross_entropy"] = "fused" if impl == "te" else "mcore-fused"
    else:
        training["cross_entropy"] = "fp32-passes"
    doc["training"] = training
    on = {"grad_reduce": _on(flags, "overlap-grad-reduce"), "param_gather": _on(flags, "overlap-param-gather"),
          "tp_comm": _on(flags, "tp-comm-overlap"), "p2p_async": not _on(flags, "no-overlap-p2p-communication")}
    read = set(_RUN_FLAGS) | (set() if model else set(_MODEL_FLAGS))
    # the overlap flags modelcut knows but does not model (--defer-embedding-wgrad-compute, ...): carried
    # into the overlap settings as given, so that predict takes them and notes what it does not time
    known = [f for f in flags if f not in read and unmodelled_option(f) is not None]
    doc["settings"] = {"framework": framework,
                       "overlap": ",".join([f"{k}={'on' if v else 'off'}" for k, v in on.items()]
                                           + [f"--{f}" + (f"={flags[f][-1]}" if flags[f] else "") for f in known])}
    read |= set(known)
    if model:
        _check_model_flags(flags, model)
    return doc, sorted(f"--{f}" for f in flags if f not in read)


def _check_model_flags(flags: dict[str, list[str]], model: str) -> None:
    """With a catalog model, the arguments' layer count, width and heads must be that model's."""
    spec = catalog.model(model)
    for flag, want in (("num-layers", spec.layers), ("hidden-size", spec.hidden), ("num-attention-heads", spec.heads)):
        got = _int(flags, flag)
        if got is not None and got != want:
            raise ModelcutError(f"--{flag} {got} is not {spec.name}'s {want}")


def run_file_text(text: str, source: str, *, gpu: str, gpus: int, model: str | None = None,
                  vocab: int | None = None, gpus_per_node: int | None = None, framework: str = "megatron-core",
                  limits: Limits | None = None) -> str:
    """The use case of ``modelcut from-megatron``: the RUN.toml text of Megatron-LM arguments
    (``source`` names where they came from, a file or "-"), read back through
    :func:`.runfile.run_from_dict` first so that every problem is one line now, not at predict.
    A shape read from the flags is named after the source file."""
    check_target(gpu, gpus, limits)
    fw = catalog.framework(framework)
    doc, unread = run_document(text, gpu=gpu, gpus=gpus, model=model, vocab=vocab, gpus_per_node=gpus_per_node,
                               framework=fw.name)
    if "name" not in doc["model"]:
        doc["model"] = {"name": "megatron-args" if source == "-" else Path(source).stem, **doc["model"]}
    header = [f"from the Megatron-LM arguments of {source}: modelcut from-megatron"]
    if unread:
        header.append("flags not read: " + " ".join(unread))
    return imported_text(doc, source, header, limits)
