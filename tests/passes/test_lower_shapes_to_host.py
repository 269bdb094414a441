"""lower_shapes_to_host: the planned ``main`` becomes its host function.

What the pass promises (relaxweb/passes/lower_shapes_to_host.py): the input checks that bind
the size variables and enforce the annotations and the bounds (each with its own message);
the storages (inputs, then the planned ones, those holding outputs marked so) and weights;
the steps in order: dispatches, ``match_cast``'s checks and bindings (a check the bounds
prove is no step; one they refute is an error now), reads of GPU values after which the host
resumes (``tensor_to_prim``, an If on a tensor), ``If`` (hidden shape variables when the
branches' shapes differ), loops, and the output shapes.  A KV cache's past is stored at the
cache's capacity and its present is an output in that same storage.
"""

from __future__ import annotations

import numpy as np
import pytest

from relaxweb.errors import InputShapeError, RelaxwebError, UnsupportedModelError
from relaxweb.ir import Constant, FunctionBuilder, IntImm, IRModule, ShapeExpr, TensorStructInfo
from relaxweb.ir.host import HostFunction
from relaxweb.ir.interpreter import run_host_function, run_module, run_shape_checks
from relaxweb.ir.parser import parse_module
from relaxweb.ir.symbolic import evaluate, format_expr
from relaxweb.ops import call_op
from relaxweb.passes import PassContext, legalize_ops, lower_shapes_to_host, plan_memory
from tests.helpers import assert_close, rand
from tests.passes.graphs import chain_module, m, mlp_module, module_of, n
from tests.passes.rewrite import EXP, RELU, check_rewrite, run

def test_lower_shapes_to_host_writes_checks_storages_and_dispatches() -> None:
    before = '''
@tensor_program
def add(A: Buffer((n, 3), "float32"), B: Buffer((3,), "float32"), out: Buffer((n, 3), "float32")):
    out[i0_, i1_] = (A[i0_, i1_] + B[i1_])

@tensor_program
def relu(A: Buffer((n, 3), "float32"), out: Buffer((n, 3), "float32")):
    out[i0_, i1_] = maximum(A[i0_, i1_], float32(0.0))

@function(inputs=["x"], outputs=["y"])
def main(x: Tensor((n, 3), "float32")) -> Tensor((n, 3), "float32"):
    storage: Object = alloc_storage(n * 12)
    storage_1: Object = alloc_storage(n * 12)
    a: Tensor((n, 3), "float32") = alloc_tensor(storage)
    _: Tuple() = call_tir_into("add", (x, const("bias", [0.0, 1.0, 2.0], "float32")), out=a, sizes={"n": n})
    y: Tensor((n, 3), "float32") = alloc_tensor(storage_1)
    __1: Tuple() = call_tir_into("relu", (a,), out=y, sizes={"n": n})
    return y
'''
    programs = before[:before.index("@function")]
    expected = programs + '''
@host_function
def main():
    inputs = [host_input("x", "float32", (n, 3), storage=0)]
    outputs = [host_output("y", "float32", (n, 3), storage=2)]
    symbolic_vars = ["n"]
    bounds = [("n", None)]
    weights = [const("bias", [0.0, 1.0, 2.0], "float32")]
    storages = [host_storage(n * 12, "input"), host_storage(n * 12, "intermediate"), host_storage(n * 12, "output")]
    check_input("ndim", input=0, expected=2, code=1, message="input 'x' has {value} dimensions, expected {expected}")
    check_input("bind", input=0, dim=0, variable="n")
    check_input("bound", input=0, dim=0, variable="n", code=2, message="input 'x': dimension 0 (n) is {value}, above its bound n <= {expected}")
    check_input("equal", input=0, dim=1, expected=3, code=3, message="input 'x': dimension 1 is {value}, expected {expected}")
    dispatch("add", (storage(0), weight(0), storage(1)), sizes={"n": n}, count=n * 3, note='a = add(x, const("bias"))')
    dispatch("relu", (storage(1), storage(2)), sizes={"n": n}, count=n * 3, note="y = relu(a)")
    output_shape(0, (n, 3))
'''
    check_rewrite(lower_shapes_to_host, before, expected, {"x": rand(4, 3)})


