"""Fused attention: the ``attention`` op (relaxweb/ops/attention.py), its library kernel
(relaxweb/library/attention.py) and the pass that writes it (relaxweb/passes/fuse_attention.py).

* deduction: the result shape, symbolic batch and sequence dims, the errors;
* the op's numpy semantics against the unfused ops in the interpreter (masks, causal, NaN rows);
* an ONNX model written as torch exports attention (MatMul, Mul or Div, Add of a mask,
  Softmax, MatMul), built once with symbolic batch and seq: the build has the fused kernel and
  no [.., seq, seq] storage, and it matches onnxruntime on wgpu at seq 1, at lengths that are
  not multiples of the key tile or of the 64-row workgroup, batch > 1 and 3 heads, with masks
  of -inf, of -3.4e38 (what torch writes) and rows masked out entirely (NaN, as unfused);
* the causal kernel (no exporter writes it) against the reference on wgpu, Sq != Sk included;
* ``zero_nan_rows`` (torch's scaled_dot_product_attention export: NaN weights set to 0): rows
  masked out entirely, a NaN query and a +inf mask entry give 0, as the unfused graph does, on
  WebGPU (both shaders) and kernels.wasm.
"""

from __future__ import annotations

import numpy as np
import pytest
from onnx import helper

from relaxweb.bundle import write_bundle
from relaxweb.compiler import compile_module, import_model
from relaxweb.ir import FunctionBuilder, SizeVar, TensorStructInfo
from relaxweb.ir.expr import Call, PrimValue
from relaxweb.ir.functor import iter_bindings
from relaxweb.ir.interpreter import run_module
from relaxweb.ir.library_kernel import LibraryKernel
from relaxweb.ir.module import IRModule
from relaxweb.ir.op_registry import AssumptionError
from relaxweb.library.attention import attention_reference
from relaxweb.ops import DeductionError, call_op
from relaxweb.passes import fuse_attention
from tests.gpu_kernels import run_compiled
from tests.helpers import F32_LOOSE, assert_close, load_bundle, make_model, onnxruntime_outputs, rand

HEADS, HEAD, VALUE_HEAD = 3, 16, 8
NEG = np.float32(-3.4028235e38)  # torch's finfo(float32).min mask
# (batch, seq): seq 1, below one key tile (32), across tiles, across the 64-row workgroup
SHAPES = [(2, 5), (1, 1), (3, 33), (1, 70)]

b, s, t = SizeVar("b"), SizeVar("s"), SizeVar("t")


def _params(builder, shapes: dict):
    return [builder.add_param(name, TensorStructInfo(shape, "float32")) for name, shape in shapes.items()]


# Deduction ---------------------------------------------------------------------------------------


def test_deduction_keeps_batch_and_lengths_symbolic() -> None:
    builder = FunctionBuilder("main")
    q, k, v, mask = _params(builder, {"q": (b, 4, s, 16), "k": (b, 4, t, 16), "v": (b, 4, t, 8), "m": (b, 1, 1, t)})
    assert call_op("attention", q, k, v, mask, scale=0.25).struct_info == TensorStructInfo((b, 4, s, 8), "float32")
    assert call_op("attention", q, k, v, causal=True).struct_info == TensorStructInfo((b, 4, s, 8), "float32")


def test_deduction_errors_name_the_argument() -> None:
    builder = FunctionBuilder("main")
    q, k, v, wide, mask = _params(builder, {"q": (b, 4, s, 16), "k": (b, 4, t, 12), "v": (b, 4, t, 8),
                                            "w": (b, 5, t, 8), "m": (b, 1, s, s + 1)})
    with pytest.raises(DeductionError, match="dim 3 of k is 12, expected 16"):
        call_op("attention", q, k, v)
    good_k = builder.add_param("k2", TensorStructInfo((b, 4, t, 16), "float32"))
    with pytest.raises(DeductionError, match="dim 1 of v is 5, expected k's 4"):
        call_op("attention", q, good_k, wide)
    with pytest.raises(AssumptionError, match="dim 3 of the mask is s \\+ 1, expected 1 or t"):
        call_op("attention", q, good_k, v, mask)
    with pytest.raises(DeductionError, match="scale must be a float"):
        call_op("attention", q, good_k, v, scale=1)


