"""The workload's schedule, LR rule and optimizer against the reference's definitions."""

import torch

from benchmarks.unet3d.workload import HParams, Unet3DWorkload, lr_at
from common.sgd import DeviceLRSGD


def _args(**kw):
    return HParams(**kw)   # the reference's values where not given


def test_warmup_is_linear_per_epoch_from_the_initial_lr():
    a = _args()
    assert lr_at(1, a) == 1e-4 + (0.8 - 1e-4) / 200
    assert lr_at(100, a) == 1e-4 + (0.8 - 1e-4) * 0.5
    assert lr_at(200, a) == lr_at(201, a) == lr_at(4000, a) == 0.8


def test_decay_applies_after_the_boundary_epoch():
    a = _args(lr_warmup_epochs=0, lr_decay_epochs=[10, 20], lr_decay_factor=0.5)
    assert [lr_at(e, a) for e in (10, 11, 20, 21)] == [0.8, 0.4, 0.4, 0.2]


def test_evaluation_schedule_is_the_references(monkeypatch):
    monkeypatch.setattr(Unet3DWorkload, "steps_per_epoch", 84)
    wl = Unet3DWorkload.__new__(Unet3DWorkload)
    wl.hp = _args(epochs=1050)
    points = wl.eval_points()
    assert [(p.first_epoch_num, p.epoch_count) for p in points] == [(1, 1000), (1001, 20),
                                                                   (1021, 20), (1041, 10)]
    assert [p.epoch_num for p in points] == [1000, 1020, 1040, 1050]
    assert points[-1].step == 1050 * 84
    wl.hp = _args(epochs=5, start_eval_at=10)
    assert [(p.first_epoch_num, p.epoch_count) for p in wl.eval_points()] == [(1, 5)]


def test_device_lr_sgd_is_torch_nesterov_sgd():
    torch.manual_seed(0)
    a, b = torch.nn.Linear(4, 3), torch.nn.Linear(4, 3)
    b.load_state_dict(a.state_dict())
    ref = torch.optim.SGD(a.parameters(), lr=0.1, momentum=0.9, nesterov=True, weight_decay=0.01)
    ours = DeviceLRSGD(b.parameters(), lr=torch.tensor(0.1), momentum=0.9, nesterov=True,
                       weight_decay=0.01)
    for _ in range(5):
        x = torch.randn(8, 4)
        for model, opt in ((a, ref), (b, ours)):
            opt.zero_grad()
            model(x).square().sum().backward()
            opt.step()
    for p, q in zip(a.parameters(), b.parameters()):
        torch.testing.assert_close(q, p, rtol=1e-5, atol=1e-5)


def test_throughput_variants_come_from_the_registry():
    from benchmarks.unet3d.throughput import ours_variants

    variants = ours_variants()
    assert variants["plain"] == [] and variants["compiled"] == ["channels-last"]
    assert variants["config"] == ["channels-last", "fused-norm", "compile=default", "cuda-graph"]
    assert variants["config-minus-fused-norm"] == ["channels-last", "compile=default", "cuda-graph"]
    assert not any("sharded-eval" in items for items in variants.values())   # not the step's
