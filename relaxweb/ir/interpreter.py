"""The reference interpreter: runs an IRModule with numpy, at any stage of the pipeline
(graph functions, and host functions after ``lower_shapes_to_host``: :func:`run_host_function`).

It evaluates graph-level op calls with each op's ``reference`` semantics, tensor programs by
evaluating their compute definition over index grids, loops iteration by iteration, and the
memory-planned form (``alloc_storage`` / ``alloc_tensor`` / ``call_tir_into``) on real byte
buffers — so a wrong storage reuse shows up as wrong numbers.  Input shapes are matched against the parameters'
annotations, binding symbolic variables, exactly as the compiled host module does.
"""

from __future__ import annotations

from typing import Callable, Mapping

import numpy as np

from ..errors import InputShapeError, RunCheckError, run_error_message
from .dtype import dtype_info
from .error_sites import error_sites
from .expr import (
    AllocStorage, AllocTensor, BindingBlock, Call, CallTIR, CallTIRInto, Constant, DataflowBlock, Function, If,
    Loop, MatchCast, PrimValue, SeqExpr, ShapeExpr, TensorToPrim, Tuple, TupleGetItem, Var, VarBinding,
)
from .functor import ExprFunctor
from .host import (
    SEQUENCE_CAPACITY, HostBind, HostCheck, HostDispatch, HostFunction, HostIf, HostLoop, HostOutputShape, HostRead,
    HostSequenceAppend, HostSequenceClear, HostSequenceInput, HostSequencePresence,
)
from .host_functor import HostStepFunctor
from .integer_checks import CheckedDivisor, CheckedInteger, checked_operation
from .library_kernel import LibraryKernel
from .module import IRModule
from .op_registry import get_op
from .scalar_functor import ScalarFunctor
from .struct_info import OptionalStructInfo, PrimStructInfo, SequenceStructInfo, TensorStructInfo
from .symbolic import PrimExpr, SizeVar, as_expr, evaluate, format_expr, free_vars
from .tir import (
    Binary, BinaryOp, Cast, CheckedIndex, Compare, CompareOp, FloatImm, Gather, IndexValue, Load, Reduce,
    ReduceCombiner, ScalarExpr, Select, TensorProgram, Unary, UnaryOp, scalar_dtype,
)


def run_module(module: IRModule, inputs: Mapping[str, np.ndarray], function: str = "main") -> list[np.ndarray]:
    """Run a function of the module on named inputs; returns its outputs as a list."""
    return Interpreter(module).run(module.functions[function], inputs)


def run_kernel(kernel, arrays: list[np.ndarray], size_vars: Mapping[str, int]) -> np.ndarray:
    """Run a tensor program (compute definition) or a library kernel (its numpy reference)."""
    if isinstance(kernel, LibraryKernel):
        if kernel.in_place:
            raise ValueError(f"{kernel.name} writes part of its output in place: it runs only into a storage")
        return kernel.reference(arrays, size_vars) if kernel.sized_reference else kernel.reference(arrays)
    return run_program(kernel, arrays, size_vars)


def run_kernel_into(kernel, arrays: list[np.ndarray], output: np.ndarray, size_vars: Mapping[str, int]) -> None:
    """Run a kernel whose output is ``output`` (a view of a storage)."""
    if isinstance(kernel, LibraryKernel) and kernel.in_place:
        kernel.reference(arrays, output, size_vars)
    else:
        output[...] = run_kernel(kernel, arrays, size_vars)


