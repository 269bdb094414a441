"""Tests of the shape-related ONNX converters and of compile-time shape folding.

1. ONNX's own node test cases of the data movement, indexing, creation and control flow
   ops (Reshape, Slice, Gather, Pad, If ...), imported as they are and run in the reference
   interpreter; then again with their shape operands (Reshape targets, Slice starts, Pad
   pads ...) given as initializers, as exporters write them, legalized to tensor programs
   and run through the whole pipeline (host function interpreter).
2. Shape subgraphs stay symbolic: ``Shape -> Gather -> Unsqueeze -> Concat -> Reshape``,
   ``Range(0, seq)``, ``ConstantOfShape`` and ``Expand`` fed by shape values get shapes in
   the input's variables only, and match onnxruntime at two shapes.
3. The same subgraphs as PyTorch's legacy (TorchScript) exporter writes them.
4. The folders' arithmetic, comparisons and If conditions; ``materialize``; data-dependent
   shapes (NonZero, run-time shape operands); some kernels, and a whole bundle, on wgpu.
"""

from __future__ import annotations

import copy

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import TensorProto, helper, numpy_helper

from relaxweb.errors import RelaxwebError, UnsupportedModelError
from relaxweb.frontend import from_onnx
from relaxweb.frontend.onnx import symbolic_vars as annotation_vars
from relaxweb.frontend.converters import ConversionContext
from relaxweb.frontend.converters.shape_values import SHAPE_OPERANDS, materialize, value_dtype, with_dtype
from relaxweb.ir import FunctionBuilder, IRModule, ShapeExpr, SizeVar, TensorStructInfo
from relaxweb.ir.dtype import DTYPES
from relaxweb.ir.expr import Call, Constant, Function, If, MatchCast, PrimValue, Var
from relaxweb.ir.interpreter import run_host_function
from relaxweb.ir.interpreter import run_module
from relaxweb.ir.printer import format_function
from relaxweb.ir.symbolic import evaluate
from relaxweb.ir.well_formed import check_well_formed
from relaxweb.ops import DeductionError, call_op
from relaxweb.passes import legalize_ops, run_pipeline
from tests.gpu_kernels import run_compiled
from tests.gpu_kernels import run_kernel_on_gpu
from tests.helpers import assert_close, make_model, onnx_node_cases

# 1. ONNX's node test cases ---------------------------------------------------------------------

# The onnx/backend/test/case/node modules of the op types tested here (importing one runs its
# exports, which record its cases; much faster than collecting all ~1900 cases).
CASE_MODULES = [
    "reshape", "flatten", "transpose", "squeeze", "unsqueeze", "concat", "split", "slice", "gather",
    "gatherelements", "gathernd", "scatter", "scatterelements", "scatternd", "expand", "tile", "pad", "shape",
    "size", "rangeop", "constantofshape", "constant", "identity", "trilu", "nonzero", "if_",
]
OP_TYPES = {
    "Reshape", "Flatten", "Transpose", "Squeeze", "Unsqueeze", "Concat", "Split", "Slice", "Gather",
    "GatherElements", "GatherND", "Scatter", "ScatterElements", "ScatterND", "Expand", "Tile", "Pad", "Shape",
    "Size", "Range", "ConstantOfShape", "Constant", "Identity", "Trilu", "NonZero", "If",
}
# Cases refused on import, with this error (none now: sequences and optionals import).
UNSUPPORTED: dict[str, str] = {}


def _collect_cases() -> dict:
    cases = {}
    for case in onnx_node_cases(CASE_MODULES):
        op_types = {node.op_type for node in case.model.graph.node}
        if op_types and op_types <= OP_TYPES:
            cases.setdefault(case.name, case)
    return cases


CASES = _collect_cases()


def _graph_inputs(model: onnx.ModelProto) -> list[str]:
    initialized = {i.name for i in model.graph.initializer}
    return [i.name for i in model.graph.input if i.name not in initialized]


def _assert_outputs(actual: list[np.ndarray], expected: list, what: str) -> None:
    assert len(actual) == len(expected), what
    for position, (got, want) in enumerate(zip(actual, expected)):
        if want is None or isinstance(want, list):  # an empty optional, a sequence
            assert (got is None) if want is None else isinstance(got, list), f"{what}, output {position}"
            if want is not None:
                _assert_outputs(got, want, f"{what}, output {position}")
            continue
        want = np.asarray(want)
        assert got.shape == want.shape, f"{what}, output {position}: shape {got.shape} vs {want.shape}"
        assert got.dtype == want.dtype, f"{what}, output {position}: dtype {got.dtype} vs {want.dtype}"
        assert_close(got.astype(np.float64), want.astype(np.float64), err_msg=f"{what}, output {position}")


def test_the_node_cases_cover_every_op_type() -> None:
    covered = {node.op_type for case in CASES.values() for node in case.model.graph.node}
    assert covered == OP_TYPES
    assert len(CASES) >= 150


@pytest.mark.parametrize("name", sorted(CASES))
def test_onnx_node_case(name: str) -> None:
    """The case as ONNX writes it (shape operands are graph inputs: data-dependent shapes)."""
    case = CASES[name]
    if name in UNSUPPORTED:
        with pytest.raises(UnsupportedModelError, match=UNSUPPORTED[name]):
            from_onnx(case.model)
        return
    module = from_onnx(case.model)
    check_well_formed(module)
    names = _graph_inputs(case.model)
    for inputs, outputs in case.data_sets:
        _assert_outputs(run_module(module, dict(zip(names, inputs))), outputs, name)


