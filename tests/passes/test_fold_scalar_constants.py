"""fold_scalar_constants: one-element constant arguments written into the tensor program.

What the pass promises (relaxweb/passes/fold_scalar_constants.py): at each call site, the
loads of a one-element constant argument (float32, int32, int64 or bool, finite) become the
constant and the argument goes; programs called with different constants are specialized per
value, identical specializations are shared, and programs nothing calls any more leave the
module.  A constant that a program gathers from (an indirect load's table) stays a buffer,
and so do constants of more elements, non-finite ones and library kernels' arguments.
"""

from __future__ import annotations

import numpy as np

from relaxweb.ir import FunctionBuilder, IRModule, SizeVar, TensorStructInfo
from relaxweb.ir.expr import Constant, CallTIR
from relaxweb.ir.interpreter import run_module
from relaxweb.ir.tir import FloatImm
from relaxweb.ops import call_op
from relaxweb.passes import fold_scalar_constants, legalize_ops
from tests.helpers import assert_close, rand
from tests.passes.rewrite import RELU, check_rewrite, check_unchanged

n = SizeVar("n")

SCALE = '''
@tensor_program
def scale(A: Buffer((n, 4), "float32"), B: Buffer((), "float32"), out: Buffer((n, 4), "float32")):
    out[i0_, i1_] = (A[i0_, i1_] * B[()])
'''


def test_fold_scalar_constants_writes_each_value_into_its_own_program() -> None:
    before = SCALE + '''
@function(inputs=["x"], outputs=["y"])
def main(x: Tensor((n, 4), "float32")) -> Tensor((n, 4), "float32"):
    with dataflow():
        a: Tensor((n, 4), "float32") = call_tir("scale", (x, const("half", 0.5, "float32")), sizes={"n": n})
        y: Tensor((n, 4), "float32") = call_tir("scale", (a, const("three", 3.0, "float32")), sizes={"n": n})
        output(y)
    return y
'''
    expected = '''
@tensor_program
def scale1(A: Buffer((n, 4), "float32"), out: Buffer((n, 4), "float32")):
    out[i0_, i1_] = (A[i0_, i1_] * float32(0.5))

@tensor_program
def scale2(A: Buffer((n, 4), "float32"), out: Buffer((n, 4), "float32")):
    out[i0_, i1_] = (A[i0_, i1_] * float32(3.0))

@function(inputs=["x"], outputs=["y"])
def main(x: Tensor((n, 4), "float32")) -> Tensor((n, 4), "float32"):
    with dataflow():
        a: Tensor((n, 4), "float32") = call_tir("scale1", (x,), sizes={"n": n})
        y: Tensor((n, 4), "float32") = call_tir("scale2", (a,), sizes={"n": n})
        output(y)
    return y
'''
    check_rewrite(fold_scalar_constants, before, expected, {"x": rand(2, 4)})


def test_fold_scalar_constants_shares_equal_values_and_folds_each_dtype() -> None:
    """Two constants of the value 0.5 give one program; an int32 of shape [1] and a bool of
    shape [1, 1] fold with their dtypes; an int64 index becomes a constant index of a gather;
    a size variable only the folded buffer had (m, bound to 1) leaves the call."""
    programs = '''
@tensor_program
def shift(A: Buffer((n, 4), "int32"), B: Buffer((m,), "int32"), C: Buffer((1, 1), "bool"), out: Buffer((n, 4), "int32")):
    out[i0_, i1_] = select(C[0, 0], (A[i0_, i1_] + B[0]), A[i0_, i1_])

@tensor_program
def row(A: Buffer((3, n), "float32"), B: Buffer((), "int64"), out: Buffer((n,), "float32")):
    out[i0_] = A[B[()], i0_]
'''
    signature = '''
@function(inputs=["x", "k", "t"], outputs=["a", "b", "d", "e"])
def main(x: Tensor((n, 4), "float32"), k: Tensor((n, 4), "int32"), t: Tensor((3, n), "float32")) -> Tuple(Tensor((n, 4), "float32"), Tensor((n, 4), "float32"), Tensor((n, 4), "int32"), Tensor((n,), "float32")):
    with dataflow():
'''
    before = SCALE + programs + signature + '''
        a: Tensor((n, 4), "float32") = call_tir("scale", (x, const("half", 0.5, "float32")), sizes={"n": n})
        b: Tensor((n, 4), "float32") = call_tir("scale", (x, const("also_half", 0.5, "float32")), sizes={"n": n})
        d: Tensor((n, 4), "int32") = call_tir("shift", (k, const("three", [3], "int32"), const("yes", [[True]], "bool")), sizes={"n": n, "m": 1})
        e: Tensor((n,), "float32") = call_tir("row", (t, const("second", 1, "int64")), sizes={"n": n})
        output(a, b, d, e)
    return (a, b, d, e)
'''
    expected = '''
@tensor_program
def scale1(A: Buffer((n, 4), "float32"), out: Buffer((n, 4), "float32")):
    out[i0_, i1_] = (A[i0_, i1_] * float32(0.5))

@tensor_program
def shift1(A: Buffer((n, 4), "int32"), out: Buffer((n, 4), "int32")):
    out[i0_, i1_] = select(bool(True), (A[i0_, i1_] + int32(3)), A[i0_, i1_])

@tensor_program
def row1(A: Buffer((3, n), "float32"), out: Buffer((n,), "float32")):
    out[i0_] = A[int64(1), i0_]
''' + signature + '''
        a: Tensor((n, 4), "float32") = call_tir("scale1", (x,), sizes={"n": n})
        b: Tensor((n, 4), "float32") = call_tir("scale1", (x,), sizes={"n": n})
        d: Tensor((n, 4), "int32") = call_tir("shift1", (k,), sizes={"n": n})
        e: Tensor((n,), "float32") = call_tir("row1", (t,), sizes={"n": n})
        output(a, b, d, e)
    return (a, b, d, e)
'''
    inputs = {"x": rand(2, 4), "k": rand(2, 4, seed=1, dtype="int32"), "t": rand(3, 2, seed=2)}
    check_rewrite(fold_scalar_constants, before, expected, inputs)


