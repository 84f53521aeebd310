# ResNet-50 on 8 H200s: 408 images per GPU, global batch 3264, the settings of
# the ruleset's reference convergence point for batch 3264 (NVIDIA's v1.1 values).
NPROC=8
PRECISION=${PRECISION:-amp-fp16}
# In amp-fp16 batch norm runs inside cuDNN fusion graphs (cuDNN 9.19 has no bf16
# fusion engines): pip install ".[cudnn]". Another PRECISION runs without them.
FUSION=()
[[ $PRECISION == amp-fp16 ]] && FUSION=(--cudnn-fusion)
# Inductor autotunes its kernels (3% faster steps on the H100): minutes on a machine's
# first run, then Inductor's on-disk cache. COMPILE=default skips the autotuning.
# Compiling, autotuning and CUDA-graph capture happen before run_start (--init-steps).
TRAIN_ARGS=(
    --precision "$PRECISION" --data-backend "${DATA_BACKEND:-nvjpeg}" --workers 12
    --batch-size 408 --grad-accum 1 --eval-batch-size 500
    --optimizer lars --lr 10.5 --end-lr 0.0001 --warmup-epochs 2 --poly-power 2
    --momentum 0.9 --weight-decay 5e-5 --lars-eta 0.001 --label-smoothing 0.1
    --epochs 37 --eval-period 4 --eval-offset 2 --bn-group 1
    --compile "${COMPILE:-max-autotune-no-cudagraphs}" --space-to-depth "${FUSION[@]}"
    --init-steps 12
)
