"""build_bundle: ONNX file -> dist/ folder (see docs/bundle-format.md for what it holds).

Steps: import the model, run the pass pipeline with the user's bounds, emit one WGSL shader
per tensor program and the host module for the host function, then write the manifest, the
weights (in shards with checksums) and a copy of the browser runtime.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path
from typing import Callable

import numpy as np

from .errors import RelaxwebError, UnsupportedModelError
from .frontend import import_onnx_file
from .ir.host import HostFunction
from .ir.module import IRModule
from .ir.printer import format_module
from .ir.symbolic import format_expr, upper_bound
from .passes import DEFAULT_OPT_LEVEL, pipeline, run_pipeline
from .wasm import MAX_RANK, PARAMS_SLOT, CallSiteParams, assemble, emit_host_wat
from .wgsl import ShaderInfo, emit_wgsl
from .wgsl.emit import WORKGROUP_SIZE

FORMAT = "relaxweb-bundle"
VERSION = 1
SHARD_BYTES = 32 * 1024 * 1024
RUNTIME_JS = Path(__file__).parent / "runtime_js"
SUPPORTED_DTYPES = (
    "float32", "float16", "float64", "int32", "int16", "int8", "uint32", "uint16", "uint8", "int64", "bool",
)
# WGSL has no 64-bit integers, no bool buffers, and no 8/16-bit or 64-bit float buffers (f16
# needs the shader-f16 feature): on the device an int64 tensor is int32 (checked at the
# boundary: weights at build time, inputs by the runtimes), int8/int16 are int32,
# uint8/uint16 are uint32, float16/float64 are float32, and a bool tensor is uint32 0/1. The
# manifest gives both the model's dtype and this device dtype; runtimes convert inputs on
# upload and outputs back to the model dtype on readback (numpy astype: narrow ints wrap).
DEVICE_DTYPES = {
    "int64": "int32", "int16": "int32", "int8": "int32", "uint16": "uint32", "uint8": "uint32",
    "float16": "float32", "float64": "float32", "bool": "uint32",
}


def device_dtype(dtype: str) -> str:
    """The dtype a tensor of ``dtype`` has in GPU memory."""
    return DEVICE_DTYPES.get(dtype, dtype)

Progress = Callable[[str], None]


def compile_model(model_path: str | Path, bounds: dict[str, int], progress: Progress = lambda _: None,
                  dump_ir: Path | None = None, opt_level: int = DEFAULT_OPT_LEVEL) -> IRModule:
    """Import and lower a model; the result's ``main`` is a HostFunction."""
    module = import_onnx_file(model_path)
    main = module.main
    progress(f"imported {Path(model_path).name}: {len(main.bindings())} bindings, "
             f"inputs {', '.join(main.input_names)}")
    return compile_module(module, bounds, progress, dump_ir, opt_level)


def compile_module(module: IRModule, bounds: dict[str, int], progress: Progress = lambda _: None,
                   dump_ir: Path | None = None, opt_level: int = DEFAULT_OPT_LEVEL) -> IRModule:
    """Run the pass pipeline of ``opt_level`` on a module (imported or built by hand) with
    the given bounds."""
    module = module.replace(attrs={**module.attrs, "bounds": dict(bounds)})

    def on_step(name: str, step_module: IRModule) -> None:
        progress(f"pass {name}")
        if dump_ir is not None:
            _dump(dump_ir, name, step_module)

    if dump_ir is not None:
        _dump(dump_ir, "imported", module)
    return run_pipeline(module, pipeline(opt_level), on_step)


def _dump(folder: Path, name: str, module: IRModule) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    index = len(list(folder.glob("*.txt")))
    (folder / f"{index:02d}_{name}.txt").write_text(format_module(module))


def build_bundle(model_path: str | Path, out_dir: str | Path, bounds: dict[str, int] | None = None,
                 progress: Progress = lambda _: None, dump_ir: Path | None = None,
                 opt_level: int = DEFAULT_OPT_LEVEL) -> dict:
    """Compile ``model_path`` into the bundle folder ``out_dir``; returns the manifest."""
    module = compile_model(model_path, bounds or {}, progress, dump_ir, opt_level)
    return write_bundle(module, out_dir, Path(model_path).name, progress)


