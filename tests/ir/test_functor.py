"""The shared traversal (relaxweb/ir/functor.py): dispatch, the visitor's and the mutator's
defaults, free_vars, use_counts, iter_bindings and the alias analysis."""

from __future__ import annotations

import inspect

import numpy as np
import pytest

from relaxweb.ir import expr as expr_module
from relaxweb.ir.expr import (
    AllocStorage, AllocTensor, BindingBlock, Call, CallLibrary, CallTIR, CallTIRInto, Constant, DataflowBlock,
    DataflowVar, Expr, Function, If, Loop, MatchCast, PrimValue, SeqExpr, ShapeExpr, TensorToPrim, Tuple, TupleGetItem,
    Var, VarBinding,
)
from relaxweb.ir.functor import (
    BINDING_METHODS, BLOCK_METHODS, EXPR_METHODS, Aliases, ExprFunctor, ExprMutator, ExprVisitor, free_vars,
    iter_bindings, post_order_visit, use_counts,
)
from relaxweb.ir.struct_info import ObjectStructInfo, PrimStructInfo, TensorStructInfo, TupleStructInfo
from relaxweb.ir.symbolic import SizeVar

n, k = SizeVar("n"), SizeVar("k")
TENSOR = TensorStructInfo((n, 4), "float32")


class Names:
    """The variables of :func:`every_kind_function`, by name."""

    def __init__(self, function: Function) -> None:
        self.by_name = {p.name: p for p in function.params}
        self.by_name.update({b.var.name: b.var for b in iter_bindings(function)})

    def __getattr__(self, name: str) -> Var:
        return self.by_name[name]


def every_kind_function() -> Function:
    """A function holding every expression kind once or more (not meant to run)::

        def main(x, flag):
            with dataflow():
                hidden(dv) = relu(x)
                kept = add(hidden, const(bias))
            storage = alloc_storage(n * 16)
            planned = alloc_tensor(storage)
            done = call_tir_into(prog, (kept,), out=planned)
            count = tensor_to_prim(planned)
            size = match_cast(count, Prim(k))
            cast = match_cast(planned, Tensor((k, 4)))
            shape = shape([n, 4])
            parts = (cast, const(bias))
            first = parts[0]
            chosen = if prim(n % 2): inner = call_tir(prog, (first,)); yield inner
                     else:          other = call_library(lib, (x,)); yield other
            yield (chosen, shape)
    """
    x = Var("x", TENSOR)
    flag = Var("flag", PrimStructInfo("int64"))
    bias = Constant(np.zeros(4, np.float32), "bias")
    hidden = DataflowVar("hidden", TENSOR)
    kept = Var("kept", TENSOR)
    dataflow = DataflowBlock((
        VarBinding(hidden, Call("relu", (x,), {}, TENSOR)),
        VarBinding(kept, Call("add", (hidden, bias), {}, TENSOR)),
    ))
    storage, planned = Var("storage", ObjectStructInfo()), Var("planned", TENSOR)
    done, count = Var("done", TupleStructInfo(())), Var("count", PrimStructInfo("int64"))
    size, cast = Var("size", PrimStructInfo("int64", k)), Var("cast", TensorStructInfo((k, 4), "float32"))
    shape, first = Var("shape", ShapeExpr((n, 4)).struct_info), Var("first", TENSOR)
    inner, other, chosen = Var("inner", TENSOR), Var("other", TENSOR), Var("chosen", TENSOR)
    parts_value = Tuple((cast, bias))
    parts = Var("parts", parts_value.struct_info)
    branches = If(
        PrimValue(n % 2),
        SeqExpr((BindingBlock((VarBinding(inner, CallTIR("prog", (TupleGetItem(parts, 0),), TENSOR, ())),)),), inner),
        SeqExpr((BindingBlock((VarBinding(other, CallLibrary("lib", (x,), TENSOR, ())),)),), other),
    )
    plain = BindingBlock((
        VarBinding(storage, AllocStorage(n * 16)),
        VarBinding(planned, AllocTensor(storage, TENSOR)),
        VarBinding(done, CallTIRInto("prog", (kept,), planned, ())),
        VarBinding(count, TensorToPrim(planned)),
        MatchCast(size, count, PrimStructInfo("int64", k)),
        MatchCast(cast, planned, TensorStructInfo((k, 4), "float32")),
        VarBinding(shape, ShapeExpr((n, 4))),
        VarBinding(parts, parts_value),
        VarBinding(first, TupleGetItem(parts, 0)),
        VarBinding(chosen, branches),
    ))
    return Function("main", (x, flag), SeqExpr((dataflow, plain), Tuple((chosen, shape))), ("x", "flag"), ("out",))