class Interpreter(ExprFunctor):
    """Evaluates each node kind with numpy; ``values`` holds each variable's value and
    ``size_vars`` each symbolic variable's, bound from the inputs and by match_cast.

    Subclasses can watch every binding by overriding ``visit_var_binding`` /
    ``visit_match_cast`` (the value is in ``self.values`` after ``super()``).
    """

    def __init__(self, module: IRModule) -> None:
        self.module = module
        self.values: dict[Var, object] = {}
        self.size_vars: dict[str, int] = {}

    def run(self, function: Function, inputs: Mapping[str, np.ndarray]) -> list[np.ndarray]:
        self.values, self.size_vars = {}, {}
        named = list(zip(function.params, function.input_names or [p.name for p in function.params]))
        for param, name in named:
            if name not in inputs:
                raise InputShapeError(f"missing input '{name}'")
            self.values[param] = input_value(inputs[name], param.struct_info)
        self.size_vars = first_bindings([(self.values[param], param.struct_info) for param, _ in named])
        for param, name in named:
            match_value(name, self.values[param], param.struct_info, self.size_vars, what="input")
        result = self.visit_seq_expr(function.body)
        outputs = list(result) if isinstance(function.body.body, Tuple) else [result]
        return [copy_value(o) for o in outputs]

    # -- sequences and bindings -----------------------------------------------------------

    def visit_seq_expr(self, seq: SeqExpr):
        for block in seq.blocks:
            self.visit_block(block)
        return self.visit_expr(seq.body)

    def visit_binding_block(self, block: BindingBlock) -> None:
        for binding in block.bindings:
            self.visit_binding(binding)

    def visit_dataflow_block(self, block: DataflowBlock) -> None:
        self.visit_binding_block(block)

    def visit_var_binding(self, binding: VarBinding) -> None:
        try:
            self.values[binding.var] = self.visit_expr(binding.value)
        except (IndexError, ValueError) as error:
            if not isinstance(binding.value, Call):
                raise
            # an op's numpy semantics refused its run-time values (an index past the end, a
            # shape the data cannot take): the user's error, not the interpreter's
            raise InputShapeError(f"{binding.value.op} of binding '{binding.var.name}': {error}") from None

    def visit_match_cast(self, binding: MatchCast) -> None:
        value = self.visit_expr(binding.value)
        match_value(binding.var.name, value, binding.struct_info, self.size_vars, binding.reason)
        self.values[binding.var] = value

    # -- expressions ----------------------------------------------------------------------

    def visit_var(self, var: Var):
        return self.values[var]

    def visit_constant(self, constant: Constant):
        return constant.data

    def visit_shape_expr(self, shape: ShapeExpr):
        return np.array([evaluate(v, self.size_vars) for v in shape.values], dtype=np.int64)

    def visit_prim_value(self, value: PrimValue):
        return int(evaluate(value.value, self.size_vars))

    def visit_tuple(self, value: Tuple):
        return tuple(self.visit_expr(f) for f in value.fields)

    def visit_tuple_get_item(self, item: TupleGetItem):
        return self.visit_expr(item.tuple_value)[item.index]

    def visit_tensor_to_prim(self, value: TensorToPrim):
        return int(np.asarray(self.visit_expr(value.tensor)).reshape(-1)[0])

    def visit_if(self, node: If):
        condition = self.visit_expr(node.condition)
        taken = node.true_branch if int(np.asarray(condition).reshape(-1)[0]) != 0 else node.false_branch
        return self.visit_seq_expr(taken)

    def visit_loop(self, node: Loop):
        """Iteration by iteration: the carried values threaded through, the others stacked
        (a planned loop carries and stacks nothing: its body writes storages)."""
        values = [self.visit_expr(value) for value in node.init]
        rows: list[tuple] = []
        outer = dict(self.size_vars)
        for iteration in range(int(evaluate(node.count, self.size_vars))):
            self.size_vars[node.iteration.name] = iteration
            self.values.update(zip(node.carried, values))
            result = self.visit_seq_expr(node.body)
            values = list(result[:len(node.carried)])
            rows.append(tuple(result[len(node.carried):]))
            self.size_vars = dict(outer)  # size variables the body binds are bound afresh each iteration
        stacked = []
        for position, info in enumerate(node.struct_info.fields[len(node.carried):]):
            if rows:
                stacked.append(np.stack([np.asarray(row[position]) for row in rows]))
            else:
                shape = tuple(int(evaluate(d, self.size_vars)) for d in info.shape)
                stacked.append(np.zeros(shape, dtype=info.dtype))
        return (*values, *stacked)

    def visit_call(self, call: Call):
        arrays = [self.visit_expr(a) for a in call.args]
        return get_op(call.op).reference(arrays, call.attrs)

    def visit_call_tir(self, call: CallTIR):
        kernel = self.module.programs[call.program]
        arrays = [self.visit_expr(a) for a in call.args]
        with self.reporting_checks():
            return run_kernel(kernel, arrays, _program_vars(call.size_var_values, self.size_vars))

    def reporting_checks(self) -> "_ReportedCheck":
        """A block in which a failed :class:`CheckedIndex` becomes the run's error, worded from
        the module's error sites as the runtimes word it."""
        return _ReportedCheck(self.module.attrs)

    def visit_alloc_storage(self, alloc: AllocStorage):
        # Variables bound later (by a match_cast after a read-back) count as 0 for now;
        # alloc_tensor grows the storage when a tensor needs more, as the runtimes do.
        known = {v.name: 0 for v in free_vars(alloc.size)} | self.size_vars
        return _StorageBytes(np.zeros(int(evaluate(alloc.size, known)), dtype=np.uint8))

    def visit_alloc_tensor(self, alloc: AllocTensor):
        storage = self.visit_expr(alloc.storage)
        info = alloc.struct_info
        shape = tuple(int(evaluate(d, self.size_vars)) for d in info.shape)
        count = int(np.prod(shape, dtype=np.int64))
        nbytes = count * dtype_info(info.dtype).bytes
        if storage.data.size < nbytes:
            grown = np.zeros(nbytes, dtype=np.uint8)
            grown[: storage.data.size] = storage.data
            storage.data = grown
        return storage.data[:nbytes].view(info.dtype).reshape(shape)

    def visit_call_tir_into(self, call: CallTIRInto):
        kernel = self.module.programs[call.program]
        arrays = [self.visit_expr(a) for a in call.args]
        output = self.visit_expr(call.output)
        with self.reporting_checks():
            run_kernel_into(kernel, arrays, output, _program_vars(call.size_var_values, self.size_vars))
        return ()


class CheckFailed(IndexError):
    """A :class:`CheckedIndex` out of range where the program's value needs it: the site and
    the values a kernel reports (the index as given, the extent)."""

    def __init__(self, site: int, values: tuple[int, ...]) -> None:
        super().__init__(f"check site {site} failed with values {list(values)}")
        self.site, self.values = site, values


