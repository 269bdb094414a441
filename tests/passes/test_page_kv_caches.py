"""page_kv_caches: a decoder's KV caches as pools of pages that several sequences share.

What the pass promises (relaxweb/passes/page_kv_caches.py): with ``kv_pages`` in the
PassContext, each cache ``place_kv_caches`` made (``kv_cache_write`` of a past input along axis
2) becomes a pool input ``[pages, heads, page_size, head]`` written by ``paged_kv_write`` with
each token's page table (a new input ``kv_page_table [b, s, ceil(capacity / page_size)]``) and
position (``position_ids`` cast to int32); its present is the whole pool; the attention reads
the pools through ``paged_attention``; the attention mask's computation and the
``attention_mask`` input go.  Without ``kv_pages`` nothing changes; a model that cannot be
paged is refused, saying why.
"""

from __future__ import annotations

import numpy as np
import pytest

from relaxweb.errors import UnsupportedModelError
from relaxweb.ir.interpreter import run_module
from relaxweb.ir.parser import parse_module
from relaxweb.ir.structural import assert_structural_equal
from relaxweb.ir.well_formed import check_well_formed
from relaxweb.library.attention import attention_reference
from relaxweb.passes import PassContext, page_kv_caches
from tests.helpers import F32, assert_close, rand
from tests.passes.rewrite import check_rewrite

# A decoder layer after place_kv_caches: caches of capacity 12 along the past length p, an
# attention mask made from attention_mask.
BEFORE = '''
@function(inputs=["q", "new_k", "new_v", "attention_mask", "position_ids", "past_k", "past_v"], outputs=["y", "present_k", "present_v"])
def main(q: Tensor((b, 4, s, 8), "float32"), new_k: Tensor((b, 2, s, 8), "float32"), new_v: Tensor((b, 2, s, 8), "float32"), attention_mask: Tensor((b, p + s), "int64"), position_ids: Tensor((b, s), "int64"), past_k: Tensor((b, 2, p, 8), "float32"), past_v: Tensor((b, 2, p, 8), "float32")) -> Tuple(Tensor((b, 4, s, 8), "float32"), Tensor((b, 2, p + s, 8), "float32"), Tensor((b, 2, p + s, 8), "float32")):
    with dataflow():
        k_cache: Tensor((b, 2, 12, 8), "float32") = kv_cache_write(past_k, new_k, axis=2, capacity=12)
        present_k: Tensor((b, 2, p + s, 8), "float32") = kv_cache_view(k_cache, prim(p + s), axis=2)
        v_cache: Tensor((b, 2, 12, 8), "float32") = kv_cache_write(past_v, new_v, axis=2, capacity=12)
        present_v: Tensor((b, 2, p + s, 8), "float32") = kv_cache_view(v_cache, prim(p + s), axis=2)
        ones: Tensor((b, p + s), "float32") = cast(attention_mask, dtype="float32")
        mask: Tensor((b, 1, 1, p + s), "float32") = reshape(ones, shape((b, 1, 1, p + s)))
        y: Tensor((b, 4, s, 8), "float32") = attention(q, k_cache, v_cache, mask, prim(p + s), scale=0.5)
        output(y, present_k, present_v)
    return (y, present_k, present_v)
'''

EXPECTED = '''
attrs = {"kv_pool": {"pages": 6, "page_size": 4, "pages_per_sequence": 3, "page_table": "kv_page_table", "capacity": 12, "replaced_size_vars": ["p"]}}

@function(inputs=["q", "new_k", "new_v", "position_ids", "past_k", "past_v", "kv_page_table"], outputs=["y", "present_k", "present_v"])
def main(q: Tensor((b, 4, s, 8), "float32"), new_k: Tensor((b, 2, s, 8), "float32"), new_v: Tensor((b, 2, s, 8), "float32"), position_ids: Tensor((b, s), "int64"), past_k: Tensor((6, 2, 4, 8), "float32"), past_v: Tensor((6, 2, 4, 8), "float32"), kv_page_table: Tensor((b, s, 3), "int32")) -> Tuple(Tensor((b, 4, s, 8), "float32"), Tensor((6, 2, 4, 8), "float32"), Tensor((6, 2, 4, 8), "float32")):
    with dataflow():
        kv_positions: Tensor((b, s), "int32") = cast(position_ids, dtype="int32")
        k_cache: Tensor((6, 2, 4, 8), "float32") = paged_kv_write(past_k, new_k, kv_page_table, kv_positions)
        present_k: Tensor((6, 2, 4, 8), "float32") = kv_cache_view(k_cache, prim(6), axis=0)
        v_cache: Tensor((6, 2, 4, 8), "float32") = paged_kv_write(past_v, new_v, kv_page_table, kv_positions)
        present_v: Tensor((6, 2, 4, 8), "float32") = kv_cache_view(v_cache, prim(6), axis=0)
        y: Tensor((b, 4, s, 8), "float32") = paged_attention(q, k_cache, v_cache, kv_page_table, kv_positions, scale=0.5)
        output(present_k, present_v, y)
    return (y, present_k, present_v)
'''


