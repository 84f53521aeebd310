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
SpecAugment run on the workload's device (``features.AudioFeatures``) inside the step. With no
optimisation named the rest is the reference's: the joint on the padded grid, the loss in pure
PyTorch, DDP and LAMB one tensor at a time, eager greedy decoding; each optimisation
(``--list-optimisations``) replaces a part of them from its own module.
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import functools
import math
from dataclasses import dataclass
from pathlib import Path

import torch
from torch import nn

from benchmarks.rnnt import (
    compiled_joint,
    compiled_loss,
    data,
    decode_graphs,
    features,
    flat_lamb,
    fused_loss,
    lattice_triton,
    packed_joint,
    rnn_graphs,
    standin,
    torchaudio_loss,
)
from benchmarks.rnnt.decoding import MAX_SYMBOLS, greedy_decode
from benchmarks.rnnt.loss import lattice, reference_log_probs, transducer_loss
from benchmarks.rnnt.model import (
    ENC_HIDDEN,
    ENC_POST_RNN_LAYERS,
    ENC_PRE_RNN_LAYERS,
    JOINT_HIDDEN,
    PRED_HIDDEN,
    PRED_RNN_LAYERS,
    RNNT,
    WEIGHTS_INIT_SCALE,
    mllog_tensor_names,
)
from benchmarks.rnnt.tokenizer import VOCAB_SIZE, Tokenizer
from benchmarks.rnnt.wer import error_counts
from common import dist, fixture_cache, loaders
from common.errors import UserError
from common.hparams import (
    checked,
    hparam,
    non_negative,
    open_fraction,
    positive,
    positive_or_inf,
)
from common.kernel_profile import region
from common.lamb import Lamb, LambHyper
from common.mllog import constants
from common.optimisations import Registry
from common.workload import CapturePolicy, EvalPoint, Target, Workload, epoch_points

LIBRISPEECH_TRAIN, LIBRISPEECH_EVAL = 281_241, 2_703   # 960 h of training, dev-clean
VOCAB_SIZE_KEY = "vocab_size"   # not an MLPerf key: the SentencePiece pieces the run used
SYNTHETIC_SECONDS = (2.0, 8.0)   # utterance lengths of synthetic batches
SYNTHETIC_WORDS_PER_SECOND = 3


@dataclass
class HParams:
    """The reference's hyper-parameters (its ``train.py`` and ``baseline_v3-1023sp.yaml``)."""

    vocab_size: int = hparam(VOCAB_SIZE, "SentencePiece pieces (librispeech<N>.model)", positive)
    batch_size: int = hparam(128, "per-rank utterances per optimizer step", positive)
    grad_accum: int = hparam(8, "micro-batches per step (of --batch-size in all)", positive)
    eval_batch_size: int = hparam(128, "utterances per evaluation batch", positive)
    epochs: int = hparam(100, "epoch cap", positive)
    eval_start: int = hparam(1, "first evaluated epoch", positive)
    eval_every: int = hparam(1, "epochs between evaluations", positive)
    lr: float = hparam(4e-3, "opt_base_learning_rate", positive)
    min_lr: float = hparam(1e-5, "floor of the learning rate", non_negative)
    lr_exp_gamma: float = hparam(0.935, "LR factor per epoch after warm-up and hold", positive)
    warmup_epochs: int = hparam(6, "epochs of linear LR warm-up", non_negative)
    hold_epochs: int = hparam(40, "epochs at the base LR after warm-up", non_negative)
    beta1: float = hparam(0.9, "LAMB's first-moment decay", open_fraction)
    beta2: float = hparam(0.999, "LAMB's second-moment decay", open_fraction)
    epsilon: float = hparam(1e-9, "LAMB's epsilon", positive)
    weight_decay: float = hparam(1e-3, "LAMB's weight decay", non_negative)
    clip_norm: float = hparam(1.0, "LAMB's global gradient norm clipping (inf: none)",
                              positive_or_inf)
    ema: float = hparam(0.999, "decay of the weights' average that evaluation uses",
                        open_fraction)
    weights_init_scale: float = hparam(WEIGHTS_INIT_SCALE, "LSTM initialisation scale", positive)
    num_buckets: int = hparam(data.NUM_BUCKETS, "duration buckets of the sampler", positive)
    max_duration: float = hparam(data.MAX_TRAIN_DURATION, "longest training utterance, s",
                                 positive)
    max_symbols: int = hparam(MAX_SYMBOLS, "greedy decoding's labels per utterance", positive)
    enc_hidden: int = hparam(ENC_HIDDEN, "encoder LSTM width", positive)
    enc_pre_rnn_layers: int = hparam(ENC_PRE_RNN_LAYERS, "encoder layers before stacking",
                                     positive)
    enc_post_rnn_layers: int = hparam(ENC_POST_RNN_LAYERS, "encoder layers after it", positive)
    pred_hidden: int = hparam(PRED_HIDDEN, "prediction network width", positive)
    pred_rnn_layers: int = hparam(PRED_RNN_LAYERS, "prediction network layers", positive)
    joint_hidden: int = hparam(JOINT_HIDDEN, "joint network width", positive)


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
    """The training forward as one module (what DDP wraps): the reference's network on the
    padded grid, then the transducer loss. Optimisations replace its parts after ``build()``:
    ``encode``, ``predict`` (rnn-graphs), ``forward`` (packed-joint), ``loss`` (torchaudio-loss),
    ``log_probs`` (fused-loss, compiled-loss), ``walk``, the lattice recursion (triton-lattice)."""

    def __init__(self, model: RNNT):
        super().__init__()
        self.model = model
        self.log_probs, self.walk = reference_log_probs, lattice

    def encode(self, feats: torch.Tensor, feat_lens: torch.Tensor
               ) -> tuple[torch.Tensor, torch.Tensor]:
        return self.model.encode(feats, feat_lens)

    def predict(self, labels: torch.Tensor) -> torch.Tensor:
        return self.model.predict(labels)[0]

    def loss(self, logits: torch.Tensor, enc_lens: torch.Tensor, labels: torch.Tensor,
             label_lens: torch.Tensor, blank: int) -> torch.Tensor:
        return transducer_loss(logits, enc_lens, labels, label_lens, blank,
                               log_probs=self.log_probs, walk=self.walk)

    def forward(self, feats: torch.Tensor, feat_lens: torch.Tensor, labels: torch.Tensor,
                label_lens: torch.Tensor) -> torch.Tensor:
        m = self.model
        with region("encoder"):
            enc, enc_lens = self.encode(feats, feat_lens)
        with region("prediction"):
            pred = self.predict(labels)
        with region("joint"):
            logits = m.joint(enc, pred)
        with region("loss"):
            return self.loss(logits, enc_lens, labels, label_lens, m.blank)


