"""RNN-T training throughput on device-resident batches: ours against what a user would run.

    python -m benchmarks.rnnt.throughput --batch-size 32 --precision amp-bf16 \
        --variants ours,ours-fused,plain,plain-compile

``ours`` is the workload's real training step (features on the device with speed perturbation
and SpecAugment, the MLPerf RNN-T at full size, vocabulary 1023, LAMB, the weights' moving
average) with the joint and the pure-PyTorch loss over the valid (t, u) pairs only (``--joint
packed``); ``ours-fused`` is that step with the log-softmax fused into the loss (``--loss
fused``: no fp32 copy of the packed logits); ``ours-compiled-loss`` computes that log-softmax as
two compiled kernels (``--loss compiled``), ``ours-compiled`` (the GPU configs' step) also the
joint's gather, add, ReLU and dropout as one (``--joint packed-compiled``); ``ours-lattice`` adds
the loss's lattice as one Triton kernel (``--lattice triton``), ``ours-flat`` LAMB on one flat
buffer (``--flat-params``), ``ours-flat-lattice`` both, ``ours-graphs`` also the LSTMs as CUDA
graphs (``--rnn-graphs``); ``ours-padded`` is
the same step with the joint on the padded ``[B, T, U+1, V]`` grid and ``torchaudio``'s loss
(``--joint padded --loss torchaudio``), ``ours-padded-reference`` the padded grid with the
pure-PyTorch loss. The tool times one micro-batch per step (``--grad-accum 1``; the 1xH100
config runs 8 micro-batches of 128 per step). The baselines: ``plain`` is the same network as a
user writes it (``torch.nn.LSTM``s, the joint on the whole padded grid,
``torchaudio.functional.rnnt_loss`` on fp32 logits, the same LAMB and moving average), fed by
the same feature front end; ``plain-compile`` runs its network through ``torch.compile`` (the
loss outside). ``decode`` and ``decode-graphs`` time evaluation instead: features, encoder and
greedy decoding of the batch by the full-size model, eagerly or with the decoding steps as CUDA
graphs (``--decode-graphs``); that model's blank bias is raised so that it emits only blanks,
each utterance taking one decoding step per encoder step (a trained model takes one more per
label it emits: the cost of a step does not depend on what it picks).

A variant that fails (out of memory, a kernel's size limit: the padded grids pass
cuBLAS's at batch 64 with these lengths, a compile error) is reported with its error while the
others run, and the exit status is 1. Every variant gets the same batch: noise of one length, so
that the encoder has ``--frames`` steps (60 ms each: 10 ms frames, stacked x3, then x2 in the
encoder; speed perturbation then varies it by up to 15%), or ``--seconds`` of audio, and
``--label-len`` labels per utterance. amp-fp16 is refused: the workload runs LAMB without a loss
scaler.
"""

from __future__ import annotations

import gc
import sys

import torch
import torch.nn.functional as F
from torch import nn

from benchmarks.rnnt import features
from benchmarks.rnnt.decode_graphs import batch_decoder
from benchmarks.rnnt.model import (
    ENC_DROPOUT,
    ENC_HIDDEN,
    ENC_POST_RNN_LAYERS,
    ENC_PRE_RNN_LAYERS,
    ENC_STACK_TIME_FACTOR,
    IN_FEATS,
    JOINT_DROPOUT,
    JOINT_HIDDEN,
    PRED_DROPOUT,
    PRED_HIDDEN,
    PRED_RNN_LAYERS,
    RNNT,
)
from benchmarks.rnnt.workload import RNNTWorkload
from common.dist import DistEnv
from common.lamb import Lamb, LambHyper
from common.precision import Precision
from common.throughput import gpu_variants, measure_variant, report_variants, tool_parser
from common.training import build_parser

COMPILED = ("--joint", "packed-compiled", "--loss", "compiled")
# variant -> workload flags of the workload's step
OURS = {"ours": ("--joint", "packed"),
        "ours-fused": ("--joint", "packed", "--loss", "fused"),
        "ours-compiled-loss": ("--joint", "packed", "--loss", "compiled"),
        "ours-compiled": COMPILED,
        "ours-lattice": (*COMPILED, "--lattice", "triton"),
        "ours-flat": (*COMPILED, "--flat-params"),
        "ours-flat-lattice": (*COMPILED, "--flat-params", "--lattice", "triton"),
        "ours-graphs": (*COMPILED, "--flat-params", "--lattice", "triton", "--rnn-graphs"),
        "ours-padded": ("--joint", "padded", "--loss", "torchaudio"),
        "ours-padded-reference": ("--joint", "padded", "--loss", "reference")}