def test_lower_shapes_to_host_reads_a_data_dependent_size_back() -> None:
    """tensor_to_prim ends a stage (a read), and match_cast checks and binds the size read."""
    before = '''
@tensor_program
def count_positive(A: Buffer((n,), "float32"), out: Buffer((1,), "int32")):
    out[i0_] = sum(select((A[r_] > float32(0.0)), int32(1), int32(0)) for r_ in range(n))

@tensor_program
def first(A: Buffer((n,), "float32"), out: Buffer((k,), "float32")):
    out[i0_] = A[i0_]

@function(inputs=["x"], outputs=["y"])
def main(x: Tensor((n,), "float32")) -> Tensor((k,), "float32"):
    counted: Object = alloc_storage(4)
    kept: Object = alloc_storage(n * 4)
    count: Tensor((1,), "int32") = alloc_tensor(counted)
    _: Tuple() = call_tir_into("count_positive", (x,), out=count, sizes={"n": n})
    value: Prim("int64") = tensor_to_prim(count)
    size: Prim("int64", k) = match_cast(value, Prim("int64", k))
    y: Tensor((k,), "float32") = alloc_tensor(kept)
    __1: Tuple() = call_tir_into("first", (x,), out=y, sizes={"n": n, "k": k})
    return y
'''
    programs = before[:before.index("@function")]
    expected = programs + '''
@host_function(read_slots=1)
def main():
    inputs = [host_input("x", "float32", (n,), storage=0)]
    outputs = [host_output("y", "float32", (k,), storage=2)]
    symbolic_vars = ["n", "_read0", "k"]
    bounds = [("n", None), ("_read0", None), ("k", None)]
    weights = []
    storages = [host_storage(n * 4, "input"), host_storage(4, "intermediate"), host_storage(n * 4, "output")]
    check_input("ndim", input=0, expected=1, code=1, message="input 'x' has {value} dimensions, expected {expected}")
    check_input("bind", input=0, dim=0, variable="n")
    check_input("bound", input=0, dim=0, variable="n", code=2, message="input 'x': dimension 0 (n) is {value}, above its bound n <= {expected}")
    dispatch("count_positive", (storage(0), storage(1)), sizes={"n": n}, count=1, note="count = count_positive(x)")
    read("_read0", storage=1, offset=0, slot=0, note="value = tensor_to_prim(count)")
    check("nonnegative", _read0, code=3, message="match_cast 'size': value is {value}, must be >= 0")
    bind("k", _read0, note="match_cast 'size': value")
    check("bound", k, variable="k", code=4, message="match_cast 'size': value (k) is {value}, above its bound k <= {expected}")
    dispatch("first", (storage(0), storage(2)), sizes={"n": n, "k": k}, count=k, note="y = first(x)")
    output_shape(0, (k,))
'''
    after = check_rewrite(lower_shapes_to_host, before, expected, {"x": np.array([1.0, -2.0, 3.0, 0.5], np.float32)})
    assert run(after, {"x": np.array([1.0, -2.0, 3.0, 0.5], np.float32)})[0].tolist() == [1.0, -2.0, 3.0]


def test_lower_shapes_to_host_reads_an_if_condition_back_and_branches_on_it() -> None:
    """An If on a tensor is a read of the condition (a stage ends there) and a host if; both
    branches dispatch into the If's storage, the output's."""
    programs = RELU + EXP
    before = programs + """
@function(inputs=["x", "flag"], outputs=["y"])
def main(x: Tensor((n, 4), "float32"), flag: Tensor((), "bool")) -> Tensor((n, 4), "float32"):
    for_y: Object = alloc_storage(n * 16)
    y: Tensor((n, 4), "float32")
    if flag:
        t: Tensor((n, 4), "float32") = alloc_tensor(for_y)
        ran_t: Tuple() = call_tir_into("relu", (x,), out=t, sizes={"n": n})
        y = t
    else:
        u: Tensor((n, 4), "float32") = alloc_tensor(for_y)
        ran_u: Tuple() = call_tir_into("exp", (x,), out=u, sizes={"n": n})
        y = u
    return y
"""
    expected = programs + """
@host_function(read_slots=1)
def main():
    inputs = [host_input("x", "float32", (n, 4), storage=0), host_input("flag", "bool", (), storage=1)]
    outputs = [host_output("y", "float32", (n, 4), storage=2)]
    symbolic_vars = ["n", "_read0"]
    bounds = [("n", None), ("_read0", None)]
    weights = []
    storages = [host_storage(n * 16, "input"), host_storage(4, "input"), host_storage(n * 16, "output")]
    check_input("ndim", input=0, expected=2, code=1, message="input 'x' has {value} dimensions, expected {expected}")
    check_input("bind", input=0, dim=0, variable="n")
    check_input("bound", input=0, dim=0, variable="n", code=2, message="input 'x': dimension 0 (n) is {value}, above its bound n <= {expected}")
    check_input("equal", input=0, dim=1, expected=4, code=3, message="input 'x': dimension 1 is {value}, expected {expected}")
    check_input("ndim", input=1, expected=0, code=4, message="input 'flag' has {value} dimensions, expected {expected}")
    read("_read0", storage=1, offset=0, slot=0, note="condition of If 'y'")
    if _read0:
        dispatch("relu", (storage(0), storage(2)), sizes={"n": n}, count=n * 4, note="t = relu(x)")
    else:
        dispatch("exp", (storage(0), storage(2)), sizes={"n": n}, count=n * 4, note="u = exp(x)")
    output_shape(0, (n, 4))
"""
    x = rand(3, 4)
    check_rewrite(lower_shapes_to_host, before, expected, [{"x": x, "flag": np.array(True)}, {"x": x, "flag": np.array(False)}])


