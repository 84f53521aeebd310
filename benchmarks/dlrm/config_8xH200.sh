# DLRM on 8 H200s with the hyper-parameters' defaults (the reference convergence point of global
# batch 55296): 6912 samples per GPU, rare embedding rows sharded over the 8 GPUs. The step is
# captured (cuda-graph: the all-to-alls padded to a few capacities, a graph each).
NPROC=8
PRECISION=${PRECISION:-amp-bf16}
# bf16-frequent-grads: +1.1% on two H200s (the frequent rows' all-reduce in bf16)
OPTIMISATIONS=(fused-sgd triton-sparse-sgd hybrid-embeddings bf16-frequent-grads fused-lookups
               aligned-dense interaction-backward compile cuda-graph prefetch cache-eval)
TRAIN_ARGS=(--precision "$PRECISION" --log-every 500
            # before the clock: compilation (training and evaluation) and, after the
            # graphs' 11 eager steps, a captured step
            --init-steps 12)
