"""``python -m benchmarks.bert``: train BERT-large to its quality target (under torchrun)."""

import sys

from benchmarks.bert.workload import BertWorkload
from common.training import main

sys.exit(main(BertWorkload))
