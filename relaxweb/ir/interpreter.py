"""The reference interpreter: runs an IRModule with numpy, at any stage of the pipeline.

It evaluates graph-level op calls with each op's ``reference`` semantics, tensor programs by
evaluating their compute definition over index grids, and the memory-planned form
(``alloc_storage`` / ``alloc_tensor`` / ``call_tir_into``) on real byte buffers — so a wrong
storage reuse shows up as wrong numbers.  Input shapes are matched against the parameters'
annotations, binding symbolic variables, exactly as the compiled host module does.
"""

from __future__ import annotations

from typing import Mapping

import numpy as np

from ..errors import InputShapeError
from .expr import (
    AllocStorage, AllocTensor, Call, CallTIR, CallTIRInto, Constant, Expr, Function, MatchCast,
    ShapeExpr, Tuple, Var,
)
from .module import IRModule
from .struct_info import TensorStructInfo
from .symbolic import PrimExpr, SizeVar, evaluate, format_expr
from .tir import Binary, FloatImm, Load, Reduce, ScalarExpr, TensorProgram, Unary


def run_module(module: IRModule, inputs: Mapping[str, np.ndarray], function: str = "main") -> list[np.ndarray]:
    """Run a function of the module on named inputs; returns its outputs as a list."""
    return Interpreter(module).run(module.functions[function], inputs)


class Interpreter:
    def __init__(self, module: IRModule) -> None:
        self.module = module

    def run(self, function: Function, inputs: Mapping[str, np.ndarray]) -> list[np.ndarray]:
        size_vars: dict[str, int] = {}
        values: dict[Var, object] = {}
        for param in function.params:
            if param.name not in inputs:
                raise InputShapeError(f"missing input '{param.name}'")
            array = np.asarray(inputs[param.name])
            match_tensor(param.name, array, param.struct_info, size_vars)
            values[param] = array
        for binding in function.bindings():
            value = self.evaluate(binding.value, values, size_vars)
            if isinstance(binding, MatchCast):
                match_tensor(binding.var.name, value, binding.struct_info, size_vars)
            values[binding.var] = value
        result = self.evaluate(function.body.body, values, size_vars)
        outputs = list(result) if isinstance(function.body.body, Tuple) else [result]
        return [np.array(o, copy=True) for o in outputs]

    def evaluate(self, expr: Expr, values: dict, size_vars: dict[str, int]):
        if isinstance(expr, Var):
            return values[expr]
        if isinstance(expr, Constant):
            return expr.data
        if isinstance(expr, ShapeExpr):
            return np.array([evaluate(v, size_vars) for v in expr.values], dtype=np.int64)
        if isinstance(expr, Tuple):
            return tuple(self.evaluate(f, values, size_vars) for f in expr.fields)
        if isinstance(expr, Call):
            from ..ops import get_op

            arrays = [self.evaluate(a, values, size_vars) for a in expr.args]
            return get_op(expr.op).reference(arrays, expr.attrs)
        if isinstance(expr, CallTIR):
            program = self.module.programs[expr.program]
            arrays = [self.evaluate(a, values, size_vars) for a in expr.args]
            return run_program(program, arrays, _program_vars(expr.size_var_values, size_vars))
        if isinstance(expr, AllocStorage):
            return np.zeros(int(evaluate(expr.size, size_vars)), dtype=np.uint8)
        if isinstance(expr, AllocTensor):
            storage = values[expr.storage]
            info = expr.struct_info
            shape = tuple(int(evaluate(d, size_vars)) for d in info.shape)
            count = int(np.prod(shape, dtype=np.int64))
            itemsize = np.dtype(info.dtype).itemsize
            return storage[: count * itemsize].view(info.dtype).reshape(shape)
        if isinstance(expr, CallTIRInto):
            program = self.module.programs[expr.program]
            arrays = [self.evaluate(a, values, size_vars) for a in expr.args]
            output = values[expr.output]
            output[...] = run_program(program, arrays, _program_vars(expr.size_var_values, size_vars))
            return ()
        raise TypeError(f"the interpreter cannot evaluate {type(expr).__name__}")


def _program_vars(bindings: tuple[tuple[str, PrimExpr], ...], size_vars: dict[str, int]) -> dict[str, int]:
    return {name: int(evaluate(value, size_vars)) for name, value in bindings}


