"""``triton-attention`` (``benchmarks/bert/attention_triton.py``) against attention written
out in fp32 autograd, sequence by sequence: the output and the three input gradients,
without dropout and with the kernels' own mask (drawn by their ``_keep`` in a kernel of this
file), for sequences empty, of one token, shorter and longer than a tile; q, k and v as
the chunks of one projection output; the mask independent of the tiles. On the GPU (bf16),
or on the CPU under Triton's interpreter (``TRITON_INTERPRET=1``, fp32)."""

import math
import os

import pytest
import torch

INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"
pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not (torch.cuda.is_available() or INTERPRETED),
                                 reason="needs CUDA (or TRITON_INTERPRET=1 and Triton)")]
triton = pytest.importorskip("triton")
tl = pytest.importorskip("triton.language")
from benchmarks.bert.attention_kernels import _keep, _sequence, _span  # noqa: E402

DEVICE = "cuda" if torch.cuda.is_available() else "cpu"
DTYPE = torch.bfloat16 if DEVICE == "cuda" else torch.float32
LENGTHS = [0, 1, 70, 33, 0, 130, 8]
HEADS, DIM = 2, 16


@triton.jit
def _mask_kernel(out_ptr, offsets_ptr, seed_ptr, T, threshold, max_len,
                 BM: tl.constexpr, BN: tl.constexpr):
    """``out[head, token, key]``: 1 where the kernels keep the probability."""
    head = tl.program_id(2)
    start, L = _sequence(offsets_ptr)
    rows, ok, tok = _span(start, L, tl.program_id(0) * BM, BM)
    for n0 in range(0, L, BN):
        cols, cok, _ = _span(start, L, n0, BN)
        keep = _keep(tl.load(seed_ptr).to(tl.uint32), tok, n0, head, T, max_len, threshold,
                     BN, False)
        at = (head * T + tok)[:, None] * max_len + cols[None, :]
        tl.store(out_ptr + at, keep.to(tl.int8), mask=ok[:, None] & cok[None, :])


