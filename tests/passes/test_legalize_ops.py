"""legalize_ops: every op call becomes calls of tensor programs, added to the module once.

What the pass promises (relaxweb/passes/legalize_ops.py): each ``Call`` is replaced by the
``call_tir`` of its legalization (an op may need several programs); programs identical up to
their name are added once and shared; nothing in the function needs op semantics afterwards,
in If branches and loop bodies too; ops without a lowering and optional tensors are refused
by name.  Each IR-text test runs before, after and expected in the interpreter
(``tests/passes/rewrite.py``).
"""

from __future__ import annotations

import numpy as np
import pytest

from relaxweb.errors import UnsupportedModelError
from relaxweb.ir import Buffer, Call, CallTIR, FunctionBuilder, IRModule, ShapeExpr, SizeVar, TensorProgram, TensorStructInfo
from relaxweb.ir.expr import DataflowBlock, Function, SeqExpr, Var, VarBinding
from relaxweb.ir.interpreter import run_module
from relaxweb.ir.parser import parse_module
from relaxweb.ir.structural import assert_structural_equal
from relaxweb.ir.symbolic import prove_equal
from relaxweb.ir.tir import Binary, FloatImm, Load
from relaxweb.ops import call_op
from relaxweb.passes import legalize_ops
from tests.helpers import assert_close, rand
from tests.passes.graphs import all_call_values, mlp_module, module_of, n
from tests.passes.rewrite import ADD, EXP, RELU, TANH, check_rewrite

# Text ---------------------------------------------------------------------------------------------


def test_legalize_ops_turns_op_calls_into_program_calls() -> None:
    before = '''
@function(inputs=["x"], outputs=["y"])
def main(x: Tensor((n, 3), "float32")) -> Tensor((n, 3), "float32"):
    with dataflow():
        a: Tensor((n, 3), "float32") = add(x, const("bias", [0.0, 1.0, 2.0], "float32"))
        y: Tensor((n, 3), "float32") = relu(a)
        output(y)
    return y
'''
    expected = '''
@tensor_program
def add(A: Buffer((rows, 3), "float32"), B: Buffer((3,), "float32"), out: Buffer((rows, 3), "float32")):
    out[i0_, i1_] = (A[i0_, i1_] + B[i1_])

@tensor_program
def relu(A: Buffer((rows, 3), "float32"), out: Buffer((rows, 3), "float32")):
    out[i0_, i1_] = maximum(A[i0_, i1_], float32(0.0))

@function(inputs=["x"], outputs=["y"])
def main(data: Tensor((rows, 3), "float32")) -> Tensor((rows, 3), "float32"):
    with dataflow():
        biased: Tensor((rows, 3), "float32") = call_tir("add", (data, const("bias", [0.0, 1.0, 2.0], "float32")), sizes={"rows": rows})
        result: Tensor((rows, 3), "float32") = call_tir("relu", (biased,), sizes={"rows": rows})
        output(result)
    return result
'''
    check_rewrite(legalize_ops, before, expected, {"x": rand(5, 3)})