# variant -> whether the plain network runs through torch.compile
PLAIN = {"plain": False, "plain-compile": True}
# variant -> whether evaluation's decoding steps replay as CUDA graphs
DECODE = {"decode": False, "decode-graphs": True}
VARIANTS = (*OURS, *PLAIN, *DECODE)
VOCAB_SIZE = 1023
HOP = int(features.SAMPLE_RATE * features.WINDOW_STRIDE)
FRAMES_PER_STEP = features.SUBSAMPLING * ENC_STACK_TIME_FACTOR   # STFT frames per encoder step
LAMB_HYPER = LambHyper(0.9, 0.999, 1e-9, 1e-3, 1.0)   # the workload's defaults
EMA = 0.999
LR = 4e-3           # the workload's base LR: throughput only


def encoder_frames(samples: int) -> int:
    """Encoder steps of an utterance of ``samples`` without speed perturbation: STFT frames,
    the front end's subsampling, the encoder's time stacking (each rounded up)."""
    frames = int(features.frame_lengths(torch.tensor(samples), HOP))
    return -(-frames // FRAMES_PER_STEP)


def samples_for_frames(steps: int) -> int:
    """Audio samples whose features make ``steps`` encoder steps, in the middle of that range
    (a few samples lost to silence trimming change nothing)."""
    frames = FRAMES_PER_STEP * steps - FRAMES_PER_STEP // 2
    return HOP * (frames - 1) + HOP // 2


def synthetic_batch(batch_size: int, samples: int, label_len: int, vocab_size: int, device
                    ) -> tuple[torch.Tensor, ...]:
    """``(audio, audio_lens, labels, label_lens)``: noise of ``samples`` per utterance and
    ``label_len`` random labels, from a fixed generator."""
    g = torch.Generator().manual_seed(0)
    audio = 0.1 * torch.randn(batch_size, samples, generator=g)
    labels = torch.randint(0, vocab_size, (batch_size, label_len), generator=g)
    audio_lens = torch.full((batch_size,), samples)
    label_lens = torch.full((batch_size,), label_len)
    return tuple(t.to(device) for t in (audio, audio_lens, labels, label_lens))


class PlainRNNT(nn.Module):
    """The MLPerf RNN-T's network as a user writes it: ``forward(feats [B, T, in_feats],
    labels [B, U])`` -> logits ``[B, ceil(T / stack), U+1, vocab_size+1]`` (blank last)."""

    def __init__(self, vocab_size: int, in_feats: int = IN_FEATS, enc_hidden: int = ENC_HIDDEN,
                 pre_layers: int = ENC_PRE_RNN_LAYERS, post_layers: int = ENC_POST_RNN_LAYERS,
                 stack: int = ENC_STACK_TIME_FACTOR, pred_hidden: int = PRED_HIDDEN,
                 pred_layers: int = PRED_RNN_LAYERS, joint_hidden: int = JOINT_HIDDEN):
        super().__init__()
        self.stack = stack
        self.pre = nn.LSTM(in_feats, enc_hidden, pre_layers, batch_first=True,
                           dropout=ENC_DROPOUT)
        self.post = nn.LSTM(stack * enc_hidden, enc_hidden, post_layers, batch_first=True,
                            dropout=ENC_DROPOUT)
        self.embed = nn.Embedding(vocab_size, pred_hidden)
        self.pred = nn.LSTM(pred_hidden, pred_hidden, pred_layers, batch_first=True,
                            dropout=PRED_DROPOUT)
        self.joint_enc = nn.Linear(enc_hidden, joint_hidden)
        self.joint_pred = nn.Linear(pred_hidden, joint_hidden)
        self.out = nn.Sequential(nn.ReLU(), nn.Dropout(JOINT_DROPOUT),
                                 nn.Linear(joint_hidden, vocab_size + 1))

    def forward(self, feats: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        x, _ = self.pre(feats)
        x = F.pad(x, (0, 0, 0, -x.shape[1] % self.stack))
        x, _ = self.post(x.reshape(x.shape[0], -1, self.stack * x.shape[2]))
        g, _ = self.pred(F.pad(self.embed(labels), (0, 0, 1, 0)))   # a zero start vector
        return self.out(self.joint_enc(x)[:, :, None] + self.joint_pred(g)[:, None])


def ours(variant: str, batch_size: int, precision: Precision, device):
    args = RNNTWorkload.parse_bench_args(
        build_parser(RNNTWorkload),
        ["--precision", precision.name, "--seed", "0", "--grad-accum", "1",
         "--vocab-size", str(VOCAB_SIZE), *OURS[variant]], "synthetic", batch_size)
    wl = RNNTWorkload(args, DistEnv(device=device), precision)
    wl.setup()
    return wl.train_step


def plain_step(precision: Precision, device, compiled: bool):
    """``PlainRNNT`` trained with torchaudio's loss, after the workload's feature front end."""
    import torchaudio.functional  # GPU machines only: the CPU wheels cannot load it

    model = PlainRNNT(VOCAB_SIZE).to(device)
    front = features.AudioFeatures().to(device)
    params = list(model.parameters())
    ema = [p.detach().clone() for p in params]
    opt = Lamb(params, [True] * len(params), LAMB_HYPER)
    lr = torch.tensor(LR, device=device)
    fwd = torch.compile(model) if compiled else model

    def step(audio, audio_lens, labels, label_lens):
        feats, feat_lens = front(audio, audio_lens, train=True)
        opt.zero_grad()
        with precision.autocast():
            logits = fwd(feats, labels)
        enc_lens = -(-feat_lens // model.stack)
        # torchaudio takes fp32 or fp16 logits, not bf16
        loss = torchaudio.functional.rnnt_loss(logits.float(), labels.int(), enc_lens.int(),
                                               label_lens.int(), blank=VOCAB_SIZE)
        loss.backward()
        opt.step(lr)
        torch._foreach_lerp_(ema, [p.detach() for p in params], 1.0 - EMA)
        return loss.detach()
    return step


def decode_step(precision: Precision, device, graphs: bool):
    """Evaluation of a batch (features, encoder, greedy decoding) by the full-size model that
    emits only blanks (see the module doc)."""
    model = RNNT(vocab_size=VOCAB_SIZE).to(device).eval()
    with torch.no_grad():
        model.joint_net.bias[model.blank] += 1e4
    front = features.AudioFeatures().to(device)
    decode = batch_decoder(model, model.blank, graphs=graphs)

    def step(audio, audio_lens, labels, label_lens):
        feats, feat_lens = front(audio, audio_lens)
        with precision.autocast():
            return decode(feats, feat_lens)
    return step


def main(argv=None) -> int:
    p = tool_parser("python -m benchmarks.rnnt.throughput", __doc__,
                    "ours,ours-fused,plain,plain-compile", warmup=5, iters=10)
    p.add_argument("--batch-size", type=int, default=32)
    length = p.add_mutually_exclusive_group()
    length.add_argument("--frames", type=int, default=400,
                        help="encoder steps per utterance (before speed perturbation)")
    length.add_argument("--seconds", type=float, help="audio per utterance instead of --frames")
    p.add_argument("--label-len", type=int, default=100, help="labels per utterance")
    a = p.parse_args(argv)
    variants = gpu_variants(p, a.variants, VARIANTS)
    if a.precision == "amp-fp16":
        p.error("amp-fp16 is not supported for rnnt (LAMB runs without a loss scaler): "
                "use amp-bf16")
    device = torch.device("cuda")
    # cudnn.benchmark stays off, as in the workload: speed perturbation changes T every step
    precision = Precision(a.precision, "cuda")
    precision.apply_backend_flags()
    samples = round(a.seconds * features.SAMPLE_RATE) if a.seconds else samples_for_frames(
        a.frames)
    shape = dict(batch_size=a.batch_size, precision=a.precision,
                 audio_seconds=samples / features.SAMPLE_RATE,
                 encoder_frames=encoder_frames(samples), label_len=a.label_len)
    print(f"batch {a.batch_size}: {shape['audio_seconds']:.2f} s of audio "
          f"({shape['encoder_frames']} encoder steps), {a.label_len} labels", flush=True)
    rows = []
    for v in variants:
        batch = synthetic_batch(a.batch_size, samples, a.label_len, VOCAB_SIZE, device)
        if v in OURS:
            step = ours(v, a.batch_size, precision, device)
        elif v in PLAIN:
            step = plain_step(precision, device, PLAIN[v])
        else:
            step = decode_step(precision, device, DECODE[v])
        rows.append(measure_variant(v, step, batch, device, a.warmup, a.iters, "utt/s",
                                    a.profile, **shape))
        del step, batch
        gc.collect()
        torch.cuda.empty_cache()
    return report_variants(rows, (*PLAIN, "decode"), a.json)


if __name__ == "__main__":
    sys.exit(main())
