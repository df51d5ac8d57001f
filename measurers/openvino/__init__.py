"""The OpenVINO measurer: inference of an imported OpenVINO IR / ONNX model, each op on its placed device
(HETERO with per-node affinities). See measurers/openvino/measurer.py."""
