"""The RNN-T throughput tool on the CPU: its errors, the batch's lengths through the real front
end and encoder, the registry's variants and the baselines' wiring."""

import sys
import types

import pytest
import torch

from benchmarks.rnnt import features, throughput
from benchmarks.rnnt.loss import transducer_loss
from benchmarks.rnnt.model import RNNT
from benchmarks.rnnt.torchaudio_loss import torchaudio_loss
from benchmarks.rnnt.workload import RNNTWorkload
from common import mfu
from common.dist import DistEnv
from common.optimisations import config_optimisations
from common.precision import Precision
from common.training import build_parser
from tests.entry_points import assert_needs_cuda


def test_without_cuda_exits_2_with_one_line():
    assert_needs_cuda("benchmarks.rnnt.throughput")


@pytest.mark.parametrize("flags, message", [
    (["--variants", "config,plain-jit"], "['plain-jit']"),
    (["--precision", "amp-fp16"], "use amp-bf16")])
def test_bad_flags_exit_2_with_one_line(monkeypatch, capsys, flags, message):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    with pytest.raises(SystemExit) as exc:
        throughput.main(flags)
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert exc.value.code == 2 and len(err) == 1 and message in err[0]


@pytest.mark.parametrize("samples", [throughput.samples_for_frames(400),
                                     throughput.samples_for_frames(3),
                                     24 * features.SAMPLE_RATE, 2 * features.SAMPLE_RATE + 37])
def test_batch_has_the_encoder_and_label_lengths_asked_for(samples):
    audio, audio_lens, labels, label_lens = throughput.synthetic_batch(2, samples, 7, 30, "cpu")
    assert audio.shape == (2, samples) and audio_lens.tolist() == [samples] * 2
    assert labels.shape == (2, 7) and label_lens.tolist() == [7, 7]
    assert 0 <= int(labels.min()) and int(labels.max()) < 30
    feats, feat_lens = features.AudioFeatures()(audio, audio_lens)
    model = RNNT(vocab_size=30, enc_hidden=8, pred_hidden=6, joint_hidden=5)
    enc, enc_lens = model.encode(feats, feat_lens)
    expected = throughput.encoder_frames(samples)
    assert enc.shape[1] == expected and enc_lens.tolist() == [expected] * 2


def test_frames_give_60_ms_encoder_steps():
    assert throughput.encoder_frames(throughput.samples_for_frames(400)) == 400
    assert throughput.samples_for_frames(400) / features.SAMPLE_RATE == pytest.approx(24, abs=0.06)
    assert throughput.encoder_frames(24 * features.SAMPLE_RATE) == 401   # 2401 STFT frames


def test_variants_are_the_registrys_ablation_and_the_baselines():
    config = config_optimisations("rnnt", "1xH100")
    steps = throughput.STEPS
    assert steps["plain"] == [] and steps["config"] == config
    assert "compiled-joint" not in steps["config-minus-packed-joint"]   # it requires that
    assert steps["config-minus-flat-params"] == [c for c in config if c != "flat-params"]
    assert steps["torchaudio"] == throughput.COMPILED["plain-compile"] == ["torchaudio-loss"]
    assert {f"config-minus-{c}" for c in config} <= set(steps)


def test_plain_builds_the_reference_workload_at_full_size():
    wl = throughput.workload([], 4, Precision("fp32", "cpu"), torch.device("cpu"))
    args = wl.args
    assert args.synthetic_data and wl.hp.batch_size == 4 and wl.hp.grad_accum == 1
    assert wl.hp.vocab_size == 1023 and wl.hp.enc_hidden == 1024 and wl.opts == {}


def _tiny_workload():
    args = RNNTWorkload.parse_bench_args(build_parser(RNNTWorkload), [
        "--device", "cpu", "--precision", "fp32", "--seed", "0", "--grad-accum", "1",
        "--vocab-size", "29", "--enc-hidden", "8", "--pred-hidden", "6", "--joint-hidden", "5",
        "--enc-pre-rnn-layers", "1", "--enc-post-rnn-layers", "1", "--pred-rnn-layers", "1"],
        "synthetic", 2)
    wl = RNNTWorkload(args, DistEnv(device=torch.device("cpu")), Precision("fp32", "cpu"))
    wl.setup()
    return wl


