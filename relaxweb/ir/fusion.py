"""Loop-level fusion: merge a producer tensor program into a consumer that reads its output.

Programs are compute definitions, so merging is inlining: every ``P[indices]`` the consumer
loads becomes the producer's body with the producer's axes replaced by ``indices``.  The
intermediate tensor disappears, and so does its kernel launch and its round trip through GPU
memory.  ``fuse_ops`` (graph level, ``relaxweb/passes/fuse_ops.py``) decides which pairs to
merge; this module only does the merge and keeps names apart:

- the producer's size variables keep their names where the consumer binds the same name to
  the same value, and are renamed where a name would clash;
- the producer's reduction axes and input buffers get names unused in the consumer.

The merged program's inputs are the consumer's (less the fused one), then the producer's.
"""

from __future__ import annotations

from dataclasses import dataclass

from .symbolic import Analyzer, IntImm, PrimExpr, SizeVar, as_int, format_expr, substitute
from .tir import (
    Buffer, Compare, CompareOp, Gather, IndexValue, Load, Reduce, ScalarExpr, Select, TensorProgram, index_var_names,
    loads_of, map_scalar, replace_buffers, scalar_children, substitute_scalar,
)


@dataclass(frozen=True)
class FusedProgram:
    """The merged program, its size-variable bindings at the call site, and where each of
    its inputs comes from: ``("consumer", i)`` or ``("producer", j)`` (argument positions)."""

    program: TensorProgram
    size_var_values: dict[str, PrimExpr]
    input_sources: tuple[tuple[str, int], ...]


def inline_producer(
    consumer: TensorProgram,
    consumer_values: dict[str, PrimExpr],
    buffer_name: str,
    producer: TensorProgram,
    producer_values: dict[str, PrimExpr],
) -> FusedProgram:
    """Replace every load of the consumer's input ``buffer_name`` by the producer's body.

    ``*_values`` bind each program's size variables at its call site (graph expressions).
    The consumer must read the buffer only through direct loads (not run-time indices).
    """
    if any(isinstance(load, Gather) for load in loads_of(consumer.body, buffer_name)):
        raise ValueError(f"{consumer.name} reads {buffer_name} at run-time indices; it cannot be inlined")
    taken = _names_in(consumer) - {buffer_name}  # the inlined buffer's name is free again
    fresh = _FreshNames(taken | _names_in(producer))

    renames: dict[str, PrimExpr] = {}
    values = dict(consumer_values)
    for var in producer.size_vars:
        value = producer_values[var.name]
        if var.name in consumer_values and format_expr(consumer_values[var.name]) == format_expr(value):
            continue
        if var.name in taken:
            new = fresh(var.name)
            renames[var.name] = SizeVar(new)
            values[new] = value
        else:
            values[var.name] = value

    # each step below rebuilds the producer's body only where it changes something: a long
    # chain fuses into bodies of hundreds of nodes, each merge's walks over them were most of
    # its build
    body = substitute_scalar(producer.body, renames) if renames else producer.body
    body = _rename_reduction_axes(body, taken, fresh)
    inputs, buffer_renames = [], {}
    for buffer in producer.inputs:
        name = fresh(buffer.name) if buffer.name in taken else buffer.name
        renamed = Buffer(name, tuple(substitute(d, renames) for d in buffer.shape), buffer.dtype) if renames or \
            name != buffer.name else buffer
        if renamed is not buffer:
            buffer_renames[buffer.name] = renamed
        inputs.append(renamed)
    body = replace_buffers(body, buffer_renames) if buffer_renames else body
    axis_names = [axis.name for axis in producer.axes]

    def inline(node: ScalarExpr) -> ScalarExpr | None:
        if isinstance(node, Load) and node.buffer.name == buffer_name:
            if all(isinstance(index, SizeVar) and index.name == axis for axis, index in zip(axis_names, node.indices)):
                return body  # read at the producer's own axes
            return substitute_scalar(body, dict(zip(axis_names, node.indices)))
        return None

    fused_body = map_scalar(consumer.body, inline)
    kept = [(b, ("consumer", i)) for i, b in enumerate(consumer.inputs) if b.name != buffer_name]
    added = [(b, ("producer", j)) for j, b in enumerate(inputs)]
    program = simplify_indices(TensorProgram(
        _fused_name(producer.name, consumer.name),
        tuple(b for b, _ in kept + added), consumer.output, consumer.axes, fused_body,
    ))
    used = {var.name for var in program.size_vars}
    return FusedProgram(
        program, {name: value for name, value in values.items() if name in used}, tuple(s for _, s in kept + added)
    )


