"""Stand-ins for what cannot run here: the TensorRT API, the CUDA runtime, tiny ONNX models."""
