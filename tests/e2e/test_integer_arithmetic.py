"""Integer arithmetic against onnxruntime: never a wrapped value.

The GPU holds an int64 tensor as int32 and WGSL kernels compute int64 in 32 bits
(``relaxweb/ir/dtype.py``): on WebGPU an int64 result that does not fit is the run's error,
naming the node (``relaxweb/ir/value_ranges.py`` decides which operations need the check).
kernels.wasm holds and computes int64 exactly: on the wasm backend the answer is
onnxruntime's.  On both, an integer division or modulo by zero fails as onnxruntime's does;
int32 wraps, as onnxruntime's does.

- one test per case of issue 29 (``5 * i``, a ReduceSum, a CumSum, ``INT32_MIN / -1``, a
  division by zero), on both backends of the Python runtime and in the reference interpreter;
- a differential property test (hypothesis): one-node models of Add, Sub, Mul, Div, Mod, Neg,
  Abs, ReduceSum, ReduceProd, CumSum, Cast (to int64 from int32, uint32 and float32; int64 to
  int32) and Pow (``x ** 3``) on int32 and int64 values around +-2^31 and +-2^53.  An answer
  must equal onnxruntime's; on WebGPU it may instead be an error where an int64 value of the
  computation (an input, a partial result, the output) does not fit int32; on both, an error
  where onnxruntime fails: never a different number.  CI runs a few examples; the ``slow``
  test many.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from functools import lru_cache
from pathlib import Path

import numpy as np
import onnx
import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from onnx import TensorProto, helper

import relaxweb
from relaxweb.errors import RelaxwebError
from tests.helpers import build_once, load_bundle, make_model, onnxruntime_outputs

INT32_MIN, INT32_MAX = -2**31, 2**31 - 1
ONNX_TYPES = {"int32": TensorProto.INT32, "int64": TensorProto.INT64, "uint32": TensorProto.UINT32,
              "float32": TensorProto.FLOAT}
OVERFLOW = "the int64 result does not fit in the 32 bits the device holds int64 in"
OVERFLOW32 = "the int32 result does not fit in 32 bits"


def _fits(values) -> bool:
    values = np.asarray(values, dtype=object).reshape(-1)
    return all(INT32_MIN <= int(v) <= INT32_MAX for v in values)


# The cases of the issue ------------------------------------------------------------------------


@dataclass(frozen=True)
class IssueCase:
    """One node ``node_name`` of ``op`` on int64 inputs, its feeds and the run's error."""

    op: str
    inputs: tuple[str, ...]
    feeds: dict
    error: str
    attrs: tuple = ()
    initializers: tuple = ()

    def model(self) -> onnx.ModelProto:
        node = helper.make_node(self.op, list(self.inputs) + [name for name, _ in self.initializers], ["y"],
                                name="node_" + self.op.lower(), **dict(self.attrs))
        return make_model([node], [(name, TensorProto.INT64, ["n"]) for name in self.inputs],
                          [("y", TensorProto.INT64)], dict(self.initializers))


ISSUE_CASES = {
    "5_times_i": IssueCase("Mul", ("x",), {"x": np.array([3, 2**30], np.int64)}, f"node 'node_mul' (Mul): {OVERFLOW}",
                           initializers=(("five", np.array(5, np.int64)),)),
    "reduce_sum": IssueCase("ReduceSum", ("x",), {"x": np.array([INT32_MAX, INT32_MAX, 5], np.int64)},
                            f"node 'node_reducesum' (ReduceSum): {OVERFLOW}", attrs=(("keepdims", 0),)),
    "cumsum": IssueCase("CumSum", ("x",), {"x": np.array([INT32_MAX, INT32_MAX, 5], np.int64)},
                        f"node 'node_cumsum' (CumSum): {OVERFLOW}", initializers=(("axis", np.array(0, np.int64)),)),
    "int32_min_over_minus_one": IssueCase("Div", ("x", "d"), {"x": np.array([7, INT32_MIN], np.int64),
                                                              "d": np.array([2, -1], np.int64)},
                                          f"node 'node_div' (Div): {OVERFLOW}"),
    "division_by_zero": IssueCase("Div", ("x", "d"), {"x": np.array([7, 5], np.int64), "d": np.array([2, 0], np.int64)},
                                  "node 'node_div' (Div): integer division by zero"),
    "modulo_by_zero": IssueCase("Mod", ("x", "d"), {"x": np.array([7, 5], np.int64), "d": np.array([2, 0], np.int64)},
                                "node 'node_mod' (Mod): integer modulo by zero"),
}


