# DLRM on one H100, batch 55296 with the reference convergence point's
# hyper-parameters. NOT the closed-division model: the reference's 40M-capped
# tables hold 187.8M rows x 128 = 96 GB in fp32 (plus a 48 GB bf16 copy), more
# than one H100's 80 GB, so this config caps every table at 10M rows
# (--max-ind-range 10000000: 54M rows, ~28 GB fp32 + ~14 GB bf16). Use it for
# single-GPU development and throughput; closed results need config_8xH200.
NPROC=1
PRECISION=${PRECISION:-amp-bf16}
TRAIN_ARGS=(
    --precision "$PRECISION" --no-cuda-graph
    --batch-size 55296 --eval-batch-size 1769472
    --embedding-dim 128 --arch-mlp-bot 13-512-256-128 --arch-mlp-top 1024-1024-512-256-1
    --max-ind-range 10000000 --embedding hybrid --frequent-threshold 20 --stats-batches 20
    --lr 24 --warmup-steps 2750 --decay-start-step 49315 --decay-steps 27772 --poly-power 2
    --epochs 1 --eval-every 0.05 --log-every 500
)