class _ReportedCheck:
    """:meth:`Interpreter.reporting_checks`: a :class:`CheckFailed` leaves as a RunCheckError."""

    def __init__(self, attrs: Mapping) -> None:
        self.attrs = attrs

    def __enter__(self) -> None:
        return None

    def __exit__(self, kind, error, traceback) -> bool:
        if not isinstance(error, CheckFailed):
            return False
        sites = error_sites(self.attrs)
        if not 1 <= error.site <= len(sites):
            raise RunCheckError(f"check site {error.site} (not in the module's table) failed with values "
                                f"{list(error.values)}") from None
        site = sites[error.site - 1]
        raise RunCheckError(run_error_message(site.node, site.op, site.message, error.values)) from None


# The numpy function of each op of the scalar IR (tests/ir/test_scalar_expr.py checks every op has one).
UNARY_FUNCTIONS: dict[UnaryOp, Callable[[np.ndarray], np.ndarray]] = {
    UnaryOp.EXP: np.exp, UnaryOp.TANH: np.tanh, UnaryOp.NEGATIVE: np.negative, UnaryOp.IS_NAN: np.isnan, UnaryOp.IS_FINITE: np.isfinite,
    UnaryOp.SIGMOID: lambda a: 1 / (1 + np.exp(-a)), UnaryOp.ABSOLUTE: np.abs,
    UnaryOp.UNPACK_HALF: lambda a: (np.asarray(a, np.uint32) & 0xFFFF).astype(np.uint16).view(np.float16).astype(np.float32),
    UnaryOp.SQRT: np.sqrt, UnaryOp.LOG: np.log, UnaryOp.FLOOR: np.floor, UnaryOp.CEIL: np.ceil,
    UnaryOp.ROUND: np.round,  # half to even, as WGSL
    UnaryOp.SIN: np.sin, UnaryOp.COS: np.cos, UnaryOp.TAN: np.tan, UnaryOp.ASIN: np.arcsin, UnaryOp.ACOS: np.arccos,
    UnaryOp.ATAN: np.arctan, UnaryOp.ASINH: np.arcsinh, UnaryOp.ACOSH: np.arccosh, UnaryOp.ATANH: np.arctanh,
}


class _StorageBytes:
    """A storage's bytes; replaced (not resized) when a larger tensor is placed in it."""

    def __init__(self, data: np.ndarray) -> None:
        self.data = data


def _program_vars(bindings: tuple[tuple[str, PrimExpr], ...], size_vars: dict[str, int]) -> dict[str, int]:
    return {name: int(evaluate(value, size_vars)) for name, value in bindings}


def input_value(value, info):
    """An input as the interpreter holds it: an array, a list of arrays for a sequence, None
    for an empty optional."""
    if isinstance(info, OptionalStructInfo):
        return None if value is None else input_value(value, info.inner)
    if isinstance(info, SequenceStructInfo) and isinstance(value, (list, tuple)):
        return [np.asarray(element) for element in value]
    return np.asarray(value)


def copy_value(value):
    """An output, copied: an array, a list of arrays (a sequence) or None (an empty optional)."""
    if value is None:
        return None
    if isinstance(value, list):
        return [np.array(element, copy=True) for element in value]
    return np.array(value, copy=True)


def first_bindings(inputs: list[tuple[object, object]]) -> dict[str, int]:
    """Each size variable's value from the first input dim that is that variable alone (as
    the host binds them): an input dim written in variables of later inputs (optimum's mask,
    ``past_sequence_length + sequence_length``) is then checked against them."""
    size_vars: dict[str, int] = {}
    for value, info in inputs:
        shape = getattr(value, "shape", None)
        if isinstance(info, TensorStructInfo) and info.shape is not None and shape is not None and len(shape) == len(info.shape):
            for dim, extent in zip(info.shape, shape):
                if isinstance(dim, SizeVar):
                    size_vars.setdefault(dim.name, int(extent))
    return size_vars


def match_value(name: str, value, info, size_vars: dict[str, int], reason: str = "", what: str = "match_cast of") -> None:
    """The run-time check of a match_cast (and of an input): tensors by shape, prim values by
    value, sequences element by element (each against the elements' annotation, without
    binding: elements differ in shape) and by length, optionals by what they hold.  A cast
    with a ``reason`` (a fact deduction assumed) reports it: ``{reason} is 4, expected 3 (...)``."""
    _VALUE_MATCHES.get(type(info), _match_plain)(name, value, info, size_vars, reason, what)


def _match_optional(name: str, value, info: OptionalStructInfo, size_vars: dict[str, int], reason: str, what: str) -> None:
    if value is not None:
        match_value(name, value, info.inner, size_vars, reason, what)


def _match_sequence(name: str, value, info: SequenceStructInfo, size_vars: dict[str, int], reason: str, what: str) -> None:
    if not isinstance(value, list):
        raise InputShapeError(f"{what} '{name}': expected a sequence (a list of arrays), got {type(value).__name__}")
    for position, element in enumerate(value):
        match_tensor(f"{name}[{position}]", np.asarray(element), info.element, dict(size_vars), what, reason)
    if info.length is not None:
        match_value(name, len(value), PrimStructInfo("int64", info.length), size_vars, reason or f"{what} '{name}': length")


