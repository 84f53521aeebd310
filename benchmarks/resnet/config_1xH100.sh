# ResNet-50 on one H100: global batch 1632 as 4 micro-batches of 408, with the
# hyper-parameters of the ruleset's reference convergence point for batch 1632.
NPROC=1
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
TRAIN_ARGS=(--precision "$PRECISION" --workers 15 --batch-size 1632 --grad-accum 4
            --eval-batch-size 500 --lr 7.4 --epochs 35 --init-steps 12)
