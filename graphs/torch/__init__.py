"""The PyTorch importer: a fake-tensor trace of a whole training step becomes an OpGraph."""
