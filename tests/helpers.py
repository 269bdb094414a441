"""What the tests share: the float tolerances (and ``assert_close``), one random-array maker
(``rand``), one ONNX model maker (``make_model``) and ONNX's node test cases (``onnx_node_cases``).

Tolerances
----------
A float comparison must allow what float32 rounding may legitimately differ by on another
CPU, numpy build, BLAS kernel or GPU driver, and nothing near what a bug gives: a wrong index,
a missing bias or a wrong reduction is off by O(1) (relative 1e-1 or more on unit-scale data).

float32 has EPS32 = 2**-23 ~ 1.19e-7 (one ulp at 1.0; the unit roundoff is EPS32 / 2).

- One correctly rounded op (+, -, *, / on the CPU, +, -, * in WGSL) is within 0.5 ulp; a chain
  of k such ops is within ~k ulps of the exact value, so two evaluations differ by ~2k ulps.
- Transcendental functions are not correctly rounded: numpy's float32 exp, log, tanh, sin...
  take SIMD paths (AVX2, AVX512) chosen by the CPU, a few ulps apart; WGSL allows exp / exp2
  3 + 2|x| ulps, log / log2 3 ulps (absolute 2**-21 ~ 4.8e-7 in [0.5, 2]), x / y 2.5 ulps,
  and tanh, sinh, pow, sqrt... inherit their formula's error (tanh near 0: an absolute error of
  a few ulps of 1).
- A reduction of K terms summed in another order (BLAS kernels block and use FMA differently on
  each CPU; the GPU's tiles and workgroup trees sum in their own order) differs by up to
  (K - 1) * EPS32 * sum|t|.  In practice the roundings are independent, so the difference is
  ~ sqrt(K) * EPS32 * |t| (K = 64 unit terms: ~1e-6).  That is an *absolute* error: where the
  terms cancel (a dot product near 0, x - mean) the relative error is unbounded, so every
  float comparison has an absolute tolerance of the terms' magnitude times ~10 ulps.

Hence the tiers (rtol, atol), each tried at its tightest on this suite with numpy's SIMD paths
disabled and OpenBLAS forced to other CPUs' kernels (see the issue's closing note):

``F32`` (the default): float32 results of unit-scale computations (inputs ~N(0, 1) or
    uniform in a few units; terms of magnitude <= ~10) on the CPU or on the GPU: elementwise
    chains of up to ~10 ops, transcendentals, reductions up to ~100 terms.  rtol 1e-5 is
    ~84 ulps (exp on the GPU at |x| = 10 is 23 ulps); atol 1e-6 is ~8 ulps of 1.0, >= 5x the
    sqrt(K) estimate above for K <= 16 and the absolute error of WGSL's log near 1.
``REDUCTION``: longer reductions and matmuls whose tiles sum in another order on the GPU
    (K up to a few hundred, sum|t| up to ~100): rtol 1e-4, atol 1e-5.
``MODEL``: whole exported models (GPT-2, BERT, a CNN; dozens of layers of K = 64..768
    reductions, layer norms, softmax, GELU) against onnxruntime's kernels: rtol = atol = 1e-4.
``ONNX_CASE``: ONNX's own expected outputs, some computed in float64 or with other formulas
    (ONNX's backend runner uses rtol 1e-3 itself): rtol 1e-3, atol 1e-4.
``FLOAT16``: float16 results (eps 2**-10 ~ 9.8e-4): rtol 1e-3 (one float16 ulp), atol 1e-3.

Exact comparisons (``np.testing.assert_array_equal``) stay where results are exact: integers,
bools, copies, gathers, slices, max / min, index arithmetic.
"""

from __future__ import annotations

import importlib
import os
import pickle
import sys
import warnings
from pathlib import Path
from typing import Iterable, NamedTuple

import numpy as np
import onnx
from onnx import TensorProto, helper, numpy_helper

EPS32 = float(np.finfo(np.float32).eps)  # 2**-23


class Tolerance(NamedTuple):
    rtol: float
    atol: float


F32 = Tolerance(rtol=1e-5, atol=1e-6)
REDUCTION = Tolerance(rtol=1e-4, atol=1e-5)
MODEL = Tolerance(rtol=1e-4, atol=1e-4)
ONNX_CASE = Tolerance(rtol=1e-3, atol=1e-4)
FLOAT16 = Tolerance(rtol=1e-3, atol=1e-3)


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
