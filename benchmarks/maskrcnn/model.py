"""The network modules of the MLPerf Training 1.1 Mask R-CNN R50-FPN (mlcommons/training
``object_detection/pytorch/maskrcnn_benchmark``: ``layers/batch_norm.py``,
``modeling/backbone/{resnet,fpn,backbone}.py``, ``modeling/make_layers.py``,
``modeling/rpn/rpn.py``, ``modeling/roi_heads/{box_head,mask_head}/*``; sizes from
``configs/e2e_mask_rcnn_R_50_FPN_1x.yaml`` and ``config/defaults.py``).

- Backbone: ResNet-50 with frozen batch norm everywhere; the stem and ``layer1`` are frozen
  too (``FREEZE_CONV_BODY_AT: 2``). Module names are torchvision's, so its ``resnet50``
  state dict loads (:func:`load_torchvision_backbone`). The reference's default
  ``STRIDE_IN_1X1: True`` suits its MSRA Caffe2 weights; torchvision's weights were trained
  with the stride in the 3x3 convolution, so that is the default here (``stride_in_1x1``
  selects the reference's placement).
- FPN: 1x1 lateral and 3x3 output convolutions of 256 channels on C2..C5, nearest x2
  top-down upsampling, and P6 = max-pool(kernel 1, stride 2) of P5. Image sides must be
  multiples of 32 (``SIZE_DIVISIBILITY``), as the reference's upsampling by a fixed factor 2
  assumes. The upsampling is a broadcast (:func:`upsample_nearest_2x`): its gradient sums
  each 2 x 2 block, where ``F.interpolate``'s, as Inductor compiles it, scatters into an
  fp32 buffer with atomic adds.
- RPN head: one 3x3 convolution and ReLU shared over the levels, then 3 objectness logits
  and 12 box deltas per location.
- Box head: RoIAlign 7x7 on P2..P5, fc6 and fc7 of 1024 with ReLU, then 81 class scores and
  81 x 4 class-specific box deltas.
- Mask head: RoIAlign 14x14, four 3x3 convolutions of 256 with ReLU, a 2x2 stride-2
  transposed convolution and ReLU, then 81 mask logits of 28x28.

A convolution followed by its batch norm, or by a ReLU, is computed through a module's
``conv_bn``, ``conv_bn_relu`` or ``conv_relu`` attribute, the plain functions below: the
optimisations replace them (:mod:`benchmarks.maskrcnn.frozen_bn`,
:mod:`benchmarks.maskrcnn.conv_relu`), and the stem and the heads' output layers likewise
(:mod:`benchmarks.maskrcnn.stem`, :mod:`benchmarks.maskrcnn.aligned_outputs`).

Every width is an argument of :class:`MaskRCNN` (the ResNet's base ``width``, the FPN's
channels, the box head's and the mask head's widths), the reference's sizes by default, so a
tiny configuration shrinks the network without changing its code path.

Initialisation is the reference's: backbone, FPN and fc6/fc7 Kaiming-uniform with ``a=1``
(Caffe2's XavierFill), the RPN normal(0.01), the box predictor normal(0.01) for scores and
normal(0.001) for deltas, the mask head Kaiming-normal (fan-out, ReLU; Caffe2's MSRAFill);
every bias 0.
"""

from __future__ import annotations

from collections.abc import Mapping

import torch
import torch.nn.functional as F
from torch import nn

from benchmarks.maskrcnn.anchors import ASPECT_RATIOS
from benchmarks.maskrcnn.roi_align import BOX_RESOLUTION, MASK_RESOLUTION, Pooler
from common.errors import UserError

NUM_CLASSES = 81                    # 80 COCO categories and background
STAGE_BLOCKS = (3, 4, 6, 3)         # ResNet-50's bottlenecks in layer1..layer4
WIDTH = 64                          # ResNet-50's base width: the stem's channels and
                                    # layer1's bottleneck width (layer k: 2^(k-1) x, out 4 x)
FREEZE_AT = 2                       # stem (stage 0) and layer1 (stage 1) are not trained
BN_EPS = 1e-5                       # torchvision's BatchNorm2d eps (see FrozenBatchNorm2d)
FPN_CHANNELS = 256
NUM_ANCHORS = len(ASPECT_RATIOS)    # anchors per location and level
MLP_HEAD_DIM = 1024
MASK_CONV_LAYERS = (256, 256, 256, 256)
EXPANSION = 4                       # a bottleneck's output channels over its width


