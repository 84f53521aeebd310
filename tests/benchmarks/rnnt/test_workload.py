"""The RNN-T workload: the reference's LR rule, a step that learns, the packed joint's step
equal to the padded one's and the compiled joint's to the packed one's (joint dropout off: each
draws its own masks), the fused loss's step equal to the reference loss's, LAMB on the flat
buffer equal to the per-tensor one, the moving average that evaluation decodes, WER over all
words, and one-line errors for bad flags."""

import multiprocessing

import pytest
import torch

from benchmarks.rnnt.decoding import greedy_decode
from benchmarks.rnnt.workload import RNNTWorkload, lr_at
from common.dist import DistEnv
from common.errors import UserError
from common.precision import Precision
from common.training import build_parser
from tests.entry_points import error_lines, run_program
from tests.host_syncs import SyncCounter

TINY = ["--device", "cpu", "--precision", "fp32", "--workers", "0", "--seed", "3",
        "--train-splits", "train-clean-100", "--vocab-size", "40", "--enc-hidden", "32",
        "--enc-pre-rnn-layers", "1", "--enc-post-rnn-layers", "1", "--pred-hidden", "16",
        "--pred-rnn-layers", "1", "--joint-hidden", "32", "--batch-size", "8",
        "--grad-accum", "2", "--eval-batch-size", "16", "--ema", "0.9"]


def build(data_dir, *flags):
    torch.manual_seed(0)
    args = build_parser(RNNTWorkload).parse_args([*TINY, "--data-dir", str(data_dir), *flags])
    wl = RNNTWorkload(args, DistEnv(), Precision("fp32", "cpu"))
    wl.setup()
    return wl


def reference_lr(step, epoch, lr, spe, warmup_epochs, hold_epochs, gamma, min_lr):
    """rnn_speech_recognition's lr_policy(policy='exponential'), steps counted from 1."""
    warmup, hold = warmup_epochs * spe, hold_epochs * spe
    if step < warmup:
        a = (step + 1) / (warmup + 1)
    elif step < warmup + hold:
        a = 1.0
    else:
        a = gamma ** (epoch - warmup_epochs - hold_epochs)
    return max(a * lr, min_lr)


