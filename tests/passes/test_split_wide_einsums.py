"""split_wide_einsums: an einsum of more operands than a kernel binds (7 operands and its
result: WebGPU's default of 8 storage buffers) becomes a chain: the leading operands that fit
are contracted into an intermediate that keeps the subscripts still used later, until the
einsum fits; an ellipsis stays in the intermediate; einsums that fit are left alone."""

from __future__ import annotations

import numpy as np

from relaxweb.passes.split_wide_einsums import split_wide_einsums
from tests.helpers import rand
from tests.passes.rewrite import check_rewrite, check_unchanged

LETTERS = "abcdefghijklmnopqrstuvwxyz"


def _names(first: int, last: int) -> str:
    return ", ".join(f"x{i}" for i in range(first, last))


def _chain(first: int, last: int) -> str:
    """The terms of a chain of matrices x_first .. x_(last-1): ab,bc,cd,..."""
    return ",".join(LETTERS[i] + LETTERS[i + 1] for i in range(first, last))


def _signature(shapes: list[str], result: str) -> str:
    params = ", ".join(f'x{i}: Tensor({shape}, "float32")' for i, shape in enumerate(shapes))
    inputs = ", ".join(f'"x{i}"' for i in range(len(shapes)))
    return f'''
@function(inputs=[{inputs}], outputs=["y"])
def main({params}) -> Tensor({result}, "float32"):
    with dataflow():
'''


def _feeds(shapes: list[tuple[int, ...]]) -> dict[str, np.ndarray]:
    return {f"x{i}": rand(*shape, seed=i) * 0.5 for i, shape in enumerate(shapes)}


def test_a_chain_of_nine_matrices_takes_two_einsums() -> None:
    """x0..x6 are contracted first, keeping a (the output's) and h (x7's); the last einsum reads the three."""
    signature = _signature(["(n, 3)"] + ["(3, 3)"] * 8, "(n, 3)")
    before = signature + f'''
        y: Tensor((n, 3), "float32") = einsum({_names(0, 9)}, equation="{_chain(0, 9)}->aj")
        output(y)
    return y
'''
    expected = signature + f'''
        y_part: Tensor((n, 3), "float32") = einsum({_names(0, 7)}, equation="{_chain(0, 7)}->ah")
        y: Tensor((n, 3), "float32") = einsum(y_part, x7, x8, equation="ah,hi,ij->aj")
        output(y)
    return y
'''
    check_rewrite(split_wide_einsums, before, expected, [_feeds([(2, 3)] + [(3, 3)] * 8), _feeds([(1, 3)] + [(3, 3)] * 8)])


def test_twenty_operands_take_three_links_and_an_implicit_output_is_spelled_out() -> None:
    """No "->": the output is the subscripts used once, in order (a and u); each link keeps a
    and the subscript it shares with the next operand."""
    shapes = [(2, 1), (1, 2)] * 10  # extents of 1 keep the reference's 21 nested sums cheap
    signature = _signature([f"({a}, {b})" for a, b in shapes], "(2, 2)")
    before = signature + f'''
        y: Tensor((2, 2), "float32") = einsum({_names(0, 20)}, equation="{_chain(0, 20)}")
        output(y)
    return y
'''
    expected = signature + f'''
        y_part: Tensor((2, 1), "float32") = einsum({_names(0, 7)}, equation="{_chain(0, 7)}->ah")
        y_part1: Tensor((2, 1), "float32") = einsum(y_part, {_names(7, 13)}, equation="ah,{_chain(7, 13)}->an")
        y_part2: Tensor((2, 1), "float32") = einsum(y_part1, {_names(13, 19)}, equation="an,{_chain(13, 19)}->at")
        y: Tensor((2, 2), "float32") = einsum(y_part2, x19, equation="at,tu->au")
        output(y)
    return y
'''
    check_rewrite(split_wide_einsums, before, expected, _feeds(shapes))


def test_an_ellipsis_is_kept_in_the_intermediate() -> None:
    """Eight operands, seven with batch dims: the intermediate keeps "..." for the output."""
    shapes = ["(b, 2, 2)"] * 7 + ["(2, 2)"]
    signature = _signature(shapes, "(b, 2, 2)")
    terms = ",".join(f"...{LETTERS[i]}{LETTERS[i + 1]}" for i in range(7)) + ",hi"
    before = signature + f'''
        y: Tensor((b, 2, 2), "float32") = einsum({_names(0, 8)}, equation="{terms}->...ai")
        output(y)
    return y
'''
    expected = signature + f'''
        y_part: Tensor((b, 2, 2), "float32") = einsum({_names(0, 7)}, equation="{terms[:-3]}->...ah")
        y: Tensor((b, 2, 2), "float32") = einsum(y_part, x7, equation="...ah,hi->...ai")
        output(y)
    return y
'''
    feeds = _feeds([(3, 2, 2)] * 7 + [(2, 2)])
    check_rewrite(split_wide_einsums, before, expected, feeds)


def test_einsums_that_fit_are_left_alone() -> None:
    """Seven operands fill a kernel exactly."""
    signature = _signature(["(2, 2)"] * 7, "(2, 2)")
    text = signature + f'''
        y: Tensor((2, 2), "float32") = einsum({_names(0, 7)}, equation="{_chain(0, 7)}->ah")
        output(y)
    return y
'''
    check_unchanged(split_wide_einsums, text, _feeds([(2, 2)] * 7))