def _with_constant_operands(case) -> tuple[onnx.ModelProto, dict, list]:
    """The case with the graph inputs that feed shape operands (and Pad's value) given as
    initializers; returns (model, the remaining feeds, the expected outputs)."""
    model = copy.deepcopy(case.model)
    graph = model.graph
    inputs, outputs = case.data_sets[0]
    feeds = dict(zip(_graph_inputs(model), inputs))
    positions = {op: set(p) for op, p in SHAPE_OPERANDS.items() if op != "Gather"}
    positions["Pad"] = {1, 2, 3}
    operands = {node.input[p] for node in graph.node for p in positions.get(node.op_type, ())
                if p < len(node.input) and node.input[p] in feeds}
    for name in sorted(operands):
        graph.initializer.append(numpy_helper.from_array(np.asarray(feeds.pop(name)), name))
    kept = [i for i in graph.input if i.name not in operands]
    del graph.input[:]
    graph.input.extend(kept)
    return model, feeds, outputs


# Cases whose ops have no GPU lowering (sequences and optionals): the interpreter runs them
# (test_onnx_node_case), the pipeline below does not.
NO_GPU_LOWERING = {"test_if_opt", "test_if_seq"}

CONSTANT_OPERAND_CASES = sorted(
    name for name, case in CASES.items()
    if name not in UNSUPPORTED and name not in NO_GPU_LOWERING and _with_constant_operands(case)[0].graph.initializer
)


@pytest.mark.parametrize("name", CONSTANT_OPERAND_CASES)
def test_onnx_node_case_with_constant_operands_through_the_pipeline(name: str) -> None:
    model, feeds, outputs = _with_constant_operands(CASES[name])
    module = from_onnx(model)
    _assert_outputs(run_module(module, feeds), outputs, f"{name} (interpreter)")
    _assert_outputs(run_module(legalize_ops(module), feeds), outputs, f"{name} (legalized)")
    dtypes = {str(np.asarray(a).dtype) for a in [*feeds.values(), *outputs]}
    if dtypes <= set(DTYPES):
        pipeline = run_pipeline(module)
        actual = run_host_function(pipeline.main, pipeline.programs, feeds)
        _assert_outputs(actual, outputs, f"{name} (host function)")


# Helpers for hand-built models -----------------------------------------------------------------

# (make_model: inputs (name, shape[, elem type]), outputs (name, elem type) with no shape, so
# nothing comes from ONNX's shape inference.)


def const(name: str, value, dtype=np.int64) -> onnx.NodeProto:
    return helper.make_node("Constant", [], [name], name=name, value=numpy_helper.from_array(np.array(value, dtype=dtype)))


def run_onnxruntime(model: onnx.ModelProto, feeds: dict) -> list[np.ndarray]:
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, feeds)


def symbolic_vars(function: Function) -> set[str]:
    """Every size variable of every annotation of the function (If branches included)."""
    return set(annotation_vars(function))


def called_ops(function: Function) -> list[str]:
    return [b.value.op for b in function.bindings() if isinstance(b.value, Call)]


def check_against_onnxruntime(model: onnx.ModelProto, shapes: list[dict], pipeline: bool = True,
                              dtypes: dict | None = None) -> IRModule:
    """Interpreter (and, with ``pipeline``, the lowered host function) against onnxruntime."""
    module = from_onnx(model)
    check_well_formed(module)
    lowered = run_pipeline(module) if pipeline else None
    rng = np.random.default_rng(0)
    for shape in shapes:
        feeds = {}
        for value in model.graph.input:
            dims = [shape.get(d.dim_param, d.dim_value) if d.dim_param else d.dim_value
                    for d in value.type.tensor_type.shape.dim]
            dtype = (dtypes or {}).get(value.name, np.float32)
            feeds[value.name] = rng.uniform(-2, 2, dims).astype(dtype)
        expected = run_onnxruntime(model, feeds)
        _assert_outputs(run_module(module, feeds), expected, f"interpreter at {shape}")
        if lowered is not None:
            actual = run_host_function(lowered.main, lowered.programs, feeds)
            _assert_outputs(actual, expected, f"host function at {shape}")
    return module


SHAPES = [{"batch": 2, "seq": 3}, {"batch": 1, "seq": 5}]


# 2. Symbolic shape subgraphs -------------------------------------------------------------------


def shape_subgraph_model() -> onnx.ModelProto:
    nodes = [
        helper.make_node("Shape", ["x"], ["shape"], name="shape"),
        const("zero", 0), const("one", 1), const("axis0", [0]), const("heads", [4, 16]),
        const("one_1d", [1]),
        helper.make_node("Gather", ["shape", "zero"], ["batch"], name="gather_batch"),
        helper.make_node("Gather", ["shape", "one"], ["seq"], name="gather_seq"),
        helper.make_node("Unsqueeze", ["batch", "axis0"], ["batch_1d"], name="unsqueeze_batch"),
        helper.make_node("Unsqueeze", ["seq", "axis0"], ["seq_1d"], name="unsqueeze_seq"),
        helper.make_node("Concat", ["batch_1d", "seq_1d", "heads"], ["target"], name="concat", axis=0),
        helper.make_node("Reshape", ["x", "target"], ["split_heads"], name="reshape"),
        helper.make_node("Range", ["zero", "seq", "one"], ["positions"], name="range"),
        helper.make_node("Concat", ["batch_1d", "seq_1d"], ["batch_seq"], name="concat_bs", axis=0),
        helper.make_node("ConstantOfShape", ["batch_seq"], ["mask"], name="constant_of_shape",
                         value=numpy_helper.from_array(np.array([1.0], np.float32))),
        helper.make_node("Expand", ["positions", "batch_seq"], ["position_ids"], name="expand"),
        helper.make_node("Slice", ["x", "one_1d", "seq_1d", "one_1d"], ["tail"], name="slice"),
    ]
    return make_model(
        nodes, [("x", ["batch", "seq", 64])],
        [("split_heads", TensorProto.FLOAT), ("positions", TensorProto.INT64), ("mask", TensorProto.FLOAT),
         ("position_ids", TensorProto.INT64), ("tail", TensorProto.FLOAT)],
    )


