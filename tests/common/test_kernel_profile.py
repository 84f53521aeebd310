import types

import pytest
import torch

from common.kernel_profile import (
    family,
    idle_by_host_op,
    idle_by_region,
    kernel_launches,
    kernel_times,
    overlap_summary,
    region,
    region_host_times,
    region_times,
)


def test_kernel_names_fall_into_families():
    assert family("sm90_xmma_wgrad_indexed_implicit_gemm_bf16") == "conv/gemm"
    assert family("triton_poi_fused__native_batch_norm_legit_functional_add_relu_18") == \
        "triton-fused"
    # Inductor names kernels after the ops it fused, convolution_backward included
    assert family("triton_poi_fused__native_batch_norm_legit_functional_add_convolution_"
                  "backward_native_batch_norm_backward_threshold_backward_61") == "triton-fused"
    assert family("void cudnn::batchnorm_bwtr_nhwc_semiPersist<__half, float, __half>") == \
        "batchnorm"
    assert family("void at::native::multi_tensor_apply_kernel<...>") == "optimizer (foreach)"
    assert family("void at::native::batch_norm_collect_statistics_channels_last_kernel") == \
        "batchnorm"
    assert family("ncclDevKernel_AllReduce_Sum_bf16_RING_LL") == "communication"
    assert family("void at::native::vectorized_elementwise_kernel<8, add>") == \
        "elementwise/reduce"
    assert family("memcpy") == "other"
    assert family("void pytorch_flash::flash_bwd_dq_dk_dv_loop_seqk_parallel_kernel<"
                  "Flash_bwd_kernel_traits<64, 128, 128, 8, cutlass::bfloat16_t>>") == "attention"
    assert family("cudnn_generated_fort_native_sdpa_sm90_flash_fprop_wgmma_f16") == "attention"
    assert family("void at::native::indexSelectLargeIndex<float, long>") == "embedding/gather"


def test_regions_are_profiler_ranges_and_sum_their_device_time_per_step():
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        for _ in range(2):
            with region("step"), region("features"):
                torch.ones(3).sum()
    names = {e.name for e in prof.events()}
    assert {"region:step", "region:features"} <= names
    host = region_host_times(prof.events(), steps=2)
    assert host["step"] >= host["features"] > 0, host

    def event(name, device_us, host_us=0.0, device="CPU"):
        return types.SimpleNamespace(
            name=name, device_time_total=device_us,
            time_range=types.SimpleNamespace(elapsed_us=lambda: host_us),
            device_type=types.SimpleNamespace(name=device))
    events = [event("region:loss", 30.0, 100.0), event("region:loss", 50.0, 300.0),
              event("region:joint", 8.0, 6.0), event("aten::add", 99.0, 99.0),
              event("region:odd", 7.0, 7.0, device="CUDA")]
    assert region_times(events, steps=2) == {"loss": 40.0, "joint": 4.0}
    assert region_host_times(events, steps=2) == {"loss": 200.0, "joint": 3.0}


def test_kernel_times_leave_out_the_gpu_spans_of_annotations():
    def event(name, us, annotation=False, device="CUDA"):
        return types.SimpleNamespace(name=name, device_time=us, is_user_annotation=annotation,
                                     device_type=types.SimpleNamespace(name=device))
    events = [event("gemm", 10.0), event("gemm", 6.0), event("region:proposals", 30.0, True),
              event("Optimizer.step#SGD.step", 5.0, True), event("aten::mm", 4.0, device="CPU")]
    assert kernel_times(events, steps=2) == {"gemm": 8.0}
    assert kernel_launches(events, steps=2) == {"gemm": 1.0}


