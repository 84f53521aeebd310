"""The transducer loss against a brute-force sum over every alignment (values and gradients),
padded and packed, several lengths in one batch; utterances without labels against their
blanks' sum by hand, in every path; the diagonal lattice against its cell-by-cell recursion;
the fused log-softmax against the reference one, chunk by chunk and without an fp32 copy of
the logits; the torchaudio path on the GPU."""

import functools
import itertools
import math

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_leaves

from benchmarks.rnnt.compiled_loss import CompiledLogProbs
from benchmarks.rnnt.fused_loss import _chunk_norm, _FusedLogProbs, fused_log_probs
from benchmarks.rnnt.loss import lattice, transducer_loss
from benchmarks.rnnt.packed_joint import packed_index, packed_transducer_loss

FUSED = {"log_probs": fused_log_probs}
COMPILED = {"log_probs": CompiledLogProbs.apply}


def fused(chunk_rows):
    return {"log_probs": functools.partial(fused_log_probs, chunk_rows=chunk_rows)}


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


@pytest.mark.parametrize("dtype", [torch.float64, torch.float32])
def test_lattice_is_the_cell_by_cell_recursion_exactly(dtype):
    """Every cell, -inf weights included, against one ``logaddexp`` per cell: the same
    operations in the same order, to the last bits (the CPU's vectorised and scalar ``exp``
    can differ by an ulp, depending on where a row's tail falls)."""
    g = torch.Generator().manual_seed(11)
    B, T, U1 = 3, 6, 4
    wt, wu = (torch.randn(2, B, T, U1, generator=g) * 3).to(dtype)
    wt[0, :, 2:] = wu[1, 3:] = wu[2, :, 1] = -math.inf
    init = torch.randn(B, generator=g).to(dtype)
    expected = torch.full((B, T, U1), -math.inf, dtype=dtype)
    expected[:, 0, 0] = init
    for t, u in itertools.product(range(T), range(U1)):
        if t or u:
            from_t = expected[:, t - 1, u] + wt[:, t, u] if t else torch.full_like(init, -math.inf)
            from_u = expected[:, t, u - 1] + wu[:, t, u] if u else torch.full_like(init, -math.inf)
            expected[:, t, u] = torch.logaddexp(from_t, from_u)
    got = lattice(wt, wu, init)
    torch.testing.assert_close(got, expected, rtol=4 * torch.finfo(dtype).eps, atol=0)
    assert got.isfinite().any() and got.isneginf().any()


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


@pytest.mark.parametrize("impl", [{}, fused(7), COMPILED], ids=["reference", "fused", "compiled"])
def test_packed_matches_brute_force_values_and_gradients(impl):     # N = 30 rows
    logits, enc_lens, labels, label_lens = _batch(3, [3, 4, 1, 2], [2, 3, 2, 0], vocab=6)
    packed = _pack(logits.detach(), enc_lens, label_lens).requires_grad_()
    loss = packed_transducer_loss(packed, enc_lens, labels, label_lens, reduction="none",
                                  **impl)
    (grad,) = torch.autograd.grad(loss.sum(), packed)
    expected = _brute_force_batch(logits, enc_lens, labels, label_lens, blank=5)
    (expected_grad,) = torch.autograd.grad(expected.sum(), logits)
    torch.testing.assert_close(loss, expected, rtol=1e-10, atol=1e-10)
    torch.testing.assert_close(grad, _pack(expected_grad, enc_lens, label_lens),
                               rtol=1e-9, atol=1e-10)


