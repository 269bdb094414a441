"""What the tests share: the float tolerances (and ``assert_close``), one random-array maker
(``rand``), one ONNX model maker (``make_model``) and ONNX's node test cases (``onnx_node_cases``).

Tolerances
----------
A float comparison must allow what float32 rounding may legitimately differ by on another
CPU, numpy build, BLAS kernel or GPU driver, and nothing near what a bug gives: a wrong index,
a missing bias or a wrong reduction is off by O(1) (1e-1 or more on unit-scale data).

float32's EPS32 = 2**-23 ~ 1.19e-7 is one ulp at 1.0 (the unit roundoff is EPS32 / 2).

- One correctly rounded op (+, -, *, / on the CPU; +, -, * in WGSL) is within half an ulp;
  a chain of k ops is within ~k ulps, so two evaluations of it differ by up to ~2k ulps.
- Transcendental functions are not correctly rounded.  numpy's float32 exp, log, tanh, sin...
  take SIMD paths picked by the CPU (AVX2, AVX512), a few ulps apart.  WGSL allows x / y
  2.5 ulps, exp 3 + 2|x| ulps, log 3 ulps (absolute 2**-21 ~ 4.8e-7 in [0.5, 2]); tanh,
  pow, sqrt... inherit the error of their formula (pow = exp2(y * log2(x)): ~1e-5 relative
  at x^10 ~ 1e6; tanh near 0: a few ulps of 1, absolute).
- A sum of K terms computed in another order (BLAS kernels block, vectorize and use FMA
  differently on each CPU; GPU tiles and workgroup trees have their own order) differs by up
  to (K - 1) * EPS32 * sum|t|, in practice ~ sqrt(K) * EPS32 * |t| (independent roundings).
  That is an *absolute* error: where the terms cancel (a dot product near 0, x - mean,
  mish at very negative x) the relative error is unbounded, so every float comparison needs
  an absolute tolerance at the scale of the terms.

Tiers (rtol, atol):

``F32`` (the default), rtol 1e-5 (~84 ulps), atol 1e-6 (~8 ulps of 1.0): float32 results of
    unit-scale computations (data ~N(0, 1) or uniform in a few units, terms up to ~10), on
    the CPU or the GPU: elementwise chains up to ~10 ops, transcendentals of moderate
    arguments (WGSL exp at |x| = 10: 23 ulps), reductions up to ~16 unit-scale terms in
    another order (sqrt(16) * EPS32 ~ 5e-7 < atol).
``F32_LOOSE``, rtol 1e-4, atol 1e-5: the same with amplified rounding: reductions of tens to
    hundreds of terms in another order (tiled matmuls and convolutions, workgroup trees on the
    GPU), terms well above 10, large transcendental arguments on the GPU (pow), cancelling
    formulas (mish: an absolute |x| * EPS32 up to 3.6e-6 at x = -30).
``MODEL``, rtol = atol = 1e-4: whole models (the example MLP; GPT-2, BERT and a CNN exported
    from torch: layers of matmuls, layer norms, softmax, GELU) against onnxruntime's kernels,
    in the interpreter, the Python runtime and Chromium.
``ONNX_CASE``, rtol 1e-3, atol 1e-4: the outputs ONNX ships with its node test cases, some
    computed in float64, by other formulas, or written out with four digits (AveragePool's
    0.1511); ONNX's own runner uses rtol 1e-3.
``FLOAT16``, rtol 1e-3, atol 1e-3: float16 results (one float16 ulp is 2**-10 ~ 9.8e-4).
``F16_MODEL``, rtol = atol = 2e-3: whole models (the GPT-2-like and CNN test models) whose
    matmuls and convolutions ran their f16 shaders (``kernels="f16"``: factors rounded to f16
    and multiplied in f16, summed in f32; relaxweb/passes/schedule_programs.py) against onnxruntime.
    Each product is off by up to 5 f16 unit roundoffs (2**-11 ~ 4.9e-4) of its magnitude, so a
    K-term sum by ~sqrt(K) * 4.9e-4 * |term| in practice (single matmuls are checked against
    that bound itself, tests/wgsl/test_f16_kernels.py).  Measured on lavapipe at the test shapes:
    at most 2.4e-4 on GPT-2's logits (|logit| < 0.48) and 4.0e-4 on the CNN's (< 0.79), a
    fifth of this tier, which is still 50x below an O(1e-1) error.

Each tier is at least 1000x below an O(1) error.  Measured on this suite (everything but the
browser and slow tests, on lavapipe) as it is, with numpy's AVX2 paths disabled
(NPY_DISABLE_CPU_FEATURES=X86_V3) and with OpenBLAS forced to other CPUs' kernels
(OPENBLAS_CORETYPE=Prescott, Sandybridge): the largest error of any comparison is 0.18 of its
tolerance (an ONNX case's four-digit output), 0.15 for F32_LOOSE (mish on the GPU) and 0.12
for F32 (a K = 13 matmul on the GPU); the whole models (a full run) use 0.3% of MODEL.  The
old rtol 1e-6 / atol 1e-7 failed here (test_passes.py: 1.2e-7 at 0.0105, one ulp of the
unit-scale terms of a matmul that OpenBLAS sums in another order), and the Gemm tests
reached 0.24 of F32 (terms up to 12; now F32_LOOSE).

Exact comparisons (``np.testing.assert_array_equal``) stay where results are exact: integers,
bools, copies, gathers, slices, max / min, index arithmetic.
"""

