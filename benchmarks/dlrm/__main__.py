"""``python -m benchmarks.dlrm``: train DLRM to AUC 0.8025 (under torchrun for several GPUs)."""

import sys

from benchmarks.dlrm.workload import DLRMWorkload
from common.training import main

sys.exit(main(DLRMWorkload))