def test_lr_is_the_references_warmup_hold_and_exponential_decay():
    spe = 7
    for step in range(0, 200, 3):
        got = lr_at(torch.tensor(float(step)), spe, 4e-3, 6, 4, 0.935, 1e-5).item()
        want = reference_lr(step + 1, step // spe + 1, 4e-3, spe, 6, 4, 0.935, 1e-5)
        assert got == pytest.approx(want, rel=1e-5), step
    assert lr_at(torch.tensor(1e5), spe, 4e-3, 6, 4, 0.5, 1e-5).item() == pytest.approx(1e-5)


def _clean_loss(wl, batch) -> float:
    """The training loss of ``batch`` without augmentation or dropout."""
    audio, audio_lens, labels, label_lens = batch
    wl.net.eval()
    with torch.no_grad():
        feats, feat_lens = wl.features(audio, audio_lens)
        loss = wl.model(feats, feat_lens, labels, label_lens)
    wl.net.train()
    return float(loss)


def test_close_stops_the_loader_processes(speech_fixture):
    before = set(multiprocessing.active_children())
    wl = build(speech_fixture, "--workers", "1")
    next(iter(wl.epoch_batches(1)))
    wl.evaluate()
    workers = [p for p in multiprocessing.active_children() if p not in before]
    assert len(workers) == 2 and all(p.is_alive() for p in workers)   # training's, evaluation's
    wl.close()
    assert not any(p.is_alive() for p in workers)


def test_steps_reduce_the_loss_and_the_average_follows_the_weights(speech_fixture):
    wl = build(speech_fixture, "--lr", "0.02", "--warmup-epochs", "0")
    batch = next(iter(wl.epoch_batches(1)))
    before = _clean_loss(wl, batch)
    for _ in range(4):
        ema = [p.clone() for p in wl.ema_params]
        assert torch.isfinite(wl.train_step(*batch))
        for avg, old, w in zip(wl.ema_params, ema, wl.params):
            torch.testing.assert_close(avg, 0.9 * old + 0.1 * w)
    assert _clean_loss(wl, batch) < before
    assert int(wl.step_count) == 4 and not torch.equal(wl.ema_params[0], wl.params[0])
    assert all(avg.grad_fn is None and not avg.requires_grad for avg in wl.ema_params)


def _first_step(speech_fixture, *flags, joint_dropout: float | None = None):
    """The loss of one training step from the same start and the weights after it."""
    wl = build(speech_fixture, *flags, "--lr", "0.02", "--warmup-epochs", "0")
    if joint_dropout is not None:
        wl.net.joint_dropout = joint_dropout
    batch = next(iter(wl.epoch_batches(1)))
    torch.manual_seed(1)
    return wl.train_step(*batch), [p.detach().clone() for p in wl.params]


def _assert_same_step(ref, other, rel, rtol, atol):
    (ref_loss, ref_params), (loss, params) = ref, other
    assert torch.isfinite(loss) and loss.item() == pytest.approx(ref_loss.item(), rel=rel)
    for p, r in zip(params, ref_params):
        torch.testing.assert_close(p, r, rtol=rtol, atol=atol)


# compiled, exp and the sums round differently: a weight moves up to 4e-6 apart (of 30720)
@pytest.mark.parametrize("fast, atol", [("fused-loss", 1e-6), ("compiled-loss", 1e-5)])
def test_the_fused_loss_takes_the_reference_losss_step(speech_fixture, fast, atol):
    """``fused-loss`` or ``compiled-loss`` on the packed joint: the same loss and the same
    weights after a step (features, SpecAugment and dropout drawn alike)."""
    _assert_same_step(_first_step(speech_fixture, "--opt", "packed-joint"),
                      _first_step(speech_fixture, "--opt", f"packed-joint,{fast}"), 1e-5,
                      1e-4, atol)


def test_the_packed_joint_takes_the_padded_joints_step(speech_fixture):
    """``packed-joint``: the same loss and weights after a step as the reference's padded
    grid, with the joint's dropout off (the packed joint draws masks over its rows)."""
    _assert_same_step(_first_step(speech_fixture, joint_dropout=0.0),
                      _first_step(speech_fixture, "--opt", "packed-joint", joint_dropout=0.0),
                      1e-6, 1e-5, 1e-6)


def test_the_compiled_joint_takes_the_packed_joints_step(speech_fixture):
    """``compiled-joint``: the same loss and weights after a step as ``packed-joint``, with
    the joint's dropout off (the compiled kernel draws its own masks)."""
    _assert_same_step(_first_step(speech_fixture, "--opt", "packed-joint", joint_dropout=0.0),
                      _first_step(speech_fixture, "--opt", "packed-joint,compiled-joint",
                                  joint_dropout=0.0), 1e-6, 1e-5, 1e-6)


def test_evaluation_decodes_with_the_average_and_counts_every_word(speech_fixture):
    wl = build(speech_fixture)
    wl.train_step(*next(iter(wl.epoch_batches(1))))
    assert wl.decode.func is greedy_decode and wl.decode.args == (wl.ema_model,)
    assert wl.decode.keywords == {"blank": wl.ema_model.blank, "max_symbols": 300}
    seen = []

    def decode_nothing(feats, feat_lens):
        seen.append(len(feats))
        return [[] for _ in range(len(feats))]

    eager, wl.decode = wl.decode, decode_nothing
    assert wl.evaluate() == {"wer": 1.0}    # every reference word deleted
    assert sum(seen) == 40
    wl.decode = eager
    first, again = wl.evaluate(), wl.evaluate()
    assert first == again and isinstance(first["wer"], float)   # dither seeded per evaluation


def test_flat_params_take_the_per_tensor_lambs_step(speech_fixture):
    """``flat-params``: LAMB on one buffer takes the per-tensor reference's step, and the
    model's weights and gradients stay views into that buffer (the LSTMs' too)."""
    ref = _first_step(speech_fixture)
    _assert_same_step(ref, _first_step(speech_fixture, "--opt", "flat-params"), 1e-6, 1e-5,
                      1e-6)
    wl = build(speech_fixture, "--opt", "flat-params")
    wl.train_step(*next(iter(wl.epoch_batches(1))))
    flat = wl.optimizer.flat
    for p in wl.net.parameters():
        assert p.untyped_storage().data_ptr() == flat.data.untyped_storage().data_ptr()
        assert p.grad.untyped_storage().data_ptr() == flat.grad.untyped_storage().data_ptr()
    assert len(wl.training_state()) == len(ref[1]) * 2 + 5   # weights, averages, m, v, 3


@pytest.mark.parametrize("flags, message", [
    (["--batch-size", "6", "--grad-accum", "4"], "not divisible by --grad-accum"),
    (["--precision", "amp-fp16"], "use --precision amp-bf16"),
    (["--opt", "triton-lattice"], "needs CUDA"),
    (["--opt", "rnn-graphs"], "needs CUDA"),
    (["--opt", "decode-graphs"], "needs CUDA"),
    (["--opt", "torchaudio-loss"], "needs CUDA"),
])
def test_bad_flags_are_one_line_errors(speech_fixture, flags, message):
    with pytest.raises(UserError, match=message) as e:
        build(speech_fixture, *flags)
    assert "\n" not in str(e.value)


@pytest.mark.parametrize("flags, message", [
    (["--opt", "torchaudio-loss,packed-joint"], "exclude each other"),
    (["--opt", "fused-loss,compiled-loss"], "exclude each other"),
    (["--opt", "compiled-joint"], "requires packed-joint"),
    (["--ema", "1.0"], "--ema: must be 0 or more and less than 1"),
    (["--clip-norm", "0"], "--clip-norm: must be more than 0"),
    (["--clip-norm", "nan"], "--clip-norm: must be more than 0"),
    (["--eval-every", "0"], "--eval-every: must be more than 0"),
    (["--enc-hidden", "0"], "--enc-hidden: must be more than 0"),
    (["--batch-size", "0"], "--batch-size: must be more than 0"),
])
def test_bad_values_and_combinations_are_parse_errors(capsys, flags, message):
    with pytest.raises(SystemExit) as e:
        build_parser(RNNTWorkload).parse_args([*TINY, *flags])
    err = [line for line in capsys.readouterr().err.splitlines() if line.strip()]
    assert e.value.code == 2 and len(err) == 1 and message in err[0], err


def test_a_missing_tokenizer_names_the_file_and_the_fix(speech_fixture, tmp_path):
    proc = run_program("rnnt", *TINY[4:], "--vocab-size", "41", "--data-dir",
                       str(speech_fixture), "--log-file", str(tmp_path / "log.txt"))
    lines = error_lines(proc)
    assert proc.returncode == 2 and len(lines) == 1, proc.stderr
    assert "librispeech41.model" in lines[0] and "prepare_data" in lines[0]


@pytest.mark.parametrize("batch_size", [8, 16])
def test_a_training_step_reads_the_device_twice_per_micro_batch(speech_fixture, batch_size):
    """The features' length (to cut the padding) and the lengths before the encoder's work
    is queued (pair count, lattice size); nothing after, whatever the batch. (The speed
    factors are drawn on the host: their copy to the device waits for nothing.)"""
    wl = build(speech_fixture, "--opt", "packed-joint,fused-loss", "--batch-size",
               str(batch_size))
    batch = wl.synthetic_batch(batch_size)
    wl.train_step(*batch)
    with SyncCounter("benchmarks/rnnt/") as counter:
        wl.train_step(*batch)
    reads = {where: n for where, n in counter.calls.items()
             if not where.startswith("speed_perturb")}
    assert sum(reads.values()) == 2 * 2, reads     # --grad-accum 2
