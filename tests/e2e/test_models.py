"""Real exported models end to end through the frontend: GPT-2, BERT and a small CNN, each
from both PyTorch exporters (TorchScript "legacy" and torch.export "dynamo").

The models are scripts/export_test_models.py's exports (tiny configs, random weights from
fixed seeds, nothing from the network), committed in tests/data/test-models/: exporting all six
in each test session took CI about 20 s of CPU time, mostly the dynamo exporter's.  Its README
says how to export them again, with which package versions.  For each model:

* the exporter wrote each input's dynamic axes under their own names (dim_param);
* the import gives a ``main`` whose symbolic variables (parameters and every binding's
  annotation) are exactly the input's dynamic axes: a fresh variable means a shape the
  deduction lost (e.g. a Reshape whose -1 could not be resolved);
* the reference interpreter matches onnxruntime at each shape, and every intermediate value
  has the shape and dtype its annotation says;
* one build per model (the whole compiler) runs every shape in the Python runtime on wgpu
  and on its kernels.wasm (the ``backend`` fixture), and matches onnxruntime (the MODEL tolerance of tests/helpers.py, as the interpreter);
* after every pass, at opt levels 1 and 0, the module is well formed and its printed text
  parses back to a structurally equal module.
"""

from __future__ import annotations

from pathlib import Path

import pytest

from relaxweb.ir.module import IRModule
from relaxweb.ir.parser import parse_module
from relaxweb.ir.printer import format_module, module_constants
from relaxweb.ir.structural import assert_structural_equal
from relaxweb.ir.well_formed import check_well_formed
from relaxweb.passes import pipeline, run_pipeline
from tests.helpers import MODEL, assert_close, load_bundle
from tests.model_exports import (
    MODELS, CheckingInterpreter, Export, committed_exports, export_script, symbolic_vars,
)

pytestmark = pytest.mark.slow  # six models through the whole compiler, at two opt levels


@pytest.fixture(scope="session")
def exports() -> dict[str, Export]:
    return committed_exports(list(MODELS))


def exported(exports: dict[str, Export], name: str) -> Export:
    return exports[name]


_imports: dict[str, object] = {}


def imported(exports: dict[str, Export], name: str):
    """The imported module (once per session), or a failure carrying the import error."""
    from relaxweb.frontend import import_onnx_file

    if name not in _imports:
        try:
            _imports[name] = import_onnx_file(exported(exports, name).path)
        except Exception as error:  # noqa: BLE001 - reported by every test of the model
            _imports[name] = error
    result = _imports[name]
    if isinstance(result, BaseException):
        pytest.fail(f"import of {name} failed: {describe_import_error(exports[name].path, result)}", pytrace=False)
    return result


def describe_import_error(path: Path, error: BaseException) -> str:
    """The error; unsupported ops as one line per op type with its node count and first node."""
    from relaxweb.errors import UnsupportedModelError
    from relaxweb.frontend.onnx import find_unsupported, load_onnx

    if not isinstance(error, UnsupportedModelError):
        return f"{type(error).__name__}: {error}"
    unsupported = find_unsupported(load_onnx(path))
    if not unsupported:
        return f"{type(error).__name__}: {error}"
    lines = [f"{op}: {len(nodes)} node(s), e.g. {nodes[0]}" for op, nodes in sorted(unsupported.items())]
    return f"{len(unsupported)} unsupported op type(s):\n  " + "\n  ".join(lines)


@pytest.mark.parametrize("name", list(MODELS))
def test_export_names_dynamic_axes(exports: dict[str, Export], name: str) -> None:
    """The exporter wrote the dynamic axes under their own names (dim_param) in every input
    (read from the model; the sidecar says what the script asked for)."""
    export = exported(exports, name)
    written = export_script()._dim_params(export.path)["inputs"]
    for spec in export.sidecar["inputs"]:
        assert written[spec["name"]] == spec["dims"], f"{name}: input {spec['name']} was written as {written[spec['name']]}"


@pytest.mark.parametrize("name", list(MODELS))
def test_import_symbolic_vars(exports: dict[str, Export], name: str) -> None:
    expected, _ = MODELS[name]
    found = symbolic_vars(imported(exports, name).main)
    fresh = {var: where for var, where in found.items() if var not in expected}
    assert set(found) == expected, (
        f"{name}: symbolic variables {sorted(found)}, expected {sorted(expected)}; "
        + "; ".join(f"{var} first in {where}" for var, where in fresh.items())
    )


def _shape_id(shape: dict[str, int]) -> str:
    return "-".join(f"{k}{v}" for k, v in shape.items())


