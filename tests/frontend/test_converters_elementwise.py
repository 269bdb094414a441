"""The elementwise, logic and reduction converters (``frontend/converters/elementwise.py``,
``frontend/converters/reduction.py``) and their ops (``ops/elementwise.py``,
``ops/logic.py``, ``ops/reduction.py``).

- ONNX's own node test cases for these op types, imported with ``from_onnx`` and run in the
  reference interpreter against the outputs ONNX ships (the ONNX_CASE tolerance); the cases
  whose axes / k / CumSum axis are graph inputs run once as they are (run-time values) and
  once with those inputs made initializers (compile-time values, full shape deduction).
- Models with symbolic dims (``dim_param``) against onnxruntime, in the interpreter and,
  for the ops that have a GPU lowering, after the whole pipeline.
- Each legalization against the op's numpy reference, and on wgpu (lavapipe) where the
  program's buffers have WGSL types.
"""

from __future__ import annotations

from functools import partial

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from relaxweb.compiler import compile_module
from relaxweb.errors import RelaxwebError, UnsupportedModelError
from relaxweb.frontend import from_onnx
from relaxweb.ir import FunctionBuilder, IRModule, SizeVar, TensorStructInfo, Var
from relaxweb.ir.expr import TupleGetItem
from relaxweb.ir.interpreter import run_host_function
from relaxweb.ir.interpreter import run_module
from relaxweb.ir.struct_info import TupleStructInfo, struct_info_equal
from relaxweb.ir.symbolic import evaluate
from relaxweb.ops import DeductionError, call_op, get_op
from relaxweb.passes import legalize_ops
from tests import helpers
from tests.gpu_kernels import run_compiled
from tests.helpers import ONNX_CASE, assert_close, onnx_node_cases

# folding the constant subgraphs of expanded function bodies may take log(0) in onnx.reference
pytestmark = pytest.mark.filterwarnings("ignore:divide by zero:RuntimeWarning")

# The ONNX op types converted by this family, and the ONNX test modules that exercise them.
OP_TYPES = {
    "Add", "Sub", "Mul", "Div", "Pow", "Mod", "Neg", "Abs", "Sqrt", "Exp", "Log", "Reciprocal", "Floor", "Ceil",
    "Round", "Sign", "Erf", "Sin", "Cos", "Tan", "Asin", "Acos", "Atan", "Sinh", "Cosh", "Asinh", "Acosh", "Atanh",
    "Relu", "LeakyRelu", "PRelu", "Elu", "Selu", "Celu", "ThresholdedRelu", "Sigmoid", "HardSigmoid", "HardSwish",
    "Softplus", "Softsign", "Tanh", "Gelu", "Mish", "Clip", "Max", "Min", "Mean", "Sum", "IsNaN", "IsInf", "BitShift",
    "Equal", "Less", "LessOrEqual", "Greater", "GreaterOrEqual", "And", "Or", "Xor", "Not", "Where", "Cast",
    "CastLike", "Identity",
    "ReduceSum", "ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1", "ReduceL2", "ReduceLogSum",
    "ReduceLogSumExp", "ReduceSumSquare", "ArgMax", "ArgMin", "CumSum", "TopK",
}
ONNX_TEST_MODULES = """
    abs acos acosh add and_ argmax argmin asin asinh atan atanh bitshift cast castlike ceil celu clip cos cosh
    cumsum div elu equal erf exp floor gelu greater greater_or_equal hardsigmoid hardswish identity isinf isnan
    leakyrelu less less_or_equal log max mean min mish mod mul neg not_ or_ pow prelu reciprocal reduce_log_sum
    reduce_log_sum_exp reducel1 reducel2 reducemax reducemean reducemin reduceprod reducesum reducesumsquare relu
    round selu sigmoid sign sin sinh softplus softsign sqrt sub sum tan tanh thresholdedrelu topk where xor
""".split()

# Element types relaxweb supports; a case producing another (float8, int4, bfloat16…) is skipped.
SUPPORTED_TYPES = {
    TensorProto.BOOL, TensorProto.INT8, TensorProto.INT16, TensorProto.INT32, TensorProto.INT64,
    TensorProto.UINT8, TensorProto.UINT16, TensorProto.UINT32, TensorProto.UINT64,
    TensorProto.FLOAT16, TensorProto.FLOAT, TensorProto.DOUBLE,
}

# Inputs that decide a shape: (op type, input position, opset from which it is an input).
COMPILE_TIME_INPUTS = {
    **{op: (1, 18) for op in ("ReduceMean", "ReduceMax", "ReduceMin", "ReduceProd", "ReduceL1", "ReduceL2",
                              "ReduceLogSum", "ReduceLogSumExp", "ReduceSumSquare")},
    "ReduceSum": (1, 13), "TopK": (1, 10), "CumSum": (1, 1),
}


