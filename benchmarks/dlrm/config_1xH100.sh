# DLRM on one H100 with the reference's 40M-capped tables (187.8M rows): the rare rows in bf16
# alone (bf16-tables, 48 GB, stochastically rounded where the reference keeps fp32; fp32 masters
# with a bf16 copy would take 144 GB, more than the H100's 80). The 8xH200 config keeps fp32
# masters: that one is the closed-division model.
NPROC=1
PRECISION=${PRECISION:-amp-bf16}
# bf16-tables: the throughput tool's step +2.7% and 14.6 in place of 40.4 GiB on one H200 at
# 10M-row tables (docs/performance.md#dlrm). This config's dry run peaked at 50.55 GiB, run with
# the allocator capped at 65.3 GiB: an H100's memory less the real evaluation set's kept batches
OPTIMISATIONS=(fused-sgd triton-sparse-sgd hybrid-embeddings fused-lookups bf16-tables
               aligned-dense interaction-backward compile cuda-graph prefetch cache-eval)
# --eval-batch-size 262144: the default 1769472 (an 8-GPU evaluation batch) took about 25 GiB
# more at the evaluation forward (two dry runs' peaks, 107.23 against 82.17 GiB)
TRAIN_ARGS=(--precision "$PRECISION" --log-every 500
            --eval-batch-size 262144
            # before the clock: compilation (training and evaluation) and, after the
            # graphs' 11 eager steps, a captured step
            --init-steps 12)
