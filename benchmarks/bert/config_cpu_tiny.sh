# A 2-layer, 64-wide BERT (the fixture's bert_config.json) on the CPU fixture, for CI and first
# contact, not an MLPerf result. Logged as an open-division run: closed_bert.yaml requires
# weights_initialization events for BERT-large's 24 layers, which this model does not have.
NPROC=1   # GPUS=2: the same run on 2 gloo processes
PRECISION=${PRECISION:-fp32}
FIXTURE_ARGS=()
OPTIMISATIONS=()
TRAIN_ARGS=(
    --device cpu --precision "$PRECISION" --submission-division open --max-seq-length 64
    --max-predictions 10 --batch-size 32 --eval-batch-size 256 --lr 5e-3 --max-steps 1500
    --max-samples-termination 48000 --eval-start-samples 1600 --eval-every-samples 1600
    --synthetic-fill 0.6   # padding in the synthetic batches (unpad has nothing to remove at 1)
)
