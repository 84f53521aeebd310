# BERT-large on one H100: global batch 256 as 4 micro-batches of 64, with the
# hyper-parameters of the ruleset's reference convergence point for batch 256
# (LAMB, LR 3.5e-4, betas 0.9/0.999, weight decay 0.01, no warm-up, 13700 steps).
# Needs DATADIR with training/ and eval/ shards, bert_config.json and
# INIT_CHECKPOINT (the reference's phase-1 checkpoint, model.ckpt-28252.pt).
# Unpadded flash attention, fused bias+GELU and bias+dropout+residual+LayerNorm, bf16
# weights/gradients over fp32 LAMB master weights (micro-batch gradients add up in bf16).
NPROC=1
PRECISION=${PRECISION:-amp-bf16}
TRAIN_ARGS=(
    --precision "$PRECISION" --init-checkpoint "${INIT_CHECKPOINT:?INIT_CHECKPOINT: the phase-1 checkpoint}"
    --max-seq-length 512 --max-predictions 76 --batch-size 256 --grad-accum 4
    --eval-batch-size 128 --attention unpad --fused-gelu --fused-layernorm --bf16-weights
    --lr 3.5e-4 --epsilon 1e-6 --beta1 0.9 --beta2 0.999 --weight-decay 0.01
    --warmup-steps 0 --start-warmup-step 0 --max-steps 13700
    --max-samples-termination 4500000 --eval-samples 10000
)
