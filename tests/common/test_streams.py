"""``work_stream``: a run's CUDA work off the legacy default stream."""

import threading

import pytest
import torch

from common.streams import work_stream


def test_nothing_changes_off_cuda():
    with work_stream(torch.device("cpu")):
        assert torch.ones(2).sum() == 2


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs CUDA")
def test_a_decode_in_another_thread_overlaps_the_work():
    """nvJPEG's hardware decoder uses blocking streams: with the work on the legacy default
    stream a decode waits for it; on the work stream, the decode finishes while a long
    kernel of the work still runs."""
    from PIL import Image
    import io
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
