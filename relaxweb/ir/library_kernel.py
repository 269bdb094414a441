"""Library kernels: hand-written WGSL for what a compute definition expresses badly.

This is the IR's view of one (``relaxweb/library`` writes the kernels themselves).

A :class:`LibraryKernel` sits in ``IRModule.programs`` next to tensor programs and follows
the same binding contract (params block with ``element_count`` and the size variables,
then the inputs, then the output), so memory planning, the host module and the runtimes
treat both alike.  ``dispatch_count`` is how many invocations to launch (in the kernel's own
size variables); ``reference`` gives the numpy semantics for the interpreter.  ``builder`` and
``builder_args`` say how the kernel was made (set by ``relaxweb.ir.kernel_builders``), which
is how the IR text writes it and the parser rebuilds it.

``extra_size_vars`` are size variables the kernel reads from its params block that no buffer
shape has (a row index).  An ``in_place`` kernel writes only part of its output and leaves
the rest as it was (it is only ever called into a planned storage, ``call_tir_into``): its
reference is then ``reference(arrays, output, size_vars)`` and writes into ``output``.  A kernel
with a ``sized_reference`` computes what depends on its size variables' values (attention over
the valid prefix of a KV cache): its reference is ``reference(arrays, size_vars)``.

``f16_source``, when not empty, is a second WGSL source of the same kernel (the same bindings,
params and dispatch) for adapters with WebGPU's ``shader-f16``: the bundle writes it as the
kernel's ``f16_file`` (``relaxweb/wgsl/variants.py`` says which kernels gain from f16).
``cpu_source``, likewise, is the kernel for CPU adapters (SwiftShader, lavapipe): its
``cpu_file``, compiled where a tensor program's ``register_matmul`` form would be.

``wasm_source``, when not empty, is the kernel for the WebAssembly backend (``kernels.wasm``,
docs/bundle-format.md): WAT text defining ``$main`` (params, first, end, scratch, then one
address per binding) and ``$units`` (params -> units), helpers named ``$main_...``; it may call
the math functions of ``relaxweb/cpu``.  ``wasm_scratch_bytes`` is the private memory ``$main``
needs per thread.  A kernel without one leaves its bundles without ``kernels.wasm``.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Callable

import numpy as np

from .symbolic import PrimExpr, SizeVar, free_vars
from .tir import Buffer


@dataclass(frozen=True)
class LibraryKernel:
    name: str
    inputs: tuple[Buffer, ...]
    output: Buffer
    dispatch_count: PrimExpr
    source: str
    reference: Callable[[list[np.ndarray]], np.ndarray] = field(compare=False)
    summary: str = ""
    builder: str = ""
    builder_args: tuple[tuple[str, object], ...] = ()
    extra_size_vars: tuple[SizeVar, ...] = ()
    in_place: bool = False
    sized_reference: bool = False
    f16_source: str = field(default="", compare=False)  # made with ``source`` by the same builder
    cpu_source: str = field(default="", compare=False)  # the same kernel for CPU adapters (manifest ``cpu_file``)
    wasm_source: str = field(default="", compare=False)  # WAT of ``$main`` and ``$units`` (below)
    wasm_scratch_bytes: int = field(default=0, compare=False)  # private scratch bytes ``$main`` needs per thread

    @property
    def size_vars(self) -> list[SizeVar]:
        """The buffer shapes' size variables (in order of first appearance), then the extra ones."""
        found = buffer_size_vars((*self.inputs, self.output))
        names = {var.name for var in found}
        return found + [var for var in self.extra_size_vars if var.name not in names]


def buffer_size_vars(buffers: tuple[Buffer, ...]) -> list[SizeVar]:
    """The size variables of buffer shapes, in order of first appearance."""
    found: dict[str, SizeVar] = {}
    for buffer in buffers:
        for dim in buffer.shape:
            for var in free_vars(dim):
                found.setdefault(var.name, var)
    return list(found.values())
