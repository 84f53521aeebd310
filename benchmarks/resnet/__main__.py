"""``python -m benchmarks.resnet``: train ResNet-50 to its quality target (under torchrun)."""

from benchmarks.resnet.workload import ResNetWorkload
from common.training import program

if __name__ == "__main__":   # not again in a spawned child (background scoring)
    program(ResNetWorkload)
