"""What one call of a tensor program costs: scalar operations and bytes moved, as expressions.

A profile (``relaxweb run DIR --profile``) divides these by a kernel's measured time to give
GFLOP/s and GB/s.  Both are symbolic in the program's size variables, the fields of its
params block, so one expression serves every call site and every shape; the bundle writer
ships them in the manifest as small JSON trees (:func:`expression_tree`) that the runtimes
evaluate with the values the host module writes into each call site's params block.

- **FLOPs** = output elements x scalar operations per element.  An operation is a binary
  or unary op or a comparison of values (constants, loads, casts and index values cost
  nothing, and so does a comparison of two index values: a padded window's bounds checks are
  index arithmetic, like the loads' addresses); a reduction costs its extent x (its body's
  operations + 1, the combine), so a matmul ``sum(A[i, k] * B[k, j] for k in range(K))`` is
  ``2 * M * N * K``, and a reduction whose body is a reduction of the same kind counts its
  combines once (a convolution's sum over channels and its window's rows and columns is one
  sum of ``C * 3 * 3`` products: 2 operations each).  A repeated subexpression counts once
  per scope, as the WGSL emitter computes it once (``let``); a ``select`` counts its
  condition and the dearer of its two branches.
  A matmul-like program (``pattern.analyze_matmul``: a convolution, a projection with a
  fused layer norm or GELU before it, a bias or activation after it) counts what a kernel
  that evaluates each factor's element once does, as the backends' packed kernels do: 2
  operations a product, each factor's own operations once per element of it (a fused
  prologue once per input element, not once per product), and the epilogue once per output.
- **Bytes** = the bytes of every input buffer and of the output buffer in their device dtype:
  a lower bound on the memory traffic (a kernel that reads an element twice, or a tile
  from several workgroups, moves more).
"""

from __future__ import annotations

from dataclasses import dataclass

from .dtype import dtype_info
from .pattern import MatmulInfo, analyze_matmul
from .symbolic import (
    Add, FloorDiv, FloorMod, IntImm, Max, Min, Mul, PrimExpr, SizeVar, Sub, expr_max, product, simplify,
)
from .tir import Binary, Compare, IndexValue, Reduce, ScalarExpr, Select, TensorProgram, Unary, scalar_children

#: The operators of a cost tree and the symbolic node each stands for.
TREE_OPERATORS = {"add": Add, "sub": Sub, "mul": Mul, "floordiv": FloorDiv, "mod": FloorMod, "min": Min, "max": Max}
#: The limits both runtimes' manifest validators enforce on a cost tree.
MAX_TREE_DEPTH = 32
MAX_TREE_NODES = 512


@dataclass(frozen=True)
class KernelCost:
    """One call's scalar operations and bytes moved (a lower bound), in the program's size variables."""

    flops: PrimExpr
    bytes: PrimExpr


def program_cost(program: TensorProgram) -> KernelCost:
    """The cost of one call of ``program`` (see the module docstring)."""
    info = analyze_matmul(program)
    if info is None:
        flops = simplify(product(program.output.shape) * _operations(program.body, set()))
    else:
        flops = _matmul_operations(program, info)
    moved = sum((_buffer_bytes(b) for b in (*program.inputs, program.output)), start=IntImm(0))
    return KernelCost(flops, simplify(moved))


def _matmul_operations(program: TensorProgram, info: MatmulInfo) -> PrimExpr:
    """A matmul-like program's operations with each factor evaluated once per element: 2
    per product, the factors' own per element of each, the epilogue per output element."""
    shape = program.output.shape
    rows, columns, batch = (product(shape[p] for p in positions) for positions in (info.rows, info.columns, info.batch))
    depth = product(info.reduce_extents)
    epilogue = _operations(program.body, {info.reduction})  # the sums given
    factors = rows * _operations(info.a, set()) + columns * _operations(info.b, set())
    return simplify(batch * (rows * columns * (epilogue + 2 * depth) + depth * factors))


def _buffer_bytes(buffer) -> PrimExpr:
    return product(buffer.shape) * dtype_info(buffer.dtype).device_bytes


def _operations(expr: ScalarExpr, seen: set) -> PrimExpr:
    """Scalar operations to compute ``expr`` once, not counting subexpressions in ``seen``
    (computed already in this scope), which it extends."""
    if expr in seen:
        return IntImm(0)
    seen.add(expr)
    if isinstance(expr, Reduce):
        # the body is a scope of its own, run once per step of the reduction
        return expr.extent * (_operations(expr.body, set()) + _combine(expr))
    if isinstance(expr, Select):
        condition = _operations(expr.condition, seen)
        # a branch's subexpressions are shared only within that branch
        return condition + expr_max(_operations(expr.a, set(seen)), _operations(expr.b, set(seen)))
    return sum((_operations(child, seen) for child in scalar_children(expr)), start=IntImm(_own_operations(expr)))


def _combine(reduction: Reduce) -> int:
    """A step's combine: 1, or 0 where the body is a reduction of the same kind (nested
    reductions of one combiner are one reduction over all their axes)."""
    inner = reduction.body
    return 0 if isinstance(inner, Reduce) and inner.combiner == reduction.combiner else 1


def _own_operations(expr: ScalarExpr) -> int:
    """1 for a binary or unary op or a comparison of values; 0 for the rest (constants,
    loads, casts, index values) and for a comparison of two index values (index arithmetic)."""
    if isinstance(expr, Compare):
        return 0 if isinstance(expr.a, IndexValue) and isinstance(expr.b, IndexValue) else 1
    return 1 if isinstance(expr, (Binary, Unary)) else 0


def expression_tree(expr: PrimExpr) -> int | str | list:
    """``expr`` as the manifest's cost tree: an int, a size variable's name, or
    ``[operator, a, b]`` with an operator of :data:`TREE_OPERATORS`."""
    if isinstance(expr, IntImm):
        return expr.value
    if isinstance(expr, SizeVar):
        return expr.name
    operator = next(name for name, kind in TREE_OPERATORS.items() if isinstance(expr, kind))
    return [operator, expression_tree(expr.a), expression_tree(expr.b)]  # type: ignore[attr-defined]


def tree_depth(tree: int | str | list) -> int:
    """Levels of a cost tree (a leaf is 1)."""
    return 1 + max(tree_depth(tree[1]), tree_depth(tree[2])) if isinstance(tree, list) else 1


def tree_size(tree: int | str | list) -> int:
    """Nodes of a cost tree."""
    return 1 + tree_size(tree[1]) + tree_size(tree[2]) if isinstance(tree, list) else 1
