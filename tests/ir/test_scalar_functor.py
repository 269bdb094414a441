"""The scalar-expression functor (relaxweb/ir/scalar_functor.py): its table covers every kind,
the visitor reaches every node, the mutator keeps unchanged nodes and rebuilds changed ones;
and the renderer base the backends share (relaxweb/ir/scalar_renderer.py)."""

from __future__ import annotations

import pytest

from relaxweb.ir.lower_index import Constant
from relaxweb.ir.scalar_functor import SCALAR_METHODS, ScalarFunctor, ScalarMutator, ScalarVisitor, scalar_operands
from relaxweb.ir.scalar_renderer import ScalarRenderer
from relaxweb.ir.symbolic import IntImm, SizeVar
from relaxweb.ir.tir import (
    BinaryOp, Buffer, Cast, FloatImm, Gather, IndexValue, Load, Reduce, ScalarExpr, Select, TensorProgram, Unary,
    UnaryOp, scalar_children, scalar_nodes,
)

i, k, n = SizeVar("i"), SizeVar("k"), SizeVar("n")
A = Buffer("A", (n, 4), "float32")
IDX = Buffer("idx", (n,), "int32")


def body() -> ScalarExpr:
    load = Load(A, (i, k))
    gathered = Gather(A, (Cast("int32", Load(IDX, (i,))), 0))
    total = Reduce("sum", k, 4, load * 2.0 + gathered)
    return Select(total.gt(0.0), Unary(UnaryOp.EXP, total), Cast("float32", IndexValue(i)) - FloatImm(1.0))


def test_the_table_names_every_scalar_kind() -> None:
    modules = ("relaxweb.ir.tir", "relaxweb.ir.integer_checks")  # the node classes live in these
    classes = {cls for module in modules for cls in vars(__import__(module, fromlist=["x"])).values()
               if isinstance(cls, type) and issubclass(cls, ScalarExpr) and cls is not ScalarExpr}
    kinds = [vars(cls).get("scalar_kind") for cls in classes]  # each class names its own kind
    assert None not in kinds and len(set(kinds)) == len(classes) and set(SCALAR_METHODS) == set(kinds)
    for method in SCALAR_METHODS.values():
        assert hasattr(ScalarVisitor, method) and hasattr(ScalarMutator, method)


def test_operands_are_the_children_in_order() -> None:
    for node in scalar_nodes(body()):
        assert scalar_operands(node) == scalar_children(node)


def test_the_visitor_reaches_every_node() -> None:
    seen = []

    class Collect(ScalarVisitor):
        def visit(self, expr):
            seen.append(expr)
            return super().visit(expr)

    Collect().visit(body())
    assert seen == list(scalar_nodes(body()))


def test_the_mutator_keeps_unchanged_nodes_and_rebuilds_changed_ones() -> None:
    expr = body()
    assert ScalarMutator().visit(expr) is expr

    class DoubleConstants(ScalarMutator):
        def visit_float_imm(self, imm):
            return FloatImm(imm.value * 2, imm.dtype)

    rebuilt = DoubleConstants().visit(expr)
    assert rebuilt is not expr
    assert sorted(node.value for node in scalar_nodes(rebuilt) if isinstance(node, FloatImm)) == [0.0, 2.0, 4.0, 4.0]  # the sum is read twice
    untouched = expr.condition.a.body.b  # the gather: no constant below it
    assert rebuilt.condition.a.body.b is untouched


def test_a_functor_without_a_method_names_the_kind() -> None:
    class OnlyLoads(ScalarFunctor):
        def visit_load(self, expr):
            return expr.buffer.name

    assert OnlyLoads().visit(Load(A, (i, k))) == "A"
    with pytest.raises(NotImplementedError, match="OnlyLoads does not handle FloatImm"):
        OnlyLoads().visit(FloatImm(1.0))
    with pytest.raises(TypeError, match="not a scalar expression kind: int"):
        OnlyLoads().visit(3)


def test_extra_arguments_pass_through() -> None:
    class Depth(ScalarVisitor):
        def visit_load(self, expr, depth=0):
            return depth

        def visit_unary(self, expr, depth=0):
            return self.visit(expr.a, depth + 1)

    assert Depth().visit(Unary(UnaryOp.EXP, Unary(UnaryOp.EXP, Load(A, (i, k)))), 0) == 2


class TextRenderer(ScalarRenderer):
    """A renderer to a toy language: ``let`` statements, Python operators."""

    binary_renderings = {BinaryOp.ADD: lambda a, b: f"({a} + {b})", BinaryOp.MULTIPLY: lambda a, b: f"({a} * {b})"}
    unary_renderings = {UnaryOp.EXP: lambda a: f"exp({a})"}
    compare_renderings = {}

    def __init__(self, program: TensorProgram) -> None:
        super().__init__(program)
        self.statements: list[str] = []

    def literal(self, value, dtype):
        return repr(value)

    def operation(self, table, op, dtype):
        return table[op]

    def bind_repeated(self, expr, value, indent):
        name = f"v{len(self.statements)}"
        self.statements.append(f"{indent}let {name} = {value}")
        return name

    def render_index(self, target):
        return str(target.value) if isinstance(target, Constant) else repr(target)

    def visit_load(self, expr, indent):
        return f"{expr.buffer.name}[{self.render_index(self.lowered_offset(expr.buffer, expr.indices))}]"


def test_the_renderer_binds_a_repeated_subexpression_once_per_scope() -> None:
    x = Load(A, (i, k))
    shared = Unary(UnaryOp.EXP, x)
    program = TensorProgram("f", (A,), Buffer("out", (n, 4), "float32"), (i, k), shared * shared + 1.0)
    renderer = TextRenderer(program)
    assert renderer.scalar(program.body, "") == "((v0 * v0) + 1.0)"
    assert renderer.statements == [f"let v0 = exp({renderer.scalar(x, '')})"]
    renderer.open_scope()
    renderer.known(shared, "outer")
    assert renderer.lookup(shared) == "outer" and renderer.scalar(shared * 2.0, "  ") == "(outer * 2.0)"
    renderer.close_scope()
    assert renderer.lookup(shared) == "v0"


def test_the_renderer_lowers_indices_with_the_axes_in_scope() -> None:
    program = TensorProgram("f", (A,), Buffer("out", (n, 4), "float32"), (i, k), Load(A, (i, k)))
    renderer = TextRenderer(program)
    assert renderer.index(k // 8) != "0"
    renderer.open_scope()
    renderer.declare_axis(k, IntImm(4))
    assert renderer.index(k // 8) == "0"  # k < 4 in this scope
    assert renderer.lowered_offset(A, (IntImm(0), k - 5 - k)) == Constant(0)  # a negative constant reads element 0
    renderer.close_scope()
    assert renderer.index(k // 8) != "0"
