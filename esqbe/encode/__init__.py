"""The sentence encoder: model loading, runtimes (torch, ONNX), encoding."""
