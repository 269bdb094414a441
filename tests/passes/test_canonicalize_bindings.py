"""canonicalize_bindings: uses of aliases read the value they name; dead pure bindings go.

What the pass promises (relaxweb/passes/canonicalize_bindings.py): every use of an alias
bound in a dataflow block (``b = a``, a tuple's item) reads what it names, as long as that
is visible wherever the alias is read; then the dataflow bindings nothing reads and that are
pure (aliases, tuples, tensor-program calls) are removed, until none is left, and so are the
programs nothing calls any more.  Bindings outside dataflow blocks, ``match_cast`` and
library calls stay.
"""

from __future__ import annotations

import numpy as np

from relaxweb.ir import FunctionBuilder, IRModule, SizeVar, TensorStructInfo
from relaxweb.ir.expr import Tuple, TupleGetItem
from relaxweb.ir.interpreter import run_module
from relaxweb.ir.structural import assert_structural_equal
from relaxweb.ops import call_op
from relaxweb.passes import canonicalize_bindings, fuse_ops, legalize_ops
from tests.helpers import assert_close, rand
from tests.passes.rewrite import ADD, EXP, NEGATIVE, RELU, check_rewrite, check_unchanged

n, m = SizeVar("n"), SizeVar("m")


def test_canonicalize_bindings_reads_values_where_computed_and_drops_dead_ones() -> None:
    """The tuple, its items and the alias go; so does the call nothing reads; add reads
    relu's and exp's results directly."""
    before = RELU + EXP + ADD + '''
@function(inputs=["x"], outputs=["y"])
def main(x: Tensor((n, 4), "float32")) -> Tensor((n, 4), "float32"):
    with dataflow():
        a: Tensor((n, 4), "float32") = call_tir("relu", (x,), sizes={"n": n})
        b: Tensor((n, 4), "float32") = call_tir("exp", (x,), sizes={"n": n})
        parts: Tuple(Tensor((n, 4), "float32"), Tensor((n, 4), "float32")) = (a, b)
        first: Tensor((n, 4), "float32") = parts[0]
        second: Tensor((n, 4), "float32") = parts[1]
        alias: Tensor((n, 4), "float32") = first
        unused: Tensor((n, 4), "float32") = call_tir("exp", (alias,), sizes={"n": n})
        y: Tensor((n, 4), "float32") = call_tir("add", (alias, second), sizes={"n": n})
        output(y)
    return y
'''
    expected = RELU + EXP + ADD + '''
@function(inputs=["x"], outputs=["y"])
def main(x: Tensor((n, 4), "float32")) -> Tensor((n, 4), "float32"):
    with dataflow():
        a: Tensor((n, 4), "float32") = call_tir("relu", (x,), sizes={"n": n})
        b: Tensor((n, 4), "float32") = call_tir("exp", (x,), sizes={"n": n})
        y: Tensor((n, 4), "float32") = call_tir("add", (a, b), sizes={"n": n})
        output(y)
    return y
'''
    check_rewrite(canonicalize_bindings, before, expected, {"x": rand(3, 4)})


def test_canonicalize_bindings_keeps_aliases_that_leave_the_block_and_bindings_outside_it() -> None:
    """first (read after the block) would read a, local to the block: it stays ``first = a``,
    and the tuple it was an item of goes.  A chain of dead calls goes as a whole (negative,
    which only it called, leaves the module).  Outside the dataflow block nothing changes:
    the plain alias, the call nothing reads, the alias in the If branch."""
    outside = '''
    copy: Tensor((n, 4), "float32") = first
    unused: Tensor((n, 4), "float32") = call_tir("exp", (copy,), sizes={"n": n})
    y: Tensor((n, 4), "float32")
    if flag:
        inner: Tensor((n, 4), "float32") = copy
        t: Tensor((n, 4), "float32") = call_tir("relu", (inner,), sizes={"n": n})
        y = t
    else:
        u: Tensor((n, 4), "float32") = call_tir("exp", (copy,), sizes={"n": n})
        y = u
    return (first, y)
'''
    signature = '''
@function(inputs=["x", "flag"], outputs=["first", "y"])
def main(x: Tensor((n, 4), "float32"), flag: Tensor((), "bool")) -> Tuple(Tensor((n, 4), "float32"), Tensor((n, 4), "float32")):
'''
    before = RELU + EXP + NEGATIVE + signature + '''
    with dataflow():
        a: Tensor((n, 4), "float32") = call_tir("relu", (x,), sizes={"n": n})
        b: Tensor((n, 4), "float32") = call_tir("exp", (x,), sizes={"n": n})
        parts: Tuple(Tensor((n, 4), "float32"), Tensor((n, 4), "float32")) = (a, b)
        first: Tensor((n, 4), "float32") = parts[0]
        second: Tensor((n, 4), "float32") = parts[1]
        dead: Tensor((n, 4), "float32") = call_tir("negative", (second,), sizes={"n": n})
        deader: Tensor((n, 4), "float32") = call_tir("relu", (dead,), sizes={"n": n})
        output(first)''' + outside
    expected = RELU + EXP + signature + '''
    with dataflow():
        a: Tensor((n, 4), "float32") = call_tir("relu", (x,), sizes={"n": n})
        first: Tensor((n, 4), "float32") = a
        output(first)''' + outside
    x = rand(3, 4)
    check_rewrite(canonicalize_bindings, before, expected, [{"x": x, "flag": np.array(True)}, {"x": x, "flag": np.array(False)}])