def _match_plain(name: str, value, info, size_vars: dict[str, int], reason: str, what: str) -> None:
    """A tensor or a prim value (neither a sequence nor none)."""
    if value is None or isinstance(value, list):
        raise InputShapeError(f"{what} '{name}': expected a tensor, got {'none' if value is None else 'a sequence'}")
    if not isinstance(info, PrimStructInfo):
        match_tensor(name, np.asarray(value), info, size_vars, what=what, reason=reason)
        return
    if info.value is None:
        return
    if isinstance(info.value, SizeVar) and info.value.name not in size_vars:
        size_vars[info.value.name] = int(value)
        return
    expected = int(evaluate(info.value, size_vars))
    if int(value) != expected:
        what = reason or f"match_cast of '{name}': value"
        raise InputShapeError(f"{what} is {int(value)}, expected {expected} ({format_expr(info.value)})")


# The check of each annotation kind that is not a plain value.
_VALUE_MATCHES: dict[type, Callable[..., None]] = {OptionalStructInfo: _match_optional, SequenceStructInfo: _match_sequence}


def match_tensor(name: str, array: np.ndarray, info, size_vars: dict[str, int], what: str = "input",
                 reason: str = "") -> None:
    """Check an array against a tensor annotation, binding unseen size variables; a failed
    dimension check says ``{reason} is ...`` when a reason is given."""
    if not isinstance(info, TensorStructInfo):
        return
    if str(array.dtype) != info.dtype:
        raise InputShapeError(f"{what} '{name}': dtype is {array.dtype}, expected {info.dtype}")
    if info.shape is None:
        if info.ndim != -1 and array.ndim != info.ndim:
            raise InputShapeError(f"{what} '{name}': has {array.ndim} dimensions, expected {info.ndim}")
        return
    if array.ndim != len(info.shape):
        raise InputShapeError(f"{what} '{name}': has {array.ndim} dimensions, expected {len(info.shape)}")
    for dim, (actual, expected) in enumerate(zip(array.shape, info.shape)):
        if isinstance(expected, SizeVar) and expected.name not in size_vars:
            size_vars[expected.name] = int(actual)
            continue
        value = int(evaluate(expected, size_vars))
        if value != actual:
            subject = reason or f"{what} '{name}': dimension {dim}"
            raise InputShapeError(f"{subject} is {actual}, expected {value} ({format_expr(expected)})")


# ----------------------------------------------------------------------------------------
# Tensor programs


def run_program(program: TensorProgram, arrays: list[np.ndarray], size_vars: Mapping[str, int]) -> np.ndarray:
    """Evaluate ``output[axes] = body`` over the whole output at once with numpy."""
    shape = tuple(int(evaluate(d, size_vars)) for d in program.output.shape)
    buffers = {}
    for buffer, array in zip(program.inputs, arrays):
        expected = tuple(int(evaluate(d, size_vars)) for d in buffer.shape)
        if tuple(array.shape) != expected:
            raise ValueError(f"{program.name}: buffer {buffer.name} has shape {array.shape}, expected {expected}")
        buffers[buffer.name] = array
    grids = np.indices(shape, dtype=np.int64) if shape else np.zeros((0,), dtype=np.int64)
    environment = dict(size_vars)
    for d, axis in enumerate(program.axes):
        environment[axis.name] = grids[d]
    result = _evaluate_scalar(program.body, buffers, environment, shape)
    return np.broadcast_to(np.asarray(result), shape).astype(program.output.dtype)


def divide(a: np.ndarray, b: np.ndarray) -> np.ndarray:
    """The IR's division: floats as numpy; integers truncate toward zero and a division by
    zero gives the dividend, as WGSL and the wasm backend compute it (numpy's ``divide``
    would give a float, its ``//`` would floor)."""
    a, b = np.asarray(a), np.asarray(b)
    if not (np.issubdtype(a.dtype, np.integer) and np.issubdtype(b.dtype, np.integer)):
        return np.divide(a, b)
    dtype = np.result_type(a, b)
    wide_a, wide_b = a.astype(np.int64), b.astype(np.int64)
    safe_b = np.where(wide_b == 0, 1, wide_b)
    quotient = np.abs(wide_a) // np.abs(safe_b) * np.sign(wide_a) * np.sign(safe_b)
    return np.where(wide_b == 0, wide_a, quotient).astype(dtype)


BINARY_FUNCTIONS: dict[BinaryOp, Callable[[np.ndarray, np.ndarray], np.ndarray]] = {
    BinaryOp.ADD: np.add, BinaryOp.SUBTRACT: np.subtract, BinaryOp.MULTIPLY: np.multiply,
    BinaryOp.DIVIDE: divide, BinaryOp.MAXIMUM: np.maximum, BinaryOp.MINIMUM: np.minimum, BinaryOp.POWER: np.power,
    BinaryOp.BITWISE_AND: np.bitwise_and, BinaryOp.BITWISE_OR: np.bitwise_or, BinaryOp.BITWISE_XOR: np.bitwise_xor,
    BinaryOp.SHIFT_RIGHT: lambda a, b: np.right_shift(a, np.asarray(b).astype(np.asarray(a).dtype)),
}
COMPARE_FUNCTIONS: dict[CompareOp, Callable[[np.ndarray, np.ndarray], np.ndarray]] = {
    CompareOp.LT: np.less, CompareOp.LE: np.less_equal, CompareOp.GT: np.greater, CompareOp.GE: np.greater_equal,
    CompareOp.EQ: np.equal, CompareOp.NE: np.not_equal,
}
# Each combiner over the leading axis of an array.
COMBINER_FUNCTIONS: dict[ReduceCombiner, Callable[..., np.ndarray]] = {
    ReduceCombiner.SUM: np.sum, ReduceCombiner.MAX: np.max, ReduceCombiner.MIN: np.min, ReduceCombiner.PROD: np.prod,
}


