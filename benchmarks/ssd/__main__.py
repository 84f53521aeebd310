"""``python -m benchmarks.ssd``: train SSD300 to bbox mAP 0.23 (under torchrun for several GPUs)."""

from benchmarks.ssd.workload import SSDWorkload
from common.training import program

if __name__ == "__main__":   # not again in a spawned child (background scoring)
    program(SSDWorkload)
