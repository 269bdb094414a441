"""Tensors kept on the GPU between runs (``Session.run(..., keep_on_gpu=...)``, ``GpuTensor``)
and the transfer counters (``Session.stats``), on the Python runtime (wgpu: lavapipe here).

The model is a state carried from run to run, as a decoder's KV cache is:
``state_out = state_in + x`` and ``y = state_in * x``, with ``state_in, x: float32[n, 8]``
and ``n <= 16``.  Its browser twin is in ``tests/runtime_js/test_browser.py``.
"""

from __future__ import annotations

import importlib.util
from dataclasses import replace
from pathlib import Path

import numpy as np
import pytest
from onnx import TensorProto, helper

import relaxweb
from relaxweb import browser
from relaxweb.errors import InputShapeError, RelaxwebError
from relaxweb.runtime.gpu_tensor import GpuTensor
from relaxweb.runtime.webgpu import Session, default_adapter
from tests.helpers import assert_close, make_model, onnxruntime_outputs, rand

STEPS = 5
ROWS = 4


def state_model():
    nodes = [helper.make_node("Add", ["state_in", "x"], ["state_out"]),
             helper.make_node("Mul", ["state_in", "x"], ["y"])]
    tensor = (TensorProto.FLOAT, ["n", 8])
    return make_model(nodes, [("state_in", *tensor), ("x", *tensor)], ["state_out", "y"])


def build_state_bundle(path: Path, bound: int) -> Path:
    relaxweb.build(state_model(), path, bounds={"n": bound})
    return path


@pytest.fixture(scope="module")
def state_bundle(tmp_path_factory: pytest.TempPathFactory) -> Path:
    return build_state_bundle(tmp_path_factory.mktemp("state") / "bundle", 16)


@pytest.fixture
def session(state_bundle: Path, device) -> Session:
    return Session(state_bundle, device)


def steps_of_x(rows: int = ROWS) -> list[np.ndarray]:
    return [rand(rows, 8, seed=step) for step in range(STEPS)]


def test_kept_state_fed_back_matches_arrays_and_onnxruntime(session: Session) -> None:
    state = rand(ROWS, 8, seed=100)
    with_arrays, array_state = [], state
    for x in steps_of_x():
        expected_state, expected_y = onnxruntime_outputs(state_model(), {"state_in": array_state, "x": x})
        outputs = session.run({"state_in": array_state, "x": x})
        assert_close(outputs["state_out"], expected_state)
        assert_close(outputs["y"], expected_y)
        with_arrays.append(outputs)
        array_state = outputs["state_out"]
    # separately, so that no array run leaves the right values in the input's storage
    kept = None
    for x, expected in zip(steps_of_x(), with_arrays):
        outputs = session.run({"state_in": state if kept is None else kept, "x": x}, keep_on_gpu=["state_out"])
        assert isinstance(outputs["state_out"], GpuTensor) and isinstance(outputs["y"], np.ndarray)
        assert list(outputs) == ["state_out", "y"]  # the manifest's order
        np.testing.assert_array_equal(outputs["y"], expected["y"])  # the same kernels: exact
        if kept is not None:
            kept.dispose()
        kept = outputs["state_out"]
        assert (kept.name, kept.dtype, kept.shape, kept.disposed) == ("state_out", np.float32, (ROWS, 8), False)
        np.testing.assert_array_equal(kept.numpy(), expected["state_out"])
    assert_close(kept.numpy(), state + sum(steps_of_x()))


def test_a_warm_decode_loop_creates_no_buffers_and_moves_no_kept_bytes(session: Session) -> None:
    kept = None
    for step, x in enumerate(steps_of_x()):
        outputs = session.run({"state_in": rand(ROWS, 8) if kept is None else kept, "x": x}, keep_on_gpu=True)
        if kept is not None:
            kept.dispose()
        kept = outputs["state_out"]
        outputs["y"].dispose()
        counts = session.stats.last_run
        if step >= 2:  # step 1 still holds step 0's tensors while it takes buffers for its own
            assert counts.buffers_created == 0, (step, counts)
        # only x crosses from the host; nothing is read back; the params block is counted apart
        assert counts.input_bytes_written == (2 * x.nbytes if step == 0 else x.nbytes)
        assert counts.bytes_read == 0
        assert counts.params_bytes_written > 0 and counts.weight_bytes_written == 0
    assert session.stats.total.buffers_created >= session.stats.last_run.buffers_created
    kept.numpy()
    assert session.stats.last_run.bytes_read == kept.nbytes == ROWS * 8 * 4  # the read after the run counts


