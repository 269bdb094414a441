"""gather_before_transpose: gather from a constant, then transpose the few rows gathered.

onnxruntime-genai's model builder ties a decoder's embedding to its LM head by writing the
embedding table as ``Transpose(lm_head.weight)`` and gathering token rows from it.  The
frontend folds a transpose of a constant only up to ``FOLD_LIMIT_ELEMENTS`` (folding would
store a second copy of a large weight), so the transpose is a kernel, and every run moves the
whole table (113 MB on SmolLM-135M, most of a decode step) to read one row of it.

This pass rewrites ``take(transpose(C, axes), ids, axis=a)``, with ``C`` a constant and the
transpose read by takes alone, into ``transpose(take(C, ids, axis=axes[a]), axes')``: the
same values (a row of the transposed table is a column of ``C``), gathering only what is read
and transposing only that.  It runs first, so ``compress_weights`` sees ``take(C, ...)``, the
form it packs.
"""

from __future__ import annotations

from ..ir.builder import FunctionBuilder
from ..ir.expr import Call, Constant, DataflowVar, Function, Var, VarBinding
from ..ir.functor import ExprMutator, use_counts
from ..ir.module import IRModule
from ..ir.struct_info import TensorStructInfo
from ..ir.op_registry import node_attrs
from ..ops import call_op


def gather_before_transpose(module: IRModule) -> IRModule:
    """Gather from constants before transposing them (see the module docstring)."""
    functions = {name: _rewrite(function) if isinstance(function, Function) else function
                 for name, function in module.functions.items()}
    return module.replace(functions=functions)


def _rewrite(function: Function) -> Function:
    transposes = {binding.var: binding.value for binding in function.bindings()
                  if isinstance(binding, VarBinding) and _is_transpose_of_constant(binding.value)}
    if not transposes:
        return function
    readers: dict[Var, int] = {}
    for binding in function.bindings():
        value = binding.value
        if isinstance(value, Call) and value.op == "take" and value.args[0] in transposes:
            readers[value.args[0]] = readers.get(value.args[0], 0) + 1
    uses = use_counts(function)
    movable = {var: call for var, call in transposes.items() if readers.get(var, 0) == uses.get(var, 0) > 0}
    if not movable:
        return function
    return _Mover(function, movable).visit_function(function)


def _is_transpose_of_constant(value) -> bool:
    return isinstance(value, Call) and value.op == "transpose" and isinstance(value.args[0], Constant)


class _Mover(ExprMutator):
    """Drops each movable transpose and rewrites the takes that read it."""

    def __init__(self, function: Function, movable: dict[Var, Call]) -> None:
        super().__init__()
        self.movable = movable
        self.names = FunctionBuilder.avoiding_names_of(function)

    def visit_var_binding(self, binding: VarBinding) -> None:
        value = binding.value
        if binding.var in self.movable:
            return  # read by the takes below alone: each gathers from its constant instead
        if not (isinstance(value, Call) and value.op == "take" and value.args[0] in self.movable):
            super().visit_var_binding(binding)
            return
        transpose = self.movable[value.args[0]]
        constant = transpose.args[0]
        given = transpose.attrs.get("axes")  # none: the axes reversed
        axes = [int(axis) for axis in given] if given is not None else list(reversed(range(constant.data.ndim)))
        ids = self.visit_expr(value.args[1])
        axis = int(value.attrs.get("axis", 0)) % len(axes)
        gathered = call_op("take", constant, ids, axis=axes[axis], **node_attrs(value))
        kind = DataflowVar if self.in_dataflow_block else Var
        rows = kind(self.names.unique_name(f"{binding.var.name}_gathered"), gathered.struct_info)
        self.emit_binding(VarBinding(rows, gathered))
        self.emit_binding(VarBinding(binding.var, call_op("transpose", rows, axes=_moved_axes(axes, axis, ids))))


def _moved_axes(axes: list[int], axis: int, ids) -> list[int]:
    """The transpose of ``take(C, ids, axis=axes[axis])`` that gives ``take(transpose(C,
    axes), ids, axis=axis)``: each of the transposed table's axes where the gather from ``C``
    left it, the indices' axes in the gathered axis's place."""
    assert isinstance(ids.struct_info, TensorStructInfo) and ids.struct_info.ndim >= 0
    index_rank, taken = ids.struct_info.ndim, axes[axis]

    def position(source_axis: int) -> int:  # where axis ``source_axis`` of C is in the gather's result
        return source_axis if source_axis < taken else source_axis - 1 + index_rank

    return ([position(a) for a in axes[:axis]] + [taken + k for k in range(index_rank)]
            + [position(a) for a in axes[axis + 1:]])
