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
    place_kv_caches, plan_memory, share_programs,
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


def test_legalize_ops_turns_op_calls_into_program_calls() -> None:
    before = '''
@function(inputs=["x"], outputs=["y"])
def main(x: Tensor((n, 3), "float32")) -> Tensor((n, 3), "float32"):
    with dataflow():
        a: Tensor((n, 3), "float32") = add(x, const("bias", [0.0, 1.0, 2.0], "float32"))
        y: Tensor((n, 3), "float32") = relu(a)
        output(y)
    return y
'''
    expected = '''
@tensor_program
def add(A: Buffer((rows, 3), "float32"), B: Buffer((3,), "float32"), out: Buffer((rows, 3), "float32")):
    out[i0_, i1_] = (A[i0_, i1_] + B[i1_])

@tensor_program
def relu(A: Buffer((rows, 3), "float32"), out: Buffer((rows, 3), "float32")):
    out[i0_, i1_] = maximum(A[i0_, i1_], float32(0.0))

@function(inputs=["x"], outputs=["y"])
def main(data: Tensor((rows, 3), "float32")) -> Tensor((rows, 3), "float32"):
    with dataflow():
        biased: Tensor((rows, 3), "float32") = call_tir("add", (data, const("bias", [0.0, 1.0, 2.0], "float32")), sizes={"rows": rows})
        result: Tensor((rows, 3), "float32") = call_tir("relu", (biased,), sizes={"rows": rows})
        output(result)
    return result
'''
    check_rewrite(legalize_ops, before, expected, {"x": rand(5, 3)})


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


# BERT's attention as torch's exporters write it (keys [b, s, heads, D] transposed by [0, 2, 3, 1]).
ATTENTION_BEFORE = '''
@function(inputs=["q", "keys", "v", "mask"], outputs=["y"])
def main(q: Tensor((b, 2, s, 4), "float32"), keys: Tensor((b, s, 2, 4), "float32"), v: Tensor((b, 2, s, 3), "float32"), mask: Tensor((b, 1, 1, s), "float32")) -> Tensor((b, 2, s, 3), "float32"):
    with dataflow():
        k_t: Tensor((b, 2, 4, s), "float32") = transpose(keys, axes=[0, 2, 3, 1])
        scores: Tensor((b, 2, s, s), "float32") = matmul(q, k_t)
        scaled: Tensor((b, 2, s, s), "float32") = multiply(scores, const("c", 0.5, "float32"))
        masked: Tensor((b, 2, s, s), "float32") = add(scaled, mask)
        weights: Tensor((b, 2, s, s), "float32") = softmax(masked, axes=[3])
        y: Tensor((b, 2, s, 3), "float32") = matmul(weights, v)
        output(y)
    return y
'''


def _attention_inputs() -> dict[str, np.ndarray]:
    mask = np.where(rand(2, 1, 1, 5, seed=4) > 0.5, -np.inf, 0.0).astype(np.float32)
    return {"q": rand(2, 2, 5, 4, seed=1), "keys": rand(2, 5, 2, 4, seed=2), "v": rand(2, 2, 5, 3, seed=3), "mask": mask}


@pytest.mark.parametrize("order", ["add(scaled, mask)", "add(mask, scaled)"])
def test_fuse_attention_rewrites_the_exported_subgraph_into_one_op(order: str) -> None:
    """The keys' transpose becomes the one that gives [b, 2, s, 4]; scores, scale, mask add
    and softmax go (the mask on either side of the add)."""
    expected = '''
@function(inputs=["q", "keys", "v", "mask"], outputs=["y"])
def main(q: Tensor((b, 2, s, 4), "float32"), keys: Tensor((b, s, 2, 4), "float32"), v: Tensor((b, 2, s, 3), "float32"), mask: Tensor((b, 1, 1, s), "float32")) -> Tensor((b, 2, s, 3), "float32"):
    with dataflow():
        k: Tensor((b, 2, s, 4), "float32") = transpose(keys, axes=[0, 2, 1, 3])
        y: Tensor((b, 2, s, 3), "float32") = attention(q, k, v, mask, scale=0.5)
        output(y)
    return y
'''
    check_rewrite(fuse_attention, ATTENTION_BEFORE.replace("add(scaled, mask)", order), expected, _attention_inputs())


