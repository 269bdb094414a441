"""write_bundle: compiled module -> dist/ folder (see docs/bundle-format.md for what it holds).

The module comes from the compile driver (``compiler.py``), its ``main`` a host function.
Steps: emit one WGSL shader per kernel the host dispatches, the same kernels as one
WebAssembly module (``kernels.wasm``, ``relaxweb/cpu``) and the host module for the host
function, then write the manifest (with the entries of the dtype table its tensors use,
``relaxweb/ir/dtype.py``), the weights (in shards with checksums, in their device dtypes), the
tokenizer's files (``tokenizer/``) and a copy of the browser runtime (``runtime``: see
:data:`RUNTIME_CHOICES`), with the browser libraries a Hugging Face tokenizer needs
(``runtime/vendor/``: :data:`BROWSER_LIBRARIES`).  The text forms of the two WebAssembly
modules (``host.wat``, ``kernels.wat``: for reading, no runtime loads them; on DistilBERT
kernels.wat outweighs the weights) are written only with ``debug``.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import shutil
from pathlib import Path
from typing import Callable, Mapping

import numpy as np

from .cpu.kernels import KernelsWasm, emit_kernels_wasm
from .cpu.schedules.matmul_packed import PrepackedFactor
from .errors import RelaxwebError, UnsupportedModelError, shortened, shown
from .ir.attention_sites import attention_sites
from .ir.cost import MAX_TREE_DEPTH, MAX_TREE_NODES, expression_tree, program_cost, tree_depth, tree_size
from .ir.dtype import GPU_DTYPES, dtype_info
from .ir.error_sites import error_sites, reports_errors
from .ir.host import SEQUENCE_CAPACITY, BufferRef, HostDispatch, HostFunction, HostInput, HostOutput
from .ir.launch import BINDING_PART_BYTES, MAX_STORAGE_BINDINGS, WEBGPU_DEFAULT_LIMITS, binding_parts, smallest_part_bytes
from .ir.kv_pool import KV_POOL
from .ir.library_kernel import WEBGPU_CPU, WEBGPU_F16, LibraryKernel
from .ir.module import IRModule
from .ir.schedule import WORKGROUP_SIZE, WebGpuSchedule
from .ir.symbolic import IntImm, format_expr, free_vars, product, simplify, substitute, upper_bound
from .ir.target_schedules import schedules_of
from .ir.tir import TensorProgram
from .ir.params_block import PARAMS_SLOT
from .wasm import MAX_RANK, CallSiteParams, assemble, emit_host_wat
from .wgsl import ShaderInfo, emit_wgsl
from .wgsl.library import emit_library_kernel, library_kernel_wgsl
from .wgsl.ragged import ragged_source

FORMAT = "relaxweb-bundle"
# 2: the manifest's ``dtypes`` table replaced each tensor's ``device_dtype``.
# 3: each ``dtypes`` entry says its form in kernels.wasm (``wasm_dtype``, ``wasm_bytes``: int64 is int64 there).
VERSION = 3
SHARD_BYTES = 32 * 1024 * 1024
RUNTIME_JS = Path(__file__).parent / "runtime_js"
KERNELS_WASM = "kernels.wasm"  # every kernel as WebAssembly SIMD functions (docs/bundle-format.md, "kernels.wasm")
KERNELS_WAT = "kernels.wat"  # its text, for reading (runtimes do not load it)
HOST_WAT = "host.wat"  # host.wasm's text, for reading (runtimes do not load it)
#: Files written only by a debug build (``relaxweb build --debug``): text for people, not pages.
DEBUG_FILES = (HOST_WAT, KERNELS_WAT)
#: What a build puts in the bundle's ``runtime/`` folder (``relaxweb build --runtime``).
RUNTIME_CHOICES = {
    "copy": "a copy of the browser runtime: the folder is all a page needs (the default)",
    "none": "nothing: the page imports the runtime from the npm package 'relaxweb' (of the same version)",
}
TOKENIZER_FOLDER = "tokenizer"  # a Hugging Face tokenizer's files, as its publisher wrote them
#: The npm packages the browser runtime imports for a Hugging Face tokenizer (by their bare
#: names where the page resolves them: a bundler, node, an import map), each as (package, its
#: self-contained ES module, the name of its copy in ``runtime/vendor/``, the runtime's fallback
#: where bare names do not resolve: runtime_js/libraries.js lists the same names).
BROWSER_LIBRARIES = (
    ("@huggingface/tokenizers", "dist/tokenizers.min.mjs", "tokenizers.mjs"),
    ("@huggingface/jinja", "dist/index.js", "jinja.mjs"),
)
VENDOR_FOLDER = "vendor"

Progress = Callable[[str], None]
#: Called as a long step goes: (the step, units done, units in all); writing the weights counts bytes.
Advance = Callable[[str, int, int], None]



def _symbolic_var(name: str, bound: int | None, as_written: dict[str, str]) -> dict:
    """A symbolic var's manifest entry; ``model_name`` when the model wrote it otherwise."""
    entry: dict = {"name": name, "bound": bound}
    if name in as_written:
        entry["model_name"] = as_written[name]
    return entry


