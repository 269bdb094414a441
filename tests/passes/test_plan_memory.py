"""plan_memory: every tensor gets a storage, and storages of dead tensors are reused.

What the pass promises (relaxweb/passes/plan_memory.py): each ``call_tir`` becomes
``alloc_tensor`` of a storage and ``call_tir_into`` it, with every ``alloc_storage`` at the
top of a function that is no dataflow block any more.  A tensor's storage is free after the
last use of the tensor or of an alias of it (match_cast, tuples, items); a new tensor takes
a free storage of provably the same size, else the smallest provably larger, else the
largest provably smaller (grown), else any (grown to the max), comparing sizes under the
user's bounds; never one an input of its own call is in.  An If gets one storage, that each
branch's last call writes; a Loop gets one per carried and stacked value and is rewritten
into the form that writes them (``loop_carry``, ``loop_stack_row``); a KV cache lives in its
past input's storage, its new rows written in place.  ``storage_reuse=False``: a storage per
tensor.
"""

from __future__ import annotations

import numpy as np
import pytest

from relaxweb.ir import AllocStorage, AllocTensor, CallTIRInto, FunctionBuilder, TensorStructInfo, Var
from relaxweb.ir.expr import BindingBlock, DataflowBlock, Function, SeqExpr, VarBinding
from relaxweb.ir.interpreter import run_module
from relaxweb.ir.symbolic import Analyzer, evaluate, format_expr
from relaxweb.ops import call_op
from relaxweb.passes import PassContext, legalize_ops, plan_memory
from relaxweb.passes.plan_memory import _Planner, _Storage
from tests.helpers import assert_close, rand
from tests.passes.graphs import chain_module, m, mlp_module, module_of, n
from tests.passes.rewrite import EXP, NEGATIVE, RELU, TANH, check_rewrite

CHAIN = RELU + TANH + EXP + NEGATIVE  # relu -> tanh -> exp -> negative of x[n, 4]


def test_plan_memory_alternates_two_storages_along_a_chain() -> None:
    """relu -> tanh -> exp -> negative: each result can reuse the storage of the value
    before the previous one, which is dead by then."""
    before = CHAIN + '''
@function(inputs=["x"], outputs=["d"])
def main(x: Tensor((n, 4), "float32")) -> Tensor((n, 4), "float32"):
    with dataflow():
        a: Tensor((n, 4), "float32") = call_tir("relu", (x,), sizes={"n": n})
        b: Tensor((n, 4), "float32") = call_tir("tanh", (a,), sizes={"n": n})
        c: Tensor((n, 4), "float32") = call_tir("exp", (b,), sizes={"n": n})
        d: Tensor((n, 4), "float32") = call_tir("negative", (c,), sizes={"n": n})
        output(d)
    return d
'''
    expected = CHAIN + '''
@function(inputs=["x"], outputs=["d"])
def main(x: Tensor((n, 4), "float32")) -> Tensor((n, 4), "float32"):
    even: Object = alloc_storage(n * 16)
    odd: Object = alloc_storage(n * 16)
    a: Tensor((n, 4), "float32") = alloc_tensor(even)
    ran_relu: Tuple() = call_tir_into("relu", (x,), out=a, sizes={"n": n})
    b: Tensor((n, 4), "float32") = alloc_tensor(odd)
    ran_tanh: Tuple() = call_tir_into("tanh", (a,), out=b, sizes={"n": n})
    c: Tensor((n, 4), "float32") = alloc_tensor(even)
    ran_exp: Tuple() = call_tir_into("exp", (b,), out=c, sizes={"n": n})
    d: Tensor((n, 4), "float32") = alloc_tensor(odd)
    ran_negative: Tuple() = call_tir_into("negative", (c,), out=d, sizes={"n": n})
    return d
'''
    check_rewrite(plan_memory, before, expected, {"x": rand(5, 4)})


