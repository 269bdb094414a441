"""The WebGPU backend of the host-program driver (``runtime/driver.py``): each state of a run on a device.

A stage is one command encoder: the copies that carry grown storages' contents over (and, on
the first, the GPU-to-GPU copies of GpuTensor inputs), then the stage's dispatches in one
compute pass; a read ends it with a submit and a 4-byte map, a resume with a submit, the last
stage with the output copies and the run's last submit.  The run status rides with the reads:
a run that reads nothing back (every output kept) leaves it unread for the next read.  GPU
tensors (``keep_on_gpu``, KV cache views: ``runtime/gpu_tensor.py``) are this backend's too.
``runtime_js/webgpu_backend.js`` is the twin.
"""

from __future__ import annotations

import struct
from collections.abc import Iterable, Mapping, Sequence
from typing import Any

import numpy as np
import wgpu

from relaxweb.errors import RelaxwebError
from relaxweb.runtime.batch import one_by_one_reason
from relaxweb.runtime.driver import PreparedRun
from relaxweb.runtime.gpu_tensor import BufferPool, CacheView, GpuTensor, cache_block_copies
from relaxweb.runtime.host import Command, Dispatch, Read
from relaxweb.runtime.host_session import HostStep
from relaxweb.runtime.run_status import CLEARED, STATUS_BYTES, check_run_status
from relaxweb.runtime.tensors import (
    checked_inputs, device_byte_sizes, device_dtype, kept_output_indices, output_array, split_sequences, to_model_dtype,
)
from relaxweb.runtime.webgpu_batch import WebGpuRaggedBatch
from relaxweb.runtime.webgpu_buffers import (
    READBACK_USAGE, STORAGE_USAGE, CarriedOver, SessionBuffers, gpu_buffer_size, padded_to_multiple_of_4,
)
from relaxweb.runtime.webgpu_device import TIMESTAMP_QUERY
from relaxweb.runtime.webgpu_timers import DispatchTimer, SubmitTimer, TimestampTimer

#: (source, offset, storage, offset, bytes) of a GPU-to-GPU copy of a GpuTensor input
InputCopy = tuple[wgpu.GPUBuffer, int, wgpu.GPUBuffer, int, int]


