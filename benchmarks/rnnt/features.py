"""Audio -> RNN-T input features, batched in torch so the same code runs on the CPU and the GPU.

Follows the MLPerf Training 1.1 reference (mlcommons/training ``rnn_speech_recognition``: the
DALI pipeline its ``train.py`` uses, ``common/data/features.py`` and
``configs/baseline_v3-1023sp.yaml``), in its order:

1. speed perturbation (training): resample by a factor drawn from U(0.85, 1.15), as the
   reference's DALI decoder does by decoding at ``rate * 16 kHz`` (1.15: longer, slower, lower);
2. silence trimming: keep the first to the last sample whose short-term power (mean square
   over the 2048 samples ending there, as DALI's ``NonsilentRegion``) is within 60 dB of the
   utterance's loudest;
3. dither (1e-5 * N(0, 1)), pre-emphasis ``y[t] = x[t] - 0.97 x[t-1]`` (``y[0] = x[0]``);
4. power spectrum: 20 ms (320-sample) symmetric Hann windows every 10 ms, n_fft 512, windows
   centred with reflection at each utterance's own ends, ``1 + samples // 160`` frames;
5. 80 mel filters (Slaney scale and area normalisation, see ``mel_filterbank``), natural log
   of ``power + 1e-20``;
6. per-feature normalisation over the utterance's frames (unbiased std + 1e-5), padding 0;
7. SpecAugment (training): 2 frequency masks of width U{0..20}, 10 time masks of width
   U{0..round(0.03 * frames)};
8. 3 frames stacked and subsampled by 3: 240 inputs, ``ceil(frames / 3)`` steps.

Every step works on a padded batch ``[B, samples]`` with lengths and treats each row as the
reference treats one utterance, so an utterance's features do not depend on its batch. Where
the reference's DALI pipeline and its torch ``FilterbankFeatures`` differ in detail (the first
pre-emphasised sample, the std's Bessel correction and epsilon, the frame count) the choices
are those above. One deviation: the reference draws a time mask's start over the batch's
padded length, here over the utterance's own (masks never fall on padding).
"""

from __future__ import annotations

import math

import torch

SAMPLE_RATE = 16000
WINDOW_SIZE = 0.02
WINDOW_STRIDE = 0.01
N_FFT = 512
N_MELS = 80
PREEMPHASIS = 0.97
DITHER = 1e-5
LOG_ZERO_GUARD = 1e-20
NORM_EPS = 1e-5
TRIM_CUTOFF_DB = -60.0
TRIM_WINDOW = 2048  # DALI NonsilentRegion's default window_length
SPEED_RANGE = (0.85, 1.15)
FREQ_MASKS, MIN_FREQ, MAX_FREQ = 2, 0, 20
TIME_MASKS, MIN_TIME, MAX_TIME = 10, 0, 0.03
STACKING = 3
SUBSAMPLING = 3
FEATURES = N_MELS * STACKING
RESAMPLE_MARGIN = 1024  # zeros after the batch before its FFT resampling
OVERSAMPLE = 4  # linear interpolation between points 1/4 sample apart: -0.4 dB at 8 kHz


def _positions(lens: torch.Tensor, width: int) -> tuple[torch.Tensor, torch.Tensor]:
    """``arange(width)`` as a row and a ``[B, width]`` mask of positions below each length."""
    pos = torch.arange(width, device=lens.device)
    return pos, pos < lens[:, None]


def random_speed_rates(batch: int, generator: torch.Generator | None = None,
                       low: float = SPEED_RANGE[0], high: float = SPEED_RANGE[1]) -> torch.Tensor:
    """One resampling factor per utterance from U(low, high), on the CPU (float64)."""
    u = torch.rand(batch, generator=generator, dtype=torch.float64)
    return low + (high - low) * u


