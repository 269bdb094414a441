"""Run a bundle without a GPU: its ``kernels.wasm`` (WebAssembly SIMD) through wasmtime.

:class:`WasmSession` follows "One run" in ``docs/bundle-format.md`` as ``webgpu.Session``
does, with the same host module, command lists and params blocks; what the GPU did is done
in one linear memory laid out as "Running on kernels.wasm" says:

    [0, 64 KiB)   never a buffer (a stray small address reads zeros or traps, never a tensor)
    params        the host's params block, copied in after every ``run()`` / ``resume()``
    scratch       ``wasm.scratch_bytes`` for the one thread this session calls kernels on
    weights       each weight whole (16-byte aligned), copied in once at load
    storages      KV caches first (sized at the bounds, never moved), then the others: at
                  their sizes at the bounds when every var has one, else placed per run
    slack         at least 64 KiB after the last buffer (a vector load may read past an end)

A storage that must grow in the middle of a run (after a read or a loop's resume) moves to
a new region at the end, its contents copied; before a run, storages that must grow are all
placed again from the first movable address (nothing of theirs is needed across runs), so
the memory stays as large as the largest run needed.  Each dispatch record calls the
kernel's ``kK_units`` on its params block, then ``kK`` over all its units on this thread.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import numpy as np
import wasmtime

from relaxweb.errors import RelaxwebError
from relaxweb.runtime.batch import ONE_BY_ONE, BatchReport, check_instance_count, run_one_by_one
from relaxweb.runtime.gpu_tensor import GpuTensor, cache_block_copies
from relaxweb.runtime.host import Dispatch, HostModule, Read, Resume, load_manifest
from relaxweb.runtime.manifest import MAX_HOST_MODULE_BYTES, read_bundle_file
from relaxweb.runtime.profile import WASM_CALLS, DispatchTime, Profile, params_fields, summarize
from relaxweb.runtime.tensors import (
    checked_inputs, device_byte_sizes, load_shards, output_array, sequence_output_tables, split_sequences, with_flat_sequences,
)
from relaxweb.tokenizer import make_tokenizer

RESERVED_BYTES = 65536  # bytes [0, 65536) are never a buffer
SLACK_BYTES = 65536  # free bytes after the last buffer
PAGE_BYTES = 65536
MAX_PAGES = 65536  # a wasm32 memory holds at most 4 GiB
ALIGNMENT = 16
MAX_KERNELS_WASM_BYTES = 256 * 1024 * 1024
#: How long one kernel call may run before it is stopped (an epoch deadline, checked at
#: every loop back-edge): far more than any kernel of a model that fits in 4 GiB needs, so
#: only a kernels.wasm that loops (a damaged bundle) ever meets it.
KERNEL_SECONDS_PER_CALL = 300
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
            and isinstance(entry.get("scratch_bytes"), int) and 0 <= entry["scratch_bytes"] <= 1 << 30):
        raise RelaxwebError(f"the bundle {bundle_dir} has a malformed 'wasm' entry in its manifest: the bundle is damaged")
    return entry


class WasmSession:
    """A bundle loaded on its ``kernels.wasm``, ready to :meth:`run` (same inputs, outputs
    and errors as ``webgpu.Session.run``), on one thread.

    Attributes:
        manifest: the bundle's ``manifest.json`` as a dict.
        host: the bundle's host module (shape checks, command list).
        backend: ``"wasm"``.
        last_dispatch_count / last_read_count: as on ``Session``.
        memory_bytes: the linear memory's size now (it grows, never shrinks).
    """

    backend = "wasm"

    def __init__(self, bundle_dir: str | Path) -> None:
        self.bundle_dir = Path(bundle_dir)
        self.manifest: dict[str, Any] = load_manifest(self.bundle_dir)
        entry = wasm_entry(self.manifest, self.bundle_dir)
        #: the bundle's tokenizer (``relaxweb/tokenizer.py``), or None when it has none
        self.tokenizer = make_tokenizer(self.manifest["tokenizer"]) if "tokenizer" in self.manifest else None
        self.host = HostModule(
            read_bundle_file(self.bundle_dir, "host.wasm", MAX_HOST_MODULE_BYTES, "the host module"), self.manifest
        )
        self.last_dispatch_count = 0
        self.last_read_count = 0
        #: how the last :meth:`run_batch` ran (``runtime/batch.BatchReport``)
        self.last_batch: BatchReport | None = None
        shards = load_shards(self.bundle_dir, self.manifest)
        wasm = read_bundle_file(self.bundle_dir, entry["file"], MAX_KERNELS_WASM_BYTES, "kernels.wasm")
        self._store = wasmtime.Store(_clock.engine())
        self._memory = wasmtime.Memory(self._store, wasmtime.MemoryType(wasmtime.Limits(1, MAX_PAGES)))
        self._units, self._kernels = self._instantiate(wasm)

        # the fixed regions: params, scratch, weights
        self._params_base = RESERVED_BYTES
        self._scratch = _aligned(self._params_base + self.manifest["params_bytes"])
        end = _aligned(self._scratch + entry["scratch_bytes"])
        self._weight_addresses = []
        for weight in self.manifest["weights"]:
            self._weight_addresses.append(end)
            end += _region_bytes(weight["nbytes"])
        storage_count = len(self.manifest["storages"])
        self._storage_addresses: list[int] = [0] * storage_count
        self._storage_capacities: list[int] = [0] * storage_count  # 0: not placed yet
        # KV caches (manifest "caches"), placed once at their size at the bounds
        self._cache_of_input = {cache["input"]: cache for cache in self.manifest.get("caches", [])}
        self._cache_of_output = {cache["output"]: cache for cache in self.manifest.get("caches", [])}
        self._fixed = {cache["storage"] for cache in self._cache_of_input.values()}
        for index in sorted(self._fixed):
            size = self.manifest["storages"][index]["size_at_bounds"]
            if size is None:
                raise RelaxwebError(f"the bundle's KV cache storage {index} has no size at the bounds: the bundle is damaged")
            self._storage_addresses[index] = end
            self._storage_capacities[index] = _region_bytes(size)
            end += self._storage_capacities[index]
        self._movable_start = end
        self._end = end
        self._ensure_memory(end)
        for weight, address in zip(self.manifest["weights"], self._weight_addresses):
            data = shards[weight["shard"]][weight["offset"]:weight["offset"] + weight["nbytes"]]
            self._memory.write(self._store, data, address)
        sizes = self.host.sizes_at_bounds()
        if sizes is not None:  # every var has a bound: every storage placed once, now
            self._place_storages(sizes)

    @property
    def memory_bytes(self) -> int:
        return self._memory.data_len(self._store)

    # Loading -----------------------------------------------------------------------------

    def _instantiate(self, wasm: bytes) -> tuple[list[wasmtime.Func], list[wasmtime.Func]]:
        """kernels.wasm instantiated on this session's memory; its ``kK_units`` and ``kK``
        functions by kernel index."""
        try:
            module = wasmtime.Module(self._store.engine, wasm)
        except wasmtime.WasmtimeError as error:
            raise RelaxwebError(f"the bundle's kernels.wasm cannot be loaded: {_first_line(error)}") from None
        imports = [(item.module, item.name, type(item.type).__name__) for item in module.imports]
        if imports != [("env", "memory", "MemoryType")]:
            raise RelaxwebError("the bundle's kernels.wasm must import exactly one thing, the memory env.memory: "
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
        return units, kernels

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
            self._storage_addresses[index] = end
            self._storage_capacities[index] = max(self._storage_capacities[index], _region_bytes(needed))
            end += self._storage_capacities[index]
        self._ensure_memory(end)
        self._end = end

    def _grow_storages(self, needed_sizes: list[int], keep_contents: bool) -> None:
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

    def _read(self, address: int, byte_size: int) -> bytearray:
        return self._memory.read(self._store, address, address + byte_size)

    # One run -----------------------------------------------------------------------------

    def run(self, inputs: Mapping[str, Any], keep_on_gpu: bool | Iterable[str] = False) -> dict[str, Any]:
        """Run the model on ``inputs`` (name -> array) and return its outputs by name, as
        ``Session.run`` does (the same checks, :class:`InputShapeError` messages and output
        dtypes).  ``keep_on_gpu`` needs the webgpu backend: there are no GPU tensors here."""
        if keep_on_gpu:
            raise RelaxwebError("keep_on_gpu needs the webgpu backend: a wasm session has no GPU to keep tensors on "
                                "(load the bundle with backend='webgpu')")
        return self._run(inputs, None)

    def run_batch(self, instances: Sequence[Mapping[str, Any]]) -> list[dict[str, Any]]:
        """``Session.run_batch``'s contract on one CPU thread: the instances run one after
        another (``last_batch.mode`` is "one by one": kernels.wasm has no ragged form)."""
        check_instance_count(len(instances))
        report = BatchReport(mode=ONE_BY_ONE, reason="the wasm backend runs a batch instance by instance",
                             instances=len(instances))
        results = run_one_by_one(self, instances, report)
        self.last_batch = report
        return results

    def generate(self, *args: Any, **kwargs: Any) -> Any:
        """Not on this backend: generation keeps the KV cache and picks tokens on the GPU."""
        raise RelaxwebError("generate needs the webgpu backend (it keeps the KV cache on the GPU and picks each token "
                            "there); load the bundle with backend='webgpu'")

    def profile(self, inputs: Mapping[str, Any], *, warmup: int = 1) -> Profile:
        """Run ``warmup`` times, then once timing each kernel call by the wall clock (its
        ``kK_units`` and ``kK`` calls), and return the :class:`Profile` (``.outputs``,
        ``.rows``, ``.table()``), the rows ``Session.profile`` gives."""
        for _ in range(warmup):
            self._run(inputs, None)
        times: list[DispatchTime] = []
        outputs = self._run(inputs, times)
        profile = summarize(self.manifest, times, WASM_CALLS)
        profile.outputs = outputs
        return profile

    def _run(self, inputs: Mapping[str, Any], times: list[DispatchTime] | None) -> dict[str, Any]:
        """:meth:`run`; with ``times``, each dispatch's time is appended to it."""
        arrays, sequences = checked_inputs(self.manifest, inputs, _refuse_gpu_tensor)
        for index, shapes in sequences.items():
            entry = self.manifest["inputs"][index]
            self.host.write_sequence(entry["name"], entry["sequence"], shapes)
        self.host.run_with_shapes([() if index in sequences else array.shape for index, array in enumerate(arrays)])
        commands = self.host.commands()
        self._grow_storages(self.host.storage_sizes(), keep_contents=False)
        self._write_inputs(arrays)
        dispatch_count = read_count = 0
        while True:
            params = self.host.params()
            self._memory.write(self._store, params, self._params_base)
            for command in commands:
                if isinstance(command, Dispatch):
                    self._dispatch(command, params, times)
                    dispatch_count += 1
            last = commands[-1] if commands else None
            if isinstance(last, Read):
                self.host.write_read_value(last.slot, self._read_value(last))
                read_count += 1
            elif not isinstance(last, Resume):
                break
            self.host.resume_or_raise()
            commands = self.host.commands()
            self._grow_storages(self.host.storage_sizes(), keep_contents=True)

        tables = sequence_output_tables(self.manifest, self.host)
        output_shapes = with_flat_sequences(self.host.output_shapes(), tables)
        byte_sizes = device_byte_sizes(self.manifest, output_shapes)
        outputs = {output["name"]: output_array(self.manifest, output, self._output_bytes(index, shape, size), shape, size)
                   for index, (output, shape, size) in enumerate(zip(self.manifest["outputs"], output_shapes, byte_sizes))}
        self.last_dispatch_count = dispatch_count
        self.last_read_count = read_count
        return split_sequences(self.manifest, outputs, tables)

    def _write_inputs(self, arrays: list[np.ndarray]) -> None:
        """Each input's device bytes into its storage (a KV cache's past: each block at the
        start of its ``capacity`` rows)."""
        for index, (entry, array) in enumerate(zip(self.manifest["inputs"], arrays)):
            if array.nbytes == 0:
                continue
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
        """The address of a call site's ``{"storage": i}``, ``{"weight": j}`` or
        ``{"weight_part": [j, part]}`` (the whole weight for part 0, 0 for the others)."""
        if "storage" in reference:
            return self._storage_addresses[reference["storage"]]
        if "weight_part" in reference:
            weight, part = reference["weight_part"]
            return self._weight_addresses[weight] if part == 0 else 0
        return self._weight_addresses[reference["weight"]]

    def _dispatch(self, command: Dispatch, params: bytes, times: list[DispatchTime] | None) -> None:
        """One dispatch record: ``kK_units`` on the call site's params block, then ``kK`` over
        all its units; a trap or the time limit is a RelaxwebError naming the call site."""
        call_site = self.manifest["call_sites"][command.call_site]
        kernel = call_site["kernel"]
        params_address = self._params_base + call_site["params_offset"]
        addresses = [self._buffer_address(reference) for reference in call_site["buffers"]]
        started = time.perf_counter()
        self._store.set_epoch_deadline(int(KERNEL_SECONDS_PER_CALL / _EPOCH_SECONDS) + 1)
        try:
            units = self._units[kernel](self._store, params_address)
            if units > 0:
                self._kernels[kernel](self._store, params_address, 0, units, self._scratch, *addresses)
        except (wasmtime.Trap, wasmtime.WasmtimeError) as error:
            raise RelaxwebError(self._trap_message(command.call_site, error)) from None
        if times is not None:
            elapsed_ms = (time.perf_counter() - started) * 1e3
            times.append(DispatchTime(command.call_site, elapsed_ms, params_fields(params, call_site)))

    def _trap_message(self, call_site_index: int, error: Exception) -> str:
        call_site = self.manifest["call_sites"][call_site_index]
        where = (f"kernel {self.manifest['kernels'][call_site['kernel']]['name']} at call site {call_site_index} "
                 f"({call_site['binding']})")
        if isinstance(error, wasmtime.Trap) and error.trap_code == wasmtime.TrapCode.INTERRUPT:
            return (f"{where} ran for more than {KERNEL_SECONDS_PER_CALL} s and was stopped (the bundle's "
                    "kernels.wasm loops, or is damaged)")
        return f"{where} failed in kernels.wasm: {_trap_reason(error)} (the bundle is damaged)"

    def _read_value(self, read: Read) -> int:
        """The i32 a read record names (sign-extended by Python's int)."""
        if read.byte_offset + 4 > self._storage_capacities[read.storage]:
            raise RelaxwebError(f"the bundle's command list reads bytes {read.byte_offset}..{read.byte_offset + 4} "
                                f"of storage {read.storage}, which has {self._storage_capacities[read.storage]} bytes")
        return int.from_bytes(self._read(self._storage_addresses[read.storage] + read.byte_offset, 4), "little",
                              signed=True)

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


def _refuse_gpu_tensor(name: str, tensor: GpuTensor) -> None:
    raise RelaxwebError(f"input '{name}': GPU tensor '{tensor.name}' lives on a WebGPU device; a wasm session takes "
                        "numpy arrays: read it with .numpy() and pass the array")


def _first_line(error: Exception) -> str:
    return (str(error).splitlines() or [type(error).__name__])[0]


def _trap_reason(error: Exception) -> str:
    """The line of a wasmtime error that says what trapped (``wasm trap: out of bounds ...``)."""
    lines = [line.strip() for line in str(error).splitlines() if line.strip()]
    return next((line for line in lines if "wasm trap" in line), lines[0] if lines else type(error).__name__)
