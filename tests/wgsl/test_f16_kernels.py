"""Kernels with an f16 shader (``TargetSchedules.webgpu_f16``, chosen by
relaxweb/passes/schedule_programs.py: tiled matmuls whose factors are staged and multiplied in
f16, summed in f32): which kernels get one, which shaders a session picks
(``kernels="auto"|"gpu"|"cpu"|"f16"``) on adapters with and without ``shader-f16``, and that
the f16 shaders compute what onnxruntime does within f16's rounding.

The f16 error bound.  f16's unit roundoff is u = 2**-11 ~ 4.9e-4.  Each term a * b of a
reduction is computed from a and b rounded to f16 (WGSL lets a conversion take either
neighbour: up to 2u each) and multiplied in f16 (correctly rounded: u), so it is off by at
most 5u |a b| (plus 2**-14 where an f16 subnormal product is flushed to zero); the f32 sum
adds nothing comparable.  So every output element is within
``5u * sum |a b| + K * 2**-14`` of the exact one (:func:`assert_within_f16_products`): an
absolute bound at the scale of the terms, which no cancellation breaks, and which a missing
bias or a wrong index exceeds.  Measured here (lavapipe): at most 0.15 of it; the f32 shaders
stay within 0.0001 of it, and within 0.06 of the f32 bound (``assert_within_f32_sums``), which
the f16 shaders exceed 120-fold at K = 27 and 33 (so a fallback to f32 is told apart).

Whole models go through layers of such matmuls (and layer norms, softmax): the ``F16_MODEL``
tier of tests/helpers.py.
"""

from __future__ import annotations

import importlib.util
import json
import warnings
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import onnx
import pytest
import wgpu
from onnx import helper

import relaxweb.runtime.webgpu as webgpu
from relaxweb import build, load
from relaxweb.api import inspect
from relaxweb.browser import open_runner_page
from relaxweb.bundle import write_bundle
from relaxweb.compiler import compile_module
from relaxweb.ir import FunctionBuilder, IRModule, TensorStructInfo
from relaxweb.ir.interpreter import run_module, run_program
from relaxweb.ir.launch import dispatch_count, workgroup_storage_bytes
from relaxweb.ir.schedule import HalfTiledMatmulSchedule, TiledMatmulSchedule
from relaxweb.ir.symbolic import SizeVar
from relaxweb.ir.target_schedules import TargetSchedules
from relaxweb.ir.tir import Binary, Buffer, FloatImm, Load, Reduce, TensorProgram
from relaxweb.passes.schedule_programs import f16_schedule
from relaxweb.runtime.webgpu import SHADER_F16, choose_kernels, default_device
from tests.gpu_kernels import run_kernel_on_gpu
from tests.helpers import EPS32, F16_MODEL, F32_LOOSE, assert_close, make_model, onnxruntime_outputs, rand
from tests.model_exports import MODELS, committed_exports, export_script
from tests.ops.test_attention import SHAPES as ATTENTION_SHAPES
from tests.ops.test_attention import _feeds as attention_feeds
from tests.ops.test_attention import attention_model

ROWS, DEPTH, COLUMNS = 70, 33, 90  # not multiples of the tiles: the edges are exercised
LONG = 768  # GPT-2's hidden size: a long reduction (summed in f32)
UNIT_ROUNDOFF_F16 = 2.0 ** -11
SMALLEST_NORMAL_F16 = 2.0 ** -14


def matmul_and_convolution_model():
    """y = relu(x @ w + b) (K = 33), l = x2 @ w2 (K = 768) and z = conv3x3(image, k) with
    padding: three tiled matmuls; s = softmax(x), not a matmul, gets no f16 shader."""
    nodes = [helper.make_node("MatMul", ["x", "w"], ["xw"]), helper.make_node("Add", ["xw", "b"], ["xwb"]),
             helper.make_node("Relu", ["xwb"], ["y"]),
             helper.make_node("MatMul", ["x2", "w2"], ["l"]),
             helper.make_node("Conv", ["image", "k"], ["z"], pads=[1, 1, 1, 1]),
             helper.make_node("Softmax", ["x"], ["s"])]
    initializers = {"w": rand(DEPTH, COLUMNS, seed=1), "b": rand(COLUMNS, seed=2), "k": rand(8, 3, 3, 3, seed=3),
                    "w2": rand(LONG, 64, seed=6)}
    return make_model(nodes, [("x", ["rows", DEPTH]), ("x2", ["rows", LONG]), ("image", [1, 3, 12, 10])],
                      ["y", "l", "z", "s"], initializers)


