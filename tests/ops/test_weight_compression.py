"""Compressed weights: the ``unpack_weights`` op (``relaxweb/ops/packed_weights.py``), the
``compress_weights`` pass behind ``relaxweb build --weights`` (its IR-text tests are in
``tests/passes/test_compress_weights.py``) through whole builds, and the import of
onnxruntime's MatMulNBits / GatherBlockQuantized.

Comparisons.  A compressed build is compared with the interpreter running the same
compressed module (the decode is exact arithmetic on both sides: ``MODEL`` tier), and with
onnxruntime's float32 outputs of the uncompressed model within a bound on the quantization
error (measured values in the comments; each bound is several times above them).  Models that
onnxruntime's quantizer wrote are compared with onnxruntime at the ``MODEL`` tier.  Each
compressed bundle runs on WebGPU and on kernels.wasm (the ``backend`` fixture).
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import onnx
import pytest
from onnx import TensorProto, helper

import relaxweb
from relaxweb.compiler import compile_model
from relaxweb.errors import RelaxwebError
from relaxweb.ir.interpreter import run_host_function, run_program
from relaxweb.ir.symbolic import SizeVar
from relaxweb.ir.tir import Buffer, TensorProgram
from relaxweb.ops.packed_weights import decode_body, pack_fields, pack_halves, unpack_weights_reference
from tests.gpu_kernels import run_kernel_on_gpu
from tests.helpers import MODEL, assert_close, in_the_browser, load_bundle, make_model, onnxruntime_outputs, rand

FORMATS = ("float16", "int8", "int4")


# The op: decoding ---------------------------------------------------------------------------


def numpy_decode(fields: np.ndarray, scales: np.ndarray, zero_points, group_size: int) -> np.ndarray:
    """(q - z) * s along axis 0, written out element by element from the unpacked fields."""
    out = np.empty(fields.shape, np.float32)
    for i in range(fields.shape[0]):
        z = zero_points[i // group_size] if zero_points is not None else None
        out[i] = (fields[i].astype(np.float32) - (8 if z is None else z)) * scales[i // group_size]
    return out


def assert_decodes_everywhere_to(device, arrays: list, attrs: dict, expected: np.ndarray) -> None:
    """``unpack_weights`` of ``arrays`` gives ``expected`` exactly in its numpy reference, as a
    tensor program in the interpreter, and as that program on wgpu."""
    np.testing.assert_array_equal(unpack_weights_reference(arrays, attrs), expected)
    buffers = [Buffer(f"B{i}", a.shape, str(a.dtype)) for i, a in enumerate(arrays)]
    axes = (SizeVar("i"), SizeVar("j"))
    program = TensorProgram("decode", tuple(buffers), Buffer("out", expected.shape, "float32"), axes,
                            decode_body(axes, buffers, attrs))
    np.testing.assert_array_equal(run_program(program, arrays, {}), expected)
    np.testing.assert_array_equal(run_kernel_on_gpu(device, program, arrays, {}), expected)


@pytest.mark.parametrize("packed_scales", [True, False], ids=["float16 scales", "float32 scales"])
@pytest.mark.parametrize("zero_points", [True, False], ids=["zero points", "symmetric"])
def test_int4_decode_is_the_numpy_decode_in_the_reference_the_interpreter_and_on_the_gpu(
        device, packed_scales: bool, zero_points: bool) -> None:
    """70 values along the packed axis (a partial word and a partial group of 32), 5 columns."""
    rng = np.random.default_rng(0)
    fields = rng.integers(0, 16, (70, 5)).astype(np.uint32)
    scales = rng.uniform(0.01, 1.0, (3, 5)).astype(np.float16).astype(np.float32)
    zeros = rng.integers(0, 16, (3, 5)).astype(np.uint32) if zero_points else None
    arrays = [pack_fields(fields, 4, 0), pack_halves(scales, 0) if packed_scales else scales]
    if zero_points:
        arrays.append(pack_fields(zeros, 4, 0))
    attrs = {"format": "int4", "axis": 0, "extent": 70, "group_size": 32}
    expected = numpy_decode(fields, scales, zeros, 32)
    assert_decodes_everywhere_to(device, arrays, attrs, expected)


def test_int4_zero_points_held_in_the_words_decode_as_numpy(device) -> None:
    """``zero_points_in_words``: the zero points' fields follow the values' words along the axis
    (70 values: 9 words, the last partial; 3 groups: 1 more word), one buffer fewer."""
    rng = np.random.default_rng(2)
    fields = rng.integers(0, 16, (70, 5)).astype(np.uint32)
    scales = rng.uniform(0.01, 1.0, (3, 5)).astype(np.float16).astype(np.float32)
    zeros = rng.integers(0, 16, (3, 5)).astype(np.uint32)
    words = np.concatenate([pack_fields(fields, 4, 0), pack_fields(zeros, 4, 0)], axis=0)
    arrays = [words, pack_halves(scales, 0)]
    attrs = {"format": "int4", "axis": 0, "extent": 70, "group_size": 32, "zero_points_in_words": True}
    expected = numpy_decode(fields, scales, zeros, 32)
    assert words.shape == (10, 5)
    assert_decodes_everywhere_to(device, arrays, attrs, expected)
    with pytest.raises(relaxweb.ops.DeductionError, match="dim 0 of argument 0 is 9, expected 10"):
        relaxweb.ops.call_op("unpack_weights", relaxweb.ir.expr.Constant(words[:9], "w"),
                             relaxweb.ir.expr.Constant(arrays[1], "s"), **attrs)


def test_int8_and_float16_decode_as_numpy() -> None:
    rng = np.random.default_rng(1)
    fields = rng.integers(0, 256, (6, 40)).astype(np.uint32)
    scales = rng.uniform(0.01, 1.0, (6, 2)).astype(np.float32)
    attrs = {"format": "int8", "axis": 1, "extent": 40, "group_size": 32}
    expected = (fields.astype(np.float32) - 128) * np.repeat(scales, 32, axis=1)[:, :40]
    np.testing.assert_array_equal(unpack_weights_reference([pack_fields(fields, 8, 1), scales], attrs), expected)
    halves = rng.standard_normal((5, 3)).astype(np.float16)
    decoded = unpack_weights_reference([pack_halves(halves, 0)], {"format": "float16", "axis": 0, "extent": 5})
    np.testing.assert_array_equal(decoded, halves.astype(np.float32))


def test_packed_arguments_are_checked() -> None:
    words = relaxweb.ir.expr.Constant(np.zeros((3, 4), np.uint32), "w")
    scales = relaxweb.ir.expr.Constant(np.zeros((2, 4), np.float32), "s")
    with pytest.raises(relaxweb.ops.DeductionError, match="dim 0 of argument 0 is 3, expected 9"):
        relaxweb.ops.call_op("unpack_weights", words, scales, format="int4", axis=0, extent=70, group_size=32)
    with pytest.raises(relaxweb.ops.DeductionError, match="dim 0 of argument 1 is 2, expected 3"):
        relaxweb.ops.call_op("unpack_weights", relaxweb.ir.expr.Constant(np.zeros((9, 4), np.uint32), "w"), scales,
                             format="int4", axis=0, extent=70, group_size=32)


# Whole models on the GPU ------------------------------------------------------------------------


def lm_like(vocab: int = 100, width: int = 72, hidden: int = 96, out: int = 40):
    """An embedding, two matmuls with biases and a relu (ids[b, s] -> y[b, s, out])."""
    nodes = [
        helper.make_node("Gather", ["emb", "ids"], ["e"], axis=0),
        helper.make_node("MatMul", ["e", "w1"], ["h"]),
        helper.make_node("Add", ["h", "b1"], ["hb"]),
        helper.make_node("Relu", ["hb"], ["r"]),
        helper.make_node("MatMul", ["r", "w2"], ["m"]),
        helper.make_node("Add", ["m", "b2"], ["y"]),
    ]
    weights = {"emb": rand(vocab, width, seed=1), "w1": rand(width, hidden, seed=2) * 0.1,
               "b1": rand(hidden, seed=3) * 0.1, "w2": rand(hidden, out, seed=4) * 0.1, "b2": rand(out, seed=5) * 0.1}
    return make_model(nodes, [("ids", TensorProto.INT64, ["b", "s"])], ["y"], weights)


def embedding_norm_matmul():
    """An embedding, a scale (a norm's weight) and a matmul: one kernel reads the packed table's
    rows, the scale and the packed weight, which fits in the 8 bindings a kernel may have only
    when each packed tensor takes two buffers (int4's zero points are in its words)."""
    nodes = [helper.make_node("Gather", ["emb", "ids"], ["e"], axis=0),
             helper.make_node("Mul", ["e", "g"], ["n"]),
             helper.make_node("MatMul", ["n", "w"], ["y"])]
    return make_model(nodes, [("ids", TensorProto.INT64, ["b", "s"])], ["y"],
                      {"emb": rand(100, 64, seed=1), "g": rand(64, seed=2), "w": rand(64, 40, seed=3) * 0.1})


def conv_net():
    nodes = [helper.make_node("Conv", ["x", "w", "b"], ["c"], pads=[1, 1, 1, 1]),
             helper.make_node("Relu", ["c"], ["y"])]
    return make_model(nodes, [("x", ["n", 8, "h", "w"])], ["y"], {"w": rand(16, 8, 3, 3, seed=6) * 0.2,
                                                                   "b": rand(16, seed=7)})


# The relative RMS error ||compressed - float32|| / ||float32|| of the outputs, measured on
# lavapipe: lm_like float16 3.9e-4, int8 1.04e-2, int4 0.139; embedding_norm_matmul 3.1e-4,
# 8.2e-3, 0.115; conv_net 1.8e-4, 4.8e-3, 0.074
# (N(0, 1) weights: int4's 16 levels per group of 32 are 8% RMS of each weight).  A decode
# bug is caught exactly by the comparison with the interpreter; these bound the quantization.
RELATIVE_ERROR_BOUND = {"float16": 2e-3, "int8": 4e-2, "int4": 0.4}


@pytest.mark.parametrize("weights", FORMATS)
@pytest.mark.parametrize("model_name", ["lm_like", "embedding_norm_matmul", "conv_net"])
def test_compressed_model_matches_its_interpreter_and_stays_near_float32(backend, tmp_path, weights, model_name) -> None:
    model = {"lm_like": lm_like, "embedding_norm_matmul": embedding_norm_matmul, "conv_net": conv_net}[model_name]()
    feeds_list = ([{"x": rand(2, 8, 6, 5, seed=8)}] if model_name == "conv_net"
                  else [{"ids": np.array([[3, 0, 99, 7, 50], [1, 2, 3, 4, 5]], np.int64)}])
    folder = tmp_path / weights
    relaxweb.build(model, folder, weights=weights)
    session = load_bundle(folder, backend)
    module = compile_model(model, weights=weights)
    manifest = json.loads((folder / "manifest.json").read_text())
    plain = json.loads(json.dumps(relaxweb.build(model, tmp_path / "float32").manifest))
    # the kernels read the packed words: no float32 copy of a big weight, no extra kernel
    big = [w for w in manifest["weights"] if w["dtype"] == "float32" and np.prod(w["shape"]) >= 1024]
    assert big == [], big
    assert len(manifest["kernels"]) == len(plain["kernels"])
    assert not [k["name"] for k in manifest["kernels"] if k["name"].startswith("unpack_weights")]
    assert all(k.get("cpu_file") for k in manifest["kernels"] if "matmul" in k["name"] or "conv" in k["name"])
    # the packed words reach the shards byte for byte
    constants = {weight.name: weight.data for weight in module.main.weights}
    for entry in manifest["weights"]:
        shard = (folder / manifest["shards"][entry["shard"]]["file"]).read_bytes()
        if entry["dtype"] == "uint32":
            assert shard[entry["offset"]:entry["offset"] + entry["nbytes"]] == constants[entry["name"]].astype("<u4").tobytes()
    for feeds in feeds_list:
        compiled = session.run(feeds)["y"]
        interpreted = run_host_function(module.main, module.programs, feeds)[0]
        assert_close(compiled, interpreted, MODEL)
        reference = onnxruntime_outputs(model, feeds)[0]
        error = np.linalg.norm(compiled - reference) / np.linalg.norm(reference)
        assert error < RELATIVE_ERROR_BOUND[weights], error


def weight_bytes(folder: Path) -> int:
    return sum(f.stat().st_size for f in (folder / "weights").glob("shard*.bin"))


def test_weight_bytes_shrink_to_the_format(tmp_path) -> None:
    """An embedding 1024 x 256 and matmuls 256 x 1024, 1024 x 256 (biases 0.16% of the
    weights): measured int4 0.1459x, int8 0.2668x, float16 0.5008x the float32 bundle's bytes
    (459,776, 840,704 and 1,577,984 of 3,150,848)."""
    model = lm_like(vocab=1024, width=256, hidden=1024, out=256)
    sizes = {fmt: weight_bytes(relaxweb.build(model, tmp_path / fmt, weights=fmt).path)
             for fmt in ("float32", *FORMATS)}
    ratios = {fmt: sizes[fmt] / sizes["float32"] for fmt in FORMATS}
    assert ratios["int4"] <= 0.17 and ratios["int8"] <= 0.27 and ratios["float16"] <= 0.51, ratios


def test_build_refuses_unknown_compression_settings(tmp_path) -> None:
    for keywords, message in (({"weights": "int3"}, "weights 'int3' is not a weight format"),
                              ({"weights": "int4", "group_size": 0}, "the group size must be an integer >= 1"),
                              ({"weights": "int4", "scale_dtype": "int8"}, "scale dtype 'int8' is not one of")):
        with pytest.raises(RelaxwebError, match=message):
            relaxweb.build(lm_like(), tmp_path / "out", **keywords)


# Pre-quantized models: onnxruntime's MatMulNBitsQuantizer --------------------------------------


def nbits_quantized(bits: int, symmetric: bool) -> onnx.ModelProto:
    from onnxruntime.quantization.matmul_nbits_quantizer import MatMulNBitsQuantizer

    nodes = [helper.make_node("Gather", ["emb", "ids"], ["e"], axis=0),
             helper.make_node("MatMul", ["e", "w1"], ["h"]),
             helper.make_node("MatMul", ["h", "w2"], ["h2"]),
             helper.make_node("Add", ["h2", "b2"], ["y"])]
    model = make_model(nodes, [("ids", TensorProto.INT64, ["b", "s"])], ["y"],
                       {"emb": rand(100, 64, seed=1), "w1": rand(64, 72, seed=2), "w2": rand(72, 48, seed=3),
                        "b2": rand(48, seed=4)}, opset=21)
    quantizer = MatMulNBitsQuantizer(model, bits=bits, block_size=32, is_symmetric=symmetric,
                                     op_types_to_quantize=("MatMul", "Gather") if bits == 4 else ("MatMul",),
                                     quant_axes=(("MatMul", 0), ("Gather", 1)))
    quantizer.process()
    return quantizer.model.model


@pytest.mark.parametrize("bits,symmetric", [(4, False), (4, True), (8, False)],
                         ids=["4 bits, zero points", "4 bits, symmetric", "8 bits, zero points"])
def test_models_from_the_matmul_nbits_quantizer_match_onnxruntime(backend, tmp_path, bits, symmetric) -> None:
    model = nbits_quantized(bits, symmetric)
    ops = {node.op_type for node in model.graph.node}
    assert "MatMulNBits" in ops and ("GatherBlockQuantized" in ops) == (bits == 4)
    relaxweb.build(model, tmp_path)
    session = load_bundle(tmp_path, backend)
    for shape in ((2, 5), (1, 1)):
        feeds = {"ids": np.random.default_rng(shape[1]).integers(0, 100, shape).astype(np.int64)}
        expected = onnxruntime_outputs(model, feeds)[0]
        assert_close(relaxweb.run_reference(model, feeds)["y"], expected, MODEL)
        assert_close(session.run(feeds)["y"], expected, MODEL)


def test_matmul_nbits_with_g_idx_is_refused_naming_the_node() -> None:
    model = nbits_quantized(4, False)
    node = next(n for n in model.graph.node if n.op_type == "MatMulNBits")
    model.graph.initializer.append(onnx.numpy_helper.from_array(np.arange(64, dtype=np.int32), "g_idx"))
    while len(node.input) < 4:
        node.input.append("")
    node.input.append("g_idx")
    with pytest.raises(RelaxwebError, match=f"MatMulNBits node '{node.name}': g_idx .* is not supported"):
        relaxweb.run_reference(model, {"ids": np.zeros((1, 2), np.int64)})


# The GPT-2-like test model (torch export) ------------------------------------------------------

# Relative RMS error of the logits against float32 onnxruntime, measured on lavapipe at both
# shapes: float16 2.2e-4, int8 5.1e-3, int4 0.088.
GPT2_ERROR_BOUND = {"float16": 1e-3, "int8": 2e-2, "int4": 0.3}


@pytest.fixture(scope="module")
def gpt2_export():
    from tests.model_exports import committed_exports

    return committed_exports(["gpt2_legacy"])["gpt2_legacy"]


@pytest.fixture(scope="module")
def gpt2_builds() -> dict:
    """weights -> (bundle folder, compiled module): each format built once for both backends."""
    return {}


@pytest.mark.slow
@pytest.mark.parametrize("weights", FORMATS)
def test_gpt2_like_model_compressed_matches_its_interpreter_and_stays_near_float32(
        backend, tmp_path_factory, gpt2_export, gpt2_builds, weights) -> None:
    from tests.model_exports import export_script

    if weights not in gpt2_builds:
        bundle = relaxweb.build(gpt2_export.path, tmp_path_factory.mktemp("gpt2") / weights, weights=weights)
        gpt2_builds[weights] = bundle.path, compile_model(gpt2_export.path, weights=weights)
    folder, module = gpt2_builds[weights]
    session = load_bundle(folder, backend)
    for dims in ({"batch": 1, "seq": 8}, {"batch": 2, "seq": 5}):
        feeds = export_script().make_inputs(gpt2_export.sidecar["inputs"], dims, seed=sum(dims.values()))
        compiled = session.run(feeds)["logits"]
        assert_close(compiled, run_host_function(module.main, module.programs, feeds)[0], MODEL)
        reference = onnxruntime_outputs(gpt2_export.path, feeds)[0]
        error = np.linalg.norm(compiled - reference) / np.linalg.norm(reference)
        print(f"gpt2_legacy {weights} {dims}: relative RMS error {error:.3g}")
        assert error < GPT2_ERROR_BOUND[weights], error


@in_the_browser
def test_an_int4_bundle_runs_in_chromium_as_on_wgpu(tmp_path) -> None:
    """The browser runtime needs nothing new: packed weights are uint32 weights, decoded by
    the kernels (SwiftShader runs the CPU variant of the fused matmul kernels)."""
    model = lm_like()
    bundle = relaxweb.build(model, tmp_path / "int4", weights="int4")
    feeds = {"ids": np.array([[3, 0, 99, 7, 50], [1, 2, 3, 4, 5]], np.int64)}
    module = compile_model(model, weights="int4")
    assert_close(relaxweb.run_in_browser(bundle.path, feeds)["y"], run_host_function(module.main, module.programs, feeds)[0],
                 MODEL)


@pytest.mark.parametrize("dtype", [TensorProto.UINT4, TensorProto.INT4], ids=["uint4", "int4"])
def test_gather_block_quantized_without_zero_points_matches_onnxruntime(device, tmp_path, dtype) -> None:
    """No zero point: an unsigned table's default is 0, a signed one's values are taken as
    they are (stored offset by 8 against the implicit 8)."""
    rng = np.random.default_rng(0)
    low, high = (0, 16) if dtype == TensorProto.UINT4 else (-8, 8)
    table = helper.make_tensor("table", dtype, [10, 64], rng.integers(low, high, (10, 64)).flatten().tolist())
    scales = onnx.numpy_helper.from_array(rng.uniform(0.1, 1.0, (10, 2)).astype(np.float32), "scales")
    node = helper.make_node("GatherBlockQuantized", ["table", "ids", "scales"], ["y"], domain="com.microsoft", block_size=32)
    model = make_model([node], [("ids", TensorProto.INT64, ["n"])], ["y"], [table, scales],
                       opset={"": 21, "com.microsoft": 1}, ir_version=10)
    feeds = {"ids": np.array([0, 5, 9, 5], np.int64)}
    expected = onnxruntime_outputs(model, feeds)[0]
    relaxweb.build(model, tmp_path)
    np.testing.assert_array_equal(relaxweb.run_reference(model, feeds)["y"], expected)
    np.testing.assert_array_equal(relaxweb.load(tmp_path, device=device).run(feeds)["y"], expected)


# onnxruntime's defaults: each quantized op's decode where the model leaves something out -------

GBQ_ROWS, GBQ_WIDTH, GBQ_BLOCK = 10, 64, 32


def _gather_block_quantized_case(data: str, bits: int, zero_points: bool) -> tuple[list, list[str]]:
    """The table's initializers and the node's inputs: ``data`` uint8 (``bits`` per value,
    MatMulNBits' layout), uint4 or int4, with zero points of the table's type or none."""
    rng = np.random.default_rng(bits)
    groups = GBQ_WIDTH // GBQ_BLOCK
    scales = onnx.numpy_helper.from_array(rng.uniform(0.1, 1.0, (GBQ_ROWS, groups)).astype(np.float32), "scales")
    per_byte = 8 // bits if data == "uint8" else 1
    if data == "uint8":
        table = onnx.numpy_helper.from_array(rng.integers(0, 256, (GBQ_ROWS, GBQ_WIDTH // per_byte)).astype(np.uint8), "table")
        zeros = onnx.numpy_helper.from_array(rng.integers(0, 256, (GBQ_ROWS, -(-groups // per_byte))).astype(np.uint8), "zeros")
    else:
        kind, (low, high) = {"uint4": (TensorProto.UINT4, (0, 16)), "int4": (TensorProto.INT4, (-8, 8))}[data]
        table = helper.make_tensor("table", kind, [GBQ_ROWS, GBQ_WIDTH], rng.integers(low, high, (GBQ_ROWS, GBQ_WIDTH)).flatten().tolist())
        zeros = helper.make_tensor("zeros", kind, [GBQ_ROWS, groups], rng.integers(low, high, (GBQ_ROWS, groups)).flatten().tolist())
    return [table, scales, *([zeros] if zero_points else [])], ["table", "ids", "scales", *(["zeros"] if zero_points else [])]


@pytest.mark.parametrize("data, bits, zero_points", [
    ("uint8", 4, False), ("uint8", 8, False), ("uint8", 4, True), ("uint8", 8, True),
    ("uint4", 4, False), ("uint4", 4, True), ("int4", 4, False), ("int4", 4, True),
])
def test_gather_block_quantized_decodes_as_onnxruntime_with_and_without_zero_points(data: str, bits: int,
                                                                                   zero_points: bool) -> None:
    """onnxruntime's kernel, not only its spec text: uint8 data without zero points is taken
    with MatMulNBits' implicit 8 (4 bits) or 128 (8 bits), uint4 and int4 data with 0."""
    initializers, names = _gather_block_quantized_case(data, bits, zero_points)
    node = helper.make_node("GatherBlockQuantized", names, ["y"], domain="com.microsoft", block_size=GBQ_BLOCK, bits=bits)
    model = make_model([node], [("ids", TensorProto.INT64, ["n"])], ["y"], initializers,
                       opset={"": 21, "com.microsoft": 1}, ir_version=10)
    feeds = {"ids": np.array([0, 5, 9, 5], np.int64)}
    np.testing.assert_array_equal(relaxweb.run_reference(model, feeds)["y"], onnxruntime_outputs(model, feeds)[0])


def test_gather_block_quantized_reads_a_reshaped_constant_as_a_constant(tmp_path) -> None:
    """The model builder's tied int4 embeddings: GatherBlockQuantized reads the LM head's
    MatMulNBits words ``[V, blocks, 16]`` through a Reshape to ``[V, blocks * 16]`` (too large
    for the importer to fold), with no zero points (so 8, as MatMulNBits)."""
    vocab, hidden, block = 320, 512, 32
    rng = np.random.default_rng(3)
    words = rng.integers(0, 256, (vocab, hidden // block, block // 2)).astype(np.uint8)
    scales = rng.uniform(0.01, 0.1, (vocab, hidden // block)).astype(np.float32)
    nodes = [helper.make_node("Reshape", ["head_words", "rows"], ["table"]),
             helper.make_node("GatherBlockQuantized", ["table", "ids", "head_scales"], ["embedded"], domain="com.microsoft",
                              block_size=block, bits=4),
             helper.make_node("MatMulNBits", ["embedded", "head_words", "head_scales"], ["logits"], domain="com.microsoft",
                              K=hidden, N=vocab, bits=4, block_size=block)]
    initializers = {"head_words": words, "head_scales": scales, "rows": np.array([vocab, -1], np.int64)}
    model = make_model(nodes, [("ids", TensorProto.INT64, ["b", "s"])], ["logits", "embedded"], initializers,
                       opset={"": 21, "com.microsoft": 1})
    assert words.size > 65536  # not folded at import: a reshape the converter looks through
    feeds = {"ids": np.array([[0, 7, 319]], np.int64)}
    expected = onnxruntime_outputs(model, feeds)
    actual = relaxweb.run_reference(model, feeds)
    assert_close(actual["embedded"], expected[1], MODEL)
    assert_close(actual["logits"], expected[0], MODEL)


@pytest.mark.parametrize("bits", [4, 8])
def test_matmul_nbits_without_zero_points_decodes_as_onnxruntime(bits: int) -> None:
    """MatMulNBits without zero points: 8 for 4 bits, 128 for 8 bits (onnxruntime's kernel)."""
    k, n, block = 64, 24, 32
    rng = np.random.default_rng(bits)
    weights = rng.integers(0, 256, (n, k // block, block * bits // 8)).astype(np.uint8)
    scales = rng.uniform(0.01, 0.1, (n * (k // block),)).astype(np.float32)
    node = helper.make_node("MatMulNBits", ["a", "w", "s"], ["y"], domain="com.microsoft", K=k, N=n, bits=bits,
                            block_size=block)
    model = make_model([node], [("a", TensorProto.FLOAT, ["m", k])], ["y"], {"w": weights, "s": scales},
                       opset={"": 21, "com.microsoft": 1})
    feeds = {"a": rand(3, k, seed=4)}
    assert_close(relaxweb.run_reference(model, feeds)["y"], onnxruntime_outputs(model, feeds)[0], MODEL)
