"""The ``kernels.wasm`` backend of the host-program driver (``runtime/driver.py``), through wasmtime.

:class:`WasmBackend` does each state of "One run" in ``docs/bundle-format.md`` as the WebGPU
backend does, with the same host module, command lists and params blocks; what the GPU did is
done in one linear memory laid out as "Running on kernels.wasm" says:

    [0, 64 KiB)   never a buffer (a stray small address reads zeros or traps, never a tensor)
    params        the host's params block, copied in after every ``run()`` / ``resume()``
    scratch       ``wasm.scratch_bytes`` for the one thread this session calls kernels on
    status        the run status (``runtime/run_status.py``), cleared before each run
    weights       each weight whole (16-byte aligned), copied in once at load as its shard
                  holds it (the wasm form: an int64 weight as int64)
    prepacked     per call site of ``wasm.prepacked``: its weight's panels as its kernel's
                  packed tier reads them, written by ``kK_pack`` at load
    storages      KV caches first (sized at the bounds, never moved), then the others: at
                  their sizes at the bounds when every var has one, else placed per run
    slack         at least 64 KiB after the last buffer (a vector load may read past an end)

A storage that must grow in the middle of a run (after a read or a loop's resume) moves to
a new region at the end, its contents copied; before a run, storages that must grow are all
placed again from the first movable address (nothing of theirs is needed across runs), so
the memory stays as large as the largest run needed.  Each dispatch record calls the
kernel's ``kK_units`` on its params block, then ``kK`` over all its units on this thread.
Kept outputs (``run(..., keep_on_gpu=...)``, what ``generate`` runs with) are
:class:`WasmTensor`\\ s: a KV cache's present is a view of the cache's storage (its place in
memory never changes), taken back as the next run's past without a byte moved; any other kept
output is a copy of its device bytes, made once at the end of its run.

Tensors are held in the memory as the manifest's ``dtypes`` table says of kernels.wasm
(``wasm_dtype``, ``wasm_bytes``: an int64 as an 8-byte little-endian int64, exactly, every other
dtype as on the GPU): the backend converts by :func:`~relaxweb.runtime.tensors.wasm_manifest`'s
view of the manifest, so inputs, outputs, kept tensors, cache views and byte counts all follow it.
``runtime_js/wasm_backend.js`` is the twin (it may split the units between worker threads).
"""

from __future__ import annotations

import math
import threading
import time
from collections.abc import Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import wasmtime

from relaxweb.errors import RelaxwebError
from relaxweb.runtime.driver import PreparedRun
from relaxweb.runtime.gpu_tensor import CacheView, GpuTensor, TransferStats, cache_block_copies
from relaxweb.runtime.host import Dispatch, Read
from relaxweb.runtime.host_session import HostStep
from relaxweb.runtime.manifest import read_bundle_file
from relaxweb.runtime.profile import WallClockTimer
from relaxweb.runtime.relaxed_simd import lower_relaxed_simd, use_relaxed_simd
from relaxweb.runtime.run_status import CLEARED, STATUS_BYTES, check_run_status
from relaxweb.runtime.tensors import (
    checked_inputs, device_byte_sizes, device_dtype, dtype_entry, kept_output_indices, load_shards, output_array,
    split_sequences, to_model_dtype, wasm_manifest,
)

RESERVED_BYTES = 65536  # bytes [0, 65536) are never a buffer
#: prepacked regions are laid out while they end below this address (a model whose weights are
#: near the 4 GiB a wasm32 memory holds keeps that room for its storages: its call sites past it
#: get no region, and their kernels pack per call as without one)
PREPACKED_LIMIT_BYTES = 2 << 30
SLACK_BYTES = 65536  # free bytes after the last buffer
PAGE_BYTES = 65536
MAX_PAGES = 65536  # a wasm32 memory holds at most 4 GiB
ALIGNMENT = 16
MAX_KERNELS_WASM_BYTES = 256 * 1024 * 1024
#: How long one kernel call (``kK_units`` and ``kK``) may run before it is stopped and the run
#: fails (an epoch deadline, checked at every loop back-edge): the browser host module's limit
#: (``HOST_CALL_TIMEOUT_MS``).  A kernel call of the models relaxweb runs on the CPU takes
#: milliseconds to a second; a kernels.wasm that loops fails within it.  ``WasmSession``'s
#: ``kernel_timeout_s`` overrides it (docs/design.md, "Deadlines").
KERNEL_SECONDS_PER_CALL = 10.0
_EPOCH_SECONDS = 0.1  # the ticker's period: deadlines are counted in these