class FrozenBatchNorm2d(nn.Module):
    """Batch norm with fixed statistics and affine terms, all buffers (never trained):
    ``y = (x - running_mean) * weight / sqrt(running_var + eps) + bias``.

    The reference computes ``weight * rsqrt(running_var)``, without eps: its Caffe2 weights
    carry only a folded scale and shift (``_bn.s``, ``_bn.b``), leaving running_var at 1.
    torchvision's weights carry real statistics, trained with eps 1e-5, so that is the
    default; ``eps=0`` is the reference's arithmetic."""

    def __init__(self, num_features: int, eps: float = BN_EPS):
        super().__init__()
        self.eps = eps
        self.register_buffer("weight", torch.ones(num_features))
        self.register_buffer("bias", torch.zeros(num_features))
        self.register_buffer("running_mean", torch.zeros(num_features))
        self.register_buffer("running_var", torch.ones(num_features))

    def scale_shift(self) -> tuple[torch.Tensor, torch.Tensor]:
        """Per channel, ``y = x * scale + shift``."""
        scale = self.weight * (self.running_var + self.eps).rsqrt()
        return scale, self.bias - self.running_mean * scale

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        scale, shift = self.scale_shift()
        return x * scale[:, None, None] + shift[:, None, None]

    def extra_repr(self) -> str:
        return f"{len(self.weight)}, eps={self.eps}"


def _kaiming_uniform(module: nn.Module) -> nn.Module:
    """Caffe2's XavierFill as the reference spells it: Kaiming-uniform ``a=1``, bias 0."""
    nn.init.kaiming_uniform_(module.weight, a=1)
    if module.bias is not None:
        nn.init.zeros_(module.bias)
    return module


def _normal(module: nn.Module, std: float) -> nn.Module:
    nn.init.normal_(module.weight, std=std)
    nn.init.zeros_(module.bias)
    return module


def _msra(module: nn.Module) -> nn.Module:
    """Caffe2's MSRAFill: Kaiming-normal over the fan-out for ReLU, bias 0."""
    nn.init.kaiming_normal_(module.weight, mode="fan_out", nonlinearity="relu")
    nn.init.zeros_(module.bias)
    return module


def _conv(cin: int, cout: int, kernel: int, stride: int = 1) -> nn.Conv2d:
    return _kaiming_uniform(nn.Conv2d(cin, cout, kernel, stride, padding=kernel // 2,
                                      bias=False))


def conv_bn(conv: nn.Conv2d, bn: FrozenBatchNorm2d, x: torch.Tensor) -> torch.Tensor:
    """The convolution, then the frozen batch norm."""
    return bn(conv(x))


def conv_bn_relu(conv: nn.Conv2d, bn: FrozenBatchNorm2d, x: torch.Tensor,
                 residual: torch.Tensor | None = None) -> torch.Tensor:
    """``relu(bn(conv(x)) [+ residual])``."""
    y = conv_bn(conv, bn, x)
    return F.relu(y if residual is None else y + residual)


def conv_relu(conv: nn.Conv2d, x: torch.Tensor) -> torch.Tensor:
    """``relu(conv(x))``."""
    return F.relu(conv(x))


class Bottleneck(nn.Module):
    """1x1, 3x3, 1x1 convolutions, each with frozen batch norm, plus a residual that a
    strided 1x1 projection carries where the width changes."""

    def __init__(self, cin: int, mid: int, cout: int, stride: int, stride_in_1x1: bool):
        super().__init__()
        self.conv_bn, self.conv_bn_relu = conv_bn, conv_bn_relu
        stride_1x1, stride_3x3 = (stride, 1) if stride_in_1x1 else (1, stride)
        self.conv1 = _conv(cin, mid, 1, stride_1x1)
        self.bn1 = FrozenBatchNorm2d(mid)
        self.conv2 = _conv(mid, mid, 3, stride_3x3)
        self.bn2 = FrozenBatchNorm2d(mid)
        self.conv3 = _conv(mid, cout, 1)
        self.bn3 = FrozenBatchNorm2d(cout)
        self.downsample = (nn.Sequential(_conv(cin, cout, 1, stride), FrozenBatchNorm2d(cout))
                           if cin != cout else None)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        out = self.conv_bn_relu(self.conv1, self.bn1, x)
        out = self.conv_bn_relu(self.conv2, self.bn2, out)
        shortcut = x if self.downsample is None else self.conv_bn(*self.downsample, x)
        return self.conv_bn_relu(self.conv3, self.bn3, out, shortcut)


