"""``Session.run_batch`` on WebGPU: a batch of instances of different sizes as ragged dispatches.

The algorithm is ``runtime/batch.py``'s (its module doc); this file owns the GPU side:

1. Each instance's inputs are checked and its own host module instance runs on its shapes;
   the storages' packed layout is computed and checked against the device's limits, and so
   is every grid of the first round.  Nothing has touched the GPU yet.
2. The packed storages are (re)allocated and each instance's inputs written into its slices.
3. Rounds: the live instances' dispatches are merged; each batched dispatch gets its batch
   table (one uniform buffer holds all of the round's, at 256-byte slots) and a bind group,
   and runs the kernel's ragged pipeline.  A command list that ends with a read ends the
   instance's round: its value is copied from its slice into a staging buffer (all reads of a
   round in one submit and one map), given to its host, which resumes.  Storages an instance
   needs more of are re-laid-out between rounds, each instance's slice copied to its new place.
4. Outputs: every instance's outputs copied from its slices into one readback buffer, one map.
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
    MAX_INSTANCES, BatchReport, SliceLayout, aligned, batch_table, call_elements, check_totals, chunks, grid_of,
    instance_error,
    merge_dispatches,
)
from relaxweb.runtime.host import Command, Dispatch, HostModule, Read, Resume
from relaxweb.runtime.manifest import MAX_HOST_MODULE_BYTES, kernel_source, read_bundle_file
from relaxweb.runtime.tensors import checked_inputs, device_byte_sizes, output_array

_STORAGE_USAGE = wgpu.BufferUsage.STORAGE | wgpu.BufferUsage.COPY_DST | wgpu.BufferUsage.COPY_SRC
_TABLE_USAGE = wgpu.BufferUsage.UNIFORM | wgpu.BufferUsage.COPY_DST
_READBACK_USAGE = wgpu.BufferUsage.MAP_READ | wgpu.BufferUsage.COPY_DST
_TABLE_SLOT = 256  # minUniformBufferOffsetAlignment's default


def _slot(byte_size: int) -> int:
    return -(-byte_size // _TABLE_SLOT) * _TABLE_SLOT


class RaggedBatchRunner:
    """The batch state of one :class:`Session`: a host module instance per batch instance,
    the ragged pipelines (compiled on first use), the packed storages and the table buffer,
    all kept between batches and grown when a batch needs more."""

    def __init__(self, session: Any) -> None:  # the webgpu.Session it serves (which imports this module)
        self.session = session
        self.manifest = session.manifest
        self._host_bytes = read_bundle_file(session.bundle_dir, "host.wasm", MAX_HOST_MODULE_BYTES, "the host module")
        self._hosts: list[HostModule] = []
        self._pipelines: dict[int, wgpu.GPUComputePipeline] = {}
        self._storages: list[wgpu.GPUBuffer | None] = [None] * len(self.manifest["storages"])
        self._table_buffer: wgpu.GPUBuffer | None = None
        self._staging: wgpu.GPUBuffer | None = None
        # output elements per (call site, params block): see _elements
        self._element_counts: dict[tuple[int, bytes], int | None] = {}

    # The host modules -------------------------------------------------------------------

    def _host(self, index: int) -> HostModule:
        while len(self._hosts) <= index:
            self._hosts.append(HostModule(self._host_bytes, self.manifest, like=self.session.host))
        host = self._hosts[index]
        host.write_var_bounds(self.session.host.var_bounds())
        return host

    def _commands(self, host: HostModule, instance: int) -> list[Command]:
        try:
            commands = host.commands()
        except RelaxwebError as error:
            raise instance_error(instance, error) from None
        return commands

    # One batch ---------------------------------------------------------------------------

    def run(self, instances: Sequence[Mapping[str, np.ndarray]], report: BatchReport) -> list[dict[str, np.ndarray]]:
        session, manifest = self.session, self.manifest
        hosts, arrays = [], []
        for index, inputs in enumerate(instances):  # 1. every instance checked and sized, no GPU work
            try:
                checked, _ = checked_inputs(manifest, inputs, None)
                host = self._host(index)
                host.run_with_shapes([array.shape for array in checked])
            except RelaxwebError as error:
                raise instance_error(index, error) from None
            hosts.append(host)
            arrays.append(checked)
        report.var_values = [host.var_values() for host in hosts]
        sizes = [host.storage_sizes() for host in hosts]
        layout = SliceLayout.of(sizes)
        largest, limit_name = session.storage_size_limit()
        check_totals(manifest, layout, sizes, report.var_values, largest, limit_name)
        commands = {index: self._commands(host, index) for index, host in enumerate(hosts)}
        plan = self._plan_round(commands)  # the first round's grids are checked before the GPU works

        self._allocate(layout)  # 2. storages, inputs
        for index, checked in enumerate(arrays):
            self._upload(index, checked, layout)

        live = dict(commands)  # 3. rounds
        carried: list[tuple[int, wgpu.GPUBuffer, wgpu.GPUBuffer, SliceLayout]] = []
        while live:
            report.rounds += 1
            encoder = session.device.create_command_encoder()
            self._carry_over(encoder, carried, layout)
            report.dispatches += self._encode_round(encoder, plan, live, hosts, layout, report)
            reads = {index: cmds[-1] for index, cmds in live.items() if cmds and isinstance(cmds[-1], Read)}
            values = self._read_values(encoder, reads, layout)
            for _, old, _, _ in carried:
                old.destroy()
            carried = []
            next_live = {}
            for index, cmds in live.items():
                last = cmds[-1] if cmds else None
                if not isinstance(last, (Read, Resume)):
                    continue
                host = hosts[index]
                try:
                    if isinstance(last, Read):
                        host.write_read_value(last.slot, values[index])
                    host.resume_or_raise()
                except RelaxwebError as error:
                    raise instance_error(index, error) from None
                next_live[index] = self._commands(host, index)
            live = next_live
            if live:
                plan = self._plan_round(live)
                sizes = [host.storage_sizes() for host in hosts]
                grown, changed = layout.grown(sizes)
                if changed:
                    check_totals(manifest, grown, sizes, report.var_values, largest, limit_name)
                carried = self._regrow(changed, layout, grown)
                layout = grown

        return self._read_outputs(hosts, layout)  # 4. outputs

    def _plan_round(self, live: Mapping[int, list[Command]]) -> list[tuple[int, list[tuple[int, Dispatch]]]]:
        """The round's batched dispatches (each chunk's grid checked)."""
        lists = {index: [c for c in cmds if isinstance(c, Dispatch)] for index, cmds in live.items()}
        merged = []
        for call_site, members in merge_dispatches(lists):
            for chunk in chunks(members):
                total = sum(math.prod(dispatch.grid) for _, dispatch in chunk)
                grid_of(total, f"call site {call_site} ({self.manifest['call_sites'][call_site]['binding'][:80]})")
                merged.append((call_site, list(chunk)))
        return merged

    # GPU work ----------------------------------------------------------------------------

    def _allocate(self, layout: SliceLayout) -> None:
        for storage, total in enumerate(layout.totals):
            buffer = self._storages[storage]
            if buffer is None or buffer.size < total:
                if buffer is not None:
                    buffer.destroy()
                self._storages[storage] = self._create_storage(storage, total)

    def _create_storage(self, storage: int, total: int) -> wgpu.GPUBuffer:
        return self.session.device.create_buffer(label=f"batch storage {storage}", size=total, usage=_STORAGE_USAGE)

    def _upload(self, index: int, checked: list[np.ndarray], layout: SliceLayout) -> None:
        queue = self.session.device.queue
        for entry, array in zip(self.manifest["inputs"], checked):
            if array.nbytes == 0:
                continue
            data = memoryview(np.ascontiguousarray(array)).cast("B").tobytes()
            data += b"\0" * (-len(data) % 4)
            storage = entry["storage"]
            queue.write_buffer(self._storages[storage], layout.offsets[storage][index], data)
            self.session.stats.add("input_bytes_written", len(data))

    def _regrow(self, changed: list[int], old_layout: SliceLayout, layout: SliceLayout):
        """New buffers for the storages whose slices grew; (storage, old, new, old layout) for
        the next round's encoder to copy each instance's slice over."""
        carried = []
        for storage in changed:
            old = self._storages[storage]
            new = self._create_storage(storage, layout.totals[storage])
            self._storages[storage] = new
            carried.append((storage, old, new, old_layout))
        return carried

    def _carry_over(self, encoder, carried, layout: SliceLayout) -> None:
        for storage, old, new, old_layout in carried:
            for index, offset in enumerate(old_layout.offsets[storage]):
                encoder.copy_buffer_to_buffer(old, offset, new, layout.offsets[storage][index],
                                              old_layout.capacities[storage][index])

    def _pipeline(self, kernel_index: int) -> wgpu.GPUComputePipeline:
        pipeline = self._pipelines.get(kernel_index)
        if pipeline is None:
            kernel = self.manifest["kernels"][kernel_index]
            file = kernel.get("batch_cpu_file") if self.session.kernels == "cpu" else None
            file = file or kernel["batch_file"]
            source = kernel_source(self.session.bundle_dir, file)
            device = self.session.device
            try:
                module = device.create_shader_module(label=file, code=source)
                pipeline = device.create_compute_pipeline(
                    label=file,
                    layout=device.create_pipeline_layout(bind_group_layouts=[self.session.bind_group_layout(kernel_index)]),
                    compute={"module": module, "entry_point": kernel["entry_point"]},
                )
            except wgpu.GPUError as error:
                raise RelaxwebError(f"kernel {file} does not compile on this device: {str(error).splitlines()[0]}") from None
            self._pipelines[kernel_index] = pipeline
        return pipeline

    def _encode_round(self, encoder, merged, live, hosts, layout: SliceLayout, report: BatchReport) -> int:
        """The round's ragged dispatches (``merged``: :meth:`_plan_round`'s), in one compute
        pass; returns how many."""
        if not merged:
            return 0
        params = {index: hosts[index].params() for index in live}
        tables, slots = bytearray(), []
        for call_site_index, members in merged:
            call_site = self.manifest["call_sites"][call_site_index]
            entries, first = [], 0
            for index, dispatch in members:
                report.add_elements(self._elements(call_site_index, params[index]))
                bases = [layout.offsets[ref["storage"]][index] if "storage" in ref else 0 for ref in call_site["buffers"]]
                entries.append((params[index], bases, first))
                first += math.prod(dispatch.grid)
            table = batch_table(call_site, entries)
            slots.append((len(tables), len(table), grid_of(first, call_site["binding"][:80])))
            tables += table + b"\0" * (_slot(len(table)) - len(table))
        self._write_tables(bytes(tables))
        compute_pass = encoder.begin_compute_pass()
        for (call_site_index, _), (offset, size, grid) in zip(merged, slots):
            call_site = self.manifest["call_sites"][call_site_index]
            kernel_index = call_site["kernel"]
            entries = [{"binding": 0, "resource": {"buffer": self._table_buffer, "offset": offset, "size": size}}]
            for position, ref in enumerate(call_site["buffers"]):
                buffer = self._storages[ref["storage"]] if "storage" in ref else self.session.referenced_buffer(ref)
                entries.append({"binding": position + 1, "resource": {"buffer": buffer, "offset": 0, "size": buffer.size}})
            bind_group = self.session.device.create_bind_group(
                layout=self.session.bind_group_layout(kernel_index), entries=entries)
            compute_pass.set_pipeline(self._pipeline(kernel_index))
            compute_pass.set_bind_group(0, bind_group)
            compute_pass.dispatch_workgroups(*grid)
        compute_pass.end()
        return len(merged)

    def _elements(self, call_site_index: int, params: bytes) -> int | None:
        """:func:`call_elements`, remembered by call site and params block: a batch evaluates
        it for every instance of every dispatch, and the same sizes come back batch after batch."""
        call_site = self.manifest["call_sites"][call_site_index]
        start = call_site["params_offset"]
        key = (call_site_index, params[start:start + call_site["params_size"]])
        if key not in self._element_counts:
            self._element_counts[key] = call_elements(self.manifest, call_site_index, params)
        return self._element_counts[key]

    def _write_tables(self, data: bytes) -> None:
        if self._table_buffer is None or self._table_buffer.size < len(data):
            if self._table_buffer is not None:
                self._table_buffer.destroy()
            self._table_buffer = self.session.device.create_buffer(
                label="batch tables", size=max(len(data), 2 * (self._table_buffer.size if self._table_buffer else 0)),
                usage=_TABLE_USAGE)
        self.session.device.queue.write_buffer(self._table_buffer, 0, data)
        self.session.stats.add("params_bytes_written", len(data))

    def _read_values(self, encoder, reads: Mapping[int, Read], layout: SliceLayout) -> dict[int, int]:
        """Submit the round; with reads, copy each instance's value into the staging buffer
        first and return them by instance."""
        device = self.session.device
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
        device.queue.submit([encoder.finish()])
        self._staging.map_sync(wgpu.MapMode.READ)
        try:
            data = self._staging.read_mapped(0, need)
            values = struct.unpack(f"<{len(order)}i", data)
        finally:
            self._staging.unmap()
        self.session.stats.add("bytes_read", need)
        return dict(zip(order, values))

    def _read_outputs(self, hosts: list[HostModule], layout: SliceLayout) -> list[dict[str, np.ndarray]]:
        """Every instance's outputs, copied out of their slices into one readback buffer."""
        device, outputs = self.session.device, self.manifest["outputs"]
        shapes = [host.output_shapes() for host in hosts]
        byte_sizes = [device_byte_sizes(self.manifest, instance_shapes) for instance_shapes in shapes]
        places, total = [], 0
        for instance_sizes in byte_sizes:
            row = []
            for size in instance_sizes:
                row.append(total)
                total += aligned(size)
            places.append(row)
        results: list[dict[str, np.ndarray]] = [{} for _ in hosts]
        readback = device.create_buffer(label="batch outputs", size=max(total, 4), usage=_READBACK_USAGE)
        try:
            encoder = device.create_command_encoder()
            for index in range(len(hosts)):
                for k, output in enumerate(outputs):
                    size = -(-byte_sizes[index][k] // 4) * 4
                    if size:
                        storage = output["storage"]
                        encoder.copy_buffer_to_buffer(self._storages[storage], layout.offsets[storage][index],
                                                      readback, places[index][k], size)
            device.queue.submit([encoder.finish()])
            readback.map_sync(wgpu.MapMode.READ)
            try:
                data = readback.read_mapped(0, max(total, 4))
                self.session.stats.add("bytes_read", total)
                for index in range(len(hosts)):
                    for k, output in enumerate(outputs):
                        start, size = places[index][k], byte_sizes[index][k]
                        results[index][output["name"]] = output_array(
                            self.manifest, output, bytearray(data[start:start + size]), shapes[index][k], size)
            finally:
                readback.unmap()
        finally:
            readback.destroy()
        return results
