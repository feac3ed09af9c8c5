"""Memory per device, per pipeline stage: weights, gradients, optimizer states, activations.

Everything is in bytes, for one device (one tensor-, context-, data-parallel rank) of each
pipeline rank. Pure: no I/O. :mod:`.activations` holds the per-layer bytes, :mod:`.stages` the
per-device totals; parameters per device are :mod:`..costs.params`' (the same count the
data-parallel collectives move), bytes per parameter :mod:`..units`'.

**Weights, gradients, optimizer states** (mixed-precision Adam as Megatron-LM keeps it:
BF16 weights, FP32 gradient accumulation buffer ``main_grad``, FP32 main parameters, FP32
Adam moments m and v; megatron/training/theoretical_memory_usage.py counts 18 bytes per
parameter, 6 + 12/d with the distributed optimizer). ZeRO stages (Rajbhandari et al. 2020,
"ZeRO", §5) shard over the data-parallel group times the context-parallel group, as
Megatron-LM shards its distributed optimizer over dp·cp:

====== ============== =============== ================
zero   weights        gradients       optimizer
====== ============== =============== ================
0      2              4               12
1      2              4               12/D
2      2              4/D             12/D
3      2/D + gathered 4/D             12/D
====== ============== =============== ================

A stack that reduces gradients in 16 bits through Megatron's DDP keeps the gradient buffer in
the parameters' dtype, 2 bytes instead of 4 (the framework's ``grad_buffer_bytes``: NeMo, and
Megatron-LM of 2021 with fp16).

ZeRO-3 (FSDP) also holds the weights it has gathered: with ``reshard_after_forward``
(FSDP's default) one layer being used and one prefetched, 2·2·P_layer; without it (Llama 3
§3.3.2: "does not reshard the weights after the forward pass") the whole stage's BF16
weights, 2·P_stage, for the duration of the step. DeepSpeed v0.3's ZeRO-3 hooks gather weight
by weight instead: memory holds the most elements its replay (:mod:`..step.deepspeed_stage3`,
the one the step time runs) has gathered at once: the sub-module running, its prefetch (5e7
elements at least) and what the reuse distance keeps.

**Activations per layer** after Korthikanti et al. 2022 ("Reducing Activation Recomputation
in Large Transformer Models", §4 and Table 2), per token of the micro-batch on this rank
(n = b·s/cp tokens), in bytes, with h the hidden size, q = heads·head_dim, k = kv_heads·
head_dim (grouped-query attention), f the MLP width, a the heads, s the full sequence, t
the tensor-parallel size:

* kept whole on every tensor-parallel rank (divided by t only with sequence parallelism):
  the two norms' inputs 2h + 2h, the QKV and MLP inputs (the norms' outputs) 2h + 2h, and,
  with dropout, the attention and MLP dropout masks h + h — 10h as in Table 2 (8h without
  dropout);
* divided by t: Q, K, V 2(q + 2k), the attention output (input to the output projection)
  2q, the MLP 4f (input of GeLU 2f, input of the second linear 2f) or, gated (SwiGLU), 6f
  (the first linear's 2f-wide output 4f, the gated product 2f) — 24h for GPT (q = k = h,
  f = 4h) as in Table 2;
* the attention core, divided by t: without FlashAttention the s-long score rows of each
  query, a·s·(2 softmax + 1 dropout mask + 2 dropout output) = 5as (2as without dropout);
  with FlashAttention (Dao et al. 2022) no score matrix at all, only the FP32 log-sum-exp
  per head and token, 4a.

Selective recomputation (Korthikanti §5) drops the attention core (nothing to drop with
FlashAttention); under torchtitan's per-op policy (the stack's ``selective = "op"``) a dense
layer keeps what :mod:`..costs.op_sac` says it keeps, and the layer being recomputed holds the
rest again. Full recomputation keeps only each layer's input, 2h (divided by t with
sequence parallelism), plus, while one layer is recomputed in the backward, that one
layer's activations. Mixture-of-experts layers hold the routed tokens' expert MLP
activations top_k times (times the capacity factor, if any), plus the permuted input 2h·top_k.

**Context parallelism** (:mod:`.context`, the per-token terms above are on n = b·s/cp
tokens). Both forms keep only the local K and V for the backward. The all-gather form (Llama 3
§3.3.2) gathers the whole sequence's K and V again in the backward (Transformer Engine's
``AttnFuncWithCPAndKVAllGather``; the step time pays that second gather): while a layer computes,
cp blocks of gathered K and V exist in its forward, and in its backward those and the whole
sequence's dK, dV, 2·cp blocks, until reduce-scattered, block = b·(s/cp)·2·kv_t·2 bytes
(:func:`.context.block_bytes`). The ring form has two blocks in flight in its forward and four
in its backward (K, V, dK, dV of the current and the next step). Those
transient buffers (``CPAttention.transient_fwd_bytes``/``transient_bwd_bytes``) belong to the
one layer being computed: each device adds the larger once, like full recomputation's
working set. Full recomputation keeps neither copy of K and V.

**DualPipe** (DeepSeek-V3 report, arXiv 2412.19437 §3.2.1, Table 2) holds two copies of the
model's p pipeline stages, one per direction: device d holds stage d of one and stage
p − 1 − d of the other, so every device holds two stages' weights, gradients and optimizer
states (2× parameters) and devices 0 and p − 1 hold both an embedding and an output layer.
DualPipeV holds one V of 2p stages, two chunks per device, as ZB-V.

**Expert parameters** (:mod:`.moe`): an MoE layer's routed experts are cut over ep·etp ranks
(:func:`..costs.params.layer_params`) and sharded by ZeRO over the expert-data-parallel group,
tp·cp·dp/(ep·etp) ranks (:func:`shard_groups`); everything else as the dense model's.

**First and last stages.** The first stage also keeps the token ids (int64, 8 bytes a
token, for the embedding's backward) and, with dropout, the embedding dropout mask h. The
last keeps the final norm's input and output, 2h + 2h (divided by t with sequence
parallelism), and what the loss's kernel keeps of the logits, per logit of V/t a token
(:data:`.activations.LOSS_BYTES`): Megatron-LM's vocab-parallel cross-entropy casts the logits
to FP32 and saves ``exp_logits`` for its backward, 4 (megatron/core/tensor_parallel/
cross_entropy.py, ``VocabParallelCrossEntropy``; theoretical_memory_usage.py counts the same
4·s·b·h·(1 + V/h)); the device holding the loss adds, once, what the kernel holds beyond that
while it runs (:func:`.activations.loss_transient_bytes`).

**Micro-batches in flight** come from the pipeline schedule itself (:mod:`..sim.inflight`,
read through the pipeline plan): each forward of a stage allocates that stage's activations,
each backward frees them (a split backward frees all but the weight-gradient share,
``W_FRACTION``, which W frees), weighted by what each stage really holds (uneven stages, the
embedding, the logits).

**Uneven splits.** The layers go to the p·v virtual stages as the pipeline plan puts them
(:mod:`..plan`: as even as possible, the lighter stages at the two ends of the pipeline, where
the embedding and the loss sit); pass a prediction's ``plan`` so memory and time describe the
same pipeline. For Llama 3
405B (126 layers) on 16 stages this gives 7, 8, ..., 8, 7 layers: "one Transformer layer
removed from the first and the last stages" (Grattafiori et al. 2024, §3.3.2); with v = 8
the first chunk holds only the embedding and the last only the output and the loss, as the
paper says; it is also what Megatron-LM's ``--account-for-embedding-in-pipeline-split
--account-for-loss-in-pipeline-split`` and torchtitan's ``generate_llm_fqn_per_model_part``
(input and output weight 1) give whenever l + 2 divides evenly. Megatron-LM's
``--decoder-first-pipeline-num-layers``/``--decoder-last-pipeline-num-layers`` can be given
instead (the layout's ``first_layers``/``last_layers``).

**Framework buffers** are a stated allowance, reported apart: ``buffer_fixed_bytes`` for
the CUDA context, cuBLAS/cuDNN workspaces and NCCL communicator buffers, and
``fragmentation`` times what the step allocates and frees (the activations and ZeRO-3's
gathered weights) for the caching allocator's fragmentation; the states held through the step
leave no freed blocks to fragment (:func:`.stages._total`).
"""

from .activations import (cp_kept_extra_bytes, cp_transient_bytes, embedding_activation_bytes,
                          layer_activation_bytes, loss_activation_bytes, loss_transient_bytes)
from .stages import (DEFAULT_OPTIONS, MemoryOptions, StageMemory, for_framework, memory_plan, memory_report,
                     peak_bytes, shard_groups, stack_options, stage_memory, state_bytes, variant_peaks,
                     with_moments)

__all__ = ["cp_kept_extra_bytes", "cp_transient_bytes", "embedding_activation_bytes", "layer_activation_bytes",
           "loss_activation_bytes", "loss_transient_bytes", "DEFAULT_OPTIONS", "MemoryOptions", "StageMemory", "for_framework",
           "memory_plan", "memory_report", "peak_bytes", "shard_groups", "stack_options", "stage_memory", "state_bytes",
           "variant_peaks", "with_moments"]
