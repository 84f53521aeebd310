"""``bf16-weights`` against the fp32-weight path it replaces (the registry-wide test runs in
fp32, which bf16 weights do not): the residual stream stays bf16, and the tiny config's
training steps under amp-bf16 follow those of fp32 weights within bf16's rounding."""

import pytest
import torch

from benchmarks.bert.flat_lamb import LowPrecisionLayerNorm
from benchmarks.bert.model import swap_class
from benchmarks.bert.workload import BertWorkload
from common.dist import DistEnv
from common.precision import Precision
from common.training import build_parser
from tests.benchmarks.bert.test_model import _batch, built, fuse, unpad
from tests.benchmarks.test_optimisations import losses, tiny_argv


@pytest.mark.parametrize("fused", [False, True])
def test_bf16_weights_keep_the_residual_stream_bf16(fused):
    """bf16 weights under autocast: every LayerNorm returns bf16 (not autocast's fp32), and the
    outputs stay close to the fp32 model's."""
    torch.manual_seed(0)
    ref = built(unpad)
    low = built(lambda m: (unpad(m), fuse(m) if fused else None), ref)
    swap_class(low, torch.nn.LayerNorm, LowPrecisionLayerNorm)
    low.to(torch.bfloat16)
    seen = []
    for m in low.modules():
        if isinstance(m, torch.nn.LayerNorm):
            m.register_forward_hook(lambda mod, args, out: seen.append(out.dtype))
    with torch.autocast("cpu", torch.bfloat16):
        got = low(*_batch())
        want = ref(*_batch())
    if not fused:
        assert seen and set(seen) == {torch.bfloat16}
    for g, w in zip(got, want):
        assert g.dtype == torch.bfloat16
        torch.testing.assert_close(g.float(), w.float(), atol=0.05, rtol=0.05)


def _losses(items: list[str]) -> list[float]:
    torch.manual_seed(1)
    args = build_parser(BertWorkload).parse_args(
        [*tiny_argv("bert"), "--device", "cpu", "--precision", "amp-bf16", "--opt",
         ",".join(items)])
    wl = BertWorkload(args, DistEnv(device=torch.device("cpu")), Precision("amp-bf16", "cpu"))
    wl.setup()
    return losses(wl)


def test_bf16_weights_train_as_fp32_weights_do_under_amp_bf16():
    want = _losses(["flat-params"])
    got = _losses(["flat-params", "bf16-weights"])
    assert got != want   # the weights are bf16: not the same numbers
    torch.testing.assert_close(got, want, rtol=5e-4, atol=0)   # measured: 1.3e-4