def loop_function() -> Function:
    """A function with a loop::

        def main(x):
            looped = for i, (carry,) in loop(n, init=(x,)):
                         step = call_tir(prog, (carry,)); yield (step, carry)
            last = looped[0]
            yield last
    """
    x, carry, step = Var("x", TENSOR), Var("carry", TENSOR), Var("step", TENSOR)
    body = SeqExpr((BindingBlock((VarBinding(step, CallTIR("prog", (carry,), TENSOR, ())),)),), Tuple((step, carry)))
    loop = Loop(n, SizeVar("i"), (carry,), (x,), body)
    looped, last = Var("looped", loop.struct_info), Var("last", TENSOR)
    block = BindingBlock((VarBinding(looped, loop), VarBinding(last, TupleGetItem(looped, 0))))
    return Function("main", (x,), SeqExpr((block,), last), ("x",), ("out",))


def expr_kinds_of(module) -> list[type]:
    """The expression classes a module defines (Expr and its subclasses)."""
    return [cls for _, cls in inspect.getmembers(module, inspect.isclass)
            if issubclass(cls, Expr) and cls is not Expr and cls.__module__ == module.__name__]


# Dispatch -------------------------------------------------------------------------------------


def test_every_expression_kind_of_ir_expr_has_a_visit_method() -> None:
    kinds = expr_kinds_of(expr_module)
    assert CallTIRInto in kinds and If in kinds and len(kinds) >= 15
    for kind in kinds:
        assert kind in EXPR_METHODS, f"{kind.__name__} has no entry in functor.EXPR_METHODS"
        method = EXPR_METHODS[kind]
        assert callable(getattr(ExprVisitor, method, None)), f"ExprVisitor lacks {method}"
        assert callable(getattr(ExprMutator, method, None)), f"ExprMutator lacks {method}"
    for kind in (VarBinding, MatchCast):
        assert hasattr(ExprVisitor, BINDING_METHODS[kind]) and hasattr(ExprMutator, BINDING_METHODS[kind])
    for kind in (BindingBlock, DataflowBlock):
        assert hasattr(ExprVisitor, BLOCK_METHODS[kind]) and hasattr(ExprMutator, BLOCK_METHODS[kind])


def test_the_visitor_reaches_every_expression_kind() -> None:
    seen: set[type] = set()
    post_order_visit(every_kind_function(), lambda expr: seen.add(type(expr)))
    post_order_visit(loop_function(), lambda expr: seen.add(type(expr)))
    assert seen == set(expr_kinds_of(expr_module))


def test_a_loop_defines_its_carried_variables_and_scopes_its_body() -> None:
    function = loop_function()
    recorder = Recorder()
    recorder.visit(function)
    assert recorder.defined == ["x", "carry", "step", "looped", "last"]
    assert recorder.used == ["x", "carry", "step", "carry", "looped", "last"]  # init, then the body, then after
    assert free_vars(function) == []
    loop = function.body.blocks[0].bindings[0].value
    assert free_vars(loop) == [function.params[0]]  # only the initial value comes from outside
    assert ExprMutator().visit_function(function) is function

    class Rename(ExprMutator):
        def visit_var_def(self, var: Var) -> Var:
            return Var("renamed", var.struct_info) if var.name == "carry" else var

    renamed = Rename().visit_function(function).body.blocks[0].bindings[0].value
    assert [v.name for v in renamed.carried] == ["renamed"]
    assert renamed.body.blocks[0].bindings[0].value.args[0] is renamed.carried[0]  # the body's uses follow
    assert renamed.body.body.fields[1] is renamed.carried[0]


