"""The real TensorFlow measurer: run a placed GraphDef on this node's devices and time it."""
