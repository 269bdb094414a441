"""Small graphs built with the FunctionBuilder that the pass and pipeline tests share."""

from __future__ import annotations

from relaxweb.ir import Constant, FunctionBuilder, IRModule, SizeVar, TensorStructInfo, Var
from relaxweb.ir.expr import Function
from relaxweb.ops import call_op
from tests.helpers import rand

n = SizeVar("n")
m = SizeVar("m")


def module_of(builder: FunctionBuilder, outputs: list[Var], names: list[str], **attrs) -> IRModule:
    return IRModule({"main": builder.finish(outputs, names)}, attrs=dict(attrs))


def mlp_module() -> IRModule:
    """x[n, 4] -> matmul -> add -> relu -> matmul -> add -> softmax."""
    builder = FunctionBuilder("main")
    x = builder.add_param("x", TensorStructInfo((n, 4), "float32"))
    h = builder.emit(call_op("matmul", x, Constant(rand(4, 8, seed=1), "w1")), "h")
    h = builder.emit(call_op("add", h, Constant(rand(8, seed=2), "b1")), "h_bias")
    h = builder.emit(call_op("relu", h), "h_relu")
    h = builder.emit(call_op("matmul", h, Constant(rand(8, 3, seed=3), "w2")), "logits")
    h = builder.emit(call_op("add", h, Constant(rand(3, seed=4), "b2")), "logits_bias")
    y = builder.emit(call_op("softmax", h, axes=[1]), "y", output=True)
    return module_of(builder, [y], ["y"])


def chain_module() -> IRModule:
    """Four elementwise ops in a chain: relu -> tanh -> exp -> negative."""
    builder = FunctionBuilder("main")
    x = builder.add_param("x", TensorStructInfo((n, 4), "float32"))
    a = builder.emit(call_op("relu", x), "a")
    b = builder.emit(call_op("tanh", a), "b")
    c = builder.emit(call_op("exp", b), "c")
    d = builder.emit(call_op("negative", c), "d", output=True)
    return module_of(builder, [d], ["d"])


def all_call_values(function: Function) -> list:
    return [b.value for b in function.bindings()]