# Semantics ---------------------------------------------------------------------------------------


def _unfused(q, k, v, mask, scale, causal, zero_nan_rows=False):
    scores = (q.astype(np.float64) @ np.swapaxes(k, -1, -2)) * scale + (0 if mask is None else mask)
    if causal:
        rows, keys = scores.shape[-2:]
        scores = np.where(np.arange(keys)[None] > np.arange(rows)[:, None] + keys - rows, -np.inf, scores)
    with np.errstate(invalid="ignore"):
        weights = np.exp(scores - scores.max(-1, keepdims=True))
        weights = weights / weights.sum(-1, keepdims=True)
        return (np.where(np.isnan(weights), 0.0, weights) if zero_nan_rows else weights) @ v


@pytest.mark.parametrize("causal", [False, True])
def test_reference_is_the_unfused_computation(causal: bool) -> None:
    q, k, v = rand(2, 3, 6, 4, seed=1), rand(2, 3, 9, 4, seed=2), rand(2, 3, 9, 5, seed=3)
    mask = np.where(rand(2, 1, 6, 9, seed=4) > 0.8, -np.inf, rand(2, 1, 6, 9, seed=5)).astype(np.float32)
    mask[1, 0, 2] = -np.inf  # one row masked out entirely: NaN, as the unfused softmax gives
    got = attention_reference([q, k, v, mask], scale=0.5, causal=causal)
    wanted = _unfused(q, k, v, mask, 0.5, causal)
    assert np.isnan(got[1, :, 2]).all()
    assert_close(got, wanted)


# Through the compiler, on wgpu -----------------------------------------------------------------


def attention_model(scale_op: str = "Mul", mask_dims: str = "rows", transposed_keys: bool = False):
    """The subgraph torch writes: q [batch, heads, seq, D], keys either [batch, heads, seq, D]
    transposed by [0, 1, 3, 2] or (``transposed_keys``, BERT's layout) [batch, seq, heads, D]
    transposed by [0, 2, 3, 1], v [batch, heads, seq, Dv], an additive mask [batch, 1, seq,
    seq] (``rows``) or [batch, 1, 1, seq] (``keys``)."""
    mask_shape = ["batch", 1, "seq", "seq"] if mask_dims == "rows" else ["batch", 1, 1, "seq"]
    key_shape = ["batch", "seq", HEADS, HEAD] if transposed_keys else ["batch", HEADS, "seq", HEAD]
    factor = 0.25 if scale_op == "Mul" else 4.0
    nodes = [
        helper.make_node("Transpose", ["k"], ["k_t"], perm=[0, 2, 3, 1] if transposed_keys else [0, 1, 3, 2]),
        helper.make_node("MatMul", ["q", "k_t"], ["scores"]),
        helper.make_node(scale_op, ["scores", "factor"], ["scaled"]),
        helper.make_node("Add", ["scaled", "mask"], ["masked"]),
        helper.make_node("Softmax", ["masked"], ["weights"], axis=-1),
        helper.make_node("MatMul", ["weights", "v"], ["out"]),
    ]
    inputs = [("q", ["batch", HEADS, "seq", HEAD]), ("k", key_shape), ("v", ["batch", HEADS, "seq", VALUE_HEAD]),
              ("mask", mask_shape)]
    return make_model(nodes, inputs, ["out"], {"factor": np.array(factor, np.float32)})


