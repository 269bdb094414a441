"""The compile driver: ONNX model -> imported module -> pass pipeline -> compiled module.

:func:`compile_model` imports a model and runs the pass pipeline of an opt level under a
:class:`~relaxweb.passes.PassContext` holding the user's bounds; the result's ``main`` is a
host function, ready for the bundle writer (``bundle.py``).  :func:`build_bundle` does both;
:func:`run_reference` runs a model in the reference interpreter instead (numpy, no GPU).
``dump_ir`` writes the module as text before the first pass and after each one.

A model is a path to an ``.onnx`` file or an ``onnx.ModelProto`` already in memory (whose
weights it must hold: external data is read only next to a model file).  The user's
settings (bounds, opt level) are checked here, so the command line and the Python API
(``relaxweb/api.py``) give the same errors.
"""

from __future__ import annotations

import operator
import shutil
import tempfile
import os
from pathlib import Path
from typing import Callable, Mapping

import numpy as np
import onnx

from .bundle import RUNTIME_CHOICES, Advance, write_bundle
from .errors import InputShapeError, RelaxwebError, shortened
from .frontend import from_onnx, load_onnx
from .frontend.onnx import symbolic_vars
from .ir.builder import FunctionBuilder
from .ir.expr import Function
from .ir.interpreter import run_module
from .ir.module import IRModule
from .ir.symbolic import as_int
from .ir.printer import format_module
from .passes import DEFAULT_OPT_LEVEL, OPT_LEVELS, PassContext, run_pipeline
from .passes.context import DEFAULT_KV_PAGE_SIZE, SCALE_DTYPES, WEIGHT_FORMATS
from .tokenizer import TokenizerSource, tokenizer_from_metadata, tokenizer_from_path

Progress = Callable[[str], None]

#: What the driver compiles: an ``.onnx`` file's path, or a model already in memory.
Model = str | Path | onnx.ModelProto


def _quiet(message: str) -> None:
    pass


def model_name(model: Model) -> str:
    """How a model is named in the manifest and in messages: its file name, or for a model in
    memory its graph's name."""
    if isinstance(model, onnx.ModelProto):
        return f"{model.graph.name or 'model'} (in memory)"
    return Path(model).name


def read_model(model: Model) -> onnx.ModelProto:
    """The model in memory itself, or the model file read with its external data."""
    if isinstance(model, onnx.ModelProto):
        return model
    if not isinstance(model, (str, os.PathLike)):
        raise RelaxwebError(f"a model is the path of an .onnx file or an onnx.ModelProto, got an object of type {type(model).__name__}")
    return load_onnx(model)


def model_tokenizer(model: Model) -> TokenizerSource | None:
    """The checked tokenizer a model names in ``metadata_props["relaxweb.tokenizer"]``
    (``relaxweb/tokenizer/``), or None.  A model file is read again without its external
    data: only its metadata is wanted."""
    proto = model if isinstance(model, onnx.ModelProto) else onnx.load(str(model), load_external_data=False)
    return tokenizer_from_metadata({prop.key: prop.value for prop in proto.metadata_props}, model_name(model))


def node_names(model: Model) -> dict[str, str]:
    """The name of the node that writes each value of the model (subgraphs' included), by
    the name the frontend gives the value in the IR (``FunctionBuilder.unique_name`` of its
    ONNX name), for the values whose IR name no other value's ONNX name also gives; an
    unnamed node is ``#i``, its place in its graph.  The attention sites of a bundle's
    manifest name their nodes with it.  A model file is read again without its external
    data: only its graph is wanted."""
    proto = model if isinstance(model, onnx.ModelProto) else onnx.load(str(model), load_external_data=False)
    names: dict[str, str] = {}
    taken: set[str] = set()
    graphs = [proto.graph]
    while graphs:
        graph = graphs.pop()
        for index, node in enumerate(graph.node):
            for attribute in node.attribute:  # an If's branches, a Loop's body
                graphs += [attribute.g] if attribute.HasField("g") else list(attribute.graphs)
            for output in node.output:
                value = FunctionBuilder("names").unique_name(output) if output else ""
                if value in taken:
                    names.pop(value, None)
                elif value:
                    taken.add(value)
                    names[value] = node.name or f"#{index}"
    return names


def import_model(model: Model) -> IRModule:
    """The imported module of a model file or of a model in memory (``main`` is the graph)."""
    return from_onnx(read_model(model), model_name(model))