def write_bundle(module: IRModule, out_dir: str | Path, source: str, progress: Progress = lambda _: None, *,
                 split_bytes: int = BINDING_PART_BYTES, tokenizer: dict | None = None,
                 tokenizer_files: Mapping[str, bytes] | None = None, debug: bool = False,
                 runtime: str = "copy", advance: Advance | None = None,
                 node_names: Mapping[str, str] | None = None) -> dict:
    """Write the bundle of a compiled module (its ``main`` a HostFunction); returns the manifest.

    ``source`` names the model in the manifest and in the generated code's comments;
    ``tokenizer`` (a checked entry, ``relaxweb/tokenizer/``) goes into the manifest as is, and
    ``tokenizer_files`` (checked names -> bytes) into ``tokenizer/``; the module's attention
    sites go into its ``attention`` entry (:func:`attention_entry`, ``node_names`` naming the
    model's nodes that wrote their values).
    ``debug`` adds the :data:`DEBUG_FILES`; ``runtime`` is one of :data:`RUNTIME_CHOICES`.
    ``progress`` gets a line per step, ``advance`` the bytes of weights written so far.  A
    weight of more than ``split_bytes`` device bytes is bound to the kernels that read it as
    several parts (``relaxweb/ir/launch.binding_parts``; docs/bundle-format.md, "Weights in
    parts"): those kernels get a shader of their own that reads the parts.
    """
    host = module.main
    assert isinstance(host, HostFunction)
    if runtime not in RUNTIME_CHOICES:
        raise RelaxwebError(f"runtime {runtime!r} is not one of {', '.join(RUNTIME_CHOICES)}")
    _check_dtypes(host, module.programs)
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / "kernels").mkdir(exist_ok=True)
    (out / "weights").mkdir(exist_ok=True)
    # a rebuild into the same folder must not leave the last build's kernels or shards behind
    for stale in (*(out / "kernels").glob("*.wgsl"), *(out / "weights").glob("shard*.bin"),
                  *(out / name for name in (KERNELS_WASM, *DEBUG_FILES) if (out / name).exists())):
        stale.unlink()

    weight_parts = [binding_parts(_weight_device_bytes(w.data), split_bytes) for w in host.weights]
    kernels, kernel_index, shader_of = [], {}, {}
    call_sites, call_site_params = [], []
    for site_index, dispatch in enumerate(host.dispatches):
        program = module.programs[dispatch.program]
        parts = _split_inputs(dispatch, program, host, weight_parts, split_bytes)
        key = (dispatch.program, tuple(parts.items()))
        if key not in kernel_index:
            name = _kernel_name(dispatch.program, parts, {*module.programs, *(k["name"] for k in kernels)})
            shader = emit_kernel(program, parts)
            shader_of[key] = shader
            kernel_index[key] = len(kernels)
            file = f"kernels/{name}.wgsl"
            (out / file).write_text(shader.source)
            variant = _cpu_variant_entry(program, name, parts, shader, out)
            half = _f16_variant_entry(program, name, parts, shader, out)
            batch = _batch_variant_entries(name, shader.source, variant, out)
            kernels.append({
                "name": name, "file": file, **variant, **half, **batch, "entry_point": "main",
                "workgroup_size": [WORKGROUP_SIZE, 1, 1], "bindings": list(shader.bindings),
                "workgroup_storage_bytes": shader.workgroup_storage_bytes,
                "params": list(shader.params.fields),
                **_cost_entry(program, shader.params.fields),
                **_elements_entry(program, shader.params.fields),
            })
        shader = shader_of[key]
        values_by_name = dict(dispatch.size_var_values)
        values = (dispatch.element_count, *(values_by_name[v] for v in shader.params.size_vars))
        call_site_params.append(CallSiteParams(values, dispatch.element_count, dispatch.note))
        call_sites.append({
            "kernel": kernel_index[key], "binding": dispatch.note,
            "params_offset": site_index * PARAMS_SLOT, "params_size": shader.params.size,
            "buffers": [*(entry for b in dispatch.buffers for entry in _buffer_entries(b, weight_parts)),
                        *([STATUS_ENTRY] if reports_errors(program) else [])],
        })
    progress(f"emitted {len(kernels)} WGSL kernels for {len(call_sites)} call sites")
    wasm_entry = _write_kernels_wasm(module, [(program, dict(parts)) for program, parts in kernel_index], source, out,
                                     progress, debug, [site["kernel"] for site in call_sites])

    wat = emit_host_wat(host, call_site_params, WORKGROUP_SIZE, source)
    if debug:
        (out / HOST_WAT).write_text(wat)
    (out / "host.wasm").write_bytes(assemble(wat))
    progress("assembled host.wasm")

    weight_bytes = sum(_padded(_weight_shard_bytes(w.data)) for w in host.weights)
    if weight_bytes:
        count = len(host.weights)
        progress(f"writing the weights: {count} tensor{'s' if count != 1 else ''}, {_megabytes(weight_bytes)}")
    weights, shards = _write_weights(host, out, weight_parts, (lambda done: None) if advance is None else
                                     (lambda done: advance("writing weights", done, weight_bytes)))
    bounds_by_name = dict(host.bounds)
    storages = []
    for storage, holds in zip(host.storages, storage_holders(module, node_names or {})):
        storages.append({
            "role": storage.role, "size": format_expr(storage.size),
            "size_at_bounds": upper_bound(storage.size, bounds_by_name), "holds": holds,
        })
    manifest = {
        "format": FORMAT,
        "version": VERSION,
        "model": source,
        "dtypes": _dtype_table(host),
        "inputs": [_sequence_entry(i, host) if i.sequence is not None else
                   {"name": i.name, "dtype": i.dtype, "shape": _shape_json(i.shape), "storage": i.storage}
                   for i in host.inputs],
        "outputs": [_sequence_entry(o, host) if o.sequence is not None else
                    {"name": o.name, "dtype": o.dtype, "shape": _shape_json(o.shape) if o.shape is not None else None,
                     "ndim": o.ndim, "storage": o.storage} for o in host.outputs],
        "symbolic_vars": [_symbolic_var(name, bound, module.attrs.get("size_var_names", {})) for name, bound in host.bounds],
        "storages": storages,
        "weights": weights,
        "shards": shards,
        "kernels": kernels,
        "call_sites": call_sites,
        "params_bytes": max(PARAMS_SLOT, len(call_sites) * PARAMS_SLOT),
        "errors": [{"code": code, "message": message} for code, message in host.error_messages],
        "max_rank": MAX_RANK,
        "read_slots": host.read_slots,
        "sequence_capacity": SEQUENCE_CAPACITY,
        "caches": [{"input": c.input, "output": c.output, "axis": c.axis, "capacity": c.capacity, "storage": c.storage}
                   for c in host.caches],
        "required_limits": _required_limits(kernels, storages, [(_weight_device_bytes(h.data), w.get("parts", 1))
                                                                for h, w in zip(host.weights, weights)]),
        "required_features": _required_features(kernels),
        "wasm": wasm_entry,
    }
    webgpu_problem = _webgpu_weight_problem(host)
    if webgpu_problem is not None:
        manifest["webgpu"] = {"unavailable": webgpu_problem}
    if tokenizer is not None:
        manifest["tokenizer"] = tokenizer
    attention = attention_entry(module, node_names or {})
    if attention:
        manifest["attention"] = attention
    if error_sites(module.attrs):
        manifest["run_errors"] = _run_errors_entry(module)
    if KV_POOL in module.attrs:
        manifest["kv_pool"] = _kv_pool_entry(module.attrs[KV_POOL], host)
    if tokenizer_files:
        (out / TOKENIZER_FOLDER).mkdir(exist_ok=True)
        for name, data in tokenizer_files.items():
            (out / TOKENIZER_FOLDER / name).write_bytes(data)
    (out / "manifest.json").write_text(json.dumps(manifest, indent=2) + "\n")
    if runtime == "copy" and RUNTIME_JS.is_dir():
        shutil.copytree(RUNTIME_JS, out / "runtime", dirs_exist_ok=True)
        if tokenizer is not None and tokenizer["kind"] == "huggingface":
            _copy_browser_libraries(out / "runtime" / VENDOR_FOLDER, progress)
    progress(f"wrote the bundle: {len(kernels)} kernels, {sum(s['nbytes'] for s in shards)} bytes of weights")
    return manifest