def match_tensor(name: str, array: np.ndarray, info, size_vars: dict[str, int]) -> None:
    """Check an array against a tensor annotation, binding unseen size variables."""
    if not isinstance(info, TensorStructInfo):
        return
    if str(array.dtype) != info.dtype:
        raise InputShapeError(f"input '{name}': dtype is {array.dtype}, expected {info.dtype}")
    if info.shape is None:
        return
    if array.ndim != len(info.shape):
        raise InputShapeError(f"input '{name}': has {array.ndim} dimensions, expected {len(info.shape)}")
    for dim, (actual, expected) in enumerate(zip(array.shape, info.shape)):
        if isinstance(expected, SizeVar) and expected.name not in size_vars:
            size_vars[expected.name] = int(actual)
            continue
        value = int(evaluate(expected, size_vars))
        if value != actual:
            raise InputShapeError(
                f"input '{name}': dimension {dim} is {actual}, expected {value} ({format_expr(expected)})"
            )


# ----------------------------------------------------------------------------------------
# Tensor programs


def run_program(program: TensorProgram, arrays: list[np.ndarray], size_vars: Mapping[str, int]) -> np.ndarray:
    """Evaluate ``output[axes] = body`` over the whole output at once with numpy."""
    shape = tuple(int(evaluate(d, size_vars)) for d in program.output.shape)
    buffers = {}
    for buffer, array in zip(program.inputs, arrays):
        expected = tuple(int(evaluate(d, size_vars)) for d in buffer.shape)
        if tuple(array.shape) != expected:
            raise ValueError(f"{program.name}: buffer {buffer.name} has shape {array.shape}, expected {expected}")
        buffers[buffer.name] = array
    grids = np.indices(shape, dtype=np.int64) if shape else np.zeros((0,), dtype=np.int64)
    environment = dict(size_vars)
    for d, axis in enumerate(program.axes):
        environment[axis.name] = grids[d]
    result = _evaluate_scalar(program.body, buffers, environment, shape)
    return np.broadcast_to(np.asarray(result), shape).astype(program.output.dtype)


def _evaluate_scalar(expr: ScalarExpr, buffers: dict, environment: dict, shape: tuple) -> np.ndarray:
    if isinstance(expr, Load):
        index = tuple(np.asarray(evaluate(i, environment)) for i in expr.indices)
        return buffers[expr.buffer.name][index] if index else buffers[expr.buffer.name][()]
    if isinstance(expr, FloatImm):
        return np.asarray(expr.value, dtype=expr.dtype)
    if isinstance(expr, Binary):
        a = _evaluate_scalar(expr.a, buffers, environment, shape)
        b = _evaluate_scalar(expr.b, buffers, environment, shape)
        return {
            "add": np.add, "subtract": np.subtract, "multiply": np.multiply,
            "divide": np.divide, "maximum": np.maximum, "minimum": np.minimum,
        }[expr.op](a, b)
    if isinstance(expr, Unary):
        a = _evaluate_scalar(expr.a, buffers, environment, shape)
        if expr.op == "sigmoid":
            return 1 / (1 + np.exp(-a))
        return {"exp": np.exp, "tanh": np.tanh, "negative": np.negative}[expr.op](a)
    if isinstance(expr, Reduce):
        # Add a leading dimension for the reduction axis: every array in the environment
        # gains a leading 1 and the axis variable spans the new dimension.
        extent = int(evaluate(expr.extent, environment))
        inner = {
            name: (value[np.newaxis] if isinstance(value, np.ndarray) else value)
            for name, value in environment.items()
        }
        depth = max((v.ndim for v in environment.values() if isinstance(v, np.ndarray)), default=0)
        inner[expr.axis.name] = np.arange(extent, dtype=np.int64).reshape((extent,) + (1,) * depth)
        body = _evaluate_scalar(expr.body, buffers, inner, shape)
        body = np.broadcast_to(body, (extent,) + np.broadcast_shapes(*(np.shape(v) for v in inner.values()))[1:])
        if extent == 0:
            return np.zeros(body.shape[1:], dtype=np.float32) if expr.combiner == "sum" else np.full(body.shape[1:], -np.inf, np.float32)
        return body.sum(axis=0) if expr.combiner == "sum" else body.max(axis=0)
    raise TypeError(f"cannot evaluate {type(expr).__name__}")
