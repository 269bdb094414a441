"""Tests of code generation: WGSL kernels (text, compilation and execution on wgpu) and the
host module of a built bundle (run with wasmtime through relaxweb.runtime.HostModule)."""

from __future__ import annotations

import json
import math
import struct
from pathlib import Path

import numpy as np
import onnx
import pytest
import wasmtime

from examples.make_mlp import make_mlp
from relaxweb.compiler import build_bundle
from relaxweb.errors import InputShapeError
from relaxweb.ir import Constant, FunctionBuilder, IRModule, SizeVar, TensorProgram, TensorStructInfo
from relaxweb.ir.interpreter import run_program
from relaxweb.ops import call_op
from relaxweb.passes import legalize_ops
from relaxweb.runtime import Dispatch, HostModule
from relaxweb.wgsl import emit_wgsl
from relaxweb.ir.schedule import WORKGROUP_SIZE
from tests.gpu_kernels import make_pipeline, run_kernel_on_gpu
from tests.helpers import F32_LOOSE, assert_close, make_model, rand

n = SizeVar("n")
m = SizeVar("m")


def legalized_programs() -> dict[str, TensorProgram]:
    """add (broadcast), matmul (symbolic K), and softmax's three programs."""
    builder = FunctionBuilder("main")
    x = builder.add_param("x", TensorStructInfo((n, m), "float32"))
    w = builder.add_param("w", TensorStructInfo((m, 5), "float32"))
    mm = builder.emit(call_op("matmul", x, w), "mm")
    biased = builder.emit(call_op("add", mm, Constant(rand(5), "bias")), "biased")
    y = builder.emit(call_op("softmax", biased, axes=[1]), "y", output=True)
    return legalize_ops(IRModule({"main": builder.finish([y], ["y"])})).programs


PROGRAMS = legalized_programs()


# WGSL text -----------------------------------------------------------------------------------


def test_wgsl_matmul_text() -> None:
    program = PROGRAMS["matmul"]
    shader = emit_wgsl(program)
    code = shader.source
    lines = [line.strip() for line in code.splitlines()]
    assert lines[0] == "// tensor program: matmul"
    assert "// out[i0_, i1_] = sum((A[i0_, k_] * B[k_, i1_]) for k_ in range(m))" in lines
    # params block: element_count, then the size variables, padded to 16 bytes
    assert shader.params_fields == ("element_count", "n", "m")
    assert shader.params_size == 16
    struct_body = code[code.index("struct Params {"): code.index("}", code.index("struct Params {"))]
    assert [line.strip() for line in struct_body.splitlines()[1:]] == [
        "element_count: i32,", "n: i32,", "m: i32,", "_pad0: i32,",
    ]
    assert shader.bindings == ("uniform", "read-only-storage", "read-only-storage", "storage")
    assert "@group(0) @binding(0) var<uniform> params: Params;" in lines
    assert "@group(0) @binding(1) var<storage, read> A: array<f32>;" in lines
    assert "@group(0) @binding(2) var<storage, read> B: array<f32>;" in lines
    assert "@group(0) @binding(3) var<storage, read_write> out: array<f32>;" in lines
    assert f"@compute @workgroup_size({WORKGROUP_SIZE})" in lines
    assert "if (index >= params.element_count) {" in lines
    # the reduction loop over the symbolic K reads it from params
    assert "for (var k_: i32 = 0; k_ < params.m; k_ = k_ + 1) {" in lines
    assert "acc0 = acc0 + (A[(i0_ * params.m) + k_] * B[i1_ + (k_ * 5)]);" in lines
    assert "out[index] = acc0;" in lines
    assert "let i1_ = rest_i0_ % 5;" in lines


