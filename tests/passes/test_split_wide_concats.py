"""split_wide_concats: a concat of more tensors than a kernel binds (7 arguments and its
result: WebGPU's default of 8 storage buffers) becomes consecutive runs of at most 7, each
concatenated, then those runs, until one concat reads them all; a constant bound in parts
counts once per part; narrower concats, and other ops, are left alone."""

from __future__ import annotations

import numpy as np

from relaxweb.passes import PassContext
from relaxweb.passes.split_wide_concats import split_wide_concats
from tests.helpers import rand
from tests.passes.rewrite import check_rewrite, check_unchanged


def _names(first: int, last: int) -> str:
    return ", ".join(f"x{i}" for i in range(first, last))


def _signature(count: int, shape: str, result: str) -> str:
    params = ", ".join(f'x{i}: Tensor({shape}, "float32")' for i in range(count))
    inputs = ", ".join(f'"x{i}"' for i in range(count))
    return f'''
@function(inputs=[{inputs}], outputs=["y"])
def main({params}) -> Tensor({result}, "float32"):
    with dataflow():
'''


def _feeds(count: int, *shape: int) -> dict[str, np.ndarray]:
    return {f"x{i}": rand(*shape, seed=i) for i in range(count)}


def test_nine_tensors_become_two_runs_read_by_one_concat() -> None:
    """9 arguments: x0..x6 fill one kernel, x7 and x8 the next; the concat reads the two."""
    signature = _signature(9, "(n, 2)", "(n, 18)")
    before = signature + f'''
        y: Tensor((n, 18), "float32") = concat({_names(0, 9)}, axis=1)
        output(y)
    return y
'''
    expected = signature + f'''
        y_part: Tensor((n, 14), "float32") = concat({_names(0, 7)}, axis=1)
        y_part1: Tensor((n, 4), "float32") = concat(x7, x8, axis=1)
        y: Tensor((n, 18), "float32") = concat(y_part, y_part1, axis=1)
        output(y)
    return y
'''
    check_rewrite(split_wide_concats, before, expected, [_feeds(9, 3, 2), _feeds(9, 1, 2)])


def test_twenty_tensors_along_a_symbolic_axis() -> None:
    """The captcha CRNN's 20 unrolled steps, stacked along their symbolic batch axis."""
    signature = _signature(20, "(b, 3)", "(b * 20, 3)")
    before = signature + f'''
        y: Tensor((b * 20, 3), "float32") = concat({_names(0, 20)}, axis=0)
        output(y)
    return y
'''
    expected = signature + f'''
        y_part: Tensor((b * 7, 3), "float32") = concat({_names(0, 7)}, axis=0)
        y_part1: Tensor((b * 7, 3), "float32") = concat({_names(7, 14)}, axis=0)
        y_part2: Tensor((b * 6, 3), "float32") = concat({_names(14, 20)}, axis=0)
        y: Tensor((b * 20, 3), "float32") = concat(y_part, y_part1, y_part2, axis=0)
        output(y)
    return y
'''
    check_rewrite(split_wide_concats, before, expected, [_feeds(20, 2, 3), _feeds(20, 1, 3)])


def test_fifty_tensors_take_two_levels() -> None:
    """50 = 7 runs of 7 and x49: eight arguments are still too many, so the seven runs are
    concatenated once more, and the last concat reads that and x49."""
    signature = _signature(50, "(2, k)", "(2, k * 50)")
    before = signature + f'''
        y: Tensor((2, k * 50), "float32") = concat({_names(0, 50)}, axis=1)
        output(y)
    return y
'''
    runs = "".join(f'''
        y_part{run or ""}: Tensor((2, k * 7), "float32") = concat({_names(7 * run, 7 * run + 7)}, axis=1)'''
                   for run in range(7))
    expected = signature + runs.lstrip("\n") + '''
        y_part7: Tensor((2, k * 49), "float32") = concat(y_part, y_part1, y_part2, y_part3, y_part4, y_part5, y_part6, axis=1)
        y: Tensor((2, k * 50), "float32") = concat(y_part7, x49, axis=1)
        output(y)
    return y
'''
    check_rewrite(split_wide_concats, before, expected, _feeds(50, 2, 3))


def test_a_constant_bound_in_parts_counts_once_per_part() -> None:
    """With weights split every 256 bytes, the 1 KiB constant binds as 4 parts: x0, x1, x2
    and it fill one kernel (7 bindings), x3 goes on its own and stays an argument."""
    signature = _signature(4, "(64,)", "(512,)")
    before = signature + '''
        y: Tensor((512,), "float32") = concat(x0, x1, x2, const("c"), x3, axis=0)
        output(y)
    return y
'''
    expected = signature + '''
        y_part: Tensor((448,), "float32") = concat(x0, x1, x2, const("c"), axis=0)
        y: Tensor((512,), "float32") = concat(y_part, x3, axis=0)
        output(y)
    return y
'''
    constants = {"c": rand(256, seed=9)}
    with PassContext(binding_split_bytes=256):
        check_rewrite(split_wide_concats, before, expected, _feeds(4, 64), constants)
    with PassContext(binding_split_bytes=1024):  # the constant is one binding: 5 arguments fit
        check_unchanged(split_wide_concats, before, _feeds(4, 64), constants)


def test_concats_that_fit_and_other_ops_are_left_alone() -> None:
    """Seven arguments fill a kernel exactly; an add chain of many inputs is fusion's to bound."""
    signature = _signature(7, "(n, 2)", "(n, 14)")
    text = signature + f'''
        y: Tensor((n, 14), "float32") = concat({_names(0, 7)}, axis=1)
        output(y)
    return y
'''
    check_unchanged(split_wide_concats, text, _feeds(7, 3, 2))