def test_lower_shapes_to_host_gives_an_if_of_two_shapes_hidden_shape_variables() -> None:
    """The branches give [n, 4] and [n, 2]: the result's dims are host variables _y_dim0 and
    _y_dim1, which each branch binds; the output's shape is theirs."""
    programs = RELU + """
@tensor_program
def left(A: Buffer((n, 4), "float32"), out: Buffer((n, 2), "float32")):
    out[i0_, i1_] = A[i0_, i1_]
"""
    before = programs + """
@function(inputs=["x"], outputs=["y"])
def main(x: Tensor((n, 4), "float32")) -> Tensor(ndim=2, dtype="float32"):
    for_y: Object = alloc_storage(n * 16)
    y: Tensor(ndim=2, dtype="float32")
    if prim(n % 2):
        t: Tensor((n, 4), "float32") = alloc_tensor(for_y)
        ran_t: Tuple() = call_tir_into("relu", (x,), out=t, sizes={"n": n})
        y = t
    else:
        u: Tensor((n, 2), "float32") = alloc_tensor(for_y)
        ran_u: Tuple() = call_tir_into("left", (x,), out=u, sizes={"n": n})
        y = u
    return y
"""
    expected = programs + """
@host_function
def main():
    inputs = [host_input("x", "float32", (n, 4), storage=0)]
    outputs = [host_output("y", "float32", None, storage=1, ndim=2)]
    symbolic_vars = ["n", "_y_dim0", "_y_dim1"]
    bounds = [("n", None), ("_y_dim0", None), ("_y_dim1", None)]
    weights = []
    storages = [host_storage(n * 16, "input"), host_storage(n * 16, "output")]
    check_input("ndim", input=0, expected=2, code=1, message="input 'x' has {value} dimensions, expected {expected}")
    check_input("bind", input=0, dim=0, variable="n")
    check_input("bound", input=0, dim=0, variable="n", code=2, message="input 'x': dimension 0 (n) is {value}, above its bound n <= {expected}")
    check_input("equal", input=0, dim=1, expected=4, code=3, message="input 'x': dimension 1 is {value}, expected {expected}")
    if n % 2:
        dispatch("relu", (storage(0), storage(1)), sizes={"n": n}, count=n * 4, note="t = relu(x)")
        bind("_y_dim0", n, note="If 'y' result")
        bind("_y_dim1", 4, note="If 'y' result")
    else:
        dispatch("left", (storage(0), storage(1)), sizes={"n": n}, count=n * 2, note="u = left(x)")
        bind("_y_dim0", n, note="If 'y' result")
        bind("_y_dim1", 2, note="If 'y' result")
    output_shape(0, (_y_dim0, _y_dim1))
"""
    after = check_rewrite(lower_shapes_to_host, before, expected, [{"x": rand(3, 4)}, {"x": rand(2, 4, seed=1)}])
    assert [result.shape for result in run(after, {"x": rand(3, 4)})] == [(3, 4)]
    assert [result.shape for result in run(after, {"x": rand(2, 4)})] == [(2, 2)]


