"""Run a bundle on WebGPU from Python, with wgpu-py (wgpu-native).

:class:`Session` loads a bundle folder once (weights, pipelines, buffers) and then runs it
as many times as wanted, following "One run" in ``docs/bundle-format.md`` step by step.
It mirrors the browser runtime (``relaxweb/runtime_js/``): the same files, the same steps,
nothing model-specific.
"""

from __future__ import annotations

import os
import re
import struct
import tempfile
import time
import warnings
from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

# Mesa's Vulkan drivers print "error: XDG_RUNTIME_DIR is invalid" on stderr when probing for
# a display on a machine without a session (CI, containers); give them a private folder so
# our own one-line "error: ..." messages are the only ones a user sees.
if not os.environ.get("XDG_RUNTIME_DIR"):
    os.environ["XDG_RUNTIME_DIR"] = tempfile.mkdtemp(prefix="relaxweb-xdg-")

import wgpu  # noqa: E402  (after the environment fix above)

from relaxweb.errors import RelaxwebError
from relaxweb.runtime.batch import (
    ONE_BY_ONE, RAGGED, BatchReport, check_instance_count, one_by_one_reason, run_one_by_one,
)
from relaxweb.runtime.generate import Generation, generate
from relaxweb.runtime.gpu_tensor import BufferPool, CacheView, GpuTensor, TransferStats, cache_block_copies
from relaxweb.runtime.host import Command, Dispatch, HostModule, Read, Resume, load_manifest
from relaxweb.runtime.manifest import MAX_HOST_MODULE_BYTES, kernel_source, read_bundle_file
from relaxweb.runtime.profile import SUBMITS, TIMESTAMPS, DispatchTime, Profile, params_fields, summarize
from relaxweb.runtime.tensors import (
    SEQUENCE_KINDS, checked_inputs, device_byte_sizes, device_dtype, dtype_entry, load_shards, output_array, sequence_output_tables,
    split_sequences, to_model_dtype, with_flat_sequences,
)
from relaxweb.runtime.webgpu_batch import RaggedBatchRunner
from relaxweb.tokenizer import make_tokenizer

_STORAGE_USAGE = wgpu.BufferUsage.STORAGE | wgpu.BufferUsage.COPY_DST | wgpu.BufferUsage.COPY_SRC
_WEIGHT_USAGE = wgpu.BufferUsage.STORAGE | wgpu.BufferUsage.COPY_DST
_PARAMS_USAGE = wgpu.BufferUsage.UNIFORM | wgpu.BufferUsage.COPY_DST
_READBACK_USAGE = wgpu.BufferUsage.MAP_READ | wgpu.BufferUsage.COPY_DST
_QUERY_RESOLVE_USAGE = wgpu.BufferUsage.QUERY_RESOLVE | wgpu.BufferUsage.COPY_SRC


# Devices and limits ----------------------------------------------------------------------


def wgpu_limit_name(name: str) -> str:
    """wgpu-py's name for a WebGPU limit: ``maxStorageBufferBindingSize`` ->
    ``max-storage-buffer-binding-size`` (names already in that form are kept)."""
    return re.sub(r"([a-z])([A-Z0-9])", r"\1-\2", name).lower()


def _limit_is_satisfied(name: str, available: int, needed: int) -> bool:
    """``min*`` limits (alignments) are better when smaller, all others when larger."""
    if wgpu_limit_name(name).startswith("min-"):
        return available <= needed
    return available >= needed


def unsatisfied_limits(
    available_limits: Mapping[str, int], required_limits: Mapping[str, int]
) -> dict[str, tuple[int, int | None]]:
    """``{manifest name: (needed, available)}`` for each required limit not met.

    ``available`` is ``None`` when ``available_limits`` does not know the limit at all.
    """
    missing: dict[str, tuple[int, int | None]] = {}
    for name, needed in required_limits.items():
        available = available_limits.get(wgpu_limit_name(name))
        if available is None or not _limit_is_satisfied(name, available, needed):
            missing[name] = (needed, available)
    return missing


def missing_features(available_features: Any, required_features: Any) -> list[str]:
    """The required WebGPU features (``"shader-f16"``, ...) that ``available_features`` lacks,
    in the order they are required."""
    available = {str(feature) for feature in available_features}
    return [feature for feature in required_features if feature not in available]


def _missing_feature_message(missing: list[str], provider: str) -> str:
    names = ", ".join(missing)
    noun = "feature" if len(missing) == 1 else "features"
    return f"the bundle needs the WebGPU {noun} {names}, which {provider} does not offer"


_default_adapter: wgpu.GPUAdapter | None = None
#: The feature that lets a profile time each dispatch on the GPU; requested only for profiling.
TIMESTAMP_QUERY = "timestamp-query"


@dataclass
class _SharedDevice:
    """A device kept for every :class:`Session` not given one, and what was requested for it."""

    device: wgpu.GPUDevice | None = None
    limits: dict[str, int] = field(default_factory=dict)
    features: list[str] = field(default_factory=list)


# Sessions that profile get a device of their own (with timestamp queries where the adapter
# has them), so that the device of sessions that do not profile never has the feature.
_shared_devices = {False: _SharedDevice(), True: _SharedDevice()}


def default_adapter() -> wgpu.GPUAdapter:
    """The process-wide adapter (high-performance preference), created on first use."""
    global _default_adapter
    if _default_adapter is None:
        _default_adapter = wgpu.gpu.request_adapter_sync(power_preference="high-performance")
        if _default_adapter is None:
            raise RelaxwebError("no WebGPU adapter is available on this machine")
    return _default_adapter


def default_device(
    required_limits: Mapping[str, int] | None = None, required_features: Any = (), *, profiling: bool = False
) -> wgpu.GPUDevice:
    """A device shared by every :class:`Session` not given one, meeting ``required_limits``
    and offering ``required_features``.

    Creating a device is slow, so one is kept and reused.  When a bundle needs a limit or a
    feature the shared device lacks, a new device is requested with that limit raised (and
    every limit raised before) and every feature requested so far, and it becomes the
    shared device.  Only limits the current device does not meet are requested, because
    wgpu gives a device exactly the requested value even when it is worse than the default.

    With ``profiling``, the device is another shared one that also has ``timestamp-query``
    when the adapter offers it (profiles then time each dispatch on the GPU).
    """
    shared = _shared_devices[profiling]
    required_limits = dict(required_limits or {})
    required_features = list(required_features or ())
    adapter = default_adapter()
    if profiling and TIMESTAMP_QUERY in adapter.features and TIMESTAMP_QUERY not in required_features:
        required_features.append(TIMESTAMP_QUERY)
    if (
        shared.device is not None
        and not unsatisfied_limits(shared.device.limits, required_limits)
        and not missing_features(shared.device.features, required_features)
    ):
        return shared.device

    adapter_name = adapter.info.get("device") or "unknown"
    problems = _device_problems(
        adapter, required_limits, required_features, f"this adapter ({adapter_name})"
    )
    if problems:
        raise RelaxwebError(problems)

    # every feature requested so far stays requested (a later device replaces this one)
    for feature in required_features:
        if feature not in shared.features:
            shared.features.append(feature)
    # The first time, a device with default limits shows which limits need requesting.
    device = shared.device or adapter.request_device_sync(
        label="relaxweb", required_features=list(shared.features)
    )
    lacking = unsatisfied_limits(device.limits, required_limits)
    new_features = missing_features(device.features, shared.features)
    if lacking or new_features:
        for name in lacking:
            shared.limits[wgpu_limit_name(name)] = required_limits[name]
        device = adapter.request_device_sync(
            label="relaxweb",
            required_limits=dict(shared.limits),
            required_features=list(shared.features),
        )
    shared.device = device
    return device


