# The 3D U-Net with every layer of the reference but a quarter of its channels (--filters)
# on the CPU fixture: 64x32x32 patches and windows, batch 4 (a factor of the 168 training
# cases), LR 0.05, evaluation after epoch 3 and then every epoch, up to epoch 20. At LR 0.1
# seed 860546649 reached the target only at epoch 12 on the CPU and not in 20 epochs with
# the GPU flags (amp-bf16); at 0.05 it reaches it at epoch 3 on both (docs/performance.md).
# For CI and first contact, not an MLPerf result.
NPROC=1
PRECISION=${PRECISION:-fp32}
FIXTURE_ARGS=()
OPTIMISATIONS=(sharded-eval)   # with GPUS=N
TRAIN_ARGS=(
    --device cpu --precision "$PRECISION" --workers 0
    --filters 8,16,32,64,80 --input-shape 64,32,32 --val-input-shape 64,32,32
    --batch-size 4 --eval-batch-size 4 --lr 0.05 --lr-warmup-epochs 1
    --epochs 20 --start-eval-at 3 --evaluate-every 1
)