from __future__ import annotations

import contextlib
import importlib
import json
import os
import pickle
import subprocess
import sys
import warnings
from pathlib import Path
from typing import Iterable, NamedTuple

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

import relaxweb

EPS32 = float(np.finfo(np.float32).eps)  # 2**-23


class Tolerance(NamedTuple):
    rtol: float
    atol: float


F32 = Tolerance(rtol=1e-5, atol=1e-6)
F32_LOOSE = Tolerance(rtol=1e-4, atol=1e-5)
MODEL = Tolerance(rtol=1e-4, atol=1e-4)
ONNX_CASE = Tolerance(rtol=1e-3, atol=1e-4)
FLOAT16 = Tolerance(rtol=1e-3, atol=1e-3)
F16_MODEL = Tolerance(rtol=2e-3, atol=2e-3)


def assert_close(actual, expected, tolerance: Tolerance = F32, *, err_msg: str = "", equal_nan: bool = True) -> None:
    """``np.testing.assert_allclose`` at one of the tiers above (the default: ``F32``)."""
    np.testing.assert_allclose(actual, expected, rtol=tolerance.rtol, atol=tolerance.atol, err_msg=err_msg,
                               equal_nan=equal_nan)


# Random arrays ------------------------------------------------------------------------------


def rand(*shape, seed: int = 0, low: float | None = None, high: float | None = None,
         dtype: str | np.dtype = "float32") -> np.ndarray:
    """A reproducible array: ``rand(3, 4)`` or ``rand((3, 4))``.

    Floats are standard normal, or uniform in [low, high) when either bound is given (the other
    defaults to -1 / 1); integers are uniform in [low, high), by default [-20, 20).  The same
    seed always gives the same values (``np.random.default_rng(seed)``).
    """
    if len(shape) == 1 and isinstance(shape[0], (tuple, list)):
        shape = tuple(shape[0])
    generator = np.random.default_rng(seed)
    if np.issubdtype(np.dtype(dtype), np.integer):
        return generator.integers(-20 if low is None else low, 20 if high is None else high, size=shape).astype(dtype)
    if low is None and high is None:
        return generator.standard_normal(shape).astype(dtype)
    return generator.uniform(-1.0 if low is None else low, 1.0 if high is None else high, shape).astype(dtype)


# ONNX models --------------------------------------------------------------------------------


