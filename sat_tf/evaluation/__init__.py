"""Evaluation: the coco-caption metrics, the paper's Table 1, and attention pictures."""
