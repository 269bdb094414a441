"""The ragged batch backend of the host-program driver on WebGPU (``Session.run_batch``).

The algorithm is ``runtime/batch.py``'s and the rounds are ``runtime/driver.py``'s
(``run_batch_rounds``); this file owns the GPU side:

1. The storages' packed layout (every instance's slice, one after another) is computed from
   the instances' first steps and checked against the device's limits before any GPU work.
2. The packed storages are (re)allocated and each instance's inputs written into its slices.
3. Each round's ragged dispatches get their batch tables (one uniform buffer holds all of the
   round's, at 256-byte slots) and bind groups, and run the kernels' ragged pipelines (compiled
   on first use).  Reads of the round are copied from each instance's slice into one staging
   buffer, submitted and mapped once.  Storages an instance needs more of are re-laid-out
   between rounds, each instance's slice copied to its new place by the next round.
4. Outputs: every instance's outputs copied from its slices into one readback buffer, one map.

``runtime_js/webgpu_batch.js`` is the twin (it copies each instance's outputs in the round it
finishes: docs/runtime-core.md, "Differences").
"""

from __future__ import annotations

import math
import struct
from collections.abc import Mapping, Sequence
from typing import Any

import numpy as np
import wgpu

from relaxweb.errors import RelaxwebError
from relaxweb.runtime.batch import (
    MAX_INSTANCES, RaggedDispatch, SliceLayout, aligned, batch_table, check_totals, instance_error,
)
from relaxweb.runtime.driver import PreparedRun
from relaxweb.runtime.host import Read
from relaxweb.runtime.host_session import HostStep
from relaxweb.runtime.tensors import checked_inputs, device_byte_sizes, output_array
from relaxweb.runtime.webgpu_device import storage_size_limit
from relaxweb.runtime.webgpu_kernels import create_ragged_pipeline

_STORAGE_USAGE = wgpu.BufferUsage.STORAGE | wgpu.BufferUsage.COPY_DST | wgpu.BufferUsage.COPY_SRC
_TABLE_USAGE = wgpu.BufferUsage.UNIFORM | wgpu.BufferUsage.COPY_DST
_READBACK_USAGE = wgpu.BufferUsage.MAP_READ | wgpu.BufferUsage.COPY_DST
_TABLE_SLOT = 256  # minUniformBufferOffsetAlignment's default


