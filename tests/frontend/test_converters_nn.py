"""The neural-network converters and ops: MatMul, Gemm, Einsum, Softmax/LogSoftmax/Hardmax,
the normalizations, convolutions, pooling, Dropout, Resize/Upsample, DepthToSpace and
SpaceToDepth.

- Every ONNX node test case (``onnx.backend.test.case.node``) whose nodes are these ops runs
  in the reference interpreter against its expected outputs; then legalized (tensor
  programs, whose WGSL is emitted) and evaluated again.  (Index ``//`` and ``%`` floor in the
  IR and in the WGSL backend alike: ``tests/wgsl/test_index_semantics.py``.)
- Models with symbolic dims (``batch``, ``height``, ``width``, ``seq``) against onnxruntime
  at several sizes: imported, legalized, and (the CNN) built into a bundle run on WebGPU.
- Deduction of symbolic shapes and its errors.
"""

from __future__ import annotations

import dataclasses
from functools import partial

import numpy as np
import onnx
import onnxruntime as ort
import pytest
from onnx import helper, numpy_helper

import relaxweb.ir.interpreter as interpreter
from relaxweb.errors import UnsupportedModelError
from relaxweb.frontend import from_onnx
from relaxweb.ir import Var
from relaxweb.ir.dtype import GPU_DTYPES
from relaxweb.ir.expr import ShapeExpr
from relaxweb.ir.interpreter import run_module
from relaxweb.ir.struct_info import TensorStructInfo
from relaxweb.ir.symbolic import IntImm, SizeVar, prove_equal
from relaxweb.ir.tir import Reduce, Unary, scalar_nodes
from relaxweb.ops import DeductionError, call_op
from relaxweb.ops.common import needs_known_shapes
from relaxweb.ops import OPS
from relaxweb.passes import legalize_ops
from relaxweb.wgsl import emit_wgsl
from tests import helpers
from tests.helpers import ONNX_CASE, assert_close, load_bundle, onnx_node_cases

# ONNX op type -> the module of onnx.backend.test.case.node that generates its cases
ONNX_CASE_MODULES = {
    "MatMul": "matmul", "Gemm": "gemm", "Einsum": "einsum", "Softmax": "softmax", "LogSoftmax": "logsoftmax",
    "Hardmax": "hardmax", "LayerNormalization": "layernormalization", "BatchNormalization": "batch_normalization",
    "InstanceNormalization": "instance_normalization", "GroupNormalization": "groupnormalization",
    "LpNormalization": "lpnormalization", "Conv": "conv", "ConvTranspose": "convtranspose", "MaxPool": "maxpool",
    "AveragePool": "averagepool", "GlobalAveragePool": "globalaveragepool", "GlobalMaxPool": "globalmaxpool",
    "LpPool": "lppool", "Dropout": "dropout", "Resize": "resize", "Upsample": "upsample",
    "DepthToSpace": "depthtospace", "SpaceToDepth": "spacetodepth",
}
OP_TYPES = set(ONNX_CASE_MODULES)

# Cases that test what relaxweb does not support on purpose; each must fail with this error.
UNSUPPORTED = {
    # training-mode Dropout drops elements at random (training_mode is a graph input here)
    **{name: "training mode" for name in (
        "test_training_dropout", "test_training_dropout_mask", "test_training_dropout_default",
        "test_training_dropout_default_mask", "test_training_dropout_zero_ratio",
        "test_training_dropout_zero_ratio_mask",
    )},
}

# Variants whose legalization refuses with a clear error (their cases check that error).
LOWERING_REFUSED = ("cubic", "antialias", "tf_crop_and_resize")


def collect_cases() -> list:
    """The ONNX node test cases made only of these op types (and Constant / Identity)."""
    selected = {}
    for case in onnx_node_cases(sorted(set(ONNX_CASE_MODULES.values()))):
        types = {node.op_type for node in case.model.graph.node}
        if types & OP_TYPES and types <= OP_TYPES | {"Constant", "Identity"}:
            selected[case.name] = case
    return [selected[name] for name in sorted(selected)]


CASES = collect_cases()