class ResNet50(nn.Module):
    """``forward(images [N, 3, H, W])`` -> ``[C2, C3, C4, C5]`` at strides 4, 8, 16 and 32,
    with ``out_channels`` channels: 256, 512, 1024 and 2048 at the reference ``width`` 64
    (``4 * width * 2^k`` in general)."""

    def __init__(self, stride_in_1x1: bool = False, freeze_at: int = FREEZE_AT,
                 width: int = WIDTH):
        super().__init__()
        self.conv_bn_relu = conv_bn_relu
        self.conv1 = _conv(3, width, 7, stride=2)
        self.bn1 = FrozenBatchNorm2d(width)
        cin = width
        for index, blocks in enumerate(STAGE_BLOCKS, 1):
            mid = width * 2 ** (index - 1)
            cout = EXPANSION * mid
            stride = 1 if index == 1 else 2
            layer = [Bottleneck(cin, mid, cout, stride, stride_in_1x1)]
            layer += [Bottleneck(cout, mid, cout, 1, stride_in_1x1) for _ in range(blocks - 1)]
            self.add_module(f"layer{index}", nn.Sequential(*layer))
            cin = cout
        self.out_channels = tuple(EXPANSION * width * 2 ** k for k in range(len(STAGE_BLOCKS)))
        for stage in self.stages()[:freeze_at]:
            for module in stage:
                module.requires_grad_(False)

    def stages(self) -> list[list[nn.Module]]:
        """The modules of stage 0 (the stem) to stage 4 (``layer4``)."""
        return [[self.conv1, self.bn1], [self.layer1], [self.layer2], [self.layer3],
                [self.layer4]]

    def stem(self, x: torch.Tensor) -> torch.Tensor:
        """``relu(bn1(conv1(x)))``."""
        return self.conv_bn_relu(self.conv1, self.bn1, x)

    def forward(self, x: torch.Tensor) -> list[torch.Tensor]:
        x = self.stem(x)
        x = F.max_pool2d(x, kernel_size=3, stride=2, padding=1)
        features = []
        for layer in (self.layer1, self.layer2, self.layer3, self.layer4):
            x = layer(x)
            features.append(x)
        return features


def upsample_nearest_2x(x: torch.Tensor) -> torch.Tensor:
    """``F.interpolate(x, scale_factor=2, mode="nearest")`` of [N, C, H, W] as a broadcast,
    in ``x``'s memory format (channels-last or contiguous)."""
    n, c, h, w = x.shape
    if x.is_contiguous():
        return x[:, :, :, None, :, None].expand(n, c, h, 2, w, 2).reshape(n, c, 2 * h, 2 * w)
    nhwc = x.permute(0, 2, 3, 1)[:, :, None, :, None].expand(n, h, 2, w, 2, c)
    return nhwc.reshape(n, 2 * h, 2 * w, c).permute(0, 3, 1, 2)


class FPN(nn.Module):
    """``forward([C2, C3, C4, C5])`` -> ``[P2, P3, P4, P5, P6]``, each ``channels`` wide at
    strides 4 to 64."""

    def __init__(self, in_channels: tuple[int, ...] = (256, 512, 1024, 2048),
                 channels: int = FPN_CHANNELS):
        super().__init__()
        self.inner_blocks = nn.ModuleList(
            _kaiming_uniform(nn.Conv2d(c, channels, 1)) for c in in_channels)
        self.layer_blocks = nn.ModuleList(
            _kaiming_uniform(nn.Conv2d(channels, channels, 3, padding=1)) for _ in in_channels)

    def forward(self, features: list[torch.Tensor]) -> list[torch.Tensor]:
        inner = self.inner_blocks[-1](features[-1])
        results = [self.layer_blocks[-1](inner)]
        for level in reversed(range(len(features) - 1)):
            inner = (self.inner_blocks[level](features[level])
                     + upsample_nearest_2x(inner))
            results.insert(0, self.layer_blocks[level](inner))
        results.append(F.max_pool2d(results[-1], kernel_size=1, stride=2))
        return results


