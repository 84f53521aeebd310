import pytest
import torch

from benchmarks.resnet.throughput import VARIANTS, variant_precisions
from common.throughput import tool_parser


def _parser():
    return tool_parser("throughput", "", "ours", warmup=1, iters=1)


def test_each_variant_takes_its_own_precision_or_the_default(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert variant_precisions(_parser(), "ours-fused-max@amp-fp16,torchvision-compile",
                              "amp-bf16") == [("ours-fused-max", "amp-fp16"),
                                              ("torchvision-compile", "amp-bf16")]
    assert "torchvision-compile-max" in VARIANTS


@pytest.mark.parametrize("text, message", [
    ("torchvision-compile@fp8", "unknown precision(s) ['fp8']"),
    ("torchvision-jit@amp-fp16", "unknown variant(s) ['torchvision-jit']"),
])
def test_bad_variant_or_precision_is_one_line_error(monkeypatch, capsys, text, message):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    with pytest.raises(SystemExit) as exc:
        variant_precisions(_parser(), text, "amp-bf16")
    assert exc.value.code == 2 and message in capsys.readouterr().err
