"""gather_before_transpose: a take from a transposed constant gathers from the constant, then
transposes the rows it gathered (the model builder's tied embedding: Transpose(lm_head))."""

from __future__ import annotations

import numpy as np

from relaxweb.passes.gather_before_transpose import gather_before_transpose
from tests.helpers import rand
from tests.passes.rewrite import check_rewrite, check_unchanged

IDS = [{"ids": np.array([[3, 0, 9], [7, 7, 1]], np.int64)}, {"ids": np.array([[5]], np.int64)}]


def test_a_tied_embedding_gathers_columns_of_the_lm_head() -> None:
    """The table [10, 6] is the head [6, 10] transposed: rows of the one are columns of the other."""
    before = """
@function(inputs=["ids"], outputs=["e"])
def main(ids: Tensor((b, s), "int64")) -> Tensor((b, s, 6), "float32"):
    with dataflow():
        table: Tensor((10, 6), "float32") = transpose(const("head"), axes=[1, 0])
        e: Tensor((b, s, 6), "float32") = take(table, ids, axis=0)
        output(e)
    return e
"""
    expected = """
@function(inputs=["ids"], outputs=["e"])
def main(ids: Tensor((b, s), "int64")) -> Tensor((b, s, 6), "float32"):
    with dataflow():
        e_gathered: Tensor((6, b, s), "float32") = take(const("head"), ids, axis=1)
        e: Tensor((b, s, 6), "float32") = transpose(e_gathered, axes=[1, 2, 0])
        output(e)
    return e
"""
    check_rewrite(gather_before_transpose, before, expected, IDS, {"head": rand(6, 10, seed=1)})


def test_any_axes_and_any_gathered_axis() -> None:
    """C [4, 5, 3] transposed to [3, 4, 5], gathered along its axis 1 (C's axis 0)."""
    before = """
@function(inputs=["ids"], outputs=["e"])
def main(ids: Tensor((b, s), "int64")) -> Tensor((3, b, s, 5), "float32"):
    with dataflow():
        moved: Tensor((3, 4, 5), "float32") = transpose(const("c"), axes=[2, 0, 1])
        e: Tensor((3, b, s, 5), "float32") = take(moved, ids, axis=1)
        output(e)
    return e
"""
    expected = """
@function(inputs=["ids"], outputs=["e"])
def main(ids: Tensor((b, s), "int64")) -> Tensor((3, b, s, 5), "float32"):
    with dataflow():
        e_gathered: Tensor((b, s, 5, 3), "float32") = take(const("c"), ids, axis=0)
        e: Tensor((3, b, s, 5), "float32") = transpose(e_gathered, axes=[3, 0, 1, 2])
        output(e)
    return e
"""
    ids = [{"ids": np.array([[3, 0, 2]], np.int64)}, {"ids": np.array([[1], [3]], np.int64)}]
    check_rewrite(gather_before_transpose, before, expected, ids, {"c": rand(4, 5, 3, seed=2)})


def test_a_transpose_read_by_anything_else_stays() -> None:
    """Read by a matmul too, the transposed table is computed anyway: nothing to save."""
    text = """
@function(inputs=["ids"], outputs=["y"])
def main(ids: Tensor((b, s), "int64")) -> Tensor((b, s, 6), "float32"):
    with dataflow():
        table: Tensor((10, 6), "float32") = transpose(const("head"), axes=[1, 0])
        e: Tensor((b, s, 6), "float32") = take(table, ids, axis=0)
        total: Tensor((1, 6), "float32") = sum(table, axes=[0], keepdims=True)
        y: Tensor((b, s, 6), "float32") = add(e, total)
        output(y)
    return y
"""
    check_unchanged(gather_before_transpose, text, IDS, {"head": rand(6, 10, seed=1)})
