"""``DeviceLRSGD``: its ``fused`` update against the plain multi-tensor one, and both against
``torch.optim.SGD``."""

import pytest
import torch

from common.sgd import DeviceLRSGD


@pytest.mark.parametrize("device", ["cpu", pytest.param("cuda", marks=pytest.mark.gpu)])
@pytest.mark.parametrize("momentum, weight_decay, nesterov", [
    (0.9, 1e-4, False), (0.9, 0.0, True), (0.0, 1e-2, False)])
def test_the_fused_update_equals_the_plain_one_and_torchs(momentum, weight_decay, nesterov,
                                                          device):
    if device == "cuda" and not torch.cuda.is_available():
        pytest.skip("needs a CUDA device")
    torch.manual_seed(0)
    nets = [torch.nn.Sequential(torch.nn.Linear(6, 5), torch.nn.Linear(5, 3)).to(device)
            for _ in range(3)]
    for net in nets[1:]:
        net.load_state_dict(nets[0].state_dict())

    def groups(net):   # biases at twice the rate and without weight decay, as Mask R-CNN's
        weights = [p for n, p in net.named_parameters() if n.endswith("weight")]
        biases = [p for n, p in net.named_parameters() if n.endswith("bias")]
        return [{"params": weights, "weight_decay": weight_decay},
                {"params": biases, "lr": lr * 2, "weight_decay": 0.0}]

    lr = torch.tensor(0.1, device=device)
    plain, fused = (DeviceLRSGD(groups(net), lr=lr, momentum=momentum, nesterov=nesterov,
                                fused=flag) for net, flag in zip(nets, (False, True)))
    lr = 0.1
    ref = torch.optim.SGD(groups(nets[2]), lr=lr, momentum=momentum, nesterov=nesterov)
    for _ in range(5):
        x = torch.randn(8, 6, device=device)
        for net, opt in zip(nets, (plain, fused, ref)):
            opt.zero_grad()
            net(x).square().mean().backward()
            opt.step()
    for p, q, r in zip(*(net.parameters() for net in nets)):
        assert not torch.equal(p, torch.zeros_like(p))
        torch.testing.assert_close(q, p, rtol=1e-6, atol=1e-6)
        torch.testing.assert_close(r, p, rtol=1e-5, atol=1e-5)


def test_fused_leaves_parameters_without_gradients_alone():
    a, b = torch.nn.Linear(3, 2), torch.nn.Linear(3, 2)
    before = b.weight.detach().clone()
    opt = DeviceLRSGD([*a.parameters(), *b.parameters()], lr=torch.tensor(0.5), momentum=0.9,
                      fused=True)
    a(torch.ones(1, 3)).sum().backward()
    opt.step()
    assert torch.equal(b.weight, before) and b.weight.grad is None
    assert not torch.equal(a.bias, torch.zeros_like(a.bias))
