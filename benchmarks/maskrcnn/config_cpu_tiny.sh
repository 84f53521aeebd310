# Mask R-CNN on the CPU fixture: the real model and code path at tiny widths (ResNet-50 base
# width 8, FPN 32, box head 128, mask head 32), 128-pixel images of three classes of objects
# 30-70% of the image side, fewer RPN candidates and sampled anchors and RoIs per image; base
# LR 0.02 for 8 images (the smallest multiple of 0.02 the 1.1.0 rules allow; at 0.04 one seed
# of five diverged), a 50-step warm-up from 0.1 x, x0.1 at steps 224 and 288 (epochs 7 and 9),
# evaluation after every epoch. For CI and first contact, not an MLPerf result.
NPROC=1
# one compute thread beside the loader process: two threads spin against each other as soon as
# anything else runs on CI's 2 cores (measured under load: 172 s an epoch against 21 s)
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
PRECISION=${PRECISION:-fp32}
FIXTURE_ARGS=(--train 300 --val 50 --image-size 128 --classes 3 --object-sizes 0.3,0.7)
TRAIN_ARGS=(
    --device cpu --precision "$PRECISION" --workers 1
    --width 8 --fpn-channels 32 --box-head-dim 128 --mask-head-dim 32
    --min-size 128 --max-size 128 --batch-size 8 --eval-batch-size 25
    --rpn-pre-nms-top-n-train 300 --rpn-pre-nms-top-n-test 300
    --rpn-post-nms-top-n-train 300 --rpn-post-nms-top-n-test 300
    --rpn-fpn-post-nms-top-n-train 1000 --rpn-fpn-post-nms-top-n-test 100
    --rpn-batch-size-per-image 64 --roi-batch-size-per-image 64
    --lr 0.02 --warmup-steps 50 --warmup-factor 0.1 --lr-decay-steps 224,288 --epochs 16
)
