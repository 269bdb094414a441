"""lower_shapes_to_host: turn the planned ``main`` into the host function.

Everything the host module must do on each run becomes explicit (see
``relaxweb/ir/host.py``): the checks that bind the size variables from the input shapes and
enforce the model's annotations and the user's bounds (each with its own error message),
the storages and their byte sizes, the weights, and the steps in order — dispatches, the
run-time checks and bindings of ``match_cast``, ``If`` on a symbolic condition, loops (the
planned ``Loop``: its iteration a size variable of the host), reads of GPU values
(``tensor_to_prim``, and ``If`` on a tensor) after which the host resumes, and the output
shapes.

Each tensor has a *host shape*: its annotated shape, or, for the result of an ``If`` whose
branches have different shapes, hidden variables (``_r_dim0``…) that each branch assigns.
A ``match_cast`` binds new size variables from the host shape, or checks it.  After this
pass no graph-level construct is left; the WebAssembly and WGSL backends read the host
function and the kernels.
"""

from __future__ import annotations

from ..errors import RelaxwebError, UnsupportedModelError
from ..ir.dtype import dtype_info
from ..ir.expr import (
    AllocStorage, AllocTensor, Call, CallTIRInto, Constant, Expr, Function, If, Loop, MatchCast, PrimValue, SeqExpr,
    TensorToPrim, Tuple, TupleGetItem, Var, VarBinding, tensor_shape,
)
from ..ir.functor import Aliases, ExprFunctor, iter_bindings
from ..ir.kv_pool import KV_POOL
from ..ir.host import (
    BufferRef, HostBind, HostCache, HostCheck, HostDispatch, HostFunction, HostIf, HostInput, HostLoop, HostOutput,
    HostOutputShape, HostRead, HostSequence, HostSequenceAppend, HostSequenceClear, HostSequenceInput,
    HostSequencePresence, HostStorage, ShapeCheck, walk_steps,
)
from ..ir.launch import dispatch_count
from ..ir.library_kernel import LibraryKernel
from ..ir.op_registry import is_view
from ..ir.module import IRModule, ProgramTable
from ..ir.printer import format_value
from ..ir.struct_info import OptionalStructInfo, PrimStructInfo, SequenceStructInfo, TensorStructInfo, TupleStructInfo
from ..ir.symbolic import Analyzer, PrimExpr, SizeVar, as_int, format_expr, free_var_names, product, substitute
from ..ops.sequence import sequence_write_kernel
from .context import PassContext
from .plan_memory import tensor_bytes


def lower_shapes_to_host(module: IRModule) -> IRModule:
    """Replace ``main`` (after plan_memory) by its HostFunction, which enforces the current
    context's bounds."""
    bounds = dict(PassContext.current().bounds)
    lowering = _Lowering(module, module.main, bounds)
    host = lowering.lower()
    return module.replace(programs=lowering.programs.programs).with_function(host)  # type: ignore[arg-type]


