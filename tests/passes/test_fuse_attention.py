"""fuse_attention: the attention subgraph exporters write, rewritten into one ``attention`` op.

What the pass promises (relaxweb/passes/fuse_attention.py): ``matmul(q, k_t)``, an optional
scale by a one-element constant (``multiply`` on either side, or ``divide``), an optional
mask ``add`` (on either side), ``softmax`` over the last axis and ``matmul(weights, v)``
become ``attention(q, k, v, [mask], scale=c)``, with ``k`` the transpose that undoes
``k_t``'s (none when that is the exporter's tensor); repeated key / value heads are read in
place and run-time checks on the scores or v become one check of the mask, shared by the
layers reading it.  torch's ``scaled_dot_product_attention`` exports (q and k_t each scaled,
``where(isnan(weights), 0, weights)`` before the value product, the dynamo exporter's
flattened key transpose) fuse too (``zero_nan_rows=True``).  It fires only where the rewrite
computes the same thing; anything else is left as it is.  Every attention site (a softmax
whose weights a matmul multiplies by values) is recorded in the module's attrs, fused or not
and why not: the expected texts say so (:func:`sites`).
"""

from __future__ import annotations

import numpy as np
import pytest

from relaxweb.ir.printer import format_literal
from relaxweb.passes import fuse_attention
from tests.helpers import rand
from tests.passes.rewrite import check_rewrite, run


def sites(*records: tuple) -> str:
    """The module's attrs line for the attention sites the pass records, each given as
    (softmax, scores, output, why not: "" when fused)."""
    items = [{"softmax": softmax, "scores": scores, "output": output, "fused": not reason, "reason": reason}
             for softmax, scores, output, reason in records]
    return f"attrs = {format_literal({'attention_sites': items})}\n"


FUSED = ("weights", "scores", "y", "")  # the site of the texts below, fused


def check_not_fused(before: str, reason: str, inputs, site: tuple = ("weights", "scores", "y")) -> None:
    """The graph stays as it is and its site is recorded as not fused, because of ``reason``."""
    check_rewrite(fuse_attention, before, sites((*site, reason)) + before, inputs)


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


def _attention_inputs(finite: bool = False) -> dict[str, np.ndarray]:
    """A mask of -inf and 0, or (``finite``) of normal values: no row or column of the
    scores all -inf, whose softmax would be NaN, in the graphs left alone."""
    mask = rand(2, 1, 1, 5, seed=4) if finite else np.where(rand(2, 1, 1, 5, seed=4) > 0.5, -np.inf, 0.0).astype(np.float32)
    return {"q": rand(2, 2, 5, 4, seed=1), "keys": rand(2, 5, 2, 4, seed=2), "v": rand(2, 2, 5, 3, seed=3), "mask": mask}


@pytest.mark.parametrize("order", ["add(scaled, mask)", "add(mask, scaled)"])
def test_fuse_attention_rewrites_the_exported_subgraph_into_one_op(order: str) -> None:
    """The keys' transpose becomes the one that gives [b, 2, s, 4]; scores, scale, mask add
    and softmax go (the mask on either side of the add)."""
    expected = sites(FUSED) + '''
@function(inputs=["q", "keys", "v", "mask"], outputs=["y"])
def main(q: Tensor((b, 2, s, 4), "float32"), keys: Tensor((b, s, 2, 4), "float32"), v: Tensor((b, 2, s, 3), "float32"), mask: Tensor((b, 1, 1, s), "float32")) -> Tensor((b, 2, s, 3), "float32"):
    with dataflow():
        k_t_keys: Tensor((b, 2, s, 4), "float32") = transpose(keys, axes=[0, 2, 1, 3])
        y: Tensor((b, 2, s, 3), "float32") = attention(q, k_t_keys, v, mask, scale=0.5)
        output(y)
    return y
'''
    check_rewrite(fuse_attention, ATTENTION_BEFORE.replace("add(scaled, mask)", order), expected, _attention_inputs())


