"""Batch norm folded into cuDNN convolutions (``--cudnn-fusion``): fp16, channels-last.

Every bottleneck convolution runs as one cuDNN runtime-fusion graph

    y = conv(relu(x * scale + bias))    the previous batch norm's apply + ReLU (prologue)
    sum, sum_sq = per-channel sums of y  this batch norm's statistics (epilogue)

so the normalised activations are never written to memory. The statistics turn
into the next convolution's ``(scale, bias)`` through a few ops on C-length
vectors (:func:`bn_scale_bias`); autograd through those ops and through the sums
gives the exact batch-norm backward. A convolution's backward is cuDNN's data
gradient plus a weight gradient that recomputes the prologue inside the kernel;
the remaining element-wise ReLU/batch-norm backward work is left to torch.compile,
except at each bottleneck's end (:mod:`residual`).

cuDNN 9.19 on the H100 has fusion engines for fp16 only (none for bf16), so the
fused graphs need fp16 CUDA tensors and the ``nvidia-cudnn-frontend`` package.
Anywhere else (the CPU tests, fp32) the same ops run as plain PyTorch: that is
also the reference the fused path is checked against.
"""

from __future__ import annotations

import functools

import torch
import torch.nn.functional as F
from torch import Tensor, nn

CHANNELS_LAST = torch.channels_last


def _nhwc_strides(shape) -> list[int]:
    n, c, h, w = shape
    return [h * w * c, 1, w * c, c]


def _out_size(size: int, kernel: int, stride: int, padding: int) -> int:
    return (size + 2 * padding - kernel) // stride + 1


def _prologue(x: Tensor, scale: Tensor | None, bias: Tensor | None) -> Tensor:
    return x if scale is None else torch.relu(x * scale + bias)


def _uses_cudnn(x: Tensor) -> bool:
    return x.is_cuda and x.dtype == torch.float16


# -- cuDNN graphs -------------------------------------------------------------------------
@functools.cache
def cudnn_frontend():
    """The ``cudnn`` module, with PyTorch's cuDNN library already loaded for it to bind to."""
    torch.backends.cudnn.version()
    import cudnn

    return cudnn


@functools.cache
def _handle(device_index: int):
    return cudnn_frontend().create_handle()


class _Graph:
    """One built cuDNN graph and its tensor handles; ``run`` binds torch tensors and executes."""

    def __init__(self, build):
        cudnn = cudnn_frontend()
        self.device = torch.cuda.current_device()
        self.graph = cudnn.pygraph(io_data_type=cudnn.data_type.HALF,
                                   intermediate_data_type=cudnn.data_type.FLOAT,
                                   compute_data_type=cudnn.data_type.FLOAT,
                                   handle=_handle(self.device))
        self.tensors = build(self.graph, cudnn)
        self.graph.validate()
        self.graph.build_operation_graph()
        self.graph.create_execution_plans([cudnn.heur_mode.A, cudnn.heur_mode.FALLBACK])
        self.graph.check_support()
        self.graph.build_plans()
        self.workspace_size = self.graph.get_workspace_size()

    def run(self, **bound: Tensor) -> None:
        cudnn = cudnn_frontend()
        handle = _handle(self.device)
        cudnn.set_stream(handle=handle, stream=torch.cuda.current_stream().cuda_stream)
        workspace = torch.empty(self.workspace_size, device="cuda", dtype=torch.uint8)
        self.graph.execute({self.tensors[k]: t for k, t in bound.items()}, workspace,
                           handle=handle)


def _half_nhwc(g, cudnn, name: str, shape) -> object:
    return g.tensor(name=name, dim=list(shape), stride=_nhwc_strides(shape),
                    data_type=cudnn.data_type.HALF)


def _conv_geometry(stride: int, padding: int) -> dict:
    return dict(padding=[padding] * 2, stride=[stride] * 2, dilation=[1, 1])


def _input_tensors(g, cudnn, x_shape, prologue: bool):
    t = {"x": _half_nhwc(g, cudnn, "x", x_shape)}
    image = t["x"]
    if prologue:
        for name in ("scale", "bias"):
            t[name] = _half_nhwc(g, cudnn, name, (1, x_shape[1], 1, 1))
        image = g.relu(name="relu", input=g.bias(name="add_bias", input=g.scale(
            name="mul_scale", input=image, scale=t["scale"]), bias=t["bias"]))
    return t, image


