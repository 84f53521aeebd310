# RNN-T on 8 H200s: NVIDIA's v1.1 DGX A100 8-GPU setting, 8 x 256 = global batch 2048 with
# the hyper-parameters of the 1.1.0 reference convergence point "rnn_t_ref_2k": LAMB LR
# 7e-3 (betas 0.9/0.999, epsilon 1e-9, weight decay 1e-3, clipping at norm 1), 6 warm-up
# epochs, 33 held, then x0.939 per epoch down to 1e-5, a moving average of 0.995,
# initialisation scale 0.5, 1023 pieces. Needs DATADIR with the manifests and the
# SentencePiece model of prepare_data. Not yet run: no machine of several GPUs was lent.
# The GPU configs' step (docs/performance.md, RNN-T): the LSTMs replayed as CUDA graphs, one
# per input length padded to 16 steps (--rnn-graphs), LAMB on one flat buffer
# (--flat-params), the loss's lattice as one Triton kernel (--lattice triton), the packed
# joint's gather, add, ReLU and dropout as one compiled kernel (--joint packed-compiled) and
# the loss's log-softmax as two (--loss compiled). On one H100 at 12.3 s utterances: 1313.2
# utterances/s at batch 128, and at batch 64 2.55x a plain nn.LSTM RNN-T with torchaudio's
# loss at 40% of its peak memory; the fixture reached its target with them on the GPU. The
# compiled parts build before run_start (--init-steps 2); a graph is captured the first
# time its padded length is met, inside the run. Evaluation's greedy decoding replays its
# steps as CUDA graphs (--decode-graphs: 5.8x the eager decoder at batch 256).
NPROC=8
PRECISION=${PRECISION:-amp-bf16}
TRAIN_ARGS=(
    --precision "$PRECISION" --workers 12 --vocab-size 1023
    --batch-size 256 --grad-accum 1 --eval-batch-size 256
    --lr 7e-3 --warmup-epochs 6 --hold-epochs 33 --lr-exp-gamma 0.939 --min-lr 1e-5
    --beta1 0.9 --beta2 0.999 --epsilon 1e-9 --weight-decay 1e-3 --clip-norm 1
    --ema 0.995 --weights-init-scale 0.5 --num-buckets 6 --max-duration 16.7
    --joint packed-compiled --loss compiled --lattice triton --flat-params --rnn-graphs
    --decode-graphs --epochs 100 --init-steps 2
)
