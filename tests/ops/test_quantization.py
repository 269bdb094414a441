"""Quantized models: the quantization ops on hand-built models, and a small CNN and a
BERT-like encoder block quantized by onnxruntime's ``quantize_dynamic`` and
``quantize_static`` (QDQ format, calibrated on random data), each built once and run on
WebGPU (wgpu), on kernels.wasm (wasmtime) and in the interpreter at two or more shapes, against onnxruntime.

Comparisons.  Integer results (QuantizeLinear, the integer GEMMs) are exact and compared
exactly.  A quantized model quantizes its activations again after float ops (a pooling, a
softmax, a layer norm) whose last bits depend on the order of a sum, so an activation within
an ulp of a rounding boundary could land one quantization step apart; on these models and
inputs none does (the largest difference is 4.8e-7, from the float ops), so they are compared
at the ``MODEL`` tier.  Two onnxruntime behaviours are not the ONNX semantics and are kept
out of the comparison (each said where it applies): its AVX2 uint8 x int8 kernels saturate
pairs of products to int16 (``weights_int8``), and with graph optimizations it fuses a QDQ
graph into QLinear kernels whose results differ from the graph as written.
"""

from __future__ import annotations

from pathlib import Path

import numpy as np
import onnx
import onnxruntime
import pytest
from onnx import TensorProto, helper, numpy_helper
from onnxruntime.quantization import CalibrationDataReader, QuantFormat, QuantType, quantize_dynamic, quantize_static

import relaxweb
from relaxweb.ir.expr import Var
from relaxweb.ir.struct_info import TensorStructInfo
from relaxweb.ops import DeductionError, call_op, get_op
from tests.helpers import F32, MODEL, Tolerance, assert_close, build_once, load_bundle, make_model, onnxruntime_outputs, rand

MS = "com.microsoft"
FLOAT, UINT8, INT8, INT32 = TensorProto.FLOAT, TensorProto.UINT8, TensorProto.INT8, TensorProto.INT32


def onnxruntime_unoptimized(model, feeds) -> list[np.ndarray]:
    """onnxruntime running the graph as written (no graph optimizations: QDQ pairs are not
    fused into its QLinear kernels, whose results differ from the unfused graph's)."""
    options = onnxruntime.SessionOptions()
    options.graph_optimization_level = onnxruntime.GraphOptimizationLevel.ORT_DISABLE_ALL
    options.log_severity_level = 3
    session = onnxruntime.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    return session.run(None, feeds)


def onnxruntime_two_threads(model, feeds) -> list[np.ndarray]:
    """onnxruntime with two threads, on any machine (its DynamicQuantizeLSTM's result depends
    on the thread count: see ``test_dynamic_quantize_lstm_matches_onnxruntime``)."""
    options = onnxruntime.SessionOptions()
    options.intra_op_num_threads = 2
    options.log_severity_level = 3
    session = onnxruntime.InferenceSession(model.SerializeToString(), options, providers=["CPUExecutionProvider"])
    return session.run(None, feeds)


def run_both(model, feeds_list, backend, folder, tolerance: Tolerance | None = None, reference=onnxruntime_outputs):
    """Build once; at each feeds, the interpreter and the bundle on ``backend`` against ``reference(model, feeds)``
    (onnxruntime; exact when ``tolerance`` is None)."""
    session = load_bundle(build_once(model, folder), backend)
    names = [o.name for o in model.graph.output]
    for feeds in feeds_list:
        expected = reference(model, feeds)
        for where, actual in (("interpreter", relaxweb.run_reference(model, feeds)), (backend, session.run(feeds))):
            for name, want in zip(names, expected):
                message = f"{where}, {name} at {[f.shape for f in feeds.values()]}"
                assert actual[name].dtype == want.dtype, message
                if tolerance is None:
                    np.testing.assert_array_equal(actual[name], want, err_msg=message)
                else:
                    assert_close(actual[name], want, tolerance, err_msg=message)


def const(name: str, value, dtype=None) -> onnx.TensorProto:
    return numpy_helper.from_array(np.asarray(value, dtype=dtype), name)


# The ops on hand-built models --------------------------------------------------------------------


