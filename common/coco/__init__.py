"""COCO 2017 for the SSD and Mask R-CNN workloads: reader (``data``), COCO evaluation
(``evaluation``) and a tiny learnable fixture in the same format (``fixture``)."""