def test_lower_shapes_to_host_runs_a_planned_loop_as_a_host_loop() -> None:
    """The iteration is a host variable; the body's dispatches run once per iteration; the
    loop's value (an alias of c's storage) is the output."""
    carry = """
@tensor_program
def loop_carry(A: Buffer((n, 4), "float32"), out: Buffer((n, 4), "float32")):
    out[i0_, i1_] = A[i0_, i1_]
"""
    before = RELU + carry + """
@function(inputs=["x"], outputs=["y"])
def main(x: Tensor((n, 4), "float32")) -> Tensor((n, 4), "float32"):
    for_c: Object = alloc_storage(n * 16)
    for_r: Object = alloc_storage(n * 16)
    c: Tensor((n, 4), "float32") = alloc_tensor(for_c)
    copy_c: Tuple() = call_tir_into("loop_carry", (x,), out=c, sizes={"n": n})
    planned: Tuple()
    for i in loop(3):
        r: Tensor((n, 4), "float32") = alloc_tensor(for_r)
        ran_r: Tuple() = call_tir_into("relu", (c,), out=r, sizes={"n": n})
        into_c: Tuple() = call_tir_into("loop_carry", (r,), out=c, sizes={"n": n})
        planned = ()
    looped: Tuple(Tensor((n, 4), "float32")) = (c,)
    y: Tensor((n, 4), "float32") = looped[0]
    return y
"""
    expected = RELU + carry + """
@host_function
def main():
    inputs = [host_input("x", "float32", (n, 4), storage=0)]
    outputs = [host_output("y", "float32", (n, 4), storage=1)]
    symbolic_vars = ["n", "i"]
    bounds = [("n", None), ("i", None)]
    weights = []
    storages = [host_storage(n * 16, "input"), host_storage(n * 16, "output"), host_storage(n * 16, "intermediate")]
    check_input("ndim", input=0, expected=2, code=1, message="input 'x' has {value} dimensions, expected {expected}")
    check_input("bind", input=0, dim=0, variable="n")
    check_input("bound", input=0, dim=0, variable="n", code=2, message="input 'x': dimension 0 (n) is {value}, above its bound n <= {expected}")
    check_input("equal", input=0, dim=1, expected=4, code=3, message="input 'x': dimension 1 is {value}, expected {expected}")
    dispatch("loop_carry", (storage(0), storage(1)), sizes={"n": n}, count=n * 4, note="c = loop_carry(x)")
    for i in loop(3, note="loop 'planned'"):
        dispatch("relu", (storage(1), storage(2)), sizes={"n": n}, count=n * 4, note="r = relu(c)")
        dispatch("loop_carry", (storage(2), storage(1)), sizes={"n": n}, count=n * 4, note="c = loop_carry(r)")
    output_shape(0, (n, 4))
"""
    check_rewrite(lower_shapes_to_host, before, expected, {"x": rand(2, 4)})


MATCH_CAST_BEFORE = """
@tensor_program
def add(A: Buffer((n, 4), "float32"), B: Buffer((n, 4), "float32"), out: Buffer((n, 4), "float32")):
    out[i0_, i1_] = (A[i0_, i1_] + B[i0_, i1_])

@function(inputs=["x", "y"], outputs=["z"])
def main(x: Tensor((n, 4), "float32"), y: Tensor((m, 4), "float32")) -> Tensor((n, 4), "float32"):
    for_z: Object = alloc_storage(n * 16)
    checked: Tensor((n, 4), "float32") = match_cast(y, Tensor((n, 4), "float32"), reason="Add node 'add': dimension 0 of input 1 ('y')")
    z: Tensor((n, 4), "float32") = alloc_tensor(for_z)
    ran_z: Tuple() = call_tir_into("add", (x, checked), out=z, sizes={"n": n})
    return z
"""


def test_lower_shapes_to_host_checks_a_match_cast_the_bounds_do_not_prove() -> None:
    """y's dim 0 (m) against n: a check with the cast's reason; its dim 1 (4 against 4) is
    proved: no step."""
    expected = MATCH_CAST_BEFORE[:MATCH_CAST_BEFORE.index("@function")] + """
@host_function
def main():
    inputs = [host_input("x", "float32", (n, 4), storage=0), host_input("y", "float32", (m, 4), storage=1)]
    outputs = [host_output("z", "float32", (n, 4), storage=2)]
    symbolic_vars = ["n", "m"]
    bounds = [("n", None), ("m", None)]
    weights = []
    storages = [host_storage(n * 16, "input"), host_storage(m * 16, "input"), host_storage(n * 16, "output")]
    check_input("ndim", input=0, expected=2, code=1, message="input 'x' has {value} dimensions, expected {expected}")
    check_input("bind", input=0, dim=0, variable="n")
    check_input("bound", input=0, dim=0, variable="n", code=2, message="input 'x': dimension 0 (n) is {value}, above its bound n <= {expected}")
    check_input("equal", input=0, dim=1, expected=4, code=3, message="input 'x': dimension 1 is {value}, expected {expected}")
    check_input("ndim", input=1, expected=2, code=4, message="input 'y' has {value} dimensions, expected {expected}")
    check_input("bind", input=1, dim=0, variable="m")
    check_input("bound", input=1, dim=0, variable="m", code=5, message="input 'y': dimension 0 (m) is {value}, above its bound m <= {expected}")
    check_input("equal", input=1, dim=1, expected=4, code=6, message="input 'y': dimension 1 is {value}, expected {expected}")
    check("equal", m, expected=n, code=7, message="Add node 'add': dimension 0 of input 1 ('y') is {value}, expected {expected} (n; n from input 'x' dimension 0)")
    dispatch("add", (storage(0), storage(1), storage(2)), sizes={"n": n}, count=n * 4, note="z = add(x, checked)")
    output_shape(0, (n, 4))
"""
    after = check_rewrite(lower_shapes_to_host, MATCH_CAST_BEFORE, expected, {"x": rand(3, 4), "y": rand(3, 4, seed=1)})
    with pytest.raises(InputShapeError, match=r"Add node 'add': dimension 0 of input 1 \('y'\) is 2, expected 3"):
        run(after, {"x": rand(3, 4), "y": rand(2, 4, seed=1)})


