"""RNN-T features: the mel filterbank against an independent formula, each step on hand-made
cases, SpecAugment's draws as distributions, and the whole pipeline's shapes."""

import math

import numpy as np
import pytest
import torch

from benchmarks.rnnt import features as F


def _slaney_mel(hz: float) -> float:
    return hz * 3 / 200 if hz < 1000 else 15 + 27 * math.log(hz / 1000) / math.log(6.4)


def _slaney_hz(mel: float) -> float:
    return mel * 200 / 3 if mel < 15 else 1000 * 6.4 ** ((mel - 15) / 27)


def _reference_filterbank(n_mels=80, n_fft=512, sr=16000) -> np.ndarray:
    """Triangles written out bin by bin (librosa's documented construction)."""
    top = _slaney_mel(sr / 2)
    edges = [_slaney_hz(top * i / (n_mels + 1)) for i in range(n_mels + 2)]
    fb = np.zeros((n_mels, n_fft // 2 + 1))
    for m in range(n_mels):
        lo, mid, hi = edges[m:m + 3]
        for k in range(n_fft // 2 + 1):
            f = k * sr / n_fft
            if lo < f <= mid:
                fb[m, k] = (f - lo) / (mid - lo)
            elif mid < f < hi:
                fb[m, k] = (hi - f) / (hi - mid)
        fb[m] *= 2 / (hi - lo)
    return fb


def test_slaney_mel_scale_hand_values():
    hz = torch.tensor([0.0, 500.0, 1000.0, 6400.0, 8000.0], dtype=torch.float64)
    mel = F.hz_to_mel(hz)
    assert mel[:4].tolist() == pytest.approx([0.0, 7.5, 15.0, 42.0])
    assert F.mel_to_hz(mel).tolist() == pytest.approx(hz.tolist())


def test_mel_filterbank_matches_independent_formula():
    fb = F.mel_filterbank()
    assert fb.shape == (80, 257) and fb.dtype == torch.float32
    np.testing.assert_allclose(fb.numpy(), _reference_filterbank(), rtol=1e-5, atol=1e-9)
    # area normalisation: filters many bins wide integrate to about 1 (in Hz); without it
    # their peaks would be 1 and their areas hundreds
    area = fb.double().sum(1) * 16000 / 512
    assert area[40:].sub(1).abs().max() < 0.02 and area.sub(1).abs().mean() < 0.03


def test_preemphasis_hand_case():
    x = torch.tensor([[1.0, 2.0, 3.0, 5.0], [4.0, 1.0, 0.0, 0.0]])
    y = F.preemphasis(x, torch.tensor([4, 2]))
    expected = [[1.0, 2 - 0.97, 3 - 1.94, 5 - 2.91], [4.0, 1 - 3.88, 0.0, 0.0]]
    torch.testing.assert_close(y, torch.tensor(expected))


def test_trim_silence_hand_cases():
    audio = torch.zeros(3, 20000)
    audio[0, 5000:6000] = 0.5                 # a burst in digital silence
    audio[1, 3000:9000] = 0.5
    audio[1, 12000:13000] = 0.5 * 10 ** (-70 / 20)  # 70 dB down: silence
    audio[1, 1000:2000] = 0.5 * 10 ** (-50 / 20)    # 50 dB down: kept
    lens = torch.tensor([20000, 20000, 4000])      # row 2: all zero, keeps everything
    first, count = F.nonsilent_region(audio, lens)
    # the power at a sample is the mean square of the 2048 samples ending there: the quiet
    # part (1e-5 of the loudest power) passes the 1e-6 cut once a tenth of the window holds it
    assert first.tolist() == [5000, 1000 + math.ceil(2048 / 10) - 1, 0]
    assert count.tolist() == [5999 + 2047 - 5000 + 1, 8999 + 2047 - first[1] + 1, 4000]
    trimmed, new_lens = F.trim_silence(audio, lens)
    assert trimmed.shape == audio.shape
    assert torch.equal(trimmed[0, :1000], torch.full((1000,), 0.5))
    assert trimmed[0, 1000:].abs().sum() == 0
    assert new_lens.tolist() == count.tolist()


def test_speed_perturbation_scales_time():
    t = torch.arange(32000, dtype=torch.float64) / 16000
    tone = torch.sin(2 * math.pi * 440 * t).float()
    audio = torch.zeros(3, 32000)
    audio[0], audio[1, :20000], audio[2, :24000] = tone, tone[:20000], tone[:24000]
    lens = torch.tensor([32000, 20000, 24000])
    rates = torch.tensor([1.15, 0.85, 1.0])
    out, new_lens = F.speed_perturb(audio, lens, rates)
    assert new_lens.tolist() == [36800, 17000, 24000]
    assert out.shape == (3, 36800)
    for b, rate in enumerate(rates.tolist()):
        n = new_lens[b]
        spectrum = torch.fft.rfft(out[b, :n].double()).abs()
        assert spectrum.argmax().item() * 16000 / n == pytest.approx(440 / rate, abs=2)
        assert out[b, n:].abs().sum() == 0
    torch.testing.assert_close(out[2, :24000], audio[2, :24000], atol=1e-5, rtol=0)
    # slowing down keeps a 7.5 kHz tone (within 0.5 dB); speeding up by 1/0.85 would move it
    # past 8 kHz, so it must vanish rather than alias back below Nyquist
    high = torch.sin(2 * math.pi * 7500 * t[:16000]).float()[None]
    for rate, low, top in ((1.15, 10 ** (-0.5 / 20), 1.0), (0.85, 0.0, 1e-4)):
        out, n = F.speed_perturb(high, torch.tensor([16000]), torch.tensor([rate]))
        gain = out[0, 1000:n - 1000].pow(2).mean().sqrt() / high.pow(2).mean().sqrt()
        assert low <= gain <= top
    draws = F.random_speed_rates(10000, torch.Generator().manual_seed(0))
    assert 0.85 <= draws.min() < 0.86 and 1.14 < draws.max() <= 1.15


def test_power_spectrum_is_each_rows_centred_stft():
    g = torch.Generator().manual_seed(0)
    audio = torch.randn(2, 4000, generator=g)
    audio[1, 2500:] = 0
    lens = torch.tensor([4000, 2500])
    window = torch.hann_window(320, periodic=False)
    power, frames = F.power_spectrum(audio, lens, window)
    assert frames.tolist() == [1 + 4000 // 160, 1 + 2500 // 160]
    for b in range(2):
        alone = torch.stft(audio[b, :lens[b]], 512, 160, 320, window, center=True,
                           pad_mode="reflect", return_complex=True).abs() ** 2
        torch.testing.assert_close(power[b, :, :frames[b]], alone, rtol=1e-4, atol=1e-4)


def test_normalize_per_feature_uses_only_the_utterance():
    g = torch.Generator().manual_seed(1)
    x = torch.randn(2, 3, 10, generator=g) * 4 + 7
    lens = torch.tensor([10, 6])
    y = F.normalize_per_feature(x, lens)
    for b in range(2):
        v = x[b, :, :lens[b]]
        expected = (v - v.mean(1, keepdim=True)) / (v.std(1, keepdim=True) + 1e-5)
        torch.testing.assert_close(y[b, :, :lens[b]], expected)
    assert y[1, :, 6:].abs().sum() == 0


def test_stack_subsample_hand_case():
    x = torch.arange(1, 8, dtype=torch.float32).view(1, 1, 7).repeat(1, 2, 1)  # frames 1..7
    x[:, 1] *= 10
    out, lens = F.stack_subsample(x, torch.tensor([7]))
    assert out.shape == (1, 6, 3) and lens.tolist() == [3]
    # step k holds frames 3k, 3k+1, 3k+2 of each feature, 0 past the end
    assert out[0, :, 0].tolist() == [1, 10, 2, 20, 3, 30]
    assert out[0, :, 2].tolist() == [7, 70, 0, 0, 0, 0]
    _, lens = F.stack_subsample(torch.zeros(2, 80, 9), torch.tensor([9, 4]))
    assert lens.tolist() == [3, 2]


def _spec_augment_counts(batch, frames, lens, **kw):
    x = torch.ones(batch, 80, frames)
    masked = F.spec_augment(x, lens, torch.Generator().manual_seed(0), **kw) == 0
    return masked.all(2), masked.all(1)  # [B, 80] masked bands, [B, frames] masked steps


def test_spec_augment_frequency_mask_width_and_start_are_uniform():
    n = 4200
    bands, steps = _spec_augment_counts(n, 50, torch.full((n,), 50), time_masks=0, freq_masks=1)
    assert not steps.any()
    width = bands.sum(1)
    counts = torch.bincount(width, minlength=21)
    assert len(counts) == 21  # widths 0..20, never more
    assert (counts - n / 21).abs().max() < 4 * math.sqrt(n / 21)
    # the band is contiguous, and its start ranges over 0..80-width (the last bin is reachable)
    wide = width > 0
    first = bands.float().argmax(1)
    assert torch.equal((first + width)[wide].le(80), torch.ones(int(wide.sum()), dtype=bool))
    assert first[wide].min() == 0 and (first + width)[wide].max() == 80
    assert torch.equal(bands.diff(dim=1).ne(0).sum(1)[wide].le(2), torch.ones_like(wide[wide]))


def test_spec_augment_time_masks_adapt_to_each_length():
    n = 2600
    lens = torch.tensor([400, 200]).repeat(n // 2)  # max widths round(0.03 * len): 12 and 6
    bands, steps = _spec_augment_counts(n, 400, lens, freq_masks=0, time_masks=1)
    assert not bands.any()
    width = steps.sum(1)
    for length, top in ((400, 12), (200, 6)):
        w = width[lens == length]
        counts = torch.bincount(w, minlength=top + 1)
        assert len(counts) == top + 1
        expected = len(w) / (top + 1)
        assert (counts - expected).abs().max() < 4 * math.sqrt(expected)
    # masks stay inside the utterance, and reach its last frame
    short = steps[lens == 200]
    assert not short[:, 200:].any() and short[:, 199].any() and short[:, 0].any()


def test_spec_augment_default_counts():
    n = 500
    bands, steps = _spec_augment_counts(n, 300, torch.full((n,), 300))
    assert bands.sum(1).max() <= 2 * 20 and bands.sum(1).float().mean() > 15
    runs = torch.cat([bands[:, :1], bands.diff(dim=1).ne(0) & bands[:, 1:]], 1).sum(1)
    assert runs.max() <= 2
    assert steps.sum(1).max() <= 10 * 9 and steps.sum(1).float().mean() > 30


def test_audio_features_shapes_and_batch_independence():
    g = torch.Generator().manual_seed(2)
    audio = torch.randn(3, 24000, generator=g) * 0.1
    lens = torch.tensor([24000, 16001, 9000])
    for b, n in enumerate(lens.tolist()):
        audio[b, n:] = 0
    fe = F.AudioFeatures(dither=0.0)
    feats, steps = fe(audio, lens)
    frames = 1 + lens // 160
    assert steps.tolist() == [-(-f // 3) for f in frames.tolist()]
    assert feats.shape == (3, steps.max(), F.FEATURES) == (3, 51, 240)
    for b in range(3):
        alone, alone_steps = fe(audio[b:b + 1, :lens[b]], lens[b:b + 1])
        assert alone_steps.item() == steps[b]
        torch.testing.assert_close(feats[b, :steps[b]], alone[0], atol=1e-4, rtol=1e-4)
        assert feats[b, steps[b]:].abs().sum() == 0


def test_audio_features_training_is_seeded_and_augmented():
    audio = torch.randn(4, 16000, generator=torch.Generator().manual_seed(3)) * 0.1
    lens = torch.full((4,), 16000)
    fe = F.AudioFeatures()

    def run(seed):
        return fe(audio, lens, train=True, generator=torch.Generator().manual_seed(seed),
                  cpu_generator=torch.Generator().manual_seed(seed))

    (a, a_lens), (b, b_lens), (c, _) = run(0), run(0), run(1)
    assert torch.equal(a, b) and torch.equal(a_lens, b_lens)
    assert not torch.equal(a, c)
    # speed perturbation changed the lengths: 101 frames at rate 1, 86-117 frames in range
    assert a_lens.unique().numel() > 1
    assert ((a_lens >= math.ceil(86 / 3)) & (a_lens <= math.ceil(117 / 3))).all()
    assert (a == 0).float().mean() > (fe(audio, lens)[0] == 0).float().mean()


@pytest.mark.gpu
def test_features_on_the_gpu_match_the_cpu():
    if not torch.cuda.is_available():
        pytest.skip("needs CUDA")
    audio = torch.randn(4, 32000, generator=torch.Generator().manual_seed(4)) * 0.1
    lens = torch.tensor([32000, 30000, 20000, 5000])
    fe = F.AudioFeatures(dither=0.0)
    cpu, cpu_steps = fe(audio, lens)
    gpu, gpu_steps = fe.cuda()(audio.cuda(), lens.cuda())
    assert torch.equal(cpu_steps, gpu_steps.cpu())
    torch.testing.assert_close(gpu.cpu(), cpu, atol=2e-3, rtol=1e-3)
    rates = torch.tensor([0.85, 1.0, 1.1, 1.15])
    out_cpu, _ = F.speed_perturb(audio, lens, rates)
    out_gpu, _ = F.speed_perturb(audio.cuda(), lens.cuda(), rates)
    torch.testing.assert_close(out_gpu.cpu(), out_cpu, atol=1e-4, rtol=0)