def node_modules_folders() -> list[Path]:
    """Where the build looks for the npm packages of :data:`BROWSER_LIBRARIES`: the
    ``node_modules`` of the working directory and of each folder above it, then the one of
    the relaxweb checkout (``npm install`` in the repository installs them)."""
    here = Path.cwd().resolve()
    folders = [folder / "node_modules" for folder in (here, *here.parents)]
    checkout = Path(__file__).resolve().parent.parent / "node_modules"
    return list(dict.fromkeys([*folders, checkout]))


def _copy_browser_libraries(vendor: Path, progress: Progress) -> None:
    """Copy each browser library (its ES module and its license) from the first node_modules
    that has it into ``runtime/vendor/``, for pages that cannot import it by its bare name;
    a note for each one found nowhere (the page must then resolve it, or the browser runtime
    says what is missing when it loads the bundle)."""
    missing = []
    for package, module_file, copy_name in BROWSER_LIBRARIES:
        found = next((folder / package for folder in node_modules_folders()
                      if (folder / package / module_file).is_file()), None)
        if found is None:
            missing.append(package)
            continue
        vendor.mkdir(exist_ok=True)
        shutil.copyfile(found / module_file, vendor / copy_name)
        if (found / "LICENSE").is_file():
            shutil.copyfile(found / "LICENSE", vendor / f"{os.path.splitext(copy_name)[0]}.LICENSE")
    if missing:
        progress(f"note: {', '.join(missing)} not found in node_modules (npm install them where you build): the "
                 "bundle's page must import them by name (a bundler or an import map), or the browser runtime "
                 "cannot tokenize; the Python runtime is not affected")


#: The manifest's longest name or reason (its schema's ``max_length``) and most attention sites.
MAX_NAME_CHARACTERS = 4096
MAX_ATTENTION_SITES = 4096


def attention_entry(module: IRModule, node_names: Mapping[str, str]) -> list[dict]:
    """The manifest's ``attention`` entry: each attention site ``fuse_attention`` recorded
    (``relaxweb/ir/attention_sites.py``), ``status`` fused or not (with its ``reason``), and
    its ``scores``, ``softmax`` and ``output`` as ``{"node": name}``, the model's node that
    wrote the value (``node_names``: by the value's name in the module), or ``{"value":
    name}``, the value's own name; ``scores`` null when none.  Names and reasons are data
    from the model, cut to the schema's length; the first MAX_ATTENTION_SITES sites."""
    def cut(text: str) -> str:
        return shortened(text, MAX_NAME_CHARACTERS)

    def named(value: str | None) -> dict | None:
        if value is None:
            return None
        return {"node": cut(node_names[value])} if value in node_names else {"value": cut(value)}

    entry = []
    for site in attention_sites(module.attrs)[:MAX_ATTENTION_SITES]:
        entry.append({"status": "fused" if site.fused else "not fused", **({} if site.fused else {"reason": cut(site.reason)}),
                      "scores": named(site.scores), "softmax": named(site.softmax), "output": named(site.output)})
    return entry


