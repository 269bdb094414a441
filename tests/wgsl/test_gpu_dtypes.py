"""int64 and bool tensors on the GPU (WGSL has neither 64-bit integers nor bool buffers), and
on kernels.wasm.

On the device an int64 tensor is int32 and a bool tensor is uint32 0/1 (the manifest's
``dtypes`` table); the runtimes convert inputs (with a range check for int64) and outputs.
Small ONNX models with symbolic dims, built with ``build_bundle`` and run with the Python
runtime on both backends (the ``backend`` fixture; and two of them in headless Chromium),
against onnxruntime.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from relaxweb.compiler import build_bundle
from relaxweb.errors import InputShapeError, RelaxwebError
from tests.helpers import FLOAT16, assert_close, load_bundle, make_model, rand


def _save(tmp_path: Path, name: str, nodes, inputs, outputs, initializers=()) -> Path:
    path = tmp_path / f"{name}.onnx"
    onnx.save(make_model(nodes, inputs, outputs, initializers, check=True, name=name), str(path))
    return path


def _info(name: str, dtype: int, *dims) -> onnx.ValueInfoProto:
    return helper.make_tensor_value_info(name, dtype, list(dims))


def where_model(tmp_path: Path) -> Path:
    """y = where(x > 0, x, 2 * x): a bool intermediate between float32 tensors."""
    two = numpy_helper.from_array(np.array(2.0, np.float32), "two")
    zero = numpy_helper.from_array(np.array(0.0, np.float32), "zero")
    nodes = [
        helper.make_node("Greater", ["x", "zero"], ["positive"]),
        helper.make_node("Mul", ["x", "two"], ["doubled"]),
        helper.make_node("Where", ["positive", "x", "doubled"], ["y"]),
    ]
    return _save(tmp_path, "where", nodes, [_info("x", TensorProto.FLOAT, "n", 3)],
                 [_info("y", TensorProto.FLOAT, "n", 3)], [two, zero])


def int64_add_model(tmp_path: Path, offset: np.ndarray | None = None) -> Path:
    """y = ids + offset, all int64."""
    if offset is None:
        offset = np.array([1, -2, 1000], np.int64)
    constant = numpy_helper.from_array(offset, "offset")
    nodes = [helper.make_node("Add", ["ids", "offset"], ["y"])]
    return _save(tmp_path, "int64_add", nodes, [_info("ids", TensorProto.INT64, "batch", 3)],
                 [_info("y", TensorProto.INT64, "batch", 3)], [constant])


def equal_not_cast_model(tmp_path: Path) -> Path:
    """y = float(not (a == b)) for int64 a, b."""
    nodes = [
        helper.make_node("Equal", ["a", "b"], ["same"]),
        helper.make_node("Not", ["same"], ["different"]),
        helper.make_node("Cast", ["different"], ["y"], to=TensorProto.FLOAT),
    ]
    return _save(tmp_path, "equal_not_cast", nodes,
                 [_info("a", TensorProto.INT64, "n"), _info("b", TensorProto.INT64, "n")],
                 [_info("y", TensorProto.FLOAT, "n")])


def logical_model(tmp_path: Path) -> Path:
    """y = (p and q) or not p; z = p or q, on bool tensors."""
    nodes = [
        helper.make_node("And", ["p", "q"], ["both"]),
        helper.make_node("Not", ["p"], ["not_p"]),
        helper.make_node("Or", ["both", "not_p"], ["y"]),
        helper.make_node("Or", ["p", "q"], ["z"]),
    ]
    return _save(tmp_path, "logical", nodes,
                 [_info("p", TensorProto.BOOL, "n", 2), _info("q", TensorProto.BOOL, "n", 2)],
                 [_info("y", TensorProto.BOOL, "n", 2), _info("z", TensorProto.BOOL, "n", 2)])


def onnxruntime_outputs(model: Path, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    session = ort.InferenceSession(str(model), providers=["CPUExecutionProvider"])
    names = [o.name for o in session.get_outputs()]
    return dict(zip(names, session.run(names, inputs)))


def build(model: Path, tmp_path: Path, bounds: dict[str, int]) -> Path:
    out = tmp_path / f"{model.stem}_bundle"
    build_bundle(model, out, bounds)
    return out


def run_session(backend: str):
    """The Python runtime on ``backend`` (the ``backend`` fixture) as the checks' ``run``."""
    return lambda bundle, inputs: load_bundle(bundle, backend).run(inputs)


