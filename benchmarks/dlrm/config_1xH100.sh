# DLRM on one H100 for development and throughput, NOT the closed-division model: the reference's
# tables (96 GB fp32 + 48 GB bf16) exceed its 80 GB, so every table is capped at 10M rows (54M
# rows, ~14 GB in bf16 with bf16-tables). Closed results need config_8xH200.
NPROC=1
PRECISION=${PRECISION:-amp-bf16}
# bf16-tables: the rare rows in bf16 alone, no fp32 masters: the throughput tool's step +2.7% and
# 14.6 in place of 40.4 GiB on one H200 (docs/performance.md#dlrm)
OPTIMISATIONS=(fused-sgd triton-sparse-sgd hybrid-embeddings fused-lookups bf16-tables
               aligned-dense interaction-backward compile cuda-graph prefetch cache-eval)
# --eval-batch-size 262144: the default 1769472 (an 8-GPU evaluation batch) took about 25 GiB
# more at the evaluation forward (two dry runs' peaks, 107.23 against 82.17 GiB)
TRAIN_ARGS=(--precision "$PRECISION" --max-ind-range 10000000 --log-every 500
            --eval-batch-size 262144
            # before the clock: compilation (training and evaluation) and, after the
            # graphs' 11 eager steps, a captured step
            --init-steps 12)
