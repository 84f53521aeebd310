"""The loss against a hand-computed case and a literal transcription of the reference's
``Loss`` (``base_model.py``, mlcommons/training v1.1)."""

import math

import torch
import torch.nn.functional as F

from benchmarks.ssd.boxes import dboxes300_coco, match, xywh_to_ltrb
from benchmarks.ssd.loss import Loss


def reference_loss(ploc, plabel, gloc, glabel, dboxes):
    """``Loss.forward`` as the reference writes it (``gloc`` [N, 4, A])."""
    d = dboxes.t()[None]
    mask = glabel > 0
    pos_num = mask.sum(dim=1)
    vec_gd = torch.cat((10 * (gloc[:, :2] - d[:, :2]) / d[:, 2:],
                        5 * (gloc[:, 2:] / d[:, 2:]).log()), dim=1)
    sl1 = F.smooth_l1_loss(ploc, vec_gd, reduction="none").sum(dim=1)
    sl1 = (mask.float() * sl1).sum(dim=1)
    con = F.cross_entropy(plabel, glabel, reduction="none")
    con_neg = con.clone()
    con_neg[mask] = 0
    _, con_idx = con_neg.sort(dim=1, descending=True)
    _, con_rank = con_idx.sort(dim=1)
    neg_num = torch.clamp(3 * pos_num, max=mask.size(1)).unsqueeze(-1)
    neg_mask = con_rank < neg_num
    closs = (con * (mask.float() + neg_mask.float())).sum(dim=1)
    total_loss = sl1 + closs
    num_mask = (pos_num > 0).float()
    pos_num = pos_num.float().clamp(min=1e-6)
    return (total_loss * num_mask / pos_num).mean(dim=0)


def softplus(x: float) -> float:
    """Cross-entropy of logits (0, x) for class 0."""
    return math.log1p(math.exp(x))


def test_hard_negative_mining_by_hand():
    """Eight default boxes, two classes, three images.
    Image 0: one positive (box 2) with location error (0.5, -2, 0, 0): smooth-L1
    0.5 * 0.5^2 + (2 - 0.5) = 1.625; its logits (0, 0) cost log 2; of the six negatives,
    with logits (0, t), only the 3 hardest (t = 3, 2, 1) count, log(1 + e^t) each.
    Image 1: two positives, so 3 x 2 = 6 negatives: all six count; divided by 2.
    Image 2: no positive, adds 0, yet counts in the mean over 3 images."""
    dboxes = torch.stack((torch.linspace(0.1, 0.8, 8), torch.full((8,), 0.5),
                          torch.full((8,), 0.1), torch.full((8,), 0.2)), dim=1)
    glabel = torch.zeros(3, 8, dtype=torch.long)
    glabel[0, 2] = 1
    glabel[1, [0, 7]] = 1
    gloc = dboxes.expand(3, 8, 4)                       # targets encode to 0
    ploc = torch.full((3, 4, 8), 5.0)                   # ignored off the positives
    ploc[0, :, 2] = torch.tensor([0.5, -2.0, 0.0, 0.0])
    ploc[1, :, [0, 7]] = 0.0
    t = torch.tensor([[-1.0, 2.0, 0.0, 0.5, 3.0, -2.0, 1.0, 0.0],
                      [0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.0],
                      [4.0, 4.0, 4.0, 4.0, 4.0, 4.0, 4.0, 4.0]])
    plabel = torch.stack((torch.zeros(3, 8), t), dim=1)
    image0 = 1.625 + math.log(2) + softplus(3) + softplus(2) + softplus(1)
    image1 = (2 * math.log(2) + sum(softplus(x) for x in (0.1, 0.2, 0.3, 0.4, 0.5, 0.6))) / 2
    loss = Loss(dboxes)(ploc, plabel, gloc, glabel)
    torch.testing.assert_close(loss, torch.tensor((image0 + image1) / 3))


def test_batched_loss_equals_the_reference():
    """Real default boxes, targets from ``match``, random predictions; and the gradient."""
    torch.manual_seed(0)
    dboxes = dboxes300_coco()
    gt = xywh_to_ltrb(dboxes[[400, 5000, 8000, 8731]]).clamp(0, 1).reshape(2, 2, 4)
    valid = torch.tensor([[True, True], [True, False]])
    gloc, glabel = match(gt, torch.tensor([[1, 2], [3, 0]]), valid, dboxes)
    ploc = torch.randn(2, 4, 8732, requires_grad=True)
    plabel = torch.randn(2, 81, 8732, requires_grad=True)
    got = Loss(dboxes)(ploc, plabel, gloc, glabel)
    want = reference_loss(ploc, plabel, gloc.transpose(1, 2), glabel, dboxes)
    torch.testing.assert_close(got, want)
    grads = [torch.autograd.grad(y, (ploc, plabel)) for y in (got, want)]
    for g_got, g_want in zip(*grads):
        torch.testing.assert_close(g_got, g_want)
