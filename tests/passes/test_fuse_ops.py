"""fuse_ops: producer/consumer tensor-program calls merged into one kernel.

What the pass promises (relaxweb/passes/fuse_ops.py): a producer without reductions merges
into every consumer that reads it by plain loads (elementwise chains, prologues of a matmul);
a producer with reductions merges into its single consumer when that consumer has no
reduction, reads it at one index and has no more elements (an epilogue).  A producer merges
only when every use of its result is such a consumer in the same dataflow block or loop
body: function outputs, If branches and library kernels keep theirs.  Merged programs are
named ``fused_<first>__<last>``, take the consumer's other inputs then the producer's
(renamed where a name is taken), and programs nothing calls leave the module.
"""

from __future__ import annotations

import numpy as np

from relaxweb.ir import FunctionBuilder, IRModule, SizeVar, TensorStructInfo
from relaxweb.ir.expr import CallTIR, DataflowBlock, Function, SeqExpr, ShapeExpr, Var, VarBinding
from relaxweb.ir.interpreter import run_module
from relaxweb.ir.parser import parse_module
from relaxweb.ir.pattern import Pattern, program_pattern
from relaxweb.ir.structural import assert_structural_equal
from relaxweb.ir.tir import Binary, Buffer, FloatImm, Load, TensorProgram, Unary, format_program
from relaxweb.ops import call_op
from relaxweb.passes import fuse_ops, legalize_ops
from tests.helpers import assert_close, rand
from tests.passes.graphs import chain_module, mlp_module
from tests.passes.rewrite import EXP, MATMUL, RELU, check_rewrite, check_unchanged

n, m = SizeVar("n"), SizeVar("m")


def tensor(*shape) -> TensorStructInfo:
    return TensorStructInfo(tuple(shape), "float32")


def calls(module: IRModule) -> list[CallTIR]:
    return [b.value for b in module.main.bindings() if isinstance(b.value, CallTIR)]


def programs_of(module: IRModule) -> list[TensorProgram]:
    return [module.programs[c.program] for c in calls(module)]


ROW_SUM = '''
@tensor_program
def row_sum(A: Buffer((n, 4), "float32"), out: Buffer((n, 1), "float32")):
    out[i0_, i1_] = sum(A[i0_, r1_] for r1_ in range(4))
'''


# Text ---------------------------------------------------------------------------------------------


def test_fuse_ops_merges_an_activation_chain_into_the_matmul_prologue() -> None:
    before = RELU + EXP + MATMUL + '''
@function(inputs=["x"], outputs=["y"])
def main(x: Tensor((n, 4), "float32")) -> Tensor((n, 8), "float32"):
    with dataflow():
        a: Tensor((n, 4), "float32") = call_tir("relu", (x,), sizes={"n": n})
        b: Tensor((n, 4), "float32") = call_tir("exp", (a,), sizes={"n": n})
        y: Tensor((n, 8), "float32") = call_tir("matmul", (b, const("w")), sizes={"n": n})
        output(y)
    return y
'''
    expected = '''
@tensor_program
def fused_relu__matmul(B: Buffer((4, 8), "float32"), A: Buffer((n, 4), "float32"), out: Buffer((n, 8), "float32")):
    out[i0_, i1_] = sum((exp(maximum(A[i0_, k_], float32(0.0))) * B[k_, i1_]) for k_ in range(4))

@function(inputs=["x"], outputs=["y"])
def main(x: Tensor((n, 4), "float32")) -> Tensor((n, 8), "float32"):
    with dataflow():
        y: Tensor((n, 8), "float32") = call_tir("fused_relu__matmul", (const("w"), x), sizes={"n": n})
        output(y)
    return y
'''
    check_rewrite(fuse_ops, before, expected, {"x": rand(3, 4)}, {"w": rand(4, 8, seed=1)})


