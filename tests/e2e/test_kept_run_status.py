"""A run that reads nothing back leaves its run status for the next read (issue 29;
docs/design.md, "Errors found by kernels"): on WebGPU such a run (every output kept on the
GPU: a decode step) does not wait for the GPU to learn its status; the status stays uncleared
and the next read that goes to the host (the next run's outputs, a GpuTensor's values, the
sampled token of ``generate``) carries it and fails, naming the node, the index and the extent
of the earlier run's error, before its values are used.  Chromium: tests/runtime_js/test_wasm_browser.py.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import pytest
import wgpu

from relaxweb.errors import RunCheckError
from tests.e2e.test_index_checks import X, gather_model
from tests.fixtures.tiny_decoder import BOUNDS, tiny_decoder
from tests.helpers import build_once, load_bundle

INDEX_7 = r"^node 'Gather_3' \(Gather\): index 7 is out of range for axis 0 of extent 4$"


@pytest.fixture
def maps(monkeypatch) -> list[str]:
    """The label of every GPU buffer mapped for reading from here on (each map is a wait for the GPU)."""
    mapped: list[str] = []
    buffer_class = type(wgpu.utils.get_default_device().create_buffer(size=16, usage=wgpu.BufferUsage.MAP_READ))
    map_sync = buffer_class.map_sync

    def counted(buffer, *args, **kwargs):
        mapped.append(buffer.label)
        return map_sync(buffer, *args, **kwargs)

    monkeypatch.setattr(buffer_class, "map_sync", counted)
    return mapped


def test_a_decode_step_waits_only_for_its_token(tmp_path: Path, device, maps: list[str]) -> None:
    """Every step of generate (the tiny decoder's embedding Gather is checked) maps one buffer:
    the sampled token's, which carries the step's run status."""
    session = load_bundle(build_once(tiny_decoder(), tmp_path / "decoder", bounds=BOUNDS), "webgpu", device=device)
    assert session.manifest.get("run_errors")  # the embedding gather checks its ids
    per_step: list[list[str]] = []

    def on_token(token: int, text: str) -> None:
        per_step.append(maps[:])
        maps.clear()

    generation = session.generate([1, 2, 3], max_new_tokens=5, temperature=0, on_token=on_token)
    assert len(generation.tokens) == 5
    assert per_step == [["sampled token read"]] * 5, per_step


def test_a_kept_runs_error_surfaces_at_the_next_read(tmp_path: Path, device) -> None:
    session = load_bundle(build_once(gather_model(), tmp_path / "gather"), "webgpu", device=device)
    bad, good = np.array([1, 7], np.int64), np.array([1, -1], np.int64)
    # read by a GpuTensor's values, after a clean kept run that must not clear it
    failed = session.run({"x": X, "i": bad}, keep_on_gpu=["y"])["y"]
    later = session.run({"x": X, "i": good}, keep_on_gpu=["y"])["y"]
    with pytest.raises(RunCheckError, match=INDEX_7):
        later.numpy()
    np.testing.assert_array_equal(later.numpy(), X[[1, 3]])  # reported once: the status is clean again
    failed.dispose()
    later.dispose()
    # read by the next run's outputs
    session.run({"x": X, "i": bad}, keep_on_gpu=["y"])["y"].dispose()
    with pytest.raises(RunCheckError, match=INDEX_7):
        session.run({"x": X, "i": good})
    np.testing.assert_array_equal(session.run({"x": X, "i": good})["y"], X[[1, 3]])


def test_generate_with_an_id_past_the_embedding_fails_naming_the_node(tmp_path: Path, backend: str) -> None:
    """A prompt id within the logits' 258 entries but past the embedding's 200 rows: the prefill
    keeps every output on the GPU, and the token read reports the gather's error."""
    bundle = build_once(tiny_decoder(embedding_rows=200), tmp_path / "short", bounds=BOUNDS)
    session = load_bundle(bundle, backend)
    with pytest.raises(RunCheckError, match=r"^node '[^']+' \(Gather\): index 250 is out of range for axis 0 of "
                                            r"extent 200$"):
        session.generate([1, 250, 3], max_new_tokens=3, temperature=0)
    # the session is usable after (one token: the decoder's random weights may pick one past row 199)
    assert len(session.generate([1, 199, 3], max_new_tokens=1, temperature=0).tokens) == 1
