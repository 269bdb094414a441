"""Library kernels: what a compute definition expresses badly, computed by hand-written code.

This is the IR's view of one: what it computes, not its code.  ``relaxweb/library`` builds
them (buffers, dispatch, numpy reference); the backends render their code from the builder
and its arguments (``relaxweb/wgsl/library``: WGSL, ``relaxweb/cpu/library``: WebAssembly text).

A :class:`LibraryKernel` sits in ``IRModule.programs`` next to tensor programs and follows
the same binding contract (params block with ``element_count`` and the size variables,
then the inputs, then the output), so memory planning, the host module and the runtimes
treat both alike.  ``dispatch_count`` is how many invocations to launch (in the kernel's own
size variables); ``reference`` gives the numpy semantics for the interpreter.  ``builder`` and
``builder_args`` say how the kernel was made (set by ``relaxweb.ir.kernel_builders``), which
is how the IR text writes it, the parser rebuilds it and a backend renders it.

``extra_size_vars`` are size variables the kernel reads from its params block that no buffer
shape has (a row index).  An ``in_place`` kernel writes only part of its output and leaves
the rest as it was (it is only ever called into a planned storage, ``call_tir_into``): its
reference is then ``reference(arrays, output, size_vars)`` and writes into ``output``.  A kernel
with a ``sized_reference`` computes what depends on its size variables' values (attention over
the valid prefix of a KV cache): its reference is ``reference(arrays, size_vars)``.

``targets`` lists the targets its hand-written code exists for (:data:`LIBRARY_TARGETS`):
every kernel has a WebGPU shader; ``webgpu_f16`` adds a second WGSL source of the same
kernel (the same bindings, params and dispatch) for adapters with WebGPU's ``shader-f16``
(the bundle's ``f16_file``), ``webgpu_cpu`` one for CPU adapters (SwiftShader, lavapipe: its
``cpu_file``), and ``wasm`` a version for the WebAssembly backend (``kernels.wasm``): a bundle
with a kernel that has none gets no ``kernels.wasm``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from .symbolic import PrimExpr, SizeVar, free_vars
from .tir import Buffer

WEBGPU = "webgpu"  # the kernel's WGSL shader (the manifest's ``file``)
WEBGPU_F16 = "webgpu_f16"  # WGSL for adapters with ``shader-f16`` (``f16_file``)
WEBGPU_CPU = "webgpu_cpu"  # WGSL for CPU adapters (``cpu_file``)
WASM = "wasm"  # WebAssembly text for ``kernels.wasm``
#: The targets a library kernel's code can exist for, in the order the IR text lists them.
LIBRARY_TARGETS = (WEBGPU, WEBGPU_F16, WEBGPU_CPU, WASM)


@dataclass(frozen=True)
class LibraryKernel:
    name: str
    inputs: tuple[Buffer, ...]
    output: Buffer
    dispatch_count: PrimExpr
    reference: Callable[[list[np.ndarray]], np.ndarray] = field(compare=False)
    summary: str = ""
    builder: str = ""
    builder_args: tuple[tuple[str, object], ...] = ()
    extra_size_vars: tuple[SizeVar, ...] = ()
    in_place: bool = False
    sized_reference: bool = False
    targets: tuple[str, ...] = (WEBGPU, WASM)

    def __post_init__(self) -> None:
        if WEBGPU not in self.targets or any(target not in LIBRARY_TARGETS for target in self.targets):
            raise ValueError(f"library kernel {self.name}: targets {self.targets} are not a WebGPU shader and others "
                             f"of {', '.join(LIBRARY_TARGETS)}")
        object.__setattr__(self, "targets", tuple(t for t in LIBRARY_TARGETS if t in self.targets))

    @property
    def size_vars(self) -> list[SizeVar]:
        """The buffer shapes' size variables (in order of first appearance), then the extra ones."""
        found = buffer_size_vars((*self.inputs, self.output))
        names = {var.name for var in found}
        return found + [var for var in self.extra_size_vars if var.name not in names]

    @property
    def arguments(self) -> dict[str, object]:
        """The builder's arguments by parameter name (what a backend renders the kernel from)."""
        return dict(self.builder_args)


def buffer_size_vars(buffers: tuple[Buffer, ...]) -> list[SizeVar]:
    """The size variables of buffer shapes, in order of first appearance."""
    found: dict[str, SizeVar] = {}
    for buffer in buffers:
        for dim in buffer.shape:
            for var in free_vars(dim):
                found.setdefault(var.name, var)
    return list(found.values())