def collect_onnx_cases() -> list:
    """ONNX's node test cases for OP_TYPES: the single-node ones and the expanded function
    bodies made only of these ops (and Constant).

    Only the needed test modules are imported (fast).  They reseed numpy's global generator
    as they run, so its state is restored afterwards.
    """
    cases: dict[str, object] = {}
    for case in onnx_node_cases(ONNX_TEST_MODULES):
        op_types = {node.op_type for node in case.model.graph.node}
        if op_types & OP_TYPES and op_types <= OP_TYPES | {"Constant"}:
            cases.setdefault(case.name, case)
    return sorted(cases.values(), key=lambda case: case.name)


CASES = {case.name: case for case in collect_onnx_cases()}


def unsupported_dtype(model: onnx.ModelProto) -> str | None:
    """The first element type (of a graph input or output, or a Cast target) that relaxweb
    lacks (sequences and optionals of tensors are values relaxweb has)."""
    values = [*model.graph.input, *model.graph.output]
    types = [value.type.tensor_type.elem_type for value in values if value.type.HasField("tensor_type")]
    for node in model.graph.node:
        if node.op_type == "Cast":
            types += [a.i for a in node.attribute if a.name == "to"]
    for elem_type in types:
        if elem_type not in SUPPORTED_TYPES:
            return TensorProto.DataType.Name(elem_type)
    return None


def as_array(value):
    """A case's value: an array, a list of them (a sequence) or None (an empty optional)."""
    if value is None:
        return None
    if isinstance(value, list):
        return [as_array(element) for element in value]
    return numpy_helper.to_array(value) if isinstance(value, onnx.TensorProto) else np.asarray(value)


def case_feeds(case) -> tuple[dict[str, np.ndarray], list[np.ndarray]]:
    inputs, outputs = case.data_sets[0]
    names = [value.name for value in case.model.graph.input]
    return {name: as_array(v) for name, v in zip(names, inputs)}, [as_array(v) for v in outputs]


def assert_outputs_match(actual: list[np.ndarray], expected: list[np.ndarray], what: str) -> None:
    assert len(actual) == len(expected), what
    for position, (got, want) in enumerate(zip(actual, expected)):
        message = f"{what}, output {position}"
        if want is None or isinstance(want, list):  # an empty optional, a sequence
            assert (got is None) if want is None else isinstance(got, list), message
            if want is not None:
                assert_outputs_match(got, want, message)
            continue
        assert got.shape == want.shape, f"{message}: shape {got.shape} != {want.shape}"
        assert got.dtype == want.dtype, f"{message}: dtype {got.dtype} != {want.dtype}"
        if want.dtype.kind in "fc":
            assert_close(got.astype(np.float64), want.astype(np.float64), ONNX_CASE, err_msg=message)
        else:
            np.testing.assert_array_equal(got, want, err_msg=message)


def run_case(model: onnx.ModelProto, feeds: dict[str, np.ndarray], expected: list[np.ndarray], name: str) -> None:
    """Import and run; a case that uses an element type relaxweb lacks may be refused, with an
    error naming what it lacks, but what imports must compute the right values."""
    try:
        module = from_onnx(model, name)
    except UnsupportedModelError as error:
        lacking = unsupported_dtype(model)
        if not lacking:
            raise
        assert np.dtype(helper.tensor_dtype_to_np_dtype(getattr(TensorProto, lacking))).name in str(error), str(error)
        return
    with np.errstate(all="ignore"):
        actual = run_module(module, feeds)
    assert_outputs_match(actual, expected, name)
    # where the ops have tensor programs, those compute the same
    try:
        legalized = legalize_ops(module)
    except UnsupportedModelError:
        return
    with np.errstate(all="ignore"):
        actual = run_module(legalized, feeds)
    assert_outputs_match(actual, expected, f"{name}, legalized")


@pytest.mark.parametrize("name", sorted(CASES))
def test_onnx_node_case(name: str) -> None:
    case = CASES[name]
    feeds, expected = case_feeds(case)
    run_case(case.model, feeds, expected, name)


def with_constant_inputs(case) -> tuple[onnx.ModelProto, dict[str, np.ndarray]] | None:
    """The case's model with its shape-deciding graph inputs made initializers, or None."""
    model = onnx.ModelProto()
    model.CopyFrom(case.model)
    feeds, _ = case_feeds(case)
    opset = next((o.version for o in model.opset_import if o.domain in ("", "ai.onnx")), 1)
    names = set()
    for node in model.graph.node:
        position, since = COMPILE_TIME_INPUTS.get(node.op_type, (None, None))
        if position is not None and opset >= since and len(node.input) > position and node.input[position] in feeds:
            names.add(node.input[position])
    if not names:
        return None
    kept = [value for value in model.graph.input if value.name not in names]
    del model.graph.input[:]
    model.graph.input.extend(kept)
    model.graph.initializer.extend(numpy_helper.from_array(feeds.pop(name), name) for name in sorted(names))
    return model, feeds


CONSTANT_INPUT_CASES = sorted(name for name, case in CASES.items() if with_constant_inputs(case) is not None)