def test_canonicalize_bindings_keeps_match_cast_and_library_calls() -> None:
    """A library call nothing reads stays (it is not pure), and so do both match_casts
    (checks); the alias of one reads the cast variable, never what the cast checked."""
    programs = '''
@library_kernel(builder="unique_count", args={"name": "unique_count", "length": sym(k), "dtype": "float32"})
def unique_count(values: Buffer((k,), "float32"), out: Buffer((1,), "int32")): ...
''' + RELU + EXP
    block = '''
@function(inputs=["x", "flat"], outputs=["y"])
def main(x: Tensor((n, 4), "float32"), flat: Tensor((k,), "float32")) -> Tensor((m, 4), "float32"):
    with dataflow():
        counted: Tensor((1,), "int32") = call_library("unique_count", (flat,), sizes={"k": k})
        a: Tensor((n, 4), "float32") = call_tir("relu", (x,), sizes={"n": n})
        checked: Tensor((m, 4), "float32") = match_cast(a, Tensor((m, 4), "float32"))
        unread: Tensor((m, 4), "float32") = match_cast(a, Tensor((m, 4), "float32"))
'''
    before = programs + block + '''        alias: Tensor((m, 4), "float32") = checked
        y: Tensor((m, 4), "float32") = call_tir("exp", (alias,), sizes={"n": m})
        output(y)
    return y
'''
    expected = programs + block + '''        y: Tensor((m, 4), "float32") = call_tir("exp", (checked,), sizes={"n": m})
        output(y)
    return y
'''
    check_rewrite(canonicalize_bindings, before, expected, {"x": rand(3, 4), "flat": rand(5, seed=1)})


def test_canonicalize_bindings_keeps_every_use_in_scope() -> None:
    """hidden is local to the dataflow block and out is read after it (by the result): out
    cannot be replaced by hidden, so nothing changes."""
    text = RELU + '''
@function(inputs=["x"], outputs=["out"])
def main(x: Tensor((n, 4), "float32")) -> Tensor((n, 4), "float32"):
    with dataflow():
        hidden: Tensor((n, 4), "float32") = call_tir("relu", (x,), sizes={"n": n})
        out: Tensor((n, 4), "float32") = hidden
        output(out)
    return out
'''
    check_unchanged(canonicalize_bindings, text, {"x": rand(2, 4)})


def test_canonicalize_bindings_reads_through_tuples_and_aliases() -> None:
    builder = FunctionBuilder("main")
    x = builder.add_param("x", TensorStructInfo((n, 4), "float32"))
    a = builder.emit(call_op("relu", x), "a")
    b = builder.emit(call_op("tanh", x), "b")
    parts = builder.emit(Tuple((a, b)), "parts")
    first = builder.emit(TupleGetItem(parts, 0), "first")
    second = builder.emit(TupleGetItem(parts, 1), "second")
    total = builder.emit(call_op("add", first, second), "total")
    alias = builder.emit(total, "alias")
    out = builder.emit(call_op("exp", alias), "out", output=True)
    before = IRModule({"main": builder.finish([out], ["out"])})

    builder = FunctionBuilder("main")
    x = builder.add_param("x", TensorStructInfo((m, 4), "float32"))  # (input names are user-facing: compared as text)
    a = builder.emit(call_op("relu", x), "p")
    b = builder.emit(call_op("tanh", x), "q")
    total = builder.emit(call_op("add", a, b), "r")
    out = builder.emit(call_op("exp", total), "s", output=True)
    expected = IRModule({"main": builder.finish([out], ["out"])})

    after = canonicalize_bindings(before)
    assert_structural_equal(after, expected)
    value = rand(3, 4, seed=10)
    assert_close(run_module(after, {"x": value})[0], run_module(before, {"x": value})[0])
    # and fusion now sees relu and tanh as the add's producers: one kernel for everything
    assert len([b for b in fuse_ops(legalize_ops(after)).main.bindings()]) == 1
