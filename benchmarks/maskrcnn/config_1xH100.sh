# Mask R-CNN on one H100 with the hyper-parameters of the 1.1.0 reference convergence point
# for global batch 48 "maskrcnn_ref_48" (rcps_maskrcnn.json; the smallest batch the RCPs
# cover): base LR 0.06, an 800-step warm-up from 0.000096 x, x0.1 at steps 24000 and 32000,
# 6000 post-NMS proposals per batch. The backbone starts from torchvision's ImageNet resnet50
# weights (BACKBONE_CHECKPOINT). Not yet run on the GPU: whether batch 48 fits in 80 GB is open.
# Frozen batch norm folded into the convolutions and channels-last memory: 1.10x the plain
# step on one H100; NMS's greedy step as one Triton kernel (--nms triton, the same result):
# with --compile and --loss-streams it made the step 1.76x faster (87.3 -> 153.4 img/s,
# docs/performance.md, Mask R-CNN). --compile and --loss-streams are not set here yet: no
# fixture run through the driver has finished with them on a GPU.
NPROC=1
PRECISION=${PRECISION:-amp-bf16}
TRAIN_ARGS=(
    --precision "$PRECISION" --workers 14 --fold-frozen-bn --channels-last --nms triton
    --backbone-checkpoint "${BACKBONE_CHECKPOINT:?set BACKBONE_CHECKPOINT to a torchvision resnet50 state dict (docs/data.md#maskrcnn)}"
    --batch-size 48 --eval-batch-size 16
    --lr 0.06 --warmup-steps 800 --warmup-factor 0.000096 --lr-decay-steps 24000,32000
    --rpn-fpn-post-nms-top-n-train 6000 --epochs 17
    --scoring faster-coco-eval --background-scoring
)