def checked_bounds(bounds: Mapping[str, int] | None) -> dict[str, int]:
    """The user's bounds as a dict, or a RelaxwebError naming the first bad one: each must be
    an integer of at least 1 (``--bound batch=64``, ``bounds={"batch": 64}``).  Names are
    checked against the model's symbolic variables later, by the host lowering."""
    if bounds is None:
        return {}
    if not isinstance(bounds, Mapping):
        raise RelaxwebError(f"bounds must map symbolic variable names to integers (like {{'batch': 64}}), "
                            f"got an object of type {type(bounds).__name__}")
    checked = {}
    for name, value in bounds.items():
        if isinstance(value, bool) or not hasattr(value, "__index__"):  # ints and numpy ints
            raise RelaxwebError(f"--bound {name}: the bound must be an integer, got {value!r}")
        number = operator.index(value)
        if number < 1:
            raise RelaxwebError(f"--bound {name}: the bound must be at least 1, got {number}")
        checked[str(name)] = number
    return checked


def bounds_by_variable(bounds: dict[str, int], module: IRModule) -> dict[str, int]:
    """The user's bounds by size variable.  A bound may name a variable as the IR does
    (``p2o_DynamicDimension_0``) or as the model wrote it (``p2o.DynamicDimension.0``), which
    bounds every variable of that name; unknown names pass through (the host lowering
    refuses them, listing the model's variables)."""
    as_written = module.attrs.get("size_var_names", {})
    variables = set(symbolic_vars(module.main)) if isinstance(module.main, Function) else set()
    by_variable: dict[str, int] = {}
    for name, bound in bounds.items():
        targets = [variable for variable, written in as_written.items() if written == name]
        if name in variables or not targets:
            targets.append(name)
        for variable in targets:
            by_variable[variable] = bound
    return by_variable


def checked_opt_level(opt_level: int) -> int:
    """``opt_level`` if it is one of :data:`~relaxweb.passes.OPT_LEVELS`, else a RelaxwebError."""
    if isinstance(opt_level, bool) or opt_level not in OPT_LEVELS:
        raise RelaxwebError(f"opt level {opt_level!r} does not exist; expected one of "
                            f"{', '.join(map(str, OPT_LEVELS))}")
    return int(opt_level)


def checked_weights(weights: str, group_size: int, scale_dtype: str) -> dict:
    """The weight compression settings (``--weights``, ``--group-size``, ``--scale-dtype``) as
    :class:`PassContext` fields, or a RelaxwebError naming the one that is wrong."""
    if weights not in WEIGHT_FORMATS:
        raise RelaxwebError(f"weights {weights!r} is not a weight format; expected one of {', '.join(WEIGHT_FORMATS)}")
    if scale_dtype not in SCALE_DTYPES:
        raise RelaxwebError(f"scale dtype {scale_dtype!r} is not one of {', '.join(SCALE_DTYPES)}")
    if isinstance(group_size, bool) or not isinstance(group_size, int) or group_size < 1:
        raise RelaxwebError(f"the group size must be an integer >= 1, got {group_size!r}")
    return {"weights": weights, "weight_group_size": group_size, "weight_scale_dtype": scale_dtype}


def checked_kv_pages(kv_pages: int | None, kv_page_size: int, opt_level: int) -> dict:
    """The paged KV cache settings (``--kv-pages``, ``--kv-page-size``) as :class:`PassContext`
    fields, or a RelaxwebError naming the one that is wrong."""
    for name, value in (("kv_pages", kv_pages), ("kv_page_size", kv_page_size)):
        if value is not None and (isinstance(value, bool) or not isinstance(value, int) or not 1 <= value <= 1 << 20):
            raise RelaxwebError(f"{name} must be an integer from 1 to {1 << 20}, got {value!r}")
    if kv_page_size is None:
        raise RelaxwebError("kv_page_size must be an integer from 1 to 1048576, got None")
    if kv_pages is not None and opt_level < 1:
        raise RelaxwebError("--kv-pages needs --opt-level 1 (KV caches are placed by the optimizing pipeline)")
    return {"kv_pages": kv_pages, "kv_page_size": kv_page_size}


