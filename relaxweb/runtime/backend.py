"""Which Python runtime backend loads a bundle: ``webgpu.Session`` or ``wasm_session.WasmSession``.

"auto" takes WebGPU when this machine's adapter meets the bundle's required limits and
features (the check ``Session`` makes before it requests a device) and the bundle's manifest
does not say that WebGPU cannot run it (``webgpu.unavailable``: an int64 weight outside
int32), else the bundle's ``kernels.wasm``; the session's ``backend`` attribute says which it got, and its
``backend_reason`` why "auto" did not take WebGPU (None when it did, or when a backend was
asked for).
"""

from __future__ import annotations

from collections.abc import Mapping
from pathlib import Path
from typing import Any

from relaxweb.errors import RelaxwebError
from relaxweb.runtime.host import load_manifest
from relaxweb.runtime.wasm_session import WasmSession, wasm_entry
from relaxweb.runtime.webgpu import Session, default_adapter, load_time_limits, missing_features, unsatisfied_limits
from relaxweb.runtime.webgpu_device import storage_note, webgpu_unavailable

BACKENDS = ("auto", "webgpu", "wasm")


def webgpu_problem(manifest: Mapping[str, Any]) -> str:
    """Why this machine's WebGPU adapter cannot load the bundle, or ``""`` when it can."""
    try:
        adapter = default_adapter()
    except Exception as error:  # noqa: BLE001 - no adapter, or a driver that fails to start: either way, no WebGPU
        return str(error) if isinstance(error, RelaxwebError) else f"no WebGPU adapter could be created ({error})"
    name = adapter.info.get("device") or "unknown"
    problems = [f"it lacks the feature {feature}"
                for feature in missing_features(adapter.features, manifest.get("required_features", []))]
    for limit, (needed, offered) in unsatisfied_limits(adapter.limits, load_time_limits(manifest)).items():
        problems.append(f"the bundle needs the limit {limit} = {needed}, it "
                        f"{'does not know this limit' if offered is None else f'offers {offered}'}"
                        + storage_note(manifest, limit, needed))
    return f"the WebGPU adapter ({name}) cannot load the bundle: {'; '.join(problems)}" if problems else ""


def load_session(bundle_dir: Path, backend: str = "auto", *, device: Any = None, profiling: bool = False,
                 kernels: str = "auto", limits: Mapping[str, int] | None = None,
                 kernel_timeout_s: float | None = None, relaxed_simd: bool | None = None) -> Session | WasmSession:
    """The bundle loaded on ``backend`` ("auto", "webgpu" or "wasm"; see the module's doc).

    ``device``, ``kernels`` and ``limits`` are WebGPU options: "wasm" refuses them, "auto"
    with a ``device`` is WebGPU on that device.  ``kernel_timeout_s`` and ``relaxed_simd`` are the
    wasm backend's (``WasmSession``): "webgpu" refuses them."""
    if backend not in BACKENDS:
        raise ValueError(f"backend must be one of {', '.join(BACKENDS)}, got {backend!r}")
    if backend == "webgpu" and kernel_timeout_s is not None:
        raise ValueError("kernel_timeout_s is a wasm option (the time one kernels.wasm call may take); "
                         "backend='webgpu' runs WGSL shaders")
    if backend == "webgpu" and relaxed_simd is not None:
        raise ValueError("relaxed_simd is a wasm option (which kernels.wasm runs); backend='webgpu' runs WGSL shaders")
    if backend == "wasm":
        given = [name for name, value in (("device", device), ("kernels", kernels != "auto"), ("limits", limits))
                 if value]
        if given:
            raise ValueError(f"{' and '.join(given)} {'is a WebGPU option' if len(given) == 1 else 'are WebGPU options'}; "
                             "backend='wasm' runs kernels.wasm on the CPU")
        return WasmSession(bundle_dir, kernel_timeout_s=kernel_timeout_s, relaxed_simd=relaxed_simd)
    if backend == "auto" and device is None:
        manifest = load_manifest(bundle_dir)
        unavailable = webgpu_unavailable(manifest)  # on any device: no adapter to ask
        problem = unavailable or webgpu_problem(manifest)
        if problem:
            try:
                wasm_entry(manifest, bundle_dir)
            except RelaxwebError as error:
                if unavailable:
                    raise RelaxwebError(f"{unavailable}, and {error}") from None
                raise RelaxwebError(f"this machine cannot run the bundle: {problem}, and {error}") from None
            session = WasmSession(bundle_dir, kernel_timeout_s=kernel_timeout_s, relaxed_simd=relaxed_simd)
            session.backend_reason = problem
            return session
    return Session(bundle_dir, device, profiling=profiling, kernels=kernels, limits=limits)
