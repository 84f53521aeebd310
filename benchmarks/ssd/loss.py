"""The MLPerf 1.1 SSD loss (mlcommons/training ``single_stage_detector/ssd/base_model.py``,
``Loss``): per image, smooth-L1 over the positives' encoded boxes (summed over the four
coordinates) plus softmax cross-entropy over the positives and the 3 x num_pos hardest
negatives, divided by the image's number of positives; images without positives add 0;
the mean over the batch.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch import nn

from benchmarks.ssd.boxes import encode

NEG_POS_RATIO = 3


class Loss(nn.Module):
    """``forward(ploc [B, 4, A], plabel [B, C, A], gloc [B, A, 4] xywh, glabel [B, A])``,
    the model's outputs and :func:`benchmarks.ssd.boxes.match`'s targets -> scalar."""

    def __init__(self, dboxes: torch.Tensor):
        super().__init__()
        self.register_buffer("dboxes", dboxes, persistent=False)

    def forward(self, ploc: torch.Tensor, plabel: torch.Tensor, gloc: torch.Tensor,
                glabel: torch.Tensor) -> torch.Tensor:
        mask = glabel > 0
        pos_num = mask.sum(dim=1)

        vec_gd = encode(gloc, self.dboxes).transpose(1, 2)
        sl1 = F.smooth_l1_loss(ploc.float(), vec_gd, reduction="none").sum(dim=1)
        sl1 = torch.where(mask, sl1, 0).sum(dim=1)

        # hard negative mining: rank the negatives by their confidence loss
        con = F.cross_entropy(plabel.float(), glabel, reduction="none")
        con_neg = torch.where(mask, 0, con)      # positives are never picked as negatives
        _, con_idx = con_neg.sort(dim=1, descending=True)
        _, con_rank = con_idx.sort(dim=1)
        neg_num = torch.clamp(NEG_POS_RATIO * pos_num, max=mask.shape[1]).unsqueeze(-1)
        neg_mask = con_rank < neg_num
        closs = (con * (mask.float() + neg_mask.float())).sum(dim=1)

        total_loss = sl1 + closs
        num_mask = (pos_num > 0).float()
        return (total_loss * num_mask / pos_num.float().clamp(min=1e-6)).mean(dim=0)
