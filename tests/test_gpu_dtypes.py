"""int64 and bool tensors on the GPU (WGSL has neither 64-bit integers nor bool buffers).

On the device an int64 tensor is int32 and a bool tensor is uint32 0/1 (the manifest's
``device_dtype``); the runtimes convert inputs (with a range check for int64) and outputs.
Small ONNX models with symbolic dims, built with ``build_bundle`` and run with the Python
runtime (and two of them in headless Chromium), against onnxruntime.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from relaxweb.bundle import build_bundle
from relaxweb.errors import InputShapeError, UnsupportedModelError


def _save(tmp_path: Path, name: str, nodes, inputs, outputs, initializers=()) -> Path:
    graph = helper.make_graph(nodes, name, inputs, outputs, initializer=list(initializers))
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", 17)])
    model.ir_version = 8
    onnx.checker.check_model(model)
    path = tmp_path / f"{name}.onnx"
    onnx.save(model, str(path))
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


def run_session(bundle: Path, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    from relaxweb.runtime import Session

    return Session(bundle).run(inputs)


def check_against_onnxruntime(model: Path, bundle: Path, inputs: dict[str, np.ndarray], run=run_session) -> None:
    expected = onnxruntime_outputs(model, inputs)
    actual = run(bundle, inputs)
    assert set(actual) == set(expected)
    for name, value in expected.items():
        assert actual[name].dtype == value.dtype, name
        assert actual[name].shape == value.shape, name
        np.testing.assert_allclose(actual[name], value, rtol=1e-6, err_msg=name)


def logical_inputs(rows: int, seed: int) -> dict[str, np.ndarray]:
    rng = np.random.default_rng(seed)
    return {"p": rng.random((rows, 2)) < 0.5, "q": rng.random((rows, 2)) < 0.5}


# The manifest and the build ----------------------------------------------------------------


def test_manifest_gives_device_dtypes(tmp_path: Path) -> None:
    bundle = build(int64_add_model(tmp_path), tmp_path, {"batch": 8})
    manifest = json.loads((bundle / "manifest.json").read_text())
    assert [(i["dtype"], i["device_dtype"]) for i in manifest["inputs"]] == [("int64", "int32")]
    assert [(o["dtype"], o["device_dtype"]) for o in manifest["outputs"]] == [("int64", "int32")]
    (weight,) = manifest["weights"]
    assert (weight["dtype"], weight["device_dtype"], weight["nbytes"]) == ("int64", "int32", 12)
    data = (bundle / "weights" / "shard0.bin").read_bytes()[weight["offset"]:weight["offset"] + 12]
    np.testing.assert_array_equal(np.frombuffer(data, "<i4"), [1, -2, 1000])
    kernel = (bundle / manifest["kernels"][0]["file"]).read_text()
    assert "array<i32>" in kernel and "i64" not in kernel

    bundle = build(logical_model(tmp_path), tmp_path, {"n": 8})
    manifest = json.loads((bundle / "manifest.json").read_text())
    assert {(t["dtype"], t["device_dtype"]) for t in manifest["inputs"] + manifest["outputs"]} == {("bool", "uint32")}


def test_an_int64_weight_outside_int32_is_a_build_error(tmp_path: Path) -> None:
    model = int64_add_model(tmp_path, np.array([1, 2**40, 3], np.int64))
    with pytest.raises(UnsupportedModelError, match="weight 'offset'.*1099511627776"):
        build(model, tmp_path, {"batch": 8})


def test_float64_stays_unsupported(tmp_path: Path) -> None:
    nodes = [helper.make_node("Add", ["x", "x"], ["y"])]
    model = _save(tmp_path, "float64", nodes, [_info("x", TensorProto.DOUBLE, "n")], [_info("y", TensorProto.DOUBLE, "n")])
    with pytest.raises(UnsupportedModelError, match="float64"):
        build(model, tmp_path, {"n": 4})


# Runs with the Python runtime ----------------------------------------------------------------


def test_greater_where_has_a_bool_intermediate(device, tmp_path: Path) -> None:
    model = where_model(tmp_path)
    bundle = build(model, tmp_path, {"n": 16})
    for rows in (1, 5, 16):
        x = np.random.default_rng(rows).uniform(-4, 4, (rows, 3)).astype(np.float32)
        check_against_onnxruntime(model, bundle, {"x": x})


def test_int64_input_plus_int64_constant(device, tmp_path: Path) -> None:
    model = int64_add_model(tmp_path)
    bundle = build(model, tmp_path, {"batch": 8})
    for rows in (1, 3, 8):
        ids = np.random.default_rng(rows).integers(-2**30, 2**30, (rows, 3), dtype=np.int64)
        check_against_onnxruntime(model, bundle, {"ids": ids})
    edges = np.array([[-2**31 + 2, 2**31 - 1 - 1000 - 5, 2**31 - 1 - 1000]], np.int64)
    check_against_onnxruntime(model, bundle, {"ids": edges})


def test_equal_of_int64_then_not_then_cast(device, tmp_path: Path) -> None:
    model = equal_not_cast_model(tmp_path)
    bundle = build(model, tmp_path, {"n": 32})
    rng = np.random.default_rng(0)
    for length in (1, 7, 32):
        a = rng.integers(0, 3, length, dtype=np.int64)
        b = rng.integers(0, 3, length, dtype=np.int64)
        check_against_onnxruntime(model, bundle, {"a": a, "b": b})


def test_an_int64_input_outside_int32_is_rejected(device, tmp_path: Path) -> None:
    from relaxweb.runtime import Session

    session = Session(build(int64_add_model(tmp_path), tmp_path, {"batch": 8}))
    for value in (2**31, -2**31 - 1, 2**40):
        ids = np.zeros((2, 3), np.int64)
        ids[1, 2] = value
        with pytest.raises(InputShapeError, match=rf"input 'ids'.*{value}"):
            session.run({"ids": ids})
    # the session still works afterwards
    ids = np.arange(6, dtype=np.int64).reshape(2, 3)
    np.testing.assert_array_equal(session.run({"ids": ids})["y"], ids + [1, -2, 1000])


def test_bool_inputs_and_outputs(device, tmp_path: Path) -> None:
    model = logical_model(tmp_path)
    bundle = build(model, tmp_path, {"n": 16})
    for rows in (1, 4, 16):
        check_against_onnxruntime(model, bundle, logical_inputs(rows, rows))


# The same models in the browser ----------------------------------------------------------------


def _browser_test(function):
    """The marks of tests/test_browser.py: ``browser``, skipped without Playwright or Chromium."""
    from tests.test_browser import pytestmark

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


def test_casts_to_and_from_int64(device, tmp_path: Path) -> None:
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
    check_against_onnxruntime(model, bundle, {"x": x})
