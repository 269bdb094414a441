"""ONNX elementwise ops: arithmetic with broadcasting and activations."""

from __future__ import annotations

from ...ops import call_op
from .registry import converter

BINARY = {"Add": "add", "Sub": "subtract", "Mul": "multiply", "Div": "divide"}
UNARY = {"Relu": "relu", "Sigmoid": "sigmoid", "Tanh": "tanh", "Exp": "exp", "Neg": "negative", "Identity": "identity"}


@converter(*BINARY)
def convert_binary(context, node, inputs):
    return call_op(BINARY[node.op_type], inputs[0], inputs[1])


@converter(*UNARY)
def convert_unary(context, node, inputs):
    return call_op(UNARY[node.op_type], inputs[0])