@pytest.mark.parametrize("bound", [8, None], ids=["n <= 8", "unbounded"])
def test_lower_shapes_to_host_drops_a_check_the_bounds_prove(bound: int | None) -> None:
    """x [n, 4] cast to [min(n, 8), 4]: with n <= 8 the bound proves it (no step); without,
    it is checked at run time."""
    programs = """
@tensor_program
def relu(A: Buffer((k, 4), "float32"), out: Buffer((k, 4), "float32")):
    out[i0_, i1_] = maximum(A[i0_, i1_], float32(0.0))
"""
    before = programs + """
@function(inputs=["x"], outputs=["y"])
def main(x: Tensor((n, 4), "float32")) -> Tensor((min(n, 8), 4), "float32"):
    for_y: Object = alloc_storage(min(n, 8) * 16)
    checked: Tensor((min(n, 8), 4), "float32") = match_cast(x, Tensor((min(n, 8), 4), "float32"))
    y: Tensor((min(n, 8), 4), "float32") = alloc_tensor(for_y)
    ran_y: Tuple() = call_tir_into("relu", (checked,), out=y, sizes={"k": min(n, 8)})
    return y
"""
    check = ('    check("equal", n, expected=min(n, 8), code=4, message="match_cast \'checked\': dimension 0 is {value}, '
             'expected {expected} (min(n, 8); n from input \'x\' dimension 0)")\n') if bound is None else ""
    expected = programs + f"""
@host_function
def main():
    inputs = [host_input("x", "float32", (n, 4), storage=0)]
    outputs = [host_output("y", "float32", (min(n, 8), 4), storage=1)]
    symbolic_vars = ["n"]
    bounds = [("n", {bound})]
    weights = []
    storages = [host_storage(n * 16, "input"), host_storage(min(n, 8) * 16, "output")]
    check_input("ndim", input=0, expected=2, code=1, message="input 'x' has {{value}} dimensions, expected {{expected}}")
    check_input("bind", input=0, dim=0, variable="n")
    check_input("bound", input=0, dim=0, variable="n", code=2, message="input 'x': dimension 0 (n) is {{value}}, above its bound n <= {{expected}}")
    check_input("equal", input=0, dim=1, expected=4, code=3, message="input 'x': dimension 1 is {{value}}, expected {{expected}}")
{check}    dispatch("relu", (storage(0), storage(1)), sizes={{"k": min(n, 8)}}, count=min(n, 8) * 4, note="y = relu(checked)")
    output_shape(0, (min(n, 8), 4))
"""
    with PassContext(bounds={} if bound is None else {"n": bound}):
        check_rewrite(lower_shapes_to_host, before, expected, {"x": rand(5, 4)})


def test_lower_shapes_to_host_refuses_a_match_cast_the_bounds_refute() -> None:
    """y [2, 4] cast to [3, 4] can never hold: an error at build time, naming the cast."""
    text = MATCH_CAST_BEFORE.replace("y: Tensor((m, 4)", "y: Tensor((2, 4)").replace(
        "Tensor((n, 4), \"float32\"), reason=", "Tensor((3, 4), \"float32\"), reason=").replace(
        "checked: Tensor((n, 4)", "checked: Tensor((3, 4)")
    with pytest.raises(RelaxwebError, match=r"Add node 'add': dimension 0 of input 1 \('y'\) is 2, which is never 3 for any input"):
        lower_shapes_to_host(parse_module(text))