@pytest.mark.parametrize("change, why", [
    ("softmax(masked, axes=[3])|softmax(masked, axes=[2])", "the softmax is over another axis"),
    ("output(y)|output(y, scores)", "the scores are read elsewhere (an output)"),
    ('const("c", 0.5, "float32")|mask', "the scale is not a constant"),
    ("add(scaled, mask)|subtract(scaled, mask)", "the mask is subtracted"),
])
def test_fuse_attention_leaves_other_graphs_alone(change: str, why: str) -> None:
    old, new = change.split("|")
    before = ATTENTION_BEFORE.replace(old, new)
    if "output(y, scores)" in before:  # scores becomes a variable of the function
        before = before.replace('outputs=["y"]', 'outputs=["y", "scores"]').replace(
            'Tensor((b, 2, s, 3), "float32"):\n', 'Tuple(Tensor((b, 2, s, 3), "float32"), Tensor((b, 2, s, s), "float32")):\n', 1
        ).replace("    return y", "    return (y, scores)")
    assert before != ATTENTION_BEFORE
    module = parse_module(before)
    assert_structural_equal(fuse_attention(module), module), why


# A decoder layer's attention as optimum's export of a Llama writes it: the present keys and
# values concat(past, new) with their heads repeated (transformers' repeat_kv: unsqueeze,
# expand, reshape), and the run-time checks the frontend puts where the scores' key length
# (p + s) meets the mask's (t, from attention_mask).
DECODER_ATTENTION_BEFORE = '''
@function(inputs=["q", "past", "new", "mask"], outputs=["y", "present"])
def main(q: Tensor((b, 4, s, 8), "float32"), past: Tensor((b, 2, p, 8), "float32"), new: Tensor((b, 2, s, 8), "float32"), mask: Tensor((b, 1, s, t), "float32")) -> Tuple(Tensor((b, 4, s, 8), "float32"), Tensor((b, 2, p + s, 8), "float32")):
    with dataflow():
        present: Tensor((b, 2, p + s, 8), "float32") = concat(past, new, axis=2)
        k5: Tensor((b, 2, 1, p + s, 8), "float32") = reshape(present, shape((b, 2, 1, p + s, 8)))
        k_repeated: Tensor((b, 2, 2, p + s, 8), "float32") = broadcast_to(k5, shape((1, 1, 2, 1, 1)))
        k: Tensor((b, 4, p + s, 8), "float32") = reshape(k_repeated, shape((b, 4, -1, 8)))
        v5: Tensor((b, 2, 1, p + s, 8), "float32") = reshape(present, shape((b, 2, 1, p + s, 8)))
        v_repeated: Tensor((b, 2, 2, p + s, 8), "float32") = broadcast_to(v5, shape((1, 1, 2, 1, 1)))
        v: Tensor((b, 4, p + s, 8), "float32") = reshape(v_repeated, shape((b, 4, -1, 8)))
        k_t: Tensor((b, 4, 8, p + s), "float32") = transpose(k, axes=[0, 1, 3, 2])
        scores: Tensor((b, 4, s, p + s), "float32") = matmul(q, k_t)
        scaled: Tensor((b, 4, s, p + s), "float32") = divide(scores, const("c", 2.0, "float32"))
        scaled_checked: Tensor((b, 4, s, t), "float32") = match_cast(scaled, Tensor((b, 4, s, t), "float32"), reason="Add node 'add': dimension 3 of input 0 ('scaled')")
        masked: Tensor((b, 4, s, t), "float32") = add(scaled_checked, mask)
        weights: Tensor((b, 4, s, t), "float32") = softmax(masked, axes=[3])
        v_checked: Tensor((b, 4, t, 8), "float32") = match_cast(v, Tensor((b, 4, t, 8), "float32"), reason="MatMul node 'mm': dimension 2 of input 1 ('v')")
        y: Tensor((b, 4, s, 8), "float32") = matmul(weights, v_checked)
        output(y, present)
    return (y, present)
'''