def test_array_outputs_count_their_bytes_read(session: Session) -> None:
    x = rand(ROWS, 8)
    session.run({"state_in": x, "x": x})
    session.run({"state_in": x, "x": x})
    counts = session.stats.last_run
    assert (counts.buffers_created, counts.input_bytes_written, counts.bytes_read) == (0, 2 * x.nbytes, 2 * x.nbytes)


def test_a_wrong_shape_gpu_tensor_gets_the_host_modules_message(session: Session, tmp_path: Path, device) -> None:
    small = Session(build_state_bundle(tmp_path / "small", 8), device)
    kept = session.run({"state_in": rand(12, 8), "x": rand(12, 8)}, keep_on_gpu=["state_out"])["state_out"]
    with pytest.raises(InputShapeError) as raised:
        small.run({"state_in": kept, "x": rand(12, 8)})
    assert str(raised.value) == "input 'state_in': dimension 0 (n) is 12, above its bound n <= 8"
    with pytest.raises(InputShapeError) as raised:  # against another input's shape
        session.run({"state_in": kept, "x": rand(5, 8)})
    assert "input 'x': dimension 0 is 5, expected 12" in str(raised.value)
    # a tensor of another session on the same device is a tensor like any other
    kept = session.run({"state_in": rand(6, 8), "x": rand(6, 8)}, keep_on_gpu=["state_out"])["state_out"]
    assert_close(small.run({"state_in": kept, "x": rand(6, 8)})["state_out"], kept.numpy() + rand(6, 8))


def test_dtype_and_rank_of_a_gpu_tensor_are_checked_like_an_array(session: Session) -> None:
    kept = session.run({"state_in": rand(2, 8), "x": rand(2, 8)}, keep_on_gpu=True)["state_out"]
    kept.dtype = np.dtype(np.int32)  # as if from another model
    with pytest.raises(InputShapeError, match=r"input 'state_in': expected float32 data \(a numpy array of dtype float32\), got a GpuTensor of dtype int32"):
        session.run({"state_in": kept, "x": rand(2, 8)})


def test_disposed_and_foreign_gpu_tensors_are_refused(session: Session, state_bundle: Path) -> None:
    kept = session.run({"state_in": rand(2, 8), "x": rand(2, 8)}, keep_on_gpu=["state_out"])["state_out"]
    kept.dispose()
    kept.dispose()  # twice does nothing
    assert kept.disposed
    with pytest.raises(RelaxwebError, match="input 'state_in': GPU tensor 'state_out' was disposed"):
        session.run({"state_in": kept, "x": rand(2, 8)})
    with pytest.raises(RelaxwebError, match="GPU tensor 'state_out' was disposed"):
        kept.numpy()

    other_device = default_adapter().request_device_sync(label="another device")
    foreign = Session(state_bundle, other_device).run({"state_in": rand(2, 8), "x": rand(2, 8)}, keep_on_gpu=True)
    with pytest.raises(RelaxwebError, match="input 'state_in': GPU tensor 'state_out' lives on another WebGPU device"):
        session.run({"state_in": foreign["state_out"], "x": rand(2, 8)})


def test_keep_on_gpu_names_must_be_outputs(session: Session) -> None:
    x = rand(2, 8)
    with pytest.raises(RelaxwebError, match="keep_on_gpu names unknown output 'z'; the model's outputs are 'state_out', 'y'"):
        session.run({"state_in": x, "x": x}, keep_on_gpu=["z"])
    with pytest.raises(RelaxwebError, match="keep_on_gpu must be True or a list of output names"):
        session.run({"state_in": x, "x": x}, keep_on_gpu="y")


