"""Where ONNX op converters register, and what they receive."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Callable

import numpy as np
import onnx
from onnx import helper, numpy_helper

from ...errors import UnsupportedModelError
from ...ir.builder import FunctionBuilder
from ...ir.expr import Constant, Expr

Converter = Callable[["ConversionContext", onnx.NodeProto, list[Expr | None]], Expr | list[Expr]]

# Keyed by op type for the standard domain, by ``domain.OpType`` for the others
# (``com.microsoft.Attention``): the name the unsupported-op listing shows.
CONVERTERS: dict[str, Converter] = {}

STANDARD_DOMAINS = ("", "ai.onnx")


def converter_key(domain: str, op_type: str) -> str:
    """The converter table's key (and the name users see) of an op type of a domain."""
    return op_type if domain in STANDARD_DOMAINS else f"{domain}.{op_type}"


def converter(*op_types: str, domain: str = ""):
    """Register a function converting the named ONNX op types of ``domain`` (by default the
    standard one)."""
    def register(function: Converter) -> Converter:
        for op_type in op_types:
            key = converter_key(domain, op_type)
            if key in CONVERTERS:
                raise ValueError(f"converter for {key} registered twice")
            CONVERTERS[key] = function
        return function

    return register


class NodeConversionError(UnsupportedModelError):
    """A supported op type used in a way the converter does not handle (an attribute value)."""


@dataclass
class ConversionContext:
    builder: FunctionBuilder
    opset: int
    constant_count: int = field(default=0)

    def attributes(self, node: onnx.NodeProto) -> dict[str, Any]:
        return {a.name: helper.get_attribute_value(a) for a in node.attribute}

    def constant(self, data: np.ndarray, name: str) -> Constant:
        self.constant_count += 1
        return Constant(np.array(data, order="C"), name)

    def constant_value(self, expr: Expr | None, node: onnx.NodeProto, what: str) -> np.ndarray:
        """The value of an input that must be known at compile time (e.g. a reshape target)."""
        if isinstance(expr, Constant):
            return expr.data
        raise NodeConversionError(
            f"{node.op_type} node '{node.name}': {what} must be a constant (an initializer or a "
            "Constant node); computed values are not supported yet"
        )


def tensor_to_array(tensor: onnx.TensorProto) -> np.ndarray:
    return numpy_helper.to_array(tensor)


def nodes_with_subgraphs(nodes):
    """The nodes, each followed by the nodes of its subgraphs (If branches, Loop and Scan
    bodies), recursively."""
    for node in nodes:
        yield node
        for attribute in node.attribute:
            if attribute.HasField("g"):
                yield from nodes_with_subgraphs(attribute.g.node)
            for subgraph in attribute.graphs:
                yield from nodes_with_subgraphs(subgraph.node)
