"""The library kernels' WGSL (``relaxweb/wgsl/library``): a renderer for every builder, every
WebGPU target a kernel lists rendered with the kernel's bindings and params block, and the
code rendered from the builder's name and arguments alone (as after the IR text's rebuild)."""

from __future__ import annotations

import dataclasses
import re

import pytest

from relaxweb.cpu.library.recurrent import WAT_ACTIVATIONS
from relaxweb.ir.kernel_builders import _BUILDERS, build_library_kernel
from relaxweb.ir.library_kernel import LIBRARY_TARGETS, WASM, WEBGPU, WEBGPU_CPU, WEBGPU_F16
from relaxweb.ir.symbolic import IntImm, SizeVar
from relaxweb.library import (
    attention_kernel, kv_cache_write_kernel, paged_attention_kernel, paged_kv_write_kernel, recurrence_kernel,
    sequence_write_kernel, unique_count_kernel, unique_values_kernel, write_row_kernel,
)
from relaxweb.library.recurrent import ACTIVATIONS
from relaxweb.wgsl.library import RENDERERS, emit_library_kernel, library_kernel_wgsl
from relaxweb.wgsl.library.recurrent import WGSL_ACTIVATIONS

n = SizeVar("n")
KERNELS = [
    attention_kernel("attention", (2, 3), n, SizeVar("past") + n, 8, 4, (2, 1, n, SizeVar("past") + n), 0.5, True,
                     kv_batch=(2, 1), key_rows=IntImm(16)),
    recurrence_kernel("gru", "gru", n, 2, 8, "forward", (("sigmoid", 0, 0), ("tanh", 0, 0)),
                      optional=("sequence_lens",)),
    write_row_kernel("write_row", n, (4,), "float32", "row"),
    sequence_write_kernel("int32"),
    kv_cache_write_kernel("kv", (1, 2), n, (8,), 64, "float32", "past"),
    kv_cache_write_kernel("kv_ragged", (SizeVar("b"), 2), n, (8,), 64, "float32", "past", ragged=True),
    unique_count_kernel("count", n, "float32"),
    unique_values_kernel("values", n, "int32"),
    paged_kv_write_kernel("paged_write", 1, 4, n, 8, 12, 16, 4, "float32"),
    paged_attention_kernel("paged_attention", 1, 4, 2, n, 8, 72, 12, 16, 4, 0.125, "float32"),
]


def test_every_builder_has_a_renderer() -> None:
    assert set(RENDERERS) == set(_BUILDERS) == {kernel.builder for kernel in KERNELS}


def test_the_backends_have_every_activation_of_the_recurrence() -> None:
    assert set(WGSL_ACTIVATIONS) == set(WAT_ACTIVATIONS) == set(ACTIVATIONS)


@pytest.mark.parametrize("kernel", KERNELS, ids=lambda kernel: kernel.builder)
def test_each_webgpu_target_renders_with_the_kernels_bindings(kernel) -> None:
    shader = emit_library_kernel(kernel)
    assert shader.params.size_vars == tuple(var.name for var in kernel.size_vars)
    assert shader.bindings == ("uniform", *("read-only-storage",) * len(kernel.inputs), "storage")
    for target in (WEBGPU, WEBGPU_F16, WEBGPU_CPU):
        source = library_kernel_wgsl(kernel, target)
        assert (source is not None) == (target in kernel.targets)
        if source is None:
            continue
        assert "@compute @workgroup_size(64)" in source and (target == WEBGPU_F16) == source.startswith("enable f16;")
        bindings = [int(b) for b in re.findall(r"@binding\((\d+)\)", source)]
        assert bindings == list(range(len(kernel.inputs) + 2))
    assert set(kernel.targets) <= set(LIBRARY_TARGETS) and WASM in kernel.targets


def test_attention_has_every_webgpu_form_and_the_others_one() -> None:
    assert [kernel.targets for kernel in KERNELS if kernel.builder == "attention"] == [LIBRARY_TARGETS]
    assert [kernel.targets for kernel in KERNELS if kernel.builder == "paged_attention"] == [(WEBGPU, WEBGPU_CPU, WASM)]
    assert all(kernel.targets == (WEBGPU, WASM) for kernel in KERNELS if "attention" not in kernel.builder)


@pytest.mark.parametrize("kernel", KERNELS, ids=lambda kernel: kernel.builder)
def test_the_code_is_rendered_from_the_builder_and_its_arguments(kernel) -> None:
    rebuilt = build_library_kernel(kernel.builder, kernel.arguments)
    assert rebuilt == kernel
    assert [library_kernel_wgsl(rebuilt, t) for t in LIBRARY_TARGETS[:3]] == [library_kernel_wgsl(kernel, t)
                                                                            for t in LIBRARY_TARGETS[:3]]


def test_a_kernel_renamed_in_a_module_keeps_its_code() -> None:
    """A module renames a program to keep names unique (``IRModule``); the code is rendered from
    the builder's arguments, so it is the same as the builder's name gave it."""
    kernel = KERNELS[2]
    assert library_kernel_wgsl(dataclasses.replace(kernel, name="write_row_2")) == library_kernel_wgsl(kernel)
