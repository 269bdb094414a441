"""Running one generated kernel by hand on wgpu (lavapipe here), for codegen and op tests."""

from __future__ import annotations

import math
import struct

import numpy as np

from relaxweb.ir.launch import dispatch_count
from relaxweb.ir.schedule import WORKGROUP_SIZE
from relaxweb.ir.symbolic import evaluate
from relaxweb.ir.tir import TensorProgram
from relaxweb.wgsl import emit_wgsl

SENTINEL = -7


def make_pipeline(device, shader):
    """A compute pipeline with the explicit bind group layout the bundle contract uses."""
    import wgpu

    module = device.create_shader_module(code=shader.source)
    layout = device.create_bind_group_layout(entries=[
        {"binding": b, "visibility": wgpu.ShaderStage.COMPUTE, "buffer": {"type": t}}
        for b, t in enumerate(shader.bindings)
    ])
    pipeline = device.create_compute_pipeline(
        layout=device.create_pipeline_layout(bind_group_layouts=[layout]),
        compute={"module": module, "entry_point": "main"},
    )
    return pipeline, layout


def run_kernel_on_gpu(device, program: TensorProgram, arrays: list[np.ndarray], size_vars: dict[str, int],
                      grid: tuple[int, int, int] | None = None) -> np.ndarray:
    """Dispatch the program's shader once with a hand-filled params block; return the output.

    The output buffer has 64 sentinel elements past the end, which must stay untouched
    (the shader's bounds guard).
    """
    shape = [int(evaluate(d, size_vars)) for d in program.output.shape]
    invocations = int(evaluate(dispatch_count(program), size_vars))  # the schedule's
    return _dispatch_once(device, emit_wgsl(program), arrays, size_vars, shape, np.dtype(program.output.dtype),
                          invocations, grid)


def _dispatch_once(device, shader, arrays: list[np.ndarray], size_vars: dict[str, int], shape: list[int],
                   dtype: np.dtype, invocations: int, grid: tuple[int, int, int] | None,
                   initial: np.ndarray | None = None) -> np.ndarray:
    """``shader`` run once on ``arrays`` (params: ``invocations``, then its size variables),
    its output of ``shape`` starting as ``initial`` (else the sentinel) with 64 sentinel
    elements past the end that must stay untouched; a run status it binds must stay 0."""
    import wgpu

    pipeline, layout = make_pipeline(device, shader)
    count = int(np.prod(shape))
    values = [invocations, *(size_vars[f] for f in shader.params_fields[1:])]
    params = struct.pack(f"<{shader.params_size // 4}i", *values, *[0] * (shader.params_size // 4 - len(values)))
    usage = wgpu.BufferUsage.STORAGE | wgpu.BufferUsage.COPY_DST | wgpu.BufferUsage.COPY_SRC
    buffers = [device.create_buffer_with_data(data=params, usage=wgpu.BufferUsage.UNIFORM)]
    # an empty input still needs a (4-byte) buffer to bind
    buffers += [device.create_buffer_with_data(data=np.ascontiguousarray(a).tobytes() or b"\0" * 4, usage=usage)
                for a in arrays]
    start = np.full(count + 64, SENTINEL, dtype)
    if initial is not None:
        start[:count] = np.asarray(initial, dtype).reshape(-1)
    output = device.create_buffer_with_data(data=start.tobytes(), usage=usage)
    buffers.append(output)
    status = None
    if len(shader.bindings) > len(buffers):  # the run status of a program that checks its data
        status = device.create_buffer_with_data(data=bytes(32), usage=usage)
        buffers.append(status)
    bind_group = device.create_bind_group(layout=layout, entries=[
        {"binding": b, "resource": {"buffer": buffer, "offset": 0, "size": buffer.size}}
        for b, buffer in enumerate(buffers)
    ])
    encoder = device.create_command_encoder()
    compute_pass = encoder.begin_compute_pass()
    compute_pass.set_pipeline(pipeline)
    compute_pass.set_bind_group(0, bind_group)
    compute_pass.dispatch_workgroups(*(grid or (max(1, math.ceil(invocations / WORKGROUP_SIZE)), 1, 1)))
    compute_pass.end()
    device.queue.submit([encoder.finish()])
    result = np.frombuffer(device.queue.read_buffer(output), dtype=dtype)
    np.testing.assert_array_equal(result[count:], start[count:])  # the bounds guard works: nothing past the end
    if status is not None:
        words = np.frombuffer(device.queue.read_buffer(status), np.int32)
        assert not words[0], f"the kernel reported error site {words[0]} with values {words[1:].tolist()}"
    return result[:count].reshape(shape).copy()


def run_compiled(module, feeds: dict[str, np.ndarray], folder, bounds: dict[str, int] | None = None,
                 kernels: str = "auto") -> list[np.ndarray]:
    """Compile an imported module through the whole pipeline into a bundle in ``folder`` and
    run it once with the Python runtime (wgpu; ``kernels`` picks the shaders as ``load`` does);
    the outputs in the model's order."""
    from relaxweb.bundle import write_bundle
    from relaxweb.compiler import compile_module
    from relaxweb.runtime.webgpu import Session

    write_bundle(compile_module(module, bounds or {}), folder, "model")
    return list(Session(folder, kernels=kernels).run(feeds).values())


def run_library_kernel_on_gpu(device, kernel, arrays: list[np.ndarray], size_vars: dict[str, int],
                              initial: np.ndarray | None = None,
                              grid: tuple[int, int, int] | None = None, target: str = "webgpu") -> np.ndarray:
    """Dispatch a library kernel's WebGPU shader (its form for ``target``) once (``relaxweb/wgsl/library``) with a
    hand-filled params block (its ``dispatch_count`` invocations, then its size variables);
    return the output.

    ``initial`` is the output buffer's content before the run (an in-place kernel's, e.g. a
    KV cache pool; by default the sentinel).  The buffer has 64 sentinel elements past the
    end, which must stay untouched; ``grid`` dispatches the workgroups as another grid (the
    flat workgroup index of the shader contract; past the dispatch count they must idle).
    """
    from dataclasses import replace

    from relaxweb.wgsl.library import emit_library_kernel, library_kernel_wgsl

    shader = replace(emit_library_kernel(kernel), source=library_kernel_wgsl(kernel, target))
    shape = [int(evaluate(d, size_vars)) for d in kernel.output.shape]
    invocations = int(evaluate(kernel.dispatch_count, size_vars))
    return _dispatch_once(device, shader, arrays, size_vars, shape, np.dtype(kernel.output.dtype), invocations, grid,
                          initial)