def test_plan_memory_gives_every_tensor_its_own_storage_without_reuse() -> None:
    before = CHAIN + '''
@function(inputs=["x"], outputs=["c"])
def main(x: Tensor((n, 4), "float32")) -> Tensor((n, 4), "float32"):
    with dataflow():
        a: Tensor((n, 4), "float32") = call_tir("relu", (x,), sizes={"n": n})
        b: Tensor((n, 4), "float32") = call_tir("tanh", (a,), sizes={"n": n})
        c: Tensor((n, 4), "float32") = call_tir("exp", (b,), sizes={"n": n})
        output(c)
    return c
'''
    expected = CHAIN + '''
@function(inputs=["x"], outputs=["c"])
def main(x: Tensor((n, 4), "float32")) -> Tensor((n, 4), "float32"):
    first: Object = alloc_storage(n * 16)
    second: Object = alloc_storage(n * 16)
    third: Object = alloc_storage(n * 16)
    a: Tensor((n, 4), "float32") = alloc_tensor(first)
    ran_relu: Tuple() = call_tir_into("relu", (x,), out=a, sizes={"n": n})
    b: Tensor((n, 4), "float32") = alloc_tensor(second)
    ran_tanh: Tuple() = call_tir_into("tanh", (a,), out=b, sizes={"n": n})
    c: Tensor((n, 4), "float32") = alloc_tensor(third)
    ran_exp: Tuple() = call_tir_into("exp", (b,), out=c, sizes={"n": n})
    return c
'''
    with PassContext(storage_reuse=False):
        check_rewrite(plan_memory, before, expected, {"x": rand(5, 4)})


def test_plan_grows_a_free_storage_to_the_larger_size() -> None:
    """a and b take n * 8 bytes each; c (n * 64) takes a's storage, free and provably
    smaller, grown; d takes b's, grown too."""
    programs = '''
@tensor_program
def narrow(A: Buffer((n, 8), "float32"), B: Buffer((8, 2), "float32"), out: Buffer((n, 2), "float32")):
    out[i0_, i1_] = sum((A[i0_, k_] * B[k_, i1_]) for k_ in range(8))

@tensor_program
def relu(A: Buffer((n, 2), "float32"), out: Buffer((n, 2), "float32")):
    out[i0_, i1_] = maximum(A[i0_, i1_], float32(0.0))

@tensor_program
def widen(A: Buffer((n, 2), "float32"), B: Buffer((2, 16), "float32"), out: Buffer((n, 16), "float32")):
    out[i0_, i1_] = sum((A[i0_, k_] * B[k_, i1_]) for k_ in range(2))

@tensor_program
def relu1(A: Buffer((n, 16), "float32"), out: Buffer((n, 16), "float32")):
    out[i0_, i1_] = maximum(A[i0_, i1_], float32(0.0))
'''
    before = programs + '''
@function(inputs=["x"], outputs=["d"])
def main(x: Tensor((n, 8), "float32")) -> Tensor((n, 16), "float32"):
    with dataflow():
        a: Tensor((n, 2), "float32") = call_tir("narrow", (x, const("w1")), sizes={"n": n})
        b: Tensor((n, 2), "float32") = call_tir("relu", (a,), sizes={"n": n})
        c: Tensor((n, 16), "float32") = call_tir("widen", (b, const("w2")), sizes={"n": n})
        d: Tensor((n, 16), "float32") = call_tir("relu1", (c,), sizes={"n": n})
        output(d)
    return d
'''
    expected = programs + '''
@function(inputs=["x"], outputs=["d"])
def main(x: Tensor((n, 8), "float32")) -> Tensor((n, 16), "float32"):
    first: Object = alloc_storage(n * 64)
    second: Object = alloc_storage(n * 64)
    a: Tensor((n, 2), "float32") = alloc_tensor(first)
    ran_a: Tuple() = call_tir_into("narrow", (x, const("w1")), out=a, sizes={"n": n})
    b: Tensor((n, 2), "float32") = alloc_tensor(second)
    ran_b: Tuple() = call_tir_into("relu", (a,), out=b, sizes={"n": n})
    c: Tensor((n, 16), "float32") = alloc_tensor(first)
    ran_c: Tuple() = call_tir_into("widen", (b, const("w2")), out=c, sizes={"n": n})
    d: Tensor((n, 16), "float32") = alloc_tensor(second)
    ran_d: Tuple() = call_tir_into("relu1", (c,), out=d, sizes={"n": n})
    return d
'''
    check_rewrite(plan_memory, before, expected, {"x": rand(3, 8)}, {"w1": rand(8, 2, seed=1), "w2": rand(2, 16, seed=2)})