def _megabytes(count: int) -> str:
    return f"{count / 1e6:.1f} MB" if count >= 100_000 else f"{count} bytes"


def _write_kernels_wasm(module: IRModule, kernel_order: list, source: str, out: Path, progress: Progress,
                        debug: bool, site_kernels: list[int]) -> dict:
    """Write ``kernels.wasm`` (and with ``debug`` its text ``kernels.wat``) with every kernel in manifest
    order, their multiply-adds with relaxed SIMD where the runtime's engine has it
    (``cpu/relaxed_simd.py``); the manifest's ``wasm`` entry.  A bundle whose kernels cannot all run on the CPU
    (a library kernel without a WebAssembly version) gets none, and the entry says why: a
    note, never a failed build."""
    kernels_wasm = emit_kernels_wasm(module, kernel_order, source)
    if not isinstance(kernels_wasm, KernelsWasm):
        progress(f"note: no {KERNELS_WASM} (no WebAssembly backend): {kernels_wasm.reason}")
        return {"unavailable": kernels_wasm.reason}
    if debug:
        (out / KERNELS_WAT).write_text(kernels_wasm.wat)
    (out / KERNELS_WASM).write_bytes(kernels_wasm.wasm)
    entry = {"file": KERNELS_WASM, "scratch_bytes": kernels_wasm.scratch_bytes}
    if kernels_wasm.relaxed_madd_sites:  # lowered to plain SIMD128 at load where the engine lacks relaxed SIMD
        entry["relaxed_madd_sites"] = kernels_wasm.relaxed_madd_sites
    regions = _prepacked_regions(module, kernels_wasm.prepacked, site_kernels)
    if regions:
        entry["prepacked"] = regions
        total = sum(region["bytes"] for region in regions)
        progress(f"{len(regions)} call sites read their weight prepacked on the CPU ({_megabytes(total)} at load)")
    progress(f"assembled {KERNELS_WASM} ({len(kernels_wasm.wasm)} bytes)")
    return entry


def _prepacked_regions(module: IRModule, prepacked: Mapping[int, PrepackedFactor], site_kernels: list[int]) -> list[dict]:
    """The manifest's ``wasm.prepacked``: per call site whose kernel can read its second factor
    prepacked (``prepacked``, by kernel index) and binds a weight there, the bytes of its
    region (header and panels: ``PrepackedFactor.region_bytes``) and the params block its
    ``kK_pack`` runs on at load (element_count 0, then the program's size variables: the call
    site's constants, 1 where a variable is not one; a call site where one the panels depend on
    is not constant gets no region)."""
    host = module.main
    assert isinstance(host, HostFunction)
    regions = []
    for site, (dispatch, kernel) in enumerate(zip(host.dispatches, site_kernels)):
        factor = prepacked.get(kernel)
        if factor is None:
            continue
        program = module.programs[dispatch.program]
        position = [buffer.name for buffer in program.inputs].index(factor.buffer)
        bound = dispatch.buffers[position]
        if bound.kind != "weight":
            continue
        size = factor.region_bytes(tuple(host.weights[bound.index].data.shape))
        values = {name: simplify(value) for name, value in dispatch.size_var_values}
        constants = {var.name: values[var.name].value for var in program.size_vars
                     if isinstance(values.get(var.name), IntImm)}
        if size is not None and factor.size_vars <= constants.keys():
            params = [0, *(constants.get(var.name, 1) for var in program.size_vars)]
            regions.append({"call_site": site, "bytes": size, "params": params})
    return regions


def _sequence_entry(value: HostInput | HostOutput, host: HostFunction) -> dict:
    """A sequence input's or output's entry (``kind`` ``optional_sequence`` when it may be
    none): its elements' dtype and rank (-1: any), its
    arena storage and its table in the host module's memory (``shape``: [] for an input,
    null for an output: a sequence has none of its own)."""
    if isinstance(value, HostOutput):
        return {"name": value.name, "dtype": value.dtype, "shape": None, "kind": _sequence_kind(value),
                "element_ndim": value.ndim, "storage": value.storage, "sequence": value.sequence}
    return {"name": value.name, "dtype": value.dtype, "shape": [], "kind": _sequence_kind(value),
            "element_ndim": host.sequences[value.sequence].ndim, "storage": value.storage, "sequence": value.sequence}


def _sequence_kind(value: HostInput | HostOutput) -> str:
    return "optional_sequence" if value.optional else "sequence"