@pytest.mark.parametrize("name", CONSTANT_INPUT_CASES)
def test_onnx_node_case_with_constant_axes(name: str) -> None:
    case = CASES[name]
    model, feeds = with_constant_inputs(case)
    _, expected = case_feeds(case)
    run_case(model, feeds, expected, name)
    # with constant axes / k the result's shape is fully deduced
    main = from_onnx(model).main
    for binding in main.bindings():
        info = binding.var.struct_info
        fields = info.fields if isinstance(info, TupleStructInfo) else (info,)
        assert all(f.shape is not None for f in fields if isinstance(f, TensorStructInfo)), str(binding.var)


def test_onnx_cases_were_collected() -> None:
    covered = {node.op_type for case in CASES.values() for node in case.model.graph.node}
    assert len(CASES) > 600
    assert OP_TYPES - {"Identity"} <= covered


# Symbolic shapes against onnxruntime ---------------------------------------------------------------


# ``inputs`` / ``outputs``: (name, element type, shape or None); checked by ONNX
make_model = partial(helpers.make_model, opset=20, check=True)


def run_onnxruntime(model: onnx.ModelProto, feeds: dict[str, np.ndarray]) -> list[np.ndarray]:
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, feeds)


F, I32, I64, B = TensorProto.FLOAT, TensorProto.INT32, TensorProto.INT64, TensorProto.BOOL


rand = partial(helpers.rand, low=-3.0, high=3.0)  # this file's data: uniform in [-3, 3)


SYMBOLIC_MODELS = {
    # activations, clip, comparisons, where, cast and the variadic ops on [batch, 6]
    "activations": (
        [
            helper.make_node("LeakyRelu", ["x"], ["a"], alpha=0.2),
            helper.make_node("Clip", ["a", "lo", "hi"], ["b"]),
            helper.make_node("Greater", ["x", "zero"], ["positive"]),
            helper.make_node("Neg", ["x"], ["negated"]),
            helper.make_node("Where", ["positive", "x", "negated"], ["absolute"]),
            helper.make_node("HardSwish", ["x"], ["c"]),
            helper.make_node("Max", ["b", "c", "absolute"], ["d"]),
            helper.make_node("Mean", ["d", "x"], ["e"]),
            helper.make_node("Elu", ["e"], ["f"], alpha=0.5),
            helper.make_node("Gelu", ["f"], ["g"], approximate="tanh"),
            helper.make_node("Softsign", ["g"], ["h"]),
            helper.make_node("PRelu", ["h", "slope"], ["y"]),
        ],
        [("x", F, ["batch", 6])], [("y", F, ["batch", 6])],
        {"lo": np.array(-1.0, np.float32), "hi": np.array(1.5, np.float32), "zero": np.array(0.0, np.float32),
         "slope": np.linspace(0.1, 0.6, 6).astype(np.float32)},
        True,
    ),
    "logic_and_cast": (
        [
            helper.make_node("Less", ["x", "t"], ["low"]),
            helper.make_node("IsNaN", ["x"], ["nan"]),
            helper.make_node("Not", ["nan"], ["number"]),
            helper.make_node("And", ["low", "number"], ["keep"]),
            helper.make_node("Cast", ["keep"], ["keep_i"], to=I32),
            helper.make_node("Cast", ["x"], ["x_i"], to=I32),
            helper.make_node("Mul", ["keep_i", "x_i"], ["y"]),
            helper.make_node("Cast", ["y"], ["y_f"], to=F),
            helper.make_node("Sign", ["y_f"], ["s"]),
        ],
        [("x", F, ["batch", "seq"])], [("y", I32, ["batch", "seq"]), ("s", F, ["batch", "seq"])],
        {"t": np.array([1.0], np.float32)},
        True,
    ),
    "reductions": (
        [
            helper.make_node("ReduceSum", ["x", "axes1"], ["sum"], keepdims=0),
            helper.make_node("ReduceL1", ["x", "axes1"], ["l1"], keepdims=1),
            helper.make_node("ReduceSumSquare", ["x", "axes02"], ["sq"], keepdims=0),
            helper.make_node("ReduceMax", ["x"], ["max"], keepdims=0),
            helper.make_node("ReduceMean", ["x", "axes1"], ["mean"]),
            helper.make_node("CumSum", ["x", "axis1"], ["cum"], exclusive=1, reverse=1),
        ],
        [("x", F, ["batch", "seq", 4])],
        [("sum", F, None), ("l1", F, None), ("sq", F, None), ("max", F, None), ("mean", F, None), ("cum", F, None)],
        {"axes1": np.array([1], np.int64), "axes02": np.array([0, -1], np.int64), "axis1": np.array(1, np.int64)},
        True,
    ),
    "without_gpu_lowering": (
        [
            helper.make_node("Sqrt", ["x"], ["a"]),
            helper.make_node("ReduceLogSumExp", ["x", "axes"], ["lse"], keepdims=0),
            helper.make_node("ReduceProd", ["a", "axes"], ["prod"], keepdims=1),
            helper.make_node("ArgMax", ["x"], ["argmax"], axis=1, keepdims=0, select_last_index=1),
            helper.make_node("TopK", ["x", "k"], ["values", "indices"], axis=1, largest=0),
            helper.make_node("Erf", ["x"], ["erf"]),
            helper.make_node("Pow", ["a", "x"], ["pow"]),
            helper.make_node("Mod", ["x", "three"], ["mod"], fmod=1),
        ],
        [("x", F, ["batch", 5])],
        [("lse", F, None), ("prod", F, None), ("argmax", I64, None), ("values", F, None), ("indices", I64, None),
         ("erf", F, None), ("pow", F, None), ("mod", F, None)],
        {"axes": np.array([1], np.int64), "k": np.array([3], np.int64), "three": np.array(3.0, np.float32)},
        False,
    ),
}


