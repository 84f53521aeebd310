"""``triton-sparse-sgd`` (``benchmarks/dlrm/sparse_triton.py``) against ``fused_sgd.sparse_sgd_``,
its reference: master rows and their low-precision copy after updates with repeated rows,
bf16 and fp32 gradients, a width that is not a power of two and a count of lookups that is
not a multiple of a program's. On the GPU, or on the CPU under Triton's interpreter
(``TRITON_INTERPRET=1`` with Triton installed)."""

import os

import pytest
import torch

from benchmarks.dlrm.fused_sgd import sparse_sgd_

INTERPRETED = os.environ.get("TRITON_INTERPRET") == "1"
pytestmark = [pytest.mark.gpu,
              pytest.mark.skipif(not (torch.cuda.is_available() or INTERPRETED),
                                 reason="needs CUDA (or TRITON_INTERPRET=1 and Triton)")]
DEVICE = "cuda" if torch.cuda.is_available() else "cpu"


def _tables(rows: int, dim: int, copy_dtype):
    g = torch.Generator().manual_seed(0)
    master = torch.randn(rows, dim, generator=g).to(DEVICE)
    copy = None if copy_dtype is None else master.to(copy_dtype)
    return master, copy


@pytest.mark.parametrize("dim", [128, 13])
@pytest.mark.parametrize("grad_dtype, copy_dtype", [(torch.bfloat16, torch.bfloat16),
                                                    (torch.float32, None)], ids=["bf16", "fp32"])
def test_triton_update_equals_the_reference(dim, grad_dtype, copy_dtype):
    from benchmarks.dlrm.sparse_triton import sparse_sgd_ as triton_sgd_

    g = torch.Generator().manual_seed(1)
    rows = torch.cat([torch.randint(0, 50, (1000,), generator=g),
                      torch.full((37,), 7)]).to(DEVICE)   # many repeats, one row often
    grads = torch.randn(len(rows), dim, generator=g).to(DEVICE, grad_dtype)
    lr = torch.tensor(0.3, device=DEVICE)
    want, want_copy = _tables(60, dim, copy_dtype)
    got, got_copy = _tables(60, dim, copy_dtype)
    for _ in range(3):
        sparse_sgd_(want, want_copy, rows, grads, lr)
        triton_sgd_(got, got_copy, rows, grads, lr)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    start = _tables(60, dim, None)[0]
    assert torch.equal(got[50:], start[50:]) and not torch.equal(got[:50], start[:50])
    if copy_dtype is not None:   # the interpreter truncates to bf16; a GPU rounds to nearest
        ulp = dict(rtol=2 ** -7, atol=0) if INTERPRETED else dict(rtol=0, atol=0)
        torch.testing.assert_close(got_copy, got.to(copy_dtype), **ulp)


def test_no_lookups_change_nothing():
    from benchmarks.dlrm.sparse_triton import sparse_sgd_ as triton_sgd_

    master, copy = _tables(5, 8, torch.bfloat16)
    before = master.clone()
    triton_sgd_(master, copy, torch.zeros(0, dtype=torch.long, device=DEVICE),
                torch.zeros(0, 8, device=DEVICE), torch.tensor(0.1, device=DEVICE))
    assert torch.equal(master, before)


def test_negative_rows_are_skipped():
    from benchmarks.dlrm.sparse_triton import sparse_sgd_ as triton_sgd_

    g = torch.Generator().manual_seed(2)
    rows = torch.randint(0, 40, (300,), generator=g)
    skip = torch.rand(300, generator=g) < 0.4
    grads = torch.randn(300, 128, generator=g).to(DEVICE, torch.bfloat16)
    lr = torch.tensor(0.3, device=DEVICE)
    want, want_copy = _tables(40, 128, torch.bfloat16)
    got, got_copy = _tables(40, 128, torch.bfloat16)
    sparse_sgd_(want, want_copy, rows[~skip].to(DEVICE), grads[~skip.to(DEVICE)], lr)
    triton_sgd_(got, got_copy, torch.where(skip, -1, rows).to(DEVICE), grads, lr)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)
    ulp = dict(rtol=2 ** -7, atol=0) if INTERPRETED else dict(rtol=0, atol=0)
    torch.testing.assert_close(got_copy, got.to(torch.bfloat16), **ulp)


def test_gradients_in_groups_are_read_in_place():
    """[B, T, d] gradients that are a slice of a wider [B, T + 3, d] (the interaction's
    backward hands the embeddings such a slice) update as their contiguous copy does."""
    from benchmarks.dlrm.sparse_triton import sparse_sgd_ as triton_sgd_
    from benchmarks.dlrm.sparse_triton import vector_groups

    g = torch.Generator().manual_seed(3)
    wide = torch.randn(64, 10, 128, generator=g).to(DEVICE, torch.bfloat16)
    grads = wide[:, 1:8]
    assert vector_groups(grads) is grads
    rows = torch.randint(0, 30, (64 * 7,), generator=g).to(DEVICE)
    lr = torch.tensor(0.1, device=DEVICE)
    want, want_copy = _tables(30, 128, torch.bfloat16)
    got, got_copy = _tables(30, 128, torch.bfloat16)
    sparse_sgd_(want, want_copy, rows, grads.reshape(-1, 128), lr)
    triton_sgd_(got, got_copy, rows, grads, lr)
    torch.testing.assert_close(got, want, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("grad_dtype, copy_dtype", [(torch.bfloat16, torch.bfloat16),
                                                    (torch.float32, None)], ids=["bf16", "fp32"])
def test_the_table_update_equals_the_reference(grad_dtype, copy_dtype):
    from benchmarks.dlrm.fused_sgd import table_sgd_
    from benchmarks.dlrm.sparse_triton import table_sgd_ as triton_table_sgd_

    g = torch.Generator().manual_seed(2)
    grad = torch.randn(300, 13, generator=g).to(DEVICE, grad_dtype)   # not a block's multiple
    lr = torch.tensor(0.3, device=DEVICE)
    want, want_copy = _tables(300, 13, copy_dtype)
    got, got_copy = _tables(300, 13, copy_dtype)
    for _ in range(3):
        table_sgd_(want, want_copy, grad, lr)
        triton_table_sgd_(got, got_copy, grad, lr)
    torch.testing.assert_close(got, want, rtol=1e-6, atol=1e-6)   # the same sums, maybe fused
    if copy_dtype is not None:   # the interpreter truncates to bf16; a GPU rounds to nearest
        ulp = dict(rtol=2 ** -7, atol=0) if INTERPRETED else dict(rtol=0, atol=0)
        torch.testing.assert_close(got_copy, got.to(copy_dtype), **ulp)
    with pytest.raises(ValueError, match="contiguous"):
        triton_table_sgd_(got.t(), None, grad.t(), lr)
