"""onnxruntime's contrib ops (domain ``com.microsoft``) that its transformer optimizer writes:
the GELU family, BiasAdd, FusedMatMul, and the fused normalizations (SkipLayerNormalization,
SimplifiedLayerNormalization and its skip form, EmbedLayerNormalization).  The attention ops
are in ``contrib_attention.py``.

Each is a composition of relaxweb ops that computes what onnxruntime's CPU kernels compute
(the numeric reference; the specs are onnxruntime's ContribOperators.md):

- ``Gelu`` (exact, erf), ``BiasGelu`` (``Gelu(A + B)``), ``FastGelu`` (the tanh form, with an
  optional bias), ``QuickGelu`` (``x * sigmoid(alpha * x)``), ``BiasAdd`` (``X + bias + skip``),
  ``BiasSplitGelu`` (``X + bias`` halved along the last dim: ``left * Gelu(right)``);
- ``FusedMatMul``: ``alpha * op(A) @ op(B)``, ``op`` transposing the last two dims
  (``transA``/``transB``) after moving the first dim behind the batch dims
  (``transBatchA``/``transBatchB``);
- ``SkipLayerNormalization`` / ``SkipSimplifiedLayerNormalization``: layer (RMS) norm of
  ``input + skip (+ bias)``, with the optional mean, inverse standard deviation and sum outputs;
- ``SimplifiedLayerNormalization`` (onnxruntime registers it in the standard domain): RMS norm;
- ``EmbedLayerNormalization``: word, position (and segment) embeddings gathered, added and
  layer-normalized; ``mask_index`` is the count of non-zero mask entries of each row.
"""

from __future__ import annotations

import numpy as np

from ...ir.expr import Expr, ShapeExpr, tensor_shape
from ...ir.struct_info import TensorStructInfo
from ...ir.symbolic import IntImm, as_int
from ...ops import call_op, strided_slice
from .registry import NodeConversionError, converter

MICROSOFT = "com.microsoft"

# onnxruntime's defaults (contrib_defs.cc: kDefaultSkipLayerNormEpsilon, kDefaultEmbedLayerNormEpsilon)
SKIP_LAYER_NORM_EPSILON = 1e-12
EMBED_LAYER_NORM_EPSILON = 1e-12


def optional_input(inputs: list[Expr | None], position: int) -> Expr | None:
    return inputs[position] if position < len(inputs) else None


def wanted_output(node, position: int) -> bool:
    return position < len(node.output) and bool(node.output[position])


def dtype_of(expr: Expr) -> str:
    info = expr.struct_info
    return info.dtype if isinstance(info, TensorStructInfo) else "float32"


def scalar_constant(context, value: float, like: Expr, name: str):
    """A 0-d constant of ``like``'s dtype."""
    return context.constant(np.array(value, dtype=np.dtype(dtype_of(like))).reshape(()), name)


def label(node) -> str:
    return node.name or node.output[0]


def require_rank(node, expr: Expr, what: str, ranks: tuple[int, ...]) -> int:
    rank = expr.struct_info.ndim if isinstance(expr.struct_info, TensorStructInfo) else -1
    if rank not in ranks:
        expected = " or ".join(f"{r}-d" for r in ranks)
        raise NodeConversionError(f"{node.op_type} node '{node.name}': {what} must be {expected}, got {expr.struct_info}")
    return rank


# Activations -----------------------------------------------------------------------------------


def _plus_bias(context, x: Expr, bias: Expr | None) -> Expr:
    return x if bias is None else context.builder.emit(call_op("add", x, bias), "biased")


@converter("Gelu", domain=MICROSOFT)
def convert_gelu(context, node, inputs):
    return call_op("gelu", inputs[0])


@converter("BiasGelu", domain=MICROSOFT)
def convert_bias_gelu(context, node, inputs):
    return call_op("gelu", _plus_bias(context, inputs[0], inputs[1]))


@converter("FastGelu", domain=MICROSOFT)
def convert_fast_gelu(context, node, inputs):
    return call_op("gelu_tanh", _plus_bias(context, inputs[0], optional_input(inputs, 1)))


@converter("QuickGelu", domain=MICROSOFT)
def convert_quick_gelu(context, node, inputs):
    x = inputs[0]
    alpha = float(context.attributes(node).get("alpha", 1.702))
    scaled = context.builder.emit(call_op("multiply", x, scalar_constant(context, alpha, x, f"{label(node)}_alpha")), "quick_gelu_scaled")
    gate = context.builder.emit(call_op("sigmoid", scaled), "quick_gelu_gate")
    return call_op("multiply", x, gate)


