# SSD300 on the CPU fixture: the real model at an eighth of its width (--width 8), 300x300
# inputs, three classes of objects 25-70% of the image side, the reference's schedule
# shortened (x0.1 after epochs 28 and 35, boundaries the 1.1.0 rules accept), evaluation every
# 2 epochs from epoch 8. For CI and first contact, not an MLPerf result.
NPROC=1
PRECISION=${PRECISION:-fp32}
FIXTURE_ARGS=(--train 300 --val 60 --image-size 128 --classes 3 --object-sizes 0.25,0.7)
TRAIN_ARGS=(
    --device cpu --precision "$PRECISION" --workers 1 --width 8
    --batch-size 16 --eval-batch-size 30 --max-boxes 8
    --lr 0.05 --lr-decay-epochs 28,35
    --epochs 40 --eval-epochs 8,10,12,14,16,18,20,22,24,26,28,30,32,34,36,38
)