def test_shape_subgraphs_give_symbolic_shapes() -> None:
    main = from_onnx(shape_subgraph_model()).main
    assert str(main.ret_struct_info) == (
        "Tuple(Tensor((batch, seq, 4, 16), float32), Tensor((seq), int64), Tensor((batch, seq), float32), "
        "Tensor((batch, seq), int64), Tensor((batch, seq - 1, 64), float32))"
    )
    assert symbolic_vars(main) == {"batch", "seq"}  # no fresh variables anywhere
    # the shape arithmetic left nothing on the GPU: only the ops that produce the outputs
    assert sorted(called_ops(main)) == ["arange", "broadcast_to", "full", "reshape", "strided_slice"]
    text = format_function(main)
    assert "reshape(x, shape((batch, seq, 4, 16)))" in text
    assert 'arange(prim(0), prim(seq), prim(1), dtype="int64", node=("range", "Range"))' in text


def test_shape_subgraphs_match_onnxruntime() -> None:
    check_against_onnxruntime(shape_subgraph_model(), SHAPES)


def test_shape_values_as_graph_outputs_and_in_gpu_ops() -> None:
    """A shape value that is an output, or that a GPU op consumes, becomes a tensor:
    ``shape_to_tensor`` (symbolic entries) or a constant (known ones)."""
    nodes = [
        helper.make_node("Shape", ["x"], ["shape"], name="shape"),
        helper.make_node("Size", ["x"], ["size"], name="size"),
        helper.make_node("Shape", ["x"], ["static"], name="static", start=-1),
        helper.make_node("Cast", ["shape"], ["shape_float"], name="cast", to=TensorProto.FLOAT),
        helper.make_node("Add", ["shape_float", "w"], ["sum"], name="add"),
    ]
    model = make_model(nodes, [("x", ["batch", "seq", 3]), ("w", [3])],
                       [("shape", TensorProto.INT64), ("size", TensorProto.INT64), ("static", TensorProto.INT64),
                        ("sum", TensorProto.FLOAT)])
    module = check_against_onnxruntime(model, SHAPES)
    text = format_function(module.main)
    assert 'shape_to_tensor(shape((batch, seq, 3)), dtype="int64")' in text
    assert 'shape_to_tensor(prim(batch * seq * 3), dtype="int64")' in text
    assert 'shape_to_tensor(shape((batch, seq, 3)), dtype="float32")' in text
    assert 'identity(const("static", [3], "int64"))' in text


def test_symbolic_slice_bounds_and_arithmetic() -> None:
    """``x[:, : seq // 2]``, ``x[:, -1]`` and ``x[:, seq - 2]`` as exporters compute them."""
    nodes = [
        helper.make_node("Shape", ["x"], ["shape"]),
        const("one", 1), const("two", 2), const("axis0", [0]), const("axis1", [1]), const("zero_1d", [0]),
        const("last", -1),
        helper.make_node("Gather", ["shape", "one"], ["seq"]),
        helper.make_node("Div", ["seq", "two"], ["half"]),
        helper.make_node("Unsqueeze", ["half", "axis0"], ["half_1d"]),
        helper.make_node("Slice", ["x", "zero_1d", "half_1d", "axis1"], ["first_half"]),
        helper.make_node("Gather", ["x", "last"], ["last_step"], axis=1),
        helper.make_node("Sub", ["seq", "two"], ["before_last"]),
        helper.make_node("Gather", ["x", "before_last"], ["second_last"], axis=1),
        helper.make_node("Mul", ["seq", "two"], ["double"]),
        helper.make_node("Mod", ["double", "two"], ["remainder"]),
        helper.make_node("Unsqueeze", ["remainder", "axis0"], ["remainder_1d"]),
        helper.make_node("Unsqueeze", ["double", "axis0"], ["double_1d"]),
        helper.make_node("Concat", ["double_1d", "remainder_1d"], ["pair"], axis=0),
        helper.make_node("Add", ["pair", "zero_1d"], ["pair_out"]),
    ]
    model = make_model(nodes, [("x", ["batch", "seq", 4])],
                       [("first_half", TensorProto.FLOAT), ("last_step", TensorProto.FLOAT),
                        ("second_last", TensorProto.FLOAT), ("pair_out", TensorProto.INT64)])
    module = check_against_onnxruntime(model, [{"batch": 2, "seq": 5}, {"batch": 1, "seq": 4}])
    main = module.main
    assert str(main.ret_struct_info) == ("Tuple(Tensor((batch, seq // 2, 4), float32), Tensor((batch, 4), float32), "
                                         "Tensor((batch, 4), float32), Tensor((2), int64))")
    assert 'shape_to_tensor(shape((seq * 2, 0)), dtype="int64")' in format_function(main)
    assert "take" not in called_ops(main)  # gathers by one index are slices


def test_symbolic_comparisons_and_where() -> None:
    """Decidable comparisons fold to constants; the others stay symbolic (0 or 1)."""
    nodes = [
        helper.make_node("Shape", ["x"], ["shape"]),
        const("minus_one", [-1, -1]), const("four", [4, 4]), const("ones", [1, 1]),
        helper.make_node("Equal", ["shape", "minus_one"], ["is_minus_one"]),
        helper.make_node("Where", ["is_minus_one", "ones", "shape"], ["target"]),
        helper.make_node("Equal", ["shape", "four"], ["is_four"]),
        helper.make_node("Cast", ["is_four"], ["is_four_int"], to=TensorProto.INT64),
        helper.make_node("Where", ["is_four", "shape", "ones"], ["picked"]),
        helper.make_node("Expand", ["x", "target"], ["y"]),
        helper.make_node("Add", ["picked", "is_four_int"], ["out"]),
    ]
    model = make_model(nodes, [("x", ["n", "m"])], [("y", TensorProto.FLOAT), ("out", TensorProto.INT64)])
    module = check_against_onnxruntime(model, [{"n": 4, "m": 3}, {"n": 2, "m": 4}])
    assert str(module.main.ret_struct_info) == "Tuple(Tensor((n, m), float32), Tensor((2), int64))"


