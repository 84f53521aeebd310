"""``python -m tests.common.toy_program WORKLOAD [driver flags]``: the shared driver on a toy
workload of ``tests.common.toy_workload`` (or ``LoaderToy`` below), as a program, for the
tests that signal it or launch it under torchrun."""

import atexit
import subprocess
import sys
import time

import torch

from common import loaders, process_exit
from common.errors import UserError
from common.training import main
from tests.common import toy_workload


class _Sleepy(torch.utils.data.Dataset):
    """The toy's batches, each after a pause, as loader processes serve a real dataset."""

    def __init__(self, batches):
        self.batches = batches

    def __len__(self):
        return len(self.batches)

    def __getitem__(self, i):
        time.sleep(0.05)
        return self.batches[i]


class LoaderToy(toy_workload.ToyWorkload):
    """The toy's batches served by two persistent loader processes."""

    def epoch_batches(self, epoch):
        if not hasattr(self, "loader"):
            batches = super().epoch_batches(epoch)
            self.keys = loaders.Keys(list(range(len(batches))))
            self.loader = loaders.persistent(_Sleepy(batches), self.keys, 2, pin=False)
        return self.loader

    def close(self):
        if hasattr(self, "loader"):
            loaders.shut_down(self.loader)


class RankOneBadInputToy(toy_workload.ToyWorkload):
    """Bad input that rank 1 alone finds, in its second epoch; rank 0 trains on."""

    def epoch_batches(self, epoch):
        if epoch == 2 and self.env.rank == 1:
            raise UserError("planted bad input on rank 1")
        return super().epoch_batches(epoch)


class HelperToy(toy_workload.ToyWorkload):
    """The toy with a helper process that Python's exit would wait 600 s for, as Inductor's
    exit handler waits for its compile workers."""

    def setup(self):
        super().setup()
        helper = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"])
        atexit.register(helper.wait)


if __name__ == "__main__":
    name = sys.argv[1]
    workload = globals().get(name) or getattr(toy_workload, name)
    process_exit.end(main(workload, sys.argv[2:]))
