"""``FlatParameters.backward`` (``common/flat_params.py``): the gradients it writes into the
buffer equal autograd's own accumulation, over micro-batches, with a parameter that gets no
gradient, whatever the buffer held before a step's first micro-batch."""

import torch

from common.flat_params import FlatParameters


def _model():
    torch.manual_seed(0)
    return torch.nn.ModuleDict({
        "net": torch.nn.Sequential(torch.nn.Linear(7, 5), torch.nn.LayerNorm(5),
                                   torch.nn.Linear(5, 3)),
        "unused": torch.nn.Linear(2, 2)})   # no gradient from the loss


def _loss(model, seed):
    x = torch.randn(4, 7, generator=torch.Generator().manual_seed(seed))
    return model["net"](x).square().sum()


def test_backward_writes_what_autograd_accumulates():
    plain, fast = _model(), _model()
    flat = FlatParameters(fast)
    for step in range(2):
        plain.zero_grad()
        flat.grad.fill_(7.0)                  # stale: a step's first micro-batch overwrites
        for micro in range(3):
            _loss(plain, 10 * step + micro).backward()
            flat.backward(_loss(fast, 10 * step + micro), accumulate=micro > 0)
        for (name, p), q, view in zip(plain.named_parameters(), flat.params, flat.grads):
            want = p.grad if p.grad is not None else torch.zeros_like(p)
            torch.testing.assert_close(q.grad, want, rtol=1e-6, atol=1e-7, msg=name)
            assert q.grad is view, name       # the buffer's view again
    assert fast["unused"].weight.grad.abs().sum() == 0
