"""emit_kernels_wasm: a compiled module's kernels, in manifest order, as one ``kernels.wasm``.

Tensor programs are rendered by their wasm schedule (``schedules/``), library kernels by their
builders' renderers (``library/``).  A bundle with a library kernel that has no WebAssembly
version (no ``wasm`` among its targets) gets no ``kernels.wasm``: the result is then a
:class:`WasmUnavailable` saying why, which the manifest records.  Anything else that cannot
render is a compiler bug and raises.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Mapping, Sequence

from ..ir.library_kernel import LibraryKernel
from ..ir.module import IRModule
from ..ir.target_schedules import schedules_of
from ..ir.tir import TensorProgram
from .helpers import HELPER_FUNCTIONS
from .library import library_kernel_wat
from .math import MATH_FUNCTIONS
from .module import KernelFunctions, assemble_kernels_module, wat_to_wasm
from .relaxed_simd import relaxed_madd_sites
from .schedules import prepacked_factor_of, render_program
from .schedules.matmul_packed import PrepackedFactor


@dataclass(frozen=True)
class KernelsWasm:
    """The module: its text (``kernels.wat``), its binary, how many relaxed multiply-add sites
    it has (0 where no kernel multiplies and adds: ``relaxed_simd.py``), the scratch
    bytes each thread needs, and the kernels that can read a second factor prepacked (by
    index: exported ``kK_pack``, ``schedules/matmul_packed.PrepackedFactor``)."""

    wat: str
    wasm: bytes
    relaxed_madd_sites: int
    scratch_bytes: int
    prepacked: Mapping[int, PrepackedFactor] = field(default_factory=dict)


@dataclass(frozen=True)
class WasmUnavailable:
    """Why a bundle has no ``kernels.wasm`` (the manifest's ``wasm.unavailable``)."""

    reason: str


def emit_kernels_wasm(module: IRModule, kernel_order: Sequence[tuple[str, Mapping[str, int]]],
                      source: str = "the model") -> KernelsWasm | WasmUnavailable:
    """Every kernel of ``kernel_order`` (the manifest's: each a program name of ``module`` and
    the inputs it reads as parts, by name) as functions ``kK`` / ``kK_units`` of one module;
    ``source`` names the model in its comments."""
    kernels, scratch, prepacked = [], 0, {}
    for index, (name, parts) in enumerate(kernel_order):
        program = module.programs[name]
        if isinstance(program, LibraryKernel):
            library_wat = library_kernel_wat(program)
            if library_wat is None:
                return WasmUnavailable(f"the library kernel {program.name} has no WebAssembly version")
            kernels.append(KernelFunctions(index, f"library kernel {program.name}", library_wat.text))
            scratch = max(scratch, library_wat.scratch_bytes)
            continue
        if not isinstance(program, TensorProgram):
            raise TypeError(f"kernel {name} is neither a tensor program nor a library kernel")
        note = "" if not parts else f", reading {', '.join(sorted(parts))} in parts"
        schedule = schedules_of(program).wasm
        kernels.append(KernelFunctions(index, f"tensor program {program.name} (schedule {schedule}{note})",
                                       render_program(program, parts, schedule)))
        scratch = max(scratch, schedule.scratch_bytes)
        factor = prepacked_factor_of(program, schedule, parts)
        if factor is not None:
            prepacked[index] = factor
    wat = assemble_kernels_module(kernels, source, {**MATH_FUNCTIONS, **HELPER_FUNCTIONS})
    return KernelsWasm(wat, wat_to_wasm(wat), relaxed_madd_sites(wat), scratch, prepacked)