def test_fuse_ops_merges_a_bias_and_an_activation_into_the_matmul_epilogue() -> None:
    """matmul -> add bias -> relu: the matmul merges into the add (one consumer, one index,
    as many elements), then that into the relu.  The producer's B is taken by the bias: B_1."""
    before = MATMUL + '''
@tensor_program
def add(A: Buffer((n, 8), "float32"), B: Buffer((8,), "float32"), out: Buffer((n, 8), "float32")):
    out[i0_, i1_] = (A[i0_, i1_] + B[i1_])

@tensor_program
def relu(A: Buffer((n, 8), "float32"), out: Buffer((n, 8), "float32")):
    out[i0_, i1_] = maximum(A[i0_, i1_], float32(0.0))

@function(inputs=["x"], outputs=["y"])
def main(x: Tensor((n, 4), "float32")) -> Tensor((n, 8), "float32"):
    with dataflow():
        product: Tensor((n, 8), "float32") = call_tir("matmul", (x, const("w")), sizes={"n": n})
        biased: Tensor((n, 8), "float32") = call_tir("add", (product, const("bias")), sizes={"n": n})
        y: Tensor((n, 8), "float32") = call_tir("relu", (biased,), sizes={"n": n})
        output(y)
    return y
'''
    expected = '''
@tensor_program
def fused_matmul__relu(B: Buffer((8,), "float32"), A: Buffer((n, 4), "float32"), B_1: Buffer((4, 8), "float32"), out: Buffer((n, 8), "float32")):
    out[i0_, i1_] = maximum((sum((A[i0_, k_] * B_1[k_, i1_]) for k_ in range(4)) + B[i1_]), float32(0.0))

@function(inputs=["x"], outputs=["y"])
def main(x: Tensor((n, 4), "float32")) -> Tensor((n, 8), "float32"):
    with dataflow():
        y: Tensor((n, 8), "float32") = call_tir("fused_matmul__relu", (const("bias"), x, const("w")), sizes={"n": n})
        output(y)
    return y
'''
    check_rewrite(fuse_ops, before, expected, {"x": rand(3, 4)}, {"w": rand(4, 8, seed=1), "bias": rand(8, seed=2)})


def test_fuse_ops_merges_an_activation_as_an_epilogue_before_as_a_prologue() -> None:
    """matmul -> relu -> matmul: epilogues merge first, so the relu is computed once per
    element after the first matmul, not once per use inside the second one's tiles."""
    project = '''
@tensor_program
def project(A: Buffer((n, 8), "float32"), B: Buffer((8, 3), "float32"), out: Buffer((n, 3), "float32")):
    out[i0_, i1_] = sum((A[i0_, k_] * B[k_, i1_]) for k_ in range(8))
'''
    before = MATMUL + '''
@tensor_program
def relu(A: Buffer((n, 8), "float32"), out: Buffer((n, 8), "float32")):
    out[i0_, i1_] = maximum(A[i0_, i1_], float32(0.0))
''' + project + '''
@function(inputs=["x"], outputs=["y"])
def main(x: Tensor((n, 4), "float32")) -> Tensor((n, 3), "float32"):
    with dataflow():
        h: Tensor((n, 8), "float32") = call_tir("matmul", (x, const("w")), sizes={"n": n})
        r: Tensor((n, 8), "float32") = call_tir("relu", (h,), sizes={"n": n})
        y: Tensor((n, 3), "float32") = call_tir("project", (r, const("v")), sizes={"n": n})
        output(y)
    return y
'''
    expected = '''
@tensor_program
def fused_matmul__relu(A: Buffer((n, 4), "float32"), B: Buffer((4, 8), "float32"), out: Buffer((n, 8), "float32")):
    out[i0_, i1_] = maximum(sum((A[i0_, k_] * B[k_, i1_]) for k_ in range(4)), float32(0.0))
''' + project + '''
@function(inputs=["x"], outputs=["y"])
def main(x: Tensor((n, 4), "float32")) -> Tensor((n, 3), "float32"):
    with dataflow():
        r: Tensor((n, 8), "float32") = call_tir("fused_matmul__relu", (x, const("w")), sizes={"n": n})
        y: Tensor((n, 3), "float32") = call_tir("project", (r, const("v")), sizes={"n": n})
        output(y)
    return y
'''
    check_rewrite(fuse_ops, before, expected, {"x": rand(3, 4)}, {"w": rand(4, 8, seed=1), "v": rand(8, 3, seed=2)})