@converter("BiasSplitGelu", domain=MICROSOFT)
def convert_bias_split_gelu(context, node, inputs):
    """``X + bias`` split in halves along its last dim: ``left * Gelu(right)`` (diffusion
    models' GEGLU, written by the UNet optimizer)."""
    biased = _plus_bias(context, inputs[0], inputs[1])
    width = tensor_shape(biased)[-1] if isinstance(biased.struct_info, TensorStructInfo) and \
        biased.struct_info.shape is not None else None
    if width is None or as_int(width) is None or as_int(width) % 2:
        raise NodeConversionError(f"BiasSplitGelu node '{node.name}': the last dim must be a known even size, "
                                  f"got {biased.struct_info}")
    half = as_int(width) // 2
    left = context.builder.emit(strided_slice(biased, [-1], [IntImm(0)], [IntImm(half)]), "split_left")
    right = context.builder.emit(strided_slice(biased, [-1], [IntImm(half)], [IntImm(2 * half)]), "split_right")
    return call_op("multiply", left, context.builder.emit(call_op("gelu", right), "split_gate"))


@converter("BiasAdd", domain=MICROSOFT)
def convert_bias_add(context, node, inputs):
    x, bias, skip = inputs[:3]
    return call_op("add", _plus_bias(context, x, bias), skip)


# FusedMatMul -----------------------------------------------------------------------------------


def _fused_operand(context, node, operand: Expr, batch_flag: str, flag: str) -> Expr:
    attrs = context.attributes(node)
    rank = operand.struct_info.ndim
    if rank < 2:
        if attrs.get(batch_flag, 0) or attrs.get(flag, 0):
            raise NodeConversionError(f"FusedMatMul node '{node.name}': {flag}/{batch_flag} need an operand of rank >= 2")
        return operand
    order = list(range(rank))
    if attrs.get(batch_flag, 0) and rank > 2:
        order = [*range(1, rank - 1), 0, rank - 1]
    if attrs.get(flag, 0):
        order[-2], order[-1] = order[-1], order[-2]
    if order == list(range(rank)):
        return operand
    return context.builder.emit(call_op("transpose", operand, axes=order), "fused_matmul_operand")


@converter("FusedMatMul", domain=MICROSOFT)
def convert_fused_matmul(context, node, inputs):
    a, b = inputs[:2]
    for what, operand in (("A", a), ("B", b)):
        if operand.struct_info.ndim < 1:
            raise NodeConversionError(f"FusedMatMul node '{node.name}': {what} needs a known rank of at least 1")
    a = _fused_operand(context, node, a, "transBatchA", "transA")
    b = _fused_operand(context, node, b, "transBatchB", "transB")
    alpha = float(context.attributes(node).get("alpha", 1.0))
    if a.struct_info.ndim >= 2 and b.struct_info.ndim >= 2:
        product = call_op("matmul", a, b)
    else:
        left = "k" if a.struct_info.ndim == 1 else "...mk"
        right = "k" if b.struct_info.ndim == 1 else "...kn"
        out = ("..." if max(a.struct_info.ndim, b.struct_info.ndim) > 1 else "") + ("m" if a.struct_info.ndim > 1 else "") + (
            "n" if b.struct_info.ndim > 1 else "")
        product = call_op("einsum", a, b, equation=f"{left},{right}->{out}")
    if alpha == 1.0:
        return product
    product = context.builder.emit(product, "fused_matmul")
    return call_op("multiply", product, scalar_constant(context, alpha, product, f"{label(node)}_alpha"))


# Normalizations --------------------------------------------------------------------------------


def _normalized(context, node, x: Expr, scale: Expr, bias: Expr | None, epsilon: float, rms: bool, axis: int = -1):
    if rms:
        return call_op("rms_norm", x, scale, axis=axis, epsilon=epsilon)
    args = (x, scale) if bias is None else (x, scale, bias)
    return call_op("layer_norm", *args, axis=axis, epsilon=epsilon)


