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
from torch import nn

STAGE_DEPTHS = (3, 4, 6, 3)
STAGE_WIDTHS = (64, 128, 256, 512)
EXPANSION = 4


def _conv(cin: int, cout: int, k: int, stride: int = 1) -> nn.Conv2d:
    return nn.Conv2d(cin, cout, k, stride=stride, padding=k // 2, bias=False)


class Bottleneck(nn.Module):
    def __init__(self, cin: int, width: int, stride: int):
        super().__init__()
        cout = width * EXPANSION
        self.conv1, self.bn1 = _conv(cin, width, 1), nn.BatchNorm2d(width)
        self.conv2, self.bn2 = _conv(width, width, 3, stride), nn.BatchNorm2d(width)
        self.conv3, self.bn3 = _conv(width, cout, 1), nn.BatchNorm2d(cout)
        self.relu = nn.ReLU(inplace=True)
        self.has_shortcut = stride != 1 or cin != cout
        if self.has_shortcut:
            self.conv1sc, self.bnsc = _conv(cin, cout, 1, stride), nn.BatchNorm2d(cout)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.relu(self.bn2(self.conv2(out)))
        out = self.bn3(self.conv3(out))
        shortcut = self.bnsc(self.conv1sc(x)) if self.has_shortcut else x
        return self.relu(out + shortcut)


class ResNet50(nn.Module):
    def __init__(self, num_classes: int = 1000):
        super().__init__()
        self.conv0, self.bn0 = _conv(3, 64, 7, 2), nn.BatchNorm2d(64)
        self.relu = nn.ReLU(inplace=True)
        self.pool0 = nn.MaxPool2d(3, stride=2, padding=1)
        cin = 64
        for i, (depth, width) in enumerate(zip(STAGE_DEPTHS, STAGE_WIDTHS), 1):
            units = []
            for u in range(depth):
                units.append(Bottleneck(cin, width, stride=2 if (u == 0 and i > 1) else 1))
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
        x = self.pool0(self.relu(self.bn0(self.conv0(x))))
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
