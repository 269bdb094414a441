"""fuse_attention: the attention subgraph exporters write, rewritten into one ``attention`` op.

torch's exporters (legacy and dynamo, BERT and GPT-2 alike) write scaled dot-product
attention as five ops, whose scores ``[batch, heads, seq, seq]`` then live in GPU memory::

    scores = matmul(q, k_t)                  # k_t: [..., D, Sk], usually transpose(x, [0, 2, 3, 1])
    scaled = multiply(scores, c)             # or multiply(c, scores), divide(scores, c); optional
    masked = add(scaled, mask)               # or add(mask, scaled); optional
    weights = softmax(masked, axes=[-1])
    out = matmul(weights, v)

This pass replaces ``out`` by ``attention(q, k, v, [mask], scale=c)`` (``relaxweb/ops/attention.py``,
one kernel that never stores the scores), with ``k = transpose(x, ...)`` the transpose that
gives ``[..., Sk, D]`` (the one that wrote ``k_t`` with its last two axes swapped, or none
when that is ``x`` itself), and drops the bindings it replaces.

It fires only where the rewrite computes the same thing:

- every intermediate (scores, scaled, masked, weights, and ``k_t`` when it goes) is a
  dataflow variable read once, by the next op of the chain;
- q, k_t and v have one rank; k_t and v have the same batch dims, each q's or 1 (a key /
  value head shared by several query heads: grouped-query attention), so q is never
  broadcast; D and Sk agree, D and Dv are constants that fit the kernel's tile;
- the scale is a one-element float constant that does not broadcast the scores up (a
  division by ``c`` becomes a product by ``1 / c``: within one rounding of the scores);
- the mask's dims are each 1 or provably the scores' (it does not broadcast them up either);
- the softmax is over the last axis only; every tensor has one float dtype.

Anything else is left as it is.  It runs before legalization at opt level 1 and above.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..ir.builder import FunctionBuilder
from ..ir.expr import Binding, Call, Constant, DataflowBlock, DataflowVar, Expr, Function, Var, VarBinding
from ..ir.functor import ExprMutator, use_counts
from ..ir.module import IRModule
from ..ir.struct_info import TensorStructInfo
from ..ir.symbolic import as_int, prove_equal
from ..ops import DeductionError, call_op
from ..ops.attention import key_tile


def fuse_attention(module: IRModule) -> IRModule:
    """Rewrite each attention subgraph (matmul, scale, mask add, softmax, matmul) into ``attention``."""
    functions = {name: _AttentionFuser(f).visit_function(f) if isinstance(f, Function) else f
                 for name, f in module.functions.items()}
    return module.replace(functions=functions)


@dataclass
class _Match:
    """One attention subgraph: the new bindings for ``out``'s place, the bindings it replaces."""

    bindings: list[Binding]
    replaced: set[Var]


class _AttentionFuser(ExprMutator):
    def __init__(self, function: Function) -> None:
        super().__init__()
        self.uses = use_counts(function)
        self.names = FunctionBuilder(function.name)  # new variables take names no variable has
        for var in (*function.params, *(b.var for b in function.bindings())):
            self.names.unique_name(var.name)

    def visit_dataflow_block(self, block: DataflowBlock) -> DataflowBlock:
        definitions = {b.var: b.value for b in block.bindings if isinstance(b, VarBinding)}
        matches: dict[Var, _Match] = {}
        replaced: set[Var] = set()
        for binding in block.bindings:
            if isinstance(binding, VarBinding):
                match = self._match(binding, definitions, replaced)
                if match is not None:
                    matches[binding.var] = match
                    replaced |= match.replaced
        if not matches:
            return super().visit_dataflow_block(block)
        rewritten = [b for binding in block.bindings if binding.var not in replaced
                     for b in (matches[binding.var].bindings if binding.var in matches else [binding])]
        return super().visit_dataflow_block(DataflowBlock(tuple(rewritten)))

    # -- matching ------------------------------------------------------------------------------

    def _single_use(self, expr: Expr, definitions: dict, op: str | tuple[str, ...]) -> Call | None:
        """The op call that defines ``expr`` when ``expr`` is a dataflow variable of this block
        read once and the call is ``op`` (one of ``op``)."""
        ops = (op,) if isinstance(op, str) else op
        value = definitions.get(expr) if isinstance(expr, DataflowVar) else None
        if isinstance(value, Call) and value.op in ops and self.uses.get(expr, 0) == 1:
            return value
        return None

    def _match(self, binding: VarBinding, definitions: dict, taken: set[Var]) -> _Match | None:
        out = binding.value
        if not (isinstance(out, Call) and out.op == "matmul" and len(out.args) == 2):
            return None
        weights_var, v = out.args
        weights = self._single_use(weights_var, definitions, "softmax")
        if weights is None:
            return None
        chain = [weights_var]
        rank = _rank(weights.struct_info)
        if rank < 2 or [a % rank for a in weights.attrs.get("axes", ())] != [rank - 1]:
            return None
        masked = self._single_use(weights.args[0], definitions, "add")
        if masked is None:
            return self._rewrite(binding, weights.args[0], None, v, chain, definitions, taken)
        if not _same_shape(masked.struct_info, weights.struct_info):
            return None  # the mask broadcasts the scores up
        for scores, mask in (masked.args, masked.args[::-1]):  # add(scores, mask) or add(mask, scores)
            match = self._rewrite(binding, scores, mask, v, [*chain, weights.args[0]], definitions, taken)
            if match is not None:
                return match
        return None

    def _rewrite(self, binding: VarBinding, scores_var: Expr, mask: Expr | None, v: Expr, chain: list,
                 definitions: dict, taken: set[Var]) -> _Match | None:
        """The rest of the match from the (masked) scores' input: an optional scale, the
        first matmul, the checks, and the new bindings."""
        scale = 1.0
        scaled = self._single_use(scores_var, definitions, ("multiply", "divide"))
        if scaled is not None:
            factor = _scale_of(scaled, scores_var)
            if factor is None:
                return None
            chain = [*chain, scores_var]
            scores_var, scale = factor
        product = self._single_use(scores_var, definitions, "matmul")
        if product is None:
            return None
        chain = [*chain, scores_var]
        q, k_t = product.args
        if any(var in taken for var in chain) or not _fits(q, k_t, v, mask, binding.var):
            return None
        k, bindings, replaced = self._keys(k_t, definitions)
        args = (q, k, v) if mask is None else (q, k, v, mask)
        try:
            call = call_op("attention", *args, scale=scale)
        except DeductionError:
            return None
        if not _same_shape(call.struct_info, binding.var.struct_info):
            return None
        return _Match([*bindings, VarBinding(binding.var, call)], set(chain) | replaced)

    def _keys(self, k_t: Expr, definitions: dict) -> tuple[Expr, list[Binding], set[Var]]:
        """``k`` ([..., Sk, D]) for ``k_t`` ([..., D, Sk]): the input of ``k_t``'s transpose
        when swapping its last two axes undoes it, else a new transpose (of that input, or of
        ``k_t``); with the bindings to add and those that go."""
        rank = _rank(k_t.struct_info)
        source, axes, replaced = k_t, list(range(rank)), set()
        transpose = self._single_use(k_t, definitions, "transpose")
        if transpose is not None:
            source = transpose.args[0]
            given = transpose.attrs.get("axes")
            axes = list(range(rank))[::-1] if given is None else [a % rank for a in given]
            replaced = {k_t}
        axes[-2], axes[-1] = axes[-1], axes[-2]
        if axes == list(range(rank)):
            return source, [], replaced
        call = call_op("transpose", source, axes=axes)
        keys = DataflowVar(self.names.unique_name(f"{getattr(k_t, 'name', 'attention')}_keys"), call.struct_info)
        return keys, [VarBinding(keys, call)], replaced


