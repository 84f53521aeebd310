"""One-pass and two-stage top-K against ``torch.topk`` (distinct scores) and against a stable
descending sort, which puts equal scores in index order (tied scores)."""

import pytest
import torch

from benchmarks.maskrcnn.topk import ordered_topk, split_topk


def stable_topk(scores, k):
    """The tie rule spelt as a sort: descending, equal scores in index order."""
    values, indices = scores.sort(dim=1, descending=True, stable=True)
    return values[:, :k], indices[:, :k]


def assert_same(result, expected):
    values, indices = result
    assert indices.dtype == torch.int64
    assert torch.equal(indices, expected[1])
    assert torch.equal(values, expected[0])
    assert values.dtype == expected[0].dtype


# (row length, k): k within a chunk, k above a chunk's length, k equal to the row, a row
# that the chunk count does not divide, and k = 0
CASES = [(1000, 50), (1000, 400), (997, 997), (37, 20), (10, 0), (5, 5)]


@pytest.mark.parametrize("num_chunks", [1, 2, 3, 4, 7])
@pytest.mark.parametrize(("length", "k"), CASES)
def test_equals_torch_topk_on_distinct_scores(num_chunks, length, k):
    g = torch.Generator().manual_seed(length + k)
    scores = torch.randperm(3 * length, generator=g)[:length].float().sub(length) / 7
    scores = scores.reshape(1, -1).repeat(3, 1)
    scores[1] = scores[1].flip(0)
    scores[2] = torch.randn(length, generator=g) * 1e3          # negatives and positives
    expected = torch.topk(scores, k, dim=1)
    assert_same(split_topk(scores, k, num_chunks), expected)
    assert_same(ordered_topk(scores, k), expected)


@pytest.mark.parametrize("num_chunks", [1, 2, 4, 5])
@pytest.mark.parametrize(("length", "k"), CASES)
def test_ties_rank_by_lower_index(num_chunks, length, k):
    g = torch.Generator().manual_seed(length)
    scores = torch.randint(-3, 4, (4, length), generator=g).float() / 2
    scores[1] = 0.0                                             # all tied
    scores[2, ::3] = float("inf")
    scores[2, 1::3] = -float("inf")
    scores[3] = torch.where(scores[3] == 0, torch.tensor(-0.0), scores[3])  # -0.0 equals 0.0
    expected = stable_topk(scores, k)
    assert_same(split_topk(scores, k, num_chunks), expected)
    assert_same(ordered_topk(scores, k), expected)


@pytest.mark.parametrize("dtype", [torch.float16, torch.bfloat16])
def test_half_precision_scores(dtype):
    g = torch.Generator().manual_seed(3)
    scores = torch.rand(2, 500, generator=g).to(dtype)           # many ties once rounded
    expected = stable_topk(scores, 300)
    assert_same(split_topk(scores, 300, 4), expected)
    assert_same(ordered_topk(scores, 300), expected)


def test_bad_arguments():
    scores = torch.rand(2, 10)
    for call in (lambda: split_topk(scores, 11), lambda: ordered_topk(scores, -1),
                 lambda: split_topk(scores[0], 3), lambda: split_topk(scores, 3, 0),
                 lambda: ordered_topk(scores.double(), 3),
                 lambda: split_topk(torch.arange(10)[None], 3)):
        with pytest.raises(ValueError):
            call()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_cuda_equals_cpu():
    g = torch.Generator().manual_seed(0)
    scores = torch.randint(0, 50, (8, 200_003), generator=g).float()
    expected = stable_topk(scores, 2000)
    for result in (split_topk(scores.cuda(), 2000, 4), ordered_topk(scores.cuda(), 2000)):
        assert_same(tuple(t.cpu() for t in result), expected)