def _cpu_variant_entry(kernel, name: str, parts: dict[str, int], shader: ShaderInfo, out: Path) -> dict:
    """``{"cpu_file": ...}`` when the kernel has a shader for CPU adapters (a tensor
    program's ``schedule.webgpu_cpu``, a library kernel's ``webgpu_cpu`` target), written next
    to its own; ``{}`` otherwise."""
    if isinstance(kernel, LibraryKernel):  # its CPU form has the same bindings and params
        source = library_kernel_wgsl(kernel, WEBGPU_CPU)
        if source is None:
            return {}
        file = f"kernels/{name}.cpu.wgsl"
        (out / file).write_text(source)
        return {"cpu_file": file}
    source = _second_shader(kernel, parts, schedules_of(kernel).webgpu_cpu, shader)
    if not source:
        return {}
    file = f"kernels/{name}.cpu.wgsl"
    (out / file).write_text(source)
    return {"cpu_file": file}


def _second_shader(program: TensorProgram, parts: dict[str, int], schedule: WebGpuSchedule | None,
                   shader: ShaderInfo) -> str:
    """The WGSL of a tensor program's second shader under ``schedule`` (one of its
    ``TargetSchedules``), ``""`` when it has none; it keeps the kernel's params and bindings."""
    if schedule is None:
        return ""
    second = emit_wgsl(program, parts, schedule)
    if (second.params, second.bindings) != (shader.params, shader.bindings):
        raise AssertionError(f"{program.name}: the {schedule.kind} shader must keep the kernel's params and bindings")
    return second.source


def _batch_variant_entries(name: str, source: str, cpu_entry: dict, out: Path) -> dict:
    """``{"batch_file": ..., "batch_cpu_file": ...}``: the ragged forms (``wgsl/ragged.py``)
    of the kernel's shader and of its CPU variant, for batches; ``{}`` when the kernel has
    none (a runtime then runs a batch instance by instance)."""
    entries = {}
    sources = {"batch_file": (source, f"kernels/{name}.batch.wgsl")}
    if "cpu_file" in cpu_entry:
        sources["batch_cpu_file"] = ((out / cpu_entry["cpu_file"]).read_text(), f"kernels/{name}.cpu.batch.wgsl")
    for key, (text, file) in sources.items():
        ragged = ragged_source(text, f"{file.removesuffix('.batch.wgsl')}.wgsl")
        if ragged is None:
            return {}
        (out / file).write_text(ragged)
        entries[key] = file
    return entries


def _f16_variant_entry(kernel, name: str, parts: dict[str, int], shader: ShaderInfo, out: Path) -> dict:
    """``{"f16_file": ...}`` when the kernel has a shader for adapters with ``shader-f16`` (a
    tensor program's ``schedule.webgpu_f16``, a library kernel's ``webgpu_f16`` target), written
    next to its own; ``{}`` otherwise.  The bundle does not require the feature: a runtime
    compiles these only where the adapter has it."""
    # a library kernel's f16 form has the same bindings and params
    if isinstance(kernel, LibraryKernel):
        source = library_kernel_wgsl(kernel, WEBGPU_F16) or ""
    else:
        source = _second_shader(kernel, parts, schedules_of(kernel).webgpu_f16, shader)
    if not source:
        return {}
    file = f"kernels/{name}.f16.wgsl"
    (out / file).write_text(source)
    return {"f16_file": file}


def emit_kernel(kernel, parts: dict[str, int] | None = None) -> ShaderInfo:
    """WGSL for a tensor program (generated) or a library kernel (hand-written); ``parts``:
    the program's inputs bound as several parts."""
    if isinstance(kernel, LibraryKernel):
        return emit_library_kernel(kernel)
    return emit_wgsl(kernel, parts)


def _weight_device_bytes(data: np.ndarray) -> int:
    return data.size * dtype_info(str(data.dtype)).device_bytes


def _weight_shard_bytes(data: np.ndarray) -> int:
    """The bytes of a weight in its shard (:func:`_shard_array`: its wasm form)."""
    return data.size * dtype_info(str(data.dtype)).wasm_bytes


def _split_inputs(dispatch: HostDispatch, kernel, host: HostFunction, weight_parts: list[int],
                  split_bytes: int) -> dict[str, int]:
    """``{input buffer name: parts}`` for the kernel's inputs bound to weights in parts.  A
    hand-written library kernel cannot read one, and a kernel has at most 8 storage bindings,
    the run status of a kernel that checks the run's data counted (a weight above 7 x 128 MiB
    cannot be bound): errors naming the weights."""
    parts = {}
    for position, buffer in enumerate(dispatch.buffers[:-1]):
        if buffer.kind == "weight" and weight_parts[buffer.index] > 1:
            weight = host.weights[buffer.index]
            if isinstance(kernel, LibraryKernel):
                raise UnsupportedModelError(
                    f"weight '{weight.name}' ({_weight_device_bytes(weight.data)} bytes) is above one WebGPU binding "
                    f"and would be bound in {weight_parts[buffer.index]} parts, but '{dispatch.note}' reads it with "
                    f"the hand-written kernel {kernel.name}, which reads whole tensors only"
                )
            parts[kernel.inputs[position].name] = weight_parts[buffer.index]
    bindings = len(dispatch.buffers) + sum(count - 1 for count in parts.values()) + reports_errors(kernel)
    if bindings > MAX_STORAGE_BINDINGS and not parts:
        raise UnsupportedModelError(
            f"'{dispatch.note}': its kernel would need {bindings} storage bindings, above WebGPU's default of "
            f"{MAX_STORAGE_BINDINGS}")
    if bindings > MAX_STORAGE_BINDINGS:
        split = ", ".join(f"'{host.weights[b.index].name}' ({_weight_device_bytes(host.weights[b.index].data)} bytes) in "
                          f"{weight_parts[b.index]} parts" for b in dispatch.buffers if b.kind == "weight"
                          and weight_parts[b.index] > 1)
        raise UnsupportedModelError(
            f"'{dispatch.note}' reads {split}: its kernel would need {bindings} storage bindings, above WebGPU's "
            f"default of {MAX_STORAGE_BINDINGS} (a weight is bound in parts of at most {split_bytes} bytes)"
        )
    return parts


