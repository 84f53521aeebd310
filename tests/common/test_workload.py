import pytest
import torch

from common.workload import Block, blocks_every, maybe_compile


def test_mlperf_resnet_schedule():
    blocks = blocks_every(4, 2, 37)
    assert blocks[0] == Block(1, 3)
    assert blocks[1] == Block(4, 4)
    assert [b.last_epoch for b in blocks] == [3, 7, 11, 15, 19, 23, 27, 31, 35, 37]
    assert sum(b.epoch_count for b in blocks) == 37


def test_every_epoch_schedule():
    assert blocks_every(1, 0, 3) == [Block(1, 1), Block(2, 1), Block(3, 1)]


@pytest.mark.parametrize("period,offset,epochs", [(0, 0, 3), (4, 4, 10), (1, 0, 0)])
def test_bad_schedules_rejected(period, offset, epochs):
    with pytest.raises(ValueError):
        blocks_every(period, offset, epochs)


def test_maybe_compile_passes_inductor_options_and_rejects_unknown_ones():
    x = torch.arange(4.0)
    assert torch.equal(maybe_compile(lambda t: t * 2 + 1, "default",
                                     loop_ordering_after_fusion=False)(x), x * 2 + 1)
    with pytest.raises(RuntimeError, match="no_such_option"):
        maybe_compile(lambda t: t, "default", no_such_option=1)