def compile_model(model: Model, bounds: Mapping[str, int] | None = None, *,
                  opt_level: int = DEFAULT_OPT_LEVEL, storage_reuse: bool = True,
                  progress: Progress = _quiet, dump_ir: Path | None = None, weights: str = "float32",
                  group_size: int = 32, scale_dtype: str = "float16", kv_pages: int | None = None,
                  kv_page_size: int = DEFAULT_KV_PAGE_SIZE) -> IRModule:
    """Import and lower a model; the result's ``main`` is a HostFunction."""
    bounds, opt_level = checked_bounds(bounds), checked_opt_level(opt_level)  # before the slow import
    checked_weights(weights, group_size, scale_dtype)
    checked_kv_pages(kv_pages, kv_page_size, opt_level)
    if not isinstance(model, onnx.ModelProto):
        progress(f"reading {model_name(model)}")
    module = import_model(model)
    main = module.main
    progress(f"imported {model_name(model)}: {len(main.bindings())} bindings, "
             f"inputs {', '.join(main.input_names)}")
    return compile_module(module, bounds, opt_level=opt_level, storage_reuse=storage_reuse,
                          progress=progress, dump_ir=dump_ir, weights=weights, group_size=group_size,
                          scale_dtype=scale_dtype, kv_pages=kv_pages, kv_page_size=kv_page_size)


def compile_module(module: IRModule, bounds: Mapping[str, int] | None = None, *,
                   opt_level: int = DEFAULT_OPT_LEVEL, storage_reuse: bool = True,
                   progress: Progress = _quiet, dump_ir: Path | None = None, weights: str = "float32",
                   group_size: int = 32, scale_dtype: str = "float16", kv_pages: int | None = None,
                   kv_page_size: int = DEFAULT_KV_PAGE_SIZE) -> IRModule:
    """Run the pass pipeline of ``opt_level`` on a module (imported or built by hand) with the
    given bounds and weight compression (``weights``: float32 keeps them, float16 / int8 /
    int4 packs them: ``passes/compress_weights.py``) and, with ``kv_pages``, a paged KV cache
    of that many pages of ``kv_page_size`` positions (``passes/page_kv_caches.py``);
    verification follows the enclosing :class:`PassContext`."""
    bounds, opt_level = checked_bounds(bounds), checked_opt_level(opt_level)
    compression = checked_weights(weights, group_size, scale_dtype)
    paging = checked_kv_pages(kv_pages, kv_page_size, opt_level)
    bounds = bounds_by_variable(bounds, module)
    context = PassContext.current().replace(bounds=bounds, opt_level=opt_level,
                                            storage_reuse=storage_reuse, **compression, **paging)

    def on_step(name: str, step_module: IRModule) -> None:
        progress(f"pass {name}")
        if dump_ir is not None:
            _dump(dump_ir, name, step_module)

    if dump_ir is not None:
        _dump(dump_ir, "imported", module)
    with context:
        return run_pipeline(module, on_step=on_step)