def test_an_unknown_expression_kind_is_an_error_not_skipped() -> None:
    class Mystery(Expr):
        struct_info = ObjectStructInfo()

    with pytest.raises(TypeError, match="Mystery is not a known expression kind"):
        ExprVisitor().visit_expr(Tuple((Var("x", TENSOR), Mystery())))
    with pytest.raises(TypeError, match="Mystery"):
        ExprMutator().visit_expr(Mystery())


def test_a_functor_without_a_method_for_a_kind_says_so() -> None:
    class OnlyVars(ExprFunctor):
        def visit_var(self, var: Var) -> str:
            return var.name

    x = DataflowVar("x", TENSOR)
    assert OnlyVars().visit_expr(x) == "x"  # a DataflowVar is handled as a Var
    with pytest.raises(NotImplementedError, match="OnlyVars does not handle Constant"):
        OnlyVars().visit_expr(Constant(np.zeros(1, np.float32), "c"))


def test_refined_kinds_go_to_their_parents_method_unless_overridden() -> None:
    class Calls(ExprVisitor):
        def __init__(self) -> None:
            self.programs: list[str] = []

        def visit_call_tir(self, call: CallTIR) -> None:
            self.programs.append(call.program)
            super().visit_call_tir(call)

    visitor = Calls()
    visitor.visit(every_kind_function())
    assert visitor.programs == ["prog", "lib"]  # call_library is a call_tir; call_tir_into is not


def test_a_subclass_extends_the_table_with_its_own_kind() -> None:
    class Placeholder(Expr):
        def __init__(self, index: int) -> None:
            self.index = index
            self.struct_info = TENSOR

    class Filler(ExprMutator):
        expr_methods = {**ExprMutator.expr_methods, Placeholder: "visit_placeholder"}

        def visit_placeholder(self, placeholder: Placeholder) -> Expr:
            return Var(f"filled{placeholder.index}", TENSOR)

    filled = Filler().visit_expr(Tuple((Placeholder(0), Placeholder(1))))
    assert [f.name for f in filled.fields] == ["filled0", "filled1"]


# The visitor ----------------------------------------------------------------------------------


class Recorder(ExprVisitor):
    """The variables defined and used, in visiting order."""

    def __init__(self) -> None:
        self.defined: list[str] = []
        self.used: list[str] = []

    def visit_var_def(self, var: Var) -> None:
        self.defined.append(var.name)

    def visit_var(self, var: Var) -> None:
        self.used.append(var.name)


def test_the_visitor_tells_definitions_from_uses_everywhere() -> None:
    recorder = Recorder()
    recorder.visit(every_kind_function())
    assert recorder.defined == [
        "x", "flag", "hidden", "kept", "storage", "planned", "done", "count", "size", "cast", "shape", "parts",
        "first", "inner", "other", "chosen",
    ]
    assert recorder.used == [
        "x", "hidden",  # the dataflow block
        "storage",  # alloc_tensor's storage
        "kept", "planned",  # call_tir_into's argument, then its output
        "planned", "count", "planned",  # tensor_to_prim, then each match_cast's value
        "cast", "parts",  # a tuple's field, an item's tuple
        "parts", "inner", "x", "other",  # the If branches: their bindings and results
        "chosen", "shape",  # the function's result
    ]


def test_iter_bindings_lists_each_binding_before_its_branches() -> None:
    names = [b.var.name for b in iter_bindings(every_kind_function())]
    assert names[-3:] == ["chosen", "inner", "other"]
    assert len(names) == 14


def test_use_counts_counts_reads_inside_branches_and_planned_forms() -> None:
    function = every_kind_function()
    v = Names(function)
    counts = use_counts(function)
    assert counts[v.planned] == 3  # call_tir_into's output, tensor_to_prim, match_cast
    assert counts[v.storage] == 1 and counts[v.count] == 1 and counts[v.parts] == 2
    assert counts[v.inner] == 1 and counts[v.other] == 1  # the branches' results
    assert v.flag not in counts and v.done not in counts  # never read


