"""Frontends: model formats -> IRModule."""

from .onnx import from_onnx, import_onnx_file, load_onnx

__all__ = ["from_onnx", "import_onnx_file", "load_onnx"]
