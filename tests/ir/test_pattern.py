"""Pattern analysis (relaxweb/ir/pattern.py): the pattern of each legalized op's programs
(what fuse_ops and schedule_programs decide by), and how a matmul-like program splits into
rows, columns, batch and reduction axes (a convolution is an implicit GEMM, a grouped one
is not).
"""

from __future__ import annotations

import pytest

from relaxweb.ir import FunctionBuilder, IRModule, SizeVar, TensorStructInfo
from relaxweb.ir.expr import CallTIR
from relaxweb.ir.pattern import Pattern, analyze_matmul, program_pattern
from relaxweb.ir.tir import TensorProgram
from relaxweb.ops import call_op
from relaxweb.passes import legalize_ops

n, m, k = SizeVar("n"), SizeVar("m"), SizeVar("k")


def tensor(*shape) -> TensorStructInfo:
    return TensorStructInfo(tuple(shape), "float32")


def one_op(params: dict[str, TensorStructInfo], make) -> IRModule:
    builder = FunctionBuilder("main")
    args = [builder.add_param(name, info) for name, info in params.items()]
    out = builder.emit(make(*args), "y", output=True)
    return IRModule({"main": builder.finish([out], ["y"])})


def programs_of(module: IRModule) -> list[TensorProgram]:
    return [module.programs[b.value.program] for b in module.main.bindings() if isinstance(b.value, CallTIR)]


PATTERN_CASES = {
    "add": (lambda x, y: call_op("add", x, y), {"x": tensor(n, 4), "y": tensor(n, 4)}, [Pattern.ELEMENTWISE]),
    "bias add": (lambda x, b: call_op("add", x, b), {"x": tensor(n, 4), "b": tensor(4)}, [Pattern.BROADCAST]),
    "transpose": (lambda x: call_op("transpose", x, axes=[1, 0]), {"x": tensor(n, 4)}, [Pattern.INJECTIVE]),
    "take": (lambda x, i: call_op("take", x, i, axis=0), {"x": tensor(n, 4), "i": TensorStructInfo((3,), "int32")},
             [Pattern.INJECTIVE]),
    "sum": (lambda x: call_op("sum", x, axes=[1], keepdims=False), {"x": tensor(n, 4)}, [Pattern.REDUCTION]),
    "softmax": (lambda x: call_op("softmax", x, axes=[1]), {"x": tensor(n, m)}, [Pattern.REDUCTION, Pattern.REDUCTION, Pattern.BROADCAST]),
    "matmul": (lambda a, b: call_op("matmul", a, b), {"a": tensor(n, k), "b": tensor(k, m)}, [Pattern.MATMUL]),
    # unique: two library kernels (count, values), then a copy into the result
    "unique": (lambda x: call_op("unique", x), {"x": tensor(n)}, [Pattern.OPAQUE, Pattern.OPAQUE, Pattern.BROADCAST]),
}



@pytest.mark.parametrize("case", list(PATTERN_CASES))
def test_pattern_of_legalized_ops(case: str) -> None:
    make, params, expected = PATTERN_CASES[case]
    legalized = legalize_ops(one_op(params, make))
    assert [program_pattern(p) for p in programs_of(legalized)] == expected



def test_matmul_split_into_rows_columns_and_batch() -> None:
    legalized = legalize_ops(one_op({"a": tensor(3, n, k), "b": tensor(k, m)}, lambda a, b: call_op("matmul", a, b)))
    (program,) = programs_of(legalized)
    info = analyze_matmul(program)
    # a batch axis only the first factor reads is just more rows: one (3 * n) x m product
    assert (info.rows, info.columns, info.batch) == ((0, 1), (2,), ())
    assert [a.name for a in info.reduce_axes] == ["k_"]
    assert info.reduction == program.body



def test_convolution_is_an_implicit_gemm_and_grouped_convolution_is_not() -> None:
    def conv(groups: int, weight_channels: int):
        def make(x, w):
            return call_op("conv", x, w, strides=[1, 1], dilations=[1, 1], padding=[1, 1, 1, 1], groups=groups)
        params = {"x": tensor(n, 4, 6, 6), "w": tensor(8, weight_channels, 3, 3)}
        return programs_of(legalize_ops(one_op(params, make)))[0]

    plain = analyze_matmul(conv(1, 4))
    # rows: the output channels (the weights' factor); columns: batch and the two spatial axes
    # (the output's last axis stays a column axis, so stores are coalesced); three reduction axes
    assert (plain.rows, plain.columns, plain.batch) == ((1,), (0, 2, 3), ())
    assert len(plain.reduce_axes) == 3
    assert program_pattern(conv(2, 2)) == Pattern.REDUCTION  # each output channel reads its own group
