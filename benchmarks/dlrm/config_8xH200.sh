# DLRM on 8 H200s: the ruleset's reference convergence point for global batch
# 55296 (rcps_dlrm.json; NVIDIA's HugeCTR v1.1 run: lr 24, 2750 warm-up steps,
# decay from step 49315 over 27772 steps, power 2; 75868 steps = one epoch,
# evaluation every 3793 steps = 0.05 epoch). 6912 samples per GPU; frequent
# rows replicated, rare rows sharded over the 8 GPUs (all-to-all over NCCL).
NPROC=8
PRECISION=${PRECISION:-amp-bf16}
TRAIN_ARGS=(
    --precision "$PRECISION" --no-cuda-graph
    --batch-size 55296 --eval-batch-size 1769472
    --embedding-dim 128 --arch-mlp-bot 13-512-256-128 --arch-mlp-top 1024-1024-512-256-1
    --max-ind-range 40000000 --embedding hybrid --frequent-threshold 20 --stats-batches 20
    --lr 24 --warmup-steps 2750 --decay-start-step 49315 --decay-steps 27772 --poly-power 2
    --epochs 1 --eval-every 0.05 --log-every 500
)
