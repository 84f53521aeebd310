"""The forward that connects the pieces (``GeneralizedRCNN``) at tiny widths: the five losses
in training, gradients for every trained weight, and detections with masks pasted at the
original image size in evaluation."""

import torch

from benchmarks.maskrcnn import data
from benchmarks.maskrcnn.detector import LOSSES, Detector, ground_truth
from benchmarks.maskrcnn.model import MaskRCNN
from benchmarks.maskrcnn.roi_heads import RoISampler
from benchmarks.maskrcnn.rpn import RPN

SIZE = 64


def tiny_detector(num_classes=4):
    torch.manual_seed(0)
    net = MaskRCNN(num_classes=num_classes, width=4, fpn_channels=8, box_head_dim=16,
                   mask_head_dim=8)
    rpn = RPN(pre_nms_top_n_train=50, pre_nms_top_n_test=50, post_nms_top_n_train=50,
              post_nms_top_n_test=50, fpn_post_nms_top_n_train=100, fpn_post_nms_top_n_test=20,
              batch_size_per_image=32)
    return Detector(net, rpn, RoISampler(32))


def test_ground_truth_splits_a_padded_batch_per_image():
    batch = data.synthetic_batch(2, 4, SIZE, SIZE, objects=3)
    batch.labels[1, 2] = 0                     # one image with a padded slot
    masks = batch.masks[:5]
    boxes, labels, per_image = ground_truth(batch.boxes, batch.labels, masks)
    assert [len(b) for b in boxes] == [3, 2] and [len(m) for m in per_image] == [3, 2]
    assert torch.equal(labels[1], batch.labels[1, :2])


def test_training_returns_the_five_losses_and_trains_every_weight():
    detector = tiny_detector()
    batch = data.synthetic_batch(2, 4, SIZE, SIZE)
    losses = detector(data.normalize(batch.images, batch.image_sizes), batch.image_sizes,
                      batch.boxes, batch.labels, batch.masks)
    assert tuple(losses) == LOSSES
    assert all(v.dim() == 0 and torch.isfinite(v) for v in losses.values())
    sum(losses.values()).backward()
    trained = [n for n, p in detector.named_parameters() if p.requires_grad]
    assert trained and all(detector.get_parameter(n).grad is not None for n in trained)


def test_evaluation_pastes_masks_at_the_original_size():
    detector = tiny_detector().eval()
    batch = data.synthetic_batch(2, 4, SIZE, SIZE)
    original = torch.tensor([[96, 120], [48, 64]])
    with torch.no_grad():
        found = detector(data.normalize(batch.images, batch.image_sizes), batch.image_sizes,
                         original)
    assert len(found) == 2
    for d, (height, width) in zip(found, original.tolist()):
        assert d.masks.shape == (len(d.boxes), height, width) and d.masks.dtype == torch.uint8
        assert len(d.boxes) <= detector.detections_per_image
        assert (d.scores[:-1] >= d.scores[1:]).all()
