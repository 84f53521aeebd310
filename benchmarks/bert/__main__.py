"""``python -m benchmarks.bert``: train BERT-large to its quality target (under torchrun)."""

from benchmarks.bert.workload import BertWorkload
from common.training import program

if __name__ == "__main__":   # not again in a spawned child (background scoring)
    program(BertWorkload)