def test_fuse_ops_keeps_shared_reductions_outputs_and_library_kernels_apart() -> None:
    """The row sum has two readers (a reduction merges into one only); r is an output, so
    the product merges into it but r itself stays; the subtraction merges into the add (its
    A is taken: A_1); the library kernel merges with nothing."""
    programs = '''
@library_kernel(builder="unique_count", args={"name": "unique_count", "length": sym(k), "dtype": "float32"})
def unique_count(values: Buffer((k,), "float32"), out: Buffer((1,), "int32")): ...
''' + ROW_SUM
    signature = '''
@function(inputs=["x", "flat"], outputs=["r", "out", "counted"])
def main(x: Tensor((n, 4), "float32"), flat: Tensor((k,), "float32")) -> Tuple(Tensor((n, 4), "float32"), Tensor((n, 4), "float32"), Tensor((1,), "int32")):
    with dataflow():
        total: Tensor((n, 1), "float32") = call_tir("row_sum", (x,), sizes={"n": n})
        counted: Tensor((1,), "int32") = call_library("unique_count", (flat,), sizes={"k": k})
'''
    before = programs + '''
@tensor_program
def multiply(A: Buffer((n, 4), "float32"), B: Buffer((n, 1), "float32"), out: Buffer((n, 4), "float32")):
    out[i0_, i1_] = (A[i0_, i1_] * B[i0_, 0])

@tensor_program
def subtract(A: Buffer((n, 4), "float32"), B: Buffer((n, 1), "float32"), out: Buffer((n, 4), "float32")):
    out[i0_, i1_] = (A[i0_, i1_] - B[i0_, 0])

@tensor_program
def add(A: Buffer((n, 4), "float32"), B: Buffer((n, 4), "float32"), out: Buffer((n, 4), "float32")):
    out[i0_, i1_] = (A[i0_, i1_] + B[i0_, i1_])
''' + RELU + signature + '''
        scaled: Tensor((n, 4), "float32") = call_tir("multiply", (x, total), sizes={"n": n})
        shifted: Tensor((n, 4), "float32") = call_tir("subtract", (x, total), sizes={"n": n})
        r: Tensor((n, 4), "float32") = call_tir("relu", (scaled,), sizes={"n": n})
        out: Tensor((n, 4), "float32") = call_tir("add", (r, shifted), sizes={"n": n})
        output(r, out, counted)
    return (r, out, counted)
'''
    expected = programs + '''
@tensor_program
def fused_multiply__relu(A: Buffer((n, 4), "float32"), B: Buffer((n, 1), "float32"), out: Buffer((n, 4), "float32")):
    out[i0_, i1_] = maximum((A[i0_, i1_] * B[i0_, 0]), float32(0.0))

@tensor_program
def fused_subtract__add(A: Buffer((n, 4), "float32"), A_1: Buffer((n, 4), "float32"), B: Buffer((n, 1), "float32"), out: Buffer((n, 4), "float32")):
    out[i0_, i1_] = (A[i0_, i1_] + (A_1[i0_, i1_] - B[i0_, 0]))
''' + signature + '''
        r: Tensor((n, 4), "float32") = call_tir("fused_multiply__relu", (x, total), sizes={"n": n})
        out: Tensor((n, 4), "float32") = call_tir("fused_subtract__add", (r, x, total), sizes={"n": n})
        output(r, out, counted)
    return (r, out, counted)
'''
    check_rewrite(fuse_ops, before, expected, {"x": rand(6, 4, seed=7), "flat": np.array([3, 1, 3], np.float32)})