def test_float_shape_arithmetic_stays_exact_or_goes_to_the_gpu() -> None:
    """``Cast(seq, float) * 2 / 4``: integral results fold; ``seq / 4`` in floats is computed
    on a materialized tensor."""
    nodes = [
        helper.make_node("Shape", ["x"], ["shape"]),
        const("one", 1), const("two", 2.0, np.float32), const("four", 4.0, np.float32),
        helper.make_node("Gather", ["shape", "one"], ["seq"]),
        helper.make_node("Cast", ["seq"], ["seq_float"], to=TensorProto.FLOAT),
        helper.make_node("Mul", ["seq_float", "four"], ["quadruple"]),
        helper.make_node("Div", ["quadruple", "two"], ["double"]),
        helper.make_node("Div", ["seq_float", "four"], ["quarter"]),
    ]
    model = make_model(nodes, [("x", ["batch", "seq"])], [("double", TensorProto.FLOAT), ("quarter", TensorProto.FLOAT)])
    module = check_against_onnxruntime(model, [{"batch": 1, "seq": 6}, {"batch": 2, "seq": 3}])
    text = format_function(module.main)
    assert 'shape_to_tensor(prim(seq * 2), dtype="float32")' in text
    assert "divide(" in text


# 3. PyTorch's legacy exporter ------------------------------------------------------------------


def legacy_view_model(opset: int) -> onnx.ModelProto:
    """``x.view(x.size(0), -1)`` and ``x.new_ones(b, s).expand(...)``, node for node as the
    TorchScript exporter writes them (scalar Gather indices, Unsqueeze with an ``axes``
    attribute before opset 13, ``unk__N`` dim names, no value_info)."""
    def unsqueeze(source: str, target: str) -> onnx.NodeProto:
        if opset < 13:
            return helper.make_node("Unsqueeze", [source], [target], name=f"/{target}", axes=[0])
        return helper.make_node("Unsqueeze", [source, "/axes"], [target], name=f"/{target}")

    nodes = [
        helper.make_node("Shape", ["input.1"], ["/Shape_output_0"], name="/Shape"),
        const("/Constant_output_0", 0),
        helper.make_node("Gather", ["/Shape_output_0", "/Constant_output_0"], ["/Gather_output_0"], name="/Gather", axis=0),
        helper.make_node("Shape", ["input.1"], ["/Shape_1_output_0"], name="/Shape_1"),
        const("/Constant_1_output_0", 1),
        helper.make_node("Gather", ["/Shape_1_output_0", "/Constant_1_output_0"], ["/Gather_1_output_0"],
                         name="/Gather_1", axis=0),
        const("/axes", [0]),
        unsqueeze("/Gather_output_0", "/Unsqueeze_output_0"),
        unsqueeze("/Gather_1_output_0", "/Unsqueeze_1_output_0"),
        const("/Constant_2_output_0", [-1]),
        helper.make_node("Concat", ["/Unsqueeze_output_0", "/Constant_2_output_0"], ["/Concat_output_0"],
                         name="/Concat", axis=0),
        helper.make_node("Reshape", ["input.1", "/Concat_output_0"], ["flat"], name="/Reshape"),
        # expand(b, s, 8) of a [1, 1, 8] weight: torch writes the -1 handling explicitly
        const("/Constant_3_output_0", [8]),
        helper.make_node("Concat", ["/Unsqueeze_output_0", "/Unsqueeze_1_output_0", "/Constant_3_output_0"],
                         ["/Concat_1_output_0"], name="/Concat_1", axis=0),
        helper.make_node("Shape", ["/Concat_1_output_0"], ["/Shape_2_output_0"], name="/Shape_2"),
        helper.make_node("ConstantOfShape", ["/Shape_2_output_0"], ["/ConstantOfShape_output_0"], name="/ConstantOfShape",
                         value=numpy_helper.from_array(np.array([1], np.int64))),
        const("/Constant_4_output_0", -1),
        helper.make_node("Mul", ["/ConstantOfShape_output_0", "/Constant_4_output_0"], ["/Mul_output_0"], name="/Mul"),
        helper.make_node("Equal", ["/Concat_1_output_0", "/Mul_output_0"], ["/Equal_output_0"], name="/Equal"),
        helper.make_node("Where", ["/Equal_output_0", "/ConstantOfShape_output_0", "/Concat_1_output_0"],
                         ["/Where_output_0"], name="/Where"),
        helper.make_node("Expand", ["weight", "/Where_output_0"], ["expanded"], name="/Expand"),
    ]
    return make_model(nodes, [("input.1", ["unk__0", "unk__1", 16])],
                      [("flat", TensorProto.FLOAT), ("expanded", TensorProto.FLOAT)], opset=opset,
                      initializers={"weight": np.arange(8, dtype=np.float32).reshape(1, 1, 8)})


@pytest.mark.parametrize("opset", [11, 13])
def test_pytorch_legacy_view_and_expand(opset: int) -> None:
    module = check_against_onnxruntime(legacy_view_model(opset), [{"unk__0": 2, "unk__1": 3}, {"unk__0": 1, "unk__1": 7}])
    main = module.main
    assert str(main.ret_struct_info) == "Tuple(Tensor((unk__0, unk__1 * 16), float32), Tensor((unk__0, unk__1, 8), float32))"
    assert symbolic_vars(main) == {"unk__0", "unk__1"}
    assert called_ops(main) == ["reshape", "broadcast_to"]


# 4. Data-dependent shapes, If, materialize, kernels --------------------------------------------


