"""split_wide_concats: a concat of more tensors than one kernel can bind becomes a tree of concats.

``concat(x0, ..., xn)`` is legalized as one kernel that binds every argument and its result
as storage buffers, and a WebGPU kernel may bind at most ``MAX_STORAGE_BINDINGS`` (WebGPU's
default ``maxStorageBuffersPerShaderStage``, 8: ``ir/launch.py``, the one place the limit is
read).  Exporters write wider concats: an LSTM exported unrolled stacks its 20 or 100 steps
with one Concat.  This pass rewrites such a call into consecutive runs of arguments, each
concatenated by a concat that fits (a run of one argument stays as it is), then concatenates
the runs the same way until one concat reads them all::

    y = concat(x0, ..., x19, axis=1)
      ->  y_part = concat(x0, ..., x6, axis=1); y_part1 = concat(x7, ..., x13, axis=1)
          y_part2 = concat(x14, ..., x19, axis=1); y = concat(y_part, y_part1, y_part2, axis=1)

Concatenation along one axis is associative, so the tree computes the same tensor; each
level copies the data once more (three levels for 100 inputs to 8 bindings).  ``fuse_ops``
may then merge a small part back into its reader where the bindings still fit.  A constant
above the context's ``binding_split_bytes`` is bound as several parts and counts once per
part (``ir/launch.binding_parts``); one too large to fit a kernel even alone is left for the
bundle writer to refuse by name.  The pass runs at every opt level, just before
``legalize_ops``, so every concat's kernel fits.
"""

from __future__ import annotations

from ..ir.builder import FunctionBuilder
from ..ir.expr import Call, DataflowVar, Expr, Function, Var, VarBinding
from ..ir.functor import ExprMutator
from ..ir.launch import MAX_STORAGE_BINDINGS, argument_bindings
from ..ir.module import IRModule
from ..ops import call_op
from .context import PassContext

# The storage bindings a concat kernel may give its arguments: all but its output's.
ARGUMENT_BINDINGS = MAX_STORAGE_BINDINGS - 1


def split_wide_concats(module: IRModule) -> IRModule:
    """Rewrite every concat whose kernel would bind too many buffers into a tree of concats."""
    functions = {name: _Splitter(function).visit_function(function) if isinstance(function, Function) else function
                 for name, function in module.functions.items()}
    return module.replace(functions=functions)


class WideCallSplitter(ExprMutator):
    """What a pass that splits calls too wide for one kernel needs (this one and
    ``split_wide_einsums``): the bindings a kernel gives arguments, the runs of arguments
    that fit one kernel, and a part bound before the call it is split from."""

    def __init__(self, function: Function) -> None:
        super().__init__()
        self.names = FunctionBuilder.avoiding_names_of(function)
        self.split_bytes = PassContext.current().binding_split_bytes

    def _bindings(self, args) -> int:
        """The storage bindings a kernel gives ``args``: one each, a constant above the split
        size one per part."""
        return argument_bindings(args, self.split_bytes)

    def _runs(self, args: list[Expr]) -> list[list[Expr]]:
        """Consecutive runs of ``args``, each as long as one kernel can bind."""
        runs: list[list[Expr]] = []
        used = ARGUMENT_BINDINGS  # start a new run at the first argument
        for arg in args:
            needed = self._bindings([arg])
            if used + needed > ARGUMENT_BINDINGS:
                runs.append([])
                used = 0
            runs[-1].append(arg)
            used += needed
        return runs

    def _emit_part(self, result: Var, part: Call) -> Var:
        """``part`` bound to a new variable named after ``result`` (``y_part``, ``y_part1``)."""
        kind = DataflowVar if self.in_dataflow_block else Var
        var = kind(self.names.unique_name(f"{result.name}_part"), part.struct_info)
        self.emit_binding(VarBinding(var, part))
        return var


class _Splitter(WideCallSplitter):
    """Emits the parts of each wide concat before its binding, which reads the parts."""

    def visit_var_binding(self, binding: VarBinding) -> None:
        value = binding.value
        if not (isinstance(value, Call) and value.op == "concat" and self._bindings(value.args) > ARGUMENT_BINDINGS):
            super().visit_var_binding(binding)
            return
        args = [self.visit_expr(arg) for arg in value.args]
        while self._bindings(args) > ARGUMENT_BINDINGS:
            runs = self._runs(args)
            if len(runs) == len(args):
                break  # no two neighbours fit one kernel: the bundle writer names the weights
            args = [run[0] if len(run) == 1 else self._emit_part(binding.var, call_op("concat", *run, **value.attrs))
                    for run in runs]
        self.emit_binding(VarBinding(self.visit_var_def(binding.var), call_op("concat", *args, **value.attrs)))
