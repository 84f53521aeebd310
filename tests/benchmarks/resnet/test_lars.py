import math

import torch

from benchmarks.resnet.lars import LARS, param_groups


def test_lars_step_matches_hand_computation():
    w = torch.nn.Parameter(torch.tensor([3.0, 4.0]))      # ||w|| = 5
    b = torch.nn.Parameter(torch.tensor([1.0]))
    w.grad = torch.tensor([0.6, 0.8])                      # ||g|| = 1
    b.grad = torch.tensor([2.0])
    lr, wd, eta, m = 0.1, 0.01, 0.001, 0.9
    opt = LARS([dict(params=[w], weight_decay=wd, lars=True),
                dict(params=[b], weight_decay=0.0, lars=False)],
               lr=lr, momentum=m, eta=eta)
    opt.step()
    trust = eta * 5 / (1 + wd * 5)
    v_w = [lr * trust * (0.6 + wd * 3), lr * trust * (0.8 + wd * 4)]
    assert torch.allclose(w.detach(), torch.tensor([3 - v_w[0], 4 - v_w[1]]), atol=1e-7)
    assert math.isclose(b.item(), 1 - lr * 2.0, abs_tol=1e-7)
    # second step: the momentum buffer carries over
    opt.step()
    w1 = [3 - v_w[0], 4 - v_w[1]]
    norm_w1 = math.hypot(*w1)
    trust2 = eta * norm_w1 / (1 + wd * norm_w1)
    v2 = [m * v_w[i] + lr * trust2 * ([0.6, 0.8][i] + wd * w1[i]) for i in range(2)]
    assert torch.allclose(w.detach(), torch.tensor([w1[0] - v2[0], w1[1] - v2[1]]), atol=1e-7)


def test_zero_grad_norm_uses_trust_one():
    w = torch.nn.Parameter(torch.tensor([1.0, 1.0]))
    w.grad = torch.zeros(2)
    LARS([dict(params=[w], weight_decay=0.5, lars=True)], lr=0.1, momentum=0.0).step()
    assert torch.allclose(w.detach(), torch.tensor([1 - 0.1 * 0.5] * 2))


def test_tensor_lr_equals_float_lr():
    torch.manual_seed(0)
    a, c = torch.nn.Parameter(torch.randn(4, 3)), torch.nn.Parameter(torch.randn(4, 3))
    c.data.copy_(a.data)
    grads = [torch.randn(4, 3) for _ in range(3)]
    oa = LARS([dict(params=[a], weight_decay=1e-4, lars=True)], lr=0.5)
    oc = LARS([dict(params=[c], weight_decay=1e-4, lars=True)], lr=torch.tensor(0.5))
    for g in grads:
        a.grad, c.grad = g.clone(), g.clone()
        oa.step()
        oc.step()
    assert torch.allclose(a, c)


def test_param_groups_exclude_bn_and_bias_from_decay():
    model = torch.nn.Sequential(torch.nn.Conv2d(3, 4, 3), torch.nn.BatchNorm2d(4),
                                torch.nn.Flatten(), torch.nn.Linear(4, 2))
    decay, no_decay = param_groups(model, 5e-5, lars=True)
    assert {id(p) for p in decay["params"]} == {id(model[0].weight), id(model[3].weight)}
    assert len(no_decay["params"]) == 4 and no_decay["weight_decay"] == 0.0
    assert no_decay["lars"] is False and decay["lars"] is True
