"""The Relax-style IR: symbolic shapes, annotations, graph functions, tensor programs."""

from .builder import FunctionBuilder
from .dtype import DTYPES, GPU_DTYPES, DtypeInfo, DtypeKind, dtype_info
from .expr import *  # noqa: F401,F403
from .module import IRModule
from .struct_info import (
    FuncStructInfo, ObjectStructInfo, OptionalStructInfo, PrimStructInfo, SequenceStructInfo, ShapeStructInfo,
    StructInfo, TensorStructInfo, TupleStructInfo, struct_info_equal,
)
from .symbolic import (
    Analyzer, IntImm, PrimExpr, SizeVar, as_expr, evaluate, expr_max, expr_min, format_expr, free_vars,
    product, prove_equal, prove_less, prove_less_equal, simplify, upper_bound,
)
from .tir import Binary, Buffer, FloatImm, Load, Reduce, ScalarExpr, TensorProgram, Unary
