"""The Python runtime: run a bundle written by ``relaxweb build``.

``HostModule`` (``host.py``) runs the bundle's ``host.wasm`` with wasmtime and needs no
GPU; ``Session`` (``webgpu.py``) loads the whole bundle on a WebGPU device with wgpu-py,
``WasmSession`` (``wasm_session.py``) on its ``kernels.wasm`` with wasmtime (no GPU), and
``load_session`` (``backend.py``) picks one of them.
"""

from __future__ import annotations

from relaxweb.runtime.backend import BACKENDS, load_session
from relaxweb.runtime.generate import Generation
from relaxweb.runtime.gpu_tensor import GpuTensor, TransferCounts, TransferStats
from relaxweb.runtime.host import Command, Dispatch, HostModule, Read, Resume, load_manifest
from relaxweb.runtime.profile import KernelRow, Profile
from relaxweb.runtime.wasm_session import WasmSession
from relaxweb.runtime.webgpu import Session, default_device

__all__ = [
    "BACKENDS", "Command", "Dispatch", "Generation", "GpuTensor", "HostModule", "KernelRow", "Profile", "Read", "Resume", "Session", "TransferCounts",
    "TransferStats", "WasmSession", "default_device", "load_manifest", "load_session",
]
