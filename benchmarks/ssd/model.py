"""SSD300 with a ResNet-34 backbone, as the MLPerf Training 1.1 reference defines it
(mlcommons/training ``single_stage_detector/ssd``: ``ssd300.py``, ``base_model.py``).

Backbone: torchvision's ResNet-34 up to ``layer3`` (conv4_x), with the stride of
``layer3``'s first block (its ``conv1`` and ``downsample`` convolution) set to 1,
so a 300x300 image gives 38x38x256 features; ``layer4`` and the classifier are
dropped. Module names are torchvision's, so its ``resnet34`` state dict loads
(:meth:`ResNet34Backbone.load_torchvision`).

Five additional blocks, each a 1x1 convolution then a 3x3 one (both with bias
and ReLU, no batch norm), give the 19, 10, 5, 3 and 1 feature maps; the 3x3 is
stride 2 padding 1 for the first three and stride 1 padding 0 for the last two.
Each of the six maps has a 3x3 location head (4 per default box) and a 3x3
confidence head (one score per class and default box), with 4, 6, 6, 6, 4, 4
default boxes per position: 8732 boxes. The extra blocks' and the heads' weights
are Xavier-uniform, their biases PyTorch's default; the backbone is initialised
as torchvision does (the reference then loads ImageNet weights into it).
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
from torch import nn

NUM_CLASSES = 81                      # 80 COCO categories and background (label 0)
NUM_DEFAULTS = (4, 6, 6, 6, 4, 4)     # default boxes per position of each feature map
WIDTH = 64                            # ResNet-34's stem width; every channel count scales with it


def out_channels(width: int = WIDTH) -> tuple[int, ...]:
    """Channels of the six feature maps: 256, 512, 512, 256, 256, 256 at full width."""
    return tuple(width * m for m in (4, 8, 8, 4, 4, 4))


def transition_channels(width: int = WIDTH) -> tuple[int, ...]:
    """Channels of the additional blocks' 1x1 convolutions: 256, 256, 128, 128, 128."""
    return tuple(width * m for m in (4, 4, 2, 2, 2))


class BasicBlock(nn.Module):
    """torchvision's ResNet basic block (two 3x3 convolutions and a residual)."""

    def __init__(self, cin: int, cout: int, stride: int, downsample: bool):
        super().__init__()
        self.conv1 = nn.Conv2d(cin, cout, 3, stride=stride, padding=1, bias=False)
        self.bn1 = nn.BatchNorm2d(cout)
        self.relu = nn.ReLU(inplace=True)
        self.conv2 = nn.Conv2d(cout, cout, 3, padding=1, bias=False)
        self.bn2 = nn.BatchNorm2d(cout)
        self.downsample = (nn.Sequential(nn.Conv2d(cin, cout, 1, stride=stride, bias=False),
                                         nn.BatchNorm2d(cout)) if downsample else None)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.relu(self.bn1(self.conv1(x)))
        out = self.bn2(self.conv2(out))
        shortcut = x if self.downsample is None else self.downsample(x)
        return self.relu(out + shortcut)


def _layer(cin: int, cout: int, blocks: int, stride: int) -> nn.Sequential:
    units = [BasicBlock(cin, cout, stride, downsample=stride != 1 or cin != cout)]
    units += [BasicBlock(cout, cout, 1, downsample=False) for _ in range(blocks - 1)]
    return nn.Sequential(*units)


class ResNet34Backbone(nn.Module):
    """ResNet-34 through ``layer3``; ``layer3`` keeps the resolution of ``layer2`` (the
    reference's ``_ModifyBlock(stride=(1, 1))``), but still widens, so its first block
    keeps the 1x1 projection, at stride 1."""

    def __init__(self, width: int = WIDTH):
        super().__init__()
        self.conv1 = nn.Conv2d(3, width, 7, stride=2, padding=3, bias=False)
        self.bn1 = nn.BatchNorm2d(width)
        self.relu = nn.ReLU(inplace=True)
        self.maxpool = nn.MaxPool2d(3, stride=2, padding=1)
        self.layer1 = _layer(width, width, 3, stride=1)
        self.layer2 = _layer(width, 2 * width, 4, stride=2)
        self.layer3 = _layer(2 * width, 4 * width, 6, stride=1)
        for m in self.modules():
            if isinstance(m, nn.Conv2d):
                nn.init.kaiming_normal_(m.weight, mode="fan_out", nonlinearity="relu")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = self.maxpool(self.relu(self.bn1(self.conv1(x))))
        return self.layer3(self.layer2(self.layer1(x)))

    def load_torchvision(self, state_dict: Mapping[str, torch.Tensor]) -> None:
        """Load a torchvision ``resnet34`` state dict (its ``layer4`` and ``fc`` are unused)."""
        own = self.state_dict()
        self.load_state_dict({k: v for k, v in state_dict.items() if k in own})


