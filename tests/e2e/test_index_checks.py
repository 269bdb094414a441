"""Indices from data are checked at run time (issue 29; docs/design.md, "Errors found by
kernels"): a Gather, GatherElements, GatherND, ScatterElements or ScatterND whose run-time index
lies outside its axis fails the run with one error naming the node, the index and the extent,
on WebGPU and on kernels.wasm (Python here; Chromium in tests/runtime_js/test_wasm_browser.py),
from the CLI (one ``error:`` line, exit 2) and in the reference interpreter alike, where it
used to answer with the nearest row (or drop a scatter's update).  Negative indices keep their
ONNX meaning; a valid index costs nothing but the check.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper

import relaxweb
from relaxweb.cli import main as cli_main
from relaxweb.errors import RunCheckError
from tests.helpers import build_once, load_bundle, make_model

X = np.arange(12, dtype=np.float32).reshape(4, 3)


def gather_model():
    """``y = Gather(x[4, 3], i[2])``, the issue's case."""
    return make_model([helper.make_node("Gather", ["x", "i"], ["y"], name="Gather_3", axis=0)],
                      [("x", [4, 3]), ("i", TensorProto.INT64, [2])], ["y"])


def embedding_model():
    """A token-id embedding of 1000 rows (a constant table): ``ids`` past the vocabulary."""
    table = np.random.default_rng(0).standard_normal((1000, 8)).astype(np.float32)
    return make_model([helper.make_node("Gather", ["table", "ids"], ["embedded"], name="embed_tokens")],
                      [("ids", TensorProto.INT64, [1, 3])], ["embedded"], {"table": table})


def scatter_models():
    """ScatterND into data[4, 3] at index tuples [[k]], ScatterElements along axis 1."""
    nd = make_model([helper.make_node("ScatterND", ["data", "k", "rows"], ["out"], name="scatter_rows")],
                    [("data", [4, 3]), ("k", TensorProto.INT64, [1, 1]), ("rows", [1, 3])], ["out"])
    elements = make_model(
        [helper.make_node("ScatterElements", ["data", "k", "values"], ["out"], name="scatter_cells", axis=1)],
        [("data", [4, 3]), ("k", TensorProto.INT64, [4, 1]), ("values", [4, 1])], ["out"])
    return nd, elements


@pytest.fixture(scope="module")
def gather_bundle(tmp_path_factory) -> Path:
    return build_once(gather_model(), tmp_path_factory.mktemp("gather") / "bundle")


def test_a_gather_past_its_axis_fails_naming_the_node(gather_bundle: Path, backend: str) -> None:
    session = load_bundle(gather_bundle, backend)
    with pytest.raises(RunCheckError, match=r"^node 'Gather_3' \(Gather\): index 7 is out of range for axis 0 of "
                                            r"extent 4$"):
        session.run({"x": X, "i": np.array([1, 7], np.int64)})
    with pytest.raises(RunCheckError, match=r"index -5 is out of range for axis 0 of extent 4$"):
        session.run({"x": X, "i": np.array([-5, 0], np.int64)})
    # negative indices count from the end; the run after an error is clean
    np.testing.assert_array_equal(session.run({"x": X, "i": np.array([1, -1], np.int64)})["y"], X[[1, 3]])
    np.testing.assert_array_equal(session.run({"x": X, "i": np.array([-4, 3], np.int64)})["y"], X[[0, 3]])


def test_an_int64_index_beyond_int32_is_never_wrapped(gather_bundle: Path, backend: str) -> None:
    """``2^32 + 1`` is not index 1: kernels.wasm checks an int64 index as it is (the error shows
    it saturated into int32, the status holding 32-bit words); WebGPU refuses the input."""
    session = load_bundle(gather_bundle, backend)
    for index in (2**32 + 1, -2**32 + 1, 2**40):
        if backend == "wasm":
            bound = 2**31 - 1 if index > 0 else -2**31
            with pytest.raises(RunCheckError, match=rf"^node 'Gather_3' \(Gather\): index {bound} is out of range for "
                                                    r"axis 0 of extent 4$"):
                session.run({"x": X, "i": np.array([0, index], np.int64)})
        else:
            with pytest.raises(relaxweb.RelaxwebError, match=rf"^input 'i': value {index} at index \[1\] does not fit"):
                session.run({"x": X, "i": np.array([0, index], np.int64)})
    np.testing.assert_array_equal(session.run({"x": X, "i": np.array([3, 0], np.int64)})["y"], X[[3, 0]])


def test_the_cli_and_the_reference_say_the_same(gather_bundle: Path, tmp_path: Path, capsys) -> None:
    np.savez(tmp_path / "in.npz", x=X, i=np.array([1, 7], np.int64))
    line = "error: node 'Gather_3' (Gather): index 7 is out of range for axis 0 of extent 4\n"
    for extra in (["--backend", "wasm"], []):
        capsys.readouterr()
        assert cli_main(["run", str(gather_bundle), "--inputs", str(tmp_path / "in.npz"), *extra]) == 2
        assert capsys.readouterr().err.endswith(line)
    with pytest.raises(RunCheckError) as in_reference:
        relaxweb.run_reference(gather_model(), {"x": X, "i": np.array([1, 7], np.int64)})
    assert f"error: {in_reference.value}\n" == line