def test_a_kept_output_owns_its_buffer(session: Session) -> None:
    """The next run overwrites the output's storage, not the kept tensor."""
    first = session.run({"state_in": rand(3, 8, seed=1), "x": rand(3, 8, seed=2)}, keep_on_gpu=True)
    before = first["state_out"].numpy()
    session.run({"state_in": rand(3, 8, seed=3), "x": rand(3, 8, seed=4)}, keep_on_gpu=True)
    np.testing.assert_array_equal(first["state_out"].numpy(), before)
    assert_close(before, rand(3, 8, seed=1) + rand(3, 8, seed=2))


# The same in Chromium (relaxweb/runtime_js: model.run(inputs, {keepOnGpu}), GpuTensor) -------

#: Runs in the runner page: 5 steps with arrays, then 5 feeding the kept state back (disposing
#: the previous step's tensors), then the refusals; returns what the Python side checks.
KEEP_ON_GPU_IN_PAGE = """
async ({ state, xs, rows }) => {
  const f32 = (values) => Float32Array.from(values);
  const tensor = (values, n = rows) => ({ data: f32(values), shape: [n, 8] });
  const model = await window.relaxweb.load("/bundle/");
  const message = async (promise) => promise.then(() => "no error", (error) => `${error.name}: ${error.message}`);
  const result = { withArrays: [], kept: [], lastRuns: [], afterReads: [], y: [] };
  let arrayState = tensor(state);
  for (const x of xs) {
    arrayState = (await model.run({ state_in: arrayState, x: tensor(x) })).state_out;
    result.withArrays.push(Array.from(arrayState.data));
  }
  let kept = null;
  for (const x of xs) {
    const outputs = await model.run({ state_in: kept ?? tensor(state), x: tensor(x) }, { keepOnGpu: true });
    result.lastRuns.push({ ...model.stats.lastRun });
    kept?.dispose();
    kept = outputs.state_out;
    result.isGpuTensor = kept instanceof window.relaxweb.GpuTensor && outputs.y instanceof window.relaxweb.GpuTensor;
    result.y.push(Array.from((await outputs.y.read()).data));
    outputs.y.dispose();
    const read = await kept.read();
    result.afterReads.push({ ...model.stats.lastRun });
    result.kept.push({ data: Array.from(read.data), shape: read.shape, name: kept.name, dtype: kept.dtype, tensorShape: kept.shape });
  }
  result.total = { ...model.stats.total };

  const tight = await window.relaxweb.load("/bundle/", { device: model.device, bounds: { n: 2 } });
  result.wrongShape = await message(tight.run({ state_in: kept, x: tensor(xs[0]) }));
  const small = (await model.run({ state_in: tensor([...Array(16).keys()], 2), x: tensor(Array(16).fill(1), 2) }, { keepOnGpu: ["state_out"] })).state_out;
  result.acrossModels = Array.from((await tight.run({ state_in: small, x: tensor(Array(16).fill(2), 2) })).state_out.data);
  const foreign = await window.relaxweb.load("/bundle/");
  result.foreign = await message(foreign.run({ state_in: kept, x: tensor(xs[0]) }));
  kept.dispose();
  kept.dispose();
  result.disposed = kept.disposed;
  result.disposedInput = await message(model.run({ state_in: kept, x: tensor(xs[0]) }));
  result.disposedRead = await message(kept.read());
  result.unknownOutput = await message(model.run({ state_in: tensor(state), x: tensor(xs[0]) }, { keepOnGpu: ["z"] }));
  for (const m of [tight, foreign, model]) m.dispose();
  return result;
}
"""