def as_array(value) -> np.ndarray:
    return numpy_helper.to_array(value) if isinstance(value, onnx.TensorProto) else np.asarray(value)


def feeds_of(model: onnx.ModelProto, inputs) -> dict[str, np.ndarray]:
    return {info.name: as_array(value) for info, value in zip(model.graph.input, inputs)}


def assert_outputs(actual: list, expected: list, what: str) -> None:
    assert len(actual) >= len(expected), what
    for index, (got, want) in enumerate(zip(actual, expected)):
        want = as_array(want)
        assert got.shape == want.shape, f"{what}: output {index} has shape {got.shape}, expected {want.shape}"
        assert got.dtype == want.dtype, f"{what}: output {index} has dtype {got.dtype}, expected {want.dtype}"
        if want.dtype == bool or np.issubdtype(want.dtype, np.integer):
            np.testing.assert_array_equal(got, want, err_msg=f"{what}: output {index}")
        else:
            assert_close(got.astype(np.float64), want.astype(np.float64), ONNX_CASE, err_msg=f"{what}: output {index}")


@pytest.mark.parametrize("case", CASES, ids=[case.name for case in CASES])
def test_onnx_node_case(case) -> None:
    if case.name in UNSUPPORTED:
        with pytest.raises(UnsupportedModelError, match=UNSUPPORTED[case.name]):
            from_onnx(case.model)
        return
    module = from_onnx(case.model)
    for inputs, outputs in case.data_sets:
        assert_outputs(run_module(module, feeds_of(case.model, inputs)), outputs, case.name)


def test_case_count() -> None:
    """The ONNX cases of these op types: all but the few unsupported ones pass."""
    assert len(CASES) >= 200
    assert len(UNSUPPORTED) <= 6


# Legalized: tensor programs --------------------------------------------------------------------


@pytest.fixture
def ir_with_sqrt_and_log(monkeypatch: pytest.MonkeyPatch):
    """The tensor-program IR as if it had ``sqrt`` and ``log``: the legalizations that wait
    for them are registered and the interpreter evaluates them."""
    from relaxweb.ops import nn, normalization

    evaluate = interpreter._evaluate_scalar

    def evaluate_with_sqrt_and_log(expr, buffers, environment, shape, guarded=False):
        if isinstance(expr, Unary) and expr.op in ("sqrt", "log"):
            value = evaluate_with_sqrt_and_log(expr.a, buffers, environment, shape, guarded)
            return np.sqrt(value) if expr.op == "sqrt" else np.log(value)
        return evaluate(expr, buffers, environment, shape, guarded)

    monkeypatch.setattr(interpreter, "_evaluate_scalar", evaluate_with_sqrt_and_log)
    waiting = {
        "log_softmax": nn.legalize_log_softmax, "layer_norm": normalization.legalize_layer_norm,
        "layer_norm_inv_std": normalization.legalize_layer_norm_inv_std,
        "group_norm": normalization.legalize_group_norm, "batch_norm": normalization.legalize_batch_norm,
    }
    for name, legalize in waiting.items():
        if OPS[name].legalize is None:
            monkeypatch.setitem(OPS, name, dataclasses.replace(OPS[name], legalize=needs_known_shapes(legalize)))


def with_constant_resize_inputs(model: onnx.ModelProto, inputs) -> tuple[onnx.ModelProto, list]:
    """Resize / Upsample cases give scales, sizes and roi as graph inputs (known only at run
    time, so the output shape is unknown): as initializers, the shape is known and lowers."""
    node = model.graph.node[0]
    if node.op_type not in ("Resize", "Upsample"):
        return model, list(inputs)
    model = onnx.ModelProto.FromString(model.SerializeToString())
    kept, values = [], []
    for info, value in zip(list(model.graph.input), inputs):
        if info.name in list(node.input)[1:]:
            model.graph.initializer.append(numpy_helper.from_array(as_array(value), info.name))
        else:
            kept.append(info)
            values.append(value)
    del model.graph.input[:]
    model.graph.input.extend(kept)
    return model, values