@pytest.mark.parametrize("change, why", [
    ("softmax(masked, axes=[3])|softmax(masked, axes=[2])", "the softmax is over axes [2], not the last one alone (the keys)"),
    ("output(y)|output(y, scores)", "the scores (scores) are also read elsewhere"),
    ('const("c", 0.5, "float32")|mask',
     "the scores are scaled (multiply) by something other than a one-element float constant"),
    ("add(scaled, mask)|subtract(scaled, mask)", "the scores are not a matmul of q and k (through a constant scale)"),
])
def test_fuse_attention_leaves_other_graphs_alone_and_says_why(change: str, why: str) -> None:
    old, new = change.split("|")
    before = ATTENTION_BEFORE.replace(old, new)
    if "output(y, scores)" in before:  # scores becomes a variable of the function
        before = before.replace('outputs=["y"]', 'outputs=["y", "scores"]').replace(
            'Tensor((b, 2, s, 3), "float32"):\n', 'Tuple(Tensor((b, 2, s, 3), "float32"), Tensor((b, 2, s, s), "float32")):\n', 1
        ).replace("    return y", "    return (y, scores)")
    assert before != ATTENTION_BEFORE
    scores = None if "subtract" in before else "scores"  # the softmax reads no matmul's scores
    check_not_fused(before, why, _attention_inputs(finite=True), ("weights", scores, "y"))


@pytest.mark.parametrize("scaled, scale", [
    ('multiply(const("c", 0.5, "float32"), scores)', 0.5),
    ('divide(scores, const("c", 4.0, "float32"))', 0.25),
    ("scores", 1.0),
], ids=["constant first", "divided", "no scale"])
def test_fuse_attention_takes_the_scale_on_either_side_divided_or_none(scaled: str, scale: float) -> None:
    before = ATTENTION_BEFORE.replace('multiply(scores, const("c", 0.5, "float32"))', scaled)
    if scaled == "scores":
        before = before.replace('        scaled: Tensor((b, 2, s, s), "float32") = scores\n', "").replace(
            "add(scaled, mask)", "add(scores, mask)")
    expected = sites(FUSED) + f'''
@function(inputs=["q", "keys", "v", "mask"], outputs=["y"])
def main(q: Tensor((b, 2, s, 4), "float32"), keys: Tensor((b, s, 2, 4), "float32"), v: Tensor((b, 2, s, 3), "float32"), mask: Tensor((b, 1, 1, s), "float32")) -> Tensor((b, 2, s, 3), "float32"):
    with dataflow():
        k: Tensor((b, 2, s, 4), "float32") = transpose(keys, axes=[0, 2, 1, 3])
        y: Tensor((b, 2, s, 3), "float32") = attention(q, k, v, mask, scale={scale})
        output(y)
    return y
'''
    check_rewrite(fuse_attention, before, expected, _attention_inputs())


def test_fuse_attention_reads_keys_in_place_without_a_mask() -> None:
    """Keys [b, 2, s, 4] transposed by [0, 1, 3, 2] are the op's k: the transpose goes and
    no new one is written; without a mask add the op has none (softmax over axis -1)."""
    before = '''
@function(inputs=["q", "k", "v"], outputs=["y"])
def main(q: Tensor((b, 2, s, 4), "float32"), k: Tensor((b, 2, t, 4), "float32"), v: Tensor((b, 2, t, 3), "float32")) -> Tensor((b, 2, s, 3), "float32"):
    with dataflow():
        k_t: Tensor((b, 2, 4, t), "float32") = transpose(k, axes=[0, 1, 3, 2])
        scores: Tensor((b, 2, s, t), "float32") = matmul(q, k_t)
        scaled: Tensor((b, 2, s, t), "float32") = multiply(scores, const("c", 0.5, "float32"))
        weights: Tensor((b, 2, s, t), "float32") = softmax(scaled, axes=[-1])
        y: Tensor((b, 2, s, 3), "float32") = matmul(weights, v)
        output(y)
    return y
'''
    expected = sites(FUSED) + '''
@function(inputs=["q", "k", "v"], outputs=["y"])
def main(q: Tensor((b, 2, s, 4), "float32"), k: Tensor((b, 2, t, 4), "float32"), v: Tensor((b, 2, t, 3), "float32")) -> Tensor((b, 2, s, 3), "float32"):
    with dataflow():
        y: Tensor((b, 2, s, 3), "float32") = attention(q, k, v, scale=0.5)
        output(y)
    return y
'''
    inputs = {"q": rand(2, 2, 3, 4, seed=1), "k": rand(2, 2, 5, 4, seed=2), "v": rand(2, 2, 5, 3, seed=3)}
    check_rewrite(fuse_attention, before, expected, inputs)