def per_tensor_lamb(wl: RNNTWorkload, train_loss: nn.Module, hyper: LambHyper):
    """``(model, optimizer)``, the reference's: DDP averages the gradients, LAMB updates one
    tensor at a time."""
    return dist.data_parallel(train_loss, wl.env), Lamb(wl.params, [True] * len(wl.params), hyper)


class RNNTWorkload(Workload):
    name = constants.RNNT
    # no compile optimisation: its compiled kernels are compiled-joint and compiled-loss
    compiles = False
    targets = (Target("wer", 0.058, higher_is_better=False),)
    full_dataset = (LIBRISPEECH_TRAIN, LIBRISPEECH_EVAL)
    hparams = HParams
    optimisations = Registry(packed_joint.OPTIMISATION, compiled_joint.OPTIMISATION,
                             fused_loss.OPTIMISATION, compiled_loss.OPTIMISATION,
                             torchaudio_loss.OPTIMISATION, lattice_triton.OPTIMISATION,
                             flat_lamb.OPTIMISATION, rnn_graphs.OPTIMISATION,
                             decode_graphs.OPTIMISATION)

    @staticmethod
    def add_args(p: argparse.ArgumentParser) -> None:
        p.add_argument("--data-dir", type=Path,
                       help="LibriSpeech root with librispeech-<split>.json manifests and "
                            "sentencepieces/ (python -m benchmarks.rnnt.prepare_data)")
        p.add_argument("--train-splits", nargs="+", default=list(data.TRAIN_SPLITS))
        p.add_argument("--eval-split", default=data.EVAL_SPLIT)
        p.add_argument("--workers", type=checked(int, non_negative), default=4,
                       help="loader processes per rank")

    # -- set-up ---------------------------------------------------------------------------
    def build(self) -> None:
        a, hp, env = self.args, self.hp, self.env
        if hp.batch_size % hp.grad_accum:
            raise UserError(f"--batch-size {hp.batch_size} is not divisible by "
                            f"--grad-accum {hp.grad_accum}")
        if a.precision == "amp-fp16":
            raise UserError("amp-fp16 is not supported for rnnt (LAMB runs without a loss "
                            "scaler): use --precision amp-bf16")
        if not self.synthetic:
            self.tokenizer = Tokenizer(data.tokenizer_path(a.data_dir, hp.vocab_size))
            if self.tokenizer.num_labels != hp.vocab_size:
                raise UserError(f"{self.tokenizer.path} has {self.tokenizer.num_labels} pieces, "
                                f"not --vocab-size {hp.vocab_size}: rewrite it with "
                                f"{data.PREPARE} {a.data_dir} --vocab-size {hp.vocab_size}")
            train = [u for split in a.train_splits for u in data.read_manifest(
                a.data_dir, data.manifest_path(a.data_dir, split), hp.max_duration)]
            evals = data.read_manifest(a.data_dir, data.manifest_path(a.data_dir, a.eval_split))
            self.train_set = data.SpeechDataset(train, self.tokenizer)
            self.eval_set = data.SpeechDataset(evals, self.tokenizer)
            self.train_loader = data.TrainLoader(self.train_set, self.global_batch_size,
                                                 env.rank, env.world_size, a.seed,
                                                 hp.num_buckets, a.workers)
            self.eval_loader = data.eval_loader(self.eval_set, hp.eval_batch_size, env.rank,
                                                env.world_size, a.workers)
        model = RNNT(vocab_size=hp.vocab_size, enc_hidden=hp.enc_hidden,
                     enc_pre_rnn_layers=hp.enc_pre_rnn_layers,
                     enc_post_rnn_layers=hp.enc_post_rnn_layers, pred_hidden=hp.pred_hidden,
                     pred_rnn_layers=hp.pred_rnn_layers, joint_hidden=hp.joint_hidden,
                     weights_init_scale=hp.weights_init_scale)
        self.tensor_names = mllog_tensor_names(model)
        self.net = model.to(env.device)
        self.train_loss = TransducerLoss(self.net)
        self.params = list(self.net.parameters())   # with flat-params, views of its buffer
        hyper = LambHyper(hp.beta1, hp.beta2, hp.epsilon, hp.weight_decay, hp.clip_norm)
        parallel = getattr(self.impl, "data_parallel", per_tensor_lamb)
        self.model, self.optimizer = parallel(self, self.train_loss, hyper)
        # after the broadcast of rank 0's weights, so every rank averages the same weights
        self.ema_model = copy.deepcopy(self.net).eval().requires_grad_(False)
        self.ema_params = list(self.ema_model.parameters())
        self.decode = functools.partial(greedy_decode, self.ema_model,
                                        blank=self.ema_model.blank, max_symbols=hp.max_symbols)
        self.features = features.AudioFeatures().to(env.device)
        self.lr = torch.zeros((), device=env.device)
        self.step_count = torch.zeros((), device=env.device)

    @property
    def dataset(self) -> str:
        if self.synthetic:
            return "synthetic (random device-resident audio and labels)"
        n_train, n_eval = len(self.train_set), len(self.eval_set)
        sizes = f"{n_train} train / {n_eval} eval utterances, {self.hp.vocab_size} pieces"
        root = self.args.data_dir
        if fixture_cache.kind(root) == standin.KIND:
            return (f"stand-in: LibriSpeech's lengths, noise audio and made-up words from "
                    f"benchmarks.rnnt.standin, not LibriSpeech ({sizes})")
        if fixture_cache.recorded(root) is not None:
            return (f"fixture: espeak-ng speech in the LibriSpeech layout from "
                    f"benchmarks.rnnt.fixture, not LibriSpeech ({sizes})")
        return f"LibriSpeech-format folder {root} ({sizes})"

    @property
    def train_samples(self) -> int:
        return LIBRISPEECH_TRAIN if self.synthetic else len(self.train_set)

    @property
    def eval_samples(self) -> int:
        return LIBRISPEECH_EVAL if self.synthetic else len(self.eval_set)

    def hyperparameters(self) -> dict:
        a, c, f = self.hp, constants, features
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

    # -- schedule -------------------------------------------------------------------------
    @property
    def steps_per_epoch(self) -> int:
        if self.synthetic:
            return LIBRISPEECH_TRAIN // self.global_batch_size
        return len(self.train_loader)

    def eval_points(self) -> list[EvalPoint]:
        a = self.hp
        epochs = sorted(set(range(a.eval_start, a.epochs + 1, a.eval_every)) | {a.epochs})
        return epoch_points(epochs, self.steps_per_epoch)

    def epoch_batches(self, epoch: int):
        for batch in self.train_loader.epoch(epoch):
            yield tuple(t.to(self.env.device, non_blocking=True) for t in batch)

    def capture_policy(self) -> CapturePolicy:
        return CapturePolicy("never", reason="the joint's and the loss's sizes depend on each "
                                             "batch's lengths; rnn-graphs captures the LSTMs "
                                             "per padded length inside the step")

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
        a = self.hp
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
        labels = torch.randint(0, self.hp.vocab_size, (batch_size, int(label_lens.max())),
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
        if getattr(self, "train_loader", None) is not None:
            self.train_loader.close()
        if getattr(self, "eval_loader", None) is not None:
            loaders.shut_down(self.eval_loader)