def check_legalized(module, feeds: dict, expected: list, what: str) -> None:
    legalized = legalize_ops(module)
    for program in legalized.programs.values():
        dtypes = {buffer.dtype for buffer in (*program.inputs, program.output)}
        if dtypes <= set(GPU_DTYPES):
            emit_wgsl(program)
    assert_outputs(run_module(legalized, feeds), expected, f"{what} (legalized)")


def legalize_case(case) -> None:
    model, inputs = with_constant_resize_inputs(case.model, case.data_sets[0][0])
    module = from_onnx(model)
    try:
        check_legalized(module, feeds_of(model, inputs), case.data_sets[0][1], case.name)
    except UnsupportedModelError as error:  # every op lowers; a few variants are refused, clearly
        if not any(text in str(error) for text in LOWERING_REFUSED):
            raise


LOWERED_CASES = [case for case in CASES if case.name not in UNSUPPORTED]


@pytest.mark.parametrize("case", LOWERED_CASES, ids=[case.name for case in LOWERED_CASES])
def test_onnx_node_case_legalized(case) -> None:
    legalize_case(case)


# Models with symbolic dims against onnxruntime -------------------------------------------------


rand = partial(helpers.rand, low=-1.0, high=1.0)  # this file's data: uniform in [-1, 1)


make_model = partial(helpers.make_model, opset=18)


node = helper.make_node


def cnn_model() -> onnx.ModelProto:
    """Conv (padded, grouped, SAME_UPPER stride 2), folded BatchNorm, ceil-mode MaxPool,
    SAME_LOWER AveragePool, ConvTranspose with output_padding, nearest and bilinear Resize,
    LpPool, GlobalAveragePool, Gemm: every spatial size symbolic."""
    initializers = {
        "w1": rand(8, 3, 3, 3, seed=1), "b1": rand(8, seed=2),
        "bn_scale": rand(8, seed=3, low=0.5, high=1.5), "bn_bias": rand(8, seed=4),
        "bn_mean": rand(8, seed=5), "bn_var": rand(8, seed=6, low=0.5, high=2.0),
        "w2": rand(8, 4, 3, 3, seed=7), "w3": rand(8, 2, 3, 3, seed=8), "b3": rand(2, seed=9),
        "fc_w": rand(10, 2, seed=10), "fc_b": rand(10, seed=11),
        "flat": np.array([0, -1], np.int64), "scales": np.array([1, 1, 2, 2], np.float32),
    }
    nodes = [
        node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]),
        node("BatchNormalization", ["c1", "bn_scale", "bn_bias", "bn_mean", "bn_var"], ["n1"], epsilon=1e-3),
        node("Relu", ["n1"], ["r1"]),
        node("MaxPool", ["r1"], ["p1"], kernel_shape=[3, 3], strides=[2, 2], pads=[1, 1, 1, 1], ceil_mode=1),
        node("Conv", ["p1", "w2"], ["c2"], strides=[2, 2], auto_pad="SAME_UPPER", group=2),
        node("AveragePool", ["c2"], ["p2"], kernel_shape=[3, 3], strides=[2, 2], auto_pad="SAME_LOWER"),
        node("ConvTranspose", ["p2", "w3", "b3"], ["t1"], strides=[2, 2], pads=[1, 1, 1, 1], output_padding=[1, 1]),
        node("Resize", ["t1", "", "scales"], ["u1"], mode="nearest", coordinate_transformation_mode="asymmetric",
             nearest_mode="floor"),
        node("Resize", ["u1", "", "scales"], ["u2"], mode="linear", coordinate_transformation_mode="half_pixel"),
        node("LpPool", ["u2"], ["l1"], kernel_shape=[2, 2], strides=[2, 2], p=1),
        node("GlobalAveragePool", ["l1"], ["g1"]),
        node("Reshape", ["g1", "flat"], ["f1"]),
        node("Gemm", ["f1", "fc_w", "fc_b"], ["y"], transB=1),
    ]
    return make_model(nodes, [("x", ["batch", 3, "height", "width"])], ["y", "u2"], initializers)


