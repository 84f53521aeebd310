"""The packed joint's gather, add, ReLU and dropout as one compiled kernel (``compiled-joint``).

``packed_joint.gather_add_relu_dropout``, the reference for this one, gathers and adds the rows of
``joint_enc``'s and ``joint_pred``'s outputs as one ``embedding_bag``: no gathered copies, but the
step's largest kernel (docs/performance.md, RNN-T). Here ``torch.compile`` makes the gather, add,
ReLU and dropout (inductor's own random numbers) one elementwise kernel: each output element reads
its two inputs, which stay in cache, and is written once. Compiled for any number of rows
(``compiled_loss.rows_dynamic``); the backward stays ``packed_joint._AddReluDropout``'s.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

from benchmarks.rnnt.compiled_loss import rows_dynamic
from common.optimisations import Optimisation


@torch.compile
def _gather_add_relu_dropout(f: torch.Tensor, g: torch.Tensor, rows_f: torch.Tensor,
                             rows_g: torch.Tensor, p: float) -> torch.Tensor:
    out = (f[rows_f] + g[rows_g]).relu()
    return F.dropout(out, p, training=True) if p > 0 else out


def gather_add_relu_dropout(f: torch.Tensor, g: torch.Tensor, rows_f: torch.Tensor,
                            rows_g: torch.Tensor, p: float) -> torch.Tensor:
    """``packed_joint.gather_add_relu_dropout``'s contract."""
    rows_dynamic(f, g, rows_f, rows_g)
    return _gather_add_relu_dropout(f, g, rows_f, rows_g, p)


def apply(wl, _) -> None:
    wl.train_loss.gather = gather_add_relu_dropout


OPTIMISATION = Optimisation(
    "compiled-joint", "the packed joint's gather, add, ReLU and dropout as one compiled kernel "
    "(benchmarks/rnnt/compiled_joint.py)", apply=apply, requires=("packed-joint",),
    compare=None, tested_by="tests/benchmarks/rnnt/test_workload.py (its dropout draws its "
    "own masks)")
