"""Tests of the Python runtime on the hand-made bundles (``tests/fixtures/handmade_bundle.py``).

The first model is ``z = (x + w) * 2`` with ``x: float32[n, 4]`` and ``n <= 16`` (or
unbounded), a bundle without reads; the second is ``y = x[x > 0]`` with ``x: float32[n]``,
whose output length is read back from the GPU in the middle of each run.
The host-module tests need no GPU; the :class:`Session` tests run on whatever WebGPU
adapter wgpu finds (lavapipe on CI) and are skipped when there is none.
"""

from __future__ import annotations

import hashlib

import json
import shutil
import struct
from pathlib import Path
from typing import Any

import numpy as np
import pytest

from relaxweb.errors import InputShapeError, RelaxwebError
from relaxweb.runtime import Dispatch, HostModule, Read
from relaxweb.runtime.tensors import checked_inputs
from tests.fixtures.handmade_bundle import (
    COUNT_BYTE_OFFSET,
    HANDMADE_WEIGHT,
    edit_manifest,
    expected_output,
    random_input,
    write_handmade_bundle,
    write_positives_bundle,
)
from tests.helpers import assert_close, rand


@pytest.fixture(scope="module")
def bounded_bundle(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("bounded") / "bundle"
    write_handmade_bundle(path)
    return path


@pytest.fixture(scope="module")
def unbounded_bundle(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("unbounded") / "bundle"
    write_handmade_bundle(path, bound=None)
    return path


@pytest.fixture
def host(bounded_bundle: Path) -> HostModule:
    return HostModule.from_bundle(bounded_bundle)


@pytest.fixture
def unbounded_host(unbounded_bundle: Path) -> HostModule:
    return HostModule.from_bundle(unbounded_bundle)


# The host module (no GPU) ------------------------------------------------------------------


def test_fixture_writes_every_bundle_file(bounded_bundle: Path) -> None:
    for relative_path in ["manifest.json", "host.wasm", "host.wat", "weights/shard0.bin",
                          "kernels/add_broadcast.wgsl", "kernels/multiply_by_two.wgsl"]:
        assert (bounded_bundle / relative_path).is_file(), relative_path
    shard = np.frombuffer((bounded_bundle / "weights/shard0.bin").read_bytes(), dtype="<f4")
    np.testing.assert_array_equal(shard, HANDMADE_WEIGHT)


def test_host_reports_bounds_and_sizes_at_bounds(host: HostModule) -> None:
    assert host.var_bounds() == {"n": 16}
    assert host.sizes_at_bounds() == [256, 256, 256]
    assert host.storage_sizes() == [256, 256, 256]


def test_unbounded_host_has_no_sizes_at_bounds(unbounded_host: HostModule) -> None:
    assert unbounded_host.var_bounds() == {"n": None}
    assert unbounded_host.sizes_at_bounds() is None


def test_host_run_writes_vars_sizes_shapes_and_commands(host: HostModule) -> None:
    host.write_input_shapes([(5, 4)])
    assert host.run() == 0
    assert host.var_values() == {"n": 5}
    assert host.storage_sizes() == [80, 80, 80]
    assert host.output_shapes() == [(5, 4)]
    assert host.commands() == [Dispatch(0, (1, 1, 1)), Dispatch(1, (1, 1, 1))]


def test_host_writes_each_call_sites_params(host: HostModule) -> None:
    host.run_with_shapes([(5, 4)])
    params = host.params()
    assert len(params) == 512
    for offset in (0, 256):  # params_offset of call sites 0 and 1
        count, *padding = struct.unpack_from("<4I", params, offset)
        assert count == 20
        assert padding == [0, 0, 0]


@pytest.mark.parametrize(("rows", "workgroups"), [(0, 0), (1, 1), (16, 1), (17, 2), (1000, 63)])
def test_host_grid_is_count_over_workgroup_size(
    unbounded_host: HostModule, rows: int, workgroups: int
) -> None:
    unbounded_host.run_with_shapes([(rows, 4)])
    assert unbounded_host.commands() == [
        Dispatch(0, (workgroups, 1, 1)),
        Dispatch(1, (workgroups, 1, 1)),
    ]
    assert unbounded_host.storage_sizes() == [rows * 16] * 3


def test_host_rejects_wrong_rank(host: HostModule) -> None:
    host.write_input_shapes([(2, 2, 4)])
    code = host.run()
    assert code == 1
    assert host.error_info() == (1, 3, 2)
    assert host.format_error(code) == "input 'x' has 3 dimensions, expected 2"


def test_host_rejects_wrong_fixed_dimension(host: HostModule) -> None:
    with pytest.raises(InputShapeError) as caught:
        host.run_with_shapes([(5, 3)])
    message = str(caught.value)
    assert "'x'" in message and "dimension 1" in message
    assert "is 3" in message and "expected 4" in message


def test_host_rejects_dimension_above_bound(host: HostModule) -> None:
    with pytest.raises(InputShapeError) as caught:
        host.run_with_shapes([(17, 4)])
    assert str(caught.value) == "input 'x': dimension 0 (n) is 17, above its bound 16"
    assert host.error_info() == (3, 17, 16)


def test_host_accepts_exactly_the_bound_after_an_error(host: HostModule) -> None:
    with pytest.raises(InputShapeError):
        host.run_with_shapes([(17, 4)])
    host.run_with_shapes([(16, 4)])
    assert host.output_shapes() == [(16, 4)]


def test_unbounded_host_accepts_any_row_count(unbounded_host: HostModule) -> None:
    unbounded_host.run_with_shapes([(100_000, 4)])
    assert unbounded_host.var_values() == {"n": 100_000}
    assert unbounded_host.output_shapes() == [(100_000, 4)]


def test_tighter_bound_written_by_the_runtime_is_enforced(host: HostModule) -> None:
    host.write_var_bounds({"n": 8})
    assert host.sizes_at_bounds() == [128, 128, 128]
    with pytest.raises(InputShapeError, match="is 9, above its bound 8"):
        host.run_with_shapes([(9, 4)])


def test_write_var_bounds_rejects_unknown_var(host: HostModule) -> None:
    with pytest.raises(RelaxwebError, match="batch"):
        host.write_var_bounds({"batch": 3})


def test_rank_above_max_rank_is_refused_before_the_host(host: HostModule) -> None:
    with pytest.raises(InputShapeError, match="'x' has 9 dimensions; .* at most 8"):
        host.write_input_shapes([(1,) * 9])


def test_error_code_missing_from_manifest_is_reported(bounded_bundle: Path) -> None:
    manifest = json.loads((bounded_bundle / "manifest.json").read_text())
    manifest["errors"] = []
    host = HostModule((bounded_bundle / "host.wasm").read_bytes(), manifest)
    with pytest.raises(RelaxwebError, match="error code 3 .* manifest does not describe"):
        host.run_with_shapes([(17, 4)])


def test_folder_without_manifest_is_not_a_bundle(tmp_path: Path) -> None:
    with pytest.raises(RelaxwebError, match="no manifest.json"):
        HostModule.from_bundle(tmp_path)


def test_newer_format_version_is_refused(tmp_path: Path) -> None:
    write_handmade_bundle(tmp_path)
    edit_manifest(tmp_path, lambda manifest: manifest.update(version=4))
    with pytest.raises(RelaxwebError, match="version 4"):
        HostModule.from_bundle(tmp_path)


@pytest.mark.parametrize("version", [1, 2])
def test_older_format_version_is_refused(tmp_path: Path, version: int) -> None:
    """Version 1 manifests gave each tensor a ``device_dtype`` instead of the ``dtypes`` table;
    version 2's table had no ``wasm_dtype`` (its kernels.wasm held int64 as int32)."""
    write_handmade_bundle(tmp_path)
    edit_manifest(tmp_path, lambda manifest: manifest.update(version=version))
    with pytest.raises(RelaxwebError, match=f"has bundle format version {version}; this runtime reads version 3 .*rebuild"):
        HostModule.from_bundle(tmp_path)


def test_manifest_without_an_entry_for_a_dtype_is_refused(tmp_path: Path) -> None:
    write_handmade_bundle(tmp_path)
    edit_manifest(tmp_path, lambda manifest: manifest.update(dtypes={}))
    with pytest.raises(RelaxwebError, match=r"manifest.json: inputs\[0\].dtype: \"float32\" is not in dtypes"):
        HostModule.from_bundle(tmp_path)


# The WebGPU session --------------------------------------------------------------------------


@pytest.fixture(scope="module")
def gpu_device() -> Any:
    """The shared wgpu device; skips the GPU tests where no adapter exists."""
    pytest.importorskip("wgpu")
    from relaxweb.runtime.webgpu import default_adapter, default_device

    try:
        default_adapter()
    except Exception as error:  # no Vulkan/Metal/D3D driver at all
        pytest.skip(f"no WebGPU adapter: {error}")
    return default_device()


@pytest.fixture(scope="module")
def session(gpu_device: Any, bounded_bundle: Path) -> Any:
    from relaxweb.runtime import Session

    return Session(bounded_bundle)


@pytest.fixture
def unbounded_session(gpu_device: Any, unbounded_bundle: Path) -> Any:
    from relaxweb.runtime import Session

    return Session(unbounded_bundle)


@pytest.mark.parametrize("rows", [1, 5, 16])
def test_session_matches_numpy(session: Any, rows: int) -> None:
    x = random_input(rows, seed=rows)
    outputs = session.run({"x": x})
    assert list(outputs) == ["z"]
    assert outputs["z"].dtype == np.float32
    assert outputs["z"].shape == (rows, 4)
    assert_close(outputs["z"], expected_output(x))
    assert session.last_dispatch_count == 2
    assert session.last_read_count == 0


def test_session_exposes_manifest_and_allocates_at_bounds(session: Any) -> None:
    assert session.manifest["model"] == "handmade"
    assert [entry["name"] for entry in session.manifest["outputs"]] == ["z"]
    assert session.storage_buffer_sizes == [256, 256, 256]


def test_session_smaller_run_after_larger_one_is_not_stale(session: Any) -> None:
    session.run({"x": random_input(16, seed=1)})
    x = random_input(3, seed=2)
    assert_close(session.run({"x": x})["z"], expected_output(x))


def test_session_handles_zero_rows(session: Any) -> None:
    z = session.run({"x": np.zeros((0, 4), dtype=np.float32)})["z"]
    assert z.shape == (0, 4) and z.dtype == np.float32


def test_session_accepts_non_contiguous_input(session: Any) -> None:
    x = np.asfortranarray(random_input(7, seed=3))
    assert not x.flags.c_contiguous
    assert_close(session.run({"x": x})["z"], expected_output(x))


def test_the_input_checks_keep_a_scalar_input_0_d(session: Any) -> None:
    """np.ascontiguousarray would make it 1-d, and the host would see the wrong rank."""
    scalar_input = {"name": "x", "dtype": "float32", "shape": [], "storage": 0}
    manifest = {**session.manifest, "inputs": [scalar_input]}
    (array,), sequences = checked_inputs(manifest, {"x": np.array(2.5, dtype=np.float32)}, None)
    assert array.shape == () and sequences == {}


def test_session_reuses_bind_groups_between_runs(session: Any) -> None:
    session.run({"x": random_input(4)})
    first = list(session.buffers.bind_groups)
    session.run({"x": random_input(9)})
    assert all(a is b for a, b in zip(first, session.buffers.bind_groups))


def test_session_rejects_row_count_above_bound(session: Any) -> None:
    with pytest.raises(InputShapeError) as caught:
        session.run({"x": random_input(17)})
    message = str(caught.value)
    assert "'x'" in message and "17" in message and "bound 16" in message


def test_session_rejects_wrong_fixed_dimension(session: Any) -> None:
    with pytest.raises(InputShapeError) as caught:
        session.run({"x": np.zeros((5, 3), dtype=np.float32)})
    assert str(caught.value) == "input 'x': dimension 1 is 3, expected 4"


def test_session_rejects_wrong_rank(session: Any) -> None:
    with pytest.raises(InputShapeError) as caught:
        session.run({"x": np.zeros((2, 5, 4), dtype=np.float32)})
    message = str(caught.value)
    assert "'x'" in message and "3 dimensions" in message and "expected 2" in message


def test_session_rejects_wrong_dtype_naming_both(session: Any) -> None:
    with pytest.raises(InputShapeError) as caught:
        session.run({"x": np.zeros((2, 4), dtype=np.float64)})
    message = str(caught.value)
    assert "'x'" in message and "float32" in message and "float64" in message


def test_session_rejects_a_list_input(session: Any) -> None:
    expected = r"input 'x': expected float32 data \(a numpy array of dtype float32\), got a list"
    with pytest.raises(InputShapeError, match=expected):
        session.run({"x": [[0.0, 0.0, 0.0, 0.0]]})


def test_session_rejects_missing_input(session: Any) -> None:
    with pytest.raises(InputShapeError, match=r"missing input 'x' \(float32 \[n, 4\]\)"):
        session.run({})


def test_session_rejects_unknown_input(session: Any) -> None:
    x = random_input(2)
    with pytest.raises(InputShapeError, match="unknown input 'y'; the model's inputs are 'x'"):
        session.run({"x": x, "y": x})


def test_session_still_works_after_rejected_inputs(session: Any) -> None:
    with pytest.raises(InputShapeError):
        session.run({"x": random_input(40)})
    x = random_input(6, seed=6)
    assert_close(session.run({"x": x})["z"], expected_output(x))


def test_unbounded_session_grows_storages(unbounded_session: Any) -> None:
    assert unbounded_session.storage_buffer_sizes == [0, 0, 0]

    small = random_input(2, seed=20)
    assert_close(unbounded_session.run({"x": small})["z"], expected_output(small))
    assert unbounded_session.storage_buffer_sizes == [32, 32, 32]

    large = random_input(40, seed=40)  # 640 bytes per storage, 3 workgroups of 64
    assert_close(unbounded_session.run({"x": large})["z"], expected_output(large))
    assert unbounded_session.storage_buffer_sizes == [640, 640, 640]
    assert unbounded_session.last_dispatch_count == 2

    small_again = random_input(3, seed=3)
    assert_close(unbounded_session.run({"x": small_again})["z"], expected_output(small_again))
    assert unbounded_session.storage_buffer_sizes == [640, 640, 640]  # never shrinks


def test_unbounded_session_doubles_on_small_growth(unbounded_session: Any) -> None:
    unbounded_session.run({"x": random_input(10)})
    x = random_input(11, seed=11)
    assert_close(unbounded_session.run({"x": x})["z"], expected_output(x))
    assert unbounded_session.storage_buffer_sizes == [320, 320, 320]


def test_corrupted_shard_fails_its_checksum(gpu_device: Any, tmp_path: Path) -> None:
    from relaxweb.runtime import Session

    write_handmade_bundle(tmp_path)
    shard_path = tmp_path / "weights" / "shard0.bin"
    corrupted = bytearray(shard_path.read_bytes())
    corrupted[0] ^= 0xFF
    shard_path.write_bytes(bytes(corrupted))
    with pytest.raises(RelaxwebError) as caught:
        Session(tmp_path)
    assert "checksum" in str(caught.value) and "weights/shard0.bin" in str(caught.value)


def test_truncated_shard_is_reported(gpu_device: Any, tmp_path: Path) -> None:
    from relaxweb.runtime import Session

    write_handmade_bundle(tmp_path)
    shard_path = tmp_path / "weights" / "shard0.bin"
    shard_path.write_bytes(shard_path.read_bytes()[:8])
    with pytest.raises(RelaxwebError, match="shard0.bin has 8 bytes, the manifest says 16"):
        Session(tmp_path)


def test_limit_the_adapter_lacks_is_named(gpu_device: Any, tmp_path: Path) -> None:
    from relaxweb.runtime import Session

    write_handmade_bundle(tmp_path)
    huge = 1 << 50
    edit_manifest(
        tmp_path,
        lambda manifest: manifest["required_limits"].update(maxStorageBufferBindingSize=huge),
    )
    with pytest.raises(RelaxwebError) as caught:
        Session(tmp_path)
    available = gpu_device.adapter.limits["max-storage-buffer-binding-size"]
    message = str(caught.value)
    assert "maxStorageBufferBindingSize" in message
    assert str(huge) in message and str(available) in message


def test_limit_a_given_device_lacks_is_named(gpu_device: Any, tmp_path: Path) -> None:
    from relaxweb.runtime import Session

    write_handmade_bundle(tmp_path)
    needed = gpu_device.limits["max-storage-buffers-per-shader-stage"] + 1
    edit_manifest(
        tmp_path,
        lambda manifest: manifest["required_limits"].update(maxStorageBuffersPerShaderStage=needed),
    )
    with pytest.raises(RelaxwebError, match=f"maxStorageBuffersPerShaderStage = {needed}"):
        Session(tmp_path, device=gpu_device)


#: Every WebGPU feature name (the spec's GPUFeatureName), to find one an adapter lacks.
WEBGPU_FEATURES = (
    "core-features-and-limits", "depth-clip-control", "depth32float-stencil8",
    "texture-compression-bc", "texture-compression-bc-sliced-3d", "texture-compression-etc2",
    "texture-compression-astc", "texture-compression-astc-sliced-3d", "timestamp-query",
    "indirect-first-instance", "shader-f16", "rg11b10ufloat-renderable", "bgra8unorm-storage",
    "float32-filterable", "float32-blendable", "clip-distances", "dual-source-blending",
    "subgroups", "texture-formats-tier1", "texture-formats-tier2",
)

#: The buffer size limits of the small device (``small_device``), in bytes.
SMALL_BINDING_SIZE = 4096
SMALL_BUFFER_SIZE = 8192


@pytest.fixture(scope="module")
def small_device(gpu_device: Any) -> Any:
    """A device of the same adapter with small buffer size limits (wgpu gives a device the
    limits it asks for, even below the defaults) and no optional feature."""
    return gpu_device.adapter.request_device_sync(
        label="small",
        required_limits={
            "max-storage-buffer-binding-size": SMALL_BINDING_SIZE,
            "max-buffer-size": SMALL_BUFFER_SIZE,
        },
    )


def test_small_device_has_the_limits_it_asked_for(small_device: Any) -> None:
    assert small_device.limits["max-storage-buffer-binding-size"] == SMALL_BINDING_SIZE
    assert small_device.limits["max-buffer-size"] == SMALL_BUFFER_SIZE


def test_storage_at_the_bounds_above_the_devices_limit_fails_at_load(
    small_device: Any, tmp_path: Path
) -> None:
    """n <= 1000 rows of 16 bytes: 16000 bytes per storage at the bounds, above 4096."""
    from relaxweb.runtime import Session

    write_handmade_bundle(tmp_path, bound=1000)
    manifest = json.loads((tmp_path / "manifest.json").read_text())
    assert manifest["required_limits"]["maxStorageBufferBindingSize"] == 16000
    with pytest.raises(RelaxwebError) as caught:
        Session(tmp_path, device=small_device)
    storage = ": storage 0 (input) needs 16000 bytes at the bounds (its size: n * 16 bytes; build with lower --bound values, or run on wasm)"
    assert str(caught.value) == (
        "the bundle needs the WebGPU limit maxStorageBufferBindingSize = 16000, "
        f"but the given device offers {SMALL_BINDING_SIZE}{storage}; the bundle needs the WebGPU limit "
        f"maxBufferSize = 16000, but the given device offers {SMALL_BUFFER_SIZE}{storage}"
    )


def test_storage_at_the_bounds_within_the_devices_limit_loads(
    small_device: Any, tmp_path: Path
) -> None:
    from relaxweb.runtime import Session

    write_handmade_bundle(tmp_path, bound=SMALL_BINDING_SIZE // 16)
    session = Session(tmp_path, device=small_device)
    assert session.storage_buffer_sizes == [SMALL_BINDING_SIZE] * 3
    x = random_input(SMALL_BINDING_SIZE // 16, seed=3)
    assert_close(session.run({"x": x})["z"], expected_output(x))


def test_storage_at_the_bounds_is_checked_even_without_required_limits(
    small_device: Any, tmp_path: Path
) -> None:
    """A manifest that says nothing of the buffer sizes still fails at load, naming the limit."""
    from relaxweb.runtime import Session

    write_handmade_bundle(tmp_path, bound=1000)
    edit_manifest(tmp_path, lambda manifest: manifest.update(required_limits={}))
    with pytest.raises(
        RelaxwebError,
        match=f"WebGPU limit maxStorageBufferBindingSize = 16000 .*offers {SMALL_BINDING_SIZE}",
    ):
        Session(tmp_path, device=small_device)


def test_compiled_bundle_requires_its_sizes_at_the_bounds(
    gpu_device: Any, small_device: Any, tmp_path: Path
) -> None:
    """A model built with --bound needs buffers as large as its largest storage at the
    bounds; the small device cannot load it, the default device can."""
    import onnx

    from examples.make_mlp import make_mlp
    from relaxweb.compiler import build_bundle
    from relaxweb.runtime import Session

    onnx.save(make_mlp(), str(tmp_path / "mlp.onnx"))
    manifest = build_bundle(tmp_path / "mlp.onnx", tmp_path / "dist", {"batch": 64})
    largest = max(
        [storage["size_at_bounds"] for storage in manifest["storages"]]
        + [weight["nbytes"] for weight in manifest["weights"]]
    )
    assert largest > SMALL_BUFFER_SIZE
    assert manifest["required_limits"]["maxStorageBufferBindingSize"] == largest
    assert manifest["required_limits"]["maxBufferSize"] == largest
    assert manifest["required_features"] == []
    with pytest.raises(RelaxwebError) as caught:
        Session(tmp_path / "dist", device=small_device)
    message = str(caught.value)
    assert f"maxStorageBufferBindingSize = {largest}" in message
    assert f"offers {SMALL_BINDING_SIZE}" in message
    assert Session(tmp_path / "dist").device.limits["max-storage-buffer-binding-size"] >= largest


def test_a_weight_above_the_devices_limit_fails_at_load(small_device: Any, tmp_path: Path) -> None:
    """Unbounded storages give no buffer size limits, but the weights' sizes are known."""
    from relaxweb.runtime import Session

    write_handmade_bundle(tmp_path, bound=None)
    (tmp_path / "weights" / "shard0.bin").write_bytes(bytes(10_000))

    def grow_the_weight(manifest: dict) -> None:
        manifest["weights"][0].update(nbytes=10_000, shape=[2_500])
        manifest["shards"][0].update(nbytes=10_000, sha256=hashlib.sha256(bytes(10_000)).hexdigest())

    edit_manifest(tmp_path, grow_the_weight)
    with pytest.raises(
        RelaxwebError,
        match=f"limit maxStorageBufferBindingSize = 10000, but the given device offers {SMALL_BINDING_SIZE}",
    ):
        Session(tmp_path, device=small_device)


def test_a_run_above_the_devices_limit_names_it(small_device: Any, unbounded_bundle: Path) -> None:
    """Without bounds, storages grow per run: one that would pass the device's binding size
    limit is refused before any buffer is made, and the session still runs smaller inputs."""
    from relaxweb.runtime import Session

    session = Session(unbounded_bundle, device=small_device)
    x = random_input(200, seed=1)
    assert_close(session.run({"x": x})["z"], expected_output(x))
    with pytest.raises(RelaxwebError) as caught:
        session.run({"x": random_input(300, seed=2)})
    assert str(caught.value) == (
        "these inputs are too large for this device: input 'x' (storage 0) needs 4800 bytes, "
        f"above the device's WebGPU limit maxStorageBufferBindingSize = {SMALL_BINDING_SIZE}"
    )
    x = random_input(256, seed=3)
    assert_close(session.run({"x": x})["z"], expected_output(x))


def test_unsatisfied_limits_of_fake_adapter_limits() -> None:
    pytest.importorskip("wgpu")
    from relaxweb.runtime.webgpu import load_time_limits, unsatisfied_limits

    available = {"max-storage-buffer-binding-size": 1024, "min-storage-buffer-offset-alignment": 256}
    required = {
        "maxStorageBufferBindingSize": 2048,
        "minStorageBufferOffsetAlignment": 32,
        "maxComputeInvocationsPerWorkgroup": 64,
    }
    assert unsatisfied_limits(available, required) == {
        "maxStorageBufferBindingSize": (2048, 1024),
        "minStorageBufferOffsetAlignment": (32, 256),
        "maxComputeInvocationsPerWorkgroup": (64, None),
    }
    # the int64 weight: 1400 bytes in its shard (8 an element), 700 on the GPU (4 an element)
    manifest = {"required_limits": {"maxStorageBuffersPerShaderStage": 3},
                "dtypes": {"float32": {"device_bytes": 4, "wasm_bytes": 4}, "int64": {"device_bytes": 4, "wasm_bytes": 8}},
                "weights": [{"dtype": "float32", "nbytes": 100}, {"dtype": "int64", "nbytes": 1400}]}
    assert load_time_limits(manifest) == {
        "maxStorageBuffersPerShaderStage": 3, "maxStorageBufferBindingSize": 700, "maxBufferSize": 700,
    }


def test_a_feature_the_adapter_lacks_is_named(gpu_device: Any, tmp_path: Path) -> None:
    from relaxweb.runtime import Session

    offered = {str(feature) for feature in gpu_device.adapter.features}
    lacking = [feature for feature in WEBGPU_FEATURES if feature not in offered]
    if not lacking:
        pytest.skip("this adapter offers every WebGPU feature")
    write_handmade_bundle(tmp_path)
    edit_manifest(tmp_path, lambda manifest: manifest.update(required_features=[lacking[0]]))
    with pytest.raises(RelaxwebError) as caught:
        Session(tmp_path)
    message = str(caught.value)
    assert message.startswith(f"the bundle needs the WebGPU feature {lacking[0]}, which this adapter (")
    assert message.endswith(") does not offer")


def test_a_feature_a_given_device_lacks_is_named(small_device: Any, tmp_path: Path) -> None:
    from relaxweb.runtime import Session

    write_handmade_bundle(tmp_path)
    edit_manifest(tmp_path, lambda manifest: manifest.update(required_features=["shader-f16"]))
    with pytest.raises(RelaxwebError) as caught:
        Session(tmp_path, device=small_device)
    assert str(caught.value) == (
        "the bundle needs the WebGPU feature shader-f16, which the given device does not offer"
    )


def test_a_feature_the_adapter_offers_is_requested(gpu_device: Any, tmp_path: Path) -> None:
    from relaxweb.runtime import Session

    if "shader-f16" not in {str(feature) for feature in gpu_device.adapter.features}:
        pytest.skip("this adapter does not offer shader-f16")
    write_handmade_bundle(tmp_path)
    edit_manifest(tmp_path, lambda manifest: manifest.update(required_features=["shader-f16"]))
    session = Session(tmp_path)
    assert "shader-f16" in {str(feature) for feature in session.device.features}
    x = random_input(4, seed=4)
    assert_close(session.run({"x": x})["z"], expected_output(x))


def test_two_sessions_share_the_default_device(bounded_bundle: Path, unbounded_bundle: Path,
                                               gpu_device: Any) -> None:
    from relaxweb.runtime import Session

    assert Session(bounded_bundle).device is Session(unbounded_bundle).device


def test_session_loads_a_copied_bundle(
    gpu_device: Any, bounded_bundle: Path, tmp_path: Path
) -> None:
    """Nothing in the bundle depends on where it was written."""
    from relaxweb.runtime import Session

    copy = tmp_path / "copy"
    shutil.copytree(bounded_bundle, copy)
    x = random_input(5, seed=5)
    assert_close(Session(copy).run({"x": x})["z"], expected_output(x))


# Values read back: the positives bundle, y = x[x > 0] --------------------------------------


def positives_input(n: int, seed: int = 0) -> np.ndarray:
    """``n`` values in [-1, 1), about half of them positive, with a 0 and a -0 when n > 3."""
    x = rand(n, seed=seed, low=-1, high=1)
    if n > 3:
        x[1], x[3] = 0.0, -0.0
    return x


@pytest.fixture(scope="module")
def positives_bundle(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("positives") / "bundle"
    write_positives_bundle(path)
    return path


@pytest.fixture(scope="module")
def unbounded_positives_bundle(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("positives-unbounded") / "bundle"
    write_positives_bundle(path, bound=None, positive_limit=1_000_000)
    return path


@pytest.fixture(scope="module")
def limited_positives_bundle(tmp_path_factory: pytest.TempPathFactory) -> Path:
    path = tmp_path_factory.mktemp("positives-limited") / "bundle"
    write_positives_bundle(path, positive_limit=3)
    return path


@pytest.fixture
def positives_host(positives_bundle: Path) -> HostModule:
    return HostModule.from_bundle(positives_bundle)


def test_bundle_without_reads_has_no_read_slots(host: HostModule) -> None:
    assert "read_slots" not in host.manifest
    assert host.read_slots == 0
    assert host.read_values() == []
    with pytest.raises(RelaxwebError, match="read slot 0 does not exist"):
        host.write_read_value(0, 1)
    with pytest.raises(RelaxwebError, match="no resume export"):
        host.resume()


def test_host_run_stops_with_a_read_and_sizes_as_if_the_value_were_0(
    unbounded_positives_bundle: Path,
) -> None:
    positives_host = HostModule.from_bundle(unbounded_positives_bundle)
    assert positives_host.read_slots == 1
    positives_host.run_with_shapes([(70,)])
    assert positives_host.commands() == [
        Dispatch(0, (2, 1, 1)),
        Dispatch(1, (1, 1, 1)),
        Read(storage=2, byte_offset=COUNT_BYTE_OFFSET, slot=0),
    ]
    assert positives_host.storage_sizes() == [280, 280, 8, 0]
    assert positives_host.output_shapes() == [(0,)]


def test_host_resume_uses_the_read_value(positives_host: HostModule) -> None:
    positives_host.run_with_shapes([(10,)])
    positives_host.write_read_value(0, 6)
    assert positives_host.read_values() == [6]
    assert positives_host.resume() == 0
    assert positives_host.commands() == [Dispatch(2, (1, 1, 1))]
    assert positives_host.storage_sizes() == [40, 64, 8, 24]
    assert positives_host.output_shapes() == [(6,)]
    assert struct.unpack_from("<4I", positives_host.params(), 512) == (10, 6, 0, 0)


def test_host_resume_error_is_formatted_from_the_manifest(positives_host: HostModule) -> None:
    positives_host.run_with_shapes([(10,)])
    positives_host.write_read_value(0, -7)  # sign-extended: the host sees -7, not 2**32 - 7
    assert positives_host.resume() == 4
    assert positives_host.error_info() == (4, -7, 10)
    with pytest.raises(InputShapeError) as caught:
        positives_host.resume_or_raise()
    assert str(caught.value) == "the number of positive elements read back is -7, outside 0..10"


def test_host_resume_error_above_the_limit(limited_positives_bundle: Path) -> None:
    host = HostModule.from_bundle(limited_positives_bundle)
    host.run_with_shapes([(10,)])
    host.write_read_value(0, 4)
    with pytest.raises(InputShapeError, match="x has 4 positive elements, more than the 3"):
        host.resume_or_raise()


def test_host_write_read_value_checks_the_slot(positives_host: HostModule) -> None:
    with pytest.raises(RelaxwebError, match="read slot 1 does not exist: the bundle has 1"):
        positives_host.write_read_value(1, 0)


def test_read_record_beyond_the_manifests_slots_is_malformed(positives_bundle: Path) -> None:
    manifest = json.loads((positives_bundle / "manifest.json").read_text())
    manifest["read_slots"] = 0
    host = HostModule((positives_bundle / "host.wasm").read_bytes(), manifest)
    host.run_with_shapes([(4,)])
    with pytest.raises(RelaxwebError, match="read record uses slot 0; the manifest has 0"):
        host.commands()


def test_read_slots_without_resume_export_are_refused(bounded_bundle: Path) -> None:
    manifest = json.loads((bounded_bundle / "manifest.json").read_text())
    manifest["read_slots"] = 1
    with pytest.raises(RelaxwebError, match="does not export read_values or resume"):
        HostModule((bounded_bundle / "host.wasm").read_bytes(), manifest)


@pytest.fixture(scope="module")
def positives_session(gpu_device: Any, positives_bundle: Path) -> Any:
    from relaxweb.runtime import Session

    return Session(positives_bundle)


def check_positives(session: Any, x: np.ndarray) -> np.ndarray:
    """Run ``x`` and check ``y`` is ``x[x > 0]``, bit for bit; return ``y``."""
    y = session.run({"x": x})["y"]
    assert y.dtype == np.float32
    np.testing.assert_array_equal(y, x[x > 0])
    assert session.last_dispatch_count == 3
    assert session.last_read_count == 1
    return y


@pytest.mark.parametrize(
    "x",
    [
        positives_input(16, seed=1),
        positives_input(7, seed=2),
        np.zeros(0, dtype=np.float32),  # n = 0, so k = 0
        -np.arange(1, 17, dtype=np.float32),  # k = 0 < n
        np.arange(1, 17, dtype=np.float32),  # k = n = the bound
        np.array([0.0, -0.0, np.nan, 2.5, -np.inf, np.inf], dtype=np.float32),
    ],
    ids=["random16", "random7", "empty", "no-positives", "all-positive", "special-values"],
)
def test_positives_session_matches_numpy(positives_session: Any, x: np.ndarray) -> None:
    check_positives(positives_session, x)


def test_positives_session_allocates_at_bounds_and_never_grows(positives_session: Any) -> None:
    # (an 8-byte storage gets the 16-byte minimum buffer)
    assert positives_session.storage_buffer_sizes == [64, 128, 16, 64]
    for n in (16, 3, 0, 16):
        check_positives(positives_session, positives_input(n, seed=n))
    assert positives_session.storage_buffer_sizes == [64, 128, 16, 64]


def test_positives_session_rejects_n_above_the_bound(positives_session: Any) -> None:
    with pytest.raises(InputShapeError, match=r"dimension 0 \(n\) is 17, above its bound 16"):
        positives_session.run({"x": np.ones(17, dtype=np.float32)})
    check_positives(positives_session, positives_input(5, seed=5))


def test_storage_grown_between_steps_keeps_its_contents(
    gpu_device: Any, unbounded_positives_bundle: Path
) -> None:
    """xc is written before the read and grows after it; the last kernel reads it."""
    from relaxweb.runtime import Session

    session = Session(unbounded_positives_bundle)
    assert session.storage_buffer_sizes == [0, 0, 0, 0]
    x = np.array([1, -2, 3, 4, -5, 6, 7, -8], dtype=np.float32)  # k = 5
    check_positives(session, x)
    # run() sized xc for k = 0 (32 bytes); resume() asked for (8 + 5) * 4 = 52.  The last
    # storage (5 * 4 = 20 bytes after the read) started at the 16-byte minimum and doubled.
    assert session.storage_buffer_sizes == [32, 64, 16, 32]


@pytest.mark.parametrize("sizes", [[3, 40, 300, 1000, 5], [1000, 0, 64]])
def test_unbounded_positives_session_grows_across_and_within_runs(
    gpu_device: Any, unbounded_positives_bundle: Path, sizes: list[int]
) -> None:
    from relaxweb.runtime import Session

    session = Session(unbounded_positives_bundle)
    for n in sizes:
        check_positives(session, positives_input(n, seed=n))
    check_positives(session, np.ones(2000, dtype=np.float32))  # k = n, everything grows


def test_failing_resume_raises_the_manifest_message(
    gpu_device: Any, limited_positives_bundle: Path
) -> None:
    from relaxweb.runtime import Session

    session = Session(limited_positives_bundle)
    x = np.array([1, 2, -3, 4, 5], dtype=np.float32)
    with pytest.raises(InputShapeError) as caught:
        session.run({"x": x})
    assert isinstance(caught.value, RelaxwebError)
    assert str(caught.value) == (
        "output 'y': x has 4 positive elements, more than the 3 this bundle allows"
    )
    check_positives(session, np.array([1, -2, 3], dtype=np.float32))  # still usable


def test_a_shared_device_keeps_the_features_it_was_made_with(gpu_device: Any) -> None:
    """A bundle that needs one feature, then one that needs another: the second shared device
    must still offer the first feature (a third session needing it must not replace it)."""
    from relaxweb.runtime.webgpu import default_adapter, default_device

    if not {"shader-f16", "shader-i16"} <= {str(feature) for feature in default_adapter().features}:
        pytest.skip("this adapter does not offer shader-f16 and shader-i16")
    # the profiling sessions' device: the tests' other sessions keep theirs as it is
    first = default_device(required_features=["shader-f16"], profiling=True)
    second = default_device(required_features=["shader-i16"], profiling=True)
    assert {"shader-f16", "shader-i16"} <= {str(feature) for feature in second.features}
    assert default_device(required_features=["shader-f16"], profiling=True) is second
    assert "shader-f16" in {str(feature) for feature in first.features}