def test_legalize_deduplicates_identical_programs() -> None:
    """Two adds of [n, 4] tensors share one program, and so do two relus; an add of [n, 4]
    and [4] is another program, named add1."""
    before = '''
@function(inputs=["x", "y"], outputs=["e"])
def main(x: Tensor((n, 4), "float32"), y: Tensor((n, 4), "float32")) -> Tensor((n, 4), "float32"):
    with dataflow():
        a: Tensor((n, 4), "float32") = add(x, y)
        b: Tensor((n, 4), "float32") = add(a, x)
        c: Tensor((n, 4), "float32") = relu(b)
        d: Tensor((n, 4), "float32") = relu(c)
        e: Tensor((n, 4), "float32") = add(d, const("bias", [1.0, 2.0, 3.0, 4.0], "float32"))
        output(e)
    return e
'''
    expected = ADD + RELU + '''
@tensor_program
def add1(A: Buffer((n, 4), "float32"), B: Buffer((4,), "float32"), out: Buffer((n, 4), "float32")):
    out[i0_, i1_] = (A[i0_, i1_] + B[i1_])

@function(inputs=["x", "y"], outputs=["e"])
def main(x: Tensor((n, 4), "float32"), y: Tensor((n, 4), "float32")) -> Tensor((n, 4), "float32"):
    with dataflow():
        a: Tensor((n, 4), "float32") = call_tir("add", (x, y), sizes={"n": n})
        b: Tensor((n, 4), "float32") = call_tir("add", (a, x), sizes={"n": n})
        c: Tensor((n, 4), "float32") = call_tir("relu", (b,), sizes={"n": n})
        d: Tensor((n, 4), "float32") = call_tir("relu", (c,), sizes={"n": n})
        e: Tensor((n, 4), "float32") = call_tir("add1", (d, const("bias", [1.0, 2.0, 3.0, 4.0], "float32")), sizes={"n": n})
        output(e)
    return e
'''
    check_rewrite(legalize_ops, before, expected, {"x": rand(3, 4, seed=1), "y": rand(3, 4, seed=2)})


def test_legalize_reuses_and_avoids_programs_already_in_the_module() -> None:
    """A program already in the module with the body a legalization makes is called as it
    is; one that only has the name (tanh, computing 7.0) is kept, and the new one is tanh1."""
    clash = '''
@tensor_program
def tanh(A: Buffer((n, 4), "float32"), out: Buffer((n, 4), "float32")):
    out[i0_, i1_] = float32(7.0)
'''
    before = RELU + clash + '''
@function(inputs=["x"], outputs=["t"])
def main(x: Tensor((n, 4), "float32")) -> Tensor((n, 4), "float32"):
    with dataflow():
        r: Tensor((n, 4), "float32") = relu(x)
        t: Tensor((n, 4), "float32") = tanh(r)
        output(t)
    return t
'''
    expected = RELU + clash + TANH.replace("def tanh(", "def tanh1(") + '''
@function(inputs=["x"], outputs=["t"])
def main(x: Tensor((n, 4), "float32")) -> Tensor((n, 4), "float32"):
    with dataflow():
        r: Tensor((n, 4), "float32") = call_tir("relu", (x,), sizes={"n": n})
        t: Tensor((n, 4), "float32") = call_tir("tanh1", (r,), sizes={"n": n})
        output(t)
    return t
'''
    check_rewrite(legalize_ops, before, expected, {"x": rand(2, 4)})


def test_legalize_writes_an_op_of_several_programs_and_legalizes_if_branches() -> None:
    """softmax is three programs (the row max, the sum of exponentials, the normalization),
    each call bound to a new variable before the op's; the ops in both branches of an If
    become program calls too."""
    before = '''
@function(inputs=["x", "flag"], outputs=["y"])
def main(x: Tensor((n, 4), "float32"), flag: Tensor((), "bool")) -> Tensor((n, 4), "float32"):
    with dataflow():
        a: Tensor((n, 4), "float32") = softmax(x, axes=[1])
        output(a)
    y: Tensor((n, 4), "float32")
    if flag:
        t: Tensor((n, 4), "float32") = relu(a)
        y = t
    else:
        u: Tensor((n, 4), "float32") = exp(a)
        y = u
    return y
'''
    expected = '''
@tensor_program
def softmax_max(A: Buffer((n, 4), "float32"), out: Buffer((n, 1), "float32")):
    out[i0_, i1_] = max(A[i0_, r1_] for r1_ in range(4))

@tensor_program
def softmax_sum(A: Buffer((n, 4), "float32"), B: Buffer((n, 1), "float32"), out: Buffer((n, 1), "float32")):
    out[i0_, i1_] = sum(exp((A[i0_, r1_] - B[i0_, 0])) for r1_ in range(4))

@tensor_program
def softmax_normalize(A: Buffer((n, 4), "float32"), B: Buffer((n, 1), "float32"), C: Buffer((n, 1), "float32"), out: Buffer((n, 4), "float32")):
    out[i0_, i1_] = (exp((A[i0_, i1_] - B[i0_, 0])) / C[i0_, 0])
''' + RELU + EXP + '''
@function(inputs=["x", "flag"], outputs=["y"])
def main(x: Tensor((n, 4), "float32"), flag: Tensor((), "bool")) -> Tensor((n, 4), "float32"):
    with dataflow():
        row_max: Tensor((n, 1), "float32") = call_tir("softmax_max", (x,), sizes={"n": n})
        row_sum: Tensor((n, 1), "float32") = call_tir("softmax_sum", (x, row_max), sizes={"n": n})
        a: Tensor((n, 4), "float32") = call_tir("softmax_normalize", (x, row_max, row_sum), sizes={"n": n})
        output(a)
    y: Tensor((n, 4), "float32")
    if flag:
        t: Tensor((n, 4), "float32") = call_tir("relu", (a,), sizes={"n": n})
        y = t
    else:
        u: Tensor((n, 4), "float32") = call_tir("exp", (a,), sizes={"n": n})
        y = u
    return y
'''
    x = rand(3, 4)
    check_rewrite(legalize_ops, before, expected, [{"x": x, "flag": np.array(True)}, {"x": x, "flag": np.array(False)}])


