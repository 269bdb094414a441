"""Relaxed SIMD in kernels.wasm (relaxweb/cpu/relaxed_simd.py): its multiply-add sites, the
runtime's lowering of them to plain SIMD128 (runtime/relaxed_simd.py), and the matmul tiers'
kernels in both forms against numpy."""

from __future__ import annotations

from dataclasses import replace

import numpy as np
import pytest
import wasmtime
from onnx import TensorProto, helper

from relaxweb.compiler import compile_model
from relaxweb.cpu.kernels import KernelsWasm, emit_kernels_wasm
from relaxweb.cpu.relaxed_simd import RELAXED_MADD, SITE_PADDING, multiply_add, plain_simd, relaxed_madd_sites
from relaxweb.errors import RelaxwebError
from relaxweb.ir.launch import dispatch_count
from relaxweb.ir.module import IRModule
from relaxweb.ir.pattern import analyze_matmul
from relaxweb.ir.symbolic import evaluate
from relaxweb.ir.target_schedules import schedules_of
from relaxweb.ir.tir import TensorProgram
from relaxweb.ir.wasm_schedule import MatrixVectorSchedule, PackedMatmulSchedule
from relaxweb.runtime.relaxed_simd import RELAXED_SIMD_PROBE, engine_has_relaxed_simd, lower_relaxed_simd
from tests.helpers import make_model, rand
from tests.wasm_kernels import run_wasm_kernel

RELAXED_MADD_OPCODE = bytes([0xFD, 0x85, 0x02])


def test_a_multiply_add_is_a_site_and_plain_simd_writes_it_as_a_multiply_then_an_add() -> None:
    text = (f"(local.set $s {multiply_add('(local.get $a)', '(v128.load offset=16 (local.get $p))', '(local.get $s)')})\n"
            f"(local.set $t {multiply_add('$x', '(f32x4.splat (local.get $y))', '(local.get $t)')})")
    assert relaxed_madd_sites(text) == 2
    assert text.count(SITE_PADDING) == 2
    plain = plain_simd(text)
    assert plain == ("(local.set $s (f32x4.add (f32x4.mul (local.get $a) (v128.load offset=16 (local.get $p))) "
                     "(local.get $s)))\n"
                     "(local.set $t (f32x4.add (f32x4.mul $x (f32x4.splat (local.get $y))) (local.get $t)))")
    assert relaxed_madd_sites(plain) == 0 and plain_simd(plain) == plain


def test_a_multiply_add_adds_to_a_local_and_holds_no_other() -> None:
    with pytest.raises(ValueError, match="adds to a local"):
        multiply_add("(local.get $a)", "(local.get $b)", "(f32x4.splat (local.get $c))")
    with pytest.raises(ValueError, match="no multiply-add of their own"):
        multiply_add(multiply_add("$a", "$b", "(local.get $c)"), "$d", "(local.get $e)")
    with pytest.raises(ValueError, match="not written by multiply_add"):
        plain_simd(f"({RELAXED_MADD} (local.get $a) (local.get $b) (local.get $c))")


def test_the_runtimes_probe_is_a_relaxed_multiply_add_that_wasmtime_validates() -> None:
    assert RELAXED_SIMD_PROBE == wasmtime.wat2wasm(
        f"(module (func (param v128 v128 v128) (result v128) ({RELAXED_MADD} (local.get 0) (local.get 1) (local.get 2))))")
    assert engine_has_relaxed_simd(wasmtime.Engine())
    config = wasmtime.Config()
    config.wasm_relaxed_simd = False
    assert not engine_has_relaxed_simd(wasmtime.Engine(config))


def _sites_module(locals_count: int) -> str:
    """A module whose function adds into locals 0, 1, 127, 128 and the last of ``locals_count``
    v128 locals (indices of one LEB128 byte and of two), each a site."""
    sums = sorted({0, 1, 127, 128, locals_count - 1})
    body = "\n".join(f"(local.set {i} {multiply_add('(v128.load (i32.const 0))', f'(local.get {i})', f'(local.get ${i})')})"
                     for i in sums)
    names = " ".join(f"(local ${i} v128)" for i in range(locals_count))
    return (f'(module (memory 1) (func (export "f") {names}\n{body}\n'
            f"(v128.store (i32.const 16) (local.get {sums[-1]}))))")


def test_the_runtimes_lowering_is_the_assemblers_plain_module() -> None:
    """runtime/relaxed_simd.py rewrites each site's bytes where they stand: the result is, byte
    for byte, what the assembler makes of plain_simd's text, for local indices of one LEB128
    byte and of two, and for the kernels of a whole model."""
    for wat in (_sites_module(200), _whole_model_kernels().wat):
        relaxed = wasmtime.wat2wasm(wat)
        lowered = lower_relaxed_simd(relaxed, relaxed_madd_sites(wat))
        assert RELAXED_MADD_OPCODE not in lowered and len(lowered) == len(relaxed)
        assert lowered == wasmtime.wat2wasm(plain_simd(wat))


def test_the_lowering_refuses_a_module_whose_sites_are_not_the_manifests() -> None:
    wat = _sites_module(130)
    relaxed = wasmtime.wat2wasm(wat)
    with pytest.raises(RelaxwebError, match=r"\(5 relaxed multiply-adds where the manifest counts 6\): the bundle is damaged"):
        lower_relaxed_simd(relaxed, 6)
    with pytest.raises(RelaxwebError, match="not a WebAssembly module"):
        lower_relaxed_simd(b"\0asm\x02\0\0\0", 1)
    damaged = relaxed.replace(bytes([0x20, 0x00]) + RELAXED_MADD_OPCODE, bytes([0x1A, 0x00]) + RELAXED_MADD_OPCODE, 1)
    with pytest.raises(RelaxwebError, match="does not follow a local.get"):
        lower_relaxed_simd(damaged, 5)


def _whole_model_kernels() -> KernelsWasm:
    """The kernels of two matmuls with a relu between (the matmul tiers' sites)."""
    model = make_model([helper.make_node("MatMul", ["x", "w"], ["h"]), helper.make_node("Relu", ["h"], ["r"]),
                        helper.make_node("MatMul", ["r", "v"], ["y"])],
                       [("x", TensorProto.FLOAT, [9, 40])], ["y"], {"w": rand(40, 64, seed=2), "v": rand(64, 3, seed=3)})
    compiled = compile_model(model)
    order = [(name, {}) for name, program in compiled.programs.items()]
    kernels = emit_kernels_wasm(compiled, order)
    assert isinstance(kernels, KernelsWasm) and kernels.relaxed_madd_sites > 0
    return kernels


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
    assert isinstance(kernels, KernelsWasm) and kernels.relaxed_madd_sites > 0
    plain = lower_relaxed_simd(kernels.wasm, kernels.relaxed_madd_sites)
    assert RELAXED_MADD_OPCODE in kernels.wasm and RELAXED_MADD_OPCODE not in plain
    expected = x.astype(np.float64) @ w.astype(np.float64)
    params = [int(evaluate(dispatch_count(program), {}))]
    results = [run_wasm_kernel(module, 0, [x, w], np.zeros((rows, 45), np.float32), params,
                               scratch_bytes=kernels.scratch_bytes)
               for module in (plain, kernels.wasm)]
    for result in results:
        np.testing.assert_allclose(result, expected, rtol=1e-5, atol=1e-4)
    np.testing.assert_allclose(results[0], results[1], rtol=1e-5, atol=1e-5)
