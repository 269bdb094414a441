"""plan_memory: give every tensor a storage, reusing storages whose tensors are dead.

Rewrites each ``lv = call_tir(program, args)`` into::

    lv = alloc_tensor(storage_k)                 # a view at offset 0 of a storage
    _ = call_tir_into(program, args, out=lv)     # the program writes into it

with the ``alloc_storage`` bindings for all storages at the top of the function.  Storages
are reused by a linear scan: a tensor's storage is free again after the binding that uses
the tensor last, and a new tensor takes a free storage of the same dtype size class,
preferring one whose size is provably the same, then one provably larger, and otherwise
growing a free one to ``max(old, new)``.  A tensor never shares a storage with the inputs
of the call that writes it, and the function's outputs keep theirs to the end.  Sizes are
symbolic (bytes, as expressions of the size variables), compared through the prover.
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from ..ir.builder import FunctionBuilder
from ..ir.expr import (
    AllocStorage, AllocTensor, BindingBlock, CallTIR, CallTIRInto, Expr, Function, SeqExpr, Tuple, Var,
    VarBinding,
)
from ..ir.module import IRModule
from ..ir.struct_info import DTYPE_SIZES, ObjectStructInfo, TensorStructInfo, TupleStructInfo
from ..ir.symbolic import PrimExpr, expr_max, product, prove_equal, prove_less_equal, simplify


@dataclass
class _Storage:
    size: PrimExpr
    var: Var | None = None


def tensor_bytes(info: TensorStructInfo) -> PrimExpr:
    return simplify(product(info.shape) * DTYPE_SIZES[info.dtype])


def _uses(expr: Expr) -> list[Var]:
    if isinstance(expr, Var):
        return [expr]
    if isinstance(expr, Tuple):
        return [v for f in expr.fields for v in _uses(f)]
    if isinstance(expr, (CallTIR,)):
        return [v for a in expr.args for v in _uses(a)]
    return []


def plan_memory(module: IRModule) -> IRModule:
    """Plan the storages of every graph function (after legalize_ops)."""
    functions = {
        name: _plan_function(function) if isinstance(function, Function) else function
        for name, function in module.functions.items()
    }
    return module.replace(functions=functions)


def _plan_function(function: Function) -> Function:
    bindings = function.bindings()
    last_use: dict[Var, int] = {}
    for index, binding in enumerate(bindings):
        for var in _uses(binding.value):
            last_use[var] = index
    for var in _uses(function.body.body):
        last_use[var] = len(bindings)  # outputs live to the end

    storages: list[_Storage] = []
    free: list[int] = []
    storage_of: dict[Var, int] = {}
    planned: list[tuple[VarBinding, int]] = []
    for index, binding in enumerate(bindings):
        value = binding.value
        if not isinstance(value, CallTIR):
            raise ValueError(f"plan_memory expects legalized functions, found {type(value).__name__} in {binding.var.name}")
        size = tensor_bytes(value.struct_info)
        storage_index = _take_storage(storages, free, size)
        storage_of[binding.var] = storage_index
        planned.append((binding, storage_index))
        for var in set(_uses(value)):
            if last_use.get(var) == index and var in storage_of:
                free.append(storage_of[var])
        if binding.var not in last_use:  # never used: free at once
            free.append(storage_index)

    names = FunctionBuilder(function.name)
    for var in (*function.params, *(b.var for b in bindings)):
        names.unique_name(var.name)
    storage_bindings = []
    for storage in storages:
        storage.var = Var(names.unique_name("storage"), ObjectStructInfo())
        storage_bindings.append(VarBinding(storage.var, AllocStorage(storage.size)))
    new_bindings: list[VarBinding] = list(storage_bindings)
    for binding, storage_index in planned:
        value = binding.value
        assert isinstance(value, CallTIR)
        tensor = replace(binding, value=AllocTensor(storages[storage_index].var, value.struct_info))
        run = VarBinding(
            Var(names.unique_name("_"), TupleStructInfo(())),
            CallTIRInto(value.program, value.args, binding.var, value.size_var_values),
        )
        new_bindings += [tensor, run]
    return replace(function, body=SeqExpr((BindingBlock(tuple(new_bindings)),), function.body.body))


def _take_storage(storages: list[_Storage], free: list[int], size: PrimExpr) -> int:
    for test in (prove_equal, lambda needed, have: prove_less_equal(needed, have)):
        for index in free:
            if test(size, storages[index].size):
                free.remove(index)
                return index
    if free:
        index = free.pop(0)
        have = storages[index].size
        storages[index].size = size if prove_less_equal(have, size) else simplify(expr_max(have, size))
        return index
    storages.append(_Storage(size))
    return len(storages) - 1