def _drawn_mask(offsets, seed, t, max_len, p, tiles):
    out = torch.zeros(HEADS, t, max_len, dtype=torch.int8, device=DEVICE)
    bm, bn = tiles
    _mask_kernel[(-(-max_len // bm), offsets.numel() - 1, HEADS)](
        out, offsets, seed, t, round(p * 65536), max_len, BM=bm, BN=bn)
    return out.bool()


def _inputs(seed=0):
    offsets = torch.tensor([0, *torch.tensor(LENGTHS).cumsum(0).tolist()], dtype=torch.int32)
    t = int(offsets[-1])
    g = torch.Generator().manual_seed(seed)
    qkv = torch.randn(t, 3 * HEADS * DIM, generator=g).to(DEVICE, DTYPE).requires_grad_()
    return qkv, offsets.to(DEVICE), t


def _reference(qkv, offsets, keep, p):
    """fp32 attention a sequence at a time, probabilities where ``keep`` scaled by 1/(1-p)."""
    t = qkv.shape[0]
    q, k, v = (y.float().view(t, HEADS, DIM) for y in qkv.chunk(3, -1))
    out = []
    for a, b in zip(offsets.tolist(), offsets.tolist()[1:]):
        s = torch.einsum("qhd,khd->hqk", q[a:b], k[a:b]) / math.sqrt(DIM)
        probs = s.softmax(-1) * keep[:, a:b, : b - a] / (1 - p)
        out.append(torch.einsum("hqk,khd->qhd", probs, v[a:b]))
    return torch.cat(out)


def _run(qkv, offsets, t, p, seed=5):
    from benchmarks.bert.attention_triton import TritonFlashVarlen

    q, k, v = (y.view(t, HEADS, DIM) for y in qkv.chunk(3, -1))
    torch.manual_seed(seed)
    return TritonFlashVarlen.apply(q, k, v, offsets, max(LENGTHS), p)


@pytest.mark.parametrize("p", [0.0, 0.25])
def test_the_kernels_equal_the_reference(p):
    qkv, offsets, t = _inputs()
    out = _run(qkv, offsets, t, p)
    dout = torch.randn(out.shape, generator=torch.Generator().manual_seed(1)).to(DEVICE, DTYPE)
    (got,) = torch.autograd.grad(out, qkv, dout)
    torch.manual_seed(5)
    seed = torch.randint(2**31 - 1, (1,), device=DEVICE)   # the one the forward drew
    keep = _drawn_mask(offsets, seed, t, max(LENGTHS), p, (32, 16))
    kept = torch.cat([keep[:, a:b, : b - a].flatten() for a, b in
                      zip(offsets.tolist(), offsets.tolist()[1:])]).float().mean().item()
    assert kept == 1 if p == 0 else abs(kept - (1 - p)) < 0.02
    ref = qkv.detach().float().requires_grad_()
    want = _reference(ref, offsets, keep, p)
    (want_grad,) = torch.autograd.grad(want, ref, dout.float())
    tol = dict(atol=3e-2, rtol=3e-2) if DTYPE == torch.bfloat16 else dict(atol=1e-4, rtol=1e-4)
    torch.testing.assert_close(out.float(), want, **tol)
    for name, a, e in zip("qkv", got.float().chunk(3, -1), want_grad.chunk(3, -1)):
        torch.testing.assert_close(a, e, **tol, msg=name)


def test_the_draws_are_independent_of_tiles_neighbours_and_seeds():
    qkv, offsets, t = _inputs()
    masks = [_drawn_mask(offsets, torch.tensor([seed], device=DEVICE), t, max(LENGTHS), 0.5,
                         tiles) for seed, tiles in ((7, (16, 16)), (7, (64, 128)), (8, (16, 16)))]
    assert torch.equal(masks[0], masks[1])
    bounds = list(zip(offsets.tolist(), offsets.tolist()[1:]))
    entries = [torch.cat([m[:, a:b, : b - a].flatten() for a, b in bounds]).float() * 2 - 1
               for m in masks]
    assert abs(entries[0].mean().item()) < 0.02            # kept with probability 1/2
    assert abs((entries[0] * entries[2]).mean().item()) < 0.03   # another seed
    a, b = bounds[5]   # the longest sequence
    m = masks[0][:, a:b, : b - a].float() * 2 - 1
    low = torch.tensor([j for j in range(b - a - 8) if j % 16 < 8])   # key j + 8: one hash
    for shifted in ((m[:, 1:] * m[:, :-1]), (m[:, :, 1:] * m[:, :, :-1]), m[1:] * m[:-1],
                    m[:, :, low] * m[:, :, low + 8]):
        # tokens, keys, heads next to each other; a hash's two halves
        assert abs(shifted.mean().item()) < 0.03
    assert not torch.equal(_run(qkv, offsets, t, 0.5, seed=5), _run(qkv, offsets, t, 0.5, seed=6))
    from benchmarks.bert.attention_triton import TritonFlashVarlen

    given = [TritonFlashVarlen.apply(*(y.view(t, HEADS, DIM) for y in qkv.chunk(3, -1)), offsets,
                                     max(LENGTHS), 0.5, torch.tensor([s], device=DEVICE))
             for s in (3, 3, 4)]   # a seed given (seeds.py's draw): its mask
    assert torch.equal(given[0], given[1]) and not torch.equal(given[0], given[2])


def test_heads_not_side_by_side_are_refused():
    from benchmarks.bert.attention_triton import TritonFlashVarlen

    qkv, offsets, t = _inputs()
    q = qkv.detach().view(t, 3 * HEADS, DIM).transpose(0, 1).contiguous().transpose(0, 1)
    with pytest.raises(ValueError, match="side by side"):
        TritonFlashVarlen.apply(q, q, q, offsets, max(LENGTHS), 0.0)
