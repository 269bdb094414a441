"""Annotations by kind (relaxweb/ir/struct_info.py): the symbolic expressions each kind holds,
in order, and the printer's text of every kind (read back by the parser)."""

from __future__ import annotations

import pytest

from relaxweb.ir import struct_info as annotations
from relaxweb.ir.printer import _STRUCT_INFO_TEXT, format_struct_info
from relaxweb.ir.struct_info import (
    FuncStructInfo, ObjectStructInfo, OptionalStructInfo, PrimStructInfo, SequenceStructInfo, ShapeStructInfo,
    StructInfo, TensorStructInfo, TupleStructInfo, is_less_specific, join, struct_info_equal,
)
from relaxweb.ir.symbolic import SizeVar, free_vars
from relaxweb.ir.well_formed import annotation_vars

n, m, k, s = SizeVar("n"), SizeVar("m"), SizeVar("k"), SizeVar("s")
TENSOR = TensorStructInfo((n, m * 2), "float32")
EVERY_KIND = [
    TENSOR, TensorStructInfo(None, "int64", 2), ShapeStructInfo((k,)), ShapeStructInfo(None, 3),
    PrimStructInfo("int64", s), PrimStructInfo(), TupleStructInfo((TENSOR, PrimStructInfo("int64", k))),
    SequenceStructInfo(TENSOR, s), OptionalStructInfo(SequenceStructInfo(TensorStructInfo(None, "float32"))),
    FuncStructInfo((TENSOR,), ShapeStructInfo((k,))), ObjectStructInfo(),
]


def test_the_printer_has_every_kind() -> None:
    kinds = {cls for cls in vars(annotations).values()
             if isinstance(cls, type) and issubclass(cls, StructInfo) and cls is not StructInfo}
    assert set(_STRUCT_INFO_TEXT) == kinds == {type(info) for info in EVERY_KIND}
    assert format_struct_info(SequenceStructInfo(TENSOR, s)) == 'Sequence(Tensor((n, m * 2), "float32"), length=s)'
    assert format_struct_info(FuncStructInfo((TENSOR,), ObjectStructInfo())) == \
        'Func((Tensor((n, m * 2), "float32"),), Object)'


@pytest.mark.parametrize(("info", "expressions"), [
    (TENSOR, [n, m * 2]), (TensorStructInfo(None, "int64", 2), []), (ShapeStructInfo((k,)), [k]),
    (PrimStructInfo("int64", s), [s]), (PrimStructInfo(), []),
    (TupleStructInfo((TENSOR, PrimStructInfo("int64", k))), [n, m * 2, k]),
    (SequenceStructInfo(TENSOR, s), [n, m * 2, s]), (OptionalStructInfo(SequenceStructInfo(TENSOR)), [n, m * 2]),
    (FuncStructInfo((TENSOR,), ShapeStructInfo((k,))), [n, m * 2, k]), (ObjectStructInfo(), []),
], ids=lambda value: type(value).__name__ if isinstance(value, StructInfo) else "")
def test_symbolic_exprs_in_order(info: StructInfo, expressions: list) -> None:
    assert list(info.symbolic_exprs()) == expressions
    assert annotation_vars(info) == {var.name for expr in expressions for var in free_vars(expr)}


@pytest.mark.parametrize("info", EVERY_KIND, ids=lambda info: type(info).__name__)
def test_every_kind_is_equal_to_itself_and_joins_to_itself(info: StructInfo) -> None:
    assert struct_info_equal(info, info) and is_less_specific(info, info)
    assert struct_info_equal(join(info, info), info)
    assert is_less_specific(ObjectStructInfo(), info)
    assert struct_info_equal(join(info, ObjectStructInfo()), ObjectStructInfo())