def paged(text: str = BEFORE):
    with PassContext(kv_pages=6, kv_page_size=4):
        return page_kv_caches(parse_module(text))


def test_each_cache_becomes_a_pool_read_through_the_page_tables() -> None:
    after = paged()
    assert_structural_equal(after, parse_module(EXPECTED))
    check_well_formed(after)


def test_without_kv_pages_nothing_changes() -> None:
    """The paged rewrite changes the inputs (so it is checked by hand below); without
    ``kv_pages`` the pass leaves the module as it is, and it computes what it did."""
    module = parse_module(BEFORE)
    assert page_kv_caches(module) is module
    inputs = {"q": rand(2, 4, 3, 8, seed=1), "new_k": rand(2, 2, 3, 8, seed=2), "new_v": rand(2, 2, 3, 8, seed=3),
              "attention_mask": np.ones((2, 8), np.int64), "position_ids": np.tile(np.arange(5, 8), (2, 1)),
              "past_k": rand(2, 2, 5, 8, seed=4), "past_v": rand(2, 2, 5, 8, seed=5)}
    check_rewrite(page_kv_caches, BEFORE, BEFORE, inputs)


def test_a_decode_step_over_the_pools_is_the_cached_one() -> None:
    """Two sequences with 5 positions of history each, held in shuffled pages, decode one
    token: the paged module's attention and pools are the cached module's, position by position."""
    history, heads = 5, 2
    pages = [[4, 1], [0, 5]]
    inputs = {"q": rand(2, 4, 1, 8, seed=1), "new_k": rand(2, heads, 1, 8, seed=2), "new_v": rand(2, heads, 1, 8, seed=3)}
    past_k, past_v = rand(2, heads, history, 8, seed=4), rand(2, heads, history, 8, seed=5)
    before = run_module(parse_module(BEFORE), {**inputs, "attention_mask": np.zeros((2, history + 1), np.int64),
                                               "position_ids": np.full((2, 1), history), "past_k": past_k,
                                               "past_v": past_v})
    pool_k, pool_v = (np.full((6, heads, 4, 8), np.nan, np.float32) for _ in range(2))
    for sequence, owned in enumerate(pages):
        for position in range(history):
            pool_k[owned[position // 4], :, position % 4] = past_k[sequence, :, position]
            pool_v[owned[position // 4], :, position % 4] = past_v[sequence, :, position]
    table = np.array([[owned + [0]] for owned in pages], np.int32)  # [2, 1, 3]
    after = run_module(paged(), {**inputs, "position_ids": np.full((2, 1), history), "past_k": pool_k,
                                 "past_v": pool_v, "kv_page_table": table})
    assert_close(after[0], before[0], F32)
    expected = attention_reference([inputs["q"], np.repeat(before[1], 2, axis=1), np.repeat(before[2], 2, axis=1)],
                                   scale=0.5, causal=False)
    assert_close(after[0], expected, F32)
    for sequence, owned in enumerate(pages):
        for position in range(history + 1):
            np.testing.assert_array_equal(after[1][owned[position // 4], :, position % 4], before[1][sequence, :, position])


@pytest.mark.parametrize("change, reason", [
    (('"position_ids", ', ''), "no position_ids input"),
    (('ones: Tensor((b, p + s), "float32") = cast(attention_mask, dtype="float32")',
      'ones: Tensor((b, p + s), "float32") = cast(attention_mask, dtype="float32")\n        extra: Tensor((b, p + s), "float32") = add(ones, ones)'),
     None),
])
def test_models_that_cannot_be_paged_are_refused_saying_why(change, reason) -> None:
    text = BEFORE.replace(*change)
    if reason == "no position_ids input":
        text = text.replace(', position_ids: Tensor((b, s), "int64")', '')
        with pytest.raises(UnsupportedModelError, match="--kv-pages: .* no position_ids input"):
            paged(text)
    else:  # the mask's reader that goes with it (dead code) does not stop paging
        check_well_formed(paged(text))


def test_a_model_without_caches_is_refused() -> None:
    text = '''
@function(inputs=["x", "position_ids"], outputs=["y"])
def main(x: Tensor((b, 4), "float32"), position_ids: Tensor((b, 1), "int64")) -> Tensor((b, 4), "float32"):
    with dataflow():
        y: Tensor((b, 4), "float32") = add(x, x)
        output(y)
    return y
'''
    with pytest.raises(UnsupportedModelError, match="--kv-pages: .* no KV cache"):
        paged(text)