@pytest.mark.parametrize("bounds, reused_size", [({"n": 64}, "256"), ({}, "max(n * 4, 256)")], ids=["n <= 64", "unbounded"])
def test_plan_memory_compares_sizes_under_the_bounds(bounds: dict, reused_size: str) -> None:
    """c (n * 4 bytes) takes a's storage (256 bytes), free by then: with n <= 64 it is
    provably large enough as it is; without a bound it grows to the larger of both."""
    programs = '''
@tensor_program
def spread(A: Buffer((n,), "float32"), out: Buffer((64,), "float32")):
    out[i0_] = A[0]

@tensor_program
def negative(A: Buffer((64,), "float32"), out: Buffer((64,), "float32")):
    out[i0_] = negative(A[i0_])

@tensor_program
def scale(A: Buffer((n,), "float32"), B: Buffer((64,), "float32"), out: Buffer((n,), "float32")):
    out[i0_] = (A[i0_] * B[0])
'''
    before = programs + '''
@function(inputs=["x"], outputs=["c"])
def main(x: Tensor((n,), "float32")) -> Tensor((n,), "float32"):
    with dataflow():
        a: Tensor((64,), "float32") = call_tir("spread", (x,), sizes={"n": n})
        b: Tensor((64,), "float32") = call_tir("negative", (a,))
        c: Tensor((n,), "float32") = call_tir("scale", (x, b), sizes={"n": n})
        output(c)
    return c
'''
    expected = programs + f'''
@function(inputs=["x"], outputs=["c"])
def main(x: Tensor((n,), "float32")) -> Tensor((n,), "float32"):
    first: Object = alloc_storage({reused_size})
    second: Object = alloc_storage(256)
    a: Tensor((64,), "float32") = alloc_tensor(first)
    ran_a: Tuple() = call_tir_into("spread", (x,), out=a, sizes={{"n": n}})
    b: Tensor((64,), "float32") = alloc_tensor(second)
    ran_b: Tuple() = call_tir_into("negative", (a,), out=b)
    c: Tensor((n,), "float32") = alloc_tensor(first)
    ran_c: Tuple() = call_tir_into("scale", (x, b), out=c, sizes={{"n": n}})
    return c
'''
    with PassContext(bounds=bounds):
        check_rewrite(plan_memory, before, expected, [{"x": rand(5)}, {"x": rand(64, seed=1)}])


def test_plan_memory_holds_a_storage_while_an_alias_of_its_tensor_lives() -> None:
    """a is not read after its match_cast, but checked (an alias of it, in a's storage) is
    read by c: b cannot take a's storage; c cannot take the storage of an input of its own
    call, so it takes a third."""
    programs = RELU + TANH + '''
@tensor_program
def add(A: Buffer((m, 4), "float32"), B: Buffer((n, 4), "float32"), out: Buffer((m, 4), "float32")):
    out[i0_, i1_] = (A[i0_, i1_] + B[i0_, i1_])
'''
    before = programs + '''
@function(inputs=["x"], outputs=["c"])
def main(x: Tensor((n, 4), "float32")) -> Tensor((m, 4), "float32"):
    with dataflow():
        a: Tensor((n, 4), "float32") = call_tir("relu", (x,), sizes={"n": n})
        checked: Tensor((m, 4), "float32") = match_cast(a, Tensor((m, 4), "float32"))
        b: Tensor((n, 4), "float32") = call_tir("tanh", (x,), sizes={"n": n})
        c: Tensor((m, 4), "float32") = call_tir("add", (checked, b), sizes={"m": m, "n": n})
        output(c)
    return c
'''
    expected = programs + '''
@function(inputs=["x"], outputs=["c"])
def main(x: Tensor((n, 4), "float32")) -> Tensor((m, 4), "float32"):
    first: Object = alloc_storage(n * 16)
    second: Object = alloc_storage(n * 16)
    third: Object = alloc_storage(m * 16)
    a: Tensor((n, 4), "float32") = alloc_tensor(first)
    ran_a: Tuple() = call_tir_into("relu", (x,), out=a, sizes={"n": n})
    checked: Tensor((m, 4), "float32") = match_cast(a, Tensor((m, 4), "float32"))
    b: Tensor((n, 4), "float32") = alloc_tensor(second)
    ran_b: Tuple() = call_tir_into("tanh", (x,), out=b, sizes={"n": n})
    c: Tensor((m, 4), "float32") = alloc_tensor(third)
    ran_c: Tuple() = call_tir_into("add", (checked, b), out=c, sizes={"m": m, "n": n})
    return c
'''
    check_rewrite(plan_memory, before, expected, {"x": rand(3, 4)})


