"""MLPerf Training ``rnnt``: RNN-T on LibriSpeech to a dev-clean word error rate of 0.058.

Defaults are the MLCommons v1.1 reference's (``rnn_speech_recognition/pytorch/train.py`` and
``configs/baseline_v3-1023sp.yaml``), which is the ruleset's batch-1024 reference convergence
point on 8 GPUs: 128 utterances per rank and step in 8 micro-batches, LAMB (betas 0.9/0.999,
epsilon 1e-9, weight decay 1e-3 on every tensor, gradients clipped at global norm 1) with
base LR 4e-3, a linear warm-up over 6 epochs, 40 epochs held, then x0.935 per epoch with a
floor of 1e-5; an exponential moving average (0.999) of the weights is what evaluation
decodes, greedily with at most 300 symbols per utterance, after every epoch, at most 100
epochs. Training utterances over 16.7 s are dropped and batched in 6 duration buckets.

A training step takes raw audio: speed perturbation, silence trimming, log-mel features and
SpecAugment run on the workload's device (``features.AudioFeatures``) inside the step; the
joint runs over the valid (t, u) pairs only (``--joint packed``, the default; with its
gather, add, ReLU and dropout compiled: ``--joint packed-compiled``) or over the padded grid
(``--joint padded``, the reference's), the loss is the pure-PyTorch transducer
loss, ``torchaudio``'s (``--loss torchaudio``, padded grid, GPU only) or the packed loss with
the log-softmax fused into it (``--loss fused``, packed joint: no fp32 ``[N, V]`` tensor), or
that log-softmax as two compiled kernels (``--loss compiled``). The loss's lattice recursion
runs diagonal by diagonal from the host (``--lattice torch``) or as one Triton kernel
(``--lattice triton``, GPU only). ``--rnn-graphs`` replays the LSTMs as CUDA graphs, one per
padded length (GPU only). ``--flat-params`` keeps the parameters and gradients in one
buffer, LAMB updating it with whole-buffer and multi-tensor kernels (``ShardedLamb``, one
gradient reduce-scatter across ranks in place of DDP) instead of one tensor at a time.
``--decode-graphs`` replays evaluation's greedy decoding steps as CUDA graphs (GPU only).
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import math
from pathlib import Path

import torch
from torch import nn

from benchmarks.rnnt import compiled_joint, data, features
from benchmarks.rnnt.decode_graphs import batch_decoder
from benchmarks.rnnt.decoding import MAX_SYMBOLS
from benchmarks.rnnt.loss import LATTICES, packed_transducer_loss, transducer_loss
from benchmarks.rnnt.model import (
    ENC_HIDDEN,
    ENC_POST_RNN_LAYERS,
    ENC_PRE_RNN_LAYERS,
    JOINT_HIDDEN,
    PRED_HIDDEN,
    PRED_RNN_LAYERS,
    RNNT,
    WEIGHTS_INIT_SCALE,
    gather_add_relu_dropout,
    mllog_tensor_names,
    stacked_lengths,
)
from benchmarks.rnnt.tokenizer import VOCAB_SIZE, Tokenizer
from benchmarks.rnnt.wer import error_counts
from common import dist, loaders
from common.errors import UserError, require_cuda
from common.fixture_cache import MARKER as FIXTURE_MARKER
from common.flat_params import FlatParameters
from common.kernel_profile import region
from common.lamb import Lamb, LambHyper, ShardedLamb
from common.mllog import constants
from common.workload import CapturePolicy, EvalPoint, Target, Workload, epoch_points

LIBRISPEECH_TRAIN, LIBRISPEECH_EVAL = 281_241, 2_703   # 960 h of training, dev-clean
VOCAB_SIZE_KEY = "vocab_size"   # not an MLPerf key: the SentencePiece pieces the run used
# --joint's packed choices -> the forward of the joint's hidden layer
GATHERS = {"packed": gather_add_relu_dropout,
           "packed-compiled": compiled_joint.gather_add_relu_dropout}
JOINTS = (*GATHERS, "padded")
SYNTHETIC_SECONDS = (2.0, 8.0)   # utterance lengths of synthetic batches
SYNTHETIC_WORDS_PER_SECOND = 3


def lr_at(step: torch.Tensor, steps_per_epoch: int, base: float, warmup_epochs: int,
          hold_epochs: int, gamma: float, min_lr: float) -> torch.Tensor:
    """The reference's ``lr_policy(policy='exponential')`` for 0-based optimizer step
    ``step`` (device ops): the reference counts steps from 1, so ``s = step + 1``; a linear
    warm-up ``(s + 1) / (W + 1)`` while ``s < W`` warm-up steps, 1 for the next ``H`` hold
    steps, then ``gamma ** (epoch - warmup_epochs - hold_epochs)`` with the 1-based epoch;
    never below ``min_lr``."""
    s = step + 1
    warmup, hold = warmup_epochs * steps_per_epoch, hold_epochs * steps_per_epoch
    epoch = torch.div(step, steps_per_epoch, rounding_mode="floor") + 1
    decay = torch.pow(torch.full_like(s, gamma), epoch - warmup_epochs - hold_epochs)
    factor = torch.where(s < warmup, (s + 1) / (warmup + 1),
                         torch.where(s < warmup + hold, torch.ones_like(s), decay))
    return (factor * base).clamp(min=min_lr)


class TransducerLoss(nn.Module):
    """The training forward as one module (what DDP wraps): features -> loss on the packed
    or the padded joint."""

    def __init__(self, model: RNNT, joint: str, loss: str, lattice: str = "torch",
                 rnn_graphs: bool = False):
        super().__init__()
        self.model, self.joint, self.loss, self.lattice = model, joint, loss, lattice
        self.rnns = None
        if rnn_graphs:
            from benchmarks.rnnt.rnn_graphs import GraphedRNNs

            self.rnns = GraphedRNNs(model)

    def forward(self, feats: torch.Tensor, feat_lens: torch.Tensor, labels: torch.Tensor,
                label_lens: torch.Tensor) -> torch.Tensor:
        m = self.model
        packed = self.joint != "padded"
        if packed:   # read before the encoder's work is queued: a short wait, the only one
            total, longest = self._packed_sizes(feat_lens, label_lens)
        with region("encoder"):
            enc, enc_lens = (self.rnns or m).encode(feats, feat_lens)
        with region("prediction"):
            pred = self.rnns.predict(labels) if self.rnns else m.predict(labels)[0]
        with region("joint"):
            logits = (m.joint_packed(enc, pred, enc_lens, label_lens, total,
                                     GATHERS[self.joint]) if packed else m.joint(enc, pred))
        with region("loss"):
            if packed:
                return packed_transducer_loss(logits, enc_lens, labels, label_lens, m.blank,
                                              impl=self.loss, longest=longest,
                                              lattice_impl=self.lattice)
            return transducer_loss(logits, enc_lens, labels, label_lens, m.blank,
                                   impl=self.loss, lattice_impl=self.lattice)

    def _packed_sizes(self, feat_lens: torch.Tensor, label_lens: torch.Tensor
                      ) -> tuple[int, tuple[int, int]]:
        """The packed joint's pair count and the lattice's longest (T, U), from one read of
        the lengths."""
        feat_host, label_host = torch.stack((feat_lens, label_lens)).long().tolist()
        enc_host = [stacked_lengths(n, self.model.encoder.stack_time_factor) for n in feat_host]
        total = sum(t * (u + 1) for t, u in zip(enc_host, label_host))
        return total, (max(enc_host), max(label_host))


class RNNTWorkload(Workload):
    name = constants.RNNT
    compiles = False
    targets = (Target("wer", 0.058, higher_is_better=False),)

    @staticmethod
    def add_args(p: argparse.ArgumentParser) -> None:
        p.add_argument("--data-dir", type=Path,
                       help="LibriSpeech root with librispeech-<split>.json manifests and "
                            "sentencepieces/ (python -m benchmarks.rnnt.prepare_data)")
        p.add_argument("--train-splits", nargs="+", default=list(data.TRAIN_SPLITS))
        p.add_argument("--eval-split", default=data.EVAL_SPLIT)
        p.add_argument("--vocab-size", type=int, default=VOCAB_SIZE,
                       help="SentencePiece pieces (sentencepieces/librispeech<N>.model)")
        p.add_argument("--batch-size", type=int, default=128,
                       help="per-rank utterances per optimizer step")
        p.add_argument("--grad-accum", type=int, default=8,
                       help="micro-batches per step (each of --batch-size / --grad-accum)")
        p.add_argument("--eval-batch-size", type=int, default=128)
        p.add_argument("--epochs", type=int, default=100, help="epoch cap")
        p.add_argument("--eval-start", type=int, default=1, help="first evaluated epoch")
        p.add_argument("--eval-every", type=int, default=1, help="epochs between evaluations")
        p.add_argument("--lr", type=float, default=4e-3, help="opt_base_learning_rate")
        p.add_argument("--min-lr", type=float, default=1e-5)
        p.add_argument("--lr-exp-gamma", type=float, default=0.935,
                       help="LR factor per epoch after warm-up and hold")
        p.add_argument("--warmup-epochs", type=int, default=6)
        p.add_argument("--hold-epochs", type=int, default=40)
        p.add_argument("--beta1", type=float, default=0.9)
        p.add_argument("--beta2", type=float, default=0.999)
        p.add_argument("--epsilon", type=float, default=1e-9)
        p.add_argument("--weight-decay", type=float, default=1e-3)
        p.add_argument("--clip-norm", type=float, default=1.0,
                       help="global gradient norm clipping inside LAMB (inf: none, as the RCP of "
                            "global batch 1024)")
        p.add_argument("--ema", type=float, default=0.999,
                       help="decay of the moving average of the weights that evaluation uses")
        p.add_argument("--weights-init-scale", type=float, default=WEIGHTS_INIT_SCALE,
                       help="LSTM weights and biases scaled after initialisation")
        p.add_argument("--num-buckets", type=int, default=data.NUM_BUCKETS,
                       help="duration buckets of the training sampler")
        p.add_argument("--max-duration", type=float, default=data.MAX_TRAIN_DURATION,
                       help="training utterances longer than this (seconds) are dropped")
        p.add_argument("--max-symbols", type=int, default=MAX_SYMBOLS,
                       help="greedy decoding's limit of labels per utterance")
        p.add_argument("--enc-hidden", type=int, default=ENC_HIDDEN)
        p.add_argument("--enc-pre-rnn-layers", type=int, default=ENC_PRE_RNN_LAYERS)
        p.add_argument("--enc-post-rnn-layers", type=int, default=ENC_POST_RNN_LAYERS)
        p.add_argument("--pred-hidden", type=int, default=PRED_HIDDEN)
        p.add_argument("--pred-rnn-layers", type=int, default=PRED_RNN_LAYERS)
        p.add_argument("--joint-hidden", type=int, default=JOINT_HIDDEN)
        p.add_argument("--joint", default="packed", choices=JOINTS,
                       help="packed: the joint and the loss over the valid (t, u) pairs only; "
                            "packed-compiled: that joint's gather, add, ReLU and dropout as "
                            "one compiled kernel (benchmarks/rnnt/compiled_joint.py); padded: "
                            "over the [B, T, U+1] grid (the reference)")
        p.add_argument("--loss", default="reference", choices=("reference", "torchaudio",
                                                                "fused", "compiled"),
                       help="transducer loss: pure PyTorch; torchaudio.functional.rnnt_loss "
                            "(--joint padded, GPU); fused: the log-softmax fused into the "
                            "loss, chunked, no fp32 copy of the logits (--joint packed); "
                            "compiled: that log-softmax as two compiled kernels "
                            "(--joint packed)")
        p.add_argument("--lattice", default="torch", choices=LATTICES,
                       help="the loss's lattice recursion: torch, two kernels per "
                            "anti-diagonal launched from the host (the reference); triton, "
                            "one kernel (benchmarks/rnnt/lattice_triton.py, --device cuda)")
        p.add_argument("--rnn-graphs", action=argparse.BooleanOptionalAction, default=False,
                       help="the encoder's and prediction network's LSTMs as CUDA graphs, one "
                            "per input length padded to 16 steps (benchmarks/rnnt/"
                            "rnn_graphs.py, --device cuda)")
        p.add_argument("--decode-graphs", action=argparse.BooleanOptionalAction, default=False,
                       help="evaluation's greedy decoding steps as a CUDA graph of 16 steps "
                            "(benchmarks/rnnt/decode_graphs.py, --device cuda)")
        p.add_argument("--flat-params", action=argparse.BooleanOptionalAction, default=False,
                       help="parameters and gradients in one buffer, LAMB on the flat buffer "
                            "(common/lamb.py ShardedLamb) instead of one tensor at a time")
        p.add_argument("--workers", type=int, default=4, help="loader processes per rank")

    # -- set-up ---------------------------------------------------------------------------
    def _check_args(self) -> None:
        a = self.args
        positive = dict(batch_size=a.batch_size, grad_accum=a.grad_accum,
                        eval_batch_size=a.eval_batch_size, epochs=a.epochs,
                        eval_start=a.eval_start, eval_every=a.eval_every,
                        vocab_size=a.vocab_size, max_symbols=a.max_symbols,
                        num_buckets=a.num_buckets)
        for key, value in positive.items():
            if value < 1:
                raise UserError(f"--{key.replace('_', '-')} must be 1 or more, not {value}")
        if a.batch_size % a.grad_accum:
            raise UserError(f"--batch-size {a.batch_size} is not divisible by "
                            f"--grad-accum {a.grad_accum}")
        if not 0 <= a.ema < 1:
            raise UserError(f"--ema must be in [0, 1), not {a.ema}")
        if not a.clip_norm > 0:
            raise UserError(f"--clip-norm must be a positive norm or inf (no clipping), "
                            f"not {a.clip_norm}")
        if a.min_lr < 0 or a.lr <= 0 or a.warmup_epochs < 0 or a.hold_epochs < 0:
            raise UserError("--lr must be positive; --min-lr, --warmup-epochs and "
                            "--hold-epochs 0 or more")
        if a.precision == "amp-fp16":
            raise UserError("amp-fp16 is not supported for rnnt (LAMB runs without a loss "
                            "scaler): use --precision amp-bf16")
        if a.loss == "torchaudio" and a.joint != "padded":
            raise UserError("--loss torchaudio takes the padded grid: add --joint padded")
        if a.loss in ("fused", "compiled") and a.joint == "padded":
            raise UserError(f"--loss {a.loss} takes the packed joint: use --joint packed")
        if a.lattice == "triton":
            require_cuda(self.env.device, "--lattice triton runs a Triton kernel")
        if a.rnn_graphs:
            require_cuda(self.env.device, "--rnn-graphs replays CUDA graphs")
        if a.decode_graphs:
            require_cuda(self.env.device, "--decode-graphs replays CUDA graphs")
        if a.lattice == "triton" and a.loss == "torchaudio":
            raise UserError("--lattice triton is our loss's recursion; --loss torchaudio has "
                            "its own: leave one of them out")

    def build(self) -> None:
        a, env = self.args, self.env
        self._check_args()
        if not self.synthetic:
            self.tokenizer = Tokenizer(data.tokenizer_path(a.data_dir, a.vocab_size))
            if self.tokenizer.num_labels != a.vocab_size:
                raise UserError(f"{self.tokenizer.path} has {self.tokenizer.num_labels} pieces, "
                                f"not --vocab-size {a.vocab_size}: rewrite it with "
                                f"{data.PREPARE} {a.data_dir} --vocab-size {a.vocab_size}")
            train = [u for split in a.train_splits for u in data.read_manifest(
                a.data_dir, data.manifest_path(a.data_dir, split), a.max_duration)]
            evals = data.read_manifest(a.data_dir, data.manifest_path(a.data_dir, a.eval_split))
            self.train_set = data.SpeechDataset(train, self.tokenizer)
            self.eval_set = data.SpeechDataset(evals, self.tokenizer)
            self.train_loader = data.train_loader(self.train_set, self.global_batch_size,
                                                  env.rank, env.world_size, a.seed,
                                                  a.num_buckets, a.workers)
            self.eval_loader = data.eval_loader(self.eval_set, a.eval_batch_size, env.rank,
                                                env.world_size, a.workers)
        model = RNNT(vocab_size=a.vocab_size, enc_hidden=a.enc_hidden,
                     enc_pre_rnn_layers=a.enc_pre_rnn_layers,
                     enc_post_rnn_layers=a.enc_post_rnn_layers, pred_hidden=a.pred_hidden,
                     pred_rnn_layers=a.pred_rnn_layers, joint_hidden=a.joint_hidden,
                     weights_init_scale=a.weights_init_scale)
        self.tensor_names = mllog_tensor_names(model)
        self.net = model.to(env.device)
        loss = TransducerLoss(self.net, a.joint, a.loss, a.lattice, a.rnn_graphs)
        hyper = LambHyper(a.beta1, a.beta2, a.epsilon, a.weight_decay, a.clip_norm)
        self.params = list(self.net.parameters())   # with --flat-params, views of its buffer
        decay = [True] * len(self.params)
        if a.flat_params:
            flat = FlatParameters(self.net, env.world_size)
            if env.distributed:
                flat.broadcast(0)   # the same initial weights everywhere
            self.optimizer = ShardedLamb(flat, decay, hyper, env.rank, env.world_size)
            self.model = loss
        else:
            self.model = dist.data_parallel(loss, env)
            self.optimizer = Lamb(self.params, decay, hyper)
        # after the broadcast of rank 0's weights, so every rank averages the same weights
        self.ema_model = copy.deepcopy(self.net).eval().requires_grad_(False)
        self.ema_params = list(self.ema_model.parameters())
        self.decode = batch_decoder(self.ema_model, self.ema_model.blank, a.max_symbols,
                                    a.decode_graphs)
        self.features = features.AudioFeatures().to(env.device)
        self.lr = torch.zeros((), device=env.device)
        self.step_count = torch.zeros((), device=env.device)

    @property
    def dataset(self) -> str:
        if self.synthetic:
            return "synthetic (random device-resident audio and labels)"
        n_train, n_eval = len(self.train_set), len(self.eval_set)
        sizes = f"{n_train} train / {n_eval} eval utterances, {self.args.vocab_size} pieces"
        if (self.args.data_dir / FIXTURE_MARKER).is_file():
            return (f"fixture: espeak-ng speech in the LibriSpeech layout from "
                    f"benchmarks.rnnt.fixture, not LibriSpeech ({sizes})")
        return f"LibriSpeech-format folder {self.args.data_dir} ({sizes})"

    @property
    def global_batch_size(self) -> int:
        return self.args.batch_size * self.env.world_size

    @property
    def train_samples(self) -> int:
        return LIBRISPEECH_TRAIN if self.synthetic else len(self.train_set)

    @property
    def eval_samples(self) -> int:
        return LIBRISPEECH_EVAL if self.synthetic else len(self.eval_set)

    def hyperparameters(self) -> dict:
        a, c, f = self.args, constants, features
        return {
            c.OPT_NAME: c.LAMB, c.GRADIENT_ACCUMULATION_STEPS: a.grad_accum,
            c.OPT_BASE_LR: a.lr, c.OPT_LAMB_EPSILON: a.epsilon,
            c.OPT_LAMB_LR_DECAY_POLY_POWER: a.lr_exp_gamma,
            c.OPT_LAMB_LR_HOLD_EPOCHS: a.hold_epochs, c.OPT_LR_WARMUP_EPOCHS: a.warmup_epochs,
            c.OPT_WEIGHT_DECAY: a.weight_decay, c.OPT_LAMB_BETA_1: a.beta1,
            c.OPT_LAMB_BETA_2: a.beta2, c.OPT_GRADIENT_CLIP_NORM: a.clip_norm,
            c.OPT_LR_ALT_DECAY_FUNC: True, c.OPT_LR_ALT_WARMUP_FUNC: True,
            c.OPT_LAMB_LR_MIN: a.min_lr,
            c.MODEL_WEIGHTS_INITIALIZATION_SCALE: a.weights_init_scale,
            c.MODEL_EVAL_EMA_FACTOR: a.ema, c.EVAL_MAX_PREDICTION_SYMBOLS: a.max_symbols,
            c.DATA_TRAIN_MAX_DURATION: a.max_duration, c.DATA_TRAIN_NUM_BUCKETS: a.num_buckets,
            c.DATA_SPEED_PERTURBATON_MIN: f.SPEED_RANGE[0],
            c.DATA_SPEED_PERTURBATON_MAX: f.SPEED_RANGE[1],
            c.DATA_SPEC_AUGMENT_FREQ_N: f.FREQ_MASKS, c.DATA_SPEC_AUGMENT_FREQ_MIN: f.MIN_FREQ,
            c.DATA_SPEC_AUGMENT_FREQ_MAX: f.MAX_FREQ, c.DATA_SPEC_AUGMENT_TIME_N: f.TIME_MASKS,
            c.DATA_SPEC_AUGMENT_TIME_MIN: f.MIN_TIME, c.DATA_SPEC_AUGMENT_TIME_MAX: f.MAX_TIME,
            VOCAB_SIZE_KEY: a.vocab_size,
        }

    def initialized_tensors(self) -> list[str]:
        return self.tensor_names

    # -- schedule -------------------------------------------------------------------------
    @property
    def steps_per_epoch(self) -> int:
        if self.synthetic:
            return LIBRISPEECH_TRAIN // self.global_batch_size
        return len(self.train_loader)

    def eval_points(self) -> list[EvalPoint]:
        a = self.args
        epochs = sorted(set(range(a.eval_start, a.epochs + 1, a.eval_every)) | {a.epochs})
        return epoch_points(epochs, self.steps_per_epoch)

    def epoch_batches(self, epoch: int):
        self.train_loader.batch_sampler.set_epoch(epoch)
        for batch in self.train_loader:
            yield tuple(t.to(self.env.device, non_blocking=True) for t in batch)

    def capture_policy(self) -> CapturePolicy:
        return CapturePolicy("never", reason="the packed joint's and the loss's sizes depend "
                                             "on each batch's lengths; --rnn-graphs captures "
                                             "the LSTMs per padded length inside the step")

    @property
    def cudnn_benchmark(self) -> bool:
        return False   # LSTM shapes change with every batch

    def training_state(self) -> list[torch.Tensor]:
        opt = self.optimizer
        moments = [*opt.m, *opt.v] if isinstance(opt, Lamb) else [opt.m, opt.v]
        return [*self.net.state_dict(keep_vars=True).values(), *self.ema_params, *moments,
                opt.t, self.lr, self.step_count]

    # -- steps ----------------------------------------------------------------------------
    def train_step(self, audio, audio_lens, labels, label_lens) -> torch.Tensor:
        """One optimizer step over ``--grad-accum`` micro-batches of raw audio, then the
        moving average of the weights."""
        a = self.args
        self.lr.copy_(lr_at(self.step_count, self.steps_per_epoch, a.lr, a.warmup_epochs,
                            a.hold_epochs, a.lr_exp_gamma, a.min_lr))
        self.optimizer.zero_grad()
        total = torch.zeros((), device=audio.device)
        micro = [t.chunk(a.grad_accum) for t in (audio, audio_lens, labels, label_lens)]
        for i, (x, x_lens, y, y_lens) in enumerate(zip(*micro)):
            with region("features"):
                feats, feat_lens = self.features(x, x_lens, train=True)
            last = i == a.grad_accum - 1
            sync = (self.model.no_sync() if (not last and hasattr(self.model, "no_sync"))
                    else contextlib.nullcontext())
            with sync:
                with self.precision.autocast():
                    loss = self.model(feats, feat_lens, y, y_lens) / a.grad_accum
                with region("backward"):
                    loss.backward()
            total += loss.detach()
        with region("optimizer"), torch.no_grad():
            self.optimizer.step(self.lr)
            torch._foreach_lerp_(self.ema_params, self.params, 1.0 - a.ema)
        self.step_count += 1
        return total

    def synthetic_batch(self, batch_size: int) -> tuple[torch.Tensor, ...]:
        """Noise of LibriSpeech-like lengths (2-8 s) with random labels (3 words a second,
        one piece each), drawn from a fixed generator."""
        g = torch.Generator().manual_seed(0)
        low, high = (int(s * features.SAMPLE_RATE) for s in SYNTHETIC_SECONDS)
        audio_lens = torch.randint(low, high + 1, (batch_size,), generator=g)
        audio = 0.1 * torch.randn(batch_size, int(audio_lens.max()), generator=g)
        audio *= torch.arange(audio.shape[1]) < audio_lens[:, None]
        label_lens = (audio_lens * SYNTHETIC_WORDS_PER_SECOND // features.SAMPLE_RATE)
        labels = torch.randint(0, self.args.vocab_size, (batch_size, int(label_lens.max())),
                               generator=g)
        return tuple(t.to(self.env.device) for t in (audio, audio_lens, labels, label_lens))

    # -- evaluation -----------------------------------------------------------------------
    def evaluate(self) -> dict[str, float]:
        """WER of the moving-average weights' greedy transcripts over every evaluation
        utterance (word errors and reference words summed over ranks); dither is drawn from
        a generator seeded the same at every evaluation."""
        a, env = self.args, self.env
        generator = torch.Generator(env.device).manual_seed(a.seed)
        counts = torch.zeros(2, dtype=torch.float64, device=env.device)
        for audio, audio_lens, labels, label_lens in self.eval_loader:
            audio, audio_lens = audio.to(env.device), audio_lens.to(env.device)
            feats, feat_lens = self.features(audio, audio_lens, generator=generator)
            with self.precision.autocast():
                hyps = self.decode(feats, feat_lens)
            refs = [self.tokenizer.decode(row[:n]) for row, n in
                    zip(labels.tolist(), label_lens.tolist())]
            errors, words = error_counts([self.tokenizer.decode(h) for h in hyps], refs)
            counts += torch.tensor([errors, words], dtype=torch.float64, device=env.device)
        dist.all_reduce_sum(counts)
        errors, words = counts.tolist()
        return {"wer": errors / words if words else math.inf}

    def close(self) -> None:
        for loader in (getattr(self, "train_loader", None), getattr(self, "eval_loader", None)):
            if loader is not None:
                loaders.shut_down(loader)
