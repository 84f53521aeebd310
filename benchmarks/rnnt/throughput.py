"""RNN-T training throughput on device-resident batches: the registry's variants against what
a user would run.

    python -m benchmarks.rnnt.throughput --batch-size 32 --precision amp-bf16 \
        --variants config,torchaudio,plain-compile

Every training variant is the workload's real step at full size (features with speed
perturbation and SpecAugment on the device, vocabulary 1023, LAMB, the weights' average), one
micro-batch a step, with a set of the registry's optimisations: ``plain`` none (the reference
path), ``config`` the 1xH100 config's, ``config-minus-<name>`` the config's without one (and
what requires it). The baselines: ``torchaudio``, the plain step with torchaudio's loss
(``torchaudio-loss``), as a user trains an RNN-T; ``plain-compile`` that step with the network
through ``torch.compile``, the loss outside. ``decode`` and ``decode-graphs`` time evaluation
instead (features, encoder, greedy decoding, eagerly or replayed as CUDA graphs) by a model
whose raised blank bias makes it emit only blanks: one decoding step per encoder step.

A variant that fails (out of memory, a kernel's size limit, a compile error) is reported with
its error while the others run, and the exit status is 1. Every variant gets the same batch:
noise of one length, so that the encoder has ``--frames`` steps (60 ms each; speed perturbation
varies it by up to 15%), or ``--seconds`` of audio, and ``--label-len`` labels per utterance.
amp-fp16 is refused: the workload runs LAMB without a loss scaler. MFU (``common.mfu``) counts
the FLOPs of one plain training step on that batch (they grow with the lengths) for the
training variants, baselines included, and of one eager ``decode`` call for both decodings.
"""

from __future__ import annotations

import functools
import gc
import sys

import torch

from benchmarks.rnnt import features
from benchmarks.rnnt.decode_graphs import GraphedDecoder
from benchmarks.rnnt.decoding import greedy_decode
from benchmarks.rnnt.model import ENC_STACK_TIME_FACTOR, RNNT
from benchmarks.rnnt.workload import RNNTWorkload
from common.dist import DistEnv
from common.mfu import MFU
from common.optimisations import ablation_variants, config_optimisations
from common.precision import Precision
from common.throughput import gpu_variants, measure_variant, report_variants, tool_parser
from common.training import build_parser

# variant -> --optimisations items of the workload's step
STEPS = {**ablation_variants(RNNTWorkload.optimisations, config_optimisations("rnnt", "1xH100")),
         "torchaudio": ["torchaudio-loss"]}
COMPILED = {"plain-compile": ["torchaudio-loss"]}   # the network through torch.compile
# variant -> whether evaluation's decoding steps replay as CUDA graphs
DECODE = {"decode": False, "decode-graphs": True}
VARIANTS = (*STEPS, *COMPILED, *DECODE)
VOCAB_SIZE = 1023
HOP = int(features.SAMPLE_RATE * features.WINDOW_STRIDE)
FRAMES_PER_STEP = features.SUBSAMPLING * ENC_STACK_TIME_FACTOR   # STFT frames per encoder step


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


def workload(optimisations: list[str], batch_size: int, precision: Precision, device
             ) -> RNNTWorkload:
    """The workload built for throughput with these ``--optimisations`` items."""
    opts = ["--opt", ",".join(optimisations)] if optimisations else []
    args = RNNTWorkload.parse_bench_args(
        build_parser(RNNTWorkload),
        ["--precision", precision.name, "--seed", "0", "--grad-accum", "1", "--device",
         device.type, "--vocab-size", str(VOCAB_SIZE), *opts], "synthetic", batch_size)
    wl = RNNTWorkload(args, DistEnv(device=device), precision)
    wl.setup()
    return wl


def compile_network(wl: RNNTWorkload) -> None:
    """The training forward through ``torch.compile`` of the plain network's ``forward``
    (encoder, prediction network, padded joint), the workload's loss after it."""
    net, train_loss = torch.compile(wl.net), wl.train_loss

    def forward(feats, feat_lens, labels, label_lens):
        logits, enc_lens = net(feats, feat_lens, labels)
        return train_loss.loss(logits, enc_lens, labels, label_lens, wl.net.blank)
    train_loss.forward = forward


def train_step(variant: str, batch_size: int, precision: Precision, device):
    wl = workload({**STEPS, **COMPILED}[variant], batch_size, precision, device)
    if variant in COMPILED:
        compile_network(wl)
    return wl.train_step


def decode_step(precision: Precision, device, graphs: bool):
    """Evaluation of a batch (features, encoder, greedy decoding) by the full-size model that
    emits only blanks (see the module doc)."""
    model = RNNT(vocab_size=VOCAB_SIZE).to(device).eval()
    with torch.no_grad():
        model.joint_net.bias[model.blank] += 1e4
    front = features.AudioFeatures().to(device)
    decode = (GraphedDecoder(model, model.blank) if graphs
              else functools.partial(greedy_decode, model, blank=model.blank))

    def step(audio, audio_lens, labels, label_lens):
        feats, feat_lens = front(audio, audio_lens)
        with precision.autocast():
            return decode(feats, feat_lens)
    return step


def main(argv=None) -> int:
    p = tool_parser("python -m benchmarks.rnnt.throughput", __doc__,
                    "config,torchaudio,plain-compile", warmup=5, iters=10)
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
    def batch():
        return synthetic_batch(a.batch_size, samples, a.label_len, VOCAB_SIZE, device)
    mfu = {"train": MFU.measure(lambda: (workload([], a.batch_size, precision, device), batch()),
                                device)}
    print(mfu["train"], flush=True)
    if DECODE.keys() & set(variants):
        mfu["decode"] = mfu["train"].counted(decode_step(precision, device, False), batch())
        print(f"decode: {mfu['decode']}", flush=True)
    rows = []
    for v in variants:
        step = (decode_step(precision, device, DECODE[v]) if v in DECODE
                else train_step(v, a.batch_size, precision, device))
        rows.append(measure_variant(v, step, batch(), device, a.warmup, a.iters, "utt/s",
                                    mfu["decode" if v in DECODE else "train"], a.profile,
                                    **shape))
        del step
        gc.collect()
        torch.cuda.empty_cache()
    return report_variants(rows, ("torchaudio", "plain", "decode"), a.json)


if __name__ == "__main__":
    sys.exit(main())