def _slot(byte_size: int) -> int:
    return -(-byte_size // _TABLE_SLOT) * _TABLE_SLOT


class WebGpuRaggedBatch:
    """The batch state of one session: the ragged pipelines (compiled on first use), the
    packed storages and the table buffer, kept between batches and grown when a batch needs
    more; the layout and the encoder of the batch in progress."""

    def __init__(self, backend: Any) -> None:  # the webgpu_backend.WebGpuBackend it serves
        self.backend = backend
        self.session = backend.session
        self.manifest = backend.manifest
        self.device: wgpu.GPUDevice = backend.device
        self._pipelines: dict[int, wgpu.GPUComputePipeline] = {}
        self._storages: list[wgpu.GPUBuffer | None] = [None] * len(self.manifest["storages"])
        self._table_buffer: wgpu.GPUBuffer | None = None
        self._staging: wgpu.GPUBuffer | None = None
        # the batch in progress
        self._layout = SliceLayout([], [])
        self._limit: tuple[int, str] = (0, "")
        self._encoder: wgpu.GPUCommandEncoder | None = None
        # (storage, old buffer, new buffer, old layout) of storages re-laid-out since the last round
        self._carried: list[tuple[int, wgpu.GPUBuffer, wgpu.GPUBuffer, SliceLayout]] = []

    # Before any GPU work -------------------------------------------------------------------

    def prepare_instance(self, inputs: Mapping[str, Any]) -> PreparedRun:
        arrays, sequences = checked_inputs(self.manifest, inputs, None)
        return PreparedRun([array.shape for array in arrays], sequences, arrays)

    def lay_out(self, sizes: Sequence[Sequence[int]], var_values: Sequence[Mapping[str, int]]) -> None:
        self._layout = SliceLayout.of(sizes)
        self._limit = storage_size_limit(self.device)
        self._carried = []
        check_totals(self.manifest, self._layout, sizes, var_values, *self._limit)

    # GPU work ------------------------------------------------------------------------------

    def write_inputs(self, runs: Sequence[PreparedRun]) -> None:
        """The packed storages allocated (or kept, when large enough), the inputs in their slices."""
        for storage, total in enumerate(self._layout.totals):
            buffer = self._storages[storage]
            if buffer is None or buffer.size < total:
                if buffer is not None:
                    buffer.destroy()
                self._storages[storage] = self._create_storage(storage, total)
        queue = self.device.queue
        for index, run in enumerate(runs):
            for entry, array in zip(self.manifest["inputs"], run.arrays):
                if array.nbytes == 0:
                    continue
                data = memoryview(np.ascontiguousarray(array)).cast("B").tobytes()
                data += b"\0" * (-len(data) % 4)
                storage = entry["storage"]
                queue.write_buffer(self._storages[storage], self._layout.offsets[storage][index], data)
                self.backend.stats.add("input_bytes_written", len(data))
        self.backend.clear_status()  # one run status for the batch: its first error fails the batch

    def _create_storage(self, storage: int, total: int) -> wgpu.GPUBuffer:
        return self.device.create_buffer(label=f"batch storage {storage}", size=total, usage=_STORAGE_USAGE)

    def begin_round(self) -> None:
        """A new encoder, first copying each instance's slice of the storages re-laid-out."""
        encoder = self.device.create_command_encoder()
        for storage, old, new, old_layout in self._carried:
            for index, offset in enumerate(old_layout.offsets[storage]):
                encoder.copy_buffer_to_buffer(old, offset, new, self._layout.offsets[storage][index],
                                              old_layout.capacities[storage][index])
        self._encoder = encoder

    def encode_round(self, plan: Sequence[RaggedDispatch], live: Mapping[int, HostStep]) -> int:
        """The round's ragged dispatches in one compute pass; returns how many."""
        if not plan:
            return 0
        layout = self._layout
        tables, offsets = bytearray(), []
        for dispatch in plan:
            call_site = self.manifest["call_sites"][dispatch.call_site]
            entries, first = [], 0
            for index, member in dispatch.members:
                bases = [layout.offsets[ref["storage"]][index] if "storage" in ref else 0 for ref in call_site["buffers"]]
                entries.append((live[index].params, bases, first))
                first += math.prod(member.grid)
            table = batch_table(call_site, entries)
            offsets.append((len(tables), len(table)))
            tables += table + b"\0" * (_slot(len(table)) - len(table))
        self._write_tables(bytes(tables))
        compute_pass = self._encoder.begin_compute_pass()
        for dispatch, (offset, size) in zip(plan, offsets):
            call_site = self.manifest["call_sites"][dispatch.call_site]
            kernel_index = call_site["kernel"]
            entries = [{"binding": 0, "resource": {"buffer": self._table_buffer, "offset": offset, "size": size}}]
            for position, ref in enumerate(call_site["buffers"]):
                buffer = self._storages[ref["storage"]] if "storage" in ref else self.backend.buffers.referenced_buffer(ref)
                entries.append({"binding": position + 1, "resource": {"buffer": buffer, "offset": 0, "size": buffer.size}})
            bind_group = self.device.create_bind_group(layout=self.backend.layouts[kernel_index], entries=entries)
            compute_pass.set_pipeline(self._pipeline(kernel_index))
            compute_pass.set_bind_group(0, bind_group)
            compute_pass.dispatch_workgroups(*dispatch.grid)
        compute_pass.end()
        return len(plan)

    def _pipeline(self, kernel_index: int) -> wgpu.GPUComputePipeline:
        pipeline = self._pipelines.get(kernel_index)
        if pipeline is None:
            pipeline = create_ragged_pipeline(self.device, self.manifest["kernels"][kernel_index], self.session.kernels,
                                              self.backend.layouts[kernel_index], self.session.read_kernel_source)
            self._pipelines[kernel_index] = pipeline
        return pipeline

    def _write_tables(self, data: bytes) -> None:
        if self._table_buffer is None or self._table_buffer.size < len(data):
            if self._table_buffer is not None:
                self._table_buffer.destroy()
            self._table_buffer = self.device.create_buffer(
                label="batch tables", size=max(len(data), 2 * (self._table_buffer.size if self._table_buffer else 0)),
                usage=_TABLE_USAGE)
        self.device.queue.write_buffer(self._table_buffer, 0, data)
        self.backend.stats.add("params_bytes_written", len(data))

    def finish_instance(self, index: int, step: HostStep) -> HostStep:
        """Nothing to encode: every instance's outputs are copied at the end (``read_batch_outputs``)."""
        return step

    def read_values(self, reads: Mapping[int, Read]) -> dict[int, int]:
        """Submit the round; with reads, copy each instance's value into the staging buffer
        first and return them by instance.  The old buffers the round copied are destroyed."""
        values = self._submit_round(reads)
        for _, old, _, _ in self._carried:
            old.destroy()
        self._carried = []
        return values

    def _submit_round(self, reads: Mapping[int, Read]) -> dict[int, int]:
        device, encoder, layout = self.device, self._encoder, self._layout
        self._encoder = None
        if not reads:
            device.queue.submit([encoder.finish()])
            return {}
        need = 4 * len(reads)
        if self._staging is None or self._staging.size < need:
            self._staging = device.create_buffer(label="batch reads", size=max(need, 4 * MAX_INSTANCES),
                                                 usage=_READBACK_USAGE)
        order = sorted(reads)
        for position, index in enumerate(order):
            read = reads[index]
            if read.byte_offset + 4 > layout.capacities[read.storage][index]:
                raise instance_error(index, RelaxwebError(
                    f"the bundle's command list reads bytes {read.byte_offset}..{read.byte_offset + 4} of storage "
                    f"{read.storage}, which has {layout.capacities[read.storage][index]} bytes"))
            encoder.copy_buffer_to_buffer(self._storages[read.storage], layout.offsets[read.storage][index] + read.byte_offset,
                                          self._staging, 4 * position, 4)
        self.backend.copy_status(encoder)
        device.queue.submit([encoder.finish()])
        self.backend.check_status()  # an error before the reads may have made their values meaningless
        self._staging.map_sync(wgpu.MapMode.READ)
        try:
            data = self._staging.read_mapped(0, need)
            values = struct.unpack(f"<{len(order)}i", data)
        finally:
            self._staging.unmap()
        self.backend.stats.add("bytes_read", need)
        return dict(zip(order, values))

    def grow_slices(self, sizes: Sequence[Sequence[int]], var_values: Sequence[Mapping[str, int]]) -> None:
        """The layout grown to ``sizes``; storages whose slices moved get new buffers, each
        instance's slice copied over by the next round."""
        grown, changed = self._layout.grown(sizes)
        if changed:
            check_totals(self.manifest, grown, sizes, var_values, *self._limit)
        for storage in changed:
            old = self._storages[storage]
            new = self._create_storage(storage, grown.totals[storage])
            self._storages[storage] = new
            self._carried.append((storage, old, new, self._layout))
        self._layout = grown

    def release_batch(self) -> None:
        """After an error: the old buffers of storages re-laid-out and not copied yet."""
        for _, old, _, _ in self._carried:
            old.destroy()
        self._carried, self._encoder = [], None

    def read_batch_outputs(self, readbacks: Sequence[HostStep]) -> list[dict[str, np.ndarray]]:
        """Every instance's outputs (``readbacks``: each instance's last step), copied out of
        their slices into one readback buffer, submitted and mapped once."""
        device, outputs, layout = self.device, self.manifest["outputs"], self._layout
        shapes = [step.output_shapes for step in readbacks]
        byte_sizes = [device_byte_sizes(self.manifest, instance_shapes) for instance_shapes in shapes]
        places, total = [], 0
        for instance_sizes in byte_sizes:
            row = []
            for size in instance_sizes:
                row.append(total)
                total += aligned(size)
            places.append(row)
        results: list[dict[str, np.ndarray]] = [{} for _ in readbacks]
        readback = device.create_buffer(label="batch outputs", size=max(total, 4), usage=_READBACK_USAGE)
        try:
            encoder = device.create_command_encoder()
            for index in range(len(readbacks)):
                for k, output in enumerate(outputs):
                    size = -(-byte_sizes[index][k] // 4) * 4
                    if size:
                        storage = output["storage"]
                        encoder.copy_buffer_to_buffer(self._storages[storage], layout.offsets[storage][index],
                                                      readback, places[index][k], size)
            self.backend.copy_status(encoder)
            device.queue.submit([encoder.finish()])
            self.backend.check_status()
            readback.map_sync(wgpu.MapMode.READ)
            try:
                data = readback.read_mapped(0, max(total, 4))
                self.backend.stats.add("bytes_read", total)
                for index in range(len(readbacks)):
                    for k, output in enumerate(outputs):
                        start, size = places[index][k], byte_sizes[index][k]
                        results[index][output["name"]] = output_array(
                            self.manifest, output, bytearray(data[start:start + size]), shapes[index][k], size)
            finally:
                readback.unmap()
        finally:
            readback.destroy()
        return results
