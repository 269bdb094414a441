"""What every Python runtime backend does to a run's tensors, whatever runs the kernels.

The steps of "One run" in ``docs/bundle-format.md`` that happen before the host module and
after the last kernel: inputs checked against the manifest (the host sees shapes only) and
converted to their device dtypes, a sequence input flattened into its arena's values, and
outputs turned from the device dtypes back into the model's (a sequence split into its
elements); and the weight shards read and checked at load.  ``webgpu.Session`` and ``wasm_session.WasmSession`` both call these, so both give
the same arrays and the same error messages.
"""

from __future__ import annotations

import hashlib
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

import numpy as np

from relaxweb.errors import InputShapeError, RelaxwebError, shortened, shown
from relaxweb.runtime.gpu_tensor import GpuTensor
from relaxweb.runtime.manifest import read_bundle_file

SEQUENCE_KINDS = ("sequence", "optional_sequence")

#: What an input takes, the same in both runtimes: a numpy array of the input's dtype (JS: its
#: typed array) or, by the input's dtype, of one of these (an int64 input takes int32 data,
#: as the GPU holds int64 tensors: every value fits; the wasm backend widens it to the int64
#: kernels.wasm holds); a GpuTensor of the input's dtype where
#: the backend takes one.  Nothing else: no lists, no arrays of other dtypes, no other array
#: types.  The browser runtime's table is ``ALSO_ACCEPTED`` in ``runtime_js/host.js``; the
#: conformance corpus (``tests/conformance/input_arrays.json``) holds both to it.
ALSO_ACCEPTED: dict[str, tuple[str, ...]] = {"int64": ("int32",)}


def device_dtype(dtype_entry: Mapping[str, Any]) -> np.dtype:
    """The dtype a tensor has in GPU memory, from its entry in the manifest's ``dtypes``
    table (int64, int16, int8 -> int32; uint16, uint8, bool -> uint32; float16, float64 ->
    float32); in :func:`wasm_manifest`'s view, the dtype it has in kernels.wasm's memory."""
    return np.dtype(dtype_entry["device_dtype"])


def wasm_manifest(manifest: Mapping[str, Any]) -> dict[str, Any]:
    """The manifest as the wasm backend holds tensors: a shallow copy whose ``dtypes`` entries
    say ``kernels.wasm``'s form (``device_dtype``, ``device_bytes`` replaced by the entry's
    ``wasm_dtype``, ``wasm_bytes``: int64 is int64 there, every other dtype as on the GPU).
    Every function here that converts by the dtypes table then converts for that memory: the
    wasm backends use this copy where WebGPU uses the manifest.  The weights' entries keep
    the shards' bytes, which are already this form (WebGPU narrows an int64 weight:
    :func:`webgpu_weight_bytes`)."""
    view = dict(manifest)
    view["dtypes"] = {name: {**entry, "device_dtype": entry["wasm_dtype"], "device_bytes": entry["wasm_bytes"]}
                      for name, entry in manifest["dtypes"].items()}
    return view


def webgpu_weight_nbytes(manifest: Mapping[str, Any], weight: Mapping[str, Any]) -> int:
    """The bytes a weight takes on the GPU (elements x ``device_bytes``): its shard holds the
    wasm form (``nbytes``, elements x ``wasm_bytes``; 8 bytes an int64 element, 4 on the GPU).
    The GPU's buffer sizes, parts and limit checks count these."""
    entry = manifest["dtypes"][weight["dtype"]]
    return weight["nbytes"] // entry["wasm_bytes"] * entry["device_bytes"]


