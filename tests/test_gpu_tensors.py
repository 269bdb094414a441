"""Tensors kept on the GPU between runs (``Session.run(..., keep_on_gpu=...)``, ``GpuTensor``)
and the transfer counters (``Session.stats``), on the Python runtime (wgpu: lavapipe here).

The model is a state carried from run to run, as a decoder's KV cache is:
``state_out = state_in + x`` and ``y = state_in * x``, with ``state_in, x: float32[n, 8]``
and ``n <= 16``.  Its browser twin is in ``tests/test_browser.py``.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
from onnx import TensorProto, helper

import relaxweb
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
    kept, array_state = None, state
    for x in steps_of_x():
        expected_state, expected_y = onnxruntime_outputs(state_model(), {"state_in": array_state, "x": x})
        with_arrays = session.run({"state_in": array_state, "x": x})
        outputs = session.run({"state_in": state if kept is None else kept, "x": x}, keep_on_gpu=["state_out"])
        assert isinstance(outputs["state_out"], GpuTensor) and isinstance(outputs["y"], np.ndarray)
        assert list(outputs) == ["state_out", "y"]  # the manifest's order
        assert_close(with_arrays["state_out"], expected_state)
        assert_close(outputs["y"], expected_y)
        if kept is not None:
            kept.dispose()
        kept = outputs["state_out"]
        assert (kept.name, kept.dtype, kept.shape, kept.disposed) == ("state_out", np.float32, (ROWS, 8), False)
        np.testing.assert_array_equal(kept.numpy(), with_arrays["state_out"])  # the same kernels: exact
        array_state = with_arrays["state_out"]
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
    with pytest.raises(InputShapeError, match="input 'state_in' must be a numpy array of dtype float32, got a GpuTensor of dtype int32"):
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
