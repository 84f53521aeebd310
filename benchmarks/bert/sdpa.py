"""The ``sdpa`` optimisation: attention on the padded batch as one
``F.scaled_dot_product_attention`` call (flash or memory-efficient kernels, the padding as a
boolean mask) in place of the reference's explicit softmax."""

from __future__ import annotations

import torch.nn.functional as F

from benchmarks.bert.model import SelfAttention, swap_class
from common.optimisations import Optimisation


class SdpaSelfAttention(SelfAttention):
    def attend(self, q, k, v, mask, p: float):
        return F.scaled_dot_product_attention(q, k, v, attn_mask=mask[:, None, None, :].bool(),
                                              dropout_p=p)


OPTIMISATION = Optimisation(
    "sdpa", "attention on the padded batch as one scaled_dot_product_attention call (sdpa.py)",
    apply=lambda wl, _: swap_class(wl.net, SelfAttention, SdpaSelfAttention), rtol=1e-6)
