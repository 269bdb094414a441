"""place_kv_caches: a decoder's KV cache in one buffer that never moves.

What the pass promises (relaxweb/passes/place_kv_caches.py): each output ``present =
concat(past, new, axis)`` of an input ``past`` read by nothing else, whose axis is a size
variable and whose other dims are bounded, becomes ``kv_cache_write`` of capacity the bound
of ``present``'s axis and a ``kv_cache_view`` of its valid prefix; an ``attention`` reading
such a pair as keys and values reads the caches with the prefix's length.  A present read
by anything else, or whose partner cannot be cached alike, stays as it is: keys and values
are cached both or neither.  Bounds come from the PassContext.
"""

from __future__ import annotations

import numpy as np
import pytest

from relaxweb.ir.parser import parse_module
from relaxweb.ir.printer import format_module
from relaxweb.passes import PassContext, place_kv_caches
from tests.helpers import rand
from tests.passes.rewrite import check_rewrite, check_unchanged


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
        check_rewrite(place_kv_caches, KV_CACHE_BEFORE, expected, [_kv_cache_inputs(), _kv_cache_inputs(past=0, new=4)])


@pytest.mark.parametrize("change, bounds, why", [
    ("", {"b": 2, "s": 4}, "p has no bound: no capacity"),
    ("output(y, present_k, present_v)|output(y, present_k, present_v, total)", KV_CACHE_BOUNDS,
     "present_k is also read by a sum, which would see the cache's layout"),
    ("", {"p": 8, "s": 4}, "b has no bound: the cache could not be sized at load"),
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
    assert why
    with PassContext(bounds=bounds):
        check_unchanged(place_kv_caches, before, _kv_cache_inputs())


def test_place_kv_caches_caches_a_present_no_op_reads() -> None:
    """A present that is only an output (no attention reads it) gets its cache too; the
    capacity is the bound of p + 1."""
    before = '''
@function(inputs=["past", "new"], outputs=["present"])
def main(past: Tensor((b, 3, p, 4), "float32"), new: Tensor((b, 3, 1, 4), "float32")) -> Tensor((b, 3, p + 1, 4), "float32"):
    with dataflow():
        present: Tensor((b, 3, p + 1, 4), "float32") = concat(past, new, axis=2)
        output(present)
    return present
'''
    expected = '''
@function(inputs=["past", "new"], outputs=["present"])
def main(past: Tensor((b, 3, p, 4), "float32"), new: Tensor((b, 3, 1, 4), "float32")) -> Tensor((b, 3, p + 1, 4), "float32"):
    with dataflow():
        cache: Tensor((b, 3, 7, 4), "float32") = kv_cache_write(past, new, axis=2, capacity=7)
        present: Tensor((b, 3, p + 1, 4), "float32") = kv_cache_view(cache, prim(p + 1), axis=2)
        output(present)
    return present
'''
    inputs = [{"past": rand(1, 3, length, 4, seed=length), "new": rand(1, 3, 1, 4, seed=9)} for length in (0, 3, 6)]
    with PassContext(bounds={"b": 1, "p": 6}):
        check_rewrite(place_kv_caches, before, expected, inputs)


def test_place_kv_caches_places_keys_and_values_together_or_not_at_all() -> None:
    """The values' present is no output (so no cache of its own): the keys' present, which
    the attention reads with it, stays a concat too.  A past that something else reads (the
    second layer's keys: a sum of the old rows) is no cache's either."""
    keys_only = KV_CACHE_BEFORE.replace('outputs=["y", "present_k", "present_v"]', 'outputs=["y", "present_k"]').replace(
        ', Tensor((b, 2, p + s, 8), "float32")):\n', '):\n', 1).replace(
        "output(y, present_k, present_v)", "output(y, present_k)").replace(
        "return (y, present_k, present_v)", "return (y, present_k)")
    assert keys_only.count("present_v") == 2
    with PassContext(bounds=KV_CACHE_BOUNDS):
        check_unchanged(place_kv_caches, keys_only, _kv_cache_inputs())
    past_read_twice = KV_CACHE_BEFORE.replace('outputs=["y", "present_k", "present_v"]', 'outputs=["y", "present_k", "present_v", "old"]').replace(
        'Tensor((b, 2, p + s, 8), "float32")):\n', 'Tensor((b, 2, p + s, 8), "float32"), Tensor((b, 2, 8), "float32")):\n', 1).replace(
        "        output(", '        old: Tensor((b, 2, 8), "float32") = sum(past_k, axes=[2])\n        output(').replace(
        "output(y, present_k, present_v)", "output(y, present_k, present_v, old)").replace(
        "return (y, present_k, present_v)", "return (y, present_k, present_v, old)")
    assert "sum(past_k" in past_read_twice and past_read_twice.count("old") == 4
    with PassContext(bounds=KV_CACHE_BOUNDS):
        check_unchanged(place_kv_caches, past_read_twice, _kv_cache_inputs())


def test_place_kv_caches_gives_every_attention_reading_the_pair_the_caches() -> None:
    """Two attentions read the same presents (one cache pair): both read the caches' valid
    prefix."""
    def two_attentions(k: str, v: str, length: str) -> str:
        return f'''
        y: Tensor((b, 4, s, 8), "float32") = attention(q, {k}, {v}, mask{length}, scale=0.5)
        z: Tensor((b, 4, s, 8), "float32") = attention(q, {k}, {v}, mask{length}, scale=0.25)
        output(y, z, present_k, present_v)
    return (y, z, present_k, present_v)
'''
    signature = KV_CACHE_BEFORE[:KV_CACHE_BEFORE.index("    with dataflow():")].replace(
        'outputs=["y", "present_k", "present_v"]', 'outputs=["y", "z", "present_k", "present_v"]').replace(
        '-> Tuple(Tensor((b, 4, s, 8), "float32"), ', '-> Tuple(Tensor((b, 4, s, 8), "float32"), Tensor((b, 4, s, 8), "float32"), ')
    before = signature + '''    with dataflow():
        present_k: Tensor((b, 2, p + s, 8), "float32") = concat(past_k, new_k, axis=2)
        present_v: Tensor((b, 2, p + s, 8), "float32") = concat(past_v, new_v, axis=2)''' + two_attentions(
        "present_k", "present_v", "")
    expected = signature + '''    with dataflow():
        k_cache: Tensor((b, 2, 12, 8), "float32") = kv_cache_write(past_k, new_k, axis=2, capacity=12)
        present_k: Tensor((b, 2, p + s, 8), "float32") = kv_cache_view(k_cache, prim(p + s), axis=2)
        v_cache: Tensor((b, 2, 12, 8), "float32") = kv_cache_write(past_v, new_v, axis=2, capacity=12)
        present_v: Tensor((b, 2, p + s, 8), "float32") = kv_cache_view(v_cache, prim(p + s), axis=2)''' + two_attentions(
        "k_cache", "v_cache", ", prim(p + s)")
    with PassContext(bounds=KV_CACHE_BOUNDS):
        check_rewrite(place_kv_caches, before, expected, [_kv_cache_inputs(), _kv_cache_inputs(past=8, new=4)])


# onnxruntime's GroupQueryAttention as the converter writes it: the past's head size checked
# (the model names it kv_cache_dim), each entry's new rows after its own past length
# (ragged_concat), and the outputs the importer's copies of the presents the attention reads.
GQA_BEFORE = '''
@function(inputs=["q", "past_k", "new_k", "past_v", "new_v", "lengths", "mask"], outputs=["y", "present_k", "present_v"])
def main(q: Tensor((b, 4, s, 8), "float32"), past_k: Tensor((b, 2, p, d), "float32"), new_k: Tensor((b, 2, s, 8), "float32"), past_v: Tensor((b, 2, p, d), "float32"), new_v: Tensor((b, 2, s, 8), "float32"), lengths: Tensor((b,), "int32"), mask: Tensor((b, 1, s, p + s), "float32")) -> Tuple(Tensor((b, 4, s, 8), "float32"), Tensor((b, 2, p + s, 8), "float32"), Tensor((b, 2, p + s, 8), "float32")):
    with dataflow():
        past_k_checked: Tensor((b, 2, p, 8), "float32") = match_cast(past_k, Tensor((b, 2, p, 8), "float32"), reason="dimension 3 of past_k")
        keys: Tensor((b, 2, p + s, 8), "float32") = ragged_concat(past_k_checked, new_k, lengths, axis=2)
        past_v_checked: Tensor((b, 2, p, 8), "float32") = match_cast(past_v, Tensor((b, 2, p, 8), "float32"), reason="dimension 3 of past_v")
        values: Tensor((b, 2, p + s, 8), "float32") = ragged_concat(past_v_checked, new_v, lengths, axis=2)
        y: Tensor((b, 4, s, 8), "float32") = attention(q, keys, values, mask, scale=0.5)
        present_k: Tensor((b, 2, p + s, 8), "float32") = identity(keys)
        present_v: Tensor((b, 2, p + s, 8), "float32") = identity(values)
        output(y, present_k, present_v)
    return (y, present_k, present_v)
'''


def _gqa_inputs(past: int, new: int, lengths: list[int]) -> dict[str, np.ndarray]:
    inputs = _kv_cache_inputs(past, new)
    return inputs | {"lengths": np.array(lengths, np.int32)}


def test_place_kv_caches_caches_ragged_appends_through_checks_and_output_copies() -> None:
    """Each ragged_concat of a checked past becomes a cache written with the entries' past
    lengths; the outputs (copies of what the attention reads) become the caches' views."""
    expected = '''
@function(inputs=["q", "past_k", "new_k", "past_v", "new_v", "lengths", "mask"], outputs=["y", "present_k", "present_v"])
def main(q: Tensor((b, 4, s, 8), "float32"), past_k: Tensor((b, 2, p, d), "float32"), new_k: Tensor((b, 2, s, 8), "float32"), past_v: Tensor((b, 2, p, d), "float32"), new_v: Tensor((b, 2, s, 8), "float32"), lengths: Tensor((b,), "int32"), mask: Tensor((b, 1, s, p + s), "float32")) -> Tuple(Tensor((b, 4, s, 8), "float32"), Tensor((b, 2, p + s, 8), "float32"), Tensor((b, 2, p + s, 8), "float32")):
    with dataflow():
        past_k_checked: Tensor((b, 2, p, 8), "float32") = match_cast(past_k, Tensor((b, 2, p, 8), "float32"), reason="dimension 3 of past_k")
        keys_cache: Tensor((b, 2, 12, 8), "float32") = kv_cache_write(past_k_checked, new_k, lengths, axis=2, capacity=12)
        past_v_checked: Tensor((b, 2, p, 8), "float32") = match_cast(past_v, Tensor((b, 2, p, 8), "float32"), reason="dimension 3 of past_v")
        values_cache: Tensor((b, 2, 12, 8), "float32") = kv_cache_write(past_v_checked, new_v, lengths, axis=2, capacity=12)
        y: Tensor((b, 4, s, 8), "float32") = attention(q, keys_cache, values_cache, mask, prim(p + s), scale=0.5)
        present_k: Tensor((b, 2, p + s, 8), "float32") = kv_cache_view(keys_cache, prim(p + s), axis=2)
        present_v: Tensor((b, 2, p + s, 8), "float32") = kv_cache_view(values_cache, prim(p + s), axis=2)
        output(y, present_k, present_v)
    return (y, present_k, present_v)
'''
    inputs = [_gqa_inputs(5, 2, [5, 3]), _gqa_inputs(0, 4, [0, 0]), _gqa_inputs(6, 1, [6, 9])]
    with PassContext(bounds=KV_CACHE_BOUNDS):
        check_rewrite(place_kv_caches, GQA_BEFORE, expected, inputs)


def test_place_kv_caches_leaves_a_copied_present_that_something_else_reads() -> None:
    """The keys the output copies are also summed: no cache for them, nor for the values."""
    before = GQA_BEFORE.replace(
        "        present_v: Tensor((b, 2, p + s, 8), \"float32\") = identity(values)\n",
        "        present_v: Tensor((b, 2, p + s, 8), \"float32\") = identity(values)\n"
        "        total: Tensor((b, 2, 8), \"float32\") = sum(keys, axes=[2])\n").replace(
        'outputs=["y", "present_k", "present_v"]', 'outputs=["y", "present_k", "present_v", "total"]').replace(
        'Tensor((b, 2, p + s, 8), "float32")):\n', 'Tensor((b, 2, p + s, 8), "float32"), Tensor((b, 2, 8), "float32")):\n', 1
    ).replace("output(y, present_k, present_v)", "output(y, present_k, present_v, total)").replace(
        "return (y, present_k, present_v)", "return (y, present_k, present_v, total)")
    assert before.count("total") == 4
    with PassContext(bounds=KV_CACHE_BOUNDS):
        check_unchanged(place_kv_caches, before, _gqa_inputs(5, 2, [5, 3]))


def test_place_kv_caches_ignores_readers_the_outputs_do_not_need() -> None:
    """A reshape of a present that nothing uses (the importer leaves such layout ops where a
    converter looked through them) does not stop the caches; the present keeps its name as
    a view for it, and canonicalize_bindings drops both later."""
    before = KV_CACHE_BEFORE.replace(
        "        y: Tensor((b, 4, s, 8)",
        '        unused: Tensor((b, 2, 1, p + s, 8), "float32") = reshape(present_k, shape((b, 2, 1, p + s, 8)))\n'
        "        y: Tensor((b, 4, s, 8)")
    expected = '''
@function(inputs=["q", "past_k", "new_k", "past_v", "new_v", "mask"], outputs=["y", "present_k", "present_v"])
def main(q: Tensor((b, 4, s, 8), "float32"), past_k: Tensor((b, 2, p, 8), "float32"), new_k: Tensor((b, 2, s, 8), "float32"), past_v: Tensor((b, 2, p, 8), "float32"), new_v: Tensor((b, 2, s, 8), "float32"), mask: Tensor((b, 1, s, p + s), "float32")) -> Tuple(Tensor((b, 4, s, 8), "float32"), Tensor((b, 2, p + s, 8), "float32"), Tensor((b, 2, p + s, 8), "float32")):
    with dataflow():
        present_k_cache: Tensor((b, 2, 12, 8), "float32") = kv_cache_write(past_k, new_k, axis=2, capacity=12)
        present_k: Tensor((b, 2, p + s, 8), "float32") = kv_cache_view(present_k_cache, prim(p + s), axis=2)
        present_v_cache: Tensor((b, 2, 12, 8), "float32") = kv_cache_write(past_v, new_v, axis=2, capacity=12)
        present_v: Tensor((b, 2, p + s, 8), "float32") = kv_cache_view(present_v_cache, prim(p + s), axis=2)
        unused: Tensor((b, 2, 1, p + s, 8), "float32") = reshape(present_k, shape((b, 2, 1, p + s, 8)))
        y: Tensor((b, 4, s, 8), "float32") = attention(q, present_k_cache, present_v_cache, mask, prim(p + s), scale=0.5)
        output(y, present_k, present_v)
    return (y, present_k, present_v)
'''
    with PassContext(bounds=KV_CACHE_BOUNDS):
        check_rewrite(place_kv_caches, before, expected, [_kv_cache_inputs()])


def test_place_kv_caches_keeps_a_copied_present_that_an_unneeded_binding_reads() -> None:
    """The keys the output copies are also reshaped for nothing: they stay, as a view too."""
    before = GQA_BEFORE.replace(
        "        y: Tensor((b, 4, s, 8)",
        '        unused: Tensor((b, 2, 1, p + s, 8), "float32") = reshape(keys, shape((b, 2, 1, p + s, 8)))\n'
        "        y: Tensor((b, 4, s, 8)")
    with PassContext(bounds=KV_CACHE_BOUNDS):
        after = place_kv_caches(parse_module(before))
    text = format_module(after)
    assert 'keys: Tensor((b, 2, p + s, 8), "float32") = kv_cache_view(keys_cache, prim(p + s), axis=2)' in text
    assert 'present_k: Tensor((b, 2, p + s, 8), "float32") = kv_cache_view(keys_cache, prim(p + s), axis=2)' in text
    assert "values:" not in text and "identity" not in text
