"""``python -m benchmarks.unet3d``: train the 3D U-Net to its quality target (under torchrun)."""

from benchmarks.unet3d.workload import Unet3DWorkload
from common.training import program

if __name__ == "__main__":   # not again in a spawned child (background scoring)
    program(Unet3DWorkload)