# The mutator ----------------------------------------------------------------------------------


def test_a_mutator_that_changes_nothing_returns_the_same_objects() -> None:
    function = every_kind_function()
    assert ExprMutator().visit_function(function) is function
    for binding in iter_bindings(function):
        assert ExprMutator().visit_expr(binding.value) is binding.value


def test_a_mutator_rebuilds_only_the_path_to_a_change() -> None:
    function = every_kind_function()

    class NewBias(ExprMutator):
        def visit_constant(self, constant: Constant) -> Expr:
            return Constant(np.ones(4, np.float32), "bias")

    changed = NewBias().visit_function(function)
    dataflow, plain = changed.body.blocks
    assert isinstance(dataflow, DataflowBlock) and type(plain) is BindingBlock  # kinds kept
    assert dataflow.bindings[0] is function.body.blocks[0].bindings[0]  # relu(x): untouched
    assert dataflow.bindings[1].value.args[1].data[0] == 1.0
    parts = [b for b in plain.bindings if b.var.name == "parts"][0]
    assert parts.value.fields[1].data[0] == 1.0
    assert parts.var is [b for b in function.body.blocks[1].bindings if b.var.name == "parts"][0].var
    # the If holds no constant: it is the same object
    assert plain.bindings[-1].value is function.body.blocks[1].bindings[-1].value


def test_a_new_definition_is_followed_by_every_later_use() -> None:
    function = every_kind_function()
    v = Names(function)

    class Rename(ExprMutator):
        def visit_var_def(self, var: Var) -> Var:
            return Var(var.name + "_new", var.struct_info) if var.name in ("storage", "planned", "parts") else var

    renamed = Rename().visit_function(function)
    recorder = Recorder()
    recorder.visit(renamed)
    assert "storage_new" in recorder.defined and "storage" not in recorder.defined
    assert "storage" not in recorder.used and "planned" not in recorder.used and "parts" not in recorder.used
    # alloc_tensor's storage, call_tir_into's output, match_cast's value, and inside the If
    assert recorder.used.count("planned_new") == 3 and recorder.used.count("storage_new") == 1
    assert recorder.used.count("parts_new") == 2
    assert use_counts(renamed).get(v.planned, 0) == 0


def test_a_mutator_may_emit_several_bindings_or_none_for_one() -> None:
    function = every_kind_function()
    seen_in_dataflow: dict[str, bool] = {}

    class Expand(ExprMutator):
        def visit_var_binding(self, binding: VarBinding) -> None:
            seen_in_dataflow[binding.var.name] = self.in_dataflow_block
            if binding.var.name == "shape":
                return  # dropped
            if binding.var.name == "inner":
                extra = Var("extra", TENSOR)
                self.emit_binding(VarBinding(extra, binding.value))
                self.emit_binding(VarBinding(binding.var, extra))
                return
            super().visit_var_binding(binding)

    expanded = Expand().visit_function(function)
    names = [b.var.name for b in iter_bindings(expanded)]
    assert "shape" not in names
    assert names[-3:] == ["extra", "inner", "other"]
    assert seen_in_dataflow["hidden"] and seen_in_dataflow["kept"]
    assert not seen_in_dataflow["storage"] and not seen_in_dataflow["inner"]  # a plain block, an If branch


# free_vars ------------------------------------------------------------------------------------


def test_a_well_formed_function_has_no_free_variables() -> None:
    function = every_kind_function()
    assert free_vars(function) == []
    assert free_vars(function.body) == [function.params[0]]  # x: the parameters are not defined there


def test_free_vars_of_an_if_are_what_it_reads_from_outside_in_first_use_order() -> None:
    function = every_kind_function()
    v = Names(function)
    chosen = [b for b in iter_bindings(function) if b.var is v.chosen][0]
    assert free_vars(chosen.value) == [v.parts, v.x]  # not inner, not other: bound in the branches