def test_plan_memory_gives_an_if_one_storage_its_branches_write() -> None:
    """y's storage is written by the last call of each branch; t, a temporary of one branch,
    takes a storage of its own (a is still read by the branches)."""
    programs = RELU + EXP + TANH + NEGATIVE
    before = programs + '''
@function(inputs=["x", "flag"], outputs=["y"])
def main(x: Tensor((n, 4), "float32"), flag: Tensor((), "bool")) -> Tensor((n, 4), "float32"):
    with dataflow():
        a: Tensor((n, 4), "float32") = call_tir("relu", (x,), sizes={"n": n})
        output(a)
    y: Tensor((n, 4), "float32")
    if flag:
        t: Tensor((n, 4), "float32") = call_tir("exp", (a,), sizes={"n": n})
        u: Tensor((n, 4), "float32") = call_tir("tanh", (t,), sizes={"n": n})
        y = u
    else:
        v: Tensor((n, 4), "float32") = call_tir("negative", (a,), sizes={"n": n})
        y = v
    return y
'''
    expected = programs + '''
@function(inputs=["x", "flag"], outputs=["y"])
def main(x: Tensor((n, 4), "float32"), flag: Tensor((), "bool")) -> Tensor((n, 4), "float32"):
    for_a: Object = alloc_storage(n * 16)
    for_y: Object = alloc_storage(n * 16)
    for_t: Object = alloc_storage(n * 16)
    a: Tensor((n, 4), "float32") = alloc_tensor(for_a)
    ran_a: Tuple() = call_tir_into("relu", (x,), out=a, sizes={"n": n})
    y: Tensor((n, 4), "float32")
    if flag:
        t: Tensor((n, 4), "float32") = alloc_tensor(for_t)
        ran_t: Tuple() = call_tir_into("exp", (a,), out=t, sizes={"n": n})
        u: Tensor((n, 4), "float32") = alloc_tensor(for_y)
        ran_u: Tuple() = call_tir_into("tanh", (t,), out=u, sizes={"n": n})
        y = u
    else:
        v: Tensor((n, 4), "float32") = alloc_tensor(for_y)
        ran_v: Tuple() = call_tir_into("negative", (a,), out=v, sizes={"n": n})
        y = v
    return y
'''
    x = rand(3, 4)
    check_rewrite(plan_memory, before, expected, [{"x": x, "flag": np.array(True)}, {"x": x, "flag": np.array(False)}])