def test_fuse_attention_leaves_a_symbolic_head_size_and_a_mask_that_broadcasts_the_scores_alone() -> None:
    """The kernel needs a constant head size; a mask [b, 2, s, s] over scores [b, 1, s, s]
    would make every head of the result read one head of the scores."""
    symbolic = (ATTENTION_BEFORE.replace("s, 4)", "s, d)").replace("2, 4", "2, d"))
    assert symbolic.count(", d") == 3
    check_not_fused(symbolic, "the head sizes (d, 3) are not constants", _attention_inputs(finite=True))
    broadcast = '''
@function(inputs=["q", "k", "v", "mask"], outputs=["y"])
def main(q: Tensor((b, 1, s, 4), "float32"), k: Tensor((b, 1, s, 4), "float32"), v: Tensor((b, 1, s, 3), "float32"), mask: Tensor((b, 2, s, s), "float32")) -> Tensor((b, 2, s, 3), "float32"):
    with dataflow():
        k_t: Tensor((b, 1, 4, s), "float32") = transpose(k, axes=[0, 1, 3, 2])
        scores: Tensor((b, 1, s, s), "float32") = matmul(q, k_t)
        masked: Tensor((b, 2, s, s), "float32") = add(scores, mask)
        weights: Tensor((b, 2, s, s), "float32") = softmax(masked, axes=[3])
        y: Tensor((b, 2, s, 3), "float32") = matmul(weights, v)
        output(y)
    return y
'''
    inputs = {"q": rand(2, 1, 3, 4, seed=1), "k": rand(2, 1, 3, 4, seed=2), "v": rand(2, 1, 3, 3, seed=3),
              "mask": rand(2, 2, 3, 3, seed=4)}
    check_not_fused(broadcast, "the mask (b, 2, s, s) broadcasts the scores (b, 1, s, s) up (a dim not 1 or theirs)", inputs)


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
    expected = sites(FUSED) + '''
@function(inputs=["q", "past", "new", "mask"], outputs=["y", "present"])
def main(q: Tensor((b, 4, s, 8), "float32"), past: Tensor((b, 2, p, 8), "float32"), new: Tensor((b, 2, s, 8), "float32"), mask: Tensor((b, 1, s, t), "float32")) -> Tuple(Tensor((b, 4, s, 8), "float32"), Tensor((b, 2, p + s, 8), "float32")):
    with dataflow():
        present: Tensor((b, 2, p + s, 8), "float32") = concat(past, new, axis=2)
        mask_checked: Tensor((b, 1, s, p + s), "float32") = match_cast(mask, Tensor((b, 1, s, p + s), "float32"), reason="Add node 'add': dimension 3 of input 0 ('scaled') against the attention mask: its dimension 3 (t)")
        y: Tensor((b, 4, s, 8), "float32") = attention(q, present, present, mask_checked, scale=0.5)
        output(y, present)
    return (y, present)
'''
    check_rewrite(fuse_attention, DECODER_ATTENTION_BEFORE, expected,
                  [_decoder_attention_inputs(), _decoder_attention_inputs(past=0, new=5)])


def test_fuse_attention_keeps_checks_the_mask_would_not_state() -> None:
    """A mask of one column states nothing about the key length: the checks stay, so does
    the unfused graph."""
    before = DECODER_ATTENTION_BEFORE.replace("mask: Tensor((b, 1, s, t)", "mask: Tensor((b, 1, s, 1)")
    check_not_fused(before, "a run-time shape check between its ops (Add node 'add': dimension 3 of input 0 ('scaled')) "
                    "that a check of the mask would not state", {**_decoder_attention_inputs(), "mask": rand(2, 1, 3, 1, seed=4)})


