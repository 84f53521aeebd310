import pytest
import torch

from common.precision import DeviceLossScaler, Precision


def scaler(**kw) -> DeviceLossScaler:
    return DeviceLossScaler("cpu", enabled=True, init_scale=8.0, **kw)


def test_device_loss_scaler_is_only_enabled_for_amp_fp16():
    assert Precision("amp-fp16", "cpu").device_loss_scaler("cpu").enabled
    assert not Precision("amp-bf16", "cpu").device_loss_scaler("cpu").enabled


def test_scale_multiplies_the_loss():
    assert scaler().scale(torch.tensor(1.5)).item() == 12.0


def test_finite_grads_are_divided_exactly_and_not_flagged():
    grads = [torch.randn(3, 2), torch.randn(4), torch.randn(5).half()]
    before = [g.clone() for g in grads]
    unscaled, found_inf = scaler().unscale(grads)
    assert found_inf.item() == 0.0 and found_inf.dim() == 0
    assert all(torch.equal(u, g / 8) and u.dtype == g.dtype for u, g in zip(unscaled, grads))
    assert all(torch.equal(g, b) for g, b in zip(grads, before))


@pytest.mark.parametrize("bad", [float("inf"), float("nan")])
def test_non_finite_grad_is_flagged_and_every_unscaled_grad_zeroed(bad):
    grads = [torch.randn(3), torch.tensor([1.0, bad]).half()]
    unscaled, found_inf = scaler().unscale(grads)
    assert found_inf.item() == 1.0
    assert all(torch.equal(u, torch.zeros_like(g)) for u, g in zip(unscaled, grads))


@pytest.mark.parametrize("dtype, value", [(torch.float16, 100.0), (torch.float32, 3e37)])
def test_grad_that_overflows_when_unscaled_is_flagged(dtype, value):
    """After many back-offs the scale can fall below 1: a finite scaled gradient can then
    turn inf when divided by it, and the step must be skipped."""
    s = DeviceLossScaler("cpu", enabled=True, init_scale=2.0 ** -10)
    grads = [torch.randn(3), torch.tensor([1.0, value], dtype=dtype)]
    unscaled, found_inf = s.unscale(grads)
    assert found_inf.item() == 1.0
    assert all(torch.equal(u, torch.zeros_like(g)) for u, g in zip(unscaled, grads))


def test_update_backs_off_after_overflow_and_grows_after_clean_interval():
    s = scaler(growth_interval=3)
    s.update(torch.tensor(1.0))
    assert s.loss_scale.item() == 4.0
    for _ in range(2):
        s.update(torch.tensor(0.0))
    assert s.loss_scale.item() == 4.0
    s.update(torch.tensor(0.0))
    assert s.loss_scale.item() == 8.0 and s.growth_tracker.item() == 0


def test_disabled_scaler_is_a_pass_through():
    s = DeviceLossScaler("cpu", enabled=False)
    loss, grads = torch.tensor(2.0), [torch.tensor([1.0, float("inf")])]
    assert s.scale(loss) is loss
    unscaled, found_inf = s.unscale(grads)
    assert found_inf.item() == 0.0 and unscaled[0] is grads[0]
    s.update(torch.tensor(1.0))
    assert s.loss_scale.item() == 2.0 ** 16
