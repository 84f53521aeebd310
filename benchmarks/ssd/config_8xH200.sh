# SSD300 on 8 H200s: 8 x 128 = global batch 1024 with the hyper-parameters of the 1.1.0
# reference convergence point "ssd_ref_1024_s128" (batch norm over each GPU's 128 images,
# model_bn_span 128). Each GPU keeps COCO's training images decoded in its memory (51.9 GB at
# side 384) beside the step (8.2 GiB at batch 128). Not yet run: no machine of several GPUs
# was lent. The colour jitter as compiled passes (--fused-jitter): 4444.7-5919.2 img/s from
# the device cache within an epoch on the 640-pixel fixture, against 3069.2-3254.1 without.
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
NPROC=8
PRECISION=${PRECISION:-amp-bf16}
TRAIN_ARGS=(
    --precision "$PRECISION" --workers 12 --channels-last --space-to-depth --fused-pool
    --class-last-heads --fused-match
    --compile tuned --init-steps 12
    --image-cache device --cache-side 384 --fused-jitter
    --batch-size 128 --eval-batch-size 64 --max-samples 50 --bn-group 1
    --lr 0.025 --warmup-epochs 2.62 --warmup-factor 0 --lr-decay-epochs 40,50
    --weight-decay 5e-4 --epochs 80 --scoring faster-coco-eval --background-scoring
    --backbone-checkpoint "${BACKBONE_CHECKPOINT:?set BACKBONE_CHECKPOINT to a torchvision resnet34 state dict (docs/data.md#ssd)}"
)