def up_convolution_model() -> onnx.ModelProto:
    """Transposed convolutions whose kernel is their stride (a DBNet head's, a U-Net's
    up-convolutions: each input pixel writes its own tile, legalized as a matmul), with and
    without a bias, square and not, and one whose tiles overlap (the general form) beside."""
    initializers = {"w1": rand(6, 4, 2, 2, seed=30), "b1": rand(4, seed=31), "w2": rand(4, 1, 2, 3, seed=32),
                    "w3": rand(6, 3, 3, 3, seed=33)}
    nodes = [
        node("ConvTranspose", ["x", "w1", "b1"], ["t1"], strides=[2, 2]),
        node("Relu", ["t1"], ["r1"]),
        node("ConvTranspose", ["r1", "w2"], ["t2"], strides=[2, 3], kernel_shape=[2, 3]),
        node("ConvTranspose", ["x", "w3"], ["t3"], strides=[2, 2]),
    ]
    return make_model(nodes, [("x", ["batch", 6, "height", "width"])], ["t2", "t1", "t3"], initializers)


def transformer_model() -> onnx.ModelProto:
    """LayerNormalization (with its Mean and InvStdDev outputs), MatMul with a 1-D operand,
    Softmax and Hardmax on a middle axis, an attention-like Einsum, LogSoftmax."""
    initializers = {"gamma": rand(16, seed=20, low=0.5, high=1.5), "beta": rand(16, seed=21),
                    "w": rand(16, 16, seed=22), "v": rand(16, seed=23)}
    nodes = [
        node("LayerNormalization", ["x", "gamma", "beta"], ["ln", "ln_mean", "ln_inv"], axis=-1),
        node("MatMul", ["ln", "w"], ["h"]),
        node("Softmax", ["h"], ["s1"], axis=1),
        node("Einsum", ["s1", "ln"], ["att"], equation="bsd,btd->bst"),
        node("LogSoftmax", ["att"], ["ls"], axis=-1),
        node("Hardmax", ["h"], ["hm"], axis=1),
        node("MatMul", ["h", "v"], ["mv"]),
    ]
    return make_model(nodes, [("x", ["batch", "seq", 16])], ["ls", "hm", "mv", "ln_mean", "ln_inv"], initializers)


def norms_model() -> onnx.ModelProto:
    """InstanceNormalization, GroupNormalization (opset 21), BatchNormalization with statistics
    given at run time, LpNormalization, DepthToSpace then SpaceToDepth, Dropout."""
    initializers = {"s": rand(4, seed=30, low=0.5, high=1.5), "b": rand(4, seed=31),
                    "gs": rand(4, seed=32, low=0.5, high=1.5), "gb": rand(4, seed=33)}
    nodes = [
        node("InstanceNormalization", ["x", "s", "b"], ["i1"]),
        node("GroupNormalization", ["i1", "gs", "gb"], ["g1"], num_groups=2),
        node("BatchNormalization", ["g1", "s", "b", "mean", "var"], ["b1"]),
        node("LpNormalization", ["b1"], ["l1"], axis=1, p=2),
        node("DepthToSpace", ["l1"], ["ds"], blocksize=2, mode="CRD"),
        node("SpaceToDepth", ["ds"], ["sd"], blocksize=2),
        node("Dropout", ["sd"], ["y"]),
    ]
    inputs = [("x", ["batch", 4, "height", "width"]), ("mean", [4]), ("var", [4])]
    return make_model(nodes, inputs, ["y"], initializers, opset=21)


def resize_model() -> onnx.ModelProto:
    """Resize by sizes from shape arithmetic (``h * 3 // 2``) and by scales of 2, in every
    coordinate transformation and nearest mode that lowers."""
    initializers = {"zero": np.array([0], np.int64), "two": np.array([2], np.int64), "four": np.array([4], np.int64),
                    "three": np.array([3], np.int64), "scales": np.array([1, 1, 2, 2], np.float32)}
    nodes = [
        node("Shape", ["x"], ["shape"]), node("Slice", ["shape", "zero", "two"], ["nc"]),
        node("Slice", ["shape", "two", "four"], ["hw"]), node("Mul", ["hw", "three"], ["hw3"]),
        node("Div", ["hw3", "two"], ["hw32"]), node("Concat", ["nc", "hw32"], ["sizes"], axis=0),
    ]
    outputs = []
    for coordinates in ("half_pixel", "pytorch_half_pixel", "align_corners", "asymmetric", "tf_half_pixel_for_nn",
                        "half_pixel_symmetric"):
        for mode, rounding in [("linear", "floor"), *(("nearest", r) for r in NEAREST_MODES)]:
            if coordinates == "tf_half_pixel_for_nn" and mode == "linear":
                continue
            for given in ("sizes", "scales"):
                name = f"{coordinates}_{mode}_{rounding}_{given}"
                inputs = ["x", "", "", "sizes"] if given == "sizes" else ["x", "", "scales"]
                nodes.append(node("Resize", inputs, [name], mode=mode, coordinate_transformation_mode=coordinates,
                                  nearest_mode=rounding))
                outputs.append(name)
    return make_model(nodes, [("x", ["batch", 2, "height", "width"])], outputs, initializers, opset=19)


