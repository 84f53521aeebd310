"""The transducer loss against a brute-force sum over every alignment (values and gradients),
padded and packed, several lengths in one batch; the torchaudio path on the GPU."""

import itertools
import math

import pytest
import torch

from benchmarks.rnnt.loss import packed_transducer_loss, transducer_loss
from benchmarks.rnnt.model import packed_index


def brute_force_nll(logits, enc_len, labels, blank):
    """``-log sum over alignments`` of one utterance's ``logits [T, U+1, V]``: every order of
    ``U`` labels and ``T`` blanks whose last symbol is a blank."""
    lp = logits.log_softmax(-1)
    U = len(labels)
    paths = []
    for label_slots in itertools.combinations(range(enc_len - 1 + U), U):
        t = u = 0
        total = lp.new_zeros(())
        for slot in range(enc_len - 1 + U + 1):
            if slot in label_slots:
                total = total + lp[t, u, labels[u]]
                u += 1
            else:
                total = total + lp[t, u, blank]
                t += 1
        paths.append(total)
    return -torch.logsumexp(torch.stack(paths), 0)


def _batch(seed, enc_lens, label_lens, vocab=5, dtype=torch.float64):
    g = torch.Generator().manual_seed(seed)
    B, T, U = len(enc_lens), max(enc_lens), max(label_lens)
    logits = torch.randn(B, T, U + 1, vocab, generator=g, dtype=dtype) * 2
    labels = torch.randint(0, vocab - 1, (B, max(U, 1)), generator=g)
    return (logits.requires_grad_(), torch.tensor(enc_lens), labels, torch.tensor(label_lens))


def _brute_force_batch(logits, enc_lens, labels, label_lens, blank):
    return torch.stack([brute_force_nll(logits[b], int(enc_lens[b]),
                                        labels[b, :label_lens[b]].tolist(), blank)
                        for b in range(len(logits))])


def _pack(logits, enc_lens, label_lens):
    b, t, u = packed_index(enc_lens, label_lens + 1)
    return logits[b, t, u]


def test_two_alignments_by_hand():
    """T = 2, one label: blank then (label, blank), or (label, blank) then blank."""
    p = torch.tensor([[[0.6, 0.1, 0.3], [0.2, 0.3, 0.5]],
                      [[0.4, 0.2, 0.4], [0.7, 0.1, 0.2]]], dtype=torch.float64)   # [t, u, v]
    label, blank = 1, 2
    paths = (p[0, 0, blank] * p[1, 0, label] * p[1, 1, blank]
             + p[0, 0, label] * p[0, 1, blank] * p[1, 1, blank])
    loss = transducer_loss(p.log()[None], torch.tensor([2]), torch.tensor([[label]]),
                           torch.tensor([1]), blank=blank)
    assert loss.item() == pytest.approx(-math.log(paths), rel=1e-12)