def _decoder_attention_inputs(past: int = 4, new: int = 3) -> dict[str, np.ndarray]:
    mask = np.where(rand(2, 1, new, past + new, seed=4) > 1.0, -np.inf, 0.0).astype(np.float32)
    return {"q": rand(2, 4, new, 8, seed=1), "past": rand(2, 2, past, 8, seed=2), "new": rand(2, 2, new, 8, seed=3),
            "mask": mask}


def test_fuse_attention_reads_repeated_heads_in_place_and_checks_the_mask_once() -> None:
    """The repeated heads go (the op reads each key / value head for 2 query heads), and the
    two checks of p + s == t become one check of the mask's last dim against p + s."""
    expected = '''
@function(inputs=["q", "past", "new", "mask"], outputs=["y", "present"])
def main(q: Tensor((b, 4, s, 8), "float32"), past: Tensor((b, 2, p, 8), "float32"), new: Tensor((b, 2, s, 8), "float32"), mask: Tensor((b, 1, s, t), "float32")) -> Tuple(Tensor((b, 4, s, 8), "float32"), Tensor((b, 2, p + s, 8), "float32")):
    with dataflow():
        present: Tensor((b, 2, p + s, 8), "float32") = concat(past, new, axis=2)
        mask_checked: Tensor((b, 1, s, p + s), "float32") = match_cast(mask, Tensor((b, 1, s, p + s), "float32"), reason="Add node 'add': dimension 3 of input 0 ('scaled') against the attention mask: its dimension 3 (t)")
        y: Tensor((b, 4, s, 8), "float32") = attention(q, present, present, mask_checked, scale=0.5)
        output(y, present)
    return (y, present)
'''
    check_rewrite(fuse_attention, DECODER_ATTENTION_BEFORE, expected, _decoder_attention_inputs())
    check_rewrite(fuse_attention, DECODER_ATTENTION_BEFORE, expected, _decoder_attention_inputs(past=0, new=5))


def test_fuse_attention_keeps_checks_the_mask_would_not_state() -> None:
    """A mask of one column states nothing about the key length: the checks stay, so does
    the unfused graph."""
    before = DECODER_ATTENTION_BEFORE.replace("mask: Tensor((b, 1, s, t)", "mask: Tensor((b, 1, s, 1)")
    module = parse_module(before)
    assert_structural_equal(fuse_attention(module), module)


# A decoder layer after fuse_attention: present keys and values concat(past, new) along the
# past length p, read by the attention and returned for the next step.
KV_CACHE_BEFORE = '''
@function(inputs=["q", "past_k", "new_k", "past_v", "new_v", "mask"], outputs=["y", "present_k", "present_v"])
def main(q: Tensor((b, 4, s, 8), "float32"), past_k: Tensor((b, 2, p, 8), "float32"), new_k: Tensor((b, 2, s, 8), "float32"), past_v: Tensor((b, 2, p, 8), "float32"), new_v: Tensor((b, 2, s, 8), "float32"), mask: Tensor((b, 1, s, p + s), "float32")) -> Tuple(Tensor((b, 4, s, 8), "float32"), Tensor((b, 2, p + s, 8), "float32"), Tensor((b, 2, p + s, 8), "float32")):
    with dataflow():
        present_k: Tensor((b, 2, p + s, 8), "float32") = concat(past_k, new_k, axis=2)
        present_v: Tensor((b, 2, p + s, 8), "float32") = concat(past_v, new_v, axis=2)
        y: Tensor((b, 4, s, 8), "float32") = attention(q, present_k, present_v, mask, scale=0.5)
        output(y, present_k, present_v)
    return (y, present_k, present_v)
'''

KV_CACHE_BOUNDS = {"b": 2, "p": 8, "s": 4}


