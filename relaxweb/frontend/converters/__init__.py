"""ONNX op converters, one file per family; importing this package registers them all."""

from . import elementwise, linear_algebra, manipulation, nn  # noqa: F401  (registration)
from .registry import CONVERTERS, ConversionContext, NodeConversionError

__all__ = ["CONVERTERS", "ConversionContext", "NodeConversionError"]
