"""Learned placers on RLlib's new API stack: the environment, the training loop and the trainers shared by every family; one subfolder per family."""
