# SSD300 on one H100 with the hyper-parameters of the 1.1.0 reference convergence point for
# global batch 1024 (rcps_ssd.json "ssd_ref_1024_s128": base LR 0.8 = 0.025 x 1024/32, 300
# warm-up steps = 2.62 epochs of 117266 images, decay after epochs 40 and 50, weight decay
# 5e-4, max_samples 50). The step at batch 1024 peaks at 45.3 GiB (docs/performance.md), so
# COCO's decoded images (51.9 GB at side 384) are cached in host memory instead of on the
# GPU (--image-cache host): each batch's images are copied over, then cropped, flipped,
# resized and jittered on the GPU; the jitter as compiled passes (--fused-jitter) took this
# pipeline from 2065.2-2256.6 to 2941.5-3425.2 img/s within an epoch on the 640-pixel
# fixture (two calls).
# Compiling and the CUDA graph's capture happen before run_start (--init-steps 12: the graph
# is captured at the 12th call); with these flags the fixture ran 13.8 s on one H100 after
# 91 s of initialization, against 66.9 s without --init-steps (docs/performance.md, SSD).
# --compile tuned: Inductor's coordinate-descent tuning of each fused kernel, 1.48x plain
# compiled at batch 1024 against 1.44x with --compile default (one process on one H100);
# it lengthens initialization (the fixture: 253 s instead of 91 s, then success in 9.2
# s). While tuning, Triton may print an MLIR "error: operand ... does not dominate"
# with a kernel's IR to stderr: a candidate block size it failed to compile, skipped.
# --fused-match: the matching's IoU maxima in one Triton kernel instead of a [batch, 200,
# 8732] IoU matrix; with it the step at batch 1024 ran 1.56x plain compiled (3930.2 against
# 2525.8 img/s, 45.3 GiB) and the fixture succeeded in 7.6 s after 323.8 s of initialization.
# The backbone starts from torchvision's ImageNet ResNet-34, as the reference's does
# (BACKBONE_CHECKPOINT).
NPROC=1
PRECISION=${PRECISION:-amp-bf16}
TRAIN_ARGS=(
    --precision "$PRECISION" --workers 14 --channels-last --space-to-depth --fused-pool
    --class-last-heads --fused-match
    --compile tuned --init-steps 12
    --image-cache host --cache-side 384 --fused-jitter
    --batch-size 1024 --eval-batch-size 256 --max-samples 50
    --lr 0.025 --warmup-epochs 2.62 --warmup-factor 0 --lr-decay-epochs 40,50
    --weight-decay 5e-4 --epochs 80 --scoring faster-coco-eval --background-scoring
    --backbone-checkpoint "${BACKBONE_CHECKPOINT:?set BACKBONE_CHECKPOINT to a torchvision resnet34 state dict (docs/data.md#ssd)}"
)
