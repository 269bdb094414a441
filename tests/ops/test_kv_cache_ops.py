"""``ragged_concat`` (relaxweb/ops/kv_cache.py): onnxruntime's GroupQueryAttention cache update,
each batch entry's new rows right after its own past length.  Its deduction and errors, its
reference against onnxruntime's rule written out, and its one program legalized: in the
interpreter, on wgpu and in kernels.wasm.  The cache it becomes (``kv_cache_write`` with the
lengths) is tested in tests/passes/test_place_kv_caches.py and tests/cpu/test_cpu_library_kernels.py."""

from __future__ import annotations

import numpy as np
import pytest

from relaxweb.ir import FunctionBuilder, IRModule, SizeVar, TensorStructInfo, Var
from relaxweb.ir.interpreter import run_module
from relaxweb.ops import DeductionError, call_op
from relaxweb.passes import legalize_ops
from tests.cpu.test_cpu_kernels import run_on_wasm
from tests.gpu_kernels import run_kernel_on_gpu
from tests.helpers import rand

b, p, s = SizeVar("b"), SizeVar("p"), SizeVar("s")


def tensor(name: str, *shape, dtype: str = "float32") -> Var:
    return Var(name, TensorStructInfo(tuple(shape), dtype))


def test_ragged_concat_deduction_and_errors() -> None:
    call = call_op("ragged_concat", tensor("past", b, 2, p, 8), tensor("new", b, 2, s, 8),
                   tensor("lengths", b, dtype="int32"), axis=2)
    assert str(call.struct_info) == str(TensorStructInfo((b, 2, p + s, 8), "float32"))
    with pytest.raises(DeductionError, match="ragged_concat: the rows of each batch entry"):
        call_op("ragged_concat", tensor("past", p, 8), tensor("new", s, 8), tensor("lengths", 3, dtype="int32"), axis=0)
    with pytest.raises(DeductionError, match="ragged_concat: the past lengths must be a 1-d integer tensor"):
        call_op("ragged_concat", tensor("past", b, p, 8), tensor("new", b, s, 8), tensor("lengths", b), axis=1)
    with pytest.raises(DeductionError, match="ragged_concat: 3 past lengths for 2 entries"):
        call_op("ragged_concat", tensor("past", 2, p, 8), tensor("new", 2, s, 8), tensor("lengths", 3, dtype="int32"),
                axis=1)
    with pytest.raises(DeductionError, match="ragged_concat: dim 2 of new is 4, expected past's 8"):
        call_op("ragged_concat", tensor("past", b, p, 8), tensor("new", b, s, 4), tensor("lengths", b, dtype="int32"),
                axis=1)


def onnxruntime_rule(past: np.ndarray, new: np.ndarray, lengths: list[int]) -> list[np.ndarray]:
    """What onnxruntime's GroupQueryAttention defines of each entry's present: its first
    ``past_b`` past rows, then its new rows (``past_b`` the entry's length, at most p)."""
    return [np.concatenate([past[e, :, :min(max(n, 0), past.shape[2])], new[e]], axis=1) for e, n in enumerate(lengths)]


# (past rows, new rows, each entry's past length): uniform, ragged, clamped, an empty past
CASES = [(5, 1, [5, 5]), (5, 2, [5, 3]), (4, 1, [-1, 7]), (0, 3, [0, 0])]


@pytest.mark.parametrize("past_rows, new_rows, lengths", CASES)
def test_ragged_concat_legalized_matches_the_rule_on_every_target(device, past_rows: int, new_rows: int,
                                                                  lengths: list[int]) -> None:
    builder = FunctionBuilder("main")
    args = [builder.add_param("past", TensorStructInfo((b, 2, p, 4), "float32")),
            builder.add_param("new", TensorStructInfo((b, 2, s, 4), "float32")),
            builder.add_param("lengths", TensorStructInfo((b,), "int32"))]
    out = builder.emit(call_op("ragged_concat", *args, axis=2), "present", output=True)
    module = IRModule({"main": builder.finish([out], ["present"])})
    past, new = rand(2, 2, past_rows, 4, seed=1), rand(2, 2, new_rows, 4, seed=2)
    inputs = {"past": past, "new": new, "lengths": np.array(lengths, np.int32)}
    (expected,) = run_module(module, inputs)
    legalized = legalize_ops(module)
    (got,) = run_module(legalized, inputs)
    np.testing.assert_array_equal(got, expected)
    (program,) = legalized.programs.values()
    sizes = {"b": 2, "p": past_rows, "s": new_rows}
    arrays = [past, new, inputs["lengths"]]
    for where, result in (("wgpu", run_kernel_on_gpu(device, program, arrays, sizes)),
                          ("wasm", run_on_wasm(program, arrays, sizes))):
        np.testing.assert_array_equal(result, expected, err_msg=where)
    for entry, rows in enumerate(onnxruntime_rule(past, new, lengths)):
        np.testing.assert_array_equal(expected[entry, :, :rows.shape[1]], rows)
