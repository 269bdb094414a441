"""compress_weights: constant weights stored as packed float16 / int8 / int4 words.

What the pass promises (relaxweb/passes/compress_weights.py), under ``PassContext.weights``:
the constant second factor ``W[..., K, N]`` of a matmul is packed along ``K``; the 2-d table
of ``take(table, ids, axis=0)`` along its rows, the call becoming ``unpack_weights`` of the
gathered rows of the words and scales; the weight ``W[O, C, *kernel]`` of a convolution as
``[O, C * kernel]`` along the reduction, reshaped back.  int8 is symmetric (scale
``max|w| / 127``, the value + 128 in 8 bits), int4 asymmetric (16 levels over
``[min(w, 0), max(w, 0)]``, the zero points in the words after the values); scales are
rounded to float16 and packed two per word.  float32 (the default), constants of fewer than
``MIN_ELEMENTS`` elements, other dtypes, and other uses of a constant stay as they are.

The weights here are multiples of a power of two that each format holds exactly, so the
packed module computes what the float32 one does (and the interpreter can show it).
"""

from __future__ import annotations

import numpy as np

from relaxweb.ir.parser import parse_module
from relaxweb.ops.packed_weights import pack_fields, pack_halves
from relaxweb.passes import PassContext, compress_weights
from relaxweb.passes.compress_weights import MIN_ELEMENTS
from tests.helpers import rand
from tests.passes.rewrite import check_rewrite, check_unchanged


def exact_levels(shape: tuple[int, ...], low: int, high: int, axis: int, step: float, seed: int) -> np.ndarray:
    """Integers in [low, high] times ``step``, with ``low`` and ``high`` both in every group of
    32 along ``axis`` (so each group's range, and so its scale, is exactly known)."""
    levels = np.random.default_rng(seed).integers(low, high + 1, shape)
    moved = np.moveaxis(levels, axis, 0)
    for start in range(0, moved.shape[0], 32):
        moved[start], moved[min(start + 1, moved.shape[0] - 1)] = low, high
    return (levels * step).astype(np.float32)


def test_compress_weights_packs_a_matmul_factor_and_an_embedding_table() -> None:
    """float16 of values that float16 holds exactly: the rewrite computes the same."""
    table = rand(40, 32, seed=1).astype(np.float16).astype(np.float32)
    weight = rand(32, 48, seed=2).astype(np.float16).astype(np.float32)
    constants = {"table": table, "w": weight, "table.float16_words": pack_halves(table, 1),
                 "w.float16_words": pack_halves(weight, 0)}
    before = """
@function(inputs=["ids"], outputs=["y"])
def main(ids: Tensor((n,), "int64")) -> Tensor((n, 48), "float32"):
    with dataflow():
        e: Tensor((n, 32), "float32") = take(const("table"), ids, axis=0)
        y: Tensor((n, 48), "float32") = matmul(e, const("w"))
        output(y)
    return y
"""
    expected = """
@function(inputs=["ids"], outputs=["y"])
def main(ids: Tensor((n,), "int64")) -> Tensor((n, 48), "float32"):
    with dataflow():
        table_float16_words_rows: Tensor((n, 16), "uint32") = take(const("table.float16_words"), ids, axis=0)
        e: Tensor((n, 32), "float32") = unpack_weights(table_float16_words_rows, format="float16", axis=1, extent=32)
        w_unpacked: Tensor((32, 48), "float32") = unpack_weights(const("w.float16_words"), format="float16", axis=0, extent=32)
        y: Tensor((n, 48), "float32") = matmul(e, w_unpacked)
        output(y)
    return y
"""
    with PassContext(weights="float16"):
        check_rewrite(compress_weights, before, expected, {"ids": np.array([3, 0, 39, 7], np.int64)}, constants)


def test_compress_weights_packs_int8_symmetric_in_both_branches_of_an_if() -> None:
    """W [64, 16] (two groups of 32 along K), each group's largest magnitude 127 / 128: the
    scale is 1 / 128 (a float16 packed in the low half of a word), each value q / 128 is
    stored as q + 128.  The matmul in each branch reads its own unpack of the same words."""
    weight = exact_levels((64, 16), -127, 127, axis=0, step=1 / 128, seed=3)
    scale = np.full((2, 16), 1 / 128, np.float32)
    constants = {"w": weight, "w.int8_words": pack_fields(np.rint(weight * 128) + 128, 8, 0),
                 "w.scales": pack_halves(scale, 0)}
    body = '''
@function(inputs=["x", "flag"], outputs=["y"])
def main(x: Tensor((n, 64), "float32"), flag: Tensor((), "bool")) -> Tensor((n, 16), "float32"):
    y: Tensor((n, 16), "float32")
    if flag:{true}
        y = a
    else:{false}
        y = b
    return y
'''
    before = body.format(true='''
        a: Tensor((n, 16), "float32") = matmul(x, const("w"))''', false='''
        b: Tensor((n, 16), "float32") = matmul(x, const("w"))''')
    unpack = 'unpack_weights(const("w.int8_words"), const("w.scales"), format="int8", axis=0, extent=64, group_size=32)'
    expected = body.format(true=f'''
        w_a: Tensor((64, 16), "float32") = {unpack}
        a: Tensor((n, 16), "float32") = matmul(x, w_a)''', false=f'''
        w_b: Tensor((64, 16), "float32") = {unpack}
        b: Tensor((n, 16), "float32") = matmul(x, w_b)''')
    x = rand(3, 64)
    with PassContext(weights="int8"):
        check_rewrite(compress_weights, before, expected,
                      [{"x": x, "flag": np.array(True)}, {"x": x, "flag": np.array(False)}], constants)