def merge_inputs(program: TensorProgram, first: int, second: int) -> TensorProgram:
    """Read input ``second`` through input ``first`` (both are bound to the same tensor) and
    drop it."""
    keep, drop = program.inputs[first], program.inputs[second]
    body = replace_buffers(program.body, {drop.name: keep})
    inputs = tuple(b for i, b in enumerate(program.inputs) if i != second)
    return TensorProgram(program.name, inputs, program.output, program.axes, body, program.schedule)


def _names_in(program: TensorProgram) -> set[str]:
    names = index_var_names(program) | {var.name for var in program.size_vars}
    return names | {b.name for b in (*program.inputs, program.output)}


def _rename_reduction_axes(body: ScalarExpr, taken: set[str], fresh) -> ScalarExpr:
    """Give every reduction axis of ``body`` a name outside ``taken``."""
    def visit(node: ScalarExpr) -> ScalarExpr | None:
        if isinstance(node, Reduce) and node.axis.name in taken:
            new = SizeVar(fresh(node.axis.name))
            inner = substitute_scalar(node.body, {node.axis.name: new})
            return Reduce(node.combiner, new, node.extent, inner)
        return None

    return map_scalar(body, visit)


def simplify_indices(program: TensorProgram) -> TensorProgram:
    """Simplify every index expression knowing each index's range (``0 <= i < extent``).

    Inlining a reshape leaves ``(i * n + j) // n`` and the like, which are ``i`` only because
    ``j < n``; with the ranges they fold back, so a merged matmul still reads its factors at
    plain indices (and the pattern analysis still sees the rows and columns).
    """
    analyzer = Analyzer()
    extents = list(zip(program.axes, program.output.shape))

    def collect(node: ScalarExpr) -> None:
        if isinstance(node, Reduce):
            extents.append((node.axis, node.extent))
        for child in scalar_children(node):
            collect(child)

    collect(program.body)
    for axis, extent in extents:
        constant = as_int(extent)
        if constant is not None:
            analyzer = analyzer.with_range(axis.name, 0, max(constant - 1, 0))
        else:
            analyzer = analyzer.with_symbolic_upper(axis.name, extent - IntImm(1))

    def visit(node: ScalarExpr) -> ScalarExpr | None:
        if isinstance(node, (Load, Gather)):  # a node whose indices stay is kept (with what is above it)
            indices = tuple(i if isinstance(i, ScalarExpr) else analyzer.simplify(i) for i in node.indices)
            return None if indices == node.indices else type(node)(node.buffer, indices)
        if isinstance(node, IndexValue):
            value = analyzer.simplify(node.value)
            return None if value == node.value else IndexValue(value)
        if isinstance(node, Select):  # a branch a constant index decides (a concat's part)
            decided = _decided(node.condition, analyzer)
            if decided is not None:
                return node.a if decided else node.b
        return None

    return TensorProgram(program.name, program.inputs, program.output, program.axes,
                         map_scalar(program.body, visit), program.schedule)


def _fused_name(producer: str, consumer: str) -> str:
    """``fused_<first>_<last>``: the first producer and the last consumer of the chain."""
    first = producer[len("fused_"):].split("__")[0] if producer.startswith("fused_") else producer
    last = consumer[len("fused_"):].split("__")[-1] if consumer.startswith("fused_") else consumer
    return f"fused_{first}__{last}"


class _FreshNames:
    def __init__(self, taken: set[str]) -> None:
        self.taken = set(taken)

    def __call__(self, hint: str) -> str:
        base = hint.rstrip("_0123456789") or "v"
        counter = 1
        while f"{base}_{counter}" in self.taken:
            counter += 1
        name = f"{base}_{counter}"
        self.taken.add(name)
        return name


def _decided(condition: ScalarExpr, analyzer: Analyzer) -> bool | None:
    """The value of a comparison of index values the analyzer can prove, else None.

    Inlining a concat (or pad) at an index that is known where it is read leaves selects
    whose branch is decided; dropping the other branch also drops its loads, which may sit
    at constant indices outside the buffer (a shader compiler rejects those)."""
    if not (isinstance(condition, Compare) and isinstance(condition.a, IndexValue) and isinstance(condition.b, IndexValue)):
        return None
    a, b = condition.a.value, condition.b.value
    proofs = {  # (holds, fails); ``ne`` is not decided
        CompareOp.LT: (analyzer.prove_less(a, b), analyzer.prove_less_equal(b, a)),
        CompareOp.LE: (analyzer.prove_less_equal(a, b), analyzer.prove_less(b, a)),
        CompareOp.GT: (analyzer.prove_less(b, a), analyzer.prove_less_equal(a, b)),
        CompareOp.GE: (analyzer.prove_less_equal(b, a), analyzer.prove_less(a, b)),
        CompareOp.EQ: (analyzer.prove_equal(a, b), analyzer.prove_less(a, b) or analyzer.prove_less(b, a)),
    }
    if condition.op not in proofs:
        return None
    holds, fails = proofs[condition.op]
    return True if holds else (False if fails else None)