def webgpu_weight_bytes(weight: Mapping[str, Any], data: bytes | memoryview,
                        dtype_entry: Mapping[str, Any]) -> bytes | memoryview:
    """A weight's bytes as the GPU holds it, from its shard bytes (its wasm form): the same
    bytes, or for an int64 weight (little-endian int64 in the shard) each value narrowed to
    int32.  A value outside int32 is an error naming the weight: a bundle built with one says
    so in its manifest's ``webgpu.unavailable``, and WebGPU refuses it before reading any
    shard, so only a damaged bundle gets here."""
    if dtype_entry["wasm_dtype"] == dtype_entry["device_dtype"]:
        return data
    wide = np.frombuffer(data, np.dtype(dtype_entry["wasm_dtype"]).newbyteorder("<"))
    device = np.dtype(dtype_entry["device_dtype"]).newbyteorder("<")
    limits = np.iinfo(device)
    outside = (wide < limits.min) | (wide > limits.max)
    if outside.any():
        raise RelaxwebError(
            f"weight '{shortened(shown(weight['name']))}' ({weight['dtype']}) holds {int(wide[outside][0])}, outside the "
            f"{dtype_entry['device_dtype']} range the GPU holds {weight['dtype']} tensors in, and the manifest does "
            "not say that WebGPU cannot run it (webgpu.unavailable): the bundle is damaged"
        )
    return wide.astype(device).tobytes()


def dtype_entry(manifest: Mapping[str, Any], tensor: Mapping[str, Any]) -> Mapping[str, Any]:
    """The manifest's ``dtypes`` entry of an input's or output's dtype."""
    return manifest["dtypes"][tensor["dtype"]]


def split_elements(flat: np.ndarray, shapes: list[tuple[int, ...]]) -> list[np.ndarray]:
    """A sequence's elements from the flat array of their values, one after another."""
    elements, start = [], 0
    for shape in shapes:
        count = int(np.prod(shape, dtype=np.int64))
        elements.append(flat[start:start + count].reshape(shape))
        start += count
    return elements


def to_device(name: str, array: np.ndarray, dtype_entry: Mapping[str, Any]) -> np.ndarray:
    """An input as the GPU holds it; an integer value outside the range of a narrower device
    dtype (int64 on an int32 device) is an error (narrower ints always fit; float64 values
    are rounded to float32, beyond its range to infinity)."""
    stored = device_dtype(dtype_entry)
    if array.dtype == stored:
        return array
    narrowed = dtype_entry["device_bytes"] < dtype_entry["bytes"]
    if dtype_entry["kind"] in ("int", "uint") and narrowed and array.size:
        info = np.iinfo(stored)
        outside = (array < info.min) | (array > info.max)
        if outside.any():
            position = tuple(int(i) for i in np.argwhere(outside)[0])
            raise InputShapeError(
                f"input '{name}': value {int(array[position])} at index {list(position)} does not fit in "
                f"{stored} ({array.dtype} tensors are {stored} on the GPU)"
            )
    with np.errstate(over="ignore"):
        return np.asarray(array.astype(stored), order="C")


def accepted_array(value: Any, dtype: np.dtype) -> bool:
    """Whether ``value`` is an array an input of ``dtype`` takes (:data:`ALSO_ACCEPTED`)."""
    return isinstance(value, np.ndarray) and (value.dtype == dtype or value.dtype.name in ALSO_ACCEPTED.get(dtype.name, ())
                                              and value.dtype.isnative)


def wrong_data(name: str, dtype: np.dtype, value: Any) -> InputShapeError:
    """The error for data an input of ``dtype`` does not take (worded as the browser's)."""
    accepted = " or ".join((dtype.name, *ALSO_ACCEPTED.get(dtype.name, ())))
    return InputShapeError(f"input '{name}': expected {dtype} data (a numpy array of dtype {accepted}), "
                           f"got {describe_value(value)}")


def describe_value(value: Any) -> str:
    """How a given input is named in error messages: its dtype, or its Python type."""
    if isinstance(value, np.ndarray):
        return f"an array of dtype {value.dtype}"
    if isinstance(value, GpuTensor):
        return f"a GpuTensor of dtype {value.dtype}"
    return f"a {type(value).__name__}"


