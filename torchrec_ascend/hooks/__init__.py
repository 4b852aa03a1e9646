"""The generic hooks H1-H6: patches of stock TorchRec that read every device difference from a backend profile."""
