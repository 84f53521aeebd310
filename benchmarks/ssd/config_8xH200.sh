# SSD300 on 8 H200s: 8 x 128 = global batch 1024 with the hyper-parameters of the 1.1.0
# reference convergence point "ssd_ref_1024_s128" (batch norm over each GPU's 128 images,
# model_bn_span 128). Each GPU keeps COCO's training images decoded in its memory (51.9 GB at
# side 384) beside the step (8.2 GiB at batch 128). The backbone starts from torchvision's
# ImageNet ResNet-34, as the reference's does (BACKBONE_CHECKPOINT).
NPROC=8
PRECISION=${PRECISION:-amp-bf16}
# compile=tuned: while tuning, Triton may print an MLIR "operand ... does not dominate" error
# with a kernel's IR: a candidate block size it failed to compile, skipped
OPTIMISATIONS=(image-cache=device fused-jitter channels-last space-to-depth fused-pool
               class-last-heads fused-match compile=tuned cuda-graph)
TRAIN_ARGS=(
    --precision "$PRECISION" --workers 12 --init-steps 12
    --batch-size 128 --eval-batch-size 64 --max-samples 50
    --lr 0.025 --warmup-epochs 2.62 --scoring faster-coco-eval --background-scoring
    --backbone-checkpoint "${BACKBONE_CHECKPOINT:?set BACKBONE_CHECKPOINT to a torchvision resnet34 state dict (docs/data.md#ssd)}"
)
