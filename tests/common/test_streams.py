"""``work_stream``: a run's CUDA work off the legacy default stream; ``SideStreams``: calls
beside it, joined."""

import threading

import pytest
import torch

from common.streams import SideStreams, work_stream


def test_nothing_changes_off_cuda():
    with work_stream(torch.device("cpu")):
        assert torch.ones(2).sum() == 2
    side = SideStreams(torch.device("cpu"), 2)
    assert side.run(1, torch.add, torch.ones(2), 1).tolist() == [2, 2]
    side.join()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_side_calls_run_beside_the_current_stream_and_join():
    """A side call starts after the current stream's work so far, runs while the current
    stream is busy with a long kernel, and the current stream reads its result only after
    :meth:`SideStreams.join`."""
    device = torch.device("cuda")
    side = SideStreams(device, 2)
    with work_stream(device):
        current = torch.cuda.current_stream(device)
        x = torch.arange(1 << 20, device=device, dtype=torch.float32)
        doubled = side.run(0, lambda t: (torch.cuda._sleep(500_000_000), t * 2)[1], x)
        side_done = side.streams[0].record_event()
        torch.cuda._sleep(2_000_000_000)       # the current stream, about a second
        current_done = current.record_event()
        side_done.synchronize()
        assert not current_done.query()         # the side call finished first
        side.join()
        total = doubled.sum()
    torch.cuda.synchronize()
    assert total.item() == 2 * x.sum().item()


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_a_side_call_holds_a_cuda_graph_output_the_caller_dropped_until_join():
    """Inductor's CUDA graph trees give a graph output's memory to the next graph they record
    once no Python object refers to it, whatever stream still reads it. Here a side call
    reads one graph's output late, the caller drops it, and a second graph runs on the
    current stream: at the recording and the replay, the side call still sums the first
    graph's values."""
    device, n = torch.device("cuda"), 1 << 20
    graphs = {"triton.cudagraphs": True}
    double = torch.compile(lambda x: x * 2, options=graphs)
    other = torch.compile(lambda x: x * 3 + 1, options=graphs)
    side, sums = SideStreams(device, 1), []
    with work_stream(device):
        for step in range(1, 4):   # warm-up, recording, replay
            torch.compiler.cudagraph_mark_step_begin()
            x = torch.full((n,), float(step), device=device)
            doubled = double(x)
            total = side.run(0, lambda t: (torch.cuda._sleep(200_000_000), t.sum())[1], doubled)
            del doubled
            later = other(x)
            side.join()
            sums.append(total.item())
            del later
    assert sums == [2.0 * n * step for step in range(1, 4)]


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_a_decode_in_another_thread_overlaps_the_work():
    """nvJPEG's hardware decoder uses blocking streams: with the work on the legacy default
    stream a decode waits for it; on the work stream, the decode finishes while a long
    kernel of the work still runs."""
    import io

    from PIL import Image
    from torchvision.io import decode_jpeg

    device = torch.device("cuda")
    buf = io.BytesIO()
    Image.new("RGB", (500, 375), (30, 120, 200)).save(buf, format="JPEG", quality=90)
    blobs = [torch.frombuffer(bytearray(buf.getvalue()), dtype=torch.uint8)] * 8
    decode_jpeg(blobs, device=device)   # the decoder's one-time set-up
    torch.cuda.synchronize()
    with work_stream(device):
        assert torch.cuda.current_stream(device) != torch.cuda.default_stream(device)
        torch.cuda._sleep(2_000_000_000)   # about a second of GPU time
        busy = torch.cuda.current_stream(device).record_event()
        seen = {}

        def decode():
            with torch.cuda.stream(torch.cuda.Stream(device)):
                decode_jpeg(blobs, device=device)
            seen["work running when the decode returned"] = not busy.query()
        thread = threading.Thread(target=decode)
        thread.start()
        thread.join()
    torch.cuda.synchronize()
    assert seen == {"work running when the decode returned": True}
