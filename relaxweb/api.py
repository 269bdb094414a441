"""The Python API: the command line's commands as functions, for notebooks and test suites.

=====================================================  ===============================================
command line                                           Python (``import relaxweb``)
=====================================================  ===============================================
``relaxweb build MODEL -o DIR --bound batch=64``       ``relaxweb.build(MODEL, DIR, bounds={"batch": 64})``
``relaxweb build MODEL -o DIR --opt-level 0``          ``relaxweb.build(MODEL, DIR, opt_level=0)``
``relaxweb build MODEL -o DIR --weights int4``         ``relaxweb.build(MODEL, DIR, weights="int4")``
``relaxweb run DIR --inputs IN.npz``                   ``relaxweb.load(DIR).run(inputs)``
``relaxweb run DIR --inputs IN.npz --backend wasm``    ``relaxweb.load(DIR, backend="wasm").run(inputs)``
``relaxweb run DIR --inputs IN.npz --browser``         ``relaxweb.run_in_browser(DIR, inputs)``
``relaxweb run MODEL --inputs IN.npz --reference``     ``relaxweb.run_reference(MODEL, inputs)``
``relaxweb inspect DIR`` / ``relaxweb inspect MODEL``  ``relaxweb.inspect(DIR)`` / ``relaxweb.inspect(MODEL)``
=====================================================  ===============================================

A model is an ``.onnx`` file's path or an ``onnx.ModelProto`` in memory (holding its weights:
external data is read only next to a model file).  Inputs and outputs are dicts of numpy
arrays keyed by the ONNX names.

The command line (``cli.py``) calls these functions, so both check the same things and fail
the same way: every user error is a :class:`~relaxweb.errors.RelaxwebError` whose message is
the line the command line prints after ``error: ``.  ``run_reference`` is the compile
driver's (``compiler.py``), re-exported as it is.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import onnx

from .browser import BrowserBatch
from .browser import profile_in_browser as profile_bundle_in_browser
from .browser import run_batch_in_browser as run_bundle_batch_in_browser
from .browser import run_in_browser as run_bundle_in_browser
from .bundle import attention_entry, checked_target_limits, limit_warnings
from .compiler import Model, build_bundle, model_name, node_names, read_model, run_reference
from .errors import RelaxwebError, path_kind, shortened, shown
from .frontend.onnx import default_opset, from_onnx, op_coverage, symbolic_vars
from .ir.attention_sites import attention_sites
from .ir.module import IRModule
from .passes import DEFAULT_KV_PAGE_SIZE, DEFAULT_OPT_LEVEL, fuse_attention
from .runtime import Profile, Session, WasmSession, load_manifest, load_session
from .runtime.manifest import MAX_KERNEL_BYTES, read_bundle_file

__all__ = [
    "Bundle", "ModelReport", "TensorSpec", "build", "check_bundle_folder", "format_coverage", "format_manifest",
    "inspect", "load", "run_batch_in_browser", "run_in_browser", "run_reference",
]

#: A shape as the manifest gives it: ints, and symbolic sizes by name (``["batch", 64]``).
Shape = tuple[int | str, ...]


# Bundles -----------------------------------------------------------------------------------


def check_bundle_folder(path: str | Path) -> Path:
    """``path`` as a Path, or a RelaxwebError when it is not a bundle folder."""
    folder = Path(path)
    if path_kind(folder / "manifest.json") != "file":
        raise RelaxwebError(f"{path}: not a bundle folder (no manifest.json); build one with 'relaxweb build'")
    return folder


@dataclass(frozen=True)
class TensorSpec:
    """An input or output of a bundle: its ONNX name, dtype and shape.

    ``shape`` holds ints and symbolic sizes by name (``("batch", 64)``); it is None for an
    output whose dims are only known at run time (its rank is ``ndim``).
    """

    name: str
    dtype: str
    shape: Shape | None
    ndim: int

    @classmethod
    def from_manifest(cls, entry: Mapping[str, Any]) -> TensorSpec:
        shape = entry["shape"]
        return cls(entry["name"], entry["dtype"], None if shape is None else tuple(shape),
                   len(shape) if shape is not None else entry.get("ndim", -1))

    def __str__(self) -> str:
        shape = list(self.shape) if self.shape is not None else f"[ndim={self.ndim}]"
        return f"{self.name}: {self.dtype}{shape}"


@dataclass(frozen=True, repr=False)
class Bundle:
    """A bundle folder written by :func:`build`: where it is and what its manifest says.

    ``str(bundle)`` is what ``relaxweb inspect DIR`` prints (inputs, symbolic variables,
    storages, kernels); :meth:`load` loads it on a WebGPU device.
    """

    path: Path
    manifest: Mapping[str, Any]
    #: Why the bundle cannot load on WebGPU's default limits (or the ``target_limits`` it was
    #: built for) at its bounds: one line per storage or limit above them (``bundle.limit_warnings``).
    warnings: tuple[str, ...] = ()

    @classmethod
    def open(cls, path: str | Path) -> Bundle:
        """The bundle in folder ``path`` (a RelaxwebError if it is none, or of another format)."""
        return cls(check_bundle_folder(path), load_manifest(path))

    @property
    def inputs(self) -> tuple[TensorSpec, ...]:
        return tuple(TensorSpec.from_manifest(entry) for entry in self.manifest["inputs"])

    @property
    def outputs(self) -> tuple[TensorSpec, ...]:
        return tuple(TensorSpec.from_manifest(entry) for entry in self.manifest["outputs"])

    @property
    def symbolic_vars(self) -> dict[str, int | None]:
        """Each symbolic size of the bundle and its bound (None: no bound given, so storages
        grow at run time as needed)."""
        return {variable["name"]: variable["bound"] for variable in self.manifest["symbolic_vars"]}

    @property
    def shader_bytes(self) -> dict[str, int]:
        """The bytes of each kernel's WGSL, by file: what the adapter compiles at load, one
        pipeline per kernel (identical programs are one kernel already)."""
        return {kernel["file"]: len(read_bundle_file(self.path, kernel["file"], MAX_KERNEL_BYTES, "kernel"))
                for kernel in self.manifest["kernels"]}

    @property
    def cpu_shader_bytes(self) -> dict[str, int]:
        """The bytes of the kernels' shaders for CPU adapters (``cpu_file``), by the kernel's
        ``file``: what a CPU adapter compiles instead (``relaxweb/passes/schedule_programs.py``)."""
        return {kernel["file"]: len(read_bundle_file(self.path, kernel["cpu_file"], MAX_KERNEL_BYTES, "kernel"))
                for kernel in self.manifest["kernels"] if "cpu_file" in kernel}

    @property
    def f16_shader_bytes(self) -> dict[str, int]:
        """The bytes of the kernels' f16 shaders (``f16_file``), by the kernel's ``file``: what
        an adapter with ``shader-f16`` compiles instead (``relaxweb/passes/schedule_programs.py``)."""
        return {kernel["file"]: len(read_bundle_file(self.path, kernel["f16_file"], MAX_KERNEL_BYTES, "kernel"))
                for kernel in self.manifest["kernels"] if "f16_file" in kernel}

    @property
    def wasm_bytes(self) -> int | None:
        """The bytes of ``kernels.wasm`` (the kernels for the WebAssembly backend), None when
        the bundle has none."""
        file = self.manifest.get("wasm", {}).get("file")
        return None if file is None else len(read_bundle_file(self.path, file, MAX_KERNEL_BYTES, "kernels.wasm"))

    def load(self, *, backend: str = "auto", device: Any = None, profiling: bool = False, kernels: str = "auto",
             limits: Mapping[str, int] | None = None, kernel_timeout_s: float | None = None,
             relaxed_simd: bool | None = None) -> Session | WasmSession:
        """The bundle loaded with the Python runtime (see :func:`load`)."""
        return load(self.path, backend=backend, device=device, profiling=profiling, kernels=kernels, limits=limits,
                    kernel_timeout_s=kernel_timeout_s, relaxed_simd=relaxed_simd)

    def __str__(self) -> str:
        return format_manifest(self.manifest, self.shader_bytes, self.cpu_shader_bytes, self.f16_shader_bytes,
                               self.wasm_bytes)

    def __repr__(self) -> str:
        return (f"Bundle({str(self.path)!r}, inputs=[{', '.join(map(str, self.inputs))}], "
                f"outputs=[{', '.join(map(str, self.outputs))}], symbolic_vars={self.symbolic_vars})")


def build(model: Model, out_dir: str | Path, *, bounds: Mapping[str, int] | None = None,
          opt_level: int = DEFAULT_OPT_LEVEL, dump_ir: str | Path | None = None,
          progress: Callable[[str], None] | None = None, weights: str = "float32", group_size: int = 32,
          scale_dtype: str = "float16", tokenizer: str | Path | None = None, debug: bool = False,
          runtime: str = "copy", advance: Callable[[str, int, int], None] | None = None,
          target_limits: Mapping[str, int] | None = None, kv_pages: int | None = None,
          kv_page_size: int = DEFAULT_KV_PAGE_SIZE) -> Bundle:
    """Compile ``model`` into the bundle folder ``out_dir`` (created if missing), as
    ``relaxweb build MODEL -o DIR`` does.

    ``bounds`` gives symbolic sizes an upper bound (``{"batch": 64}``, ``--bound batch=64``):
    storages are then allocated once at load time and larger inputs are rejected.
    ``opt_level`` 1 fuses and schedules kernels, 0 gives one kernel per op (``--opt-level``).
    ``dump_ir`` names a folder for the module as text after each pass (``--dump-ir``);
    ``progress`` is called with a line for each step (the command line prints them).
    ``weights`` ("float32", "float16", "int8" or "int4"; ``--weights``) stores the weights of
    matmuls, gathers and convolutions packed, decoded inside the kernels that read them;
    int8 / int4 quantize them in groups of ``group_size`` (``--group-size``) with scales of
    ``scale_dtype`` ("float16" or "float32"; ``--scale-dtype``).
    ``tokenizer`` (``--tokenizer``), for ``generate`` and ``chat``: a Hugging Face tokenizer
    folder as ``save_pretrained`` writes it, a ``tokenizer.json``, or a JSON byte tokenizer file;
    without it the model's ``metadata_props["relaxweb.tokenizer"]`` is used when it has one
    (``relaxweb/tokenizer/``).
    ``debug=True`` (``--debug``) also writes ``host.wat`` and ``kernels.wat``, the text of the
    two WebAssembly modules, for reading (no runtime loads them).
    ``runtime`` (``--runtime``): ``"copy"`` (the default) puts a copy of the browser runtime in
    the bundle's ``runtime/``; ``"none"`` leaves it out, for a page that imports the runtime
    from the npm package ``relaxweb`` (docs/bundle-format.md, "The runtime").
    ``advance`` is called as long steps go, with the step, the units done and the units in all
    (``("writing weights", bytes written, bytes in all)``): the command line draws a bar with it.
    ``target_limits`` (``--target-limits``, WebGPU limit names -> values) are the limits of the
    devices the bundle is for: ``bundle.warnings`` says where the bundle needs more at its
    bounds (by default, more than WebGPU's default limits), naming each storage, what it holds,
    its size and the bounds to lower; such a bundle still builds, and runs on wasm or on
    adapters offering more.
    ``kv_pages`` (``--kv-pages``) makes a decoder's KV caches pools of that many pages of
    ``kv_page_size`` positions (``--kv-page-size``) per layer, which the sequences of one run
    share: ``generate_many`` and concurrent ``generate`` calls then advance together
    (``passes/page_kv_caches.py``, ``runtime/paged_generate.py``).
    """
    checked_target_limits(target_limits)  # before the slow compile
    manifest = build_bundle(model, out_dir, bounds, opt_level=opt_level, progress=progress or _ignore,
                            dump_ir=_dump_folder(dump_ir) if dump_ir is not None else None, weights=weights,
                            group_size=group_size, scale_dtype=scale_dtype, tokenizer=tokenizer, debug=debug,
                            runtime=runtime, advance=advance, kv_pages=kv_pages, kv_page_size=kv_page_size)
    return Bundle(Path(out_dir), manifest, tuple(limit_warnings(manifest, target_limits)))


def _dump_folder(dump_ir: str | Path) -> Path:
    """The folder of ``dump_ir`` (``--dump-ir``), made before the slow compile, or one error
    saying why it cannot be (an empty name, a file there, a name too long)."""
    if not str(dump_ir).strip():
        raise RelaxwebError("the IR dump folder (--dump-ir) is empty: name the folder to write the module's text to")
    folder = Path(dump_ir)
    try:
        folder.mkdir(parents=True, exist_ok=True)
    except OSError as error:
        raise RelaxwebError(f"cannot make the IR dump folder (--dump-ir) {shown(shortened(str(folder)))}: "
                            f"{error.strerror or error}") from None
    return folder


def load(bundle_dir: str | Path, *, backend: str = "auto", device: Any = None, profiling: bool = False,
         kernels: str = "auto", limits: Mapping[str, int] | None = None,
         kernel_timeout_s: float | None = None, relaxed_simd: bool | None = None) -> Session | WasmSession:
    """Load a bundle with the Python runtime, as ``relaxweb run DIR`` does; then
    ``session.run({"x": array, ...})`` returns the outputs by name, as many times as wanted,
    and ``session.profile(inputs)`` runs once timing every kernel (``relaxweb run DIR --profile``).

    ``backend`` (``--backend``): ``"webgpu"`` (a :class:`Session` on wgpu), ``"wasm"`` (a
    :class:`WasmSession`: the bundle's ``kernels.wasm`` on one CPU thread with wasmtime, no
    GPU; ``keep_on_gpu`` keeps outputs in its memory, ``generate`` and ``chat`` pick tokens on the
    CPU), or ``"auto"`` (the default): WebGPU when this machine's adapter meets the bundle's
    required limits and features, else wasm.
    ``session.backend`` says which.  The options below are WebGPU's: ``"wasm"`` refuses them.

    ``device`` is a ``wgpu.GPUDevice``; by default a device shared by every session.
    ``profiling=True`` requests the adapter's ``timestamp-query`` feature when it has one
    (a device shared by profiling sessions), so that profiles time kernels on the GPU.
    ``kernels`` picks the shaders of kernels that have a variant (``relaxweb/passes/schedule_programs.py``):
    ``"auto"`` (the CPU ones on a CPU adapter such as lavapipe, else the f16 ones where the
    adapter offers ``shader-f16``, else the f32 ones), ``"gpu"``, ``"cpu"`` or ``"f16"`` (the
    f32 ones, with a warning, where the feature is missing); ``session.kernels`` says which
    were compiled.
    ``limits`` (``{"maxStorageBufferBindingSize": 134217728}``) lowers the buffer size limits
    that weights the bundle binds in parts are split at, as on a device that offers no more
    (docs/bundle-format.md, "Weights in parts"); storages keep the device's own limits.
    ``kernel_timeout_s`` (wasm only; default ``wasm_backend.KERNEL_SECONDS_PER_CALL``, 10 s) is
    how long one kernels.wasm call may run before the run fails (a kernels.wasm that loops).
    ``relaxed_simd`` (wasm only): None (the default) runs the kernels' multiply-adds with
    relaxed SIMD (fused) where wasmtime compiles it, False lowers them to plain SIMD128 at load
    (results the same on every machine); ``session.relaxed_simd`` says which runs.

    A session may be called from several threads: its calls take turns (``Session``, "Threads").
    """
    return load_session(check_bundle_folder(bundle_dir), backend, device=device, profiling=profiling, kernels=kernels,
                        limits=limits, kernel_timeout_s=kernel_timeout_s, relaxed_simd=relaxed_simd)


def run_in_browser(bundle_dir: str | Path, inputs: Mapping[str, np.ndarray], *,
                   timeout_s: float = 120.0, backend: str = "auto") -> dict[str, np.ndarray]:
    """Run a bundle once in headless Chromium, as ``relaxweb run DIR --browser [--backend]``
    does (needs Playwright and Chromium): ``backend`` is the browser runtime's option ("auto":
    WebGPU where Chromium's adapter fits, else the bundle's kernels.wasm; "webgpu"; "wasm")."""
    return run_bundle_in_browser(check_bundle_folder(bundle_dir), dict(inputs), timeout_s, backend=backend)


def run_batch_in_browser(bundle_dir: str | Path, instances: list[Mapping[str, np.ndarray]], *,
                         timeout_s: float = 120.0, backend: str = "auto", batch: bool = True) -> BrowserBatch:
    """Run a batch of instances (each its own inputs, of its own sizes) in headless Chromium,
    as ``relaxweb run DIR --inputs A.npz --inputs B.npz --batch --browser`` does: the browser
    runtime's ``model.runBatch``; ``.outputs`` one dict per instance, ``.ms`` the batch's time
    without the load, ``.report`` how it ran; ``backend`` as for :func:`run_in_browser`;
    ``batch=False`` runs them one after another with ``model.run`` (``relaxweb run`` without
    ``--batch``)."""
    return run_bundle_batch_in_browser(check_bundle_folder(bundle_dir), [dict(inputs) for inputs in instances],
                                       timeout_s, load_options={"backend": backend}, batch=batch)


def profile_in_browser(bundle_dir: str | Path, inputs: Mapping[str, np.ndarray], *,
                       timeout_s: float = 120.0, backend: str = "auto") -> Profile:
    """Profile one run in headless Chromium, as ``relaxweb run DIR --browser --profile``
    does: the browser runtime's ``model.profile(inputs)`` as a :class:`Profile` (``.outputs``,
    ``.rows``, ``.table()``), the same rows as ``load(DIR).profile(inputs)``; ``backend`` as
    for :func:`run_in_browser`."""
    return profile_bundle_in_browser(check_bundle_folder(bundle_dir), dict(inputs), timeout_s, backend=backend)


def _ignore(message: str) -> None:
    pass


# Inspecting models -------------------------------------------------------------------------


@dataclass(frozen=True)
class ModelReport:
    """What ``relaxweb inspect MODEL.onnx`` prints, as data (``str(report)`` is that text).

    ``coverage`` lists each op type with its node count and whether relaxweb supports it,
    unsupported ones first; ``module`` is the imported IR (print it to read it).
    """

    source: str
    opset: int
    coverage: tuple[tuple[str, int, bool], ...]
    module: IRModule = field(repr=False)
    attention: tuple[dict, ...] = ()
    """Each attention site, fused or not (why not), as the manifest's ``attention`` entry
    lists it (``relaxweb/bundle.py``'s ``attention_entry``)."""

    @property
    def symbolic_vars(self) -> list[str]:
        """The symbolic sizes of the imported module, in order of appearance."""
        return symbolic_vars(self.module.main)

    @property
    def model_names(self) -> dict[str, str]:
        """The symbolic sizes the model wrote otherwise (``p2o.DynamicDimension.0`` for
        ``p2o_DynamicDimension_0``): ``--bound`` takes either name."""
        return dict(self.module.attrs.get("size_var_names", {}))

    def __str__(self) -> str:
        written = self.model_names
        names = ", ".join(f"{name} (the model's {written[name]!r})" if name in written else name
                          for name in self.symbolic_vars) or "(none)"
        sites = "".join(f"\n{line}" for line in format_attention(self.attention))
        return (f"{format_coverage(self.source, self.opset, list(self.coverage))}\n\n"
                f"{self.module}symbolic vars: {names}{sites}")


def inspect(target: Model) -> Bundle | ModelReport:
    """A bundle folder's :class:`Bundle`, or a model's :class:`ModelReport`, as ``relaxweb
    inspect`` prints them.  A model with unsupported ops raises an
    :class:`~relaxweb.errors.UnsupportedModelError` naming each of them and its nodes."""
    if isinstance(target, (str, os.PathLike)) and path_kind(target) == "folder":
        return Bundle.open(target)
    model, source = read_model(target), model_name(target)
    module = from_onnx(model, source)
    return ModelReport(source, default_opset(model), tuple(op_coverage(model)), module, attention_listing(module, model))


def attention_listing(module: IRModule, model: onnx.ModelProto) -> tuple[dict, ...]:
    """The attention sites of an imported model (``fuse_attention`` run on it), each with the
    names of its nodes, as a bundle's manifest lists them."""
    fused = fuse_attention(module)
    return tuple(attention_entry(fused, node_names(model) if attention_sites(fused.attrs) else {}))


# Text --------------------------------------------------------------------------------------


def format_coverage(source: str, opset: int, coverage: list[tuple[str, int, bool]]) -> str:
    """The op coverage table of ``relaxweb inspect``: every op type, its node count, supported or not."""
    nodes = sum(count for _, count, _ in coverage)
    supported_types = sum(1 for _, _, ok in coverage if ok)
    supported_nodes = sum(count for _, count, ok in coverage if ok)
    lines = [
        f"model {source}: opset {opset}, {nodes} node(s), {len(coverage)} op type(s)",
        f"op coverage: {supported_types} of {len(coverage)} op types supported "
        f"({supported_nodes} of {nodes} nodes)",
    ]
    width = max([len(op) for op, _, _ in coverage] + [2])
    for op, count, ok in coverage:
        lines.append(f"  {op:<{width}}  {count:>5} node{'s' if count != 1 else ' '}  {'supported' if ok else 'UNSUPPORTED'}")
    return "\n".join(lines)


def format_attention(entries: Sequence[Mapping[str, Any]]) -> list[str]:
    """The attention sites as ``relaxweb inspect`` lists them: each fused (one kernel, no
    scores in memory) or not and why not, with its scores', softmax's and output's nodes (or
    values, where no node of the model wrote one); none for a model without any."""
    if not entries:
        return []
    fused = sum(1 for entry in entries if entry["status"] == "fused")
    lines = [f"attention sites: {len(entries)}, {fused} fused"]
    for index, entry in enumerate(entries):
        names = ", ".join(f"{role} {_site_name(entry[role])}" for role in ("scores", "softmax", "output")
                          if entry.get(role) is not None)
        why = f": {shown(entry['reason'])}" if entry["status"] != "fused" else ""
        lines += [f"  {index}: {entry['status']}{why}", f"     {names}"]
    return lines


def _site_name(name: Mapping[str, str]) -> str:
    """``node 'x'`` or ``value 'x'`` (a manifest's ``{"node": x}`` or ``{"value": x}``), shown as data."""
    kind, text = next(iter(name.items()))
    return f"{kind} '{shown(text)}'"


def format_manifest(manifest: Mapping[str, Any], shader_bytes: Mapping[str, int] | None = None,
                    cpu_shader_bytes: Mapping[str, int] | None = None,
                    f16_shader_bytes: Mapping[str, int] | None = None, wasm_bytes: int | None = None) -> str:
    """A bundle's manifest as ``relaxweb inspect DIR`` prints it (with ``shader_bytes``, the
    size of each kernel's WGSL by file: the pipelines to compile at load, largest first; with
    ``cpu_shader_bytes`` and ``f16_shader_bytes``, the sizes of the shaders a CPU adapter and
    an adapter with ``shader-f16`` compile instead; with ``wasm_bytes``, the size of
    ``kernels.wasm``)."""
    lines = [f"bundle of {manifest.get('model')} (format {manifest['format']} v{manifest['version']})"]
    for kind in ("inputs", "outputs"):
        for item in manifest[kind]:
            shape = item["shape"] if item["shape"] is not None else f"[ndim={item.get('ndim')}]"
            lines.append(f"{kind[:-1]:>6} {item['name']}: {item['dtype']}{shape} (storage {item['storage']})")
    for variable in manifest["symbolic_vars"]:
        bound = variable["bound"] if variable["bound"] is not None else "none"
        written = f", the model's {variable['model_name']!r}" if "model_name" in variable else ""
        lines.append(f"   var {variable['name']} (bound: {bound}{written})")
    lines.append(f"storages ({len(manifest['storages'])}):")
    for index, storage in enumerate(manifest["storages"]):
        at_bounds = storage["size_at_bounds"]
        lines.append(f"  {index}: {storage['role']:<12} {storage['size']} bytes"
                     + (f" = {at_bounds} at the bounds" if at_bounds is not None else ""))
    weight_bytes = sum(w["nbytes"] for w in manifest["weights"])
    by_dtype: dict[str, int] = {}
    for weight in manifest["weights"]:
        by_dtype[weight["dtype"]] = by_dtype.get(weight["dtype"], 0) + weight["nbytes"]
    # packed weights (relaxweb build --weights float16|int8|int4) are the uint32 ones
    kinds = f" ({', '.join(f'{dtype} {count}' for dtype, count in sorted(by_dtype.items()))})" if len(by_dtype) > 1 else ""
    lines.append(f"weights: {len(manifest['weights'])} tensors, {weight_bytes} bytes{kinds} in "
                 f"{len(manifest['shards'])} shard(s)")
    lines.append(f"kernels ({len(manifest['kernels'])}), call sites ({len(manifest['call_sites'])}):")
    for index, site in enumerate(manifest["call_sites"]):
        lines.append(f"  {index}: {manifest['kernels'][site['kernel']]['file']}  {site['binding']}")
    if shader_bytes is not None:
        lines += _format_pipelines(manifest, shader_bytes, cpu_shader_bytes or {}, f16_shader_bytes or {})
    wasm = manifest.get("wasm", {})
    if "unavailable" in wasm:
        lines.append(f"kernels.wasm: none ({wasm['unavailable']})")
    elif "file" in wasm:
        size = f"{wasm_bytes} bytes, " if wasm_bytes is not None else ""
        lines.append(f"kernels.wasm: {size}{wasm['scratch_bytes']} bytes of scratch per thread")
    if "webgpu" in manifest:  # the build's webgpu.unavailable: an int64 weight outside int32
        lines.append(f"WebGPU: cannot run it ({manifest['webgpu']['unavailable']}); kernels.wasm can")
    lines.append(f"required limits: {manifest['required_limits']}")
    lines += format_attention(manifest.get("attention", []))
    return "\n".join(lines)


def _format_pipelines(manifest: Mapping[str, Any], shader_bytes: Mapping[str, int],
                      cpu_shader_bytes: Mapping[str, int], f16_shader_bytes: Mapping[str, int] | None = None,
                      largest: int = 5) -> list[str]:
    """The pipelines a load creates (one per kernel) and the WGSL they compile, with the
    largest shaders and how many call sites use each; then what changes on a CPU adapter and
    on an adapter with ``shader-f16``."""
    sites: dict[str, int] = {}
    for site in manifest["call_sites"]:
        file = manifest["kernels"][site["kernel"]]["file"]
        sites[file] = sites.get(file, 0) + 1
    lines = [f"pipelines at load: {len(shader_bytes)}, {sum(shader_bytes.values())} bytes of WGSL"]
    for file, size in sorted(shader_bytes.items(), key=lambda item: -item[1])[:largest]:
        lines.append(f"  {size:>7} bytes  {file}  ({sites.get(file, 0)} call site(s))")
    if cpu_shader_bytes:
        on_cpu = sum({**shader_bytes, **cpu_shader_bytes}.values())
        lines.append(f"  on a CPU adapter (SwiftShader, lavapipe) {len(cpu_shader_bytes)} of them compile their "
                     f"cpu_file instead: {on_cpu} bytes of WGSL")
    if f16_shader_bytes:
        with_f16 = sum({**shader_bytes, **f16_shader_bytes}.values())
        lines.append(f"  on an adapter with shader-f16 {len(f16_shader_bytes)} of them compile their "
                     f"f16_file instead: {with_f16} bytes of WGSL")
    return lines