class WebGpuBackend:
    """The run state of one ``webgpu.Session``: its buffers, pipelines, the encoder of the
    stage in progress, and the old buffers of storages grown during the run."""

    def __init__(self, session: Any, buffers: SessionBuffers, layouts: list[wgpu.GPUBindGroupLayout],
                 pipelines: list[wgpu.GPUComputePipeline], sizes_at_bounds: list[int] | None) -> None:
        self.session = session  # the webgpu.Session its GpuTensors belong to
        self.manifest = session.manifest
        self.device: wgpu.GPUDevice = buffers.device
        self.stats = buffers.stats
        self.buffers = buffers
        self.layouts = layouts
        self._pipelines = pipelines
        # KV caches (manifest "caches"): by input index and by output index
        self._cache_of_input = {cache["input"]: cache for cache in self.manifest.get("caches", [])}
        self._cache_of_output = {cache["output"]: cache for cache in self.manifest.get("caches", [])}
        # runs that started writing the GPU: a view of a cache is current while it is this run's
        self.run_number = 0
        # what a kept output's buffer is sized at: its storage's size at the bounds (None: unbounded)
        self._sizes_at_bounds = sizes_at_bounds
        self._gpu_tensor_pool = BufferPool()  # buffers of disposed GpuTensors, for the next kept outputs
        self._ragged_batch: WebGpuRaggedBatch | None = None
        # the run in progress
        self._encoder: wgpu.GPUCommandEncoder | None = None
        self._carried_over: CarriedOver = []  # storages grown since the last submit: copied by the next stage
        self._retired: list[wgpu.GPUBuffer] = []  # old buffers copied by stages submitted without a wait
        self._input_copies: list[InputCopy] = []  # GpuTensor inputs, copied by the first stage
        # a run that read nothing back left the run status uncopied: the next read carries it
        self._status_unread = False

    # Before the run ------------------------------------------------------------------------

    def prepare_run(self, inputs: Mapping[str, Any], keep_on_gpu: bool | Iterable[str]) -> PreparedRun:
        kept = self.kept_output_indices(keep_on_gpu)
        self.stats.start_run()
        arrays, sequences = checked_inputs(self.manifest, inputs, self._check_gpu_tensor)
        shapes = [() if index in sequences else array.shape for index, array in enumerate(arrays)]
        return PreparedRun(shapes, sequences, arrays, kept)

    def one_by_one_reason(self, instances: Sequence[Mapping[str, Any]]) -> str:
        return one_by_one_reason(self.manifest, instances)

    def ragged_batch(self) -> WebGpuRaggedBatch:
        if self._ragged_batch is None:
            self._ragged_batch = WebGpuRaggedBatch(self)
        return self._ragged_batch

    def check_commands(self, commands: Sequence[Command]) -> None:
        """Refuse a grid the device cannot dispatch, instead of a GPU validation error."""
        most = self.device.limits["max-compute-workgroups-per-dimension"]
        for command in commands:
            if isinstance(command, Dispatch) and max(command.grid) > most:
                raise RelaxwebError(
                    f"these inputs are too large for this device: call site {command.call_site} "
                    f"({self.manifest['call_sites'][command.call_site]['binding']}) needs "
                    f"{max(command.grid)} workgroups along one dimension, the device allows {most}"
                )

    def prepare_storages(self, sizes: Sequence[int], keep_contents: bool) -> None:
        carried_over = self.buffers.grow_storages(sizes, keep_contents)
        if keep_contents:
            self._carried_over = carried_over

    def write_inputs(self, run: PreparedRun) -> None:
        # the current views of caches are read before the run number moves on
        self._input_copies = self._gpu_tensor_input_copies(run.arrays)
        self.run_number += 1  # every cache is written from here on: older views are stale
        self._upload_inputs(run.arrays)
        self.clear_status()

    # Stages --------------------------------------------------------------------------------

    def begin_step(self, params: bytes) -> None:
        """The params block written; a new encoder with the copies that carry grown storages'
        contents over and the first stage's GpuTensor input copies."""
        self.buffers.write(self.buffers.params, params, "params_bytes_written")
        encoder = self.device.create_command_encoder()
        for old, new in self._carried_over:
            encoder.copy_buffer_to_buffer(old, 0, new, 0, old.size)
        for source, source_offset, storage, target_offset, byte_size in self._input_copies:
            encoder.copy_buffer_to_buffer(source, source_offset, storage, target_offset, byte_size)
        self._input_copies = []
        self._encoder = encoder

    def encode_dispatches(self, dispatches: Sequence[Dispatch], params: bytes, timer: DispatchTimer | None) -> None:
        """The stage's dispatches in one compute pass (a timer encodes, and may submit, them its
        own way and hands on the encoder to go on with)."""
        if timer is not None:
            self._encoder = timer.encode(self._encoder, list(dispatches), params)
            return
        compute_pass = self._encoder.begin_compute_pass()
        for command in dispatches:
            self.encode_dispatch(compute_pass, command)
        compute_pass.end()

    def encode_dispatch(self, compute_pass: wgpu.GPUComputePassEncoder, command: Dispatch) -> None:
        kernel = self.manifest["call_sites"][command.call_site]["kernel"]
        compute_pass.set_pipeline(self._pipelines[kernel])
        compute_pass.set_bind_group(0, self.buffers.bind_group(command.call_site, self.layouts[kernel]))
        compute_pass.dispatch_workgroups(*command.grid)

    def read_value(self, read: Read) -> int:
        """Copy the i32 the read record names into the staging buffer, submit the stage, wait
        for it and return the value (the old buffers it copied are destroyed then)."""
        storage = self.buffers.storages[read.storage]
        if read.byte_offset + 4 > storage.size:
            raise RelaxwebError(
                f"the bundle's command list reads bytes {read.byte_offset}..{read.byte_offset + 4} "
                f"of storage {read.storage}, which has {storage.size} bytes"
            )
        staging = self.buffers.read_staging()
        self._encoder.copy_buffer_to_buffer(storage, read.byte_offset, staging, 0, 4)
        carries_status = self.copy_status_into(self._encoder, staging, 4, unread_only=False)
        self.device.queue.submit([self._encoder.finish()])
        staging.map_sync(wgpu.MapMode.READ)
        try:
            data = bytes(staging.read_mapped(0, staging.size))
        finally:
            staging.unmap()
        if carries_status:  # an error before the read may have made its value meaningless
            check_run_status(self.manifest, data[4:])
        (value,) = struct.unpack("<i", data[:4])
        self.stats.add("bytes_read", 4)
        self._destroy(self._carried_over)
        self._carried_over = []
        return value

    def submit(self) -> None:
        """Submit a stage that resumes (a loop's iteration); its old buffers go when the run ends."""
        self.device.queue.submit([self._encoder.finish()])
        self._retired += [old for old, _ in self._carried_over]
        self._carried_over = []

    # The outputs ---------------------------------------------------------------------------

    def submit_outputs(self, run: PreparedRun, step: HostStep) -> tuple:
        """After the last stage's dispatches: kept outputs' copies, the output copies into the
        readback buffers (the run status's too), and the run's last submit.  A run that reads
        nothing back (every output kept) copies no status: it is left for the next read."""
        byte_sizes = device_byte_sizes(self.manifest, step.output_shapes)
        self.buffers.grow_readbacks(byte_sizes, run.kept)
        kept_tensors = self._keep_outputs(run.kept, step.output_shapes, byte_sizes)
        for index, output in enumerate(self.manifest["outputs"]):
            copy_size = (byte_sizes[index] + 3) // 4 * 4
            if not copy_size or index in run.kept:
                continue
            storage, readback = self.buffers.storages[output["storage"]], self.buffers.readbacks[index]
            if index in self._cache_of_output:  # its rows of each block
                shape = step.output_shapes[index]
                itemsize = byte_sizes[index] // int(np.prod(shape, dtype=np.int64))
                for dense, at, size in cache_block_copies(self._cache_of_output[index], shape, itemsize, None):
                    self._encoder.copy_buffer_to_buffer(storage, at, readback, dense, size)
            else:
                self._encoder.copy_buffer_to_buffer(storage, 0, readback, 0, copy_size)
        reads_back = len(run.kept) < len(self.manifest["outputs"])
        if reads_back:
            self.copy_status(self._encoder)
        elif self.buffers.status is not None:
            self._status_unread = True
        self.device.queue.submit([self._encoder.finish()])
        self._encoder = None
        return run, step, byte_sizes, kept_tensors, reads_back

    def read_outputs(self, readback: tuple) -> dict[str, Any]:
        """Map each readback buffer (but those of kept outputs) into an array of the output's
        shape; kept outputs are their GpuTensors; sequences split into their elements."""
        run, step, byte_sizes, kept_tensors, reads_back = readback
        if reads_back:
            self.check_status()
        outputs = {}
        for index, output in enumerate(self.manifest["outputs"]):
            if index in run.kept:
                outputs[output["name"]] = kept_tensors[output["name"]]
                continue
            shape, byte_size = step.output_shapes[index], byte_sizes[index]
            if byte_size == 0:
                outputs[output["name"]] = output_array(self.manifest, output, b"", shape, 0)
                continue
            buffer = self.buffers.readbacks[index]
            buffer.map_sync(wgpu.MapMode.READ)
            try:
                data = bytearray(buffer.read_mapped(0, gpu_buffer_size(byte_size)))
                self.stats.add("bytes_read", len(data))
            finally:
                buffer.unmap()
            outputs[output["name"]] = output_array(self.manifest, output, data, shape, byte_size)
        return split_sequences(self.manifest, outputs, step.element_shapes)

    # The run status (run_status.py): cleared, copied with the next read, checked ---------

    def clear_status(self) -> None:
        """Zero the run status before the run's first submit (a write_buffer, ordered before it),
        unless an earlier run left it unread: then its error, if any, stays for the next read."""
        if self.buffers.status is not None and not self._status_unread:
            self.device.queue.write_buffer(self.buffers.status, 0, CLEARED)

    def copy_status(self, encoder: wgpu.GPUCommandEncoder) -> None:
        """The run status copied into its readback buffer (``check_status`` maps it), in the
        encoder of a submit that is read back."""
        self.copy_status_into(encoder, self.buffers.status_readback, 0, unread_only=False)

    def copy_status_into(self, encoder: wgpu.GPUCommandEncoder, target: wgpu.GPUBuffer, offset: int, *,
                         unread_only: bool = True) -> bool:
        """Copy the run status to ``offset`` of ``target`` (a buffer the caller maps, to check
        its bytes there with ``check_run_status`` before using what it read), when the bundle
        has one and, with ``unread_only``, an earlier run left it unread (a GpuTensor's read, the
        sampled token's); returns whether it did.  From this copy on the status is read."""
        if self.buffers.status is None or (unread_only and not self._status_unread):
            return False
        encoder.copy_buffer_to_buffer(self.buffers.status, 0, target, offset, STATUS_BYTES)
        self._status_unread = False
        return True

    def check_status(self) -> None:
        """The run's error, when a kernel reported one (the status copied by the last submit)."""
        readback = self.buffers.status_readback
        if readback is None:
            return
        readback.map_sync(wgpu.MapMode.READ)
        try:
            data = bytes(readback.read_mapped(0, STATUS_BYTES))
        finally:
            readback.unmap()
        check_run_status(self.manifest, data)

    def release_run(self) -> None:
        """Destroy the old buffers of storages grown during the run, once its submits are done."""
        self._destroy(self._carried_over)
        for old in self._retired:
            old.destroy()
        self._carried_over, self._retired, self._input_copies, self._encoder = [], [], [], None

    def create_timer(self) -> DispatchTimer:
        return TimestampTimer(self) if TIMESTAMP_QUERY in self.device.features else SubmitTimer(self)

    @staticmethod
    def _destroy(carried_over: CarriedOver) -> None:
        for old, _ in carried_over:
            old.destroy()

    # Inputs --------------------------------------------------------------------------------

    def _upload_inputs(self, arrays: list[Any]) -> None:
        for index, (entry, array) in enumerate(zip(self.manifest["inputs"], arrays)):
            if isinstance(array, GpuTensor) or array.nbytes == 0:
                continue
            if index in self._cache_of_input:  # a cache's past: each block at the start of its capacity rows
                cache = self._cache_of_input[index]
                buffer = self.buffers.storages[cache["storage"]]
                for source, target, size in cache_block_copies(cache, array.shape, array.itemsize, None):
                    self.buffers.write(buffer, memoryview(array).cast("B")[source:source + size], "input_bytes_written",
                                       target)
                continue
            data = padded_to_multiple_of_4(memoryview(array).cast("B"))
            buffer = self.buffers.storages[entry["storage"]]
            if buffer is None or buffer.size < len(data):
                raise RelaxwebError(
                    f"the bundle's host module gave input '{entry['name']}' a storage of "
                    f"{0 if buffer is None else buffer.size} bytes for {len(data)} bytes of data: the bundle is damaged"
                )
            self.buffers.write(buffer, data, "input_bytes_written")

    # GPU tensors (run(..., keep_on_gpu=...)) -------------------------------------------

    def kept_output_indices(self, keep_on_gpu: bool | Iterable[str]) -> frozenset[int]:
        """The indices of the outputs ``keep_on_gpu`` names (True: every output but sequences)."""
        return kept_output_indices(self.manifest, keep_on_gpu)

    def _check_gpu_tensor(self, name: str, tensor: GpuTensor) -> None:
        """Refuse a disposed GpuTensor or one on another device, naming the input."""
        if tensor.disposed:
            raise RelaxwebError(f"input '{name}': GPU tensor '{tensor.name}' was disposed and cannot be used any more")
        if tensor.session.device is not self.device:
            raise RelaxwebError(
                f"input '{name}': GPU tensor '{tensor.name}' lives on another WebGPU device than this session's; "
                "read it with .numpy() and pass the array"
            )

    def _gpu_tensor_input_copies(self, arrays: list[Any]) -> list[InputCopy]:
        """(source, offset, storage, offset, bytes) of each GpuTensor input, for the run's first
        encoder: nothing for the current view of an input's own cache (it is there already),
        a copy per block into a cache's rows for any other tensor given as a cache's past."""
        copies = []
        for index, (entry, value) in enumerate(zip(self.manifest["inputs"], arrays)):
            if not isinstance(value, GpuTensor) or value.nbytes == 0:
                continue
            view = value.cache_view
            self._check_view(entry["name"], value)
            cache = self._cache_of_input.get(index)
            if cache is not None:
                if view is not None and view.cache is cache:
                    continue  # the cache holds it already: nothing moves
                own_past = arrays[view.cache["input"]] if view is not None else None
                if view is not None and not (isinstance(own_past, GpuTensor) and own_past.cache_view is not None
                                             and own_past.cache_view.cache is view.cache):
                    raise RelaxwebError(
                        f"input '{entry['name']}': GPU tensor '{value.name}' is a view of another KV cache whose own past "
                        "in this run is not that view (this run overwrites it first); read it with .numpy() and pass the array")
                storage = self.buffers.storages[cache["storage"]]
                itemsize = value.nbytes // max(1, int(np.prod(value.shape, dtype=np.int64)))
                for source, target, size in cache_block_copies(cache, value.shape, itemsize,
                                                               None if view is None else view.cache):
                    copies.append((value.buffer(), source, storage, target, size))
                continue
            if view is not None:
                raise RelaxwebError(f"input '{entry['name']}': GPU tensor '{value.name}' is a view of a KV cache; "
                                    "it can be given back only as a cache's past (or read with .numpy())")
            copy_size = (value.nbytes + 3) // 4 * 4
            storage = self.buffers.storages[entry["storage"]]
            if storage is None or storage.size < copy_size:
                raise RelaxwebError(
                    f"the bundle's host module gave input '{entry['name']}' a storage of "
                    f"{0 if storage is None else storage.size} bytes for {value.nbytes} bytes of data: the bundle is damaged"
                )
            copies.append((value.buffer(), 0, storage, 0, copy_size))
        return copies

    def _check_view(self, name: str, value: GpuTensor) -> None:
        """Refuse a view of another session's cache, or of a cache a later run has written."""
        view = value.cache_view
        if view is not None and value.session is not self.session:
            raise RelaxwebError(f"input '{name}': GPU tensor '{value.name}' is a view of another session's "
                                "KV cache; read it with .numpy() and pass the array")
        if view is not None and view.run != self.run_number:
            raise RelaxwebError(
                f"input '{name}': GPU tensor '{value.name}' is a view of a KV cache that a later run has "
                "written: a view is valid until the next run (read it with .numpy() first to keep its values)")

    def _keep_outputs(self, kept: frozenset[int], output_shapes: list[tuple[int, ...]],
                      output_byte_sizes: list[int]) -> dict[str, GpuTensor]:
        """A GpuTensor per kept output: a buffer from the pool (or a new one, sized at its
        storage's size at the bounds so that later runs find it fits), and the copy of the
        output into it, encoded after the last stage's dispatches."""
        tensors = {}
        for index in sorted(kept):
            output = self.manifest["outputs"][index]
            byte_size = output_byte_sizes[index]
            if index in self._cache_of_output:  # a view of the cache's storage: no buffer, no copy
                cache = self._cache_of_output[index]
                tensors[output["name"]] = GpuTensor(
                    self.session, output["name"], np.dtype(output["dtype"]), tuple(output_shapes[index]),
                    self.buffers.storages[cache["storage"]], byte_size, CacheView(cache, self.run_number))
                continue
            at_bounds = self._sizes_at_bounds[output["storage"]] if self._sizes_at_bounds else 0
            size = gpu_buffer_size(max(byte_size, at_bounds))
            buffer = self._gpu_tensor_pool.take(size) or self.buffers.create(
                label=f"kept output {index}", size=size, usage=STORAGE_USAGE)
            if byte_size:
                self._encoder.copy_buffer_to_buffer(self.buffers.storages[output["storage"]], 0, buffer, 0,
                                                    (byte_size + 3) // 4 * 4)
            tensors[output["name"]] = GpuTensor(
                self.session, output["name"], np.dtype(output["dtype"]), tuple(output_shapes[index]), buffer, byte_size)
        return tensors

    def read_gpu_tensor(self, tensor: GpuTensor) -> np.ndarray:
        """A GpuTensor's values as an array (what ``tensor.numpy()`` calls)."""
        stored = device_dtype(self.manifest["dtypes"][str(tensor.dtype)])
        if tensor.nbytes == 0:
            tensor.buffer()  # a disposed tensor is refused even when empty
            return np.zeros(tensor.shape, dtype=tensor.dtype)
        copy_size = (tensor.nbytes + 3) // 4 * 4
        view = tensor.cache_view
        if view is not None and view.run != self.run_number:
            raise RelaxwebError(f"GPU tensor '{tensor.name}' is a view of a KV cache that a later run has written: "
                                "a view is valid until the next run")
        # the run status after the values, when a run left it unread
        status = STATUS_BYTES if self._status_unread and self.buffers.status is not None else 0
        staging = self.buffers.create(label=f"read {tensor.name}", size=copy_size + status, usage=READBACK_USAGE)
        try:
            encoder = self.device.create_command_encoder()
            if view is None:
                encoder.copy_buffer_to_buffer(tensor.buffer(), 0, staging, 0, copy_size)
            for dense, at, size in () if view is None else cache_block_copies(
                    view.cache, tensor.shape, tensor.nbytes // int(np.prod(tensor.shape, dtype=np.int64)), None):
                encoder.copy_buffer_to_buffer(tensor.buffer(), at, staging, dense, size)
            carries_status = self.copy_status_into(encoder, staging, copy_size) if status else False
            self.device.queue.submit([encoder.finish()])
            staging.map_sync(wgpu.MapMode.READ)
            try:
                data = bytearray(staging.read_mapped(0, copy_size + status))
            finally:
                staging.unmap()
        finally:
            staging.destroy()
        if carries_status:  # a kept run's error surfaces here, before its values are used
            check_run_status(self.manifest, data[copy_size:])
        del data[copy_size:]
        self.stats.add("bytes_read", len(data))
        array = np.frombuffer(data, dtype=stored, count=tensor.nbytes // stored.itemsize)
        return to_model_dtype(array, tensor.dtype).reshape(tensor.shape)

    def release_gpu_buffer(self, buffer: wgpu.GPUBuffer) -> None:
        """Take back the buffer of a disposed GpuTensor, for later kept outputs."""
        self._gpu_tensor_pool.give(buffer)
