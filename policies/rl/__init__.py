"""Learned placers on RLlib's new API stack: the environment, the training loop and the trainers shared by every family; one subfolder per family.

Every module here that imports RLlib sits in this package, so this file runs before RLlib is imported
and quiets it first (``quiet_rllib``):

- RLlib's new API stack is torch-only, yet ``ray.rllib`` imports TensorFlow whenever it is installed
  (2-5 s and ~500 MB, with TensorFlow's own start-up lines on stderr). ``RLLIB_TEST_NO_TF_IMPORT`` is the
  one switch RLlib reads to skip it; it is set here (unless the user set it) so ``placer search`` starts
  as quickly from a plain shell as under ``make``. The measurer pool's actors never import RLlib, so
  they need no such setting; the TensorFlow measurer imports TensorFlow itself.
- With that switch on, every RLlib module that calls ``try_import_tf`` logs "Not importing TensorFlow
  for test purposes" (about 80 lines per process), and RLlib 2.60's own ``RLModule.__init__`` builds the
  deprecated ``RLModuleConfig`` for every module, which logs a deprecation warning even though our
  module is built with the current constructor (``RLModuleSpec(observation_space=..., action_space=...,
  model_config=...)``). Neither is something a user can act on: a logging filter drops exactly those
  messages and nothing else.
"""

from __future__ import annotations

import logging
import os

NO_TF_IMPORT_VARIABLE = "RLLIB_TEST_NO_TF_IMPORT"
FRAMEWORK_LOGGER = "ray.rllib.utils.framework"  # logs "Not importing TensorFlow ..." per try_import_tf call
DEPRECATION_LOGGER = "ray._common.deprecation"  # logs the RLModuleConfig warning RLlib triggers itself
_UNACTIONABLE = {
    FRAMEWORK_LOGGER: ("Not importing TensorFlow",),
    DEPRECATION_LOGGER: ("RLModule(config=[RLModuleConfig object])",),
}


class _DropMessages(logging.Filter):
    """Drops the records whose message contains one of ``fragments``; passes every other record."""

    def __init__(self, fragments: tuple[str, ...]):
        super().__init__()
        self.fragments = fragments

    def filter(self, record: logging.LogRecord) -> bool:
        message = record.getMessage()
        return not any(fragment in message for fragment in self.fragments)


def quiet_rllib() -> None:
    """Skip RLlib's TensorFlow import and drop the warnings a user cannot act on (idempotent)."""
    os.environ.setdefault(NO_TF_IMPORT_VARIABLE, "1")
    for name, fragments in _UNACTIONABLE.items():
        logger = logging.getLogger(name)
        if not any(isinstance(f, _DropMessages) for f in logger.filters):
            logger.addFilter(_DropMessages(fragments))


quiet_rllib()