@pytest.mark.gpu
def test_run_time_shape_operands_give_data_dependent_shapes(tmp_path) -> None:
    """A Reshape target or Tile repeats computed at run time: only the rank is known, and the
    result is matched against fresh size variables (later ops see named dims); the
    interpreter runs it, and the GPU build reads the extents back mid-run."""
    nodes = [
        helper.make_node("Reshape", ["x", "target"], ["y"], name="reshape"),
        helper.make_node("Tile", ["x", "repeats"], ["z"], name="tile"),
    ]
    model = make_model(nodes, [("x", ["n", 4]), ("target", [3], TensorProto.INT64), ("repeats", [2], TensorProto.INT64)],
                       [("y", TensorProto.FLOAT), ("z", TensorProto.FLOAT)])
    module = from_onnx(model)
    assert str(module.main.ret_struct_info) == \
        "Tuple(Tensor((y_dim0, y_dim1, y_dim2), float32), Tensor((z_dim0, z_dim1), float32))"
    x = np.arange(24, dtype=np.float32).reshape(6, 4)
    feeds = {"x": x, "target": np.array([0, 2, -1], np.int64), "repeats": np.array([1, 2], np.int64)}
    expected = run_onnxruntime(model, feeds)
    _assert_outputs(run_module(module, feeds), expected, "run-time operands")
    _assert_outputs(run_compiled(module, feeds, tmp_path / "bundle"), expected, "run-time operands on the GPU")


@pytest.mark.gpu
def test_ops_after_a_data_dependent_range_see_named_dims(tmp_path) -> None:
    """Range(0, max(x)) has a length only the data gives: the ops after it (a Cast, a Sqrt,
    an Add with itself) deduce their shapes from the size variable its match_cast binds,
    and the GPU build reads the length back mid-run."""
    nodes = [
        helper.make_node("ReduceMax", ["x"], ["top"], name="top", keepdims=0),
        helper.make_node("Cast", ["top"], ["limit"], name="limit", to=TensorProto.INT64),
        helper.make_node("Range", ["zero", "limit", "one"], ["steps"], name="steps"),
        helper.make_node("Cast", ["steps"], ["as_float"], name="as_float", to=TensorProto.FLOAT),
        helper.make_node("Sqrt", ["as_float"], ["root"], name="root"),
        helper.make_node("Add", ["root", "as_float"], ["y"], name="sum"),
    ]
    model = make_model(nodes, [("x", ["n"])], [("y", TensorProto.FLOAT)],
                       initializers={"zero": np.array(0, np.int64), "one": np.array(1, np.int64)})
    module = from_onnx(model)
    assert str(module.main.ret_struct_info) == "Tensor((steps_dim0), float32)"
    for x in (np.array([3.0, 1.0], np.float32), np.array([7.5], np.float32), np.array([-2.0], np.float32)):
        feeds = {"x": x}
        expected = run_onnxruntime(model, feeds)
        _assert_outputs(run_module(module, feeds), expected, f"interpreter at {x}")
        _assert_outputs(run_compiled(module, feeds, tmp_path / "bundle"), expected, f"GPU at {x}")


def test_shape_of_a_data_dependent_tensor_names_its_dims() -> None:
    """Shape of a tensor known only by its rank matches it against fresh size variables,
    and later readers of the same ONNX value see the named dims."""
    nodes = [
        helper.make_node("Reshape", ["x", "target"], ["y"], name="reshape"),
        helper.make_node("Shape", ["y"], ["shape"], name="shape"),
        helper.make_node("Relu", ["y"], ["z"], name="relu"),
    ]
    model = make_model(nodes, [("x", ["n", 4]), ("target", [2], TensorProto.INT64)],
                       [("shape", TensorProto.INT64), ("z", TensorProto.FLOAT)])
    module = from_onnx(model)
    assert str(module.main.ret_struct_info) == "Tuple(Tensor((2), int64), Tensor((y_dim0, y_dim1), float32))"
    feeds = {"x": np.arange(12, dtype=np.float32).reshape(3, 4) - 5, "target": np.array([2, -1], np.int64)}
    _assert_outputs(run_module(module, feeds), run_onnxruntime(model, feeds), "data-dependent shape")


OLD_OPSET_CASES = {
    # name: (opset, nodes, input shape)
    "split_attr": (11, [helper.make_node("Split", ["x"], ["a", "b"], axis=1, split=[1, 3])], ["n", 4]),
    "split_equal": (11, [helper.make_node("Split", ["x"], ["a", "b"], axis=1)], ["n", 4]),
    "slice_attrs": (9, [helper.make_node("Slice", ["x"], ["a"], starts=[1, -3], ends=[2**63 - 1, -1], axes=[0, 1])],
                    ["n", 4]),
    "pad_attrs": (10, [helper.make_node("Pad", ["x"], ["a"], pads=[1, 0, 0, 2], mode="edge")], ["n", 4]),
    "squeeze_unsqueeze_attrs": (11, [helper.make_node("Unsqueeze", ["x"], ["u"], axes=[0, 3]),
                                     helper.make_node("Squeeze", ["u"], ["a"], axes=[0])], ["n", 4]),
    "flatten": (11, [helper.make_node("Flatten", ["x"], ["a"], axis=0)], ["n", 4]),
    "transpose_gather_elements": (11, [
        helper.make_node("Transpose", ["x"], ["t"]),
        helper.make_node("Shape", ["t"], ["s"]),
        helper.make_node("ConstantOfShape", ["s"], ["zeros"], value=numpy_helper.from_array(np.array([0], np.int64))),
        helper.make_node("GatherElements", ["t", "zeros"], ["a"], axis=1),
    ], ["n", 4]),
}


@pytest.mark.parametrize("case", sorted(OLD_OPSET_CASES))
def test_older_opset_forms(case: str) -> None:
    opset, nodes, shape = OLD_OPSET_CASES[case]
    outputs = [o for node in nodes for o in node.output if o in ("a", "b")]
    model = make_model(nodes, [("x", shape)], [(o, TensorProto.FLOAT) for o in outputs], opset=opset)
    check_against_onnxruntime(model, [{"n": 3}, {"n": 5}], pipeline=case != "transpose_gather_elements")


