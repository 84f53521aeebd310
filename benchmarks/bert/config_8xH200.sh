# BERT-large on 8 H200s: NVIDIA's v1.1 DGX A100 8-GPU settings (config_DGXA100_1x8x56x1),
# the hyper-parameters' defaults: 56 sequences per GPU (global 448).
NPROC=8
PRECISION=${PRECISION:-amp-bf16}
OPTIMISATIONS=(unpad triton-attention fused-qkv triton-qkv triton-gelu triton-layernorm flat-params
               sharded-optimizer fused-lamb bf16-weights cuda-graph)
TRAIN_ARGS=(
    --precision "$PRECISION" --init-checkpoint "${INIT_CHECKPOINT:?INIT_CHECKPOINT: the phase-1 checkpoint}"
    # before the clock: Triton's kernels and, after the graphs' 11 eager steps, a captured step
    --init-steps 12
)