def value_info(spec) -> onnx.ValueInfoProto:
    """A graph input or output: a ``ValueInfoProto`` as it is, a name (float32, no shape), or a
    tuple of the name and, in any order, an element type (``TensorProto.INT64``: an int) and a
    shape (a list or tuple of ints and dim_param names, or None for no shape)."""
    if isinstance(spec, onnx.ValueInfoProto):
        return spec
    if isinstance(spec, str):
        spec = (spec,)
    name, elem_type, shape = spec[0], TensorProto.FLOAT, None
    for part in spec[1:]:
        if isinstance(part, (int, np.integer)):
            elem_type = int(part)
        else:
            shape = None if part is None else list(part)
    return helper.make_tensor_value_info(name, elem_type, shape)


def make_model(nodes: Iterable[onnx.NodeProto], inputs, outputs, initializers=None, *, opset: int | dict = 17,
               check: bool = False, name: str = "test", ir_version: int = 8) -> onnx.ModelProto:
    """A one-graph ONNX model.

    ``inputs`` / ``outputs``: what ``value_info`` takes (outputs are usually a name: no
    declared type beyond float32 and no shape, so nothing comes from ONNX's shape inference);
    ``initializers``: a dict of name -> array, or TensorProtos; ``opset``: the default
    domain's version, or a dict of domain -> version.  IR version 8 by default, which every
    onnxruntime the tests support loads.  ``check``: run ONNX's checker (after its shape
    inference) on the model.
    """
    if isinstance(initializers, dict):
        initializers = [numpy_helper.from_array(np.asarray(value), key) for key, value in initializers.items()]
    graph = helper.make_graph(list(nodes), name, [value_info(i) for i in inputs], [value_info(o) for o in outputs],
                              initializer=list(initializers or ()))
    opsets = opset if isinstance(opset, dict) else {"": opset}
    model = helper.make_model(graph, opset_imports=[helper.make_opsetid(domain, v) for domain, v in opsets.items()])
    if ir_version is not None:
        model.ir_version = ir_version
    if check:
        onnx.checker.check_model(onnx.shape_inference.infer_shapes(model))
    return model


def load_bundle(folder: str | Path, backend: str, **options):
    """The bundle in ``folder`` loaded by the Python runtime on ``backend`` (the ``backend``
    fixture of tests/conftest.py: "webgpu" or "wasm"), checked to be on it: never a silent
    fallback.  ``options`` are ``relaxweb.load``'s (the WebGPU ones only for "webgpu")."""
    session = relaxweb.load(folder, backend=backend, **options)
    assert session.backend == backend, (session.backend, backend)
    return session


_BUILDS: dict[tuple, Path] = {}


def build_once(model: onnx.ModelProto | str | Path, folder: Path, **options) -> Path:
    """The bundle of ``model`` (in memory or a file) built by ``relaxweb.build`` with
    ``options`` into ``folder``, once per test session: a later call with an equal model and
    options (the same test on the other backend) gets the first call's folder, unbuilt."""
    source = model.SerializeToString() if isinstance(model, onnx.ModelProto) else str(Path(model).resolve())
    key = (source, json.dumps(options, sort_keys=True, default=str))
    if key not in _BUILDS:
        _BUILDS[key] = relaxweb.build(model, folder, **options).path
    return _BUILDS[key]