def test_split_with_symbolic_sizes_slices_each_part() -> None:
    nodes = [
        helper.make_node("Shape", ["x"], ["shape"]), const("zero", [0]), const("one", [1]), const("four", [4]),
        helper.make_node("Slice", ["shape", "zero", "one"], ["n"]),
        helper.make_node("Concat", ["four", "n"], ["sizes"], axis=0),
        helper.make_node("Concat", ["x", "y"], ["both"], axis=0),
        helper.make_node("Split", ["both", "sizes"], ["a", "b"], axis=0),
    ]
    model = make_model(nodes, [("x", ["n", 2]), ("y", [4, 2])], [("a", TensorProto.FLOAT), ("b", TensorProto.FLOAT)])
    module = check_against_onnxruntime(model, [{"n": 1}, {"n": 3}])
    assert str(module.main.ret_struct_info) == "Tuple(Tensor((4, 2), float32), Tensor((n, 2), float32))"


def test_constant_forms() -> None:
    sparse = helper.make_sparse_tensor(numpy_helper.from_array(np.array([5.0, 6.0], np.float32), "values"),
                                       numpy_helper.from_array(np.array([1, 4], np.int64), "indices"), [2, 3])
    nodes = [
        helper.make_node("Constant", [], ["s"], sparse_value=sparse),
        helper.make_node("Constant", [], ["f"], value_floats=[1.5, 2.5, 3.5]),
        helper.make_node("Constant", [], ["i"], value_int=3),
        helper.make_node("Add", ["x", "s"], ["a"]),
        helper.make_node("Mul", ["a", "f"], ["b"]),
        helper.make_node("Cast", ["i"], ["i_float"], to=TensorProto.FLOAT),
        helper.make_node("Add", ["b", "i_float"], ["y"]),
    ]
    model = make_model(nodes, [("x", [2, 3])], [("y", TensorProto.FLOAT)])
    check_against_onnxruntime(model, [{}])


def test_nonzero_count_gets_a_name_and_shape_reads_it() -> None:
    nodes = [
        helper.make_node("NonZero", ["x"], ["indices"], name="nonzero"),
        helper.make_node("Shape", ["indices"], ["shape"], name="shape"),
        const("one", 1), const("axis0", [0]), const("rows", [2]),
        helper.make_node("Gather", ["shape", "one"], ["count"], name="gather"),
        helper.make_node("Unsqueeze", ["count", "axis0"], ["count_1d"], name="unsqueeze"),
        helper.make_node("Concat", ["count_1d", "rows"], ["target"], name="concat", axis=0),
        helper.make_node("Transpose", ["indices"], ["pairs"], name="transpose"),
        helper.make_node("Reshape", ["pairs", "target"], ["y"], name="reshape"),
    ]
    model = make_model(nodes, [("x", ["n", "m"])], [("y", TensorProto.INT64)])
    module = check_against_onnxruntime(model, [{"n": 3, "m": 4}, {"n": 2, "m": 2}], pipeline=False)
    assert str(module.main.ret_struct_info) == "Tensor((indices_count, 2), int64)"
    assert isinstance([b for b in module.main.bindings() if b.var.name == "nonzero_cast"][0], MatchCast)


def if_model(condition: str) -> onnx.ModelProto:
    """``if cond: relu(x) + w else: reshape(x, [-1, 2])`` reading ``x`` and ``w`` from the
    outer scope; ``cond`` is a graph input or ``Shape(x)[0] == 2``."""
    then_branch = helper.make_graph(
        [helper.make_node("Relu", ["x"], ["r"]), helper.make_node("Add", ["r", "w"], ["then_out"])],
        "then", [], [helper.make_tensor_value_info("then_out", TensorProto.FLOAT, None)])
    else_branch = helper.make_graph(
        [const("flat", [-1, 2]), helper.make_node("Reshape", ["x", "flat"], ["else_out"])],
        "else", [], [helper.make_tensor_value_info("else_out", TensorProto.FLOAT, None)])
    nodes = [helper.make_node("If", [condition], ["y"], name="if", then_branch=then_branch, else_branch=else_branch)]
    inputs = [("x", ["n", 4])]
    if condition == "cond":
        inputs.append(("cond", [], TensorProto.BOOL))
    else:
        nodes = [helper.make_node("Shape", ["x"], ["shape"]), const("zero", 0), const("two", 2),
                 helper.make_node("Gather", ["shape", "zero"], ["rows"]),
                 helper.make_node("Equal", ["rows", "two"], ["is_two"])] + nodes
    return make_model(nodes, inputs, [("y", TensorProto.FLOAT)], {"w": np.arange(4, dtype=np.float32)}, opset=17)


def test_if_on_a_symbolic_condition_is_decided_in_the_host() -> None:
    module = check_against_onnxruntime(if_model("is_two"), [{"n": 2}, {"n": 3}])
    (branch,) = [b for b in module.main.bindings() if isinstance(b.value, If)]
    assert isinstance(branch.value.condition, PrimValue)
    condition = branch.value.condition.value  # n == 2, as 0 or 1
    assert [evaluate(condition, {"n": n}) for n in (0, 1, 2, 3, 4)] == [0, 0, 1, 0, 0]
    # the branches disagree on the shape: the result is matched against fresh dims
    assert str(module.main.ret_struct_info) == "Tensor((y_dim0, y_dim1), float32)"


def test_if_on_a_tensor_condition() -> None:
    model = if_model("cond")
    module = from_onnx(model)
    (branch,) = [b for b in module.main.bindings() if isinstance(b.value, If)]
    assert branch.value.condition.struct_info == TensorStructInfo((), "int32")  # cast for the host's read-back
    lowered = run_pipeline(module)
    x = np.linspace(-1, 1, 12, dtype=np.float32).reshape(3, 4)
    for cond in (True, False):
        feeds = {"x": x, "cond": np.array(cond)}
        expected = run_onnxruntime(model, feeds)
        _assert_outputs(run_module(module, feeds), expected, f"cond={cond}")
        _assert_outputs(run_host_function(lowered.main, lowered.programs, feeds), expected, f"host, cond={cond}")