def check_against_onnxruntime(model: Path, bundle: Path, inputs: dict[str, np.ndarray], run) -> None:
    expected = onnxruntime_outputs(model, inputs)
    actual = run(bundle, inputs)
    assert set(actual) == set(expected)
    for name, value in expected.items():
        assert actual[name].dtype == value.dtype, name
        assert actual[name].shape == value.shape, name
        assert_close(actual[name], value, err_msg=name)


def logical_inputs(rows: int, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {"p": rng.random((rows, 2)) < 0.5, "q": rng.random((rows, 2)) < 0.5}


# The manifest and the build ----------------------------------------------------------------


def device_dtype(manifest: dict, tensor: dict) -> str:
    """The device dtype of a manifest's input, output or weight, from its dtypes table."""
    return manifest["dtypes"][tensor["dtype"]]["device_dtype"]


def test_manifest_gives_device_dtypes(tmp_path: Path) -> None:
    bundle = build(int64_add_model(tmp_path), tmp_path, {"batch": 8})
    manifest = json.loads((bundle / "manifest.json").read_text())
    assert manifest["dtypes"] == {"int64": {"bytes": 8, "kind": "int", "device_dtype": "int32", "device_bytes": 4,
                                           "wasm_dtype": "int64", "wasm_bytes": 8}}
    assert [(i["dtype"], device_dtype(manifest, i)) for i in manifest["inputs"]] == [("int64", "int32")]
    assert [(o["dtype"], device_dtype(manifest, o)) for o in manifest["outputs"]] == [("int64", "int32")]
    (weight,) = manifest["weights"]
    # the shard holds the wasm form (int64, 8 bytes an element); WebGPU narrows it at upload
    assert (weight["dtype"], device_dtype(manifest, weight), weight["nbytes"]) == ("int64", "int32", 24)
    data = (bundle / "weights" / "shard0.bin").read_bytes()[weight["offset"]:weight["offset"] + 24]
    np.testing.assert_array_equal(np.frombuffer(data, "<i8"), [1, -2, 1000])
    kernel = (bundle / manifest["kernels"][0]["file"]).read_text()
    assert "array<i32>" in kernel and "i64" not in kernel

    bundle = build(logical_model(tmp_path), tmp_path, {"n": 8})
    manifest = json.loads((bundle / "manifest.json").read_text())
    assert {(t["dtype"], device_dtype(manifest, t)) for t in manifest["inputs"] + manifest["outputs"]} == {("bool", "uint32")}
    assert manifest["dtypes"] == {"bool": {"bytes": 1, "kind": "bool", "device_dtype": "uint32", "device_bytes": 4,
                                          "wasm_dtype": "uint32", "wasm_bytes": 4}}


def test_an_int64_weight_outside_int32_runs_on_wasm_only(tmp_path: Path) -> None:
    """The build writes why WebGPU cannot hold it (webgpu.unavailable); kernels.wasm runs it."""
    model = int64_add_model(tmp_path, np.array([1, 2**40, 3], np.int64))
    bundle = build(model, tmp_path, {"batch": 8})
    manifest = json.loads((bundle / "manifest.json").read_text())
    assert manifest["webgpu"] == {"unavailable": "weight 'offset' (int64) holds 1099511627776, outside the int32 "
                                                 "range the GPU holds int64 tensors in"}
    ids = np.array([[2**40, 0, -5]], np.int64)
    np.testing.assert_array_equal(load_bundle(bundle, "wasm").run({"ids": ids})["y"], ids + [1, 2**40, 3])
    with pytest.raises(RelaxwebError, match=r"^WebGPU cannot run this bundle: weight 'offset' \(int64\) holds "
                                            r"1099511627776, .*; load it with backend=\"wasm\"$"):
        load_bundle(bundle, "webgpu")


def test_a_damaged_bundle_with_an_int64_weight_outside_int32_is_refused_on_webgpu(device, tmp_path: Path) -> None:
    """A manifest that does not say webgpu.unavailable but a shard holding an int64 weight
    outside int32 (its sha256 matching): WebGPU's narrowing names the weight."""
    bundle = build(int64_add_model(tmp_path, np.array([1, 2**40, 3], np.int64)), tmp_path, {"batch": 8})
    manifest = json.loads((bundle / "manifest.json").read_text())
    del manifest["webgpu"]
    (bundle / "manifest.json").write_text(json.dumps(manifest))
    with pytest.raises(RelaxwebError, match=r"^weight 'offset' \(int64\) holds 1099511627776, outside the int32 range "
                                            r"the GPU holds int64 tensors in, .*the bundle is damaged$"):
        load_bundle(bundle, "webgpu", device=device)


def boundary_model(tmp_path: Path) -> Path:
    """float64, float16 and uint8 in and out: d = x64 + w64 (a float64 weight), h = h16 * h16,
    s = a8 + b8 (wraps), c = int8(i32) and u = uint16(i32) (wrap), f = float16(x32)."""
    w = numpy_helper.from_array(np.array([0.1, -2.5, 1e-3], np.float64), "w")
    nodes = [
        helper.make_node("Add", ["x64", "w"], ["d"]),
        helper.make_node("Mul", ["h16", "h16"], ["h"]),
        helper.make_node("Add", ["a8", "b8"], ["s"]),
        helper.make_node("Cast", ["i32"], ["c"], to=TensorProto.INT8),
        helper.make_node("Cast", ["i32"], ["u"], to=TensorProto.UINT16),
        helper.make_node("Cast", ["x32"], ["f"], to=TensorProto.FLOAT16),
    ]
    inputs = [
        _info("x64", TensorProto.DOUBLE, "n", 3), _info("h16", TensorProto.FLOAT16, "n"),
        _info("a8", TensorProto.UINT8, "n"), _info("b8", TensorProto.UINT8, "n"),
        _info("i32", TensorProto.INT32, "n"), _info("x32", TensorProto.FLOAT, "n"),
    ]
    outputs = [
        _info("d", TensorProto.DOUBLE, "n", 3), _info("h", TensorProto.FLOAT16, "n"),
        _info("s", TensorProto.UINT8, "n"), _info("c", TensorProto.INT8, "n"),
        _info("u", TensorProto.UINT16, "n"), _info("f", TensorProto.FLOAT16, "n"),
    ]
    return _save(tmp_path, "boundary", nodes, inputs, outputs, [w])


def boundary_inputs(n: int, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {
        "x64": rng.uniform(-10, 10, (n, 3)),
        "h16": rng.uniform(-8, 8, n).astype(np.float16),
        "a8": rng.integers(0, 256, n, dtype=np.uint8),
        "b8": rng.integers(0, 256, n, dtype=np.uint8),
        "i32": rng.integers(-70000, 70000, n, dtype=np.int32),
        "x32": rng.uniform(-1000, 1000, n).astype(np.float32),
    }


def check_boundary(model: Path, bundle: Path, inputs: dict[str, np.ndarray], run) -> None:
    """Outputs in the model's dtypes: exact for the ints, float64 as float32 on the device
    (float32 rounding), float16 products computed in float32 and rounded once (within half an ulp of
    float16 of ONNX Runtime's)."""
    expected = onnxruntime_outputs(model, inputs)
    actual = run(bundle, inputs)
    for name, value in expected.items():
        assert actual[name].dtype == value.dtype, name
        assert actual[name].shape == value.shape, name
    assert_close(actual["d"], expected["d"])
    assert_close(actual["h"].astype(np.float32), expected["h"].astype(np.float32), FLOAT16)
    for name in ("s", "c", "u", "f"):
        np.testing.assert_array_equal(actual[name], expected[name], err_msg=name)


def test_manifest_gives_device_dtypes_of_narrow_and_wide_dtypes(tmp_path: Path) -> None:
    bundle = build(boundary_model(tmp_path), tmp_path, {"n": 16})
    manifest = json.loads((bundle / "manifest.json").read_text())
    pairs = {t["name"]: (t["dtype"], device_dtype(manifest, t)) for t in manifest["inputs"] + manifest["outputs"]}
    assert pairs == {
        "x64": ("float64", "float32"), "h16": ("float16", "float32"), "a8": ("uint8", "uint32"),
        "b8": ("uint8", "uint32"), "i32": ("int32", "int32"), "x32": ("float32", "float32"),
        "d": ("float64", "float32"), "h": ("float16", "float32"), "s": ("uint8", "uint32"),
        "c": ("int8", "int32"), "u": ("uint16", "uint32"), "f": ("float16", "float32"),
    }
    (weight,) = manifest["weights"]
    assert (weight["dtype"], device_dtype(manifest, weight), weight["nbytes"]) == ("float64", "float32", 12)
    data = (bundle / "weights" / "shard0.bin").read_bytes()[weight["offset"]:weight["offset"] + 12]
    np.testing.assert_array_equal(np.frombuffer(data, "<f4"), np.array([0.1, -2.5, 1e-3], np.float32))
    kernels = "".join((bundle / k["file"]).read_text() for k in manifest["kernels"])
    assert "f64" not in kernels and "f16" not in kernels and "extractBits" in kernels


# Runs with the Python runtime ----------------------------------------------------------------


def test_greater_where_has_a_bool_intermediate(backend, tmp_path: Path) -> None:
    model = where_model(tmp_path)
    bundle = build(model, tmp_path, {"n": 16})
    for rows in (1, 5, 16):
        x = rand(rows, 3, seed=rows, low=-4, high=4)
        check_against_onnxruntime(model, bundle, {"x": x}, run_session(backend))


def test_int64_input_plus_int64_constant(backend, tmp_path: Path) -> None:
    model = int64_add_model(tmp_path)
    bundle = build(model, tmp_path, {"batch": 8})
    for rows in (1, 3, 8):
        ids = rand(rows, 3, seed=rows, low=-2**30, high=2**30, dtype=np.int64)
        check_against_onnxruntime(model, bundle, {"ids": ids}, run_session(backend))
    edges = np.array([[-2**31 + 2, 2**31 - 1 - 1000 - 5, 2**31 - 1 - 1000]], np.int64)
    check_against_onnxruntime(model, bundle, {"ids": edges}, run_session(backend))


def test_equal_of_int64_then_not_then_cast(backend, tmp_path: Path) -> None:
    model = equal_not_cast_model(tmp_path)
    bundle = build(model, tmp_path, {"n": 32})
    rng = np.random.default_rng(0)
    for length in (1, 7, 32):
        a = rng.integers(0, 3, length, dtype=np.int64)
        b = rng.integers(0, 3, length, dtype=np.int64)
        check_against_onnxruntime(model, bundle, {"a": a, "b": b}, run_session(backend))


def test_an_int64_input_outside_int32_is_rejected_on_webgpu(backend, tmp_path: Path) -> None:
    """WebGPU refuses it, naming the input; kernels.wasm holds int64 and answers exactly."""
    session = load_bundle(build(int64_add_model(tmp_path), tmp_path, {"batch": 8}), backend)
    for value in (2**31, -2**31 - 1, 2**40):
        ids = np.zeros((2, 3), np.int64)
        ids[1, 2] = value
        if backend == "wasm":
            np.testing.assert_array_equal(session.run({"ids": ids})["y"], ids + [1, -2, 1000])
            continue
        with pytest.raises(InputShapeError, match=rf"input 'ids'.*{value}"):
            session.run({"ids": ids})
    # the session still works afterwards
    ids = np.arange(6, dtype=np.int64).reshape(2, 3)
    np.testing.assert_array_equal(session.run({"ids": ids})["y"], ids + [1, -2, 1000])


def test_bool_inputs_and_outputs(backend, tmp_path: Path) -> None:
    model = logical_model(tmp_path)
    bundle = build(model, tmp_path, {"n": 16})
    for rows in (1, 4, 16):
        check_against_onnxruntime(model, bundle, logical_inputs(rows, rows), run_session(backend))


# The same models in the browser ----------------------------------------------------------------


def _browser_test(function):
    """The marks of tests/runtime_js/test_browser.py: ``browser``, skipped without Playwright or Chromium."""
    from tests.runtime_js.test_browser import pytestmark

    for mark in pytestmark:
        function = mark(function)
    return function


@_browser_test
@pytest.mark.parametrize("which", ["int64_add", "logical"])
def test_int64_and_bool_in_the_browser(which: str, tmp_path: Path) -> None:
    from relaxweb.browser import run_in_browser

    if which == "int64_add":
        model = int64_add_model(tmp_path)
        bundle = build(model, tmp_path, {"batch": 8})
        inputs = {"ids": np.array([[5, -7, 2**31 - 1001], [0, 1, -2**31 + 2]], np.int64)}
    else:
        model = logical_model(tmp_path)
        bundle = build(model, tmp_path, {"n": 16})
        inputs = logical_inputs(5, 3)
    check_against_onnxruntime(model, bundle, inputs, run=run_in_browser)


def test_casts_to_and_from_int64(backend, tmp_path: Path) -> None:
    """y = int64(x) (truncation toward zero), z = float(int64(x) > 1), w = int64(x > 0)."""
    one = numpy_helper.from_array(np.array(1, np.int64), "one")
    zero = numpy_helper.from_array(np.array(0.0, np.float32), "zero")
    nodes = [
        helper.make_node("Cast", ["x"], ["y"], to=TensorProto.INT64),
        helper.make_node("Greater", ["y", "one"], ["big"]),
        helper.make_node("Cast", ["big"], ["z"], to=TensorProto.FLOAT),
        helper.make_node("Greater", ["x", "zero"], ["positive"]),
        helper.make_node("Cast", ["positive"], ["w"], to=TensorProto.INT64),
    ]
    model = _save(tmp_path, "casts", nodes, [_info("x", TensorProto.FLOAT, "n")],
                  [_info("y", TensorProto.INT64, "n"), _info("z", TensorProto.FLOAT, "n"),
                   _info("w", TensorProto.INT64, "n")], [one, zero])
    bundle = build(model, tmp_path, {"n": 16})
    x = np.array([-3.7, -0.5, 0.0, 0.5, 1.0, 1.9, 2.0, 1000.25], np.float32)
    check_against_onnxruntime(model, bundle, {"x": x}, run_session(backend))


def test_float64_float16_and_narrow_ints_at_the_boundary(backend, tmp_path: Path) -> None:
    model = boundary_model(tmp_path)
    bundle = build(model, tmp_path, {"n": 16})
    for n in (1, 7, 16):
        check_boundary(model, bundle, boundary_inputs(n, n), run_session(backend))
    edge = boundary_inputs(6, 0)
    edge["a8"] = np.array([255, 250, 0, 128, 1, 200], np.uint8)
    edge["b8"] = np.array([1, 10, 0, 128, 254, 200], np.uint8)
    edge["i32"] = np.array([127, 128, -129, 255, -65536, 65535], np.int32)
    edge["x32"] = np.array([0.1, 1 / 3, 65504, -2.0, 6e-5, 1e-8], np.float32)
    check_boundary(model, bundle, edge, run_session(backend))


@pytest.mark.parametrize("columns", [5, 200])  # a serial loop; a workgroup reduction (>= 128)
def test_max_and_min_of_narrow_ints_start_from_their_own_extremes(backend, tmp_path: Path, columns: int) -> None:
    """ReduceMax of int8 rows that are all negative, ReduceMin of uint8 rows that are all
    positive: the reductions start from -128 and 255 (the dtype table says how wide each
    dtype is), not from 0."""
    nodes = [helper.make_node("ReduceMax", ["a"], ["largest"], axes=[1], keepdims=0),
             helper.make_node("ReduceMin", ["b"], ["smallest"], axes=[1], keepdims=0)]
    model = _save(tmp_path, f"narrow_reductions{columns}", nodes,
                  [_info("a", TensorProto.INT8, "n", columns), _info("b", TensorProto.UINT8, "n", columns)],
                  [_info("largest", TensorProto.INT8, "n"), _info("smallest", TensorProto.UINT8, "n")])
    bundle = build(model, tmp_path, {"n": 4})
    rng = np.random.default_rng(columns)
    a = rng.integers(-128, 0, (3, columns), dtype=np.int8)
    b = rng.integers(1, 256, (3, columns), dtype=np.uint8)
    outputs = run_session(backend)(bundle, {"a": a, "b": b})
    np.testing.assert_array_equal(outputs["largest"], a.max(axis=1))
    np.testing.assert_array_equal(outputs["smallest"], b.min(axis=1))


@pytest.mark.parametrize(("to", "dtype"), [
    (TensorProto.INT8, np.int8), (TensorProto.UINT8, np.uint8),
    (TensorProto.INT16, np.int16), (TensorProto.UINT16, np.uint16),
])
def test_casts_from_float_to_narrow_ints_truncate(backend, tmp_path: Path, to: int, dtype) -> None:
    """In-range float values truncate toward zero, like ONNX Runtime (out of range is
    undefined in ONNX); a cast back to float32 reads the narrow value."""
    nodes = [helper.make_node("Cast", ["x"], ["y"], to=to), helper.make_node("Cast", ["y"], ["z"], to=TensorProto.FLOAT)]
    model = _save(tmp_path, f"cast{to}", nodes, [_info("x", TensorProto.FLOAT, "n")],
                  [_info("y", to, "n"), _info("z", TensorProto.FLOAT, "n")])
    bundle = build(model, tmp_path, {"n": 16})
    info = np.iinfo(dtype)
    x = np.array([0.0, 0.9, -0.9, 1.5, info.max - 0.5, info.min + 0.5, 7.99, info.max, info.min], np.float32)
    check_against_onnxruntime(model, bundle, {"x": x}, run_session(backend))


@_browser_test
def test_float64_float16_and_narrow_ints_in_the_browser(tmp_path: Path) -> None:
    """float16 data crosses to the page as Uint16Array half bits, which the runtime takes for a
    float16 input and gives for a float16 output (relaxweb.browser converts both ways)."""
    from relaxweb.browser import run_in_browser

    model = boundary_model(tmp_path)
    bundle = build(model, tmp_path, {"n": 16})

    def run(bundle: Path, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
        outputs = run_in_browser(bundle, inputs)
        for name in ("h", "f"):
            assert outputs[name].dtype == np.float16
        return outputs

    inputs = boundary_inputs(6, 0)
    inputs["a8"] = np.array([255, 250, 0, 128, 1, 200], np.uint8)
    inputs["i32"] = np.array([127, 128, -129, 255, -65536, 65535], np.int32)
    check_boundary(model, bundle, inputs, run=run)


#: Runs in the runner page: ``5 * i`` (tests/e2e/test_integer_arithmetic.py) on each backend,
#: with ``i = 2^30`` (the product does not fit the int32 the GPU holds), small values, then
#: ``i = 2^40`` (an input the GPU cannot hold).
TIMES_FIVE_IN_PAGE = """
async () => {
  const results = {};
  for (const backend of ["webgpu", "wasm"]) {
    const model = await window.relaxweb.load("/bundle/", { backend });
    const outcome = [model.backend];
    for (const values of [[3, 2 ** 30], [3, -4], [3, 2 ** 40]]) {
      try {
        const { y } = await model.run({ x: { data: BigInt64Array.from(values.map(BigInt)), shape: [2] } });
        outcome.push(Array.from(y.data, Number));
      } catch (error) {
        outcome.push(`${error.name}: ${error.message}`, error instanceof window.relaxweb.RunCheckError);
      }
    }
    model.dispose();
    results[backend] = outcome;
  }
  return results;
}
"""


@_browser_test
def test_an_int64_result_outside_int32_fails_the_run_in_the_browser(tmp_path: Path) -> None:
    """On WebGPU the kernel finds that ``5 * 2^30`` does not fit and the run is rejected naming
    the node (issue 29), and ``2^40`` is refused as an input; kernels.wasm computes int64 exactly
    and answers both; in one page, small values still answer on both: never a wrapped value."""
    from relaxweb.browser import open_runner_page
    from tests.e2e.test_integer_arithmetic import ISSUE_CASES

    case = ISSUE_CASES["5_times_i"]
    build_bundle(case.model(), tmp_path / "bundle")
    with open_runner_page(tmp_path / "bundle", webgpu=True) as page:
        results = page.evaluate(TIMES_FIVE_IN_PAGE)
    assert results["webgpu"][:4] == ["webgpu", f"RunCheckError: {case.error}", True, [15, -20]], results
    refused, is_check = results["webgpu"][4:]
    assert "input 'x'" in refused and "1099511627776" in refused and not is_check, results
    assert results["wasm"] == ["wasm", [15, 5 * 2**30], [15, -20], [15, 5 * 2**40]], results
