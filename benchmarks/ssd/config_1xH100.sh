# SSD300 on one H100 with the hyper-parameters of the 1.1.0 reference convergence point for
# global batch 1024 (rcps_ssd.json "ssd_ref_1024_s128": base LR 0.8 = 0.025 x 1024/32, 300
# warm-up steps = 2.62 epochs of 117266 images, decay after epochs 40 and 50, weight decay
# 5e-4, max_samples 50). COCO's decoded images (51.9 GB at side 384) do not fit beside the
# step at batch 1024 (45.3 GiB), so they are cached in host memory. The backbone starts from
# torchvision's ImageNet ResNet-34, as the reference's does (BACKBONE_CHECKPOINT).
NPROC=1
PRECISION=${PRECISION:-amp-bf16}
# compile=tuned: while tuning, Triton may print an MLIR "operand ... does not dominate" error
# with a kernel's IR: a candidate block size it failed to compile, skipped
OPTIMISATIONS=(image-cache=host fused-jitter channels-last space-to-depth fused-pool
               class-last-heads fused-match compile=tuned cuda-graph)
TRAIN_ARGS=(
    --precision "$PRECISION" --workers 14 --init-steps 12
    --batch-size 1024 --eval-batch-size 256 --max-samples 50
    --lr 0.025 --warmup-epochs 2.62 --scoring faster-coco-eval --background-scoring
    --backbone-checkpoint "${BACKBONE_CHECKPOINT:?set BACKBONE_CHECKPOINT to a torchvision resnet34 state dict (docs/data.md#ssd)}"
)
