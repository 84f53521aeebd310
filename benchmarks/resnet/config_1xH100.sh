# ResNet-50 on one H100: global batch 1632 as 4 micro-batches of 408, with the
# hyper-parameters of the ruleset's reference convergence point for batch 1632.
NPROC=1
PRECISION=${PRECISION:-amp-fp16}
# In amp-fp16 batch norm runs inside cuDNN fusion graphs (cuDNN 9.19 has no bf16
# fusion engines): pip install ".[cudnn]". Another PRECISION runs without them.
FUSION=()
[[ $PRECISION == amp-fp16 ]] && FUSION=(--cudnn-fusion)
# Inductor autotunes its kernels (3% faster steps on the H100): minutes on a machine's
# first run, then Inductor's on-disk cache. COMPILE=default skips the autotuning.
# Compiling, autotuning and CUDA-graph capture happen before run_start (--init-steps).
# Input: the turbo backend (libjpeg-turbo and the crops in 15 loader processes, no GPU
# decode): on 16 host cores it fed 4,016-4,096 img/s end to end against 3,342 for nvjpeg
# (docs/performance.md, ResNet input pipeline, session 19); DATA_BACKEND=nvjpeg for that.
# With only each crop's region decoded (--region-decode, libjpeg-turbo 3: `make turbojpeg`)
# 4,429-4,493 img/s against 3,634-3,881 without (session 20). Build that library with nasm
# installed (its SIMD code): 6,274.4 img/s against 4,808.5 in plain C, one run each on one
# H100, 86% of the resident step's 7,258.9 (session 25). The crops resized on the GPU, one
# kernel a batch (--resize-on-device): 6,440-6,565 img/s against 5,735-5,801 without in one
# call on one H100 machine, +10.2% on a second, -2.6% on a third (session 26). With the
# slices read in place from the loaders' page-locked pool: 6,973-7,062 img/s, 96.4-97.6% of
# the resident step's 7,233.2 in the same call (session 27, docs/performance.md).
# Evaluation batches: half of each decoded by nvJPEG in the training process
# (--eval-nvjpeg-share 0.5): the evaluation pipeline alone fed 9,790 img/s against 7,433 for
# training's in the same call; with the loader processes alone 6,950 against 9,624 at 0.4
# (session 28, docs/performance.md).
# EXTRA_ARGS="--no-resize-on-device --eval-nvjpeg-share 0" resizes in the loaders.
REGION=()
[[ ${DATA_BACKEND:-turbo} == turbo ]] && REGION=(--region-decode --resize-on-device
                                                 --eval-nvjpeg-share 0.5)
TRAIN_ARGS=(
    --precision "$PRECISION" --data-backend "${DATA_BACKEND:-turbo}" --workers 15
    "${REGION[@]}"
    --batch-size 1632 --grad-accum 4 --eval-batch-size 500
    --optimizer lars --lr 7.4 --end-lr 0.0001 --warmup-epochs 2 --poly-power 2
    --momentum 0.9 --weight-decay 5e-5 --lars-eta 0.001 --label-smoothing 0.1
    --epochs 35 --eval-period 4 --eval-offset 2 --bn-group 1
    --compile "${COMPILE:-max-autotune-no-cudagraphs}" --space-to-depth "${FUSION[@]}"
    --init-steps 12
)
