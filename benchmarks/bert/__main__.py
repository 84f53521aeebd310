"""``python -m benchmarks.bert``: train BERT-large to its quality target (under torchrun)."""

import sys

from benchmarks.bert.workload import BertWorkload
from common.training import main

if __name__ == "__main__":   # not again in a spawned child (background scoring)
    sys.exit(main(BertWorkload))
