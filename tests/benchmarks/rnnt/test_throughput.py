"""The RNN-T throughput tool on the CPU: its errors, the batch's lengths through the real front
end and encoder, ours' flags and the plain network's logits."""

import math
import sys
import types

import pytest
import torch

from benchmarks.rnnt import features, throughput
from benchmarks.rnnt.loss import transducer_loss
from benchmarks.rnnt.model import RNNT
from common.precision import Precision
from tests.entry_points import assert_needs_cuda

TINY = dict(enc_hidden=8, pre_layers=2, post_layers=2, pred_hidden=6, pred_layers=2,
            joint_hidden=5)


def test_without_cuda_exits_2_with_one_line():
    assert_needs_cuda("benchmarks.rnnt.throughput")


@pytest.mark.parametrize("flags, message", [
    (["--variants", "ours,plain-jit"], "['plain-jit']"),
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


@pytest.mark.parametrize("variant, joint, loss", [
    ("ours", "packed", "reference"), ("ours-fused", "packed", "fused"),
    ("ours-compiled-loss", "packed", "compiled"), ("ours-compiled", "packed-compiled", "compiled"),
    ("ours-padded", "padded", "torchaudio"),
    ("ours-padded-reference", "padded", "reference")])
def test_ours_builds_the_workload_with_its_flags(variant, joint, loss):
    step = throughput.ours(variant, 4, Precision("fp32", "cpu"), torch.device("cpu"))
    args = step.__self__.args
    assert args.synthetic_data and args.batch_size == 4 and args.grad_accum == 1
    assert args.vocab_size == 1023 and args.enc_hidden == 1024
    assert (args.joint, args.loss) == (joint, loss)


def test_plain_network_gives_the_padded_grid_of_logits_and_ours_parameter_count():
    plain = throughput.PlainRNNT(29, in_feats=12, **TINY)
    logits = plain(torch.randn(3, 7, 12), torch.randint(0, 29, (3, 4)))
    assert logits.shape == (3, 4, 5, 30)    # T 7 stacked x2 -> 4, U+1 = 5, blank added
    ours = RNNT(vocab_size=29, in_feats=12, enc_hidden=8, enc_pre_rnn_layers=2,
                enc_post_rnn_layers=2, pred_hidden=6, pred_rnn_layers=2, joint_hidden=5)
    assert sum(p.numel() for p in plain.parameters()) == sum(p.numel() for p in ours.parameters())


def test_plain_step_meets_torchaudios_contract_and_trains(monkeypatch):
    seen = []

    def rnnt_loss(logits, targets, logit_lengths, target_lengths, blank):
        # torchaudio's own checks: fp32/fp16 logits, int32 rest, the grid exactly as long
        assert logits.dtype == torch.float32 and targets.dtype == torch.int32
        assert logit_lengths.dtype == target_lengths.dtype == torch.int32
        assert logits.shape[1:3] == (int(logit_lengths.max()), int(target_lengths.max()) + 1)
        seen.append(logits.shape)
        return transducer_loss(logits, logit_lengths, targets, target_lengths, blank)

    functional = types.ModuleType("torchaudio.functional")
    functional.rnnt_loss = rnnt_loss
    torchaudio = types.ModuleType("torchaudio")
    torchaudio.functional = functional
    monkeypatch.setitem(sys.modules, "torchaudio", torchaudio)
    monkeypatch.setitem(sys.modules, "torchaudio.functional", functional)
    step = throughput.plain_step(Precision("amp-bf16", "cpu"), torch.device("cpu"), False)
    batch = throughput.synthetic_batch(2, throughput.samples_for_frames(5), 3, 1023, "cpu")
    losses = [float(step(*batch)) for _ in range(2)]
    assert all(math.isfinite(x) for x in losses) and losses[0] != losses[1]
    assert seen[0][0] == 2 and seen[0][2:] == (4, 1024)


def test_decode_step_runs_evaluation_with_a_model_that_emits_only_blanks():
    step = throughput.decode_step(Precision("fp32", "cpu"), torch.device("cpu"), graphs=False)
    batch = throughput.synthetic_batch(2, throughput.samples_for_frames(5), 3, 1023, "cpu")
    assert step(*batch) == [[], []]
