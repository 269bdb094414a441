"""One traversal of graph-level IR, shared by every pass and analysis.

Modelled on TVM Relax's ``ExprFunctor`` / ``ExprVisitor`` / ``ExprMutator``:

- :class:`ExprFunctor` dispatches on the kind of a node through a table:
  ``visit_expr(e)`` calls ``visit_<kind>(e)`` (``visit_var``, ``visit_call_tir``,
  ``visit_if``…), ``visit_binding`` calls ``visit_var_binding`` or ``visit_match_cast``,
  ``visit_block`` calls ``visit_binding_block`` or ``visit_dataflow_block``.  A kind missing
  from the table is an error, never skipped.  A kind that refines another
  (``DataflowVar`` a ``Var``, ``CallLibrary`` a ``CallTIR``) is handled like it unless
  its own method is overridden.  It has no other defaults: a functor that computes a
  value for every kind (the reference interpreter; a printer, text) defines each method.
- :class:`ExprVisitor` visits every child of every node by default (``If`` branches, a
  ``Loop``'s initial values, carried variables and body, ``call_tir_into``'s output,
  ``alloc_tensor``'s storage, ``match_cast``'s value…), so an analysis overrides only the
  kinds it cares about.  Definitions (parameters, binding variables, a loop's carried
  variables) go to ``visit_var_def``, uses to ``visit_var``.
- :class:`ExprMutator` rebuilds what its overrides change and returns every unchanged node
  itself (passes rely on ``is``).  It rebuilds blocks binding by binding (a pass may emit
  several bindings for one, or none), keeps a block's kind, and remaps variables: when
  ``visit_var_def`` returns a new variable for a binding, later uses follow.

On top: :func:`free_vars`, :func:`use_counts`, :func:`iter_bindings`,
:func:`post_order_visit` and the alias analysis :class:`Aliases`.

Symbolic shapes (``PrimExpr``) inside nodes are not visited: they are not graph-level
expressions (``relaxweb.ir.symbolic.free_vars`` is their traversal).
"""

from __future__ import annotations

from dataclasses import replace
from typing import Any, Callable, ClassVar, Mapping, Sequence

from .expr import (
    AllocStorage, AllocTensor, Binding, BindingBlock, Call, CallLibrary, CallTIR, CallTIRInto, Constant,
    DataflowBlock, DataflowVar, Expr, Function, If, Loop, MatchCast, PrimValue, SeqExpr, ShapeExpr, TensorToPrim,
    Tuple, TupleGetItem, Var, VarBinding,
)
from .op_registry import is_view
from .struct_info import TensorStructInfo

EXPR_METHODS: Mapping[type, str] = {
    Var: "visit_var",
    DataflowVar: "visit_dataflow_var",
    Constant: "visit_constant",
    ShapeExpr: "visit_shape_expr",
    PrimValue: "visit_prim_value",
    Tuple: "visit_tuple",
    Call: "visit_call",
    CallTIR: "visit_call_tir",
    CallLibrary: "visit_call_library",
    TensorToPrim: "visit_tensor_to_prim",
    TupleGetItem: "visit_tuple_get_item",
    AllocStorage: "visit_alloc_storage",
    AllocTensor: "visit_alloc_tensor",
    CallTIRInto: "visit_call_tir_into",
    If: "visit_if",
    Loop: "visit_loop",
}
"""Each expression kind (exactly its class) -> the method that visits it."""

BINDING_METHODS: Mapping[type, str] = {VarBinding: "visit_var_binding", MatchCast: "visit_match_cast"}
BLOCK_METHODS: Mapping[type, str] = {BindingBlock: "visit_binding_block", DataflowBlock: "visit_dataflow_block"}


