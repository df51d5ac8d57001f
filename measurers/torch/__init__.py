"""The real PyTorch measurer: replay a captured training step op by op on the placed devices and time it."""