class RPNHead(nn.Module):
    """``forward(levels)`` -> ``(objectness, deltas)``: per level ``[N, A, H, W]`` logits
    and ``[N, 4A, H, W]`` box deltas, the same weights on every level."""

    def __init__(self, channels: int = FPN_CHANNELS, num_anchors: int = NUM_ANCHORS):
        super().__init__()
        self.conv = _normal(nn.Conv2d(channels, channels, 3, padding=1), 0.01)
        self.cls_logits = _normal(nn.Conv2d(channels, num_anchors, 1), 0.01)
        self.bbox_pred = _normal(nn.Conv2d(channels, 4 * num_anchors, 1), 0.01)
        self.conv_relu = conv_relu

    def forward(self, levels: list[torch.Tensor]
                ) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
        hidden = [self.conv_relu(self.conv, x) for x in levels]
        return [self.cls_logits(h) for h in hidden], [self.bbox_pred(h) for h in hidden]


class BoxFeatureExtractor(nn.Module):
    """The reference's ``FPN2MLPFeatureExtractor``: ``forward(levels, rois [K, 5])`` ->
    ``[K, 1024]``, RoIAlign 7x7 on P2..P5 (a P6 passed along is not pooled), flattened,
    then fc6 and fc7 with ReLU."""

    def __init__(self, channels: int = FPN_CHANNELS, hidden: int = MLP_HEAD_DIM):
        super().__init__()
        self.pooler = Pooler(BOX_RESOLUTION)
        self.fc6 = _kaiming_uniform(nn.Linear(channels * BOX_RESOLUTION ** 2, hidden))
        self.fc7 = _kaiming_uniform(nn.Linear(hidden, hidden))

    def forward(self, levels: list[torch.Tensor], rois: torch.Tensor) -> torch.Tensor:
        x = self.pooler(levels[:len(self.pooler.scales)], rois).flatten(1)
        return F.relu(self.fc7(F.relu(self.fc6(x))))


class BoxPredictor(nn.Module):
    """The reference's ``FPNPredictor``: ``forward(x [K, 1024])`` -> ``(scores [K, 81],
    deltas [K, 81 * 4])``, one box per class."""

    def __init__(self, hidden: int = MLP_HEAD_DIM, num_classes: int = NUM_CLASSES):
        super().__init__()
        self.cls_score = _normal(nn.Linear(hidden, num_classes), 0.01)
        self.bbox_pred = _normal(nn.Linear(hidden, 4 * num_classes), 0.001)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        return self.cls_score(x), self.bbox_pred(x)


class MaskFeatureExtractor(nn.Module):
    """The reference's ``MaskRCNNFPNFeatureExtractor``: ``forward(levels, rois [K, 5])`` ->
    ``[K, 256, 14, 14]``, RoIAlign 14x14 on P2..P5 then four 3x3 convolutions with ReLU."""

    def __init__(self, channels: int = FPN_CHANNELS, layers: tuple[int, ...] = MASK_CONV_LAYERS):
        super().__init__()
        self.pooler = Pooler(MASK_RESOLUTION)
        self.convs = nn.ModuleList(_msra(nn.Conv2d(cin, cout, 3, padding=1))
                                   for cin, cout in zip((channels, *layers[:-1]), layers))
        self.conv_relu = conv_relu

    def forward(self, levels: list[torch.Tensor], rois: torch.Tensor) -> torch.Tensor:
        x = self.pooler(levels[:len(self.pooler.scales)], rois)
        for conv in self.convs:
            x = self.conv_relu(conv, x)
        return x


class MaskPredictor(nn.Module):
    """The reference's ``MaskRCNNC4Predictor`` on FPN: ``forward(x [K, 256, 14, 14])`` ->
    ``[K, 81, 28, 28]`` mask logits, one mask per class."""

    def __init__(self, channels: int = MASK_CONV_LAYERS[-1], num_classes: int = NUM_CLASSES):
        super().__init__()
        self.conv5_mask = _msra(nn.ConvTranspose2d(channels, channels, 2, stride=2))
        self.mask_fcn_logits = _msra(nn.Conv2d(channels, num_classes, 1))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        x = F.relu(self.conv5_mask(x))
        return self.mask_fcn_logits(x)


