"""The TensorFlow importer: a GraphDef of a Keras or tf.function training step becomes an OpGraph."""
