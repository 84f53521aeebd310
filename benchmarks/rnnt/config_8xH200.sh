# RNN-T on 8 H200s: NVIDIA's v1.1 DGX A100 8-GPU setting, 8 x 256 = global batch 2048 with
# the hyper-parameters of the 1.1.0 reference convergence point "rnn_t_ref_2k". Needs DATADIR
# with the manifests and the SentencePiece model of prepare_data.
NPROC=8
PRECISION=${PRECISION:-amp-bf16}
OPTIMISATIONS=(packed-joint compiled-joint compiled-loss triton-lattice flat-params rnn-graphs
               decode-graphs)
TRAIN_ARGS=(
    --precision "$PRECISION" --workers 12
    --batch-size 256 --grad-accum 1 --eval-batch-size 256
    --lr 7e-3 --hold-epochs 33 --lr-exp-gamma 0.939 --ema 0.995
    # the compiled parts build before run_start
    --init-steps 2
)
