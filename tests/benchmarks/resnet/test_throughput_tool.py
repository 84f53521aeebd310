import pytest
import torch

from benchmarks.resnet.throughput import TORCHVISION, ours_variants, variant_precisions
from common.throughput import tool_parser

KNOWN = [*ours_variants(), *TORCHVISION]


def _parser():
    return tool_parser("throughput", "", "plain", warmup=1, iters=1)


def test_each_variant_takes_its_own_precision_or_the_default(monkeypatch):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert variant_precisions(_parser(), "config@amp-fp16,torchvision-compile", "amp-bf16",
                              KNOWN) == [("config", "amp-fp16"),
                                         ("torchvision-compile", "amp-bf16")]
    assert "torchvision-compile-max" in KNOWN


def test_ours_are_the_registrys_ablation_of_the_config_without_its_input():
    """The config's step: the optimisations of the 1xH100 config that act on the step (the
    configs' --cudnn-fusion --space-to-depth, compiled with autotuning, one CUDA graph)."""
    variants = ours_variants()
    assert variants["plain"] == []
    assert sorted(variants["config"]) == sorted(
        ["channels-last", "space-to-depth", "compile=max-autotune-no-cudagraphs",
         "cuda-graph", "cudnn-fusion"])
    assert "cudnn-fusion" not in variants["config-minus-channels-last"]   # it requires it
    assert not any(k.startswith("config-minus-turbo") for k in variants)


@pytest.mark.parametrize("text, message", [
    ("torchvision-compile@fp8", "unknown precision(s) ['fp8']"),
    ("torchvision-jit@amp-fp16", "unknown variant(s) ['torchvision-jit']"),
])
def test_bad_variant_or_precision_is_one_line_error(monkeypatch, capsys, text, message):
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    with pytest.raises(SystemExit) as exc:
        variant_precisions(_parser(), text, "amp-bf16", KNOWN)
    assert exc.value.code == 2 and message in capsys.readouterr().err