class _EpochClock:
    """The engine every WasmSession compiles on, and a daemon thread advancing its epoch
    every ``_EPOCH_SECONDS`` (a kernel call's deadline is a number of these ticks).

    Made on the first session, not at import: wasmtime installs its signal handlers (an out
    of bounds access is a SIGSEGV it turns into a trap) when its first engine is made, and a
    handler installed after them (``faulthandler.enable()``, as pytest does at start) would
    take those signals first and end the process."""

    def __init__(self) -> None:
        self._engine: wasmtime.Engine | None = None
        self._lock = threading.Lock()

    def engine(self) -> wasmtime.Engine:
        with self._lock:
            if self._engine is None:
                config = wasmtime.Config()
                config.epoch_interruption = True
                self._engine = wasmtime.Engine(config)
                threading.Thread(target=self._tick, args=(self._engine,), name="relaxweb-wasm-epoch", daemon=True).start()
            return self._engine

    @staticmethod
    def _tick(engine: wasmtime.Engine) -> None:
        while True:
            time.sleep(_EPOCH_SECONDS)
            engine.increment_epoch()


_clock = _EpochClock()


def _aligned(value: int) -> int:
    return (value + ALIGNMENT - 1) // ALIGNMENT * ALIGNMENT


def _region_bytes(byte_size: int) -> int:
    """The bytes a buffer of ``byte_size`` takes: at least 16, a multiple of 16."""
    return _aligned(max(16, byte_size))


def wasm_entry(manifest: Mapping[str, Any], bundle_dir: Path) -> Mapping[str, Any]:
    """The manifest's ``wasm`` entry, or a RelaxwebError saying why the bundle has none."""
    entry = manifest.get("wasm")
    if entry is None:
        raise RelaxwebError(f"the bundle {bundle_dir} has no kernels.wasm (its manifest has no 'wasm' entry: it was "
                            "built by a relaxweb without the WebAssembly backend); rebuild it, or run it on WebGPU")
    if isinstance(entry, Mapping) and "unavailable" in entry:
        raise RelaxwebError(f"the bundle {bundle_dir} has no kernels.wasm: {entry['unavailable']}")
    if not (isinstance(entry, Mapping) and isinstance(entry.get("file"), str)
            and isinstance(entry.get("relaxed_madd_sites", 1), int) and entry.get("relaxed_madd_sites", 1) > 0
            and isinstance(entry.get("scratch_bytes"), int) and 0 <= entry["scratch_bytes"] <= 1 << 30):
        raise RelaxwebError(f"the bundle {bundle_dir} has a malformed 'wasm' entry in its manifest: the bundle is damaged")
    return entry


class WasmTensor(GpuTensor):
    """An output a wasm session's ``run(..., keep_on_gpu=...)`` kept: a GpuTensor's interface
    (``name``, ``dtype``, ``shape``, ``numpy()``, ``dispose()``, given back to ``run`` as an
    input) over the session's memory instead of a GPU.  A KV cache's present is a view of the
    cache's storage (``cache_view`` set: valid until the next run ends, as on WebGPU); any other
    kept output holds a copy of its device bytes, made at the end of its run."""

    def __init__(self, backend: "WasmBackend", name: str, dtype: np.dtype, shape: tuple[int, ...], nbytes: int,
                 data: np.ndarray | None, cache_view: CacheView | None = None) -> None:
        super().__init__(backend.owner, name, dtype, shape, data if cache_view is None else cache_view.cache["storage"],
                         nbytes, cache_view)
        self._backend = backend

    @property
    def backend(self) -> "WasmBackend":
        return self._backend

    def device_data(self) -> np.ndarray:
        """Its values as the memory holds them (the dtype's ``wasm_dtype``), flat; a view's
        are read from the cache's rows now (refused once a later run has written the cache)."""
        self.buffer()  # refuses a disposed tensor
        if self.cache_view is None:
            return self._buffer
        with self._backend.owner.run_lock:  # the memory is the session's: not while another thread runs
            return self._backend.read_view(self)

    def numpy(self) -> np.ndarray:
        return to_model_dtype(self.device_data(), self.dtype).reshape(self.shape)

    def dispose(self) -> None:
        """Drop it (its copy, or its claim on the cache's rows); using it afterwards is an error."""
        self._buffer = None