def symbolic_feeds(model: onnx.ModelProto, batch: int, seed: int) -> dict[str, np.ndarray]:
    feeds = {}
    initializers = {i.name for i in model.graph.initializer}
    for position, value in enumerate(model.graph.input):
        if value.name in initializers:
            continue
        dims = [d.dim_value if d.HasField("dim_value") else (batch if d.dim_param == "batch" else 3)
                for d in value.type.tensor_type.shape.dim]
        data = rand(*dims, seed=seed + position)
        if "without_gpu" in model.graph.name:
            data = np.abs(data)
        feeds[value.name] = data
    return feeds


@pytest.mark.parametrize("name", sorted(SYMBOLIC_MODELS))
def test_symbolic_model_matches_onnxruntime(name: str) -> None:
    nodes, inputs, outputs, initializers, lowered = SYMBOLIC_MODELS[name]
    model = make_model(nodes, inputs, outputs, initializers)
    model.graph.name = name
    module = from_onnx(model)
    # every result keeps the symbolic dims (no unknown shapes on the way)
    assert "batch" in str(module.main.params[0].struct_info)
    for binding in module.main.bindings():
        info = binding.var.struct_info
        for field in (info.fields if isinstance(info, TupleStructInfo) else (info,)):
            assert field.shape is not None, str(binding.var)
    pipeline = compile_module(module, {"batch": 8}) if lowered else None
    for batch in (1, 4):
        feeds = symbolic_feeds(model, batch, seed=batch)
        expected = run_onnxruntime(model, feeds)
        assert_outputs_match(run_module(module, feeds), expected, f"{name} at batch {batch}")
        if pipeline is not None:
            actual = run_host_function(pipeline.main, pipeline.programs, feeds)
            assert_outputs_match(actual, expected, f"{name} after the pipeline at batch {batch}")


# (nodes, opset, initializers): one input x[batch, 4, 3] (float32), one output y
OPSET_VARIANTS = {
    "ReduceSum_11_axes_attribute": ([helper.make_node("ReduceSum", ["x"], ["y"], axes=[1], keepdims=0)], 11, {}),
    "ReduceL2_13_axes_attribute": ([helper.make_node("ReduceL2", ["x"], ["y"], axes=[-1])], 13, {}),
    "ReduceLogSumExp_11_all_axes": ([helper.make_node("ReduceLogSumExp", ["x"], ["y"], keepdims=0)], 11, {}),
    "ReduceMax_18_noop_empty_axes": (
        [helper.make_node("ReduceMax", ["x", "axes"], ["y"], noop_with_empty_axes=1)], 18,
        {"axes": np.zeros((0,), np.int64)}),
    "ReduceSumSquare_18_noop_no_axes": (
        [helper.make_node("ReduceSumSquare", ["x"], ["y"], noop_with_empty_axes=1)], 18, {}),
    "ReduceMean_18_empty_axes_all": (
        [helper.make_node("ReduceMean", ["x", "axes"], ["y"], keepdims=1)], 18, {"axes": np.zeros((0,), np.int64)}),
    "Clip_6_attributes": ([helper.make_node("Clip", ["x"], ["y"], min=-0.5, max=0.25)], 6, {}),
    "Clip_11_min_only": ([helper.make_node("Clip", ["x", "lo"], ["y"])], 11, {"lo": np.array(-0.5, np.float32)}),
    "Clip_13_max_only": ([helper.make_node("Clip", ["x", "", "hi"], ["y"])], 13, {"hi": np.array(0.5, np.float32)}),
    "TopK_1_k_attribute": ([helper.make_node("TopK", ["x"], ["y", "i"], k=2, axis=1)], 1, {}),
    "TopK_11_smallest": ([helper.make_node("TopK", ["x", "k"], ["y", "i"], largest=0, axis=-1)], 11,
                         {"k": np.array([2], np.int64)}),
    "ArgMin_11": ([helper.make_node("ArgMin", ["x"], ["y"], axis=-1, keepdims=0)], 11, {}),
    "CumSum_11_reverse": ([helper.make_node("CumSum", ["x", "axis"], ["y"], reverse=1)], 11,
                          {"axis": np.array(-1, np.int32)}),
    "Cast_13_round_trip": ([helper.make_node("Cast", ["x"], ["h"], to=TensorProto.FLOAT16),
                            helper.make_node("Cast", ["h"], ["i"], to=TensorProto.INT64),
                            helper.make_node("Cast", ["i"], ["y"], to=TensorProto.DOUBLE)], 13, {}),
    "Sum_8_broadcast": ([helper.make_node("Sum", ["x", "row", "x"], ["y"])], 8, {"row": rand(3, seed=9)}),
    "Pow_15_squared": ([helper.make_node("Pow", ["x", "two"], ["y"])], 15, {"two": np.array(2, np.int64)}),
    "Mod_13_fmod": ([helper.make_node("Mod", ["x", "d"], ["y"], fmod=1)], 13, {"d": np.array([0.7, -0.4, 1.1], np.float32)}),
}