def test_overlap_summary_splits_the_timeline_into_hidden_and_exposed_communication():
    def kernel(name, start, end, annotation=False, device="CUDA"):
        return types.SimpleNamespace(name=name, is_user_annotation=annotation,
                                     time_range=types.SimpleNamespace(start=start, end=end),
                                     device_type=types.SimpleNamespace(name=device))
    # 2 steps over 0..4000 us: compute 0-1000 and 1500-2500 (overlapping kernels), an
    # all-reduce 2000-3000 (half hidden), a gap 3000-3500, compute 3500-4000
    events = [kernel("gemm", 0, 800), kernel("relu", 500, 1000), kernel("gemm", 1500, 2500),
              kernel("ncclDevKernel_AllReduce_Sum_f32_RING_LL", 2000, 3000),
              kernel("gemm", 3500, 4000), kernel("region:loss", 0, 4000, annotation=True),
              kernel("aten::mm", 0, 9000, device="CPU")]
    got = overlap_summary(events, steps=2)
    assert got == {"span": 2.0, "busy": 1.5, "communication": 0.5,
                   "exposed_communication": 0.25, "idle": 0.5}
    assert overlap_summary(events[-2:], steps=2) == {}
    # a kernel before ``since`` (a barrier waiting for a slower rank) is left out
    late = overlap_summary([kernel("ncclDevKernel_AllReduce", -9000, -100), *events], 2, 0)
    assert late == got


def test_idle_time_goes_to_the_innermost_region_the_host_was_in_as_the_gpu_ran_dry():
    def event(name, start, end, device="CUDA", annotation=False):
        return types.SimpleNamespace(name=name, is_user_annotation=annotation,
                                     time_range=types.SimpleNamespace(start=start, end=end),
                                     device_type=types.SimpleNamespace(name=device))
    # kernels 0-100, 80-150 (overlapping), 200-300, 450-500, 520-600 (2 steps); the host in
    # "proposals" 0-180, "heads" 180-480 with "sampler" 250-400 inside it (and a region of
    # the same start and longer, "step", around everything)
    events = [event("gemm", 0, 100), event("relu", 80, 150), event("gemm", 200, 300),
              event("gemm", 450, 500), event("gemm", 520, 600),
              event("region:step", 0, 700, "CPU"), event("region:proposals", 0, 180, "CPU"),
              event("region:heads", 180, 480, "CPU"), event("region:sampler", 250, 400, "CPU"),
              event("region:heads", 180, 480, annotation=True), event("aten::mm", 0, 900, "CPU")]
    assert idle_by_region(events, steps=2) == {"proposals": 0.025, "sampler": 0.075,
                                               "step": 0.01}
    # a gap that begins outside every region
    assert idle_by_region(events[:5], steps=1) == {"(no region)": 0.22}


def test_idle_time_goes_to_the_innermost_host_op_as_the_gpu_ran_dry_on_any_thread():
    def event(name, start, end, device="CPU"):
        return types.SimpleNamespace(name=name, is_user_annotation=False,
                                     time_range=types.SimpleNamespace(start=start, end=end),
                                     device_type=types.SimpleNamespace(name=device))
    # kernels 0-100, 150-200, 260-300, 400-420; gaps 100-150 (the host waits in .item()'s
    # stream sync), 200-260 (between ops in "heads"), 300-400 (the autograd engine's thread
    # inside a backward node's aten::mul, while the main thread waits in the region)
    events = [event("k", 0, 100, "CUDA"), event("k", 150, 200, "CUDA"),
              event("k", 260, 300, "CUDA"), event("k", 400, 420, "CUDA"),
              event("region:heads", 0, 250), event("aten::item", 90, 160),
              event("aten::_local_scalar_dense", 95, 160),
              event("cudaStreamSynchronize", 96, 150), event("aten::mm", 210, 215),
              event("region:backward", 250, 500),
              event("autograd::engine::evaluate_function: MulBackward0", 280, 330),
              event("aten::mul", 290, 320), event("cudaLaunchKernel", 299, 302)]
    assert idle_by_host_op(events, steps=1) == pytest.approx(
        {"aten::_local_scalar_dense": 0.05, "region:heads": 0.06, "aten::mul": 0.1})