def test_wgsl_softmax_text() -> None:
    maximum = emit_wgsl(PROGRAMS["softmax_max"])
    lines = [line.strip() for line in maximum.source.splitlines()]
    assert maximum.params_fields == ("element_count", "n")
    assert maximum.bindings == ("uniform", "read-only-storage", "storage")
    # -inf for an empty row, from a bit pattern the compiler cannot fold (no infinity literal)
    assert "var acc0: f32 = bitcast<f32>(0xff800000u | (u32(params.element_count) & 0u));" in lines
    assert "for (var r1_: i32 = 0; r1_ < 5; r1_ = r1_ + 1) {" in lines
    # the first element starts the row; max propagates NaN (either operand's bit pattern)
    assert "let v0 = A[(i0_ * 5) + r1_];" in lines
    assert ("acc0 = select(select(select(max(acc0, v0), v0, ((bitcast<u32>(v0) & 0x7fffffffu) > 0x7f800000u)), acc0, "
            "((bitcast<u32>(acc0) & 0x7fffffffu) > 0x7f800000u)), v0, r1_ == 0);") in lines
    assert "let i1_ = 0;" in lines  # the kept dim of extent 1
    total = emit_wgsl(PROGRAMS["softmax_sum"])
    assert "acc0 = acc0 + exp((A[(i0_ * 5) + r1_] - B[i0_]));" in [l.strip() for l in total.source.splitlines()]
    normalize = emit_wgsl(PROGRAMS["softmax_normalize"])
    assert normalize.bindings == ("uniform", "read-only-storage", "read-only-storage", "read-only-storage", "storage")
    assert "out[index] = (exp((A[(i0_ * 5) + i1_] - B[i0_])) / C[i0_]);" in [
        l.strip() for l in normalize.source.splitlines()
    ]


def test_wgsl_add_broadcast_text() -> None:
    shader = emit_wgsl(PROGRAMS["add"])
    lines = [line.strip() for line in shader.source.splitlines()]
    assert shader.params_fields == ("element_count", "n")
    assert "out[index] = (A[(i0_ * 5) + i1_] + B[i1_]);" in lines


# WGSL on wgpu ----------------------------------------------------------------------------------


@pytest.mark.parametrize("name", sorted(PROGRAMS))
def test_wgsl_compiles_on_wgpu(device, name: str) -> None:
    shader = emit_wgsl(PROGRAMS[name])
    module = device.create_shader_module(code=shader.source)
    pipeline, _ = make_pipeline(device, shader)
    assert pipeline is not None
    auto = device.create_compute_pipeline(layout="auto", compute={"module": module, "entry_point": "main"})
    assert auto is not None


def test_elementwise_kernel_runs_on_wgpu(device) -> None:
    program = PROGRAMS["add"]
    x, bias = rand(37, 5, seed=1), rand(5, seed=2)  # 185 elements: 3 workgroups, the last partial
    out = run_kernel_on_gpu(device, program, [x, bias], {"n": 37})
    assert_close(out, x + bias)
    assert_close(out, run_program(program, [x, bias], {"n": 37}))


def test_elementwise_kernel_on_a_two_dimensional_grid(device) -> None:
    """Workgroups are numbered y * grid_x + x: a (2, 2) grid covers 256 elements."""
    program = PROGRAMS["add"]
    x, bias = rand(40, 5, seed=3), rand(5, seed=4)  # 200 elements
    out = run_kernel_on_gpu(device, program, [x, bias], {"n": 40}, grid=(2, 2, 1))
    assert_close(out, x + bias)


def test_matmul_kernel_runs_on_wgpu(device) -> None:
    program = PROGRAMS["matmul"]
    a, b = rand(9, 13, seed=5), rand(13, 5, seed=6)
    out = run_kernel_on_gpu(device, program, [a, b], {"n": 9, "m": 13})
    assert_close(out, a @ b)


