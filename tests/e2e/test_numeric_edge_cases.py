"""Numeric edge cases: what onnxruntime refuses or computes as NaN,
relaxweb refuses or computes as NaN too, on the GPU path as in the reference interpreter.

1. Sizes read from data (a Reshape or Expand whose target is a run-time tensor): checked at
   run time, one error naming the node and both values: ``InputShapeError`` from the Python
   runtime, exit 2 from the CLI (with and without ``--reference``), a rejected run in Chromium.
2. Indices the spec calls out of range: constant ones are refused at build naming the node
   (the GPU would clamp them); run-time ones are an error in the reference interpreter (the
   GPU clamps them: no run-time index check yet).
3. NaN: every float max / min of the WGSL backend propagates it (``wgsl/emit.float_extremum``),
   so Relu, Max, Min, Clip, HardSigmoid... match onnxruntime on NaN inputs, at opt level 0
   (one kernel per op) and 1 (fused, vectorized).  Max reductions, pools and ArgMax give NaN
   (its position) as numpy and the reference interpreter do; onnxruntime's CPU kernels are not
   consistent there (its ReduceMax of [1, NaN, -2, 3] is 1, of [-1, -5, 2, NaN] is 2), so
   those are compared with the interpreter.  Inside a recurrent layer onnxruntime maps NaN
   to 0 in Relu and HardSigmoid, and so does the persistent kernel.
4. A conv or pool window larger than its padded input: refused at build for constant shapes,
   a run-time check naming the node for symbolic ones.
"""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper, numpy_helper

import relaxweb
from relaxweb.errors import InputShapeError, RelaxwebError, RunCheckError
from tests.helpers import F32, in_the_browser, load_bundle, make_model, onnxruntime_outputs, rand

ROOT = Path(__file__).resolve().parents[2]

# The issue's example: x of 8 elements, a target [3, 5] from data.
RESHAPE_ERROR = "Reshape node 'reshape_node': the element count of the target shape is 15, expected 8"


def reshape_model() -> onnx.ModelProto:
    return make_model([helper.make_node("Reshape", ["x", "target"], ["y"], name="reshape_node")],
                      [("x", [8]), ("target", TensorProto.INT64, [2])], ["y"])


def reshape_feeds(target) -> dict[str, np.ndarray]:
    return {"x": np.arange(8, dtype=np.float32), "target": np.array(target, np.int64)}


@pytest.fixture(scope="module")
def reshape_bundle(tmp_path_factory) -> Path:
    folder = tmp_path_factory.mktemp("reshape") / "dist"
    relaxweb.build(reshape_model(), folder)
    return folder


# 1. Sizes read from data ---------------------------------------------------------------------


@pytest.mark.parametrize("target, error", [
    ([3, 5], RESHAPE_ERROR),
    ([3, -1], "Reshape node 'reshape_node': the element count of the target shape is 6, expected 8"),
    ([-2, -4], "Reshape node 'reshape_node': dimension 0 of the result is -2, must be >= 0"),
])
def test_a_reshape_target_from_data_is_checked(target, error: str, reshape_bundle: Path, device) -> None:
    session = relaxweb.load(reshape_bundle, device=device)
    for valid in ([2, 4], [4, -1], [0, 1]):  # 0 copies the input's dim (no allowzero)
        feeds = reshape_feeds(valid)
        np.testing.assert_array_equal(session.run(feeds)["y"], onnxruntime_outputs(reshape_model(), feeds)[0])
    with pytest.raises(InputShapeError) as on_gpu:
        session.run(reshape_feeds(target))
    assert str(on_gpu.value) == error
    with pytest.raises(InputShapeError) as in_reference:
        relaxweb.run_reference(reshape_model(), reshape_feeds(target))
    assert str(in_reference.value) == error
    with pytest.raises(Exception):  # onnxruntime refuses it too
        onnxruntime_outputs(reshape_model(), reshape_feeds(target))