@pytest.fixture(scope="module")
def issue_bundles(tmp_path_factory) -> dict[str, Path]:
    folder = tmp_path_factory.mktemp("integer_issue_cases")
    return {name: relaxweb.build(case.model(), folder / name).path for name, case in ISSUE_CASES.items()}


@pytest.mark.parametrize("name", ISSUE_CASES)
def test_an_int64_result_outside_int32_fails_on_webgpu_and_is_exact_on_wasm_a_zero_divisor_fails(name: str, backend: str,
                                                                        issue_bundles: dict[str, Path]) -> None:
    case = ISSUE_CASES[name]
    session = load_bundle(issue_bundles[name], backend)
    if backend == "wasm" and "zero" not in name:  # int64 is exact in kernels.wasm
        np.testing.assert_array_equal(session.run(case.feeds)["y"], onnxruntime_outputs(case.model(), case.feeds)[0])
        return
    with pytest.raises(RelaxwebError) as caught:
        session.run(case.feeds)
    assert str(caught.value) == case.error
    fine = {key: np.where((np.abs(value) < 2**20) & (value != 0), value, 1).astype(np.int64)
            for key, value in case.feeds.items()}  # the large values and zeros made 1: the bundle answers
    np.testing.assert_array_equal(session.run(fine)["y"], onnxruntime_outputs(case.model(), fine)[0])


def test_the_reference_computes_int64_and_refuses_a_zero_divisor() -> None:
    for name, case in ISSUE_CASES.items():
        model = case.model()
        if "zero" in name:
            with pytest.raises(RelaxwebError, match="by zero"):
                relaxweb.run_reference(model, case.feeds)
        else:
            np.testing.assert_array_equal(relaxweb.run_reference(model, case.feeds)["y"],
                                          onnxruntime_outputs(model, case.feeds)[0], err_msg=name)


# The differential property test ----------------------------------------------------------------


@dataclass(frozen=True)
class OpCase:
    """A one-node model: ``op`` with ``arity`` inputs of ``dtype`` (``source`` for a Cast's
    input), its attributes and constant inputs (int64 scalars, by name)."""

    op: str
    dtype: str
    arity: int = 2
    attrs: tuple = ()
    initializers: tuple = ()
    source: str | None = None

    @property
    def input_dtype(self) -> str:
        return self.source or self.dtype

    def model(self) -> onnx.ModelProto:
        names = ["a", "b"][:self.arity]
        node = helper.make_node(self.op, names + [name for name, _ in self.initializers], ["y"], name="under_test",
                                **dict(self.attrs))
        inputs = [(name, ONNX_TYPES[self.input_dtype], ["n"]) for name in names]
        constants = {name: np.array(value, np.int64) for name, value in self.initializers}
        return make_model([node], inputs, [("y", ONNX_TYPES[self.dtype])], constants)


def _op_cases() -> list[OpCase]:
    cases = []
    for dtype in ("int32", "int64"):
        cases += [OpCase(op, dtype) for op in ("Add", "Sub", "Mul", "Div", "Mod")]
        cases += [OpCase("Mod", dtype, attrs=(("fmod", 1),)), OpCase("Neg", dtype, 1), OpCase("Abs", dtype, 1),
                  OpCase("ReduceSum", dtype, 1, (("keepdims", 0),)), OpCase("ReduceProd", dtype, 1, (("keepdims", 0),)),
                  OpCase("CumSum", dtype, 1, initializers=(("axis", 0),)),
                  OpCase("CumSum", dtype, 1, (("reverse", 1), ("exclusive", 1)), (("axis", 0),))]
    cases += [OpCase("Cast", "int64", 1, (("to", TensorProto.INT64),), source=source)
              for source in ("int32", "uint32", "float32")]
    cases += [OpCase("Pow", "int64", 1, initializers=(("three", 3),))]  # x * x * x
    cases += [OpCase("Cast", "int32", 1, (("to", TensorProto.INT32),), source="int64")]
    return cases


OP_CASES = _op_cases()
EDGES = [0, 1, -1, 2, -2, 3, 5, -7, 46340, 46341, -46341, 65536, 2**30, INT32_MAX, INT32_MIN, INT32_MAX - 1,
         INT32_MIN + 1, 2**31, -2**31 - 1, 2**32, 2**53, -2**53, 2**53 + 1, -2**53 - 1, 2**62]


