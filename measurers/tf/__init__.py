"""The real TensorFlow measurer: run a placed GraphDef on this node's devices and time it."""

import graphs.native_order  # noqa: F401  (OR-Tools before TensorFlow: graphs/native_order.py)
