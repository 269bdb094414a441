"""fold_scalar_constants: write one-element constant arguments into the tensor program.

Exporters keep scalars as initializers (GELU's 0.5 and 0.044715, attention's scale, a mask
fill value), and legalization passes them to tensor programs as tensors: each is a storage
buffer binding and a memory read per element.  This pass replaces, at each call site, the
loads of a one-element constant argument by the constant itself and drops the argument, so
the kernel binds fewer buffers (fusion may then merge more: a kernel has at most 8) and the
shader compiler sees the number.  Programs shared by call sites with different constants are
specialized per value; identical results are shared again.
"""

from __future__ import annotations

from dataclasses import replace
from typing import Callable

import numpy as np

from ..ir.expr import CallLibrary, CallTIR, Constant, Expr, Function
from ..ir.functor import ExprMutator
from ..ir.module import IRModule, ProgramTable, drop_uncalled_programs
from ..ir.tir import FloatImm, Gather, Load, TensorProgram, map_scalar, scalar_nodes
from ..ir.value_ranges import INT32_MAX, INT32_MIN

FOLDABLE_DTYPES = ("float32", "int32", "int64", "bool")


def fold_scalar_constants(module: IRModule) -> IRModule:
    """Fold one-element constant arguments of every tensor-program call into the program."""
    table = ProgramTable(module.programs)
    programs = table.programs

    def fold_call(call: CallTIR) -> CallTIR:
        program = programs.get(call.program)
        if isinstance(call, CallLibrary) or not isinstance(program, TensorProgram):
            return call
        values = {program.inputs[i].name: arg for i, arg in enumerate(call.args) if _is_scalar_constant(arg)}
        if not values or any(isinstance(n, Gather) and n.buffer.name in values for n in scalar_nodes(program.body)):
            return call

        def fold(node):
            if isinstance(node, Load) and node.buffer.name in values:
                data = values[node.buffer.name].data
                value = bool(data.reshape(-1)[0]) if data.dtype == np.bool_ else data.reshape(-1)[0].item()
                return FloatImm(value, node.buffer.dtype)
            return None

        kept = [i for i, b in enumerate(program.inputs) if b.name not in values]
        folded = TensorProgram(program.name, tuple(program.inputs[i] for i in kept), program.output, program.axes,
                               map_scalar(program.body, fold), program.schedule)
        name = table.add(folded)
        used = {v.name for v in programs[name].size_vars}
        return replace(call, program=name, args=tuple(call.args[i] for i in kept),
                       size_var_values=tuple((n, v) for n, v in call.size_var_values if n in used))

    folder = _CallFolder(fold_call)
    functions = {name: folder.visit_function(f) if isinstance(f, Function) else f
                 for name, f in module.functions.items()}
    folded = module.replace(functions=functions, programs=programs)
    return drop_uncalled_programs(folded)


class _CallFolder(ExprMutator):
    """Rewrites every tensor-program call (If branches included) with ``fold_call``."""

    def __init__(self, fold_call: Callable[[CallTIR], CallTIR]) -> None:
        super().__init__()
        self.fold_call = fold_call

    def visit_call_tir(self, call: CallTIR) -> Expr:
        return self.fold_call(call)


def _is_scalar_constant(arg) -> bool:
    """A one-element constant the program can hold as a literal: an int64 outside int32 is not
    one (the device holds int64 in 32 bits; written in, it would be saturated and ``Max(x, 2^53)``
    would answer ``2^31 - 1``): it stays a weight, which the bundle refuses by name."""
    return (isinstance(arg, Constant) and arg.data.size == 1 and str(arg.data.dtype) in FOLDABLE_DTYPES
            and (arg.data.dtype == np.bool_ or np.isfinite(arg.data).all())
            and (arg.data.dtype != np.int64 or INT32_MIN <= int(arg.data.reshape(-1)[0]) <= INT32_MAX))

