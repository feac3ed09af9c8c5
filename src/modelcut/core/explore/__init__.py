"""The layout explorer: every way to cut a model over N accelerators, the ones that fit,
ranked by predicted step time.

**Space.** For N GPUs: tensor parallelism t dividing the heads and, with grouped-query
attention, dividing or divided by the KV heads, and the MLP width, its group inside one
node unless allowed across; context parallelism c with the sequence cut in 2c equal chunks
(Llama 3's load-balanced causal split, Grattafiori et al. 2024 §3.3.2) and at least
``min_tokens_per_cp_rank`` tokens per rank; pipeline p ≤ layers; data parallelism
d = N/(t·c·p) dividing the global batch; micro-batch b; schedule and chunks v (1F1B and
ZB-H1 with v = 1; the interleaved schedule with the v whose p·v divides l or l + 2, so
that chunks are balanced, with m a multiple of p as Megatron-LM requires; ZB-V with
v = 2; DualPipe, when asked for, with v = 2, p even, m even and m ≥ 2p, and DualPipeV with
v = 2 and m ≥ 2p, the DualPipe repository's rules); recomputation none/selective/full, and
for a mixture-of-experts model selective recomputation of ``layernorm+moe_act`` (the MoE
layer's pre-MLP norm and the experts' activation, Megatron-core's ``--recompute-modules`` as
Megatron-Bridge's MoE recipes name them; :data:`..specs.RECOMPUTE_VARIANTS`) where the stack's
rules offer it, and ``blocks``: full recomputation of the fewest layers of each chunk with which
the layout fits (Megatron-core's block method, :data:`..specs.BLOCKS`; the fewest found by
bisection, :meth:`.search._Search.fewest_blocks`); ZeRO stage 0–3. Sequence parallelism is on whenever t > 1 (same traffic, t times fewer norm and
dropout activations; Korthikanti et al. 2022 §4.2.2). Every layout uses exactly N GPUs:
t·c·p·d = N. With c > 1 every form of context parallelism is tried (``Space.cp_kinds``: the
all-gather of Llama 3, ring attention, the all-to-all of DeepSpeed-Ulysses where c divides the
heads, and Megatron-LM's hierarchical all-to-all then ring where the cp group leaves a node, its
all-to-all groups the cp ranks a node holds, or the largest part of them that cuts the heads:
:func:`.space.hierarchical_a2a`; :mod:`.context`). For a mixture-of-experts model,
expert parallelism e runs over the divisors of the experts that divide d (the ep group is
carved from the data-parallel ranks, :mod:`.mesh`; ``Space.eps`` narrows it), expert tensor
parallelism equal to t. Every layout takes the default rank order, Megatron-core's
tp-cp-ep-dp-pp (:data:`..specs.DEFAULT_ORDER`), which keeps the ep group on the ranks next to
tp and cp and the pipeline outermost; a dense model keeps e = 1. On a stack that takes an uneven
split (``uneven_split``), a layout with a pipeline comes also with a lighter last rank, the layer
count that balances the output layer by FLOPs (:func:`..plan.lighter_last`, ``Structure.last_layers``).

**Fit.** A layout is feasible when its peak device memory (:mod:`.memory`, buffers
allowance included) is at most the accelerator's capacity less ``margin`` (a fraction,
default 2 %, kept free for what the model does not count: the backward's activation
gradients, the logits' BF16 copy, allocator spikes).

**Pruning.** Memory before time. For each structure (t, c, e, p, d, b, schedule, v, form) the
peak memory of all its recomputation × ZeRO variants comes from one pass
(:func:`.memory.variant_peaks`: activations depend only on the recomputation, weights,
gradients and optimizer states only on the ZeRO stage); a structure where none fits is
dropped. Of the variants that fit only the cheapest are predicted: more recomputation or
more sharding only adds work or traffic, so a variant is dropped when one with no more of
either fits (for each recomputation variant, the least ZeRO stage that fits, kept only if
it shards less than every variant redoing no more of its work needs: the module list and the
attention core are not compared, each redoing work the other does not, nor either with
``blocks``, which redoes more than none and less than full). One exception: beside a ZeRO-0
variant (with dp·cp > 1) its ZeRO-1 is timed too, where the stack runs it: the distributed
optimizer's reduce-scatter behind the backward and weight gather ahead of the forward can beat
the all-reduce in time (:func:`.search.frugal`). A ``blocks`` candidate is bounded
with one layer a chunk recomputed, the least it can redo. In-flight activation
profiles are cached per (schedule, p, equivalent m, v) and the step-time model caches its
pipeline simulations. ``prune=False`` predicts every variant that fits and
``cached=False`` recomputes every variant's memory from the full schedule (the
benchmark's baseline).

**Rank.** By the step time of the ``predictor`` passed in (the service passes the default or the
seed step model). :func:`.why.why` names the terms that differ most between two ranked layouts.

Modules: :mod:`.space` (what is enumerated), :mod:`.search` (fit, prune, rank), :mod:`.why`.
"""

from .search import DEFAULT_MARGIN, Evaluated, Exploration, count_runnable, explore, find, frugal
from .space import (DEFAULT_SCHEDULES, RECOMPUTE_ORDER, ZERO_ORDER, Space, Structure, divisors, ep_choices,
                    make_run, structures, tp_ok, vpp_choices)
from .why import BREAKDOWN_TERMS, MEMORY_TERMS, why

__all__ = ["DEFAULT_MARGIN", "Evaluated", "Exploration", "count_runnable", "explore", "find", "frugal", "DEFAULT_SCHEDULES",
           "RECOMPUTE_ORDER", "ZERO_ORDER", "Space", "Structure", "divisors", "ep_choices", "make_run", "structures",
           "tp_ok", "vpp_choices", "BREAKDOWN_TERMS", "MEMORY_TERMS", "why"]