def test_fuse_ops_leaves_a_reduction_read_at_more_elements_and_if_branches_alone() -> None:
    """The row sum's reader has four times its elements (merged, the sum would be computed
    once per element); the chain in the If branch and the relu read by it keep their calls."""
    text = ROW_SUM + RELU + EXP + '''
@tensor_program
def multiply(A: Buffer((n, 4), "float32"), B: Buffer((n, 1), "float32"), out: Buffer((n, 4), "float32")):
    out[i0_, i1_] = (A[i0_, i1_] * B[i0_, 0])

@function(inputs=["x", "flag"], outputs=["scaled", "y"])
def main(x: Tensor((n, 4), "float32"), flag: Tensor((), "bool")) -> Tuple(Tensor((n, 4), "float32"), Tensor((n, 4), "float32")):
    with dataflow():
        total: Tensor((n, 1), "float32") = call_tir("row_sum", (x,), sizes={"n": n})
        scaled: Tensor((n, 4), "float32") = call_tir("multiply", (x, total), sizes={"n": n})
        r: Tensor((n, 4), "float32") = call_tir("relu", (x,), sizes={"n": n})
        output(scaled, r)
    y: Tensor((n, 4), "float32")
    if flag:
        a: Tensor((n, 4), "float32") = call_tir("exp", (r,), sizes={"n": n})
        b: Tensor((n, 4), "float32") = call_tir("relu", (a,), sizes={"n": n})
        y = b
    else:
        y = r
    return (scaled, y)
'''
    x = rand(3, 4)
    check_unchanged(fuse_ops, text, [{"x": x, "flag": np.array(True)}, {"x": x, "flag": np.array(False)}])


CONCAT = '''
@tensor_program
def concat(A: Buffer((n, 2), "float32"), B: Buffer((n, 2), "float32"), out: Buffer((n, 4), "float32")):
    out[i0_, i1_] = select((index(i1_) < index(2)), A[i0_, i1_], B[i0_, i1_ - 2])
'''


def test_fuse_ops_computes_a_math_function_once_for_several_consumers() -> None:
    """An elementwise producer that calls a math function (exp) and feeds two kernels (two
    row sums, both outputs) stays a kernel: merged, each would compute it again.  One
    without (relu) merges into both."""
    def graph(producer: str) -> str:
        return ROW_SUM + {"exp": EXP, "relu": RELU}[producer] + f'''
@function(inputs=["x"], outputs=["s", "t"])
def main(x: Tensor((n, 4), "float32")) -> Tuple(Tensor((n, 1), "float32"), Tensor((n, 1), "float32")):
    with dataflow():
        a: Tensor((n, 4), "float32") = call_tir("{producer}", (x,), sizes={{"n": n}})
        s: Tensor((n, 1), "float32") = call_tir("row_sum", (a,), sizes={{"n": n}})
        t: Tensor((n, 1), "float32") = call_tir("row_sum", (a,), sizes={{"n": n}})
        output(s, t)
    return (s, t)
'''
    check_unchanged(fuse_ops, graph("exp"), {"x": rand(3, 4)})
    merged = fuse_ops(parse_module(graph("relu")))
    assert [call.program for call in calls(merged)] == ["fused_relu__row_sum", "fused_relu__row_sum"]


def test_fuse_ops_keeps_a_concatenation_before_a_reduction() -> None:
    """A concatenation (a select between inputs by index) merged into a row sum would pick
    its input at every step of every sum: it stays a kernel of its own, written once."""
    text = CONCAT + ROW_SUM + '''
@function(inputs=["x", "y"], outputs=["total"])
def main(x: Tensor((n, 2), "float32"), y: Tensor((n, 2), "float32")) -> Tensor((n, 1), "float32"):
    with dataflow():
        c: Tensor((n, 4), "float32") = call_tir("concat", (x, y), sizes={"n": n})
        total: Tensor((n, 1), "float32") = call_tir("row_sum", (c,), sizes={"n": n})
        output(total)
    return total
'''
    check_unchanged(fuse_ops, text, {"x": rand(3, 2), "y": rand(3, 2, seed=1)})


