"""``python -m benchmarks.dlrm``: train DLRM to AUC 0.8025 (under torchrun for several GPUs)."""

from benchmarks.dlrm.workload import DLRMWorkload
from common.training import program

if __name__ == "__main__":   # not again in a spawned child (background scoring)
    program(DLRMWorkload)