def _rank(info) -> int:
    return len(info.shape) if isinstance(info, TensorStructInfo) and info.shape is not None else -1


def _same_shape(a, b) -> bool:
    return (isinstance(a, TensorStructInfo) and isinstance(b, TensorStructInfo) and a.dtype == b.dtype
            and a.shape is not None and b.shape is not None and len(a.shape) == len(b.shape)
            and all(prove_equal(x, y) for x, y in zip(a.shape, b.shape)))


def _scale_of(scaled: Call, result: Var) -> tuple[Expr, float] | None:
    """(the scores, the factor) of ``multiply(scores, c)``, ``multiply(c, scores)`` or
    ``divide(scores, c)`` with ``c`` a one-element float constant that leaves the scores'
    shape as it is."""
    orders = (scaled.args, scaled.args[::-1]) if scaled.op == "multiply" else (scaled.args,)
    for scores, constant in orders:
        if (isinstance(constant, Constant) and constant.data.size == 1 and constant.data.dtype.kind == "f"
                and constant.data.ndim <= _rank(scores.struct_info) and _same_shape(scores.struct_info, result.struct_info)):
            value = float(constant.data.reshape(()))
            if scaled.op == "divide":
                value = float(np.float32(1.0) / np.float32(value)) if value != 0.0 else None
            if value is not None and np.isfinite(value):
                return scores, value
    return None


def _fits(q: Expr, k_t: Expr, v: Expr, mask: Expr | None, out: Var) -> bool:
    """q [..., Sq, D], k_t [..., D, Sk], v [..., Sk, Dv] with k_t's and v's batch dims q's or 1,
    constant head sizes the kernel takes, one float dtype, and a mask of scores' dims or 1s."""
    infos = [e.struct_info for e in (q, k_t, v, out) + (() if mask is None else (mask,))]
    if not all(isinstance(i, TensorStructInfo) and i.shape is not None for i in infos):
        return False
    if len({i.dtype for i in infos}) != 1 or not infos[0].dtype.startswith("float"):
        return False
    qs, ks, vs = infos[0].shape, infos[1].shape, infos[2].shape
    if not len(qs) == len(ks) == len(vs) >= 2:
        return False
    batch = len(qs) - 2
    # k and v the same batch dims, each q's or 1 (a head shared by query heads); never q broadcast
    if not all(prove_equal(b, c) and (as_int(b) == 1 or prove_equal(a, b))
               for a, b, c in zip(qs[:batch], ks[:batch], vs[:batch])):
        return False
    if not (prove_equal(qs[-1], ks[-2]) and prove_equal(ks[-1], vs[-2])):
        return False
    head, value_head = as_int(qs[-1]), as_int(vs[-1])
    if head is None or value_head is None or key_tile(head, value_head) < 1:
        return False
    if mask is not None:
        scores = (*qs[:-1], ks[-1])
        shape = infos[4].shape
        if len(shape) > len(scores):
            return False
        offset = len(scores) - len(shape)
        if not all(as_int(d) == 1 or prove_equal(d, scores[offset + i]) for i, d in enumerate(shape)):
            return False
    return True
