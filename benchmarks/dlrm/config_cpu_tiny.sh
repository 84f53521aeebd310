# DLRM on the CPU fixture: the reference's layer structure (3 bottom, 5 top layers, dot
# interaction) with small widths, 16-dim embeddings and tables of at most 5000 rows. For CI,
# not an MLPerf result.
NPROC=1   # GPUS=2: the same run on 2 gloo processes
PRECISION=${PRECISION:-fp32}
FIXTURE_ARGS=(--train 300000 --eval 20000 --max-table 5000)
OPTIMISATIONS=(fused-sgd hybrid-embeddings prefetch cache-eval)
TRAIN_ARGS=(
    --device cpu --precision "$PRECISION" --log-every 10
    --batch-size 512 --eval-batch-size 20000
    --embedding-dim 16 --arch-mlp-bot 13-64-32-16 --arch-mlp-top 64-64-32-16-1
    --lr 0.5 --warmup-steps 100 --decay-start-step 450 --decay-steps 135
)