def test_legalize_rewrites_a_loop_body_and_keeps_match_cast() -> None:
    """The ops of a loop's body become program calls; the loop, its tuple items and the
    match_cast (a check, not an op) stay as they are."""
    body = '''
@function(inputs=["x"], outputs=["y", "s"])
def main(x: Tensor((n, 4), "float32")) -> Tuple(Tensor((m, 4), "float32"), Tensor((3, n, 4), "float32")):
    looped: Tuple(Tensor((n, 4), "float32"), Tensor((3, n, 4), "float32"))
    for i, (c,) in loop(3, init=(x,), carried=(Tensor((n, 4), "float32"),)):
        doubled: Tensor((n, 4), "float32") = {add}
        r: Tensor((n, 4), "float32") = {relu}
        looped = (doubled, r)
    y: Tensor((n, 4), "float32") = looped[0]
    s: Tensor((3, n, 4), "float32") = looped[1]
    checked: Tensor((m, 4), "float32") = match_cast(y, Tensor((m, 4), "float32"))
    return (checked, s)
'''
    before = body.format(add="add(c, c)", relu="relu(c)")
    expected = ADD + RELU + body.format(add='call_tir("add", (c, c), sizes={"n": n})',
                                        relu='call_tir("relu", (c,), sizes={"n": n})')
    check_rewrite(legalize_ops, before, expected, {"x": rand(2, 4)})


def test_legalize_refuses_ops_without_a_lowering_and_optional_tensors_by_name() -> None:
    without_lowering = parse_module('''
@function(inputs=["x", "parts"], outputs=["y", "count"])
def main(x: Tensor((n, 4), "float32"), parts: Sequence(Tensor((n, 4), "float32"))) -> Tuple(Tensor((n, 4), "float32"), Tensor((), "int64")):
    with dataflow():
        y: Tensor((n, 4), "float32") = relu(x)
        count: Tensor((), "int64") = sequence_length(parts)
        output(y, count)
    return (y, count)
''')
    with pytest.raises(UnsupportedModelError, match=r"no GPU lowering yet for 1 op\(s\): sequence_length "):
        legalize_ops(without_lowering)
    optional = parse_module('''
@function(inputs=["x", "maybe"], outputs=["y"])
def main(x: Tensor((n, 4), "float32"), maybe: Optional(Tensor((n, 4), "float32"))) -> Tensor((n, 4), "float32"):
    with dataflow():
        y: Tensor((n, 4), "float32") = relu(x)
        output(y)
    return y
''')
    with pytest.raises(UnsupportedModelError, match="no GPU lowering yet for optional tensors: input 'maybe'"):
        legalize_ops(optional)


# Modules built in Python -------------------------------------------------------------------------