def _fft_size(n: int) -> int:
    """The smallest ``2^a 3^b 5^c`` at least ``n`` (a fast FFT length)."""
    best, p2 = 2 * n, 1
    while p2 < 2 * n:
        p3 = p2
        while p3 < 2 * n:
            p5 = p3
            while p5 < n:
                p5 *= 5
            best = min(best, p5)
            p3 *= 3
        p2 *= 2
    return best


def speed_perturb(audio: torch.Tensor, lens: torch.Tensor,
                  rates: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Resample row ``b`` to ``round(lens[b] * rates[b])`` samples, band-limited, all rows at
    once: the batch (zero-padded by at least ``RESAMPLE_MARGIN`` to a fast FFT length, so no
    end wraps onto a start) goes through one FFT, each row's spectrum is cut at ``rate`` times
    Nyquist when ``rate < 1`` (nothing aliases), one inverse FFT ``OVERSAMPLE`` times longer
    interpolates it exactly, and output sample ``j`` is read at input position ``j / rate``
    between the two nearest oversampled points."""
    if not audio.shape[0]:
        return audio, lens
    host_rates = rates.detach().to("cpu", torch.float64)
    width = math.ceil(audio.shape[1] * float(host_rates.max()))
    rates = rates.to(audio.device, torch.float64)
    new_lens = torch.round(lens.to(torch.float64) * rates).long()
    size = _fft_size(audio.shape[1] + RESAMPLE_MARGIN)
    _, valid = _positions(lens, audio.shape[1])
    spec = torch.fft.rfft(torch.where(valid, audio, 0.0), n=size)
    cut = rates.clamp(max=1.0)[:, None] * (size // 2)
    spec = torch.where(torch.arange(spec.shape[1], device=audio.device) <= cut, spec, 0)
    fine = torch.fft.irfft(spec, n=OVERSAMPLE * size) * OVERSAMPLE
    pos, valid = _positions(new_lens, width)
    src = pos * (OVERSAMPLE / rates[:, None])  # float64: positions reach millions
    base = torch.floor(src).long()
    frac = (src - base).to(audio.dtype)
    base = base.clamp(max=fine.shape[1] - 2)
    out = fine.gather(1, base) * (1 - frac) + fine.gather(1, base + 1) * frac
    return torch.where(valid, out, 0.0), new_lens


def nonsilent_region(audio: torch.Tensor, lens: torch.Tensor, cutoff_db: float = TRIM_CUTOFF_DB,
                     window: int = TRIM_WINDOW) -> tuple[torch.Tensor, torch.Tensor]:
    """(first, count) of each row's samples whose short-term power is at most ``-cutoff_db``
    dB below the row's highest; an all-silent row keeps everything."""
    _, valid = _positions(lens, audio.shape[1])
    sq = torch.where(valid, audio.to(torch.float64) ** 2, 0.0)
    csum = torch.nn.functional.pad(sq.cumsum(1), (1, 0))
    hi = torch.arange(1, audio.shape[1] + 1, device=audio.device)
    power = (csum[:, hi] - csum[:, (hi - window).clamp(min=0)]) / window
    power = torch.where(valid, power, -1.0)
    loud = valid & (power >= power.amax(1, keepdim=True) * 10.0 ** (cutoff_db / 10))
    first = torch.where(loud, hi - 1, audio.shape[1]).amin(1)
    last = torch.where(loud, hi - 1, -1).amax(1)
    count = (last - first + 1).clamp(min=0)
    return torch.where(count > 0, first, 0), count


def trim_silence(audio: torch.Tensor, lens: torch.Tensor, cutoff_db: float = TRIM_CUTOFF_DB,
                 window: int = TRIM_WINDOW) -> tuple[torch.Tensor, torch.Tensor]:
    """Each row's non-silent region moved to its start (the batch keeps its width)."""
    first, count = nonsilent_region(audio, lens, cutoff_db, window)
    pos, valid = _positions(count, audio.shape[1])
    idx = (first[:, None] + pos).clamp(max=max(audio.shape[1] - 1, 0))
    return torch.where(valid, audio.gather(1, idx), 0.0), count


def add_dither(audio: torch.Tensor, lens: torch.Tensor, scale: float = DITHER,
               generator: torch.Generator | None = None) -> torch.Tensor:
    """Gaussian noise of std ``scale`` on each row's samples (padding stays 0)."""
    _, valid = _positions(lens, audio.shape[1])
    noise = torch.randn(audio.shape, generator=generator, device=audio.device, dtype=audio.dtype)
    return torch.where(valid, audio + scale * noise, 0.0)


def preemphasis(audio: torch.Tensor, lens: torch.Tensor,
                coeff: float = PREEMPHASIS) -> torch.Tensor:
    """``y[t] = x[t] - coeff * x[t-1]``, ``y[0] = x[0]`` (padding stays 0)."""
    _, valid = _positions(lens, audio.shape[1])
    y = torch.cat([audio[:, :1], audio[:, 1:] - coeff * audio[:, :-1]], 1)
    return torch.where(valid, y, 0.0)


def hz_to_mel(hz: torch.Tensor) -> torch.Tensor:
    """Slaney's mel scale (librosa's default, ``htk=False``): linear to 1 kHz, then log."""
    f_sp, min_log_hz, min_log_mel = 200.0 / 3, 1000.0, 15.0
    logstep = math.log(6.4) / 27.0
    return torch.where(hz >= min_log_hz,
                       min_log_mel + torch.log(hz.clamp(min=min_log_hz) / min_log_hz) / logstep,
                       hz / f_sp)


def mel_to_hz(mel: torch.Tensor) -> torch.Tensor:
    """The inverse of ``hz_to_mel``."""
    f_sp, min_log_hz, min_log_mel = 200.0 / 3, 1000.0, 15.0
    logstep = math.log(6.4) / 27.0
    return torch.where(mel >= min_log_mel,
                       min_log_hz * torch.exp(logstep * (mel - min_log_mel)), mel * f_sp)


def mel_filterbank(n_mels: int = N_MELS, n_fft: int = N_FFT, sample_rate: int = SAMPLE_RATE,
                   f_min: float = 0.0, f_max: float | None = None) -> torch.Tensor:
    """``[n_mels, n_fft // 2 + 1]`` triangular filters as ``librosa.filters.mel`` builds them by
    default (the reference's call ``mel(sr, n_fft, n_mels=80, fmin=0, fmax=sr/2)``; DALI's
    ``MelFilterBank(normalize=True)`` with its default Slaney formula is the same):
    ``n_mels + 2`` edges equally spaced on the Slaney mel scale, each filter rising from edge
    ``m`` to a peak at ``m + 1`` and falling to ``m + 2``, evaluated at the FFT bin
    frequencies and scaled by ``2 / (hz[m + 2] - hz[m])`` (area normalisation)."""
    f_max = sample_rate / 2 if f_max is None else f_max
    bins = torch.linspace(0, sample_rate / 2, n_fft // 2 + 1, dtype=torch.float64)
    edges = mel_to_hz(torch.linspace(float(hz_to_mel(torch.tensor(f_min, dtype=torch.float64))),
                                     float(hz_to_mel(torch.tensor(f_max, dtype=torch.float64))),
                                     n_mels + 2, dtype=torch.float64))
    widths = edges.diff()
    ramps = edges[:, None] - bins[None, :]
    rising = -ramps[:-2] / widths[:-1, None]
    falling = ramps[2:] / widths[1:, None]
    weights = torch.minimum(rising, falling).clamp(min=0)
    return (weights * (2.0 / (edges[2:] - edges[:-2]))[:, None]).float()


def frame_lengths(lens: torch.Tensor, hop: int) -> torch.Tensor:
    """Frames of a centred STFT of ``lens`` samples: ``1 + lens // hop``."""
    return 1 + torch.div(lens, hop, rounding_mode="floor")


def power_spectrum(audio: torch.Tensor, lens: torch.Tensor, window: torch.Tensor,
                   n_fft: int = N_FFT, hop: int = int(SAMPLE_RATE * WINDOW_STRIDE)
                   ) -> tuple[torch.Tensor, torch.Tensor]:
    """``|STFT|^2`` as ``[B, n_fft // 2 + 1, frames]`` and frame counts; each row is padded by
    ``n_fft // 2`` reflected samples at its own start and end (``torch.stft(center=True)``
    on that row alone)."""
    pad = n_fft // 2
    width = audio.shape[1] + 2 * pad
    i = torch.arange(width, device=audio.device)[None, :] - pad
    last = (lens[:, None] - 1).clamp(min=0)
    i = torch.where(i < 0, -i, i)
    i = torch.where(i > last, 2 * last - i, i).clamp(0, max(audio.shape[1] - 1, 0))
    padded = audio.gather(1, i)
    spec = torch.stft(padded, n_fft=n_fft, hop_length=hop, win_length=window.numel(),
                      window=window, center=False, return_complex=True)
    return spec.real ** 2 + spec.imag ** 2, frame_lengths(lens, hop)


def normalize_per_feature(x: torch.Tensor, lens: torch.Tensor) -> torch.Tensor:
    """``(x - mean) / (std + 1e-5)`` per utterance and feature over its ``lens`` frames (std
    unbiased, as the reference's ``normalize_batch``); frames past ``lens`` become 0."""
    _, valid = _positions(lens, x.shape[2])
    valid = valid[:, None, :]
    n = lens[:, None, None].to(x.dtype)
    mean = torch.where(valid, x, 0.0).sum(2, keepdim=True) / n.clamp(min=1)
    var = torch.where(valid, (x - mean) ** 2, 0.0).sum(2, keepdim=True) / (n - 1).clamp(min=1)
    return torch.where(valid, (x - mean) / (var.sqrt() + NORM_EPS), 0.0)


def _mask_spans(starts: torch.Tensor, widths: torch.Tensor, size: int) -> torch.Tensor:
    """``[B, size]``: True inside any of the ``[B, n]`` spans ``[start, start + width)``."""
    pos = torch.arange(size, device=starts.device)[None, None, :]
    inside = (pos >= starts[..., None]) & (pos < (starts + widths)[..., None])
    return inside.any(1)


def spec_augment(x: torch.Tensor, lens: torch.Tensor, generator: torch.Generator | None = None,
                 freq_masks: int = FREQ_MASKS, min_freq: int = MIN_FREQ,
                 max_freq: int = MAX_FREQ, time_masks: int = TIME_MASKS,
                 min_time: int = MIN_TIME, max_time: float = MAX_TIME) -> torch.Tensor:
    """SpecAugment without time warping, adaptive time masks (arXiv 1904.08779, 1912.05533).

    ``x`` is ``[B, features, frames]``. Each utterance gets ``freq_masks`` bands of width
    U{min_freq..max_freq} starting at U{0..features - width}, and ``time_masks`` spans of
    width U{min_time..round(max_time * frames)} (``max_time`` in (0, 1) is a fraction of the
    utterance's frames, otherwise a count) starting at U{0..frames - width}; masked values
    are 0. Random draws use ``generator`` (on ``x``'s device).
    """
    b, feats, frames = x.shape

    def draw(high: torch.Tensor, n: int) -> torch.Tensor:
        """U{0..high} per row (``high`` ``[B, 1]``), ``n`` draws per row."""
        u = torch.rand(b, n, generator=generator, device=x.device, dtype=torch.float64)
        return torch.floor(u * (high + 1)).long()

    low_f = torch.full((b, 1), min_freq, device=x.device)
    f_width = low_f + draw(torch.full_like(low_f, max_freq - min_freq), freq_masks)
    f_start = draw((feats - f_width).clamp(min=0), freq_masks)
    lens_f = lens[:, None].to(torch.float64)
    t_max = torch.round(lens_f * max_time).long() if 0 < max_time < 1 else (
        torch.full_like(lens[:, None], int(max_time)))
    t_width = min_time + draw((t_max - min_time).clamp(min=0), time_masks)
    t_start = draw((lens[:, None] - t_width).clamp(min=0), time_masks)
    mask = (_mask_spans(f_start, f_width, feats)[:, :, None]
            | _mask_spans(t_start, t_width, frames)[:, None, :])
    return x.masked_fill(mask, 0.0)


def stack_subsample(x: torch.Tensor, lens: torch.Tensor, stacking: int = STACKING,
                    subsampling: int = SUBSAMPLING) -> tuple[torch.Tensor, torch.Tensor]:
    """``[B, F, T]`` -> ``[B, F * stacking, ceil(T / subsampling)]``: frame ``t`` followed by
    frames ``t + 1 .. t + stacking - 1`` (0 past the end), every ``subsampling``-th kept;
    lengths ``ceil(lens / subsampling)``."""
    shifted = [x] + [torch.nn.functional.pad(x[:, :, n:], (0, n)) for n in range(1, stacking)]
    out = torch.cat(shifted, 1)[:, :, ::subsampling]
    return out, -torch.div(-lens, subsampling, rounding_mode="floor")


class AudioFeatures(torch.nn.Module):
    """The whole pipeline: ``(audio [B, samples], lens)`` -> ``(features [B, steps, 240],
    steps)``; ``train=True`` adds speed perturbation and SpecAugment. Buffers (window, mel
    filters) follow ``.to(device)``; always computed in float32 outside autocast."""

    def __init__(self, sample_rate: int = SAMPLE_RATE, n_mels: int = N_MELS,
                 n_fft: int = N_FFT, speed_range: tuple[float, float] = SPEED_RANGE,
                 trim_db: float | None = TRIM_CUTOFF_DB, dither: float = DITHER):
        super().__init__()
        self.hop = int(sample_rate * WINDOW_STRIDE)
        self.n_fft = n_fft
        self.speed_range = speed_range
        self.trim_db = trim_db
        self.dither = dither
        self.register_buffer("window", torch.hann_window(int(sample_rate * WINDOW_SIZE),
                                                         periodic=False), persistent=False)
        self.register_buffer("filters", mel_filterbank(n_mels, n_fft, sample_rate),
                             persistent=False)

    @torch.no_grad()
    def forward(self, audio: torch.Tensor, lens: torch.Tensor, train: bool = False,
                generator: torch.Generator | None = None,
                cpu_generator: torch.Generator | None = None
                ) -> tuple[torch.Tensor, torch.Tensor]:
        """``generator`` drives the draws on ``audio``'s device, ``cpu_generator`` the speed
        factors (drawn on the host so no device sync is needed for the output width)."""
        with torch.autocast(audio.device.type, enabled=False):
            audio, lens = audio.float(), lens.long()
            if train:
                rates = random_speed_rates(audio.shape[0], cpu_generator, *self.speed_range)
                audio, lens = speed_perturb(audio, lens, rates)
            if self.trim_db is not None:
                audio, lens = trim_silence(audio, lens, self.trim_db)
            if self.dither:
                audio = add_dither(audio, lens, self.dither, generator)
            audio = preemphasis(audio, lens)
            power, frames = power_spectrum(audio, lens, self.window, self.n_fft, self.hop)
            x = torch.log(self.filters @ power + LOG_ZERO_GUARD)
            x = normalize_per_feature(x, frames)
            if train:
                x = spec_augment(x, frames, generator)
            x, steps = stack_subsample(x, frames)
            return x[:, :, :int(steps.max()) if steps.numel() else 0].transpose(1, 2), steps