def zero_reshape_models() -> dict[str, onnx.ModelProto]:
    """Reshape of an input of symbolic shape [a, b] to [0, -1] (0 copies a: the -1 is ambiguous
    when a is 0), with the target a constant or from data; and with allowzero, [a, b, -1, 4]
    from the input's shape (onnxruntime infers the -1 there even when a or b is 0)."""
    node = helper.make_node("Reshape", ["x", "target"], ["y"], name="reshape_node")
    allowzero = [helper.make_node("Shape", ["x"], ["dims"], start=0, end=2),
                 helper.make_node("Concat", ["dims", "tail"], ["target"], axis=0),
                 helper.make_node("Reshape", ["x", "target"], ["y"], name="reshape_node", allowzero=1)]
    return {"constant": make_model([node], [("x", ["a", "b"])], ["y"], {"target": np.array([0, -1], np.int64)}),
            "from data": make_model([node], [("x", ["a", "b"]), ("target", TensorProto.INT64, [2])], ["y"]),
            "allowzero": make_model(allowzero, [("x", ["a", "b", 8])], ["y"], {"tail": np.array([-1, 4], np.int64)},
                                    opset=19)}


@pytest.fixture(scope="module")
def zero_reshape_bundles(tmp_path_factory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("zero_reshape")
    return {kind: relaxweb.build(model, folder / kind.replace(" ", "_")).path
            for kind, model in zero_reshape_models().items()}


ZERO_RESHAPE_ERRORS = {
    "constant": "Reshape node 'reshape_node': the -1 of the target (dim 1): inferred only where the other target dims "
                "(a) are not 0, as in onnxruntime; min(1, a) of input 0 ('x') is 0, expected 1",
    "from data": "Reshape node 'reshape_node': dimension 1 of the result is -1, must be >= 0",
}


@pytest.mark.parametrize("kind", ["constant", "from data", "allowzero"])
def test_a_zero_element_reshape_with_an_ambiguous_minus_one_is_refused_as_in_onnxruntime(
        kind: str, backend, zero_reshape_bundles: dict[str, Path]) -> None:
    """[0, 4] -> [0, -1]: onnxruntime refuses (the other dims multiply to 0, any -1 fits); so does
    every relaxweb path, naming the node.  Where the -1 is not ambiguous, or allowzero makes
    onnxruntime infer it, the results match."""
    model = zero_reshape_models()[kind]
    session = load_bundle(zero_reshape_bundles[kind], backend)
    if kind == "allowzero":
        for shape in [(2, 3, 8), (2, 0, 8), (0, 3, 8)]:
            feeds = {"x": rand(*shape)}
            expected = onnxruntime_outputs(model, feeds)[0]
            for result in (session.run(feeds)["y"], relaxweb.run_reference(model, feeds)["y"]):
                np.testing.assert_array_equal(result, expected)
        return
    target = {"target": np.array([0, -1], np.int64)} if kind == "from data" else {}
    for shape in [(2, 4), (3, 0)]:
        feeds = {"x": rand(*shape), **target}
        np.testing.assert_array_equal(session.run(feeds)["y"], onnxruntime_outputs(model, feeds)[0])
    feeds = {"x": np.zeros((0, 4), np.float32), **target}
    with pytest.raises(Exception, match="cannot be reshaped"):
        onnxruntime_outputs(model, feeds)
    for run in (session.run, lambda feeds: relaxweb.run_reference(model, feeds)):
        with pytest.raises(InputShapeError) as refused:
            run(feeds)
        assert str(refused.value).startswith(ZERO_RESHAPE_ERRORS[kind])  # the interpreter adds " (1)"


def expand_model() -> onnx.ModelProto:
    return make_model([helper.make_node("Expand", ["x", "shape"], ["y"], name="expand_node")],
                      [("x", [3, 1]), ("shape", TensorProto.INT64, [3])], ["y"])


def test_an_expand_target_from_data_is_checked(device, tmp_path: Path) -> None:
    session = relaxweb.build(expand_model(), tmp_path / "dist").load(device=device)
    x = rand(3, 1)
    for valid in ([2, 3, 4], [2, 1, 4], [1, 3, 1]):
        feeds = {"x": x, "shape": np.array(valid, np.int64)}
        np.testing.assert_array_equal(session.run(feeds)["y"], onnxruntime_outputs(expand_model(), feeds)[0])
    invalid = {"x": x, "shape": np.array([2, 2, 4], np.int64)}
    error = "Expand node 'expand_node': entry 1 of the target shape (1 or the input's dim) is 2, expected 3"
    with pytest.raises(InputShapeError) as on_gpu:
        session.run(invalid)
    assert str(on_gpu.value) == error
    with pytest.raises(InputShapeError) as in_reference:
        relaxweb.run_reference(expand_model(), invalid)
    assert str(in_reference.value) == error


@pytest.mark.slow
def test_the_cli_exits_2_naming_the_node(reshape_bundle: Path, tmp_path: Path) -> None:
    onnx.save(reshape_model(), str(tmp_path / "model.onnx"))
    np.savez(tmp_path / "bad.npz", **reshape_feeds([3, 5]))
    for command in (["run", str(reshape_bundle)], ["run", str(tmp_path / "model.onnx"), "--reference"]):
        done = subprocess.run([sys.executable, "-m", "relaxweb", *command, "--inputs", str(tmp_path / "bad.npz")],
                              capture_output=True, text=True, timeout=300, cwd=ROOT)
        assert done.returncode == 2, done.stderr
        assert done.stderr.strip().splitlines() == [f"error: {RESHAPE_ERROR}"]


@in_the_browser
def test_the_browser_rejects_the_run(reshape_bundle: Path) -> None:
    feeds = reshape_feeds([2, 4])
    np.testing.assert_array_equal(relaxweb.run_in_browser(reshape_bundle, feeds)["y"],
                                  onnxruntime_outputs(reshape_model(), feeds)[0])
    with pytest.raises(InputShapeError) as caught:
        relaxweb.run_in_browser(reshape_bundle, reshape_feeds([3, 5]))
    assert str(caught.value) == RESHAPE_ERROR


def range_model() -> onnx.ModelProto:
    """Range(0, limit, 1) with the limit from data: its length is computed from floats."""
    return make_model([helper.make_node("Range", ["start", "limit", "delta"], ["y"], name="range_node")],
                      [("limit", [])], ["y"], [numpy_helper.from_array(np.array(0, np.float32), "start"),
                                               numpy_helper.from_array(np.array(1, np.float32), "delta")])


RANGE_ERROR = ("Range node 'range_node': the number of elements ceil((limit - start) / delta) (-1 where it is not a "
               "finite value: a NaN or infinite start, limit or delta, or a delta of 0) is -1, must be >= 0")


@pytest.fixture(scope="module")
def range_bundle(tmp_path_factory) -> Path:
    return relaxweb.build(range_model(), tmp_path_factory.mktemp("range") / "dist").path


def test_a_range_of_a_non_finite_length_fails_naming_the_node(range_bundle: Path, backend: str) -> None:
    """onnxruntime refuses a Range whose length is NaN or infinite; so do both backends, with
    the same message (the wasm backend returned an empty tensor for NaN, WebGPU named an
    internal variable), and the reference interpreter, which names the values."""
    session = load_bundle(range_bundle, backend)
    np.testing.assert_array_equal(session.run({"limit": np.array(3.5, np.float32)})["y"], [0, 1, 2, 3])
    assert session.run({"limit": np.array(-2.5, np.float32)})["y"].shape == (0,)  # a negative length: empty
    for limit in (np.nan, np.inf, -np.inf):
        feeds = {"limit": np.array(limit, np.float32)}
        with pytest.raises(InputShapeError) as caught:
            session.run(feeds)
        assert str(caught.value) == RANGE_ERROR
        with pytest.raises(InputShapeError, match=r"Range node 'range_node': the number of elements .* is not a "
                                                  rf"finite value \(start 0, limit {limit}, delta 1\)"):
            relaxweb.run_reference(range_model(), feeds)
        with pytest.raises(Exception, match="not a finite value"):
            onnxruntime_outputs(range_model(), feeds)


def int64_range_model() -> onnx.ModelProto:
    return make_model([helper.make_node("Range", ["start", "limit", "delta"], ["y"], name="range_node")],
                      [(name, TensorProto.INT64, []) for name in ("start", "limit", "delta")], [("y", TensorProto.INT64)])


def test_an_int64_range_counts_exactly(tmp_path: Path, backend: str) -> None:
    """An integer Range counts its elements in integers, not in float32 (where ``Range(2^30 + 1,
    2^30 + 4, 1)`` was empty on both backends); from ``2^40`` on, kernels.wasm answers exactly, and WebGPU
    refuses the inputs it cannot hold; a delta of 0 fails naming the node, as in onnxruntime."""
    session = load_bundle(relaxweb.build(int64_range_model(), tmp_path / "dist").path, backend)
    cases = [(2**30 + 1, 2**30 + 4, 1), (5, -3, -3), (7, 7, 1), (-7, 2**31 - 1, 2**30), (2**40, 2**40 + 5, 2)]
    for start, limit, delta in cases:
        feeds = {name: np.array(value, np.int64) for name, value in zip(("start", "limit", "delta"), (start, limit, delta))}
        if backend == "webgpu" and max(abs(start), abs(limit)) >= 2**31:
            with pytest.raises(InputShapeError, match="does not fit in int32"):
                session.run(feeds)
            continue
        if backend == "webgpu" and abs(limit - start) >= 2**31:  # the span leaves the int32 the GPU computes in
            with pytest.raises(RunCheckError, match="^node 'range_node' \\(Range\\): the int64 result does not fit"):
                session.run(feeds)
            continue
        np.testing.assert_array_equal(session.run(feeds)["y"], onnxruntime_outputs(int64_range_model(), feeds)[0],
                                      err_msg=str((start, limit, delta)))
    zero = {"start": np.array(0, np.int64), "limit": np.array(10, np.int64), "delta": np.array(0, np.int64)}
    with pytest.raises(InputShapeError, match=r"^Range node 'range_node': the number of elements .* is -1, must be >= 0$"):
        session.run(zero)


@pytest.mark.parametrize("op, feeds, error", [
    ("Tile", {"x": np.ones((2, 3), np.float32), "repeats": np.array([-2, 1], np.int64)},
     "Tile node 'node': dimension 0 of the result is -4, must be >= 0"),
    ("ConstantOfShape", {"shape": np.array([2, -3], np.int64)},
     "ConstantOfShape node 'node': dimension 1 of the result is -3, must be >= 0"),
])
def test_a_size_read_back_names_its_node(op: str, feeds: dict, error: str, backend: str, tmp_path: Path) -> None:
    """A size read back from data is checked naming the ONNX node (it named the internal
    variable: ``match_cast 'tile_d0_1': value is -4``)."""
    inputs = [(name, TensorProto.FLOAT if value.dtype == np.float32 else TensorProto.INT64, list(value.shape))
              for name, value in feeds.items()]
    model = make_model([helper.make_node(op, list(feeds), ["y"], name="node")], inputs, ["y"])
    session = load_bundle(relaxweb.build(model, tmp_path / "dist").path, backend)
    with pytest.raises(InputShapeError) as caught:
        session.run(feeds)
    assert str(caught.value) == error


@in_the_browser
def test_the_browser_refuses_a_range_of_a_non_finite_length(range_bundle: Path) -> None:
    for backend in ("webgpu", "wasm"):
        with pytest.raises(InputShapeError) as caught:
            relaxweb.run_in_browser(range_bundle, {"limit": np.array(np.nan, np.float32)}, backend=backend)
        assert str(caught.value) == RANGE_ERROR, backend


# 2. Indices out of range -----------------------------------------------------------------------


INDEX_CASES = {
    "Gather": ({"axis": 0}, [[1, 7]], [], "take: index 7 is out of range for dimension 0 of the data (extent 2: "
                                             "indices lie in [-2, 1])"),
    "GatherElements": ({"axis": 1}, [[0, 3], [1, -4]], [], "gather_elements: index 3 is out of range for dimension 1"),
    "GatherND": ({}, [[1, 2], [-3, 0]], [], "gather_nd: index -3 is out of range for dimension 0"),
    "ScatterElements": ({"axis": 0}, [[0, 5, 1]], [[1.0, 2.0, 3.0]],
                        "scatter_elements: index 5 is out of range for dimension 0"),
    "ScatterND": ({}, [[3]], [[1.0, 2.0, 3.0]], "scatter_nd: index 3 is out of range for dimension 0"),
}


@pytest.mark.parametrize("op", INDEX_CASES)
def test_constant_indices_out_of_range_are_refused_at_build(op: str, tmp_path: Path) -> None:
    attrs, indices, updates, error = INDEX_CASES[op]
    initializers = {"i": np.array(indices, np.int64)}
    inputs = ["x", "i"]
    if updates:
        initializers["u"] = np.array(updates, np.float32)
        inputs.append("u")
    model = make_model([helper.make_node(op, inputs, ["y"], name="the_node", **attrs)], [("x", [2, 3])], ["y"],
                       initializers)
    with pytest.raises(RelaxwebError) as at_build:
        relaxweb.build(model, tmp_path / "dist")
    assert str(at_build.value).startswith(f"{op} node 'the_node' (binding 'y'): {error}")
    with pytest.raises(RelaxwebError) as in_reference:
        relaxweb.run_reference(model, {"x": rand(2, 3)})
    assert str(in_reference.value) == str(at_build.value)


def test_run_time_indices_out_of_range_are_an_error_in_the_reference() -> None:
    model = make_model([helper.make_node("Gather", ["x", "i"], ["y"], name="gather_node")],
                       [("x", [4, 3]), ("i", TensorProto.INT64, [2])], ["y"])
    with pytest.raises(RunCheckError, match=r"^node 'gather_node' \(Gather\): index 9 is out of range for axis 0 of "
                                            r"extent 4$"):
        relaxweb.run_reference(model, {"x": rand(4, 3), "i": np.array([1, 9], np.int64)})


# 3. NaN --------------------------------------------------------------------------------------


NAN_INPUT = np.array([[1.0, np.nan, -2.0, 3.0], [np.nan, 0.0, 0.0, 0.0], [-1.0, -5.0, 2.0, np.nan],
                      [4.0, 5.0, 6.0, 7.0]], np.float32)
ZEROS = np.zeros((4, 4), np.float32)

# op -> (extra inputs as initializers, attributes): elementwise ops, where onnxruntime
# propagates NaN as IEEE 754 and numpy do.
ELEMENTWISE_NAN = {
    "Relu": ({}, {}),
    "Max": ({"z": ZEROS}, {}),
    "Min": ({"z": ZEROS}, {}),
    "Clip": ({"low": np.array(-1, np.float32), "high": np.array(1, np.float32)}, {}),
    "LeakyRelu": ({}, {}),
    "PRelu": ({"slope": np.full(4, 0.1, np.float32)}, {}),
    "HardSigmoid": ({}, {}),
    "HardSwish": ({}, {}),
    "Sign": ({}, {}),
    "Abs": ({}, {}),
    "Elu": ({}, {}),
    "Softplus": ({}, {}),
}


def nan_model(op: str, extra: dict, attrs: dict, *, first: bool = True) -> onnx.ModelProto:
    inputs = ["x", *extra] if first else [*extra, "x"]
    return make_model([helper.make_node(op, inputs, ["y"], **attrs)], [("x", [4, 4])], ["y"], extra)


@pytest.mark.parametrize("opt_level", [0, 1])
@pytest.mark.parametrize("op", ELEMENTWISE_NAN)
def test_nan_propagates_as_in_onnxruntime(backend, op: str, opt_level: int, tmp_path: Path) -> None:
    extra, attrs = ELEMENTWISE_NAN[op]
    for first in (True, False) if op in ("Max", "Min") else (True,):  # NaN on either side
        model = nan_model(op, extra, attrs, first=first)
        expected = onnxruntime_outputs(model, {"x": NAN_INPUT})[0]
        assert np.isnan(expected).sum() == 3  # the case does test NaN
        session = load_bundle(relaxweb.build(model, tmp_path / f"dist{first}", opt_level=opt_level).path, backend)
        np.testing.assert_allclose(session.run({"x": NAN_INPUT})["y"], expected, rtol=F32.rtol, atol=F32.atol,
                                   equal_nan=True, err_msg=op)


def reduce_model(op: str) -> onnx.ModelProto:
    nodes = [helper.make_node("Reshape", ["x", "shape"], ["image"])]
    attrs = {"ReduceMax": {"axes": [1]}, "ReduceMin": {"axes": [1]}, "ArgMax": {"axis": 1}, "ArgMin": {"axis": 1},
             "MaxPool": {"kernel_shape": [2, 2]}, "GlobalMaxPool": {}}[op]
    source = "image" if "Pool" in op else "x"
    nodes.append(helper.make_node(op, [source], ["y"], **attrs))
    output = ("y", TensorProto.INT64, None) if op.startswith("Arg") else "y"
    return make_model(nodes, [("x", [4, 4])], [output], {"shape": np.array([1, 1, 4, 4], np.int64)})


@pytest.mark.parametrize("opt_level", [0, 1])
@pytest.mark.parametrize("op", ["ReduceMax", "ReduceMin", "ArgMax", "ArgMin", "MaxPool", "GlobalMaxPool"])
def test_nan_in_max_reductions_as_numpy(op: str, opt_level: int, device, tmp_path: Path) -> None:
    model = reduce_model(op)
    expected = relaxweb.run_reference(model, {"x": NAN_INPUT})["y"]
    assert np.isnan(expected).any() if not op.startswith("Arg") else list(expected.reshape(-1)[:3]) == [1, 0, 3]
    session = relaxweb.build(model, tmp_path / "dist", opt_level=opt_level).load(device=device)
    np.testing.assert_array_equal(session.run({"x": NAN_INPUT})["y"], expected)


def test_the_issue_nan_example_matches_onnxruntime(backend, tmp_path: Path) -> None:
    """relu(x) and max(x, 0) of a NaN input: NaN, as onnxruntime (lavapipe's max(NaN, 0) is 0)."""
    model = make_model([helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Max", ["x", "z"], ["m"])],
                       [("x", [4])], ["r", "m"], {"z": np.zeros(4, np.float32)})
    x = np.array([np.nan, 1, -1, np.nan], np.float32)
    outputs = load_bundle(relaxweb.build(model, tmp_path / "dist").path, backend).run({"x": x})
    for actual, expected in zip(outputs.values(), onnxruntime_outputs(model, {"x": x})):
        np.testing.assert_array_equal(actual, expected)  # NaN equals NaN here


# 4. Windows larger than the input --------------------------------------------------------------


def window_model(op: str, height) -> onnx.ModelProto:
    if op == "Conv":
        return make_model([helper.make_node("Conv", ["x", "w"], ["y"], name="window_node")],
                          [("x", [1, 1, height, 3])], ["y"], {"w": rand(1, 1, 4, 3)})
    return make_model([helper.make_node(op, ["x"], ["y"], name="window_node", kernel_shape=[4, 3])],
                      [("x", [1, 1, height, 3])], ["y"])


@pytest.mark.parametrize("op", ["Conv", "MaxPool"])
def test_a_window_larger_than_a_constant_input_is_refused_at_build(op: str, tmp_path: Path) -> None:
    with pytest.raises(RelaxwebError, match=rf"^{op} node 'window_node' \(binding 'y'\): .*spatial dim 0 of the "
                                            r"result would be -?\d \(the window is larger than the padded input\)$"):
        relaxweb.build(window_model(op, 3 if op == "Conv" else 2), tmp_path / "dist")


@pytest.mark.parametrize("op, least", [("Conv", 1), ("MaxPool", 0)])
def test_a_window_larger_than_a_symbolic_input_is_checked_at_run_time(op: str, least: int, device,
                                                                      tmp_path: Path) -> None:
    model = window_model(op, "h")
    session = relaxweb.build(model, tmp_path / "dist").load(device=device)
    x = rand(1, 1, 6, 3)
    np.testing.assert_allclose(session.run({"x": x})["y"], onnxruntime_outputs(model, {"x": x})[0], rtol=1e-5,
                               atol=1e-5)
    error = (f"{op} node 'window_node': the result's extent along spatial dim 0 (the window must fit the padded "
             f"input) is -1, expected {least} (max({least}, h - 3)")
    small = {"x": rand(1, 1, 2, 3)}
    with pytest.raises(InputShapeError) as on_gpu:
        session.run(small)
    assert str(on_gpu.value).startswith(error)
    with pytest.raises(InputShapeError) as in_reference:
        relaxweb.run_reference(model, small)
    assert str(in_reference.value).startswith(error)


@pytest.mark.parametrize("clip", [None, 5.0])
@pytest.mark.parametrize("activation", ["Relu", "HardSigmoid", "Tanh", "Softplus", "LeakyRelu"])
def test_nan_through_a_recurrent_layer_as_onnxruntime(backend, activation: str, clip, tmp_path: Path) -> None:
    """onnxruntime's recurrent kernels map NaN to 0 in Relu and HardSigmoid (its elementwise
    ops propagate it) and keep it in the others; the persistent kernel and its numpy
    reference do the same, explicitly (WGSL's max, min and clamp of a NaN are unspecified)."""
    extra = {"clip": clip} if clip else {}
    model = make_model([helper.make_node("RNN", ["x", "w", "r"], ["y"], hidden_size=3, activations=[activation],
                                         **extra)], [("x", [2, 1, 2])], ["y"],
                       {"w": rand(1, 3, 2), "r": rand(1, 3, 3, seed=1)})
    x = rand(2, 1, 2, seed=2)
    x[0, 0, 1] = np.nan
    expected = onnxruntime_outputs(model, {"x": x})[0]
    assert np.isnan(expected).any() == (activation not in ("Relu", "HardSigmoid"))
    actual = load_bundle(relaxweb.build(model, tmp_path / "dist").path, backend).run({"x": x})["y"]
    np.testing.assert_allclose(actual, expected, rtol=F32.rtol, atol=F32.atol, equal_nan=True)
    np.testing.assert_allclose(relaxweb.run_reference(model, {"x": x})["y"], expected, rtol=F32.rtol, atol=F32.atol,
                               equal_nan=True)
