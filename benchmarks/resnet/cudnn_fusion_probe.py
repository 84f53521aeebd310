"""Probe for the next ResNet optimisation: cuDNN runtime fusion of the previous batch norm's
apply + ReLU into a convolution's input and the next batch norm's statistics into its output.

    python -m pip download --no-deps --only-binary=:all: --python-version 3.12 \\
        --platform manylinux_2_28_x86_64 -d .whl nvidia-cudnn-frontend==1.32.0
    # on the GPU machine (the wheel is 11.6 MB, carried in .whl/):
    pip install --no-deps --target /tmp/site .whl/nvidia_cudnn_frontend*.whl
    PYTHONPATH=/tmp/site:$PWD LD_LIBRARY_PATH=<site-packages>/nvidia/cudnn/lib \\
        python -m benchmarks.resnet.cudnn_fusion_probe --dtype fp16

For ResNet-50 layer shapes at batch 256 (NHWC) it builds one cuDNN graph
``relu(x * scale + bias) -> conv -> (sum, sum of squares) per channel``,
checks it against PyTorch, and times it against the same chain in eager
PyTorch. Not part of the training step yet: a diagnostic that says which
dtypes the installed cuDNN fuses and how fast.
"""

from __future__ import annotations

import argparse
import time

import torch
import torch.nn.functional as F

# (batch, in channels, height = width, out channels, kernel size) of ResNet-50 convolutions
SHAPES = ((256, 64, 56, 64, 3), (256, 64, 56, 256, 1), (256, 256, 56, 64, 1),
          (256, 128, 28, 128, 3), (256, 256, 14, 256, 3), (256, 512, 7, 2048, 1))


def ms_per_call(fn, iters: int = 50) -> float:
    for _ in range(5):
        fn()
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(iters):
        fn()
    torch.cuda.synchronize()
    return (time.perf_counter() - start) / iters * 1e3


def eager_chain(x, w, scale, bias):
    """The same chain in PyTorch: output and per-channel sums (fp32)."""
    out = F.conv2d(torch.relu(x * scale + bias), w, padding=w.shape[-1] // 2)
    return out, out.float().sum((0, 2, 3)), out.float().square().sum((0, 2, 3))


def fused_graph(cudnn, handle, x, w, scale, bias, y, sums, squares):
    """The cuDNN graph for one shape; returns a function that runs it (None: unsupported)."""
    dtype = cudnn.data_type.HALF if x.dtype == torch.float16 else cudnn.data_type.BFLOAT16
    g = cudnn.pygraph(io_data_type=dtype, intermediate_data_type=dtype,
                      compute_data_type=cudnn.data_type.FLOAT, handle=handle)
    X, W, S, B = (g.tensor(name=n, dim=t.size(), stride=t.stride(), data_type=t.dtype)
                  for n, t in (("X", x), ("W", w), ("S", scale), ("B", bias)))
    act = g.relu(name="relu", input=g.bias(name="bias", input=g.scale(name="scale", input=X,
                                                                        scale=S), bias=B))
    pad = w.shape[-1] // 2
    Y = g.conv_fprop(image=act, weight=W, padding=[pad, pad], stride=[1, 1], dilation=[1, 1])
    Y.set_output(True).set_data_type(dtype)
    SUM, SQ = g.genstats(name="genstats", input=Y)
    for t in (SUM, SQ):
        t.set_output(True).set_data_type(cudnn.data_type.FLOAT)
    try:
        g.validate()
        g.build_operation_graph()
        g.create_execution_plans([cudnn.heur_mode.A, cudnn.heur_mode.FALLBACK])
        g.check_support()
        g.build_plans()
    except Exception as exc:   # the frontend raises several types for "no engine"
        print(f"  unsupported: {str(exc).splitlines()[0][:100]}")
        return None
    workspace = torch.empty(g.get_workspace_size(), device="cuda", dtype=torch.uint8)
    pack = {X: x, W: w, S: scale, B: bias, Y: y, SUM: sums, SQ: squares}
    return lambda: g.execute(pack, workspace, handle=handle)


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--dtype", choices=("fp16", "bf16"), default="fp16")
    a = p.parse_args()
    import cudnn
    torch.backends.cudnn.benchmark = True
    handle = cudnn.create_handle()
    cudnn.set_stream(handle=handle, stream=torch.cuda.current_stream().cuda_stream)
    print(f"cudnn frontend {cudnn.__version__}, backend {cudnn.backend_version()}, {a.dtype}")
    dt = torch.float16 if a.dtype == "fp16" else torch.bfloat16
    cl = torch.channels_last
    for n, c, hw, k, r in SHAPES:
        x = torch.randn(n, c, hw, hw, device="cuda", dtype=dt).to(memory_format=cl)
        w = (torch.randn(k, c, r, r, device="cuda", dtype=dt) * 0.05).to(memory_format=cl)
        scale = (torch.rand(1, c, 1, 1, device="cuda", dtype=dt) + 0.5).to(memory_format=cl)
        bias = (torch.randn(1, c, 1, 1, device="cuda", dtype=dt) * 0.1).to(memory_format=cl)
        want, want_sums, _ = eager_chain(x, w, scale, bias)
        y = torch.empty_like(want)
        sums, squares = (torch.empty(1, k, 1, 1, device="cuda") for _ in range(2))
        print(f"{(n, c, hw, k, r)}:")
        run = fused_graph(cudnn, handle, x, w, scale, bias, y, sums, squares)
        if run is None:
            continue
        run()
        torch.cuda.synchronize()
        err = ((y.float() - want.float()).norm() / want.float().norm()).item()
        sum_err = ((sums.flatten() - want_sums).norm() / want_sums.norm()).item()
        eager = ms_per_call(lambda: eager_chain(x, w, scale, bias))  # noqa: B023 (called here)
        print(f"  eager {eager:.3f} ms, fused {ms_per_call(run):.3f} ms; relative "
              f"error: output {err:.1e}, sums {sum_err:.1e}")


if __name__ == "__main__":
    main()
