# BERT-large on 8 H200s: NVIDIA's v1.1 DGX A100 8-GPU settings (config_DGXA100_1x8x56x1):
# 56 sequences per GPU (global 448), LAMB LR 3.5e-4, betas 0.9/0.999, weight decay
# 0.01, no warm-up, 7100 steps, at most 4.5M samples, evaluation every 150000
# samples; flat parameter buffer with the sharded LAMB and a whole-step CUDA graph;
# unpadded flash attention, fused bias+GELU and dropout+residual+LayerNorm, bf16 weights
# over fp32 master weights.
NPROC=8
PRECISION=${PRECISION:-amp-bf16}
TRAIN_ARGS=(
    --precision "$PRECISION" --init-checkpoint "${INIT_CHECKPOINT:?INIT_CHECKPOINT: the phase-1 checkpoint}"
    --max-seq-length 512 --max-predictions 76 --batch-size 56 --grad-accum 1
    --eval-batch-size 128 --attention unpad --fused-gelu --fused-layernorm --bf16-weights
    --flat-params --sharded-optimizer
    --lr 3.5e-4 --epsilon 1e-6 --beta1 0.9 --beta2 0.999 --weight-decay 0.01
    --warmup-steps 0 --start-warmup-step 0 --max-steps 7100
    --max-samples-termination 4500000 --eval-start-samples 150000 --eval-every-samples 150000
    --eval-samples 10000
)
