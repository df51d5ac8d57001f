"""Inference graphs from exported model files: ONNX (``onnx_import``) and OpenVINO IR (``openvino_import``),
sharing one table of FLOP formulas (``flops``). Every op is a forward op; weights are resident param bytes."""