def _kv_cache_inputs(past: int = 5, new: int = 2) -> dict[str, np.ndarray]:
    mask = np.where(rand(2, 1, new, past + new, seed=6) > 1.0, -np.inf, 0.0).astype(np.float32)
    return {"q": rand(2, 4, new, 8, seed=1), "past_k": rand(2, 2, past, 8, seed=2), "new_k": rand(2, 2, new, 8, seed=3),
            "past_v": rand(2, 2, past, 8, seed=4), "new_v": rand(2, 2, new, 8, seed=5), "mask": mask}


def test_place_kv_caches_gives_each_present_one_cache_read_in_place() -> None:
    """Each present becomes a view of a cache of capacity 12 (the bound of p + s) written in
    past's storage; the attention reads both caches' first p + s rows."""
    expected = '''
@function(inputs=["q", "past_k", "new_k", "past_v", "new_v", "mask"], outputs=["y", "present_k", "present_v"])
def main(q: Tensor((b, 4, s, 8), "float32"), past_k: Tensor((b, 2, p, 8), "float32"), new_k: Tensor((b, 2, s, 8), "float32"), past_v: Tensor((b, 2, p, 8), "float32"), new_v: Tensor((b, 2, s, 8), "float32"), mask: Tensor((b, 1, s, p + s), "float32")) -> Tuple(Tensor((b, 4, s, 8), "float32"), Tensor((b, 2, p + s, 8), "float32"), Tensor((b, 2, p + s, 8), "float32")):
    with dataflow():
        k_cache: Tensor((b, 2, 12, 8), "float32") = kv_cache_write(past_k, new_k, axis=2, capacity=12)
        present_k: Tensor((b, 2, p + s, 8), "float32") = kv_cache_view(k_cache, prim(p + s), axis=2)
        v_cache: Tensor((b, 2, 12, 8), "float32") = kv_cache_write(past_v, new_v, axis=2, capacity=12)
        present_v: Tensor((b, 2, p + s, 8), "float32") = kv_cache_view(v_cache, prim(p + s), axis=2)
        y: Tensor((b, 4, s, 8), "float32") = attention(q, k_cache, v_cache, mask, prim(p + s), scale=0.5)
        output(y, present_k, present_v)
    return (y, present_k, present_v)
'''
    with PassContext(bounds=KV_CACHE_BOUNDS):
        check_rewrite(place_kv_caches, KV_CACHE_BEFORE, expected, _kv_cache_inputs())
        check_rewrite(place_kv_caches, KV_CACHE_BEFORE, expected, _kv_cache_inputs(past=0, new=4))


@pytest.mark.parametrize("change, bounds, why", [
    ("", {"b": 2, "s": 4}, "p has no bound: no capacity"),
    ("output(y, present_k, present_v)|output(y, present_k, present_v, total)", KV_CACHE_BOUNDS,
     "present_k is also read by a sum, which would see the cache's layout"),
])
def test_place_kv_caches_leaves_other_graphs_alone(change: str, bounds: dict, why: str) -> None:
    before = KV_CACHE_BEFORE
    if change:
        old, new = change.split("|")
        before = before.replace(old, new)
    if "total" in before:
        before = before.replace('outputs=["y", "present_k", "present_v"]', 'outputs=["y", "present_k", "present_v", "total"]').replace(
            'Tensor((b, 2, p + s, 8), "float32")):\n', 'Tensor((b, 2, p + s, 8), "float32"), Tensor((b, 2, 8), "float32")):\n', 1
        ).replace("        output(", '        total: Tensor((b, 2, 8), "float32") = sum(present_k, axes=[2])\n        output(').replace(
            "    return (y, present_k, present_v)", "    return (y, present_k, present_v, total)")
    module = parse_module(before)
    with PassContext(bounds=bounds):
        assert_structural_equal(place_kv_caches(module), module), why