def test_if_on_a_constant_condition_is_inlined() -> None:
    model = if_model("is_two")
    model.graph.input[0].type.tensor_type.shape.dim[0].dim_value = 2  # Shape(x)[0] == 2 folds to true
    module = check_against_onnxruntime(model, [{}])
    assert not any(isinstance(b.value, If) for b in module.main.bindings())
    assert called_ops(module.main) == ["relu", "add", "identity"]


def test_if_with_unsupported_ops_in_a_branch_lists_them() -> None:
    then_branch = helper.make_graph([helper.make_node("Bogus", ["x"], ["t"], name="bogus")], "then", [],
                                    [helper.make_tensor_value_info("t", TensorProto.FLOAT, None)])
    model = make_model([helper.make_node("If", ["cond"], ["y"], name="if", then_branch=then_branch,
                                         else_branch=then_branch)],
                       [("x", [4]), ("cond", [], TensorProto.BOOL)], [("y", TensorProto.FLOAT)])
    # found by the check of the whole model before conversion (both branches share the graph)
    with pytest.raises(UnsupportedModelError, match=r"^the model uses 1 unsupported op type\(s\): Bogus \(nodes: bogus, bogus\)$"):
        from_onnx(model)


def test_materialize() -> None:
    builder = FunctionBuilder("main")
    context = ConversionContext(builder, 17)
    n = SizeVar("n")
    static = materialize(context, ShapeExpr((2, 3)))
    assert isinstance(static, Constant) and static.data.tolist() == [2, 3] and static.data.dtype == np.int64
    scalar = materialize(context, PrimValue(7))
    assert isinstance(scalar, Constant) and scalar.data.shape == ()
    symbolic = ShapeExpr((n, 4))
    var = materialize(context, symbolic, "target")
    assert isinstance(var, Var) and var.struct_info == TensorStructInfo((2,), "int64")
    assert materialize(context, symbolic) is var  # bound once per builder
    half = with_dtype(PrimValue(n), "float32")
    assert value_dtype(half) == "float32"
    assert materialize(context, half).struct_info == TensorStructInfo((), "float32")
    assert materialize(context, var) is var  # tensors pass through
    assert [str(b.value.op) for b in builder.bindings] == ["shape_to_tensor", "shape_to_tensor"]


def test_deduction_of_the_new_ops() -> None:
    n, m = SizeVar("n"), SizeVar("m")
    x = Var("x", TensorStructInfo((n, 4), "float32"))
    assert str(call_op("broadcast_to", x, ShapeExpr((m, 1, 1))).struct_info) == "Tensor((m, n, 4), float32)"
    assert str(call_op("tile", x, ShapeExpr((2, m))).struct_info) == "Tensor((n * 2, m * 4), float32)"
    zero = Constant(np.zeros((), np.float32), "zero")
    assert str(call_op("pad", x, ShapeExpr((1, 0, 2, -1)), zero).struct_info) == "Tensor((n + 3, 3), float32)"
    assert str(call_op("arange", PrimValue(n), PrimValue(2 * n), PrimValue(3)).struct_info) == "Tensor(((n + 2) // 3), int64)"
    assert str(call_op("arange", PrimValue(0), PrimValue(n - m), PrimValue(1)).struct_info) == \
        "Tensor((max(0, n - m)), int64)"
    assert str(call_op("full", ShapeExpr((n, 2)), value=1, dtype="int32").struct_info) == "Tensor((n, 2), int32)"
    assert str(call_op("take", x, Var("i", TensorStructInfo((m, 2), "int64")), axis=1).struct_info) == \
        "Tensor((n, m, 2), float32)"
    with pytest.raises(DeductionError, match="broadcast_to: cannot broadcast dimension 1 of the result: 4 vs 5"):
        call_op("broadcast_to", x, ShapeExpr((5,)))
    with pytest.raises(DeductionError, match="pad: 2 pads for 2 padded axes"):
        call_op("pad", x, ShapeExpr((1, 1)), zero)


def test_errors_name_the_node() -> None:
    model = make_model([const("target", [5, -1]), helper.make_node("Reshape", ["x", "target"], ["y"], name="bad")],
                       [("x", [4, 3])], [("y", TensorProto.FLOAT)])
    with pytest.raises(RelaxwebError, match="Reshape node 'bad' \\(binding 'y'\\): reshape: cannot infer -1"):
        from_onnx(model)
    model = make_model([const("index", 5), helper.make_node("Gather", ["x", "index"], ["y"], name="far")],
                       [("x", [3, 2])], [("y", TensorProto.FLOAT)])
    with pytest.raises(RelaxwebError, match="Gather node 'far': index 5 is out of range for dimension 0"):
        from_onnx(model)


def _program(module: IRModule, name: str):
    return legalize_ops(module).programs[name]


def _module(params: dict, make) -> IRModule:
    builder = FunctionBuilder("main")
    args = [builder.add_param(name, info) for name, info in params.items()]
    output = builder.emit(make(*args), "y", output=True)
    return IRModule({"main": builder.finish([output], ["y"])})


@pytest.mark.parametrize("mode", ["constant", "edge", "reflect", "wrap"])
def test_pad_kernels_run_on_wgpu(device, mode: str) -> None:
    n = SizeVar("n")
    fill = Constant(np.array(-1.5, np.float32), "fill")
    module = _module({"x": TensorStructInfo((n, 5), "float32")},
                     lambda x: call_op("pad", x, ShapeExpr((2, 3, 1, -1)), fill, mode=mode))
    x = np.arange(20, dtype=np.float32).reshape(4, 5)
    (expected,) = run_module(module, {"x": x})
    assert expected.shape == (7, 7)
    np.testing.assert_array_equal(run_module(legalize_ops(module), {"x": x})[0], expected)
    arrays = [x, fill.data] if mode == "constant" else [x]
    np.testing.assert_array_equal(run_kernel_on_gpu(device, _program(module, "pad"), arrays, {"n": 4}), expected)


