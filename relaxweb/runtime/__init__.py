"""The Python runtime: run a bundle written by ``relaxweb build``.

``HostModule`` (``host.py``) runs the bundle's ``host.wasm`` with wasmtime and needs no
GPU; ``Session`` (``webgpu.py``) loads the whole bundle on a WebGPU device with wgpu-py.
"""

from __future__ import annotations

from relaxweb.runtime.generate import Generation
from relaxweb.runtime.gpu_tensor import GpuTensor, TransferCounts, TransferStats
from relaxweb.runtime.host import Command, Dispatch, HostModule, Read, Resume, load_manifest
from relaxweb.runtime.profile import KernelRow, Profile
from relaxweb.runtime.webgpu import Session, default_device

__all__ = [
    "Command", "Dispatch", "Generation", "GpuTensor", "HostModule", "KernelRow", "Profile", "Read", "Resume", "Session", "TransferCounts",
    "TransferStats", "default_device", "load_manifest",
]