@functools.cache
def _fprop_graph(x_shape, w_shape, stride: int, padding: int, prologue: bool) -> _Graph:
    def build(g, cudnn):
        t, image = _input_tensors(g, cudnn, x_shape, prologue)
        t["w"] = _half_nhwc(g, cudnn, "w", w_shape)
        t["y"] = g.conv_fprop(name="conv", image=image, weight=t["w"],
                              **_conv_geometry(stride, padding))
        t["y"].set_output(True).set_data_type(cudnn.data_type.HALF)
        t["sum"], t["sum_sq"] = g.genstats(name="stats", input=t["y"])
        for name in ("sum", "sum_sq"):
            t[name].set_output(True).set_data_type(cudnn.data_type.FLOAT)
        return t
    return _Graph(build)


@functools.cache
def _wgrad_graph(x_shape, dy_shape, w_shape, stride: int, padding: int,
                 prologue: bool) -> _Graph:
    def build(g, cudnn):
        t, image = _input_tensors(g, cudnn, x_shape, prologue)
        t["dy"] = _half_nhwc(g, cudnn, "dy", dy_shape)
        t["dw"] = g.conv_wgrad(name="wgrad", image=image, loss=t["dy"],
                               **_conv_geometry(stride, padding))
        t["dw"].set_output(True).set_dim(list(w_shape)).set_stride(_nhwc_strides(w_shape))
        t["dw"].set_data_type(cudnn.data_type.HALF)
        return t
    return _Graph(build)


def _prologue_args(scale, bias) -> dict:
    return {} if scale is None else {"scale": scale.contiguous(), "bias": bias.contiguous()}


# -- the two operators --------------------------------------------------------------------
@torch.library.custom_op("resnet::conv_stats", mutates_args=())
def conv_stats(x: Tensor, weight: Tensor, scale: Tensor | None, bias: Tensor | None,
               stride: int, padding: int) -> tuple[Tensor, Tensor, Tensor]:
    """``y = conv2d(relu(x * scale + bias))`` (no prologue when ``scale`` is None) and y's
    per-channel sum and sum of squares in fp32. ``y`` is channels-last."""
    if _uses_cudnn(x):
        x, weight = x.contiguous(memory_format=CHANNELS_LAST), weight.contiguous(
            memory_format=CHANNELS_LAST)
        graph = _fprop_graph(tuple(x.shape), tuple(weight.shape), stride, padding,
                             scale is not None)
        y = _empty_output(x, weight, stride, padding)
        total, total_sq = (torch.empty(weight.shape[0], device=x.device) for _ in range(2))
        graph.run(x=x, w=weight, y=y, sum=total, sum_sq=total_sq, **_prologue_args(scale, bias))
        return y, total, total_sq
    y = F.conv2d(_prologue(x, scale, bias), weight, stride=stride, padding=padding)
    y = y.contiguous(memory_format=CHANNELS_LAST)
    wide = y.to(stats_dtype(y.dtype))
    return y, wide.sum((0, 2, 3)), wide.square().sum((0, 2, 3))


def stats_dtype(dtype: torch.dtype) -> torch.dtype:
    """Statistics in fp32 for 16-bit activations (fp64 in the fp64 tests)."""
    return torch.promote_types(dtype, torch.float32)


def _empty_output(x: Tensor, weight: Tensor, stride: int, padding: int) -> Tensor:
    n, _, h, w = x.shape
    k, _, r, s = weight.shape
    shape = (n, k, _out_size(h, r, stride, padding), _out_size(w, s, stride, padding))
    return x.new_empty_strided(shape, _nhwc_strides(shape))


@conv_stats.register_fake
def _(x, weight, scale, bias, stride, padding):
    k, dtype = weight.shape[0], stats_dtype(x.dtype)
    return (_empty_output(x, weight, stride, padding),
            x.new_empty(k, dtype=dtype), x.new_empty(k, dtype=dtype))


@torch.library.custom_op("resnet::conv_wgrad", mutates_args=())
def conv_wgrad(x: Tensor, grad: Tensor, scale: Tensor | None, bias: Tensor | None,
               weight_shape: list[int], stride: int, padding: int) -> Tensor:
    """Weight gradient of :func:`conv_stats`'s convolution, the prologue recomputed."""
    if _uses_cudnn(x):
        x, grad = (t.contiguous(memory_format=CHANNELS_LAST) for t in (x, grad))
        graph = _wgrad_graph(tuple(x.shape), tuple(grad.shape), tuple(weight_shape), stride,
                             padding, scale is not None)
        dw = x.new_empty_strided(weight_shape, _nhwc_strides(weight_shape))
        graph.run(x=x, dy=grad, dw=dw, **_prologue_args(scale, bias))
        return dw
    dw = torch.nn.grad.conv2d_weight(_prologue(x, scale, bias), weight_shape, grad,
                                     stride=stride, padding=padding)
    return dw.contiguous(memory_format=CHANNELS_LAST)


