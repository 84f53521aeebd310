"""``python -m benchmarks.ssd``: train SSD300 to bbox mAP 0.23 (under torchrun for several GPUs)."""

import sys

from benchmarks.ssd.workload import SSDWorkload
from common.training import main

if __name__ == "__main__":   # not again in a spawned child (background scoring)
    sys.exit(main(SSDWorkload))