def test_lower_shapes_to_host_stores_a_kv_caches_past_at_its_capacity_and_outputs_its_present_there() -> None:
    """past's storage holds the cache (b * 3 * 7 * 4 floats, role "cache"), the new rows are
    dispatched into it at row p, and present is output 0 in that storage (caches table)."""
    program = """
@library_kernel(builder="kv_cache_write", args={"name": "kv_cache_write", "outer": (sym(b), sym(3)), "length": sym(1), "inner": (sym(4),), "capacity": 7, "dtype": "float32", "offset": "offset_"})
def kv_cache_write(value: Buffer((b, 3, 1, 4), "float32"), out: Buffer((b, 3, 7, 4), "float32")): ...
"""
    before = program + """
@function(inputs=["past", "new"], outputs=["present"])
def main(past: Tensor((b, 3, p, 4), "float32"), new: Tensor((b, 3, 1, 4), "float32")) -> Tensor((b, 3, p + 1, 4), "float32"):
    cache: Tensor((b, 3, 7, 4), "float32") = kv_cache_write(past, new, axis=2, capacity=7)
    written: Tuple() = call_tir_into("kv_cache_write", (new,), out=cache, sizes={"b": b, "offset_": p})
    present: Tensor((b, 3, p + 1, 4), "float32") = kv_cache_view(cache, prim(p + 1), axis=2)
    return present
"""
    expected = program + """
@host_function
def main():
    inputs = [host_input("past", "float32", (b, 3, p, 4), storage=0), host_input("new", "float32", (b, 3, 1, 4), storage=1)]
    outputs = [host_output("present", "float32", (b, 3, p + 1, 4), storage=0)]
    symbolic_vars = ["b", "p"]
    bounds = [("b", 1), ("p", 6)]
    weights = []
    storages = [host_storage(b * 336, "cache"), host_storage(b * 48, "input")]
    caches = [host_cache(input=0, output=0, axis=2, capacity=7, storage=0)]
    check_input("ndim", input=0, expected=4, code=1, message="input 'past' has {value} dimensions, expected {expected}")
    check_input("bind", input=0, dim=0, variable="b")
    check_input("bound", input=0, dim=0, variable="b", code=2, message="input 'past': dimension 0 (b) is {value}, above its bound b <= {expected}")
    check_input("equal", input=0, dim=1, expected=3, code=3, message="input 'past': dimension 1 is {value}, expected {expected}")
    check_input("bind", input=0, dim=2, variable="p")
    check_input("bound", input=0, dim=2, variable="p", code=4, message="input 'past': dimension 2 (p) is {value}, above its bound p <= {expected}")
    check_input("equal", input=0, dim=3, expected=4, code=5, message="input 'past': dimension 3 is {value}, expected {expected}")
    check_input("ndim", input=1, expected=4, code=6, message="input 'new' has {value} dimensions, expected {expected}")
    check_input("equal", input=1, dim=0, expected=b, code=7, message="input 'new': dimension 0 is {value}, expected {expected} (b; b from input 'past' dimension 0)")
    check_input("equal", input=1, dim=1, expected=3, code=8, message="input 'new': dimension 1 is {value}, expected {expected}")
    check_input("equal", input=1, dim=2, expected=1, code=9, message="input 'new': dimension 2 is {value}, expected {expected}")
    check_input("equal", input=1, dim=3, expected=4, code=10, message="input 'new': dimension 3 is {value}, expected {expected}")
    dispatch("kv_cache_write", (storage(1), storage(0)), sizes={"b": b, "offset_": p}, count=b * 12, note="cache = kv_cache_write(new)")
    output_shape(0, (b, 3, p + 1, 4))
"""
    inputs = [{"past": rand(1, 3, length, 4, seed=length), "new": rand(1, 3, 1, 4, seed=9)} for length in (0, 6)]
    with PassContext(bounds={"b": 1, "p": 6}):
        check_rewrite(lower_shapes_to_host, before, expected, inputs)


# Modules built in Python -------------------------------------------------------------------------


def two_input_module() -> IRModule:
    """x[n, 4], y[n, m] -> z = (x @ w)[n, 1] + y, and a second output x * 2 + b (b used twice)."""
    builder = FunctionBuilder("main")
    x = builder.add_param("x", TensorStructInfo((n, 4), "float32"))
    y = builder.add_param("y", TensorStructInfo((n, m), "float32"))
    w = Constant(rand(4, 1, seed=7), "w")
    b = Constant(rand(4, seed=8), "b")
    xw = builder.emit(call_op("matmul", x, w), "xw")
    z = builder.emit(call_op("add", xw, y), "z", output=True)
    t = builder.emit(call_op("add", x, b), "t")
    u = builder.emit(call_op("add", t, b), "u", output=True)
    return module_of(builder, [z, u], ["z", "u"])


def lowered(module: IRModule, **bounds: int) -> IRModule:
    with PassContext(bounds=bounds):
        return lower_shapes_to_host(plan_memory(legalize_ops(module)))