def quantize_model(dtype, axis_scale: bool, block: int = 0):
    """QuantizeLinear then DequantizeLinear of x[n, 4, 6] per tensor, per channel (axis 1) or in
    blocks of ``block`` along axis 2."""
    np_dtype = np.dtype(helper.tensor_dtype_to_np_dtype(dtype))
    low = -20 if np_dtype.kind == "i" else 100
    if block:
        # onnxruntime wants the parameters' other dims equal to the input's: a fixed batch of 2
        scale = rand(2, 4, 6 // block, low=0.01, high=0.1, seed=1)
        zero_point = rand(2, 4, 6 // block, low=low, high=low + 40, dtype=np_dtype, seed=2)
    elif axis_scale:
        scale, zero_point = rand(4, low=0.01, high=0.1, seed=1), rand(4, low=low, high=low + 40, dtype=np_dtype, seed=2)
    else:
        scale, zero_point = np.float32(0.02), np_dtype.type(low + 3)
    attrs = {"axis": 2 if block else 1, **({"block_size": block} if block else {})}
    node = helper.make_node("QuantizeLinear", ["x", "scale", "zero_point"], ["q"], **attrs)
    back = helper.make_node("DequantizeLinear", ["q", "scale", "zero_point"], ["y"], **attrs)
    return make_model([node, back], [("x", [2 if block else "n", 4, 6])], [("q", dtype), "y"],
                      [const("scale", scale, np.float32), const("zero_point", zero_point)], opset=21)


@pytest.mark.parametrize("dtype", [UINT8, INT8, TensorProto.INT16])
@pytest.mark.parametrize("layout", ["tensor", "axis", "block"])
def test_quantize_dequantize_linear_match_onnxruntime(backend, dtype, layout, tmp_path) -> None:
    if layout == "block" and dtype == TensorProto.INT16:
        pytest.skip("onnxruntime has no blocked int16 QuantizeLinear kernel")
    model = quantize_model(dtype, layout == "axis", 3 if layout == "block" else 0)
    # values far out of range saturate; exact halves (x / scale = k + 0.5) round to even
    halves = (np.arange(48, dtype=np.float32).reshape(2, 4, 6) - 24.5) * np.float32(0.02)
    feeds = [{"x": rand(2 if layout == "block" else 3, 4, 6, seed=3) * 4}, {"x": halves}, {"x": rand(2, 4, 6, seed=4) * 100}]
    run_both(model, feeds, backend, tmp_path / "bundle")


def test_dequantize_linear_of_int32_is_exact_beyond_float32_integers(backend, tmp_path) -> None:
    node = helper.make_node("DequantizeLinear", ["x", "scale", "zero_point"], ["y"])
    model = make_model([node], [("x", INT32, ["n"])], ["y"],
                       [const("scale", 0.5, np.float32), const("zero_point", 7, np.int32)], opset=19)
    x = np.array([2**24 + 1 + 7, -(2**24) - 3, 7, 123456789], dtype=np.int32)
    run_both(model, [{"x": x}, {"x": x[:1]}], backend, tmp_path / "bundle")


def test_dynamic_quantize_linear_matches_onnxruntime_including_an_all_zero_input(backend, tmp_path) -> None:
    node = helper.make_node("DynamicQuantizeLinear", ["x"], ["y", "scale", "zero_point"])
    model = make_model([node], [("x", ["n", 5])], [("y", UINT8), "scale", ("zero_point", UINT8)], opset=13)
    feeds = [{"x": rand(4, 5, seed=1)}, {"x": np.abs(rand(2, 5, seed=2))}, {"x": -np.abs(rand(3, 5, seed=3))},
             {"x": np.zeros((2, 5), np.float32)}, {"x": np.full((1, 5), 3.0, np.float32)}]
    run_both(model, feeds, backend, tmp_path / "bundle")


def weights_int8(*shape, seed: int) -> np.ndarray:
    """int8 weights in [-64, 64): onnxruntime's AVX2 uint8 x int8 kernels add pairs of products
    in saturating int16 (vpmaddubsw), so 255 * 127 * 2 overflows there; 7-bit weights (what
    ``quantize_dynamic(reduce_range=True)`` writes) keep its results exact."""
    return rand(*shape, low=-64, high=64, dtype=np.int8, seed=seed)


def test_matmul_integer_with_zero_points_per_tensor_and_column(backend, tmp_path) -> None:
    nodes = [helper.make_node("MatMulInteger", ["a", "b", "a_zero_point", "b_zero_point"], ["y"])]
    model = make_model(nodes, [("a", UINT8, ["m", 7]), ("a_zero_point", UINT8, [])], [("y", INT32)],
                       [const("b", weights_int8(7, 5, seed=1)),
                        const("b_zero_point", rand(5, low=-5, high=5, dtype=np.int8, seed=2))], opset=13)
    feeds = [{"a": rand(m, 7, low=0, high=256, dtype=np.uint8, seed=m), "a_zero_point": np.array(m * 70, np.uint8)} for m in (3, 1)]
    run_both(model, feeds, backend, tmp_path / "bundle")


def test_conv_integer_with_padding_and_zero_points(backend, tmp_path) -> None:
    # onnxruntime takes per-tensor zero points only (the ONNX node cases check per channel)
    nodes = [helper.make_node("ConvInteger", ["x", "w", "x_zero_point", "w_zero_point"], ["y"], pads=[1, 1, 1, 1],
                              strides=[2, 1])]
    model = make_model(nodes, [("x", UINT8, ["n", 3, "h", 6])], [("y", INT32)],
                       [const("w", rand(4, 3, 3, 3, low=0, high=256, dtype=np.uint8, seed=1)),
                        const("x_zero_point", 130, np.uint8), const("w_zero_point", 120, np.uint8)],
                       opset=13)
    feeds = [{"x": rand(n, 3, h, 6, low=0, high=256, dtype=np.uint8, seed=n)} for n, h in ((2, 5), (1, 8))]
    run_both(model, feeds, backend, tmp_path / "bundle")


def test_qlinear_matmul_and_conv_requantize_as_onnxruntime(backend, tmp_path) -> None:
    nodes = [
        helper.make_node("QLinearConv", ["x", "x_scale", "x_zero_point", "w", "w_scale", "w_zero_point", "y_scale",
                                         "y_zero_point", "bias"], ["conv"], pads=[1, 1, 1, 1]),
        helper.make_node("Reshape", ["conv", "flat_shape"], ["flat"]),
        helper.make_node("QLinearMatMul", ["flat", "y_scale", "y_zero_point", "m", "m_scale", "m_zero_point", "z_scale",
                                           "z_zero_point"], ["z"]),
    ]
    initializers = [
        const("x_scale", 0.05, np.float32), const("x_zero_point", 128, np.uint8),
        const("w", weights_int8(4, 2, 3, 3, seed=1)),
        const("w_scale", [0.01, 0.02, 0.005, 0.03], np.float32), const("w_zero_point", [0, 0, 0, 0], np.int8),
        const("y_scale", 0.1, np.float32), const("y_zero_point", 100, np.uint8),
        const("bias", rand(4, low=-500, high=500, dtype=np.int32, seed=2)),
        const("flat_shape", [-1, 16], np.int64),
        const("m", weights_int8(16, 6, seed=3)), const("m_scale", 0.02, np.float32),
        const("m_zero_point", 0, np.int8), const("z_scale", 0.3, np.float32), const("z_zero_point", 120, np.uint8),
    ]
    model = make_model(nodes, [("x", UINT8, ["n", 2, 2, 2])], [("conv", UINT8), ("z", UINT8)], initializers, opset=13)
    feeds = [{"x": rand(n, 2, 2, 2, low=0, high=256, dtype=np.uint8, seed=n)} for n in (3, 1)]
    run_both(model, feeds, backend, tmp_path / "bundle")


def test_contrib_integer_matmuls_match_onnxruntime(backend, tmp_path) -> None:
    nodes = [
        helper.make_node("DynamicQuantizeMatMul", ["x", "b", "b_scale", "b_zero_point", "bias"], ["dynamic"], domain=MS),
        helper.make_node("DynamicQuantizeLinear", ["x"], ["xq", "x_scale", "x_zero_point"]),
        helper.make_node("MatMulIntegerToFloat", ["xq", "b", "x_scale", "b_scale", "x_zero_point", "b_zero_point", "bias"],
                         ["to_float"], domain=MS),
    ]
    initializers = [const("b", weights_int8(8, 5, seed=1)),
                    const("b_scale", rand(5, low=0.01, high=0.03, seed=2)), const("b_zero_point", np.zeros(5, np.int8)),
                    const("bias", rand(5, seed=3))]
    model = make_model(nodes, [("x", ["n", "s", 8])], ["dynamic", "to_float"], initializers, opset={"": 13, MS: 1})
    run_both(model, [{"x": rand(2, 3, 8, seed=4)}, {"x": rand(1, 1, 8, seed=5)}], backend, tmp_path / "bundle",
             tolerance=F32)


def test_quantization_deduction_names_the_problem() -> None:
    x = Var("x", TensorStructInfo((2, 4), "float32"))
    scale = Var("s", TensorStructInfo((1, 3), "float32"))
    zero_point = Var("z", TensorStructInfo((1, 3), "uint8"))
    with pytest.raises(DeductionError, match="dim 1 of argument 1 is 3, expected 1 or 4"):
        call_op("quantize_linear", x, scale, zero_point, axis=1, block_size=0, dtype="uint8")
    blocked = call_op("quantize_linear", x, Var("s2", TensorStructInfo((1, 2), "float32")),
                      Var("z2", TensorStructInfo((1, 2), "uint8")), axis=1, block_size=2, dtype="uint8")
    assert blocked.struct_info == TensorStructInfo((2, 4), "uint8")
    with pytest.raises(DeductionError, match="cannot quantize to int32"):
        call_op("quantize_linear", x, scale, Var("z32", TensorStructInfo((1, 3), "int32")), axis=1, block_size=2,
                dtype="int32")
    data = np.array([[0.1, -0.3, 2.55, 9.0]], np.float32)
    quantized = get_op("quantize_linear").reference(
        [data, np.float32([[0.1, 0.2]]), np.uint8([[10, 250]])], {"axis": 1, "block_size": 2, "dtype": "uint8"})
    np.testing.assert_array_equal(quantized, [[11, 7, 255, 255]])  # 12.75 + 250 and 45 + 250 saturate


# Models quantized by onnxruntime ---------------------------------------------------------------------


def float_cnn() -> onnx.ModelProto:
    """conv-relu-pool, conv-relu, global average pool, a linear layer: x[batch, 3, h, w] -> [batch, 10]."""
    initializers = [const("w1", rand(8, 3, 3, 3, seed=1) * 0.3), const("b1", rand(8, seed=2) * 0.1),
                    const("w2", rand(16, 8, 3, 3, seed=3) * 0.2), const("b2", rand(16, seed=4) * 0.1),
                    const("fc", rand(16, 10, seed=5) * 0.3), const("fc_b", rand(10, seed=6) * 0.1)]
    nodes = [
        helper.make_node("Conv", ["x", "w1", "b1"], ["c1"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c1"], ["r1"]),
        helper.make_node("MaxPool", ["r1"], ["p1"], kernel_shape=[2, 2], strides=[2, 2]),
        helper.make_node("Conv", ["p1", "w2", "b2"], ["c2"], pads=[1, 1, 1, 1]),
        helper.make_node("Relu", ["c2"], ["r2"]),
        helper.make_node("GlobalAveragePool", ["r2"], ["g"]),
        helper.make_node("Flatten", ["g"], ["f"]),
        helper.make_node("MatMul", ["f", "fc"], ["m"]),
        helper.make_node("Add", ["m", "fc_b"], ["logits"]),
    ]
    return make_model(nodes, [("x", ["batch", 3, "h", "w"])], ["logits"], initializers, opset=17)


def float_encoder() -> onnx.ModelProto:
    """One BERT-like block, x[batch, seq, 16]: single-head attention (Q, K, V projections,
    softmax), residual and layer norm, a GELU feed-forward, residual and layer norm."""
    d = 16
    weights = {name: rand(*shape, seed=i) * 0.3 for i, (name, shape) in enumerate(
        [("wq", (d, d)), ("wk", (d, d)), ("wv", (d, d)), ("wo", (d, d)), ("w1", (d, 32)), ("w2", (32, d))])}
    initializers = [const(name, value) for name, value in weights.items()] + [
        const("bq", rand(d, seed=10) * 0.1), const("b1", rand(32, seed=11) * 0.1),
        const("gamma", 1 + rand(d, seed=12) * 0.1), const("beta", rand(d, seed=13) * 0.1),
        const("inv_sqrt_d", 1 / np.sqrt(d), np.float32), const("half", 0.5, np.float32), const("one", 1.0, np.float32),
        const("inv_sqrt2", 1 / np.sqrt(2), np.float32)]
    nodes = [
        helper.make_node("MatMul", ["x", "wq"], ["q0"]), helper.make_node("Add", ["q0", "bq"], ["q"]),
        helper.make_node("MatMul", ["x", "wk"], ["k"]), helper.make_node("MatMul", ["x", "wv"], ["v"]),
        helper.make_node("Transpose", ["k"], ["kt"], perm=[0, 2, 1]),
        helper.make_node("MatMul", ["q", "kt"], ["scores0"]), helper.make_node("Mul", ["scores0", "inv_sqrt_d"], ["scores"]),
        helper.make_node("Softmax", ["scores"], ["probs"], axis=-1),
        helper.make_node("MatMul", ["probs", "v"], ["context"]), helper.make_node("MatMul", ["context", "wo"], ["attn"]),
        helper.make_node("Add", ["x", "attn"], ["res1"]),
        helper.make_node("LayerNormalization", ["res1", "gamma", "beta"], ["h1"], axis=-1),
        helper.make_node("MatMul", ["h1", "w1"], ["f0"]), helper.make_node("Add", ["f0", "b1"], ["f1"]),
        helper.make_node("Mul", ["f1", "inv_sqrt2"], ["fs"]), helper.make_node("Erf", ["fs"], ["fe"]),
        helper.make_node("Add", ["fe", "one"], ["fe1"]), helper.make_node("Mul", ["f1", "fe1"], ["fm"]),
        helper.make_node("Mul", ["fm", "half"], ["gelu"]),
        helper.make_node("MatMul", ["gelu", "w2"], ["f2"]), helper.make_node("Add", ["h1", "f2"], ["res2"]),
        helper.make_node("LayerNormalization", ["res2", "gamma", "beta"], ["out"], axis=-1),
    ]
    return make_model(nodes, [("x", ["batch", "seq", d])], ["out"], initializers, opset=17)


FLOAT_MODELS = {
    "cnn": (float_cnn, [{"x": rand(2, 3, 16, 16, seed=20)}, {"x": rand(1, 3, 12, 20, seed=21)}]),
    "encoder": (float_encoder, [{"x": rand(2, 5, 16, seed=20)}, {"x": rand(1, 9, 16, seed=21)}]),
}


class RandomCalibration(CalibrationDataReader):
    """onnxruntime's calibration reader over a few random inputs."""

    def __init__(self, feeds: list[dict]) -> None:
        self.feeds = iter(feeds)

    def get_next(self):
        return next(self.feeds, None)


def quantized(name: str, method: str, folder: Path, per_channel: bool) -> onnx.ModelProto:
    """The float model quantized by onnxruntime: ``dynamic`` with 7-bit weights (see
    ``weights_int8``), ``static`` in the QDQ format, calibrated on random inputs."""
    make, feeds = FLOAT_MODELS[name]
    source, target = folder / f"{name}.onnx", folder / f"{name}_{method}.onnx"
    onnx.save(make(), source)
    if method == "dynamic":
        quantize_dynamic(source, target, weight_type=QuantType.QInt8, per_channel=per_channel, reduce_range=True)
    else:
        reader = RandomCalibration([{k: rand(*v.shape, seed=100 + i) for k, v in feeds[0].items()} for i in range(4)])
        quantize_static(source, target, reader, quant_format=QuantFormat.QDQ, per_channel=per_channel,
                        activation_type=QuantType.QUInt8, weight_type=QuantType.QInt8)
    return onnx.load(target)


@pytest.mark.parametrize("name", sorted(FLOAT_MODELS))
@pytest.mark.parametrize("method, per_channel", [("dynamic", False), ("dynamic", True), ("static", False), ("static", True)])
def test_onnxruntime_quantized_models_match(backend, name, method, per_channel, tmp_path) -> None:
    model = quantized(name, method, tmp_path, per_channel)
    op_types = {node.op_type for node in model.graph.node}
    assert op_types & {"DynamicQuantizeLinear", "QuantizeLinear"}, op_types
    # onnxruntime fuses a QDQ graph into its QLinear kernels, which differ from the graph as
    # written (by up to 1.3 on the encoder here: int16 saturation, requantization order)
    run_both(model, FLOAT_MODELS[name][1], backend, tmp_path / "bundle", tolerance=MODEL,
             reference=onnxruntime_outputs if method == "dynamic" else onnxruntime_unoptimized)


def float_lstm(direction: str, hidden: int = 8, inputs: int = 6) -> onnx.ModelProto:
    directions = 2 if direction == "bidirectional" else 1
    initializers = [const("W", rand(directions, 4 * hidden, inputs, seed=1) * 0.5),
                    const("R", rand(directions, 4 * hidden, hidden, seed=2) * 0.5),
                    const("B", rand(directions, 8 * hidden, seed=3) * 0.1),
                    const("initial_c", rand(directions, 1, hidden, seed=4) * 0.5)]
    nodes = [helper.make_node("Shape", ["x"], ["x_shape"]),
             helper.make_node("Slice", ["x_shape", "one", "two"], ["batch"]),
             helper.make_node("Concat", ["directions", "batch", "hidden"], ["state_shape"], axis=0),
             helper.make_node("Expand", ["initial_c", "state_shape"], ["c0"]),
             helper.make_node("LSTM", ["x", "W", "R", "B", "", "", "c0"], ["Y", "Y_h", "Y_c"], hidden_size=hidden,
                              direction=direction)]
    initializers += [const("one", [1], np.int64), const("two", [2], np.int64),
                     const("directions", [directions], np.int64), const("hidden", [hidden], np.int64)]
    return make_model(nodes, [("x", ["steps", "batch", inputs])], ["Y", "Y_h", "Y_c"], initializers, opset=14)


@pytest.mark.parametrize("direction", ["forward", "reverse", "bidirectional"])
def test_dynamic_quantize_lstm_matches_onnxruntime(backend, direction, tmp_path) -> None:
    """quantize_dynamic's DynamicQuantizeLSTM (a computed initial cell state), at three sequence
    lengths from one build.  Batches of 1 and 2: onnxruntime quantizes the hidden state of the
    rows each of its threads runs together (with 2 threads, one row each), relaxweb each row."""
    source, target = tmp_path / "lstm.onnx", tmp_path / "lstm_quantized.onnx"
    onnx.save(float_lstm(direction), source)
    quantize_dynamic(source, target, weight_type=QuantType.QInt8, reduce_range=True)
    model = onnx.load(target)
    assert [node.op_type for node in model.graph.node if node.domain == MS] == ["DynamicQuantizeLSTM"]
    feeds = [{"x": rand(steps, batch, 6, seed=steps)} for steps, batch in ((5, 2), (1, 1), (9, 1))]
    run_both(model, feeds, backend, tmp_path / "bundle", tolerance=MODEL, reference=onnxruntime_two_threads)


def test_dynamic_quantize_lstm_options_onnxruntime_never_writes_are_refused_by_name(tmp_path) -> None:
    model = onnx.load_from_string(quantized_lstm_bytes(tmp_path))
    lstm = next(node for node in model.graph.node if node.op_type == "DynamicQuantizeLSTM")
    lstm.name = "qlstm"
    lstm.attribute.append(helper.make_attribute("clip", 3.0))
    with pytest.raises(relaxweb.RelaxwebError, match="DynamicQuantizeLSTM node 'qlstm'.*clip is not supported"):
        relaxweb.build(model, tmp_path / "bundle")


def quantized_lstm_bytes(folder: Path) -> bytes:
    onnx.save(float_lstm("forward"), folder / "lstm.onnx")
    quantize_dynamic(folder / "lstm.onnx", folder / "lstm_quantized.onnx", weight_type=QuantType.QInt8, reduce_range=True)
    return (folder / "lstm_quantized.onnx").read_bytes()