def test_compress_weights_packs_int4_convolution_weights_with_their_zero_points_in_the_words() -> None:
    """W [16, 8, 3, 3] is packed as [16, 72] along its 72 reduction values (two groups of 32
    and one of 8), each group spanning -8 / 16 .. 7 / 16: scale 1 / 16, zero point 8.  The
    words are 9 of values (8 per word) then 1 of the 3 zero points; the unpacked weight is
    reshaped back for the convolution."""
    flat = exact_levels((16, 72), -8, 7, axis=1, step=1 / 16, seed=4)
    fields = np.rint(flat * 16) + 8
    zero_points = np.full((16, 3), 8)
    words = np.concatenate([pack_fields(fields, 4, 1), pack_fields(zero_points, 4, 1)], axis=1)
    assert words.shape == (16, 10)
    constants = {"w": flat.reshape(16, 8, 3, 3), "w.int4_words": words,
                 "w.scales": pack_halves(np.full((16, 3), 1 / 16, np.float32), 1)}
    signature = '''
@function(inputs=["x"], outputs=["y"])
def main(x: Tensor((n, 8, 6, 6), "float32")) -> Tensor((n, 16, 4, 4), "float32"):
    with dataflow():
'''
    attrs = "strides=[1, 1], dilations=[1, 1], padding=[0, 0, 0, 0], groups=1"
    before = signature + f'''
        y: Tensor((n, 16, 4, 4), "float32") = conv(x, const("w"), {attrs})
        output(y)
    return y
'''
    expected = signature + f'''
        w_unpacked: Tensor((16, 72), "float32") = unpack_weights(const("w.int4_words"), const("w.scales"), format="int4", axis=1, extent=72, group_size=32, zero_points_in_words=True)
        w_kernel: Tensor((16, 8, 3, 3), "float32") = reshape(w_unpacked, shape((16, 8, 3, 3)))
        y: Tensor((n, 16, 4, 4), "float32") = conv(x, w_kernel, {attrs})
        output(y)
    return y
'''
    with PassContext(weights="int4"):
        check_rewrite(compress_weights, before, expected, {"x": rand(2, 8, 6, 6)}, constants)


def test_compress_weights_leaves_other_uses_of_constants_alone() -> None:
    """A table gathered along its columns, a constant first factor of a matmul, and a
    float16 weight are not weights this pass packs."""
    text = '''
@function(inputs=["ids", "x", "half"], outputs=["columns", "y", "z"])
def main(ids: Tensor((n,), "int64"), x: Tensor((32, m), "float32"), half: Tensor((m, 32), "float16")) -> Tuple(Tensor((40, n), "float32"), Tensor((48, m), "float32"), Tensor((m, 48), "float16")):
    with dataflow():
        columns: Tensor((40, n), "float32") = take(const("table"), ids, axis=1)
        y: Tensor((48, m), "float32") = matmul(const("w"), x)
        z: Tensor((m, 48), "float16") = matmul(half, const("h"))
        output(columns, y, z)
    return (columns, y, z)
'''
    constants = {"table": rand(40, 40, seed=1), "w": rand(48, 32, seed=2), "h": rand(32, 48, seed=3).astype(np.float16)}
    assert all(array.size >= MIN_ELEMENTS for array in constants.values())
    inputs = {"ids": np.array([0, 39, 5], np.int64), "x": rand(32, 3, seed=4), "half": rand(3, 32, seed=5).astype(np.float16)}
    with PassContext(weights="int4"):
        check_unchanged(compress_weights, text, inputs, constants)


def test_compress_weights_leaves_float32_builds_and_small_constants_alone() -> None:
    text = """
@function(inputs=["x"], outputs=["y"])
def main(x: Tensor((n, 8), "float32")) -> Tensor((n, 8), "float32"):
    with dataflow():
        y: Tensor((n, 8), "float32") = matmul(x, const("w"))
        output(y)
    return y
"""
    module = parse_module(text, {"w": rand(8, 8)})  # 64 elements: below MIN_ELEMENTS
    with PassContext(weights="int4"):
        assert compress_weights(module).main is module.main
    assert compress_weights(module) is module  # float32 (the default)
