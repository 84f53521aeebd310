# BERT-large on one H100: global batch 256 as 4 micro-batches of 64, the ruleset's reference
# convergence point for batch 256 (13700 steps). Needs DATADIR and INIT_CHECKPOINT (README.md).
NPROC=1
PRECISION=${PRECISION:-amp-bf16}
OPTIMISATIONS=(unpad triton-attention fused-qkv triton-qkv triton-gelu triton-layernorm flat-params
               sharded-optimizer fused-lamb bf16-weights cuda-graph)
TRAIN_ARGS=(
    --precision "$PRECISION" --init-checkpoint "${INIT_CHECKPOINT:?INIT_CHECKPOINT: the phase-1 checkpoint}"
    --batch-size 256 --grad-accum 4 --max-steps 13700
    # before the clock: Triton's kernels and, after the graphs' 11 eager steps, a captured step
    --init-steps 12
)
