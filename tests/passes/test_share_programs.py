"""share_programs: programs that differ only in integer literals become one, whose differing
literals are size variables each call site binds.

What the pass promises (relaxweb/passes/share_programs.py): programs with the same skeleton
(the program with its non-zero integer literals of index arithmetic taken out) are merged;
a literal with one value in every member stays a literal, differing ones become variables
``constant0``, ``constant1``..., and positions with the same values in every member share
one; every call site (``call_tir``, ``call_tir_into``, in If branches too) binds them to its
member's values; the module's attrs record the variables each shared program gained
(``shared_sizes``).  Members are grouped by their WebGPU schedule, and a group is left alone
when the shared program would not fit that schedule (a vectorized program's last dimension)
or would need more than ``MAX_NEW_VARIABLES``.
"""

from __future__ import annotations

import numpy as np

from relaxweb.passes import share_programs
from relaxweb.passes.share_programs import MAX_NEW_VARIABLES
from tests.helpers import rand
from tests.passes.rewrite import check_rewrite, check_unchanged

SHARED_SIZES_LINE = "attrs = {{\"shared_sizes\": {}}}\n"


def test_share_programs_turns_differing_literals_into_variables_the_call_sites_bind() -> None:
    """Two matmuls that differ only in their depth (4 and 6) become one program whose depth
    is a variable each call site binds; the column count (8 in both) stays a literal.  Two
    elementwise programs that differ in their last dimension stay apart: WebGPU's vectorized
    schedule fits both, but a variable there could not be shown to be a multiple of 4
    (tests/passes/test_schedule_programs.py has the schedules sharing keeps)."""
    matmul = '''
@tensor_program
def {name}(A: Buffer((n, {k}), "float32"), B: Buffer(({k}, 8), "float32"), out: Buffer((n, 8), "float32")):
    out[i0_, i1_] = sum((A[i0_, k_] * B[k_, i1_]) for k_ in range({k}))
'''
    relu = '''
@tensor_program
def {name}(A: Buffer((n, {m}), "float32"), out: Buffer((n, {m}), "float32")):
    out[i0_, i1_] = maximum(A[i0_, i1_], float32(0.0))
'''
    main = '''
@function(inputs=["x", "y"], outputs=["a", "b", "c", "d"])
def main(x: Tensor((n, 4), "float32"), y: Tensor((n, 6), "float32")) -> Tuple(Tensor((n, 8), "float32"), Tensor((n, 8), "float32"), Tensor((n, 8), "float32"), Tensor((n, 4), "float32")):
    with dataflow():
        a: Tensor((n, 8), "float32") = call_tir("matmul", (x, const("w")), sizes={{"n": n{first}}})
        b: Tensor((n, 8), "float32") = call_tir("{second}", (y, const("v")), sizes={{"n": n{other}}})
        c: Tensor((n, 8), "float32") = call_tir("relu", (a,), sizes={{"n": n}})
        d: Tensor((n, 4), "float32") = call_tir("relu1", (x,), sizes={{"n": n}})
        output(a, b, c, d)
    return (a, b, c, d)
'''
    relus = relu.format(name="relu", m=8) + relu.format(name="relu1", m=4)
    before = (matmul.format(name="matmul", k=4) + matmul.format(name="matmul1", k=6) + relus
              + main.format(first="", second="matmul1", other=""))
    expected = (SHARED_SIZES_LINE.format('{"matmul": ("constant0",)}') + matmul.format(name="matmul", k="constant0")
                + relus
                + main.format(first=', "constant0": 4', second="matmul", other=', "constant0": 6'))
    inputs = {"x": rand(3, 4), "y": rand(3, 6, seed=1)}
    constants = {"w": rand(4, 8, seed=2), "v": rand(6, 8, seed=3)}
    check_rewrite(share_programs, before, expected, inputs, constants)


def test_share_programs_gives_positions_of_equal_values_one_variable_and_redirects_if_branches() -> None:
    """The width is a shape of A and of the output (5 in one program, 7 in the other): one
    variable for both; B's shape 3 and the index 2 are the same in both: literals.  The call
    in the If branch binds the variable too.  (Widths that are not multiples of 4: both
    programs and the shared one get WebGPU's element schedule, so sharing keeps nothing apart.)"""
    shift = '''
@tensor_program
def {name}(A: Buffer((n, {width}), "float32"), B: Buffer((3,), "float32"), out: Buffer((n, {width}), "float32")):
    out[i0_, i1_] = (A[i0_, i1_] + B[2])
'''
    main = '''
@function(inputs=["x", "y", "flag"], outputs=["a", "b"])
def main(x: Tensor((n, 5), "float32"), y: Tensor((n, 7), "float32"), flag: Tensor((), "bool")) -> Tuple(Tensor((n, 5), "float32"), Tensor((n, 7), "float32")):
    with dataflow():
        a: Tensor((n, 5), "float32") = call_tir("shift5", (x, const("b")), sizes={{"n": n{four}}})
        output(a)
    b: Tensor((n, 7), "float32")
    if flag:
        t: Tensor((n, 7), "float32") = call_tir("{six}", (y, const("b")), sizes={{"n": n{six_sizes}}})
        b = t
    else:
        b = y
    return (a, b)
'''
    before = (shift.format(name="shift5", width=5) + shift.format(name="shift7", width=7)
              + main.format(four="", six="shift7", six_sizes=""))
    expected = (SHARED_SIZES_LINE.format('{"shift5": ("constant0",)}') + shift.format(name="shift5", width="constant0")
                + main.format(four=', "constant0": 5', six="shift5", six_sizes=', "constant0": 7'))
    x, y = rand(2, 5), rand(2, 7, seed=1)
    inputs = [{"x": x, "y": y, "flag": np.array(True)}, {"x": x, "y": y, "flag": np.array(False)}]
    check_rewrite(share_programs, before, expected, inputs, {"b": rand(3, seed=2)})