def _feeds(batch: int, seq: int, mask_dims: str, transposed_keys: bool, seed: int) -> dict[str, np.ndarray]:
    keys = (batch, seq, HEADS, HEAD) if transposed_keys else (batch, HEADS, seq, HEAD)
    mask_shape = (batch, 1, seq, seq) if mask_dims == "rows" else (batch, 1, 1, seq)
    mask = rand(mask_shape, seed=seed + 3)
    mask = np.where(mask > 1.0, -np.inf, np.where(mask < -1.0, NEG, 0.0)).astype(np.float32)
    if mask_dims == "rows" and seq > 3:
        mask[0, 0, 1] = -np.inf  # a row masked out entirely with -inf: NaN
        mask[-1, 0, 2] = NEG  # and with torch's finite minimum: the mean of the values
    return {"q": rand(batch, HEADS, seq, HEAD, seed=seed), "k": rand(keys, seed=seed + 1),
            "v": rand(batch, HEADS, seq, VALUE_HEAD, seed=seed + 2), "mask": mask}


@pytest.mark.parametrize("scale_op, mask_dims, transposed_keys", [
    ("Mul", "rows", True), ("Div", "keys", False)], ids=["bert-layout", "divide-key-mask"])
def test_one_fused_build_matches_onnxruntime_at_every_length(backend, tmp_path, scale_op, mask_dims,
                                                             transposed_keys) -> None:
    model = attention_model(scale_op, mask_dims, transposed_keys)
    module = import_model(model)
    ops = [b.value.op for b in iter_bindings(fuse_attention(module).main) if isinstance(b.value, Call)]
    assert "attention" in ops and "softmax" not in ops and "matmul" not in ops  # the rewrite fired
    compiled = compile_module(module, {})
    assert [p.builder for p in compiled.programs.values() if isinstance(p, LibraryKernel)] == ["attention"]
    assert not any("softmax" in name for name in compiled.programs)
    write_bundle(compiled, tmp_path / "bundle", "model")
    session = load_bundle(tmp_path / "bundle", backend)
    for index, (batch, seq) in enumerate(SHAPES):
        feeds = _feeds(batch, seq, mask_dims, transposed_keys, seed=10 * index)
        wanted = onnxruntime_outputs(model, feeds)[0]
        got = session.run(feeds)["out"]
        assert np.array_equal(np.isnan(got), np.isnan(wanted)), (batch, seq)
        assert_close(got, wanted, F32_LOOSE, err_msg=f"batch {batch}, seq {seq}")
        if mask_dims == "rows" and seq > 3:
            assert np.isnan(got[0, :, 1]).all() and np.isfinite(got[-1, :, 2]).all()


@pytest.mark.parametrize("kernels", ["gpu", "cpu"])  # keys staged in workgroup memory, or read in place
@pytest.mark.parametrize("query_length, key_length", [(70, 70), (5, 40), (40, 5), (1, 1)])
def test_causal_kernel_matches_the_reference(device, tmp_path, query_length: int, key_length: int, kernels: str) -> None:
    builder = FunctionBuilder("main")
    q, k, v = _params(builder, {"q": (b, 2, s, 8), "k": (b, 2, t, 8), "v": (b, 2, t, 4)})
    out = builder.emit_op("attention", q, k, v, scale=0.3, causal=True, name_hint="out", output=True)
    module = IRModule({"main": builder.finish([out], ["out"])})
    feeds = {"q": rand(2, 2, query_length, 8, seed=1), "k": rand(2, 2, key_length, 8, seed=2),
             "v": rand(2, 2, key_length, 4, seed=3)}
    wanted = run_module(module, feeds)[0]
    assert_close(wanted, _unfused(feeds["q"], feeds["k"], feeds["v"], None, 0.3, True))
    got = run_compiled(module, feeds, tmp_path / "bundle", kernels=kernels)[0]
    # Sq > Sk: the first rows see no key at all (NaN, as an additive -inf mask gives)
    assert np.array_equal(np.isnan(got), np.isnan(wanted))
    assert_close(got, wanted, F32_LOOSE)


