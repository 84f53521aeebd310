# The 3D U-Net on one H100 with the reference's single-GPU settings, which are the ruleset's
# reference convergence point for global batch 2 (a factor of the 168 training cases):
# SGD (Nesterov) momentum 0.9, LR 0.8 after a 200-epoch warm-up from 1e-4, no decay,
# weight decay 0, oversampling 0.4, 128^3 patches and windows, overlap 0.5, evaluation every
# 20 epochs from epoch 1000, at most 4000 epochs: the hyper-parameters' defaults.
NPROC=1
PRECISION=${PRECISION:-amp-bf16}
OPTIMISATIONS=(channels-last fused-norm compile=default cuda-graph sharded-eval)
# before the clock (--init-steps 12): compilation, Triton's kernels and, after the graphs'
# 11 eager steps, a captured step
TRAIN_ARGS=(--precision "$PRECISION" --workers 8 --eval-batch-size 4 --init-steps 12)
