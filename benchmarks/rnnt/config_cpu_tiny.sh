# RNN-T on the CPU fixture (espeak-ng speech over 34 words in the LibriSpeech layout: 2000
# training utterances from 60 voices, the 2703 dev-clean utterances from 10 other voices,
# 48 SentencePiece pieces). The real features, model, loss, LAMB, moving average and greedy
# decoding at tiny widths, the joint over the valid pairs only. For CI and first contact, not
# an MLPerf result.
NPROC=1
# one compute thread: two spin against each other as soon as anything else runs on 2 cores
export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}
PRECISION=${PRECISION:-fp32}
FIXTURE_ARGS=(--train 2000 --train-speakers 60 --vocab-size 48)
OPTIMISATIONS=(packed-joint)
TRAIN_ARGS=(
    --device cpu --precision "$PRECISION" --workers 0 --train-splits train-clean-100
    --vocab-size 48 --enc-hidden 128 --enc-pre-rnn-layers 1 --enc-post-rnn-layers 1
    --pred-hidden 64 --pred-rnn-layers 1 --joint-hidden 128
    --batch-size 16 --grad-accum 1
    --lr 0.01 --warmup-epochs 1 --hold-epochs 4 --lr-exp-gamma 0.85 --ema 0.9
    --epochs 25 --eval-start 8 --eval-every 1
)
