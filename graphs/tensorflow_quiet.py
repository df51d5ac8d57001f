"""TensorFlow imported without its start-up lines, for the commands that load it (Keras import, the tf
measurer and profiler) and for the tf measurer wherever it is built (a pool's actors forwarded the lines to
the driver's stderr). Outside ``graphs.tf``, whose package import loads OR-Tools: every command imports this."""

from __future__ import annotations

import os
import sys

from graphs.errors import PlacerError


def import_tensorflow_quietly() -> None:
    """TensorFlow's C++ start-up writes a few lines to file descriptor 2 (no CUDA driver, CPU features,
    absl) that say nothing about the user's model: they are held back, and shown only if the import fails.
    Its later C++ log lines (the failed cuInit of a machine without a GPU) are off unless
    TF_CPP_MIN_LOG_LEVEL says otherwise; its errors still raise as exceptions."""
    import tempfile

    os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "3")
    sys.stderr.flush()
    saved = os.dup(2)
    with tempfile.TemporaryFile() as held:
        try:
            os.dup2(held.fileno(), 2)
            import graphs.native_order  # noqa: F401  (OR-Tools before TensorFlow)
            import tensorflow  # noqa: F401
        except Exception as exc:  # noqa: BLE001  (ImportError: _importer names the missing importer)
            failed = exc
        else:
            failed = None
        finally:
            sys.stderr.flush()
            os.dup2(saved, 2)
            os.close(saved)
        if failed is not None:
            held.seek(0)
            sys.stderr.write(held.read().decode(errors="replace"))
            if not isinstance(failed, ImportError):
                raise PlacerError(f"TensorFlow failed to load: {type(failed).__name__}: {failed}") from None