@pytest.mark.browser
@pytest.mark.skipif(importlib.util.find_spec("playwright") is None, reason="playwright is not installed")
def test_keep_on_gpu_in_chromium(state_bundle: Path) -> None:
    try:
        browser.find_chromium()
    except RelaxwebError as error:
        pytest.skip(str(error))
    state, xs = rand(ROWS, 8, seed=100), steps_of_x()
    with browser.open_runner_page(state_bundle) as page:
        result = page.evaluate(KEEP_ON_GPU_IN_PAGE, {"state": state.ravel().tolist(), "xs": [x.ravel().tolist() for x in xs],
                                                     "rows": ROWS})
    assert result["isGpuTensor"]
    expected = state
    for step, x in enumerate(xs):
        assert_close(np.array(result["y"][step], np.float32).reshape(ROWS, 8), expected * x)
        expected = expected + x
        kept = result["kept"][step]
        assert (kept["name"], kept["dtype"], kept["shape"], kept["tensorShape"]) == ("state_out", "float32", [ROWS, 8], [ROWS, 8])
        np.testing.assert_array_equal(kept["data"], result["withArrays"][step])  # the same kernels: exact
        assert_close(np.array(kept["data"], np.float32).reshape(ROWS, 8), expected)
        counts = result["lastRuns"][step]
        if step >= 2:  # step 1 still holds step 0's state while it takes a buffer for its own
            assert counts["buffersCreated"] == 0, (step, counts)
        # only x crosses from the host, nothing is read back; the params block is counted apart
        assert counts["inputBytesWritten"] == (2 if step == 0 else 1) * x.nbytes
        assert counts["bytesRead"] == 0
        assert counts["paramsBytesWritten"] > 0 and counts["weightBytesWritten"] == 0
        # the reads after the run count in lastRun (a staging buffer each)
        assert result["afterReads"][step]["bytesRead"] == 2 * x.nbytes
        assert result["afterReads"][step]["buffersCreated"] == counts["buffersCreated"] + 2
    assert result["total"]["buffersCreated"] > 0
    assert result["wrongShape"] == "InputShapeError: input 'state_in': dimension 0 (n) is 4, above its bound n <= 2"
    assert_close(np.array(result["acrossModels"], np.float32), np.arange(16, dtype=np.float32) + 3)
    assert result["foreign"].startswith("Error: input 'state_in': GPU tensor 'state_out' lives on another WebGPU device")
    assert result["disposed"] is True
    assert result["disposedInput"] == "Error: input 'state_in': GPU tensor 'state_out' was disposed and cannot be used any more"
    assert result["disposedRead"] == "Error: GPU tensor 'state_out' was disposed and cannot be used any more"
    assert result["unknownOutput"] == "Error: keepOnGpu names unknown output 'z'; the model's outputs are 'state_out', 'y'"


def kv_cache_model():
    """A cache that grows by one position per step, as a decoder's: ``present = concat(past,
    k)`` along the symbolic past length, and ``total = sum(present)`` over it."""
    nodes = [helper.make_node("Concat", ["past", "k"], ["present"], axis=1),
             helper.make_node("ReduceSum", ["present", "axes"], ["total"], keepdims=0)]
    inputs = [("past", TensorProto.FLOAT, [2, "past_length", 4]), ("k", TensorProto.FLOAT, [2, 1, 4])]
    return make_model(nodes, inputs, ["present", "total"], {"axes": np.array([1], np.int64)})


def test_a_growing_cache_kept_on_the_gpu_needs_no_new_buffers(tmp_path: Path, device) -> None:
    relaxweb.build(kv_cache_model(), tmp_path / "kv", bounds={"past_length": 16})
    session = Session(tmp_path / "kv", device)
    past = rand(2, 3, 4, seed=7)
    cache, array_cache = None, past
    for step in range(STEPS):
        k = rand(2, 1, 4, seed=step)
        expected_present, expected_total = onnxruntime_outputs(kv_cache_model(), {"past": array_cache, "k": k})
        outputs = session.run({"past": past if cache is None else cache, "k": k}, keep_on_gpu=["present"])
        counts = replace(session.stats.last_run)  # a copy: the reads below count there too
        if cache is not None:
            cache.dispose()
        cache, array_cache = outputs["present"], expected_present
        assert cache.shape == (2, 4 + step, 4)
        np.testing.assert_array_equal(cache.numpy(), expected_present)  # a copy: exact
        assert_close(outputs["total"], expected_total)
        if step >= 2:  # sized at the bound of past_length: the longer cache fits the pooled buffer
            assert counts.buffers_created == 0, (step, counts)
        assert counts.input_bytes_written == (past.nbytes if step == 0 else 0) + k.nbytes
