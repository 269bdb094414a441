"""Running one kernel of a ``kernels.wasm`` on numpy arrays, for tests of the WebAssembly
backend's kernels without a bundle: the memory laid out as docs/bundle-format.md
("kernels.wasm") says, the units split into ranges called in reverse order (a kernel whose
units are not independent gives a different answer); a kernel that reads its second factor
prepacked (exports ``kK_pack``) gets a region as the runtimes give one, or none."""

from __future__ import annotations

from typing import Mapping, Sequence

import numpy as np
import wasmtime

RESERVED = 65536  # bytes [0, 65536) are never a buffer
SLACK = 65536
PAGE = 65536


def _aligned(value: int, alignment: int = 16) -> int:
    return (value + alignment - 1) // alignment * alignment


def run_wasm_kernel(wasm: bytes, index: int, inputs: Sequence[np.ndarray], output: np.ndarray,
                    params: Sequence[int], *, scratch_bytes: int = 0, ranges: int = 3, prepacked_bytes: int = 0,
                    after_pack: Mapping[int, np.ndarray] | None = None, packed: list[int] | None = None) -> np.ndarray:
    """Kernel ``index`` of ``wasm`` on ``inputs`` (wasm dtypes: float32 / int32 / uint32 / int64),
    writing into a copy of ``output`` (its initial contents matter to in-place kernels);
    ``params`` are the params block's i32 fields (element_count, then the size variables).
    Returns the output after the call; the units are run as ``ranges`` ranges, last first.

    A kernel exporting ``kK_pack`` takes a prepacked region last: one of ``prepacked_bytes``
    (its header's second word says so), packed by ``kK_pack`` before the units (its result
    appended to ``packed``; then each input ``after_pack`` names by position is overwritten
    with its array there, so that a kernel reading the factor again would see it); with 0,
    address 0 (none: the kernel packs per call)."""
    engine = wasmtime.Engine()
    store = wasmtime.Store(engine)
    arrays = [np.ascontiguousarray(a) for a in (*inputs, output)]
    for array in arrays:
        assert array.dtype.itemsize == 4 or array.dtype == np.int64, f"wasm dtypes are 4 bytes or int64, got {array.dtype}"
    address = RESERVED
    params_address = address
    block = np.zeros(max(4, -(-len(params) // 4) * 4), np.int32)
    block[:len(params)] = params
    address = _aligned(address + block.nbytes)
    addresses = []
    for array in arrays:
        addresses.append(address)
        address = _aligned(address + max(array.nbytes, 16))
    scratch = address
    status = address = _aligned(address + scratch_bytes)  # the run status, for a kernel that checks its data
    address = _aligned(address + 32)
    region = address if prepacked_bytes else 0
    address = _aligned(address + prepacked_bytes) + SLACK
    memory = wasmtime.Memory(store, wasmtime.MemoryType(wasmtime.Limits(-(-address // PAGE), 65536)))
    module = wasmtime.Module(engine, wasm)
    instance = wasmtime.Instance(store, module, [memory])
    memory.write(store, block.tobytes(), params_address)
    for array, at in zip(arrays, addresses):
        memory.write(store, array.tobytes(), at)
    exports = instance.exports(store)
    pack = exports.get(f"k{index}_pack")
    if len(exports[f"k{index}"].type(store).params) == 4 + len(addresses) + 1 + (pack is not None):
        addresses.append(status)
    if pack is not None:
        addresses.append(region)
        if region:
            memory.write(store, np.array([0, prepacked_bytes], np.uint32).tobytes(), region)
        result = pack(store, params_address, 0, 0, scratch, *addresses)
        if packed is not None:
            packed.append(result)
        for position, array in (after_pack or {}).items():
            memory.write(store, np.ascontiguousarray(array, arrays[position].dtype).tobytes(), addresses[position])
    units = exports[f"k{index}_units"](store, params_address)
    bounds = np.linspace(0, units, ranges + 1).astype(int) if units > 0 else []
    for first, end in reversed(list(zip(bounds[:-1], bounds[1:]))):
        if end > first:
            exports[f"k{index}"](store, params_address, int(first), int(end), scratch, *addresses)
    words = np.frombuffer(memory.read(store, status, status + 32), np.int32)
    assert not words[0], f"the kernel reported error site {words[0]} with values {words[1:].tolist()}"
    output_address = addresses[len(arrays) - 1]
    result = memory.read(store, output_address, output_address + arrays[-1].nbytes)
    return np.frombuffer(result, arrays[-1].dtype).reshape(arrays[-1].shape).copy()