def test_fused_log_probs_are_the_log_softmax_at_two_columns():
    """Against autograd through ``log_softmax`` with a gradient on every row: where a row has
    no label, its -inf is a constant and passes none."""
    g = torch.Generator().manual_seed(10)
    logits = torch.randn(23, 11, generator=g, dtype=torch.float64, requires_grad=True)
    ids = torch.randint(0, 10, (23,), generator=g)
    has_label = torch.rand(23, generator=g) < 0.7
    upstream = tuple(torch.randn(2, 23, generator=g, dtype=torch.float64))
    got = _FusedLogProbs.apply(logits, ids, has_label, 10, 5)
    lp = logits.log_softmax(-1)
    expected = (lp[:, 10], lp.gather(1, ids[:, None])[:, 0].masked_fill(~has_label, -math.inf))
    torch.testing.assert_close(got, expected, rtol=1e-12, atol=1e-12)
    torch.testing.assert_close(torch.autograd.grad(got, logits, upstream),
                               torch.autograd.grad(expected, logits, upstream),
                               rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("dtype", [torch.bfloat16, torch.float32])
def test_chunk_norm_is_logsumexp_of_the_float32_copy_bit_for_bit(dtype):
    x = (torch.randn(9, 37, generator=torch.Generator().manual_seed(12)) * 4).to(dtype)
    x[3] = -math.inf
    x[5, :3] = -math.inf
    got = _chunk_norm(x, torch.float32)
    assert got.dtype == torch.float32
    assert torch.equal(got, torch.logsumexp(x.float(), -1))


def _packed_batch(seed, dtype, vocab=64):
    """Packed logits ``[N, V]`` of 4 utterances, one without labels; N = 61."""
    g = torch.Generator().manual_seed(seed)
    enc_lens, label_lens = torch.tensor([5, 3, 7, 1]), torch.tensor([3, 0, 4, 2])
    n = int((enc_lens * (label_lens + 1)).sum())
    logits = (torch.randn(n, vocab, generator=g) * 3).to(dtype)
    labels = torch.randint(0, vocab - 1, (4, 4), generator=g)
    return logits, enc_lens, labels, label_lens


def _loss_and_grad(logits, enc_lens, labels, label_lens, **impl):
    x = logits.clone().requires_grad_()
    loss = packed_transducer_loss(x, enc_lens, labels, label_lens, reduction="none", **impl)
    (grad,) = torch.autograd.grad(loss.sum(), x)
    return loss, grad


@pytest.mark.parametrize("chunk_rows", [None, 61, 8, 1])
@pytest.mark.parametrize("dtype, tol", [(torch.float32, dict(rtol=1e-6, atol=1e-6)),
                                        (torch.bfloat16, dict(rtol=1.6e-2, atol=1e-5))])
def test_fused_packed_matches_the_reference_packed_path(dtype, tol, chunk_rows):
    batch = _packed_batch(8, dtype)
    loss, grad = _loss_and_grad(*batch, **fused(chunk_rows))
    ref_loss, ref_grad = _loss_and_grad(*batch)
    assert loss.dtype == torch.float32 and grad.dtype == dtype
    torch.testing.assert_close(loss, ref_loss, rtol=1e-6, atol=1e-5)
    torch.testing.assert_close(grad, ref_grad, **tol)   # finite, also on the label-less rows
    assert grad.float().sum(-1).abs().max() < 1e-2      # softmax gradients sum to 0 per row


class _LargestFloat32(TorchDispatchMode):
    """Records the most elements of any fp32 tensor an op makes."""

    largest = 0

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        sizes = [t.numel() for t in tree_leaves(out)
                 if isinstance(t, torch.Tensor) and t.dtype == torch.float32]
        self.largest = max([self.largest, *sizes])
        return out


@pytest.mark.parametrize("impl", ["reference", "fused"])
def test_fused_path_never_makes_an_fp32_copy_of_the_logits(impl):
    impl = fused(8) if impl == "fused" else {}
    # a vocabulary wide enough that one chunk outgrows the lattice's fp32 grids
    logits, enc_lens, labels, label_lens = _packed_batch(9, torch.bfloat16, vocab=256)
    with _LargestFloat32() as mode:
        _loss_and_grad(logits, enc_lens, labels, label_lens, **impl)
    n, vocab = logits.shape
    if not impl:
        assert mode.largest >= n * vocab     # the check sees the reference's copy
    else:
        assert mode.largest <= 8 * vocab     # one chunk of rows at most


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


def test_unknown_reduction_is_refused():
    logits, enc_lens, labels, label_lens = _batch(6, [2], [1])
    with pytest.raises(ValueError, match="reduction"):
        transducer_loss(logits, enc_lens, labels, label_lens, reduction="avg")
    with pytest.raises(ValueError, match="reduction"):
        packed_transducer_loss(_pack(logits, enc_lens, label_lens), enc_lens, labels,
                               label_lens, reduction="avg")


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_torchaudio_matches_reference_on_gpu():
    from benchmarks.rnnt.torchaudio_loss import torchaudio_loss

    g = torch.Generator().manual_seed(7)
    B, T, U, V = 8, 120, 40, 129
    enc_lens = torch.randint(T // 2, T + 1, (B,), generator=g)
    label_lens = torch.randint(1, U + 1, (B,), generator=g)
    enc_lens[0], label_lens[1] = T, U
    logits = (torch.randn(B, T + 3, U + 1, V, generator=g) * 3).cuda()   # grid over-padded in T
    labels = torch.randint(0, V - 1, (B, U), generator=g).cuda()
    enc_lens, label_lens = enc_lens.cuda(), label_lens.cuda()
    results = []
    for loss_fn in (transducer_loss, torchaudio_loss):
        x = logits.clone().requires_grad_()
        loss = loss_fn(x, enc_lens, labels, label_lens)
        (grad,) = torch.autograd.grad(loss, x)
        results.append((loss, grad))
    (ref_loss, ref_grad), (ta_loss, ta_grad) = results
    torch.testing.assert_close(ta_loss, ref_loss, rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(ta_grad, ref_grad, rtol=1e-3, atol=2e-4)


@pytest.mark.parametrize("dtype, tol", [(torch.float32, dict(rtol=1e-5, atol=1e-6)),
                                        (torch.bfloat16, dict(rtol=1.6e-2, atol=1e-5))])
def test_compiled_packed_matches_the_fused_path(dtype, tol):
    batch = _packed_batch(8, dtype)
    loss, grad = _loss_and_grad(*batch, **COMPILED)
    fused_loss, fused_grad = _loss_and_grad(*batch, **FUSED)
    assert loss.dtype == torch.float32 and grad.dtype == dtype
    torch.testing.assert_close(loss, fused_loss, rtol=1e-5, atol=1e-5)
    torch.testing.assert_close(grad, fused_grad, **tol)
    # another number of rows runs the same compiled kernels (dynamic), and stays right
    shorter = (batch[0][:-1], torch.tensor([5, 3, 7, 1]), batch[2], torch.tensor([3, 0, 4, 1]))
    torch.testing.assert_close(_loss_and_grad(*shorter, **COMPILED)[0],
                               _loss_and_grad(*shorter, **FUSED)[0], rtol=1e-5, atol=1e-5)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
@pytest.mark.parametrize("impl", [fused(4096), COMPILED], ids=["fused", "compiled"])
def test_fast_paths_on_gpu_hold_no_fp32_copy_and_match_the_reference(impl):
    g = torch.Generator().manual_seed(14)
    enc_lens, label_lens = torch.tensor([200, 180, 150, 90]), torch.tensor([60, 40, 75, 0])
    n = int((enc_lens * (label_lens + 1)).sum())            # 41,790 rows
    logits = (torch.randn(n, 1024, generator=g) * 3).to(torch.bfloat16).cuda()
    labels = torch.randint(0, 1023, (4, 75), generator=g).cuda()
    batch = (logits, enc_lens.cuda(), labels, label_lens.cuda())
    ref_loss, ref_grad = _loss_and_grad(*batch)
    _loss_and_grad(*batch, **impl)                          # compiled: built once
    x = logits.clone().requires_grad_()
    torch.cuda.synchronize()
    torch.cuda.reset_peak_memory_stats()
    before = torch.cuda.memory_allocated()
    loss = packed_transducer_loss(x, *batch[1:], reduction="none", **impl)
    (grad,) = torch.autograd.grad(loss.sum(), x)
    extra = torch.cuda.max_memory_allocated() - before
    torch.testing.assert_close(loss, ref_loss, rtol=1e-5, atol=1e-3)
    torch.testing.assert_close(grad, ref_grad, rtol=1.6e-2, atol=1e-5)
    # the bf16 gradient (2 bytes an element) and less than 2 more: no fp32 copy of the logits
    assert extra < logits.numel() * 4, extra / 2**20


def _no_label_batch(columns: int, device="cpu"):
    """Padded logits of 3 utterances (T = 5, 3, 1) without labels (``columns`` label columns
    of padding), and their losses by hand: the sum of the blank's log-probabilities along t
    at u = 0, the one alignment."""
    g = torch.Generator().manual_seed(15)
    logits = (torch.randn(3, 5, columns + 1, 7, generator=g, dtype=torch.float64) * 3)
    enc_lens, label_lens = torch.tensor([5, 3, 1]), torch.zeros(3, dtype=torch.long)
    labels = torch.randint(0, 6, (3, columns), generator=g)
    p = logits[:, :, 0].softmax(-1)[..., 6]
    by_hand = torch.tensor([-sum(math.log(p[b, t]) for t in range(n))
                            for b, n in enumerate(enc_lens.tolist())], dtype=torch.float64)
    batch = (logits.to(device), enc_lens.to(device), labels.to(device), label_lens.to(device))
    return batch, by_hand.to(device)


@pytest.mark.parametrize("columns", [0, 2], ids=["no-label-columns", "padding-columns"])
@pytest.mark.parametrize("impl", [{}, fused(4), COMPILED], ids=["reference", "fused",
                                                                "compiled"])
@pytest.mark.parametrize("packed", [False, True], ids=["padded", "packed"])
@pytest.mark.parametrize("device", [
    "cpu", pytest.param("cuda", marks=[pytest.mark.gpu, pytest.mark.skipif(
        not torch.cuda.is_available(), reason="needs CUDA")])])
def test_utterances_without_labels_lose_their_blanks_sum(columns, impl, packed, device):
    """U = 0: every path, a batch with no label column at all included."""
    (logits, enc_lens, labels, label_lens), by_hand = _no_label_batch(columns, device)
    if packed:
        logits = _pack(logits, enc_lens, label_lens)
        loss = packed_transducer_loss(logits, enc_lens, labels, label_lens, reduction="none",
                                      **impl)
    else:
        loss = transducer_loss(logits, enc_lens, labels, label_lens, reduction="none", **impl)
    torch.testing.assert_close(loss, by_hand, rtol=1e-12, atol=1e-12)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_utterances_without_labels_on_the_gpu_triton_and_torchaudio():
    """U = 0 (and T = 1) through the Triton lattice and through torchaudio, whose kernel
    leaves those utterances' costs unwritten."""
    from benchmarks.rnnt.lattice_triton import lattice as triton_lattice
    from benchmarks.rnnt.torchaudio_loss import torchaudio_loss

    (logits, enc_lens, labels, label_lens), by_hand = _no_label_batch(0, "cuda")
    x = logits.float().requires_grad_()
    torch.testing.assert_close(
        transducer_loss(x, enc_lens, labels, label_lens, reduction="none", walk=triton_lattice),
        by_hand.float(), rtol=1e-6, atol=1e-5)
    loss = torchaudio_loss(x, enc_lens, labels, label_lens, reduction="none")
    torch.testing.assert_close(loss, by_hand.float(), rtol=1e-6, atol=1e-5)
    (grad,) = torch.autograd.grad(loss.sum(), x)
    assert grad.isfinite().all()
    # with labelled utterances beside them: torchaudio takes those, the reference the rest
    g = torch.Generator().manual_seed(16)
    enc_lens, label_lens = torch.tensor([6, 4, 1, 5]).cuda(), torch.tensor([0, 2, 3, 1]).cuda()
    logits = (torch.randn(4, 6, 4, 9, generator=g) * 3).cuda().requires_grad_()
    labels = torch.randint(0, 8, (4, 3), generator=g).cuda()
    ref = transducer_loss(logits, enc_lens, labels, label_lens, reduction="none")
    got = torchaudio_loss(logits, enc_lens, labels, label_lens, reduction="none")
    torch.testing.assert_close(got, ref, rtol=1e-5, atol=1e-4)
    torch.testing.assert_close(torch.autograd.grad(got.sum(), logits)[0],
                               torch.autograd.grad(ref.sum(), logits)[0], rtol=1e-3, atol=2e-4)
