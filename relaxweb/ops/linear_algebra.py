"""Matrix multiplication with numpy semantics (batched, broadcast batch dims), and einsum.

``matmul(A[..., M, K], B[..., K, N]) -> [..., M, N]``; the batch dims broadcast.  Operands
must have at least 2 dims (the frontend reshapes 1-D operands).  Legalizes to one tensor
program with a sum reduction over K.

Deduction: K must be equal on both sides (provably, or checked at run time where the analyzer
cannot decide: ``ops/common.require_equal``); the batch dims broadcast like elementwise ops.  With an operand of unknown shape the result's shape is unknown and its rank the larger
of the two (unknown if either rank is).
"""

from __future__ import annotations

import numpy as np

from ..ir.expr import Call
from ..ir.op_registry import DeductionError, register_op
from ..ir.struct_info import TensorStructInfo
from ..ir.symbolic import IntImm, SizeVar, as_int, format_expr
from ..ir.tir import Load, Reduce, ReduceCombiner
from .common import (
    DimOf, broadcast_indices, broadcast_shapes, expect_args, integer_arithmetic, make_program, needs_known_shapes, require_equal,
    require_tensor, same_dtype, unknown_rank_join,
)


def deduce_matmul(args, attrs) -> TensorStructInfo:
    expect_args("matmul", args, 2)
    a, b = (require_tensor(arg, "matmul", i) for i, arg in enumerate(args))
    for position, info in enumerate((a, b)):
        if 0 <= info.ndim < 2:
            raise DeductionError(f"matmul: operands need at least 2 dims, argument {position} is {info}")
    dtype = same_dtype("matmul", [a, b])
    if a.shape is None or b.shape is None:
        return TensorStructInfo(None, dtype, unknown_rank_join([a.ndim, b.ndim]))
    require_equal(DimOf(a.shape[-1], 0, a.ndim - 1), DimOf(b.shape[-2], 1, b.ndim - 2), (
        f"matmul: reduction dims differ: {format_expr(a.shape[-1])} (dim {a.ndim - 1} of the first operand) "
        f"vs {format_expr(b.shape[-2])} (dim {b.ndim - 2} of the second)"
    ))
    batch = broadcast_shapes("matmul", [a.shape[:-2], b.shape[:-2]], scope="the batch dims")
    return TensorStructInfo((*batch, a.shape[-2], b.shape[-1]), a.dtype)


def legalize_matmul(context, call: Call):
    info = call.struct_info
    reduction_axis = SizeVar("k_")

    def body(axes, buffers):
        a, b = buffers
        batch_axes = axes[:-2]
        row, column = axes[-2], axes[-1]
        a_index = (*broadcast_indices(a.shape[:-2], batch_axes), row, reduction_axis)
        b_index = (*broadcast_indices(b.shape[:-2], batch_axes), reduction_axis, column)
        product = Load(a, a_index) * Load(b, b_index)
        return Reduce(ReduceCombiner.SUM, reduction_axis, a.shape[-1], product)

    program = make_program("matmul", call.args, info.shape, info.dtype, body)
    return context.call_tir(program, call.args)


register_op(
    "matmul",
    deduce=deduce_matmul,
    legalize=needs_known_shapes(legalize_matmul),
    reference=lambda arrays, attrs: np.matmul(arrays[0], arrays[1]).astype(arrays[0].dtype),
    checks_data=integer_arithmetic,
)


# einsum ----------------------------------------------------------------------------------------
#
# ``einsum(x0, x1, ..., equation="ij,jk->ik")``: numpy's Einstein summation.  Every letter is
# one index; a letter that is missing from the output is summed over; a letter repeated in
# one operand takes its diagonal; ``...`` stands for the dims no letter names (broadcast
# between operands like elementwise ops).  Without ``->`` the output is the ellipsis dims,
# then the letters that appear once, sorted.  Legalizes to one tensor program: the product of
# one load per operand under nested sum reductions over the summed letters.


def parse_einsum(equation: str, ranks: list[int]) -> tuple[list[list[str]], list[str], int]:
    """Each operand's dims as letters (ellipsis dims as ``"...0"``, ``"...1"`` … counted from
    the left of the broadcast ellipsis), the output's, and the ellipsis rank.

    ``ranks`` are the operands' ranks (-1 when unknown: then the operand must not use ``...``).
    """
    text = equation.replace(" ", "")
    if "->" in text:
        inputs_text, output_text = text.split("->")
    else:
        inputs_text, output_text = text, None
    terms = inputs_text.split(",")
    if len(terms) != len(ranks):
        raise DeductionError(f"einsum: the equation {equation!r} names {len(terms)} operand(s), got {len(ranks)}")
    ellipsis_ranks = []
    for position, (term, rank) in enumerate(zip(terms, ranks)):
        letters = term.replace("...", "")
        if not letters.isalpha() and letters:
            raise DeductionError(f"einsum: operand {position} term {term!r} must be letters (and '...')")
        if "..." in term:
            if rank == -1:
                ellipsis_ranks.append(-1)
                continue
            extra = rank - len(letters)
            if extra < 0:
                raise DeductionError(f"einsum: operand {position} has {rank} dims, fewer than its term {term!r}")
            ellipsis_ranks.append(extra)
        else:
            if rank != -1 and rank != len(letters):
                raise DeductionError(f"einsum: operand {position} has {rank} dims, its term {term!r} has {len(letters)}")
            ellipsis_ranks.append(0)
    if -1 in ellipsis_ranks:
        raise _UnknownRank()
    ellipsis_rank = max(ellipsis_ranks, default=0)

    def expand(term: str, extra: int) -> list[str]:
        if "..." not in term:
            return list(term)
        before, after = term.split("...")
        return list(before) + [f"...{ellipsis_rank - extra + d}" for d in range(extra)] + list(after)

    operands = [expand(term, extra) for term, extra in zip(terms, ellipsis_ranks)]
    ellipsis = [f"...{d}" for d in range(ellipsis_rank)]
    if output_text is None:
        counts: dict[str, int] = {}
        for term in terms:
            for letter in term.replace("...", ""):
                counts[letter] = counts.get(letter, 0) + 1
        output = ellipsis + sorted(letter for letter, count in counts.items() if count == 1)
    else:
        letters = output_text.replace("...", "")
        if not letters.isalpha() and letters:
            raise DeductionError(f"einsum: output term {output_text!r} must be letters (and '...')")
        if len(set(letters)) != len(letters):
            raise DeductionError(f"einsum: output term {output_text!r} repeats a letter")
        known = {letter for term in terms for letter in term.replace("...", "")}
        for letter in letters:
            if letter not in known:
                raise DeductionError(f"einsum: output letter {letter!r} appears in no operand")
        if "..." in output_text:
            before, after = output_text.split("...")
            output = list(before) + ellipsis + list(after)
        else:
            output = list(letters)
    return operands, output, ellipsis_rank