def test_share_programs_redirects_calls_into_storages() -> None:
    """After memory planning, call_tir_into sites are redirected and bind the variable alike
    (lengths 5 and 7: element programs on WebGPU, like the shared one)."""
    negate = '''
@tensor_program
def {name}(A: Buffer(({width},), "float32"), out: Buffer(({width},), "float32")):
    out[i0_] = negative(A[i0_])
'''
    main = '''
@function(inputs=["x", "y"], outputs=["a", "b"])
def main(x: Tensor((5,), "float32"), y: Tensor((7,), "float32")) -> Tuple(Tensor((5,), "float32"), Tensor((7,), "float32")):
    first: Object = alloc_storage(20)
    second: Object = alloc_storage(28)
    a: Tensor((5,), "float32") = alloc_tensor(first)
    ran_a: Tuple() = call_tir_into("negate5", (x,), out=a{four})
    b: Tensor((7,), "float32") = alloc_tensor(second)
    ran_b: Tuple() = call_tir_into("{six}", (y,), out=b{six_sizes})
    return (a, b)
'''
    before = negate.format(name="negate5", width=5) + negate.format(name="negate7", width=7) + main.format(
        four="", six="negate7", six_sizes="")
    expected = (SHARED_SIZES_LINE.format('{"negate5": ("constant0",)}') + negate.format(name="negate5", width="constant0")
                + main.format(four=', sizes={"constant0": 5}', six="negate5", six_sizes=', sizes={"constant0": 7}'))
    check_rewrite(share_programs, before, expected, {"x": rand(5), "y": rand(7, seed=1)})


def test_share_programs_leaves_groups_needing_too_many_variables_and_other_bodies_alone() -> None:
    """Sums of 17 single elements at other indices would need 17 variables (one more than
    MAX_NEW_VARIABLES); a program of another body has no partner."""
    assert MAX_NEW_VARIABLES == 16

    def taps(name: str, first: int) -> str:
        loads = " + ".join(f"A[{index}]" for index in range(first, first + 17))
        return f'''
@tensor_program
def {name}(A: Buffer((40,), "float32"), out: Buffer((1,), "float32")):
    out[i0_] = ({loads})
'''

    text = taps("low", 1) + taps("high", 18) + '''
@tensor_program
def first(A: Buffer((40,), "float32"), out: Buffer((1,), "float32")):
    out[i0_] = negative(A[3])

@function(inputs=["x"], outputs=["a", "b", "c"])
def main(x: Tensor((40,), "float32")) -> Tuple(Tensor((1,), "float32"), Tensor((1,), "float32"), Tensor((1,), "float32")):
    with dataflow():
        a: Tensor((1,), "float32") = call_tir("low", (x,))
        b: Tensor((1,), "float32") = call_tir("high", (x,))
        c: Tensor((1,), "float32") = call_tir("first", (x,))
        output(a, b, c)
    return (a, b, c)
'''
    check_unchanged(share_programs, text, {"x": rand(40)})


def test_share_programs_keeps_apart_programs_webgpu_lays_out_differently() -> None:
    """Matmuls of 48 rows (32x32 tiles: most of a 64 tile would be padding) and of 100 rows
    (64x64 tiles) differ only in the row count, but a shared program would have one WebGPU
    schedule for both: they stay apart (48 and 40 rows share, keeping their 32x32 tiles:
    tests/passes/test_schedule_programs.py)."""
    program = '''
@tensor_program
def {name}(A: Buffer(({rows}, 4), "float32"), B: Buffer((4, n), "float32"), out: Buffer(({rows}, n), "float32")):
    out[i0_, i1_] = sum((A[i0_, k_] * B[k_, i1_]) for k_ in range(4))
'''
    main = '''
@function(inputs=["x", "y", "w"], outputs=["a", "b"])
def main(x: Tensor((48, 4), "float32"), y: Tensor((100, 4), "float32"), w: Tensor((4, n), "float32")) -> Tuple(Tensor((48, n), "float32"), Tensor((100, n), "float32")):
    with dataflow():
        a: Tensor((48, n), "float32") = call_tir("few", (x, w), sizes={"n": n})
        b: Tensor((100, n), "float32") = call_tir("many", (y, w), sizes={"n": n})
        output(a, b)
    return (a, b)
'''
    text = program.format(name="few", rows=48) + program.format(name="many", rows=100) + main
    check_unchanged(share_programs, text, {"x": rand(48, 4), "y": rand(100, 4, seed=1), "w": rand(4, 5, seed=2)})
