"""The Python runtime: run a bundle written by ``relaxweb build``.

``HostModule`` (``host.py``) runs the bundle's ``host.wasm`` with wasmtime and needs no
GPU; ``Session`` (``webgpu.py``) loads the whole bundle on a WebGPU device with wgpu-py.
``Session`` is imported lazily so that using the host module does not import wgpu.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from relaxweb.runtime.host import Command, Dispatch, HostModule, Read, load_manifest

if TYPE_CHECKING:
    from relaxweb.runtime.webgpu import Session, default_device

__all__ = [
    "Command", "Dispatch", "HostModule", "Read", "Session", "default_device", "load_manifest",
]


def __getattr__(name: str) -> Any:
    """Import ``Session`` and ``default_device`` from ``webgpu.py`` on first access."""
    if name in ("Session", "default_device"):
        from relaxweb.runtime import webgpu

        return getattr(webgpu, name)
    raise AttributeError(f"module 'relaxweb.runtime' has no attribute {name!r}")