def test_plan_memory_writes_a_loops_carried_and_stacked_values_into_their_storages() -> None:
    """Carried c, d, e each get a storage and their initial value copied in; the stacked
    relu(c) gets [3, n, 4].  Each iteration writes its row, then the next values: c's is d,
    another carried value, so it goes through a temporary first (d is overwritten too); e is
    carried through unchanged and is not copied.  The loop's value is the storages' tensors."""
    carry = '''
@tensor_program
def loop_carry(A: Buffer((n, 4), "float32"), out: Buffer((n, 4), "float32")):
    out[i0_, i1_] = A[i0_, i1_]

@library_kernel(builder="write_row", args={"name": "loop_stack_row", "rows": sym(3), "row_shape": (sym(n), sym(4)), "dtype": "float32", "row": "i"})
def loop_stack_row(value: Buffer((n, 4), "float32"), out: Buffer((3, n, 4), "float32")): ...
'''
    signature = '''
@function(inputs=["x", "z"], outputs=["y", "w", "e", "s"])
def main(x: Tensor((n, 4), "float32"), z: Tensor((n, 4), "float32")) -> Tuple(Tensor((n, 4), "float32"), Tensor((n, 4), "float32"), Tensor((n, 4), "float32"), Tensor((3, n, 4), "float32")):
    looped: Tuple(Tensor((n, 4), "float32"), Tensor((n, 4), "float32"), Tensor((n, 4), "float32"), Tensor((3, n, 4), "float32"))
'''
    results = '''
    y: Tensor((n, 4), "float32") = looped[0]
    w: Tensor((n, 4), "float32") = looped[1]
    e2: Tensor((n, 4), "float32") = looped[2]
    s: Tensor((3, n, 4), "float32") = looped[3]
    return (y, w, e2, s)
'''
    before = RELU + signature + '''\
    for i, (c, d, e) in loop(3, init=(x, z, x), carried=(Tensor((n, 4), "float32"), Tensor((n, 4), "float32"), Tensor((n, 4), "float32"))):
        r: Tensor((n, 4), "float32") = call_tir("relu", (c,), sizes={"n": n})
        looped = (d, r, e, r)''' + results
    expected = RELU + carry + """
@function(inputs=["x", "z"], outputs=["y", "w", "e", "s"])
def main(x: Tensor((n, 4), "float32"), z: Tensor((n, 4), "float32")) -> Tuple(Tensor((n, 4), "float32"), Tensor((n, 4), "float32"), Tensor((n, 4), "float32"), Tensor((3, n, 4), "float32")):
    for_c: Object = alloc_storage(n * 16)
    for_d: Object = alloc_storage(n * 16)
    for_e: Object = alloc_storage(n * 16)
    for_s: Object = alloc_storage(n * 48)
    for_r: Object = alloc_storage(n * 16)
    for_next: Object = alloc_storage(n * 16)
    c: Tensor((n, 4), "float32") = alloc_tensor(for_c)
    copy_c: Tuple() = call_tir_into("loop_carry", (x,), out=c, sizes={"n": n})
    d: Tensor((n, 4), "float32") = alloc_tensor(for_d)
    copy_d: Tuple() = call_tir_into("loop_carry", (z,), out=d, sizes={"n": n})
    e: Tensor((n, 4), "float32") = alloc_tensor(for_e)
    copy_e: Tuple() = call_tir_into("loop_carry", (x,), out=e, sizes={"n": n})
    stacked: Tensor((3, n, 4), "float32") = alloc_tensor(for_s)
    planned: Tuple()
    for i in loop(3):
        r: Tensor((n, 4), "float32") = alloc_tensor(for_r)
        ran_r: Tuple() = call_tir_into("relu", (c,), out=r, sizes={"n": n})
        row: Tuple() = call_tir_into("loop_stack_row", (r,), out=stacked, sizes={"n": n, "i": i})
        next_c: Tensor((n, 4), "float32") = alloc_tensor(for_next)
        copy_next_c: Tuple() = call_tir_into("loop_carry", (d,), out=next_c, sizes={"n": n})
        into_c: Tuple() = call_tir_into("loop_carry", (next_c,), out=c, sizes={"n": n})
        into_d: Tuple() = call_tir_into("loop_carry", (r,), out=d, sizes={"n": n})
        planned = ()
    looped: Tuple(Tensor((n, 4), "float32"), Tensor((n, 4), "float32"), Tensor((n, 4), "float32"), Tensor((3, n, 4), "float32")) = (c, d, e, stacked)""" + results
    check_rewrite(plan_memory, before, expected, {"x": rand(2, 4), "z": rand(2, 4, seed=1)})


def test_plan_memory_writes_a_kv_caches_new_rows_in_place() -> None:
    """The cache and its view take no storage of their own (they live in past's); the new
    rows are written at row p by the cache writer, in place."""
    before = '''
@function(inputs=["past", "new"], outputs=["present"])
def main(past: Tensor((b, 3, p, 4), "float32"), new: Tensor((b, 3, 1, 4), "float32")) -> Tensor((b, 3, p + 1, 4), "float32"):
    with dataflow():
        cache: Tensor((b, 3, 7, 4), "float32") = kv_cache_write(past, new, axis=2, capacity=7)
        present: Tensor((b, 3, p + 1, 4), "float32") = kv_cache_view(cache, prim(p + 1), axis=2)
        output(present)
    return present
'''
    expected = '''
@library_kernel(builder="kv_cache_write", args={"name": "kv_cache_write", "outer": (sym(b), sym(3)), "length": sym(1), "inner": (sym(4),), "capacity": 7, "dtype": "float32", "offset": "offset_"})
def kv_cache_write(value: Buffer((b, 3, 1, 4), "float32"), out: Buffer((b, 3, 7, 4), "float32")): ...

@function(inputs=["past", "new"], outputs=["present"])
def main(past: Tensor((b, 3, p, 4), "float32"), new: Tensor((b, 3, 1, 4), "float32")) -> Tensor((b, 3, p + 1, 4), "float32"):
    cache: Tensor((b, 3, 7, 4), "float32") = kv_cache_write(past, new, axis=2, capacity=7)
    written: Tuple() = call_tir_into("kv_cache_write", (new,), out=cache, sizes={"b": b, "offset_": p})
    present: Tensor((b, 3, p + 1, 4), "float32") = kv_cache_view(cache, prim(p + 1), axis=2)
    return present
'''
    inputs = [{"past": rand(1, 3, length, 4, seed=length), "new": rand(1, 3, 1, 4, seed=9)} for length in (0, 6)]
    check_rewrite(plan_memory, before, expected, inputs)