def test_fuse_attention_checks_a_mask_two_layers_read_once() -> None:
    """Two layers' scores [b, 2, s, p + s] are checked against one mask [b, 1, s, t]: one
    check of the mask against p + s, before the first layer's attention, serves both."""
    mask_check = '''
        mask_checked: Tensor((b, 1, s, p + s), "float32") = match_cast(mask, Tensor((b, 1, s, p + s), "float32"), reason="Add node 'add1': dimension 3 of input 0 against the attention mask: its dimension 3 (t)")'''

    def layer(index: int, fused: bool) -> str:
        if fused:
            attention = f'''
        y{index}: Tensor((b, 2, s, 8), "float32") = attention(q{index}, present{index}, present{index}, mask_checked, scale=1.0)'''
            return f'''
        present{index}: Tensor((b, 2, p + s, 8), "float32") = concat(past{index}, new{index}, axis=2)''' + (
                mask_check if index == 1 else "") + attention
        return f'''
        present{index}: Tensor((b, 2, p + s, 8), "float32") = concat(past{index}, new{index}, axis=2)
        k_t{index}: Tensor((b, 2, 8, p + s), "float32") = transpose(present{index}, axes=[0, 1, 3, 2])
        scores{index}: Tensor((b, 2, s, p + s), "float32") = matmul(q{index}, k_t{index})
        checked{index}: Tensor((b, 2, s, t), "float32") = match_cast(scores{index}, Tensor((b, 2, s, t), "float32"), reason="Add node 'add{index}': dimension 3 of input 0")
        masked{index}: Tensor((b, 2, s, t), "float32") = add(checked{index}, mask)
        weights{index}: Tensor((b, 2, s, t), "float32") = softmax(masked{index}, axes=[3])
        v{index}: Tensor((b, 2, t, 8), "float32") = match_cast(present{index}, Tensor((b, 2, t, 8), "float32"), reason="MatMul node 'mm{index}': dimension 2 of input 1")
        y{index}: Tensor((b, 2, s, 8), "float32") = matmul(weights{index}, v{index})'''

    layer_inputs = ", ".join(f'q{i}: Tensor((b, 2, s, 8), "float32"), past{i}: Tensor((b, 2, p, 8), "float32"), new{i}: Tensor((b, 2, s, 8), "float32")'
                             for i in (1, 2))
    function = ('''
@function(inputs=["q1", "past1", "new1", "q2", "past2", "new2", "mask"], outputs=["y1", "y2"])
def main(''' + layer_inputs + ''', mask: Tensor((b, 1, s, t), "float32")) -> Tuple(Tensor((b, 2, s, 8), "float32"), Tensor((b, 2, s, 8), "float32")):
    with dataflow():{layers}
        output(y1, y2)
    return (y1, y2)
''')
    before = function.format(layers=layer(1, False) + layer(2, False))
    expected = sites(*((f"weights{i}", f"scores{i}", f"y{i}", "") for i in (1, 2))) + function.format(
        layers=layer(1, True) + layer(2, True))
    past, new = 4, 2
    inputs = {name: rand(2, 2, length, 8, seed=seed) for seed, (name, length) in enumerate(
        [("q1", new), ("past1", past), ("new1", new), ("q2", new), ("past2", past), ("new2", new)])}
    inputs["mask"] = np.where(rand(2, 1, new, past + new, seed=9) > 1.0, -np.inf, 0.0).astype(np.float32)
    check_rewrite(fuse_attention, before, expected, inputs)


# What torch writes for scaled_dot_product_attention (transformers' default attention), legacy
# exporter: q and k_t each scaled by the root of the scale, a mask of where(mask, 0, -inf),
# and the weights' NaN rows (every key masked) set to 0 before the value product.
SDPA_BEFORE = '''
@function(inputs=["q", "keys", "v", "mask"], outputs=["y"])
def main(q: Tensor((b, 2, s, 4), "float32"), keys: Tensor((b, s, 2, 4), "float32"), v: Tensor((b, 2, s, 3), "float32"), mask: Tensor((b, 1, s, s), "float32")) -> Tensor((b, 2, s, 3), "float32"):
    with dataflow():
        k_t: Tensor((b, 2, 4, s), "float32") = transpose(keys, axes=[0, 2, 3, 1])
        q_scaled: Tensor((b, 2, s, 4), "float32") = multiply(q, const("c", 0.5, "float32"))
        k_scaled: Tensor((b, 2, 4, s), "float32") = multiply(k_t, const("c2", 0.25, "float32"))
        scores: Tensor((b, 2, s, s), "float32") = matmul(q_scaled, k_scaled)
        masked: Tensor((b, 2, s, s), "float32") = add(scores, mask)
        weights: Tensor((b, 2, s, s), "float32") = softmax(masked, axes=[3])
        nan: Tensor((b, 2, s, s), "bool") = isnan(weights)
        zeroed: Tensor((b, 2, s, s), "float32") = where(nan, const("zero", 0.0, "float32"), weights)
        y: Tensor((b, 2, s, 3), "float32") = matmul(zeroed, v)
        output(y)
    return y
'''


