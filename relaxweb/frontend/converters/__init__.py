"""ONNX op converters, one file per family; importing this package registers them all."""

from . import contrib, contrib_attention, control_flow, convolution, elementwise, indexing, linear_algebra, manipulation, nn, normalization, packed_weights, quantization, recurrent, reduction, sequence  # noqa: F401  (registration)
from .registry import CONVERTERS, ConversionContext, NodeConversionError

__all__ = ["CONVERTERS", "ConversionContext", "NodeConversionError"]