def test_grouped_query_heads_share_a_key_value_head(device, tmp_path) -> None:
    """k and v [b, 2, 1, t, 8] serve q [b, 2, 3, s, 8] (3 query heads per key / value head,
    as onnxruntime's GroupQueryAttention converter writes it) without a copy per query head."""
    builder = FunctionBuilder("main")
    q, k, v, mask = _params(builder, {"q": (b, 2, 3, s, 8), "k": (b, 2, 1, t, 8), "v": (b, 2, 1, t, 4),
                                      "m": (b, 1, 1, s, t)})
    out = builder.emit_op("attention", q, k, v, mask, scale=0.5, name_hint="out", output=True)
    module = IRModule({"main": builder.finish([out], ["out"])})
    for seed, (batch, queries, keys) in enumerate([(2, 5, 7), (1, 1, 40)]):
        mask_values = np.where(rand(batch, 1, 1, queries, keys, seed=seed) > 1.0, -np.inf, 0.0).astype(np.float32)
        feeds = {"q": rand(batch, 2, 3, queries, 8, seed=seed + 1), "k": rand(batch, 2, 1, keys, 8, seed=seed + 2),
                 "v": rand(batch, 2, 1, keys, 4, seed=seed + 3), "m": mask_values}
        wanted = run_module(module, feeds)[0]
        assert_close(wanted, _unfused(feeds["q"], feeds["k"], feeds["v"], mask_values, 0.5, False))
        assert_close(run_compiled(module, feeds, tmp_path / f"bundle{seed}")[0], wanted, F32_LOOSE)


def test_grouped_query_heads_read_a_fewer_headed_key_value_tensor(device, tmp_path) -> None:
    """k and v [b, 2, t, 8] serve q [b, 6, s, 8] as transformers' repeat_kv orders the heads
    (query head h reads key / value head h // 3): the 4-d layout a decoder's KV cache has, read
    without a repeated copy."""
    builder = FunctionBuilder("main")
    q, k, v, mask = _params(builder, {"q": (b, 6, s, 8), "k": (b, 2, t, 8), "v": (b, 2, t, 4), "m": (b, 1, s, t)})
    out = builder.emit_op("attention", q, k, v, mask, scale=0.5, name_hint="out", output=True)
    module = IRModule({"main": builder.finish([out], ["out"])})
    with pytest.raises(DeductionError, match="dim 1 of k is 4, expected 1, 6 or a divisor of it"):
        call_op("attention", q, *_params(FunctionBuilder("f"), {"k": (b, 4, t, 8), "v": (b, 4, t, 4)}))
    for seed, (batch, queries, keys) in enumerate([(2, 5, 7), (1, 1, 40)]):
        mask_values = np.where(rand(batch, 1, queries, keys, seed=seed) > 1.0, -np.inf, 0.0).astype(np.float32)
        feeds = {"q": rand(batch, 6, queries, 8, seed=seed + 1), "k": rand(batch, 2, keys, 8, seed=seed + 2),
                 "v": rand(batch, 2, keys, 4, seed=seed + 3), "m": mask_values}
        repeated = {name: np.repeat(feeds[name], 3, axis=1) for name in ("k", "v")}
        wanted = _unfused(feeds["q"], repeated["k"], repeated["v"], mask_values, 0.5, False)
        assert_close(run_module(module, feeds)[0], wanted)
        for kernels in ("gpu", "cpu"):
            assert_close(run_compiled(module, feeds, tmp_path / f"bundle{seed}", kernels=kernels)[0], wanted, F32_LOOSE)


