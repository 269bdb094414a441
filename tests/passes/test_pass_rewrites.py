"""Each pass on a module written as IR text, against the expected module written as IR text.

The pattern of every test: parse ``before``, run the pass, assert the result is structurally
equal to the parsed ``expected`` (variable and size-variable names may differ), check it is
well formed, and run ``before``, the result and ``expected`` through the reference
interpreter on the same inputs (``run_host_function`` once the module has a host function).
"""

from __future__ import annotations

from typing import Callable

import numpy as np
import pytest

from relaxweb.ir.host import HostFunction
from relaxweb.ir.interpreter import run_host_function
from relaxweb.ir.interpreter import run_module
from relaxweb.ir.module import IRModule
from relaxweb.ir.parser import parse_module
from relaxweb.ir.structural import assert_structural_equal
from relaxweb.ir.well_formed import check_well_formed
from relaxweb.passes import (
    PassContext, canonicalize_bindings, fold_scalar_constants, fuse_attention, fuse_ops, legalize_ops, lower_shapes_to_host,
    place_kv_caches, plan_memory, schedule_programs, share_programs,
)

RTOL, ATOL = 1e-5, 1e-6


def run(module: IRModule, inputs: dict[str, np.ndarray]) -> list[np.ndarray]:
    main = module.main
    if isinstance(main, HostFunction):
        return run_host_function(main, module.programs, inputs)
    return run_module(module, inputs)


def check_rewrite(rewrite: Callable[[IRModule], IRModule], before_text: str, expected_text: str,
                  inputs: dict[str, np.ndarray], constants: dict[str, np.ndarray] | None = None) -> IRModule:
    """``rewrite(parse(before))`` is ``parse(expected)``, well formed, and computes the same."""
    before = parse_module(before_text, constants)
    after = rewrite(before)
    expected = parse_module(expected_text, constants)
    assert_structural_equal(after, expected)
    check_well_formed(after)
    reference = run(before, inputs)
    for module in (after, expected):
        results = run(module, inputs)
        assert len(results) == len(reference)
        for result, wanted in zip(results, reference):
            np.testing.assert_allclose(result, wanted, rtol=RTOL, atol=ATOL)
    return after


def rand(*shape: int, seed: int = 0) -> np.ndarray:
    return np.random.default_rng(seed).standard_normal(shape).astype(np.float32)


# Tensor programs the graph-level tests call.
RELU = '''
@tensor_program
def relu(A: Buffer((n, 4), "float32"), out: Buffer((n, 4), "float32")):
    out[i0_, i1_] = maximum(A[i0_, i1_], float32(0.0))
'''
EXP = '''
@tensor_program
def exp(A: Buffer((n, 4), "float32"), out: Buffer((n, 4), "float32")):
    out[i0_, i1_] = exp(A[i0_, i1_])
'''
ADD = '''
@tensor_program
def add(A: Buffer((n, 4), "float32"), B: Buffer((n, 4), "float32"), out: Buffer((n, 4), "float32")):
    out[i0_, i1_] = (A[i0_, i1_] + B[i0_, i1_])
'''
MATMUL = '''
@tensor_program
def matmul(A: Buffer((n, 4), "float32"), B: Buffer((4, 8), "float32"), out: Buffer((n, 8), "float32")):
    out[i0_, i1_] = sum((A[i0_, k_] * B[k_, i1_]) for k_ in range(4))
'''


# BERT's attention as torch's exporters write it (keys [b, s, heads, D] transposed by [0, 2, 3, 1]).


# A decoder layer's attention as optimum's export of a Llama writes it: the present keys and
# values concat(past, new) with their heads repeated (transformers' repeat_kv: unsqueeze,
# expand, reshape), and the run-time checks the frontend puts where the scores' key length
# (p + s) meets the mask's (t, from attention_mask).


# A decoder layer after fuse_attention: present keys and values concat(past, new) along the
# past length p, read by the attention and returned for the next step.


def test_schedule_programs_picks_each_schedule_by_pattern() -> None:
    """matmul-like: tiled; a long constant reduction: a workgroup per output element;
    elementwise with a last dimension that is a multiple of 4: vectorized; else element."""
    odd = '''
@tensor_program{decorator}
def negative(A: Buffer((n, 3), "float32"), out: Buffer((n, 3), "float32")):
    out[i0_, i1_] = negative(A[i0_, i1_])
'''
    row_sum = '''
@tensor_program{decorator}
def row_sum(A: Buffer((n, 256), "float32"), out: Buffer((n,), "float32")):
    out[i0_] = sum(A[i0_, r_] for r_ in range(256))
'''
    main = '''
@function(inputs=["x", "odd", "wide"], outputs=["y", "z", "s"])
def main(x: Tensor((n, 4), "float32"), odd: Tensor((n, 3), "float32"), wide: Tensor((n, 256), "float32")) -> Tuple(Tensor((n, 8), "float32"), Tensor((n, 3), "float32"), Tensor((n,), "float32")):
    with dataflow():
        a: Tensor((n, 4), "float32") = call_tir("relu", (x,), sizes={"n": n})
        y: Tensor((n, 8), "float32") = call_tir("matmul", (a, const("w")), sizes={"n": n})
        z: Tensor((n, 3), "float32") = call_tir("negative", (odd,), sizes={"n": n})
        s: Tensor((n,), "float32") = call_tir("row_sum", (wide,), sizes={"n": n})
        output(y, z, s)
    return (y, z, s)
'''
    before = RELU + MATMUL + odd.format(decorator="") + row_sum.format(decorator="") + main
    expected = (RELU.replace("@tensor_program", '@tensor_program(schedule=vectorized(width=4))')
                + MATMUL.replace("@tensor_program", '@tensor_program(schedule=tiled_matmul(tile=32, depth=16, block=4))')
                + odd.format(decorator="") + row_sum.format(decorator='(schedule=workgroup_reduction)') + main)
    inputs = {"x": rand(3, 4), "odd": rand(3, 3, seed=2), "wide": rand(3, 256, seed=3)}
    check_rewrite(schedule_programs, before, expected, inputs, {"w": rand(4, 8, seed=1)})


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
