# ResNet-50 on 8 H200s: 408 images per GPU, global batch 3264, the settings of
# the ruleset's reference convergence point for batch 3264 (NVIDIA's v1.1 values).
NPROC=8
PRECISION=${PRECISION:-amp-fp16}
# Compiling, autotuning and capture run before run_start (--init-steps); COMPILE=default
# skips Inductor's autotuning (minutes on a machine's first run).
OPTIMISATIONS=(channels-last space-to-depth "compile=${COMPILE:-max-autotune-no-cudagraphs}"
               cuda-graph)
# cuDNN 9.19 has fusion engines for fp16 only: pip install ".[cudnn]".
[[ $PRECISION == amp-fp16 ]] && OPTIMISATIONS+=(cudnn-fusion)
# The input: DATA_BACKEND=turbo (libjpeg-turbo 3 with SIMD: make turbojpeg), nvjpeg, dali or
# pillow (the reference reader).
INPUT=${DATA_BACKEND:-turbo}
[[ $INPUT == turbo ]] && INPUT="turbo region-decode resize-on-device eval-nvjpeg-share=0.5"
[[ $INPUT != pillow ]] && OPTIMISATIONS+=($INPUT)
TRAIN_ARGS=(--precision "$PRECISION" --workers 12 --batch-size 408 --eval-batch-size 500
            --init-steps 12)