def test_legalize_replaces_every_call() -> None:
    before = mlp_module()
    after = legalize_ops(before)
    values = all_call_values(after.main)
    assert not any(isinstance(v, Call) for v in values)
    assert all(isinstance(v, CallTIR) for v in values)
    # softmax becomes three programs, each call keeps its output annotation
    assert [v.program for v in values] == [
        "matmul", "add", "relu", "matmul1", "add1", "softmax_max", "softmax_sum", "softmax_normalize",
    ]
    assert set(after.programs) == {v.program for v in values}
    for binding in after.main.bindings():
        assert binding.var.struct_info == binding.value.struct_info
        program = after.programs[binding.value.program]
        assert prove_equal(program.output.shape[0], binding.value.struct_info.shape[0])
        assert len(program.inputs) == len(binding.value.args)
    assert dict(values[0].size_var_values) == {"n": n}
    # the input module is unchanged
    assert all(isinstance(v, Call) for v in all_call_values(before.main))
    assert before.programs == {}


@pytest.mark.parametrize("rows", [1, 6])
def test_legalize_preserves_results(rows: int) -> None:
    before = mlp_module()
    after = legalize_ops(before)
    x = rand(rows, 4, seed=rows)
    (expected,) = run_module(before, {"x": x})
    (actual,) = run_module(after, {"x": x})
    assert_close(actual, expected)


def test_legalize_reshape_and_transpose_preserve_results() -> None:
    builder = FunctionBuilder("main")
    x = builder.add_param("x", TensorStructInfo((n, 6, 4), "float32"))
    r = builder.emit(call_op("reshape", x, ShapeExpr((n * 3, 8))), "r")
    t = builder.emit(call_op("transpose", r, axes=[1, 0]), "t")
    s = builder.emit(call_op("reshape", t, ShapeExpr((4, 2, n * 3))), "s", output=True)
    before = module_of(builder, [s], ["s"])
    after = legalize_ops(before)
    assert [v.program for v in all_call_values(after.main)] == ["reshape", "transpose", "reshape1"]
    for rows in (1, 5):
        x_value = rand(rows, 6, 4, seed=rows)
        expected = x_value.reshape(rows * 3, 8).T.reshape(4, 2, rows * 3)
        np.testing.assert_array_equal(run_module(before, {"x": x_value})[0], expected)
        np.testing.assert_array_equal(run_module(after, {"x": x_value})[0], expected)


def test_legalize_ops_matches_a_hand_written_expected_module_up_to_renaming() -> None:
    """before: y = relu(x); expected: y = call_tir(relu, (x,)) with the program written out,
    using other variable names (structural equality renames them)."""
    builder = FunctionBuilder("main")
    x = builder.add_param("x", TensorStructInfo((n, 4), "float32"))
    y = builder.emit(call_op("relu", x), "y", output=True)
    before = IRModule({"main": builder.finish([y], ["y"])})

    rows = SizeVar("rows")
    i, j = SizeVar("i0_"), SizeVar("i1_")
    source = Buffer("A", (rows, 4), "float32")
    program = TensorProgram("relu", (source,), Buffer("out", (rows, 4), "float32"), (i, j),
                            Binary("maximum", Load(source, (i, j)), FloatImm(0.0)))
    data = Var("data", TensorStructInfo((rows, 4), "float32"))
    result = Var("result", TensorStructInfo((rows, 4), "float32"))
    call = CallTIR("relu", (data,), TensorStructInfo((rows, 4), "float32"), (("rows", rows),))
    expected = IRModule(
        {"main": Function("main", (data,), SeqExpr((DataflowBlock((VarBinding(result, call),)),), result), ("x",), ("y",))},
        {"relu": program},
    )
    after = legalize_ops(before)
    assert_structural_equal(after, expected)
    value = rand(3, 4, seed=3)
    assert_close(run_module(after, {"x": value})[0], run_module(before, {"x": value})[0])
    assert_close(run_module(expected, {"x": value})[0], np.maximum(value, 0))
