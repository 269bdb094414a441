"""Which shaders a WebGPU session compiles, and its compute pipelines.

A kernel may ship variants (``cpu_file`` for adapters that run shaders on the CPU, ``f16_file``
for devices with ``shader-f16``, ``batch_file`` / ``batch_cpu_file`` for ragged batches:
docs/bundle-format.md, "Kernel variants"); :func:`choose_kernels` picks the set, the functions
below compile them.  How a kernel's source is read is the caller's (``read_source(file)``).
"""

from __future__ import annotations

import warnings
from collections.abc import Callable, Mapping
from typing import Any

import wgpu

from relaxweb.errors import RelaxwebError
from relaxweb.runtime.webgpu_device import default_adapter

KERNEL_VARIANTS = ("auto", "gpu", "cpu", "f16")  # which shaders of kernels with a variant a session compiles
SHADER_F16 = "shader-f16"  # the WebGPU feature the f16 shaders (``f16_file``) need


def choose_kernels(requested: str, adapter_info: Mapping[str, Any], features: Any, *, has_f16_shaders: bool) -> str:
    """The shaders a session compiles ("gpu", "cpu" or "f16") for the ``kernels`` option.

    "auto" takes the CPU shaders on an adapter that runs shaders on the CPU (lavapipe,
    SwiftShader: wgpu's ``adapter_type``), where kernels with a ``cpu_file`` run faster from
    it, else the f16 ones when the bundle has some and the adapter (or the given device)
    offers ``shader-f16``, else the staged f32 ones.  "f16" falls back to "gpu" where the
    feature or the f16 shaders are missing (the outputs are then within f32's tolerance, not
    f16's; ``Session`` warns).  ``adapter_info`` and ``features`` are the adapter's (wgpu's
    ``adapter.info``), or the given device's."""
    f16 = has_f16_shaders and SHADER_F16 in {str(feature) for feature in features}
    if requested == "auto":
        return "cpu" if adapter_info.get("adapter_type") == "CPU" else "f16" if f16 else "gpu"
    if requested == "f16" and not f16:
        return "gpu"
    return requested


def kernel_file(kernel: Mapping[str, Any], kernels: str) -> str:
    """The shader file a session that chose ``kernels`` compiles for a manifest kernel."""
    variant = {"cpu": "cpu_file", "f16": "f16_file"}.get(kernels)
    return kernel.get(variant, kernel["file"]) if variant else kernel["file"]


def ragged_kernel_file(kernel: Mapping[str, Any], kernels: str) -> str:
    """The ragged form's shader file (``batch_cpu_file`` where the session chose "cpu")."""
    file = kernel.get("batch_cpu_file") if kernels == "cpu" else None
    return file or kernel["batch_file"]


def session_kernels(requested: str, manifest: Mapping[str, Any], device: wgpu.GPUDevice | None) -> str:
    """:func:`choose_kernels` for the given device, or for the default adapter (whose device
    is then requested with ``shader-f16`` when the choice is "f16"); a warning (pointing at
    the caller of ``Session``) when "f16" was asked for and cannot be had."""
    has_f16_shaders = any("f16_file" in kernel for kernel in manifest["kernels"])
    if device is None:
        adapter = default_adapter()
        chosen = choose_kernels(requested, adapter.info, adapter.features, has_f16_shaders=has_f16_shaders)
    else:
        chosen = choose_kernels(requested, device.adapter_info, device.features, has_f16_shaders=has_f16_shaders)
    if requested == "f16" and chosen != "f16":
        reason = ("the bundle has no f16 shaders" if not has_f16_shaders else
                  f"the {'adapter' if device is None else 'given device'} does not offer {SHADER_F16}")
        warnings.warn(f"kernels='f16': {reason}; compiling the f32 shaders", RuntimeWarning, stacklevel=3)
    return chosen


def first_reason(text: str) -> str:
    """The most telling line of a wgpu error (it spans many lines with source excerpts)."""
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    telling = [line for line in lines if not line.startswith(("Caused by", "In wgpu", "Validation Error", "┌", "│", "^"))]
    return (telling or lines or ["no reason given"])[0][:300]


def create_pipelines(device: wgpu.GPUDevice, manifest: Mapping[str, Any], kernels: str,
                     read_source: Callable[[str], str]) -> tuple[list[wgpu.GPUBindGroupLayout], list[wgpu.GPUComputePipeline]]:
    """One compute pipeline per kernel (its ``kernels`` variant), with a bind group layout
    from its ``bindings``."""
    layouts = []
    pipelines = []
    for kernel in manifest["kernels"]:
        layout = device.create_bind_group_layout(
            label=kernel["name"],
            entries=[
                {"binding": binding, "visibility": wgpu.ShaderStage.COMPUTE, "buffer": {"type": binding_type}}
                for binding, binding_type in enumerate(kernel["bindings"])
            ],
        )
        file = kernel_file(kernel, kernels)
        source = read_source(file)
        try:
            shader = device.create_shader_module(label=kernel["name"], code=source)
            pipeline = device.create_compute_pipeline(
                label=kernel["name"],
                layout=device.create_pipeline_layout(bind_group_layouts=[layout]),
                compute={"module": shader, "entry_point": kernel["entry_point"]},
            )
        except wgpu.GPUError as error:
            raise RelaxwebError(f"kernel {file} does not compile on this device: {first_reason(str(error))}") from None
        layouts.append(layout)
        pipelines.append(pipeline)
    return layouts, pipelines


def create_ragged_pipeline(device: wgpu.GPUDevice, kernel: Mapping[str, Any], kernels: str,
                           layout: wgpu.GPUBindGroupLayout, read_source: Callable[[str], str]) -> wgpu.GPUComputePipeline:
    """The compute pipeline of a kernel's ragged form (it shares the kernel's bind group layout)."""
    file = ragged_kernel_file(kernel, kernels)
    source = read_source(file)
    try:
        module = device.create_shader_module(label=file, code=source)
        return device.create_compute_pipeline(
            label=file,
            layout=device.create_pipeline_layout(bind_group_layouts=[layout]),
            compute={"module": module, "entry_point": kernel["entry_point"]},
        )
    except wgpu.GPUError as error:
        raise RelaxwebError(f"kernel {file} does not compile on this device: {str(error).splitlines()[0]}") from None