class ExprFunctor:
    """Dispatch on node kinds; subclasses define the ``visit_<kind>`` methods they handle.

    ``expr_methods`` is the dispatch table; a pass with a private expression kind extends
    it in its subclass (``expr_methods = {**ExprMutator.expr_methods, Mine: "visit_mine"}``).
    """

    expr_methods: ClassVar[Mapping[type, str]] = EXPR_METHODS

    def visit(self, node: Any) -> Any:
        """Visit a function, a sequence, a block, a binding or an expression."""
        if isinstance(node, Function):
            return self.visit_function(node)
        if isinstance(node, SeqExpr):
            return self.visit_seq_expr(node)
        if type(node) in BLOCK_METHODS:
            return self.visit_block(node)
        if type(node) in BINDING_METHODS:
            return self.visit_binding(node)
        return self.visit_expr(node)

    def visit_expr(self, expr: Expr) -> Any:
        method = getattr(self, _method(self.expr_methods, expr, "expression"), None)
        return self.visit_expr_default(expr) if method is None else method(expr)

    def visit_expr_default(self, expr: Expr) -> Any:
        """What a functor does with an expression kind it has no method for: fail, naming both."""
        raise NotImplementedError(f"{type(self).__name__} does not handle {type(expr).__name__} expressions")

    def visit_binding(self, binding: Binding) -> Any:
        return self._visit_structure(BINDING_METHODS, binding, "binding")

    def visit_block(self, block: BindingBlock) -> Any:
        return self._visit_structure(BLOCK_METHODS, block, "block")

    def _visit_structure(self, table: Mapping[type, str], node: Any, what: str) -> Any:
        method = getattr(self, _method(table, node, what), None)
        if method is None:
            raise NotImplementedError(f"{type(self).__name__} does not handle {type(node).__name__} {what}s")
        return method(node)

    # Refinements are handled like the kind they refine unless overridden.

    def visit_dataflow_var(self, var: DataflowVar) -> Any:
        return self.visit_var(var)

    def visit_call_library(self, call: CallLibrary) -> Any:
        return self.visit_call_tir(call)


def _method(table: Mapping[type, str], node: Any, what: str) -> str:
    """The name of the method for ``node``'s kind (exactly its class) in ``table``."""
    name = table.get(type(node))
    if name is None:
        raise TypeError(f"{type(node).__name__} is not a known {what} kind "
                        "(relaxweb/ir/functor.py lists each kind and the method that visits it)")
    return name


class ExprVisitor(ExprFunctor):
    """Visits every node and all its children, doing nothing else: override the kinds an
    analysis cares about (calling ``super()`` to keep visiting their children)."""

    def visit_function(self, function: Function) -> None:
        for param in function.params:
            self.visit_var_def(param)
        self.visit_seq_expr(function.body)

    def visit_seq_expr(self, seq: SeqExpr) -> None:
        for block in seq.blocks:
            self.visit_block(block)
        self.visit_expr(seq.body)

    def visit_binding_block(self, block: BindingBlock) -> None:
        for binding in block.bindings:
            self.visit_binding(binding)

    def visit_dataflow_block(self, block: DataflowBlock) -> None:
        for binding in block.bindings:
            self.visit_binding(binding)

    def visit_var_binding(self, binding: VarBinding) -> None:
        self.visit_expr(binding.value)
        self.visit_var_def(binding.var)

    def visit_match_cast(self, binding: MatchCast) -> None:
        self.visit_expr(binding.value)
        self.visit_var_def(binding.var)

    def visit_var_def(self, var: Var) -> None:
        """A variable's definition: a parameter or the left side of a binding."""

    def visit_var(self, var: Var) -> None:
        """A use of a variable."""

    def visit_constant(self, constant: Constant) -> None:
        pass

    def visit_shape_expr(self, shape: ShapeExpr) -> None:
        pass

    def visit_prim_value(self, value: PrimValue) -> None:
        pass

    def visit_tuple(self, value: Tuple) -> None:
        for field in value.fields:
            self.visit_expr(field)

    def visit_call(self, call: Call) -> None:
        for arg in call.args:
            self.visit_expr(arg)

    def visit_call_tir(self, call: CallTIR) -> None:
        for arg in call.args:
            self.visit_expr(arg)

    def visit_tensor_to_prim(self, value: TensorToPrim) -> None:
        self.visit_expr(value.tensor)

    def visit_tuple_get_item(self, item: TupleGetItem) -> None:
        self.visit_expr(item.tuple_value)

    def visit_alloc_storage(self, alloc: AllocStorage) -> None:
        pass

    def visit_alloc_tensor(self, alloc: AllocTensor) -> None:
        self.visit_expr(alloc.storage)

    def visit_call_tir_into(self, call: CallTIRInto) -> None:
        for arg in call.args:
            self.visit_expr(arg)
        self.visit_expr(call.output)

    def visit_if(self, node: If) -> None:
        self.visit_expr(node.condition)
        self.visit_seq_expr(node.true_branch)
        self.visit_seq_expr(node.false_branch)

    def visit_loop(self, node: Loop) -> None:
        for value in node.init:
            self.visit_expr(value)
        for var in node.carried:
            self.visit_var_def(var)
        self.visit_seq_expr(node.body)


