"""Backbones for the image encoder: the registry of names, and weight porting (PyTorch
`.pth` files read without torch, the EfficientNet-Lite builders)."""
