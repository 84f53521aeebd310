# ResNet-50 v1.5 (the full model) on the CPU fixture: 64 px crops, batch 32,
# evaluation after every epoch. For CI and first contact, not an MLPerf result.
NPROC=1
PRECISION=${PRECISION:-fp32}
FIXTURE_ARGS=(--classes 10 --train-per-class 100 --val-per-class 50 --image-size 80)
# channels-last: a step on two CPU cores takes a third of the NCHW time
OPTIMISATIONS=(channels-last)
TRAIN_ARGS=(
    --device cpu --precision "$PRECISION" --workers 2
    --image-size 64 --batch-size 32 --eval-batch-size 100
    --lr 2.0 --warmup-epochs 1 --epochs 8 --eval-period 1 --eval-offset 0
)