class _BlockUnderConstruction:
    """The bindings emitted so far for one block an ExprMutator is rebuilding."""

    def __init__(self, block: BindingBlock) -> None:
        self.block = block
        self.bindings: list[Binding] = []


class ExprMutator(ExprFunctor):
    """Rebuilds the nodes whose children change and returns the others unchanged.

    Blocks are rebuilt from what ``visit_var_binding`` / ``visit_match_cast`` emit
    (:meth:`emit_binding`): by default the binding itself, or a copy with its new value.
    ``var_remap`` maps variables to what their uses become; it is filled when
    ``visit_var_def`` gives a binding (or parameter) a new variable, and a pass may fill it
    itself (an alias replaced by its source).  A binding otherwise keeps its variable, and
    so its annotation, whatever its new value.
    """

    def __init__(self, var_remap: Mapping[Var, Expr] | None = None) -> None:
        self.var_remap: dict[Var, Expr] = dict(var_remap or {})
        self._blocks: list[_BlockUnderConstruction] = []

    # -- functions, sequences, blocks, bindings -----------------------------------------

    def visit_function(self, function: Function) -> Function:
        params = tuple(self._define(param) for param in function.params)
        body = self.visit_seq_expr(function.body)
        if body is function.body and _same(params, function.params):
            return function
        return replace(function, params=params, body=body)

    def visit_seq_expr(self, seq: SeqExpr) -> SeqExpr:
        blocks = tuple(self.visit_block(block) for block in seq.blocks)
        body = self.visit_expr(seq.body)
        if body is seq.body and _same(blocks, seq.blocks):
            return seq
        return SeqExpr(blocks, body)

    def visit_binding_block(self, block: BindingBlock) -> BindingBlock:
        return self._rebuild_block(block)

    def visit_dataflow_block(self, block: DataflowBlock) -> DataflowBlock:
        return self._rebuild_block(block)

    def _rebuild_block(self, block: BindingBlock) -> BindingBlock:
        self._blocks.append(_BlockUnderConstruction(block))
        for binding in block.bindings:
            self.visit_binding(binding)
        bindings = self._blocks.pop().bindings
        if _same(bindings, block.bindings):
            return block
        return type(block)(tuple(bindings))

    @property
    def in_dataflow_block(self) -> bool:
        """Whether the block being rebuilt (the innermost) is a dataflow block."""
        return bool(self._blocks) and isinstance(self._blocks[-1].block, DataflowBlock)

    def emit_binding(self, binding: Binding) -> None:
        """Add a binding to the block being rebuilt."""
        self._blocks[-1].bindings.append(binding)

    def visit_var_binding(self, binding: VarBinding) -> None:
        value = self.visit_expr(binding.value)
        var = self._define(binding.var)
        if value is binding.value and var is binding.var:
            self.emit_binding(binding)
        else:
            self.emit_binding(VarBinding(var, value))

    def visit_match_cast(self, binding: MatchCast) -> None:
        value = self.visit_expr(binding.value)
        var = self._define(binding.var)
        if value is binding.value and var is binding.var:
            self.emit_binding(binding)
        else:
            self.emit_binding(MatchCast(var, value, binding.struct_info, binding.reason))

    def visit_var_def(self, var: Var) -> Var:
        """The variable a definition binds from now on (by default the same one)."""
        return var

    def _define(self, var: Var) -> Var:
        new = self.visit_var_def(var)
        if new is not var:
            self.var_remap[var] = new
        return new

    # -- expressions ----------------------------------------------------------------------

    def visit_var(self, var: Var) -> Expr:
        return self.var_remap.get(var, var)

    def visit_constant(self, constant: Constant) -> Expr:
        return constant

    def visit_shape_expr(self, shape: ShapeExpr) -> Expr:
        return shape

    def visit_prim_value(self, value: PrimValue) -> Expr:
        return value

    def visit_alloc_storage(self, alloc: AllocStorage) -> Expr:
        return alloc

    def visit_tuple(self, value: Tuple) -> Expr:
        fields = tuple(self.visit_expr(field) for field in value.fields)
        return value if _same(fields, value.fields) else Tuple(fields)

    def visit_call(self, call: Call) -> Expr:
        args = tuple(self.visit_expr(arg) for arg in call.args)
        return call if _same(args, call.args) else replace(call, args=args)

    def visit_call_tir(self, call: CallTIR) -> Expr:
        args = tuple(self.visit_expr(arg) for arg in call.args)
        return call if _same(args, call.args) else replace(call, args=args)

    def visit_tensor_to_prim(self, value: TensorToPrim) -> Expr:
        tensor = self.visit_expr(value.tensor)
        return value if tensor is value.tensor else replace(value, tensor=tensor)

    def visit_tuple_get_item(self, item: TupleGetItem) -> Expr:
        tuple_value = self.visit_expr(item.tuple_value)
        return item if tuple_value is item.tuple_value else TupleGetItem(tuple_value, item.index)

    def visit_alloc_tensor(self, alloc: AllocTensor) -> Expr:
        storage = self.visit_expr(alloc.storage)
        return alloc if storage is alloc.storage else replace(alloc, storage=storage)

    def visit_call_tir_into(self, call: CallTIRInto) -> Expr:
        args = tuple(self.visit_expr(arg) for arg in call.args)
        output = self.visit_expr(call.output)
        if output is call.output and _same(args, call.args):
            return call
        return replace(call, args=args, output=output)

    def visit_if(self, node: If) -> Expr:
        condition = self.visit_expr(node.condition)
        true_branch = self.visit_seq_expr(node.true_branch)
        false_branch = self.visit_seq_expr(node.false_branch)
        if condition is node.condition and true_branch is node.true_branch and false_branch is node.false_branch:
            return node
        return If(condition, true_branch, false_branch)

    def visit_loop(self, node: Loop) -> Expr:
        init = tuple(self.visit_expr(value) for value in node.init)
        carried = tuple(self._define(var) for var in node.carried)
        body = self.visit_seq_expr(node.body)
        if body is node.body and _same(init, node.init) and _same(carried, node.carried):
            return node
        return Loop(node.count, node.iteration, carried, init, body)


