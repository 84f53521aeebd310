import math

import pytest
import torch

from benchmarks.resnet.lars import LARS, param_groups
from common.precision import DeviceLossScaler


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


def _two_group_lars(seed: int, momentum: float = 0.9):
    """A LARS group and a plain momentum group, one step already taken (momentum buffers set)."""
    torch.manual_seed(seed)
    w, b = torch.nn.Parameter(torch.randn(4, 3)), torch.nn.Parameter(torch.randn(3))
    opt = LARS([dict(params=[w], weight_decay=1e-4, lars=True),
                dict(params=[b], weight_decay=0.0, lars=False)],
               lr=torch.tensor(0.5), momentum=momentum)
    w.grad, b.grad = torch.randn(4, 3), torch.randn(3)
    opt.step()
    w.grad, b.grad = torch.randn(4, 3), torch.randn(3)
    return opt, [w, b]


def _state(opt, params):
    return [p.detach().clone() for p in params] + \
        [opt.state[p]["momentum_buffer"].clone() for p in params]


def _bit_equal(xs, ys):
    return all(torch.equal(x.view(torch.int32), y.view(torch.int32)) for x, y in zip(xs, ys))


def test_skip_one_leaves_params_and_momentum_bit_identical():
    opt, params = _two_group_lars(0)
    before = _state(opt, params)
    opt.step(skip=torch.tensor(1.0))
    assert _bit_equal(_state(opt, params), before)


@pytest.mark.parametrize("momentum", [0.9, 0.0])
def test_skip_zero_is_bit_identical_to_a_step_without_skip(momentum):
    opt_a, params_a = _two_group_lars(1, momentum)
    opt_b, params_b = _two_group_lars(1, momentum)
    opt_a.step()
    opt_b.step(skip=torch.tensor(0.0))
    assert _bit_equal(_state(opt_a, params_a), _state(opt_b, params_b))


def test_overflowed_step_through_the_scaler_is_skipped():
    opt, params = _two_group_lars(2)
    before = _state(opt, params)
    params[0].grad[1, 2] = float("inf")
    scaler = DeviceLossScaler("cpu", enabled=True)
    grads, found_inf = scaler.unscale([p.grad for p in params])
    opt.step(skip=found_inf, grads=grads)
    after = _state(opt, params)
    assert found_inf.item() == 1.0 and _bit_equal(after, before)
    assert all(t.isfinite().all() for t in after)


@pytest.mark.parametrize("overflow", [False, True])
def test_compiled_update_equals_eager(overflow):
    """The workload compiles unscale + overflow check + LARS + scale update as one graph."""
    runs = []
    for compiled in (False, True):
        opt, params = _two_group_lars(3)
        params[0].grad *= 2.0 ** 16
        params[1].grad *= 2.0 ** 16
        if overflow:
            params[1].grad[0] = float("nan")
        scaler = DeviceLossScaler("cpu", enabled=True)

        def update(opt, params, scaler):
            grads, found_inf = scaler.unscale([p.grad for p in params])
            opt.step(skip=found_inf, grads=grads)
            scaler.update(found_inf)

        (torch.compile(update, fullgraph=True) if compiled else update)(opt, params, scaler)
        runs.append(_state(opt, params) + [scaler.loss_scale.clone()])
    eager, compiled = runs
    torch.testing.assert_close(compiled, eager, rtol=1e-6, atol=0)
    assert eager[-1].item() == (2.0 ** 15 if overflow else 2.0 ** 16)


def test_given_grads_replace_p_grad_bit_for_bit():
    opt_a, params_a = _two_group_lars(4)
    opt_b, params_b = _two_group_lars(4)
    given = [2 * p.grad for p in params_b]
    for p in params_a:
        p.grad *= 2
    opt_a.step()
    opt_b.step(grads=given)
    assert _bit_equal(_state(opt_a, params_a), _state(opt_b, params_b))
    assert all(torch.equal(2 * p.grad, g) for p, g in zip(params_b, given))


def test_given_grads_must_match_the_parameters():
    opt, params = _two_group_lars(5)
    with pytest.raises(ValueError, match="1 gradients for 2 parameters"):
        opt.step(grads=[params[0].grad])