def _check_device_limits(
    device: wgpu.GPUDevice, required_limits: Mapping[str, int], required_features: Any = ()
) -> None:
    """Raise a readable error when a caller-supplied device lacks a required feature or limit."""
    problems = _device_problems(device, required_limits, required_features, "the given device")
    if problems:
        raise RelaxwebError(problems)


def _device_problems(
    gpu: Any, required_limits: Mapping[str, int], required_features: Any, provider: str
) -> str:
    """Every missing feature and unmet limit of ``gpu`` (an adapter or a device) in one
    message, or ``""`` when it can load the bundle."""
    problems = []
    lacking_features = missing_features(gpu.features, required_features)
    if lacking_features:
        problems.append(_missing_feature_message(lacking_features, provider))
    shortfalls = unsatisfied_limits(gpu.limits, required_limits)
    if shortfalls:
        problems.append(_shortfall_message(shortfalls, provider))
    return "; ".join(problems)


def _shortfall_message(shortfalls: Mapping[str, tuple[int, int | None]], provider: str) -> str:
    """One readable line per limit that ``provider`` (adapter or device) cannot meet."""
    lines = []
    for name, (needed, available) in shortfalls.items():
        offered = "does not know this limit" if available is None else f"offers {available}"
        lines.append(
            f"the bundle needs the WebGPU limit {name} = {needed}, but {provider} {offered}"
        )
    return "; ".join(lines)


def load_time_limits(manifest: Mapping[str, Any]) -> dict[str, int]:
    """The limits a device must meet to load a bundle: the manifest's ``required_limits``,
    with the buffer size limits raised to the largest weight when that is larger (bundles
    whose storages have no bound give no buffer size limits, but their weights still need
    buffers of a known size), and ``maxBufferSize`` at least ``maxStorageBufferBindingSize``."""
    limits = dict(manifest.get("required_limits", {}))
    # a weight in parts needs a binding of its smallest part only
    largest = max((smallest_part_bytes(w["nbytes"], w.get("parts", 1)) for w in manifest.get("weights", [])), default=0)
    # A buffer bound whole is at least as large as its binding.
    largest = max(largest, limits.get("maxStorageBufferBindingSize", 0))
    if largest:
        for name in ("maxStorageBufferBindingSize", "maxBufferSize"):
            limits[name] = max(limits.get(name, 0), largest)
    return limits


def _storage_size_limit(device: wgpu.GPUDevice, caps: Mapping[str, int] | None = None) -> tuple[int, str]:
    """The largest storage buffer ``device`` can bind, and the name of the limit that says so;
    ``caps``: lower values of those limits the caller asked a session to keep to."""
    caps = caps or {}
    binding = min(device.limits["max-storage-buffer-binding-size"], caps.get("maxStorageBufferBindingSize", 1 << 62))
    buffer = min(device.limits["max-buffer-size"], caps.get("maxBufferSize", 1 << 62))
    if buffer < binding:
        return buffer, "maxBufferSize"
    return binding, "maxStorageBufferBindingSize"


# Weights in parts ------------------------------------------------------------------------

# Every part of a weight in parts but the last holds a multiple of this many bytes (the twin
# of relaxweb/ir/launch.PART_ALIGNMENT; docs/bundle-format.md, "Weights in parts").
PART_ALIGNMENT = 256
CAPPED_LIMITS = ("maxStorageBufferBindingSize", "maxBufferSize")  # what ``limits=`` may lower