def _values(dtype: str) -> st.SearchStrategy:
    """Values of ``dtype`` near the edges of int32 and of float64's integers, and small ones."""
    if dtype == "float32":
        return st.sampled_from([float(v) for v in EDGES] + [0.5, -2.5, 1e9, -3e9])
    if dtype == "uint32":
        return st.sampled_from([v for v in EDGES if 0 <= v < 2**32] + [2**32 - 1])
    if dtype == "int32":
        return st.one_of(st.sampled_from([v for v in EDGES if INT32_MIN <= v <= INT32_MAX]), st.integers(-60, 60),
                         st.integers(INT32_MIN, INT32_MAX))
    return st.one_of(st.sampled_from(EDGES), st.integers(-60, 60), st.integers(-2**33, 2**33))


@st.composite
def op_examples(draw, cases: list[OpCase] = OP_CASES) -> tuple[OpCase, dict[str, np.ndarray]]:
    case = draw(st.sampled_from(cases))
    length = draw(st.integers(1, 4))
    feeds = {}
    for name in ["a", "b"][:case.arity]:
        values = draw(st.lists(_values(case.input_dtype), min_size=length, max_size=length))
        feeds[name] = np.array(values, dtype=case.input_dtype)
    if case.op == "Div" and case.dtype == "int32":  # onnxruntime dies of SIGFPE on INT32_MIN / -1
        feeds["b"] = np.where((feeds["a"] == INT32_MIN) & (feeds["b"] == -1), 1, feeds["b"]).astype(np.int32)
    return case, feeds


def _wide_values(case: OpCase, feeds: dict[str, np.ndarray], expected: np.ndarray, int64_exact: bool = False) -> bool:
    """Whether some int64 value of the computation may not fit int32: an input, the output,
    or a partial result (every partial sum lies between the sums of the negative and of the
    positive terms; every partial product's size is at most the product of the sizes >= 1);
    or a partial result of an int32 ReduceSum or ReduceProd (onnxruntime computes those in 64
    bits and saturates; the device checks each step).  ``int64_exact`` (kernels.wasm): only
    the int32 reductions' partial results count."""
    if int64_exact and case.dtype == "int64":
        return False
    values = [expected] if case.dtype == "int64" else []
    values += [v for v in feeds.values() if v.dtype == np.int64 and not int64_exact]
    checked_steps = ("ReduceSum", "ReduceProd") + (("CumSum",) if case.dtype == "int64" else ())  # int32 CumSum wraps
    if case.op in checked_steps and case.op != "ReduceProd":
        terms = [int(v) for v in feeds["a"]]
        values.append([sum(t for t in terms if t > 0), sum(t for t in terms if t < 0)])
    if case.op == "ReduceProd":
        values.append([int(np.prod([max(abs(int(v)), 1) for v in feeds["a"]], dtype=object))])
    return not all(_fits(np.asarray(v, dtype=object)) for v in values)


@lru_cache(maxsize=None)
def _bundle(case: OpCase, folder: str) -> Path:
    return relaxweb.build(case.model(), Path(folder) / f"case{OP_CASES.index(case)}").path


@lru_cache(maxsize=None)
def _session(case: OpCase, folder: str, backend: str):
    return load_bundle(_bundle(case, folder), backend)


def check_against_onnxruntime(case: OpCase, feeds: dict[str, np.ndarray], run, *, exact: bool = False,
                              int64_exact: bool = False) -> None:
    """``run(feeds)`` answers onnxruntime's answer, or fails where that is allowed (module doc);
    ``exact``: fails only where onnxruntime does (the reference computes int64 in 64 bits;
    where the exact result leaves int64 itself, numpy wraps and onnxruntime's float64 does
    not, and neither is compared); ``int64_exact`` (kernels.wasm): int64 is exact, an int32
    reduction may still fail where a partial result leaves int32."""
    int64_exact = int64_exact or exact
    if int64_exact and case.op == "Pow" and max(abs(int(v)) for v in feeds["a"]) ** 3 >= 2**63:
        return
    try:
        expected = _python_reduction(case, feeds) if int64_exact and _lossy_in_onnxruntime(case, feeds) else \
            onnxruntime_outputs(case.model(), feeds)[0]
    except Exception as error:  # noqa: BLE001 - onnxruntime's own errors: a division by zero
        assert "by zero" in str(error), error
        with pytest.raises(RelaxwebError) as caught:
            run(feeds)
        if int64_exact or _fits_inputs(feeds):  # (else the inputs may be refused first)
            assert str(caught.value) == f"node 'under_test' ({case.op}): integer {_ZERO_WORDS[case.op]} by zero"
        return
    try:
        actual = run(feeds)
    except RelaxwebError as error:
        allowed = not exact and _wide_values(case, feeds, expected, int64_exact)
        assert allowed, f"{case} {feeds}: failed with {error}, onnxruntime: {expected}"
        if _fits_inputs(feeds) or int64_exact:
            assert str(error) == f"node 'under_test' ({case.op}): {OVERFLOW if case.dtype == 'int64' else OVERFLOW32}", \
                (case, feeds)
        return
    assert actual.dtype == expected.dtype and actual.shape == expected.shape, (case, feeds, actual, expected)
    np.testing.assert_array_equal(actual, expected, err_msg=f"{case} {feeds}")