#: Why ``run_batch`` on this backend runs the instances one after another.
ONE_BY_ONE_REASON = "the wasm backend runs a batch instance by instance"


class WasmBackend:
    """A bundle's ``kernels.wasm`` instantiated on one linear memory, with the weights in it
    and the storages placed: the run state of one ``WasmSession``, on one thread."""

    def __init__(self, bundle_dir: Path, manifest: Mapping[str, Any], entry: Mapping[str, Any],
                 sizes_at_bounds: list[int] | None, owner: Any = None, kernel_timeout_s: float | None = None,
                 relaxed_simd: bool | None = None) -> None:
        #: the manifest with its dtypes as kernels.wasm holds them (``wasm_manifest``): what the driver and every
        #: conversion here read
        self.manifest = wasm_manifest(manifest)
        #: how long one kernel call may run (seconds)
        self.kernel_timeout_s = _checked_timeout(KERNEL_SECONDS_PER_CALL if kernel_timeout_s is None else kernel_timeout_s)
        self.owner = owner  # the WasmSession its WasmTensors belong to
        #: what moved in and out of the memory (``buffers_created``: regions laid out for storages)
        self.stats = TransferStats()
        # runs that started writing the memory: a view of a cache is current while it is this run's
        self.run_number = 0
        shards = load_shards(bundle_dir, manifest)
        self._store = wasmtime.Store(_clock.engine())
        #: whether the kernels run with relaxed SIMD (else lowered to plain SIMD128 at load: ``relaxed_simd.py``)
        self.relaxed_simd = use_relaxed_simd(entry, relaxed_simd, self._store.engine)
        wasm = read_bundle_file(bundle_dir, entry["file"], MAX_KERNELS_WASM_BYTES, "the kernel module")
        if "relaxed_madd_sites" in entry and not self.relaxed_simd:
            wasm = lower_relaxed_simd(wasm, entry["relaxed_madd_sites"])
        self._memory = wasmtime.Memory(self._store, wasmtime.MemoryType(wasmtime.Limits(1, MAX_PAGES)))
        self._units, self._kernels, self._packs = self._instantiate(wasm)

        # the fixed regions: params, scratch, the run status, weights
        self._params_base = RESERVED_BYTES
        self._scratch = _aligned(self._params_base + manifest["params_bytes"])
        self._status = _aligned(self._scratch + entry["scratch_bytes"])
        end = _aligned(self._status + STATUS_BYTES)
        self._weight_addresses = []
        for weight in manifest["weights"]:  # nbytes: elements * wasm_bytes (an int64 weight 8 bytes an element)
            self._weight_addresses.append(end)
            end += _region_bytes(weight["nbytes"])
        # per call site whose kernel reads its weight prepacked: the region of its panels (written below)
        self._prepacked_regions: dict[int, tuple[int, int]] = {}
        for region in entry.get("prepacked", []):
            if end + _region_bytes(region["bytes"]) <= PREPACKED_LIMIT_BYTES:
                self._prepacked_regions[region["call_site"]] = (end, region["bytes"])
                end += _region_bytes(region["bytes"])
        storage_count = len(manifest["storages"])
        self._storage_addresses: list[int] = [0] * storage_count
        self._storage_capacities: list[int] = [0] * storage_count  # 0: not placed yet
        # KV caches (manifest "caches"), placed once at their size at the bounds
        self._cache_of_input = {cache["input"]: cache for cache in manifest.get("caches", [])}
        self._cache_of_output = {cache["output"]: cache for cache in manifest.get("caches", [])}
        self._fixed = {cache["storage"] for cache in self._cache_of_input.values()}
        for index in sorted(self._fixed):
            size = manifest["storages"][index]["size_at_bounds"]
            if size is None:
                raise RelaxwebError(f"the bundle's KV cache storage {index} has no size at the bounds: the bundle is damaged")
            self._storage_addresses[index] = end
            self._storage_capacities[index] = _region_bytes(size)
            end += self._storage_capacities[index]
            self.stats.add("buffers_created")
        self._movable_start = end
        self._end = end
        self._ensure_memory(end)
        for weight, address in zip(manifest["weights"], self._weight_addresses):
            # the shards hold each weight as kernels.wasm does (an int64 weight as int64)
            data = shards[weight["shard"]][weight["offset"]:weight["offset"] + weight["nbytes"]]
            self._memory.write(self._store, data, address)
            self.stats.add("weight_bytes_written", len(data))
        self._prepack(entry.get("prepacked", []))
        if sizes_at_bounds is not None:  # every var has a bound: every storage placed once, now
            self._place_storages(sizes_at_bounds)

    def _prepack(self, regions: Sequence[Mapping[str, Any]]) -> None:
        """Each laid-out region's header (its second word: the region's bytes), then its
        panels written by its kernel's ``kK_pack`` on the region's params block (put in the
        call site's own params slot, zeroed again after), the weights at their addresses and 0
        for every other buffer; a pack that declines (0) leaves the kernel packing per call."""
        for region in regions:
            site = region["call_site"]
            if site not in self._prepacked_regions:
                continue
            address, size = self._prepacked_regions[site]
            # the header (docs/bundle-format.md, "Prepacked weights"): i32 0 set by kK_pack, i32 1 the region's bytes
            self._memory.write(self._store, size.to_bytes(4, "little"), address + 4)
            call_site = self.manifest["call_sites"][site]
            pack = self._packs[call_site["kernel"]]
            if pack is None:
                raise RelaxwebError(f"the bundle's wasm.prepacked names call site {site}, whose kernel has no "
                                    "kK_pack: the bundle is damaged")
            params_address = self._params_base + call_site["params_offset"]
            self._memory.write(self._store, np.array(region["params"], np.int32).tobytes(), params_address)
            addresses = [self._buffer_address(reference) if "weight" in reference or "weight_part" in reference else 0
                         for reference in call_site["buffers"]]
            self._store.set_epoch_deadline(math.ceil(self.kernel_timeout_s / _EPOCH_SECONDS) + 1)
            try:
                pack(self._store, params_address, 0, 0, self._scratch, *addresses, address)
            except (wasmtime.Trap, wasmtime.WasmtimeError) as error:
                raise RelaxwebError(f"packing a weight at load: {self._trap_message(site, error)}") from None
            self._memory.write(self._store, bytes(4 * len(region["params"])), params_address)

    @property
    def memory_bytes(self) -> int:
        return self._memory.data_len(self._store)

    # Loading -----------------------------------------------------------------------------

    def _instantiate(self, wasm: bytes) -> tuple[list[wasmtime.Func], list[wasmtime.Func], list[wasmtime.Func | None]]:
        """kernels.wasm instantiated on this session's memory; its ``kK_units``, ``kK`` and
        ``kK_pack`` (None where the kernel reads no factor prepacked) functions by kernel index."""
        try:
            module = wasmtime.Module(self._store.engine, wasm)
        except wasmtime.WasmtimeError as error:
            raise RelaxwebError(f"the bundle's kernels.wasm cannot be loaded: {_first_line(error)}") from None
        imports = [(item.module, item.name, type(item.type).__name__) for item in module.imports]
        if imports != [("env", "memory", "MemoryType")]:
            raise RelaxwebError(f"the bundle's kernels.wasm must import exactly one thing, the memory env.memory: "
                                "the bundle is damaged")
        try:
            instance = wasmtime.Instance(self._store, module, [self._memory])
        except (wasmtime.WasmtimeError, wasmtime.Trap) as error:
            raise RelaxwebError(f"the bundle's kernels.wasm cannot be instantiated: {_first_line(error)}") from None
        exports = instance.exports(self._store)
        units, kernels, missing = [], [], []
        for index in range(len(self.manifest["kernels"])):
            for name, found in ((f"k{index}_units", units), (f"k{index}", kernels)):
                function = exports.get(name)
                if not isinstance(function, wasmtime.Func):
                    missing.append(name)
                found.append(function)
        if missing:
            shown = ", ".join(missing[:6]) + (f" and {len(missing) - 6} more" if len(missing) > 6 else "")
            raise RelaxwebError(f"the bundle's kernels.wasm does not export {shown}: the bundle is damaged")
        packs = [exports.get(f"k{index}_pack") for index in range(len(kernels))]
        return units, kernels, [function if isinstance(function, wasmtime.Func) else None for function in packs]

    # Memory ------------------------------------------------------------------------------

    def _ensure_memory(self, end: int) -> None:
        """Grow the memory to hold ``end`` bytes and the slack after them."""
        needed_pages = -(-(end + SLACK_BYTES) // PAGE_BYTES)
        if needed_pages > MAX_PAGES:
            raise RelaxwebError(f"these inputs are too large for the wasm backend: they need {end + SLACK_BYTES} bytes "
                                f"of memory, above the {MAX_PAGES * PAGE_BYTES} bytes (4 GiB) a wasm32 memory holds")
        pages = self._memory.size(self._store)
        if needed_pages > pages:
            self._memory.grow(self._store, needed_pages - pages)

    def _place_storages(self, needed_sizes: list[int]) -> None:
        """Every storage but the caches placed again from the first movable address, each at
        least as large as before and as ``needed_sizes`` says (contents not kept)."""
        end = self._movable_start
        for index, needed in enumerate(needed_sizes):
            if index in self._fixed:
                continue
            capacity = max(self._storage_capacities[index], _region_bytes(needed))
            if (self._storage_addresses[index], self._storage_capacities[index]) != (end, capacity):
                self.stats.add("buffers_created")
            self._storage_addresses[index], self._storage_capacities[index] = end, capacity
            end += capacity
        self._ensure_memory(end)
        self._end = end

    def prepare_storages(self, needed_sizes: Sequence[int], keep_contents: bool) -> None:
        """Give every storage smaller than ``needed_sizes`` says a region that fits (twice its
        old size at least): between runs by placing all again, in a run by moving each to
        the end of memory with its contents."""
        growing = [index for index, needed in enumerate(needed_sizes) if self._storage_capacities[index] < needed]
        fixed = [index for index in growing if index in self._fixed]
        if fixed:
            raise RelaxwebError(f"the bundle's host module sized KV cache storage {fixed[0]} above its size at the "
                                "bounds: the bundle is damaged")
        if not growing:
            return
        if not keep_contents:
            for index in growing:
                self._storage_capacities[index] = max(_region_bytes(needed_sizes[index]),
                                                      2 * self._storage_capacities[index])
            self._place_storages(needed_sizes)
            return
        for index in growing:
            old_address, old_capacity = self._storage_addresses[index], self._storage_capacities[index]
            capacity = max(_region_bytes(needed_sizes[index]), 2 * old_capacity)
            self._ensure_memory(self._end + capacity)
            if old_capacity:
                self._memory.write(self._store, self._memory.read(self._store, old_address, old_address + old_capacity),
                                   self._end)
            self._storage_addresses[index], self._storage_capacities[index] = self._end, capacity
            self._end += capacity
            self.stats.add("buffers_created")

    def _read(self, address: int, byte_size: int) -> bytearray:
        return self._memory.read(self._store, address, address + byte_size)

    # The states of a run (driver.RunBackend) ------------------------------------------------

    def prepare_run(self, inputs: Mapping[str, Any], keep_on_gpu: Any) -> PreparedRun:
        kept = kept_output_indices(self.manifest, keep_on_gpu)
        self.stats.start_run()
        arrays, sequences = checked_inputs(self.manifest, inputs, self._check_tensor)
        shapes = [() if index in sequences else array.shape for index, array in enumerate(arrays)]
        return PreparedRun(shapes, sequences, arrays, kept)

    def one_by_one_reason(self, instances: Sequence[Mapping[str, Any]]) -> str:
        return ONE_BY_ONE_REASON  # kernels.wasm has no ragged form

    def ragged_batch(self) -> Any:
        raise RelaxwebError(ONE_BY_ONE_REASON)

    def check_commands(self, commands: Sequence[Any]) -> None:
        """Nothing to refuse: a dispatch runs its units, however many."""

    def write_inputs(self, run: PreparedRun) -> None:
        # kept tensors resolved before anything is written: a view read now, while its cache holds it
        arrays = [self._tensor_input(index, value) if isinstance(value, GpuTensor) else value
                  for index, value in enumerate(run.arrays)]
        self.run_number += 1  # every cache is written from here on: older views are stale
        self._write_inputs(arrays)
        self._memory.write(self._store, CLEARED, self._status)

    def begin_step(self, params: bytes) -> None:
        self._memory.write(self._store, params, self._params_base)
        self.stats.add("params_bytes_written", len(params))

    def encode_dispatches(self, dispatches: Sequence[Dispatch], params: bytes, timer: WallClockTimer | None) -> None:
        for command in dispatches:
            self._dispatch(command, params, timer)

    def read_value(self, read: Read) -> int:
        """The i32 a read record names (sign-extended by Python's int)."""
        if read.byte_offset + 4 > self._storage_capacities[read.storage]:
            raise RelaxwebError(f"the bundle's command list reads bytes {read.byte_offset}..{read.byte_offset + 4} "
                                f"of storage {read.storage}, which has {self._storage_capacities[read.storage]} bytes")
        self.stats.add("bytes_read", 4)
        self._check_status()  # an error before the read may have made its value meaningless
        return int.from_bytes(self._read(self._storage_addresses[read.storage] + read.byte_offset, 4), "little",
                              signed=True)

    def submit(self) -> None:
        """Nothing to submit: every dispatch has run."""

    def submit_outputs(self, run: PreparedRun, step: HostStep) -> tuple[PreparedRun, HostStep]:
        return run, step  # every dispatch has run: the outputs are in memory

    def read_outputs(self, readback: tuple[PreparedRun, HostStep]) -> dict[str, Any]:
        """Each output as an array, or kept (:class:`WasmTensor`: a view of a cache, else a copy)."""
        run, step = readback
        self._check_status()
        byte_sizes = device_byte_sizes(self.manifest, step.output_shapes)
        outputs = {}
        for index, (output, shape, size) in enumerate(zip(self.manifest["outputs"], step.output_shapes, byte_sizes)):
            dtype = np.dtype(output["dtype"])
            if index in run.kept and index in self._cache_of_output:  # a view: no copy
                outputs[output["name"]] = WasmTensor(self, output["name"], dtype, tuple(shape), size, None,
                                                     CacheView(self._cache_of_output[index], self.run_number))
                continue
            data = self._output_bytes(index, shape, size)
            self.stats.add("bytes_read", size)
            if index in run.kept:
                stored = device_dtype(dtype_entry(self.manifest, output))
                outputs[output["name"]] = WasmTensor(self, output["name"], dtype, tuple(shape), size,
                                                     np.frombuffer(bytearray(data), stored, size // stored.itemsize))
            else:
                outputs[output["name"]] = output_array(self.manifest, output, data, shape, size)
        return split_sequences(self.manifest, outputs, step.element_shapes)

    def release_run(self) -> None:
        """Nothing is kept past a run."""

    def _check_status(self) -> None:
        """The run's error, when a kernel reported one into the status."""
        check_run_status(self.manifest, self._read(self._status, STATUS_BYTES))

    def create_timer(self) -> WallClockTimer:
        return WallClockTimer(self.manifest)

    # Kept tensors ------------------------------------------------------------------------------

    def _check_tensor(self, name: str, tensor: GpuTensor) -> None:
        """Refuse a GPU tensor, a disposed tensor, another session's, or a stale view, naming the input."""
        if not isinstance(tensor, WasmTensor):
            raise RelaxwebError(f"input '{name}': GPU tensor '{tensor.name}' lives on a WebGPU device; a wasm session "
                                "takes numpy arrays and its own kept tensors: read it with .numpy() and pass the array")
        if tensor.disposed:
            raise RelaxwebError(f"input '{name}': tensor '{tensor.name}' was disposed and cannot be used any more")
        if tensor.backend is not self:
            raise RelaxwebError(f"input '{name}': tensor '{tensor.name}' was kept by another wasm session; read it "
                                "with .numpy() and pass the array")
        self._check_current(tensor, f"input '{name}': tensor '{tensor.name}'")

    def _check_current(self, tensor: WasmTensor, what: str) -> None:
        view = tensor.cache_view
        if view is not None and view.run != self.run_number:
            raise RelaxwebError(f"{what} is a view of a KV cache that a later run has written: a view is valid until "
                                "the next run (read it with .numpy() first to keep its values)")

    def _tensor_input(self, index: int, tensor: WasmTensor) -> np.ndarray | None:
        """A kept tensor given as input ``index``: None for the current view of the input's own
        cache (the cache holds it already: nothing moves), else its device values."""
        view = tensor.cache_view
        if view is not None and view.cache is self._cache_of_input.get(index):
            return None
        return tensor.device_data().reshape(tensor.shape)

    def read_view(self, tensor: WasmTensor) -> np.ndarray:
        """A cache view's values (its rows of each block), flat in the dtype the memory holds (``wasm_dtype``)."""
        self._check_current(tensor, f"tensor '{tensor.name}'")
        cache = tensor.cache_view.cache
        stored = device_dtype(self.manifest["dtypes"][str(tensor.dtype)])
        dense = bytearray(tensor.nbytes)
        base = self._storage_addresses[cache["storage"]]
        for target, at, size in cache_block_copies(cache, tensor.shape, stored.itemsize, None):
            dense[target:target + size] = self._read(base + at, size)
        self.stats.add("bytes_read", tensor.nbytes)
        return np.frombuffer(dense, stored)

    def _write_inputs(self, arrays: list[np.ndarray | None]) -> None:
        """Each input's device bytes into its storage (a KV cache's past: each block at the
        start of its ``capacity`` rows); None: the cache's own view, already in place."""
        for index, (entry, array) in enumerate(zip(self.manifest["inputs"], arrays)):
            if array is None or array.nbytes == 0:
                continue
            self.stats.add("input_bytes_written", array.nbytes)
            data = memoryview(array).cast("B")
            if index in self._cache_of_input:
                cache = self._cache_of_input[index]
                base = self._storage_addresses[cache["storage"]]
                for source, target, size in cache_block_copies(cache, array.shape, array.itemsize, None):
                    self._memory.write(self._store, data[source:source + size], base + target)
                continue
            storage = entry["storage"]
            if self._storage_capacities[storage] < array.nbytes:
                raise RelaxwebError(f"the bundle's host module gave input '{entry['name']}' a storage of "
                                    f"{self._storage_capacities[storage]} bytes for {array.nbytes} bytes of data: "
                                    "the bundle is damaged")
            self._memory.write(self._store, data, self._storage_addresses[storage])

    def _buffer_address(self, reference: Mapping[str, Any]) -> int:
        """The address of a call site's ``{"storage": i}``, ``{"weight": j}``,
        ``{"weight_part": [j, part]}`` (the whole weight for part 0, 0 for the others) or
        ``{"status": 0}`` (the run status)."""
        if "storage" in reference:
            return self._storage_addresses[reference["storage"]]
        if "status" in reference:
            return self._status
        if "weight_part" in reference:
            weight, part = reference["weight_part"]
            return self._weight_addresses[weight] if part == 0 else 0
        return self._weight_addresses[reference["weight"]]

    def _dispatch(self, command: Dispatch, params: bytes, timer: WallClockTimer | None) -> None:
        """One dispatch record: ``kK_units`` on the call site's params block, then ``kK`` over
        all its units; a trap or the time limit is a RelaxwebError naming the call site."""
        call_site = self.manifest["call_sites"][command.call_site]
        kernel = call_site["kernel"]
        params_address = self._params_base + call_site["params_offset"]
        addresses = [self._buffer_address(reference) for reference in call_site["buffers"]]
        if self._packs[kernel] is not None:  # the kernel takes its prepacked region last (0: none, it packs per call)
            addresses.append(self._prepacked_regions.get(command.call_site, (0, 0))[0])
        started = time.perf_counter()
        self._store.set_epoch_deadline(math.ceil(self.kernel_timeout_s / _EPOCH_SECONDS) + 1)
        try:
            units = self._units[kernel](self._store, params_address)
            if units > 0:
                self._kernels[kernel](self._store, params_address, 0, units, self._scratch, *addresses)
        except (wasmtime.Trap, wasmtime.WasmtimeError) as error:
            raise RelaxwebError(self._trap_message(command.call_site, error)) from None
        if timer is not None:
            timer.record(command.call_site, (time.perf_counter() - started) * 1e3, params)

    def _trap_message(self, call_site_index: int, error: Exception) -> str:
        call_site = self.manifest["call_sites"][call_site_index]
        where = (f"kernel {self.manifest['kernels'][call_site['kernel']]['name']} at call site {call_site_index} "
                 f"({call_site['binding']})")
        if isinstance(error, wasmtime.Trap) and error.trap_code == wasmtime.TrapCode.INTERRUPT:
            return (f"{where} ran for more than {self.kernel_timeout_s:g} s and was stopped (the bundle's "
                    "kernels.wasm loops, or is damaged; a model this slow on purpose: raise kernel_timeout_s)")
        return f"{where} failed in kernels.wasm: {_trap_reason(error)} (the bundle is damaged)"

    def _output_bytes(self, index: int, shape: tuple[int, ...], byte_size: int) -> bytes | bytearray:
        """Output ``index``'s device bytes: from its storage, dense (a KV cache's present:
        the first rows of each block)."""
        if byte_size == 0:
            return b""
        output = self.manifest["outputs"][index]
        address = self._storage_addresses[output["storage"]]
        if index in self._cache_of_output:
            cache = self._cache_of_output[index]
            dense = bytearray(byte_size)
            itemsize = byte_size // int(np.prod(shape, dtype=np.int64))
            for target, at, size in cache_block_copies(cache, shape, itemsize, None):
                dense[target:target + size] = self._read(address + at, size)
            return dense
        if self._storage_capacities[output["storage"]] < byte_size:
            raise RelaxwebError(f"the bundle's host module gave output '{output['name']}' a storage of "
                                f"{self._storage_capacities[output['storage']]} bytes for {byte_size} bytes: "
                                "the bundle is damaged")
        return self._read(address, byte_size)


def _checked_timeout(seconds: Any) -> float:
    """A kernel call's time limit: a number of seconds above 0 and at most a day."""
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not 0 < seconds <= 86400:
        raise ValueError(f"kernel_timeout_s must be a number of seconds above 0 and at most 86400, got {seconds!r}")
    return float(seconds)


def _first_line(error: Exception) -> str:
    return (str(error).splitlines() or [type(error).__name__])[0]


def _trap_reason(error: Exception) -> str:
    """The line of a wasmtime error that says what trapped (``wasm trap: out of bounds ...``)."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    return next((line for line in lines if "wasm trap" in line), lines[0] if lines else type(error).__name__)
