"""Loop-level fusion (relaxweb/ir/fusion.py): a producer program inlined into its consumer
(the merge fuse_ops decides), names kept apart, and the index arithmetic a merge leaves
simplified knowing each index's range.  Each merged program runs in the interpreter against
numpy.
"""

from __future__ import annotations

import numpy as np

from relaxweb.ir import SizeVar
from relaxweb.ir.fusion import inline_producer, simplify_indices
from relaxweb.ir.interpreter import run_program
from relaxweb.ir.symbolic import Analyzer, IntImm
from relaxweb.ir.tir import Binary, Buffer, FloatImm, Load, Reduce, TensorProgram, format_program
from tests.helpers import assert_close, rand

n, m, k = SizeVar("n"), SizeVar("m"), SizeVar("k")
I0, I1, I2 = SizeVar("i0_"), SizeVar("i1_"), SizeVar("i2_")


def relu_program() -> TensorProgram:
    a = Buffer("A", (n, k), "float32")
    return TensorProgram("relu", (a,), Buffer("out", (n, k), "float32"), (I0, I1),
                         Binary("maximum", Load(a, (I0, I1)), FloatImm(0.0)))



def matmul_program() -> TensorProgram:
    a, b = Buffer("A", (n, k), "float32"), Buffer("B", (k, m), "float32")
    r = SizeVar("k_")
    body = Reduce("sum", r, k, Binary("multiply", Load(a, (I0, r)), Load(b, (r, I1))))
    return TensorProgram("matmul", (a, b), Buffer("out", (n, m), "float32"), (I0, I1), body)



def test_inline_producer_builds_the_prologue() -> None:
    values = {"n": n, "k": k, "m": m}
    fused = inline_producer(matmul_program(), values, "A", relu_program(), {"n": n, "k": k})
    # the consumer's other input first, then the producer's (renamed: B is taken)
    assert fused.input_sources == (("consumer", 1), ("producer", 0))
    b, a = fused.program.inputs
    assert b.name == "B" and a.name != "B"
    r = SizeVar("k_")
    expected_body = Reduce("sum", r, k, Binary(
        "multiply", Binary("maximum", Load(a, (I0, r)), FloatImm(0.0)), Load(b, (r, I1))))
    assert fused.program.body == expected_body
    assert fused.size_var_values == values
    left, right = rand(5, 3, seed=1), rand(3, 4, seed=2)
    got = run_program(fused.program, [right, left], {"n": 5, "k": 3, "m": 4})
    assert_close(got, np.maximum(left, 0) @ right)



def test_inline_producer_renames_clashing_size_vars_and_reduction_axes() -> None:
    # the producer is a row sum whose size var "k" is bound to another value than the consumer's
    a = Buffer("A", (n, k), "float32")
    r = SizeVar("k_")
    row_sum = TensorProgram("row_sum", (a,), Buffer("out", (n,), "float32"), (I0,),
                            Reduce("sum", r, k, Load(a, (I0, r))))
    consumer_input = Buffer("A", (n,), "float32")
    other = Buffer("B", (n, k), "float32")
    consumer = TensorProgram("scale", (consumer_input, other), Buffer("out", (n, k), "float32"), (I0, I1),
                             Binary("multiply", Load(consumer_input, (I0,)), Load(other, (I0, I1))))
    fused = inline_producer(consumer, {"n": n, "k": k}, "A", row_sum, {"n": n, "k": SizeVar("width")})
    renamed = [name for name in fused.size_var_values if name not in ("n", "k")]
    assert len(renamed) == 1 and format(fused.size_var_values[renamed[0]]) == "width"
    text = format_program(fused.program)
    assert f"in range({renamed[0]})" in text
    data, weights = rand(4, 7, seed=3), rand(4, 2, seed=4)
    got = run_program(fused.program, [weights, data], {"n": 4, "k": 2, renamed[0]: 7})
    assert_close(got, data.sum(axis=1, keepdims=True) * weights)



def test_simplify_indices_folds_reshape_arithmetic_with_symbolic_extents() -> None:
    # out[i0, i1, i2] reads a [n*m, 8] buffer through a reshape: row (i0*m + i1), column i2
    source = Buffer("A", (n * m, 8), "float32")
    flat = (I0 * m + I1) * 8 + I2
    program = TensorProgram("view", (source,), Buffer("out", (n, m, 8), "float32"), (I0, I1, I2),
                            Load(source, (flat // 8 % (n * m), flat % 8)))
    simplified = simplify_indices(program)
    assert [str(i) for i in simplified.body.indices] == ["i0_ * m + i1_", "i2_"]
    analyzer = Analyzer().with_symbolic_upper("s", SizeVar("S") - 1)
    assert analyzer.prove_less(SizeVar("s"), SizeVar("S"))
    assert not Analyzer().prove_less(SizeVar("s"), SizeVar("S"))



def test_inlining_at_a_known_index_drops_the_branch_not_taken() -> None:
    from relaxweb.ir.tir import Compare, IndexValue, Select

    # concat(A[n, 2], B[n, 3]) along axis 1, read by a consumer at column 4 only
    a, b = Buffer("A", (n, 2), "float32"), Buffer("B", (n, 3), "float32")
    concat = TensorProgram("concat", (a, b), Buffer("out", (n, 5), "float32"), (I0, I1), Select(
        Compare("lt", IndexValue(I1), IndexValue(2)), Load(a, (I0, I1)), Load(b, (I0, I1 - 2))))
    source = Buffer("C", (n, 5), "float32")
    column = TensorProgram("column", (source,), Buffer("out", (n,), "float32"), (I0,), Load(source, (I0, IntImm(4))))
    fused = inline_producer(column, {"n": n}, "C", concat, {"n": n})
    # the select is gone, and with it the load of A at column 4 (outside A's 2 columns)
    assert fused.program.body == Load(fused.program.inputs[1], (I0, IntImm(2)))
    left, right = rand(3, 2, seed=19), rand(3, 3, seed=20)
    np.testing.assert_array_equal(run_program(fused.program, [left, right], {"n": 3}), right[:, 2])
