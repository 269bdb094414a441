"""The WebGPU device a session runs on: the adapter, a shared device, and the limits and
features a bundle needs of it (docs/bundle-format.md, "Required limits" and "Weights in parts").

Nothing here runs a bundle; ``webgpu.Session`` asks these functions for its device, and
``backend.load_session`` whether this machine's adapter can load a bundle at all.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

import wgpu  # (relaxweb/runtime/__init__.py gave Mesa its XDG_RUNTIME_DIR first)

from relaxweb.errors import RelaxwebError
from relaxweb.runtime.tensors import webgpu_weight_nbytes


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
    required_limits: Mapping[str, int] | None = None, required_features: Any = (), *, profiling: bool = False,
    manifest: Mapping[str, Any] | None = None,
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
    problems = device_problems(
        adapter, required_limits, required_features, f"this adapter ({adapter_name})", manifest
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


def check_device_limits(
    device: wgpu.GPUDevice, required_limits: Mapping[str, int], required_features: Any = (),
    manifest: Mapping[str, Any] | None = None,
) -> None:
    """Raise a readable error when a caller-supplied device lacks a required feature or limit
    (naming the storage that sets a buffer size limit, with the bundle's ``manifest``)."""
    problems = device_problems(device, required_limits, required_features, "the given device", manifest)
    if problems:
        raise RelaxwebError(problems)


def device_problems(
    gpu: Any, required_limits: Mapping[str, int], required_features: Any, provider: str,
    manifest: Mapping[str, Any] | None = None,
) -> str:
    """Every missing feature and unmet limit of ``gpu`` (an adapter or a device) in one
    message, or ``""`` when it can load the bundle."""
    problems = []
    lacking_features = missing_features(gpu.features, required_features)
    if lacking_features:
        problems.append(_missing_feature_message(lacking_features, provider))
    shortfalls = unsatisfied_limits(gpu.limits, required_limits)
    if shortfalls:
        problems.append(_shortfall_message(shortfalls, provider, manifest))
    return "; ".join(problems)


def _shortfall_message(shortfalls: Mapping[str, tuple[int, int | None]], provider: str,
                       manifest: Mapping[str, Any] | None = None) -> str:
    """One readable line per limit that ``provider`` (adapter or device) cannot meet; a buffer
    size limit set by a storage at the bounds names that storage (``manifest``)."""
    lines = []
    for name, (needed, available) in shortfalls.items():
        offered = "does not know this limit" if available is None else f"offers {available}"
        lines.append(
            f"the bundle needs the WebGPU limit {name} = {needed}, but {provider} {offered}"
            + storage_note(manifest, name, needed)
        )
    return "; ".join(lines)


BUFFER_SIZE_LIMITS = ("maxStorageBufferBindingSize", "maxBufferSize")


def storage_note(manifest: Mapping[str, Any] | None, limit: str, needed: int) -> str:
    """Which storage makes the bundle need ``limit`` = ``needed``, for a message: ``": storage 3
    (output 'logits') needs ... at the bounds ..."``, or ``""`` when no storage at the bounds
    sets it (another limit, a weight, no manifest)."""
    if manifest is None or limit not in BUFFER_SIZE_LIMITS:
        return ""
    index = next((i for i, s in enumerate(manifest["storages"]) if s["size_at_bounds"] == needed), None)
    if index is None:
        return ""
    storage = manifest["storages"][index]
    return (f": storage {index} ({storage.get('holds', storage['role'])}) needs {needed} bytes at the bounds "
            f"(its size: {storage['size']} bytes; build with lower --bound values, or run on wasm)")


def webgpu_unavailable(manifest: Mapping[str, Any]) -> str | None:
    """Why WebGPU cannot run the bundle whatever the device, from its manifest's
    ``webgpu.unavailable`` (an int64 weight outside int32, the range the GPU holds int64
    tensors in: the build writes it, kernels.wasm runs the bundle), or None."""
    entry = manifest.get("webgpu")
    return None if entry is None else f"WebGPU cannot run this bundle: {entry['unavailable']}"


def load_time_limits(manifest: Mapping[str, Any]) -> dict[str, int]:
    """The limits a device must meet to load a bundle: the manifest's ``required_limits``,
    with the buffer size limits raised to the largest weight when that is larger (bundles
    whose storages have no bound give no buffer size limits, but their weights still need
    buffers of a known size), and ``maxBufferSize`` at least ``maxStorageBufferBindingSize``."""
    limits = dict(manifest.get("required_limits", {}))
    # a weight in parts needs a binding of its smallest part only
    largest = max((smallest_part_bytes(webgpu_weight_nbytes(manifest, w), w.get("parts", 1))
                   for w in manifest.get("weights", [])), default=0)
    # A buffer bound whole is at least as large as its binding.
    largest = max(largest, limits.get("maxStorageBufferBindingSize", 0))
    if largest:
        for name in ("maxStorageBufferBindingSize", "maxBufferSize"):
            limits[name] = max(limits.get(name, 0), largest)
    return limits


def storage_size_limit(device: wgpu.GPUDevice, caps: Mapping[str, int] | None = None) -> tuple[int, str]:
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