def test_compiled_network_feeds_the_workloads_loss(monkeypatch):
    """``plain-compile``: the network's own ``forward`` (through ``torch.compile``, here the
    identity) gives the training forward the plain path's loss."""
    wl = _tiny_workload()
    wl.net.eval()
    batch = throughput.synthetic_batch(2, throughput.samples_for_frames(5), 3, 29, "cpu")
    feats, feat_lens = wl.features(*batch[:2])
    plain = wl.train_loss(feats, feat_lens, *batch[2:])
    compiled = []
    monkeypatch.setattr(torch, "compile", lambda m: compiled.append(m) or m)
    throughput.compile_network(wl)
    assert compiled == [wl.net]
    torch.testing.assert_close(wl.train_loss(feats, feat_lens, *batch[2:]), plain)


def test_torchaudios_contract_and_its_unwritten_costs(monkeypatch):
    """``torchaudio-loss`` hands torchaudio fp32 logits, int32 rest and the grid exactly as
    long as the longest utterance, never an utterance without labels or of one encoder step
    (its kernel writes them no cost): those take the reference path."""
    seen = []

    def rnnt_loss(logits, targets, logit_lengths, target_lengths, blank, reduction):
        assert logits.dtype == torch.float32 and targets.dtype == torch.int32
        assert logit_lengths.dtype == target_lengths.dtype == torch.int32
        assert logits.shape[1:3] == (int(logit_lengths.max()), int(target_lengths.max()) + 1)
        assert bool((target_lengths > 0).all() and (logit_lengths > 1).all())
        seen.append(len(logits))
        return transducer_loss(logits, logit_lengths, targets, target_lengths, blank,
                               reduction)

    functional = types.ModuleType("torchaudio.functional")
    functional.rnnt_loss = rnnt_loss
    torchaudio = types.ModuleType("torchaudio")
    torchaudio.functional = functional
    monkeypatch.setitem(sys.modules, "torchaudio", torchaudio)
    monkeypatch.setitem(sys.modules, "torchaudio.functional", functional)
    g = torch.Generator().manual_seed(3)
    logits = torch.randn(4, 7, 5, 6, generator=g).bfloat16()   # over-padded in T and U
    enc_lens, label_lens = torch.tensor([5, 1, 4, 6]), torch.tensor([2, 3, 0, 3])
    labels = torch.randint(0, 5, (4, 4), generator=g)
    got = torchaudio_loss(logits, enc_lens, labels, label_lens, reduction="none")
    assert seen == [2]
    torch.testing.assert_close(got, transducer_loss(logits, enc_lens, labels, label_lens,
                                                    reduction="none"))
    assert torchaudio_loss(logits[:1], enc_lens[:1], labels[:1], label_lens[:1]).dtype == \
        torch.float32 and seen == [2, 1]


def test_decode_step_runs_evaluation_with_a_model_that_emits_only_blanks():
    step = throughput.decode_step(Precision("fp32", "cpu"), torch.device("cpu"), graphs=False)
    batch = throughput.synthetic_batch(2, throughput.samples_for_frames(5), 3, 1023, "cpu")
    assert step(*batch) == [[], []]


def test_plain_steps_flops_are_counted_per_utterance_lstms_included(monkeypatch):
    """The (tiny) plain step, speed perturbation fixed at 1: the same per utterance at any
    batch, more with longer labels, and its LSTMs counted (FlopCounterMode alone has no
    formula for their fused kernel)."""
    wl = _tiny_workload()
    wl.features.speed_range = (1.0, 1.0)
    samples = throughput.samples_for_frames(5)

    def counted(batch_size, label_len):
        batch = throughput.synthetic_batch(batch_size, samples, label_len, 29, "cpu")
        return mfu.MFU.measure(lambda: (wl, batch), torch.device("cpu"))
    one = counted(1, 3)
    assert one.flops_from == mfu.COUNTED and one.flops_per_sample > 0
    assert counted(2, 3).flops_per_sample == one.flops_per_sample
    assert counted(1, 6).flops_per_sample > one.flops_per_sample
    monkeypatch.setattr(mfu, "RNN_FLOPS", {})
    assert counted(1, 3).flops_per_sample < one.flops_per_sample