def _lossy_in_onnxruntime(case: OpCase, feeds: dict[str, np.ndarray]) -> bool:
    """onnxruntime reduces int64 and raises it to a power through float64: a term or a result
    beyond 2^53 loses its low bits there (``[2^53 + 1]`` sums to ``2^53``)."""
    if case.op not in ("ReduceSum", "ReduceProd", "Pow") or case.dtype != "int64":
        return False
    terms = [int(v) for v in feeds["a"]]
    return max(*map(abs, _python_totals(case, feeds)), *map(abs, terms)) > 2**53


def _python_totals(case: OpCase, feeds: dict[str, np.ndarray]) -> list[int]:
    """The exact sum or product of ``a``, or each element cubed."""
    terms = [int(v) for v in feeds["a"]]
    if case.op == "Pow":
        return [t ** 3 for t in terms]
    return [sum(terms)] if case.op == "ReduceSum" else [int(np.prod(np.array(terms, dtype=object)))]


def _python_reduction(case: OpCase, feeds: dict[str, np.ndarray]) -> np.ndarray:
    """:func:`_python_totals` wrapped to int64 as numpy's (beyond 2^63 onnxruntime saturates instead)."""
    wrapped = [(total + 2**63) % 2**64 - 2**63 for total in _python_totals(case, feeds)]
    return np.array(wrapped if case.op == "Pow" else wrapped[0], np.int64)


_ZERO_WORDS = {"Div": "division", "Mod": "modulo"}


def _fits_inputs(feeds: dict[str, np.ndarray]) -> bool:
    return all(v.dtype != np.int64 or _fits(v) for v in feeds.values())


def _examples(count: int):
    return settings(max_examples=count, deadline=None, derandomize=True, database=None,
                    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow])


@pytest.fixture(scope="module")
def bundle_folder(tmp_path_factory) -> str:
    return str(tmp_path_factory.mktemp("integer_ops"))


@_examples(40)
@given(example=op_examples())
def test_integer_ops_match_onnxruntime_or_fail(example, backend: str, bundle_folder: str) -> None:
    case, feeds = example
    check_against_onnxruntime(case, feeds, lambda f: _session(case, bundle_folder, backend).run(f)["y"],
                              int64_exact=backend == "wasm")


@_examples(60)
@given(example=op_examples())
def test_the_reference_matches_onnxruntime(example) -> None:
    case, feeds = example
    check_against_onnxruntime(case, feeds, lambda f: relaxweb.run_reference(case.model(), f)["y"], exact=True)


@pytest.mark.slow
@_examples(1500)
@given(example=op_examples())
def test_integer_ops_match_onnxruntime_or_fail_long(example, backend: str, bundle_folder: str) -> None:
    case, feeds = example
    check_against_onnxruntime(case, feeds, lambda f: _session(case, bundle_folder, backend).run(f)["y"],
                              int64_exact=backend == "wasm")


#: An int64 constant beyond int32 (beyond float64's integers too: 2^53 + 1).
BIG = 2**53 + 1
#: The reason the build writes into the manifest's webgpu.unavailable for it.
BIG_REASON = f"weight 'c' (int64) holds {BIG}, outside the int32 range the GPU holds int64 tensors in"


def _constant_model(op: str, c: np.ndarray) -> onnx.ModelProto:
    return make_model([helper.make_node(op, ["x", "c"], ["y"], name="big")], [("x", TensorProto.INT64, ["n"])],
                      [("y", TensorProto.INT64)], {"c": c})


