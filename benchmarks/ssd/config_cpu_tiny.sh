# SSD300 on the CPU fixture: the real model at a quarter of its width (--width 16), 300x300
# inputs, the reference's schedule shortened (decay x0.1 after epochs 32 and 40, which the
# 1.1.0 rules accept), evaluation every 2 epochs from epoch 24. For CI and first contact,
# not an MLPerf result.
NPROC=1
PRECISION=${PRECISION:-fp32}
FIXTURE_ARGS=(--train 300 --val 60 --image-size 128 --classes 5)
TRAIN_ARGS=(
    --device cpu --precision "$PRECISION" --workers 1 --width 16
    --batch-size 16 --eval-batch-size 30 --max-boxes 8
    --lr 0.05 --warmup-epochs 1 --lr-decay-epochs 32,40
    --epochs 48 --eval-epochs 24,28,32,34,36,38,40,42,44,46
)