def _kernel_name(program: str, parts: dict[str, int], taken: set[str]) -> str:
    """The kernel's name (and file name): its program's, or for a shader reading some input
    in parts that with ``_parts`` (and a number when ``taken`` has it)."""
    if not parts:
        return program
    name, number = f"{program}_parts", 1
    while name in taken:
        number += 1
        name = f"{program}_parts{number}"
    return name


def _kv_pool_entry(layout: Mapping, host) -> dict:
    """The manifest's ``kv_pool``: a paged KV cache's layout (``passes/page_kv_caches.py``): pages
    per pool, positions per page, pages per sequence, the longest sequence (``capacity``) and
    the index of the page table input."""
    names = [entry.name for entry in host.inputs]
    return {"pages": layout["pages"], "page_size": layout["page_size"],
            "pages_per_sequence": layout["pages_per_sequence"], "capacity": layout["capacity"],
            "page_table": names.index(layout["page_table"])}


def _run_errors_entry(module: IRModule) -> list[dict]:
    """The manifest's ``run_errors``: the module's error sites in order (site ``k`` is entry
    ``k - 1``), the model's node names and op types cut to the manifest's longest name."""
    return [{"node": shortened(site.node, MAX_NAME_CHARACTERS), "op": shortened(site.op, MAX_NAME_CHARACTERS),
             "message": site.message} for site in error_sites(module.attrs)]


#: A call site's entry for the run status, the last binding of a kernel that checks the run's
#: data (``relaxweb/ir/error_sites.py``).
STATUS_ENTRY = {"status": 0}


def _buffer_entries(buffer: BufferRef, weight_parts: list[int]) -> list[dict]:
    """A call site's entries for one buffer: ``{"storage": i}``, ``{"weight": j}``, or one
    ``{"weight_part": [j, k]}`` per part of a weight in parts."""
    if buffer.kind == "weight" and weight_parts[buffer.index] > 1:
        return [{"weight_part": [buffer.index, part]} for part in range(weight_parts[buffer.index])]
    return [{buffer.kind: buffer.index}]


def _cost_entry(kernel, fields: tuple[str, ...]) -> dict:
    """``{"cost": {"flops": tree, "bytes": tree}}``: one call's cost (``ir/cost.py``) as
    expression trees over the kernel's params fields, for profiles; ``{}`` for a library
    kernel (hand-written: no compute definition to count) or a tree past the manifest's limits."""
    if isinstance(kernel, LibraryKernel):
        return {}
    cost = program_cost(kernel)
    trees = {"flops": expression_tree(cost.flops), "bytes": expression_tree(cost.bytes)}
    for expr, tree in zip((cost.flops, cost.bytes), trees.values()):
        if tree_depth(tree) > MAX_TREE_DEPTH or tree_size(tree) > MAX_TREE_NODES:
            return {}
        if any(var.name not in fields for var in free_vars(expr)):
            return {}
    return {"cost": trees}


def _elements_entry(kernel, fields: tuple[str, ...]) -> dict:
    """``{"elements": tree}``: the output elements one call computes, as an expression tree
    over the kernel's params fields (what a batch's work is counted in); ``{}`` where a size
    of the output is not among the fields or the tree is past the manifest's limits."""
    elements = product(kernel.output.shape)
    tree = expression_tree(elements)
    if tree_depth(tree) > MAX_TREE_DEPTH or tree_size(tree) > MAX_TREE_NODES:
        return {}
    if any(var.name not in fields for var in free_vars(elements)):
        return {}
    return {"elements": tree}


def _shape_json(shape) -> list:
    return [int(d.value) if hasattr(d, "value") else format_expr(d) for d in shape]


def _check_dtypes(host: HostFunction, programs: dict) -> None:
    """One error naming every tensor whose dtype has no GPU representation yet."""
    problems = [f"input '{i.name}' is {i.dtype}" for i in host.inputs if i.dtype not in GPU_DTYPES]
    problems += [f"output '{o.name}' is {o.dtype}" for o in host.outputs if o.dtype not in GPU_DTYPES]
    problems += [f"weight '{w.name}' is {w.data.dtype}" for w in host.weights if str(w.data.dtype) not in GPU_DTYPES]
    for dispatch in host.dispatches:
        kernel = programs[dispatch.program]
        for buffer in (*kernel.inputs, kernel.output):
            if buffer.dtype not in GPU_DTYPES:
                problems.append(f"a {buffer.dtype} tensor in '{dispatch.note}'")
    if problems:
        unique = list(dict.fromkeys(problems))
        raise UnsupportedModelError(
            "unsupported dtypes on the GPU (supported: " + ", ".join(GPU_DTYPES) + "): " + "; ".join(unique)
        )


def _dtype_table(host: HostFunction) -> dict:
    """The manifest's ``dtypes``: the dtype table's entry of each dtype an input, output or
    weight has (the runtimes convert by them)."""
    used = [t.dtype for t in (*host.inputs, *host.outputs)] + [str(w.data.dtype) for w in host.weights]
    return {dtype: dtype_info(dtype).manifest_entry() for dtype in sorted(set(used))}