@pytest.mark.parametrize("op", ["Add", "Max", "Mod"])
def test_an_int64_constant_outside_int32_runs_on_wasm_only(op: str, tmp_path) -> None:
    """A one-element int64 constant outside int32 is not written into the kernel (it could only
    be held saturated: ``x + 2^31`` answered ``x + 2^31 - 1``, ``Max(x, 2^53 + 1)`` answered
    ``2^31 - 1``): it stays a weight, int64 in its shard.  The build warns and writes why WebGPU
    cannot hold it (the manifest's ``webgpu.unavailable``); kernels.wasm answers onnxruntime's
    values exactly, and WebGPU refuses the bundle naming the weight, before asking for a device."""
    model = _constant_model(op, np.array(BIG, np.int64))
    bundle = relaxweb.build(model, tmp_path / "bundle")
    assert bundle.manifest["webgpu"] == {"unavailable": BIG_REASON}
    assert [w for w in bundle.warnings if BIG_REASON in w] != []
    (weight,) = bundle.manifest["weights"]
    assert weight["nbytes"] == 8  # elements x wasm_bytes: the shard holds int64
    x = np.array([0, 1, -3, 2**31, -2**31 - 1, 2**40, -2**40 + 7, 2**40 + 12345, -BIG], np.int64)
    [expected] = onnxruntime_outputs(model, {"x": x})
    wasm = relaxweb.load(bundle.path, backend="wasm")
    np.testing.assert_array_equal(wasm.run({"x": x})["y"], expected)
    with pytest.raises(RelaxwebError) as caught:
        relaxweb.load(bundle.path, backend="webgpu")
    assert str(caught.value) == f'WebGPU cannot run this bundle: {BIG_REASON}; load it with backend="wasm"'
    auto = relaxweb.load(bundle.path)  # "auto": wasm, whatever the machine's GPU, and why
    assert (auto.backend, auto.backend_reason) == ("wasm", f"WebGPU cannot run this bundle: {BIG_REASON}")
    np.testing.assert_array_equal(auto.run({"x": x})["y"], expected)


def test_the_cli_runs_an_int64_weight_outside_int32_on_wasm_and_says_why(tmp_path, capsys) -> None:
    from relaxweb.cli import main

    model = _constant_model("Add", np.array(BIG, np.int64))
    relaxweb.build(model, tmp_path / "bundle")
    x = np.array([2**40, -5], np.int64)
    np.savez(tmp_path / "in.npz", x=x)
    assert main(["run", str(tmp_path / "bundle"), "--inputs", str(tmp_path / "in.npz"),
                 "--out", str(tmp_path / "out.npz")]) == 0
    assert f"note: running on kernels.wasm: WebGPU cannot run this bundle: {BIG_REASON}\n" in capsys.readouterr().err
    np.testing.assert_array_equal(np.load(tmp_path / "out.npz")["y"], x + BIG)
    assert main(["run", str(tmp_path / "bundle"), "--inputs", str(tmp_path / "in.npz"), "--backend", "webgpu"]) == 2
    err = capsys.readouterr().err
    assert err == (f"error: WebGPU cannot run this bundle: {BIG_REASON}; run it with --backend wasm "
                   "(or the default, --backend auto)\n")


@pytest.mark.parametrize("op", ["Add", "Max"])
def test_an_int64_weight_within_int32_runs_on_both_backends(op: str, backend: str, tmp_path) -> None:
    """An int64 weight within int32 (int64 in its shard): WebGPU narrows it to int32 at upload,
    kernels.wasm holds it as it is; both answer onnxruntime's values."""
    model = make_model([helper.make_node(op, ["x", "c"], ["y"])], [("x", TensorProto.INT64, ["n", 2])],
                       [("y", TensorProto.INT64, ["n", 2])], {"c": np.array([3, -7], np.int64)})
    folder = build_once(model, tmp_path / "bundle")
    manifest = json.loads((folder / "manifest.json").read_text())
    assert "webgpu" not in manifest and manifest["weights"][0]["nbytes"] == 16
    x = np.array([[1, 2], [-100, 100], [2**30, -2**30]], np.int64)
    [expected] = onnxruntime_outputs(model, {"x": x})
    np.testing.assert_array_equal(load_bundle(folder, backend).run({"x": x})["y"], expected)