NEAREST_MODES = ("floor", "ceil", "round_prefer_floor", "round_prefer_ceil")

SYMBOLIC_MODELS = {
    "resize": (resize_model, [{"x": (1, 2, 4, 5)}, {"x": (2, 2, 3, 1)}, {"x": (1, 2, 1, 1)}, {"x": (1, 2, 7, 2)}]),
    "cnn": (cnn_model, [{"x": (1, 3, 16, 16)}, {"x": (2, 3, 13, 11)}, {"x": (1, 3, 7, 9)}]),
    "transformer": (transformer_model, [{"x": (2, 5, 16)}, {"x": (1, 3, 16)}]),
    "up_convolution": (up_convolution_model, [{"x": (1, 6, 5, 7)}, {"x": (2, 6, 1, 3)}]),
    "norms": (norms_model, [{"x": (2, 4, 6, 8), "mean": (4,), "var": (4,)}, {"x": (1, 4, 3, 1), "mean": (4,), "var": (4,)}]),
}


def symbolic_feeds(shapes: dict) -> dict[str, np.ndarray]:
    return {name: rand(*shape, seed=sum(shape), low=0.2 if name == "var" else -1.0) for name, shape in shapes.items()}


def run_onnxruntime(model: onnx.ModelProto, feeds: dict) -> list[np.ndarray]:
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    return session.run(None, feeds)


@pytest.mark.parametrize("name", sorted(SYMBOLIC_MODELS))
def test_symbolic_model_matches_onnxruntime(name: str, ir_with_sqrt_and_log) -> None:
    make, sizes = SYMBOLIC_MODELS[name]
    model = make()
    module = from_onnx(model)
    for param in module.main.params:
        assert any(isinstance(dim, SizeVar) for dim in param.struct_info.shape) or param.name in ("mean", "var")
    for shapes in sizes:
        feeds = symbolic_feeds(shapes)
        expected = run_onnxruntime(model, feeds)
        assert_outputs(run_module(module, feeds), expected, f"{name} at {shapes}")
        check_legalized(module, feeds, expected, f"{name} at {shapes}")


