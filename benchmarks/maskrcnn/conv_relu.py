"""A convolution, its bias, an optional residual and a ReLU as one cuDNN kernel:
``relu(conv2d(x, weight) + bias [+ residual])``, the adds and the ReLU in the convolution's
epilogue (optimisation ``fused-conv-relu``: the folded backbone's convolutions with their
shift and residual, the RPN head's and the mask head's).

Compiled by Inductor, the plain form is a cuDNN convolution that writes its output, then a
Triton kernel that reads it back to add the bias (and residual) and apply the ReLU. Here the
forward is a custom operator calling aten's ``cudnn_convolution_relu`` and
``cudnn_convolution_add_relu``; its backward is plain aten (the ReLU's mask from the output,
``convolution_backward``), which AOTAutograd traces and Inductor fuses as it does the plain
form's. On the H100 (bf16, channels-last) the fused kernel took 0.44-0.74 of the pair's time
for ResNet-50's convolutions (docs/performance.md, Mask R-CNN). Off CUDA the
operator runs the plain form: the reference the CUDA path is tested against."""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from benchmarks.maskrcnn.frozen_bn import folded
from benchmarks.maskrcnn.model import Bottleneck, FrozenBatchNorm2d, MaskRCNN, ResNet50


def _memory_format(x: torch.Tensor) -> torch.memory_format:
    """The layout cuDNN gives the output: channels-last for a channels-last input."""
    return torch.channels_last if x.stride(1) == 1 and x.shape[1] > 1 else torch.contiguous_format


def plain_conv_bias_relu(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor,
                         residual: torch.Tensor | None = None, stride: int = 1,
                         padding: int = 0) -> torch.Tensor:
    """:func:`conv_bias_relu` as two ops, the convolution then the adds and ReLU: its
    reference, and its body off CUDA."""
    y = F.conv2d(x, weight, bias, stride, padding)
    return torch.relu(y if residual is None else y + residual)


@torch.library.custom_op("maskrcnn::conv_bias_relu", mutates_args=())
def _conv_bias_relu(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor,
                    residual: torch.Tensor | None, stride: int, padding: int) -> torch.Tensor:
    if not x.is_cuda:
        out = plain_conv_bias_relu(x, weight, bias, residual, stride, padding)
    elif residual is None:
        out = torch.cudnn_convolution_relu(x, weight, bias, [stride] * 2, [padding] * 2,
                                           [1, 1], 1)
    else:
        out = torch.cudnn_convolution_add_relu(x, weight, residual, 1.0, bias, [stride] * 2,
                                               [padding] * 2, [1, 1], 1)
    return out.contiguous(memory_format=_memory_format(x))


@_conv_bias_relu.register_fake
def _(x, weight, bias, residual, stride, padding):
    n, _, h, w = x.shape
    k = weight.shape[2]
    size = (n, weight.shape[0], (h + 2 * padding - k) // stride + 1,
            (w + 2 * padding - k) // stride + 1)
    return x.new_empty(size).contiguous(memory_format=_memory_format(x))


def _setup_context(ctx, inputs, output):
    x, weight, _, residual, ctx.stride, ctx.padding = inputs
    ctx.has_residual = residual is not None
    ctx.save_for_backward(x, weight, output)


def _backward(ctx, grad):
    x, weight, out = ctx.saved_tensors
    grad = torch.ops.aten.threshold_backward(grad, out, 0)
    dx, dw, db = torch.ops.aten.convolution_backward(
        grad, x, weight, [weight.shape[0]], [ctx.stride] * 2, [ctx.padding] * 2, [1, 1],
        False, [0, 0], 1, list(ctx.needs_input_grad[:3]))
    return dx, dw, db, grad if ctx.has_residual else None, None, None


_conv_bias_relu.register_autograd(_backward, setup_context=_setup_context)


def conv_bias_relu(x: torch.Tensor, weight: torch.Tensor, bias: torch.Tensor,
                   residual: torch.Tensor | None = None, stride: int = 1,
                   padding: int = 0) -> torch.Tensor:
    """``relu(conv2d(x, weight, bias, stride, padding) [+ residual])``, square stride and
    padding, no dilation or groups; under autocast the inputs are cast to its dtype first, as
    autocast casts a convolution's."""
    if torch.is_autocast_enabled(x.device.type):
        dtype = torch.get_autocast_dtype(x.device.type)
        x, weight, bias = x.to(dtype), weight.to(dtype), bias.to(dtype)
        residual = None if residual is None else residual.to(dtype)
    return _conv_bias_relu(x, weight, bias, residual, stride, padding)


def conv_relu(conv: nn.Conv2d, x: torch.Tensor) -> torch.Tensor:
    """``relu(conv(x))`` of a biased convolution module as :func:`conv_bias_relu`."""
    return conv_bias_relu(x, conv.weight, conv.bias, None, conv.stride[0], conv.padding[0])


def conv_bn_relu(conv: nn.Conv2d, bn: FrozenBatchNorm2d, x: torch.Tensor,
                 residual: torch.Tensor | None = None) -> torch.Tensor:
    """The folded convolution, its shift, ``residual`` and the ReLU as one cuDNN kernel."""
    return conv_bias_relu(x, *folded(conv, bn), residual, conv.stride[0], conv.padding[0])


def fuse(net: MaskRCNN) -> None:
    """Every convolution followed by a ReLU as one kernel: the folded backbone's (with their
    shift and residual), the RPN head's and the mask head's."""
    for m in net.backbone.modules():
        if isinstance(m, (ResNet50, Bottleneck)):
            m.conv_bn_relu = conv_bn_relu
    net.rpn.conv_relu = net.mask_features.conv_relu = conv_relu
