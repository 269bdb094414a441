"""Schedules: those schedule_programs picks, and their WGSL on wgpu.

The schedules' shaders run on wgpu (lavapipe here) against the interpreter, at sizes that
leave partial tiles and partial workgroups; the fused MLP agrees with the unfused one on the
GPU.  (fuse_ops's own tests are in test_fuse_ops.py, pattern analysis and the loop-level
merge in tests/ir/test_pattern.py and tests/ir/test_loop_fusion.py.)
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import ClassVar

import numpy as np
import pytest

from relaxweb.ir import FunctionBuilder, IRModule, SizeVar, TensorStructInfo
from relaxweb.ir.expr import CallTIR
from relaxweb.ir.interpreter import run_module, run_program
from relaxweb.ir.launch import dispatch_count, vectorizable, workgroup_storage_bytes
from relaxweb.ir.pattern import Pattern, program_pattern
from relaxweb.ir.schedule import (
    ElementSchedule, RegisterMatmulSchedule, TiledMatmulSchedule, VectorizedSchedule, WebGpuSchedule,
    WorkgroupReductionSchedule,
)
from relaxweb.ir.target_schedules import TargetSchedules
from relaxweb.ir.symbolic import IntImm, evaluate
from relaxweb.ir.tir import Binary, Buffer, FloatImm, Load, Reduce, TensorProgram, Unary
from relaxweb.ops import call_op
from relaxweb.passes import fuse_ops, legalize_ops, schedule_programs
from relaxweb.wgsl import emit_wgsl
from tests.gpu_kernels import run_kernel_on_gpu
from tests.helpers import F32_LOOSE, assert_close, rand
from tests.passes.graphs import mlp_module  # x[n, 4] -> matmul -> add -> relu -> matmul -> add -> softmax


n, m, k = SizeVar("n"), SizeVar("m"), SizeVar("k")
I0, I1, I2 = SizeVar("i0_"), SizeVar("i1_"), SizeVar("i2_")


def tensor(*shape) -> TensorStructInfo:
    return TensorStructInfo(tuple(shape), "float32")


def one_op(params: dict[str, TensorStructInfo], make) -> IRModule:
    builder = FunctionBuilder("main")
    args = [builder.add_param(name, info) for name, info in params.items()]
    out = builder.emit(make(*args), "y", output=True)
    return IRModule({"main": builder.finish([out], ["y"])})


def calls(module: IRModule) -> list[CallTIR]:
    return [b.value for b in module.main.bindings() if isinstance(b.value, CallTIR)]


def programs_of(module: IRModule) -> list[TensorProgram]:
    return [module.programs[c.program] for c in calls(module)]


# schedule_programs -------------------------------------------------------------------------------


def test_schedule_programs_picks_by_pattern() -> None:
    scheduled = schedule_programs(fuse_ops(legalize_ops(mlp_module())))
    schedules = [p.schedule.webgpu for p in programs_of(scheduled)]
    # the fused matmuls, then softmax max / sum over a row of 3 (short: one invocation each)
    assert schedules[0] == TiledMatmulSchedule()
    assert ElementSchedule() in schedules
    assert "@tensor_program(webgpu=tiled_matmul(tile=32, depth=16, block=4), webgpu_cpu=register_matmul(block=4)" \
        in str(scheduled)
    def softmax(width):
        return legalize_ops(one_op({"x": tensor(n, width)}, lambda x: call_op("softmax", x, axes=[1])))

    long_rows = schedule_programs(softmax(200))  # a long constant row: a workgroup per row
    # (and the normalization, elementwise over rows of 200 = 50 x 4, reads 4 at a time)
    assert [p.schedule.webgpu.kind for p in programs_of(long_rows)] == ["workgroup_reduction", "workgroup_reduction",
                                                                         "vectorized"]
    # a symbolic row length: as many rows as the row is long, so one invocation per row
    assert [p.schedule.webgpu for p in programs_of(schedule_programs(softmax(m)))] == [ElementSchedule()] * 3
    value = rand(3, 200, seed=8)
    assert_close(run_module(long_rows, {"x": value})[0], run_module(softmax(200), {"x": value})[0])


# Schedules on the GPU ----------------------------------------------------------------------------


def scheduled(program: TensorProgram, schedule: WebGpuSchedule) -> TensorProgram:
    """``program`` with its WebGPU shader laid out by ``schedule``."""
    from dataclasses import replace

    return replace(program, schedule=TargetSchedules(webgpu=schedule))


# every schedule of matmul-like programs: staged through workgroup memory, or read into registers
MATMUL_SCHEDULES = [TiledMatmulSchedule(), RegisterMatmulSchedule(block=8), RegisterMatmulSchedule(block=4)]


@pytest.mark.parametrize("schedule", MATMUL_SCHEDULES, ids=str)
@pytest.mark.parametrize("sizes", [(1, 1, 1), (37, 19, 45), (64, 16, 32), (5, 70, 3)])
def test_tiled_matmul_with_epilogue_on_gpu(device, sizes: tuple[int, int, int], schedule: WebGpuSchedule) -> None:
    rows, depth, columns = sizes
    # out = relu(A @ B + bias): the matmul with a fused epilogue
    a, b, bias = Buffer("A", (n, k), "float32"), Buffer("B", (k, m), "float32"), Buffer("C", (m,), "float32")
    r = SizeVar("k_")
    product = Reduce("sum", r, k, Binary("multiply", Load(a, (I0, r)), Load(b, (r, I1))))
    body = Binary("maximum", Binary("add", product, Load(bias, (I1,))), FloatImm(0.0))
    program = TensorProgram("matmul_bias_relu", (a, b, bias), Buffer("out", (n, m), "float32"), (I0, I1), body)
    assert program_pattern(program) == Pattern.MATMUL
    arrays = [rand(rows, depth, seed=1), rand(depth, columns, seed=2), rand(columns, seed=3)]
    size_vars = {"n": rows, "k": depth, "m": columns}
    want = run_program(program, arrays, size_vars)
    got = run_kernel_on_gpu(device, scheduled(program, schedule), arrays, size_vars)
    assert_close(got, want, F32_LOOSE)
    staged = "var<workgroup> tile_a" in emit_wgsl(scheduled(program, schedule)).source
    assert staged == isinstance(schedule, TiledMatmulSchedule)


@pytest.mark.parametrize("schedule", MATMUL_SCHEDULES, ids=str)
def test_tiled_batched_matmul_with_broadcast_on_gpu(device, schedule: WebGpuSchedule) -> None:
    legalized = legalize_ops(one_op({"a": tensor(3, n, k), "b": tensor(k, m)}, lambda a, b: call_op("matmul", a, b)))
    (program,) = programs_of(legalized)
    arrays = [rand(3, 33, 20, seed=4), rand(20, 40, seed=5)]
    size_vars = {"n": 33, "k": 20, "m": 40}
    got = run_kernel_on_gpu(device, scheduled(program, schedule), arrays, size_vars)
    assert_close(got, arrays[0] @ arrays[1], F32_LOOSE)


@pytest.mark.parametrize("schedule", MATMUL_SCHEDULES, ids=str)
def test_convolution_as_tiled_matmul_on_gpu(device, schedule: WebGpuSchedule) -> None:
    def make(x, w):
        return call_op("conv", x, w, strides=[1, 1], dilations=[1, 1], padding=[1, 1, 1, 1])
    legalized = legalize_ops(one_op({"x": tensor(n, 3, 9, 7), "w": tensor(5, 3, 3, 3)}, make))
    (program,) = programs_of(legalized)
    arrays = [rand(2, 3, 9, 7, seed=6), rand(5, 3, 3, 3, seed=7)]
    want = run_program(program, arrays, {"n": 2})
    got = run_kernel_on_gpu(device, scheduled(program, schedule), arrays, {"n": 2})
    assert_close(got, want, F32_LOOSE)


def test_tiled_matmuls_take_64_tiles_unless_an_extent_is_a_small_constant() -> None:
    def matmul_schedule(rows, depth, columns):
        module = legalize_ops(one_op({"a": tensor(rows, depth), "b": tensor(depth, columns)},
                                     lambda a, b: call_op("matmul", a, b)))
        return programs_of(schedule_programs(module))[0].schedule.webgpu

    large, small = TiledMatmulSchedule(tile=64, depth=16, block=8), TiledMatmulSchedule()
    assert matmul_schedule(1024, 1024, 1024) == large
    assert matmul_schedule(n, 768, 768) == large  # a symbolic extent counts as large
    assert matmul_schedule(n, 768, 8) == small  # 8 columns: a 64 tile would be 7/8 padding
    assert matmul_schedule(48, 768, n) == small


def test_tiled_matmul_follows_its_parameters_on_gpu(device) -> None:
    # 64 x 64 tiles staged 8 deep, 8 x 8 outputs per invocation (8 x 8 invocations, as always)
    schedule = TiledMatmulSchedule(tile=64, depth=8, block=8)
    a, b = Buffer("A", (n, k), "float32"), Buffer("B", (k, m), "float32")
    r = SizeVar("k_")
    body = Reduce("sum", r, k, Binary("multiply", Load(a, (I0, r)), Load(b, (r, I1))))
    program = scheduled(TensorProgram("matmul", (a, b), Buffer("out", (n, m), "float32"), (I0, I1), body), schedule)
    size_vars = {"n": 137, "k": 19, "m": 75}
    assert int(evaluate(dispatch_count(program), size_vars)) == 3 * 2 * 64  # ceil(137 / 64) x ceil(75 / 64) tiles
    assert workgroup_storage_bytes(program) == 2 * 64 * 8 * 4
    assert "var<workgroup> tile_a: array<vec4<f32>, 128>;" in emit_wgsl(program).source  # 64 x 8 as vec4
    arrays = [rand(137, 19, seed=21), rand(19, 75, seed=22)]
    got = run_kernel_on_gpu(device, program, arrays, size_vars)
    np.testing.assert_allclose(got, arrays[0] @ arrays[1], rtol=1e-4, atol=1e-5)


def test_schedules_are_typed_validated_and_printed() -> None:
    assert str(TiledMatmulSchedule()) == "tiled_matmul(tile=32, depth=16, block=4)"
    assert str(VectorizedSchedule(width=2)) == "vectorized(width=2)"
    assert str(WorkgroupReductionSchedule()) == "workgroup_reduction"
    with pytest.raises(ValueError, match="must be the workgroup size 64"):
        TiledMatmulSchedule(tile=32, block=2)  # 16 x 16 invocations
    with pytest.raises(ValueError, match="block must be a multiple of 4"):
        TiledMatmulSchedule(tile=16, block=2)  # 8 x 8 invocations, but a block row is not whole vec4s
    with pytest.raises(ValueError, match="tile must divide 64"):
        TiledMatmulSchedule(tile=128, block=16)  # an invocation would stage two rows of the tile
    with pytest.raises(ValueError, match="width must be 2 or 4"):
        VectorizedSchedule(width=3)
    source = Buffer("A", (n,), "float32")
    with pytest.raises(TypeError, match="schedule must be a TargetSchedules"):
        TensorProgram("p", (source,), Buffer("out", (n,), "float32"), (I0,), Load(source, (I0,)), "element")
    with pytest.raises(TypeError, match="the wasm schedule must be a WasmSchedule"):
        TargetSchedules(wasm=ElementSchedule())  # a WebGPU kind for the wasm target
    with pytest.raises(TypeError, match="the webgpu schedule must be a WebGpuSchedule, got None"):
        TargetSchedules(webgpu=None)  # only a second shader may be missing


def test_a_schedule_without_a_wgsl_renderer_is_an_error() -> None:
    @dataclass(frozen=True)
    class Unrolled(WebGpuSchedule):
        kind: ClassVar[str] = "unrolled"
        factor: int = 8

    source = Buffer("A", (n,), "float32")
    program = scheduled(TensorProgram("copy", (source,), Buffer("out", (n,), "float32"), (I0,), Load(source, (I0,))),
                        Unrolled())
    with pytest.raises(NotImplementedError, match=r"copy: the WGSL backend has no renderer for the schedule unrolled\(factor=8\)"):
        emit_wgsl(program)


@pytest.mark.parametrize("combiner", ["sum", "max", "min", "prod"])
@pytest.mark.parametrize("width", [0, 1, 63, 64, 65, 200])
def test_workgroup_reduction_on_gpu(device, combiner: str, width: int) -> None:
    a = Buffer("A", (n, m), "float32")
    r = SizeVar("r_")
    # out[i] = combiner(A[i, r]) * 2 + 1: an epilogue after the cooperative reduction
    body = Binary("add", Binary("multiply", Reduce(combiner, r, m, Load(a, (I0, r))), FloatImm(2.0)), FloatImm(1.0))
    program = TensorProgram("row_" + combiner, (a,), Buffer("out", (n,), "float32"), (I0,), body)
    data = rand(5, width, seed=width)
    if combiner == "prod":
        data = (1 + data * 0.01).astype(np.float32)
    if width and combiner in ("max", "min"):
        data[1, :] = -np.inf if combiner == "max" else np.inf  # a row of infinities stays infinite
    want = run_program(program, [data], {"n": 5, "m": width})
    got = run_kernel_on_gpu(device, scheduled(program, WorkgroupReductionSchedule()), [data], {"n": 5, "m": width})
    assert_close(got, want, F32_LOOSE)


def test_workgroup_reduction_of_two_reductions_over_one_axis_name_on_gpu(device) -> None:
    """out[i] = sum(A[i, r]) / max(A[i, r]) with both reductions over an axis named r_ (as a
    ceil-mode AveragePool's sum / count): each keeps its own state in the shader."""
    a = Buffer("A", (n, m), "float32")
    r = SizeVar("r_")
    body = Binary("divide", Reduce("sum", r, m, Load(a, (I0, r))), Reduce("max", r, m, Load(a, (I0, r))))
    program = TensorProgram("sum_over_max", (a,), Buffer("out", (n,), "float32"), (I0,), body)
    data = rand(5, 100, seed=1, low=0.5, high=1.5)
    want = run_program(program, [data], {"n": 5, "m": 100})
    got = run_kernel_on_gpu(device, scheduled(program, WorkgroupReductionSchedule()), [data], {"n": 5, "m": 100})
    assert_close(got, want, F32_LOOSE)


@pytest.mark.gpu
def test_fused_models_agree_with_unfused_on_gpu(tmp_path) -> None:
    """The MLP built at opt level 0 and 1: same outputs in the Python runtime, fewer dispatches."""
    pytest.importorskip("wgpu")
    from relaxweb.bundle import write_bundle
    from relaxweb.compiler import compile_module
    from relaxweb.runtime.webgpu import Session

    results, dispatches = {}, {}
    value = rand(7, 4, seed=9)
    for level in (0, 1):
        compiled = compile_module(mlp_module(), {}, opt_level=level)
        write_bundle(compiled, tmp_path / f"level{level}", "mlp")
        session = Session(tmp_path / f"level{level}")
        results[level] = session.run({"x": value})
        dispatches[level] = session.last_dispatch_count
    for name in results[0]:
        assert_close(results[1][name], results[0][name])
    assert (dispatches[0], dispatches[1]) == (8, 5)


def test_workgroup_reduction_shader_combines_through_workgroup_memory() -> None:
    legalized = legalize_ops(one_op({"x": tensor(n, 256)}, lambda x: call_op("softmax", x, axes=[1])))
    for program in schedule_programs(legalized).programs.values():
        source = emit_wgsl(program).source
        if isinstance(program.schedule.webgpu, WorkgroupReductionSchedule):
            assert "workgroupBarrier();" in source
            assert "if (local_index == 0u) {" in source


# The vectorized schedule -------------------------------------------------------------------------


def test_vectorized_elementwise_on_gpu(device) -> None:
    # out[i, j] = tanh((x[i, j] - mean[i, 0]) * scale[j] + 1.0): x and scale read along j
    # (16-byte loads), mean constant along j (read once, splatted)
    x, mean, scale = Buffer("A", (n, 12), "float32"), Buffer("B", (n, 1), "float32"), Buffer("C", (12,), "float32")
    body = Unary("tanh", Binary("add", Binary("multiply", Binary("subtract", Load(x, (I0, I1)), Load(mean, (I0, IntImm(0)))),
                                                  Load(scale, (I1,))), FloatImm(1.0)))
    program = TensorProgram("normalize", (x, mean, scale), Buffer("out", (n, 12), "float32"), (I0, I1), body)
    assert vectorizable(program)
    assert schedule_programs(IRModule({}, {"normalize": program})).programs["normalize"].schedule.webgpu == VectorizedSchedule()
    arrays = [rand(5, 12, seed=15), rand(5, 1, seed=16), rand(12, seed=17)]
    shader = emit_wgsl(scheduled(program, VectorizedSchedule())).source
    assert "var<storage, read> A: array<vec4<f32>>;" in shader and "var<storage, read> B: array<f32>;" in shader
    got = run_kernel_on_gpu(device, scheduled(program, VectorizedSchedule()), arrays, {"n": 5})
    assert_close(got, run_program(program, arrays, {"n": 5}))


def test_vectorized_slice_at_a_multiple_of_four_on_gpu(device) -> None:
    # a split's part: out[i, j] = A[i, j + 8] (from a [n, 24] tensor)
    source = Buffer("A", (n, 24), "float32")
    program = TensorProgram("part", (source,), Buffer("out", (n, 8), "float32"), (I0, I1), Load(source, (I0, I1 + 8)))
    assert vectorizable(program)
    data = rand(3, 24, seed=18)
    got = run_kernel_on_gpu(device, scheduled(program, VectorizedSchedule()), [data], {"n": 3})
    np.testing.assert_array_equal(got, data[:, 8:16])


def test_vectorized_by_two_on_gpu(device) -> None:
    # rows of 6: a multiple of 2, not of 4
    x, bias = Buffer("A", (n, 6), "float32"), Buffer("B", (6,), "float32")
    body = Binary("maximum", Binary("add", Load(x, (I0, I1)), Load(bias, (I1,))), FloatImm(0.0))
    program = TensorProgram("bias_relu", (x, bias), Buffer("out", (n, 6), "float32"), (I0, I1), body)
    assert vectorizable(program, 2) and not vectorizable(program, 4)
    program = scheduled(program, VectorizedSchedule(width=2))
    assert "var<storage, read> A: array<vec2<f32>>;" in emit_wgsl(program).source
    assert int(evaluate(dispatch_count(program), {"n": 5})) == 15
    arrays = [rand(5, 6, seed=23), rand(6, seed=24)]
    got = run_kernel_on_gpu(device, program, arrays, {"n": 5})
    np.testing.assert_allclose(got, np.maximum(arrays[0] + arrays[1], 0), rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize("case", ["odd last dim", "offset not a multiple of 4", "a select", "int32"])
def test_programs_that_do_not_vectorize(case: str) -> None:
    from relaxweb.ir.tir import Compare, Select

    width = 6 if case == "odd last dim" else 8
    dtype = "int32" if case == "int32" else "float32"
    source = Buffer("A", (n, 16), dtype)
    load = Load(source, (I0, I1 + (2 if case == "offset not a multiple of 4" else 0)))
    body = Select(Compare("gt", load, FloatImm(0.0)), load, FloatImm(0.0)) if case == "a select" else load
    program = TensorProgram("p", (source,), Buffer("out", (n, width), dtype), (I0, I1), body)
    assert not vectorizable(program)
    assert schedule_programs(IRModule({}, {"p": program})).programs["p"].schedule.webgpu == ElementSchedule()


def test_the_bundle_declares_the_workgroup_memory_its_schedules_use(tmp_path) -> None:
    import json

    from relaxweb.bundle import write_bundle

    from relaxweb.compiler import compile_module

    manifest = write_bundle(compile_module(mlp_module(), {}), tmp_path / "bundle", "mlp")
    by_name = {k["name"]: k for k in manifest["kernels"]}
    tiled = [k for k in by_name.values() if "tile_a" in (tmp_path / "bundle" / k["file"]).read_text()]
    assert tiled and all(k["workgroup_storage_bytes"] == 2 * 32 * 16 * 4 for k in tiled)
    limits = json.loads((tmp_path / "bundle" / "manifest.json").read_text())["required_limits"]
    assert limits["maxComputeWorkgroupStorageSize"] == 4096
    assert limits["maxComputeInvocationsPerWorkgroup"] == 64