def smallest_part_bytes(nbytes: int, parts: int) -> int:
    """The smallest binding size (a multiple of 256) at which ``parts`` parts hold ``nbytes``."""
    if parts == 1:
        return nbytes
    share = -(-nbytes // parts)
    return -(-share // PART_ALIGNMENT) * PART_ALIGNMENT


def parts_at_limit(nbytes: int, parts: int, largest: int) -> list[int] | None:
    """The byte sizes of the buffers holding a weight of ``nbytes`` bound in up to ``parts``
    parts on a device binding at most ``largest`` bytes: the whole weight when it fits, else
    parts of ``largest`` rounded down to 256 bytes and the rest; None when ``parts`` are too few."""
    if nbytes <= largest:
        return [nbytes]
    part = largest // PART_ALIGNMENT * PART_ALIGNMENT
    if part == 0 or -(-nbytes // part) > parts:
        return None
    return [min(part, nbytes - start) for start in range(0, nbytes, part)]


def checked_limit_caps(limits: Mapping[str, int] | None) -> dict[str, int]:
    """The ``limits=`` of a session: lower buffer size limits to split weights at."""
    caps = dict(limits or {})
    for name, value in caps.items():
        if name not in CAPPED_LIMITS:
            raise ValueError(f"limits may lower {' and '.join(CAPPED_LIMITS)}, not {name!r}")
        if not isinstance(value, int) or value < PART_ALIGNMENT:
            raise ValueError(f"limits: {name} must be an integer of at least {PART_ALIGNMENT}, got {value!r}")
    return caps


# Small helpers ---------------------------------------------------------------------------


def gpu_buffer_size(byte_size: int) -> int:
    """The doc's GPU buffer size for ``byte_size`` bytes: at least 16 (a kernel may bind it
    as ``array<vec4<f32>>``, whose smallest binding is 16 bytes, even when it is empty), a
    multiple of 4."""
    return max(16, (byte_size + 3) // 4 * 4)


def _padded_to_multiple_of_4(data: bytes | memoryview) -> bytes | memoryview:
    """``write_buffer`` needs a size that is a multiple of 4; pad with zeros if needed."""
    remainder = len(data) % 4
    return data if remainder == 0 else bytes(data) + bytes(4 - remainder)


def _first_reason(text: str) -> str:
    """The most telling line of a wgpu error (it spans many lines with source excerpts)."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    telling = [line for line in lines if not line.startswith(("Caused by", "In wgpu", "Validation Error", "┌", "│", "^"))]
    return (telling or lines or ["no reason given"])[0][:300]


KERNEL_VARIANTS = ("auto", "gpu", "cpu", "f16")  # which shaders of kernels with a variant a session compiles
SHADER_F16 = "shader-f16"  # the WebGPU feature the f16 shaders (``f16_file``) need


def choose_kernels(requested: str, adapter_info: Mapping[str, Any], features: Any, *, has_f16_shaders: bool) -> str:
    """The shaders a session compiles ("gpu", "cpu" or "f16") for the ``kernels`` option.

    "auto" takes the CPU shaders on an adapter that runs shaders on the CPU (lavapipe,
    SwiftShader: wgpu's ``adapter_type``), where kernels with a ``cpu_file`` run faster from
    it, else the f16 ones when the bundle has some and the adapter (or the given device)
    offers ``shader-f16``, else the staged f32 ones.  "f16" falls back to "gpu" where the
    feature or the f16 shaders are missing (the outputs are then within f32's tolerance, not
    f16's; ``Session`` warns).  ``adapter_info`` and ``features`` are the adapter's (wgpu's
    ``adapter.info``), or the given device's."""
    f16 = has_f16_shaders and SHADER_F16 in {str(feature) for feature in features}
    if requested == "auto":
        return "cpu" if adapter_info.get("adapter_type") == "CPU" else "f16" if f16 else "gpu"
    if requested == "f16" and not f16:
        return "gpu"
    return requested


def kernel_file(kernel: Mapping[str, Any], kernels: str) -> str:
    """The shader file a session that chose ``kernels`` compiles for a manifest kernel."""
    variant = {"cpu": "cpu_file", "f16": "f16_file"}.get(kernels)
    return kernel.get(variant, kernel["file"]) if variant else kernel["file"]


def _session_kernels(requested: str, manifest: Mapping[str, Any], device: wgpu.GPUDevice | None) -> str:
    """:func:`choose_kernels` for the given device, or for the default adapter (whose device
    is then requested with ``shader-f16`` when the choice is "f16"); a warning when "f16"
    was asked for and cannot be had."""
    has_f16_shaders = any("f16_file" in kernel for kernel in manifest["kernels"])
    if device is None:
        adapter = default_adapter()
        chosen = choose_kernels(requested, adapter.info, adapter.features, has_f16_shaders=has_f16_shaders)
    else:
        chosen = choose_kernels(requested, device.adapter_info, device.features, has_f16_shaders=has_f16_shaders)
    if requested == "f16" and chosen != "f16":
        reason = ("the bundle has no f16 shaders" if not has_f16_shaders else
                  f"the {'adapter' if device is None else 'given device'} does not offer {SHADER_F16}")
        warnings.warn(f"kernels='f16': {reason}; compiling the f32 shaders", RuntimeWarning, stacklevel=3)
    return chosen


# The session -----------------------------------------------------------------------------


class Session:
    """A bundle loaded on a WebGPU device, ready to :meth:`run`.

    Attributes:
        manifest: the bundle's ``manifest.json`` as a dict.
        device: the wgpu device everything lives on.
        host: the bundle's host module (shape checks, command list).
        last_dispatch_count: how many dispatches the last :meth:`run` recorded, over all
            its steps.
        last_read_count: how many values the last :meth:`run` read back from the GPU (one
            per step but the last; 0 for bundles without reads).
        stats: the :class:`~relaxweb.runtime.gpu_tensor.TransferStats` of its GPU calls:
            ``stats.total`` since it was created (load included), ``stats.last_run`` since
            the last :meth:`run` started (buffers created, input / params / weight bytes
            written from the host, bytes read back).
        weight_part_sizes: for each weight the bundle binds in parts, by name, the byte
            sizes of the buffers it was loaded into (one: the device binds it whole).

    ``profiling=True`` (without a ``device``) loads it on a device with the adapter's
    ``timestamp-query`` feature when it has one, for :meth:`profile`; otherwise the feature
    is never requested.

    ``backend`` is ``"webgpu"`` (``wasm_session.WasmSession``'s is ``"wasm"``).

    ``limits`` (``{"maxStorageBufferBindingSize": n, "maxBufferSize": n}``, either) lowers the
    buffer size limits that weights the bundle binds in parts are split at, to split them as
    a device that offers only those would (to check a bundle for such devices, and in tests);
    storages are still sized against the device's own limits.
    """

    backend = "webgpu"

    def __init__(self, bundle_dir: str | Path, device: wgpu.GPUDevice | None = None, *, profiling: bool = False,
                 kernels: str = "auto", limits: Mapping[str, int] | None = None) -> None:
        self.limits = checked_limit_caps(limits)
        if kernels not in KERNEL_VARIANTS:
            raise ValueError(f"kernels must be one of {', '.join(KERNEL_VARIANTS)}, got {kernels!r}")
        self.bundle_dir = Path(bundle_dir)
        self.stats = TransferStats()
        # buffers of disposed GpuTensors, for the next kept outputs
        self._gpu_tensor_pool = BufferPool()
        self.manifest: dict[str, Any] = load_manifest(self.bundle_dir)
        #: the bundle's tokenizer (``relaxweb/tokenizer.py``), or None when it has none
        self.tokenizer = make_tokenizer(self.manifest["tokenizer"]) if "tokenizer" in self.manifest else None
        self.host = HostModule(
            read_bundle_file(self.bundle_dir, "host.wasm", MAX_HOST_MODULE_BYTES, "the host module"), self.manifest
        )
        self.last_dispatch_count = 0
        self.last_read_count = 0

        required_limits = load_time_limits(self.manifest)
        required_features = list(self.manifest.get("required_features", []))
        # which shaders of kernels with a variant to compile ("gpu", "cpu" or "f16")
        self.kernels = _session_kernels(kernels, self.manifest, device)
        if self.kernels == "f16" and SHADER_F16 not in required_features:
            required_features.append(SHADER_F16)
        if device is None:
            device = default_device(required_limits, required_features, profiling=profiling)
        else:
            _check_device_limits(device, required_limits, required_features)
        self.device: wgpu.GPUDevice = device

        self._weight_parts: dict[int, list[wgpu.GPUBuffer]] = {}  # the buffers of weights in parts, by weight
        # the byte sizes a weight in parts was loaded as, by name: one when the device binds it whole
        self.weight_part_sizes: dict[str, list[int]] = {}
        self._weight_buffers = self._create_weight_buffers(self._load_shards())
        self._params_buffer = self._create_buffer(
            label="params", size=self.manifest["params_bytes"], usage=_PARAMS_USAGE
        )
        self._storage_buffers = self._create_storage_buffers_at_bounds()
        # KV caches (manifest "caches"): by input index and by output index
        self._cache_of_input = {cache["input"]: cache for cache in self.manifest.get("caches", [])}
        self._cache_of_output = {cache["output"]: cache for cache in self.manifest.get("caches", [])}
        for cache in self._cache_of_input.values():  # allocated at load even when other storages are not
            if self._storage_buffers[cache["storage"]] is None:
                self._storage_buffers[cache["storage"]] = self._create_storage_buffer(
                    cache["storage"], self.manifest["storages"][cache["storage"]]["size_at_bounds"])
        # runs that started writing the GPU: a view of a cache is current while it is this run's
        self._run_number = 0
        # what a kept output's buffer is sized at: its storage's size at the bounds (None: unbounded)
        self._storage_sizes_at_bounds = self.host.sizes_at_bounds()
        self._readback_buffers: list[wgpu.GPUBuffer | None] = [None] * len(
            self.manifest["outputs"]
        )
        # Where a value read back mid-run lands (4 bytes, made on the first read).
        self._read_staging_buffer: wgpu.GPUBuffer | None = None
        self._bind_group_layouts, self._pipelines = self._create_pipelines()
        # One bind group per call site, built on first use and dropped when a storage it
        # binds is reallocated.
        self._bind_groups: list[wgpu.GPUBindGroup | None] = [None] * len(
            self.manifest["call_sites"]
        )
        #: how the last :meth:`run_batch` ran (``runtime/batch.BatchReport``)
        self.last_batch: BatchReport | None = None
        self._batch_runner: RaggedBatchRunner | None = None

    @property
    def storage_buffer_sizes(self) -> list[int]:
        """The byte size of each storage's GPU buffer (0: not allocated yet)."""
        return [0 if buffer is None else buffer.size for buffer in self._storage_buffers]

    # Loading -----------------------------------------------------------------------------

    def _load_shards(self) -> list[bytes]:
        """Read every weight shard, checking its size and sha256 against the manifest."""
        return load_shards(self.bundle_dir, self.manifest)

    def _create_weight_buffers(self, shards: list[bytes]) -> list[wgpu.GPUBuffer]:
        """One read-only GPU buffer per weight, filled from its shard (a weight in parts:
        its first part's, the others in ``self._weight_parts``)."""
        buffers = []
        for index, weight in enumerate(self.manifest["weights"]):
            data = shards[weight["shard"]][weight["offset"]:weight["offset"] + weight["nbytes"]]
            if weight.get("parts", 1) > 1:
                self._weight_parts[index] = self._create_weight_parts(weight, memoryview(data))
                buffers.append(self._weight_parts[index][0])
                continue
            buffer = self._create_buffer(
                label=f"weight {weight['name']}",
                size=gpu_buffer_size(weight["nbytes"]),
                usage=_WEIGHT_USAGE,
            )
            if data:
                self._write_buffer(buffer, _padded_to_multiple_of_4(data), "weight_bytes_written")
            buffers.append(buffer)
        return buffers

    def _create_weight_parts(self, weight: Mapping[str, Any], data: memoryview) -> list[wgpu.GPUBuffer]:
        """The buffers bound for each part of a weight in parts: the whole weight in one when
        the device binds it (the other parts a 16-byte placeholder), else parts as large as
        the device binds (docs/bundle-format.md, "Weights in parts")."""
        largest, limit_name = _storage_size_limit(self.device, self.limits)
        sizes = parts_at_limit(weight["nbytes"], weight["parts"], largest)
        if sizes is None:
            raise RelaxwebError(
                f"weight '{weight['name']}' has {weight['nbytes']} bytes, above the device's WebGPU limit "
                f"{limit_name} = {largest}, and the bundle binds it in at most {weight['parts']} parts"
            )
        self.weight_part_sizes[weight["name"]] = sizes
        buffers, start = [], 0
        for part, size in enumerate(sizes):
            buffer = self._create_buffer(label=f"weight {weight['name']} part {part}",
                                         size=gpu_buffer_size(size), usage=_WEIGHT_USAGE)
            self._write_buffer(buffer, _padded_to_multiple_of_4(data[start:start + size]), "weight_bytes_written")
            buffers.append(buffer)
            start += size
        if len(buffers) < weight["parts"]:
            placeholder = self._create_buffer(label="unused weight part", size=16, usage=_WEIGHT_USAGE)
            buffers += [placeholder] * (weight["parts"] - len(buffers))
        return buffers

    def _create_storage_buffers_at_bounds(self) -> list[wgpu.GPUBuffer | None]:
        """Storage buffers sized at the bounds, or all ``None`` (made per run) when some
        var is unbounded and ``sizes_at_bounds`` cannot size them."""
        sizes = self.host.sizes_at_bounds()
        if sizes is None:
            return [None] * self.host.storage_count
        largest, limit_name = _storage_size_limit(self.device)
        for index, size in enumerate(sizes):
            if size > largest:
                raise RelaxwebError(
                    f"the bundle needs the WebGPU limit {limit_name} = {size} (storage {index} at "
                    f"the bounds), but the device offers {largest}"
                )
        return [self._create_storage_buffer(index, size) for index, size in enumerate(sizes)]

    def _create_storage_buffer(self, index: int, byte_size: int) -> wgpu.GPUBuffer:
        role = self.manifest["storages"][index]["role"]
        return self._create_buffer(
            label=f"storage {index} ({role})", size=gpu_buffer_size(byte_size), usage=_STORAGE_USAGE
        )

    def _create_pipelines(
        self,
    ) -> tuple[list[wgpu.GPUBindGroupLayout], list[wgpu.GPUComputePipeline]]:
        """One compute pipeline per kernel, with a bind group layout from its ``bindings``."""
        layouts = []
        pipelines = []
        for kernel in self.manifest["kernels"]:
            layout = self.device.create_bind_group_layout(
                label=kernel["name"],
                entries=[
                    {
                        "binding": binding,
                        "visibility": wgpu.ShaderStage.COMPUTE,
                        "buffer": {"type": binding_type},
                    }
                    for binding, binding_type in enumerate(kernel["bindings"])
                ],
            )
            file = kernel_file(kernel, self.kernels)
            source = kernel_source(self.bundle_dir, file)
            try:
                shader = self.device.create_shader_module(label=kernel["name"], code=source)
                pipeline = self.device.create_compute_pipeline(
                    label=kernel["name"],
                    layout=self.device.create_pipeline_layout(bind_group_layouts=[layout]),
                    compute={"module": shader, "entry_point": kernel["entry_point"]},
                )
            except wgpu.GPUError as error:
                raise RelaxwebError(
                    f"kernel {file} does not compile on this device: {_first_reason(str(error))}"
                ) from None
            layouts.append(layout)
            pipelines.append(pipeline)
        return layouts, pipelines

    # One run -----------------------------------------------------------------------------

    def run(self, inputs: Mapping[str, np.ndarray | GpuTensor],
            keep_on_gpu: bool | Iterable[str] = False) -> dict[str, np.ndarray | GpuTensor]:
        """Run the model on ``inputs`` (name -> array) and return its outputs by name.

        ``keep_on_gpu`` (a list of output names, or True for every output but sequences)
        returns those outputs as :class:`~relaxweb.runtime.gpu_tensor.GpuTensor`\\ s: a copy
        on the GPU in a buffer of their own, nothing read back.  A ``GpuTensor`` (of this
        session's device) is accepted as an input like an array of its dtype and shape, and
        copied on the GPU into the input's storage by the run's first command encoder.

        Raises :class:`InputShapeError` when an input is missing, unknown, of the wrong
        dtype or rank, or when the host module rejects the shapes (e.g. a bound exceeded)
        or a value read back from the GPU (its ``resume`` returns an error code).

        One step per command list: a list that ends with a :class:`Read` is submitted, the
        value is read and given to the host's ``resume``, which writes the next list; one
        that ends with a :class:`Resume` (a loop's iteration) is submitted and resumed at
        once.  Storages that grow between two steps keep their contents.
        """
        return self._run(inputs, None, keep_on_gpu)

    def run_batch(self, instances: Sequence[Mapping[str, np.ndarray]]) -> list[dict[str, np.ndarray]]:
        """Run the model on each of ``instances`` (a list of ``name -> array``, each with its
        own values of the model's symbolic sizes within their bounds) and return their outputs,
        one dict per instance, in order.

        The instances run as one ragged batch (``runtime/batch.py``): each kernel is dispatched
        once for all the instances that run it, over each instance's own sizes, their data
        packed without padding; instances whose ``If`` conditions differ share every dispatch
        but their branches'.  Every instance is checked and sized before any GPU work: one
        outside the bounds raises :class:`InputShapeError`, a batch whose packed size exceeds a
        device limit a :class:`RelaxwebError`, each naming the instance.  Bundles that cannot
        batch (``last_batch.reason``: a kernel without a ragged form, KV caches, sequences) run
        the instances one after another.  ``last_batch`` reports how it ran."""
        check_instance_count(len(instances))
        report = BatchReport(instances=len(instances))
        self.stats.start_run()
        reason = one_by_one_reason(self.manifest, instances)
        if reason or not instances:
            report.mode, report.reason = (ONE_BY_ONE, reason) if reason else (RAGGED, "")
            results = run_one_by_one(self, instances, report)
        else:
            if self._batch_runner is None:
                self._batch_runner = RaggedBatchRunner(self)
            results = self._batch_runner.run(instances, report)
        self.last_batch = report
        return results

    def storage_size_limit(self) -> tuple[int, str]:
        """The largest storage buffer this device binds, and the WebGPU limit that says so."""
        return _storage_size_limit(self.device)

    def bind_group_layout(self, kernel_index: int) -> wgpu.GPUBindGroupLayout:
        """The bind group layout of a kernel (its own and its ragged form share it)."""
        return self._bind_group_layouts[kernel_index]

    def referenced_buffer(self, reference: Mapping[str, int]) -> wgpu.GPUBuffer:
        """The buffer of a call site's ``{"weight": j}`` or ``{"weight_part": [j, k]}`` reference
        (or ``{"storage": i}``: this session's single-run storage)."""
        return self._referenced_buffer(reference)

    def generate(self, prompt: str | Sequence[int], *, max_new_tokens: int = 64, temperature: float = 0.0,
                 top_k: int = 0, seed: int = 0, stop_tokens: Iterable[int] | None = None,
                 on_token: Callable[[int, str], Any] | None = None) -> Generation:
        """Generate up to ``max_new_tokens`` tokens after ``prompt`` (text, encoded by the
        bundle's tokenizer, or token ids) with a decoder bundle (``runtime/generate.py``: which
        bundles can, and how): greedy when ``temperature`` is 0, else sampled from
        softmax(logits / temperature) over the ``top_k`` largest logits (0: all), with random
        numbers from ``seed``; the next token is picked on the GPU and only it is read back.
        It stops at a token of ``stop_tokens`` (default: the tokenizer's EOS; not included),
        after ``max_new_tokens``, or when ``on_token(token, text_so_far)`` (called once per
        token, the text holding complete characters only) returns False.  Returns a
        :class:`~relaxweb.runtime.generate.Generation` (``tokens``, ``text``, ``stopped``:
        "eos", "length" or "aborted", ``tokens_per_second``, ``prefill_ms``); every GpuTensor
        it made is disposed."""
        return generate(self, prompt, max_new_tokens=max_new_tokens, temperature=temperature, top_k=top_k, seed=seed,
                        stop_tokens=stop_tokens, on_token=on_token)

    def profile(self, inputs: Mapping[str, np.ndarray], *, warmup: int = 1) -> Profile:
        """Run the model ``warmup`` times, then once like :meth:`run` timing each dispatch
        (drivers compile a pipeline on its first use), and return the
        :class:`~relaxweb.runtime.profile.Profile`: its outputs (``.outputs``, the same as
        :meth:`run` gives), one row per kernel (calls, time, FLOPs and bytes) and the table
        of the slowest (``.table()``).

        Dispatches are timed by timestamp queries (a compute pass each, timestamps at its
        start and end) where the device has ``timestamp-query`` (load with
        ``profiling=True``), otherwise by one submit per dispatch, timing the wall clock
        until the queue has done it (which adds the submit's overhead to every dispatch).
        """
        for _ in range(warmup):
            self._run(inputs, None)
        timer: _DispatchTimer
        if TIMESTAMP_QUERY in self.device.features:
            timer = _TimestampTimer(self)
        else:
            timer = _SubmitTimer(self)
        outputs = self._run(inputs, timer)
        profile = summarize(self.manifest, timer.times(), timer.method)
        profile.outputs = outputs
        return profile

    def _run(self, inputs: Mapping[str, np.ndarray | GpuTensor], timer: "_DispatchTimer | None",
             keep_on_gpu: bool | Iterable[str] = False) -> dict[str, Any]:
        """:meth:`run`, with each dispatch timed by ``timer`` when one is given."""
        kept = self._kept_output_indices(keep_on_gpu)
        self.stats.start_run()
        arrays, sequences = self._checked_inputs(inputs)
        for index, shapes in sequences.items():
            entry = self.manifest["inputs"][index]
            self.host.write_sequence(entry["name"], entry["sequence"], shapes)
        self.host.run_with_shapes([() if index in sequences else array.shape for index, array in enumerate(arrays)])
        commands = self._checked_commands()
        # Before the first step nothing of this run is on the GPU yet: no copies needed.
        self._grow_storages(self.host.storage_sizes())
        # GpuTensor inputs, copied into their storages by the first step's encoder (before the
        # run number moves on: the current views of caches are read now)
        input_copies = self._gpu_tensor_input_copies(arrays)
        self._run_number += 1  # every cache is written from here on: older views are stale
        self._upload_inputs(arrays)

        dispatch_count = 0
        read_count = 0
        # (old buffer, new buffer) of storages grown since the last submit; the old
        # contents are copied over at the start of the next step.
        carried_over: list[tuple[wgpu.GPUBuffer, wgpu.GPUBuffer]] = []
        # old buffers copied by steps submitted without a wait (resume records), destroyed
        # once the run's last submit is done
        retired: list[tuple[wgpu.GPUBuffer, wgpu.GPUBuffer]] = []
        while True:
            params = self.host.params()
            self._write_buffer(self._params_buffer, params, "params_bytes_written")
            encoder = self._encode_step(commands, carried_over, timer, params, input_copies)
            input_copies = []
            dispatch_count += sum(isinstance(command, Dispatch) for command in commands)
            last = commands[-1] if commands else None
            if isinstance(last, Read):
                value = self._read_value(encoder, last)
                self._destroy_old_buffers(carried_over)
                read_count += 1
                self.host.write_read_value(last.slot, value)
            elif isinstance(last, Resume):
                self.device.queue.submit([encoder.finish()])
                retired += carried_over
            else:
                break
            self.host.resume_or_raise()
            commands = self._checked_commands()
            carried_over = self._grow_storages(self.host.storage_sizes(), keep_contents=True)

        output_shapes = self.host.output_shapes()
        # a sequence output is read as one flat array of its elements' values, then split
        sequence_shapes = sequence_output_tables(self.manifest, self.host)
        output_shapes = with_flat_sequences(output_shapes, sequence_shapes)
        output_byte_sizes = device_byte_sizes(self.manifest, output_shapes)
        self._grow_readback_buffers(output_byte_sizes, kept)
        kept_tensors = self._keep_outputs(encoder, kept, output_shapes, output_byte_sizes)
        self._copy_outputs_and_submit(encoder, output_byte_sizes, kept, output_shapes)
        outputs = self._read_outputs(output_shapes, output_byte_sizes, kept)
        outputs = {name: kept_tensors[name] if name in kept_tensors else outputs[name] for name in
                   (output["name"] for output in self.manifest["outputs"])}
        outputs = split_sequences(self.manifest, outputs, sequence_shapes)
        self._destroy_old_buffers(carried_over + retired)
        self.last_dispatch_count = dispatch_count
        self.last_read_count = read_count
        return outputs

    def _checked_inputs(self, inputs: Mapping[str, Any]) -> tuple[list[np.ndarray], dict[int, list | None]]:
        """:func:`~relaxweb.runtime.tensors.checked_inputs`, GpuTensors of this session's device accepted."""
        return checked_inputs(self.manifest, inputs, self._check_gpu_tensor)

    def _dtype_entry(self, tensor: Mapping[str, Any]) -> Mapping[str, Any]:
        """The manifest's ``dtypes`` entry of an input's or output's dtype."""
        return dtype_entry(self.manifest, tensor)

    def _checked_commands(self) -> list[Command]:
        """The host's current command list, after the checks in :meth:`_check_grids`."""
        commands = self.host.commands()
        self._check_grids(commands)
        return commands

    def _check_grids(self, commands: list[Command]) -> None:
        """Refuse a grid the device cannot dispatch, instead of a GPU validation error."""
        most = self.device.limits["max-compute-workgroups-per-dimension"]
        for command in commands:
            if isinstance(command, Dispatch) and max(command.grid) > most:
                raise RelaxwebError(
                    f"these inputs are too large for this device: call site {command.call_site} "
                    f"({self.manifest['call_sites'][command.call_site]['binding']}) needs "
                    f"{max(command.grid)} workgroups along one dimension, the device allows {most}"
                )

    def _grow_storages(
        self, needed_sizes: list[int], keep_contents: bool = False
    ) -> list[tuple[wgpu.GPUBuffer, wgpu.GPUBuffer]]:
        """Reallocate every storage buffer smaller than this run needs.

        A grown buffer gets at least twice its old size (capped by the device's binding
        size limit), so inputs that keep growing do not reallocate on every run.  The bind
        groups of call sites that use a reallocated storage are dropped.

        With ``keep_contents`` (growth between two steps of one run) the old buffers are
        kept and returned as ``(old, new)`` pairs: the next step copies each old buffer
        into its new one before anything else, and destroys the old ones after its submit.
        Without it the old buffers are destroyed now and ``[]`` is returned.
        """
        carried_over: list[tuple[wgpu.GPUBuffer, wgpu.GPUBuffer]] = []
        largest, limit_name = _storage_size_limit(self.device)
        for index, needed in enumerate(needed_sizes):
            if needed > largest:
                raise RelaxwebError(self._too_large_message(index, needed, largest, limit_name))
        for index, needed in enumerate(needed_sizes):
            buffer = self._storage_buffers[index]
            needed = gpu_buffer_size(needed)
            if buffer is not None and buffer.size >= needed:
                continue
            doubled = 2 * buffer.size if buffer is not None else 0
            new_size = max(needed, (min(doubled, largest) // 4) * 4)
            new_buffer = self._create_storage_buffer(index, new_size)
            if buffer is not None:
                if keep_contents:
                    carried_over.append((buffer, new_buffer))
                else:
                    buffer.destroy()
            self._storage_buffers[index] = new_buffer
            self._forget_bind_groups_using(index)
        return carried_over

    def _too_large_message(self, index: int, needed: int, largest: int, limit_name: str) -> str:
        """Why a run cannot go on: storage ``index`` needs more bytes than the device's limit."""
        storage = self.manifest["storages"][index]
        holds = f"storage {index} ({storage['role']})"
        for kind in ("output", "input"):  # an input's name wins
            for entry in self.manifest[f"{kind}s"]:
                if entry["storage"] == index:
                    holds = f"{kind} '{entry['name']}' (storage {index})"
        return (
            f"these inputs are too large for this device: {holds} needs {needed} bytes, above "
            f"the device's WebGPU limit {limit_name} = {largest}"
        )

    @staticmethod
    def _destroy_old_buffers(carried_over: list[tuple[wgpu.GPUBuffer, wgpu.GPUBuffer]]) -> None:
        """Destroy the old buffers of grown storages once their copies have run."""
        for old, _ in carried_over:
            old.destroy()

    def _forget_bind_groups_using(self, storage_index: int) -> None:
        for call_site_index, call_site in enumerate(self.manifest["call_sites"]):
            if {"storage": storage_index} in call_site["buffers"]:
                self._bind_groups[call_site_index] = None

    def _grow_readback_buffers(self, output_byte_sizes: list[int], kept: frozenset[int] = frozenset()) -> None:
        for index, byte_size in enumerate(output_byte_sizes):
            if index in kept:
                continue
            buffer = self._readback_buffers[index]
            if buffer is None or buffer.size < gpu_buffer_size(byte_size):
                if buffer is not None:
                    buffer.destroy()
                self._readback_buffers[index] = self._create_buffer(
                    label=f"readback {self.manifest['outputs'][index]['name']}",
                    size=gpu_buffer_size(byte_size),
                    usage=_READBACK_USAGE,
                )

    def _upload_inputs(self, arrays: list[np.ndarray]) -> None:
        for index, (entry, array) in enumerate(zip(self.manifest["inputs"], arrays)):
            if isinstance(array, GpuTensor) or array.nbytes == 0:
                continue
            if index in self._cache_of_input:  # a cache's past: each block at the start of its capacity rows
                cache = self._cache_of_input[index]
                buffer = self._storage_buffers[cache["storage"]]
                for source, target, size in cache_block_copies(cache, array.shape, array.itemsize, None):
                    self._write_buffer(buffer, memoryview(array).cast("B")[source:source + size], "input_bytes_written",
                                       target)
                continue
            data = _padded_to_multiple_of_4(memoryview(array).cast("B"))
            buffer = self._storage_buffers[entry["storage"]]
            if buffer is None or buffer.size < len(data):
                raise RelaxwebError(
                    f"the bundle's host module gave input '{entry['name']}' a storage of "
                    f"{0 if buffer is None else buffer.size} bytes for {len(data)} bytes of data: the bundle is damaged"
                )
            self._write_buffer(buffer, data, "input_bytes_written")

    def _bind_group(self, call_site_index: int) -> wgpu.GPUBindGroup:
        """The call site's bind group, built now if it has none (first use or reallocation)."""
        bind_group = self._bind_groups[call_site_index]
        if bind_group is None:
            call_site = self.manifest["call_sites"][call_site_index]
            entries = [
                {
                    "binding": 0,
                    "resource": {
                        "buffer": self._params_buffer,
                        "offset": call_site["params_offset"],
                        "size": call_site["params_size"],
                    },
                }
            ]
            for position, reference in enumerate(call_site["buffers"]):
                buffer = self._referenced_buffer(reference)
                entries.append(
                    {
                        "binding": position + 1,
                        "resource": {"buffer": buffer, "offset": 0, "size": buffer.size},
                    }
                )
            bind_group = self.device.create_bind_group(
                label=call_site["binding"],
                layout=self._bind_group_layouts[call_site["kernel"]],
                entries=entries,
            )
            self._bind_groups[call_site_index] = bind_group
        return bind_group

    def _referenced_buffer(self, reference: Mapping[str, int]) -> wgpu.GPUBuffer:
        """The buffer a call site's ``{"storage": i}`` or ``{"weight": j}`` refers to."""
        if "storage" in reference:
            return self._storage_buffers[reference["storage"]]
        if "weight_part" in reference:
            weight, part = reference["weight_part"]
            return self._weight_parts[weight][part]
        return self._weight_buffers[reference["weight"]]

    def _encode_step(
        self,
        commands: list[Command],
        carried_over: list[tuple[wgpu.GPUBuffer, wgpu.GPUBuffer]],
        timer: "_DispatchTimer | None" = None,
        params: bytes = b"",
        input_copies: Iterable[tuple[wgpu.GPUBuffer, int, wgpu.GPUBuffer, int, int]] = (),
    ) -> wgpu.GPUCommandEncoder:
        """A new encoder with the copies that carry grown storages' contents over (and the
        first step's ``input_copies``: (source, offset, storage, offset, bytes) of GpuTensor inputs), then the
        step's dispatches in one compute pass.  Nothing is submitted yet.  With a ``timer``,
        it encodes (and may submit) the dispatches its way and returns the encoder to go on
        with; ``params`` is the params block the step uploaded."""
        encoder = self.device.create_command_encoder()
        for old, new in carried_over:
            encoder.copy_buffer_to_buffer(old, 0, new, 0, old.size)
        for source, source_offset, storage, target_offset, byte_size in input_copies:
            encoder.copy_buffer_to_buffer(source, source_offset, storage, target_offset, byte_size)
        dispatches = [command for command in commands if isinstance(command, Dispatch)]
        if timer is not None:
            return timer.encode(encoder, dispatches, params)
        compute_pass = encoder.begin_compute_pass()
        for command in dispatches:
            self._encode_dispatch(compute_pass, command)
        compute_pass.end()
        return encoder

    def _encode_dispatch(self, compute_pass: wgpu.GPUComputePassEncoder, command: Dispatch) -> None:
        call_site = self.manifest["call_sites"][command.call_site]
        compute_pass.set_pipeline(self._pipelines[call_site["kernel"]])
        compute_pass.set_bind_group(0, self._bind_group(command.call_site))
        compute_pass.dispatch_workgroups(*command.grid)

    def _read_value(self, encoder: wgpu.GPUCommandEncoder, read: Read) -> int:
        """Copy the i32 the read record names into the staging buffer, submit the step,
        wait for it and return the value."""
        storage = self._storage_buffers[read.storage]
        if read.byte_offset + 4 > storage.size:
            raise RelaxwebError(
                f"the bundle's command list reads bytes {read.byte_offset}..{read.byte_offset + 4} "
                f"of storage {read.storage}, which has {storage.size} bytes"
            )
        if self._read_staging_buffer is None:
            self._read_staging_buffer = self._create_buffer(
                label="read value", size=4, usage=_READBACK_USAGE
            )
        staging = self._read_staging_buffer
        encoder.copy_buffer_to_buffer(storage, read.byte_offset, staging, 0, 4)
        self.device.queue.submit([encoder.finish()])
        staging.map_sync(wgpu.MapMode.READ)
        try:
            (value,) = struct.unpack("<i", staging.read_mapped(0, 4))
            self.stats.add("bytes_read", 4)
        finally:
            staging.unmap()
        return value

    def _copy_outputs_and_submit(
        self, encoder: wgpu.GPUCommandEncoder, output_byte_sizes: list[int], kept: frozenset[int] = frozenset(),
        output_shapes: list[tuple[int, ...]] | None = None,
    ) -> None:
        """After the last step's dispatches: the output copies, then the run's last submit."""
        for index, output in enumerate(self.manifest["outputs"]):
            copy_size = (output_byte_sizes[index] + 3) // 4 * 4
            if copy_size and index not in kept and index in self._cache_of_output:  # its rows of each block
                cache = self._cache_of_output[index]
                itemsize = output_byte_sizes[index] // int(np.prod(output_shapes[index], dtype=np.int64))
                for dense, at, size in cache_block_copies(cache, output_shapes[index], itemsize, None):
                    encoder.copy_buffer_to_buffer(self._storage_buffers[output["storage"]], at,
                                                  self._readback_buffers[index], dense, size)
            elif copy_size and index not in kept:
                encoder.copy_buffer_to_buffer(
                    self._storage_buffers[output["storage"]], 0,
                    self._readback_buffers[index], 0, copy_size,
                )
        self.device.queue.submit([encoder.finish()])

    def _read_outputs(
        self, output_shapes: list[tuple[int, ...]], output_byte_sizes: list[int], kept: frozenset[int] = frozenset()
    ) -> dict[str, np.ndarray]:
        """Map each readback buffer (but those of ``kept`` outputs) and turn its bytes into an
        array of the output's shape."""
        results = {}
        for index, output in enumerate(self.manifest["outputs"]):
            if index in kept:
                continue
            byte_size = output_byte_sizes[index]
            if byte_size == 0:
                results[output["name"]] = output_array(self.manifest, output, b"", output_shapes[index], 0)
                continue
            buffer = self._readback_buffers[index]
            buffer.map_sync(wgpu.MapMode.READ)
            try:
                data = bytearray(buffer.read_mapped(0, gpu_buffer_size(byte_size)))
                self.stats.add("bytes_read", len(data))
            finally:
                buffer.unmap()
            results[output["name"]] = output_array(self.manifest, output, data, output_shapes[index], byte_size)
        return results

    # GPU tensors (run(..., keep_on_gpu=...)) -------------------------------------------

    def _kept_output_indices(self, keep_on_gpu: bool | Iterable[str]) -> frozenset[int]:
        """The indices of the outputs ``keep_on_gpu`` names (True: every output but sequences)."""
        outputs = self.manifest["outputs"]
        if keep_on_gpu is True:
            return frozenset(k for k, output in enumerate(outputs) if output.get("kind") not in SEQUENCE_KINDS)
        if keep_on_gpu is False or keep_on_gpu is None:
            return frozenset()
        if isinstance(keep_on_gpu, str):
            raise RelaxwebError(f"keep_on_gpu must be True or a list of output names, got the string {keep_on_gpu!r}")
        index_of = {output["name"]: k for k, output in enumerate(outputs)}
        chosen = list(keep_on_gpu)
        unknown = [name for name in chosen if name not in index_of]
        if unknown:
            raise RelaxwebError(
                f"keep_on_gpu names unknown output {', '.join(repr(name) for name in unknown)}; "
                f"the model's outputs are {', '.join(repr(name) for name in index_of)}"
            )
        sequences = [name for name in chosen if outputs[index_of[name]].get("kind") in SEQUENCE_KINDS]
        if sequences:
            raise RelaxwebError(
                f"output {', '.join(repr(name) for name in sequences)} is a sequence: only tensors can be kept on the GPU"
            )
        return frozenset(index_of[name] for name in chosen)

    def _check_gpu_tensor(self, name: str, tensor: GpuTensor) -> None:
        """Refuse a disposed GpuTensor or one on another device, naming the input."""
        if tensor.disposed:
            raise RelaxwebError(f"input '{name}': GPU tensor '{tensor.name}' was disposed and cannot be used any more")
        if tensor.session.device is not self.device:
            raise RelaxwebError(
                f"input '{name}': GPU tensor '{tensor.name}' lives on another WebGPU device than this session's; "
                "read it with .numpy() and pass the array"
            )

    def _gpu_tensor_input_copies(self, arrays: list[Any]) -> list[tuple[wgpu.GPUBuffer, int, wgpu.GPUBuffer, int, int]]:
        """(source, offset, storage, offset, bytes) of each GpuTensor input, for the run's first
        encoder: nothing for the current view of an input's own cache (it is there already),
        a copy per block into a cache's rows for any other tensor given as a cache's past."""
        copies = []
        for index, (entry, value) in enumerate(zip(self.manifest["inputs"], arrays)):
            if not isinstance(value, GpuTensor) or value.nbytes == 0:
                continue
            view = value.cache_view
            if view is not None and value.session is not self:
                raise RelaxwebError(f"input '{entry['name']}': GPU tensor '{value.name}' is a view of another session's "
                                    "KV cache; read it with .numpy() and pass the array")
            if view is not None and view.run != self._run_number:
                raise RelaxwebError(
                    f"input '{entry['name']}': GPU tensor '{value.name}' is a view of a KV cache that a later run has "
                    "written: a view is valid until the next run (read it with .numpy() first to keep its values)")
            cache = self._cache_of_input.get(index)
            if cache is not None:
                if view is not None and view.cache is cache:
                    continue  # the cache holds it already: nothing moves
                own_past = arrays[view.cache["input"]] if view is not None else None
                if view is not None and not (isinstance(own_past, GpuTensor) and own_past.cache_view is not None
                                             and own_past.cache_view.cache is view.cache):
                    raise RelaxwebError(
                        f"input '{entry['name']}': GPU tensor '{value.name}' is a view of another KV cache whose own past "
                        "in this run is not that view (this run overwrites it first); read it with .numpy() and pass the array")
                storage = self._storage_buffers[cache["storage"]]
                itemsize = value.nbytes // max(1, int(np.prod(value.shape, dtype=np.int64)))
                for source, target, size in cache_block_copies(cache, value.shape, itemsize,
                                                               None if view is None else view.cache):
                    copies.append((value.buffer(), source, storage, target, size))
                continue
            if view is not None:
                raise RelaxwebError(f"input '{entry['name']}': GPU tensor '{value.name}' is a view of a KV cache; "
                                    "it can be given back only as a cache's past (or read with .numpy())")
            copy_size = (value.nbytes + 3) // 4 * 4
            storage = self._storage_buffers[entry["storage"]]
            if storage is None or storage.size < copy_size:
                raise RelaxwebError(
                    f"the bundle's host module gave input '{entry['name']}' a storage of "
                    f"{0 if storage is None else storage.size} bytes for {value.nbytes} bytes of data: the bundle is damaged"
                )
            copies.append((value.buffer(), 0, storage, 0, copy_size))
        return copies

    def _keep_outputs(self, encoder: wgpu.GPUCommandEncoder, kept: frozenset[int],
                      output_shapes: list[tuple[int, ...]], output_byte_sizes: list[int]) -> dict[str, GpuTensor]:
        """A GpuTensor per kept output: a buffer from the pool (or a new one, sized at its
        storage's size at the bounds so that later runs find it fits), and the copy of the
        output into it, encoded after the last step's dispatches."""
        tensors = {}
        for index in sorted(kept):
            output = self.manifest["outputs"][index]
            byte_size = output_byte_sizes[index]
            if index in self._cache_of_output:  # a view of the cache's storage: no buffer, no copy
                cache = self._cache_of_output[index]
                tensors[output["name"]] = GpuTensor(
                    self, output["name"], np.dtype(output["dtype"]), tuple(output_shapes[index]),
                    self._storage_buffers[cache["storage"]], byte_size, CacheView(cache, self._run_number))
                continue
            at_bounds = self._storage_sizes_at_bounds[output["storage"]] if self._storage_sizes_at_bounds else 0
            size = gpu_buffer_size(max(byte_size, at_bounds))
            buffer = self._gpu_tensor_pool.take(size) or self._create_buffer(
                label=f"kept output {index}", size=size, usage=_STORAGE_USAGE
            )
            if byte_size:
                encoder.copy_buffer_to_buffer(self._storage_buffers[output["storage"]], 0, buffer, 0, (byte_size + 3) // 4 * 4)
            tensors[output["name"]] = GpuTensor(
                self, output["name"], np.dtype(output["dtype"]), tuple(output_shapes[index]), buffer, byte_size
            )
        return tensors

    def read_gpu_tensor(self, tensor: GpuTensor) -> np.ndarray:
        """A GpuTensor's values as an array (what ``tensor.numpy()`` calls)."""
        entry = self.manifest["dtypes"][str(tensor.dtype)]
        stored = device_dtype(entry)
        if tensor.nbytes == 0:
            tensor.buffer()  # a disposed tensor is refused even when empty
            return np.zeros(tensor.shape, dtype=tensor.dtype)
        copy_size = (tensor.nbytes + 3) // 4 * 4
        view = tensor.cache_view
        if view is not None and view.run != self._run_number:
            raise RelaxwebError(f"GPU tensor '{tensor.name}' is a view of a KV cache that a later run has written: "
                                "a view is valid until the next run")
        staging = self._create_buffer(label=f"read {tensor.name}", size=copy_size, usage=_READBACK_USAGE)
        try:
            encoder = self.device.create_command_encoder()
            if view is None:
                encoder.copy_buffer_to_buffer(tensor.buffer(), 0, staging, 0, copy_size)
            for dense, at, size in () if view is None else cache_block_copies(
                    view.cache, tensor.shape, tensor.nbytes // int(np.prod(tensor.shape, dtype=np.int64)), None):
                encoder.copy_buffer_to_buffer(tensor.buffer(), at, staging, dense, size)
            self.device.queue.submit([encoder.finish()])
            staging.map_sync(wgpu.MapMode.READ)
            try:
                data = bytearray(staging.read_mapped(0, copy_size))
                self.stats.add("bytes_read", len(data))
            finally:
                staging.unmap()
        finally:
            staging.destroy()
        array = np.frombuffer(data, dtype=stored, count=tensor.nbytes // stored.itemsize)
        return to_model_dtype(array, tensor.dtype).reshape(tensor.shape)

    def release_gpu_buffer(self, buffer: wgpu.GPUBuffer) -> None:
        """Take back the buffer of a disposed GpuTensor, for later kept outputs."""
        self._gpu_tensor_pool.give(buffer)

    # Counted GPU calls (stats) -------------------------------------------------------------

    def _create_buffer(self, **descriptor: Any) -> wgpu.GPUBuffer:
        """``device.create_buffer``, counted in :attr:`stats`."""
        buffer = self.device.create_buffer(**descriptor)
        self.stats.add("buffers_created")
        self.stats.track_buffer(buffer)
        return buffer

    def _write_buffer(self, buffer: wgpu.GPUBuffer, data: bytes | memoryview, counter: str, offset: int = 0) -> None:
        """``queue.write_buffer`` at ``offset``, its bytes counted in :attr:`stats` under ``counter``."""
        self.device.queue.write_buffer(buffer, offset, data)
        self.stats.add(counter, memoryview(data).nbytes)


# Timing dispatches (Session.profile) -----------------------------------------------------


class _DispatchTimer:
    """How :meth:`Session.profile` times dispatches: :meth:`encode` takes over the encoding
    of each step's dispatches, :meth:`times` gives them after the run's last submit."""

    method = ""

    def __init__(self, session: Session) -> None:
        self.session = session
        self.device = session.device

    def encode(self, encoder: wgpu.GPUCommandEncoder, dispatches: list[Dispatch], params: bytes) -> wgpu.GPUCommandEncoder:
        raise NotImplementedError

    def times(self) -> list[DispatchTime]:
        raise NotImplementedError

    def _fields(self, command: Dispatch, params: bytes) -> tuple[int, ...]:
        return params_fields(params, self.session.manifest["call_sites"][command.call_site])


class _TimestampTimer(_DispatchTimer):
    """One compute pass per dispatch, with timestamps written at its start and end into a
    query set, resolved and copied to a mappable buffer in the same encoder."""

    method = TIMESTAMPS
    _MAX_QUERIES = 4096  # WebGPU's largest query set

    def __init__(self, session: Session) -> None:
        super().__init__(session)
        # per query set: the set and its resolve buffer (destroyed after the run), the mappable
        # copy, and its dispatches' (call site, params)
        self._pending: list[tuple[list, wgpu.GPUBuffer, list[tuple[int, tuple[int, ...]]]]] = []

    def encode(self, encoder, dispatches, params):
        per_set = self._MAX_QUERIES // 2
        for first in range(0, len(dispatches), per_set):
            chunk = dispatches[first:first + per_set]
            count = 2 * len(chunk)
            query_set = self.device.create_query_set(type=wgpu.QueryType.timestamp, count=count)
            for index, command in enumerate(chunk):
                compute_pass = encoder.begin_compute_pass(timestamp_writes={
                    "query_set": query_set, "beginning_of_pass_write_index": 2 * index,
                    "end_of_pass_write_index": 2 * index + 1,
                })
                self.session._encode_dispatch(compute_pass, command)
                compute_pass.end()
            resolved = self.session._create_buffer(size=8 * count, usage=_QUERY_RESOLVE_USAGE)
            readable = self.session._create_buffer(size=8 * count, usage=_READBACK_USAGE)
            encoder.resolve_query_set(query_set, 0, count, resolved, 0)
            encoder.copy_buffer_to_buffer(resolved, 0, readable, 0, 8 * count)
            self._pending.append(([query_set, resolved], readable, [(c.call_site, self._fields(c, params)) for c in chunk]))
        return encoder

    def times(self):
        times = []
        for spent, readable, calls in self._pending:
            readable.map_sync(wgpu.MapMode.READ)
            try:
                stamps = struct.unpack(f"<{2 * len(calls)}Q", readable.read_mapped())
                self.session.stats.add("bytes_read", 16 * len(calls))
            finally:
                readable.unmap()
                for used in (readable, *spent):
                    used.destroy()
            for index, (call_site, fields) in enumerate(calls):
                # nanoseconds; a pair out of order (a driver's clock reset) counts as 0
                elapsed = max(0, stamps[2 * index + 1] - stamps[2 * index])
                times.append(DispatchTime(call_site, elapsed / 1e6, fields))
        return times


class _SubmitTimer(_DispatchTimer):
    """One submit per dispatch, timed by the wall clock until the queue has done it.

    The wait is a map of a 4-byte buffer that the dispatch's command buffer copies into last
    (a map completes once the submits using the buffer are done): wgpu-py's
    ``on_submitted_work_done_sync`` fails with the wgpu-native it ships (0.32)."""

    method = SUBMITS

    def __init__(self, session: Session) -> None:
        super().__init__(session)
        self._times: list[DispatchTime] = []
        self._fence_source = session._create_buffer(size=4, usage=wgpu.BufferUsage.COPY_SRC)
        self._fence = session._create_buffer(size=4, usage=_READBACK_USAGE)

    def _submit_and_wait(self, encoder: wgpu.GPUCommandEncoder) -> None:
        encoder.copy_buffer_to_buffer(self._fence_source, 0, self._fence, 0, 4)
        self.device.queue.submit([encoder.finish()])
        self._fence.map_sync(wgpu.MapMode.READ)
        self._fence.unmap()

    def encode(self, encoder, dispatches, params):
        # what came before (uploads, copies of grown storages) is done before the first timing
        self._submit_and_wait(encoder)
        for command in dispatches:
            single = self.device.create_command_encoder()
            compute_pass = single.begin_compute_pass()
            self.session._encode_dispatch(compute_pass, command)
            compute_pass.end()
            start = time.perf_counter()
            self._submit_and_wait(single)
            elapsed = time.perf_counter() - start
            self._times.append(DispatchTime(command.call_site, elapsed * 1e3, self._fields(command, params)))
        return self.device.create_command_encoder()

    def times(self):
        self._fence.destroy()
        self._fence_source.destroy()
        return self._times
