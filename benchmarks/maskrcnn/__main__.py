"""``python -m benchmarks.maskrcnn``: train Mask R-CNN to box mAP 0.377 and mask mAP 0.339
(under torchrun for several GPUs)."""

from benchmarks.maskrcnn.workload import MaskRCNNWorkload
from common.training import program

if __name__ == "__main__":   # not again in a spawned child (background scoring)
    program(MaskRCNNWorkload)
