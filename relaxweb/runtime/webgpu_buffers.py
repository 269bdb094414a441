"""The GPU buffers of a WebGPU session: weights, the params block, storages, bind groups and
readback buffers, every creation and upload counted in the session's ``stats``.

Sizes follow docs/bundle-format.md ("One run"): a buffer holds at least 16 bytes (a kernel may
bind it as ``array<vec4<f32>>``), a multiple of 4; a storage that must grow gets at least twice
its old size (capped by the device's binding limit), so inputs that keep growing do not
reallocate on every run; a weight in parts is split where the device's binding limit says.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from typing import Any

import wgpu

from relaxweb.errors import RelaxwebError
from relaxweb.runtime.batch import storage_name
from relaxweb.runtime.gpu_tensor import TransferStats
from relaxweb.runtime.run_status import STATUS_BYTES
from relaxweb.runtime.tensors import webgpu_weight_bytes
from relaxweb.runtime.webgpu_device import parts_at_limit, storage_size_limit

STORAGE_USAGE = wgpu.BufferUsage.STORAGE | wgpu.BufferUsage.COPY_DST | wgpu.BufferUsage.COPY_SRC
WEIGHT_USAGE = wgpu.BufferUsage.STORAGE | wgpu.BufferUsage.COPY_DST
PARAMS_USAGE = wgpu.BufferUsage.UNIFORM | wgpu.BufferUsage.COPY_DST
READBACK_USAGE = wgpu.BufferUsage.MAP_READ | wgpu.BufferUsage.COPY_DST
QUERY_RESOLVE_USAGE = wgpu.BufferUsage.QUERY_RESOLVE | wgpu.BufferUsage.COPY_SRC

#: (old buffer, new buffer) of a storage grown between two steps: the next step copies one into the other
CarriedOver = list[tuple[wgpu.GPUBuffer, wgpu.GPUBuffer]]


def gpu_buffer_size(byte_size: int) -> int:
    """The doc's GPU buffer size for ``byte_size`` bytes: at least 16 (a kernel may bind it
    as ``array<vec4<f32>>``, whose smallest binding is 16 bytes, even when it is empty), a
    multiple of 4."""
    return max(16, (byte_size + 3) // 4 * 4)


def padded_to_multiple_of_4(data: bytes | memoryview) -> bytes | memoryview:
    """``write_buffer`` needs a size that is a multiple of 4; pad with zeros if needed."""
    remainder = len(data) % 4
    return data if remainder == 0 else bytes(data) + bytes(4 - remainder)


class SessionBuffers:
    """The buffers of one session on ``device``; ``limit_caps``: lower buffer size limits that
    weights in parts are split at (``Session(limits=...)``)."""

    def __init__(self, device: wgpu.GPUDevice, manifest: Mapping[str, Any], stats: TransferStats,
                 limit_caps: Mapping[str, int]) -> None:
        self.device = device
        self.manifest = manifest
        self.stats = stats
        self.limit_caps = limit_caps
        self.weights: list[wgpu.GPUBuffer] = []  # per weight (a weight in parts: its first part)
        self.weight_parts: dict[int, list[wgpu.GPUBuffer]] = {}  # the buffers of weights in parts, by weight
        #: the byte sizes a weight in parts was loaded as, by name: one when the device binds it whole
        self.weight_part_sizes: dict[str, list[int]] = {}
        self.params: wgpu.GPUBuffer | None = None
        self.storages: list[wgpu.GPUBuffer | None] = [None] * len(manifest["storages"])
        # one bind group per call site, built on first use and dropped when a storage it binds is reallocated
        self.bind_groups: list[wgpu.GPUBindGroup | None] = [None] * len(manifest["call_sites"])
        self.readbacks: list[wgpu.GPUBuffer | None] = [None] * len(manifest["outputs"])
        self._read_staging: wgpu.GPUBuffer | None = None  # where a value read back mid-run lands
        # the run status and the buffer it is read back into (run_status.py): a bundle whose
        # kernels check the run's data has them (made at load)
        self.status: wgpu.GPUBuffer | None = None
        self.status_readback: wgpu.GPUBuffer | None = None

    # Counted GPU calls (stats) -------------------------------------------------------------

    def create(self, **descriptor: Any) -> wgpu.GPUBuffer:
        """``device.create_buffer``, counted in the stats."""
        buffer = self.device.create_buffer(**descriptor)
        self.stats.add("buffers_created")
        self.stats.track_buffer(buffer)
        return buffer

    def write(self, buffer: wgpu.GPUBuffer, data: bytes | memoryview, counter: str, offset: int = 0) -> None:
        """``queue.write_buffer`` at ``offset``, its bytes counted in the stats under ``counter``."""
        self.device.queue.write_buffer(buffer, offset, data)
        self.stats.add(counter, memoryview(data).nbytes)

    # Loading -------------------------------------------------------------------------------

    def load(self, shards: list[bytes], sizes_at_bounds: list[int] | None) -> None:
        """Weights from their shards, the params block, the storages at the bounds (when every
        var has one) and the KV caches' storages (always: they are sized at the bounds)."""
        self.weights = self._create_weight_buffers(shards)
        self.params = self.create(label="params", size=self.manifest["params_bytes"], usage=PARAMS_USAGE)
        if self.manifest.get("run_errors"):
            self.status = self.create(label="run status", size=STATUS_BYTES, usage=STORAGE_USAGE)
            self.status_readback = self.create(label="run status readback", size=STATUS_BYTES, usage=READBACK_USAGE)
        if sizes_at_bounds is not None:
            largest, limit_name = storage_size_limit(self.device)
            for index, size in enumerate(sizes_at_bounds):
                if size > largest:
                    raise RelaxwebError(
                        f"the bundle needs the WebGPU limit {limit_name} = {size} (storage {index} at "
                        f"the bounds), but the device offers {largest}"
                    )
            self.storages = [self.create_storage(index, size) for index, size in enumerate(sizes_at_bounds)]
        for cache in self.manifest.get("caches", []):
            if self.storages[cache["storage"]] is None:
                self.storages[cache["storage"]] = self.create_storage(
                    cache["storage"], self.manifest["storages"][cache["storage"]]["size_at_bounds"])

    def _create_weight_buffers(self, shards: list[bytes]) -> list[wgpu.GPUBuffer]:
        """One read-only GPU buffer per weight, filled from its shard (a weight in parts:
        its first part's, the others in ``weight_parts``)."""
        buffers = []
        for index, weight in enumerate(self.manifest["weights"]):
            # the shard holds the wasm form: an int64 weight is narrowed to int32 here
            data = webgpu_weight_bytes(weight, shards[weight["shard"]][weight["offset"]:weight["offset"] + weight["nbytes"]],
                                       self.manifest["dtypes"][weight["dtype"]])
            if weight.get("parts", 1) > 1:
                self.weight_parts[index] = self._create_weight_parts(weight, memoryview(data))
                buffers.append(self.weight_parts[index][0])
                continue
            buffer = self.create(label=f"weight {weight['name']}", size=gpu_buffer_size(len(data)),
                                 usage=WEIGHT_USAGE)
            if data:
                self.write(buffer, padded_to_multiple_of_4(data), "weight_bytes_written")
            buffers.append(buffer)
        return buffers

    def _create_weight_parts(self, weight: Mapping[str, Any], data: memoryview) -> list[wgpu.GPUBuffer]:
        """The buffers bound for each part of a weight in parts (``data``: its bytes as the GPU
        holds it): the whole weight in one when the device binds it (the other parts a 16-byte
        placeholder), else parts as large as the device binds (docs/bundle-format.md, "Weights
        in parts")."""
        largest, limit_name = storage_size_limit(self.device, self.limit_caps)
        sizes = parts_at_limit(len(data), weight["parts"], largest)
        if sizes is None:
            raise RelaxwebError(
                f"weight '{weight['name']}' has {len(data)} bytes, above the device's WebGPU limit "
                f"{limit_name} = {largest}, and the bundle binds it in at most {weight['parts']} parts"
            )
        self.weight_part_sizes[weight["name"]] = sizes
        buffers, start = [], 0
        for part, size in enumerate(sizes):
            buffer = self.create(label=f"weight {weight['name']} part {part}", size=gpu_buffer_size(size),
                                 usage=WEIGHT_USAGE)
            self.write(buffer, padded_to_multiple_of_4(data[start:start + size]), "weight_bytes_written")
            buffers.append(buffer)
            start += size
        if len(buffers) < weight["parts"]:
            placeholder = self.create(label="unused weight part", size=16, usage=WEIGHT_USAGE)
            buffers += [placeholder] * (weight["parts"] - len(buffers))
        return buffers

    # Storages ------------------------------------------------------------------------------

    def create_storage(self, index: int, byte_size: int) -> wgpu.GPUBuffer:
        role = self.manifest["storages"][index]["role"]
        return self.create(label=f"storage {index} ({role})", size=gpu_buffer_size(byte_size), usage=STORAGE_USAGE)

    def grow_storages(self, needed_sizes: Sequence[int], keep_contents: bool) -> CarriedOver:
        """Reallocate every storage buffer smaller than this run needs.

        A grown buffer gets at least twice its old size (capped by the device's binding
        size limit).  The bind groups of call sites that use a reallocated storage are dropped.
        With ``keep_contents`` (growth between two steps of one run) the old buffers are kept
        and returned as ``(old, new)`` pairs: the next step copies each old buffer into its new
        one before anything else.  Without it the old buffers are destroyed now and ``[]`` is
        returned."""
        carried_over: CarriedOver = []
        largest, limit_name = storage_size_limit(self.device)
        for index, needed in enumerate(needed_sizes):
            if needed > largest:
                raise RelaxwebError(
                    f"these inputs are too large for this device: {storage_name(self.manifest, index)} needs "
                    f"{needed} bytes, above the device's WebGPU limit {limit_name} = {largest}")
        for index, needed in enumerate(needed_sizes):
            buffer = self.storages[index]
            needed = gpu_buffer_size(needed)
            if buffer is not None and buffer.size >= needed:
                continue
            doubled = 2 * buffer.size if buffer is not None else 0
            new_buffer = self.create_storage(index, max(needed, (min(doubled, largest) // 4) * 4))
            if buffer is not None:
                if keep_contents:
                    carried_over.append((buffer, new_buffer))
                else:
                    buffer.destroy()
            self.storages[index] = new_buffer
            self._forget_bind_groups_using(index)
        return carried_over

    def _forget_bind_groups_using(self, storage_index: int) -> None:
        for call_site_index, call_site in enumerate(self.manifest["call_sites"]):
            if {"storage": storage_index} in call_site["buffers"]:
                self.bind_groups[call_site_index] = None

    # Binding -------------------------------------------------------------------------------

    def referenced_buffer(self, reference: Mapping[str, Any]) -> wgpu.GPUBuffer:
        """The buffer a call site's ``{"storage": i}``, ``{"weight": j}``,
        ``{"weight_part": [j, k]}`` or ``{"status": 0}`` (the run status) refers to."""
        if "storage" in reference:
            return self.storages[reference["storage"]]
        if "status" in reference:
            if self.status is None:
                raise RelaxwebError("a call site binds the run status, but the manifest has no run_errors: "
                                    "the bundle is damaged")
            return self.status
        if "weight_part" in reference:
            weight, part = reference["weight_part"]
            return self.weight_parts[weight][part]
        return self.weights[reference["weight"]]

    def bind_group(self, call_site_index: int, layout: wgpu.GPUBindGroupLayout) -> wgpu.GPUBindGroup:
        """The call site's bind group, built now if it has none (first use or reallocation)."""
        bind_group = self.bind_groups[call_site_index]
        if bind_group is None:
            call_site = self.manifest["call_sites"][call_site_index]
            entries = [{"binding": 0, "resource": {"buffer": self.params, "offset": call_site["params_offset"],
                                                   "size": call_site["params_size"]}}]
            for position, reference in enumerate(call_site["buffers"]):
                buffer = self.referenced_buffer(reference)
                entries.append({"binding": position + 1, "resource": {"buffer": buffer, "offset": 0, "size": buffer.size}})
            bind_group = self.device.create_bind_group(label=call_site["binding"], layout=layout, entries=entries)
            self.bind_groups[call_site_index] = bind_group
        return bind_group

    # Reading back --------------------------------------------------------------------------

    def grow_readbacks(self, output_byte_sizes: Sequence[int], kept: frozenset[int]) -> None:
        """A readback buffer for each output not kept on the GPU, at least as large as it is now."""
        for index, byte_size in enumerate(output_byte_sizes):
            if index in kept:
                continue
            buffer = self.readbacks[index]
            if buffer is None or buffer.size < gpu_buffer_size(byte_size):
                if buffer is not None:
                    buffer.destroy()
                self.readbacks[index] = self.create(label=f"readback {self.manifest['outputs'][index]['name']}",
                                                    size=gpu_buffer_size(byte_size), usage=READBACK_USAGE)

    def read_staging(self) -> wgpu.GPUBuffer:
        """The buffer a value read back mid-run lands in: 4 bytes, and the run status after
        them where the bundle has one (made on the first read)."""
        if self._read_staging is None:
            size = 4 + (STATUS_BYTES if self.status is not None else 0)
            self._read_staging = self.create(label="read value", size=size, usage=READBACK_USAGE)
        return self._read_staging
