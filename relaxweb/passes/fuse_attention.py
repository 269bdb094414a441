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

Two things exporters of decoders write between these ops are looked through:

- **Repeated key / value heads** (transformers' ``repeat_kv``): when k and v are both
  ``reshape(broadcast_to(reshape(x, [..., H, 1, Sk, D]), [..., H, G, Sk, D]), [..., H * G, Sk, D])``
  of ``x [..., H, Sk, D]``, the attention op reads ``x`` itself (a key / value head shared by
  ``G`` query heads), so no copy of the repeated heads is made.
- **Run-time shape checks** (``match_cast``s the frontend writes where it cannot prove two
  extents equal: a decoder's scores ``[.., past + seq]`` against a mask ``[.., total]``) on the
  (scaled) scores or on v.  They go, and the same facts are checked once on the mask instead
  (a ``match_cast`` of the mask to the scores' dims, shared by every layer reading that mask):
  this fires only when every equality a dropped check stated is one the mask's check states.

It fires only where the rewrite computes the same thing:

- every intermediate (scores, scaled, masked, weights, and ``k_t`` when it goes) is a
  dataflow variable read once, by the next op of the chain;
- q, k_t and v have one rank; k_t and v have the same batch dims, each q's, 1 or a constant
  dividing q's (a key / value head shared by several query heads: grouped-query attention),
  so q is never broadcast; D and Sk agree, D and Dv are constants that fit the kernel's tile;
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
from ..ir.expr import Binding, Call, Constant, DataflowBlock, DataflowVar, Expr, Function, MatchCast, Var, VarBinding
from ..ir.functor import ExprMutator, use_counts
from ..ir.module import IRModule
from ..ir.struct_info import TensorStructInfo
from ..ir.symbolic import PrimExpr, as_int, format_expr, prove_equal
from ..ops import DeductionError, call_op
from ..ops.attention import key_tile, kv_group_size


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
        self.checked_masks: dict[tuple, Var] = {}  # (mask, the scores' dims) -> its cast, bound once

    def visit_dataflow_block(self, block: DataflowBlock) -> DataflowBlock:
        self.checked_masks = {}  # a dataflow variable lives in its block
        definitions = {b.var: b.value if isinstance(b, VarBinding) else b for b in block.bindings
                       if isinstance(b, (VarBinding, MatchCast))}
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
        """The rest of the match from the (masked) scores' input: a run-time shape check, an
        optional scale, the first matmul, the checks, and the new bindings."""
        checks = []
        scores_check = self._check(scores_var, definitions)
        if scores_check is not None:
            checks.append(scores_check)
            chain = [*chain, scores_var]
            scores_var = scores_check.value
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
        value_check = self._check(v, definitions)
        if value_check is not None:
            checks.append(value_check)
            chain = [*chain, v]
            v = value_check.value
        q, k_t = product.args
        if any(var in taken for var in chain):
            return None
        k, bindings, replaced = self._keys(k_t, definitions)
        if not bindings:  # k is the exporter's own tensor: its heads may be repeated ones
            k, v, repeats = self._shared_heads(k, v, definitions)
            if any(var in taken for var in repeats):
                return None
            replaced |= repeats
        mask_key = None  # (the mask, its checked dims): the check later layers share
        if checks:
            checked = self._checked_mask(q, k, mask, checks)
            if checked is None:
                return None
            mask_key = (mask, checked[0].struct_info.shape)
            mask, check_bindings = checked
            bindings = [*check_bindings, *bindings]
        if not _fits(q, _transposed(k), v, mask, binding.var):
            return None
        args = (q, k, v) if mask is None else (q, k, v, mask)
        try:
            call = call_op("attention", *args, scale=scale)
        except DeductionError:
            return None
        if not _same_shape(call.struct_info, binding.var.struct_info):
            return None
        if mask_key is not None:  # later layers reading this mask share its check
            self.checked_masks[mask_key] = mask
        return _Match([*bindings, VarBinding(binding.var, call)], set(chain) | replaced)

    def _check(self, expr: Expr, definitions: dict) -> MatchCast | None:
        """The ``match_cast`` that defines ``expr`` when ``expr`` is a dataflow variable read
        once and the cast only checks dims of a tensor of the same rank and dtype."""
        cast = definitions.get(expr) if isinstance(expr, DataflowVar) else None
        if not (isinstance(cast, MatchCast) and self.uses.get(expr, 0) == 1):
            return None
        source, target = cast.value.struct_info, cast.struct_info
        if not (isinstance(source, TensorStructInfo) and isinstance(target, TensorStructInfo)
                and source.dtype == target.dtype and _rank(source) == _rank(target) >= 0):
            return None
        return cast

    def _checked_mask(self, q: Expr, k: Expr, mask: Expr | None, checks: list[MatchCast]
                      ) -> tuple[Expr, list[Binding]] | None:
        """The mask cast to the scores' dims (each of its dims that is not 1), with its binding
        when this is the first match to need it, provided every equality the dropped ``checks``
        stated is one this cast states; None otherwise (no mask, or a fact it would not check)."""
        if mask is None or not isinstance(mask.struct_info, TensorStructInfo) or mask.struct_info.shape is None:
            return None
        q_shape, k_shape, mask_shape = (e.struct_info.shape for e in (q, k, mask))
        scores = (*q_shape[:-1], k_shape[-2])
        if len(mask_shape) > len(scores):
            return None
        target = tuple(d if as_int(d) == 1 else scores[len(scores) - len(mask_shape) + i] for i, d in enumerate(mask_shape))
        stated = _unproven(mask_shape, target)
        dropped = [pair for cast in checks for pair in _unproven(cast.value.struct_info.shape, cast.struct_info.shape)]
        if not dropped or not all(any(_same_fact(fact, other) for other in stated) for fact in dropped):
            return None
        if (mask, target) in self.checked_masks:
            return self.checked_masks[(mask, target)], []
        info = TensorStructInfo(target, mask.struct_info.dtype)
        checked = DataflowVar(self.names.unique_name(f"{getattr(mask, 'name', 'mask')}_checked"), info)
        dim, extent = next((i, d) for i, d in enumerate(mask_shape) if not prove_equal(d, target[i]))
        reason = f"{checks[0].reason} against the attention mask: its dimension {dim} ({format_expr(extent)})"
        return checked, [MatchCast(checked, mask, info, reason)]

    def _shared_heads(self, k: Expr, v: Expr, definitions: dict) -> tuple[Expr, Expr, set[Var]]:
        """(k, v, the bindings that go): the tensors whose heads transformers' ``repeat_kv``
        repeated into k and v when it repeated both the same way, else k and v as they are."""
        keys, values = self._repeated(k, definitions), self._repeated(v, definitions)
        if keys is None or values is None or keys[1] != values[1]:
            return k, v, set()
        return keys[0], values[0], keys[2] | values[2]

    def _repeated(self, x: Expr, definitions: dict) -> tuple[Expr, int, set[Var]] | None:
        """(source, G, the bindings that go) when ``x [..., H * G, S, D]`` is
        ``reshape(broadcast_to(reshape(source, [..., H, 1, S, D]), [..., H, G, S, D]))`` of
        ``source [..., H, S, D]``."""
        merged = self._single_use(x, definitions, "reshape")
        repeated = None if merged is None else self._single_use(merged.args[0], definitions, "broadcast_to")
        split = None if repeated is None else self._single_use(repeated.args[0], definitions, "reshape")
        if split is None:
            return None
        source = split.args[0]
        shapes = [e.struct_info.shape if isinstance(e.struct_info, TensorStructInfo) else None
                  for e in (source, merged.args[0], x)]
        if any(shape is None for shape in shapes) or len(shapes[0]) < 3:
            return None
        (*outer, heads, length, size), (*outer5, heads5, group, length5, size5), (*outer4, all_heads, length4, size4) = (
            shapes[0], shapes[1], shapes[2])
        group, heads, all_heads = as_int(group), as_int(heads), as_int(all_heads)
        if (group is None or heads is None or all_heads != heads * group or as_int(heads5) != heads
                or len(outer5) != len(outer) or len(outer4) != len(outer)
                or _unproven((*outer, length, size), (*outer5, length5, size5))
                or _unproven((*outer, length, size), (*outer4, length4, size4))
                or _unproven(split.struct_info.shape, (*outer, heads, 1, length, size))):
            return None
        return source, group, {x, merged.args[0], repeated.args[0]}

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


def _transposed(k: Expr) -> Expr:
    """A stand-in for ``k`` with its last two dims swapped, for :func:`_fits`."""
    info = k.struct_info
    if not (isinstance(info, TensorStructInfo) and info.shape is not None and len(info.shape) >= 2):
        return k
    shape = (*info.shape[:-2], info.shape[-1], info.shape[-2])
    return Var("k_t", TensorStructInfo(shape, info.dtype))


def _unproven(a: tuple, b: tuple) -> list[tuple[PrimExpr, PrimExpr]]:
    """The pairs of dims of ``a`` and ``b`` (one rank) not provably equal."""
    return [(x, y) for x, y in zip(a, b) if not prove_equal(x, y)]


def _same_fact(a: tuple[PrimExpr, PrimExpr], b: tuple[PrimExpr, PrimExpr]) -> bool:
    """Whether ``a[0] == a[1]`` and ``b[0] == b[1]`` state the same equality."""
    return ((prove_equal(a[0], b[0]) and prove_equal(a[1], b[1]))
            or (prove_equal(a[0], b[1]) and prove_equal(a[1], b[0])))


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
    if not all(prove_equal(b, c) and kv_group_size(b, a) is not None
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
