"""The Python runtime: run a bundle written by ``relaxweb build``.

``HostModule`` (``host.py``) runs the bundle's ``host.wasm`` with wasmtime and needs no
GPU; ``Session`` (``webgpu.py``) loads the whole bundle on a WebGPU device with wgpu-py,
``WasmSession`` (``wasm_session.py``) on its ``kernels.wasm`` with wasmtime (no GPU), and
``load_session`` (``backend.py``) picks one of them.  Both run the host program with the
one driver of ``driver.py`` (docs/runtime-core.md).
"""

from __future__ import annotations

import os
import tempfile

# Mesa's Vulkan drivers print "error: XDG_RUNTIME_DIR is invalid" on stderr when probing for
# a display on a machine without a session (CI, containers); give them a private folder so
# our own one-line "error: ..." messages are the only ones a user sees.  Here, before any
# module of the runtime imports wgpu.
if not os.environ.get("XDG_RUNTIME_DIR"):
    os.environ["XDG_RUNTIME_DIR"] = tempfile.mkdtemp(prefix="relaxweb-xdg-")

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
