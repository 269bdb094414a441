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
the ``If``.  A ``Loop`` gets a storage for each carried value and each stacked one and is
rewritten into its planned form, which writes them itself::

    c = alloc_tensor(storage_c)                            # a carried value's storage
    _ = call_tir_into("loop_carry", (init,), out=c)        # its initial value
    s = alloc_tensor(storage_s)                            # a stacked value's rows
    _: Tuple() = loop(count, i):                           # the body reads c; it plans its own
        ...                                                #   temporaries from the storages
        _ = call_tir_into("loop_stack_row", (value,), out=s, sizes={..., "i": i})  # row i
        _ = call_tir_into("loop_carry", (next,), out=c)    # the next iteration's c
    result = (c, s)

(``relaxweb/ops/loop.py`` makes the two kernels; a next value that is another carried value
goes through a temporary first, and one that is the carried value itself is not copied.)
The planned function is no longer a dataflow block (it writes into storages): its variables
become plain ``Var`` s.

With ``PassContext(storage_reuse=False)`` every tensor gets a storage of its own (the
baseline ``scripts/measure_pipeline.py`` compares against).
"""

from __future__ import annotations

from dataclasses import dataclass, replace

from ..errors import UnsupportedModelError
from ..ir.builder import FunctionBuilder
from ..ir.dtype import dtype_info
from ..ir.expr import (
    AllocStorage, AllocTensor, BindingBlock, Call, CallTIR, CallTIRInto, Expr, Function, If, Loop, MatchCast, SeqExpr,
    Tuple, Var, VarBinding, tensor_shape,
)
from ..ir.functor import Aliases, ExprMutator, iter_bindings, use_counts
from ..ir.op_registry import is_view
from ..ir.module import IRModule, ProgramTable
from ..ir.struct_info import ObjectStructInfo, OptionalStructInfo, SequenceStructInfo, TensorStructInfo, TupleStructInfo
from ..ir.symbolic import Analyzer, PrimExpr, SizeVar, expr_max, product, simplify
from ..ops.kv_cache import CACHE_OFFSET, cache_writer
from ..ops.paged_kv import paged_writer
from ..ops.loop import carried_copy, stacked_row_writer
from .context import PassContext


@dataclass
class _Storage:
    size: PrimExpr
    var: Var | None = None


def tensor_bytes(info: TensorStructInfo) -> PrimExpr:
    if info.shape is None:
        raise ValueError(f"plan_memory needs known shapes, got {info}")
    return simplify(product(info.shape) * dtype_info(info.dtype).storage_bytes)


def _read_vars(expr: Expr) -> list[Var]:
    """Every variable ``expr`` reads, inside If branches too: a branch that reads its own
    alias of an outer tensor reads that tensor's storage."""
    return list(use_counts(expr))


def plan_memory(module: IRModule) -> IRModule:
    """Plan the storages of every graph function (after legalize_ops), with the current
    context's bounds and storage reuse setting."""
    context = PassContext.current()
    table = ProgramTable(module.programs)  # loops add the kernels that write their storages
    functions = {
        name: _Planner(function, Analyzer.from_bounds(context.bounds), context.storage_reuse, table).plan()
        if isinstance(function, Function) else function
        for name, function in module.functions.items()
    }
    return module.replace(functions=functions, programs=table.programs)