def _sdpa_inputs(keys_shape: tuple = (2, 5, 2, 4)) -> dict[str, np.ndarray]:
    """A -inf / 0 mask with query row 1 of batch 0 masked out entirely (NaN weights, 0 after
    the where) and a row of batch 1 masked with torch's finite minimum."""
    mask = np.where(rand(2, 1, 5, 5, seed=4) > 0.8, -np.inf, 0.0).astype(np.float32)
    mask[0, 0, 1] = -np.inf
    mask[1, 0, 3] = np.float32(-3.4028235e38)
    return {"q": rand(2, 2, 5, 4, seed=1), "keys": rand(keys_shape, seed=2), "v": rand(2, 2, 5, 3, seed=3), "mask": mask}


def test_fuse_attention_reads_torchs_scaled_dot_product_attention() -> None:
    """The scales of q and k_t join the kernel's (0.5 * 0.25), and the where of the weights'
    NaN tests becomes zero_nan_rows: the masked-out row is 0, as the where makes it."""
    expected = sites(("weights", "scores", "y", "")) + '''
@function(inputs=["q", "keys", "v", "mask"], outputs=["y"])
def main(q: Tensor((b, 2, s, 4), "float32"), keys: Tensor((b, s, 2, 4), "float32"), v: Tensor((b, 2, s, 3), "float32"), mask: Tensor((b, 1, s, s), "float32")) -> Tensor((b, 2, s, 3), "float32"):
    with dataflow():
        k: Tensor((b, 2, s, 4), "float32") = transpose(keys, axes=[0, 2, 1, 3])
        y: Tensor((b, 2, s, 3), "float32") = attention(q, k, v, mask, scale=0.125, zero_nan_rows=True)
        output(y)
    return y
'''
    inputs = _sdpa_inputs()
    result = run(check_rewrite(fuse_attention, SDPA_BEFORE, expected, inputs), inputs)[0]
    assert (result[0, :, 1] == 0).all() and np.isfinite(result).all()


def test_fuse_attention_reads_the_dynamo_exporters_flattened_key_transpose() -> None:
    """torch.export writes k.transpose(-2, -1) of k [b, 2, s, 4] as a reshape to [b * 2, s, 4],
    a transpose of the last two axes and a reshape back: k itself, no transpose left."""
    before = SDPA_BEFORE.replace(
        'keys: Tensor((b, s, 2, 4), "float32")', 'keys: Tensor((b, 2, s, 4), "float32")').replace(
        '''        k_t: Tensor((b, 2, 4, s), "float32") = transpose(keys, axes=[0, 2, 3, 1])''',
        '''        flat: Tensor((b * 2, s, 4), "float32") = reshape(keys, shape((b * 2, s, 4)))
        flat_t: Tensor((b * 2, 4, s), "float32") = transpose(flat, axes=[0, 2, 1])
        k_t: Tensor((b, 2, 4, s), "float32") = reshape(flat_t, shape((b, 2, 4, s)))''')
    expected = sites(("weights", "scores", "y", "")) + '''
@function(inputs=["q", "keys", "v", "mask"], outputs=["y"])
def main(q: Tensor((b, 2, s, 4), "float32"), keys: Tensor((b, 2, s, 4), "float32"), v: Tensor((b, 2, s, 3), "float32"), mask: Tensor((b, 1, s, s), "float32")) -> Tensor((b, 2, s, 3), "float32"):
    with dataflow():
        y: Tensor((b, 2, s, 3), "float32") = attention(q, keys, v, mask, scale=0.125, zero_nan_rows=True)
        output(y)
    return y
'''
    check_rewrite(fuse_attention, before, expected, _sdpa_inputs((2, 2, 5, 4)))