def test_host_function_checks() -> None:
    host = lowered(two_input_module(), n=8).main
    assert isinstance(host, HostFunction)
    assert host.symbolic_vars == ("n", "m")
    assert host.bounds == (("n", 8), ("m", None))
    summary = [(c.kind, c.input, c.dim, c.variable, c.code) for c in host.checks]
    assert summary == [
        ("ndim", 0, -1, None, 1),
        ("bind", 0, 0, "n", 0),
        ("bound", 0, 0, "n", 2),
        ("equal", 0, 1, None, 3),
        ("ndim", 1, -1, None, 4),
        ("equal", 1, 0, None, 5),
        ("bind", 1, 1, "m", 0),
        ("bound", 1, 1, "m", 6),
    ]
    messages = {c.code: c.message for c in host.checks if c.code}
    assert messages[1] == "input 'x' has {value} dimensions, expected {expected}"
    assert messages[2] == "input 'x': dimension 0 (n) is {value}, above its bound n <= {expected}"
    assert messages[3] == "input 'x': dimension 1 is {value}, expected {expected}"
    assert messages[5] == "input 'y': dimension 0 is {value}, expected {expected} (n; n from input 'x' dimension 0)"
    assert host.checks[3].expected == IntImm(4)
    assert host.checks[5].expected == n


def test_host_function_storages_weights_and_dispatches() -> None:
    module = lowered(two_input_module(), n=8)
    host = module.main
    roles = [s.role for s in host.storages]
    sizes = [format_expr(s.size) for s in host.storages]
    assert roles[:2] == ["input", "input"]
    assert sizes[:2] == ["n * 16", "m * n * 4"]
    assert [i.storage for i in host.inputs] == [0, 1]
    assert roles.count("output") == 2
    assert [o.name for o in host.outputs] == ["z", "u"]
    assert [format_expr(d) for d in host.outputs[0].shape] == ["n", "m"]
    assert {host.storages[o.storage].role for o in host.outputs} == {"output"}
    # b is used by two calls but is one weight
    assert [w.name for w in host.weights] == ["w", "b"]
    programs = [d.program for d in host.dispatches]
    assert programs == ["matmul", "add", "add1", "add1"]
    first = host.dispatches[0]
    assert [(r.kind, r.index) for r in first.buffers][:2] == [("storage", 0), ("weight", 0)]
    assert format_expr(first.element_count) == "n"
    assert format_expr(host.dispatches[1].element_count) == "m * n"
    assert dict(host.dispatches[1].size_var_values) == {"n": n, "m": m}
    assert first.note == 'xw = matmul(x, const("w"))'
    # every storage a dispatch writes is large enough at a few sizes
    for dispatch in host.dispatches:
        program = module.programs[dispatch.program]
        out_ref = dispatch.buffers[-1]
        assert out_ref.kind == "storage" and out_ref.index >= 2
        for env in ({"n": 1, "m": 1}, {"n": 3, "m": 7}):
            count = evaluate(dispatch.element_count, env)
            assert count == int(np.prod([evaluate(d, env) for d in program.output.shape]))
            assert evaluate(host.storages[out_ref.index].size, env) >= count * 4


@pytest.mark.parametrize(("rows", "cols"), [(1, 1), (3, 5), (8, 2)])
def test_host_function_preserves_results(rows: int, cols: int) -> None:
    before = two_input_module()
    after = lowered(before, n=8)
    inputs = {"x": rand(rows, 4, seed=rows), "y": rand(rows, cols, seed=cols)}
    expected = run_module(before, inputs)
    actual = run_host_function(after.main, after.programs, inputs)
    assert len(actual) == len(expected) == 2
    for a, e in zip(actual, expected):
        assert a.shape == e.shape
        assert_close(a, e)


@pytest.mark.parametrize("rows", [1, 5])
def test_host_function_of_mlp_preserves_results(rows: int) -> None:
    before = mlp_module()
    after = lowered(before)
    x = rand(rows, 4, seed=20 + rows)
    assert_close(run_host_function(after.main, after.programs, {"x": x})[0], run_module(before, {"x": x})[0])


@pytest.mark.parametrize(
    ("shapes", "message"),
    [
        ([(9, 4), (9, 2)], "input 'x': dimension 0 (n) is 9, above its bound n <= 8"),
        ([(2, 4, 1), (2, 2)], "input 'x' has 3 dimensions, expected 2"),
        ([(2, 5), (2, 2)], "input 'x': dimension 1 is 5, expected 4"),
        ([(2, 4), (3, 2)], "input 'y': dimension 0 is 3, expected 2 (n; n from input 'x' dimension 0)"),
        ([(2, 4), (2,)], "input 'y' has 1 dimensions, expected 2"),
    ],
)
def test_host_shape_checks_fail_with_their_message(shapes, message: str) -> None:
    host = lowered(two_input_module(), n=8).main
    with pytest.raises(InputShapeError) as caught:
        run_shape_checks(host, shapes)
    assert str(caught.value) == message


def test_host_shape_checks_bind_the_variables() -> None:
    host = lowered(two_input_module(), n=8).main
    assert run_shape_checks(host, [(8, 4), (8, 100)]) == {"n": 8, "m": 100}
    unbounded = lowered(two_input_module()).main
    assert unbounded.bounds == (("n", None), ("m", None))
    assert run_shape_checks(unbounded, [(1000, 4), (1000, 3)]) == {"n": 1000, "m": 3}