class MaskRCNN(nn.Module):
    """The networks of Mask R-CNN, each with its own forward; :meth:`features` runs the
    backbone and FPN. It has no ``forward`` of its own: the proposal selection, target
    matching, losses and post-processing that connect the heads (the reference's
    ``GeneralizedRCNN.forward``) are :class:`benchmarks.maskrcnn.detector.Detector`'s.

    ``width`` is the ResNet's base width, ``fpn_channels`` the FPN's and the RPN head's,
    ``box_head_dim`` the width of fc6 and fc7, ``mask_head_dim`` that of the mask head's four
    convolutions and its transposed convolution; the defaults are the reference's."""

    def __init__(self, stride_in_1x1: bool = False, num_classes: int = NUM_CLASSES,
                 width: int = WIDTH, fpn_channels: int = FPN_CHANNELS,
                 box_head_dim: int = MLP_HEAD_DIM, mask_head_dim: int = MASK_CONV_LAYERS[-1]):
        super().__init__()
        self.backbone = ResNet50(stride_in_1x1, width=width)
        self.fpn = FPN(self.backbone.out_channels, fpn_channels)
        self.rpn = RPNHead(fpn_channels)
        self.box_features = BoxFeatureExtractor(fpn_channels, box_head_dim)
        self.box_predictor = BoxPredictor(box_head_dim, num_classes)
        self.mask_features = MaskFeatureExtractor(
            fpn_channels, (mask_head_dim,) * len(MASK_CONV_LAYERS))
        self.mask_predictor = MaskPredictor(mask_head_dim, num_classes)

    def features(self, images: torch.Tensor) -> list[torch.Tensor]:
        """FPN levels ``[P2, ..., P6]`` of padded images [N, 3, H, W] (H, W multiples of 32)."""
        return self.fpn(self.backbone(images))


TORCHVISION_FORMAT = ("a torchvision resnet50 state dict (keys conv1.weight, bn1.weight, "
                      "bn1.bias, bn1.running_mean, bn1.running_var, layer1.0.conv1.weight, ..., "
                      "layer1.0.downsample.0.weight, ..., layer4.2.bn3.running_var; fc.* and "
                      "*.num_batches_tracked are ignored)")


def load_torchvision_backbone(model: MaskRCNN, state_dict: Mapping[str, torch.Tensor]) -> None:
    """Load torchvision's ``resnet50`` ImageNet weights into ``model.backbone``; raise a
    :class:`UserError` naming the expected format on any missing, unexpected or misshapen
    tensor."""
    state = {k: v for k, v in state_dict.items()
             if not k.startswith("fc.") and not k.endswith(".num_batches_tracked")}
    own = model.backbone.state_dict()
    problems = [f"{what}: {', '.join(keys[:3])}{', ...' if len(keys) > 3 else ''}"
                for what, keys in (
                    ("missing", sorted(own.keys() - state.keys())),
                    ("unexpected", sorted(state.keys() - own.keys())),
                    ("wrong shape", sorted(k for k in own.keys() & state.keys()
                                           if state[k].shape != own[k].shape)))
                if keys]
    if problems:
        raise UserError(f"backbone checkpoint is not {TORCHVISION_FORMAT}: "
                        + "; ".join(problems))
    model.backbone.load_state_dict(state)


def mllog_tensor_modules(model: MaskRCNN) -> dict[str, nn.Module]:
    """The ``weights_initialization`` tensor names of the 1.1.0 ruleset
    (``closed_maskrcnn.yaml``), each with the module whose weight and bias it names. Block 1
    of the FPN is C2's; the mask predictor's ``fcn5`` is its transposed convolution."""
    names = {}
    for i, (inner, layer) in enumerate(zip(model.fpn.inner_blocks, model.fpn.layer_blocks), 1):
        names[f"FPN_inner_block{i}"] = inner
        names[f"FPN_layer_block{i}"] = layer
    names.update(RPNHead_conv=model.rpn.conv, RPNHead_cls=model.rpn.cls_logits,
                 RPNHead_bbox=model.rpn.bbox_pred,
                 ROI_BOX_FEATURE_EXTRACTOR_fc6=model.box_features.fc6,
                 ROI_BOX_FEATURE_EXTRACTOR_fc7=model.box_features.fc7,
                 ROI_BOX_PREDICTOR_cls=model.box_predictor.cls_score,
                 ROI_BOX_PREDICTOR_bbox=model.box_predictor.bbox_pred)
    for i, conv in enumerate(model.mask_features.convs, 1):
        names[f"ROI_MASK_FEATURE_EXTRACTOR_fcn{i}"] = conv
    names.update(ROI_MASK_PREDICTOR_fcn5=model.mask_predictor.conv5_mask,
                 ROI_MASK_PREDICTOR_fcn_logits=model.mask_predictor.mask_fcn_logits)
    return names


def mllog_tensor_names(model: MaskRCNN) -> list[str]:
    """The ruleset's tensor names in module order."""
    return list(mllog_tensor_modules(model))