def test_a_key_length_reads_the_valid_prefix_of_a_cache_in_place(device, tmp_path) -> None:
    """attention(q, k, v, mask, prim(t)) with k and v [b, 2, 16, .] buffers (a KV cache of
    capacity 16) reads the first t rows of each head, rows 16 apart; the rows past t hold NaN,
    which would poison every output they reached."""
    builder = FunctionBuilder("main")
    q, k, v, mask = _params(builder, {"q": (b, 6, s, 8), "k": (b, 2, 16, 8), "v": (b, 2, 16, 4), "m": (b, 1, s, t)})
    out = builder.emit_op("attention", q, k, v, mask, PrimValue(t), scale=0.5, name_hint="out", output=True)
    module = IRModule({"main": builder.finish([out], ["out"])})
    with pytest.raises(DeductionError, match="17 keys, but k has 16 rows"):
        call_op("attention", q, k, v, PrimValue(17))
    for seed, (batch, queries, keys) in enumerate([(2, 3, 7), (1, 1, 16), (1, 2, 1)]):
        mask_values = np.where(rand(batch, 1, queries, keys, seed=seed) > 1.0, -np.inf, 0.0).astype(np.float32)
        cache = {"k": rand(batch, 2, 16, 8, seed=seed + 2), "v": rand(batch, 2, 16, 4, seed=seed + 3)}
        for tensor in cache.values():
            tensor[:, :, keys:] = np.nan
        feeds = {"q": rand(batch, 6, queries, 8, seed=seed + 1), **cache, "m": mask_values}
        valid = {name: np.repeat(tensor[:, :, :keys], 3, axis=1) for name, tensor in cache.items()}
        wanted = _unfused(feeds["q"], valid["k"], valid["v"], mask_values, 0.5, False)
        assert_close(run_module(module, feeds)[0], wanted)
        for kernels in ("gpu", "cpu"):
            assert_close(run_compiled(module, feeds, tmp_path / f"bundle{seed}", kernels=kernels)[0], wanted, F32_LOOSE)


def test_zero_nan_rows_are_zero_as_the_unfused_where_makes_them(backend, tmp_path) -> None:
    """attention(..., zero_nan_rows=True) is where(isnan(weights), 0, weights) @ v: a query row
    masked out entirely (-inf), one with a NaN query and one with a +inf mask entry have NaN
    weights, so 0; a row masked with -3.4e38 stays the mean of its values.  70 queries and 130
    keys: two WebGPU workgroups of rows, the wasm kernel's key blocks."""
    builder = FunctionBuilder("main")
    q, k, v, mask = _params(builder, {"q": (b, 2, s, 8), "k": (b, 2, t, 8), "v": (b, 2, t, 4), "m": (b, 1, s, t)})
    out = builder.emit_op("attention", q, k, v, mask, scale=0.5, zero_nan_rows=True, name_hint="out", output=True)
    module = IRModule({"main": builder.finish([out], ["out"])})
    write_bundle(compile_module(module, {}), tmp_path / "bundle", "model")
    sessions = [load_bundle(tmp_path / "bundle", backend)]
    if backend == "webgpu":  # and the shader for CPU adapters, which stages no tiles
        sessions.append(load_bundle(tmp_path / "bundle", backend, kernels="cpu"))
    for seed, (batch, queries, keys) in enumerate([(2, 5, 7), (1, 70, 130)]):
        mask_values = np.where(rand(batch, 1, queries, keys, seed=seed) > 1.0, -np.inf, 0.0).astype(np.float32)
        mask_values[0, 0, 1] = -np.inf
        mask_values[0, 0, 2] = NEG
        mask_values[0, 0, 3, keys // 2] = np.inf
        feeds = {"q": rand(batch, 2, queries, 8, seed=seed + 1), "k": rand(batch, 2, keys, 8, seed=seed + 2),
                 "v": rand(batch, 2, keys, 4, seed=seed + 3), "m": mask_values}
        feeds["q"][0, 1, 4] = np.nan
        wanted = _unfused(feeds["q"], feeds["k"], feeds["v"], mask_values, 0.5, False, zero_nan_rows=True)
        assert (wanted[0, :, 1] == 0).all() and (wanted[0, :, 3] == 0).all() and (wanted[0, 1, 4] == 0).all()
        assert_close(run_module(module, feeds)[0], wanted)
        for session in sessions:
            got = session.run(feeds)["out"]
            assert not np.isnan(got).any()
            assert_close(got, wanted, F32_LOOSE, err_msg=f"{backend}, {queries} queries, {keys} keys")
