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

What torch writes for ``scaled_dot_product_attention`` (transformers' default attention, so
every export of BERT, DistilBERT, GPT-2, Llama or Whisper made without ``attn_implementation=
"eager"``, optimum's included) differs in three ways, all read through:

- **The scale on q and k**: ``matmul(multiply(q, sqrt(c)), multiply(k_t, sqrt(c)))``; each
  factor (a one-element float constant, on either side, or a divisor) joins the kernel's
  scale: ``(q a) . (k b)`` is ``(q . k) a b`` up to the rounding of the products.
- **NaN rows set to 0**: ``where(isnan(weights), 0, weights)`` between the softmax and the
  value product, the softmax read by both; the op gets ``zero_nan_rows=True`` (a row whose
  weights are NaN, every key masked with ``-inf``, is 0: ``relaxweb/library/attention.py``).
- **The dynamo exporter's key transpose**: ``reshape(transpose(reshape(x, [B, Sk, D]), [0, 2,
  1]), [..., D, Sk])`` with ``B`` the product of x's leading dims is x with its last two axes
  swapped: the op reads ``x``.

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

- every intermediate (scores, scaled, masked, weights, the scaled q and k_t, and ``k_t``
  when it goes) is a variable read once, by the next op of the chain (the weights: also by
  their ``isnan``);
- q, k_t and v have one rank; k_t and v have the same batch dims, each q's, 1 or a constant
  dividing q's (a key / value head shared by several query heads: grouped-query attention),
  so q is never broadcast; D and Sk agree, D and Dv are constants that fit the kernel's tile;
- the scale is a one-element float constant that does not broadcast the scores up (a
  division by ``c`` becomes a product by ``1 / c``: within one rounding of the scores);
- the mask's dims are each 1 or provably the scores' (it does not broadcast them up either);
- the softmax is over the last axis only; every tensor has one float dtype.