def test_fuse_attention_keeps_a_flattened_transpose_that_is_no_swap() -> None:
    """A transpose of the flattened keys' first two axes is not k's last two swapped: it stays,
    and the op reads its keys through a transpose of its own (the same values either way)."""
    before = SDPA_BEFORE.replace(
        'keys: Tensor((b, s, 2, 4), "float32")', 'keys: Tensor((2, b, 4, s), "float32")').replace(
        '''        k_t: Tensor((b, 2, 4, s), "float32") = transpose(keys, axes=[0, 2, 3, 1])''',
        '''        flat: Tensor((2, b * 4, s), "float32") = reshape(keys, shape((2, b * 4, s)))
        flat_t: Tensor((b * 4, 2, s), "float32") = transpose(flat, axes=[1, 0, 2])
        k_t: Tensor((b, 2, 4, s), "float32") = reshape(flat_t, shape((b, 2, 4, s)))''').replace("b, 2, s, 4), \"float32\") = multiply", "b, 2, s, 4), \"float32\") = multiply")
    expected = sites(("weights", "scores", "y", "")) + '''
@function(inputs=["q", "keys", "v", "mask"], outputs=["y"])
def main(q: Tensor((b, 2, s, 4), "float32"), keys: Tensor((2, b, 4, s), "float32"), v: Tensor((b, 2, s, 3), "float32"), mask: Tensor((b, 1, s, s), "float32")) -> Tensor((b, 2, s, 3), "float32"):
    with dataflow():
        flat: Tensor((2, b * 4, s), "float32") = reshape(keys, shape((2, b * 4, s)))
        flat_t: Tensor((b * 4, 2, s), "float32") = transpose(flat, axes=[1, 0, 2])
        k_t: Tensor((b, 2, 4, s), "float32") = reshape(flat_t, shape((b, 2, 4, s)))
        k_t_keys: Tensor((b, 2, s, 4), "float32") = transpose(k_t, axes=[0, 1, 3, 2])
        y: Tensor((b, 2, s, 3), "float32") = attention(q, k_t_keys, v, mask, scale=0.125, zero_nan_rows=True)
        output(y)
    return y
'''
    check_rewrite(fuse_attention, before, expected, _sdpa_inputs((2, 2, 4, 5)))


WHERE_OF_OTHER_ROWS = ("the value product reads the weights through a where whose condition is neither isnan(weights) "
                       "nor a constant false (it may set rows to 0 that the kernel would not)")


@pytest.mark.parametrize("change, why", [
    ('where(nan, const("zero", 0.0, "float32"), weights)|where(nan, const("zero", 1.0, "float32"), weights)',
     "the value product reads the weights through something other than where(isnan(weights), 0, weights)"),
    ("isnan(weights)|isinf(weights)", WHERE_OF_OTHER_ROWS),
    ('where(nan, const("zero", 0.0, "float32"), weights)|where(const("rows", [[True], [False], [False], [False], '
     '[False]], "bool"), const("zero", 0.0, "float32"), weights)', WHERE_OF_OTHER_ROWS),
    ("output(y)|output(y, nan)", "the weights' NaN tests (nan) are also read elsewhere"),
    ("output(y)|output(y, zeroed)", "the NaN-zeroed weights (zeroed) are also read elsewhere"),
])
def test_fuse_attention_leaves_other_nan_handling_alone(change: str, why: str) -> None:
    """Only where(isnan(weights), 0, weights), read by the value product alone, is what
    zero_nan_rows computes."""
    old, new = change.split("|")
    before = SDPA_BEFORE.replace(old, new)
    for extra, dtype in (("nan", "bool"), ("zeroed", "float32")):
        if f"output(y, {extra})" in before:
            before = before.replace('outputs=["y"]', f'outputs=["y", "{extra}"]').replace(
                'Tensor((b, 2, s, 3), "float32"):\n', f'Tuple(Tensor((b, 2, s, 3), "float32"), Tensor((b, 2, s, s), "{dtype}")):\n',
                1).replace("    return y", f"    return (y, {extra})")
    assert before != SDPA_BEFORE
    check_not_fused(before, why, _sdpa_inputs())


def test_fuse_attention_reads_onnx_attentions_where_of_no_row() -> None:
    """ONNX's Attention function (opset 23) writes where(rows_all_masked, 0, weights); without a
    mask hiding whole rows the condition is a constant false: the where is the weights, and
    the op leaves NaN rows NaN (no zero_nan_rows)."""
    before = SDPA_BEFORE.replace('        nan: Tensor((b, 2, s, s), "bool") = isnan(weights)\n', "").replace(
        'where(nan, const("zero", 0.0, "float32"), weights)',
        'where(const("rows", [[False], [False], [False], [False], [False]], "bool"), const("zero", 0.0, "float32"), '
        'weights)')
    expected = sites(("weights", "scores", "y", "")) + '''
@function(inputs=["q", "keys", "v", "mask"], outputs=["y"])
def main(q: Tensor((b, 2, s, 4), "float32"), keys: Tensor((b, s, 2, 4), "float32"), v: Tensor((b, 2, s, 3), "float32"), mask: Tensor((b, 1, s, s), "float32")) -> Tensor((b, 2, s, 3), "float32"):
    with dataflow():
        k: Tensor((b, 2, s, 4), "float32") = transpose(keys, axes=[0, 2, 1, 3])
        y: Tensor((b, 2, s, 3), "float32") = attention(q, k, v, mask, scale=0.125)
        output(y)
    return y
'''
    check_rewrite(fuse_attention, before, expected, _sdpa_inputs())