def _skip_norm(context, node, inputs, rms: bool):
    """SkipLayerNormalization (input, skip, gamma, beta?, bias?) and SkipSimplifiedLayerNormalization
    (input, skip, gamma, bias?) -> output, mean?, inv_std_var?, input_skip_bias_sum?."""
    x, skip, gamma = inputs[:3]
    beta = None if rms else optional_input(inputs, 3)
    bias = optional_input(inputs, 3 if rms else 4)
    epsilon = float(context.attributes(node).get("epsilon", SKIP_LAYER_NORM_EPSILON))
    require_rank(node, x, "input", (2, 3))
    total = context.builder.emit(call_op("add", x, skip), "skip_sum")
    if bias is not None:
        total = context.builder.emit(call_op("add", total, bias), "skip_bias_sum")
    results = [_normalized(context, node, total, gamma, beta, epsilon, rms)]
    if wanted_output(node, 1):
        if rms:
            raise NodeConversionError(
                f"{node.op_type} node '{node.name}': the 'mean' output is not computed by RMS normalization "
                "(onnxruntime leaves it undefined); relaxweb does not support using it"
            )
        results.append(call_op("mean", total, axes=[-1 % len(tensor_shape(total))], keepdims=True))
    elif wanted_output(node, 2) or wanted_output(node, 3):
        results.append(None)
    if wanted_output(node, 2):
        results.append(call_op("rms_norm_inv_std" if rms else "layer_norm_inv_std", total, axis=-1, epsilon=epsilon))
    elif wanted_output(node, 3):
        results.append(None)
    if wanted_output(node, 3):
        results.append(total)
    return results


@converter("SkipLayerNormalization", domain=MICROSOFT)
def convert_skip_layer_norm(context, node, inputs):
    return _skip_norm(context, node, inputs, rms=False)


@converter("SkipSimplifiedLayerNormalization", domain=MICROSOFT)
def convert_skip_simplified_layer_norm(context, node, inputs):
    return _skip_norm(context, node, inputs, rms=True)


@converter("SimplifiedLayerNormalization")
def convert_simplified_layer_norm(context, node, inputs):
    """onnxruntime's RMS norm (X, scale) -> Y, inv_std_var?; registered by onnxruntime in the
    standard domain.  ``stash_type`` only picks the precision of the statistics, which relaxweb
    always computes in float32 (or float64 for float64 tensors)."""
    x, scale = inputs[:2]
    attrs = context.attributes(node)
    axis = int(attrs.get("axis", -1))
    epsilon = float(attrs.get("epsilon", 1e-5))
    results = [call_op("rms_norm", x, scale, axis=axis, epsilon=epsilon)]
    if wanted_output(node, 1):
        results.append(call_op("rms_norm_inv_std", x, axis=axis, epsilon=epsilon))
    return results


@converter("EmbedLayerNormalization", domain=MICROSOFT)
def convert_embed_layer_norm(context, node, inputs):
    """(input_ids, segment_ids?, word_embedding, position_embedding, segment_embedding?, gamma,
    beta, mask?, position_ids?) -> output, mask_index?, embedding_sum?.  Without position_ids
    the positions are 0 .. sequence_length - 1."""
    input_ids, segment_ids, words, positions = inputs[:4]
    segments, gamma, beta = optional_input(inputs, 4), inputs[5], inputs[6]
    mask, position_ids = optional_input(inputs, 7), optional_input(inputs, 8)
    epsilon = float(context.attributes(node).get("epsilon", EMBED_LAYER_NORM_EPSILON))
    require_rank(node, input_ids, "input_ids", (2,))
    emit = context.builder.emit
    total = emit(call_op("take", words, input_ids, axis=0), "word_embedding")
    if position_ids is not None:
        position = emit(call_op("take", positions, position_ids, axis=0), "position_embedding")
    else:  # positions 0 .. sequence_length - 1, shared by every row
        length = tensor_shape(input_ids)[1]
        position = emit(strided_slice(positions, [0], [IntImm(0)], [length]), "position_embedding")
    total = emit(call_op("add", total, position), "embedding_sum")
    if segment_ids is not None and segments is not None:
        segment = emit(call_op("take", segments, segment_ids, axis=0), "segment_embedding")
        total = emit(call_op("add", total, segment), "embedding_sum")
    results = [call_op("layer_norm", total, gamma, beta, axis=-1, epsilon=epsilon)]
    if wanted_output(node, 1):  # without a mask, zeros (as onnxruntime)
        batch = tensor_shape(input_ids)[0]
        results.append(_mask_index(context, node, mask) if mask is not None
                       else call_op("full", ShapeExpr((batch,)), value=0, dtype="int32"))
    elif wanted_output(node, 2):
        results.append(None)
    if wanted_output(node, 2):
        results.append(total)
    return results


def _mask_index(context, node, mask: Expr):
    """The number of non-zero entries of each mask row, as int32."""
    emit = context.builder.emit
    zero = context.constant(np.zeros((), dtype=np.dtype(dtype_of(mask))), f"{label(node)}_zero")
    kept = emit(call_op("not_equal", mask, zero), "mask_kept")
    counted = emit(call_op("cast", kept, dtype="int32"), "mask_counted")
    return call_op("sum", counted, axes=[1], keepdims=False)