@pytest.mark.parametrize("name", sorted(OPSET_VARIANTS))
def test_opset_variant_matches_onnxruntime(name: str) -> None:
    nodes, opset, initializers = OPSET_VARIANTS[name]
    outputs = [helper.make_value_info(o, onnx.TypeProto()) for node in nodes[-1:] for o in node.output]  # untyped
    model = make_model(nodes, [("x", F, ["batch", 4, 3])], outputs, initializers, opset=opset, check=False, name=name)
    model = onnx.shape_inference.infer_shapes(model)
    module = from_onnx(model)
    for batch in (1, 3):
        feeds = {"x": rand(batch, 4, 3, seed=batch)}
        assert_outputs_match(run_module(module, feeds), run_onnxruntime(model, feeds), f"{name} at batch {batch}")


def test_reduction_deduces_symbolic_shapes() -> None:
    nodes, inputs, outputs, initializers, _ = SYMBOLIC_MODELS["reductions"]
    main = from_onnx(make_model(nodes, inputs, outputs, initializers)).main
    shapes = {binding.var.name: str(binding.var.struct_info) for binding in main.bindings()}
    assert shapes["sum"] == "Tensor((batch, 4), float32)"
    assert shapes["l1"] == "Tensor((batch, 1, 4), float32)"
    assert shapes["sq"] == "Tensor((seq), float32)"
    assert shapes["max"] == "Tensor((), float32)"
    assert shapes["cum"] == "Tensor((batch, seq, 4), float32)"
    nodes, inputs, outputs, initializers, _ = SYMBOLIC_MODELS["without_gpu_lowering"]
    main = from_onnx(make_model(nodes, inputs, outputs, initializers)).main
    shapes = {binding.var.name: str(binding.var.struct_info) for binding in main.bindings()}
    assert shapes["values"] == "Tensor((batch, 3), float32)"
    assert shapes["indices"] == "Tensor((batch, 3), int64)"
    assert shapes["argmax"] == "Tensor((batch), int64)"


@pytest.mark.gpu
def test_run_time_axes_keep_the_rank(tmp_path) -> None:
    """Axes and k computed at run time: only the ranks are known; the interpreter runs it,
    and the GPU build reads the result extents back mid-run."""
    model = make_model(
        [helper.make_node("ReduceSum", ["x", "axes"], ["s"], keepdims=0),
         helper.make_node("TopK", ["x", "k"], ["v", "i"], axis=-1),
         helper.make_node("CumSum", ["x", "axis"], ["c"])],
        [("x", F, ["batch", 5]), ("axes", I64, [1]), ("k", I64, [1]), ("axis", I64, [])],
        [("s", F, None), ("v", F, None), ("i", I64, None), ("c", F, None)], check=False,
    )
    module = from_onnx(model)
    infos = {b.var.name: b.var.struct_info for b in module.main.bindings()}
    assert str(infos["s"]) == "Tensor(ndim=1, float32)"
    assert str(infos["v"]) == "Tensor(ndim=2, float32)"
    assert str(infos["c"]) == "Tensor((batch, 5), float32)"
    feeds = {"x": rand(3, 5), "axes": np.array([-1], np.int64), "k": np.array([2], np.int64), "axis": np.array(1, np.int64)}
    expected = run_onnxruntime(model, feeds)
    assert_outputs_match(run_module(module, feeds), expected, "run-time axes")
    assert_outputs_match(run_compiled(module, feeds, tmp_path / "bundle"), expected, "run-time axes on the GPU")


def test_building_lists_the_ops_without_gpu_lowering(monkeypatch) -> None:
    """Every op lowers today; the build's error for ops that do not is checked by taking two
    ops' lowerings away."""
    import dataclasses

    from relaxweb.ops import OPS

    for name in ("argmax", "topk"):
        monkeypatch.setitem(OPS, name, dataclasses.replace(OPS[name], legalize=None))
    nodes, inputs, outputs, initializers, _ = SYMBOLIC_MODELS["without_gpu_lowering"]
    module = from_onnx(make_model(nodes, inputs, outputs, initializers))
    with pytest.raises(UnsupportedModelError) as caught:
        legalize_ops(module)
    listed = str(caught.value).split(": ", 1)[1].split(" (")[0].split(", ")
    assert listed == ["argmax", "topk"]
    assert "relaxweb run MODEL.onnx --reference" in str(caught.value)