@pytest.mark.parametrize("blank", [-1, 0])
def test_padded_matches_brute_force_values_and_gradients(blank):
    enc_lens, label_lens = [4, 2, 3, 1, 3], [3, 2, 0, 1, 1]
    logits, enc_lens_t, labels, label_lens_t = _batch(0, enc_lens, label_lens)
    if blank == 0:
        labels = labels + 1                     # labels never equal the blank
    vocab = logits.shape[-1]
    loss = transducer_loss(logits, enc_lens_t, labels, label_lens_t, blank=blank,
                           reduction="none")
    (grad,) = torch.autograd.grad(loss.sum(), logits)
    expected = _brute_force_batch(logits, enc_lens_t, labels, label_lens_t, blank % vocab)
    (expected_grad,) = torch.autograd.grad(expected.sum(), logits)
    torch.testing.assert_close(loss, expected, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(grad, expected_grad, rtol=1e-9, atol=1e-10)


def test_reduction_mean_is_sum_over_batch_size():
    logits, enc_lens, labels, label_lens = _batch(1, [3, 2, 4], [2, 1, 2])
    per_utt = transducer_loss(logits, enc_lens, labels, label_lens, reduction="none")
    mean = transducer_loss(logits, enc_lens, labels, label_lens)
    assert mean.item() == pytest.approx(per_utt.sum().item() / 3, rel=1e-12)
    assert transducer_loss(logits, enc_lens, labels, label_lens, reduction="sum").item() == \
        pytest.approx(per_utt.sum().item(), rel=1e-12)


def test_padding_does_not_matter_and_gets_no_gradient():
    logits, enc_lens, labels, label_lens = _batch(2, [4, 2, 3], [3, 1, 2])
    loss = transducer_loss(logits, enc_lens, labels, label_lens, reduction="none")
    (grad,) = torch.autograd.grad(loss.sum(), logits)
    b, t, u = packed_index(enc_lens, label_lens + 1)
    valid = torch.zeros(logits.shape[:3], dtype=torch.bool)
    valid[b, t, u] = True
    noisy = torch.where(valid[..., None], logits.detach(), 1e3 * torch.randn(logits.shape,
                                                                              dtype=logits.dtype))
    labels_noisy = labels.clone()
    labels_noisy[1, 1:] = 0
    torch.testing.assert_close(
        transducer_loss(noisy, enc_lens, labels_noisy, label_lens, reduction="none"), loss)
    assert grad[~valid].abs().max() == 0
    assert grad[valid].abs().max() > 0


def test_packed_matches_brute_force_values_and_gradients():
    logits, enc_lens, labels, label_lens = _batch(3, [3, 4, 1, 2], [2, 3, 2, 0], vocab=6)
    packed = _pack(logits.detach(), enc_lens, label_lens).requires_grad_()
    loss = packed_transducer_loss(packed, enc_lens, labels, label_lens, reduction="none")
    (grad,) = torch.autograd.grad(loss.sum(), packed)
    expected = _brute_force_batch(logits, enc_lens, labels, label_lens, blank=5)
    (expected_grad,) = torch.autograd.grad(expected.sum(), logits)
    torch.testing.assert_close(loss, expected, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(grad, _pack(expected_grad, enc_lens, label_lens),
                               rtol=1e-9, atol=1e-10)


def test_long_sequences_in_float32_match_float64():
    """T = 60, U = 25 with peaked logits: finite, and float32 close to float64."""
    logits, enc_lens, labels, label_lens = _batch(4, [60, 41], [25, 13], vocab=9,
                                                  dtype=torch.float64)
    logits = (logits.detach() * 5).requires_grad_()
    loss64 = transducer_loss(logits, enc_lens, labels, label_lens)
    (grad64,) = torch.autograd.grad(loss64, logits)
    logits32 = logits.detach().float().requires_grad_()
    loss32 = transducer_loss(logits32, enc_lens, labels, label_lens)
    (grad32,) = torch.autograd.grad(loss32, logits32)
    assert loss64.item() > 100
    assert loss32.item() == pytest.approx(loss64.item(), rel=1e-5)
    torch.testing.assert_close(grad32.double(), grad64, rtol=0, atol=1e-4)
    # over the vocabulary each cell's gradient sums to 0: alignments leave every cell they reach
    assert grad64.sum(-1).abs().max() < 1e-9


def test_bf16_logits_are_computed_in_float32():
    logits, enc_lens, labels, label_lens = _batch(5, [3, 2], [2, 1], dtype=torch.float32)
    loss = transducer_loss(logits.bfloat16(), enc_lens, labels, label_lens)
    assert loss.dtype == torch.float32
    reference = transducer_loss(logits.bfloat16().float(), enc_lens, labels, label_lens)
    assert loss.item() == pytest.approx(reference.item(), rel=1e-6)


def test_unknown_impl_and_reduction_are_refused():
    logits, enc_lens, labels, label_lens = _batch(6, [2], [1])
    with pytest.raises(ValueError, match="impl"):
        transducer_loss(logits, enc_lens, labels, label_lens, impl="warp")
    with pytest.raises(ValueError, match="reduction"):
        transducer_loss(logits, enc_lens, labels, label_lens, reduction="avg")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_torchaudio_matches_reference_on_gpu():
    g = torch.Generator().manual_seed(7)
    B, T, U, V = 8, 120, 40, 129
    enc_lens = torch.randint(T // 2, T + 1, (B,), generator=g)
    label_lens = torch.randint(1, U + 1, (B,), generator=g)
    enc_lens[0], label_lens[1] = T, U
    logits = (torch.randn(B, T + 3, U + 1, V, generator=g) * 3).cuda()   # grid over-padded in T
    labels = torch.randint(0, V - 1, (B, U), generator=g).cuda()
    enc_lens, label_lens = enc_lens.cuda(), label_lens.cuda()
    results = []
    for impl in ("reference", "torchaudio"):
        x = logits.clone().requires_grad_()
        loss = transducer_loss(x, enc_lens, labels, label_lens, impl=impl)
        (grad,) = torch.autograd.grad(loss, x)
        results.append((loss, grad))
    (ref_loss, ref_grad), (ta_loss, ta_grad) = results
    torch.testing.assert_close(ta_loss, ref_loss, rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(ta_grad, ref_grad, rtol=1e-3, atol=2e-4)