def _padded(nbytes: int) -> int:
    """A weight's bytes in its shard: its device bytes, padded to a multiple of 4."""
    return nbytes + (-nbytes) % 4


def _write_weights(host: HostFunction, out: Path, weight_parts: list[int],
                   written: Callable[[int], None]) -> tuple[list, list]:
    """Write the weights into shards of about :data:`SHARD_BYTES` (a larger weight alone),
    calling ``written`` with the bytes of the shards written so far after each shard; returns
    the manifest's ``weights`` and ``shards``."""
    weights, shards = [], []
    done = 0
    chunks: list[bytes] = []
    size = 0
    written(done)

    def close_shard() -> None:
        nonlocal chunks, size, done
        if not chunks:
            return
        data = b"".join(chunks)
        file = f"weights/shard{len(shards)}.bin"
        (out / file).write_bytes(data)
        shards.append({"file": file, "nbytes": len(data), "sha256": hashlib.sha256(data).hexdigest()})
        chunks, size = [], 0
        done += len(data)
        written(done)

    for weight, parts in zip(host.weights, weight_parts):
        dtype = str(weight.data.dtype)
        raw = _shard_array(np.asarray(weight.data)).tobytes()
        padded = raw + b"\0" * (_padded(len(raw)) - len(raw))
        if size and size + len(padded) > SHARD_BYTES:
            close_shard()
        weights.append({
            "name": weight.name, "dtype": dtype, "shape": [int(d) for d in weight.data.shape],
            "shard": len(shards), "offset": size, "nbytes": len(raw), **({"parts": parts} if parts > 1 else {}),
        })
        chunks.append(padded)
        size += len(padded)
    close_shard()
    return weights, shards


def _shard_array(data: np.ndarray) -> np.ndarray:
    """A weight's values as the shards hold them (little endian, in its wasm dtype: as
    kernels.wasm holds it, ``ir/dtype.py``): int64 stays int64 (the WebGPU runtimes narrow it
    to int32 at load: :func:`_webgpu_weight_problem`), int8/int16 -> int32, uint8/uint16/bool
    -> uint32, float16/float64 -> float32 (rounded)."""
    info = dtype_info(str(data.dtype))
    target = np.dtype(info.wasm_dtype).newbyteorder("<")
    with np.errstate(over="ignore"):  # a float64 beyond float32 becomes inf, as on upload
        return np.ascontiguousarray(data.astype(target))


def _webgpu_weight_problem(host: HostFunction) -> str | None:
    """Why WebGPU cannot hold the bundle's weights, or None: an int64 weight holding a value
    outside int32, the range the GPU holds int64 tensors in (kernels.wasm holds it exactly: the
    manifest's ``webgpu.unavailable``, the build's warning, the runtimes' refusal of WebGPU)."""
    for weight in host.weights:
        info = dtype_info(str(weight.data.dtype))
        if not (info.is_integer and info.narrowed_on_device) or weight.data.size == 0:
            continue
        limits = np.iinfo(np.dtype(info.device.name))
        data = np.asarray(weight.data)
        outside = (data < limits.min) | (data > limits.max)
        if outside.any():
            return (f"weight '{shortened(shown(weight.name), MAX_NAME_CHARACTERS)}' ({info.name}) holds "
                    f"{int(data[outside].flat[0])}, outside the {info.device.name} range the GPU holds {info.name} "
                    "tensors in")
    return None


def _required_features(kernels: list) -> list[str]:
    """The WebGPU features (``"shader-f16"``, ...) the kernels need; runtimes refuse to load
    a bundle on a device without them.  No kernel uses an optional feature yet."""
    return []


def _required_limits(kernels: list, storages: list, weights: list[tuple[int, int]]) -> dict:
    """The WebGPU limits a device needs to load the bundle.  With every storage sized at
    the bounds, the buffer size limits are the largest storage at the bounds or weight (each
    weight given as its bytes on the GPU and its parts);
    otherwise storages grow per run and the runtimes check each run's sizes (and the
    weights at load) against the device's limits themselves."""
    limits = {
        "maxStorageBuffersPerShaderStage": max((len(k["bindings"]) - 1 for k in kernels), default=0),
        "maxComputeInvocationsPerWorkgroup": max((k["workgroup_size"][0] for k in kernels), default=0),
        "maxComputeWorkgroupSizeX": max((k["workgroup_size"][0] for k in kernels), default=0),
        "maxComputeWorkgroupStorageSize": max((k.get("workgroup_storage_bytes", 0) for k in kernels), default=0),
    }
    # a weight in parts needs a binding of its smallest part size only
    sizes = [s["size_at_bounds"] for s in storages] + [smallest_part_bytes(nbytes, parts) for nbytes, parts in weights]
    if all(s is not None for s in sizes) and sizes:
        limits["maxStorageBufferBindingSize"] = max(sizes)
        limits["maxBufferSize"] = max(sizes)
    return limits


