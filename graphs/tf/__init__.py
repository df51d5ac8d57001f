"""The TensorFlow importer: a GraphDef of a Keras or tf.function training step becomes an OpGraph."""

import graphs.native_order  # noqa: F401  (OR-Tools before TensorFlow: graphs/native_order.py)
