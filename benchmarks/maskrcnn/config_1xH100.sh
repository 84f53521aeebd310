# Mask R-CNN on one H100 with the hyper-parameters of the 1.1.0 reference convergence point
# for global batch 48 "maskrcnn_ref_48" (rcps_maskrcnn.json; the smallest batch the RCPs
# cover): base LR 0.06, an 800-step warm-up from 0.000096 x, x0.1 at steps 24000 and 32000,
# 6000 post-NMS proposals per batch. The backbone starts from torchvision's ImageNet resnet50
# weights (BACKBONE_CHECKPOINT).
NPROC=1
PRECISION=${PRECISION:-amp-bf16}
OPTIMISATIONS=(
    fold-frozen-bn channels-last nms-triton compile compile-losses loss-streams
    backbone-graphs head-graphs box-head-before-sync fused-sgd aligned-outputs
    backward-before-sync roi-align-triton fused-conv-relu space-to-depth device-rle
    box-roi-multiple=512 mask-roi-multiple=128
)
# --size-buckets 4: batches padded to 7 shapes, so the compiled backbone has 7 graphs, each
# compiled and recorded before the clock (--init-steps 14: two steps of each)
TRAIN_ARGS=(
    --precision "$PRECISION" --workers 14 --size-buckets 4 --init-steps 14
    --backbone-checkpoint "${BACKBONE_CHECKPOINT:?set BACKBONE_CHECKPOINT to a torchvision resnet50 state dict (docs/data.md#maskrcnn)}"
    --batch-size 48 --eval-batch-size 16
    --lr 0.06 --warmup-steps 800 --warmup-factor 0.000096 --lr-decay-steps 24000,32000
    --rpn-fpn-post-nms-top-n-train 6000 --epochs 17
    --scoring faster-coco-eval --background-scoring
)