def _evaluate_scalar(expr: ScalarExpr, buffers: dict, environment: dict, shape: tuple, guarded: bool = False) -> np.ndarray:
    """The value of ``expr`` at every point of the index grids in ``environment``.

    ``guarded`` is set inside the branches of a :class:`Select`, which are evaluated
    everywhere here but only where chosen on the GPU: out-of-bounds loads there read 0
    instead of failing (the values are discarded).
    """
    return _ScalarEvaluator(buffers, environment, guarded).visit(expr)


class _ScalarEvaluator(ScalarFunctor):
    """The numpy value of each kind over the index grids of ``environment`` (index and size
    variables by name); ``guarded`` as in :func:`_evaluate_scalar`."""

    def __init__(self, buffers: dict, environment: dict, guarded: bool) -> None:
        self.buffers, self.environment, self.guarded = buffers, environment, guarded

    def visit_load(self, expr: Load) -> np.ndarray:
        index = tuple(np.asarray(evaluate(i, self.environment)) for i in expr.indices)
        return _load(self.buffers[expr.buffer.name], expr.buffer.name, index, self.guarded)

    def visit_gather(self, expr: Gather) -> np.ndarray:
        array = self.buffers[expr.buffer.name]
        index = []
        for position, extent in zip(expr.indices, array.shape):
            if isinstance(position, ScalarExpr):  # computed at run time: clamped into the extent
                value = np.asarray(self.visit(position)).astype(np.int64)
                index.append(np.clip(value, 0, max(extent - 1, 0)))
            else:
                index.append(np.asarray(evaluate(position, self.environment)))
        return _load(array, expr.buffer.name, tuple(index), self.guarded)

    def visit_float_imm(self, expr: FloatImm) -> np.ndarray:
        return np.asarray(expr.value, dtype=expr.dtype)

    def visit_checked_index(self, expr: CheckedIndex) -> np.ndarray:
        """The index wrapped when negative and clamped into the extent; out of range where it
        is evaluated for real (not in a select's branch, which the GPU may not take) it is the
        run's error (:class:`CheckFailed`)."""
        value = np.asarray(self.visit(expr.index)).astype(np.int64)
        extent = np.asarray(evaluate(expr.extent, self.environment)).astype(np.int64)
        wrapped = np.where(value < 0, value + extent, value)
        bad = (wrapped < 0) | (wrapped >= extent)
        if not self.guarded and np.any(bad):
            value, extent = np.broadcast_arrays(value, extent)
            raise CheckFailed(int(evaluate(expr.site, self.environment)),
                              (int(value[bad].reshape(-1)[0]), int(extent[bad].reshape(-1)[0])))
        return np.clip(wrapped, 0, np.maximum(extent - 1, 0)).astype(np.int32)

    def visit_index_value(self, expr: IndexValue) -> np.ndarray:
        return np.asarray(evaluate(expr.value, self.environment)).astype(np.int32)

    def visit_cast(self, expr: Cast) -> np.ndarray:
        return np.asarray(self.visit(expr.a)).astype(np.dtype(expr.dtype))

    def visit_compare(self, expr: Compare) -> np.ndarray:
        return COMPARE_FUNCTIONS[expr.op](self.visit(expr.a), self.visit(expr.b))

    def visit_select(self, expr: Select) -> np.ndarray:
        condition = np.asarray(self.visit(expr.condition), dtype=bool)
        branches = _ScalarEvaluator(self.buffers, self.environment, guarded=True)
        with np.errstate(all="ignore"):  # the branch not taken may divide by zero
            a, b = branches.visit(expr.a), branches.visit(expr.b)
        return np.where(condition, a, b)

    def visit_binary(self, expr: Binary) -> np.ndarray:
        return BINARY_FUNCTIONS[expr.op](self.visit(expr.a), self.visit(expr.b))

    def visit_unary(self, expr: Unary) -> np.ndarray:
        return UNARY_FUNCTIONS[expr.op](self.visit(expr.a))

    def visit_reduce(self, expr: Reduce) -> np.ndarray:
        body = self.reduction_terms(expr)
        if body.shape[0] == 0:
            return np.full(body.shape[1:], _reduce_identity(expr.combiner, scalar_dtype(expr.body)))
        return COMBINER_FUNCTIONS[expr.combiner](body, axis=0)

    def visit_checked_integer(self, expr: CheckedInteger) -> np.ndarray:
        """The operation's exact result (in int64; a reduction's partial results in the
        order a kernel takes them); where one does not fit int32 and the value is needed
        for real (not in a select's branch), the run's error (:class:`CheckFailed`)."""
        operation = expr.value
        if operation.scalar_kind == "reduce":
            terms = self.reduction_terms(operation).astype(np.int64)
            running = (np.cumsum if operation.combiner is ReduceCombiner.SUM else np.cumprod)(terms, axis=0)
            exact = running[-1] if len(terms) else np.full(terms.shape[1:], 0 if operation.combiner is ReduceCombiner.SUM else 1)
        else:
            running = exact = _EXACT_OPERATIONS[checked_operation(operation)](self, operation)
        if not self.guarded and np.any((running < -2**31) | (running > 2**31 - 1)):
            raise CheckFailed(int(evaluate(expr.site, self.environment)), ())
        return np.asarray(exact).astype(expr.dtype)

    def visit_checked_divisor(self, expr: CheckedDivisor) -> np.ndarray:
        """The divisor, a 0 divides as 1; a 0 needed for real is the run's error."""
        divisor = np.asarray(self.visit(expr.divisor))
        if not self.guarded and np.any(divisor == 0):
            raise CheckFailed(int(evaluate(expr.site, self.environment)), ())
        return np.where(divisor == 0, 1, divisor).astype(divisor.dtype)

    def reduction_terms(self, expr: Reduce) -> np.ndarray:
        """The body of a reduction at every step: the steps along a new leading axis."""
        # Add a leading dimension for the reduction axis: every array in the environment
        # gains a leading 1 and the axis variable spans the new dimension.
        environment = self.environment
        extent = int(evaluate(expr.extent, environment))
        inner = {
            name: (value[np.newaxis] if isinstance(value, np.ndarray) else value)
            for name, value in environment.items()
        }
        depth = max((v.ndim for v in environment.values() if isinstance(v, np.ndarray)), default=0)
        inner[expr.axis.name] = np.arange(extent, dtype=np.int64).reshape((extent,) + (1,) * depth)
        body = _ScalarEvaluator(self.buffers, inner, self.guarded).visit(expr.body)
        return np.broadcast_to(body, (extent,) + np.broadcast_shapes(*(np.shape(v) for v in inner.values()))[1:])