def to_model_dtype(array: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """Values read back as the GPU holds them, in the model's dtype, like numpy's astype:
    int32 -> int64/int16/int8 and uint32 -> uint16/uint8 (narrow ints keep their low bits),
    float32 -> float16 (rounded)/float64, uint32 (0/1) -> bool."""
    if array.dtype == dtype:
        return array
    with np.errstate(over="ignore"):
        return array != 0 if dtype == np.bool_ else array.astype(dtype)


def output_array(manifest: Mapping[str, Any], output: Mapping[str, Any], data: bytes | bytearray,
                 shape: tuple[int, ...], byte_size: int) -> np.ndarray:
    """An output's ``byte_size`` bytes as the device holds them (``data`` may be longer), as
    an array of the model's dtype and ``shape``."""
    dtype = np.dtype(output["dtype"])
    if byte_size == 0:
        return np.zeros(shape, dtype=dtype)
    stored = device_dtype(dtype_entry(manifest, output))
    return to_model_dtype(np.frombuffer(data, dtype=stored, count=byte_size // stored.itemsize), dtype).reshape(shape)


def describe_input(entry: Mapping[str, Any]) -> str:
    shape = ", ".join(str(dimension) for dimension in entry["shape"])
    return f"{entry['dtype']} [{shape}]"


def checked_inputs(manifest: Mapping[str, Any], inputs: Mapping[str, Any],
                   check_gpu_tensor: Callable[[str, GpuTensor], None]) -> tuple[list[Any], dict[int, list | None]]:
    """The inputs in manifest order, contiguous, after the checks the host cannot do, and
    the shapes of the elements of each sequence input by its index (a sequence is a list of
    arrays, given to the GPU as one flat array of their values; an optional sequence may
    be None).  A GpuTensor input is kept as it is after ``check_gpu_tensor(name, tensor)``
    (which raises when the session cannot take it)."""
    expected_names = [entry["name"] for entry in manifest["inputs"]]
    unknown = [name for name in inputs if name not in expected_names]
    if unknown:
        raise InputShapeError(
            f"unknown input {', '.join(repr(name) for name in unknown)}; "
            f"the model's inputs are {', '.join(repr(name) for name in expected_names)}"
        )
    arrays: list[Any] = []
    sequences: dict[int, list | None] = {}
    for entry in manifest["inputs"]:
        name = entry["name"]
        if name not in inputs:
            raise InputShapeError(f"missing input '{name}' ({describe_input(entry)})")
        value = inputs[name]
        if entry.get("kind") in SEQUENCE_KINDS:
            none = value is None and entry["kind"] == "optional_sequence"
            arrays.append(checked_sequence(manifest, entry, [] if none else value))
            sequences[len(arrays) - 1] = None if none else [element.shape for element in value]
            continue
        if isinstance(value, GpuTensor):
            check_gpu_tensor(name, value)
        expected_dtype = np.dtype(entry["dtype"])
        if not (accepted_array(value, expected_dtype) or isinstance(value, GpuTensor) and value.dtype == expected_dtype):
            raise wrong_data(name, expected_dtype, value)
        if value.ndim != len(entry["shape"]):
            raise InputShapeError(
                f"input '{name}' has {value.ndim} dimensions (shape {list(value.shape)}), "
                f"expected {len(entry['shape'])} ({describe_input(entry)})"
            )
        if isinstance(value, GpuTensor):  # copied on the GPU by the run (Session._gpu_tensor_input_copies)
            arrays.append(value)
            continue
        # Not np.ascontiguousarray: it turns a 0-d array (a scalar input) into a 1-d one.
        arrays.append(to_device(name, np.asarray(value, order="C"), dtype_entry(manifest, entry)))
    return arrays, sequences


def kept_output_indices(manifest: Mapping[str, Any], keep_on_gpu: Any) -> frozenset[int]:
    """The indices of the outputs a run's ``keep_on_gpu`` names (True: every output but
    sequences), for either backend; a RelaxwebError for a name that is not an output's."""
    outputs = manifest["outputs"]
    if keep_on_gpu is True:
        return frozenset(k for k, output in enumerate(outputs) if output.get("kind") not in SEQUENCE_KINDS)
    if keep_on_gpu is False or keep_on_gpu is None:
        return frozenset()
    if isinstance(keep_on_gpu, str):
        raise RelaxwebError(f"keep_on_gpu must be True or a list of output names, got the string {keep_on_gpu!r}")
    index_of = {output["name"]: k for k, output in enumerate(outputs)}
    chosen = list(keep_on_gpu)
    unknown = [name for name in chosen if name not in index_of]
    if unknown:
        raise RelaxwebError(
            f"keep_on_gpu names unknown output {', '.join(repr(name) for name in unknown)}; "
            f"the model's outputs are {', '.join(repr(name) for name in index_of)}"
        )
    sequences = [name for name in chosen if outputs[index_of[name]].get("kind") in SEQUENCE_KINDS]
    if sequences:
        raise RelaxwebError(
            f"output {', '.join(repr(name) for name in sequences)} is a sequence: only tensors can be kept on the GPU"
        )
    return frozenset(index_of[name] for name in chosen)


def checked_sequence(manifest: Mapping[str, Any], entry: Mapping[str, Any], value: Any) -> np.ndarray:
    """A sequence input (a list of arrays of its dtype and rank) as one flat device array."""
    name, dtype, ndim = entry["name"], np.dtype(entry["dtype"]), entry["element_ndim"]
    if not isinstance(value, (list, tuple)):
        raise InputShapeError(f"input '{name}' is a sequence: it must be a list of numpy arrays, got {describe_value(value)}")
    flat = []
    for position, element in enumerate(value):
        if not accepted_array(element, dtype):
            raise wrong_data(f"{name}[{position}]", dtype, element)
        if ndim >= 0 and element.ndim != ndim:
            raise InputShapeError(f"input '{name}': element {position} has {element.ndim} dimensions "
                                  f"(shape {list(element.shape)}), expected {ndim}")
        flat.append(to_device(name, np.asarray(element, order="C"), dtype_entry(manifest, entry)).reshape(-1))
    return np.concatenate(flat) if flat else np.zeros(0, device_dtype(dtype_entry(manifest, entry)))


def device_byte_sizes(manifest: Mapping[str, Any], output_shapes: list[tuple[int, ...]]) -> list[int]:
    """Bytes of each output as the device holds it: its elements times its ``device_bytes``."""
    return [int(np.prod(shape, dtype=np.int64)) * dtype_entry(manifest, output)["device_bytes"]
            for shape, output in zip(output_shapes, manifest["outputs"])]


def sequence_output_tables(manifest: Mapping[str, Any], host: Any) -> dict[int, list[tuple[int, ...]] | None]:
    """The element shapes of each sequence output by its index, from the tables the host
    module's last run left (None: an optional sequence that is none)."""
    return {index: host.read_sequence(output["sequence"], output["kind"] == "optional_sequence")
            for index, output in enumerate(manifest["outputs"]) if output.get("kind") in SEQUENCE_KINDS}


def with_flat_sequences(output_shapes: list[tuple[int, ...]],
                        tables: Mapping[int, list[tuple[int, ...]] | None]) -> list[tuple[int, ...]]:
    """``output_shapes`` with each sequence output's replaced by the 1-D shape of its arena's
    values (a sequence is read as one flat array, then split)."""
    shapes = list(output_shapes)
    for index, elements in tables.items():
        shapes[index] = (sum(int(np.prod(shape, dtype=np.int64)) for shape in elements or ()),)
    return shapes


def split_sequences(manifest: Mapping[str, Any], outputs: dict[str, Any],
                    tables: Mapping[int, list[tuple[int, ...]] | None]) -> dict[str, Any]:
    """``outputs`` with each sequence output's flat array split into its elements (a list)."""
    for index, elements in tables.items():
        name = manifest["outputs"][index]["name"]
        outputs[name] = None if elements is None else split_elements(outputs[name], elements)
    return outputs


def load_shards(bundle_dir: Path, manifest: Mapping[str, Any]) -> list[bytes]:
    """Read every weight shard, checking its size and sha256 against the manifest."""
    shards = []
    for shard in manifest["shards"]:
        # one byte more than the manifest says shows a longer file without reading it all
        data = read_bundle_file(bundle_dir, shard["file"], shard["nbytes"] + 1, "weight shard")
        if len(data) != shard["nbytes"]:
            size = f"{len(data)} bytes" if len(data) <= shard["nbytes"] else "more bytes"
            raise RelaxwebError(
                f"weight shard {shard['file']} has {size}, the manifest says "
                f"{shard['nbytes']}: the bundle is incomplete or corrupted"
            )
        digest = hashlib.sha256(data).hexdigest()
        if digest != shard["sha256"]:
            raise RelaxwebError(
                f"weight shard {shard['file']} fails its checksum (sha256 {digest}, the "
                f"manifest says {shard['sha256']}): the bundle is corrupted"
            )
        shards.append(data)
    return shards