def test_fuse_attention_leaves_a_q_scaled_by_a_tensor_in_place() -> None:
    """q scaled by a tensor (not a one-element constant) stays: the op reads the product."""
    before = SDPA_BEFORE.replace('multiply(q, const("c", 0.5, "float32"))', "multiply(q, q)")
    expected = sites(("weights", "scores", "y", "")) + '''
@function(inputs=["q", "keys", "v", "mask"], outputs=["y"])
def main(q: Tensor((b, 2, s, 4), "float32"), keys: Tensor((b, s, 2, 4), "float32"), v: Tensor((b, 2, s, 3), "float32"), mask: Tensor((b, 1, s, s), "float32")) -> Tensor((b, 2, s, 3), "float32"):
    with dataflow():
        q_scaled: Tensor((b, 2, s, 4), "float32") = multiply(q, q)
        k: Tensor((b, 2, s, 4), "float32") = transpose(keys, axes=[0, 2, 1, 3])
        y: Tensor((b, 2, s, 3), "float32") = attention(q_scaled, k, v, mask, scale=0.25, zero_nan_rows=True)
        output(y)
    return y
'''
    check_rewrite(fuse_attention, before, expected, _sdpa_inputs())


def test_fuse_attention_rewrites_a_graph_with_control_flow() -> None:
    """A graph with an If has no dataflow blocks (ONNX's If: optimum's merged decoders): the
    attention in a branch fuses all the same, its new variables plain ones."""
    before = '''
@function(inputs=["q", "keys", "v", "mask", "flag"], outputs=["y"])
def main(q: Tensor((b, 2, s, 4), "float32"), keys: Tensor((b, s, 2, 4), "float32"), v: Tensor((b, 2, s, 3), "float32"), mask: Tensor((b, 1, s, s), "float32"), flag: Tensor((), "bool")) -> Tensor((b, 2, s, 3), "float32"):
    y: Tensor((b, 2, s, 3), "float32")
    if flag:
        k_t: Tensor((b, 2, 4, s), "float32") = transpose(keys, axes=[0, 2, 3, 1])
        scores: Tensor((b, 2, s, s), "float32") = matmul(q, k_t)
        masked: Tensor((b, 2, s, s), "float32") = add(scores, mask)
        weights: Tensor((b, 2, s, s), "float32") = softmax(masked, axes=[3])
        t: Tensor((b, 2, s, 3), "float32") = matmul(weights, v)
        y = t
    else:
        u: Tensor((b, 2, s, 3), "float32") = relu(v)
        y = u
    return y
'''
    expected = sites(("weights", "scores", "t", "")) + '''
@function(inputs=["q", "keys", "v", "mask", "flag"], outputs=["y"])
def main(q: Tensor((b, 2, s, 4), "float32"), keys: Tensor((b, s, 2, 4), "float32"), v: Tensor((b, 2, s, 3), "float32"), mask: Tensor((b, 1, s, s), "float32"), flag: Tensor((), "bool")) -> Tensor((b, 2, s, 3), "float32"):
    y: Tensor((b, 2, s, 3), "float32")
    if flag:
        k: Tensor((b, 2, s, 4), "float32") = transpose(keys, axes=[0, 2, 1, 3])
        t: Tensor((b, 2, s, 3), "float32") = attention(q, k, v, mask, scale=1.0)
        y = t
    else:
        u: Tensor((b, 2, s, 3), "float32") = relu(v)
        y = u
    return y
'''
    inputs = {**_sdpa_inputs(), "mask": rand(2, 1, 5, 5, seed=4)}
    check_rewrite(fuse_attention, before, expected, [{**inputs, "flag": np.array(True)}, {**inputs, "flag": np.array(False)}])