Anything else is left as it is.  It runs before legalization at opt level 1 and above, in
every block: a graph with control flow (an ``If``'s branches) has no dataflow blocks.

**Attention sites.**  Each ``softmax`` whose weights (or their NaN-zeroed form) a ``matmul``
multiplies by values is an attention site.  The pass records every site it saw in the
module's attrs (``relaxweb/ir/attention_sites.py``), fused or not and why not, with the names
of its scores, softmax and output variables; ``relaxweb inspect`` and the bundle's manifest
list them (``api.py``, ``bundle.py``).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from ..ir.attention_sites import ATTENTION_SITES, AttentionSite, attention_sites
from ..ir.builder import FunctionBuilder
from ..ir.expr import (
    Binding, BindingBlock, Call, Constant, DataflowBlock, DataflowVar, Expr, Function, MatchCast, Var, VarBinding,
)
from ..ir.functor import ExprMutator, use_counts
from ..ir.module import IRModule
from ..ir.struct_info import TensorStructInfo
from ..ir.symbolic import PrimExpr, as_int, format_expr, format_shape, product, prove_equal
from ..ops import DeductionError, call_op
from ..ops.attention import key_tile, kv_group_size


def fuse_attention(module: IRModule) -> IRModule:
    """Rewrite each attention subgraph (matmul, scale, mask add, softmax, matmul) into
    ``attention``; record every attention site in ``module.attrs`` (``ir/attention_sites.py``)."""
    sites: list[AttentionSite] = []
    functions = {}
    for name, function in module.functions.items():
        if isinstance(function, Function):
            fuser = _AttentionFuser(function)
            function = fuser.visit_function(function)
            sites += fuser.sites
        functions[name] = function
    if not sites:
        return module.replace(functions=functions)
    seen = {site.softmax for site in sites}  # a second run replaces its sites' records
    kept = [site for site in attention_sites(module.attrs) if site.softmax not in seen]
    return module.replace(functions=functions,
                          attrs={**module.attrs, ATTENTION_SITES: [site.record() for site in (*kept, *sites)]})


class NotFused(Exception):
    """Why an attention site is left as it is (the message, for the user)."""


@dataclass
class _Match:
    """One attention subgraph: the new bindings for ``out``'s place, the bindings it replaces."""

    bindings: list[Binding]
    replaced: set[Var]


class _AttentionFuser(ExprMutator):
    def __init__(self, function: Function) -> None:
        super().__init__()
        self.uses = use_counts(function)
        self.names = FunctionBuilder.avoiding_names_of(function)
        self.checked_masks: dict[tuple, Var] = {}  # (mask, the scores' dims) -> its cast, bound once
        self.sites: list[AttentionSite] = []
        self.variable = DataflowVar  # the kind of the variables the block being rewritten binds

    def visit_dataflow_block(self, block: DataflowBlock) -> DataflowBlock:
        return self._fuse_block(block, DataflowVar)

    def visit_binding_block(self, block: BindingBlock) -> BindingBlock:
        return self._fuse_block(block, Var)

    def _fuse_block(self, block: BindingBlock, variable: type) -> BindingBlock:
        self.checked_masks, self.variable = {}, variable  # a block's new variables live in it
        definitions = {b.var: b.value if isinstance(b, VarBinding) else b for b in block.bindings
                       if isinstance(b, (VarBinding, MatchCast))}
        readers: dict[Var, list[VarBinding]] = {}
        for binding in block.bindings:
            if isinstance(binding, VarBinding) and isinstance(binding.value, Call):
                for arg in binding.value.args:
                    if isinstance(arg, Var):
                        readers.setdefault(arg, []).append(binding)
        matches: dict[Var, _Match] = {}
        replaced: set[Var] = set()
        for binding in block.bindings:
            output = _value_product(binding, readers)
            if output is None:
                continue
            reason = ""
            try:
                match = self._match(binding, output, definitions, replaced)
            except NotFused as not_fused:
                reason = str(not_fused)
            else:
                matches[output.var] = match
                replaced |= match.replaced
            self.sites.append(AttentionSite(binding.var.name, _scores_name(binding.value.args[0], definitions),
                                            output.var.name, reason))
        if not matches:
            return super()._rebuild_block(block)
        rewritten = [b for binding in block.bindings if binding.var not in replaced
                     for b in (matches[binding.var].bindings if binding.var in matches else [binding])]
        return super()._rebuild_block(type(block)(tuple(rewritten)))

    # -- matching ------------------------------------------------------------------------------

    def _defined_by(self, expr: Expr, definitions: dict, op: str | tuple[str, ...]) -> Call | None:
        """The op call (one of ``op``) that defines ``expr`` in this block, however often it is read."""
        ops = (op,) if isinstance(op, str) else op
        value = definitions.get(expr) if isinstance(expr, Var) else None
        return value if isinstance(value, Call) and value.op in ops else None

    def _read_once(self, expr: Expr, what: str, times: int = 1) -> None:
        """NotFused unless ``expr`` (the site's ``what``) is read ``times`` times, all by the site."""
        if self.uses.get(expr, 0) != times:
            raise NotFused(f"the {what} ({getattr(expr, 'name', '?')}) are also read elsewhere")

    def _single_use(self, expr: Expr, definitions: dict, op: str | tuple[str, ...]) -> Call | None:
        """The op call that defines ``expr`` when ``expr`` is a variable of this block read
        once and the call is ``op`` (one of ``op``)."""
        value = self._defined_by(expr, definitions, op)
        return value if value is not None and self.uses.get(expr, 0) == 1 else None

    def _match(self, softmax: VarBinding, output: VarBinding, definitions: dict, taken: set[Var]) -> _Match:
        """The rewrite of the site ``softmax`` whose value product is ``output``, or NotFused."""
        weights_var, weights = softmax.var, softmax.value
        rank = _rank(weights.struct_info)
        axes = [a % rank for a in weights.attrs.get("axes", ())] if rank > 0 else []
        if rank < 2 or axes != [rank - 1]:
            raise NotFused(f"the softmax is over axes {weights.attrs.get('axes')}, not the last one alone (the keys)")
        chain, zero_nan_rows = [weights_var], False
        if output.value.args[0] is not weights_var:  # out = matmul(where(..., 0, weights), v)
            zeroed, zero_nan_rows = self._zeroed_rows(output.value.args[0], weights_var, definitions)
            chain += zeroed
        else:
            self._read_once(weights_var, "attention weights")
        v = output.value.args[1]
        masked = self._defined_by(weights.args[0], definitions, "add")
        if masked is None:
            return self._rewrite(output, weights.args[0], None, v, chain, definitions, taken, zero_nan_rows)
        self._read_once(weights.args[0], "masked scores")
        orders = [(scores, mask) for scores, mask in (masked.args, masked.args[::-1])  # add(scores, mask) or add(mask, scores)
                  if _scores_name(scores, definitions) is not None]
        if not orders:
            raise NotFused("neither side of the mask add is a matmul of q and k (through a scale)")
        reasons = []
        for scores, mask in orders:
            try:
                return self._rewrite(output, scores, mask, v, [*chain, weights.args[0]], definitions, taken,
                                     zero_nan_rows)
            except NotFused as reason:
                reasons.append(reason)
        raise reasons[0]

    def _zeroed_rows(self, zeroed: Expr, weights: Var, definitions: dict) -> tuple[list[Var], bool]:
        """(the bindings that go, zero_nan_rows) of ``zeroed = where(isnan(weights), 0,
        weights)`` (torch's export: the weights read by these two alone) or ``where(c, 0,
        weights)`` with ``c`` a constant all false (ONNX's Attention function without a mask
        that hides whole rows: the weights themselves), ``zeroed`` read by the value product
        alone; NotFused otherwise."""
        where = self._defined_by(zeroed, definitions, "where")
        fill = None if where is None else where.args[1]
        if (where is None or where.args[2] is not weights or not _same_shape(where.struct_info, weights.struct_info)
                or not (isinstance(fill, Constant) and fill.data.size == 1 and float(fill.data.reshape(())) == 0.0)):
            raise NotFused("the value product reads the weights through something other than "
                           "where(isnan(weights), 0, weights)")
        condition = where.args[0]
        if isinstance(condition, Constant) and condition.data.dtype == np.bool_ and not condition.data.any():
            self._read_once(weights, "attention weights")
            self._read_once(zeroed, "weights")
            return [zeroed], False
        test = self._defined_by(condition, definitions, "isnan")
        if test is None or test.args[0] is not weights:
            raise NotFused("the value product reads the weights through a where whose condition is neither "
                           "isnan(weights) nor a constant false (it may set rows to 0 that the kernel would not)")
        self._read_once(weights, "attention weights", times=2)
        self._read_once(condition, "weights' NaN tests")
        self._read_once(zeroed, "NaN-zeroed weights")
        return [condition, zeroed], True

    def _rewrite(self, output: VarBinding, scores_var: Expr, mask: Expr | None, v: Expr, chain: list,
                 definitions: dict, taken: set[Var], zero_nan_rows: bool) -> _Match:
        """The rest of the match from the (masked) scores' input: a run-time shape check, an
        optional scale, the first matmul, the checks, and the new bindings."""
        checks = []
        scores_check = self._check(scores_var, definitions)
        if scores_check is not None:
            checks.append(scores_check)
            chain = [*chain, scores_var]
            scores_var = scores_check.value
        scale = 1.0
        scaled = self._defined_by(scores_var, definitions, ("multiply", "divide"))
        if scaled is not None:
            self._read_once(scores_var, "scaled scores")
            factor = _scale_of(scaled, scores_var)
            if factor is None:
                raise NotFused(f"the scores are scaled ({scaled.op}) by something other than a one-element float "
                               "constant")
            chain = [*chain, scores_var]
            scores_var, scale = factor
        product = self._defined_by(scores_var, definitions, "matmul")
        if product is None:
            raise NotFused("the scores are not a matmul of q and k (through a constant scale)")
        self._read_once(scores_var, "scores")
        chain = [*chain, scores_var]
        value_check = self._check(v, definitions)
        if value_check is not None:
            checks.append(value_check)
            chain = [*chain, v]
            v = value_check.value
        (q, q_scale, q_scaled), (k_t, k_scale, k_scaled) = (self._operand_scale(x, definitions) for x in product.args)
        scale *= q_scale * k_scale
        chain = [*chain, *q_scaled, *k_scaled]
        if any(var in taken for var in chain):
            raise NotFused("it shares bindings with another attention site")
        k, bindings, replaced = self._keys(k_t, definitions)
        if not bindings:  # k is the exporter's own tensor: its heads may be repeated ones
            k, v, repeats = self._shared_heads(k, v, definitions)
            if any(var in taken for var in repeats):
                raise NotFused("its repeated key / value heads belong to another attention site")
            replaced |= repeats
        mask_key = None  # (the mask, its checked dims): the check later layers share
        if checks:
            checked = self._checked_mask(q, k, mask, checks)
            mask_key = (mask, checked[0].struct_info.shape)
            mask, check_bindings = checked
            bindings = [*check_bindings, *bindings]
        problem = _misfit(q, _transposed(k), v, mask, output.var)
        if problem is not None:
            raise NotFused(problem)
        args = (q, k, v) if mask is None else (q, k, v, mask)
        attrs = {"scale": scale, **({"zero_nan_rows": True} if zero_nan_rows else {})}
        try:
            call = call_op("attention", *args, **attrs)
        except DeductionError as error:
            raise NotFused(f"the attention op refuses it: {error}") from None
        if not _same_shape(call.struct_info, output.var.struct_info):
            raise NotFused(f"the fused result would be {_shape_text(call.struct_info)}, the value product's is "
                           f"{_shape_text(output.var.struct_info)}")
        if mask_key is not None:  # later layers reading this mask share its check
            self.checked_masks[mask_key] = mask
        return _Match([*bindings, VarBinding(output.var, call)], set(chain) | replaced)

    def _operand_scale(self, x: Expr, definitions: dict) -> tuple[Expr, float, list[Var]]:
        """(the operand, its factor, the binding that goes): ``x`` scaled by a one-element
        constant (read once: torch's ``scaled_dot_product_attention`` scales q and k_t by the
        square root of the scale), else ``x``, 1 and none."""
        scaled = self._single_use(x, definitions, ("multiply", "divide"))
        factor = None if scaled is None else _scale_of(scaled, x)
        if factor is None:
            return x, 1.0, []
        return factor[0], factor[1], [x]

    def _check(self, expr: Expr, definitions: dict) -> MatchCast | None:
        """The ``match_cast`` that defines ``expr`` when ``expr`` is a variable of this block
        read once and the cast only checks dims of a tensor of the same rank and dtype."""
        cast = definitions.get(expr) if isinstance(expr, Var) else None
        if not (isinstance(cast, MatchCast) and self.uses.get(expr, 0) == 1):
            return None
        source, target = cast.value.struct_info, cast.struct_info
        if not (isinstance(source, TensorStructInfo) and isinstance(target, TensorStructInfo)
                and source.dtype == target.dtype and _rank(source) == _rank(target) >= 0):
            return None
        return cast

    def _checked_mask(self, q: Expr, k: Expr, mask: Expr | None, checks: list[MatchCast]
                      ) -> tuple[Expr, list[Binding]]:
        """The mask cast to the scores' dims (each of its dims that is not 1), with its binding
        when this is the first match to need it, provided every equality the dropped ``checks``
        stated is one this cast states; NotFused otherwise (no mask, or a fact it would not check)."""
        if mask is None or not isinstance(mask.struct_info, TensorStructInfo) or mask.struct_info.shape is None:
            raise NotFused(f"a run-time shape check between its ops ({_check_text(checks[0])}) that no mask states")
        q_shape, k_shape, mask_shape = (e.struct_info.shape for e in (q, k, mask))
        scores = (*q_shape[:-1], k_shape[-2])
        if len(mask_shape) > len(scores):
            raise NotFused(f"the mask has {len(mask_shape)} dims, the scores {len(scores)}")
        target = tuple(d if as_int(d) == 1 else scores[len(scores) - len(mask_shape) + i] for i, d in enumerate(mask_shape))
        stated = _unproven(mask_shape, target)
        for cast in checks:
            dropped = _unproven(cast.value.struct_info.shape, cast.struct_info.shape)
            if not dropped or not all(any(_same_fact(fact, other) for other in stated) for fact in dropped):
                raise NotFused(f"a run-time shape check between its ops ({_check_text(cast)}) that a check of the "
                               "mask would not state")
        if (mask, target) in self.checked_masks:
            return self.checked_masks[(mask, target)], []
        info = TensorStructInfo(target, mask.struct_info.dtype)
        checked = self.variable(self.names.unique_name(f"{getattr(mask, 'name', 'mask')}_checked"), info)
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
        (or of the dynamo exporter's flattened one, :meth:`_flat_swap`) when swapping its last
        two axes undoes it, else a new transpose (of that input, or of ``k_t``); with the
        bindings to add and those that go."""
        swapped = self._flat_swap(k_t, definitions)
        if swapped is not None:
            return swapped
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
        keys = self.variable(self.names.unique_name(f"{getattr(k_t, 'name', 'attention')}_keys"), call.struct_info)
        return keys, [VarBinding(keys, call)], replaced

    def _flat_swap(self, k_t: Expr, definitions: dict) -> tuple[Expr, list[Binding], set[Var]] | None:
        """(x, no bindings, the three that go) when ``k_t`` is ``reshape(transpose(reshape(x,
        [B, Sk, D]), [0, 2, 1]), [..., D, Sk])`` of ``x [..., Sk, D]`` with ``B`` the product of
        its leading dims (what torch's dynamo exporter writes for ``k.transpose(-2, -1)``):
        exactly x with its last two axes swapped."""
        unflat = self._single_use(k_t, definitions, "reshape")
        swap = None if unflat is None else self._single_use(unflat.args[0], definitions, "transpose")
        flat = None if swap is None else self._single_use(swap.args[0], definitions, "reshape")
        if flat is None or [a % 3 for a in swap.attrs.get("axes") or (2, 1, 0)] != [0, 2, 1]:
            return None
        x = flat.args[0]
        shapes = [e.struct_info.shape if isinstance(e.struct_info, TensorStructInfo) else None
                  for e in (x, swap.args[0], k_t)]
        if any(shape is None for shape in shapes) or len(shapes[1]) != 3 or len(shapes[0]) < 2:
            return None
        (*outer, length, size), (rows, length3, size3), result = shapes
        leading = product(outer)
        if (len(result) != len(shapes[0]) or _unproven((*outer, size, length), result)
                or _unproven((leading, length, size), (rows, length3, size3))):
            return None
        return x, [], {k_t, unflat.args[0], swap.args[0]}


def _value_product(binding: Binding, readers: dict[Var, list[VarBinding]]) -> VarBinding | None:
    """The ``matmul(weights, v)`` binding when ``binding`` is a ``softmax`` whose result (or
    ``where(isnan(w), 0, w)`` of it) a matmul reads as its first operand: an attention site."""
    if not (isinstance(binding, VarBinding) and isinstance(binding.value, Call) and binding.value.op == "softmax"):
        return None
    weights = binding.var
    for reader in readers.get(weights, []):
        if reader.value.op == "matmul" and reader.value.args[0] is weights:
            return reader
        if reader.value.op == "where" and reader.value.args[2] is weights:
            products = [r for r in readers.get(reader.var, []) if r.value.op == "matmul" and r.value.args[0] is reader.var]
            if products:
                return products[0]
    return None


def _scores_name(expr: Expr, definitions: dict, depth: int = 4) -> str | None:
    """The name of the ``matmul`` that ``expr`` is, through up to ``depth`` run-time checks,
    scales and mask adds (however often each is read), or None."""
    value = definitions.get(expr) if isinstance(expr, Var) else None
    if isinstance(value, Call) and value.op == "matmul":
        return expr.name
    if depth == 0:
        return None
    if isinstance(value, MatchCast):
        return _scores_name(value.value, definitions, depth - 1)
    if isinstance(value, Call) and value.op in ("multiply", "divide", "add"):
        names = (_scores_name(arg, definitions, depth - 1) for arg in value.args)
        return next((name for name in names if name is not None), None)
    return None


def _check_text(cast: MatchCast) -> str:
    """A run-time check as the frontend states it (its node and dimension), or its variable."""
    return cast.reason or f"'{cast.var.name}'"


def _shape_text(info) -> str:
    return format_shape(info.shape) if isinstance(info, TensorStructInfo) and info.shape is not None else "(unknown)"


def _transposed(k: Expr) -> Expr:
    """A stand-in for ``k`` with its last two dims swapped, for :func:`_misfit`."""
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
    """(the scaled tensor, the factor) of ``multiply(x, c)``, ``multiply(c, x)`` or
    ``divide(x, c)`` with ``c`` a one-element float constant that leaves x's shape as it is."""
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


def _misfit(q: Expr, k_t: Expr, v: Expr, mask: Expr | None, out: Var) -> str | None:
    """Why the kernel cannot take q [..., Sq, D], k_t [..., D, Sk], v [..., Sk, Dv] (k_t's and
    v's batch dims q's, 1 or divisors, constant head sizes that fit its tile, one float
    dtype, a mask of the scores' dims or 1s), or None."""
    infos = [e.struct_info for e in (q, k_t, v, out) + (() if mask is None else (mask,))]
    if not all(isinstance(i, TensorStructInfo) and i.shape is not None for i in infos):
        return "a shape is not known (q, k, v or the mask)"
    dtypes = sorted({i.dtype for i in infos})
    if len(dtypes) != 1 or not dtypes[0].startswith("float"):
        return f"q, k, v, the mask and the result are not of one float dtype ({', '.join(dtypes)})"
    qs, ks, vs = infos[0].shape, infos[1].shape, infos[2].shape
    if not len(qs) == len(ks) == len(vs) >= 2:
        return f"q, k and v have ranks {len(qs)}, {len(ks)} and {len(vs)}"
    batch = len(qs) - 2
    # k and v the same batch dims, each q's or 1 (a head shared by query heads); never q broadcast
    if not all(prove_equal(b, c) and kv_group_size(b, a) is not None
               for a, b, c in zip(qs[:batch], ks[:batch], vs[:batch])):
        return (f"the batch dims of k {format_shape(ks[:batch])} and v {format_shape(vs[:batch])} are not "
                f"each q's {format_shape(qs[:batch])}, 1 or a constant dividing it")
    if not (prove_equal(qs[-1], ks[-2]) and prove_equal(ks[-1], vs[-2])):
        return "the head sizes of q and k, or the key lengths of k and v, are not provably equal"
    head, value_head = as_int(qs[-1]), as_int(vs[-1])
    if head is None or value_head is None:
        return f"the head sizes ({format_expr(qs[-1])}, {format_expr(vs[-1])}) are not constants"
    if key_tile(head, value_head) < 1:
        return f"a key and a value of head sizes {head} and {value_head} do not fit the kernel's workgroup memory"
    if mask is not None:
        scores = (*qs[:-1], ks[-1])
        shape = infos[4].shape
        if len(shape) > len(scores):
            return f"the mask has {len(shape)} dims, the scores {len(scores)}"
        offset = len(scores) - len(shape)
        if not all(as_int(d) == 1 or prove_equal(d, scores[offset + i]) for i, d in enumerate(shape)):
            return f"the mask {format_shape(shape)} broadcasts the scores {format_shape(scores)} up (a dim not 1 or theirs)"
    return None
