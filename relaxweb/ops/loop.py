"""The kernels a planned loop writes its storages with (``passes/plan_memory.py``).

A loop (``relaxweb/ir/expr.py``, ``Loop``) threads carried values through its iterations
and stacks others; planned, each carried value lives in a storage of its own and each
stacked value in the rows of one: after its body, an iteration copies each next carried
value into its storage (:func:`carried_copy`, an ordinary tensor program) and writes each
stacked value into its row (:func:`stacked_row_writer`, the in-place library kernel of
``relaxweb/library/loop.py``: a tensor program computes all of its output).
"""

from __future__ import annotations

from ..ir.library_kernel import LibraryKernel
from ..ir.struct_info import TensorStructInfo
from ..ir.symbolic import SizeVar
from ..ir.tir import Buffer, Load, TensorProgram
from ..library import write_row_kernel
from .common import axis_vars


def carried_copy(info: TensorStructInfo) -> TensorProgram:
    """``out = A``: a carried value copied into the storage the loop keeps it in."""
    source = Buffer("A", info.shape, info.dtype)
    axes = axis_vars(len(info.shape))
    return TensorProgram("loop_carry", (source,), Buffer("out", info.shape, info.dtype), axes, Load(source, axes))


def stacked_row_writer(stacked: TensorStructInfo, iteration: SizeVar) -> LibraryKernel:
    """``out[iteration] = value`` into a stacked value's storage ``[count, *row]``."""
    return write_row_kernel("loop_stack_row", stacked.shape[0], tuple(stacked.shape[1:]), stacked.dtype, iteration.name)