@conv_wgrad.register_fake
def _(x, grad, scale, bias, weight_shape, stride, padding):
    return x.new_empty_strided(weight_shape, _nhwc_strides(weight_shape))


def _setup_context(ctx, inputs, output):
    x, weight, scale, bias, stride, padding = inputs
    ctx.save_for_backward(x, weight, scale, bias, output[0])
    ctx.stride, ctx.padding = stride, padding


def conv_stats_grads(grad_y: Tensor, grad_sum: Tensor, grad_sum_sq: Tensor, x: Tensor,
                     weight: Tensor, scale: Tensor | None, bias: Tensor | None, y: Tensor,
                     stride: int, padding: int) -> tuple:
    """Gradients of :func:`conv_stats`'s inputs ``(x, weight, scale, bias)`` from those of its
    outputs ``(y, sum, sum_sq)``; ``scale``'s and ``bias``'s are None without a prologue."""
    # The sums feed the batch-norm statistics: fold their gradients into y's (in fp32).
    per_channel = (1, -1, 1, 1)
    wide = stats_dtype(y.dtype)
    grad = grad_y.to(wide) + grad_sum.view(per_channel) + 2 * y.to(wide) * grad_sum_sq.view(
        per_channel)
    grad = grad.to(y.dtype).contiguous(memory_format=CHANNELS_LAST)
    # x stands in for the convolution's input (same shape and layout; dgrad reads neither)
    grad_image = torch.ops.aten.convolution_backward(
        grad, x, weight, None, [stride] * 2, [padding] * 2, [1, 1], False, [0, 0], 1,
        [True, False, False])[0]
    grad_weight = conv_wgrad(x, grad, scale, bias, list(weight.shape), stride, padding)
    if scale is None:
        return grad_image, grad_weight, None, None
    x_wide, scale_wide = x.to(wide), scale.to(wide)
    grad_pre = torch.where(x_wide * scale_wide + bias.to(wide) > 0, grad_image.to(wide), 0.0)
    grad_x = (grad_pre * scale_wide).to(x.dtype)
    grad_scale = (grad_pre * x_wide).sum((0, 2, 3), keepdim=True).to(scale.dtype)
    grad_bias = grad_pre.sum((0, 2, 3), keepdim=True).to(bias.dtype)
    return grad_x, grad_weight, grad_scale, grad_bias


def _backward(ctx, grad_y, grad_sum, grad_sum_sq):
    x, weight, scale, bias, y = ctx.saved_tensors
    return (*conv_stats_grads(grad_y, grad_sum, grad_sum_sq, x, weight, scale, bias, y,
                              ctx.stride, ctx.padding), None, None)


conv_stats.register_autograd(_backward, setup_context=_setup_context)


# -- batch norm around the fused convolutions --------------------------------------------
def bn_scale_bias(bn: nn.BatchNorm2d, total: Tensor, total_sq: Tensor, count: int,
                  dtype: torch.dtype) -> tuple[Tensor, Tensor]:
    """``bn`` as ``y * scale + bias`` (shape 1xCx1x1, ``dtype``): from the batch's sums in
    training, updating the running statistics as ``nn.BatchNorm2d`` does; from the running
    statistics in evaluation."""
    if bn.training:
        mean = total / count
        var = (total_sq / count - mean * mean).clamp_min(0)
        with torch.no_grad():
            bn.running_mean.lerp_(mean, bn.momentum)
            bn.running_var.lerp_(var * (count / (count - 1)), bn.momentum)
            bn.num_batches_tracked.add_(1)
    else:
        mean, var = bn.running_mean, bn.running_var
    scale = bn.weight * torch.rsqrt(var + bn.eps)
    bias = bn.bias - mean * scale
    return scale.view(1, -1, 1, 1).to(dtype), bias.view(1, -1, 1, 1).to(dtype)


def conv_bn(conv: nn.Conv2d, bn: nn.BatchNorm2d, x: Tensor, scale=None, bias=None):
    """``conv`` on ``x`` (through the prologue) and ``bn``'s (scale, bias) for its output."""
    weight = conv.weight.to(x.dtype)
    y, total, total_sq = conv_stats(x, weight, scale, bias, conv.stride[0], conv.padding[0])
    return (y, *bn_scale_bias(bn, total, total_sq, y.numel() // y.shape[1], x.dtype))