def test_a_variable_bound_in_a_branch_is_free_after_the_if() -> None:
    x = Var("x", TENSOR)
    inner, chosen, after = Var("inner", TENSOR), Var("chosen", TENSOR), Var("after", TENSOR)
    branch = SeqExpr((BindingBlock((VarBinding(inner, Call("relu", (x,), {}, TENSOR)),)),), inner)
    body = SeqExpr((BindingBlock((
        VarBinding(chosen, If(PrimValue(n % 2), branch, SeqExpr((), x))),
        VarBinding(after, Call("add", (chosen, inner), {}, TENSOR)),
    )),), after)
    assert free_vars(Function("main", (x,), body)) == [inner]


def test_a_dataflow_variable_is_free_after_its_block() -> None:
    x = Var("x", TENSOR)
    local, out = DataflowVar("local", TENSOR), Var("out", TENSOR)
    block = DataflowBlock((VarBinding(local, Call("relu", (x,), {}, TENSOR)),
                           VarBinding(out, Call("exp", (local,), {}, TENSOR))))
    assert free_vars(Function("main", (x,), SeqExpr((block,), out))) == []
    assert free_vars(Function("main", (x,), SeqExpr((block,), local))) == [local]


# Aliases --------------------------------------------------------------------------------------


def test_aliases_resolve_to_the_defining_variable() -> None:
    function = every_kind_function()
    v = Names(function)
    aliases = Aliases(function)
    assert aliases.resolve(v.first) is v.planned  # first = parts[0], parts = (cast, ...), cast = match_cast(planned)
    assert aliases.resolve(TupleGetItem(v.parts, 1)).name == "bias"  # a constant field
    assert aliases.resolve(v.size) is v.size  # a prim match_cast defines a value: no alias
    assert aliases.resolve(v.chosen) is v.chosen and aliases.resolve(v.kept) is v.kept
    assert aliases.tuple_fields(v.parts)[0] is v.cast


def test_aliases_chain_and_stop_where_not_followed() -> None:
    x = Var("x", TENSOR)
    a, b, c = Var("a", TENSOR), Var("b", TENSOR), Var("c", TENSOR)
    pair = Var("pair", TupleStructInfo((TENSOR, TENSOR)))
    again, item = Var("again", pair.struct_info), Var("item", TENSOR)
    body = SeqExpr((BindingBlock((
        VarBinding(a, Call("relu", (x,), {}, TENSOR)),
        VarBinding(b, a),
        VarBinding(c, b),
        VarBinding(pair, Tuple((c, x))),
        VarBinding(again, pair),
        VarBinding(item, TupleGetItem(again, 0)),
    )),), item)
    aliases = Aliases(Function("main", (x,), body))
    assert aliases.resolve(item) is a
    assert aliases.resolve(TupleGetItem(pair, 1)) is x
    assert aliases.resolve(item, follow=lambda var: var is not b) is b
    assert aliases.resolve(item, follow=lambda var: var is not pair) is item  # the tuple is not looked into


def test_an_item_of_an_unknown_tuple_stops_at_the_last_variable() -> None:
    pair = Var("pair", TupleStructInfo((TENSOR, TENSOR)))
    item, alias = Var("item", TENSOR), Var("alias", TENSOR)
    body = SeqExpr((BindingBlock((VarBinding(item, TupleGetItem(pair, 0)), VarBinding(alias, item))),), alias)
    aliases = Aliases(Function("main", (pair,), body))
    assert aliases.resolve(alias) is item
    unknown = TupleGetItem(pair, 1)
    assert aliases.resolve(unknown) is unknown


def test_aliases_inside_if_branches_are_recorded() -> None:
    x = Var("x", TENSOR)
    inner, chosen = Var("inner", TENSOR), Var("chosen", TENSOR)
    branch = SeqExpr((BindingBlock((VarBinding(inner, x),)),), inner)
    body = SeqExpr((BindingBlock((VarBinding(chosen, If(PrimValue(n % 2), branch, SeqExpr((), x))),)),), chosen)
    assert Aliases(Function("main", (x,), body)).resolve(inner) is x
