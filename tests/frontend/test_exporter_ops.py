"""Ops that exported models from the wild use (tf2onnx's ReverseSequence for bidirectional
RNNs, OneHot, integer Mod, the bitwise ops, EyeLike, CumProd, LpPool, Shrink), each on a
hand-built model with symbolic dims: built once into a bundle, run on WebGPU (wgpu) and on
kernels.wasm at two or more shapes and in the reference interpreter, each compared with
onnxruntime's CPU kernels.
ONNX's node cases for these ops run through the compiler in ``scripts/onnx_node_tests.py``.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

import numpy as np
import pytest
from onnx import TensorProto, helper

import relaxweb
from relaxweb.errors import RelaxwebError
from relaxweb.ir.parser import parse_module
from relaxweb.ir.printer import format_module, module_constants
from relaxweb.ir.structural import assert_structural_equal
from relaxweb.passes import pipeline, run_pipeline
from tests.helpers import F32, F32_LOOSE, FLOAT16, Tolerance, assert_close, build_once, load_bundle, make_model, onnxruntime_outputs, rand

FLOAT, INT32, INT64 = TensorProto.FLOAT, TensorProto.INT32, TensorProto.INT64




@dataclass
class Case:
    """A model, and its inputs at each shape (``feeds(seed)`` for seeds 0, 1, ...)."""

    model: object
    feeds: list[Callable[[int], dict]]
    tolerance: Tolerance = F32


def check_case(case: Case, backend: str, folder) -> None:
    """The interpreter and the built bundle on ``backend`` against onnxruntime at every shape;
    integer and bool results exactly."""
    names = [o.name for o in case.model.graph.output]
    session = load_bundle(build_once(case.model, folder), backend)
    for seed, make_feeds in enumerate(case.feeds):
        feeds = make_feeds(seed)
        expected = onnxruntime_outputs(case.model, feeds)
        for where, actual in (("interpreter", relaxweb.run_reference(case.model, feeds)), (backend, session.run(feeds))):
            for name, want in zip(names, expected):
                message = f"{where}, {name}, feeds {seed}"
                assert actual[name].shape == want.shape and actual[name].dtype == want.dtype, message
                if want.dtype.kind == "f":
                    assert_close(actual[name], want, case.tolerance, err_msg=message)
                else:
                    np.testing.assert_array_equal(actual[name], want, err_msg=message)


# ReverseSequence -----------------------------------------------------------------------------


def reverse_sequence_case(batch_axis: int) -> Case:
    """[seq, batch, 3] (time-major, as tf2onnx writes) or [batch, seq, 3], lengths at run time."""
    dims = ["seq", "batch", 3] if batch_axis == 1 else ["batch", "seq", 3]
    model = make_model(
        [helper.make_node("ReverseSequence", ["x", "lengths"], ["y"], batch_axis=batch_axis, time_axis=1 - batch_axis)],
        [("x", FLOAT, dims), ("lengths", INT64, ["batch"])], [("y", FLOAT, dims)], check=True,
    )

    def feeds(batch: int, seq: int):
        def make(seed):
            shape = (seq, batch, 3) if batch_axis == 1 else (batch, seq, 3)
            lengths = np.random.default_rng(seed).integers(0, seq + 1, size=batch).astype(np.int64)
            lengths[0] = seq  # the whole sequence, and a 0 and a 1 where the batch has room
            lengths[1:3] = [0, 1][: max(batch - 1, 0)]
            return {"x": rand(shape, seed=seed), "lengths": lengths}
        return make

    return Case(model, [feeds(4, 5), feeds(1, 1), feeds(3, 7)])


# OneHot --------------------------------------------------------------------------------------


def one_hot_case(axis: int, depth_at_run_time: bool) -> Case:
    """int64 indices [batch, seq] with negative and out-of-range ones; depth 5 as an
    initializer or as a graph input (then read back on the GPU)."""
    initializers = {"values": np.array([-1.5, 2.0], np.float32)}
    inputs = [("indices", INT64, ["batch", "seq"])]
    if depth_at_run_time:
        inputs.append(("depth", INT64, [1]))
    else:
        initializers["depth"] = np.array(5, np.int64)
    model = make_model([helper.make_node("OneHot", ["indices", "depth", "values"], ["y"], axis=axis)],
                       inputs, [("y", FLOAT, None)], initializers, check=True)

    def feeds(batch: int, seq: int):
        def make(seed):
            values = {"indices": rand(batch, seq, seed=seed, low=-7, high=7, dtype="int64")}
            if depth_at_run_time:
                values["depth"] = np.array([5], np.int64)
            return values
        return make

    return Case(model, [feeds(2, 6), feeds(1, 1), feeds(3, 4)])


# Mod -----------------------------------------------------------------------------------------


def mod_case(dtype: str, fmod: int) -> Case:
    """x [batch, 6] mod a divisor row with both signs (broadcast), for integers and floats
    narrower or wider than the device's 32 bits."""
    elem_type = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    unsigned = np.dtype(dtype).kind == "u"
    divisor = np.array([3, 250, 7, 5, 1, 2] if unsigned else [3, -3, 7, -5, 1, 2], dtype)
    model = make_model([helper.make_node("Mod", ["x", "divisor"], ["y"], fmod=fmod)],
                       [("x", elem_type, ["batch", 6])], [("y", elem_type, None)], {"divisor": divisor}, check=True)
    low, high = (0, 250) if unsigned else (-100, 100) if np.dtype(dtype).kind == "i" else (None, None)

    def feeds(batch: int):
        def make(seed):
            if low is None:
                return {"x": (rand(batch, 6, seed=seed) * 10).astype(dtype)}
            return {"x": rand(batch, 6, seed=seed, low=low, high=high, dtype=dtype)}
        return make

    # floats: a - b * floor(a / b) in float32 on values up to ~30 (F32_LOOSE), float16 results
    tolerance = {"float64": F32_LOOSE, "float16": FLOAT16}.get(dtype, F32)
    return Case(model, [feeds(3), feeds(1)], tolerance)


