#!/bin/bash
# Llama 3 70B on 64 H100 (its shape: Grattafiori et al. 2024, Table 3) as a Megatron-LM launch line: what
# modelcut from-megatron reads (docs/default-model.md, "From Megatron-LM arguments")
torchrun --nproc_per_node 8 pretrain_gpt.py \
    --num-layers 80 --hidden-size 8192 --ffn-hidden-size 28672 --num-attention-heads 64 \
    --group-query-attention --num-query-groups 8 --swiglu --normalization RMSNorm \
    --position-embedding-type rope --untie-embeddings-and-output-weights --disable-bias-linear \
    --attention-dropout 0.0 --hidden-dropout 0.0 \
    --tensor-model-parallel-size 4 --pipeline-model-parallel-size 4 --num-layers-per-virtual-pipeline-stage 5 \
    --context-parallel-size 2 --sequence-parallel \
    --micro-batch-size 1 --global-batch-size 128 --seq-length 8192 \
    --use-distributed-optimizer --overlap-grad-reduce --overlap-param-gather --tp-comm-overlap \
    --recompute-granularity selective --bf16 --cross-entropy-loss-fusion \
    --lr 3e-4 --data-path /data/x --tokenizer-type HuggingFaceTokenizer