def storage_holders(module: IRModule, node_names: Mapping[str, str]) -> list[str]:
    """What each storage of the module's host function holds, for people (the manifest's
    ``holds``): the inputs and outputs it holds by name, else the largest value a kernel
    writes into it at the bounds (the first one where sizes have no bound) with the model's
    node that computes it (``node_names``: by the value's name in the module)."""
    host = module.main
    assert isinstance(host, HostFunction)
    named: dict[int, list[str]] = {}
    for kind, tensors in (("input", host.inputs), ("output", host.outputs)):
        for tensor in tensors:
            named.setdefault(tensor.storage, []).append(f"{kind} '{shown(tensor.name)}'")
    largest: dict[int, tuple[int, str]] = {}  # storage -> (bytes at the bounds, -1: unknown; the value)
    bounds = dict(host.bounds)
    for dispatch in host.dispatches:
        target = dispatch.buffers[-1]
        if target.kind != "storage" or target.index in named:
            continue
        output = module.programs[dispatch.program].output
        size = substitute(product(output.shape) * dtype_info(output.dtype).storage_bytes, dict(dispatch.size_var_values))
        at_bounds = upper_bound(size, bounds)
        value = dispatch.note.split(" = ", 1)[0]
        if target.index not in largest or (at_bounds is not None and at_bounds > largest[target.index][0]):
            largest[target.index] = (-1 if at_bounds is None else at_bounds, value)
    holders = []
    for index, storage in enumerate(host.storages):
        if index in named:
            holders.append(", ".join(named[index]))
        elif index in largest:
            value = largest[index][1]
            node = f" of node '{shown(node_names[value])}'" if value in node_names else ""
            holders.append(f"the value '{shown(value)}'{node}")
        else:
            holders.append(f"{storage.role} values")
    return [shortened(holder, MAX_NAME_CHARACTERS) for holder in holders]


#: The limits ``limit_warnings`` compares storages with: a storage is bound whole, so the
#: smaller of the two is the largest a device takes.
BUFFER_SIZE_LIMITS = ("maxStorageBufferBindingSize", "maxBufferSize")


def checked_target_limits(limits: Mapping[str, int] | None) -> dict[str, int]:
    """The limits a build checks its bundle against (``--target-limits``): WebGPU's defaults
    (``ir/launch.WEBGPU_DEFAULT_LIMITS``), with the ones given replacing them; a name that is
    not one of those or a value that is not a positive integer is an error."""
    given = dict(limits or {})
    for name, value in given.items():
        if name not in WEBGPU_DEFAULT_LIMITS:
            raise RelaxwebError(f"target limit {shortened(shown(name))!r} is not one the build checks "
                                f"({', '.join(WEBGPU_DEFAULT_LIMITS)})")
        if isinstance(value, bool) or not isinstance(value, int) or value <= 0:
            raise RelaxwebError(f"target limit {name} must be a positive integer, got {shortened(shown(repr(value)))}")
    return {**WEBGPU_DEFAULT_LIMITS, **given}


def limit_warnings(manifest: Mapping, limits: Mapping[str, int] | None = None) -> list[str]:
    """Why a bundle cannot load on a WebGPU device offering ``limits`` (by default WebGPU's
    default limits; :func:`checked_target_limits`), one line per storage above the largest
    buffer such a device binds at the bounds (naming what it holds, its size expression and
    the bounds to lower) and per other limit its kernels exceed.  Empty when it loads.  A
    storage without a size at the bounds (a size variable with no bound) grows at run time
    and is checked by the runtimes then."""
    target = checked_target_limits(limits)
    whose = "WebGPU's default" if limits is None or not dict(limits) else "the target's"
    largest = min(target[name] for name in BUFFER_SIZE_LIMITS)
    limit = next(name for name in BUFFER_SIZE_LIMITS if target[name] == largest)
    bounds = {var["name"]: var["bound"] for var in manifest["symbolic_vars"]}
    warnings = []
    webgpu = manifest.get("webgpu", {}).get("unavailable")
    if webgpu is not None:
        warnings.append(f"WebGPU cannot run the bundle: {webgpu}; it runs on the wasm backend, which holds int64 exactly")
    for index, storage in enumerate(manifest["storages"]):
        needed = storage["size_at_bounds"]
        if needed is None or needed <= largest:
            continue
        variables = [name for name in bounds if re.search(rf"\b{re.escape(name)}\b", storage["size"])]
        at = ", ".join(f"{name} <= {bounds[name]}" for name in variables)
        lower = f"; lower the bounds of {', '.join(variables)} (--bound)" if variables else ""
        warnings.append(
            f"storage {index} ({storage.get('holds', storage['role'])}) needs {needed} bytes"
            f"{f' at the bounds {at}' if at else ''} (its size: {storage['size']} bytes), above {whose} {limit} of "
            f"{largest}: WebGPU adapters offering no more cannot load the bundle (wasm can){lower}")
    for name, needed in manifest.get("required_limits", {}).items():
        if name not in BUFFER_SIZE_LIMITS and name in target and needed > target[name]:
            warnings.append(f"the bundle's kernels need the WebGPU limit {name} = {needed}, above {whose} {target[name]}: "
                            "WebGPU adapters offering no more cannot load the bundle (wasm can)")
    return warnings


def describe(manifest_or_dir) -> dict:
    """The manifest of a bundle folder (for ``relaxweb inspect``)."""
    path = Path(manifest_or_dir)
    manifest_path = path / "manifest.json" if path.is_dir() else path
    if not manifest_path.exists():
        raise RelaxwebError(f"{path}: not a bundle (no manifest.json)")
    return json.loads(manifest_path.read_text())
