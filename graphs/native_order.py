"""Load OR-Tools' native library before TensorFlow's: import this module before ``import tensorflow``.

Both ship their own copy of abseil. In a process where TensorFlow's library was loaded first and has run a
graph, a later CP-SAT solve (``placer search --policy exact``) dies with a segmentation fault (seen in
the test suite: the TF measurer's tests, then ``tests/policies/test_exact.py``). With OR-Tools loaded
first, both work. Importing this costs about a second, once; without OR-Tools it does nothing.
"""

try:
    from ortools.sat.python import cp_model  # noqa: F401  (loads OR-Tools' native library)
except ImportError:  # OR-Tools missing: nothing to order
    pass
