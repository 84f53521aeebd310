# DLRM on 8 H200s with the reference convergence point of global batch 55296 (the
# hyper-parameters' defaults): 6912 samples per GPU; frequent rows replicated, rare rows
# sharded over the 8 GPUs (all-to-all over NCCL).
NPROC=8
PRECISION=${PRECISION:-amp-bf16}
OPTIMISATIONS=(fused-sgd hybrid-embeddings prefetch cache-eval)
TRAIN_ARGS=(--precision "$PRECISION" --log-every 500)