def test_fuse_ops_merges_a_concatenation_into_an_activation() -> None:
    before = CONCAT + RELU + '''
@function(inputs=["x", "y"], outputs=["r"])
def main(x: Tensor((n, 2), "float32"), y: Tensor((n, 2), "float32")) -> Tensor((n, 4), "float32"):
    with dataflow():
        c: Tensor((n, 4), "float32") = call_tir("concat", (x, y), sizes={"n": n})
        r: Tensor((n, 4), "float32") = call_tir("relu", (c,), sizes={"n": n})
        output(r)
    return r
'''
    expected = '''
@tensor_program
def fused_concat__relu(A: Buffer((n, 2), "float32"), B: Buffer((n, 2), "float32"), out: Buffer((n, 4), "float32")):
    out[i0_, i1_] = maximum(select((index(i1_) < index(2)), A[i0_, i1_], B[i0_, i1_ - 2]), float32(0.0))

@function(inputs=["x", "y"], outputs=["r"])
def main(x: Tensor((n, 2), "float32"), y: Tensor((n, 2), "float32")) -> Tensor((n, 4), "float32"):
    with dataflow():
        r: Tensor((n, 4), "float32") = call_tir("fused_concat__relu", (x, y), sizes={"n": n})
        output(r)
    return r
'''
    check_rewrite(fuse_ops, before, expected, {"x": rand(3, 2), "y": rand(3, 2, seed=1)})


def test_fuse_ops_merges_a_chain_in_a_loop_body() -> None:
    """A loop's body is fused like a dataflow block (each launch saved is saved at every
    iteration)."""
    loop = '''
@function(inputs=["x"], outputs=["y"])
def main(x: Tensor((n, 4), "float32")) -> Tensor((n, 4), "float32"):
    looped: Tuple(Tensor((n, 4), "float32"))
    for i, (c,) in loop(3, init=(x,), carried=(Tensor((n, 4), "float32"),)):
{body}
    y: Tensor((n, 4), "float32") = looped[0]
    return y
'''
    before = RELU + EXP + loop.format(body='''\
        a: Tensor((n, 4), "float32") = call_tir("relu", (c,), sizes={"n": n})
        b: Tensor((n, 4), "float32") = call_tir("exp", (a,), sizes={"n": n})
        looped = (b,)''')
    expected = '''
@tensor_program
def fused_relu__exp(A: Buffer((n, 4), "float32"), out: Buffer((n, 4), "float32")):
    out[i0_, i1_] = exp(maximum(A[i0_, i1_], float32(0.0)))
''' + loop.format(body='''\
        b: Tensor((n, 4), "float32") = call_tir("fused_relu__exp", (c,), sizes={"n": n})
        looped = (b,)''')
    check_rewrite(fuse_ops, before, expected, {"x": rand(2, 4) * 0.1})


# Modules built in Python -------------------------------------------------------------------------


def test_fuse_ops_merges_an_elementwise_chain_into_one_program() -> None:
    before = legalize_ops(chain_module())
    after = fuse_ops(before)

    rows = SizeVar("rows")
    i, j = SizeVar("i"), SizeVar("j")
    source = Buffer("A", (rows, 4), "float32")
    body = Unary("negative", Unary("exp", Unary("tanh", Binary("maximum", Load(source, (i, j)), FloatImm(0.0)))))
    program = TensorProgram("fused_relu__negative", (source,), Buffer("out", (rows, 4), "float32"), (i, j), body)
    data = Var("data", tensor(rows, 4))
    result = Var("result", tensor(rows, 4))
    call = CallTIR("fused_relu__negative", (data,), tensor(rows, 4), (("rows", rows),))
    expected = IRModule(
        {"main": Function("main", (data,), SeqExpr((DataflowBlock((VarBinding(result, call),)),), result), ("x",), ("d",))},
        {"fused_relu__negative": program},
    )
    assert_structural_equal(after, expected)
    value = rand(3, 4, seed=5)
    want = run_module(before, {"x": value})[0]
    assert_close(run_module(after, {"x": value})[0], want)
    assert_close(run_module(expected, {"x": value})[0], want)


