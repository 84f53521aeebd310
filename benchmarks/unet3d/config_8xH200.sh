# The 3D U-Net on 8 H200s: 7 samples per GPU, global batch 56 (168 / 3, as NVIDIA's v1.1
# 1x8x7 runs), with the ruleset's reference convergence point for batch 56: LR 2.0 after a
# 1000-epoch warm-up from 1e-4, no decay, momentum 0.9, weight decay 0, evaluation every 20
# epochs from epoch 1000. SPATIAL_GROUP=2 splits every sample's depth over 2 GPUs (global
# batch BATCH_SIZE x 4; the ruleset has no reference convergence point for batch 28).
NPROC=8
PRECISION=${PRECISION:-amp-bf16}
# not compiled: that path has not run on several GPUs
OPTIMISATIONS=(channels-last fused-norm cuda-graph sharded-eval)
((${SPATIAL_GROUP:-1} > 1)) && OPTIMISATIONS+=("spatial-group=$SPATIAL_GROUP")
# before the clock (--init-steps 12): compilation, Triton's kernels and, after the graphs'
# 11 eager steps, a captured step
TRAIN_ARGS=(
    --precision "$PRECISION" --workers 8 --batch-size "${BATCH_SIZE:-7}" --eval-batch-size 4
    --lr 2.0 --lr-warmup-epochs 1000 --init-steps 12
)
