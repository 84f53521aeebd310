"""ResNet-50 v1.5, as the MLPerf reference defines it.

v1.5: the stride of a down-sampling bottleneck sits on its 3x3 convolution,
not on the first 1x1. The last BN of every bottleneck starts with gamma = 0,
so each residual block starts as an identity. Module names follow the MXNet
tensor names that MLPerf's ``weights_initialization`` events use
(``conv0``, ``bn0``, ``stage1_unit1_conv1``, ``..._conv1sc``/``_bnsc`` for the
projection shortcut, ``fc1``).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from common.fusion import compiled

STAGE_DEPTHS = (3, 4, 6, 3)
STAGE_WIDTHS = (64, 128, 256, 512)
EXPANSION = 4


def _conv(cin: int, cout: int, k: int, stride: int = 1) -> nn.Conv2d:
    return nn.Conv2d(cin, cout, k, stride=stride, padding=k // 2, bias=False)


def _wide(x: torch.Tensor) -> torch.Tensor:
    """``x`` in at least fp32 (bf16/fp16 activations are normalised in fp32)."""
    return x.to(torch.promote_types(x.dtype, torch.float32))


def channel_var_mean(x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    """Biased variance and mean of every channel of ``x`` [N, C, H, W], at least in fp32."""
    return torch.var_mean(_wide(x), dim=(0, 2, 3), correction=0)


def scale_shift_act(x, scale, shift, residual: torch.Tensor | None, relu: bool):
    """``relu(x * scale + shift + residual)`` per channel, in ``x``'s dtype (math in fp32)."""
    y = torch.addcmul(shift[:, None, None], _wide(x), scale[:, None, None])
    if residual is not None:
        y = y + _wide(residual)
    return (F.relu(y) if relu else y).to(x.dtype)


def fused_batch_norm_act(bn: nn.BatchNorm2d, x, residual=None, relu: bool = True):
    """``bn`` (batch statistics in training, running ones in eval), then the residual add and
    ReLU, as two Inductor kernels forward (statistics; normalise+add+ReLU) that read the
    channels-last activations in place; the running statistics update as ``bn`` would."""
    if bn.training:
        var, mean = compiled(channel_var_mean)(x)
        with torch.no_grad():
            n = x.numel() // x.shape[1]
            bn.running_mean.lerp_(mean, bn.momentum)
            bn.running_var.lerp_(var * (n / max(n - 1, 1)), bn.momentum)
            bn.num_batches_tracked.add_(1)
    else:
        var, mean = bn.running_var, bn.running_mean
    # plain views: Dynamo would specialise a Parameter's shape (a graph per channel count)
    scale = torch.rsqrt(var + bn.eps) * bn.weight.view(-1)
    shift = bn.bias.view(-1) - mean * scale
    return compiled(scale_shift_act)(x, scale, shift, residual, relu)


class Bottleneck(nn.Module):
    def __init__(self, cin: int, width: int, stride: int, fused_bn: bool = False):
        super().__init__()
        cout = width * EXPANSION
        self.conv1, self.bn1 = _conv(cin, width, 1), nn.BatchNorm2d(width)
        self.conv2, self.bn2 = _conv(width, width, 3, stride), nn.BatchNorm2d(width)
        self.conv3, self.bn3 = _conv(width, cout, 1), nn.BatchNorm2d(cout)
        self.relu = nn.ReLU(inplace=True)
        self.fused_bn = fused_bn
        self.has_shortcut = stride != 1 or cin != cout
        if self.has_shortcut:
            self.conv1sc, self.bnsc = _conv(cin, cout, 1, stride), nn.BatchNorm2d(cout)

    def _norm(self, bn: nn.BatchNorm2d, x, residual=None, relu: bool = True):
        """``relu(bn(x) + residual)``: eager modules, or fused kernels with ``fused_bn``."""
        if self.fused_bn:
            return fused_batch_norm_act(bn, x, residual, relu)
        y = bn(x) if residual is None else bn(x) + residual
        return self.relu(y) if relu else y

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self._norm(self.bn1, self.conv1(x))
        out = self._norm(self.bn2, self.conv2(out))
        shortcut = self._norm(self.bnsc, self.conv1sc(x), relu=False) if self.has_shortcut else x
        return self._norm(self.bn3, self.conv3(out), shortcut)


class ResNet50(nn.Module):
    """``fused_bn``: every batch norm (+ residual add + ReLU) as ``fused_batch_norm_act``."""

    def __init__(self, num_classes: int = 1000, fused_bn: bool = False):
        super().__init__()
        self.fused_bn = fused_bn
        self.conv0, self.bn0 = _conv(3, 64, 7, 2), nn.BatchNorm2d(64)
        self.relu = nn.ReLU(inplace=True)
        self.pool0 = nn.MaxPool2d(3, stride=2, padding=1)
        cin = 64
        for i, (depth, width) in enumerate(zip(STAGE_DEPTHS, STAGE_WIDTHS), 1):
            units = []
            for u in range(depth):
                units.append(Bottleneck(cin, width, 2 if (u == 0 and i > 1) else 1, fused_bn))
                cin = width * EXPANSION
            setattr(self, f"stage{i}", nn.Sequential(*units))
        self.pool1 = nn.AdaptiveAvgPool2d(1)
        self.fc1 = nn.Linear(cin, num_classes)
        self.reset_parameters()

    def reset_parameters(self) -> None:
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")
            elif isinstance(m, nn.BatchNorm2d):
                nn.init.ones_(m.weight)
                nn.init.zeros_(m.bias)
        for m in self.modules():
            if isinstance(m, Bottleneck):
                nn.init.zeros_(m.bn3.weight)
        nn.init.normal_(self.fc1.weight, std=0.01)
        nn.init.zeros_(self.fc1.bias)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.conv0(x)
        x = fused_batch_norm_act(self.bn0, x) if self.fused_bn else self.relu(self.bn0(x))
        x = self.pool0(x)
        x = self.stage4(self.stage3(self.stage2(self.stage1(x))))
        return self.fc1(torch.flatten(self.pool1(x), 1))


def mllog_tensor_name(param_name: str, is_norm: bool) -> str:
    """``stage1.0.bn1.weight`` -> ``stage1_unit1_bn1_gamma`` (the MLPerf ruleset's naming)."""
    parts = param_name.split(".")
    if len(parts) == 4:  # stageN.<unit index>.<layer>.<param>
        parts = [parts[0], f"unit{int(parts[1]) + 1}", parts[2], parts[3]]
    if is_norm:
        parts[-1] = {"weight": "gamma", "bias": "beta"}[parts[-1]]
    return "_".join(parts)


def mllog_tensor_names(model: nn.Module) -> list[str]:
    norm_params = {f"{mn}.{pn}" if mn else pn
                   for mn, m in model.named_modules()
                   if isinstance(m, nn.modules.batchnorm._BatchNorm)
                   for pn, _ in m.named_parameters(recurse=False)}
    return [mllog_tensor_name(n, n in norm_params) for n, _ in model.named_parameters()]