def _same(new: Sequence[Any], old: Sequence[Any]) -> bool:
    return len(new) == len(old) and all(a is b for a, b in zip(new, old))


# ----------------------------------------------------------------------------------------
# Scopes and the analyses built on the visitor


class ScopedVisitor(ExprVisitor):
    """A visitor that knows which variables are in scope where it is.

    In scope: the parameters, then each binding's variable after its binding; a binding
    inside an ``If`` branch goes out of scope at the end of the branch, a ``Loop``'s carried
    variables and body bindings at the end of the loop, and a ``DataflowVar`` at the end of
    its dataflow block.  Subclasses read :meth:`in_scope`.
    """

    def __init__(self) -> None:
        self.scope: set[Var] = set()

    def in_scope(self, var: Var) -> bool:
        return var in self.scope

    def visit_var_def(self, var: Var) -> None:
        self.scope.add(var)

    def visit_seq_expr(self, seq: SeqExpr) -> None:
        outer = set(self.scope)
        super().visit_seq_expr(seq)
        self.scope = outer

    def visit_dataflow_block(self, block: DataflowBlock) -> None:
        before = set(self.scope)
        super().visit_dataflow_block(block)
        self.scope = {var for var in self.scope if var in before or not isinstance(var, DataflowVar)}

    def visit_loop(self, node: Loop) -> None:
        outer = set(self.scope)
        super().visit_loop(node)
        self.scope = outer


class _FreeVars(ScopedVisitor):
    def __init__(self) -> None:
        super().__init__()
        self.free: dict[Var, None] = {}

    def visit_var(self, var: Var) -> None:
        if not self.in_scope(var):
            self.free.setdefault(var)


def free_vars(node: Expr | SeqExpr | Function) -> list[Var]:
    """The variables ``node`` uses that it does not define in scope, in order of first use.

    A variable bound inside an ``If`` branch and used there is not free; used after the
    ``If`` (out of its scope) it is, and so is a ``DataflowVar`` used after its block.
    """
    visitor = _FreeVars()
    visitor.visit(node)
    return list(visitor.free)


class _UseCounter(ExprVisitor):
    def __init__(self) -> None:
        self.counts: dict[Var, int] = {}

    def visit_var(self, var: Var) -> None:
        self.counts[var] = self.counts.get(var, 0) + 1