def _exact_binary(evaluator: _ScalarEvaluator, expr: Binary) -> np.ndarray:
    a, b = (np.asarray(evaluator.visit(operand)).astype(np.int64) for operand in (expr.a, expr.b))
    return BINARY_FUNCTIONS[expr.op](a, b)


def _exact_cast(evaluator: _ScalarEvaluator, expr: Cast) -> np.ndarray:
    """A cast to int64, exactly: a float truncated toward zero (NaN and infinities as a value
    that fits no int32)."""
    value = np.asarray(evaluator.visit(expr.a))
    if np.issubdtype(value.dtype, np.floating):
        finite = np.isfinite(value)
        clipped = np.clip(np.trunc(np.where(finite, value, 0)), -2.0**62, 2.0**62).astype(np.int64)
        return np.where(finite, clipped, np.int64(2**62))
    return value.astype(np.int64)


# The exact (int64) result of each operation a CheckedInteger checks (but reductions).
_EXACT_OPERATIONS: dict[str, Callable[[_ScalarEvaluator, ScalarExpr], np.ndarray]] = {
    "add": _exact_binary, "subtract": _exact_binary, "multiply": _exact_binary, "divide": _exact_binary,
    "negative": lambda evaluator, expr: -np.asarray(evaluator.visit(expr.a)).astype(np.int64),
    "cast": _exact_cast,
}


def _load(array: np.ndarray, name: str, index: tuple[np.ndarray, ...], guarded: bool) -> np.ndarray:
    """``array[index]``; out-of-bounds indices fail, or read 0 when ``guarded``."""
    if not index:
        return array[()]
    index = tuple(np.broadcast_arrays(*index))
    valid = np.ones(index[0].shape, dtype=bool)
    for dim, (positions, extent) in enumerate(zip(index, array.shape)):
        inside = (positions >= 0) & (positions < extent)
        if not guarded and not inside.all():
            bad = int(positions[~inside].reshape(-1)[0])
            raise IndexError(f"load of {name}: index {bad} is out of bounds for dimension {dim} of extent {extent}")
        valid &= inside
    if guarded:
        if array.size == 0:
            return np.zeros(valid.shape, dtype=array.dtype)
        clipped = tuple(np.clip(positions, 0, extent - 1) for positions, extent in zip(index, array.shape))
        return np.where(valid, array[clipped], np.zeros((), dtype=array.dtype))
    return array[index]


def _reduce_identity(combiner: ReduceCombiner, dtype: str):
    """What a reduction over an empty range gives (sum 0, prod 1, max lowest, min highest)."""
    if combiner is ReduceCombiner.SUM:
        return np.zeros((), dtype=dtype)
    if combiner is ReduceCombiner.PROD:
        return np.ones((), dtype=dtype)
    lowest = combiner is ReduceCombiner.MAX
    if dtype_info(dtype).is_float:
        return np.asarray(-np.inf if lowest else np.inf, dtype=dtype)
    info = np.iinfo(np.dtype(dtype))
    return np.asarray(info.min if lowest else info.max, dtype=dtype)


# ----------------------------------------------------------------------------------------
# Running a host function with numpy (the semantics the compiled host + GPU must match)


def fill_message(template: str, value: int, expected: int) -> str:
    return template.replace("{value}", str(value)).replace("{expected}", str(expected))


