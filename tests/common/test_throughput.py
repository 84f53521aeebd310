import pytest
import torch

from common.cli import OneLineParser
from common.throughput import gpu_variants


def test_gpu_variants_needs_cuda_and_known_names(monkeypatch, capsys):
    p = OneLineParser(prog="tool")
    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    with pytest.raises(SystemExit) as exc:
        gpu_variants(p, "a", ("a", "b"))
    assert exc.value.code == 2 and "needs a CUDA device" in capsys.readouterr().err
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    assert gpu_variants(p, "b,a", ("a", "b")) == ["b", "a"]
    with pytest.raises(SystemExit):
        gpu_variants(p, "a,c", ("a", "b"))
    assert "unknown variant(s) ['c']; choose from a, b" in capsys.readouterr().err