def use_counts(node: Expr | SeqExpr | Function) -> dict[Var, int]:
    """How many times each variable is read in ``node`` (If branches included); a
    variable never read is absent."""
    counter = _UseCounter()
    counter.visit(node)
    return counter.counts


class _BindingCollector(ExprVisitor):
    def __init__(self) -> None:
        self.bindings: list[Binding] = []

    def visit_binding(self, binding: Binding) -> None:
        self.bindings.append(binding)
        super().visit_binding(binding)


def iter_bindings(node: Expr | SeqExpr | Function) -> list[Binding]:
    """Every binding of ``node``, those inside If branches included (each binding before
    the bindings of its value's branches)."""
    collector = _BindingCollector()
    collector.visit(node)
    return collector.bindings


class _PostOrder(ExprVisitor):
    def __init__(self, function: Callable[[Expr], None]) -> None:
        self.function = function

    def visit_expr(self, expr: Expr) -> None:
        super().visit_expr(expr)
        self.function(expr)


def post_order_visit(node: Expr | SeqExpr | Function, function: Callable[[Expr], None]) -> None:
    """Call ``function`` on every expression of ``node``, each after its children
    (variables at their uses, not their definitions)."""
    _PostOrder(function).visit(node)


# ----------------------------------------------------------------------------------------
# Aliases


class Aliases:
    """Which variables are other names for a value computed elsewhere.

    Recorded over a whole function or sequence (If branches included): ``a = b``,
    ``a = t[i]``, ``a = match_cast(b, Tensor(...))`` (a tensor cast names the same
    tensor), ``a = op(b, ...)`` of a view op (``is_view``: a KV cache and its views live in
    ``b``'s storage) and the fields of ``t = (x, y)``.  :meth:`resolve` follows them to the
    variable (or constant) that defines the value.
    """

    def __init__(self, node: Expr | SeqExpr | Function) -> None:
        self.sources: dict[Var, Expr] = {}
        self.tuples: dict[Var, Tuple] = {}
        _AliasCollector(self).visit(node)

    def resolve(self, expr: Expr, follow: Callable[[Var], bool] | None = None) -> Expr:
        """What ``expr`` names, through every alias ``follow`` accepts (all by default).

        A variable whose alias is not followed, or is not one, is itself the answer; so
        is a constant.  An item of a tuple whose fields are not known stops the walk: the
        answer is the last variable reached (the one that names the item), or the item
        itself when ``expr`` is one.
        """
        last_var: Var | None = None
        while True:
            if isinstance(expr, Var):
                if expr not in self.sources or (follow is not None and not follow(expr)):
                    return expr
                last_var, expr = expr, self.sources[expr]
            elif isinstance(expr, TupleGetItem):
                fields = self.tuple_fields(self.resolve(expr.tuple_value, follow), follow)
                if fields is None:
                    return expr if last_var is None else last_var
                expr = fields[expr.index]
            else:
                return expr

    def tuple_fields(self, expr: Expr, follow: Callable[[Var], bool] | None = None) -> tuple[Expr, ...] | None:
        """The fields of a tuple value (a literal, or a variable bound to one), if known."""
        if isinstance(expr, Tuple):
            return expr.fields
        if isinstance(expr, Var) and expr in self.tuples and (follow is None or follow(expr)):
            return self.tuples[expr].fields
        return None


class _AliasCollector(ExprVisitor):
    def __init__(self, aliases: Aliases) -> None:
        self.aliases = aliases

    def visit_var_binding(self, binding: VarBinding) -> None:
        value = binding.value
        if isinstance(value, (Var, TupleGetItem)):
            self.aliases.sources[binding.var] = value
        elif is_view(value):
            self.aliases.sources[binding.var] = value.args[0]
        elif isinstance(value, Tuple):
            self.aliases.tuples[binding.var] = value
        super().visit_var_binding(binding)

    def visit_match_cast(self, binding: MatchCast) -> None:
        if isinstance(binding.struct_info, TensorStructInfo):
            self.aliases.sources[binding.var] = binding.value
        super().visit_match_cast(binding)


__all__ = [
    "Aliases", "BINDING_METHODS", "BLOCK_METHODS", "EXPR_METHODS", "ExprFunctor", "ExprMutator", "ExprVisitor",
    "ScopedVisitor", "free_vars", "iter_bindings", "post_order_visit", "use_counts",
]