def run_shape_checks(function: HostFunction, shapes: list[tuple[int, ...]]) -> dict[str, int]:
    """Bind the size variables from input shapes, raising the check's message on failure."""
    values: dict[str, int] = {}
    for check in function.checks:
        shape = shapes[check.input]
        if check.kind == "ndim":
            if len(shape) != check.expected:
                raise InputShapeError(fill_message(check.message, len(shape), int(check.expected)))  # type: ignore[arg-type]
        elif check.kind == "bind":
            values[check.variable] = shape[check.dim]  # type: ignore[index]
        elif check.kind == "bound":
            bound = function.bound_of(check.variable)  # type: ignore[arg-type]
            if bound is not None and values[check.variable] > bound:  # type: ignore[index]
                raise InputShapeError(fill_message(check.message, values[check.variable], bound))  # type: ignore[index]
        elif check.kind == "equal":
            expected = int(evaluate(as_expr(check.expected), values))
            if shape[check.dim] != expected:
                raise InputShapeError(fill_message(check.message, shape[check.dim], expected))
    return values


class _HostRun(HostStepFunctor):
    """One run of a host function on numpy byte buffers: each step kind's effect."""

    def __init__(self, function: HostFunction, programs: Mapping) -> None:
        self.function = function
        self.programs = programs
        self.values: dict[str, int] = {}
        self.storages = [np.zeros(0, dtype=np.uint8) for _ in function.storages]
        self.output_shapes: dict[int, tuple[int, ...]] = {}
        # each sequence's table: its elements' shapes (None: an optional sequence that is none)
        self.tables: list[list[tuple[int, ...]] | None] = [[] for _ in function.sequences]

    def value(self, expr: PrimExpr) -> int:
        # Variables not known yet (bound by a later stage) count as 0, as in the host module.
        names = {v.name for v in free_vars(expr)}
        return int(evaluate(expr, {**{n: 0 for n in names}, **self.values}))

    def grow_storages(self) -> None:
        for index, storage in enumerate(self.function.storages):
            needed = self.value(storage.size)
            if needed > self.storages[index].size:
                grown = np.zeros(needed, dtype=np.uint8)
                grown[: self.storages[index].size] = self.storages[index]
                self.storages[index] = grown

    def view(self, storage: int, dtype: str, shape: tuple[int, ...]) -> np.ndarray:
        count = int(np.prod(shape, dtype=np.int64))
        needed = count * dtype_info(dtype).bytes
        if needed > self.storages[storage].size:
            # a sequence's arena, written past its end before the host appends the element
            # (the runtimes grow storages before a stage's dispatches run)
            self.storages[storage] = np.concatenate(
                [self.storages[storage], np.zeros(needed - self.storages[storage].size, np.uint8)])
        return self.storages[storage][:needed].view(dtype).reshape(shape)

    def run_steps(self, steps) -> None:
        self.visit_steps(steps)

    def visit_dispatch(self, step: HostDispatch) -> None:
        self.dispatch(step)

    def visit_bind(self, step: HostBind) -> None:
        self.values[step.variable] = self.value(step.value)
        self.grow_storages()

    def visit_check(self, step: HostCheck) -> None:
        self.check(step)

    def visit_if(self, step: HostIf) -> None:
        self.run_steps(step.then_steps if self.value(step.condition) != 0 else step.else_steps)

    def visit_loop(self, step: HostLoop) -> None:
        for iteration in range(self.value(step.count)):
            self.values[step.variable] = iteration
            self.run_steps(step.steps)

    def visit_read(self, step: HostRead) -> None:
        raw = self.storages[step.storage][step.byte_offset: step.byte_offset + 4]
        self.values[step.variable] = int(raw.view(np.int32)[0])
        self.grow_storages()

    def visit_output_shape(self, step: HostOutputShape) -> None:
        self.output_shapes[step.output] = tuple(self.value(d) for d in step.shape)

    # The table steps (``docs/bundle-format.md`` "Sequences"); a sequence input's table and
    # values were written by ``run_host_function``.

    def visit_sequence_presence(self, step: HostSequencePresence) -> None:
        self.values[step.variable] = int(self.tables[step.sequence] is not None)

    def visit_sequence_clear(self, step: HostSequenceClear) -> None:
        self.tables[step.sequence] = []
        self.values[self.function.sequences[step.sequence].size_var] = 0

    def visit_sequence_append(self, step: HostSequenceAppend) -> None:
        sequence, table = self.function.sequences[step.sequence], self.tables[step.sequence]
        if len(table or ()) >= SEQUENCE_CAPACITY:
            raise InputShapeError(fill_message(step.message, len(table or ()) + 1, SEQUENCE_CAPACITY))
        shape = tuple(self.value(d) for d in step.shape)
        self.tables[step.sequence] = [*(table or ()), shape]
        self.values[sequence.size_var] += int(np.prod(shape, dtype=np.int64)) * sequence.element_bytes
        self.grow_storages()

    def visit_sequence_input(self, step: HostSequenceInput) -> None:
        sequence, table = self.function.sequences[step.sequence], self.tables[step.sequence]
        if table is not None and len(table) > SEQUENCE_CAPACITY:
            raise InputShapeError(fill_message(step.capacity_message, len(table), SEQUENCE_CAPACITY))
        for position, shape in enumerate(table or ()):
            if sequence.ndim >= 0 and len(shape) != sequence.ndim:
                raise InputShapeError(fill_message(step.ndim_message, position, sequence.ndim))
        self.values[sequence.size_var] = sum(int(np.prod(shape, dtype=np.int64)) for shape in table or ()) \
            * sequence.element_bytes

    def sequence_value(self, sequence: int) -> list[np.ndarray] | None:
        """A sequence's elements, from its arena and its table."""
        table, info = self.tables[sequence], self.function.sequences[sequence]
        if table is None:
            return None
        flat = self.view(info.storage, info.dtype, (self.values[info.size_var] // info.element_bytes,))
        starts = np.cumsum([0] + [int(np.prod(shape, dtype=np.int64)) for shape in table])
        return [flat[start:start + int(np.prod(shape, dtype=np.int64))].reshape(shape).copy()
                for start, shape in zip(starts, table)]

    def check(self, step: HostCheck) -> None:
        value = self.value(step.value)
        if step.kind == "equal":
            expected = self.value(step.expected)  # type: ignore[arg-type]
            failed = value != expected
        elif step.kind == "bound":
            bound = self.function.bound_of(step.variable)  # type: ignore[arg-type]
            expected = bound if bound is not None else -1
            failed = bound is not None and value > bound
        else:
            expected = 0
            failed = value < 0
        if failed:
            raise InputShapeError(fill_message(step.message, value, expected))

    def dispatch(self, step: HostDispatch) -> None:
        kernel = self.programs[step.program]
        kernel_vars = {name: self.value(value) for name, value in step.size_var_values}
        buffers = []
        for ref, buffer in zip(step.buffers, (*kernel.inputs, kernel.output)):
            if ref.kind == "weight":
                buffers.append(self.function.weights[ref.index].data)
            else:
                shape = tuple(int(evaluate(d, kernel_vars)) for d in buffer.shape)
                buffers.append(self.view(ref.index, buffer.dtype, shape))
        run_kernel_into(kernel, buffers[:-1], buffers[-1], kernel_vars)


def run_host_function(function: HostFunction, programs: Mapping, inputs: Mapping[str, np.ndarray]) -> list[np.ndarray]:
    for host_input in function.inputs:
        if host_input.name not in inputs:
            raise InputShapeError(f"missing input '{host_input.name}'")
        value = inputs[host_input.name]
        elements = (value or ()) if host_input.sequence is not None else (value,)
        for given in {np.asarray(element).dtype for element in elements}:
            if str(given) != host_input.dtype:
                raise InputShapeError(f"input '{host_input.name}': dtype is {given}, expected {host_input.dtype}")
    run = _HostRun(function, programs)
    arrays = []
    for host_input in function.inputs:
        given = inputs[host_input.name]
        if host_input.sequence is None:
            arrays.append(np.asarray(given))
            continue
        # a sequence input (a list of arrays, or None for an optional one): its table, and its
        # values one after another (in the model's dtype, as this interpreter keeps storages)
        run.tables[host_input.sequence] = None if given is None else [np.shape(e) for e in given]
        values = [np.asarray(e, dtype=host_input.dtype).reshape(-1) for e in given or ()]
        arrays.append(np.concatenate(values) if values else np.zeros(0, host_input.dtype))
    run.values = run_shape_checks(function, [() if i.sequence is not None else a.shape
                                             for i, a in zip(function.inputs, arrays)])
    for step in function.steps:  # the arenas' sizes, before the inputs are copied in
        if isinstance(step, HostSequenceInput):
            run.visit_sequence_input(step)
    run.grow_storages()
    cache_of_input = {cache.input: cache for cache in function.caches}
    cache_of_output = {cache.output: cache for cache in function.caches}
    for index, (host_input, array) in enumerate(zip(function.inputs, arrays)):
        if index in cache_of_input:  # a KV cache's past: its rows at the start of each block of capacity rows
            rows = _cache_rows(run, cache_of_input[index], host_input.dtype, array.shape)
            rows[...] = array.reshape(rows.shape)
            continue
        raw = np.ascontiguousarray(array).view(np.uint8).reshape(-1)
        run.storages[host_input.storage][: raw.size] = raw
    run.run_steps(function.steps)
    return [
        run.sequence_value(output.sequence) if output.sequence is not None
        else _cache_rows(run, cache_of_output[index], output.dtype, run.output_shapes[index]).reshape(
            run.output_shapes[index]).copy() if index in cache_of_output
        else run.view(output.storage, output.dtype, run.output_shapes[index]).copy()
        for index, output in enumerate(function.outputs)
    ]


def _cache_rows(run, cache, dtype: str, shape: tuple) -> np.ndarray:
    """The elements of a KV cache's tensor of ``shape`` in its storage (each block's first
    ``shape[axis]`` rows of ``capacity``), as a writable array ``[outer, rows * inner]``."""
    outer, rows, inner = (int(np.prod(shape[:cache.axis], dtype=np.int64)), shape[cache.axis],
                          int(np.prod(shape[cache.axis + 1:], dtype=np.int64)))
    blocks = run.view(cache.storage, dtype, (outer, cache.capacity * inner))
    return blocks[:, : rows * inner]