def build_bundle(model: Model, out_dir: str | Path, bounds: Mapping[str, int] | None = None, *,
                 opt_level: int = DEFAULT_OPT_LEVEL, progress: Progress = _quiet,
                 dump_ir: Path | None = None, weights: str = "float32", group_size: int = 32,
                 scale_dtype: str = "float16", tokenizer: str | Path | None = None, debug: bool = False,
                 runtime: str = "copy", advance: Advance | None = None, kv_pages: int | None = None,
                 kv_page_size: int = DEFAULT_KV_PAGE_SIZE) -> dict:
    """Compile ``model`` into the bundle folder ``out_dir``; returns the manifest.

    The bundle carries the tokenizer at the path ``tokenizer`` when one is given (a Hugging
    Face tokenizer folder or tokenizer.json, or a JSON tokenizer entry), else the one the model
    names in its metadata (``relaxweb/tokenizer/``), else none.
    ``debug`` (``--debug``) adds the WebAssembly modules' text; ``runtime`` (``--runtime``)
    says whether the bundle carries a copy of the browser runtime (``bundle.RUNTIME_CHOICES``);
    ``advance`` is told the bytes of weights written as they go (the command line's bar).

    The bundle is written into a new folder next to ``out_dir`` and its entries are moved
    into ``out_dir`` only when all of it is written: a build that fails (a refused model, a
    full disk) leaves the bundle already there as it was.  Other files in ``out_dir`` stay.
    """
    if not str(out_dir).strip():
        raise RelaxwebError("the output (-o) is empty: name the bundle's folder (it is made where missing)")
    out = Path(out_dir)
    try:
        if out.exists() and not out.is_dir():
            raise RelaxwebError(f"{out} exists and is not a folder; the output (-o) must be a folder")
    except OSError as error:  # a name or path longer than the file system takes
        raise RelaxwebError(f"cannot write the bundle to {shortened(str(out))}: {error.strerror or error}") from None
    if runtime not in RUNTIME_CHOICES:  # before the slow compile
        raise RelaxwebError(f"runtime {runtime!r} is not one of {', '.join(RUNTIME_CHOICES)} "
                            f"({'; '.join(f'{name}: {what}' for name, what in RUNTIME_CHOICES.items())})")
    tokenizer_source = tokenizer_from_path(tokenizer) if tokenizer is not None else None  # before the slow compile
    checked_kv_pages(kv_pages, kv_page_size, opt_level)  # before the slow compile
    module = compile_model(model, bounds, opt_level=opt_level, progress=progress, dump_ir=dump_ir,
                           weights=weights, group_size=group_size, scale_dtype=scale_dtype, kv_pages=kv_pages,
                           kv_page_size=kv_page_size)
    if tokenizer_source is None:
        tokenizer_source = model_tokenizer(model)
    for note in tokenizer_source.notes if tokenizer_source is not None else ():
        progress(f"note: {note}")
    if tokenizer_source is not None:
        _check_vocabulary(tokenizer_source.entry, module)
    try:
        out.parent.mkdir(parents=True, exist_ok=True)
        staging = Path(tempfile.mkdtemp(prefix=f".{out.name}.building-", dir=out.parent))
    except OSError as error:
        raise RelaxwebError(f"cannot write the bundle next to {shortened(str(out))}: {error.strerror}") from None
    try:
        manifest = write_bundle(module, staging, model_name(model), progress,
                                split_bytes=PassContext.current().binding_split_bytes,
                                tokenizer=tokenizer_source.entry if tokenizer_source is not None else None,
                                tokenizer_files=tokenizer_source.files if tokenizer_source is not None else None,
                                debug=debug, runtime=runtime, advance=advance,
                                node_names=node_names(model))
        _move_into_place(staging, out)
    except OSError as error:
        raise RelaxwebError(f"cannot write the bundle to {shortened(str(out))}: {error.strerror or error}") from None
    finally:
        shutil.rmtree(staging, ignore_errors=True)
    return manifest


#: What a build writes into its folder; a rebuild replaces exactly these.
BUNDLE_ENTRIES = ("kernels", "weights", "runtime", "tokenizer", "host.wasm", "host.wat", "kernels.wasm",
                  "kernels.wat", "manifest.json")


def _move_into_place(staging: Path, out: Path) -> None:
    """Replace the bundle entries of ``out`` by those of ``staging`` (the manifest last)."""
    out.mkdir(exist_ok=True)
    retired = staging / ".retired"
    retired.mkdir()
    for name in BUNDLE_ENTRIES:
        if (out / name).exists() or (out / name).is_symlink():
            (out / name).rename(retired / name)
        if (staging / name).exists():
            (staging / name).rename(out / name)


def run_reference(model: Model, inputs: Mapping[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Import an ONNX model and run it in the reference interpreter (numpy, no GPU).

    Inputs and outputs are keyed by the ONNX names, with the same checks as a bundle's.
    """
    module = import_model(model)
    main = module.main
    expected_names = list(main.input_names or [p.name for p in main.params])
    unknown = [name for name in inputs if name not in expected_names]
    if unknown:
        raise InputShapeError(
            f"unknown input {', '.join(repr(name) for name in unknown)}; "
            f"the model's inputs are {', '.join(repr(name) for name in expected_names)}"
        )
    outputs = run_module(module, inputs)
    names = list(main.output_names) or [f"output_{i}" for i in range(len(outputs))]
    return dict(zip(names, outputs))


def _dump(folder: Path, name: str, module: IRModule) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    index = len(list(folder.glob("*.txt")))
    (folder / f"{index:02d}_{name}.txt").write_text(format_module(module))


def _check_vocabulary(tokenizer: Mapping, module: IRModule) -> None:
    """Refuse a tokenizer with more ids than the model's ``logits`` have entries: some of its
    ids would be tokens the model has never seen (a tokenizer of another model).  Fewer is
    usual: vocabularies are padded for the GPU."""
    logits = next((output for output in module.main.outputs if output.name == "logits"), None)
    vocab = as_int(logits.shape[-1]) if logits is not None and logits.shape else None
    if vocab is not None and tokenizer["vocab_size"] > vocab:
        raise RelaxwebError(f"the tokenizer has {tokenizer['vocab_size']} token ids, but the model's logits have {vocab} "
                            "entries: it is not this model's tokenizer")