class _Lowering(ExprFunctor):
    """Lowers the planned function binding by binding: each ``visit_<kind>`` lowers a
    binding of that kind of value (``self.binding_var``) to the host steps it needs."""

    def __init__(self, module: IRModule, function: Function, bounds: dict[str, int]) -> None:
        self.module = module
        self.function = function
        self.bounds = bounds
        self.analyzer = Analyzer.from_bounds(bounds)  # proves the checks the bounds make true
        # size variables as the model wrote them (frontend/onnx.py), for the messages
        self.as_written: dict[str, str] = dict(module.attrs.get("size_var_names", {}))
        self.checks: list[ShapeCheck] = []
        self.symbolic_vars: list[str] = []
        self.defined_by: dict[str, str] = {}
        self.storages: list[HostStorage] = []
        self.storage_of: dict[Var, int] = {}
        self.planned: dict[Var, int] = {}
        self.host_shape: dict[Var, tuple[PrimExpr, ...]] = {}
        self.prim_value: dict[Var, PrimExpr] = {}
        self.aliases = Aliases(function)
        self.binding_var: Var | None = None  # the variable of the binding being lowered
        self.top_level = True  # False inside an If branch or a loop's body
        self.weights: list[Constant] = []
        self.weight_index: dict[int, int] = {}
        self.read_slots = 0
        self.next_code = 1
        self.programs = ProgramTable(module.programs)  # sequences add the kernel that appends
        self.sequences: list[HostSequence] = []
        self.sequence_of: dict[Var, int] = {}  # a sequence value -> its table
        self.initial_steps: list = []  # the checks of sequence inputs
        self.target: tuple[Var, int] | None = None  # (an If branch's result, the table it is built into)
        # KV caches (ops/kv_cache.py): each past input written in place -> the kv_cache_write call
        self.cache_writes: dict[Var, Call] = {}
        for binding in iter_bindings(function):
            if isinstance(binding.value, Call) and binding.value.op in ("kv_cache_write", "paged_kv_write"):
                past = self.aliases.resolve(binding.value.args[0])
                if past not in function.params:
                    raise UnsupportedModelError(f"{binding.var.name}: a KV cache must be the model's past input")
                self.cache_writes[past] = binding.value
        self.caches: list[HostCache] = []
        self.views: dict[Var, Call] = {}  # kv_cache_view bindings, outputs of the caches

    # -- codes and variables -------------------------------------------------------------

    def code(self) -> int:
        self.next_code += 1
        return self.next_code - 1

    def define(self, name: str, where: str) -> None:
        if name in self.defined_by:
            raise ValueError(f"size variable {name} defined twice ({self.defined_by[name]} and {where})")
        self.defined_by[name] = where
        self.symbolic_vars.append(name)

    def lower(self) -> HostFunction:
        self.input_checks()
        # (page_kv_caches replaced the past length and the mask's length by pools: their bounds sized them)
        replaced = set(self.module.attrs.get(KV_POOL, {}).get("replaced_size_vars", ()))
        unknown = sorted(set(self.bounds) - set(self.symbolic_vars) - self.match_cast_vars() - replaced)
        if unknown:
            raise RelaxwebError(
                f"--bound names {', '.join(unknown)}, but the model's symbolic variables are: "
                f"{', '.join(self.shown(v) for v in self.symbolic_vars + sorted(self.match_cast_vars())) or '(none)'}"
            )
        steps = self.initial_steps + self.lower_seq(self.function.body, top_level=True)
        outputs_vars = list(self.function.body.body.fields) if isinstance(self.function.body.body, Tuple) else [self.function.body.body]
        outputs = []
        for index, (var, name) in enumerate(zip(outputs_vars, self.function.output_names)):
            root = self.resolve(var)
            if isinstance(var.struct_info, (SequenceStructInfo, OptionalStructInfo)):
                optional = isinstance(var.struct_info, OptionalStructInfo)
                element = (var.struct_info.inner if optional else var.struct_info).element
                sequence = self.sequence(var)
                table = self.sequences[sequence]
                outputs.append(HostOutput(name, table.dtype, table.storage, None, element.ndim, sequence, optional))
                continue
            cache = self.cache_output(var, root, index)
            if cache is None and (not isinstance(root, Var) or root not in self.storage_of
                                  or self.storage_of[root] < len(self.function.params)):
                raise UnsupportedModelError(f"output '{name}' must be computed by the model (not an input or a constant)")
            info = var.struct_info
            assert isinstance(info, TensorStructInfo)
            storage = self.storage_of[root]
            if cache is None:
                self.storages[storage] = HostStorage(self.storages[storage].size, "output")
            outputs.append(HostOutput(name, info.dtype, storage, info.shape, info.ndim))
            steps.append(HostOutputShape(index, self.shape_of(var)))
        needed = free_var_names([s.size for s in self.storages]) | free_var_names(
            [value for d in _dispatches(steps) for _, value in d.size_var_values]
        )
        missing = sorted(needed - set(self.symbolic_vars))
        if missing:
            raise UnsupportedModelError(
                f"symbolic variable(s) {', '.join(missing)} cannot be computed by the host "
                "(they need a match_cast from an input shape or from a value read back)"
            )
        return HostFunction(
            self.function.name, tuple(self.inputs), tuple(outputs), tuple(self.symbolic_vars),
            tuple((v, self.bounds.get(v)) for v in self.symbolic_vars), tuple(self.checks),
            tuple(self.storages), tuple(self.weights), tuple(steps), self.read_slots, tuple(self.sequences),
            tuple(self.caches),
        )

    def cache_output(self, var: Expr, root: Expr, index: int) -> HostCache | None:
        """The cache whose view output ``index`` is (``kv_cache_view`` of the ``kv_cache_write``
        into a past input), recorded; None for any other output."""
        view = self.views.get(self.aliases.resolve(var, follow=lambda v: v not in self.views))
        if view is None or root not in self.cache_writes:
            return None
        write = self.cache_writes[root]
        # a paged cache's pool (ops/paged_kv.py) is viewed whole: its pages along axis 0
        axis, capacity = ((0, as_int(tensor_shape(write.args[0])[0])) if write.op == "paged_kv_write"
                          else (write.attrs["axis"], write.attrs["capacity"]))
        if view.attrs["axis"] != axis or any(c.input == self.function.params.index(root) for c in self.caches):
            raise UnsupportedModelError(f"output '{self.function.output_names[index]}': one view of a KV cache may be an output")
        cache = HostCache(self.function.params.index(root), index, axis, capacity, self.storage_of[root])
        self.caches.append(cache)
        return cache

    def match_cast_vars(self) -> set[str]:
        names: set[str] = set()
        for binding in iter_bindings(self.function):
            if isinstance(binding, MatchCast):
                info = binding.struct_info
                dims = info.shape if isinstance(info, TensorStructInfo) and info.shape else (
                    (info.value,) if isinstance(info, PrimStructInfo) and info.value is not None else ())
                names.update(d.name for d in dims if isinstance(d, SizeVar))
        return names

    # -- inputs ---------------------------------------------------------------------------

    def input_checks(self) -> None:
        """Each input's rank, the dims that bind a size variable (its first dim alone) and
        each other dim against what it must equal.  A dim written in variables that only
        later inputs bind (optimum's mask: ``past_sequence_length + sequence_length``) is
        checked after every input's."""
        self.inputs = []
        later: list[tuple[int, int, PrimExpr, str]] = []
        for index, (param, name) in enumerate(zip(self.function.params, self.function.input_names)):
            info = param.struct_info
            if isinstance(info, (SequenceStructInfo, OptionalStructInfo)):
                self.sequence_input(index, param, name, info)
                continue
            if not isinstance(info, TensorStructInfo) or info.shape is None:
                raise UnsupportedModelError(f"input '{name}': needs a tensor annotation with a known rank")
            self.checks.append(ShapeCheck("ndim", index, -1, len(info.shape), None, self.code(),
                                          f"input '{name}' has {{value}} dimensions, expected {{expected}}"))
            for dim, expected in enumerate(info.shape):
                where = f"input '{name}' dimension {dim}"
                if isinstance(expected, SizeVar) and expected.name not in self.defined_by:
                    self.define(expected.name, where)
                    self.checks.append(ShapeCheck("bind", index, dim, None, expected.name, 0, ""))
                    # Checked at run time against the host's var_bounds, which a runtime may
                    # tighten at load even when the build gave no bound.
                    self.checks.append(ShapeCheck(
                        "bound", index, dim, None, expected.name, self.code(),
                        f"input '{name}': dimension {dim} ({self.shown(expected.name)}) is {{value}}, above its "
                        f"bound {self.shown(expected.name)} <= {{expected}}",
                    ))
                    continue
                if free_var_names([expected]) - set(self.defined_by):
                    later.append((index, dim, expected, name))
                    continue
                self.equal_check(index, dim, expected, name)
            self.storage_of[param] = len(self.storages)
            self.host_shape[param] = info.shape
            self.inputs.append(HostInput(name, info.dtype, info.shape, len(self.storages)))
            if param in self.cache_writes:  # the past of a KV cache: stored with the cache's capacity
                self.storages.append(HostStorage(tensor_bytes(self.cache_writes[param].struct_info), "cache"))
            else:
                self.storages.append(HostStorage(tensor_bytes(info), "input"))
        for index, dim, expected, name in later:
            if free_var_names([expected]) - set(self.defined_by):
                raise UnsupportedModelError(
                    f"input '{name}': dimension {dim} is {self.shown_expr(expected)}; size variables must "
                    "appear alone as some input's dimension"
                )
            self.equal_check(index, dim, expected, name)

    def equal_check(self, index: int, dim: int, expected: PrimExpr, name: str) -> None:
        self.checks.append(ShapeCheck("equal", index, dim, expected, None, self.code(),
                                      f"input '{name}': dimension {dim} is {{value}}, expected {{expected}}"
                                      + self.detail(expected)))

    # -- sequences ----------------------------------------------------------------------

    def new_sequence(self, info: SequenceStructInfo, role: str, where: str) -> int:
        """A new table and its arena storage, whose size is a host variable of its own."""
        if self.target is not None and self.binding_var is self.target[0]:
            return self.target[1]  # an If branch's result, built into the table the other branch keeps
        index = len(self.sequences)
        size_var = f"_sequence{index}_bytes"
        self.define(size_var, where)
        element_bytes = max(dtype_info(info.element.dtype).bytes, 4)  # as tensor_bytes counts
        self.sequences.append(HostSequence(len(self.storages), size_var, info.element.dtype, info.element.ndim,
                                           element_bytes))
        self.storages.append(HostStorage(SizeVar(size_var), role))
        return index

    def sequence_input(self, index: int, param: Var, name: str, info) -> None:
        optional = isinstance(info, OptionalStructInfo)
        info = info.inner if optional else info  # legalize_ops refused optional tensors
        sequence = self.new_sequence(info, "input", f"the elements of input '{name}'")
        self.sequence_of[param] = sequence
        self.inputs.append(HostInput(name, info.element.dtype, (), self.sequences[sequence].storage, sequence, optional))
        self.initial_steps.append(HostSequenceInput(
            sequence, name, optional,
            self.code(), f"input '{name}': element {{value}} has a rank other than {info.element.ndim}"
            if info.element.ndim >= 0 else f"input '{name}': element {{value}} has more than {{expected}} dimensions",
            self.code(), f"input '{name}' has {{value}} elements, above the {{expected}} a sequence can hold"))

    def sequence(self, expr: Expr) -> int:
        root = self.resolve(expr)
        if not isinstance(root, Var) or root not in self.sequence_of:
            raise UnsupportedModelError(f"the sequence {format_value(expr)} is not known to the host")
        return self.sequence_of[root]

    def append(self, sequence: int, element: Expr, note: str) -> list:
        """Copy ``element`` to the end of the sequence's arena, then add it to the table."""
        table = self.sequences[sequence]
        shape = self.shape_of(element)
        kernel = self.programs.add(sequence_write_kernel(table.dtype))
        end = SizeVar(table.size_var) // table.element_bytes
        sizes = (("count", product(shape)), ("arena", end + product(shape)), ("offset", end))
        dispatch = HostDispatch(kernel, (self.buffer_ref(element), BufferRef("storage", table.storage)), sizes,
                                product(shape), note)
        message = f"{note}: the sequence has {{value}} elements, the most a sequence can hold is {{expected}}"
        return [dispatch, HostSequenceAppend(sequence, tuple(shape), self.code(), message)]

    def visit_call(self, value: Call) -> list:
        """The sequence ops the host lowers (``ops/sequence.py``, ``host_lowered``); a KV cache
        and its views are aliases of the past input's storage (its write is a dispatch of its own)."""
        var = self.binding_var
        if is_view(value):
            self.host_shape[var] = value.struct_info.shape
            if value.op == "kv_cache_view":
                self.views[var] = value
            return []
        note = f"{var.name} = {value.op}"
        if value.op == "optional_has_element":
            variable = f"_present{len([v for v in self.symbolic_vars if v.startswith('_present')])}"
            self.define(variable, note)
            self.prim_value[var] = SizeVar(variable)
            return [HostSequencePresence(self.sequence(value.args[0]), variable)]
        if value.op == "optional_get_element":
            self.sequence_of[var] = self.sequence(value.args[0])
            return []
        if value.op == "sequence_insert":
            sequence = self.sequence(value.args[0])
            self.sequence_of[var] = sequence  # appended in place (plan_memory checks the old value is not read again)
            return self.append(sequence, value.args[1], note)
        if value.op in ("sequence_empty", "sequence_construct"):
            sequence = self.new_sequence(value.struct_info, "intermediate", note)
            self.sequence_of[var] = sequence
            steps: list = [HostSequenceClear(sequence)]
            for element in value.args:
                steps += self.append(sequence, element, note)
            return steps
        raise ValueError(f"lower_shapes_to_host: no lowering for {value.op} in '{var.name}'")

    def detail(self, expected: PrimExpr) -> str:
        if as_int(expected) is not None:
            return ""
        sources = ", ".join(f"{self.shown(v)} from {self.defined_by[v]}" for v in sorted(free_var_names([expected])))
        return f" ({self.shown_expr(expected)}; {sources})"

    def shown(self, name: str) -> str:
        """A size variable as users know it: as the model wrote it."""
        return self.as_written.get(name, name)

    def shown_expr(self, expr: PrimExpr) -> str:
        return format_expr(expr, self.as_written)

    # -- values ---------------------------------------------------------------------------

    def resolve(self, expr: Expr) -> Expr:
        """Follow aliases (a = b, tuple items, match_cast of tensors) to the defining var."""
        root = self.aliases.resolve(expr)
        if isinstance(root, TupleGetItem):
            raise UnsupportedModelError(f"cannot resolve tuple item {format_value(root)}")
        return root

    def shape_of(self, expr: Expr) -> tuple[PrimExpr, ...]:
        if isinstance(expr, Var) and expr in self.host_shape:
            return self.host_shape[expr]
        root = self.resolve(expr)
        if isinstance(root, Var) and root in self.host_shape:
            return self.host_shape[root]
        info = expr.struct_info
        if isinstance(info, TensorStructInfo) and info.shape is not None:
            return info.shape
        raise UnsupportedModelError(f"the shape of {format_value(expr)} is not known to the host")

    def buffer_ref(self, expr: Expr) -> BufferRef:
        if isinstance(expr, Constant):
            if id(expr) not in self.weight_index:
                self.weight_index[id(expr)] = len(self.weights)
                self.weights.append(expr)
            return BufferRef("weight", self.weight_index[id(expr)])
        root = self.resolve(expr)
        if isinstance(root, Constant):
            return self.buffer_ref(root)
        if isinstance(root, Var) and root in self.storage_of:
            return BufferRef("storage", self.storage_of[root])
        raise ValueError(f"lower_shapes_to_host: {format_value(expr)} is not a planned tensor")

    def prim(self, expr: Expr) -> PrimExpr:
        if isinstance(expr, PrimValue):
            return expr.value
        if isinstance(expr, Var) and expr in self.prim_value:
            return self.prim_value[expr]
        info = expr.struct_info
        if isinstance(info, PrimStructInfo) and info.value is not None:
            return info.value
        raise UnsupportedModelError(f"the value of {format_value(expr)} is not known to the host")

    # -- steps ----------------------------------------------------------------------------

    def lower_seq(self, seq: SeqExpr, top_level: bool) -> list:
        outer, self.top_level = self.top_level, top_level
        steps = [step for block in seq.blocks for binding in block.bindings for step in self.visit_binding(binding)]
        self.top_level = outer
        return steps

    def read(self, tensor: Expr, note: str) -> tuple[list, PrimExpr]:
        if not self.top_level:
            raise UnsupportedModelError(f"{note}: reading a GPU value inside an If branch or a loop is not supported yet")
        ref = self.buffer_ref(tensor)
        if ref.kind != "storage":
            raise UnsupportedModelError(f"{note}: the value is a constant; fold it instead of reading it back")
        variable = f"_read{self.read_slots}"
        self.define(variable, note)
        step = HostRead(ref.index, 0, self.read_slots, variable, note)
        self.read_slots += 1
        return [step], SizeVar(variable)

    def visit_var_binding(self, binding: VarBinding) -> list:
        self.binding_var = binding.var
        return self.visit_expr(binding.value)

    def visit_expr_default(self, expr: Expr) -> list:
        raise ValueError(
            f"lower_shapes_to_host expects a planned function; cannot lower {type(expr).__name__} "
            f"in '{self.binding_var.name}'"
        )

    def visit_alloc_storage(self, value: AllocStorage) -> list:
        self.planned[self.binding_var] = len(self.storages)
        self.storages.append(HostStorage(value.size, "intermediate"))
        return []

    def visit_alloc_tensor(self, value: AllocTensor) -> list:
        self.storage_of[self.binding_var] = self.planned[value.storage]
        self.host_shape[self.binding_var] = value.struct_info.shape  # type: ignore[assignment]
        return []

    def visit_call_tir_into(self, value: CallTIRInto) -> list:
        return [self.dispatch(value)]

    def visit_var(self, value: Var) -> list:
        """An alias (see ``self.aliases``); a prim value keeps its value."""
        if value in self.prim_value:
            self.prim_value[self.binding_var] = self.prim_value[value]
        return []

    def visit_tuple(self, value: Tuple) -> list:
        return []  # an alias of its fields (see ``self.aliases``)

    def visit_tuple_get_item(self, value: TupleGetItem) -> list:
        return []  # an alias of the field (see ``self.aliases``)

    def visit_prim_value(self, value: PrimValue) -> list:
        self.prim_value[self.binding_var] = value.value
        return []

    def visit_tensor_to_prim(self, value: TensorToPrim) -> list:
        var = self.binding_var
        steps, read_value = self.read(value.tensor, f"{var.name} = {format_value(value)}")
        self.prim_value[var] = read_value
        return steps

    def dispatch(self, value: CallTIRInto) -> HostDispatch:
        kernel = self.module.programs[value.program]
        refs = tuple(self.buffer_ref(a) for a in value.args) + (self.buffer_ref(value.output),)
        if isinstance(kernel, LibraryKernel):
            count = substitute(kernel.dispatch_count, dict(value.size_var_values))
        else:
            count = substitute(dispatch_count(kernel), dict(value.size_var_values))
        args = ", ".join(format_value(a) for a in value.args)
        return HostDispatch(value.program, refs, value.size_var_values, count, f"{value.output.name} = {value.program}({args})")

    def visit_match_cast(self, binding: MatchCast) -> list:
        var, value, info = binding.var, binding.value, binding.struct_info
        note = binding.reason or f"match_cast '{var.name}'"
        if isinstance(info, (SequenceStructInfo, OptionalStructInfo)):
            self.sequence_of[var] = self.sequence(value)
            return []
        if isinstance(info, PrimStructInfo):
            self.prim_value[var] = self.prim(value)
            expected = [info.value] if info.value is not None else []
            return self.match_dims([self.prim(value)], expected, note, "" if binding.reason else "value")
        if not isinstance(info, TensorStructInfo):
            raise UnsupportedModelError(f"{note}: only tensors and prim values can be cast")
        source_shape = self.shape_of(value)
        if info.shape is None:
            self.host_shape[var] = source_shape
            return []
        if len(source_shape) != len(info.shape):
            raise UnsupportedModelError(f"{note}: the value has {len(source_shape)} dims, the cast says {len(info.shape)}")
        self.host_shape[var] = info.shape
        return self.match_dims(list(source_shape), list(info.shape), note, "" if binding.reason else "dimension")

    def match_dims(self, actual: list[PrimExpr], expected: list[PrimExpr], note: str, what: str) -> list:
        """The steps matching ``actual`` against ``expected``: a size variable seen for the
        first time is bound; anything else is checked, except what the bounds prove (no
        step), and what they refute is an error now.  Messages say ``{note}: {what} {position}``
        (``what`` empty: ``note`` already names the value: a cast's ``reason``)."""
        steps: list = []
        for position, (value, wanted) in enumerate(zip(actual, expected)):
            label = note
            if what:
                label += f": {what}" + (f" {position}" if what == "dimension" else "")
            if isinstance(wanted, SizeVar) and wanted.name not in self.defined_by:
                self.define(wanted.name, label)
                steps.append(HostCheck("nonnegative", value, None, None, self.code(), f"{label} is {{value}}, must be >= 0"))
                steps.append(HostBind(wanted.name, value, label))
                steps.append(HostCheck("bound", SizeVar(wanted.name), None, wanted.name, self.code(),
                                       f"{label} ({self.shown(wanted.name)}) is {{value}}, above its bound "
                                       f"{self.shown(wanted.name)} <= {{expected}}"))
                continue
            missing = free_var_names([wanted]) - set(self.defined_by)
            if missing:
                raise UnsupportedModelError(f"{label}: {self.shown_expr(wanted)} uses undefined variables {sorted(missing)}")
            if self.analyzer.prove_equal(value, wanted):
                continue
            if self.analyzer.prove_not_equal(value, wanted):
                within = f" within the bounds ({self.bounds_text()})" if self.bounds else ""
                raise RelaxwebError(f"{label} is {self.shown_expr(value)}, which is never {self.shown_expr(wanted)} "
                                    f"for any input{within}")
            steps.append(HostCheck("equal", value, wanted, None, self.code(),
                                   f"{label} is {{value}}, expected {{expected}}{self.detail(wanted)}"))
        return steps

    def bounds_text(self) -> str:
        return ", ".join(f"{self.shown(name)} <= {bound}" for name, bound in sorted(self.bounds.items()) if bound is not None)

    def visit_loop(self, value: Loop) -> list:
        """A planned loop (it carries and stacks nothing): its body's steps, once per iteration."""
        var = self.binding_var
        if not self.top_level:
            raise UnsupportedModelError(f"Loop '{var.name}': a loop inside an If branch or another loop is not supported yet")
        if value.carried or value.body.body.struct_info != TupleStructInfo(()):
            raise ValueError(f"lower_shapes_to_host expects a planned loop (plan_memory), got '{var.name}'")
        self.define(value.iteration.name, f"the iteration of loop '{var.name}'")
        steps = self.lower_seq(value.body, top_level=False)
        return [HostLoop(value.iteration.name, value.count, tuple(steps), f"loop '{var.name}'")]

    def visit_if(self, value: If) -> list:
        var = self.binding_var
        steps: list = []
        condition_info = value.condition.struct_info
        if isinstance(condition_info, TensorStructInfo):
            read_steps, condition = self.read(value.condition, f"condition of If '{var.name}'")
            steps += read_steps
        else:
            condition = self.prim(value.condition)
        info = value.struct_info
        if isinstance(info, (SequenceStructInfo, OptionalStructInfo)):
            return steps + [self.sequence_if(var, condition, value)]
        if not isinstance(info, TensorStructInfo):
            raise UnsupportedModelError(f"If '{var.name}': no GPU lowering yet for an If whose result is a {info}")
        if info.shape is None:
            if info.ndim < 0:
                raise UnsupportedModelError(f"If '{var.name}': the branches' results have different ranks")
            hidden = [f"_{var.name}_dim{d}" for d in range(info.ndim)]
            for name in hidden:
                self.define(name, f"the shape of If '{var.name}'")
            self.host_shape[var] = tuple(SizeVar(name) for name in hidden)
        else:
            hidden = []
        branches = []
        for branch in (value.true_branch, value.false_branch):
            branch_steps = self.lower_seq(branch, top_level=False)
            result = branch.body
            for name, dim in zip(hidden, self.shape_of(result)):
                branch_steps.append(HostBind(name, dim, f"If '{var.name}' result"))
            root = self.resolve(result)
            self.storage_of[var] = self.storage_of[root]  # both branches write the same storage
            branches.append(tuple(branch_steps))
        steps.append(HostIf(condition, *branches))
        return steps


    def sequence_if(self, var: Var, condition: PrimExpr, value: If) -> HostIf:
        """An If returning a sequence: one branch keeps an outer sequence, the other builds one
        into that sequence's table (plan_memory checked the outer one is not read again; the
        building branch's result must be a new sequence: one of its own is refused by name)."""
        kept = [self.outer_sequence(branch) for branch in (value.true_branch, value.false_branch)]
        if sum(k is not None for k in kept) != 1:
            raise UnsupportedModelError(f"If '{var.name}': no GPU lowering yet for an If returning a sequence "
                                        "unless one branch keeps an outer sequence and the other builds one")
        table = next(k for k in kept if k is not None)
        branches = []
        for branch, keeps in zip((value.true_branch, value.false_branch), kept):
            self.target = None if keeps is not None else (self.resolve(branch.body), table)
            branches.append(tuple(self.lower_seq(branch, top_level=False)))
            self.target = None
            if self.sequence(branch.body) != table:
                raise UnsupportedModelError(f"If '{var.name}': no GPU lowering yet for a branch that builds a "
                                            "sequence and then inserts into it")
        self.sequence_of[var] = table
        return HostIf(condition, *branches)

    def outer_sequence(self, branch: SeqExpr) -> int | None:
        """The table of the outer sequence a branch returns (through optional_get_element), if any."""
        definitions = {b.var: b.value for block in branch.blocks for b in block.bindings}
        result = self.resolve(branch.body)
        while isinstance(result, Var) and isinstance(definitions.get(result), Call) \
                and definitions[result].op == "optional_get_element":
            result = self.resolve(definitions[result].args[0])
        return self.sequence_of.get(result) if isinstance(result, Var) and result not in definitions else None


def _dispatches(steps) -> list[HostDispatch]:
    return [s for s in walk_steps(steps) if isinstance(s, HostDispatch)]
