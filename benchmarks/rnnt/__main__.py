"""``python -m benchmarks.rnnt``: train RNN-T to its quality target (under torchrun)."""

import sys

from benchmarks.rnnt.workload import RNNTWorkload
from common.training import main

if __name__ == "__main__":   # not again in a spawned child (background scoring)
    sys.exit(main(RNNTWorkload))