@pytest.mark.parametrize(
    "name, dims",
    [(name, dims) for name, (_, shapes) in MODELS.items() for dims in shapes],
    ids=[f"{name}-{_shape_id(dims)}" for name, (_, shapes) in MODELS.items() for dims in shapes],
)
def test_interpreter_matches_onnxruntime(exports: dict[str, Export], name: str, dims: dict[str, int]) -> None:
    import onnxruntime as ort

    module = imported(exports, name)
    export = exported(exports, name)
    inputs = export_script().make_inputs(export.sidecar["inputs"], dims, seed=sum(dims.values()))
    session = ort.InferenceSession(str(export.path), providers=["CPUExecutionProvider"])
    expected = session.run(None, inputs)
    actual = CheckingInterpreter(module).run(module.main, inputs)
    names = [o.name for o in session.get_outputs()]
    assert len(actual) == len(expected), f"{name}: {len(actual)} outputs, onnxruntime gives {len(expected)} ({names})"
    for output, got, want in zip(names, actual, expected):
        assert got.shape == want.shape, f"{name} {output}: shape {got.shape}, onnxruntime {want.shape}"
        assert got.dtype == want.dtype, f"{name} {output}: dtype {got.dtype}, onnxruntime {want.dtype}"
        assert_close(got, want, MODEL, err_msg=f"{name} output {output} at {dims}")


@pytest.mark.parametrize("opt_level", [1, 0])
@pytest.mark.parametrize("name", list(MODELS))
def test_every_pass_output_is_well_formed_and_round_trips(exports: dict[str, Export], name: str, opt_level: int) -> None:
    def check(step: str, module: IRModule) -> None:
        check_well_formed(module)  # graph functions; a host function has no variables left to check
        text = format_module(module)
        parsed = parse_module(text, module_constants(module))
        try:
            assert_structural_equal(parsed, module)
        except AssertionError:
            pytest.fail(f"{name}: the module after {step} does not round-trip through its text", pytrace=False)
        assert format_module(parsed) == text, f"{name}: the text after {step} changes when parsed and printed again"

    module = imported(exports, name)
    check("import", module)
    run_pipeline(module, pipeline(opt_level), check)


@pytest.fixture(scope="session")
def bundle_sessions():
    """Python-runtime sessions by model name, released before the interpreter shuts down
    (wasmtime objects must not outlive the wasmtime module)."""
    import gc

    sessions: dict[str, object] = {}
    yield sessions
    sessions.clear()
    gc.collect()


def compiled_session(exports: dict[str, Export], sessions: dict, name: str, folder: Path, backend: str = "webgpu"):
    """One build per model (no bounds: storages grow), one Python-runtime session per backend."""
    from relaxweb.compiler import build_bundle

    if not (folder / name / "manifest.json").is_file():
        build_bundle(exported(exports, name).path, folder / name)
    if (name, backend) not in sessions:
        sessions[name, backend] = load_bundle(folder / name, backend)
    return sessions[name, backend]


@pytest.mark.parametrize(
    "name, dims",
    [(name, dims) for name, (_, shapes) in MODELS.items() for dims in shapes],
    ids=[f"{name}-{_shape_id(dims)}" for name, (_, shapes) in MODELS.items() for dims in shapes],
)
def test_compiled_bundle_matches_onnxruntime(backend, exports: dict[str, Export], bundle_sessions, tmp_path_factory,
                                             name: str, dims: dict[str, int]) -> None:
    """The whole compiler and the Python runtime (wgpu, lavapipe here; and kernels.wasm on
    wasmtime), every shape from one build."""
    import onnxruntime as ort

    export = exported(exports, name)
    session = compiled_session(exports, bundle_sessions, name, tmp_path_factory.getbasetemp(), backend)
    inputs = export_script().make_inputs(export.sidecar["inputs"], dims, seed=sum(dims.values()))
    reference = ort.InferenceSession(str(export.path), providers=["CPUExecutionProvider"])
    expected = reference.run(None, inputs)
    actual = session.run(inputs)
    for output, want in zip(reference.get_outputs(), expected):
        got = actual[output.name]
        assert got.shape == want.shape, f"{name} {output.name}: shape {got.shape}, onnxruntime {want.shape}"
        assert_close(got, want, MODEL, err_msg=f"{name} output {output.name} at {dims}")


@pytest.mark.gpu
@pytest.mark.parametrize("name", list(MODELS))
def test_the_shaders_for_gpu_adapters_match_onnxruntime_too(exports: dict[str, Export], bundle_sessions,
                                                            tmp_path_factory, name: str) -> None:
    """lavapipe is a CPU adapter, so the sessions above compile the matmuls' CPU shaders
    (``cpu_file``); the shaders a GPU adapter compiles (staged tiled matmuls) are checked
    here, at the model's first shape, from the same build."""
    import onnxruntime as ort

    from relaxweb.runtime import Session

    export = exported(exports, name)
    compiled_session(exports, bundle_sessions, name, tmp_path_factory.getbasetemp())  # builds once
    session = Session(tmp_path_factory.getbasetemp() / name, kernels="gpu")
    assert session.kernels == "gpu"
    dims = MODELS[name][1][0]
    inputs = export_script().make_inputs(export.sidecar["inputs"], dims, seed=sum(dims.values()))
    reference = ort.InferenceSession(str(export.path), providers=["CPUExecutionProvider"])
    actual = session.run(inputs)
    for output, want in zip(reference.get_outputs(), reference.run(None, inputs)):
        assert_close(actual[output.name], want, MODEL, err_msg=f"{name} output {output.name} at {dims}")