class _UnknownRank(Exception):
    pass


def _einsum_extents(args, equation: str):
    """letter -> its extent (the ellipsis dims broadcast), plus the parse."""
    infos = [require_tensor(arg, "einsum", i) for i, arg in enumerate(args)]
    operands, output, ellipsis_rank = parse_einsum(equation, [info.ndim for info in infos])
    first_seen: dict[str, DimOf] = {}  # letter -> where it first appears
    ellipsis_shapes = []
    ellipsis_origins: list[tuple[int | None, int]] = []  # (operand, its first ellipsis dim)
    for position, (letters, info) in enumerate(zip(operands, infos)):
        own_ellipsis = []
        for dim, letter in enumerate(letters):
            extent = info.shape[dim]
            if letter.startswith("..."):
                if not own_ellipsis:
                    ellipsis_origins.append((position, dim))
                own_ellipsis.append(extent)
                continue
            if letter in first_seen:
                require_equal(first_seen[letter], DimOf(extent, position, dim), (
                    f"einsum: letter {letter!r} has extent {format_expr(first_seen[letter].extent)} and "
                    f"{format_expr(extent)} (dim {dim} of operand {position})"
                ))
            else:
                first_seen[letter] = DimOf(extent, position, dim)
        if not own_ellipsis:
            ellipsis_origins.append((position, 0))
        ellipsis_shapes.append(tuple(own_ellipsis))
    extents = {letter: seen.extent for letter, seen in first_seen.items()}
    if ellipsis_rank:
        broadcast = broadcast_shapes("einsum", ellipsis_shapes, scope="the ellipsis dims", origins=ellipsis_origins)
        for d, extent in enumerate(broadcast):
            extents[f"...{d}"] = extent
    return operands, output, extents


def deduce_einsum(args, attrs) -> TensorStructInfo:
    if not args:
        raise DeductionError("einsum: needs at least one operand")
    infos = [require_tensor(arg, "einsum", i) for i, arg in enumerate(args)]
    dtype = same_dtype("einsum", infos)
    equation = str(attrs["equation"])
    try:
        if any(info.shape is None for info in infos):
            _, output, _ = parse_einsum(equation, [info.ndim for info in infos])
            return TensorStructInfo(None, dtype, len(output))
        _, output, extents = _einsum_extents(args, equation)
    except _UnknownRank:
        return TensorStructInfo(None, dtype, -1)
    return TensorStructInfo(tuple(extents[letter] for letter in output), dtype)


def legalize_einsum(context, call: Call):
    info = call.struct_info
    operands, output, extents = _einsum_extents(call.args, str(call.attrs["equation"]))
    summed = [letter for letter in dict.fromkeys(l for letters in operands for l in letters) if letter not in output]

    def body(axes, buffers):
        variables = {letter: axes[d] for d, letter in enumerate(output)}
        for position, letter in enumerate(summed):
            variables[letter] = SizeVar(f"r{position}_")
        expr = None
        for letters, buffer in zip(operands, buffers):
            index = tuple(
                IntImm(0) if letter.startswith("...") and as_int(dim) == 1 and as_int(extents[letter]) != 1
                else variables[letter]
                for letter, dim in zip(letters, buffer.shape)
            )
            load = Load(buffer, index)
            expr = load if expr is None else expr * load
        for letter in reversed(summed):
            expr = Reduce(ReduceCombiner.SUM, variables[letter], extents[letter], expr)
        return expr

    program = make_program("einsum", call.args, info.shape, info.dtype, body)
    return context.call_tir(program, call.args)


def einsum_reference(arrays, attrs):
    equation = str(attrs["equation"]).replace(" ", "")
    # dtypes numpy cannot compute in (bfloat16) are computed in float32
    native = [a if a.dtype.kind in "fiub" and a.dtype.isnative else a.astype(np.float32) for a in arrays]
    result = np.einsum(equation, *native)
    return np.array(result, dtype=arrays[0].dtype, order="C")


register_op("einsum", deduce=deduce_einsum, legalize=needs_known_shapes(legalize_einsum), reference=einsum_reference)