# Bitwise ops ---------------------------------------------------------------------------------


def bitwise_case(dtype: str) -> Case:
    """BitwiseAnd/Or/Xor of x [batch, 4] with a broadcast row, and BitwiseNot of each."""
    elem_type = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    info = np.iinfo(dtype)
    # int64 values must fit in 32 bits on the device (checked at the boundary)
    low, high = (max(int(info.min), -2**31), min(int(info.max), 2**31 - 1))
    row = np.array([high, low, 0b1010, -1 if low < 0 else high // 3], dtype)
    nodes = [helper.make_node(op, ["x", "row"], [op.lower()]) for op in ("BitwiseAnd", "BitwiseOr", "BitwiseXor")]
    nodes += [helper.make_node("BitwiseNot", ["bitwisexor"], ["not_xor"]), helper.make_node("BitwiseNot", ["x"], ["not_x"])]
    outputs = [(name, elem_type, None) for name in ("bitwiseand", "bitwiseor", "bitwisexor", "not_xor", "not_x")]
    model = make_model(nodes, [("x", elem_type, ["batch", 4])], outputs, {"row": row}, opset=18, check=True)

    def feeds(batch: int):
        return lambda seed: {"x": np.random.default_rng(seed).integers(low, high, size=(batch, 4), endpoint=True,
                                                                      dtype=dtype)}

    return Case(model, [feeds(5), feeds(1)])


# EyeLike, CumProd ----------------------------------------------------------------------------


def eye_like_case(k: int, dtype: int | None) -> Case:
    """An identity-like matrix of x's symbolic shape [rows, cols], added to x (float) so the
    output depends on x's values too."""
    attrs = {"k": k} if dtype is None else {"k": k, "dtype": dtype}
    nodes = [helper.make_node("EyeLike", ["x"], ["eye"], **attrs)]
    outputs = [("eye", dtype or FLOAT, None)]
    if dtype is None:
        nodes.append(helper.make_node("Add", ["x", "eye"], ["sum"]))
        outputs.append(("sum", FLOAT, None))
    model = make_model(nodes, [("x", FLOAT, ["rows", "cols"])], outputs, check=True)
    return Case(model, [lambda seed: {"x": rand(3, 5, seed=seed)}, lambda seed: {"x": rand(6, 2, seed=seed)},
                        lambda seed: {"x": rand(1, 1, seed=seed)}])


def cumprod_case(dtype: str, exclusive: int, reverse: int, axis_at_run_time: bool) -> Case:
    """CumProd along the symbolic axis 1 of [batch, seq, 3] (values near 1, so products stay
    unit-scale); the axis an initializer or a graph input."""
    elem_type = helper.np_dtype_to_tensor_dtype(np.dtype(dtype))
    inputs = [("x", elem_type, ["batch", "seq", 3])]
    initializers = {}
    if axis_at_run_time:
        inputs.append(("axis", INT64, []))
    else:
        initializers["axis"] = np.array(-2, np.int64)
    model = make_model([helper.make_node("CumProd", ["x", "axis"], ["y"], exclusive=exclusive, reverse=reverse)],
                       inputs, [("y", elem_type, None)], initializers, opset=26, ir_version=13, check=True)

    def feeds(batch: int, seq: int):
        def make(seed):
            if dtype == "int32":
                values = {"x": rand(batch, seq, 3, seed=seed, low=-2, high=3, dtype=dtype)}
            else:
                values = {"x": rand(batch, seq, 3, seed=seed, low=0.5, high=1.5)}
            if axis_at_run_time:
                values["axis"] = np.array(1, np.int64)
            return values
        return make

    return Case(model, [feeds(2, 6), feeds(1, 1), feeds(3, 4)])


# LpPool, Shrink ------------------------------------------------------------------------------


def lp_pool_case(p: int) -> Case:
    """LpPool 3x3, stride 2, padded, on [batch, 2, h, w] (symbolic spatial dims), then Shrink."""
    model = make_model(
        [helper.make_node("LpPool", ["x"], ["pooled"], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1], p=p),
         helper.make_node("Shrink", ["pooled"], ["y"], lambd=1.5, bias=0.5)],
        [("x", FLOAT, ["batch", 2, "h", "w"])], [("pooled", FLOAT, None), ("y", FLOAT, None)], check=True,
    )
    # |x|**p summed over 9 terms in another order, then a root through WGSL pow (F32_LOOSE)
    return Case(model, [lambda seed: {"x": rand(2, 2, 7, 6, seed=seed)}, lambda seed: {"x": rand(1, 2, 4, 9, seed=seed)}],
                F32_LOOSE)


def shrink_case(lambd: float, bias: float) -> Case:
    model = make_model([helper.make_node("Shrink", ["x"], ["y"], lambd=lambd, bias=bias)],
                       [("x", FLOAT, ["batch", 5])], [("y", FLOAT, None)], check=True)
    # the thresholds themselves, and values on either side
    edges = np.array([lambd, -lambd, lambd + 0.25, -lambd - 0.25, 0.0], np.float32)
    return Case(model, [lambda seed: {"x": np.concatenate([edges[None], rand(3, 5, seed=seed) * 2])},
                        lambda seed: {"x": rand(1, 5, seed=seed)}])


CASES = {
    **{f"lp_pool_p{p}": (lambda p: lambda: lp_pool_case(p))(p) for p in (1, 2, 3, 11)},
    "shrink_hard": lambda: shrink_case(0.5, 0.0),
    "shrink_soft": lambda: shrink_case(1.0, 1.0),
    "eye_like": lambda: eye_like_case(0, None),
    "eye_like_above_int32": lambda: eye_like_case(2, INT32),
    "eye_like_below_int64": lambda: eye_like_case(-1, INT64),
    **{f"cumprod_exclusive{e}_reverse{r}": (lambda e, r: lambda: cumprod_case("float32", e, r, False))(e, r)
       for e in (0, 1) for r in (0, 1)},
    "cumprod_int32_axis_at_run_time": lambda: cumprod_case("int32", 1, 0, True),
    **{f"bitwise_{dtype}": (lambda dtype: lambda: bitwise_case(dtype))(dtype)
       for dtype in ("int32", "int64", "int16", "uint8", "uint32")},
    # (onnxruntime has the floor mod of floats only from opset 28; the node cases check it)
    **{f"mod_{dtype}_fmod{fmod}": (lambda dtype, fmod: lambda: mod_case(dtype, fmod))(dtype, fmod)
       for dtype in ("int32", "int64", "int8", "uint8", "float64", "float16") for fmod in (0, 1)
       if fmod or dtype.startswith(("int", "uint"))},
    "reverse_sequence_time_major": lambda: reverse_sequence_case(batch_axis=1),
    "reverse_sequence_batch_major": lambda: reverse_sequence_case(batch_axis=0),
    "one_hot_last_axis": lambda: one_hot_case(-1, depth_at_run_time=False),
    "one_hot_axis_1": lambda: one_hot_case(1, depth_at_run_time=False),
    "one_hot_first_axis_depth_at_run_time": lambda: one_hot_case(0, depth_at_run_time=True),
}


@pytest.mark.parametrize("name", sorted(CASES))
def test_op_matches_onnxruntime(backend, name: str, tmp_path) -> None:
    check_case(CASES[name](), backend, tmp_path / "bundle")


def test_one_hot_depth_from_a_shape_gives_a_symbolic_result(backend, tmp_path) -> None:
    """A depth computed from an input's shape stays symbolic: the result is [n, classes],
    with no read-back."""
    model = make_model(
        [helper.make_node("Shape", ["logits"], ["shape"], start=1, end=2),
         helper.make_node("OneHot", ["labels", "shape", "values"], ["y"])],
        [("labels", INT64, ["n"]), ("logits", FLOAT, ["n", "classes"])], [("y", FLOAT, None)],
        {"values": np.array([0.0, 1.0], np.float32)}, check=True,
    )
    text = str(relaxweb.inspect(model).module)
    assert 'y: Tensor((n, classes), "float32") = one_hot(' in text
    check_case(Case(model, [lambda seed: {"labels": np.array([2, 0, -1], np.int64), "logits": rand(3, 4)},
                            lambda seed: {"labels": np.array([6, -7], np.int64), "logits": rand(2, 7)}]),
               backend, tmp_path / "bundle")


def test_reverse_sequence_axes_other_than_0_and_1_are_refused() -> None:
    model = make_model([helper.make_node("ReverseSequence", ["x", "lengths"], ["y"], name="rev", batch_axis=0,
                                         time_axis=2)],
                       [("x", FLOAT, [2, 3, 4]), ("lengths", INT64, [2])], [("y", FLOAT, None)])
    with pytest.raises(RelaxwebError, match="ReverseSequence node 'rev'.*batch_axis and time_axis must be 0 and 1"):
        relaxweb.inspect(model).module  # noqa: B018 - importing is what raises


def test_every_pass_output_round_trips_through_its_text() -> None:
    """The new ops' attributes and arguments (a symbolic OneHot depth, a None dtype...) print
    and parse back at every pass."""
    models = [CASES[name]().model for name in sorted(CASES)]
    models.append(make_model([helper.make_node("Shape", ["logits"], ["shape"], start=1, end=2),
                              helper.make_node("OneHot", ["labels", "shape", "values"], ["y"])],
                             [("labels", INT64, ["n"]), ("logits", FLOAT, ["n", "classes"])], [("y", FLOAT, None)],
                             {"values": np.array([0.0, 1.0], np.float32)}))

    def check(step: str, module) -> None:
        text = format_module(module)
        parsed = parse_module(text, module_constants(module))
        assert_structural_equal(parsed, module)
        assert format_module(parsed) == text, step

    for model in models:
        module = relaxweb.inspect(model).module
        check("import", module)
        run_pipeline(module, pipeline(1), check)
