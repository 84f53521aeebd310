# Mask R-CNN on 8 H200s: 8 x 12 = global batch 96 with the hyper-parameters of the 1.1.0
# reference convergence point "maskrcnn_ref_96" (rcps_maskrcnn.json; NVIDIA's 8xA100 setting):
# base LR 0.12, a 625-step warm-up from 0.000192 x, x0.1 at steps 12000 and 16000, 6000
# post-NMS proposals per rank's batch. The backbone starts from torchvision's ImageNet
# resnet50 weights (BACKBONE_CHECKPOINT).
NPROC=8
PRECISION=${PRECISION:-amp-bf16}
# the 1xH100 config's without backward-before-sync, which runs in one process only
OPTIMISATIONS=(
    fold-frozen-bn channels-last nms-triton compile compile-losses loss-streams
    backbone-graphs head-graphs box-head-before-sync fused-sgd aligned-outputs
    roi-align-triton fused-conv-relu space-to-depth device-rle
    box-roi-multiple=512 mask-roi-multiple=128
)
# --size-buckets 4: batches padded to 7 shapes, so the compiled backbone has 7 graphs, each
# compiled and recorded before the clock (--init-steps 14: two steps of each). --gc-freeze:
# setup's objects (compiled code, graphs) out of the garbage collector's full collections,
# which would pause one rank inside a timed step while every rank waits for it
TRAIN_ARGS=(
    --precision "$PRECISION" --workers 12 --size-buckets 4 --init-steps 14 --gc-freeze
    --backbone-checkpoint "${BACKBONE_CHECKPOINT:?set BACKBONE_CHECKPOINT to a torchvision resnet50 state dict (docs/data.md#maskrcnn)}"
    --batch-size 12 --eval-batch-size 8
    --lr 0.12 --warmup-steps 625 --warmup-factor 0.000192 --lr-decay-steps 12000,16000
    --rpn-fpn-post-nms-top-n-train 6000 --epochs 17
    --scoring faster-coco-eval --background-scoring
)
