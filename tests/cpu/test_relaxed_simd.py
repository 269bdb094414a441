"""Relaxed SIMD in kernels.wasm (relaxweb/cpu/relaxed_simd.py): the lowering to plain SIMD128,
and the matmul tiers' kernels in both modules against numpy."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import wasmtime
from onnx import TensorProto, helper

from relaxweb.compiler import compile_model
from relaxweb.cpu.kernels import KernelsWasm, emit_kernels_wasm
from relaxweb.cpu.relaxed_simd import RELAXED_MADD, multiply_add, plain_simd, uses_relaxed_simd
from relaxweb.ir.launch import dispatch_count
from relaxweb.ir.module import IRModule
from relaxweb.ir.pattern import analyze_matmul
from relaxweb.ir.symbolic import evaluate
from relaxweb.ir.target_schedules import schedules_of
from relaxweb.ir.tir import TensorProgram
from relaxweb.ir.wasm_schedule import MatrixVectorSchedule, PackedMatmulSchedule
from relaxweb.runtime.wasm_backend import RELAXED_SIMD_PROBE, engine_has_relaxed_simd
from tests.helpers import make_model, rand
from tests.wasm_kernels import run_wasm_kernel

RELAXED_MADD_OPCODE = bytes([0xFD, 0x85, 0x02])


def test_plain_simd_writes_each_relaxed_multiply_add_as_a_multiply_then_an_add() -> None:
    text = (f"(local.set $s {multiply_add('(local.get $a)', '(v128.load offset=16 (local.get $p))', '(local.get $s)')})\n"
            f"(local.set $t {multiply_add('$x', multiply_add('(local.get $b)', '$y', '$z'), '(local.get $t)')})")
    assert uses_relaxed_simd(text)
    plain = plain_simd(text)
    assert plain == ("(local.set $s (f32x4.add (f32x4.mul (local.get $a) (v128.load offset=16 (local.get $p))) "
                     "(local.get $s)))\n"
                     "(local.set $t (f32x4.add (f32x4.mul $x (f32x4.add (f32x4.mul (local.get $b) $y) $z)) "
                     "(local.get $t)))")
    assert not uses_relaxed_simd(plain) and plain_simd(plain) == plain


def test_plain_simd_refuses_a_multiply_add_without_three_operands() -> None:
    with pytest.raises(ValueError, match="2 operands"):
        plain_simd(f"({RELAXED_MADD} (local.get $a) (local.get $b))")


def test_the_runtimes_probe_is_a_relaxed_multiply_add_that_wasmtime_validates() -> None:
    assert RELAXED_SIMD_PROBE == wasmtime.wat2wasm(
        f"(module (func (param v128 v128 v128) (result v128) ({RELAXED_MADD} (local.get 0) (local.get 1) (local.get 2))))")
    assert engine_has_relaxed_simd(wasmtime.Engine())
    config = wasmtime.Config()
    config.wasm_relaxed_simd = False
    assert not engine_has_relaxed_simd(wasmtime.Engine(config))


def _matmul(rows: int, depth: int, columns: int) -> tuple[TensorProgram, np.ndarray, np.ndarray]:
    x, w = rand(rows, depth), rand(depth, columns, seed=1)
    model = make_model([helper.make_node("MatMul", ["x", "w"], ["y"])], [("x", TensorProto.FLOAT, [rows, depth])],
                       ["y"], {"w": w})
    [program] = [p for p in compile_model(model).programs.values()
                 if isinstance(p, TensorProgram) and analyze_matmul(p) is not None]
    return program, x, w


def _tier(schedule, tier: str):
    """The matmul's wasm schedule that runs ``tier``: the matrix-vector kind as chosen, the
    packed kind alone, or the packed kind with no depth (its block matmul runs every reduction)."""
    assert isinstance(schedule, MatrixVectorSchedule)
    if tier == "matrix_vector":
        return schedule
    assert isinstance(schedule.otherwise, PackedMatmulSchedule)
    return schedule.otherwise if tier == "packed_matmul" else replace(schedule.otherwise, max_depth=1)


@pytest.mark.parametrize("rows, tier", [(3, "matrix_vector"), (37, "packed_matmul"), (37, "block_matmul")])
def test_each_matmul_tier_gives_the_product_in_both_modules(rows: int, tier: str) -> None:
    """The module with relaxed SIMD and its plain lowering run the same kernel (a multiply-add
    fused or not: within float32 rounding of each other and of numpy)."""
    program, x, w = _matmul(rows, 70, 45)
    schedule = _tier(schedules_of(program).wasm, tier)
    program = replace(program, schedule=replace(program.schedule, wasm=schedule))
    kernels = emit_kernels_wasm(IRModule(functions={}, programs={program.name: program}), [(program.name, {})])
    assert isinstance(kernels, KernelsWasm) and kernels.relaxed_wasm is not None
    assert RELAXED_MADD_OPCODE in kernels.relaxed_wasm and RELAXED_MADD_OPCODE not in kernels.wasm
    expected = x.astype(np.float64) @ w.astype(np.float64)
    params = [int(evaluate(dispatch_count(program), {}))]
    results = [run_wasm_kernel(module, 0, [x, w], np.zeros((rows, 45), np.float32), params,
                               scratch_bytes=kernels.scratch_bytes)
               for module in (kernels.wasm, kernels.relaxed_wasm)]
    for result in results:
        np.testing.assert_allclose(result, expected, rtol=1e-5, atol=1e-4)
    np.testing.assert_allclose(results[0], results[1], rtol=1e-5, atol=1e-5)
