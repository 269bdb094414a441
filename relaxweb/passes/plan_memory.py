"""plan_memory: give every tensor a storage, reusing storages whose tensors are dead.

Rewrites each ``lv = call_tir(program, args)`` (and ``call_library``) into::

    lv = alloc_tensor(storage_k)                 # a view at offset 0 of a storage
    _ = call_tir_into(program, args, out=lv)     # the kernel writes into it

with the ``alloc_storage`` bindings for all storages at the top of the function.  Storages
are reused by a linear scan: a tensor's storage is free again after the binding that uses
the tensor (or any alias of it) last, and a new tensor takes a free storage, preferring one
whose size is provably the same, then one provably larger, and otherwise growing a free one
to ``max(old, new)``; among several, the best fit: the smallest large enough, else the
largest too small (comparisons use the user's bounds: with ``n <= 64``, 256 bytes is
provably enough for ``n * 4``).  A tensor never shares a storage with the inputs of the call that
writes it, and the function's outputs keep theirs to the end.  Sizes are symbolic byte
counts compared through the prover.

Aliases take no storage: ``match_cast`` of a tensor, tuples and their items, and plain
``a = b`` share the storage of their source.  An ``If`` gets one storage for its result;
each branch writes its result straight into it (the branch's last kernel call is planned
into that storage) and plans its own temporaries, starting from the storages free before
the ``If``.  The planned function is no longer a dataflow block (it writes into storages):
its variables become plain ``Var`` s.

With ``PassContext(storage_reuse=False)`` every tensor gets a storage of its own (the
baseline ``scripts/measure_pipeline.py`` compares against).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from ..errors import UnsupportedModelError
from ..ir.builder import FunctionBuilder
from ..ir.expr import (
    AllocStorage, AllocTensor, BindingBlock, Call, CallTIR, CallTIRInto, Expr, Function, If, MatchCast,
    SeqExpr, TensorToPrim, Tuple, TupleGetItem, Var, VarBinding,
)
from ..ir.module import IRModule
from ..ir.struct_info import DTYPE_SIZES, storage_element_bytes, ObjectStructInfo, TensorStructInfo, TupleStructInfo
from ..ir.symbolic import Analyzer, PrimExpr, expr_max, product, simplify
from .context import PassContext


@dataclass
class _Storage:
    size: PrimExpr
    var: Var | None = None


def tensor_bytes(info: TensorStructInfo) -> PrimExpr:
    if info.shape is None:
        raise ValueError(f"plan_memory needs known shapes, got {info}")
    if info.dtype not in DTYPE_SIZES:
        raise UnsupportedModelError(f"tensors of dtype {info.dtype} are not supported on the GPU")
    return simplify(product(info.shape) * storage_element_bytes(info.dtype))


def used_vars(expr: Expr) -> list[Var]:
    """Variables an expression reads (inside If branches too)."""
    if isinstance(expr, Var):
        return [expr]
    if isinstance(expr, Tuple):
        return [v for f in expr.fields for v in used_vars(f)]
    if isinstance(expr, TupleGetItem):
        return used_vars(expr.tuple_value)
    if isinstance(expr, TensorToPrim):
        return used_vars(expr.tensor)
    if isinstance(expr, CallTIR):
        return [v for a in expr.args for v in used_vars(a)]
    if isinstance(expr, If):
        found = used_vars(expr.condition)
        for branch in (expr.true_branch, expr.false_branch):
            for block in branch.blocks:
                for binding in block.bindings:
                    found += used_vars(binding.value)
            found += used_vars(branch.body)
        return found
    return []


def plan_memory(module: IRModule) -> IRModule:
    """Plan the storages of every graph function (after legalize_ops), with the current
    context's bounds and storage reuse setting."""
    context = PassContext.current()
    functions = {
        name: _Planner(function, Analyzer.from_bounds(context.bounds), reuse=context.storage_reuse).plan()
        if isinstance(function, Function) else function
        for name, function in module.functions.items()
    }
    return module.replace(functions=functions)