# Deduction ---------------------------------------------------------------------------------------

n, m = SizeVar("n"), SizeVar("m")


def tensor(name: str, *shape, dtype: str = "float32") -> Var:
    return Var(name, TensorStructInfo(tuple(shape), dtype))


def same(actual, expected) -> None:
    assert struct_info_equal(actual, expected), f"{actual} != {expected}"


def test_comparison_logic_and_where_deduction() -> None:
    same(call_op("less", tensor("a", n, 1), tensor("b", 4)).struct_info, TensorStructInfo((n, 4), "bool"))
    same(call_op("logical_not", tensor("c", n, dtype="bool")).struct_info, TensorStructInfo((n,), "bool"))
    same(call_op("where", tensor("c", n, 1, dtype="bool"), tensor("a", 1, m), tensor("b", m)).struct_info,
         TensorStructInfo((n, m), "float32"))
    same(call_op("isinf", tensor("a", n)).struct_info, TensorStructInfo((n,), "bool"))
    same(call_op("cast", tensor("a", n, 3), dtype="float16").struct_info, TensorStructInfo((n, 3), "float16"))
    with pytest.raises(DeductionError, match="equal: dtypes differ"):
        call_op("equal", tensor("a", 3), tensor("b", 3, dtype="int64"))
    with pytest.raises(DeductionError, match="logical_and: argument 1 must be a bool tensor, got float32"):
        call_op("logical_and", tensor("a", 3, dtype="bool"), tensor("b", 3))
    with pytest.raises(DeductionError, match="where: argument 0 .* must be a bool tensor"):
        call_op("where", tensor("c", 3), tensor("a", 3), tensor("b", 3))
    with pytest.raises(DeductionError, match="where: cannot broadcast dimension 0 of the result: n vs m"):
        call_op("where", tensor("c", n, dtype="bool"), tensor("a", m), tensor("b", 1))
    with pytest.raises(DeductionError, match="sqrt: argument 0 must be a float tensor, got int64"):
        call_op("sqrt", tensor("i", 3, dtype="int64"))
    with pytest.raises(DeductionError, match="cast: unsupported target dtype 'bfloat16'"):
        call_op("cast", tensor("a", 3), dtype="bfloat16")


def test_power_mod_and_shift_deduction() -> None:
    same(call_op("power", tensor("a", n, 3), tensor("b", 3, dtype="int64")).struct_info, TensorStructInfo((n, 3), "float32"))
    same(call_op("mod", tensor("a", n, dtype="int32"), tensor("b", 1, dtype="int32")).struct_info,
         TensorStructInfo((n,), "int32"))
    with pytest.raises(DeductionError, match="left_shift: argument 0 must be an integer tensor, got float32"):
        call_op("left_shift", tensor("a", 3), tensor("b", 3))


def test_reduction_family_deduction() -> None:
    x = tensor("x", n, m, 4)
    same(call_op("l2_norm", x, axes=[1], keepdims=True).struct_info, TensorStructInfo((n, 1, 4), "float32"))
    same(call_op("log_sum_exp", x, axes=[0, 2]).struct_info, TensorStructInfo((m,), "float32"))
    same(call_op("sum_square", x, axes=[]).struct_info, TensorStructInfo((n, m, 4), "float32"))
    same(call_op("argmin", x, axis=-1, keepdims=False).struct_info, TensorStructInfo((n, m), "int64"))
    same(call_op("cumsum", x, axis=1).struct_info, x.struct_info)
    topk = call_op("topk", x, k=2, axis=2).struct_info
    same(topk, TupleStructInfo((TensorStructInfo((n, m, 2), "float32"), TensorStructInfo((n, m, 2), "int64"))))
    with pytest.raises(DeductionError, match="topk: k = 5 is larger than dimension 2 \\(4\\)"):
        call_op("topk", x, k=5, axis=2)
    with pytest.raises(DeductionError, match="topk: k = 2 is not provably at most dimension 0 \\(n\\)"):
        call_op("topk", x, k=2, axis=0)
    with pytest.raises(DeductionError, match="log_sum: argument 0 must be a float tensor, got int32"):
        call_op("log_sum", tensor("i", 3, dtype="int32"))
    # axes known only at run time: the rank is still known
    axes = tensor("axes", 2, dtype="int64")
    same(call_op("max", x, axes, keepdims=False).struct_info, TensorStructInfo(None, "float32", 1))
    same(call_op("max", x, axes, keepdims=True).struct_info, TensorStructInfo(None, "float32", 3))
    same(call_op("sum", x, tensor("none", 0, dtype="int64"), keepdims=False).struct_info,
         TensorStructInfo(None, "float32", 0))


