"""``python -m benchmarks.rnnt``: train RNN-T to its quality target (under torchrun)."""

from benchmarks.rnnt.workload import RNNTWorkload
from common.training import program

if __name__ == "__main__":   # not again in a spawned child (background scoring)
    program(RNNTWorkload)
