"""The compile driver: ONNX file -> imported module -> pass pipeline -> compiled module.

:func:`compile_model` imports a model and runs the pass pipeline of an opt level under a
:class:`~relaxweb.passes.PassContext` holding the user's bounds; the result's ``main`` is a
host function, ready for the bundle writer (``bundle.py``).  :func:`build_bundle` does both;
:func:`run_reference` runs a model in the reference interpreter instead (numpy, no GPU).
``dump_ir`` writes the module as text before the first pass and after each one.
"""

from __future__ import annotations

from pathlib import Path
from typing import Callable, Mapping

import numpy as np

from .bundle import write_bundle
from .errors import InputShapeError
from .frontend import import_onnx_file
from .ir.interpreter import run_module
from .ir.module import IRModule
from .ir.printer import format_module
from .passes import DEFAULT_OPT_LEVEL, PassContext, run_pipeline

Progress = Callable[[str], None]


def _quiet(message: str) -> None:
    pass


def compile_model(model_path: str | Path, bounds: Mapping[str, int] | None = None, *,
                  opt_level: int = DEFAULT_OPT_LEVEL, storage_reuse: bool = True,
                  progress: Progress = _quiet, dump_ir: Path | None = None) -> IRModule:
    """Import and lower a model; the result's ``main`` is a HostFunction."""
    module = import_onnx_file(model_path)
    main = module.main
    progress(f"imported {Path(model_path).name}: {len(main.bindings())} bindings, "
             f"inputs {', '.join(main.input_names)}")
    return compile_module(module, bounds, opt_level=opt_level, storage_reuse=storage_reuse,
                          progress=progress, dump_ir=dump_ir)


def compile_module(module: IRModule, bounds: Mapping[str, int] | None = None, *,
                   opt_level: int = DEFAULT_OPT_LEVEL, storage_reuse: bool = True,
                   progress: Progress = _quiet, dump_ir: Path | None = None) -> IRModule:
    """Run the pass pipeline of ``opt_level`` on a module (imported or built by hand) with the
    given bounds; verification follows the enclosing :class:`PassContext`."""
    context = PassContext.current().replace(bounds=dict(bounds or {}), opt_level=opt_level,
                                            storage_reuse=storage_reuse)

    def on_step(name: str, step_module: IRModule) -> None:
        progress(f"pass {name}")
        if dump_ir is not None:
            _dump(dump_ir, name, step_module)

    if dump_ir is not None:
        _dump(dump_ir, "imported", module)
    with context:
        return run_pipeline(module, on_step=on_step)


def build_bundle(model_path: str | Path, out_dir: str | Path, bounds: Mapping[str, int] | None = None, *,
                 opt_level: int = DEFAULT_OPT_LEVEL, progress: Progress = _quiet,
                 dump_ir: Path | None = None) -> dict:
    """Compile ``model_path`` into the bundle folder ``out_dir``; returns the manifest."""
    module = compile_model(model_path, bounds, opt_level=opt_level, progress=progress, dump_ir=dump_ir)
    return write_bundle(module, out_dir, Path(model_path).name, progress)


def run_reference(model_path: str | Path, inputs: dict[str, np.ndarray]) -> dict[str, np.ndarray]:
    """Import an ONNX model and run it in the reference interpreter (numpy, no GPU).

    Inputs and outputs are keyed by the ONNX names, with the same checks as a bundle's.
    """
    module = import_onnx_file(model_path)
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