def test_softmax_kernels_run_on_wgpu(device) -> None:
    x = rand(70, 5, seed=7) * 4
    row_max = run_kernel_on_gpu(device, PROGRAMS["softmax_max"], [x], {"n": 70})
    np.testing.assert_array_equal(row_max, x.max(axis=1, keepdims=True))
    total = run_kernel_on_gpu(device, PROGRAMS["softmax_sum"], [x, row_max], {"n": 70})
    out = run_kernel_on_gpu(device, PROGRAMS["softmax_normalize"], [x, row_max, total], {"n": 70})
    e = np.exp(x - x.max(axis=1, keepdims=True))
    assert_close(out, e / e.sum(axis=1, keepdims=True))


# The host module of a built bundle ---------------------------------------------------------------



@pytest.fixture(scope="module")
def mlp_onnx(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("model") / "mlp.onnx"
    onnx.save(make_mlp(), str(path))
    return path


# The host-module tests below pin the call sites of the unfused MLP (one kernel per op, one
# invocation per element): opt level 0.  Fusion and schedules have their own tests
# (tests/passes/test_fusion.py).
@pytest.fixture(scope="module")
def bundle(mlp_onnx: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("bundle") / "dist"
    build_bundle(mlp_onnx, out, {"batch": 64}, opt_level=0, debug=True)  # host.wat too
    return out


@pytest.fixture(scope="module")
def unbounded_bundle(mlp_onnx: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    out = tmp_path_factory.mktemp("unbounded") / "dist"
    build_bundle(mlp_onnx, out, opt_level=0)
    return out


@pytest.fixture
def manifest(bundle: Path) -> dict:
    return json.loads((bundle / "manifest.json").read_text())


@pytest.fixture
def host(bundle: Path) -> HostModule:
    return HostModule.from_bundle(bundle)


def evaluate_text(expression: str, batch: int) -> int:
    """A manifest size expression ('batch * 512') at a batch size."""
    return eval(expression, {"__builtins__": {}, "min": min, "max": max}, {"batch": batch})


# Element count of each call site of the MLP, per row of the batch.
MLP_COUNTS_PER_ROW = [128, 128, 128, 10, 10, 1, 1, 10]


def test_bundle_manifest_shape(manifest: dict, bundle: Path) -> None:
    assert manifest["inputs"] == [{"name": "x", "dtype": "float32", "shape": ["batch", 64], "storage": 0}]
    assert manifest["dtypes"] == {"float32": {"bytes": 4, "kind": "float", "device_dtype": "float32", "device_bytes": 4,
                                             "wasm_dtype": "float32", "wasm_bytes": 4}}
    assert manifest["outputs"][0]["shape"] == ["batch", 10]
    assert manifest["symbolic_vars"] == [{"name": "batch", "bound": 64}]
    assert [s["role"] for s in manifest["storages"]][0] == "input"
    assert manifest["storages"][manifest["outputs"][0]["storage"]]["role"] == "output"
    assert len(manifest["call_sites"]) == len(MLP_COUNTS_PER_ROW)
    assert manifest["params_bytes"] == 256 * len(MLP_COUNTS_PER_ROW)
    for index, site in enumerate(manifest["call_sites"]):
        assert site["params_offset"] == 256 * index
        assert site["params_size"] % 16 == 0 and site["params_size"] >= 16
        kernel = manifest["kernels"][site["kernel"]]
        assert len(site["buffers"]) == len(kernel["bindings"]) - 1
        assert (bundle / kernel["file"]).is_file()
    for entry in manifest["storages"]:
        assert entry["size_at_bounds"] == evaluate_text(entry["size"], 64)


@pytest.mark.parametrize("batch", [1, 5, 64])
def test_host_vars_and_storage_sizes(host: HostModule, manifest: dict, batch: int) -> None:
    host.run_with_shapes([(batch, 64)])
    assert host.var_values() == {"batch": batch}
    assert host.storage_sizes() == [evaluate_text(s["size"], batch) for s in manifest["storages"]]
    assert host.storage_sizes()[0] == batch * 64 * 4
    assert host.output_shapes() == [(batch, 10)]


@pytest.mark.parametrize("batch", [1, 5, 64])
def test_host_commands(host: HostModule, batch: int) -> None:
    host.run_with_shapes([(batch, 64)])
    expected = [
        Dispatch(index, (math.ceil(per_row * batch / WORKGROUP_SIZE), 1, 1))
        for index, per_row in enumerate(MLP_COUNTS_PER_ROW)
    ]
    assert host.commands() == expected


@pytest.mark.parametrize("batch", [1, 5, 64])
def test_host_params_of_every_call_site(host: HostModule, manifest: dict, batch: int) -> None:
    host.run_with_shapes([(batch, 64)])
    params = host.params()
    assert len(params) == manifest["params_bytes"]
    for index, site in enumerate(manifest["call_sites"]):
        slots = struct.unpack_from(f"<{site['params_size'] // 4}i", params, site["params_offset"])
        # every MLP kernel has the fields (element_count, batch) plus padding
        assert slots == (MLP_COUNTS_PER_ROW[index] * batch, batch, 0, 0), site["binding"]


def test_host_params_of_the_first_matmul(host: HostModule, manifest: dict) -> None:
    host.run_with_shapes([(5, 64)])
    site = manifest["call_sites"][0]
    assert site["binding"] == 'fc1_matmul = matmul(x, const("fc1.weight"))'
    assert site["buffers"] == [{"storage": 0}, {"weight": 0}, {"storage": 1}]
    element_count, batch = struct.unpack_from("<2i", host.params(), site["params_offset"])
    assert (element_count, batch) == (5 * 128, 5)


def test_host_error_above_the_bound(host: HostModule, manifest: dict) -> None:
    host.write_input_shapes([(65, 64)])
    code = host.run()
    assert code == 2
    assert host.error_info() == (2, 65, 64)
    assert host.format_error(code) == "input 'x': dimension 0 (batch) is 65, above its bound batch <= 64"
    assert {e["code"] for e in manifest["errors"]} == {1, 2, 3}


def test_host_error_wrong_fixed_dimension(host: HostModule) -> None:
    host.write_input_shapes([(5, 63)])
    code = host.run()
    assert code == 3
    assert host.error_info() == (3, 63, 64)
    assert host.format_error(code) == "input 'x': dimension 1 is 63, expected 64"


def test_host_error_wrong_rank(host: HostModule) -> None:
    with pytest.raises(InputShapeError) as caught:
        host.run_with_shapes([(5, 64, 1)])
    assert str(caught.value) == "input 'x' has 3 dimensions, expected 2"
    assert host.error_info() == (1, 3, 2)


def test_host_runs_again_after_an_error(host: HostModule) -> None:
    with pytest.raises(InputShapeError):
        host.run_with_shapes([(65, 64)])
    host.run_with_shapes([(64, 64)])
    assert host.var_values() == {"batch": 64}


def test_host_sizes_at_bounds(host: HostModule, manifest: dict) -> None:
    assert host.var_bounds() == {"batch": 64}
    assert host.sizes_at_bounds() == [s["size_at_bounds"] for s in manifest["storages"]]
    host.write_var_bounds({"batch": 8})
    assert host.sizes_at_bounds() == [evaluate_text(s["size"], 8) for s in manifest["storages"]]
    with pytest.raises(InputShapeError, match="is 9, above its bound batch <= 8"):
        host.run_with_shapes([(9, 64)])


def test_unbounded_host_sizes_at_bounds_is_minus_one(unbounded_bundle: Path) -> None:
    manifest = json.loads((unbounded_bundle / "manifest.json").read_text())
    assert manifest["symbolic_vars"] == [{"name": "batch", "bound": None}]
    assert all(s["size_at_bounds"] is None for s in manifest["storages"])
    assert "maxStorageBufferBindingSize" not in manifest["required_limits"]
    store = wasmtime.Store()
    instance = wasmtime.Instance(store, wasmtime.Module(store.engine, (unbounded_bundle / "host.wasm").read_bytes()), [])
    assert instance.exports(store)["sizes_at_bounds"](store) == -1
    host = HostModule.from_bundle(unbounded_bundle)
    assert host.sizes_at_bounds() is None
    host.run_with_shapes([(100_000, 64)])
    assert host.storage_sizes()[0] == 100_000 * 256
    # 12.8M elements = 200000 workgroups: more than 65535 along x, so the grid wraps into y
    assert host.commands()[0] == Dispatch(0, (65535, 4, 1))


def test_host_grid_uses_the_y_dimension_past_65535_workgroups(unbounded_bundle: Path) -> None:
    host = HostModule.from_bundle(unbounded_bundle)
    host.run_with_shapes([(40_000, 64)])  # 5.12M elements: 80000 workgroups
    first = host.commands()[0]
    assert first.grid == (65535, 2, 1)
    assert first.grid[0] * first.grid[1] * WORKGROUP_SIZE >= 40_000 * 128


def test_host_wat_is_readable(bundle: Path, manifest: dict) -> None:
    wat = (bundle / "host.wat").read_text()
    assert wat.startswith(";; relaxweb host module for mlp.onnx")
    for index, site in enumerate(manifest["call_sites"]):
        assert f";; call site {index}: {site['binding']}" in wat
    assert ';; call site 0: fc1_matmul = matmul(x, const("fc1.weight"))' in wat
    assert ";; check 1: input 'x' has 2 dimensions" in wat
    assert ";; check 2: batch <= its bound (when it has one)" in wat
    assert ";; check 3: input 'x' dimension 1 == 64" in wat
    assert ";; input 'x' dimension 0 defines batch" in wat
    assert ";; storage 0 (input): batch * 256" in wat
    assert ";; output 'probabilities': [batch, 10]" in wat
    assert wasmtime.wat2wasm(wat) == (bundle / "host.wasm").read_bytes()


# Whole bundles of every supported op, run on wgpu --------------------------------------------------


def gpu_models() -> dict[str, onnx.ModelProto]:
    from onnx import helper

    node = helper.make_node
    generator = np.random.default_rng(30)
    W = generator.standard_normal((6, 5)).astype(np.float32)
    V = generator.standard_normal(5).astype(np.float32)
    return {
        # MatMul, Add, Tanh, Reshape (0 and a symbolic -1), Transpose, Sigmoid, Mul, Softmax
        "chain": make_model([
            node("MatMul", ["x", "W"], ["h"], name="mm"),
            node("Add", ["h", "V"], ["h2"], name="add"),
            node("Tanh", ["h2"], ["h3"], name="tanh"),
            node("Reshape", ["h3", "S"], ["h4"], name="reshape"),
            node("Transpose", ["h4"], ["h5"], name="transpose", perm=[0, 2, 1]),
            node("Sigmoid", ["h5"], ["h6"], name="sigmoid"),
            node("Mul", ["h6", "h5"], ["h7"], name="mul"),
            node("Softmax", ["h7"], ["y"], name="softmax"),
        ], [("x", ["batch", 6])], ["y"], {"W": W, "V": V, "S": np.array([0, 5, -1], np.int64)}),
        # batched MatMul of two inputs, opset-11 Softmax over two axes (nested reductions),
        # Sub, Div, Neg, Exp, Relu, default Transpose, Identity
        "opset11": make_model([
            node("MatMul", ["x", "z"], ["a"], name="mm"),
            node("Softmax", ["a"], ["b"], name="softmax", axis=1),
            node("Sub", ["b", "S"], ["c"], name="sub"),
            node("Div", ["c", "P"], ["d"], name="div"),
            node("Neg", ["d"], ["e"], name="neg"),
            node("Exp", ["e"], ["f"], name="exp"),
            node("Relu", ["f"], ["g"], name="relu"),
            node("Transpose", ["g"], ["h"], name="transpose"),
            node("Identity", ["h"], ["y"], name="identity"),
        ], [("x", ["batch", 3, 4]), ("z", ["batch", 4, 2])], ["y"],
            {"S": generator.random(2).astype(np.float32), "P": (generator.random((3, 2)) + 0.5).astype(np.float32)},
            opset=11),
        # Gemm with every attribute on computed operands; batch is dimension 1 of x
        "gemm": make_model(
            [node("Gemm", ["x", "B", "C"], ["y"], name="gemm", transA=1, transB=1, alpha=0.5, beta=-2.0)],
            [("x", [6, "batch"]), ("B", [5, 6]), ("C", ["batch", 5])], ["y"],
        ),
    }


GPU_MODELS = gpu_models()


def random_feeds(model: onnx.ModelProto, batch: int, seed: int) -> dict[str, np.ndarray]:
    generator = np.random.default_rng(seed)
    feeds = {}
    for value in model.graph.input:
        shape = [batch if d.dim_param else d.dim_value for d in value.type.tensor_type.shape.dim]
        feeds[value.name] = generator.standard_normal(shape).astype(np.float32)
    return feeds


@pytest.mark.parametrize("name", sorted(GPU_MODELS))
def test_bundle_runs_on_wgpu_like_onnxruntime(device, tmp_path: Path, name: str) -> None:
    import onnxruntime as ort

    from relaxweb.runtime import Session

    model = GPU_MODELS[name]
    path = tmp_path / f"{name}.onnx"
    onnx.save(model, str(path))
    build_bundle(path, tmp_path / "dist", {"batch": 16})
    session = Session(tmp_path / "dist", device=device)
    reference = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    for batch in (1, 7, 16):
        feeds = random_feeds(model, batch, seed=batch)
        (expected,) = reference.run(None, feeds)
        actual = session.run(feeds)["y"]
        assert actual.shape == expected.shape
        assert_close(actual, expected, F32_LOOSE, err_msg=f"{name} at batch {batch}")


@pytest.mark.parametrize("dim_param", ["k_", "i1_"])
def test_dim_param_named_like_an_index_variable(device, tmp_path: Path, dim_param: str) -> None:
    """Kernels name their index variables i0_, i1_, k_, r1_…; a model's symbolic dimension with
    the same name must not be confused with them (the interpreter gets this right)."""
    from onnx import helper

    from relaxweb.runtime import Session

    w = rand(4, 3, seed=0)
    model = make_model([helper.make_node("MatMul", ["x", "W"], ["y"], name="mm")], [("x", [dim_param, 4])], ["y"], {"W": w})
    path = tmp_path / "model.onnx"
    onnx.save(model, str(path))
    build_bundle(path, tmp_path / "dist", {})
    x = rand(5, 4, seed=1)
    actual = Session(tmp_path / "dist", device=device).run({"x": x})["y"]
    assert_close(actual, x @ w)


def test_size_vars_named_like_wgsl_reserved_words_compile(device) -> None:
    """Model dimension names become fields of the params struct; WGSL reserves many words
    (and every name starting with two underscores)."""
    from relaxweb.runtime.webgpu import default_adapter

    fresh = default_adapter().request_device_sync(label="reserved-words")  # keep the shared one clean
    names = ["batch", "target", "module", "new", "self", "null", "__x"]
    failures = []
    for name in names:
        var = SizeVar(name)
        builder = FunctionBuilder("main")
        x = builder.add_param("x", TensorStructInfo((var, 4), "float32"))
        y = builder.emit(call_op("relu", x), "y", output=True)
        program = legalize_ops(IRModule({"main": builder.finish([y], ["y"])})).programs["relu"]
        try:
            make_pipeline(fresh, emit_wgsl(program))
        except Exception:  # wgpu raises its own validation error types
            failures.append(name)
    assert failures == [], f"shaders for size variables named {failures} do not compile"