def test_fuse_ops_merges_epilogues_and_prologues_of_an_mlp() -> None:
    before = legalize_ops(mlp_module())
    after = fuse_ops(before)
    assert len(calls(before)) == 8
    # matmul+bias+relu; matmul+bias (a reduction does not merge into another reduction);
    # softmax max, sum and normalize (the logits have three readers, so they stay)
    patterns = [program_pattern(p) for p in programs_of(after)]
    assert len(calls(after)) == 5, [format_program(p) for p in programs_of(after)]
    assert patterns[:2] == [Pattern.MATMUL, Pattern.MATMUL]
    first = format_program(programs_of(after)[0])
    assert "maximum(" in first and "sum(" in first  # bias + relu epilogue of the first matmul
    # nothing left in the module that no call uses
    assert set(after.programs) == {c.program for c in calls(after)}
    for rows in (1, 5):
        value = rand(rows, 4, seed=rows)
        assert_close(run_module(after, {"x": value})[0], run_module(before, {"x": value})[0])


def test_fuse_ops_keeps_shared_reductions_outputs_and_library_kernels() -> None:
    builder = FunctionBuilder("main")
    x = builder.add_param("x", tensor(n, 4))
    flat = builder.add_param("flat", tensor(m))
    total = builder.emit(call_op("sum", x, axes=[1], keepdims=True), "total")
    scaled = builder.emit(call_op("multiply", x, total), "scaled")      # reads total
    shifted = builder.emit(call_op("subtract", x, total), "shifted")    # reads total again
    distinct = builder.emit(call_op("unique", flat), "distinct")
    relu = builder.emit(call_op("relu", scaled), "relu", output=True)   # an output: stays
    out = builder.emit(call_op("add", relu, shifted), "out", output=True)
    module = IRModule({"main": builder.finish([relu, out, distinct], ["relu", "out", "distinct"])})
    before = legalize_ops(module)
    after = fuse_ops(before)
    produced = {b.var.name for b in after.main.bindings() if isinstance(b.value, CallTIR)}
    assert {"total", "relu", "distinct"} <= produced  # used twice / a function output / opaque
    assert "scaled" not in produced and "shifted" not in produced  # merged into their consumers
    inputs = {"x": rand(6, 4, seed=7), "flat": np.array([3, 1, 3], np.float32)}
    for got, want in zip(run_module(after, inputs), run_module(before, inputs)):
        assert_close(got, want)


def test_fuse_ops_stays_within_eight_storage_buffers() -> None:
    builder = FunctionBuilder("main")
    params = [builder.add_param(f"x{i}", tensor(n, 4)) for i in range(10)]
    total = params[0]
    for index, param in enumerate(params[1:]):
        total = builder.emit(call_op("add", total, param), f"sum{index}")
    out = builder.emit(call_op("relu", total), "out", output=True)
    module = IRModule({"main": builder.finish([out], ["out"])})
    before = legalize_ops(module)
    after = fuse_ops(before)
    assert len(calls(after)) < len(calls(before))
    assert all(len(p.inputs) + 1 <= 8 for p in programs_of(after))
    inputs = {f"x{i}": rand(2, 4, seed=i) for i in range(10)}
    assert_close(run_module(after, inputs)[0], run_module(before, inputs)[0])


def test_fusion_keeps_a_matmul_tiled_rather_than_merge_a_head_transpose() -> None:
    # attention's probs @ v, then the transpose and reshape that merge the heads
    builder = FunctionBuilder("main")
    probs = builder.add_param("probs", tensor(n, 4, m, m))
    values = builder.add_param("values", tensor(n, 4, m, 8))
    context = builder.emit(call_op("matmul", probs, values), "context")
    swapped = builder.emit(call_op("transpose", context, axes=[0, 2, 1, 3]), "swapped")
    merged = builder.emit(call_op("reshape", swapped, ShapeExpr((n, m, 32))), "merged", output=True)
    before = legalize_ops(IRModule({"main": builder.finish([merged], ["merged"])}))
    after = fuse_ops(before)
    patterns = [program_pattern(p) for p in programs_of(after)]
    assert patterns[0] == Pattern.MATMUL and len(patterns) == 2  # the transpose and reshape merge together
    inputs = {"probs": rand(2, 4, 3, 3, seed=13), "values": rand(2, 4, 3, 8, seed=14)}
    assert_close(run_module(after, inputs)[0], run_module(before, inputs)[0])


