"""The PyTorch importer: a fake-tensor trace of a whole training step becomes an OpGraph."""

LOSS_SCOPE = "loss"  # the scope of the ops a traced loss function runs itself (not a module of the model)