@pytest.fixture(scope="module")
def f16_bundle(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("f16")
    onnx.save(matmul_and_convolution_model(), folder / "model.onnx")
    build(str(folder / "model.onnx"), str(folder / "bundle"), bounds={"rows": 128})
    return folder


def feeds() -> dict[str, np.ndarray]:
    return {"x": rand(ROWS, DEPTH, seed=4), "x2": rand(ROWS, LONG, seed=7), "image": rand(1, 3, 12, 10, seed=5)}


def term_magnitudes(inputs: dict[str, np.ndarray], model: onnx.ModelProto) -> dict[str, tuple[np.ndarray, int]]:
    """sum |a b| over each output's reduction, and the reduction's length K, in float64."""
    weights = {i.name: onnx.numpy_helper.to_array(i).astype(np.float64) for i in model.graph.initializer}
    x, x2, image = (np.abs(inputs[n].astype(np.float64)) for n in ("x", "x2", "image"))
    padded = np.pad(image, ((0, 0), (0, 0), (1, 1), (1, 1)))
    kernel = np.abs(weights["k"])
    conv = np.zeros((1, 8, 12, 10))
    for dy in range(3):
        for dx in range(3):
            conv += np.einsum("nchw,oc->nohw", padded[:, :, dy:dy + 12, dx:dx + 10], kernel[:, :, dy, dx])
    return {"y": (x @ np.abs(weights["w"]), DEPTH), "l": (x2 @ np.abs(weights["w2"]), LONG), "z": (conv, 27)}


def assert_within_f16_products(got: np.ndarray, want: np.ndarray, terms: np.ndarray, depth: int) -> float:
    """Every element within the f16 bound of the module doc; returns the largest error as a
    fraction of it."""
    return _assert_within(got, want, 5 * UNIT_ROUNDOFF_F16 * terms + depth * SMALLEST_NORMAL_F16 + 1e-5, "f16")


def assert_within_f32_sums(got: np.ndarray, want: np.ndarray, terms: np.ndarray, depth: int) -> float:
    """Every element within what two f32 sums of the same K products in different orders may
    differ by: K * EPS32 * sum |a b| (27 times tighter than the f16 bound at K = 768)."""
    return _assert_within(got, want, depth * EPS32 * terms + 1e-6, "f32")


def _assert_within(got: np.ndarray, want: np.ndarray, bound: np.ndarray, name: str) -> float:
    ratio = np.abs(got.astype(np.float64) - want.astype(np.float64)) / bound
    assert ratio.max() <= 1.0, f"error {ratio.max():.2f} times the {name} bound at {np.unravel_index(ratio.argmax(), ratio.shape)}"
    return float(ratio.max())


def test_tiled_matmuls_get_an_f16_shader(f16_bundle: Path) -> None:
    manifest = json.loads((f16_bundle / "bundle" / "manifest.json").read_text())
    with_f16 = [k for k in manifest["kernels"] if "f16_file" in k]
    assert len(manifest["kernels"]) > 3 and len(with_f16) == 3  # the two matmuls and the convolution
    assert manifest["required_features"] == []  # the f32 shaders stay the bundle's baseline
    for kernel in with_f16:
        source = (f16_bundle / "bundle" / kernel["f16_file"]).read_text()
        assert kernel["f16_file"] == kernel["file"].replace(".wgsl", ".f16.wgsl")
        assert source.startswith("enable f16;\n")
        assert "var<workgroup> tile_a: array<vec4<f16>," in source and "tiled_matmul_f16(" in source
        assert "var accumulators: array<vec4<f32>," in source  # summed in f32
        assert "array<f16>" not in source  # the buffers stay f32
        assert "f16" not in (f16_bundle / "bundle" / kernel["file"]).read_text()
    sizes = {k["file"]: (f16_bundle / "bundle" / k.get("f16_file", k["file"])).stat().st_size for k in manifest["kernels"]}
    assert (f"on an adapter with shader-f16 3 of them compile their f16_file instead: {sum(sizes.values())} bytes of WGSL"
            in str(inspect(f16_bundle / "bundle")))


def matmul_bias_relu(schedule: TiledMatmulSchedule) -> TensorProgram:
    """out[n, m] = relu(A[n, k] @ B[k, m] + C[m]), its WebGPU shader laid out by ``schedule``."""
    n, m, k, i0, i1, r = (SizeVar(name) for name in ("n", "m", "k", "i0_", "i1_", "k_"))
    a, b, bias = Buffer("A", (n, k), "float32"), Buffer("B", (k, m), "float32"), Buffer("C", (m,), "float32")
    product = Reduce("sum", r, k, Binary("multiply", Load(a, (i0, r)), Load(b, (r, i1))))
    body = Binary("maximum", Binary("add", product, Load(bias, (i1,))), FloatImm(0.0))
    return TensorProgram("matmul_bias_relu", (a, b, bias), Buffer("out", (n, m), "float32"), (i0, i1), body,
                         schedule=TargetSchedules(webgpu=schedule))


def test_the_f16_schedule_keeps_the_tiles_and_halves_the_workgroup_memory() -> None:
    for schedule in (TiledMatmulSchedule(), TiledMatmulSchedule(tile=64, depth=8, block=8)):
        program = matmul_bias_relu(schedule)
        half = f16_schedule(schedule)
        assert half == HalfTiledMatmulSchedule(tile=schedule.tile, depth=schedule.depth, block=schedule.block)
        assert str(half) == str(schedule).replace("tiled_matmul(", "tiled_matmul_f16(")
        assert dispatch_count(program, half) == dispatch_count(program)
        assert workgroup_storage_bytes(program, half) * 2 == workgroup_storage_bytes(program)
        assert f16_schedule(half) is None  # one second shader, not a chain


@pytest.mark.gpu
@pytest.mark.parametrize("schedule", [TiledMatmulSchedule(), TiledMatmulSchedule(tile=64, depth=8, block=8)], ids=str)
@pytest.mark.parametrize("sizes", [(1, 1, 1), (37, 19, 45), (64, 16, 32), (5, 70, 3), (137, 200, 75)])
def test_the_f16_schedule_on_gpu(sizes: tuple[int, int, int], schedule: TiledMatmulSchedule) -> None:
    """Every edge of the tiles (the kernel's own bounds guard is checked by run_kernel_on_gpu)."""
    rows, depth, columns = sizes
    program = matmul_bias_relu(f16_schedule(schedule))
    arrays = [rand(rows, depth, seed=1), rand(depth, columns, seed=2), rand(columns, seed=3)]
    size_vars = {"n": rows, "k": depth, "m": columns}
    got = run_kernel_on_gpu(default_device(required_features=[SHADER_F16]), program, arrays, size_vars)
    want = run_program(program, [x.astype(np.float64) for x in arrays], size_vars)
    terms = np.abs(arrays[0]).astype(np.float64) @ np.abs(arrays[1]).astype(np.float64)
    assert_within_f16_products(got, want, terms, depth)


@pytest.mark.parametrize("requested, cpu_adapter, features, has_f16_shaders, chosen", [
    ("auto", False, {SHADER_F16}, True, "f16"),  # a GPU with the feature
    ("auto", False, set(), True, "gpu"),  # a GPU without it
    ("auto", True, {SHADER_F16}, True, "cpu"),  # lavapipe, SwiftShader: the CPU shaders first
    ("auto", False, {SHADER_F16}, False, "gpu"),  # nothing to compile in f16
    ("f16", False, set(), True, "gpu"),  # forced, without the feature: the f32 shaders
    ("f16", True, {SHADER_F16}, True, "f16"),  # forced on a CPU adapter that has it
    ("f16", False, {SHADER_F16}, False, "gpu"),
    ("gpu", False, {SHADER_F16}, True, "gpu"),
    ("cpu", False, {SHADER_F16}, True, "cpu"),
])
def test_choose_kernels(requested, cpu_adapter, features, has_f16_shaders, chosen) -> None:
    adapter = SimpleNamespace(info={"adapter_type": "CPU" if cpu_adapter else "DiscreteGPU", "device": "fake"},
                              features=features)
    assert choose_kernels(requested, adapter.info, adapter.features, has_f16_shaders=has_f16_shaders) == chosen


@pytest.mark.gpu
def test_the_python_runtime_runs_the_f16_shaders_within_the_f16_bound(f16_bundle: Path, monkeypatch) -> None:
    model = onnx.load(f16_bundle / "model.onnx")
    inputs = feeds()
    want = dict(zip(("y", "l", "z", "s"), onnxruntime_outputs(f16_bundle / "model.onnx", inputs)))
    assert SHADER_F16 in wgpu.gpu.request_adapter_sync().features  # lavapipe offers it
    compiled = []
    read = webgpu.kernel_source
    monkeypatch.setattr(webgpu, "kernel_source", lambda folder, file: compiled.append(file) or read(folder, file))
    session = load(f16_bundle / "bundle", kernels="f16")
    assert session.kernels == "f16" and SHADER_F16 in session.device.features
    manifest = session.manifest
    assert compiled == [k.get("f16_file", k["file"]) for k in manifest["kernels"]]
    got = session.run(inputs)
    terms = term_magnitudes(inputs, model)
    worst = {name: assert_within_f16_products(got[name], want[name], *terms[name]) for name in ("l", "z")}
    # y = relu(x @ w + b): the bound holds before the relu; relu and the bias only shrink the error
    worst["y"] = assert_within_f16_products(got["y"], want["y"], *terms["y"])
    assert_close(got["s"], want["s"], F32_LOOSE)  # not a matmul: its f32 shader
    assert max(worst.values()) > 0.01  # the f16 shaders ran (the f32 ones are ~1000x closer)
    assert load(f16_bundle / "bundle").kernels == "cpu"  # auto on lavapipe, a CPU adapter


@pytest.mark.gpu
def test_f16_on_a_device_without_the_feature_falls_back_to_f32(f16_bundle: Path) -> None:
    device = wgpu.gpu.request_adapter_sync().request_device_sync(required_features=[])
    assert SHADER_F16 not in device.features
    with pytest.warns(RuntimeWarning, match="does not offer shader-f16; compiling the f32 shaders"):
        session = load(f16_bundle / "bundle", device=device, kernels="f16")
    assert session.kernels == "gpu"
    inputs = feeds()
    want = dict(zip(("y", "l", "z", "s"), onnxruntime_outputs(f16_bundle / "model.onnx", inputs)))
    got = session.run(inputs)
    terms = term_magnitudes(inputs, onnx.load(f16_bundle / "model.onnx"))
    for name in ("y", "l", "z"):
        assert_within_f32_sums(got[name], want[name], *terms[name])
    assert_close(got["s"], want["s"], F32_LOOSE)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert load(f16_bundle / "bundle", device=device).kernels == "cpu"  # auto: no warning


F16_OR_NOT_IN_PAGE = """
async (inputs) => {
  const outcome = {};
  for (const kernels of ["auto", "f16"]) {
    const model = await window.relaxweb.load("/bundle/", { kernels });
    const feeds = {};
    for (const [name, value] of Object.entries(inputs)) feeds[name] = { data: new Float32Array(value.data), shape: value.shape };
    const outputs = await model.run(feeds);
    outcome[kernels] = { kernels: model.kernels, y: Array.from(outputs.y.data), l: Array.from(outputs.l.data),
                         z: Array.from(outputs.z.data) };
    model.dispose();
  }
  const adapter = await navigator.gpu.requestAdapter();
  outcome.hasF16 = adapter.features.has("shader-f16");
  return outcome;
}
"""


@pytest.mark.browser
@pytest.mark.skipif(importlib.util.find_spec("playwright") is None, reason="playwright is not installed")
def test_the_browser_runtime_falls_back_to_f32_on_swiftshader(f16_bundle: Path) -> None:
    """SwiftShader has no shader-f16: "auto" takes the CPU shaders, "f16" the f32 ones, and
    both match onnxruntime at f32's tolerance."""
    inputs = feeds()
    want = onnxruntime_outputs(f16_bundle / "model.onnx", inputs)
    terms = term_magnitudes(inputs, onnx.load(f16_bundle / "model.onnx"))
    arguments = {name: {"data": value.reshape(-1).tolist(), "shape": list(value.shape)} for name, value in inputs.items()}
    with open_runner_page(f16_bundle / "bundle") as page:
        outcome = page.evaluate(F16_OR_NOT_IN_PAGE, arguments)
    assert outcome["hasF16"] is False
    assert [outcome[k]["kernels"] for k in ("auto", "f16")] == ["cpu", "gpu"]
    for kernels in ("auto", "f16"):
        for index, name in enumerate(("y", "l", "z")):
            got = np.array(outcome[kernels][name], dtype=np.float32).reshape(want[index].shape)
            assert_within_f32_sums(got, want[index], *terms[name])


@pytest.mark.gpu
@pytest.mark.slow  # each model built and run at every test shape
@pytest.mark.parametrize("name", ["gpt2_legacy", "cnn_legacy"])
def test_models_with_f16_shaders_match_onnxruntime(tmp_path_factory, name: str) -> None:
    """The GPT-2-like and CNN test models (tests/model_exports.py) at every test shape, one build."""
    import onnxruntime as ort

    export = committed_exports([name])[name]
    folder = tmp_path_factory.mktemp(f"{name}_f16")
    build(str(export.path), str(folder))
    session = load(folder, kernels="f16")
    assert session.kernels == "f16"
    assert any("f16_file" in kernel for kernel in session.manifest["kernels"])
    reference = ort.InferenceSession(str(export.path), providers=["CPUExecutionProvider"])
    for dims in MODELS[name][1]:
        inputs = export_script().make_inputs(export.sidecar["inputs"], dims, seed=sum(dims.values()))
        actual = session.run(inputs)
        for output, want in zip(reference.get_outputs(), reference.run(None, inputs)):
            assert_close(actual[output.name], want, F16_MODEL, err_msg=f"{name} output {output.name} at {dims}")


@pytest.mark.gpu
@pytest.mark.parametrize("mask_dims", ["rows", "keys"])
def test_the_fused_attention_kernel_has_an_f16_shader(tmp_path, mask_dims: str) -> None:
    """Scores of f16 products summed in f32 are each off by at most d = 5u * scale * sum |q k|;
    the softmax turns that into weights off by a factor within exp(+-2d), and the weighted
    values (f16 products again) add 5u: each output within max |v| * (2d + 5u) of the exact
    one.  Rows masked out entirely stay NaN, as unfused.  Measured: 0.03 of the bound (the f32
    shader: 1e-5)."""
    model = attention_model("Div", mask_dims, transposed_keys=False)  # scores / 4
    onnx.save(model, tmp_path / "model.onnx")
    build(str(tmp_path / "model.onnx"), str(tmp_path / "bundle"))
    manifest = json.loads((tmp_path / "bundle" / "manifest.json").read_text())
    (attention,) = [k for k in manifest["kernels"] if k["name"].startswith("attention")]
    source = (tmp_path / "bundle" / attention["f16_file"]).read_text()
    assert source.startswith("enable f16;\n") and "var<workgroup> key_tile: array<vec4<f16>," in source
    session = load(tmp_path / "bundle", kernels="f16")
    worst = 0.0
    for index, (batch, seq) in enumerate(ATTENTION_SHAPES):
        feeds = attention_feeds(batch, seq, mask_dims, False, seed=10 * index)
        want = onnxruntime_outputs(model, feeds)[0].astype(np.float64)
        got = session.run(feeds)["out"].astype(np.float64)
        assert np.array_equal(np.isnan(got), np.isnan(want)), (batch, seq)
        q, k, v = (np.abs(feeds[name].astype(np.float64)) for name in ("q", "k", "v"))
        score_error = 5 * UNIT_ROUNDOFF_F16 * 0.25 * (q @ np.swapaxes(k, -1, -2)).max(axis=-1, keepdims=True)
        bound = v.max(axis=(-2, -1), keepdims=True) * (2 * score_error + 5 * UNIT_ROUNDOFF_F16) + 1e-6
        ratio = np.abs(got - want) / bound
        ratio = ratio[~np.isnan(ratio)]  # NaN rows compared above (seq 1 may have only one)
        assert ratio.max(initial=0.0) <= 1.0, f"batch {batch}, seq {seq}: {ratio.max():.2f} times the bound"
        worst = max(worst, float(ratio.max(initial=0.0)))
    assert worst > 0.001  # the f16 shader ran (the f32 one is ~3000x closer)


@pytest.mark.gpu
def test_the_causal_attention_kernel_with_scalar_words_in_f16(tmp_path) -> None:
    """Head sizes 6 and 3 (not multiples of 4: the kernel's words are scalars), causal, Sq < Sk."""
    s, t = SizeVar("s"), SizeVar("t")
    builder = FunctionBuilder("main")
    q, k, v = (builder.add_param(name, TensorStructInfo(shape, "float32"))
               for name, shape in (("q", (2, s, 6)), ("k", (2, t, 6)), ("v", (2, t, 3))))
    out = builder.emit_op("attention", q, k, v, scale=0.5, causal=True, name_hint="out", output=True)
    module = IRModule({"main": builder.finish([out], ["out"])})
    write_bundle(compile_module(module, {}), tmp_path / "bundle", "model")
    session = load(tmp_path / "bundle", kernels="f16")
    assert "f16_file" in session.manifest["kernels"][0] and session.kernels == "f16"
    feeds = {"q": rand(2, 5, 6, seed=1), "k": rand(2, 40, 6, seed=2), "v": rand(2, 40, 3, seed=3)}
    want = run_module(module, feeds)[0].astype(np.float64)
    got = session.run(feeds)["out"].astype(np.float64)
    q64, k64, v64 = (np.abs(feeds[name].astype(np.float64)) for name in ("q", "k", "v"))
    score_error = 5 * UNIT_ROUNDOFF_F16 * 0.5 * (q64 @ np.swapaxes(k64, -1, -2)).max(axis=-1, keepdims=True)
    bound = v64.max(axis=(-2, -1), keepdims=True) * (2 * score_error + 5 * UNIT_ROUNDOFF_F16) + 1e-6
    assert (np.abs(got - want) / bound).max() <= 1.0
