# RNN-T on one H100 at the 1.1.0 reference convergence point "rnn_t_ref_1k" (the MLCommons
# reference's hyper-parameters): 1024 utterances per step as 8 micro-batches of 128. Needs
# DATADIR with the manifests and the SentencePiece model of prepare_data.
NPROC=1
PRECISION=${PRECISION:-amp-bf16}
OPTIMISATIONS=(packed-joint compiled-joint compiled-loss triton-lattice flat-params rnn-graphs
               decode-graphs)
TRAIN_ARGS=(
    --precision "$PRECISION" --workers 12
    --batch-size 1024 --eval-batch-size 256
    # the RCP of global batch 1024 clips no gradient (its "none", logged as inf)
    --clip-norm inf
    # the compiled parts build before run_start
    --init-steps 2
)