class _Planner:
    def __init__(self, function: Function, analyzer: Analyzer, reuse: bool = True,
                 programs: ProgramTable | None = None) -> None:
        self.function = function
        self.analyzer = analyzer  # size comparisons know the user's bounds
        self.programs = programs or ProgramTable({})  # where a loop's kernels go
        self.reuse = reuse  # False: a storage per tensor (to measure what reuse saves)
        self.storages: list[_Storage] = []
        self.storage_of: dict[Var, int] = {}
        self.aliases = Aliases(function)
        self.sequence_casts = {b.var: b.value for b in iter_bindings(function)
                               if isinstance(b, MatchCast) and _is_sequence(b.struct_info)}
        self.renamer = ExprMutator()  # each variable -> its plain Var in the planned function
        self.names = FunctionBuilder(function.name)
        for var in function.params:
            self.names.unique_name(var.name)
        # A loop's value is a tuple of tensors, each in a storage of its own: one stand-in
        # variable per field, so that its items resolve to them (and hold their storages)
        self.loop_fields: dict[Var, tuple[Var, ...]] = {}
        for binding in iter_bindings(function):
            if isinstance(binding.value, Loop):
                fields = tuple(Var(f"{binding.var.name}_{index}", info)
                               for index, info in enumerate(binding.value.struct_info.fields))
                self.loop_fields[binding.var] = fields
                self.aliases.tuples[binding.var] = Tuple(fields)

    def plan(self) -> Function:
        body = self.plan_seq(self.function.body, [], {}, is_function_body=True)
        storage_bindings = []
        for storage in self.storages:
            storage.var = Var(self.names.unique_name("storage"), ObjectStructInfo())
            storage_bindings.append(VarBinding(storage.var, AllocStorage(storage.size)))
        # alloc_tensor bindings were built with placeholder storage indices; attach the vars
        body = _StorageAttacher([storage.var for storage in self.storages]).visit_seq_expr(body)
        bindings = tuple(storage_bindings) + body.blocks[0].bindings
        return replace(self.function, body=SeqExpr((BindingBlock(bindings),), body.body))

    # -- aliases and renaming ---------------------------------------------------------------

    def root_of(self, expr: Expr) -> Var | None:
        """The variable whose storage holds ``expr``'s value (itself when it is not an alias)."""
        root = self.aliases.resolve(expr)
        if isinstance(root, Var):
            return root
        return expr if isinstance(expr, Var) else None  # a constant, or an item of an unknown tuple

    def rename(self, expr: Expr) -> Expr:
        return self.renamer.visit_expr(expr)

    def new_var(self, var: Var) -> Var:
        fresh = Var(self.names.unique_name(var.name), var.struct_info)
        self.renamer.var_remap[var] = fresh
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
        uses = [(index, _read_vars(binding.value)) for index, binding in enumerate(bindings)]
        uses.append((len(bindings), _read_vars(seq.body)))
        last_use = self.last_uses(uses)
        result: list = []
        for index, binding in enumerate(bindings):
            self.check_appended_in_place(binding, index, uses)
            result += self.plan_binding(binding, free, forced, defined_here)
            self.release(binding, index, free, forced, defined_here, last_use)
        return SeqExpr((BindingBlock(tuple(result)),), self.rename(seq.body))

    def last_uses(self, uses: list[tuple[int, list[Var]]]) -> dict[Var, int]:
        """The last use of each storage-holding root (and of the fields of a tuple read whole),
        from each binding's (and the result's) reads."""
        last_use: dict[Var, int] = {}
        for index, used in uses:
            for var in used:
                root = self.root_of(var)
                if root is not None:
                    last_use[root] = index
                    for field in self.aliases.tuple_fields(root) or ():
                        field_root = self.root_of(field)
                        if field_root is not None:
                            last_use[field_root] = index
        return last_use

    def plan_binding(self, binding, free: list[int], forced: dict[Var, int], defined_here: set[Var]) -> list:
        """The planned bindings of one binding, by the kind of its value; a tensor it defines
        in a storage of its own joins ``defined_here``."""
        value, var = binding.value, binding.var
        if isinstance(value, CallTIR):
            return self.plan_call_tir(var, value, free, forced, defined_here)
        if isinstance(value, If):
            return self.plan_if(var, value, free, forced, defined_here)
        if isinstance(value, Loop):
            if var in forced:
                raise NotImplementedError(f"Loop '{var.name}': a loop cannot be the result of an If branch yet")
            planned = self.plan_loop(var, value, free)
            defined_here.update(self.loop_fields[var])
            return planned
        if isinstance(value, Call):
            return self.plan_call(binding, value)
        new = self.new_var(var)
        return [replace(binding, var=new, value=self.rename(value))]

    def plan_call_tir(self, var: Var, value: CallTIR, free: list[int], forced: dict[Var, int],
                      defined_here: set[Var]) -> list:
        """A kernel call writes into a storage: ``alloc_tensor`` then ``call_tir_into``."""
        storage = forced.get(var)
        if storage is None:
            storage = self.take_storage(free, tensor_bytes(value.struct_info))
        self.storage_of[var] = storage
        defined_here.add(var)
        new = self.new_var(var)
        return [
            VarBinding(new, _PendingAlloc(storage, value.struct_info)),
            VarBinding(Var(self.names.unique_name("_"), TupleStructInfo(())),
                       CallTIRInto(value.program, tuple(self.rename(a) for a in value.args), new, value.size_var_values)),
        ]

    def plan_if(self, var: Var, value: If, free: list[int], forced: dict[Var, int], defined_here: set[Var]) -> list:
        """An If of a sequence: each branch leaves it in one table (lower_shapes_to_host picks
        it); an If of a tensor: one storage, which each branch's last kernel call writes."""
        if _is_sequence(value.struct_info):
            branches = [self.plan_seq(branch, list(free), {}) for branch in (value.true_branch, value.false_branch)]
            return [VarBinding(self.new_var(var), If(self.rename(value.condition), *branches))]
        if not isinstance(value.struct_info, TensorStructInfo):
            raise UnsupportedModelError(
                f"If '{var.name}': no GPU lowering yet for an If whose result is a {value.struct_info}")
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
        return [VarBinding(new, If(self.rename(value.condition), *branches))]

    def plan_call(self, binding, value: Call) -> list:
        """A call left after legalization: a view (a KV cache and its views live in the past
        input's storage, ops/kv_cache.py: the cache's new rows are written there in place) or
        a sequence op the host lowers (ops/sequence.py: its arena is the host's)."""
        if is_view(value):
            new = self.new_var(binding.var)
            planned = [replace(binding, var=new, value=self.rename(value))]
            if value.op == "kv_cache_write":
                planned.append(self.effect(self.cache_write(value, new)))
            elif value.op == "paged_kv_write":
                planned.append(self.effect(self.paged_write(value, new)))
            return planned
        if value.op in SEQUENCE_OPS:
            new = self.new_var(binding.var)
            return [replace(binding, var=new, value=self.rename(value))]
        raise ValueError(f"plan_memory expects legalized functions, found a call of {value.op} in '{binding.var.name}'")

    def release(self, binding, index: int, free: list[int], forced: dict[Var, int], defined_here: set[Var],
                last_use: dict[Var, int]) -> None:
        """Free the storages of the tensors defined here that binding ``index`` uses last."""
        released_vars = _read_vars(binding.value) + [binding.var] + list(self.loop_fields.get(binding.var, ()))
        for released in dict.fromkeys(released_vars):  # in order: storages reused deterministically
            root = self.root_of(released)
            if root in defined_here and last_use.get(root, -1) <= index and root in self.storage_of:
                if self.storage_of[root] not in free and root not in forced:
                    free.append(self.storage_of[root])
                defined_here.discard(root)

    def cache_write(self, value: Call, cache: Var) -> CallTIRInto:
        """The in-place write of ``kv_cache_write(past, new[, lengths])``'s new rows into ``cache``."""
        past, new, *lengths = value.args
        axis = value.attrs["axis"]
        name = self.programs.add(cache_writer(new.struct_info, axis, value.attrs["capacity"], ragged=bool(lengths)))
        sizes = tuple((v.name, tensor_shape(past)[axis] if v.name == CACHE_OFFSET else SizeVar(v.name))
                      for v in self.programs.programs[name].size_vars)
        return CallTIRInto(name, (self.rename(new), *(self.rename(n) for n in lengths)), cache, sizes)

    def paged_write(self, value: Call, pool: Var) -> CallTIRInto:
        """The in-place write of ``paged_kv_write(pool, new, page_table, positions)``'s rows into ``pool``."""
        _, new, table, positions = value.args
        name = self.programs.add(paged_writer(value))
        sizes = tuple((v.name, SizeVar(v.name)) for v in self.programs.programs[name].size_vars)
        return CallTIRInto(name, tuple(self.rename(arg) for arg in (new, table, positions)), pool, sizes)

    # -- sequences --------------------------------------------------------------------------

    def sequence_root(self, expr: Expr) -> Expr:
        """The sequence ``expr`` names, through aliases and casts of sequences."""
        root = self.aliases.resolve(expr)
        while isinstance(root, Var) and root in self.sequence_casts:
            root = self.aliases.resolve(self.sequence_casts[root])
        return root

    def check_appended_in_place(self, binding, index: int, uses: list) -> None:
        """A sequence grows in place (``sequence_insert``, a loop carrying it): no one may
        read its old value afterwards, which would see the new elements."""
        value = binding.value
        if isinstance(value, Call) and value.op == "sequence_insert":
            grown = [value.args[0]]
        elif isinstance(value, Loop):
            grown = [init for carried, init in zip(value.carried, value.init) if _is_sequence(carried.struct_info)]
        elif isinstance(value, If) and _is_sequence(value.struct_info):
            grown = [outer for outer in [_kept_by_if(value, self.aliases)] if outer is not None]
        else:
            return
        for sequence in grown:
            root = self.sequence_root(sequence)
            if any(self.sequence_root(v) is root for later, used in uses if later > index for v in used):
                raise UnsupportedModelError(
                    f"'{binding.var.name}': the sequence '{getattr(sequence, 'name', '?')}' is read again after "
                    "elements are inserted into it; no GPU lowering yet for a sequence copied before it grows")

    # -- loops ------------------------------------------------------------------------------

    def plan_loop(self, var: Var, loop: Loop, free: list[int]) -> list:
        """The bindings of a loop's planned form (see the module doc)."""
        bindings: list = []
        views = []  # carried values, then stacked ones: the tensors in the loop's storages
        for field, info in zip(self.loop_fields[var], loop.struct_info.fields):
            if not _is_sequence(info):
                self.storage_of[field] = self.take_storage(free, tensor_bytes(info))
        for index, (carried, init) in enumerate(zip(loop.carried, loop.init)):
            view = self.new_var(carried)  # the body reads the carried value in its storage
            if _is_sequence(carried.struct_info):
                # a carried sequence grows in place in its initial value's arena (the body
                # may only append to it: checked below)
                bindings.append(VarBinding(view, self.rename(init)))
                views.append(view)
                continue
            bindings.append(VarBinding(view, _PendingAlloc(self.storage_of[self.loop_fields[var][index]], view.struct_info)))
            bindings.append(self.copy(self.rename(init), view))
            views.append(view)
        for field in self.loop_fields[var][len(loop.carried):]:
            view = Var(self.names.unique_name(f"{var.name}_stacked"), field.struct_info)
            bindings.append(VarBinding(view, _PendingAlloc(self.storage_of[field], view.struct_info)))
            views.append(view)
        body_free = list(free)
        body = self.plan_seq(loop.body, body_free, {})
        results, planned = loop.body.body, body.body
        assert isinstance(results, Tuple) and isinstance(planned, Tuple), "a loop body's value is a tuple"
        tail = []
        for value, view in zip(planned.fields[len(loop.carried):], views[len(loop.carried):]):
            writer = self.programs.add(stacked_row_writer(view.struct_info, loop.iteration))
            sizes = tuple((v.name, SizeVar(v.name)) for v in self.programs.programs[writer].size_vars)
            tail.append(self.effect(CallTIRInto(writer, (value,), view, sizes)))
        sources = []
        carried_count = len(loop.carried)
        for index, (original, value) in enumerate(zip(results.fields[:carried_count], planned.fields[:carried_count])):
            root = self.root_of(original)
            if _is_sequence(original.struct_info):
                if _appended_to(loop.body, root, self.aliases) is not loop.carried[index]:
                    raise UnsupportedModelError(
                        f"Loop '{var.name}': a carried sequence must be the one the body received, with "
                        "elements appended (no GPU lowering yet for any other next value)")
                sources.append(None)
            elif root is loop.carried[index]:
                sources.append(None)  # carried through unchanged: already in its storage
            elif root in loop.carried:  # another carried value, which its own copy may overwrite
                temporary = Var(self.names.unique_name(f"{var.name}_next"), value.struct_info)
                storage = self.take_storage(body_free, tensor_bytes(value.struct_info))
                tail += [VarBinding(temporary, _PendingAlloc(storage, temporary.struct_info)), self.copy(value, temporary)]
                sources.append(temporary)
            else:
                sources.append(value)
        tail += [self.copy(source, view) for source, view in zip(sources, views) if source is not None]
        planned_body = SeqExpr((BindingBlock(body.blocks[0].bindings + tuple(tail)),), Tuple(()))
        planned_loop = Var(self.names.unique_name(f"{var.name}_loop"), TupleStructInfo(()))
        bindings.append(VarBinding(planned_loop, Loop(loop.count, loop.iteration, (), (), planned_body)))
        bindings.append(VarBinding(self.new_var(var), Tuple(tuple(views))))
        return bindings

    def copy(self, value: Expr, view: Var) -> VarBinding:
        program = self.programs.add(carried_copy(view.struct_info))
        sizes = tuple((v.name, SizeVar(v.name)) for v in self.programs.programs[program].size_vars)
        return self.effect(CallTIRInto(program, (value,), view, sizes))

    def effect(self, value: Expr) -> VarBinding:
        """``_ = value``: a binding kept for what it writes."""
        return VarBinding(Var(self.names.unique_name("_"), TupleStructInfo(())), value)