class SSD300(nn.Module):
    """``forward(images [B, 3, 300, 300])`` -> ``(locs [B, 4, 8732], confs [B, C, 8732])``,
    the reference's layout: box index = feature map offset + (default box * H + y) * W + x,
    the order of :func:`benchmarks.ssd.boxes.dboxes300_coco`. ``width`` scales every channel
    count (64: the reference's); a smaller one keeps the code path for CPU fixtures."""

    def __init__(self, num_classes: int = NUM_CLASSES, width: int = WIDTH):
        super().__init__()
        self.num_classes = num_classes
        self.backbone = ResNet34Backbone(width)
        chans = out_channels(width)
        # 38 -> 19 -> 10 -> 5 by stride 2, then 5 -> 3 -> 1 by unpadded 3x3 convolutions
        self.additional_blocks = nn.ModuleList(
            nn.Sequential(
                nn.Conv2d(cin, mid, kernel_size=1),
                nn.ReLU(inplace=True),
                nn.Conv2d(mid, cout, kernel_size=3, padding=1 if i < 3 else 0,
                          stride=2 if i < 3 else 1),
                nn.ReLU(inplace=True))
            for i, (cin, mid, cout) in enumerate(
                zip(chans[:-1], transition_channels(width), chans[1:])))
        self.loc = nn.ModuleList(nn.Conv2d(c, nd * 4, kernel_size=3, padding=1)
                                 for nd, c in zip(NUM_DEFAULTS, chans))
        self.conf = nn.ModuleList(nn.Conv2d(c, nd * num_classes, kernel_size=3, padding=1)
                                  for nd, c in zip(NUM_DEFAULTS, chans))
        for layer in [*self.additional_blocks, *self.loc, *self.conf]:
            for param in layer.parameters():
                if param.dim() > 1:
                    nn.init.xavier_uniform_(param)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        x = self.backbone(x)
        features = [x]
        for block in self.additional_blocks:
            x = block(x)
            features.append(x)
        b = x.shape[0]
        locs = torch.cat([loc(f).reshape(b, 4, -1) for f, loc in zip(features, self.loc)], 2)
        return locs, self.scores(features)

    def scores(self, features: list[torch.Tensor]) -> torch.Tensor:
        """The confidence heads' scores ``[B, C, 8732]`` of the six feature maps."""
        b = features[0].shape[0]
        return torch.cat([conf(f).reshape(b, self.num_classes, -1)
                          for f, conf in zip(features, self.conf)], 2)


def mllog_parameter_names(model: SSD300) -> dict[str, str]:
    """Each trainable parameter -> its ``weights_initialization`` tensor name.

    The 1.1.0 ruleset (``closed_ssd.yaml``) spells the 119 names of NVIDIA's MXNet
    submission: ``resnetmlperf0_conv0``/``batchnorm0`` for the stem, then per stage the
    Gluon counters ``stageN_convK``/``batchnormK`` in creation order (a block's two 3x3
    convolutions, then its projection), ``expand_trans_convI``/``expand_convI`` for the
    additional blocks, and one ``convpredictorI_conv0`` per feature map, which fuses the
    confidence and location heads: ``conf[I]`` and ``loc[I]`` both map to that name.
    """
    names = {"backbone.conv1.weight": "resnetmlperf0_conv0_weight",
             "backbone.bn1.weight": "resnetmlperf0_batchnorm0_gamma",
             "backbone.bn1.bias": "resnetmlperf0_batchnorm0_beta"}
    for s in (1, 2, 3):
        k = 0
        for b, block in enumerate(getattr(model.backbone, f"layer{s}")):
            prefix, stage = f"backbone.layer{s}.{b}", f"resnetmlperf0_stage{s}"
            pairs = [("conv1", "bn1"), ("conv2", "bn2")]
            if block.downsample is not None:
                pairs.append(("downsample.0", "downsample.1"))
            for conv, bn in pairs:
                names[f"{prefix}.{conv}.weight"] = f"{stage}_conv{k}_weight"
                names[f"{prefix}.{bn}.weight"] = f"{stage}_batchnorm{k}_gamma"
                names[f"{prefix}.{bn}.bias"] = f"{stage}_batchnorm{k}_beta"
                k += 1
    for i in range(len(model.additional_blocks)):
        for layer, name in ((0, "expand_trans_conv"), (2, "expand_conv")):
            for p in ("weight", "bias"):
                names[f"additional_blocks.{i}.{layer}.{p}"] = f"{name}{i}_{p}"
    for head in ("loc", "conf"):
        for i in range(len(NUM_DEFAULTS)):
            for p in ("weight", "bias"):
                names[f"{head}.{i}.{p}"] = f"convpredictor{i}_conv0_{p}"
    return {param: f"ssd0_{name}" for param, name in names.items()}


def mllog_tensor_names(model: SSD300) -> list[str]:
    """The ruleset's tensor names, each once, in module order (the fused heads' once)."""
    return list(dict.fromkeys(mllog_parameter_names(model).values()))
