import pytest
import torch

from benchmarks.resnet.schedule import poly_warmup_lr

KW = dict(base_lr=10.0, end_lr=0.0001, warmup_steps=4, decay_steps=14, power=2)


@pytest.mark.parametrize("step,expected", [
    (0, 2.5), (1, 5.0), (3, 10.0),                 # linear warm-up
    (4, 10.0),                                     # decay starts at the base rate
    (9, 0.0001 + (10 - 0.0001) * 0.5 ** 2),        # half way through the decay
    (14, 0.0001), (100, 0.0001),                   # end rate, then held
])
def test_values(step, expected):
    assert poly_warmup_lr(step, **KW) == pytest.approx(expected, rel=1e-6)


def test_tensor_form_matches_float_form():
    steps = torch.arange(0, 20, dtype=torch.float32)
    got = poly_warmup_lr(steps, **KW)
    want = torch.tensor([poly_warmup_lr(int(s), **KW) for s in steps])
    assert torch.allclose(got, want, rtol=1e-6)


def test_decay_must_outlast_warmup():
    with pytest.raises(ValueError):
        poly_warmup_lr(0, 1.0, 0.0, warmup_steps=5, decay_steps=5)
