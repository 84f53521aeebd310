import copy

import pytest
import torch

from common.cuda_graph import GraphedStep


def make_step(model, opt):
    def step(x, y):
        opt.zero_grad(set_to_none=True)
        loss = torch.nn.functional.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        return loss.detach()
    return step


def run(step_fn, batches):
    return torch.stack([step_fn(x, y).clone() for x, y in batches])


def models(device):
    torch.manual_seed(0)
    a = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1))
    return a.to(device), copy.deepcopy(a).to(device)


def plain_and_graphed(device, warmup_steps):
    """The same SGD step twice from the same weights: plain, and through GraphedStep."""
    a, b = models(device)
    plain = make_step(a, torch.optim.SGD(a.parameters(), lr=0.1, momentum=0.9))
    graphed = GraphedStep(make_step(b, torch.optim.SGD(b.parameters(), lr=0.1, momentum=0.9)),
                          warmup_steps=warmup_steps)
    return plain, graphed


def batches(device, n=15):
    g = torch.Generator().manual_seed(1)
    return [(torch.randn(4, 8, generator=g).to(device), torch.randn(4, 1, generator=g).to(device))
            for _ in range(n)]


def test_eager_fallback_equals_plain_step():
    plain, graphed = plain_and_graphed("cpu", 2)
    data = batches("cpu")
    assert torch.equal(run(plain, data), run(graphed, data))
    assert not graphed.captured


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_captured_graph_equals_eager_on_gpu():
    plain, graphed = plain_and_graphed("cuda", 3)
    data = batches("cuda")
    want, got = run(plain, data), run(graphed, data)
    assert graphed.captured
    torch.testing.assert_close(got, want)


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_one_graph_per_input_shape_on_gpu():
    plain, graphed = plain_and_graphed("cuda", 3)
    g = torch.Generator().manual_seed(2)
    data = [(torch.randn(n, 8, generator=g).cuda(), torch.randn(n, 1, generator=g).cuda())
            for n in (4, 4, 4, 4, 6, 4, 6, 2, 6, 4, 2)]
    want, got = run(plain, data), run(graphed, data)
    assert sorted(k[0][0] for k in graphed.graphs) == [2, 4, 6]
    torch.testing.assert_close(got, want)