def _is_sequence(info) -> bool:
    return isinstance(info, SequenceStructInfo) or (
        isinstance(info, OptionalStructInfo) and isinstance(info.inner, SequenceStructInfo))


def _appended_to(seq: SeqExpr, var: Var | None, aliases: Aliases) -> Var | None:
    """The sequence ``var`` is ``var`` itself with elements appended to (``sequence_insert``
    at the end, as often as it is): that sequence."""
    definitions = {b.var: b.value for block in seq.blocks for b in block.bindings}
    while var in definitions:
        value = definitions[var]
        if isinstance(value, Call) and value.op == "sequence_insert":
            root = aliases.resolve(value.args[0])
        elif isinstance(value, If) and _is_sequence(value.struct_info):
            root = _kept_by_if(value, aliases)
        else:
            break
        var = root if isinstance(root, Var) else None
    return var


#: The sequence ops lower_shapes_to_host lowers (ops/sequence.py, ``host_lowered``).
SEQUENCE_OPS = ("sequence_empty", "sequence_construct", "sequence_insert", "optional_get_element", "optional_has_element")


def _kept_by_if(value: If, aliases: Aliases) -> Var | None:
    """The outer sequence an If returns from one branch, when the other builds a new one
    (which lower_shapes_to_host writes into the outer one's table and arena): that sequence."""
    kept = []
    for branch in (value.true_branch, value.false_branch):
        definitions = {b.var: b.value for block in branch.blocks for b in block.bindings}
        result = aliases.resolve(branch.body)
        while isinstance(result, Var) and result in definitions and isinstance(definitions[result], Call) \
                and definitions[result].op == "optional_get_element":
            result = aliases.resolve(definitions[result].args[0])
        built = isinstance(definitions.get(result), Call) and definitions[result].op in ("sequence_empty", "sequence_construct")
        if not built:
            kept.append(result)
    return kept[0] if len(kept) == 1 and isinstance(kept[0], Var) else None


@dataclass(frozen=True, eq=False)
class _PendingAlloc(Expr):
    """An alloc_tensor whose storage variable is created at the end of planning."""

    storage: int
    struct_info: TensorStructInfo


class _StorageAttacher(ExprMutator):
    """Replaces each pending allocation (If branches included) by an alloc_tensor of its storage."""

    expr_methods = {**ExprMutator.expr_methods, _PendingAlloc: "visit_pending_alloc"}

    def __init__(self, storage_vars: list[Var]) -> None:
        super().__init__()
        self.storage_vars = storage_vars

    def visit_pending_alloc(self, alloc: _PendingAlloc) -> Expr:
        return AllocTensor(self.storage_vars[alloc.storage], alloc.struct_info)