SPACE_TO_DEPTH = '''
@tensor_program
def space_to_depth(A: Buffer((1, 2, n), "float32"), out: Buffer((1, 2, n), "float32")):
    out[i0_, i1_, i2_] = select((index(i1_) < index(1)), A[0, 1, i2_], A[0, 0, i2_])
'''

WINDOWED = '''
@tensor_program
def conv(A: Buffer((1, 2, n), "float32"), W: Buffer((3, 2, 3), "float32"), out: Buffer((1, 3, n), "float32")):
    out[i0_, i1_, i2_] = sum(sum(select((index(i2_ + rk_ - 1) >= index(0)), select((index(i2_ + rk_ - 1) < index(n)), (A[0, rc_, i2_ + rk_ - 1] * W[i1_, rc_, rk_]), float32(0.0)), float32(0.0)) for rk_ in range(3)) for rc_ in range(2))
'''


def test_fuse_ops_keeps_a_selection_by_index_before_a_window() -> None:
    """A selection between parts of one input by index (YOLOX's space-to-depth stem) stays a
    kernel before a convolution: the convolution's prologue is evaluated at every position
    of its window, the selection with it."""
    text = SPACE_TO_DEPTH + WINDOWED + '''
@function(inputs=["x", "w"], outputs=["y"])
def main(x: Tensor((1, 2, n), "float32"), w: Tensor((3, 2, 3), "float32")) -> Tensor((1, 3, n), "float32"):
    with dataflow():
        s: Tensor((1, 2, n), "float32") = call_tir("space_to_depth", (x,), sizes={"n": n})
        y: Tensor((1, 3, n), "float32") = call_tir("conv", (s, w), sizes={"n": n})
        output(y)
    return y
'''
    assert program_pattern(parse_module(text).programs["conv"]) is Pattern.MATMUL
    check_unchanged(fuse_ops, text, {"x": rand(1, 2, 5), "w": rand(3, 2, 3, seed=1)})


TILES = '''
@tensor_program
def tiles(A: Buffer((m, n, 3), "float32"), W: Buffer((3, 2, 2), "float32"), out: Buffer((m, n, 2, 2), "float32")):
    out[i0_, i1_, i2_, i3_] = sum((A[i0_, i1_, rc_] * W[rc_, i2_, i3_]) for rc_ in range(3))

@tensor_program
def interleave(A: Buffer((m, n, 2, 2), "float32"), out: Buffer((m, 2, n * 2), "float32")):
    out[i0_, i1_, i2_] = A[i0_, i2_ // 2, i1_, i2_ % 2]
'''


def test_fuse_ops_keeps_a_matmul_whose_epilogue_would_make_its_rows_batch() -> None:
    """An epilogue that interleaves a matmul's rows and columns in one axis (a transposed
    convolution's tiles read as its output) would leave a program that is still matmul-like
    but with fewer rows x columns (m rows x 2 columns, the interleaved axis a batch axis,
    against m n rows x 4 columns): the matmul keeps its tiles and the epilogue is a kernel."""
    text = TILES + '''
@function(inputs=["x", "w"], outputs=["y"])
def main(x: Tensor((m, n, 3), "float32"), w: Tensor((3, 2, 2), "float32")) -> Tensor((m, 2, n * 2), "float32"):
    with dataflow():
        t: Tensor((m, n, 2, 2), "float32") = call_tir("tiles", (x, w), sizes={"m": m, "n": n})
        y: Tensor((m, 2, n * 2), "float32") = call_tir("interleave", (t,), sizes={"m": m, "n": n})
        output(y)
    return y
'''
    check_unchanged(fuse_ops, text, {"x": rand(2, 5, 3), "w": rand(3, 2, 2, seed=1)})