# Modules built in Python -------------------------------------------------------------------------


def storages_of(function: Function) -> dict[Var, AllocStorage]:
    return {b.var: b.value for b in function.bindings() if isinstance(b.value, AllocStorage)}


def tensor_storage(function: Function) -> dict[Var, Var]:
    return {b.var: b.value.storage for b in function.bindings() if isinstance(b.value, AllocTensor)}


def assert_no_call_shares_storage_between_input_and_output(function: Function) -> None:
    placed = tensor_storage(function)
    for binding in function.bindings():
        if isinstance(binding.value, CallTIRInto):
            output_storage = placed[binding.value.output]
            for arg in binding.value.args:
                if isinstance(arg, Var) and arg in placed:
                    assert placed[arg] is not output_storage, (
                        f"{binding.value.output.name} is written into the storage of its input {arg.name}"
                    )


def test_plan_chain_of_four_uses_two_storages() -> None:
    planned = plan_memory(legalize_ops(chain_module()))
    main = planned.main
    storages = storages_of(main)
    assert len(storages) == 2
    assert [format_expr(s.size) for s in storages.values()] == ["n * 16", "n * 16"]
    placed = tensor_storage(main)
    names = {var.name: storage for var, storage in placed.items()}
    first, second = list(storages)
    assert [names[k] for k in "abcd"] == [first, second, first, second]
    assert_no_call_shares_storage_between_input_and_output(main)
    # the storages come first, then (alloc_tensor, call_tir_into) per call
    kinds = [type(b.value).__name__ for b in main.bindings()]
    assert kinds == ["AllocStorage"] * 2 + ["AllocTensor", "CallTIRInto"] * 4
    assert not isinstance(main.body.blocks[0], DataflowBlock)
    assert isinstance(main.body.blocks[0], BindingBlock)


def test_plan_mlp_storages() -> None:
    planned = plan_memory(legalize_ops(mlp_module()))
    main = planned.main
    sizes = [format_expr(s.size) for s in storages_of(main).values()]
    # h (n*32) and h_bias (n*32) are both alive at once; later tensors reuse their storages
    # (logits: a provably larger one), softmax_sum and y need new ones because everything
    # they read is still alive.
    assert sizes == ["n * 32", "n * 32", "n * 4", "n * 12"]
    assert_no_call_shares_storage_between_input_and_output(main)
    storage_index = {var: index for index, var in enumerate(storages_of(main))}
    placed = {var.name: storage_index[storage] for var, storage in tensor_storage(main).items()}
    assert placed == {
        "h": 0, "h_bias": 1, "h_relu": 0, "logits": 1, "logits_bias": 0,
        "softmax_max": 1, "softmax_sum": 2, "y": 3,
    }


def test_plan_tensor_never_lives_in_a_storage_too_small() -> None:
    planned = plan_memory(legalize_ops(mlp_module()))
    sizes = {var: s.size for var, s in storages_of(planned.main).items()}
    for binding in planned.main.bindings():
        if isinstance(binding.value, AllocTensor):
            info = binding.value.struct_info
            for rows in (0, 1, 7, 100):
                needed = int(np.prod([evaluate(d, {"n": rows}) for d in info.shape])) * 4
                assert evaluate(sizes[binding.value.storage], {"n": rows}) >= needed