def test_cnn_shapes_are_symbolic() -> None:
    main = from_onnx(cnn_model()).main
    h, w = SizeVar("height"), SizeVar("width")
    shapes = {b.var.name: b.var.struct_info.shape for b in main.bindings() if isinstance(b.var.struct_info, TensorStructInfo)}
    assert prove_equal(shapes["c2"][2], (h // 2 + 2) // 2) and prove_equal(shapes["c2"][3], (w // 2 + 2) // 2)
    assert prove_equal(shapes["p1"][2], h // 2 + 1)  # ceil_mode: ceil((h + 2 - 3) / 2) + 1
    assert prove_equal(shapes["u2"][2], shapes["t1"][2] * 4)
    assert str(main.ret_struct_info).startswith("Tuple(Tensor((batch, 10), float32)")


@pytest.mark.parametrize("name", ["cnn", "resize", "up_convolution"])
def test_bundle_runs_on_each_backend(backend, name: str, tmp_path, monkeypatch: pytest.MonkeyPatch) -> None:
    """The whole pipeline, WGSL or kernels.wasm and the host module, at several sizes within the bounds."""
    from relaxweb.bundle import write_bundle
    from relaxweb.compiler import compile_module
    from relaxweb.frontend.converters import shape_values

    # Resize's sizes as the shape value itself, not also as an (unused, int64) tensor
    monkeypatch.setitem(shape_values.SHAPE_OPERANDS, "Resize",
                        shape_values.SHAPE_OPERANDS.get("Resize", frozenset()) | {1, 2, 3})

    make, sizes = SYMBOLIC_MODELS[name]
    model = make()
    compiled = compile_module(from_onnx(model), {"batch": 2, "height": 32, "width": 32})
    write_bundle(compiled, tmp_path / name, f"{name}.onnx")
    session = load_bundle(tmp_path / name, backend)
    for shapes in sizes:
        feeds = symbolic_feeds(shapes)
        expected = run_onnxruntime(model, feeds)
        actual = session.run(feeds)
        assert_outputs(list(actual.values()), expected, f"{name} bundle at {shapes}")


# Deduction -------------------------------------------------------------------------------------


def tensor(name: str, *shape, dtype: str = "float32") -> Var:
    return Var(name, TensorStructInfo(tuple(shape), dtype))


n, h, w = SizeVar("n"), SizeVar("h"), SizeVar("w")
CONV = {"strides": [2, 2], "dilations": [1, 1], "padding": [1, 1, 1, 1]}


def assert_shape(info, *expected) -> None:
    assert len(info.shape) == len(expected), info
    for actual, want in zip(info.shape, expected):
        assert prove_equal(actual, want), f"{info}: expected {expected}"


def test_conv_deduces_symbolic_spatial_extents() -> None:
    info = call_op("conv", tensor("x", n, 3, h, w), tensor("k", 8, 3, 3, 3), **CONV).struct_info
    assert_shape(info, n, 8, (h + 1 + 1 - 2 - 1) // 2 + 1, (w - 1) // 2 + 1)
    same = call_op("conv", tensor("x", n, 3, h, w), tensor("k", 8, 3, 3, 3), strides=[2, 2], dilations=[2, 2],
                   padding=[0] * 4, auto_pad="SAME_LOWER").struct_info
    assert_shape(same, n, 8, (h + 1) // 2, (w + 1) // 2)
    grouped = call_op("conv", tensor("x", n, 4, h), tensor("k", 6, 2, 3), strides=[1], dilations=[3],
                      padding=[0, 0], groups=2).struct_info
    assert_shape(grouped, n, 6, h - 6)


def test_conv_errors_name_the_dimension() -> None:
    with pytest.raises(DeductionError, match=r"the input has 4 channels, the weight expects 3 \(dim 1 = 3 × groups=1\)"):
        call_op("conv", tensor("x", n, 4, h, w), tensor("k", 8, 3, 3, 3), **CONV)
    with pytest.raises(DeductionError, match="not provably divisible by groups=3"):
        call_op("conv", tensor("x", n, 6, h, w), tensor("k", 8, 2, 3, 3), groups=3, **CONV)
    with pytest.raises(DeductionError, match="spatial dim 0 of the result would be -2"):
        call_op("conv", tensor("x", n, 3, 2, 2), tensor("k", 8, 3, 5, 5), strides=[1, 1], dilations=[1, 1],
                padding=[0] * 4)
    unknown = Var("u", TensorStructInfo(None, "float32", 4))
    assert call_op("conv", unknown, tensor("k", 8, 3, 3, 3), **CONV).struct_info == TensorStructInfo(None, "float32", 4)


def test_conv_transpose_and_pools_deduce_symbolic_extents() -> None:
    up = call_op("conv_transpose", tensor("x", n, 8, h, w), tensor("k", 8, 2, 3, 3), output_padding=[1, 1], **CONV)
    assert_shape(up.struct_info, n, 2, h * 2, w * 2)
    pooled = call_op("max_pool", tensor("x", n, 3, h, w), kernel=[2, 2], strides=[2, 2], dilations=[1, 1],
                     padding=[0, 0, 0, 0], ceil_mode=True)
    assert_shape(pooled.struct_info, n, 3, (h + 1) // 2, (w + 1) // 2)
    average = call_op("avg_pool", tensor("x", n, 3, h), kernel=[3], strides=[1], dilations=[1], padding=[0, 0],
                      auto_pad="SAME_UPPER")
    assert_shape(average.struct_info, n, 3, h)


def test_normalizer_axes_and_einsum_deduction() -> None:
    x = tensor("x", n, 3, 4)
    assert call_op("softmax", x, axes=[1]).struct_info == x.struct_info
    assert call_op("hardmax", x, axes=[0, 2]).struct_info == x.struct_info
    with pytest.raises(DeductionError, match="at least one axis"):
        call_op("log_softmax", x, axes=[])
    assert_shape(call_op("einsum", tensor("a", n, 3, 4), tensor("b", n, 4, h), equation="bij,bjk->bik").struct_info,
                 n, 3, h)
    assert_shape(call_op("einsum", tensor("a", 2, n, 3), equation="...ij->...ji").struct_info, 2, 3, n)
    assert_shape(call_op("einsum", tensor("a", n, n), equation="ii").struct_info)
    with pytest.raises(DeductionError, match="letter 'j' has extent 4 and 5"):
        call_op("einsum", tensor("a", 3, 4), tensor("b", 5, 6), equation="ij,jk->ik")


def test_resize_deduces_from_exact_fractions() -> None:
    attrs = {"scales": [1.0, 1.0, 0.6, 2.0], "mode": "linear"}
    assert_shape(call_op("resize", tensor("x", n, 3, h, w), **attrs).struct_info, n, 3, h * 3 // 5, w * 2)
    sizes = call_op("resize", tensor("x", n, 3, h, w), ShapeExpr((n, 3, h * 2, 7)), inputs=["output_shape"])
    assert_shape(sizes.struct_info, n, 3, h * 2, 7)
    runtime = call_op("resize", tensor("x", n, 3, h, w), tensor("s", 4), inputs=["scales"]).struct_info
    assert runtime == TensorStructInfo(None, "float32", 4)


def test_layer_norm_checks_the_scale() -> None:
    x = tensor("x", n, 5, 8)
    assert call_op("layer_norm", x, tensor("g", 8), axis=-1).struct_info == x.struct_info
    assert call_op("layer_norm", x, tensor("g", 5, 8), tensor("b", 1, 8), axis=1).struct_info == x.struct_info
    with pytest.raises(DeductionError, match="cannot broadcast dimension 0 of the normalized dims: 8 vs 5"):
        call_op("layer_norm", x, tensor("g", 5), axis=-1)
    assert_shape(call_op("layer_norm_inv_std", x, axis=1).struct_info, n, 1, 1)


def test_unsupported_uses_have_clear_errors() -> None:
    def convert(node_proto):
        return from_onnx(make_model([node_proto], [("x", ["batch", 4, "height", 6])], ["y"], {}))

    with pytest.raises(UnsupportedModelError, match="height height is not provably a multiple of blocksize 2"):
        convert(node("SpaceToDepth", ["x"], ["y"], blocksize=2))
    with pytest.raises(UnsupportedModelError, match="kernel_shape"):
        convert(node("MaxPool", ["x"], ["y"], kernel_shape=[2]))


def test_conv_transpose_without_overlap_is_a_matmul() -> None:
    """A transposed convolution whose kernel is its stride lowers to a matmul of the channels
    into tiles ending with the input's pixels (the matmul's rows, consecutive in its output),
    then their interleaving into the output; one whose tiles overlap keeps the general form,
    a sum over the kernel's positions."""
    from relaxweb.ir.pattern import analyze_matmul

    programs = legalize_ops(from_onnx(up_convolution_model())).programs
    tiles = [program for name, program in programs.items() if name.startswith("conv_transpose_tiles")]
    interleaves = [program for name, program in programs.items() if name.startswith("conv_transpose_interleave")]
    general = [program for name, program in programs.items()
               if name.startswith("conv_transpose") and program not in tiles + interleaves]
    assert len(tiles) == 2 and all(analyze_matmul(program) is not None for program in tiles)
    assert all(program.output.shape[-2:] == program.inputs[0].shape[-2:] for program in tiles)
    assert len(interleaves) == 2
    assert len(general) == 1 and any(isinstance(node, Reduce) and node.extent == IntImm(3)
                                     for node in scalar_nodes(general[0].body))