def test_a_token_id_past_the_vocabulary(tmp_path: Path, backend: str) -> None:
    model = embedding_model()
    session = load_bundle(build_once(model, tmp_path / "embedding"), backend)
    with pytest.raises(RunCheckError, match=r"^node 'embed_tokens' \(Gather\): index 5000 is out of range for axis 0 "
                                            r"of extent 1000$"):
        session.run({"ids": np.array([[3, 5000, 7]], np.int64)})
    ids = np.array([[3, 999, -1]], np.int64)
    expected = ort.InferenceSession(model.SerializeToString()).run(None, {"ids": ids})[0]
    np.testing.assert_array_equal(session.run({"ids": ids})["embedded"], expected)


def test_scatters_refuse_an_index_past_their_axis(tmp_path: Path, backend: str) -> None:
    nd, elements = scatter_models()
    data, rows = X.copy(), np.full((1, 3), -1, np.float32)
    nd_session = load_bundle(build_once(nd, tmp_path / "nd"), backend)
    with pytest.raises(RunCheckError, match=r"^node 'scatter_rows' \(ScatterND\): index 4 is out of range for axis 0 "
                                            r"of extent 4$"):
        nd_session.run({"data": data, "k": np.array([[4]], np.int64), "rows": rows})
    expected = ort.InferenceSession(nd.SerializeToString()).run(
        None, {"data": data, "k": np.array([[-1]], np.int64), "rows": rows})[0]
    np.testing.assert_array_equal(nd_session.run({"data": data, "k": np.array([[-1]], np.int64), "rows": rows})["out"],
                                  expected)
    elements_session = load_bundle(build_once(elements, tmp_path / "elements"), backend)
    values = np.full((4, 1), -1, np.float32)
    with pytest.raises(RunCheckError, match=r"^node 'scatter_cells' \(ScatterElements\): index -4 is out of range for "
                                            r"axis 1 of extent 3$"):
        elements_session.run({"data": data, "k": np.array([[0], [2], [-4], [1]], np.int64), "values": values})


def reverse_sequence_model(lengths: np.ndarray | None = None):
    """ReverseSequence of x[4 steps, 2 in the batch, 3], lengths from data (or a constant)."""
    node = helper.make_node("ReverseSequence", ["x", "lengths"], ["y"], name="reverse", batch_axis=1, time_axis=0)
    inputs = [("x", [4, 2, 3])] + ([] if lengths is not None else [("lengths", TensorProto.INT64, [2])])
    return make_model([node], inputs, ["y"], {} if lengths is None else {"lengths": lengths})


def test_reverse_sequence_lengths_outside_the_time_axis_fail_as_onnxruntime_refuses(tmp_path: Path, backend: str) -> None:
    """onnxruntime: "Invalid sequence length: 7. Value must be in range [0,4]"; before, the
    kernels answered with clamped rows (7) or the data unreversed (-1)."""
    model = reverse_sequence_model()
    session = load_bundle(build_once(model, tmp_path / "bundle"), backend)
    x = np.arange(24, dtype=np.float32).reshape(4, 2, 3)
    for valid in ([4, 2], [0, 1], [3, 4]):
        feeds = {"x": x, "lengths": np.array(valid, np.int64)}
        (want,) = ort.InferenceSession(model.SerializeToString()).run(None, feeds)
        np.testing.assert_array_equal(session.run(feeds)["y"], want)
    for lengths, message in (([7, 2], "sequence length 7 is not below 5 (the time axis' extent plus one)"),
                             ([2, -1], "sequence length -1 is negative")):
        feeds = {"x": x, "lengths": np.array(lengths, np.int64)}
        with pytest.raises(Exception):
            ort.InferenceSession(model.SerializeToString()).run(None, feeds)
        for run in (session.run, lambda f: relaxweb.run_reference(model, f)):
            with pytest.raises(RunCheckError, match=r"^node 'reverse' \(ReverseSequence\): " + message.replace("(", r"\(")
                               .replace(")", r"\)") + "$"):
                run(feeds)


def test_constant_reverse_sequence_lengths_are_checked_at_build(tmp_path: Path) -> None:
    with pytest.raises(relaxweb.RelaxwebError, match=r"sequence length 5 is out of range \[0, 4\]"):
        relaxweb.build(reverse_sequence_model(np.array([5, 1], np.int64)), tmp_path / "bundle")


def test_an_index_error_in_a_batch_names_the_instance(tmp_path: Path, backend: str) -> None:
    """A ragged batch (WebGPU) merges the instances' rows, so the status cannot say whose index
    failed: the instances run again one at a time to name it (wasm runs them one at a time)."""
    table = np.random.default_rng(0).standard_normal((1000, 8)).astype(np.float32)
    model = make_model([helper.make_node("Gather", ["table", "ids"], ["embedded"], name="embed_tokens")],
                       [("ids", TensorProto.INT64, ["b", "s"])], ["embedded"], {"table": table})
    session = load_bundle(build_once(model, tmp_path / "bundle"), backend)
    good = [{"ids": np.array([[1, 2, 3]], np.int64)}, {"ids": np.array([[7]], np.int64)}]
    bad = {"ids": np.array([[4, 5000]], np.int64)}
    with pytest.raises(RunCheckError, match=r"^instance 1 of the batch: node 'embed_tokens' \(Gather\): index 5000 is "
                                            r"out of range for axis 0 of extent 1000$"):
        session.run_batch([good[0], bad, good[1]])
    outputs = session.run_batch(good)  # the session runs on
    for inputs, output in zip(good, outputs):
        np.testing.assert_array_equal(output["embedded"], table[inputs["ids"]])
    assert session.last_batch.mode == ("ragged" if backend == "webgpu" else "one by one")