def test_references_follow_onnx() -> None:
    def reference(op, *arrays, **attrs):
        return get_op(op).reference(list(arrays), attrs)

    ints = np.array([7, -7, 7, -7], np.int64), np.array([2, 2, -2, -2], np.int64)
    np.testing.assert_array_equal(reference("divide", *ints), [3, -3, -3, 3])  # toward zero
    np.testing.assert_array_equal(reference("mod", *ints), [1, 1, -1, -1])  # sign of the divisor
    np.testing.assert_array_equal(reference("mod", *ints, fmod=True), [1, -1, 1, -1])  # of the dividend
    big = np.array([2**62 + 1], np.int64)
    assert reference("divide", big, np.array([1], np.int64))[0] == 2**62 + 1  # exact, not through float
    np.testing.assert_array_equal(reference("round", np.array([0.5, 1.5, 2.5, -0.5], np.float32)), [0, 2, 2, -0])
    np.testing.assert_array_equal(
        reference("right_shift", np.array([-8, 8], np.int8), np.array([9, 1], np.int8)), [-1, 4])
    values, indices = reference("topk", np.array([[1, 3, 3, 2]], np.float32), k=3, axis=-1, largest=True)
    np.testing.assert_array_equal(values, [[3, 3, 2]])
    np.testing.assert_array_equal(indices, [[1, 2, 3]])  # ties: the lower index first
    values, indices = reference("topk", np.array([5, 1, 1, 7], np.int32), k=2, axis=0, largest=False)
    np.testing.assert_array_equal(indices, [1, 2])
    np.testing.assert_array_equal(reference("cumsum", np.arange(1, 5, dtype=np.int32), axis=0, exclusive=True,
                                            reverse=True), [9, 7, 4, 0])
    np.testing.assert_array_equal(reference("argmax", np.array([[1, 5, 5]], np.float32), axis=1,
                                            select_last_index=True), [[2]])
    assert reference("cast", np.array([-1.7, 0.0, np.nan], np.float32), dtype="bool").tolist() == [True, False, True]
    np.testing.assert_array_equal(reference("cast", np.array([-1.7, 2.9], np.float32), dtype="int64"), [-1, 2])


# Legalization ----------------------------------------------------------------------------------------

UNARY_ATTRS = {
    "leaky_relu": {"alpha": 0.1}, "elu": {"alpha": 0.7}, "selu": {}, "celu": {"alpha": 1.5},
    "thresholded_relu": {"alpha": 0.3}, "hard_sigmoid": {"alpha": 0.3, "beta": 0.4},
}
LEGALIZED_UNARY = [
    "abs", "reciprocal", "sign", "sinh", "cosh", "softsign", "leaky_relu", "elu", "selu", "celu",
    "thresholded_relu", "hard_sigmoid", "hard_swish", "gelu_tanh",
]


def build(params: dict[str, TensorStructInfo], make) -> IRModule:
    builder = FunctionBuilder("main")
    args = [builder.add_param(name, info) for name, info in params.items()]
    calls = make(*args)
    outputs = []
    for position, call in enumerate(calls if isinstance(calls, list) else [calls]):
        outputs.append(builder.emit(call, f"y{position}", output=True))
    return IRModule({"main": builder.finish(outputs, [o.name for o in outputs])})


def check_legalized(module: IRModule, feeds: dict[str, np.ndarray]) -> IRModule:
    legalized = legalize_ops(module)
    with np.errstate(all="ignore"):
        want, got = run_module(module, feeds), run_module(legalized, feeds)
    assert_outputs_match(got, want, "legalized")
    return legalized


def sample(shape, dtype: str, seed: int = 0) -> np.ndarray:
    generator = np.random.default_rng(seed)
    if dtype == "bool":
        return generator.integers(0, 2, size=shape).astype(bool)
    if dtype.startswith("int"):
        return generator.integers(-9, 9, size=shape).astype(dtype)
    values = generator.uniform(-3, 3, size=shape).astype(dtype)
    values.reshape(-1)[:3] = [0.0, 0.3, -0.3][: values.size]  # the edges of thresholds and signs
    return values