def onnxruntime_outputs(model: onnx.ModelProto | str | Path, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    """The reference: onnxruntime's CPU outputs of a model (in memory or a file), in order."""
    import onnxruntime  # noqa: PLC0415 - imported here so that importing the helpers stays cheap

    source = model.SerializeToString() if isinstance(model, onnx.ModelProto) else str(model)
    return onnxruntime.InferenceSession(source, providers=["CPUExecutionProvider"]).run(None, feeds)


@contextlib.contextmanager
def demo_page(bundle: Path):
    """A headless Chromium page on the demo of ``bundle``, served as ``relaxweb serve`` serves
    it; the browser and the server are closed afterwards."""
    from relaxweb import browser  # noqa: PLC0415 - Playwright only for the tests that use it

    server = browser.start_server(bundle)
    try:
        with browser.sync_playwright() as playwright:
            chromium = browser.launch_chromium(playwright)
            try:
                page = chromium.new_page()
                page.goto(server.url)  # type: ignore[attr-defined]
                yield page
            finally:
                chromium.close()
    finally:
        browser.stop_server(server)


def in_the_browser(test):
    """A test with the marks of tests/runtime_js/test_browser.py: ``browser``, and skipped without
    Playwright or Chromium."""
    from tests.runtime_js.test_browser import pytestmark  # noqa: PLC0415 - that module imports these helpers

    for mark in pytestmark:
        test = mark(test)
    return test


# ONNX's node test cases ---------------------------------------------------------------------


#: Generated cases are kept here per onnx version (importing the pooling modules runs ONNX's
#: pure-Python reference pools for ~13 s of CPU); delete the folder to regenerate.
CASE_CACHE = Path(__file__).resolve().parent.parent / ".cache" / "onnx-node-cases"
_CASES_BY_MODULE: dict[str, list] = {}


def onnx_node_cases(modules: Iterable[str]) -> list:
    """ONNX's node test cases recorded by the ``onnx.backend.test.case.node`` modules named
    (importing one runs its exports, which compute the expected outputs; much faster than
    collecting all ~1900 cases), in module order.

    The cases of each module are generated once per onnx (and numpy) version and kept in
    CASE_CACHE.  Generating silences the exports' warnings and restores numpy's global random
    state, which they reseed.
    """
    cases = []
    for module in modules:
        if module not in _CASES_BY_MODULE:
            _CASES_BY_MODULE[module] = _cached_cases(module)
        cases += _CASES_BY_MODULE[module]
    return cases


def _cached_cases(module: str) -> list:
    path = CASE_CACHE / f"onnx-{onnx.__version__}-numpy-{np.__version__}" / f"{module}.pickle"
    try:
        return pickle.loads(path.read_bytes())
    except Exception:  # noqa: BLE001 - missing, or written by another version: generate
        pass
    cases = _generate_cases(module)
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        partial = path.with_name(f"{path.name}.{os.getpid()}")
        partial.write_bytes(pickle.dumps(cases))
        os.replace(partial, path)
    except OSError:  # a read-only checkout: generate every time
        pass
    return cases


def _generate_cases(module: str) -> list:
    from onnx.backend.test.case import node as node_cases

    name = f"onnx.backend.test.case.node.{module}"
    if name in sys.modules:
        raise RuntimeError(f"{name} was imported before: its cases cannot be told from the others")
    recorded = len(node_cases._NodeTestCases)
    state = np.random.get_state()
    target = node_cases._TargetOpType
    node_cases._TargetOpType = None  # record every case (collect_testcases(op_type) may have set it)
    try:
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            importlib.import_module(name)
    finally:
        node_cases._TargetOpType = target
        np.random.set_state(state)
    return list(node_cases._NodeTestCases[recorded:])


def js_manifest_problems(manifests: list, folder: Path) -> list:
    """What the JS runtime's validator (``runtime_js/manifest.js``'s ``manifestProblem``) says of
    each manifest, run in node (the caller skips when node is missing), for comparison with
    ``relaxweb.runtime.manifest.manifest_problem``'s messages."""
    validator = Path(__file__).resolve().parent.parent / "relaxweb/runtime_js/manifest.js"
    (folder / "cases.json").write_text(json.dumps(manifests))
    script = (f"import {{ manifestProblem }} from {json.dumps(validator.as_uri())};\n"
              "import { readFileSync } from 'node:fs';\n"
              f"const cases = JSON.parse(readFileSync({json.dumps(str(folder / 'cases.json'))}, 'utf8'));\n"
              "console.log(JSON.stringify(cases.map(manifestProblem)));\n")
    (folder / "check.mjs").write_text(script)
    result = subprocess.run(["node", str(folder / "check.mjs")], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)