class _Planner:
    def __init__(self, function: Function, analyzer: Analyzer, reuse: bool = True) -> None:
        self.function = function
        self.analyzer = analyzer  # size comparisons know the user's bounds
        self.reuse = reuse  # False: a storage per tensor (to measure what reuse saves)
        self.storages: list[_Storage] = []
        self.storage_of: dict[Var, int] = {}
        self.root: dict[Var, Var] = {}
        self.tuple_fields: dict[Var, tuple[Expr, ...]] = {}
        self.renamed: dict[Var, Var] = {}
        self.names = FunctionBuilder(function.name)
        for var in function.params:
            self.names.unique_name(var.name)

    def plan(self) -> Function:
        body = self.plan_seq(self.function.body, [], {}, is_function_body=True)
        storage_bindings = []
        for storage in self.storages:
            storage.var = Var(self.names.unique_name("storage"), ObjectStructInfo())
            storage_bindings.append(VarBinding(storage.var, AllocStorage(storage.size)))
        # alloc_tensor bindings were built with placeholder storage indices; attach the vars
        bindings = [VarBinding(b.var, AllocTensor(self.storages[b.value.storage].var, b.value.struct_info))
                    if isinstance(b.value, _PendingAlloc) else b for b in body.blocks[0].bindings]
        bindings = [self._attach(b) for b in bindings]
        return replace(self.function, body=SeqExpr((BindingBlock(tuple(storage_bindings + bindings)),), body.body))

    def _attach(self, binding):
        """Resolve pending allocations inside If branches too."""
        value = binding.value
        if isinstance(value, If):
            value = If(value.condition, self._attach_seq(value.true_branch), self._attach_seq(value.false_branch))
            return replace(binding, value=value)
        return binding

    def _attach_seq(self, seq: SeqExpr) -> SeqExpr:
        bindings = []
        for binding in seq.blocks[0].bindings:
            if isinstance(binding.value, _PendingAlloc):
                binding = VarBinding(binding.var, AllocTensor(self.storages[binding.value.storage].var, binding.value.struct_info))
            bindings.append(self._attach(binding))
        return SeqExpr((BindingBlock(tuple(bindings)),), seq.body)

    # -- aliases and renaming ---------------------------------------------------------------

    def root_of(self, expr: Expr) -> Var | None:
        if isinstance(expr, TupleGetItem) and isinstance(expr.tuple_value, Var):
            fields = self.tuple_fields.get(self.root.get(expr.tuple_value, expr.tuple_value))
            return self.root_of(fields[expr.index]) if fields else None
        if isinstance(expr, Var):
            return self.root.get(expr, expr)
        return None

    def rename(self, expr: Expr) -> Expr:
        if isinstance(expr, Var):
            return self.renamed.get(expr, expr)
        if isinstance(expr, Tuple):
            return Tuple(tuple(self.rename(f) for f in expr.fields))
        if isinstance(expr, TupleGetItem):
            return TupleGetItem(self.rename(expr.tuple_value), expr.index)
        if isinstance(expr, TensorToPrim):
            return TensorToPrim(self.rename(expr.tensor))
        if isinstance(expr, CallTIR):
            return replace(expr, args=tuple(self.rename(a) for a in expr.args))
        return expr

    def new_var(self, var: Var) -> Var:
        fresh = Var(self.names.unique_name(var.name), var.struct_info)
        self.renamed[var] = fresh
        return fresh

    # -- the scan ---------------------------------------------------------------------------

    def take_storage(self, free: list[int], size: PrimExpr) -> int:
        if not self.reuse:
            self.storages.append(_Storage(size))
            return len(self.storages) - 1
        prove_le = self.analyzer.prove_less_equal
        sizes = {index: self.storages[index].size for index in free}
        for index in free:
            if self.analyzer.prove_equal(size, sizes[index]):
                free.remove(index)
                return index
        # best fit: the smallest storage provably large enough, else the largest provably too
        # small (grown to this size), else any (grown to the max of both)
        larger = [i for i in free if prove_le(size, sizes[i])]
        smaller = [i for i in free if i not in larger and prove_le(sizes[i], size)]
        if larger:
            index = next((i for i in larger if all(prove_le(sizes[i], sizes[j]) for j in larger)), larger[0])
        elif smaller:
            index = next((i for i in smaller if all(prove_le(sizes[j], sizes[i]) for j in smaller)), smaller[0])
        elif free:
            index = free[0]
        else:
            self.storages.append(_Storage(size))
            return len(self.storages) - 1
        free.remove(index)
        if not larger:
            have = sizes[index]
            self.storages[index].size = size if prove_le(have, size) else simplify(expr_max(have, size))
        return index

    def plan_seq(self, seq: SeqExpr, free: list[int], forced: dict[Var, int], is_function_body: bool = False) -> SeqExpr:
        bindings = [b for block in seq.blocks for b in block.bindings]
        defined_here: set[Var] = set()
        # alias roots first (they only depend on earlier bindings), then last uses per root
        for binding in bindings:
            value = binding.value
            if isinstance(binding, MatchCast) or isinstance(value, (Var, TupleGetItem)):
                source = self.root_of(value)
                if source is not None:
                    self.root[binding.var] = source
            elif isinstance(value, Tuple):
                self.tuple_fields[binding.var] = value.fields
        last_use: dict[Var, int] = {}
        for index, binding in enumerate(bindings):
            for var in used_vars(binding.value):
                root = self.root_of(var)
                if root is not None:
                    last_use[root] = index
                    for field in self.tuple_fields.get(root, ()):
                        field_root = self.root_of(field)
                        if field_root is not None:
                            last_use[field_root] = index
        for var in used_vars(seq.body):
            root = self.root_of(var)
            if root is not None:
                last_use[root] = len(bindings)
                for field in self.tuple_fields.get(root, ()):
                    field_root = self.root_of(field)
                    if field_root is not None:
                        last_use[field_root] = len(bindings)

        result: list = []
        for index, binding in enumerate(bindings):
            value = binding.value
            var = binding.var
            if isinstance(value, CallTIR):
                storage = forced.get(var)
                if storage is None:
                    storage = self.take_storage(free, tensor_bytes(value.struct_info))
                self.storage_of[var] = storage
                defined_here.add(var)
                new = self.new_var(var)
                result.append(VarBinding(new, _PendingAlloc(storage, value.struct_info)))
                result.append(VarBinding(
                    Var(self.names.unique_name("_"), TupleStructInfo(())),
                    CallTIRInto(value.program, tuple(self.rename(a) for a in value.args), new, value.size_var_values),
                ))
            elif isinstance(value, If):
                storage = forced.get(var)
                if storage is None:
                    sizes = [tensor_bytes(branch.body.struct_info) for branch in (value.true_branch, value.false_branch)]
                    storage = self.take_storage(free, sizes[0] if self.analyzer.prove_equal(*sizes) else simplify(expr_max(*sizes)))
                self.storage_of[var] = storage
                defined_here.add(var)
                branches = []
                for branch in (value.true_branch, value.false_branch):
                    if not isinstance(branch.body, Var) or not any(b.var is branch.body and isinstance(b.value, CallTIR) for blk in branch.blocks for b in blk.bindings):
                        raise NotImplementedError(
                            f"If '{var.name}': each branch must end with a value computed inside it "
                            "(returning an outer value from a branch is not supported yet)"
                        )
                    branches.append(self.plan_seq(branch, list(free), {branch.body: storage}))
                new = self.new_var(var)
                result.append(VarBinding(new, If(self.rename(value.condition), *branches)))
            elif isinstance(value, Call):
                raise ValueError(f"plan_memory expects legalized functions, found a call of {value.op} in '{var.name}'")
            else:
                new = self.new_var(var)
                renamed_value = self.rename(value)
                result.append(replace(binding, var=new, value=renamed_value))
            for released in set(used_vars(value)) | {var}:
                root = self.root_of(released)
                if root in defined_here and last_use.get(root, -1) <= index and root in self.storage_of:
                    if self.storage_of[root] not in free and root not in forced:
                        free.append(self.storage_of[root])
                    defined_here.discard(root)
        return SeqExpr((BindingBlock(tuple(result)),), self.rename(seq.body))


@dataclass(frozen=True, eq=False)
class _PendingAlloc(Expr):
    """An alloc_tensor whose storage variable is created at the end of planning."""

    storage: int
    struct_info: TensorStructInfo