def test_fold_scalar_constants_writes_each_value_into_its_own_program() -> None:
    scale = '''
@tensor_program
def scale(A: Buffer((n, 4), "float32"), B: Buffer((), "float32"), out: Buffer((n, 4), "float32")):
    out[i0_, i1_] = (A[i0_, i1_] * B[()])
'''
    before = scale + '''
@function(inputs=["x"], outputs=["y"])
def main(x: Tensor((n, 4), "float32")) -> Tensor((n, 4), "float32"):
    with dataflow():
        a: Tensor((n, 4), "float32") = call_tir("scale", (x, const("half", 0.5, "float32")), sizes={"n": n})
        y: Tensor((n, 4), "float32") = call_tir("scale", (a, const("three", 3.0, "float32")), sizes={"n": n})
        output(y)
    return y
'''
    expected = '''
@tensor_program
def scale1(A: Buffer((n, 4), "float32"), out: Buffer((n, 4), "float32")):
    out[i0_, i1_] = (A[i0_, i1_] * float32(0.5))

@tensor_program
def scale2(A: Buffer((n, 4), "float32"), out: Buffer((n, 4), "float32")):
    out[i0_, i1_] = (A[i0_, i1_] * float32(3.0))

@function(inputs=["x"], outputs=["y"])
def main(x: Tensor((n, 4), "float32")) -> Tensor((n, 4), "float32"):
    with dataflow():
        a: Tensor((n, 4), "float32") = call_tir("scale1", (x,), sizes={"n": n})
        y: Tensor((n, 4), "float32") = call_tir("scale2", (a,), sizes={"n": n})
        output(y)
    return y
'''
    check_rewrite(fold_scalar_constants, before, expected, {"x": rand(2, 4)})


def test_fuse_ops_merges_an_activation_chain_into_the_matmul_prologue() -> None:
    before = RELU + EXP + MATMUL + '''
@function(inputs=["x"], outputs=["y"])
def main(x: Tensor((n, 4), "float32")) -> Tensor((n, 8), "float32"):
    with dataflow():
        a: Tensor((n, 4), "float32") = call_tir("relu", (x,), sizes={"n": n})
        b: Tensor((n, 4), "float32") = call_tir("exp", (a,), sizes={"n": n})
        y: Tensor((n, 8), "float32") = call_tir("matmul", (b, const("w")), sizes={"n": n})
        output(y)
    return y
'''
    expected = '''
@tensor_program
def fused_relu__matmul(B: Buffer((4, 8), "float32"), A: Buffer((n, 4), "float32"), out: Buffer((n, 8), "float32")):
    out[i0_, i1_] = sum((exp(maximum(A[i0_, k_], float32(0.0))) * B[k_, i1_]) for k_ in range(4))

@function(inputs=["x"], outputs=["y"])
def main(x: Tensor((n, 4), "float32")) -> Tensor((n, 8), "float32"):
    with dataflow():
        y: Tensor((n, 8), "float32") = call_tir("fused_relu__matmul", (const("w"), x), sizes={"n": n})
        output(y)
    return y
'''
    check_rewrite(fuse_ops, before, expected, {"x": rand(3, 4)}, {"w": rand(4, 8, seed=1)})


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
    expected = (matmul.format(name="matmul", k="constant0") + relus
                + main.format(first=', "constant0": 4', second="matmul", other=', "constant0": 6'))
    inputs = {"x": rand(3, 4), "y": rand(3, 6, seed=1)}
    constants = {"w": rand(4, 8, seed=2), "v": rand(6, 8, seed=3)}
    check_rewrite(share_programs, before, expected, inputs, constants)


CHAIN = '''
@tensor_program
def relu(A: Buffer((n, 4), "float32"), out: Buffer((n, 4), "float32")):
    out[i0_, i1_] = maximum(A[i0_, i1_], float32(0.0))

@tensor_program
def tanh(A: Buffer((n, 4), "float32"), out: Buffer((n, 4), "float32")):
    out[i0_, i1_] = tanh(A[i0_, i1_])

@tensor_program
def exp(A: Buffer((n, 4), "float32"), out: Buffer((n, 4), "float32")):
    out[i0_, i1_] = exp(A[i0_, i1_])

@tensor_program
def negative(A: Buffer((n, 4), "float32"), out: Buffer((n, 4), "float32")):
    out[i0_, i1_] = negative(A[i0_, i1_])
'''


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