def test_host_dtype_and_missing_input() -> None:
    after = lowered(two_input_module(), n=8)
    with pytest.raises(InputShapeError, match="missing input 'y'"):
        run_host_function(after.main, after.programs, {"x": rand(2, 4)})
    with pytest.raises(InputShapeError, match="input 'x': dtype is float64, expected float32"):
        run_host_function(after.main, after.programs, {"x": np.zeros((2, 4)), "y": rand(2, 2)})


def test_lower_rejects_a_bound_on_an_unknown_variable() -> None:
    with pytest.raises(RelaxwebError) as caught:
        lowered(two_input_module(), n=8, batch=4)
    assert str(caught.value) == "--bound names batch, but the model's symbolic variables are: n, m"


def test_lower_rejects_a_compound_dimension_of_a_variable_no_input_binds() -> None:
    builder = FunctionBuilder("main")
    x = builder.add_param("x", TensorStructInfo((n * 2, 4), "float32"))
    y = builder.emit(call_op("relu", x), "y", output=True)
    with pytest.raises(UnsupportedModelError, match="dimension 0 is n \\* 2; size variables must appear alone as some input"):
        lowered(module_of(builder, [y], ["y"]))


def test_lower_checks_a_compound_dimension_before_its_variables_after_every_input() -> None:
    """optimum's mask, ``past_sequence_length + sequence_length``, comes before the past."""
    builder = FunctionBuilder("main")
    mask = builder.add_param("mask", TensorStructInfo((n + m,), "float32"))
    x = builder.add_param("x", TensorStructInfo((n,), "float32"))
    y = builder.add_param("y", TensorStructInfo((m,), "float32"))
    joined = builder.emit(call_op("concat", x, y, axis=0), "joined")
    z = builder.emit(call_op("add", mask, joined), "z", output=True)
    after = lowered(module_of(builder, [z], ["z"]))
    (check,) = [c for c in after.main.checks if c.kind == "equal" and c.input == 0]
    assert after.main.checks.index(check) > max(after.main.checks.index(c) for c in after.main.checks if c.kind == "bind")
    with pytest.raises(InputShapeError, match="input 'mask': dimension 0 is 4, expected 5"):
        run_shape_checks(after.main, [(4,), (2,), (3,)])
    values = {"mask": rand(5, seed=1), "x": rand(2, seed=2), "y": rand(3, seed=3)}
    (actual,) = run_host_function(after.main, after.programs, values)
    assert_close(actual, values["mask"] + np.concatenate([values["x"], values["y"]]))


def test_lower_checks_a_compound_dimension_after_its_variable() -> None:
    builder = FunctionBuilder("main")
    x = builder.add_param("x", TensorStructInfo((n, 4), "float32"))
    y = builder.add_param("y", TensorStructInfo((n * 2,), "float32"))
    r = builder.emit(call_op("reshape", x, ShapeExpr((n * 2, 2))), "r")
    y2 = builder.emit(call_op("reshape", y, ShapeExpr((n * 2, 1))), "y2")
    z = builder.emit(call_op("add", r, y2), "z", output=True)
    after = lowered(module_of(builder, [z], ["z"]))
    (check,) = [c for c in after.main.checks if c.kind == "equal" and c.input == 1]
    assert format_expr(check.expected) == "n * 2"
    assert check.message == "input 'y': dimension 0 is {value}, expected {expected} (n * 2; n from input 'x' dimension 0)"
    with pytest.raises(InputShapeError, match="input 'y': dimension 0 is 5, expected 6"):
        run_shape_checks(after.main, [(3, 4), (5,)])
    x_value, y_value = rand(3, 4, seed=1), rand(6, seed=2)
    (actual,) = run_host_function(after.main, after.programs, {"x": x_value, "y": y_value})
    assert_close(actual, x_value.reshape(6, 2) + y_value.reshape(6, 1))


def test_lower_rejects_an_input_returned_as_output() -> None:
    builder = FunctionBuilder("main")
    x = builder.add_param("x", TensorStructInfo((n, 4), "float32"))
    y = builder.emit(call_op("relu", x), "y", output=True)
    module = IRModule({"main": builder.finish([y, x], ["y", "x_again"])})
    with pytest.raises(UnsupportedModelError, match="output 'x_again' must be computed by the model"):
        lowered(module)


def test_lower_rejects_an_unplanned_function() -> None:
    with pytest.raises(ValueError, match="expects a planned function"):
        lower_shapes_to_host(legalize_ops(chain_module()))