def test_fold_scalar_constants_leaves_tables_larger_and_non_finite_constants_alone() -> None:
    """A one-element table an indirect load reads, four elements, and an infinity stay
    buffers."""
    text = SCALE + '''
@tensor_program
def lookup(A: Buffer((1,), "float32"), B: Buffer((n,), "int64"), out: Buffer((n,), "float32")):
    out[i0_] = A[B[i0_]]

@tensor_program
def bias(A: Buffer((n, 4), "float32"), B: Buffer((4,), "float32"), out: Buffer((n, 4), "float32")):
    out[i0_, i1_] = (A[i0_, i1_] + B[i1_])

@function(inputs=["x", "ids"], outputs=["c", "f", "g"])
def main(x: Tensor((n, 4), "float32"), ids: Tensor((n,), "int64")) -> Tuple(Tensor((n, 4), "float32"), Tensor((n,), "float32"), Tensor((n, 4), "float32")):
    with dataflow():
        c: Tensor((n, 4), "float32") = call_tir("scale", (x, const("infinite", float("inf"), "float32")), sizes={"n": n})
        f: Tensor((n,), "float32") = call_tir("lookup", (const("table", [2.5], "float32"), ids), sizes={"n": n})
        g: Tensor((n, 4), "float32") = call_tir("bias", (x, const("four", [1.0, 2.0, 3.0, 4.0], "float32")), sizes={"n": n})
        output(c, f, g)
    return (c, f, g)
'''
    check_unchanged(fold_scalar_constants, text, {"x": rand(3, 4), "ids": np.zeros(3, np.int64)})


def test_fold_scalar_constants_folds_calls_in_if_branches() -> None:
    body = RELU + '''{programs}
@function(inputs=["x", "flag"], outputs=["y"])
def main(x: Tensor((n, 4), "float32"), flag: Tensor((), "bool")) -> Tensor((n, 4), "float32"):
    with dataflow():
        r: Tensor((n, 4), "float32") = call_tir("relu", (x,), sizes={{"n": n}})
        output(r)
    y: Tensor((n, 4), "float32")
    if flag:
        t: Tensor((n, 4), "float32") = call_tir({twice}, sizes={{"n": n}})
        y = t
    else:
        u: Tensor((n, 4), "float32") = call_tir({half}, sizes={{"n": n}})
        y = u
    return y
'''
    before = body.format(programs=SCALE, twice='"scale", (r, const("two", 2.0, "float32"))',
                         half='"scale", (r, const("half", 0.5, "float32"))')
    folded = '''
@tensor_program
def scale1(A: Buffer((n, 4), "float32"), out: Buffer((n, 4), "float32")):
    out[i0_, i1_] = (A[i0_, i1_] * float32(2.0))

@tensor_program
def scale2(A: Buffer((n, 4), "float32"), out: Buffer((n, 4), "float32")):
    out[i0_, i1_] = (A[i0_, i1_] * float32(0.5))
'''
    expected = body.format(programs=folded, twice='"scale1", (r,)', half='"scale2", (r,)')
    x = rand(3, 4)
    check_rewrite(fold_scalar_constants, before, expected, [{"x": x, "flag": np.array(True)}, {"x": x, "flag": np.array(False)}])


def test_fold_scalar_constants_writes_scalars_into_the_program() -> None:
    builder = FunctionBuilder("main")
    x = builder.add_param("x", TensorStructInfo((n, 4), "float32"))
    half = builder.emit(call_op("multiply", x, Constant(np.array(0.5, np.float32), "half")), "half")
    out = builder.emit(call_op("add", half, Constant(rand(4, seed=11), "bias")), "out", output=True)
    before = legalize_ops(IRModule({"main": builder.finish([out], ["out"])}))
    after = fold_scalar_constants(before)
    scale, bias = [b.value for b in after.main.bindings() if isinstance(b.value, CallTIR)]
    assert len(scale.args) == 1 and len(after.programs[scale.program].inputs) == 1
    assert FloatImm(0.5, "float32") in [after.programs[scale.program].body.b]
    assert len(bias.args) == 2  # a four-element constant stays a buffer
    value = rand(5, 4, seed=12)
    assert_close(run_module(after, {"x": value})[0], run_module(before, {"x": value})[0])
