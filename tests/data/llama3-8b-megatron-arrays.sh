#!/bin/bash
# Llama 3 8B in FP8 on H100 as a launch script in the style of Megatron-LM's examples: literal
# variables (some with a positional default), bash arrays of flags, a conditional that appends
# quoted "--flag value" words, the arrays expanded on the torchrun line. What modelcut
# from-megatron reads of a script like this (docs/default-model.md, "From Megatron-LM arguments").
CKPT=${1:-"checkpoints/llama3_8b"}
DATA=${2:-"MOCK"}
GPUS_PER_NODE=8
NODES=${NODES:-1}
WORLD=$(($GPUS_PER_NODE*$NODES))     # arithmetic: not substituted, and not a flag modelcut reads

TP=2
PP=1
MBS=1
GBS=128
SEQ=8192
DTYPE="fp8"

LAUNCH=(
    --nproc_per_node $GPUS_PER_NODE
    --nnodes $NODES
)

SHAPE=(
    --num-layers 32
    --hidden-size 4096 --ffn-hidden-size 14336
    --num-attention-heads 32 --group-query-attention --num-query-groups 8
    --swiglu --normalization RMSNorm --position-embedding-type rope
    --untie-embeddings-and-output-weights --disable-bias-linear
    --attention-dropout 0.0 --hidden-dropout 0.0
    --vocab-size 128256
)

TRAIN=(
    --micro-batch-size $MBS
    --global-batch-size $GBS
    --seq-length ${SEQ}
    --bf16
    --grad-reduce-in-bf16
    --cross-entropy-loss-fusion
)

PRECISION=()
if [[ "$DTYPE" == "fp8" ]]; then
    PRECISION+=(
        "--fp8-format hybrid"
        "--fp8-recipe tensorwise"
        "--fp8-param-gather"
    )
fi

PARALLEL=(
    --tensor-model-parallel-size $TP
    --pipeline-model-parallel-size $PP
    --sequence-parallel
    # --context-parallel-size 2   (a comment inside an array)
)

DDP=(
    --use-distributed-optimizer
    --overlap-grad-reduce
    --overlap-param-gather
)
TRAIN+=("${DDP[@]}")

if [[ "$DATA" == "MOCK" ]]; then
    DATA_ARGS=("--mock-data" "--tokenizer-type NullTokenizer")
else
    DATA_ARGS=("--data-path $DATA")
fi

torchrun ${LAUNCH[@]} pretrain_gpt.py \
    ${SHAPE[@]} ${TRAIN[@]} ${PRECISION[@]} ${PARALLEL[@]} ${DATA_ARGS[@]} \
    --save "$CKPT" --load "$CKPT"
