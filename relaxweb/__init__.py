"""relaxweb: compile ONNX models into static WebGPU bundles with symbolic shapes."""

__version__ = "0.1.0"