def write_bundle(module: IRModule, out_dir: str | Path, source: str, progress: Progress = lambda _: None) -> dict:
    """Write the bundle of a compiled module (its ``main`` a HostFunction); returns the manifest.

    ``source`` names the model in the manifest and in the generated code's comments.
    """
    host = module.main
    assert isinstance(host, HostFunction)
    _check_dtypes(host, module.programs)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "kernels").mkdir(exist_ok=True)
    (out / "weights").mkdir(exist_ok=True)
    # a rebuild into the same folder must not leave the last build's kernels or shards behind
    for stale in (*(out / "kernels").glob("*.wgsl"), *(out / "weights").glob("shard*.bin")):
        stale.unlink()

    kernels, kernel_index, shader_of = [], {}, {}
    call_sites, call_site_params = [], []
    for site_index, dispatch in enumerate(host.dispatches):
        if dispatch.program not in kernel_index:
            shader = emit_kernel(module.programs[dispatch.program])
            shader_of[dispatch.program] = shader
            kernel_index[dispatch.program] = len(kernels)
            file = f"kernels/{dispatch.program}.wgsl"
            (out / file).write_text(shader.source)
            kernels.append({
                "name": dispatch.program, "file": file, "entry_point": "main",
                "workgroup_size": [WORKGROUP_SIZE, 1, 1], "bindings": list(shader.bindings),
                "workgroup_storage_bytes": shader.workgroup_storage_bytes,
            })
        shader = shader_of[dispatch.program]
        values_by_name = dict(dispatch.size_var_values)
        values = (dispatch.element_count, *(values_by_name[f] for f in shader.params_fields[1:]))
        call_site_params.append(CallSiteParams(values, dispatch.element_count, dispatch.note))
        call_sites.append({
            "kernel": kernel_index[dispatch.program], "binding": dispatch.note,
            "params_offset": site_index * PARAMS_SLOT, "params_size": shader.params_size,
            "buffers": [{b.kind: b.index} for b in dispatch.buffers],
        })
    progress(f"emitted {len(kernels)} WGSL kernels for {len(call_sites)} call sites")

    wat = emit_host_wat(host, call_site_params, WORKGROUP_SIZE, source)
    (out / "host.wat").write_text(wat)
    (out / "host.wasm").write_bytes(assemble(wat))
    progress("assembled host.wasm")

    weights, shards = _write_weights(host, out)
    bounds_by_name = dict(host.bounds)
    storages = []
    for storage in host.storages:
        storages.append({
            "role": storage.role, "size": format_expr(storage.size),
            "size_at_bounds": upper_bound(storage.size, bounds_by_name),
        })
    manifest = {
        "format": FORMAT,
        "version": VERSION,
        "model": source,
        "inputs": [{"name": i.name, "dtype": i.dtype, "device_dtype": device_dtype(i.dtype), "shape": _shape_json(i.shape), "storage": i.storage} for i in host.inputs],
        "outputs": [{"name": o.name, "dtype": o.dtype, "device_dtype": device_dtype(o.dtype), "shape": _shape_json(o.shape) if o.shape is not None else None,
                     "ndim": o.ndim, "storage": o.storage} for o in host.outputs],
        "symbolic_vars": [{"name": name, "bound": bound} for name, bound in host.bounds],
        "storages": storages,
        "weights": weights,
        "shards": shards,
        "kernels": kernels,
        "call_sites": call_sites,
        "params_bytes": max(PARAMS_SLOT, len(call_sites) * PARAMS_SLOT),
        "errors": [{"code": code, "message": message} for code, message in host.error_messages],
        "max_rank": MAX_RANK,
        "read_slots": host.read_slots,
        "required_limits": _required_limits(kernels, storages, weights),
        "required_features": _required_features(kernels),
    }
    (out / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    if RUNTIME_JS.is_dir():
        shutil.copytree(RUNTIME_JS, out / "runtime", dirs_exist_ok=True)
    progress(f"wrote {out}/ ({len(kernels)} kernels, {sum(s['nbytes'] for s in shards)} bytes of weights)")
    return manifest


def emit_kernel(kernel) -> ShaderInfo:
    """WGSL for a tensor program (generated) or a library kernel (hand-written)."""
    from .library import LibraryKernel

    if isinstance(kernel, LibraryKernel):
        fields = ("element_count", *(v.name for v in kernel.size_vars))
        padded = len(fields) + (-len(fields)) % 4
        bindings = ("uniform", *("read-only-storage" for _ in kernel.inputs), "storage")
        return ShaderInfo(kernel.source, fields, 4 * padded, bindings)
    return emit_wgsl(kernel)


def _shape_json(shape) -> list:
    return [int(d.value) if hasattr(d, "value") else format_expr(d) for d in shape]


def _check_dtypes(host: HostFunction, programs: dict) -> None:
    """One error naming every tensor whose dtype has no GPU representation yet."""
    problems = [f"input '{i.name}' is {i.dtype}" for i in host.inputs if i.dtype not in SUPPORTED_DTYPES]
    problems += [f"output '{o.name}' is {o.dtype}" for o in host.outputs if o.dtype not in SUPPORTED_DTYPES]
    problems += [f"weight '{w.name}' is {w.data.dtype}" for w in host.weights if str(w.data.dtype) not in SUPPORTED_DTYPES]
    for dispatch in host.dispatches:
        kernel = programs[dispatch.program]
        for buffer in (*kernel.inputs, kernel.output):
            if buffer.dtype not in SUPPORTED_DTYPES:
                problems.append(f"a {buffer.dtype} tensor in '{dispatch.note}'")
    if problems:
        unique = list(dict.fromkeys(problems))
        raise UnsupportedModelError(
            "unsupported dtypes on the GPU (supported: " + ", ".join(SUPPORTED_DTYPES) + "): " + "; ".join(unique)
        )


def _write_weights(host: HostFunction, out: Path) -> tuple[list, list]:
    weights, shards = [], []
    chunks: list[bytes] = []
    size = 0

    def close_shard() -> None:
        nonlocal chunks, size
        if not chunks:
            return
        data = b"".join(chunks)
        file = f"weights/shard{len(shards)}.bin"
        (out / file).write_bytes(data)
        shards.append({"file": file, "nbytes": len(data), "sha256": hashlib.sha256(data).hexdigest()})
        chunks, size = [], 0

    for weight in host.weights:
        dtype = str(weight.data.dtype)
        raw = _device_array(weight.name, np.asarray(weight.data)).tobytes()
        padded = raw + b"\0" * ((-len(raw)) % 4)
        if size and size + len(padded) > SHARD_BYTES:
            close_shard()
        weights.append({
            "name": weight.name, "dtype": dtype, "device_dtype": device_dtype(dtype), "shape": [int(d) for d in weight.data.shape],
            "shard": len(shards), "offset": size, "nbytes": len(raw),
        })
        chunks.append(padded)
        size += len(padded)
    close_shard()
    return weights, shards


def _device_array(name: str, data: np.ndarray) -> np.ndarray:
    """A weight's values as the GPU holds them (little endian): int64 -> int32 (range-checked),
    int8/int16 -> int32, uint8/uint16/bool -> uint32, float16/float64 -> float32 (rounded)."""
    dtype = str(data.dtype)
    if dtype == "int64":
        info = np.iinfo(np.int32)
        outside = (data < info.min) | (data > info.max)
        if outside.any():
            value = int(data[outside].flat[0])
            raise UnsupportedModelError(
                f"weight '{name}' (int64) holds {value}, outside the int32 range the GPU uses for int64 tensors"
            )
    target = np.dtype(device_dtype(dtype)).newbyteorder("<")
    with np.errstate(over="ignore"):  # a float64 beyond float32 becomes inf, as on upload
        return np.ascontiguousarray(data.astype(target))


def _required_features(kernels: list) -> list[str]:
    """The WebGPU features (``"shader-f16"``, ...) the kernels need; runtimes refuse to load
    a bundle on a device without them.  No kernel uses an optional feature yet."""
    return []


def _required_limits(kernels: list, storages: list, weights: list) -> dict:
    """The WebGPU limits a device needs to load the bundle.  With every storage sized at
    the bounds, the buffer size limits are the largest storage at the bounds or weight;
    otherwise storages grow per run and the runtimes check each run's sizes (and the
    weights at load) against the device's limits themselves."""
    limits = {
        "maxStorageBuffersPerShaderStage": max((len(k["bindings"]) - 1 for k in kernels), default=0),
        "maxComputeInvocationsPerWorkgroup": max((k["workgroup_size"][0] for k in kernels), default=0),
        "maxComputeWorkgroupSizeX": max((k["workgroup_size"][0] for k in kernels), default=0),
        "maxComputeWorkgroupStorageSize": max((k.get("workgroup_storage_bytes", 0) for k in kernels), default=0),
    }
    sizes = [s["size_at_bounds"] for s in storages] + [w["nbytes"] for w in weights]
    if all(s is not None for s in sizes) and sizes:
        limits["maxStorageBufferBindingSize"] = max(sizes)
        limits["maxBufferSize"] = max(sizes)
    return limits


def describe(manifest_or_dir) -> dict:
    """The manifest of a bundle folder (for ``relaxweb inspect``)."""
    path = Path(manifest_or_dir)
    manifest_path = path / "manifest.json" if path.is_dir() else path
    if not manifest_path.exists():
        raise RelaxwebError(f"{path}: not a bundle (no manifest.json)")
    return json.loads(manifest_path.read_text())