def test_plan_keeps_two_inputs_of_one_call_apart() -> None:
    builder = FunctionBuilder("main")
    x = builder.add_param("x", TensorStructInfo((n, 4), "float32"))
    a = builder.emit(call_op("relu", x), "a")
    b = builder.emit(call_op("tanh", x), "b")
    c = builder.emit(call_op("add", a, b), "c")
    d = builder.emit(call_op("multiply", c, c), "d", output=True)
    planned = plan_memory(legalize_ops(module_of(builder, [d], ["d"])))
    placed = {v.name: s for v, s in tensor_storage(planned.main).items()}
    assert placed["a"] is not placed["b"]
    assert len({placed["a"], placed["b"], placed["c"]}) == 3
    assert placed["d"] in (placed["a"], placed["b"])  # a and b are dead by then
    assert_no_call_shares_storage_between_input_and_output(planned.main)


def test_plan_unused_value_is_freed_at_once() -> None:
    builder = FunctionBuilder("main")
    x = builder.add_param("x", TensorStructInfo((n, 4), "float32"))
    builder.emit(call_op("exp", x), "unused")
    a = builder.emit(call_op("relu", x), "a")
    y = builder.emit(call_op("tanh", a), "y", output=True)
    planned = plan_memory(legalize_ops(module_of(builder, [y], ["y"])))
    assert len(storages_of(planned.main)) == 2
    placed = {v.name: s for v, s in tensor_storage(planned.main).items()}
    assert placed["unused"] is placed["a"]


@pytest.mark.parametrize("rows", [1, 5])
def test_plan_preserves_results(rows: int) -> None:
    legalized = legalize_ops(mlp_module())
    planned = plan_memory(legalized)
    x = rand(rows, 4, seed=10 + rows)
    (expected,) = run_module(legalized, {"x": x})
    (actual,) = run_module(planned, {"x": x})
    assert_close(actual, expected)


def test_interpreter_catches_a_wrong_storage_reuse() -> None:
    """The planned form runs on real bytes: two live tensors in one storage give wrong numbers."""
    builder = FunctionBuilder("main")
    x = builder.add_param("x", TensorStructInfo((n, 4), "float32"))
    a = builder.emit(call_op("relu", x), "a")
    b = builder.emit(call_op("tanh", x), "b")
    c = builder.emit(call_op("add", a, b), "c", output=True)
    legalized = legalize_ops(module_of(builder, [c], ["c"]))
    planned = plan_memory(legalized)
    main = planned.main
    bindings = list(main.bindings())
    a_storage = next(b.value.storage for b in bindings if isinstance(b.value, AllocTensor) and b.var.name == "a")
    broken = [
        VarBinding(b.var, AllocTensor(a_storage, b.value.struct_info))
        if isinstance(b.value, AllocTensor) and b.var.name == "b" else b
        for b in bindings
    ]
    broken_module = planned.with_function(
        Function("main", main.params, SeqExpr((BindingBlock(tuple(broken)),), main.body.body),
                 main.input_names, main.output_names)
    )
    x_value = rand(3, 4, seed=5)
    (good,) = run_module(planned, {"x": x_value})
    (bad,) = run_module(broken_module, {"x": x_value})
    assert_close(good, np.maximum(x_value, 0) + np.tanh(x_value))
    assert not np.allclose(bad, good)


def test_plan_rejects_unlegalized_functions() -> None:
    with pytest.raises(ValueError, match="expects legalized functions"):
        plan_memory(chain_module())


def test_plan_memory_reuses_the_best_fitting_free_storage() -> None:
    """The smallest free storage that is large enough; else the largest too small, grown."""
    planner = _Planner(mlp_module().main, Analyzer())
    planner.storages = [_Storage(n * 4), _Storage(n * 32), _Storage(n * 16), _Storage(n * 2)]
    assert planner.take_storage([0, 1, 2, 3], n * 8) == 2  # n*16 fits with the least to spare
    assert planner.take_storage([0, 3], n * 8) == 0  # nothing fits: n*4 grows (n*2 would waste more)
    assert format_expr(planner.storages[0].size) == "n * 8"
    planner.storages.append(_Storage(m * 4))
    index = planner.take_storage([4], n * 4)  # incomparable sizes: grown to the max of both
    assert index == 4 and format_expr(planner.storages[4].size) in ("max(m * 4, n * 4)", "max(n * 4, m * 4)")
    assert planner.take_storage([], n) == 5  # no free storage: a new one
