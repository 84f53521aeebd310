import pytest
import torch

from common.norms import stacked_norms


def _tensors():
    g = torch.Generator().manual_seed(0)
    return [torch.randn(3, 5, generator=g), torch.randn(7, generator=g).half(),
            torch.randn(2, 2, 2, generator=g) * 1e3]


@pytest.mark.parametrize("ord", [2.0, float("inf")])
def test_stacked_norms_equal_each_tensors_norm_in_fp32(ord):
    ts = _tensors()
    got = stacked_norms(ts, ord)
    want = torch.stack([torch.linalg.vector_norm(t.float(), ord) for t in ts])
    assert got.dtype == torch.float32
    torch.testing.assert_close(got, want)


def test_stacked_norms_keep_fp64():
    ts = [torch.randn(4, dtype=torch.float64), torch.randn(3)]
    got = stacked_norms(ts)
    assert got.dtype == torch.float64
    torch.testing.assert_close(got[0], torch.linalg.vector_norm(ts[0]))


def test_stacked_norms_flag_non_finite_values():
    ts = _tensors()
    ts[1][2] = float("inf")
    ts[2][0, 1, 1] = float("nan")
    assert stacked_norms(ts, float("inf")).isfinite().tolist() == [True, False, False]


def test_stacked_norms_compile_as_one_operator():
    ts = _tensors()
    torch.library.opcheck(stacked_norms, (ts, 2.0))
    compiled = torch.compile(lambda xs: stacked_norms(xs).sum() * 2, fullgraph=True)
    torch.testing.assert_close(compiled(ts), stacked_norms(ts).sum() * 2)


def test_stacked_norms_reject_an_empty_list():
    with pytest.raises(ValueError, match="at least one tensor"):
        stacked_norms([])
