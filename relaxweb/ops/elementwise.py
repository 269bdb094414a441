"""Elementwise ops: binary arithmetic with broadcasting, and unary activations.

Each output element depends only on the input elements at the same (broadcast) index, so
each legalizes to one tensor program whose body is the scalar operation.

Deduction: binary ops broadcast (``broadcast_shapes``: 1 takes the other side, otherwise the
dims must be provably equal); with an operand of unknown shape the result's shape is unknown
and its rank the larger of the two (unknown if either rank is).  Unary ops keep the
annotation of their argument.
"""

from __future__ import annotations

import numpy as np

from ..ir.expr import Call, tensor_dtype
from ..ir.struct_info import TensorStructInfo
from ..ir.tir import Binary, FloatImm, Unary
from .common import (
    broadcast_shapes, expect_args, load_broadcast, make_program, needs_known_shapes, require_float,
    require_tensor, same_dtype, unknown_rank_join,
)
from .registry import register_op

BINARY_REFERENCE = {
    "add": np.add,
    "subtract": np.subtract,
    "multiply": np.multiply,
    "divide": np.divide,
}


def _deduce_binary(name: str):
    def deduce(args, attrs) -> TensorStructInfo:
        expect_args(name, args, 2)
        a, b = (require_tensor(arg, name, i) for i, arg in enumerate(args))
        dtype = same_dtype(name, [a, b])
        if a.shape is None or b.shape is None:
            return TensorStructInfo(None, dtype, unknown_rank_join([a.ndim, b.ndim]))
        return TensorStructInfo(broadcast_shapes(name, [a.shape, b.shape]), dtype)

    return deduce


def _legalize_binary(name: str):
    def legalize(context, call: Call):
        info = call.struct_info
        program = make_program(
            name, call.args, info.shape, info.dtype,
            lambda axes, buffers: Binary(name, load_broadcast(buffers[0], axes), load_broadcast(buffers[1], axes)),
        )
        return context.call_tir(program, call.args)

    return legalize


def _reference_binary(name: str):
    function = BINARY_REFERENCE[name]
    return lambda arrays, attrs: function(arrays[0], arrays[1]).astype(arrays[0].dtype)


for _name in BINARY_REFERENCE:
    register_op(
        _name,
        deduce=_deduce_binary(_name),
        legalize=needs_known_shapes(_legalize_binary(_name)),
        reference=_reference_binary(_name),
    )


# Unary ops: scalar body as a function of the loaded element.
UNARY_BODIES = {
    "relu": lambda x: Binary("maximum", x, FloatImm(0.0)),
    "sigmoid": lambda x: Unary("sigmoid", x),
    "tanh": lambda x: Unary("tanh", x),
    "exp": lambda x: Unary("exp", x),
    "negative": lambda x: Unary("negative", x),
    "identity": lambda x: x,
}

UNARY_REFERENCE = {
    "relu": lambda x: np.maximum(x, 0),
    "sigmoid": lambda x: 1 / (1 + np.exp(-x)),
    "tanh": np.tanh,
    "exp": np.exp,
    "negative": np.negative,
    "identity": lambda x: x.copy(),
}

FLOAT_ONLY = {"relu", "sigmoid", "tanh", "exp"}


def _deduce_unary(name: str):
    def deduce(args, attrs) -> TensorStructInfo:
        expect_args(name, args, 1)
        info = require_tensor(args[0], name, 0)
        if name in FLOAT_ONLY:
            require_float(name, info)
        return info

    return deduce


def _legalize_unary(name: str):
    scalar = UNARY_BODIES[name]

    def legalize(context, call: Call):
        info = call.struct_info
        program = make_program(
            name, call.args, info.shape, tensor_dtype(call.args[0]),
            lambda axes, buffers: scalar(load_broadcast(buffers[0], axes)),
        )
        return context.call_tir(program, call.args)

    return legalize


for _name in UNARY_BODIES:
    register_op(
        _name,
        deduce=_deduce_unary(_name),
        legalize=needs_known_shapes(_legalize_unary(_name)),
        reference=(lambda function: lambda arrays, attrs: function(arrays[0]).astype(arrays[0].dtype))(UNARY_REFERENCE[_name]),
    )