def test_pad_wrap_repeats_past_the_dim_on_wgpu(device) -> None:
    """Wrap pads longer than the (cropped) dim repeat it, as numpy's: the position is taken
    modulo the dim (floor modulo: positions before the start are negative)."""
    n = SizeVar("n")
    module = _module({"x": TensorStructInfo((n, 3), "float32")},
                     lambda x: call_op("pad", x, ShapeExpr((5, 7, 6, -1)), Constant(np.array(0, np.float32), "fill"),
                                       mode="wrap"))
    x = np.arange(12, dtype=np.float32).reshape(4, 3)
    expected = np.pad(x[:, :2], ((5, 6), (7, 0)), mode="wrap")
    np.testing.assert_array_equal(run_module(module, {"x": x})[0], expected)
    np.testing.assert_array_equal(run_module(legalize_ops(module), {"x": x})[0], expected)
    np.testing.assert_array_equal(run_kernel_on_gpu(device, _program(module, "pad"), [x], {"n": 4}), expected)


def test_creation_and_movement_kernels_run_on_wgpu(device) -> None:
    n, m = SizeVar("n"), SizeVar("m")
    x = np.arange(6, dtype=np.float32).reshape(2, 3)
    cases = [
        ({"x": TensorStructInfo((n, 3), "float32")}, lambda x: call_op("tile", x, ShapeExpr((2, m))), "tile",
         np.tile(x, (2, 2))),
        ({"x": TensorStructInfo((n, 3), "float32")}, lambda x: call_op("broadcast_to", x, ShapeExpr((m, 1, 1))),
         "broadcast_to", np.broadcast_to(x, (2, 2, 3))),
        ({"x": TensorStructInfo((n, 3), "float32")}, lambda x: call_op("trilu", x, PrimValue(m - 2), upper=False),
         "trilu", np.tril(x, 0)),
        ({}, lambda: call_op("arange", PrimValue(m), PrimValue(3 * m + 1), PrimValue(2), dtype="int32"), "arange",
         np.arange(2, 7, 2, dtype=np.int32)),
        ({}, lambda: call_op("shape_to_tensor", ShapeExpr((n, m * 4, 7)), dtype="int32"), "shape_to_tensor",
         np.array([2, 8, 7], np.int32)),
        ({}, lambda: call_op("full", ShapeExpr((m, n)), value=3, dtype="int32"), "full", np.full((2, 2), 3, np.int32)),
    ]
    for params, make, name, expected in cases:
        module = _module(params, make)
        arrays = [x] if params else []
        program = _program(module, name)
        sizes = {v.name: 2 for v in program.size_vars}
        np.testing.assert_array_equal(run_kernel_on_gpu(device, program, arrays, sizes), expected, err_msg=name)


def test_symbolic_shape_ops_in_a_bundle_on_wgpu(device, tmp_path) -> None:
    """One bundle, two shapes: reshape / ConstantOfShape / Trilu / Pad / Tile / Slice whose
    shapes come from Shape arithmetic run on wgpu and match onnxruntime."""
    from relaxweb.bundle import write_bundle
    from relaxweb.compiler import compile_module
    from relaxweb.runtime import Session

    nodes = [
        helper.make_node("Shape", ["x"], ["shape"]),
        const("zero", 0), const("one", 1), const("axis0", [0]), const("heads", [4, 16]), const("one_1d", [1]),
        helper.make_node("Gather", ["shape", "zero"], ["b"]), helper.make_node("Gather", ["shape", "one"], ["s"]),
        helper.make_node("Unsqueeze", ["b", "axis0"], ["b1"]), helper.make_node("Unsqueeze", ["s", "axis0"], ["s1"]),
        helper.make_node("Concat", ["b1", "s1", "heads"], ["target"], axis=0),
        helper.make_node("Reshape", ["x", "target"], ["y"]),
        helper.make_node("Concat", ["b1", "s1"], ["bs"], axis=0),
        helper.make_node("Concat", ["s1", "s1"], ["ss"], axis=0),
        helper.make_node("ConstantOfShape", ["bs"], ["mask"], value=numpy_helper.from_array(np.array([1.0], np.float32))),
        helper.make_node("ConstantOfShape", ["ss"], ["square"], value=numpy_helper.from_array(np.array([2.0], np.float32))),
        helper.make_node("Trilu", ["square", "one"], ["upper"]),
        helper.make_node("Pad", ["x", "pads"], ["padded"], mode="reflect"),
        helper.make_node("Tile", ["mask", "repeats"], ["tiled"]),
        helper.make_node("Slice", ["x", "one_1d", "s1", "one_1d"], ["tail"]),
    ]
    outputs = ["y", "mask", "upper", "padded", "tiled", "tail"]
    model = make_model(nodes, [("x", ["batch", "seq", 64])], [(name, TensorProto.FLOAT) for name in outputs],
                       {"pads": np.array([0, 1, 2, 0, 1, 3], np.int64), "repeats": np.array([2, 1], np.int64)}, opset=17)
    compiled = compile_module(from_onnx(model), {"batch": 4, "seq": 8})
    write_bundle(compiled, tmp_path / "bundle", "shapes.onnx")
    session = Session(tmp_path / "bundle")
    rng = np.random.default_rng(1)
    for shape in [(2, 3, 64), (3, 7, 64)]:
        x = rng.standard_normal(shape).astype(np.float32)
        actual = session.run({"x": x})
        _assert_outputs([actual[name] for name in outputs], run_onnxruntime(model, {"x": x}), f"wgpu at {shape}")