def legalized_cases():
    """(id, params, make, dtypes of the inputs) for every op with a new legalization."""
    x = {"x": TensorStructInfo((n, 5), "float32")}
    for op in LEGALIZED_UNARY:
        yield op, x, (lambda op: lambda a: call_op(op, a, **UNARY_ATTRS.get(op, {})))(op)
    for op in ("abs", "sign", "negative"):
        yield f"{op}_int32", {"x": TensorStructInfo((n, 5), "int32")}, (lambda op: lambda a: call_op(op, a))(op)
    two = {"a": TensorStructInfo((n, 5), "float32"), "b": TensorStructInfo((5,), "float32")}
    for op in ("maximum", "minimum", "prelu", "equal", "less", "less_equal", "greater", "greater_equal"):
        yield op, two, (lambda op: lambda a, b: call_op(op, a, b))(op)
    bools = {"a": TensorStructInfo((n, 5), "bool"), "b": TensorStructInfo((1, 5), "bool")}
    for op in ("logical_and", "logical_or", "logical_xor"):
        yield op, bools, (lambda op: lambda a, b: call_op(op, a, b))(op)
    yield "logical_not", {"a": TensorStructInfo((n, 5), "bool")}, lambda a: call_op("logical_not", a)
    yield "where", {"c": TensorStructInfo((n, 1), "bool"), **two}, lambda c, a, b: call_op("where", c, a, b)
    for dtype in ("int32", "float32", "bool", "uint32"):
        yield f"cast_to_{dtype}", x, (lambda dtype: lambda a: call_op("cast", a, dtype=dtype))(dtype)
    yield "cast_int_to_float", {"x": TensorStructInfo((n, 5), "int32")}, lambda a: call_op("cast", a, dtype="float32")
    three = {"x": TensorStructInfo((n, m, 4), "float32")}
    for op in ("l1_norm", "sum_square"):
        yield op, three, (lambda op: lambda a: [call_op(op, a, axes=[1]), call_op(op, a, axes=[0, 2], keepdims=True),
                                                 call_op(op, a)])(op)
    for exclusive in (False, True):
        for reverse in (False, True):
            yield (f"cumsum_exclusive{int(exclusive)}_reverse{int(reverse)}", three,
                   (lambda e, r: lambda a: call_op("cumsum", a, axis=1, exclusive=e, reverse=r))(exclusive, reverse))


LEGALIZED = {case[0]: case[1:] for case in legalized_cases()}


@pytest.mark.parametrize("name", sorted(LEGALIZED))
def test_legalized_matches_reference(name: str) -> None:
    params, make = LEGALIZED[name]
    module = build(params, make)
    feeds = {}
    for position, (param, info) in enumerate(params.items()):
        shape = tuple(int(evaluate(d, {"n": 3, "m": 2})) for d in info.shape)
        feeds[param] = sample(shape, info.dtype, seed=position)
    check_legalized(module, feeds)


def test_isnan_and_isinf_legalized() -> None:
    module = build({"x": TensorStructInfo((n,), "float32")},
                   lambda x: [call_op("isinf", x), call_op("isinf", x, detect_negative=False),
                              call_op("isinf", x, detect_positive=False, detect_negative=False), call_op("isnan", x)])
    check_legalized(module, {"x": np.array([1.0, np.inf, -np.inf, np.nan, 3.4e38], np.float32)})


GPU_CASES = [name for name, (params, _) in LEGALIZED.items()
             if all(info.dtype in ("float32", "int32") for info in params.values())
             and not name.startswith(("equal", "less", "greater", "cast_to_bool", "cast_to_uint32"))]


@pytest.mark.parametrize("name", sorted(GPU_CASES))
def test_legalized_runs_on_wgpu(device, name: str) -> None:
    from tests.gpu_kernels import run_kernel_on_gpu

    params, make = LEGALIZED[name]
    module = build(params, make)
    sizes = {"n": 3, "m": 2}
    feeds = {}
    for position, (param, info) in enumerate(params.items()):
        feeds[param] = sample(tuple(int(evaluate(d, sizes)) for d in info.shape), info.dtype, seed=position)
    legalized = legalize_ops(module)
    with np.errstate(all="ignore"):
        expected = run_module(module, feeds)
    calls = [b.value for b in legalized.main.bindings()]
    assert len(calls) == len(expected)
    for call, want in zip(calls, expected):
        program = legalized.programs[call.program]
        arrays = [feeds[arg.name] for arg in call.args]
        values = {name: int(evaluate(value, sizes)) for name, value in call.size_var_values}
        got = run_kernel_on_gpu(device, program, arrays, values)
        assert_close(got, want, err_msg=program.name)


def test_some_results_are_tuples_of_topk() -> None:
    model = make_model([helper.make_node("TopK", ["x", "k"], ["v", "i"])], [("x", F, ["n", 6])],
                       [("v", F, None), ("i", I64, None)], {"k": np.array([2], np.int64)})
    main = from_onnx(model).main
    assert any(isinstance(b.value, TupleGetItem) for b in main.bindings())
    feeds = {"x": rand(4, 6)}
    assert_outputs_match(run_module(from_onnx(model), feeds), run_onnxruntime(model, feeds), "topk")


def test_conversion_errors_name_the_node() -> None:
    model = make_model([helper.make_node("ReduceSum", ["x", "axes"], ["y"], name="bad_sum")],
                       [("x", F, ["n", 3])], [("y", F, None)], {"axes": np.array([2], np.int64)}, check=False)
    with pytest.raises(RelaxwebError, match=r"ReduceSum node 'bad_sum' \(binding 'y'\): sum: axis 2 is out of range"):
        from_onnx(model)
